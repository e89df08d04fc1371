"""Compaction on the Responses API (issue 42): a `compaction_trigger` answered with one `compaction` item,
that item rendered as its summary where it comes back, `POST /v1/responses/compact`, `context_management`,
references that cannot be expanded, and the compaction step in the trace and the metrics.

The application runs in this process (app_thread.py) with the replay backend behind a reader that keeps
each prompt the engine was handed; the Qwen3.5 and Gemma 4 checkpoints carry their real chat templates.
"""

from __future__ import annotations

import json
import re
import sqlite3
import uuid

import pytest
from openai.types.responses import CompactedResponse, Response, ResponseStreamEvent
from pydantic import TypeAdapter

from looptrace.backends.recorded import ReplayBackend
from looptrace.common import attributes as attr
from looptrace.proxy.api.openai.responses.compaction.plan import COMPACTION_PROMPT, SUMMARY_HEADER
from looptrace.proxy.settings import Settings

from app_thread import AppThread, Reading
from server import sse_events

MODEL = "tiny"
REFERENCE = re.compile(r"^lt1\.[0-9a-f]{32}\.[0-9a-f]{64}$")
STREAM_EVENT = TypeAdapter(ResponseStreamEvent)
SUMMARY = "SUMMARY: ran ls, found notes.txt; next, read it."
EXEC = {"type": "function", "name": "exec_command", "description": "Run a command.",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}
# A codex-like window: its instructions, the user's task, then a tool loop the summary replaces.
HISTORY = [
    {"type": "message", "role": "developer", "content": "You are a coding agent."},
    {"type": "message", "role": "user", "content": "Look at the notes."},
    {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "List first."}]},
    {"type": "function_call", "call_id": "call_ls", "name": "exec_command", "arguments": '{"cmd": "ls"}'},
    {"type": "function_call_output", "call_id": "call_ls", "output": "notes.txt\n"},
]
ANSWERS = {"qwen": ("Summing up.\n</think>\n\n" + SUMMARY + "<|im_end|>", "\n</think>\n\nGoing on.<|im_end|>"),
           "gemma": (SUMMARY + "<turn|>", "Going on.<turn|>")}


def started(model_dir, folder, **settings) -> AppThread:
    placeholder = folder / "none.jsonl"
    placeholder.write_text('{"text": "unused"}\n')
    return AppThread(Settings(model=str(model_dir), backend="replay", replay=str(placeholder), served_model_name=MODEL,
                              trace_db=str(folder / "traces.sqlite3"), **settings)).start()


@pytest.fixture(scope="module")
def qwen(qwen3_5_dir, tmp_path_factory):
    app = started(qwen3_5_dir, tmp_path_factory.mktemp("compaction-qwen"))
    yield app
    app.stop()


@pytest.fixture(scope="module")
def gemma(gemma4_dir, tmp_path_factory):
    app = started(gemma4_dir, tmp_path_factory.mktemp("compaction-gemma"))
    yield app
    app.stop()


def script(app: AppThread, *texts: str) -> Reading:
    """The next requests get these outputs, one each; the prompts the engine read are kept."""
    reading = Reading(ReplayBackend([{"text": t} for t in texts], app.runtime.vocab))
    app.runtime.backend = reading
    return reading


def respond(app: AppThread, items: list, **body) -> tuple[int, dict | list]:
    """The answer, or the stream's events without its terminal `[DONE]` (checked: the stream ends so)."""
    status, _, data = app.post({"model": MODEL, "input": items, "tools": [EXEC], **body})
    if not (body.get("stream") and status == 200):
        return status, json.loads(data)
    events = sse_events(data)
    assert events[-1] == "[DONE]", events[-1:]
    return status, events[:-1]


def compacted(app: AppThread, family: str = "qwen", **body) -> dict:
    """HISTORY compacted through a trigger: the compaction item."""
    script(app, ANSWERS[family][0])
    status, answer = respond(app, [*HISTORY, {"type": "compaction_trigger"}], **body)
    assert status == 200, answer
    (item,) = answer["output"]
    return item


def prompt_text(app: AppThread, reading: Reading, index: int = -1) -> str:
    return app.runtime.tokenizer.decode(reading.read[index])


# -- the trigger ----------------------------------------------------------------------------------------

def test_a_compaction_trigger_is_answered_with_exactly_one_compaction_item(qwen):
    reading = script(qwen, ANSWERS["qwen"][0])
    status, events = respond(qwen, [*HISTORY, {"type": "compaction_trigger"}], stream=True)
    assert status == 200, events
    for event in events:
        STREAM_EVENT.validate_python(event)
    # What codex's remote compaction requires: one compaction item, added and done, then completed.
    assert [e["type"] for e in events] == ["response.created", "response.in_progress", "response.output_item.added",
                                           "response.output_item.done", "response.completed"]
    assert [e["sequence_number"] for e in events] == list(range(5))
    item = events[3]["item"]
    assert events[2]["item"] == item and events[4]["response"]["output"] == [item]
    assert (item["type"], item["id"][:4]) == ("compaction", "cmp_") and REFERENCE.match(item["encrypted_content"])
    assert events[4]["response"]["usage"]["output_tokens"] > 0  # codex reads usage off every response
    # The model was asked for the summary in a user turn of its own template, after the whole history.
    prompt = prompt_text(qwen, reading)
    assert prompt.endswith(f"<|im_start|>user\n{COMPACTION_PROMPT}<|im_end|>\n<|im_start|>assistant\n<think>\n")
    assert '"cmd": "ls"' in prompt or "<parameter=cmd>\nls\n</parameter>" in prompt


def test_a_compaction_not_streamed_is_a_response_of_one_item(qwen):
    reading = script(qwen, ANSWERS["qwen"][0])
    # A call the client would force is not: the summary is text, and the prompt ends asking for it.
    status, answer = respond(qwen, [*HISTORY, {"type": "compaction_trigger"}], tool_choice="required")
    assert status == 200, answer
    assert prompt_text(qwen, reading).endswith(f"{COMPACTION_PROMPT}<|im_end|>\n<|im_start|>assistant\n<think>\n")
    Response.model_validate(answer, strict=True)
    assert [i["type"] for i in answer["output"]] == ["compaction"] and answer["status"] == "completed"


def test_the_operator_replaces_the_compaction_prompt(qwen3_5_dir, tmp_path):
    from looptrace.proxy.cli import build_parser

    prompt = tmp_path / "compaction.txt"
    prompt.write_text("Summarize for the next shift: what changed, what is left.\n")
    app = started(qwen3_5_dir, tmp_path, compaction_prompt=str(prompt))
    try:
        reading = script(app, ANSWERS["qwen"][0])
        status, answer = respond(app, [*HISTORY, {"type": "compaction_trigger"}])
        assert status == 200, answer
        text = prompt_text(app, reading)
        assert text.endswith("<|im_start|>user\nSummarize for the next shift: what changed, what is left.<|im_end|>\n"
                             "<|im_start|>assistant\n<think>\n") and COMPACTION_PROMPT not in text
    finally:
        app.stop()
    (tmp_path / "empty.txt").write_text(" \n")
    for bad in (tmp_path / "missing.txt", tmp_path / "empty.txt"):  # refused at start, saying why
        with pytest.raises(SystemExit):
            build_parser().parse_args(["serve", "--compaction-prompt", str(bad)])


def test_a_trigger_before_the_last_item_is_a_400(qwen):
    reading = script(qwen, ANSWERS["qwen"][0])
    status, error = respond(qwen, [*HISTORY[:2], {"type": "compaction_trigger"}, *HISTORY[2:]])
    assert status == 400 and error["error"]["param"] == "input[2]", error
    assert "last input item" in error["error"]["message"] and reading.read == []


# -- the item coming back -------------------------------------------------------------------------------

@pytest.mark.parametrize("family", ["qwen", "gemma"])
def test_the_summary_is_a_user_turn_in_place_of_the_turns_it_replaced(request, family):
    app = request.getfixturevalue(family)
    item = compacted(app, family)
    reading = script(app, ANSWERS[family][1], ANSWERS[family][1])
    going_on = {"type": "message", "role": "user", "content": "Go on."}
    # As codex sends it after a compaction: what it kept, the item, then what follows; the items before
    # the item that the model wrote (reasoning, calls, results) are replaced by it, if a client keeps them.
    status, answer = respond(app, [*HISTORY, item, going_on])
    assert status == 200, answer
    # The same prompt as the window written out: the instructions, the user's message, the summary as a
    # user turn, what follows. Equal because both are one template rendering the same messages.
    written = [HISTORY[0], HISTORY[1], {"type": "message", "role": "user", "content": SUMMARY_HEADER + SUMMARY},
               going_on]
    status, answer = respond(app, written)
    assert status == 200, answer
    assert reading.read[0] == reading.read[1]
    prompt = prompt_text(app, reading, 0)
    user = "<|im_start|>user\n" if family == "qwen" else "<|turn>user\n"
    assert f"{user}{SUMMARY_HEADER}{SUMMARY}" in prompt
    assert "notes.txt" not in prompt.replace(SUMMARY, "") and "List first." not in prompt


def test_a_stored_compaction_is_continued_by_previous_response_id(qwen):
    script(qwen, ANSWERS["qwen"][0], ANSWERS["qwen"][1])
    status, compaction = respond(qwen, [*HISTORY, {"type": "compaction_trigger"}], store=True)
    assert status == 200, compaction
    reading = script(qwen, ANSWERS["qwen"][1])
    status, answer = respond(qwen, [{"type": "message", "role": "user", "content": "Go on."}],
                             previous_response_id=compaction["id"])
    assert status == 200, answer
    # The stored conversation's trigger was a request once: it asks for nothing now; its item is the summary.
    prompt = prompt_text(qwen, reading)
    assert SUMMARY_HEADER + SUMMARY in prompt and COMPACTION_PROMPT not in prompt and "notes.txt\n" not in prompt


def test_a_restarted_process_expands_what_it_signed_before(qwen3_5_dir, tmp_path):
    app = started(qwen3_5_dir, tmp_path)
    try:
        item = compacted(app)
    finally:
        app.stop()
    again = started(qwen3_5_dir, tmp_path)  # the same store: its summaries and its key
    try:
        reading = script(again, ANSWERS["qwen"][1])
        status, answer = respond(again, [*HISTORY[:2], item])
        assert status == 200, answer
        assert SUMMARY_HEADER + SUMMARY in prompt_text(again, reading)
    finally:
        again.stop()


def _tampered(reference: str) -> str:
    head, mac = reference.rsplit(".", 1)
    return f"{head}.{'0' if mac[0] != '0' else '1'}{mac[1:]}"


def _foreign(reference: str) -> str:
    # A summary id and a signature of the right shape from another deployment: an id this store never held.
    return "lt1." + "ab" * 16 + "." + "cd" * 32


def _openai(reference: str) -> str:
    return "gAAAAABpM0Yj-encrypted-by-someone-else=="


@pytest.mark.parametrize(("alter", "result"), [(_tampered, "tampered"), (_foreign, "unknown"),
                                               (_openai, "malformed")])
def test_a_reference_that_cannot_be_expanded_is_a_400_and_nothing_changes(qwen, alter, result):
    item = compacted(qwen)
    refused_before = qwen.metric("looptrace_compaction_items_total", result=result)
    compactions_before = qwen.metric("looptrace_compactions_total")
    reading = script(qwen, ANSWERS["qwen"][1])
    bad = {**item, "encrypted_content": alter(item["encrypted_content"])}
    status, error = respond(qwen, [*HISTORY[:2], bad, {"type": "message", "role": "user", "content": "Go on."}],
                            store=True)
    assert status == 400, error
    assert (error["error"]["param"], error["error"]["code"]) == ("input[2].encrypted_content",
                                                                 "invalid_encrypted_content")
    assert "'input[2]'" in error["error"]["message"]
    # Nothing else: the model never read a prompt, nothing was compacted or stored, and the one refusal counted.
    assert reading.read == []
    assert qwen.metric("looptrace_compactions_total") == compactions_before
    assert qwen.metric("looptrace_compaction_items_total", result=result) == refused_before + 1
    # The conversation goes on with the item as it was made.
    status, answer = respond(qwen, [*HISTORY[:2], item])
    assert status == 200 and SUMMARY in prompt_text(qwen, reading), answer


def test_an_expired_reference_is_a_400(qwen3_5_dir, tmp_path, monkeypatch):
    from looptrace.trace_store import state

    monkeypatch.setattr(state, "MAX_COMPACTIONS", 1)  # the store keeps the newest summary only
    app = started(qwen3_5_dir, tmp_path)
    try:
        first = compacted(app)
        compacted(app)  # prunes the first
        reading = script(app, ANSWERS["qwen"][1])
        status, error = respond(app, [*HISTORY[:2], first])
        assert status == 400 and "expired" in error["error"]["message"], error
        assert reading.read == []
    finally:
        app.stop()


# -- POST /v1/responses/compact, context_management -----------------------------------------------------

def test_the_compact_endpoint_answers_a_compact_resource(qwen):
    reading = script(qwen, ANSWERS["qwen"][0], ANSWERS["qwen"][1])
    status, _, data = qwen.post({"model": MODEL, "input": HISTORY, "tools": [EXEC]}, path="/v1/responses/compact")
    assert status == 200, data
    compacted_window = json.loads(data)
    # The window a compaction leaves: the user's messages, then the compaction item. The SDK's type holds
    # output messages of the assistant only, so it checks the rest; the user's, the specification's Message.
    users, item = compacted_window["output"][:-1], compacted_window["output"][-1]
    CompactedResponse.model_validate({**compacted_window, "output": [item]}, strict=True)
    assert compacted_window["object"] == "response.compaction"
    (user,) = users
    assert user["id"].startswith("msg_") and {k: v for k, v in user.items() if k != "id"} == {
        "type": "message", "status": "completed", "role": "user",
        "content": [{"type": "input_text", "text": HISTORY[1]["content"]}]}
    assert item["type"] == "compaction" and REFERENCE.match(item["encrypted_content"])
    assert prompt_text(qwen, reading).endswith(f"{COMPACTION_PROMPT}<|im_end|>\n<|im_start|>assistant\n<think>\n")
    # That window, given back as input, goes on from the summary.
    status, answer = respond(qwen, [HISTORY[0], *compacted_window["output"]])
    assert status == 200 and SUMMARY_HEADER + SUMMARY in prompt_text(qwen, reading), answer


def test_context_management_compacts_first_past_its_threshold(qwen):
    reading = script(qwen, ANSWERS["qwen"][0], ANSWERS["qwen"][1])
    events = respond(qwen, HISTORY, stream=True, context_management=[{"type": "compaction", "compact_threshold": 50}])[1]
    for event in events:
        STREAM_EVENT.validate_python(event)
    final = events[-1]["response"]
    # The compaction item first, then the answer the model wrote on the compacted conversation.
    assert [i["type"] for i in final["output"]] == ["compaction", "message"], final["output"]
    assert final["output"][1]["content"][0]["text"] == "Going on."
    summarize, answer = (prompt_text(qwen, reading, i) for i in (0, 1))
    assert COMPACTION_PROMPT in summarize and SUMMARY_HEADER + SUMMARY in answer and "notes.txt\n" not in answer
    # Below the threshold, nothing is compacted.
    reading = script(qwen, ANSWERS["qwen"][1])
    status, answer = respond(qwen, HISTORY, context_management=[{"type": "compaction", "compact_threshold": 100000}])
    assert status == 200 and [i["type"] for i in answer["output"]] == ["message"], answer
    assert len(reading.read) == 1


def test_context_management_is_checked(qwen):
    for bad, param in (([{"type": "compaction", "compact_threshold": 0}], "context_management[0].compact_threshold"),
                       (["compaction"], "context_management[0]"), ({"type": "compaction"}, "context_management")):
        status, error = respond(qwen, HISTORY, context_management=bad)
        assert status == 400 and error["error"]["param"] == param, error


# -- the trace, the metrics -----------------------------------------------------------------------------

def test_the_compaction_step_is_marked_in_its_trace_and_counted(qwen):
    before = qwen.metric("looptrace_compactions_total", how="trigger")
    expanded_before = qwen.metric("looptrace_compaction_items_total", result="expanded")
    headers = {"session-id": "compaction-trace"}
    script(qwen, ANSWERS["qwen"][0], ANSWERS["qwen"][1])
    status, _, data = qwen.post({"model": MODEL, "input": [*HISTORY, {"type": "compaction_trigger"}], "tools": [EXEC]},
                                headers=headers)
    item = json.loads(data)["output"][0]
    status, _, data = qwen.post({"model": MODEL, "input": [*HISTORY[:2], item], "tools": [EXEC]}, headers=headers)
    assert status == 200, data
    assert qwen.metric("looptrace_compactions_total", how="trigger") == before + 1
    assert qwen.metric("looptrace_compaction_items_total", result="expanded") == expanded_before + 1
    steps = qwen.stored("/v1/sessions/compaction-trace", steps=2)["steps"]
    compaction, after = steps
    assert compaction["compaction"] == {"how": "trigger", "replaced_items": len(HISTORY),
                                        "id": item["encrypted_content"].split(".")[1]}
    assert after.get("compaction") is None and after["compactions_expanded"] == 1
    span = next(s for s in qwen.stored(f"/v1/traces/{compaction['trace_id']}")["spans"]
                if s["attributes"].get(attr.ENDPOINT))
    assert span["attributes"][attr.COMPACTION] == "trigger"
    # The summary is kept in the store's state, once, under the id the reference names.
    folder = qwen.settings.trace_db.rsplit("/", 1)[0]
    with sqlite3.connect(f"{folder}/traces.state.sqlite3") as db:
        ids = [r[0] for r in db.execute("SELECT id FROM state_compactions")]
    assert compaction["compaction"]["id"] in ids


def test_the_compaction_step_is_exported_like_any_step(qwen):
    """`looptrace export`: the compaction is a step of the session, its answer the summary's tokens; the
    next step's prompt holds the summary as a user turn, which the model did not write there (mask 0)."""
    import argparse

    from looptrace.proxy.export import command as export

    headers = {"session-id": "compaction-export"}
    script(qwen, ANSWERS["qwen"][0], ANSWERS["qwen"][1])
    status, _, data = qwen.post({"model": MODEL, "input": [*HISTORY, {"type": "compaction_trigger"}], "tools": [EXEC]},
                                headers=headers)
    item = json.loads(data)["output"][0]
    status, _, data = qwen.post({"model": MODEL, "input": [*HISTORY[:2], item], "tools": [EXEC]}, headers=headers)
    assert status == 200, data
    qwen.stored("/v1/sessions/compaction-export", steps=2)
    args = argparse.Namespace(store=qwen.settings.trace_db, session="compaction-export", since=None)
    compaction, after = export.exported(args)
    decode = qwen.runtime.tokenizer.decode
    assert SUMMARY in decode(compaction["completion_ids"])
    prompt = decode(after["prompt_ids"])
    at = prompt.index(SUMMARY_HEADER + SUMMARY)
    held = len(qwen.runtime.tokenizer.encode(prompt[:at], add_special_tokens=False))
    assert after["mask"][held:len(after["prompt_ids"])] == [0] * (len(after["prompt_ids"]) - held)


@pytest.mark.parametrize(("metadata", "marked"), [
    ({"x-codex-turn-metadata": json.dumps({"request_kind": "compaction", "compaction": {"implementation": "responses"}})},
     True),
    ({"x-codex-turn-metadata": json.dumps({"request_kind": "turn"})}, False),
    ({"x-codex-turn-metadata": '{"request_kind": "compaction"'}, False),  # not JSON: nothing is said
    ({"x-codex-turn-metadata": ["compaction"]}, False),
    ({"x-codex-turn-metadata": "[" * 20000 + '"compaction"' + "]" * 20000}, False),  # nested past the parser
])
def test_a_clients_own_compaction_is_marked_as_it_says(qwen, metadata, marked):
    """codex with a custom provider compacts on its own side, in an ordinary request its metadata names."""
    conversation = "client-compaction-" + uuid.uuid4().hex
    script(qwen, ANSWERS["qwen"][0])
    status, _, data = qwen.post({"model": MODEL, "input": HISTORY, "client_metadata": metadata},
                                headers={"session-id": conversation})
    assert status == 200, data
    (step,) = qwen.stored(f"/v1/sessions/{conversation}", steps=1)["steps"]
    assert step.get("compaction") == ({"how": "client", "replaced_items": len(HISTORY) - 1} if marked else None)


def test_a_turn_compacted_first_parses_its_request_once(qwen, responses_parses):
    parses = responses_parses
    # Counting, the compaction's own request, then the compacted one: all made from the one model.
    script(qwen, ANSWERS["qwen"][0], ANSWERS["qwen"][1])
    status, answer = respond(qwen, HISTORY, context_management=[{"type": "compaction", "compact_threshold": 50}])
    assert status == 200 and [i["type"] for i in answer["output"]] == ["compaction", "message"], answer
    assert parses == ["ResponsesRequest"]
    parses.clear()
    script(qwen, ANSWERS["qwen"][0])
    status, answer = respond(qwen, [*HISTORY, {"type": "compaction_trigger"}])  # a trigger: one parse too
    assert status == 200 and parses == ["ResponsesRequest"], (answer, parses)
    parses.clear()
    script(qwen, ANSWERS["qwen"][0])
    status, _, data = qwen.post({"model": MODEL, "input": HISTORY}, path="/v1/responses/compact")
    assert status == 200 and parses == ["ResponsesRequest"], (data, parses)
