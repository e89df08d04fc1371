"""Attached items decoded for the checkpoint's processor: images with pillow, audio with PyAV
(FFmpeg's decoders: WAV, MP3, FLAC, Ogg, …), mono at the processor's sampling rate, and video with
PyAV, keeping only the frames the processor samples.

Called on the rendering thread, never on the event loop. Every limit has a flag (proxy/settings.py)
and going past one is a `MediaError` naming the limit and the part, which the server answers with a
400, as it does a corrupt or undecodable item. pillow and av are an optional extra
(`looptrace[media]`): without them, media is a 400 saying what to install, never a 500.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import logging
from collections.abc import Callable
from typing import Any

from .parts import MediaError, MediaLimits, MediaPart

log = logging.getLogger("looptrace")


def _undecodable(kind: str, param: str, exc: Exception) -> MediaError:
    """A file its decoder refused, said in the user's words; the decoder's own (pillow's, FFmpeg's: a
    class name and an object's address) goes to the log."""
    log.info("the %s at %s could not be decoded: %r", kind, param, exc)
    return MediaError(f"The {kind} at {param} could not be decoded: it is damaged, or not in a format this server "
                      "reads.", param)

IMAGE_FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF")


def image_size(part: MediaPart, limits: MediaLimits) -> tuple[int, int]:
    """The image's (width, height) read from its header, before any pixel is decoded, held to
    --media-max-pixels; its bytes stay on the part, for the decoding."""
    Image, _, UnidentifiedImageError = _pil(part)
    data = part.raw = _bytes(part, limits, "image")
    try:
        with Image.open(io.BytesIO(data), formats=IMAGE_FORMATS) as image:
            width, height = image.size
    except Image.DecompressionBombError as exc:  # pillow's own bound, far past ours: a header's claim
        raise MediaError(f"The image at {part.param} is larger than the limit of {limits.max_pixels:,} pixels "
                         f"(--media-max-pixels): {exc}", part.param, code="media_too_large") from exc
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:
        raise _undecodable("image", part.param, exc) from exc
    if width * height > limits.max_pixels:
        raise MediaError(f"The image at {part.param} is {width}×{height} pixels; the limit is "
                         f"{limits.max_pixels:,} pixels (--media-max-pixels).", part.param, code="media_too_large")
    return width, height


def decode_image(part: MediaPart, limits: MediaLimits) -> Any:
    """The part as an RGB PIL image: EXIF orientation applied, palette and alpha flattened onto
    white, an animated image's first frame (a screenshot or diagram is what agents send; a video
    goes in as a video). Its pixels are held once: turned in place, converted only when not RGB."""
    Image, ImageOps, UnidentifiedImageError = _pil(part)
    image_size(part, limits)  # the header first: nothing past a limit is decoded
    data = part.raw
    try:
        image = Image.open(io.BytesIO(data), formats=IMAGE_FORMATS)
        fmt = image.format
        image.seek(0)
        image.load()
        ImageOps.exif_transpose(image, in_place=True)
        image = _rgb(image)
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        raise _undecodable("image", part.param, exc) from exc
    part.info = {"format": fmt, "width": image.width, "height": image.height, "bytes": len(data),
                 "sha256": hashlib.sha256(data).hexdigest()}
    return image


def decode_audio(part: MediaPart, limits: MediaLimits, rate: int) -> Any:
    """The part as mono float32 samples at `rate`, as the processor's feature extractor reads them."""
    av, np = _av(part, "audio")
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
        raise _undecodable("audio", part.param, exc) from exc
    audio = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.float32)
    if audio.size == 0:
        raise MediaError(f"The audio at {part.param} holds no samples.", part.param)
    if audio.size > int(limits.max_audio_seconds * rate):
        raise MediaError(f"The audio at {part.param} is longer than {limits.max_audio_seconds:g} s "
                         "(--media-max-audio-seconds).", part.param, code="media_too_large")
    part.info = {"format": fmt, "seconds": round(audio.size / rate, 3), "sampling_rate": rate, "bytes": len(data),
                 "sha256": hashlib.sha256(data).hexdigest()}
    return audio


def decode_video(part: MediaPart, limits: MediaLimits, sample: Callable[[int, float, int, int], Any]) -> tuple:
    """The part as (frames, metadata): the frames `sample(total frames, fps, width, height)` picks
    (transformers' VideoMetadata, its frames_indices set) as a uint8 array (frames, height, width, 3).
    Only those frames are converted; the count comes from a first pass that reads packets only."""
    av, np = _av(part, "video")
    data = _bytes(part, limits, "video")
    try:
        with av.open(io.BytesIO(data), mode="r") as container:
            if not container.streams.video:
                raise MediaError(f"The video at {part.param} holds no video stream.", part.param)
            stream = container.streams.video[0]
            width, height = stream.codec_context.width, stream.codec_context.height
            if width * height > limits.max_pixels:
                raise MediaError(f"The video at {part.param} is {width}×{height} pixels a frame; the limit is "
                                 f"{limits.max_pixels:,} pixels (--media-max-pixels).", part.param,
                                 code="media_too_large")
            rate = stream.average_rate or stream.guessed_rate
            fps = float(rate) if rate else 0.0
            total = sum(1 for packet in container.demux(stream) if packet.size)
            fmt = stream.codec_context.name  # h264, vp9, …: the container's name is a list (mov,mp4,…)
        if total == 0:
            raise MediaError(f"The video at {part.param} holds no frames.", part.param)
        if fps <= 0:
            raise MediaError(f"The video at {part.param} declares no frame rate.", part.param)
        metadata = sample(total, fps, width, height)
        wanted = [int(i) for i in metadata.frames_indices]
        if len(wanted) > limits.max_video_frames:
            raise MediaError(f"The video at {part.param} is {total / fps:.1f} s; the model's processor samples "
                             f"{len(wanted)} frames from it and the limit is {limits.max_video_frames} "
                             "(--media-max-video-frames).", part.param, code="media_too_large")
        keep, frames = set(wanted), {}
        with av.open(io.BytesIO(data), mode="r") as container:
            for index, frame in enumerate(container.decode(container.streams.video[0])):
                if index in keep:
                    frames[index] = frame.to_ndarray(format="rgb24")
                if index >= wanted[-1]:
                    break
    except MediaError:
        raise
    except (av.error.FFmpegError, ValueError, IndexError) as exc:
        raise _undecodable("video", part.param, exc) from exc
    if len(frames) < len(wanted):  # fewer frames decoded than packets counted (a damaged stream)
        raise MediaError(f"The video at {part.param} could not be decoded: {len(frames)} of its {total} frames "
                         "were readable.", part.param)
    video = np.stack([frames[i] for i in wanted])
    part.info = {"format": fmt, "width": width, "height": height, "frames": len(wanted), "total_frames": total,
                 "fps": round(fps, 3), "seconds": round(total / fps, 3), "bytes": len(data),
                 "sha256": hashlib.sha256(data).hexdigest()}
    return video, metadata


def _pil(part: MediaPart) -> tuple:
    """pillow's Image, ImageOps and UnidentifiedImageError, or a 400 saying what to install."""
    try:
        from PIL import Image, ImageOps, UnidentifiedImageError
    except ImportError as exc:
        raise MediaError("This server cannot decode images: install looptrace[media] (pillow).", part.param,
                         code="media_unsupported") from exc
    return Image, ImageOps, UnidentifiedImageError


def _av(part: MediaPart, what: str) -> tuple:
    """PyAV and numpy, or a 400 saying what to install (never a 500 for a missing optional package)."""
    try:
        import av
        import numpy as np
    except ImportError as exc:
        raise MediaError(f"This server cannot decode {what}: install looptrace[media] (av).", part.param,
                         code="media_unsupported") from exc
    return av, np


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
    if image.mode in ("RGBA", "LA", "RGBa", "PA"):
        background = Image.new("RGB", image.size, (255, 255, 255))
        background.paste(image.convert("RGBA"), mask=image.convert("RGBA").getchannel("A"))
        return background
    return image.convert("RGB")


def thumbnail(image, side: int = 128, quality: int = 70) -> bytes:
    """A small JPEG of the image (or of a video frame's array) for the trace: a few kilobytes,
    enough to recognise it."""
    from PIL import Image

    image = image if isinstance(image, Image.Image) else Image.fromarray(image)
    scale = min(1.0, side / max(image.size))
    size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
    # Resized straight from the image (what thumbnail() does to a copy of it: no full-size copy here).
    small = image.resize(size, Image.Resampling.BICUBIC, reducing_gap=2.0)
    out = io.BytesIO()
    small.save(out, "JPEG", quality=quality)
    return out.getvalue()
