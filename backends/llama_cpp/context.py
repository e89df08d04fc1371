"""llama.cpp through llama-cpp-python's low-level binding (llama.h as ctypes): one model, one
context, one batch, and the token ids the context's KV cache holds.

The binding's `Llama` class is not used: it samples inside llama.cpp and copies logits into arrays
of its own. looptrace samples by itself (sampling.py), reading each position's logits as a numpy
view of llama.cpp's own buffer, and tracks what the KV cache holds so that a prompt's prefix can be
reused. Everything here runs on the backend's decode thread.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import subprocess
import sys
from pathlib import Path

import llama_cpp.llama_cpp as llama  # llama.h, function for function
import numpy as np

log = logging.getLogger("looptrace")

# Tokens per llama_decode call in prefill: the binding's own default (Llama's n_batch), so a prompt
# evaluated here and by llama-cpp-python directly goes through the same kernels in the same chunks.
BATCH = 512
SEQ = 0  # the one sequence the context holds
LOG_ERROR = 3  # ggml_log_level GGML_LOG_LEVEL_ERROR (the binding names no constant for it)


def physical_cores() -> int:
    """The cores this process may run on, counting a core's hyper-threads once: llama.cpp's threads
    each keep a core's arithmetic units busy, and two on one core only wait for each other."""
    try:
        cpus = os.sched_getaffinity(0)
    except AttributeError:  # macOS, Windows: no affinity or topology to read
        return os.cpu_count() or 1
    cores = set()
    for cpu in cpus:
        topology = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            cores.add(((topology / "physical_package_id").read_text(), (topology / "core_id").read_text()))
        except OSError:
            return len(cpus)
    return len(cores) or len(cpus)


@llama.llama_log_callback
def _to_logging(level: int, text: bytes, _user_data: ctypes.c_void_p) -> None:
    # llama.cpp reports every tensor and buffer as it loads: useful when debugging, noise otherwise.
    if level == LOG_ERROR:
        log.error("llama.cpp: %s", text.decode(errors="replace").rstrip())
    elif log.isEnabledFor(logging.DEBUG):
        log.debug("llama.cpp: %s", text.decode(errors="replace").rstrip())


def _advertises_amx() -> bool:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            return any(line.startswith("flags") and " amx_tile" in line for line in cpuinfo)
    except OSError:
        return False


PROBE = """
import sys
from looptrace.backends.llama_cpp.context import LlamaContext
context = LlamaContext(sys.argv[1], n_ctx=64, threads=int(sys.argv[2]), extra_buffers=True)
context.eval([1, 2, 3, 4])
"""


@functools.cache
def extra_buffers_work(path: str, threads: int) -> bool:
    """Whether llama.cpp's extra buffer types decode here. A CPU that advertises AMX, under a kernel or
    sandbox that faults on its tile instructions, kills the process at the first decode (seen on this
    project's CI machines): where the CPU advertises AMX, a child process decodes a few tokens first,
    and if it dies the weights are loaded without them (llama.cpp's plain CPU kernels), said once."""
    if not _advertises_amx():
        return True
    try:
        probe = subprocess.run([sys.executable, "-c", PROBE, path, str(threads)], capture_output=True, timeout=300)
    except subprocess.TimeoutExpired:
        return True  # slow, not dead: nothing to say against them
    if probe.returncode == 0:
        return True
    log.warning("llama.cpp: this CPU advertises AMX, but a probe decode with llama.cpp's extra buffer types died "
                "(exit %s): loading the weights without them", probe.returncode)
    return False


@functools.cache
def _init_once() -> None:
    llama.llama_log_set(_to_logging, ctypes.c_void_p(0))
    llama.llama_backend_init()


class LlamaContext:
    """A GGUF model loaded into llama.cpp with a context of `n_ctx` tokens.

    `ids` is what the KV cache holds, position by position: eval() appends, cut() and restore()
    change it. `logits(i)` reads the logits after token i of the last chunk evaluated as a view into
    llama.cpp's buffer, valid until the next eval.
    """

    def __init__(self, path: str, *, n_ctx: int, threads: int, n_gpu_layers: int = 0,
                 extra_buffers: bool | None = None) -> None:
        """`extra_buffers`: llama.cpp's extra buffer types for the weights (AMX, repacked layouts);
        None: used where a probe finds they work (`extra_buffers_work`)."""
        _init_once()
        model_params = llama.llama_model_default_params()
        model_params.n_gpu_layers = n_gpu_layers
        if not (extra_buffers if extra_buffers is not None else extra_buffers_work(str(path), threads)):
            model_params.use_extra_bufts = False
        self.model = llama.llama_model_load_from_file(str(path).encode(), model_params)
        if not self.model:
            raise ValueError(f"llama.cpp could not load {path} (its log above says why)")
        params = llama.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = params.n_ubatch = min(BATCH, n_ctx)
        params.n_seq_max = 1
        params.n_threads = params.n_threads_batch = threads
        # flash_attn_type stays llama.cpp's default (auto: on for a CPU). llama-cpp-python's Llama turns
        # it off unless asked, and its kernels round otherwise: greedy answers equal the binding's only
        # with flash_attn=True (README, "llama.cpp").
        params.no_perf = True
        self.ctx = llama.llama_init_from_model(self.model, params)
        if not self.ctx:
            llama.llama_model_free(self.model)
            raise ValueError(f"llama.cpp could not make a context of {n_ctx} tokens for {path}")
        self.n_ctx = llama.llama_n_ctx(self.ctx)
        self.threads = threads
        self.n_gpu_layers = n_gpu_layers
        self.vocab = llama.llama_model_get_vocab(self.model)
        self.n_vocab = llama.llama_vocab_n_tokens(self.vocab)
        self.n_ctx_train = llama.llama_model_n_ctx_train(self.model)
        # Recurrent and hybrid models keep a state that cannot be cut back to an earlier position.
        self.can_cut = not (llama.llama_model_is_recurrent(self.model) or llama.llama_model_is_hybrid(self.model))
        self._memory = llama.llama_get_memory(self.ctx)
        self._batch = llama.llama_batch_init(params.n_batch, 0, 1)
        self._size = params.n_batch
        # The batch's arrays as numpy views, filled a slice at a time rather than element by element.
        self._tokens = np.ctypeslib.as_array(self._batch.token, shape=(self._size,))
        self._pos = np.ctypeslib.as_array(self._batch.pos, shape=(self._size,))
        self._wants = np.ctypeslib.as_array(self._batch.logits, shape=(self._size,))
        np.ctypeslib.as_array(self._batch.n_seq_id, shape=(self._size,))[:] = 1
        for i in range(self._size):
            self._batch.seq_id[i][0] = SEQ
        self.ids: list[int] = []
        self._view_at = 0
        self._view: np.ndarray | None = None

    def token_text(self, token_id: int) -> bytes:
        """The token's text as the GGUF's vocabulary spells it (a piece, as a tokenizer's are)."""
        return llama.llama_vocab_get_text(self.vocab, token_id) or b""

    def eval(self, tokens: list[int], *, every_row: bool = False) -> None:
        """Runs `tokens` after what the KV cache holds, in chunks of the batch size. Logits are kept
        for the last token, or with `every_row` for each (the chunk must then be one batch)."""
        if every_row and len(tokens) > self._size:
            raise ValueError(f"{len(tokens)} tokens with logits for each: more than one batch of {self._size}")
        for start in range(0, len(tokens), self._size):
            self._run(tokens[start:start + self._size], every_row)

    def step(self, token: int) -> np.ndarray:
        """One token in, the next position's logits out: the decode loop's whole step."""
        self._run([token], False)
        return self.logits(0)

    def _run(self, chunk: list[int], every_row: bool) -> None:
        n, past = len(chunk), len(self.ids)
        if past + n > self.n_ctx:
            raise ValueError(f"{past + n} tokens do not fit in the context of {self.n_ctx}")
        self._tokens[:n] = chunk
        self._pos[:n] = np.arange(past, past + n)
        self._wants[:n] = 1 if every_row else 0
        self._wants[n - 1] = 1
        self._batch.n_tokens = n
        code = llama.llama_decode(self.ctx, self._batch)
        if code != 0:
            # 1: no room in the KV cache; 2: aborted; below 0: invalid or fatal. A failed batch may
            # leave some of its tokens in the cache: start again from nothing next time.
            self.clear()
            raise RuntimeError(f"llama_decode returned {code} for {n} tokens after {past}")
        self.ids.extend(chunk)

    def logits(self, row: int) -> np.ndarray:
        """The logits after token `row` of the last chunk evaluated (-1: its last), without a copy."""
        pointer = llama.llama_get_logits_ith(self.ctx, row)
        if not pointer:
            raise RuntimeError(f"llama.cpp kept no logits for token {row} of the last chunk")
        address = ctypes.cast(pointer, ctypes.c_void_p).value
        if address != self._view_at:  # one view per address: the buffer stays put between decodes
            self._view_at = address
            self._view = np.ctypeslib.as_array(pointer, shape=(self.n_vocab,))
        return self._view

    def cut(self, length: int) -> bool:
        """Drops what the KV cache holds past `length` tokens; False when this model cannot (its
        state is recurrent), in which case nothing changed."""
        if length >= len(self.ids):
            return True
        if not self.can_cut or not llama.llama_memory_seq_rm(self._memory, SEQ, length, -1):
            return False
        del self.ids[length:]
        return True

    def clear(self) -> None:
        llama.llama_memory_clear(self._memory, True)
        self.ids = []

    def save(self) -> ctypes.Array:
        """A copy of the KV cache's state (what restore() takes), as llama.cpp serialises it."""
        size = llama.llama_state_seq_get_size(self.ctx, SEQ)
        blob = (ctypes.c_uint8 * size)()
        if llama.llama_state_seq_get_data(self.ctx, blob, size, SEQ) != size:
            raise RuntimeError("llama.cpp did not copy its whole state")
        return blob

    def restore(self, ids: list[int], blob: ctypes.Array) -> bool:
        """Puts back a state save() copied while the cache held `ids`; False (and an empty cache)
        when llama.cpp refuses it."""
        self.clear()
        if llama.llama_state_seq_set_data(self.ctx, blob, len(blob), SEQ) != len(blob):
            self.clear()
            return False
        self.ids = list(ids)
        return True

    def close(self) -> None:
        if self.ctx:
            llama.llama_batch_free(self._batch)
            llama.llama_free(self.ctx)
            llama.llama_model_free(self.model)
            self.ctx = self.model = None
