"""The checkpoint's own multimodal processor, built so that it runs without torchvision.

`AutoProcessor` cannot build Gemma 4's or Qwen3.5's processor without torchvision: their video
processors import it, and the processor checks its video slot against torchvision's classes. The
image processors have PIL backends (transformers' `image_processing_pil_*`), and the video
processors run with torch alone (video_processor.py), so the processor is built here from the
checkpoint's image processor, video processor and audio feature extractor (where it has them) and
tokenizer: every item goes through the processor's own code (its token counts, its chat template
handling).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from .video_processor import load_video_processor

log = logging.getLogger("looptrace")


class _OptionalSlots:
    """Lets the processor's video and audio slots be empty, and takes a video processor built
    without torchvision (the slot's class check looks its class up through torchvision's)."""

    def check_argument_for_proper_class(self, name: str, arg: Any) -> Any:
        if name in ("video_processor", "feature_extractor") and arg is None:
            return None
        if name == "video_processor":
            from transformers.video_processing_utils import BaseVideoProcessor

            if isinstance(arg, BaseVideoProcessor):
                return None
        return super().check_argument_for_proper_class(name, arg)


def load_processor(folder: str | Path, processor_class: str, tokenizer: Any, load_kwargs: dict,
                   video: bool = True) -> Any | None:
    """The processor for images, and video and audio where the checkpoint has their configs, or
    None when the checkpoint has no image preprocessing config (a text-only checkpoint) or this
    transformers lacks the class. `video=False` leaves video out (its processor is torch code)."""
    import transformers
    from transformers import AutoImageProcessor

    base = getattr(transformers, processor_class, None)
    if base is None:
        return None
    try:
        images = AutoImageProcessor.from_pretrained(folder, backend="pil", **load_kwargs)
    except ImportError as exc:  # pillow missing: the server runs, text only, and says why
        log.warning("%s: images are not read: install looptrace[media] (%s)", folder, exc)
        return None
    except (OSError, ValueError) as exc:  # no preprocessor_config.json / processor_config.json
        log.debug("%s: no image processor (%s)", folder, exc)
        return None
    cls = type(processor_class, (_OptionalSlots, base), {})
    kwargs: dict = {"image_processor": images, "tokenizer": tokenizer,
                    "video_processor": load_video_processor(folder, processor_class, load_kwargs) if video else None,
                    "chat_template": tokenizer.chat_template}
    if "feature_extractor" in base.__init__.__code__.co_varnames:
        kwargs["feature_extractor"] = _feature_extractor(folder, load_kwargs)
    try:
        return cls(**kwargs)
    except (TypeError, ValueError, AttributeError) as exc:
        log.warning("%s: images are not supported: the processor could not be built (%s)", folder, exc)
        return None


def _feature_extractor(folder: str | Path, load_kwargs: dict) -> Any | None:
    """The checkpoint's audio feature extractor, when its processor config has one (Gemma 4's)."""
    from transformers import AutoFeatureExtractor

    try:
        return AutoFeatureExtractor.from_pretrained(folder, **load_kwargs)
    except (OSError, ValueError, ImportError) as exc:
        log.debug("%s: no audio feature extractor (%s)", folder, exc)
        return None
