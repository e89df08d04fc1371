"""A PDF attached to a request (Responses' `input_file`, Chat Completions' `file` part), read as the
text of each page in order, with pypdf.

The model reads text: each page becomes `[NAME, page N of M]` and its text, so a question about page 3
can be answered and the trace shows what the model was given. Page images are not rendered (pypdf
draws nothing; a renderer is a native library of its own), so a scanned page with no text layer
reads as `(no text on this page)`, said where the page is.

The API layer only finds the part (`pdf_part`: its size, from the base64's length) and puts it in the
conversation like any other attached item; its text is read on the rendering thread (`with_pdf_text`,
first of all there, since everything after counts that text), never on the event loop: a 1,000-page
file takes seconds. What cannot be read is a `MediaError` naming the part, which the server answers
with a 400, before anything else is spent: an encrypted PDF (nothing here can ask for its password),
one that is not a PDF or is broken past repair, and one past the limits (MAX_PAGES pages, MAX_BYTES
bytes), which are checked from the file's page tree before any page is read, so a 10,000-page file is
refused in milliseconds.
"""

from __future__ import annotations

import base64
import binascii
import io
import logging

from .parts import MediaError, MediaPart

log = logging.getLogger("looptrace")

MAX_PAGES = 1000
MAX_BYTES = 32 * 1024 * 1024  # the specification's own bound on `file_data` (33,554,432 characters)
REPAIRED_END = b"\nstartxref\n0\n%%EOF\n"  # lets pypdf rebuild a cross-reference table the file lacks


def _refused(where: str, why: str, code: str = "invalid_file") -> MediaError:
    return MediaError(f"'{where}': {why}", where, code)


def _too_large(size: int, where: str) -> MediaError:
    return _refused(where, f"the PDF is {size:,} bytes; at most {MAX_BYTES:,} are read.", "file_too_large")


def pdf_part(encoded: str, where: str, filename: str | None = None) -> MediaPart:
    """The base64 PDF `encoded` (from the part at `where`) as a part to be read on the rendering thread;
    refused here only for what costs nothing to find: a size past MAX_BYTES, from the base64's length
    (what it decodes to, when it is valid base64)."""
    size = len(encoded) * 3 // 4 - encoded[-2:].count("=")
    if size > MAX_BYTES:
        raise _too_large(size, where)
    return MediaPart("pdf", encoded, where, "application/pdf", filename=filename or "")


def with_pdf_text(messages: list[dict]) -> list[dict]:
    """The conversation with each PDF part (`pdf_part`) replaced by its pages' text, as a text part; a
    message left with text parts only is one string again, its texts joined by a newline, as the API
    layer joins a message's texts (request_parts.joined): the prompt and the trace read as they would
    had the text been there from the start."""
    out = []
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list) and any(_is_pdf(p) for p in content):
            content = [{"type": "text", "text": pdf_text(p["media"].encoded, p["media"].param,
                                                         p["media"].filename or None)} if _is_pdf(p) else p
                       for p in content]
            if all(isinstance(p, dict) and p.keys() == {"type", "text"} and p["type"] == "text" for p in content):
                content = "\n".join(p["text"] for p in content)
            message = {**message, "content": content}
        out.append(message)
    return out


def _is_pdf(part: object) -> bool:
    return isinstance(part, dict) and isinstance(part.get("media"), MediaPart) and part["media"].kind == "pdf"


def pdf_text(encoded: str, where: str, filename: str | None = None) -> str:
    """The text of the base64 PDF `encoded` (from the part at `where`), page by page."""
    try:
        data = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise _refused(where, "the file is not valid base64.") from None
    if len(data) > MAX_BYTES:
        raise _too_large(len(data), where)
    if not data.startswith(b"%PDF-"):
        raise _refused(where, "the file is not a PDF (it does not start with %PDF-); only PDF files are read.",
                       "unsupported_file")
    reader = _reader(data, where)
    name = filename or "attached PDF"
    pages = []
    try:
        count = _pages_within_limit(reader, where)
        for number, page in enumerate(reader.pages, 1):
            if number > count:  # a page tree whose count understates it: read no more than it says
                break
            text = (page.extract_text() or "").strip()
            pages.append(f"[{name}, page {number} of {count}]\n{text or '(no text on this page)'}")
    except MediaError:
        raise
    except Exception as exc:  # noqa: BLE001 - pypdf raises many kinds on a broken file: each is the client's
        raise _unreadable(exc, where) from None
    return "\n\n".join(pages)


def _unreadable(exc: Exception, where: str) -> MediaError:
    """A PDF pypdf could not read, said in the user's words; pypdf's own words go to the log (they name its
    classes and internals, nothing a client can act on)."""
    from pypdf.errors import LimitReachedError

    log.info("a PDF at %s could not be read: %r", where, exc)
    if isinstance(exc, LimitReachedError):
        from pypdf import get_configuration

        limit = get_configuration().zlib_maximum_output_length
        return _refused(where, f"the PDF expands past the limit of {limit / 1e6:g} MB when its contents are "
                        "decompressed; it was not read.", "file_too_large")
    return _refused(where, "the PDF is damaged: its structure could not be read. Save it again from the program "
                    "that made it, or send its text.")


def _pages_within_limit(reader, where: str) -> int:
    """The number of pages, found by walking the page tree no further than the limit allows: pypdf's
    own count (`len(reader.pages)`) flattens the whole tree first, 4 s for 10,000 pages here, and a
    file's /Count is the client's word."""
    claimed = reader.trailer["/Root"]["/Pages"].get_object().get("/Count", 0)
    if isinstance(claimed, int) and claimed > MAX_PAGES:
        raise _refused(where, f"the PDF has {claimed:,} pages; at most {MAX_PAGES:,} are read.", "file_too_large")
    pages, nodes, seen = 0, 0, set()
    stack = [reader.trailer["/Root"]["/Pages"]]
    while stack:
        ref = stack.pop()
        key = getattr(ref, "idnum", None)
        if key is not None and key in seen:
            continue  # a tree that loops back on itself
        seen.add(key)
        node = ref.get_object()
        nodes += 1
        if node.get("/Type") == "/Pages" or "/Kids" in node:
            stack.extend(node.get("/Kids", []))
        else:
            pages += 1
        if pages > MAX_PAGES or nodes > 4 * MAX_PAGES:
            raise _refused(where, f"the PDF has more than {MAX_PAGES:,} pages; at most {MAX_PAGES:,} are read.",
                           "file_too_large")
    return pages


def _reader(data: bytes, where: str):
    from pypdf import PdfReader
    from pypdf.errors import PdfReadError

    logging.getLogger("pypdf").setLevel(logging.ERROR)  # its repairs are warnings about the client's file
    try:
        try:
            reader = PdfReader(io.BytesIO(data), strict=False)
        except PdfReadError as exc:
            if "startxref" not in str(exc):
                raise
            # Hand-written PDFs (the Open Responses fixture among them) may end without a cross-reference
            # table; pypdf rebuilds one by scanning the objects when pointed at a wrong one.
            reader = PdfReader(io.BytesIO(data + REPAIRED_END), strict=False)
    except Exception as exc:  # noqa: BLE001 - a file that is not a readable PDF
        raise _unreadable(exc, where) from None
    if reader.is_encrypted:
        raise _refused(where, "the PDF is encrypted; send it decrypted (this server cannot ask for a password).",
                       "encrypted_file")
    return reader
