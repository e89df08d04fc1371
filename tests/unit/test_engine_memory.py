"""The model's memory below the engine (issue 43, item 1): the ids a conversation's model read and
sampled are kept by the engine (proxy/engine/memory.py), written by `Generation` as it runs and read by
token continuity; observers only read them. Token continuity works with no observer at all, and no
observer writes to a request, a generation, the conversation's memory or an event it is shown."""

from __future__ import annotations

import dataclasses
import json

import pytest

from looptrace.proxy.engine.memory import Memory
from looptrace.proxy.engine.observer import Observer
from looptrace.proxy.observe import telemetry as telemetry_module
from looptrace.proxy.settings import Settings

from app_thread import AppThread, Reading

READ = {"type": "function", "function": {"name": "read_file", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}
CALL = ("I should read it.\n</think>\n\n<tool_call>\n<function=read_file>\n<parameter=path>\nnotes.txt\n"
        "</parameter>\n</function>\n</tool_call><|im_end|>")
ANSWER = "It says hello.\n</think>\n\nIt says hello.<|im_end|>"


@pytest.fixture(scope="module")
def app(qwen3_5_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("memory")
    placeholder = folder / "none.jsonl"
    placeholder.write_text('{"text": "unused"}\n')
    running = AppThread(Settings(model=str(qwen3_5_dir), backend="replay", replay=str(placeholder),
                                 served_model_name="tiny", trace_db=str(folder / "traces.sqlite3"),
                                 token_continuity="keep")).start()
    yield running
    running.stop()


def tool_loop(app: AppThread, rollout: str, *, stream: bool = False) -> Reading:
    """Three turns of a tool loop under `keep` (a call, its result; an answer, a new user message; an
    answer); what the engine read and the model wrote."""
    backend = Reading(app.replay(CALL, ANSWER, ANSWER))
    app.runtime.backend = backend
    messages = [{"role": "user", "content": "Read notes.txt"}]
    for _ in range(3):
        body = {"model": "tiny", "messages": messages, "tools": [READ], "stream": stream}
        if stream:
            message = streamed_message(app, f"/r/{rollout}/v1/chat/completions", body)
        else:
            status, answer = app.call("POST", f"/r/{rollout}/v1/chat/completions", body)
            assert status == 200, answer
            message = answer["choices"][0]["message"]
        calls = message.get("tool_calls")
        messages = messages + [message, {"role": "tool", "tool_call_id": calls[0]["id"], "content": "hello"}
                               if calls else {"role": "user", "content": "thanks"}]
    return backend


def streamed_message(app: AppThread, path: str, body: dict) -> dict:
    import urllib.request

    request = urllib.request.Request(app.url + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        chunks = [json.loads(line[6:]) for line in response.read().decode().splitlines()
                  if line.startswith("data: {")]
    message: dict = {"role": "assistant", "content": "", "reasoning_content": ""}
    calls: dict[int, dict] = {}
    for chunk in chunks:
        for choice in chunk["choices"]:
            delta = choice["delta"]
            message["content"] += delta.get("content") or ""
            message["reasoning_content"] += delta.get("reasoning_content") or ""
            for call in delta.get("tool_calls") or ():
                held = calls.setdefault(call["index"], {"id": call["id"], "type": "function",
                                                        "function": {"name": call["function"]["name"],
                                                                     "arguments": ""}})
                held["function"]["arguments"] += call["function"].get("arguments") or ""
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message


def kept(backend: Reading) -> bool:
    """Whether the last prompt is the one before and the ids sampled after it, then more. Qwen3.5's
    template drops an answer's reasoning once a new user message follows: rendered as always, it is not."""
    held = backend.read[1] + backend.wrote[1]
    return backend.read[2][:len(held)] == held


def test_token_continuity_keeps_a_turn_with_no_observer_at_all(app, monkeypatch):
    """The engine's memory is its own: with no span builder (nor metrics) watching, the next turn still
    reads what the model read and wrote. (Before, the ids came from the span builder's token buffer.)"""
    def unobserved(self, endpoint, parent, attributes):
        found = original(self, endpoint, parent, attributes)
        found.observers = ()
        return found

    original = telemetry_module.Telemetry.start_request
    monkeypatch.setattr(telemetry_module.Telemetry, "start_request", unobserved)
    assert kept(tool_loop(app, "unobserved-1"))


# -- observers only watch -----------------------------------------------------------------------------

ENGINE_TYPES = ("looptrace.proxy.engine.", "looptrace.backends.base", "looptrace.families.base")


def state(value, depth: int = 0):
    """What can be written of a value, to compare before and after a hook: data (dicts, lists, the
    engine's objects: a request, a generation, the conversation's memory, a decode request) taken
    apart; anything else (the runtime, a lock, an event loop's event) by identity."""
    if depth > 8 or value is None or isinstance(value, (str, int, float, bool, bytes)):
        return value
    if isinstance(value, Memory):  # every conversation's: the request's own view of it is its Recall
        return ("object", id(value))
    if isinstance(value, dict):
        return ("dict", tuple((k, state(v, depth + 1)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(state(v, depth + 1) for v in value))
    if isinstance(value, (set, frozenset)):
        return (type(value).__name__, frozenset(value))
    if type(value).__module__.startswith(ENGINE_TYPES):
        names = [f.name for f in dataclasses.fields(value)] if dataclasses.is_dataclass(value) else [
            *getattr(value, "__dict__", {}), *getattr(type(value), "__slots__", ())]
        return (type(value).__name__, tuple((n, state(getattr(value, n, None), depth + 1)) for n in names
                                            if n not in SKIPPED))
    return ("object", id(value))


SKIPPED = {"runtime", "observers", "_screening"}  # the served model; the observers themselves; the engine's own


class Watching(Observer):
    """An observer as the engine sees it, each hook checked: what it was shown (the generation, with its
    request and the conversation's memory; the event; the decode request) is as it was after the hook."""

    def __init__(self, inner: Observer, writes: list[str]) -> None:
        self.inner, self.writes = inner, writes

    def _watched(self, name: str, *shown):
        before = [state(s) for s in shown]
        result = getattr(self.inner, name)(*shown)
        for n, (was, value) in enumerate(zip(before, shown)):
            if state(value) != was:
                self.writes.append(f"{type(self.inner).__name__}.{name} wrote to argument {n}")
        return result

    def rendered(self, generation, started_ns, ended_ns, content=True):
        self._watched("rendered", generation, started_ns, ended_ns, content)

    def submitted(self, generation, decode):
        return self._watched("submitted", generation, decode)

    def upstream(self, event):
        self._watched("upstream", event)

    def prefill(self, event):
        self._watched("prefill", event)

    def token(self, event, channel, now_ns):
        self._watched("token", event, channel, now_ns)

    def tool_call(self, delta):
        self._watched("tool_call", delta)

    def unparsed_call(self, delta):
        self._watched("unparsed_call", delta)

    def finished(self, generation):
        self._watched("finished", generation)


def watch(monkeypatch, extra: Observer | None = None) -> list[str]:
    """Every request's observers (and `extra`) watched from now on; the writes found."""
    writes: list[str] = []
    original = telemetry_module.Telemetry.start_request

    def watched(self, endpoint, parent, attributes):
        found = original(self, endpoint, parent, attributes)
        observers = (*found.observers, *((extra,) if extra is not None else ()))
        found.observers = tuple(Watching(o, writes) for o in observers)
        return found

    monkeypatch.setattr(telemetry_module.Telemetry, "start_request", watched)
    return writes


@pytest.mark.parametrize("stream", [False, True], ids=["answer", "stream"])
def test_no_observer_writes_to_a_turn_or_a_request(app, monkeypatch, stream):
    """The span builder and the metrics, over a kept tool loop (a conversation's memory read and written,
    tool calls, every token): each hook leaves what it was shown as it found it."""
    writes = watch(monkeypatch)
    assert kept(tool_loop(app, f"watched-{stream}", stream=stream))
    assert writes == []


class Meddling(Observer):
    def __init__(self, where: str) -> None:
        self.where = where

    def rendered(self, generation, started_ns, ended_ns, content=True):
        if self.where == "request":
            generation.request.max_tokens = 1
        elif self.where == "memory":
            generation.request.memory.label = "someone else's"

    def token(self, event, channel, now_ns):
        if self.where == "event":
            event["text"] = ""

    def finished(self, generation):
        if self.where == "generation":
            generation.tool_calls.append({"name": "made_up"})


@pytest.mark.parametrize("where", ["request", "memory", "event", "generation"])
def test_the_watch_finds_an_observer_that_writes(app, monkeypatch, where):
    """The check above can fail: an observer that writes to what it is shown is found."""
    writes = watch(monkeypatch, Meddling(where))
    tool_loop(app, f"meddled-{where}")
    assert writes and all(w.startswith("Meddling.") for w in writes), writes


def test_a_turn_kept_on_one_process_continues_on_another(qwen3_5_dir, tmp_path):
    """Two applications on one store stand for two processes (`--workers`, or machines behind a load
    balancer): the engine's memory of a turn lives in the store's state, so a conversation's turns kept
    on either build on what the model read and wrote on the other."""
    placeholder = tmp_path / "none.jsonl"
    placeholder.write_text('{"text": "unused"}\n')
    settings = Settings(model=str(qwen3_5_dir), backend="replay", replay=str(placeholder), served_model_name="tiny",
                        trace_db=str(tmp_path / "traces.sqlite3"), token_continuity="keep")
    a, b = AppThread(settings).start(), AppThread(settings).start()
    try:
        read, wrote = [], []
        messages = [{"role": "user", "content": "Read notes.txt"}]
        for n, (app, output) in enumerate(((a, CALL), (b, ANSWER), (a, ANSWER))):
            backend = Reading(app.replay(output))
            app.runtime.backend = backend
            status, answer = app.call("POST", "/r/two-1/v1/chat/completions",
                                      {"model": "tiny", "messages": messages, "tools": [READ]})
            assert status == 200, answer
            read.append(backend.read[0])
            wrote.append(backend.wrote[0])
            if n:  # what the model read and wrote on the other process, then more
                assert read[n][:len(read[n - 1]) + len(wrote[n - 1])] == read[n - 1] + wrote[n - 1]
            message = answer["choices"][0]["message"]
            calls = message.get("tool_calls")
            messages = messages + [message, {"role": "tool", "tool_call_id": calls[0]["id"], "content": "hello"}
                                   if calls else {"role": "user", "content": "thanks"}]
        kinds = [a.metric("looptrace_token_continuity_total", **{"class": "kept"}),
                 b.metric("looptrace_token_continuity_total", **{"class": "kept"})]
        assert kinds == [1, 1]
    finally:
        a.stop()
        b.stop()
