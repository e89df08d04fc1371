"""The Gemini API's `systemInstruction` and `contents` (protocol.py's models) → the engine's messages
(Hugging Face's common format).

A user turn's parts are text, inlineData (images, audio, video, a PDF) and functionResponse; each
functionResponse becomes a `tool` message where it stands, so text around it stays in order. A model
turn's parts are text, thought text and functionCall: its thoughts become `reasoning_content`, which
the family renders as it renders earlier reasoning; a `thoughtSignature` is taken and ignored.

Gemini names a call only sometimes (`id`): a call without one gets an id made from its place, and a
response without one answers the first call of its name still unanswered, as Google pairs them.
"""

from __future__ import annotations

from looptrace.common.jsonio import dumps
from looptrace.families.media.parts import MediaError, MediaPart
from looptrace.families.media.pdf import pdf_part

from ..errors import invalid
from ..request_parts import joined, media_note
from .protocol import Content, Part

MEDIA_KINDS = ("image", "audio", "video")
SIGNATURE = frozenset(("thoughtSignature", "thought_signature"))  # taken and ignored


def conversation(system: Content | None, contents: list[Content]) -> list[dict]:
    messages: list[dict] = []
    if system is not None:
        messages.append({"role": "system", "content": _system(system)})
    if not contents:
        raise invalid("'contents' must hold at least one content.", param="contents", code="empty_array")
    waiting: list[tuple[str, str]] = []  # (name, id) of the calls no response has answered yet
    for i, content in enumerate(contents):
        parts = content.parts or []
        if content.role == "model":
            messages.append(_model(parts, i, waiting))
        else:
            _user(parts, i, waiting, messages)
    return messages


def _system(system: Content) -> str:
    texts = []
    for j, part in enumerate(system.parts or []):
        if part.text is None:
            raise invalid(f"Invalid value for 'systemInstruction.parts[{j}]': a system instruction holds text parts "
                          "only.", param=f"systemInstruction.parts[{j}]")
        texts.append(part.text)
    return "\n".join(texts)


def _user(parts: list[Part], i: int, waiting: list[tuple[str, str]], messages: list[dict]) -> None:
    held: list = []
    for j, part in enumerate(parts):
        response = part.function_response
        if response is not None:
            if held:  # what the user wrote before it stays before it
                messages.append({"role": "user", "content": joined(held)})
                held = []
            messages.append({"role": "tool", "tool_call_id": _answered(response.id, response.name, waiting),
                             "content": _result(response.response)})
        elif part.text is not None:
            held.append(part.text)
        elif not _empty(part):
            held.append(_media(part, f"contents[{i}].parts[{j}]", "user"))
    if held or not parts:
        messages.append({"role": "user", "content": joined(held)})


def _answered(call_id: str | None, name: str, waiting: list[tuple[str, str]]) -> str:
    for k, (waiting_name, waiting_id) in enumerate(waiting):
        if waiting_id == call_id or (call_id is None and waiting_name == name):
            del waiting[k]
            return waiting_id
    return call_id or name  # a response to no call shown: the template still renders it


def _result(response: dict | None) -> str:
    """A function's response object as the text the model reads: the one string it wraps where it is
    only that (Gemini CLI sends {"output": "…"}), else its JSON."""
    if not response:
        return ""
    if len(response) == 1:
        (key, value), = response.items()
        if key in ("output", "result", "content") and isinstance(value, str):
            return value
    return dumps(response)


def _model(parts: list[Part], i: int, waiting: list[tuple[str, str]]) -> dict:
    texts: list = []
    thoughts: list[str] = []
    calls: list[dict] = []
    for j, part in enumerate(parts):
        call = part.function_call
        if call is not None:
            call_id = call.id or f"call_{i}_{j}"  # stable: the same history makes the same prompt
            waiting.append((call.name, call_id))
            calls.append({"id": call_id, "type": "function",
                          "function": {"name": call.name, "arguments": call.args or {}}})
        elif part.text is not None:
            (thoughts if part.thought else texts).append(part.text)
        elif part.function_response is not None:
            raise invalid(f"Invalid value for 'contents[{i}].parts[{j}]': a functionResponse belongs in a user "
                          "turn.", param=f"contents[{i}].parts[{j}]")
        elif not _empty(part):
            texts.append(_media(part, f"contents[{i}].parts[{j}]", "assistant"))
    # No text is "" rather than None, which some templates (SmolLM2's) cannot render.
    out: dict = {"role": "assistant", "content": joined(texts)}
    if thoughts:
        out["reasoning_content"] = "".join(thoughts)
    if calls:
        out["tool_calls"] = calls
    return out


def _empty(part: Part) -> bool:
    """A part of nothing but a thought's signature (or a bare `thought` flag): nothing to render."""
    return part.inline_data is None and part.file_data is None and set(part.model_extra or ()) <= SIGNATURE


def _media(part: Part, param: str, role: str) -> str | dict:
    """An inlineData (or fileData by http(s) URL) part, as a media part of the engine's message."""
    if part.inline_data is not None:
        blob, where = part.inline_data, f"{param}.inlineData"
        mime = blob.mime_type.strip().lower()[:64]  # the client's string: kept short, only shown and compared
        if mime == "application/pdf":
            try:
                media = pdf_part(blob.data, f"{where}.data")
            except MediaError as exc:
                raise invalid(str(exc), param=exc.param, code=exc.code) from None
        elif mime.split("/", 1)[0] in MEDIA_KINDS:
            media = MediaPart(mime.split("/", 1)[0], blob.data, f"{where}.data", mime)
        else:
            raise invalid(f"'{where}.mimeType' is {mime!r}; inline data is read as an image, audio, video or PDF.",
                          param=f"{where}.mimeType", code="media_unsupported")
    elif part.file_data is not None:
        uri, where = part.file_data.file_uri, f"{param}.fileData.fileUri"
        if not uri.startswith(("http://", "https://")):
            raise invalid(f"'{where}' must be an http(s) URL: this server has no files API.", param=where,
                          code="media_unsupported")
        media = MediaPart("image", "", where, url=uri)  # fetched if its host is listed
    else:
        raise invalid(f"Invalid value for '{param}': a part here holds text, inlineData, fileData, functionCall or "
                      "functionResponse.", param=param)
    if role != "user":
        return media_note()
    return {"type": "pdf" if media.kind == "pdf" else media.kind, "media": media}
