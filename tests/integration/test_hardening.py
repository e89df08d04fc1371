"""Bad input is refused in one log line, and the server lives on: what only a real `looptrace serve`
process shows (its own log). The rest of issue 13's cases run in this process: tests/unit/test_hardening.py."""

from __future__ import annotations

import json

MODEL = "tiny-qwen"
ASK = [{"role": "user", "content": "Hi"}]


def test_a_long_header_is_taken_and_a_longer_one_refused_in_one_log_line(serve, qwen3_5_dir, tmp_path):
    # aiohttp refused any header past 8 KiB with a plain-text 400 and a traceback in the log.
    import http.client

    replay = tmp_path / "steps.jsonl"
    replay.write_text(json.dumps({"text": "Fine.<|im_end|>"}) + "\n")
    server = serve(str(qwen3_5_dir), "--backend", "replay", "--replay", str(replay), "--served-model-name", MODEL)
    status, answer = server.post("/v1/chat/completions", {"model": MODEL, "messages": ASK},
                                 headers={"X-Long-Token": "a" * 20_000})
    assert status == 200, answer
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    connection.request("GET", "/health", headers={"X-Longer": "b" * 70_000})
    refused = connection.getresponse()
    assert refused.status == 400
    connection.close()
    assert server.get("/health")[0] == 200
    log = server.log()
    assert log.count("refused a malformed HTTP request") == 1 and "Traceback" not in log, log[-3000:]
