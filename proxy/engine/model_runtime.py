"""Whether this process may hold a model runtime (torch, and transformers' model code with it).

A relay (a backend whose registry entry needs no model runtime: vLLM, replay) needs a tokenizer and a
chat template, neither of which needs torch; but transformers imports torch with its tokenizers
(configuration_utils → modeling_rope_utils) whenever torch is installed, which is 300 MiB of a relay's
memory and seconds of its start. So `looptrace serve` keeps torch out of a relay's process before
anything imports transformers: `sys.modules["torch"] = None`, Python's own way to make a module
unimportable, which transformers' check (`importlib.util.find_spec`) reads as "not installed".

The one thing a relay may still need torch for is a checkpoint's video processor (transformers'
video processors are torch code): the runtime lets torch in for it, before transformers is
imported, and says so. Only the command line keeps torch out: an application built in a process
that already has torch (the tests' in-process server) is left as it is.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys

log = logging.getLogger("looptrace")

KEPT_OUT = ("torch",)  # what a relay never imports (transformers' model code comes only with torch)
_state = {"kept_out": False}


class _NoTorchAdvice(logging.Filter):
    """transformers says "PyTorch was not found" when it imports without torch; here torch was kept
    out on purpose, and the server's own log line says so."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "PyTorch was not found" not in record.getMessage()


def keep_out() -> None:
    """Makes torch unimportable in this process, unless something already imported it."""
    if any(name in sys.modules for name in KEPT_OUT) or "transformers" in sys.modules:
        return
    for name in KEPT_OUT:
        sys.modules[name] = None  # type: ignore[assignment]  # import raises ModuleNotFoundError
    logging.getLogger("transformers").addFilter(_NoTorchAdvice())
    _state["kept_out"] = True


def let_in(reason: str) -> None:
    """Undoes keep_out, for `reason`, as long as transformers has not been imported without torch."""
    if not _state["kept_out"]:
        return
    if "transformers" in sys.modules:
        raise RuntimeError(f"torch is needed ({reason}) but transformers was already imported without it")
    for name in KEPT_OUT:
        if sys.modules.get(name, False) is None:
            del sys.modules[name]
    _state["kept_out"] = False
    log.info("importing torch: %s", reason)


def kept_out() -> bool:
    return _state["kept_out"]


def report() -> str:
    """The start-up line that says what this process's memory holds of a model runtime: what was
    kept out, and whether any of it was imported after all (it never should be)."""
    if not _state["kept_out"]:
        loaded = [name for name in KEPT_OUT if sys.modules.get(name) is not None]
        return f"model runtime: {', '.join(loaded) or 'none'} imported"
    models = sorted(m for m in sys.modules if m.startswith("transformers.models.") and ".modeling_" in m)
    return (f"model runtime kept out: {', '.join(KEPT_OUT)} not imported, transformers' model code "
            f"{'imported: ' + ', '.join(models) if models else 'not imported'}")


def return_freed_memory() -> None:
    """Hands the heap freed after loading back to the system (glibc keeps it otherwise): parsing a
    tokenizer.json of 250,000 tokens leaves about 80 MiB of freed, fragmented heap in a relay whose
    whole budget is 150. No-op where the C library has no malloc_trim."""
    name = ctypes.util.find_library("c")
    trim = getattr(ctypes.CDLL(name), "malloc_trim", None) if name else None
    if trim is not None:
        trim(0)
