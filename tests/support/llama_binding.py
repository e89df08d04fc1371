"""llama-cpp-python's own `Llama`, loading a GGUF's weights as looptrace's llama.cpp backend does: with
llama.cpp's extra buffer types where they work on this machine, without them where a CPU that
advertises AMX faults on it (backends/llama_cpp/context.py, `extra_buffers_work`). The binding's
`Llama` takes no such argument: its model parameters are made with them switched off instead."""

from __future__ import annotations

from unittest import mock

import llama_cpp
import llama_cpp.llama_cpp as llama_h

from looptrace.backends.llama_cpp.context import extra_buffers_work


def binding_llama(path, *, threads: int, **kwargs) -> llama_cpp.Llama:
    if extra_buffers_work(str(path), threads):
        return llama_cpp.Llama(str(path), n_threads=threads, n_threads_batch=threads, **kwargs)
    defaults = llama_h.llama_model_default_params

    def without_extra_buffers():
        params = defaults()
        params.use_extra_bufts = False
        return params

    with mock.patch.object(llama_h, "llama_model_default_params", without_extra_buffers):
        return llama_cpp.Llama(str(path), n_threads=threads, n_threads_batch=threads, **kwargs)
