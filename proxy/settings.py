"""Everything `looptrace serve` can be told, in one place, read once at start-up."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_MODEL = "Qwen/Qwen3.5-0.8B"


@dataclass(slots=True)
class Settings:
    model: str | None = DEFAULT_MODEL
    host: str = "127.0.0.1"
    port: int = 8000
    served_model_name: str | None = None
    revision: str | None = None
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    api_key: str | None = None
    max_model_len: int | None = None  # None: the checkpoint's own
    max_queue: int = 64  # requests waiting for the model before new ones get a 429
    backend: str = "local"  # local | replay
    replay: str | None = None  # the recorded steps, for --backend replay
