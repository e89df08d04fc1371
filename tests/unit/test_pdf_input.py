"""PDF files attached to a request (Responses' `input_file`, Chat Completions' `file` part): the text
of each page reaches the model in order, read off the event loop (where images are decoded); an
encrypted, broken or oversized PDF is a 400 naming the part."""

from __future__ import annotations

import base64
import io
import threading
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
from pypdf import PdfWriter

from looptrace.families.media import pdf as pdf_module
from looptrace.proxy.api.request_parts import Attachment, joined, media_part

MODEL = "tiny-qwen"
ANSWER = "\n</think>\n\nRead.<|im_end|>"


def text_pdf(*pages: str) -> bytes:
    """A PDF whose pages each show one line of text (Helvetica), with a correct cross-reference table."""
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>",
               b"<< /Type /Pages /Kids [" + b" ".join(b"%d 0 R" % (4 + 2 * i) for i in range(len(pages)))
               + b"] /Count %d >>" % len(pages),
               b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"]
    for i, text in enumerate(pages):
        stream = b"BT /F1 12 Tf 72 72 Td (" + text.encode("latin-1") + b") Tj ET"
        objects.append(b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 300 144] /Contents %d 0 R "
                       b"/Resources << /Font << /F1 3 0 R >> >> >>" % (5 + 2 * i))
        objects.append(b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream")
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    return bytes(out)


def data_url(pdf: bytes) -> str:
    return "data:application/pdf;base64," + base64.b64encode(pdf).decode()


def asking(file_part: dict) -> dict:
    return {"model": MODEL, "input": [{"role": "user", "content": [
        {"type": "input_text", "text": "What does it say?"}, {"type": "input_file", **file_part}]}]}


def posted(app, path: str, body: dict) -> tuple[int, dict, str]:
    """(status, answer, the prompt the model read): the request carries a traceparent of its own, so its
    trace is found by id."""
    import secrets

    trace_id = secrets.token_hex(16)
    status, answer = app.call("POST", path, body, headers={"traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-01"})
    if status != 200:
        return status, answer, ""
    app.stored(f"/v1/traces/{trace_id}", timeout=30)
    prompt = app.stored(f"/v1/traces/{trace_id}/prompt")
    return status, answer, "".join(token[1] for token in prompt["tokens"])


@pytest.mark.parametrize("how", ["data_url", "raw_base64"])
def test_a_pdfs_pages_reach_the_model_in_order(replay_app, how):
    pdf = text_pdf("First page: the plan.", "Second page: the result.")
    part = ({"filename": "report.pdf", "file_data": data_url(pdf)} if how == "data_url"
            else {"filename": "report.pdf", "file_data": base64.b64encode(pdf).decode()})
    replay_app.replay(ANSWER)
    status, answer, prompt = posted(replay_app, "/v1/responses", asking(part))
    assert status == 200, answer
    first, second = prompt.index("First page: the plan."), prompt.index("Second page: the result.")
    assert prompt.index("[report.pdf, page 1 of 2]") < first < prompt.index("[report.pdf, page 2 of 2]") < second


def test_a_pdf_in_a_chat_completions_file_part(replay_app):
    replay_app.replay(ANSWER)
    status, answer, prompt = posted(replay_app, "/v1/chat/completions", {"model": MODEL, "messages": [{
        "role": "user", "content": [{"type": "text", "text": "Title?"}, {"type": "file", "file": {
            "filename": "t.pdf", "file_data": data_url(text_pdf("Quarterly numbers"))}}]}]})
    assert status == 200, answer
    assert "Quarterly numbers" in prompt


def blank_pages(count: int) -> bytes:
    writer = PdfWriter()
    for _ in range(count):
        writer.add_blank_page(72, 72)
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def encrypted() -> bytes:
    writer = PdfWriter()
    writer.add_blank_page(72, 72)
    writer.encrypt("secret")
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


@pytest.mark.parametrize(("pdf", "code"), [
    (lambda: blank_pages(10_000), "file_too_large"),
    (encrypted, "encrypted_file"),
    (lambda: b"%PDF-1.4\n1 0 obj << /Type /Catalog /Pages 9 0 R >> garbage", "invalid_file"),
    (lambda: b"GIF89a not a pdf at all", "unsupported_file"),
], ids=["10000_pages", "encrypted", "malformed", "not_a_pdf"])
def test_an_unreadable_pdf_is_a_400_naming_the_part(replay_app, pdf, code):
    """Read on the rendering thread, refused there in the API's own shape, as at the door before. The
    10,000-page file is refused for the count its page tree declares, before any page is read (the
    refusal names it); a wall-clock bound proved nothing more and failed on a loaded machine."""
    body = asking({"filename": "x.pdf", "file_data": data_url(pdf())})
    status, answer = replay_app.call("POST", "/v1/responses", body)
    assert status == 400, answer
    assert answer["error"]["code"] == code and answer["error"]["param"] == "input[0].content[1].file_data", answer
    assert answer["error"]["type"] == "invalid_request_error", answer
    assert answer["error"]["message"].startswith("'input[0].content[1].file_data': "), answer
    if code == "file_too_large":
        assert "the PDF has 10,000 pages; at most 1,000 are read." in answer["error"]["message"], answer


def test_a_pdf_that_is_not_base64_is_a_400(replay_app):
    status, answer = replay_app.call("POST", "/v1/responses", asking({"file_data": "data:application/pdf;base64,%%%"}))
    assert status == 400 and answer["error"]["code"] == "invalid_file", answer


def test_a_page_count_that_understates_the_pages_is_found_out(replay_app):
    """The file's /Count is the client's word: the page tree is walked, no further than the limit. The
    walk's own refusal ("more than 1,000 pages") says it stopped there, before any page was read; a
    wall-clock bound here failed on a loaded machine (issue 53's stop) and proved nothing more."""
    pdf = text_pdf(*["x"] * 1500).replace(b"/Count 1500", b"/Count 1   ")  # same length: offsets hold
    status, answer = replay_app.call("POST", "/v1/responses", asking({"filename": "x.pdf", "file_data": data_url(pdf)}))
    assert status == 400 and answer["error"]["code"] == "file_too_large", answer
    assert "more than 1,000 pages" in answer["error"]["message"]


def test_a_pdf_past_the_size_limit_is_refused_at_the_door(replay_app, monkeypatch):
    """Its size is what the request's parse checks (from the base64's length, nothing decoded)."""
    monkeypatch.setattr(pdf_module, "MAX_BYTES", 1000)
    pdf = text_pdf(*["a page of text"] * 20)
    status, answer = replay_app.call("POST", "/v1/responses", asking({"filename": "x.pdf", "file_data": data_url(pdf)}))
    assert status == 400 and answer["error"]["code"] == "file_too_large", answer
    assert answer["error"]["message"] == (f"'input[0].content[1].file_data': the PDF is {len(pdf):,} bytes; at most "
                                          "1,000 are read."), answer


@pytest.mark.parametrize("beside", ["text", "an image"])
def test_a_pdf_read_later_is_the_text_it_was_read_as_at_the_door(beside):
    """The conversation after the PDF is read is the one the request's parse made when it read the PDF
    itself: a message of texts one string, joined as before; beside an image, a text part."""
    pdf = text_pdf("First page: the plan.", "Second page: the result.")
    file_part = Attachment(type="input_file", filename="report.pdf", file_data=data_url(pdf))
    other = ("Read it." if beside == "text" else
             media_part(Attachment(type="input_image", image_url="data:image/png;base64,iVBORw0KGgo="), "input[0].content[0]"))
    parsed = [{"role": "user", "content": joined([other, media_part(file_part, "input[0].content[1]")])}]
    text = pdf_module.pdf_text(base64.b64encode(pdf).decode(), "input[0].content[1].file_data", "report.pdf")
    assert pdf_module.with_pdf_text(parsed) == [{"role": "user", "content": joined([other, text])}]
    assert text.startswith("[report.pdf, page 1 of 2]\nFirst page: the plan.")


def test_health_answers_while_a_pdf_is_read(replay_app, monkeypatch):
    """The PDF's text is read off the event loop: held in its reading, the request leaves the server free,
    and /health answers; let go, the request completes with the PDF's text in its prompt. Were the text
    read on the event loop, /health could not answer before the reading ended (its timeout would)."""
    reading, let_go = threading.Event(), threading.Event()
    read = pdf_module.pdf_text

    def held(*args, **kwargs):
        reading.set()
        let_go.wait(60)
        return read(*args, **kwargs)

    monkeypatch.setattr(pdf_module, "pdf_text", held)
    replay_app.replay(ANSWER)
    part = {"filename": "report.pdf", "file_data": data_url(text_pdf("Held while /health answered."))}
    with ThreadPoolExecutor(1) as pool:
        answered = pool.submit(posted, replay_app, "/v1/responses", asking(part))
        try:
            assert reading.wait(60), "the PDF was never read"
            with urllib.request.urlopen(replay_app.url + "/health", timeout=20) as health:
                assert health.status == 200
            assert not answered.done()  # still held: /health answered during the reading, not after it
        finally:
            let_go.set()
        status, answer, prompt = answered.result(timeout=120)
    assert status == 200, answer
    assert "Held while /health answered." in prompt
