"""The rollout surfaces under hostile input (issue 41: M1, M2, L1, L4, L6). Each test is named after its
finding and failed before its fix: rewards grew without bound in bytes and steps and every POST echoed
the whole rollout (M1); NaN and Infinity were taken into a reward's `info` and came back as invalid
JSON (M2); a 400-digit integer among trainer logprobs was a 500 (L1); a reward for a rollout that never
made a request took a slot, and steps past the rollout's end were taken (L4); an overflowing KL read as
"no data", a fullwidth digit as an ASCII one, and an invalid X-Weight-Version was dropped (L6)."""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.parse
import urllib.request

import pytest

from looptrace.proxy.api.keys import TELEMETRY
from looptrace.proxy.settings import Settings
from looptrace.trace_store import rollouts as stored_rollouts
from looptrace.trace_store.gap import figures
from looptrace.trace_store.location import open_state

from app_thread import AppThread

MODEL = "tiny"
ANSWER = "Hello there.<|im_end|>"


def started(folder, model, **settings) -> AppThread:
    placeholder = folder / "none.jsonl"
    placeholder.write_text('{"text": "unused"}\n')
    return AppThread(Settings(model=str(model), backend="replay", replay=str(placeholder), served_model_name=MODEL,
                              trace_db=str(folder / "traces.sqlite3"), **settings)).start()


@pytest.fixture(scope="module")
def app(qwen3_5_dir, tmp_path_factory):
    running = started(tmp_path_factory.mktemp("bounds"), qwen3_5_dir)
    yield running
    running.stop()


def rollout(app: AppThread, key: str, steps: int = 1, headers: dict | None = None) -> list[str]:
    """`steps` requests through the rollout's base URL; their trace ids, once stored."""
    app.replay(*[ANSWER] * steps)
    messages = [{"role": "user", "content": "Hi"}]
    for _ in range(steps):
        status, answer = app.call("POST", f"/r/{key}/v1/chat/completions", {"model": MODEL, "messages": messages},
                                  headers)
        assert status == 200, answer
        messages = messages + [answer["choices"][0]["message"], {"role": "user", "content": "More"}]
    return [s["trace_id"] for s in app.stored(f"/v1/sessions/{key}", steps=steps)["steps"]]


_MADE: dict[tuple[int, str], list[str]] = {}


def rollout_once(app: AppThread, key: str, steps: int = 1) -> list[str]:
    """The rollout `key` of `steps` steps, made by the first test that asks (the parametrized ones share it)."""
    if (id(app), key) not in _MADE:
        _MADE[id(app), key] = rollout(app, key, steps)
    return _MADE[id(app), key]


def raw(app: AppThread, method: str, path: str, text: str | None = None, headers: dict | None = None):
    """(status, the answer's bytes) of a body as written: NaN and 1e400 are what json.dumps will not write."""
    request = urllib.request.Request(app.url + path, data=None if text is None else text.encode(), method=method,
                                     headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def strict(data: bytes) -> object:
    """JSON as the standard has it: Python's json takes NaN and Infinity, which no other reader does."""
    def refuse(name):
        raise ValueError(f"{name} is not JSON")
    return json.loads(data, parse_constant=refuse)


# -- M1: bounded in bytes and steps, and a short answer ---------------------------------------------------


def test_m1_a_rollouts_rewards_are_bounded_in_bytes_across_posts(app):
    steps = 17
    rollout(app, "m1-bytes", steps=steps)
    big = {"blob": "x" * 60_000}  # under the 64 KB bound of one info; 18 of them pass the rollout's 1 MiB
    status, answer = app.call("POST", "/v1/rollouts/m1-bytes/reward", {"reward": 1.0, "info": big})
    assert status == 200, answer
    for step in range(1, steps + 1):
        status, answer = app.call("POST", "/v1/rollouts/m1-bytes/reward", {"steps": [
            {"step": step, "reward": 0.5, "info": big}]})
        if step < steps:
            assert status == 200, (step, answer)
    # Each post adds a step's info until the rollout's bound; the one past it is refused, saying so.
    assert status == 400 and answer["error"]["param"] == "steps[0].info", answer
    assert f"{stored_rollouts.MAX_ROLLOUT_INFO_BYTES:,}" in answer["error"]["message"], answer
    found = app.call("GET", "/v1/rollouts/m1-bytes/reward")[1]
    assert len(found["steps"]) == steps - 1
    assert len(json.dumps(found)) <= stored_rollouts.MAX_ROLLOUT_INFO_BYTES + 10_000
    # Replacing what is there is not adding to it: step 1's info again is taken.
    status, answer = app.call("POST", "/v1/rollouts/m1-bytes/reward", {"steps": [{"step": 1, "reward": 1.0,
                                                                                  "info": big}]})
    assert status == 200, answer


def test_m1_a_reward_post_answers_in_a_few_bytes_not_the_whole_rollout(app):
    rollout(app, "m1-short", steps=3)
    info = {"log": "y" * 50_000}
    status, body = raw(app, "POST", "/v1/rollouts/m1-short/reward", json.dumps({
        "reward": 1.0, "info": info, "steps": [{"step": n, "reward": 0.1 * n, "info": info} for n in (1, 2, 3)]}))
    assert status == 200 and len(body) < 300, body[:300]
    answer = json.loads(body)
    assert answer["rollout"] == "m1-short" and answer["reward"] == 1.0 and answer["step_rewards"] == 3
    assert answer["info_bytes"] == 4 * len(json.dumps(info, separators=(",", ":")))
    assert len(app.call("GET", "/v1/rollouts/m1-short/reward")[1]["steps"]) == 3  # GET reads it all


def test_m1_one_post_names_at_most_the_rollouts_steps(app):
    rollout(app, "m1-steps", steps=2)
    status, error = app.call("POST", "/v1/rollouts/m1-steps/reward", {
        "steps": [{"step": n, "reward": 0} for n in range(1, stored_rollouts.MAX_STEPS + 2)]})
    assert status == 400 and error["error"]["param"] == "steps", error


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_m1_rollouts_are_kept_by_bytes_as_well_as_by_count(request, tmp_path, monkeypatch, kind):
    """The newest rollouts that fit in MAX_ROLLOUTS_BYTES together (info, step rewards, trainer
    logprobs), on either store; before, only their count (65,536) was bounded."""
    setting = str(tmp_path / "traces.sqlite3")
    if kind == "postgresql":
        import postgres

        setting = postgres.fresh_schema(request.getfixturevalue("postgres_url"))
    monkeypatch.setattr(stored_rollouts, "MAX_ROLLOUTS_BYTES", 250_000)
    monkeypatch.setattr(stored_rollouts, "PRUNE_EVERY", 1)
    rollouts = stored_rollouts.Rollouts(open_state(setting))
    try:
        info = {"blob": "z" * 50_000}
        for n in range(8):
            rollouts.set_reward(f"r{n}", 1.0, info, [("1", 0.5, info)])  # 100 KB each
        rollouts.set_trainer_logprobs("r7", {"a" * 32: [-0.5] * 1000}, None)  # 8 KB more
        kept = [r["rollout"] for r in rollouts.in_group(None, 100)]
        assert kept == ["r7", "r6"], kept  # 208 KB; a third would pass 250 KB
        assert rollouts.get("r7")["info"] == info and rollouts.get("r5") is None
        assert rollouts.trainer_logprobs("r7")
    finally:
        rollouts.state.close()


# -- M2: non-finite numbers refused wherever a body is parsed ------------------------------------------------


@pytest.mark.parametrize("path", ["/v1/rollouts/m2/reward", "/v1/rollouts/m2/trainer-logprobs",
                                  "/v1/chat/completions", "/v1/responses", "/v1/messages",
                                  "/v1/messages/count_tokens", "/v1/score"])
@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e400", "-1e999"])
def test_m2_nan_and_infinity_are_refused_in_every_json_body(app, path, number):
    rollout_once(app, "m2")
    text = (f'{{"model": "{MODEL}", "reward": 1, "info": {{"x": [{number}]}}, "logprobs": [-1], '
            f'"messages": [{{"role": "user", "content": "Hi"}}], "input": "Hi", "max_tokens": 4, '
            f'"metadata": {{"score": {number}}}}}')
    status, body = raw(app, "POST", path, text)
    answer = strict(body)  # the refusal itself is JSON any reader takes
    assert status == 400, answer
    assert "NaN, Infinity" in json.dumps(answer), answer


def test_m2_info_beside_a_long_integer_and_a_lone_surrogate_reads_back_as_strict_json(app):
    """The writer fell back from orjson to json.dumps for a 70-bit integer or a lone surrogate, and
    wrote NaN beside them as NaN; the integer also came back a float, 1.18e21."""
    rollout(app, "m2-back")
    status, body = raw(app, "POST", "/v1/rollouts/m2-back/reward",
                       '{"reward": 1, "info": {"big": 1180591620717411303424, "s": "\\ud800", "n": NaN}}')
    assert status == 400, body
    status, body = raw(app, "POST", "/v1/rollouts/m2-back/reward",
                       '{"reward": 1, "info": {"big": 1180591620717411303424, "s": "a\\ud800b"}}')
    assert status == 200, body
    status, body = raw(app, "GET", "/v1/rollouts/m2-back/reward")
    assert strict(body)["info"] == {"big": 2 ** 70, "s": "a\ufffdb"}


# -- L1: a long integer among trainer logprobs -----------------------------------------------------------------


@pytest.mark.parametrize("value", ["-" + "9" * 400, "9" * 400])
def test_l1_a_400_digit_integer_in_trainer_logprobs_is_a_400(app, value):
    rollout_once(app, "l1")
    for text in (f'{{"logprobs": [{value}]}}', f'{{"steps": [{{"step": 1, "logprobs": [{value}]}}]}}'):
        status, body = raw(app, "POST", "/v1/rollouts/l1/trainer-logprobs", text)
        assert status == 400, body
        assert "logprobs" in strict(body)["error"]["param"]


# -- L4: a reward only for a rollout there is, and only for its steps -------------------------------------


def test_l4_a_reward_for_a_rollout_that_never_made_a_request_is_refused(app):
    status, error = app.call("POST", "/v1/rollouts/never-seen/reward", {"reward": 1.0})
    assert status == 404 and error["error"]["code"] == "rollout_not_found", error
    assert "--allow-unknown-rollout-rewards" in error["error"]["message"]
    assert app.call("GET", "/v1/rollouts/never-seen/reward")[0] == 404  # it took no slot
    assert "never-seen" not in [r["rollout"] for r in app.call("GET", "/v1/rollouts?limit=1000")[1]["data"]]


def test_l4_a_rollout_noted_before_its_spans_are_stored_takes_its_reward(app):
    """With --workers, the request's spans are written by the worker that served it, and the reward may
    reach another before they are: the rollout's row, noted when its request arrived, is enough."""
    app.app[TELEMETRY].rollouts.note("noted-only", "grp")  # as the serving worker did, its spans not written
    status, answer = app.call("POST", "/v1/rollouts/noted-only/reward", {"reward": 1.0, "steps": [
        {"step": 2, "reward": 0.5}]})
    assert status == 200 and answer["step_rewards"] == 1, answer


def test_l4_the_operator_may_allow_rewards_for_rollouts_never_seen(qwen3_5_dir, tmp_path):
    allowing = started(tmp_path, qwen3_5_dir, allow_unknown_rollout_rewards=True)
    try:
        status, answer = allowing.call("POST", "/v1/rollouts/judged-elsewhere/reward", {
            "reward": 1.0, "steps": [{"step": 7, "reward": 0.5}]})
        assert status == 200, answer
        assert allowing.call("GET", "/v1/rollouts/judged-elsewhere/reward")[1]["steps"][0]["step"] == 7
        # Still bounded: a step number no rollout reaches is refused, and so are more steps than a rollout
        # may hold, though each post names fewer (trace ids, which a rollout never seen cannot be checked on).
        status, error = allowing.call("POST", "/v1/rollouts/judged-elsewhere/reward", {
            "steps": [{"step": stored_rollouts.MAX_STEPS + 1, "reward": 0.5}]})
        assert status == 400 and error["error"]["param"] == "steps[0].step", error
        half = stored_rollouts.MAX_STEPS // 2 + 1
        for post in range(2):
            status, answer = allowing.call("POST", "/v1/rollouts/judged-elsewhere/reward", {"steps": [
                {"trace_id": f"{post * half + n:032x}", "reward": 0.0} for n in range(half)]})
            assert (status, answer.get("step_rewards")) == (200, half + 1) if post == 0 else status == 400, answer
        assert answer["error"]["param"] == "steps" and f"{stored_rollouts.MAX_STEPS:,}" in answer["error"]["message"]
    finally:
        allowing.stop()


def test_l4_steps_past_the_rollouts_end_and_a_300_digit_step_are_refused(app):
    traces = rollout(app, "l4-steps", steps=2)
    for step, param in (({"step": 3}, "steps[0].step"), ({"step": 10 ** 300}, "steps[0].step"),
                        ({"trace_id": "f" * 32}, "steps[0].trace_id")):
        status, error = app.call("POST", "/v1/rollouts/l4-steps/reward", {"steps": [{**step, "reward": 1.0}]})
        assert status == 400 and error["error"]["param"] == param, (step, error)
        assert "2 steps" in error["error"]["message"]
    status, answer = app.call("POST", "/v1/rollouts/l4-steps/reward", {"steps": [
        {"step": 2, "reward": 1.0}, {"trace_id": traces[0], "reward": 0.0}]})
    assert status == 200, answer


# -- L6: overflow told apart, ASCII digits, the weight version header -------------------------------------


def test_l6_an_overflowing_kl_is_told_apart_from_no_data(app):
    assert figures([], [])["kl_k3"] is None and figures([], [])["kl_k3_overflow"] is False
    for inference in ([-800.0], [-710.0] * 10):  # e^800, and e^710 (2.2e308): past a float's 1.8e308
        found = figures(inference, [0.0] * len(inference))
        assert found["kl_k3"] is None and found["kl_k3_overflow"] is True, found
        assert found["tokens"] == len(inference) and found["past_cap"] == 1.0
    # A mean a float holds is given, though the sum of its terms would not be (3 × e^709 = 2.5e308):
    # before, that too read as null.
    assert figures([-709.0] * 3, [0.0] * 3)["kl_k3"] == pytest.approx(math.expm1(709) - 709)
    assert figures([-1.0], [-1.0]) == {"tokens": 1, "kl_k3": 0.0, "kl_k3_overflow": False, "past_cap": 0.0,
                                       "mean_abs_log_ratio": 0.0}
    # Through the endpoint: the stored logprob of the replay's tokens is 0, the trainer's -800 at most, so
    # the ratio's overflow is one of e^-800 (no overflow); the figures above are the ones that overflow.
    traces = rollout(app, "l6-kl")
    tokens = app.stored(f"/v1/traces/{traces[0]}/tokens")["tokens"]
    status, gap = app.call("POST", "/v1/rollouts/l6-kl/trainer-logprobs", {"logprobs": [-800.0] * len(tokens)})
    assert status == 200 and gap["kl_k3_overflow"] is False and gap["kl_k3"] > 0, gap


@pytest.mark.parametrize("query", ["offset=\uff11", "limit=\uff11", "offset=\u0661", "limit=+5", "limit=1_0",
                                   "limit= 5", "offset=-0"])
def test_l6_integer_query_parameters_take_ascii_digits_only(app, query):
    traces = rollout_once(app, "l6-q", steps=2)
    name, value = query.split("=")
    query = f"{name}={urllib.parse.quote(value)}"
    status, error = app.call("GET", f"/v1/sessions/l6-q?{query}")
    assert status == 400 and error["error"]["param"] == name, (query, error)
    for path in ("/v1/sessions", "/v1/traces", "/v1/rollouts"):
        if name == "limit":
            status, error = app.call("GET", f"{path}?{query}")
            assert status == 400 and error["error"]["param"] == "limit", (path, query, error)
    assert [s["trace_id"] for s in app.call("GET", "/v1/sessions/l6-q?offset=1&limit=1")[1]["steps"]] == traces[1:2]


@pytest.mark.parametrize("cap", ["\uff12", "2_0", " 2", "1e1"])
def test_l6_number_query_parameters_take_ascii_digits_only(app, cap):
    rollout_once(app, "l6-cap")
    status, error = app.call("GET", f"/v1/rollouts/l6-cap/gap?cap={urllib.parse.quote(cap)}")
    assert status == 400 and error["error"]["param"] == "cap", error
    since = urllib.parse.quote("\uff11\uff17\uff10\uff10\uff10\uff10\uff10\uff10\uff10\uff10")  # 1700000000
    status, error = app.call("GET", f"/v1/sessions?since={since}")
    assert status == 400 and error["error"]["param"] == "since", error


@pytest.mark.parametrize("version", ["", "x" * 257, "step\u202e1", "a\tb"])
def test_l6_an_invalid_x_weight_version_is_refused(app, version):
    app.replay(ANSWER)
    status, error = app.call("POST", "/v1/chat/completions", {"model": MODEL, "messages": [
        {"role": "user", "content": "Hi"}]}, {"X-Weight-Version": version.encode("utf-8").decode("latin-1")})
    assert status == 400 and error["error"]["param"] == "weight_version", error
    status, answer = app.call("POST", "/v1/chat/completions", {"model": MODEL, "messages": [
        {"role": "user", "content": "Hi"}]}, {"X-Weight-Version": "step-40"})
    assert status == 200, answer


def test_a_trace_id_of_digits_only_names_its_own_step_not_a_place(tmp_path):
    """Found re-probing: one trace id in (10/16)^32 is all digits, and was read as a step's place
    ("0…01": step 1), for trainer logprobs, rewards and the reward read back alike."""
    from looptrace.proxy.api.protocol import parse
    from looptrace.proxy.api.rollouts.gap import _per_step
    from looptrace.proxy.api.rollouts.protocol import StepReward, TrainerLogprobs
    from looptrace.proxy.api.rollouts.rewards import _step

    digits = "0" * 31 + "1"
    steps = [{"trace_id": "a" * 32, "output_tokens": 2}, {"trace_id": digits, "output_tokens": 1}]
    posted = parse(TrainerLogprobs, {"steps": [{"trace_id": digits, "logprobs": [-1.0]}]})
    assert _per_step(posted, steps) == {digits: [-1.0]}
    order = [s["trace_id"] for s in steps]
    assert _step(parse(StepReward, {"trace_id": digits, "reward": 1.0}), "steps[0]", order)[0] == digits
    assert _step(parse(StepReward, {"step": 2, "reward": 1.0}), "steps[0]", order)[0] == "2"
    rollouts = stored_rollouts.Rollouts(open_state(str(tmp_path / "traces.sqlite3")))
    try:
        rollouts.set_reward("digits", None, None, [(digits, 1.0, None), ("2", 0.5, None)])
        assert [{k: v for k, v in s.items() if k != "info"} for s in rollouts.get("digits")["steps"]] == [
            {"trace_id": digits, "reward": 1.0}, {"step": 2, "reward": 0.5}]
    finally:
        rollouts.state.close()
