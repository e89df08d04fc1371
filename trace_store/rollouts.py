"""Rollouts for agent RL, beside the conversations' state (state.py): each rollout's group, its reward
(for the rollout, or per step, with free `info`), and the trainer's logprob of each token the model
wrote, per step. A rollout is a session (its key is the rollout id: /r/{id}/v1, X-Rollout-Id).

    rollouts           key, grp, reward, info (JSON), weight_version, updated_ns, size (bytes it holds)
    rollout_rewards    key, step ("3": the third step, or a trace id), reward, info, noted_ns
    trainer_logprobs   trace_id, key, logprobs (float64, packed), weight_version, noted_ns

In the state's own file beside the traces (SQLite: sqlite/state.py) or the store's database
(PostgreSQL: postgres/schema.py): a reward is written while the trace writer holds the traces file,
and must not wait behind it.

Bounded, since anyone who reaches the port may post (issue 41, M1): an `info` is at most
MAX_INFO_BYTES and a rollout's infos together MAX_ROLLOUT_INFO_BYTES (checked by the API before it
writes: proxy/api/rollouts/), and its rewards name at most MAX_STEPS steps; the newest MAX_ROLLOUTS
rollouts are kept, and of those the newest that hold MAX_ROLLOUTS_BYTES together (infos, step
rewards' rows and trainer logprobs), trimmed every PRUNE_EVERY writes; what belongs to those dropped goes with them.
`info` is stored as ASCII JSON, so the databases' length() is its size in bytes.
"""

from __future__ import annotations

import json
import time
from array import array

from .state import PRUNE, StateStore

MAX_ROLLOUTS = 65536
MAX_ROLLOUTS_BYTES = 512 * 1024**2  # what the kept rollouts hold together: infos and trainer logprobs
MAX_INFO_BYTES = 65536  # one `info`, as JSON
MAX_ROLLOUT_INFO_BYTES = 1024**2  # a rollout's `info` and its steps' together: 16 infos at their largest
MAX_STEPS = 10_000  # steps a rollout's rewards name; and the highest step by place of one the store does not hold
PRUNE_EVERY = 256  # rollouts are trimmed to their bounds every this many writes

NOTE = """
INSERT INTO rollouts AS r (key, grp, updated_ns) VALUES (?, ?, ?)
ON CONFLICT (key) DO UPDATE SET grp = coalesce(excluded.grp, r.grp), updated_ns = excluded.updated_ns"""
SET_REWARD = """
INSERT INTO rollouts AS r (key, reward, info, updated_ns) VALUES (?, ?, ?, ?)
ON CONFLICT (key) DO UPDATE SET reward = excluded.reward, info = excluded.info, updated_ns = excluded.updated_ns"""
SET_STEP_REWARD = """
INSERT INTO rollout_rewards AS r VALUES (?, ?, ?, ?, ?)
ON CONFLICT (key, step) DO UPDATE SET reward = excluded.reward, info = excluded.info, noted_ns = excluded.noted_ns"""
SET_LOGPROBS = """
INSERT INTO trainer_logprobs AS t VALUES (?, ?, ?, ?, ?)
ON CONFLICT (trace_id) DO UPDATE SET key = excluded.key, logprobs = excluded.logprobs,
                                     weight_version = excluded.weight_version, noted_ns = excluded.noted_ns"""
# What belongs to no kept rollout any more.
ORPHANS = "DELETE FROM {table} WHERE key NOT IN (SELECT key FROM rollouts)"
ROW_BYTES = 64  # a step reward's row besides its info (its key, step, reward, time and index entry), about
# A rollout's size once written (its rows' infos are ASCII JSON: length() counts their bytes).
SIZE = f"""
UPDATE rollouts SET size = coalesce(length(info), 0)
    + (SELECT coalesce(sum(coalesce(length(info), 0) + {ROW_BYTES}), 0) FROM rollout_rewards WHERE key = ?)
    + (SELECT coalesce(sum(length(logprobs)), 0) FROM trainer_logprobs WHERE key = ?)
WHERE key = ?"""
# Rollouts past the newest that fit in `?` bytes together.
PRUNE_BYTES = """
DELETE FROM rollouts WHERE key IN (SELECT key FROM (
    SELECT key, sum(coalesce(size, 0)) OVER (ORDER BY updated_ns DESC, key DESC) AS total FROM rollouts) t
    WHERE total > ?)"""


def info_json(info: dict | None) -> str | None:
    """An `info` as stored: compact ASCII JSON (a lone surrogate escaped, an integer of any size exact,
    NaN refused: the API refuses it first)."""
    return None if info is None else json.dumps(info, separators=(",", ":"), allow_nan=False)


def pack_floats(values: list[float]) -> bytes:
    return array("d", values).tobytes()


def unpack_floats(data: bytes) -> list[float]:
    return array("d", bytes(data)).tolist()


class Rollouts:
    """The rollouts' rows, read and written through the state store's connections (one round trip, one
    transaction each)."""

    def __init__(self, state: StateStore) -> None:
        self.state = state
        self.where = state.where
        self._writes = 0

    def _write(self, key: str, statements: list[tuple[str, tuple]]) -> None:
        self._writes += 1
        statements = statements + [(SIZE, (key, key, key))]
        if self._writes % PRUNE_EVERY == 1 % PRUNE_EVERY:
            statements += [
                (PRUNE.format(table="rollouts", key="key", time="updated_ns", all=self.state.ALL), (MAX_ROLLOUTS,)),
                (PRUNE_BYTES, (MAX_ROLLOUTS_BYTES,)),
                (ORPHANS.format(table="rollout_rewards"), ()), (ORPHANS.format(table="trainer_logprobs"), ())]
        self.state._write(statements)

    def note(self, key: str, group: str | None) -> None:
        """A rollout's request arrived (and its group, if it named one)."""
        self._write(key, [(NOTE, (key, group, time.time_ns()))])

    def set_reward(self, key: str, reward: float | None, info: dict | None,
                   steps: list[tuple[str, float, dict | None]] = ()) -> None:
        """The rollout's reward (None: left as it was) and each step's (step: "3", or a trace id)."""
        now = time.time_ns()
        statements = [(NOTE, (key, None, now))]
        if reward is not None:
            statements.append((SET_REWARD, (key, reward, info_json(info), now)))
        for step, value, step_info in steps:
            statements.append((SET_STEP_REWARD, (key, step, value, info_json(step_info or None), now)))
        self._write(key, statements)

    def set_trainer_logprobs(self, key: str, steps: dict[str, list[float]], weight_version: str | None) -> None:
        """The trainer's logprobs of each step's tokens, by the step's trace id."""
        now = time.time_ns()
        self._write(key, [(NOTE, (key, None, now))] + [
            (SET_LOGPROBS, (trace_id, key, pack_floats(values), weight_version, now)) for trace_id, values in steps.items()])

    def get(self, key: str) -> dict | None:
        """A rollout: its group, reward and info, and its steps' rewards (by step, as given); None when
        nothing was noted of it."""
        head, steps = self.state._read([
            ("SELECT grp, reward, info, updated_ns FROM rollouts WHERE key = ?", (key,)),
            ("SELECT step, reward, info FROM rollout_rewards WHERE key = ? ORDER BY noted_ns", (key,))])
        if not head:
            return None
        group, reward, info, updated = head[0]
        return {"rollout": key, "group": group, "reward": reward, "info": json.loads(info) if info else None,
                "updated_ns": updated,
                "steps": [{**({"step": int(s)} if len(s) != 32 else {"trace_id": s}), "reward": r,
                           "info": json.loads(i) if i else None} for s, r, i in steps]}

    def held(self, key: str) -> tuple[float | None, int, dict[str, int]] | None:
        """What a rollout holds now, for a post's bounds: its reward, its info's bytes and each step's
        info's bytes (by step, as given); None when nothing was noted of it."""
        head, steps = self.state._read([
            ("SELECT reward, coalesce(length(info), 0) FROM rollouts WHERE key = ?", (key,)),
            ("SELECT step, coalesce(length(info), 0) FROM rollout_rewards WHERE key = ?", (key,))])
        if not head:
            return None
        return head[0][0], head[0][1], dict(steps)

    def trainer_logprobs(self, key: str) -> dict[str, tuple[list[float], str | None]]:
        """The trainer's logprobs of a rollout's steps: trace id → (logprobs, weight version)."""
        (rows,) = self.state._read([("SELECT trace_id, logprobs, weight_version FROM trainer_logprobs WHERE key = ?",
                                     (key,))])
        return {trace_id: (unpack_floats(data), version) for trace_id, data, version in rows}

    def in_group(self, group: str | None, limit: int = 100, tenant: str | None = None) -> list[dict]:
        """Rollouts, newest first: those of `group`, or all; with `tenant`, its own alone (a tenant's
        rollout is kept as "tenant/id": proxy/api/auth.py's `within`; a tenant's name holds no "/")."""
        where, args = (["grp = ?"], [group]) if group is not None else ([], [])
        if tenant is not None:  # substr, not LIKE: a rollout id's own % and _ match only themselves
            prefix = f"{tenant}/"
            where, args = where + ["substr(key, 1, ?) = ?"], args + [len(prefix), prefix]
        clause = f"WHERE {' AND '.join(where)} " if where else ""
        (rows,) = self.state._read([(f"SELECT key, grp, reward, updated_ns FROM rollouts {clause}"
                                     "ORDER BY updated_ns DESC LIMIT ?", (*args, limit))])
        return [{"rollout": k, "group": g, "reward": r, "updated_ns": u} for k, g, r, u in rows]
