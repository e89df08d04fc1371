"""Media a client attached: the parts as the API layer found them (`MediaPart`), their limits, and
where they sit in a conversation (in Hugging Face's message format, as the processor reads it).
Decoding them is decode.py's; reading a PDF's text, pdf.py's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# What a model reads in the place of an item it cannot take, where refusing would end an agent's
# session for something the client did not choose to send it (a tool's output, a system prompt).
NOTE = "[an image or file was attached here; this server reads text only]"


class MediaError(ValueError):
    """A part that cannot be used: its message is for the client, `param` names the part."""

    def __init__(self, message: str, param: str, code: str = "invalid_media") -> None:
        super().__init__(message)
        self.param, self.code = param, code


@dataclass(frozen=True, slots=True)
class MediaLimits:
    """What one request may attach (the server's --media-* settings, whose defaults are Settings')."""

    max_bytes: int  # per item: its bytes (base64 decoded, or as fetched)
    max_pixels: int  # per image (or video frame): a 5K or 6K screenshot fits, a decompression bomb does not
    max_items: int  # per request
    max_audio_seconds: float  # per clip
    max_video_frames: int  # per video, as the processor samples it
    # Per request, its images' pixels in all (as their headers say): the processor holds ~40 bytes a pixel.
    max_request_pixels: int = 33_554_432


@dataclass(slots=True)
class MediaPart:
    """One attached item as the client sent it: what it is, its base64 text, and where it was."""

    kind: str  # "image" | "audio" | "video" | "pdf" (read as its pages' text: pdf.py)
    encoded: str  # base64, as in the data URL
    param: str  # e.g. messages[1].content[0].image_url.url
    mime: str = ""  # as the data URL declared it (or the server that served it)
    info: dict = field(default_factory=dict)  # filled once decoded: format, size, bytes, sha256
    url: str = ""  # an http(s) URL to fetch (proxy/api/media_fetch.py), instead of `encoded`
    raw: bytes | None = None  # its bytes, once fetched
    filename: str = ""  # a file's name, as the client gave it (a PDF's pages are headed with it)

    def data_url(self) -> str:
        """The item as a data URL (a fetched one too: the server it goes on to need not fetch it)."""
        import base64

        encoded = base64.b64encode(self.raw).decode() if self.raw is not None else self.encoded
        return f"data:{self.mime or 'application/octet-stream'};base64,{encoded}"


def with_decoded(messages: list[dict], decoded: dict[int, Any]) -> list[dict]:
    """The conversation with each item's part holding its decoded form (`decoded`: id(part) → it),
    as the processor's chat template reads it: {"type": "image", "image": PIL image}; a video's
    part also holds its metadata (`video_metadata()` takes it out)."""
    out = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list) and any(isinstance(p, dict) and "media" in p for p in content):
            content = [_decoded_part(p["media"], decoded[id(p["media"])])
                       if isinstance(p, dict) and isinstance(p.get("media"), MediaPart) else p for p in content]
            message = {**message, "content": content}
        out.append(message)
    return out


def _decoded_part(part: MediaPart, value: Any) -> dict:
    if part.kind == "video":
        frames, metadata = value
        return {"type": "video", "video": frames, "video_metadata": metadata}
    return {"type": part.kind, part.kind: value}


def video_metadata(messages: list[dict]) -> tuple[list[dict], list[Any]]:
    """The conversation without its videos' metadata, and the metadata in the videos' order, as the
    processor takes it (beside the messages, one per video)."""
    found: list[Any] = []
    out = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list) and any(isinstance(p, dict) and "video_metadata" in p for p in content):
            parts = []
            for p in content:
                if isinstance(p, dict) and "video_metadata" in p:
                    found.append(p["video_metadata"])
                    p = {k: v for k, v in p.items() if k != "video_metadata"}
                parts.append(p)
            message = {**message, "content": parts}
        out.append(message)
    return out, found


def placeholders_only(messages: list[dict]) -> list[dict]:
    """The conversation with each decoded item's part reduced to its type ({"type": "image"}): what
    a template needs to write the item's placeholder, without the item."""
    out = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list) and any(isinstance(p, dict) and p.get("type") in MEDIA_TYPES for p in content):
            content = [{"type": p["type"]} if isinstance(p, dict) and p.get("type") in MEDIA_TYPES else p
                       for p in content]
            message = {**message, "content": content}
        out.append(message)
    return out


MEDIA_TYPES = ("image", "video", "audio")


def has_media(messages: list[dict]) -> bool:
    return any(isinstance(p, dict) and p.get("type") in ("image", "video", "audio")
               for m in messages if isinstance(m.get("content"), list) for p in m["content"])


def lift_from_tool_results(messages: list[dict]) -> list[dict]:
    """For a template that renders only the text of a tool's output (Gemma 4's): the items of each
    run of tool messages move, in order, into a user message right after the run, as an agent
    harness does itself when its API has no place for them (pi on Chat Completions)."""
    out: list[dict] = []
    lifted: list[dict] = []
    for message in messages:
        if message.get("role") != "tool" and lifted:
            out.append({"role": "user", "content": lifted})
            lifted = []
        content = message.get("content")
        if message.get("role") == "tool" and isinstance(content, list):
            items = [p for p in content if isinstance(p, dict) and p.get("type") in ("image", "video", "audio")]
            if items:
                lifted += items
                message = {**message, "content": [p for p in content if p not in items]}
        out.append(message)
    if lifted:
        out.append({"role": "user", "content": lifted})
    return out


def noted_in_tool_results(messages: list[dict], accepted: frozenset[str]) -> list[dict]:
    """Items in tools' outputs of a kind the model cannot take, each replaced by NOTE."""
    out = []
    for message in messages:
        content = message.get("content")
        if message.get("role") == "tool" and isinstance(content, list):
            content = [{"type": "text", "text": NOTE} if isinstance(p, dict) and isinstance(p.get("media"), MediaPart)
                       and p["media"].kind not in accepted else p for p in content]
            if all(p.get("type") == "text" for p in content):  # all text again: one string, as before
                content = "\n".join(p["text"] for p in content)
            message = {**message, "content": content}
        out.append(message)
    return out


def item_tokens(ids: list[int], media_ids: dict[int, str], runs_per_item: list[int]) -> list[tuple[int, int, int]]:
    """(offset, span, tokens) of each item in a prompt: where its first run of placeholder tokens
    starts, how far its last one ends from there, and how many placeholders it became. An image or
    a clip is one run; a video one per frame (Gemma 4) or per pair of frames (Qwen3.5), with the
    frames' timestamps between them."""
    runs = token_runs(ids, media_ids)
    out = []
    for count in runs_per_item:
        mine, runs = runs[:count], runs[count:]
        if mine:
            out.append((mine[0][0], sum(mine[-1]) - mine[0][0], sum(n for _, n in mine)))
        else:
            out.append((0, 0, 0))
    return out


def token_runs(ids: list[int], media_ids: dict[int, str]) -> list[tuple[int, int]]:
    """(offset, length) of each run of media placeholder tokens in a prompt, in order."""
    runs: list[tuple[int, int]] = []
    for i, token_id in enumerate(ids):
        if token_id in media_ids:
            if runs and sum(runs[-1]) == i:
                runs[-1] = (runs[-1][0], runs[-1][1] + 1)
            else:
                runs.append((i, 1))
    return runs
