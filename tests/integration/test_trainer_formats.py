"""`looptrace export`'s trainer formats load into each framework's own types (issue 36): a rollout of
three turns (a tool call, its result, an answer, a new user message) through /r/{id}/v1 with keep, a
reward posted, exported one row per rollout and per step.

verl 0.9.1's `AgentLoopOutput` and skyrl 0.3.0's `TrajectoryOutput` are the classes of the pinned wheels
(rl_types.py); tinker 0.38.0's `Datum` is the installed SDK's, in an environment of its own (the test
cache), when it installs; NeMo Gym (no wheel for this Python) and prime-rl (not on PyPI) are checked
against their source at a pinned commit, named below and in docs/rollouts.md."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from looptrace.proxy.api.keys import TELEMETRY
from looptrace.proxy.export.command import write_prime_rl
from looptrace.proxy.export.rollouts import rollout_rows
from looptrace.proxy.settings import Settings
from looptrace.trace_store.recorded_sessions import session_steps

from app_thread import AppThread
from build_cache import cached
from rl_types import framework_classes

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1] / "unit"))
from test_rollouts import agent  # noqa: E402  the same scripted rollout as the unit tests

# NeMo Gym's TokenIDLogProbMixin (nemo_gym/openai_utils.py at 009d2fec8e644065a260dfb83e58481c94af3562).
NEMO_GYM = {"prompt_token_ids": int, "generation_token_ids": int, "generation_log_probs": float}
# prime-rl's Parquet (src/zeroband/utils/parquet.py's pa_schema, with logprobs, at f77e0fe), and our loss_mask.
PRIME_RL = ["input_tokens", "output_tokens", "input_logprobs", "output_logprobs", "advantages", "rewards",
            "task_rewards", "length_penalties", "proofs", "step", "target_lengths", "loss_mask"]
TINKER = "tinker==0.38.0"


@pytest.fixture(scope="module")
def rollout(qwen3_5_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("formats")
    (folder / "none.jsonl").write_text('{"text": "unused"}\n')
    app = AppThread(Settings(model=str(qwen3_5_dir), backend="replay", replay=str(folder / "none.jsonl"),
                             served_model_name="tiny", trace_db=str(folder / "traces.sqlite3"))).start()
    try:
        backend, answers = agent(app, "formats-1", "keep", headers={"X-Rollout-Group": "task-1"})
        app.call("POST", "/v1/rollouts/formats-1/reward", {"reward": 0.75})
        app.stored("/v1/sessions/formats-1", steps=3)
        steps = session_steps(app.app[TELEMETRY].store, "formats-1")
        yield app.runtime.settings.trace_db, steps, backend.read, [a["choices"][0]["token_ids"] for a in answers]
    finally:
        app.stop()


def rows(rollout, fmt: str, per: str = "rollout") -> list[dict]:
    store, steps, _, _ = rollout
    return rollout_rows([("formats-1", steps)], fmt, per, store)


def framework_fields(row: dict) -> dict:
    return {k: v for k, v in row.items() if k != "looptrace"}


def test_verl_rows_are_agent_loop_outputs(rollout):
    AgentLoopOutput = framework_classes("verl")["AgentLoopOutput"]
    _, _, read, sampled = rollout
    (row,) = rows(rollout, "verl")
    output = AgentLoopOutput(**framework_fields(row))
    assert output.prompt_ids == read[0] and output.reward_score == 0.75 and output.num_turns == 6
    assert [i for i, m in zip(output.response_ids, output.response_mask) if m] == sum(sampled, [])
    assert len(output.response_logprobs) == len(output.response_ids)
    assert all(AgentLoopOutput(**framework_fields(r)) for r in rows(rollout, "verl", "step"))


def test_skyrl_rows_are_trajectory_outputs(rollout):
    TrajectoryOutput = framework_classes("skyrl")["TrajectoryOutput"]
    (row,) = rows(rollout, "skyrl")
    output = TrajectoryOutput(**framework_fields(row))
    assert output.reward == 0.75 and output.stop_reason == "stop"
    assert len(output.loss_mask) == len(output.response_ids) == len(output.rollout_logprobs)
    hints = {k: v for k, v in TrajectoryOutput.__annotations__.items() if k in row}
    assert set(hints) == set(framework_fields(row))


def test_nemo_gym_rows_hold_its_token_entries(rollout):
    _, _, read, sampled = rollout
    (row,) = rows(rollout, "nemo-gym")
    assert row["reward"] == 0.75
    for entry, prompt, ids in zip(row["output"], read, sampled):
        assert set(entry) == set(NEMO_GYM)
        assert all(all(isinstance(v, kind) for v in entry[k]) for k, kind in NEMO_GYM.items())
        assert entry["prompt_token_ids"] == prompt and entry["generation_token_ids"] == ids


def test_prime_rl_rows_are_its_parquet_columns(rollout, tmp_path):
    import pyarrow.parquet as pq

    path = tmp_path / "rollouts.parquet"
    write_prime_rl(rows(rollout, "prime-rl"), str(path))
    table = pq.read_table(path)
    assert table.column_names == PRIME_RL + ["looptrace"]
    row = table.to_pylist()[0]
    assert row["rewards"] == 0.75 and row["advantages"] == 0.0  # the only rollout of its group
    assert len(row["loss_mask"]) == len(row["output_tokens"]) == len(row["output_logprobs"])


def _tinker_python():
    def build(out):
        subprocess.run([sys.executable, "-m", "venv", str(out / "venv")], check=True)
        done = subprocess.run([str(out / "venv" / "bin" / "pip"), "install", "-q", TINKER], capture_output=True,
                              text=True)
        if done.returncode != 0:
            raise RuntimeError(done.stderr[-2000:])
    return cached("tinker-venv", {"requirement": TINKER}, build) / "venv" / "bin" / "python"


CHECK_TINKER = """
import json, sys
import tinker
from tinker import types
for line in open(sys.argv[1]):
    row = json.loads(line)
    tokens = row["model_input"]["chunks"][0]["tokens"]
    datum = types.Datum(model_input=types.ModelInput.from_ints(tokens),
                        loss_fn_inputs={k: types.TensorData(**v) for k, v in row["loss_fn_inputs"].items()})
    assert datum.model_input.length == len(tokens)
    print(json.dumps({k: v.tolist() for k, v in ((k, t.to_numpy()) for k, t in datum.loss_fn_inputs.items())}))
"""


def test_tinker_rows_are_datums(rollout, tmp_path):
    (row,) = rows(rollout, "tinker")
    python = _tinker_python()  # an install that fails fails the test: it would hide a broken pin
    path = tmp_path / "tinker.jsonl"
    path.write_text(json.dumps(row) + "\n")
    done = subprocess.run([str(python), "-c", CHECK_TINKER, str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    loaded = json.loads(done.stdout.splitlines()[-1])
    assert loaded["target_tokens"] == row["loss_fn_inputs"]["target_tokens"]["data"]
    assert sum(loaded["mask"]) == sum(len(s) for s in rollout[3])


def test_atif_trajectory_of_a_rollout_holds_its_steps_ids_and_reward(rollout):
    import atif

    from looptrace.proxy.export.atif import trajectories
    from looptrace.trace_store.recorded_sessions import open_reader

    store, steps, _, _ = rollout
    (document,) = trajectories(open_reader(store), ["formats-1"], store)
    atif.Trajectory.model_validate(document)
    assert document["extra"]["rollout"]["reward"] == 0.75 and document["extra"]["rollout"]["group"] == "task-1"
    agent = [s for s in document["steps"] if s["source"] == "agent"]
    assert [s["extra"]["trace_id"] for s in agent] == [s.trace_id for s in steps]
    for step, recorded in zip(agent, steps):
        # Equal, not close: the export copies the stored numbers, no arithmetic on any CPU.
        assert step["metrics"]["prompt_token_ids"] == recorded.prompt_ids
        assert step["metrics"]["completion_token_ids"] == [t["id"] for t in recorded.tokens]
        assert step["metrics"]["logprobs"] == [t["logprob"] for t in recorded.tokens]
    # The tool's result is the first answer's observation; the rollout's user turn a step of its own.
    assert agent[0]["observation"]["results"][0]["content"] == "hello"
    assert [s["source"] for s in document["steps"]] == ["system", "user", "agent", "agent", "user", "agent"]
