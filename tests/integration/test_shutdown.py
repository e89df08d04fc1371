"""Shutdown is bounded (issue 53, L3): with --otlp-endpoint pointing at a collector that accepts the
connection and never answers, SIGTERM took 17.2 s to exit (a 5 s flush of every sink, then a 10 s join
of the OTLP thread inside its 10 s request). Now the collector gets a few seconds for what is left; what
it did not take is counted as dropped and said in the log. The collector here is a socket that listens
and never reads: what no real collector does on demand."""

from __future__ import annotations

import json
import signal
import socket
import time

from looptrace.trace_store.provider import OTLP_LAST_FLUSH_SECONDS

from processes import free_port


def test_sigterm_with_a_collector_that_never_answers_exits_within_seconds(serve, qwen3_5_dir, tmp_path):
    steps = tmp_path / "steps.jsonl"
    steps.write_text("".join(json.dumps({"text": "Hello there.<|im_end|>"}) + "\n" for _ in range(3)))
    silent = free_port()
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", silent))
        listener.listen(64)
        server = serve(str(qwen3_5_dir), "--backend", "replay", "--replay", str(steps), "--served-model-name", "tiny",
                       "--otlp-endpoint", f"http://127.0.0.1:{silent}")
        for _ in range(3):
            status, answer = server.post("/v1/chat/completions", {
                "model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8})
            assert status == 200, answer
        server.trace_after(None)  # the store took them; the collector holds its first batch unanswered
        began = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        server.process.wait(timeout=60)
        took = time.monotonic() - began
    log = server.log()
    assert took < OTLP_LAST_FLUSH_SECONDS + 4, (took, log[-2000:])
    assert "trace sink otlp did not take the last" in log and "dropped" in log, log[-2000:]
