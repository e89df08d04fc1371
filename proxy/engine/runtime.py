"""The served model: loaded in the background, so /health answers from the first second.

Requests that arrive while it loads wait for it; after a failed load they get a 503 saying why.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from pathlib import Path

from looptrace.common import checkpoint as ckpt
from looptrace.backends.base import Backend
from looptrace.common.vocabulary import Vocabulary
from looptrace.backends.replay import ReplayBackend, read_steps
from looptrace.backends.vllm import Pool, Upstream, VLLMBackend
from looptrace.families import family_for_config
from looptrace.families.base import Family
from looptrace.families.media.parts import MediaLimits
from looptrace.families.media.processor import load_processor
from looptrace.trace_store.sqlite import SQLiteTraceStore, store_path

from ..settings import Settings
from .errors import Unavailable

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
        self.pool: Pool | None = None  # the vLLM servers, with --backend vllm; the runtime owns them
        self._loaded = asyncio.Event()
        self._task: asyncio.Task | None = None

    @property
    def media_limits(self) -> MediaLimits:
        s = self.settings
        return MediaLimits(max_bytes=int(s.media_max_mb * 1024**2), max_pixels=s.media_max_pixels,
                           max_items=s.media_max_items, max_audio_seconds=s.media_max_audio_seconds,
                           max_video_frames=s.media_max_video_frames)

    def start(self) -> None:
        self._task = asyncio.create_task(self._load())

    async def _load(self) -> None:
        try:
            if self.settings.backend == "vllm":
                await self._reach_vllm()
            await asyncio.to_thread(self._load_sync)
            self.status = "ready"
            log.info("ready: %s (%s family, %s backend, context %d)", self.model_name, self.family.name,
                     self.backend.name, self.max_model_len)
        except Exception as exc:  # noqa: BLE001 - a failed load is reported on /health and to every request
            self.status, self.reason = "failed", f"{type(exc).__name__}: {exc}"
            log.error("loading %s failed: %s", self.settings.model, self.reason)
        finally:
            self._loaded.set()

    async def _reach_vllm(self) -> None:
        """Learn what the vLLM servers serve (the first to answer says); while none does, say so and keep trying."""
        settings = self.settings
        self.pool = Pool([Upstream(url, settings.vllm_api_key, settings.vllm_timeout) for url in settings.vllm_urls])

        def waiting(reason: str) -> None:
            self.reason = reason

        first = await self.pool.reach(settings.model, waiting)
        self.reason = None
        self.model_name = self.model_name or first.model

    def _load_sync(self) -> None:
        # Imported here, on the loading thread: transformers takes seconds to import, and /health
        # answers from the first second.
        from transformers import AutoTokenizer

        settings = self.settings
        if self.pool is None:  # with llama.cpp, --tokenizer may name the checkpoint that goes with MODEL's weights
            source = settings.tokenizer if settings.backend == "llama.cpp" and settings.tokenizer else settings.model
        else:  # the servers' checkpoint: where --tokenizer says it is here, else where the server read it
            source = settings.tokenizer or self.pool.reference.checkpoint_source()
        checkpoint = ckpt.read_config(source, settings.revision)
        family_cls = family_for_config(checkpoint.config)  # refuses an unsupported family before any weights move
        log.info("%s: %s family; fetching the checkpoint", source, family_cls.name)
        # Replay needs the tokenizer and template only; local decoding needs the weights too.
        folder = ckpt.fetch(checkpoint, weights=settings.backend == "local")
        tokenizer = AutoTokenizer.from_pretrained(folder, **checkpoint.load_kwargs())
        processor = None
        if family_cls.processor_class and not checkpoint.gguf_file:
            processor = load_processor(folder, family_cls.processor_class, tokenizer, checkpoint.load_kwargs())
        self.family = family_cls(tokenizer, _generation_config(folder, checkpoint), processor=processor)
        if processor is not None:
            log.info("%s: takes %s", source, " and ".join(sorted(self.family.media_kinds)))
        self.tokenizer = tokenizer
        self.vocab = Vocabulary(tokenizer)
        if not self.settings.max_model_len:
            self.max_model_len = ckpt.context_length(checkpoint.config) or tokenizer.model_max_length
        if self.pool is not None:  # the servers' context is the limit
            limit = self.pool.reference.max_model_len
            self.max_model_len = min(settings.max_model_len or limit, limit)
        self.backend = self._backend(checkpoint)

    def _backend(self, checkpoint: ckpt.Checkpoint) -> Backend:
        settings = self.settings
        if settings.backend == "replay":
            return ReplayBackend(self._replay_steps(), self.vocab)
        if settings.backend == "vllm":
            return VLLMBackend(self.pool, self.vocab)
        if settings.backend == "llama.cpp":
            from looptrace.backends.llama_cpp import default_context, load_llama_cpp

            if not settings.max_model_len:
                self.max_model_len = default_context(self.max_model_len)
            return load_llama_cpp(settings.model, self.vocab, settings, self.max_model_len)
        # torch and the model classes are imported only when this process decodes.
        from looptrace.backends.loading import load_local

        return load_local(checkpoint, self.vocab, settings, self.max_model_len, media=bool(self.family.media_kinds))

    def _replay_steps(self) -> list[dict]:
        """A JSON Lines file of steps, or traces from the store (trace_store's `replay_steps`)."""
        spec = self.settings.replay
        if Path(spec).expanduser().is_file():
            return read_steps(Path(spec).expanduser())
        path = store_path(self.settings.trace_db)
        if path is None:
            raise ValueError(f"--replay {spec}: not a file, and the trace store is off")
        return SQLiteTraceStore(path).replay_steps(spec)

    async def loaded(self) -> None:
        """Until loading ends, either way."""
        await self._loaded.wait()

    async def ready(self) -> None:
        if not self._loaded.is_set() and self.pool is not None and self.pool.reference is None and self.reason:
            # The vLLM server may never answer: say so now rather than hold the request.
            raise Unavailable(f"the model is not ready: {self.reason}", code="upstream_unreachable")
        await self._loaded.wait()
        if self.status != "ready":
            raise Unavailable(f"the model {self.settings.model} failed to load: {self.reason}", code="model_load_failed")

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def health(self) -> dict:
        body = {"status": self.status, "model": self.model_name}
        if self.status == "ready":
            body.update(family=self.family.name, backend=self.backend.name, max_model_len=self.max_model_len,
                        requests_running=self.backend.running, requests_waiting=self.backend.waiting)
            kept = self.backend.prefix_cache_stats()
            if kept is not None:
                body["prefix_cache"] = kept
            speculative = getattr(self.backend, "speculative", None)
            if speculative is not None:  # as configured: the counts are in the traces and metrics
                body["speculative"] = {k: v for k, v in dataclasses.asdict(speculative).items() if v}
            details = getattr(self.backend, "health_details", None)
            if details is not None:  # what the backend runs on (llama.cpp: threads, GPU layers, context)
                body.update(details())
        if self.reason:
            body["reason"] = self.reason
        if self.pool is not None:  # where tokens come from, by which route, and whether each answers now
            body["upstreams"] = self.pool.health()
            if self.status == "ready" and not self.pool.serving:
                body["status"] = "upstream_unreachable"
        return body

    async def close(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
        if self.backend is not None:
            await self.backend.close()
        if self.pool is not None:  # created here, closed here (the backend only borrows it)
            await self.pool.close()


def _generation_config(folder: Path, checkpoint: ckpt.Checkpoint) -> dict | None:
    path = folder / "generation_config.json"
    if path.is_file() and not checkpoint.gguf_file:
        return json.loads(path.read_text())
    return None
