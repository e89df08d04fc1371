"""Request parsing every API surface shares: sampling ranges, past tool calls' arguments, tool_choice, media
parts, and warnings said once."""

from __future__ import annotations

import logging

from looptrace.families.media.parts import NOTE, MediaError, MediaPart
from looptrace.families.media.pdf import pdf_part
from looptrace.families.prompt_items import ITEM_LIMITS, TooManyItems

from .errors import invalid
from .validation import embedded_json, field, in_range, tool_name

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


def media_part(part: dict, param: str) -> dict:
    """An attached item of either API as `{"type": "image", "media": MediaPart}`, in the engine's
    (Hugging Face's) message format. Only its data URL is read here: its bytes are decoded on the
    rendering thread (families/media/decode.py). A PDF file is `{"type": "pdf", "media": MediaPart}`,
    read there as its pages' text (families/media/pdf.py): only its size is checked here."""
    kind = part.get("type")
    if kind == "input_audio":  # {"input_audio": {"data": base64, "format": "wav"}} (or the two at the top)
        audio = part.get("input_audio") if isinstance(part.get("input_audio"), dict) else part
        where = f"{param}.input_audio" if audio is not part else param
        data, fmt = audio.get("data"), audio.get("format")
        if not isinstance(data, str):
            raise invalid(f"Invalid type for '{where}.data': expected a base64 string.", param=f"{where}.data",
                          code="invalid_type")
        if not isinstance(fmt, str) or not fmt:
            raise invalid(f"Missing required parameter: '{where}.format' (wav, mp3, flac, ogg, ...).",
                          param=f"{where}.format", code="missing_required_parameter")
        return {"type": "audio", "media": MediaPart("audio", data, f"{where}.data", f"audio/{fmt.lower()[:16]}")}
    if kind in ("image_url", "video_url"):  # Chat Completions (video as vLLM takes it): {"url": ...} or the URL
        holder = part.get(kind)
        url, where = (holder.get("url"), f"{param}.{kind}.url") if isinstance(holder, dict) else (holder, f"{param}.{kind}")
    elif kind == "input_image":  # Responses
        if part.get("file_id") is not None:
            raise invalid(f"'{param}.file_id': this server has no files API; send the image as a data URL in "
                          "'image_url'.", param=f"{param}.file_id", code="media_unsupported")
        url, where = part.get("image_url"), f"{param}.image_url"
    else:  # a file part: Chat's {"file": {"file_data"}} or Responses' {"file_data"}
        holder = part.get("file") if kind == "file" and isinstance(part.get("file"), dict) else part
        if holder.get("file_data") is None:
            raise invalid(f"'{param}': only a file sent inline as 'file_data' can be read here (there is no files "
                          "API, and URLs are not fetched).", param=param, code="media_unsupported")
        url, where = holder.get("file_data"), f"{param}.file_data"
        if isinstance(url, str) and (url.startswith("data:application/pdf;") or _pdf_named(holder, url)):
            return _pdf(url.partition(",")[2] if url.startswith("data:") else url, where,
                        holder.get("filename") if isinstance(holder.get("filename"), str) else None)
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


def _pdf(encoded: str, where: str, filename: str | None) -> dict:
    try:
        return {"type": "pdf", "media": pdf_part(encoded, where, filename)}
    except MediaError as exc:
        raise invalid(str(exc), param=exc.param, code=exc.code) from None


def _pdf_named(holder: dict, data: str) -> bool:
    """Raw base64 (no data URL) of a file named *.pdf: how some clients send a PDF's `file_data`."""
    name = holder.get("filename")
    return not data.startswith("data:") and isinstance(name, str) and name.lower().endswith(".pdf")


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


def temperature_and_top_p(body: dict) -> tuple[float | None, float | None]:
    temperature = field(body, "temperature", float, "temperature")
    in_range(temperature, "temperature", 0, 2)
    top_p = field(body, "top_p", float, "top_p")
    if top_p is not None and not 0 < top_p <= 1:
        raise invalid(f"Invalid value for 'top_p': {top_p} must be greater than 0 and at most 1.", param="top_p")
    return temperature, top_p


SEED_RANGE = (-(2**63), 2**64 - 1)  # what a torch generator (and vLLM) can be seeded with


def seed(body: dict) -> int | None:
    value = field(body, "seed", int, "seed")
    in_range(value, "seed", *SEED_RANGE)
    return value


def call_arguments(arguments: object, param: str) -> dict:
    """A past call's arguments (a JSON string or an object) as the dict templates iterate over."""
    if isinstance(arguments, str):
        arguments = embedded_json(arguments, param) if arguments.strip() else {}
    if not isinstance(arguments, dict):
        raise invalid(f"'{param}' must be a JSON object.", param=param)
    return arguments


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
        function = choice.get("function") if isinstance(choice.get("function"), dict) else choice
        name = function.get("name")
        if not isinstance(name, str):
            raise invalid("'tool_choice' names no function.", param="tool_choice")
        tool_name(name, "tool_choice.name" if function is choice else "tool_choice.function.name")
        if name not in {t["function"]["name"] for t in tools or []}:
            raise invalid(f"'tool_choice' names the function {name!r}, which is not among the tools.",
                          param="tool_choice")
        return {"name": name}
    raise invalid("Invalid type for 'tool_choice': expected a string or an object.", param="tool_choice",
                  code="invalid_type")


def parse_tools(tools: list | None) -> list[dict] | None:
    """Function tools in Chat Completions' shape (which looptrace's /v1/generate takes too), checked."""
    if not tools:
        return None
    out = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise invalid(f"Invalid type for '{where}': expected an object.", param=where, code="invalid_type")
        if tool.get("type", "function") != "function":
            raise invalid(f"Invalid value for '{where}.type': {tool.get('type')!r}; only 'function' tools are "
                          "supported here.", param=f"{where}.type")
        function = field(tool, "function", dict, f"{where}.function", required=True)
        name = field(function, "name", str, f"{where}.function.name", required=True)
        if not name:
            raise invalid(f"'{where}.function.name' must not be empty.", param=f"{where}.function.name")
        spec = {"name": tool_name(name, f"{where}.function.name")}
        description = field(function, "description", str, f"{where}.function.description")
        if description is not None:
            spec["description"] = description
        parameters = field(function, "parameters", dict, f"{where}.function.parameters")
        spec["parameters"] = parameters if parameters is not None else {"type": "object", "properties": {}}
        out.append({"type": "function", "function": spec})
    return out
