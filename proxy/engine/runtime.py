"""The served model: loaded in the background, so /health answers from the first second.

The backend's registry entry (backends/registry.py) says what it needs and gives its loader; the
runtime runs the loader's steps in order (connect, read the checkpoint, fix the context, load) and
knows no backend by name. Requests that arrive while it loads wait for it; after a failed load they
get a 503 saying why.
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import json
import logging
from pathlib import Path

from looptrace.backends import registry
from looptrace.backends.base import Backend, Loader, TextModel
from looptrace.common import checkpoint as ckpt
from looptrace.common.vocabulary import Vocabulary
from looptrace.families import family_for_config
from looptrace.families.base import Family
from looptrace.families.continuity import report_line, template_report
from looptrace.families.media.parts import MediaLimits
from looptrace.families.media.processor import load_processor
from looptrace.families.media.video_processor import has_video_config
from looptrace.trace_store.location import open_queries

from ..settings import Settings
from . import model_runtime
from .errors import Unavailable

log = logging.getLogger("looptrace")


class Runtime:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.entry = registry.entry(settings.backend)
        self.status = "loading"
        self.reason: str | None = None
        self.model_name = settings.served_model_name or settings.model or ""
        self.max_model_len = settings.max_model_len or 0
        self.family: Family | None = None
        self.tokenizer_sha256 = ""  # what a trainer checks its tokenizer against (exports carry it)
        self.template_continuity: dict = {}  # whether the template keeps earlier turns (families/continuity.py)
        self.tokenizer = None
        self.vocab: Vocabulary | None = None
        self.backend: Backend | None = None
        self._loader: Loader | None = None  # the entry's, until the backend is loaded
        self._waiting: str | None = None  # why the loader cannot go on yet (an upstream that does not answer)
        self._loaded = asyncio.Event()
        self._task: asyncio.Task | None = None

    @property
    def media_limits(self) -> MediaLimits:
        s = self.settings
        return MediaLimits(max_bytes=int(s.media_max_mb * 1024**2), max_pixels=s.media_max_pixels,
                           max_items=s.media_max_items, max_audio_seconds=s.media_max_audio_seconds,
                           max_video_frames=s.media_max_video_frames, max_request_pixels=s.media_max_request_pixels)

    def start(self) -> None:
        self._task = asyncio.create_task(self._load())

    async def _load(self) -> None:
        try:
            self._loader = self.entry.load(self.settings, self)
            named = await self._loader.connect()
            self.model_name = self.model_name or named or ""
            self.backend = await asyncio.to_thread(self._load_sync)
            self._loader = None  # the backend owns what the loader opened
            # What loading made (tokenizer, vocabulary, templates: hundreds of thousands of objects) lives
            # as long as the server: frozen out of the collector's walks, a full collection, which stalls
            # every thread, walks what requests allocate, not all of that (bench/pdf_health.py).
            if self.settings.freeze_after_load:
                gc.collect()
                gc.freeze()
            self.status = "ready"
            log.info("ready: %s (%s family, %s backend, context %d)", self.model_name, self.family.name,
                     self.backend.name, self.max_model_len)
        except Exception as exc:  # noqa: BLE001 - a failed load is reported on /health and to every request
            self.status, self.reason = "failed", f"{type(exc).__name__}: {exc}"
            log.error("loading %s failed: %s", self.settings.model, self.reason)
        finally:
            self._loaded.set()

    def _load_sync(self) -> Backend:
        settings, loader = self.settings, self._loader
        source = loader.checkpoint_source()
        if source.endswith(".gguf") and model_runtime.kept_out():
            model_runtime.let_in(f"{source} is a GGUF file, whose config and tokenizer transformers reads with "
                                 "torch code (a checkpoint folder or --tokenizer DIR keeps torch out)")
        checkpoint = ckpt.read_config(source, settings.revision)
        family_cls = family_for_config(checkpoint.config)  # refuses an unsupported family before any weights move
        log.info("%s: %s family; fetching the checkpoint", source, family_cls.name)
        folder = ckpt.fetch(checkpoint, weights=self.entry.needs.weights)
        media = bool(family_cls.processor_class) and not checkpoint.gguf_file
        video = media and settings.media_max_video_frames > 0 and has_video_config(folder)
        if video and model_runtime.kept_out():
            model_runtime.let_in(f"{source} reads video, and transformers' video processors are torch code "
                                 "(--media-max-video-frames 0 leaves video out, and torch with it)")
        # Imported here, on the loading thread, once it is settled whether torch may come too:
        # transformers takes seconds to import, and /health answers from the first second.
        tokenizer = _tokenizer(folder, checkpoint, lean=not self.entry.needs.model_runtime)
        processor = None
        if media:
            processor = load_processor(folder, family_cls.processor_class, tokenizer, checkpoint.load_kwargs(),
                                       video=video)
        self.family = family_cls(tokenizer, _generation_config(folder, checkpoint), processor=processor)
        self.family.item_costs()  # measured on the template here, off the event loop, not on a first request
        self.family.keep_encodings(int(settings.render_cache_mb * 1024**2), settings.render_check_every,
                                   settings.render_windows)
        self.template_continuity = _template_report(self.family)
        if processor is not None:
            log.info("%s: takes %s", source, " and ".join(sorted(self.family.media_kinds)))
        self.tokenizer = tokenizer
        self.tokenizer_sha256 = _tokenizer_hash(tokenizer)
        self.vocab = Vocabulary(tokenizer)
        own = ckpt.context_length(checkpoint.config) or tokenizer.model_max_length
        self.max_model_len = loader.context(settings.max_model_len, own)
        backend = loader.load(TextModel(checkpoint, self.vocab, bool(self.family.media_kinds), self.max_model_len))
        if not self.entry.needs.model_runtime:
            model_runtime.return_freed_memory()
            log.info(model_runtime.report())
        return backend

    # -- what a loader may ask of the server (backends.base.LoaderHost) --

    def waiting(self, reason: str | None) -> None:
        self._waiting = reason

    def stored_steps(self, spec: str) -> list[dict]:
        store = open_queries(self.settings.trace_db)
        if store is None:
            raise ValueError(f"--replay {spec}: not a file, and the trace store is off")
        return store.replay_steps(spec)

    # -- serving --

    async def loaded(self) -> None:
        """Until loading ends, either way."""
        await self._loaded.wait()

    async def ready(self) -> None:
        if not self._loaded.is_set() and self._waiting:
            # The upstream may never answer: say so now rather than hold the request.
            raise Unavailable(f"the model is not ready: {self._waiting}", code="upstream_unreachable")
        await self._loaded.wait()
        if self.status != "ready":
            raise Unavailable(f"the model {self.settings.model} failed to load: {self.reason}", code="model_load_failed")

    def health(self) -> dict:
        body = {"status": self.status, "model": self.model_name}
        backend = self.backend
        if self.status == "ready":
            body.update(family=self.family.name, backend=backend.name, max_model_len=self.max_model_len,
                        requests_running=backend.running, requests_waiting=backend.waiting)
            body["token_continuity"] = {"mode": self.settings.token_continuity, "template": self.template_continuity}
        reason = self.reason or self._waiting
        if reason:
            body["reason"] = reason
        holder = backend if backend is not None else self._loader
        if holder is not None:
            body.update(holder.health_details())
        if self.status == "ready" and not backend.serving:
            body["status"] = "upstream_unreachable"  # loaded, but no server it forwards to answers now
        return body

    async def close(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
        if self.backend is not None:
            await self.backend.close()
        elif self._loader is not None:
            await self._loader.close()  # what it opened while connecting, never handed over


def _tokenizer(folder: Path, checkpoint: ckpt.Checkpoint, lean: bool):
    """The checkpoint's tokenizer. A relay (`lean`) reads its tokenizer.json as it is, through
    transformers' generic class: a model's own class (Qwen3.5's) rebuilds the same tokenizer from the
    vocabulary and merges and keeps Python copies of both (190 MiB for 248,000 tokens). The two
    render, encode and decode alike (tests/unit/test_relay_tokenizer.py)."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    if lean and not checkpoint.gguf_file and (folder / "tokenizer.json").is_file():
        return PreTrainedTokenizerFast.from_pretrained(folder, **checkpoint.load_kwargs())
    return AutoTokenizer.from_pretrained(folder, **checkpoint.load_kwargs())


def _tokenizer_hash(tokenizer) -> str:
    """The tokenizer's digest: its tokenizer.json as loaded (vocabulary, merges, added tokens), else its
    vocabulary; once, at load."""
    backend = getattr(getattr(tokenizer, "tokenizer", tokenizer), "backend_tokenizer", None)
    text = backend.to_str() if backend is not None else json.dumps(sorted(tokenizer.get_vocab().items()))
    return hashlib.sha256(text.encode()).hexdigest()


def _template_report(family: Family) -> dict:
    """Whether the template keeps what it wrote of earlier turns, checked on a scripted agent session and
    said in the log; a template that refuses the script is reported, never a failed load."""
    try:
        report = template_report(family)
    except ValueError as exc:
        log.warning("%s template: its prefix preservation could not be checked: %s", family.name, exc)
        return {"prefix_preserving": None, "error": str(exc)}
    log.info(report_line(family, report))
    return report


def _generation_config(folder: Path, checkpoint: ckpt.Checkpoint) -> dict | None:
    path = folder / "generation_config.json"
    if path.is_file() and not checkpoint.gguf_file:
        return json.loads(path.read_text())
    return None
