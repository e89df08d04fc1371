"""The test checkpoints' tokenizers and vocabularies, loaded once per test process.

The tiny Qwen3.5 carries the real 248,044-token vocabulary: loading its tokenizer takes one to two
seconds (tokenizers reads the merges; transformers rebuilds Qwen3.5's own class from them), and its
`Vocabulary` (every piece, by id) a fifth of a second more. The unit suite loaded it 119 times, 85 s
of its 300, in the tests and in the applications they start on threads of this process. A tokenizer
is only read once loaded (the family sets its `chat_control_tokens`, the same list each time), so
one object serves every test and every application in the process; each is still loaded the way
the server loads it, through the same call, the first time.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any


@functools.cache
def _load(cls: Any, folder: str, kwargs: tuple) -> Any:
    return cls.from_pretrained(folder, **dict(kwargs))


def tokenizer(folder: str | Path, cls: Any = None, **kwargs: Any) -> Any:
    """`cls.from_pretrained(folder, **kwargs)` (AutoTokenizer by default), loaded once per process."""
    if cls is None:
        from transformers import AutoTokenizer

        cls = AutoTokenizer
    return _load(cls, str(folder), tuple(sorted(kwargs.items())))


@functools.cache
def checkpoint(source: str | Path) -> Any:
    """`read_config(source)`, once per process: a GGUF file's config comes from its header, which
    transformers reads whole (SmolLM2's vocabulary and merges too), 2-4 s a time."""
    from looptrace.common.checkpoint import read_config

    return read_config(str(source))


_VOCABULARIES: dict[int, tuple[Any, Any]] = {}


def vocabulary(tokenizer: Any) -> Any:
    """`Vocabulary(tokenizer)`, made once per tokenizer object (kept alive here with it, so its id is
    never reused by another)."""
    from looptrace.common.vocabulary import Vocabulary

    kept = _VOCABULARIES.get(id(tokenizer))
    if kept is None:
        kept = _VOCABULARIES[id(tokenizer)] = (tokenizer, Vocabulary(tokenizer))
    return kept[1]


def share_in_applications(monkeypatch: Any) -> None:
    """The applications started in this process (app_thread.py, traced_app.py) load their tokenizer and
    vocabulary through the caches above: the server's own loading function (`runtime._tokenizer`,
    which picks the class), memoized on its arguments, and `Vocabulary` made once per tokenizer."""
    from looptrace.proxy.engine import runtime

    real = runtime._tokenizer
    loaded: dict[tuple, Any] = {}

    def once(folder: Path, checkpoint: Any, lean: bool) -> Any:
        key = (str(folder), checkpoint.gguf_file, tuple(sorted(checkpoint.load_kwargs().items())), lean)
        if key not in loaded:
            loaded[key] = real(folder, checkpoint, lean)
        return loaded[key]

    monkeypatch.setattr(runtime, "_tokenizer", once)
    monkeypatch.setattr(runtime, "Vocabulary", vocabulary)
