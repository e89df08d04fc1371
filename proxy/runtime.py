"""The served model: loaded in the background, so /health answers from the first second.

Requests that arrive while it loads wait for it; after a failed load they get a 503 saying why.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

from backends import checkpoint as ckpt
from backends.base import Backend
from backends.detokenize import Vocabulary
from families import family_for_config
from families.base import Family

from .errors import unavailable
from .settings import Settings

log = logging.getLogger("looptrace")


class Runtime:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.status = "loading"
        self.reason: str | None = None
        self.model_name = settings.served_model_name or settings.model or ""
        self.max_model_len = settings.max_model_len or 0
        self.family: Family | None = None
        self.tokenizer = None
        self.vocab: Vocabulary | None = None
        self.backend: Backend | None = None
        self._loaded = asyncio.Event()
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._load())

    async def _load(self) -> None:
        try:
            await asyncio.to_thread(self._load_sync)
            self.status = "ready"
            log.info("ready: %s (%s family, %s backend, context %d)", self.model_name, self.family.name,
                     self.backend.name, self.max_model_len)
        except Exception as exc:  # noqa: BLE001 - a failed load is reported on /health and to every request
            self.status, self.reason = "failed", f"{type(exc).__name__}: {exc}"
            log.error("loading %s failed: %s", self.settings.model, self.reason)
        finally:
            self._loaded.set()

    def _load_sync(self) -> None:
        from transformers import AutoTokenizer

        settings = self.settings
        checkpoint = ckpt.read_config(settings.model, settings.revision)
        family_cls = family_for_config(checkpoint.config)  # refuses an unsupported family before any weights move
        log.info("%s: %s family; fetching the checkpoint", settings.model, family_cls.name)
        # Replay needs the tokenizer and template only; local decoding needs the weights too.
        folder = ckpt.fetch(checkpoint, weights=settings.backend == "local")
        tokenizer = AutoTokenizer.from_pretrained(folder, **checkpoint.load_kwargs())
        self.family = family_cls(tokenizer, _generation_config(folder, checkpoint))
        self.tokenizer = tokenizer
        self.vocab = Vocabulary(tokenizer)
        if not self.settings.max_model_len:
            self.max_model_len = ckpt.context_length(checkpoint.config) or tokenizer.model_max_length
        self.backend = self._backend(checkpoint)

    def _backend(self, checkpoint: ckpt.Checkpoint) -> Backend:
        settings = self.settings
        if settings.backend == "replay":
            from backends.replay import ReplayBackend, read_steps

            return ReplayBackend(read_steps(settings.replay), self.vocab)
        from backends.loading import load_local  # torch and the model classes load only when needed

        return load_local(checkpoint, self.vocab, settings)

    async def ready(self) -> None:
        await self._loaded.wait()
        if self.status != "ready":
            raise unavailable(f"the model {self.settings.model} failed to load: {self.reason}", code="model_load_failed")

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def health(self) -> dict:
        body = {"status": self.status, "model": self.model_name}
        if self.status == "ready":
            body.update(family=self.family.name, backend=self.backend.name, max_model_len=self.max_model_len,
                        requests_running=self.backend.running, requests_waiting=self.backend.waiting)
        if self.reason:
            body["reason"] = self.reason
        return body

    async def close(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
        if self.backend is not None:
            await self.backend.close()


def _generation_config(folder: Path, checkpoint: ckpt.Checkpoint) -> dict | None:
    path = folder / "generation_config.json"
    if path.is_file() and not checkpoint.gguf_file:
        return json.loads(path.read_text())
    return None
