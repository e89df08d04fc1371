"""The tiny checkpoints with their image preprocessing, as the real ones ship it.

The tiny Qwen3.5 and Gemma 4 are saved with their vision towers; what makes a checkpoint take images
is its processor configs (images, video). The real checkpoints' values are written beside the same files (linked,
not copied), so the weights are the tiny ones and text decodes exactly as without.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

from build_cache import BUILD_INFO, cached

# Qwen/Qwen3.5-* preprocessor_config.json (image part).
QWEN3_5_PREPROCESSOR = {
    "processor_class": "Qwen3VLProcessor", "image_processor_type": "Qwen2VLImageProcessorFast",
    "size": {"longest_edge": 16777216, "shortest_edge": 65536}, "patch_size": 16, "temporal_patch_size": 2,
    "merge_size": 2, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
}
# google/gemma-4-* processor_config.json: the image part, and (GEMMA4_AUDIO) the audio part.
GEMMA4_PROCESSOR = {
    "processor_class": "Gemma4Processor", "image_seq_length": 280, "audio_seq_length": 750,
    "image_processor": {
        "image_processor_type": "Gemma4ImageProcessor", "do_convert_rgb": True, "do_normalize": False,
        "do_rescale": True, "do_resize": True, "image_mean": [0.0, 0.0, 0.0], "image_std": [1.0, 1.0, 1.0],
        "image_seq_length": 280, "max_soft_tokens": 280, "patch_size": 16, "pooling_kernel_size": 3,
        "resample": 3, "rescale_factor": 1 / 255,
    },
}
GEMMA4_AUDIO = {
    "feature_extractor": {
        "feature_extractor_type": "Gemma4AudioFeatureExtractor", "feature_size": 128, "sampling_rate": 16000,
        "frame_length": 320, "hop_length": 160, "fft_length": 512, "max_frequency": 8000.0, "mel_floor": 0.001,
        "padding_side": "right", "input_scale_factor": 1.0,
    },
    "audio_ms_per_token": 40,
}
# A toy audio tower of Gemma 4's architecture (its conformer, chunked attention, subsampling).
GEMMA4_AUDIO_TOWER = {
    "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "subsampling_conv_channels": [128, 4],
    "conv_kernel_size": 5, "output_proj_dims": 32, "attention_chunk_size": 12, "attention_context_left": 13,
    "attention_context_right": 0,
}
# Qwen/Qwen3.5-* video_preprocessor_config.json (its sampling: 2 frames a second, 4 to 768).
QWEN3_5_VIDEO = {
    "processor_class": "Qwen3VLProcessor", "video_processor_type": "Qwen3VLVideoProcessor",
    "size": {"longest_edge": 25165824, "shortest_edge": 4096}, "patch_size": 16, "temporal_patch_size": 2,
    "merge_size": 2, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
}
# google/gemma-4-* processor_config.json, its video part: 32 frames of at most 70 soft tokens.
GEMMA4_VIDEO = {
    "video_processor": {
        "video_processor_type": "Gemma4VideoProcessor", "do_convert_rgb": True, "do_normalize": True,
        "do_rescale": True, "do_resize": True, "do_sample_frames": True, "image_mean": [0.0, 0.0, 0.0],
        "image_std": [1.0, 1.0, 1.0], "max_soft_tokens": 70, "num_frames": 32, "patch_size": 16,
        "pooling_kernel_size": 3, "resample": 3, "rescale_factor": 1 / 255, "return_metadata": False,
    },
}
FILES = {"qwen3_5": {"preprocessor_config.json": QWEN3_5_PREPROCESSOR, "video_preprocessor_config.json": QWEN3_5_VIDEO},
         "gemma4": {"processor_config.json": {**GEMMA4_PROCESSOR, **GEMMA4_VIDEO}}}


def with_images(base: Path, family: str) -> Path:
    """`base` (a tiny checkpoint folder) and its family's image and video processor configs."""
    files = FILES[family]

    def build(out: Path) -> dict:
        for item in base.iterdir():
            if item.name != BUILD_INFO and not item.name.startswith("."):  # its own info is written after
                os.symlink(item, out / item.name)
        for name, config in files.items():
            (out / name).write_text(json.dumps(config, indent=2) + "\n")
        return {}

    return cached(f"{family}-tiny-images", {"base": base.name, "files": files}, build)


def gemma4_with_audio() -> Path:
    """The tiny Gemma 4 with an audio tower too, and its image and audio preprocessing."""
    from tiny_gemma4 import gemma4_checkpoint

    base = gemma4_checkpoint(audio_config=GEMMA4_AUDIO_TOWER)
    config = {**GEMMA4_PROCESSOR, **GEMMA4_AUDIO, **GEMMA4_VIDEO}

    def build(out: Path) -> dict:
        for item in base.iterdir():
            if item.name != BUILD_INFO and not item.name.startswith("."):
                os.symlink(item, out / item.name)
        (out / "processor_config.json").write_text(json.dumps(config, indent=2) + "\n")
        return {}

    return cached("gemma4-tiny-audio", {"base": base.name, "config": config}, build)


def mp4(frames: int = 40, fps: int = 10, width: int = 64, height: int = 48, codec: str = "libx264") -> bytes:
    """A clip whose frames differ (a line moves across, the red rises): which are sampled matters."""
    import av
    import numpy as np

    out = io.BytesIO()
    with av.open(out, "w", format="mp4") as container:
        stream = container.add_stream(codec, rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for i in range(frames):
            pixels = np.zeros((height, width, 3), np.uint8)
            pixels[..., 0] = i * 255 // frames
            pixels[:, (i * 3) % width] = 255
            for packet in stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return out.getvalue()
