"""Media a client attached, decoded for the checkpoint's processor: images with pillow, audio with
PyAV (FFmpeg's decoders: WAV, MP3, FLAC, Ogg, …), mono at the processor's sampling rate.

The API layer finds the parts and their bytes (`MediaPart`); decoding happens here, on the
rendering thread, never on the event loop. Every limit has a flag (proxy/settings.py) and going past
one is a `MediaError` naming the limit and the part, which the server answers with a 400, as it does
a corrupt or undecodable item. pillow is an optional extra (`looptrace[media]`): without it, media
is a 400 saying what to install, never a 500.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
from dataclasses import dataclass, field
from typing import Any

IMAGE_FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF")
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
    max_bytes: int = 20 * 1024**2  # per item, as sent (after base64)
    max_pixels: int = 33_554_432  # per image: a 5K or 6K screenshot fits, a decompression bomb does not
    max_items: int = 16  # per request
    max_audio_seconds: float = 30.0  # per clip: Gemma 4's audio encoder reads 30 s (750 tokens of 40 ms)


@dataclass(slots=True)
class MediaPart:
    """One attached item as the client sent it: what it is, its base64 text, and where it was."""

    kind: str  # "image" | "audio"
    encoded: str  # base64, as in the data URL
    param: str  # e.g. messages[1].content[0].image_url.url
    mime: str = ""  # as the data URL declared it (or the server that served it)
    info: dict = field(default_factory=dict)  # filled once decoded: format, size, bytes, sha256
    url: str = ""  # an http(s) URL to fetch (proxy/api/media_fetch.py), instead of `encoded`
    raw: bytes | None = None  # its bytes, once fetched


def decode_image(part: MediaPart, limits: MediaLimits) -> Any:
    """The part as an RGB PIL image: EXIF orientation applied, palette and alpha flattened onto
    white, an animated image's first frame (a screenshot or diagram is what agents send; a video
    goes in as a video)."""
    try:
        from PIL import Image, ImageOps, UnidentifiedImageError
    except ImportError as exc:
        raise MediaError("This server cannot decode images: install looptrace[media] (pillow).", part.param,
                         code="media_unsupported") from exc
    data = _bytes(part, limits, "image")
    try:
        image = Image.open(io.BytesIO(data), formats=IMAGE_FORMATS)
        width, height = image.size  # from the header, before any pixel is decoded
        if width * height > limits.max_pixels:
            raise MediaError(f"The image at {part.param} is {width}×{height} pixels; the limit is "
                             f"{limits.max_pixels:,} pixels (--media-max-pixels).", part.param, code="media_too_large")
        fmt = image.format
        image.seek(0)
        image = ImageOps.exif_transpose(image)
        image = _rgb(image)
    except MediaError:
        raise
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        raise MediaError(f"The image at {part.param} could not be decoded ({type(exc).__name__}: {exc}).",
                         part.param) from exc
    part.info = {"format": fmt, "width": image.width, "height": image.height, "bytes": len(data),
                 "sha256": hashlib.sha256(data).hexdigest()}
    return image


def decode_audio(part: MediaPart, limits: MediaLimits, rate: int) -> Any:
    """The part as mono float32 samples at `rate`, as the processor's feature extractor reads them."""
    try:
        import av
        import numpy as np
    except ImportError as exc:
        raise MediaError("This server cannot decode audio: install looptrace[media] (av).", part.param,
                         code="media_unsupported") from exc
    data = _bytes(part, limits, "audio clip")
    try:
        with av.open(io.BytesIO(data), mode="r") as container:
            if not container.streams.audio:
                raise MediaError(f"The audio at {part.param} holds no audio stream.", part.param)
            stream = container.streams.audio[0]
            resampler = av.AudioResampler(format="flt", layout="mono", rate=rate)
            chunks, samples, most = [], 0, int(limits.max_audio_seconds * rate)
            for frame in container.decode(stream):
                for out in resampler.resample(frame):
                    chunks.append(out.to_ndarray()[0])
                    samples += chunks[-1].shape[0]
                if samples > most:  # decoding stops here: a long clip costs no more than the limit
                    raise MediaError(f"The audio at {part.param} is longer than {limits.max_audio_seconds:g} s "
                                     "(--media-max-audio-seconds).", part.param, code="media_too_large")
            chunks += [out.to_ndarray()[0] for out in resampler.resample(None)]
            fmt = container.format.name
    except MediaError:
        raise
    except (av.error.FFmpegError, ValueError, IndexError) as exc:
        raise MediaError(f"The audio at {part.param} could not be decoded ({type(exc).__name__}: {exc}).",
                         part.param) from exc
    audio = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.float32)
    if audio.size == 0:
        raise MediaError(f"The audio at {part.param} holds no samples.", part.param)
    if audio.size > int(limits.max_audio_seconds * rate):
        raise MediaError(f"The audio at {part.param} is longer than {limits.max_audio_seconds:g} s "
                         "(--media-max-audio-seconds).", part.param, code="media_too_large")
    part.info = {"format": fmt, "seconds": round(audio.size / rate, 3), "sampling_rate": rate, "bytes": len(data),
                 "sha256": hashlib.sha256(data).hexdigest()}
    return audio


def _bytes(part: MediaPart, limits: MediaLimits, what: str) -> bytes:
    if part.raw is not None:  # fetched, within the limit
        return part.raw
    if len(part.encoded) * 3 // 4 > limits.max_bytes + 3:
        raise MediaError(f"The {what} at {part.param} is about {len(part.encoded) * 3 // 4:,} bytes; the limit is "
                         f"{limits.max_bytes:,} (--media-max-mb).", part.param, code="media_too_large")
    try:
        return base64.b64decode(part.encoded, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise MediaError(f"The {what} at {part.param} is not valid base64 ({exc}).", part.param) from exc


def _rgb(image):
    from PIL import Image

    if image.mode == "RGB":
        return image
    if image.mode == "P":
        image = image.convert("RGBA")
    if image.mode in ("RGBA", "LA") or (image.mode == "RGBa"):
        background = Image.new("RGB", image.size, (255, 255, 255))
        background.paste(image.convert("RGBA"), mask=image.convert("RGBA").getchannel("A"))
        return background
    return image.convert("RGB")


def thumbnail(image, side: int = 128, quality: int = 70) -> bytes:
    """A small JPEG of the image for the trace: a few kilobytes, enough to recognise it."""
    copy = image.copy()
    copy.thumbnail((side, side))
    out = io.BytesIO()
    copy.save(out, "JPEG", quality=quality)
    return out.getvalue()


def media_parts(messages: list[dict]) -> list[MediaPart]:
    """The attached items of a conversation, in order (the API layer put them in as parts)."""
    return [part["media"] for message in messages if isinstance(message.get("content"), list)
            for part in message["content"] if isinstance(part, dict) and isinstance(part.get("media"), MediaPart)]


def with_decoded(messages: list[dict], decoded: dict[int, Any]) -> list[dict]:
    """The conversation with each item's part holding its decoded form (`decoded`: id(part) → it),
    as the processor's chat template reads it: {"type": "image", "image": PIL image}."""
    out = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list) and any(isinstance(p, dict) and "media" in p for p in content):
            content = [{"type": p["media"].kind, p["media"].kind: decoded[id(p["media"])]}
                       if isinstance(p, dict) and isinstance(p.get("media"), MediaPart) else p for p in content]
            message = {**message, "content": content}
        out.append(message)
    return out


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


def token_runs(ids: list[int], media_ids: dict[int, str]) -> list[tuple[int, int]]:
    """(offset, length) of each run of media placeholder tokens in a prompt: one per item, in the
    items' order, as the processor writes them."""
    runs: list[tuple[int, int]] = []
    for i, token_id in enumerate(ids):
        if token_id in media_ids:
            if runs and sum(runs[-1]) == i:
                runs[-1] = (runs[-1][0], runs[-1][1] + 1)
            else:
                runs.append((i, 1))
    return runs
