"""A compaction under `looptrace serve --workers 2` (issue 42): one worker writes the summary and signs its
reference, the other expands it, from the store they share (its summaries and its key). Each request is
a connection of its own, which the kernel gives to either worker; which worker did what is read from
each worker's own metric files."""

from __future__ import annotations

import json
import urllib.request

from looptrace.proxy.api.openai.responses.compaction.plan import SUMMARY_HEADER

from server import Server
from server_workers import all_ready, children, counted_by_pid, metrics_dir

MODEL = "fleet"
SUMMARY = "SUMMARY: the notes were listed; read them next."
TASK = [{"type": "message", "role": "developer", "content": "You are a coding agent."},
        {"type": "message", "role": "user", "content": "Look at the notes."}]


def post(server: Server, body: dict, conversation: str) -> tuple[int, dict]:
    request = urllib.request.Request(server.url + "/v1/responses", data=json.dumps({"model": MODEL, **body}).encode(),
                                     headers={"Content-Type": "application/json", "session-id": conversation},
                                     method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def by_worker(server: Server, name: str, **labels: str) -> dict[int, float]:
    """What each worker counted, by pid, from the metric files every worker writes in one folder."""
    return counted_by_pid(metrics_dir(children(server.process.pid)[0]), name, **labels)


def test_a_compaction_made_by_one_worker_is_expanded_by_the_other(serve, qwen3_5_dir, tmp_path):
    steps = tmp_path / "steps.jsonl"
    # Every request answers the same: the summary (a compaction's), or the answer of a turn after it.
    steps.write_text((json.dumps({"text": "Summing up.\n</think>\n\n" + SUMMARY + "<|im_end|>"}) + "\n") * 64)
    server = serve(str(qwen3_5_dir), "--backend", "replay", "--replay", str(steps), "--served-model-name", MODEL,
                   "--workers", "2", "--trace-db", str(tmp_path / "traces.sqlite3"))
    server.wait_until(lambda: all_ready(server.log(), 2), 300)
    status, compacted = post(server, {"input": [*TASK, {"type": "compaction_trigger"}]}, "workers-compaction")
    assert status == 200, compacted
    (item,) = compacted["output"]
    made = by_worker(server, "looptrace_compactions_total", how="trigger")
    (maker,) = [pid for pid, n in made.items() if n == 1]
    # Requests carrying the item, each on a connection of its own, until the other worker took one.
    expanded: dict[int, float] = {}
    sent = 1
    for _ in range(40):
        status, answer = post(server, {"input": [*TASK, item]}, "workers-compaction")
        assert status == 200, answer
        sent += 1
        expanded = by_worker(server, "looptrace_compaction_items_total", result="expanded")
        if any(n for pid, n in expanded.items() if pid != maker):
            break  # the request just answered was the other worker's: its count moved
    other = [pid for pid, n in expanded.items() if pid != maker and n]
    assert other, f"every request went to worker {maker}: {expanded}"
    # What the other worker's model read: the summary, found in the store the two share.
    last = stored(server, "/v1/sessions/workers-compaction", lambda s: len(s["steps"]) >= sent)["steps"][-1]
    assert SUMMARY_HEADER + SUMMARY in stored(server, f"/v1/traces/{last['trace_id']}/prompt")["text"]


def stored(server: Server, path: str, whole=lambda found: True, timeout: float = 30) -> dict:
    """GET `path` until it answers 200 and is `whole`: the store writes a step a moment after its answer."""
    def answered():
        status, found = server.get(path)
        return found if status == 200 and whole(found) else None
    return server.wait_until(answered, timeout)
