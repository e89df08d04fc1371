"""Request parsing every API surface shares: the seed's range, past tool calls' arguments, tool_choice, media
parts (read through Attachment), and warnings said once."""

from __future__ import annotations

import logging
from typing import Any

from pydantic import BaseModel, ConfigDict

from looptrace.families.media.parts import NOTE, MediaError, MediaPart
from looptrace.families.media.pdf import pdf_part
from looptrace.families.prompt_items import ITEM_LIMITS, TooManyItems

from .errors import invalid
from .validation import embedded_json, tool_name

log = logging.getLogger("looptrace")
_warned: set[str] = set()

MEDIA_PARTS = ("image_url", "input_image", "input_audio", "input_file", "file", "video_url")
MEDIA_NOTE = NOTE  # what an item in a system prompt or an assistant's words becomes

MAX_STOPS, MAX_STOP_LENGTH = 16, 256  # stop strings: more than OpenAI's 4; each is matched as every token arrives


def warn_once(key: str, message: str, *args) -> None:
    # Clients send the same things on every request of a session: say it once, not per request.
    if key not in _warned:
        _warned.add(key)
        log.warning(message, *args)


def at_most(items: list, kind: str, param: str) -> list:
    """`items`, refused before any is read when there are more than the engine would take
    (families/prompt_items.py): a parser must not build what is refused anyway."""
    limit = ITEM_LIMITS[kind][0]
    if len(items) > limit:
        raise invalid(str(TooManyItems(kind, limit, param)), param=param, code="too_many_items")
    return items


def media_note() -> str:
    warn_once("media", "media in a request were replaced by a note: this server reads text only")
    return MEDIA_NOTE


class MediaFields(BaseModel):
    """What an attachment of Chat Completions or Responses may hold, at its top or in its nested object
    (`image_url: {"url"}`, `input_audio: {"data", "format"}`, `file: {"file_data", "filename"}`). Typed
    loosely: media_part checks each in the words it has always used. (A protocol model's config, spelled
    out: protocol.py is a sibling of this module, not below it.)"""

    model_config = ConfigDict(extra="allow", frozen=True, strict=True)

    type: Any = None  # first, as the part's own type is when dumped
    url: Any = None
    image_url: Any = None
    video_url: Any = None
    input_audio: Any = None
    data: Any = None
    format: Any = None
    file: Any = None
    file_id: Any = None
    file_data: Any = None
    filename: Any = None


class Attachment(MediaFields):
    """A media part of either OpenAI API, by its `type` (image_url, input_image, input_audio, file, …)."""

    type: str


def media_part(part: Attachment | dict, param: str) -> dict:
    """An attached item of either API as `{"type": "image", "media": MediaPart}`, in the engine's
    (Hugging Face's) message format. Only its data URL is read here: its bytes are decoded on the
    rendering thread (families/media/decode.py). A PDF file is `{"type": "pdf", "media": MediaPart}`,
    read there as its pages' text (families/media/pdf.py): only its size is checked here."""
    if isinstance(part, dict):  # a caller still holding the part as a dict (chat/request.py, until it passes its model)
        part = Attachment.model_validate(part)
    kind = part.type
    if kind == "input_audio":  # {"input_audio": {"data": base64, "format": "wav"}} (or the two at the top)
        nested = isinstance(part.input_audio, dict)
        audio, where = (_nested(part.input_audio), f"{param}.input_audio") if nested else (part, param)
        if not isinstance(audio.data, str):
            raise invalid(f"Invalid type for '{where}.data': expected a base64 string.", param=f"{where}.data",
                          code="invalid_type")
        if not isinstance(audio.format, str) or not audio.format:
            raise invalid(f"Missing required parameter: '{where}.format' (wav, mp3, flac, ogg, ...).",
                          param=f"{where}.format", code="missing_required_parameter")
        return {"type": "audio", "media": MediaPart("audio", audio.data, f"{where}.data",
                                                    f"audio/{audio.format.lower()[:16]}")}
    if kind in ("image_url", "video_url"):  # Chat Completions (video as vLLM takes it): {"url": ...} or the URL
        holder = part.image_url if kind == "image_url" else part.video_url
        url, where = ((_nested(holder).url, f"{param}.{kind}.url") if isinstance(holder, dict)
                      else (holder, f"{param}.{kind}"))
    elif kind == "input_image":  # Responses
        if part.file_id is not None:
            raise invalid(f"'{param}.file_id': this server has no files API; send the image as a data URL in "
                          "'image_url'.", param=f"{param}.file_id", code="media_unsupported")
        url, where = part.image_url, f"{param}.image_url"
    else:  # a file part: Chat's {"file": {"file_data"}} or Responses' {"file_data"}
        holder = _nested(part.file) if kind == "file" and isinstance(part.file, dict) else part
        if holder.file_data is None:
            raise invalid(f"'{param}': only a file sent inline as 'file_data' can be read here (there is no files "
                          "API, and URLs are not fetched).", param=param, code="media_unsupported")
        url, where = holder.file_data, f"{param}.file_data"
        filename = holder.filename if isinstance(holder.filename, str) else None
        if isinstance(url, str) and (url.startswith("data:application/pdf;") or _pdf_named(filename, url)):
            return _pdf(url.partition(",")[2] if url.startswith("data:") else url, where, filename)
    if not isinstance(url, str):
        raise invalid(f"Invalid type for '{where}': expected a string.", param=where, code="invalid_type")
    if kind in ("image_url", "input_image", "video_url") and url.startswith(("http://", "https://")):
        # Fetched, if its host is listed, before the request is prepared (media_fetch.py).
        media = "video" if kind == "video_url" else "image"
        return {"type": media, "media": MediaPart(media, "", where, url=url)}
    mime, encoded = _data_url(url, where)
    media = mime.split("/", 1)[0]
    taken = {"image_url": ("image",), "input_image": ("image",), "video_url": ("video",)}.get(
        kind, ("image", "audio", "video"))  # a file part may hold any of them
    if media not in taken:
        what = " or ".join(f"{t}s" for t in taken)
        raise invalid(f"'{where}' is {mime or 'of no declared type'}; this part takes {what}.", param=where,
                      code="media_unsupported")
    return {"type": media, "media": MediaPart(media, encoded, where, mime)}


def _nested(value: dict) -> MediaFields:
    # An attachment's nested object: every field is Any, so this parse never refuses.
    return MediaFields.model_validate(value)


def _pdf(encoded: str, where: str, filename: str | None) -> dict:
    try:
        return {"type": "pdf", "media": pdf_part(encoded, where, filename)}
    except MediaError as exc:
        raise invalid(str(exc), param=exc.param, code=exc.code) from None


def _pdf_named(filename: str | None, data: str) -> bool:
    """Raw base64 (no data URL) of a file named *.pdf: how some clients send a PDF's `file_data`."""
    return not data.startswith("data:") and filename is not None and filename.lower().endswith(".pdf")


def joined(parts: list) -> str | list[dict]:
    """Texts and media parts in order → one string when all are text, joined as vLLM joins them
    (not every template takes a list of parts); else the parts in Hugging Face's format."""
    if all(isinstance(p, str) for p in parts):
        return "\n".join(parts)
    return [{"type": "text", "text": p} if isinstance(p, str) else p for p in parts]


def _data_url(url: str, where: str) -> tuple[str, str]:
    """(MIME type, base64 text) of a `data:` URL; anything else is refused, never fetched."""
    if not url.startswith("data:"):
        scheme = url.split(":", 1)[0][:16] if ":" in url else "none"
        raise invalid(f"'{where}': only data URLs (data:image/png;base64,...) and, from the hosts "
                      f"--allowed-media-domains lists, http(s) URLs are read (scheme {scheme!r}).", param=where,
                      code="media_unsupported")
    header, sep, encoded = url[5:].partition(",")
    if not sep or not header.endswith(";base64"):
        raise invalid(f"'{where}': a data URL must be base64 (data:MIME;base64,...).", param=where,
                      code="invalid_media")
    # The declared type is the client's string: kept short, it is only shown (escaped) and compared.
    return header[: -len(";base64")].split(";", 1)[0].strip().lower()[:64], encoded


SEED_RANGE = (-(2**63), 2**64 - 1)  # what a torch generator (and vLLM) can be seeded with


def call_arguments(arguments: object, param: str) -> dict:
    """A past call's arguments (a JSON string or an object) as the dict templates iterate over."""
    if isinstance(arguments, str):
        arguments = embedded_json(arguments, param) if arguments.strip() else {}
    if not isinstance(arguments, dict):
        raise invalid(f"'{param}' must be a JSON object.", param=param)
    return arguments


class _Choice(BaseModel):
    """A named tool_choice, `{"name"}` or Chat's `{"function": {"name"}}`: typed loosely, refused below
    in the words it has always had."""

    model_config = ConfigDict(extra="allow", frozen=True)
    name: Any = None
    function: Any = None


def parse_tool_choice(choice: object, tools: list[dict] | None) -> str | dict:
    """"auto" | "none" | "required" | {"name": NAME}, checked against the tools offered."""
    if choice is None:
        return "auto"
    if isinstance(choice, str):
        if choice not in ("auto", "none", "required"):
            raise invalid(f"Invalid value for 'tool_choice': {choice!r}; expected 'auto', 'none', 'required' or a "
                          "named function.", param="tool_choice")
        if choice == "required" and not tools:
            raise invalid("'tool_choice' is 'required' but no tools were given.", param="tool_choice")
        return choice
    if isinstance(choice, dict):
        named = _Choice.model_validate(choice)
        nested = isinstance(named.function, dict)
        name = _Choice.model_validate(named.function).name if nested else named.name
        if not isinstance(name, str):
            raise invalid("'tool_choice' names no function.", param="tool_choice")
        tool_name(name, "tool_choice.function.name" if nested else "tool_choice.name")
        if name not in {t["function"]["name"] for t in tools or []}:
            raise invalid(f"'tool_choice' names the function {name!r}, which is not among the tools.",
                          param="tool_choice")
        return {"name": name}
    raise invalid("Invalid type for 'tool_choice': expected a string or an object.", param="tool_choice",
                  code="invalid_type")
