"""Budgets (issue 55; api/budgets.py, trace_store/budgets.py): a key's requests per minute and tokens per
day, refused with a 429 in each API's own shape and Retry-After, counted in the store that two servers
(two `--workers`) share, and counted per key on /metrics. On SQLite and PostgreSQL alike."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
import uuid

import pytest

from looptrace.proxy.api.budgets import Budgets
from looptrace.proxy.api.keys import TELEMETRY
from looptrace.proxy.observe.metrics import Metrics
from looptrace.proxy.settings import Settings
from looptrace.trace_store.api_keys import SECRET_ENV, KeyStore, server_secret
from looptrace.trace_store.budgets import DAY, MINUTE, REQUESTS, TOKENS, BudgetStore
from looptrace.trace_store.interface import StoreUnavailable

from app_thread import AppThread
from stores import KINDS, Stores

MODEL = "tiny"
ANSWER = "\n</think>\n\nNoted.<|im_end|>"


@pytest.fixture(scope="module", params=KINDS)
def servers(request, qwen3_5_dir, tmp_path_factory):
    """Two servers on one store, as two `--workers` processes are: (first, second, the store's keys)."""
    stores = Stores(request.param, tmp_path_factory.mktemp("budgets"),
                    request.getfixturevalue("postgres_url") if request.param == "postgresql" else None)
    setting = stores.setting()
    recorded = stores.folder / "none.jsonl"  # each test sets its answers (AppThread.replay)
    recorded.write_text('{"text": "unused"}\n')
    with pytest.MonkeyPatch.context() as env:
        env.setenv(SECRET_ENV, "budget-test-secret")  # never this machine's own secret file
        apps = [AppThread(Settings(model=str(qwen3_5_dir), backend="replay", replay=str(recorded),
                                   served_model_name=MODEL,
                                   trace_db=setting)).start() for _ in range(2)]
        try:
            for app in apps:
                state = app.app[TELEMETRY].state
                if request.param == "postgresql":
                    state._pool.wait(timeout=30)  # a fresh pool's first connection is not a store that fails
            yield apps[0], apps[1], KeyStore(apps[0].app[TELEMETRY].state, server_secret())
        finally:
            for app in apps:
                app.stop()
            stores.close()


def named(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def send(app, key: str, path: str, body: dict, header: str = "Authorization") -> tuple[int, dict, dict]:
    """(status, headers, the JSON answer) of one request carrying `key`."""
    app.replay(ANSWER)
    value = f"Bearer {key}" if header == "Authorization" else key
    request = urllib.request.Request(app.url + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json", header: value,
                                              "anthropic-version": "2023-06-01"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, dict(response.headers), json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), json.loads(err.read())


def chat(app, key: str) -> tuple[int, dict, dict]:
    return send(app, key, "/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})


def messages(app, key: str) -> tuple[int, dict, dict]:
    return send(app, key, "/v1/messages", {"model": MODEL, "max_tokens": 16,
                                           "messages": [{"role": "user", "content": "hi"}]}, header="x-api-key")


def in_one_minute(burst):
    """`burst()`'s answers, all sent within one UTC minute (a window of the counters): a burst the minute's
    end cut in two is sent again, once (it takes well under a minute, so the second cannot be cut too)."""
    for _ in range(2):
        started = int(time.time()) // MINUTE
        answers = burst()
        if int(time.time()) // MINUTE == started:
            return answers
    raise AssertionError("two bursts in a row crossed a minute's end")


def generated(app) -> float:
    return app.metric("looptrace_generation_tokens_total")


def test_the_request_past_the_minutes_limit_gets_a_429_in_openais_shape(servers):
    app, _, keys = servers

    def burst():
        key = keys.create(named("rpm"), requests_per_minute=2)
        answers = [chat(app, key), send(app, key, "/v1/responses", {"model": MODEL, "input": "hi"})]
        before = generated(app), app.metric("looptrace_requests_total", status="429")
        answers.append(chat(app, key))
        return key, answers, before

    key, (first, second, third), (tokens, refusals) = in_one_minute(burst)
    assert first[0] == 200 and second[0] == 200, (first, second)
    status, headers, body = third
    assert status == 429, body
    assert body["error"]["type"] == "requests" and body["error"]["code"] == "rate_limit_exceeded", body
    assert "requests per minute" in body["error"]["message"]
    assert 1 <= int(headers["Retry-After"]) <= MINUTE
    assert generated(app) == tokens  # refused before it ran: nothing generated
    app.settled()
    assert app.metric("looptrace_requests_total", status="429") == refusals + 1  # and traced as a 429
    status, _, body = send(app, key, "/v1/responses", {"model": MODEL, "input": "hi"})  # Responses: the same shape
    assert status == 429 and body["error"]["code"] == "rate_limit_exceeded", body


def test_the_request_past_the_minutes_limit_gets_a_429_in_anthropics_shape(servers):
    app, _, keys = servers

    def burst():
        key = keys.create(named("claude"), requests_per_minute=1)
        return messages(app, key), messages(app, key)

    first, (status, headers, body) = in_one_minute(burst)
    assert first[0] == 200, first
    assert status == 429 and body["type"] == "error" and body["error"]["type"] == "rate_limit_error", body
    assert set(body["error"]) == {"type", "message"} and "requests per minute" in body["error"]["message"]
    assert 1 <= int(headers["Retry-After"]) <= MINUTE


def test_the_gemini_api_refuses_in_googles_shape(servers):
    app, _, keys = servers

    def burst():
        key = keys.create(named("gemini"), requests_per_minute=1)
        return [send(app, key, f"/v1beta/models/{MODEL}:generateContent",
                     {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}) for _ in range(2)]

    first, (status, headers, body) = in_one_minute(burst)
    assert first[0] == 200, first
    assert status == 429 and body["error"]["status"] == "RESOURCE_EXHAUSTED" and body["error"]["code"] == 429, body
    assert 1 <= int(headers["Retry-After"]) <= MINUTE


def test_the_days_tokens_spent_refuse_the_next_turn_until_midnight(servers):
    app, _, keys = servers
    name = named("tpd")
    key = keys.create(name, tokens_per_day=10)
    status, _, answer = chat(app, key)  # within the budget when it starts: it runs whole, past it
    assert status == 200, answer
    spent = answer["usage"]["prompt_tokens"] + answer["usage"]["completion_tokens"]
    assert spent > 10
    assert BudgetStore(app.app[TELEMETRY].state).used(name, TOKENS) == spent
    assert app.metric("looptrace_key_tokens_total", key=name) == spent
    status, headers, body = chat(app, key)
    assert status == 429 and body["error"]["type"] == "tokens", body
    assert "tokens per day" in body["error"]["message"]
    until_midnight = DAY - int(time.time()) % DAY
    assert abs(int(headers["Retry-After"]) - until_midnight) <= 2
    status, _, body = messages(app, key)
    assert status == 429 and body["error"]["type"] == "rate_limit_error", body
    assert app.metric("looptrace_key_refused_total", key=name, reason=TOKENS) == 2


def test_a_streamed_turns_tokens_are_charged_too(servers):
    app, _, keys = servers
    name = named("stream")
    key = keys.create(name, tokens_per_day=10**6)
    app.replay(ANSWER)
    status, _, data = app.post({"model": MODEL, "input": "hi", "stream": True}, headers={"Authorization": f"Bearer {key}"})
    assert status == 200
    app.settled()  # the request's span ends once its tokens are charged, after its stream's last frame
    events = [json.loads(line[6:]) for line in data.decode().splitlines() if line.startswith("data: {")]
    usage = events[-1]["response"]["usage"]
    assert BudgetStore(app.app[TELEMETRY].state).used(name, TOKENS) == usage["input_tokens"] + usage["output_tokens"]


def test_two_servers_on_one_store_share_the_count(servers):
    first, second, keys = servers

    def burst():
        key = keys.create(named("shared"), requests_per_minute=2)
        return chat(first, key), chat(second, key), chat(first, key), chat(second, key)

    answers = in_one_minute(burst)
    assert [a[0] for a in answers] == [200, 200, 429, 429], answers
    name = named("shared-tokens")
    key = keys.create(name, tokens_per_day=1)
    assert chat(first, key)[0] == 200
    status, _, body = chat(second, key)  # the tokens the first server charged
    assert status == 429 and body["error"]["type"] == "tokens", body
    assert second.metric("looptrace_key_refused_total", key=name, reason=TOKENS) == 1
    assert first.metric("looptrace_key_refused_total", key=name) == 0  # each process's own series


def test_metrics_count_each_keys_requests_tokens_and_refusals(servers):
    app, _, keys = servers
    free = named("free")

    def burst():
        label = named("counted")
        key = keys.create(label, requests_per_minute=1)
        return label, chat(app, key), chat(app, key)

    label, ran, refused = in_one_minute(burst)
    assert (ran[0], refused[0]) == (200, 429)
    assert app.metric("looptrace_key_requests_total", key=label) == 2  # the refused one too
    assert app.metric("looptrace_key_refused_total", key=label, reason=REQUESTS) == 1
    usage = ran[2]["usage"]
    assert app.metric("looptrace_key_tokens_total", key=label) == usage["prompt_tokens"] + usage["completion_tokens"]
    # A key without budgets is counted on /metrics, and costs the store nothing.
    unlimited = keys.create(free)
    assert chat(app, unlimited)[0] == 200 and app.metric("looptrace_key_requests_total", key=free) == 1
    state = app.app[TELEMETRY].state
    (rows,) = state._read([("SELECT count(*) FROM budget_use WHERE name = ?", (free,))])
    assert rows[0][0] == 0


def test_the_minute_frees_and_a_refusal_does_not_take_a_slot(tmp_path):
    """The store's counting alone, on a clock the test gives: the refused request takes no slot, and
    the next minute starts from none."""
    from looptrace.trace_store.sqlite.state import SQLiteState

    store = BudgetStore(SQLiteState(tmp_path / "state.sqlite3"))
    now = 1_800_000_000 + 15.5  # 15.5 s into a minute
    assert [store.admit("k", 2, None, now) for _ in range(3)][:2] == [None, None]
    refused = store.admit("k", 2, None, now)
    assert refused.reason == REQUESTS and refused.retry_after == 45
    assert store.used("k", REQUESTS, now) == 2
    assert store.admit("k", 2, None, now + 45) is None


def test_two_processes_racing_for_the_last_slots_take_exactly_the_limit(stores):
    """Two processes' stores (connections of their own), four threads each, sending at once: the minute's
    row is the test, so exactly the limit are admitted, whichever store."""
    from concurrent.futures import ThreadPoolExecutor

    setting = stores.setting()
    processes = [BudgetStore(stores.state(setting)) for _ in range(2)]
    now = 1_800_000_000 + 10.0
    try:
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda i: processes[i % 2].admit("raced", 25, 10**6, now), range(64)))
        assert sum(a is None for a in answers) == 25
        assert processes[0].used("raced", REQUESTS, now) == 25
    finally:
        for process in processes:
            process.state.close()


class FailingState:
    """A store that refuses every call: budgets cannot be counted."""

    where = "postgresql://nowhere/x"

    def _write(self, statements):
        raise StoreUnavailable("connection refused")

    _read = _write


def test_a_store_that_cannot_count_admits_the_request_and_says_so(caplog):
    from looptrace.proxy.api.auth import Caller

    budgets = Budgets(FailingState(), Metrics())
    caller = Caller("limited", "limited", frozenset({"infer"}), requests_per_minute=1, tokens_per_day=1)
    spending = asyncio.run(budgets.admit(caller))
    assert spending is not None and spending.caller is caller
    assert "budgets could not be counted" in caplog.text
