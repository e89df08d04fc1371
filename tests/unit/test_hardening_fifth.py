"""The fifth hardening pass (issue 53): every export line strict JSON whatever a client sent, errors said
in the user's words (never a Python exception's name), a WebSocket `stream_id` held to OpenAI's shape, a
shutdown that does not wait on a dead collector, and a replay out of answers said as a 503."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from looptrace.proxy import cli
from looptrace.proxy.settings import Settings

from app_thread import AppThread

MODEL = "tiny"
HOSTILE_ARGUMENTS = '{"a": 1e400, "b": NaN, "c": 123456789012345678901234567890, "d": -Infinity}'
CALL = {"name": "f", "description": "A tool.", "parameters": {"type": "object", "properties": {}}}
EXPORTS = ["jsonl", "verl", "skyrl", "nemo-gym", "tinker", "atif"]


def strict(line: str) -> object:
    """A line as JSON.parse and orjson read it: NaN, Infinity and numbers past a float's range refused."""
    def refused(name):
        raise AssertionError(f"{name} in an export line: {line[:200]}")

    def finite(digits):
        value = float(digits)
        assert value not in (float("inf"), float("-inf")), f"{digits} overflows in an export line"
        return value

    return json.loads(line, parse_constant=refused, parse_float=finite)


@pytest.fixture(scope="module")
def app(qwen3_5_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("fifth")
    (folder / "none.jsonl").write_text('{"text": "unused"}\n')
    running = AppThread(Settings(model=str(qwen3_5_dir), backend="replay", replay=str(folder / "none.jsonl"),
                                 served_model_name=MODEL, trace_db=str(folder / "traces.sqlite3"))).start()
    yield running
    running.stop()


def export_file(app: AppThread, key: str, fmt: str, tmp_path) -> str:
    """`looptrace export` as a user runs it, into a file."""
    out = tmp_path / f"{key}.{fmt}"
    with pytest.raises(SystemExit) as done:
        cli.main(["export", "--store", app.runtime.settings.trace_db, "--session", key, "--format", fmt,
                  "--out", str(out)])
    assert done.value.code == 0
    return str(out)


def export(app: AppThread, key: str, fmt: str, tmp_path) -> list[str]:
    with open(export_file(app, key, fmt, tmp_path), encoding="utf-8") as lines:
        return lines.read().splitlines()


def test_a_hostile_history_leaves_every_export_line_strict_json(app, tmp_path):
    """M1: arguments holding 1e400, NaN and a 30-digit integer were answered, then written by `export
    --format atif` as `Infinity` and `NaN`, which strict parsers refuse: one request poisoned the file."""
    key = "hostile-arguments"
    history = [{"role": "user", "content": "Call f."},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": HOSTILE_ARGUMENTS}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "done"}]
    app.replay("Thinking.\n</think>\n\n<tool_call>\n<function=f>\n</function>\n</tool_call><|im_end|>")
    status, answer = app.call("POST", "/v1/chat/completions", {
        "model": MODEL, "messages": history, "tools": [{"type": "function", "function": CALL}], "logprobs": True},
        {"session_id": key})
    assert status == 200, answer
    app.stored(f"/v1/sessions/{key}", steps=1)
    for fmt in EXPORTS:
        lines = export(app, key, fmt, tmp_path)
        assert lines, fmt
        for line in lines:
            strict(line)
    for fmt in ("parquet", "prime-rl"):  # Parquet: the JSON held in its text columns
        table = pq.read_table(export_file(app, key, fmt, tmp_path)).to_pylist()
        assert table, fmt
        for row in table:
            if "looptrace" in row:
                strict(row["looptrace"])
            for call in row.get("tool_calls") or ():
                strict(call["arguments"])
    (trajectory,) = [strict(line) for line in export(app, key, "atif", tmp_path)]
    calls = [c for step in trajectory["steps"] for c in step.get("tool_calls", ())]
    kept = [c for c in calls if c["tool_call_id"] == "call_1"]
    assert kept and kept[0]["extra"]["arguments_text"] == HOSTILE_ARGUMENTS, kept  # kept as the client wrote it
