"""Finding a checkpoint: a Hugging Face id, a local folder, or a GGUF file.

`config.json` is read first, on its own, so an unsupported family is refused before gigabytes of
weights are fetched. Downloads go through huggingface_hub, which shows progress and caches.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import hf_hub_download, snapshot_download

# Everything a tokenizer, template and model need, and nothing else (no .bin/.pth duplicates, no ONNX).
CHECKPOINT_FILES = ["*.json", "*.safetensors", "*.jinja", "*.model", "*.txt", "*.tiktoken"]
NON_WEIGHT_FILES = ["*.json", "*.jinja", "*.model", "*.txt", "*.tiktoken"]


@dataclass(slots=True)
class Checkpoint:
    source: str  # as the user named it
    revision: str | None
    config: dict
    folder: Path | None = None  # local files, once fetched
    gguf_file: str | None = None  # a file name inside `folder`

    @property
    def is_local(self) -> bool:
        return self.gguf_file is not None or Path(self.source).is_dir()

    def load_kwargs(self) -> dict:
        kwargs: dict = {}
        if self.gguf_file:
            kwargs["gguf_file"] = self.gguf_file
        if self.revision and not self.is_local:
            kwargs["revision"] = self.revision
        return kwargs


def read_config(source: str, revision: str | None = None) -> Checkpoint:
    """The checkpoint's config, without its weights."""
    path = Path(source).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise FileNotFoundError(f"no GGUF file at {path}")
        from transformers import AutoConfig  # the GGUF header holds the config

        config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name).to_dict()
        return Checkpoint(str(path), None, config, folder=path.parent, gguf_file=path.name)
    if path.is_dir():
        config_file = path / "config.json"
        if not config_file.is_file():
            raise FileNotFoundError(f"{path} has no config.json: is it a Hugging Face checkpoint folder?")
        return Checkpoint(str(path), None, json.loads(config_file.read_text()), folder=path)
    if source.startswith((".", "/", "~")) or source.count("/") > 1:
        raise FileNotFoundError(f"no checkpoint folder at {path}")
    config_file = hf_hub_download(source, "config.json", revision=revision)
    return Checkpoint(source, revision, json.loads(Path(config_file).read_text()))


def fetch(checkpoint: Checkpoint, *, weights: bool = True) -> Path:
    """Download what is missing (with progress bars) and return the local folder."""
    if checkpoint.folder is None:
        patterns = CHECKPOINT_FILES if weights else NON_WEIGHT_FILES
        checkpoint.folder = Path(
            snapshot_download(checkpoint.source, revision=checkpoint.revision, allow_patterns=patterns)
        )
    return checkpoint.folder


def text_config(config: dict) -> dict:
    """Multimodal checkpoints keep the language model's settings under `text_config`."""
    return config.get("text_config") or config


def context_length(config: dict) -> int | None:
    text = text_config(config)
    for key in ("max_position_embeddings", "max_sequence_length", "seq_length", "n_positions"):
        value = text.get(key) or config.get(key)
        if isinstance(value, int) and value > 0:
            return value
    return None
