"""The checkpoint's own video processor (transformers' Gemma4VideoProcessor, Qwen3VLVideoProcessor),
made to run without torchvision.

Those processors are torch code except for three torchvision calls (`functional.resize`,
`normalize`, `grayscale_to_rgb`), and torchvision has no CPU build that pairs with the CPU torch
wheel. Where torchvision is missing, the three are given here, written with torch as torchvision
writes them for tensors (resize is `torch.nn.functional.interpolate` with antialiasing, rounded back
to uint8), so every other step (frame sampling, resizing arithmetic, patch layout, timestamps) is
transformers' own. Where torchvision is installed, nothing here is used.
"""

from __future__ import annotations

import enum
import importlib.util
import logging
import sys
import types
from pathlib import Path
from typing import Any

log = logging.getLogger("looptrace")

# The family's processor class → its video processor (class name, module in transformers.models).
VIDEO_PROCESSORS = {
    "Gemma4Processor": ("Gemma4VideoProcessor", "gemma4.video_processing_gemma4"),
    "Qwen3VLProcessor": ("Qwen3VLVideoProcessor", "qwen3_vl.video_processing_qwen3_vl"),
}


class InterpolationMode(enum.Enum):  # torchvision's names and values
    NEAREST = "nearest"
    NEAREST_EXACT = "nearest-exact"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    BOX = "box"
    HAMMING = "hamming"
    LANCZOS = "lanczos"


def _resize(image: Any, size: list[int], interpolation: Any = InterpolationMode.BILINEAR, antialias: bool = True,
            **_: Any) -> Any:
    import torch
    import torch.nn.functional as F

    mode = interpolation if isinstance(interpolation, InterpolationMode) else _FROM_PIL[int(interpolation)]
    if mode.value not in ("nearest", "nearest-exact", "bilinear", "bicubic"):
        raise ValueError(f"resize with {mode.name} needs torchvision")
    shape = image.shape
    flat = image.reshape(-1, *shape[-3:])
    smooth = mode.value in ("bilinear", "bicubic")
    out = F.interpolate(flat.float() if flat.dtype == torch.uint8 else flat, size=list(size), mode=mode.value,
                        align_corners=False if smooth else None, antialias=antialias and smooth)
    if image.dtype == torch.uint8:
        out = out.clamp_(0, 255).round_().to(torch.uint8)
    return out.reshape(*shape[:-2], *out.shape[-2:])


def _normalize(image: Any, mean: Any, std: Any, inplace: bool = False) -> Any:
    import torch

    mean = torch.as_tensor(mean, dtype=image.dtype, device=image.device).view(-1, 1, 1)
    std = torch.as_tensor(std, dtype=image.dtype, device=image.device).view(-1, 1, 1)
    return image.sub_(mean).div_(std) if inplace else (image - mean) / std


def _grayscale_to_rgb(image: Any) -> Any:
    return image.expand(*image.shape[:-3], 3, *image.shape[-2:]) if image.shape[-3] == 1 else image


_FROM_PIL = {0: InterpolationMode.NEAREST_EXACT, 1: InterpolationMode.LANCZOS, 2: InterpolationMode.BILINEAR,
             3: InterpolationMode.BICUBIC, 4: InterpolationMode.BOX, 5: InterpolationMode.HAMMING}
TORCH_FUNCTIONAL = types.SimpleNamespace(InterpolationMode=InterpolationMode, resize=_resize, normalize=_normalize,
                                         grayscale_to_rgb=_grayscale_to_rgb)


def _video_processor_class(processor_class: str) -> type | None:
    import transformers

    name, module = VIDEO_PROCESSORS.get(processor_class, (None, None))
    if name is None:
        return None
    if importlib.util.find_spec("torchvision") is not None:
        return getattr(transformers, name)
    import transformers.image_processing_backends as backends
    import transformers.video_processing_utils as video_utils

    for holder in (backends, video_utils):  # their tvF is only bound when torchvision imports
        if not hasattr(holder, "tvF"):
            holder.tvF = TORCH_FUNCTIONAL
    if not getattr(backends, "pil_torch_interpolation_mapping", None):  # likewise, PIL's filter names → ours
        from transformers.image_utils import PILImageResampling

        backends.pil_torch_interpolation_mapping = {PILImageResampling(k): v for k, v in _FROM_PIL.items()}
        backends.torch_pil_interpolation_mapping = {v: PILImageResampling(k) for k, v in _FROM_PIL.items()}
    full = f"transformers.models.{module}"
    if full not in sys.modules:
        # Gemma 4's module names tvF in an annotation at import: it is loaded with ours bound first.
        spec = importlib.util.find_spec(full)
        loaded = importlib.util.module_from_spec(spec)
        loaded.tvF = TORCH_FUNCTIONAL
        sys.modules[full] = loaded
        try:
            spec.loader.exec_module(loaded)
        except Exception:
            del sys.modules[full]
            raise
    return getattr(sys.modules[full], name)


def load_video_processor(folder: str | Path, processor_class: str, load_kwargs: dict) -> Any | None:
    """The checkpoint's video processor, or None when its family reads no video, the checkpoint has
    no video preprocessing config, or it cannot be built here (the reason is logged)."""
    try:
        cls = _video_processor_class(processor_class)
        if cls is None:
            return None
        processor = cls.from_pretrained(folder, **load_kwargs)
    except (OSError, ValueError, ImportError, AttributeError, NameError, TypeError) as exc:
        log.warning("%s: video is not read: its video processor could not be built (%s)", folder, exc)
        return None
    if not has_video_config(folder):
        return None
    return processor


def has_video_config(folder: str | Path) -> bool:
    """Whether the checkpoint ships video preprocessing (read before transformers is imported: a
    relay lets torch in only for a video processor). from_pretrained falls back to the image
    preprocessing config, so a local folder without a video config reads no video."""
    local = Path(folder)
    if not local.is_dir():
        return True
    if (local / "video_preprocessor_config.json").exists():
        return True
    import json

    config = local / "processor_config.json"
    try:
        return config.exists() and "video_processor" in json.loads(config.read_text())
    except (OSError, ValueError):
        return False


def sampler(video_processor: Any):
    """`sample(total frames, fps, width, height)` → the VideoMetadata of the frames the processor
    samples (its own `sample_frames`), so that only those are decoded. A clip with fewer frames
    than the processor's fixed count (Gemma 4 takes 32) gives all of them."""
    from transformers.video_utils import VideoMetadata

    def sample(total: int, fps: float, width: int, height: int) -> Any:
        metadata = VideoMetadata(total_num_frames=total, fps=fps, width=width, height=height)
        fixed = getattr(video_processor, "num_frames", None)
        if fixed and total < fixed:
            indices = video_processor.sample_frames(metadata, num_frames=total)
        else:
            indices = video_processor.sample_frames(metadata)
        metadata.frames_indices = [int(i) for i in indices]
        return metadata

    return sample
