"""Trainer formats for `looptrace export --format`: each row is the framework's own object, field for
field, and a `looptrace` key beside them (the rollout, its steps' traces, the reward, the template's
and tokenizer's digests, each step's weight version). Checked against each framework's own types
(tests/integration/test_trainer_formats.py; docs/rollouts.md says which version of which).

    verl       AgentLoopOutput: prompt_ids, response_ids, response_mask (1: the model's token),
               response_logprobs, reward_score, num_turns, metrics, extra_fields
    skyrl      TrajectoryOutput: prompt_ids, response_ids, loss_mask, rollout_logprobs, reward,
               stop_reason, env_metrics
    prime-rl   the zeroband Parquet columns: input_tokens, output_tokens, input_logprobs,
               output_logprobs, advantages, rewards, task_rewards, length_penalties, proofs, step,
               target_lengths, and loss_mask over output_tokens
    nemo-gym   per step a TokenIDLogProbMixin (prompt_token_ids, generation_token_ids,
               generation_log_probs); per rollout the steps' list of them, as NeMo Gym attaches
               one to each model call's output
    tinker     Datum: model_input (the sequence but its last token), loss_fn_inputs target_tokens,
               logprobs, advantages, mask (each aligned to the targets)

A row per rollout holds one stitched trajectory (trajectory.py); a rollout that forked holds several,
`looptrace.segment` counting them. A row per step is that step alone. Rewards: the rollout's (POST
/v1/rollouts/{id}/reward), else the sum of its steps' in the trajectory; an advantage (tinker,
prime-rl) is the reward less the mean of its group's exported rewards.
"""

from __future__ import annotations

from collections.abc import Callable

from .trajectory import Trajectory

TRAINERS = ("verl", "skyrl", "prime-rl", "nemo-gym", "tinker")


def verl(t: Trajectory, reward: float | None, advantage: float | None, meta: dict) -> dict:
    return {"prompt_ids": t.prompt_ids, "response_ids": t.response_ids, "response_mask": t.response_mask,
            "response_logprobs": t.response_logprobs, "reward_score": reward, "num_turns": _turns(t),
            "metrics": {}, "extra_fields": {"looptrace": meta}, "looptrace": meta}


def skyrl(t: Trajectory, reward: float | None, advantage: float | None, meta: dict) -> dict:
    return {"prompt_ids": t.prompt_ids, "response_ids": t.response_ids, "loss_mask": t.response_mask,
            "rollout_logprobs": t.response_logprobs, "reward": reward if reward is not None else 0.0,
            "stop_reason": t.steps[-1].finish_reason or "stop", "env_metrics": {}, "looptrace": meta}


def prime_rl(t: Trajectory, reward: float | None, advantage: float | None, meta: dict) -> dict:
    return {"input_tokens": t.prompt_ids, "output_tokens": t.response_ids,
            "input_logprobs": [0.0] * len(t.prompt_ids), "output_logprobs": t.response_logprobs,
            "advantages": advantage, "rewards": reward, "task_rewards": reward, "length_penalties": 0.0,
            "proofs": b"", "step": meta["steps"][0]["step"], "target_lengths": len(t.response_ids),
            "loss_mask": t.response_mask, "looptrace": meta}


def nemo_gym(t: Trajectory, reward: float | None, advantage: float | None, meta: dict) -> dict:
    return {"reward": reward, "output": [token_entry(step) for step in t.steps], "looptrace": meta}


def token_entry(step) -> dict:
    return {"prompt_token_ids": step.prompt_ids, "generation_token_ids": [t["id"] for t in step.tokens],
            "generation_log_probs": [float(t.get("logprob") or 0.0) for t in step.tokens]}


def tinker(t: Trajectory, reward: float | None, advantage: float | None, meta: dict) -> dict:
    sequence = t.held
    zeros = [0.0] * (len(t.prompt_ids) - 1)  # the targets start at the prompt's second token
    mask = zeros + [float(m) for m in t.response_mask]
    value = advantage if advantage is not None else (reward if reward is not None else 0.0)
    return {"model_input": {"chunks": [{"type": "encoded_text", "tokens": sequence[:-1]}]},
            "loss_fn_inputs": {
                "target_tokens": _tensor(sequence[1:], "int64"),
                "logprobs": _tensor(zeros + t.response_logprobs, "float32"),
                "advantages": _tensor([value * m for m in mask], "float32"),
                "mask": _tensor(mask, "float32")},
            "looptrace": meta}


def _tensor(data: list, dtype: str) -> dict:
    return {"data": data, "dtype": dtype, "shape": [len(data)]}


def _turns(t: Trajectory) -> int:
    """verl's count: the chat's turns, user, assistant and tool: each step read one or more messages
    and wrote one."""
    return 2 * len(t.steps)


ROWS: dict[str, Callable[..., dict]] = {"verl": verl, "skyrl": skyrl, "prime-rl": prime_rl, "nemo-gym": nemo_gym,
                                        "tinker": tinker}
