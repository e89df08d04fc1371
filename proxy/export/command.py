"""`looptrace export`: recorded steps as training and evaluation data, token-exact (never re-tokenized).

    looptrace export --store PATH_OR_URL (--session KEY | --since TIME) [--tenant T] [--format jsonl|parquet]
                     [--out FILE]

(`--format atif`: a trajectory per session, atif.py; a trainer's format: rollouts.py. `--tenant T`: only
that tenant's sessions and steps, tenant.py; without it, every tenant's: the operator holds the store.)

One record per step (JSON Lines to standard output by default; Parquet through pyarrow,
`pip install 'looptrace[export]'`):

    session, step, trace_id, model, prompt_ids, completion_ids, completion_logprobs,
    mask          over prompt_ids + completion_ids: 1 where the model wrote the token, 0 where the
                  template, the user or a tool did
    tool_calls    the calls the model made: name, arguments (JSON text), outcome
    finish_reason

The mask of a prompt marks the model's own earlier answers where the prompt holds them token for
token: the conversation so far (the step before's prompt and answer, with its mask) is carried over
as long as the new prompt starts with it. What a template rewrote (an earlier turn's reasoning
dropped, an answer re-rendered as other tokens) is not what the model wrote, token for token, and is
masked 0 from where it differs. A forced opening (tool_choice) sits at the prompt's end, masked 0.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Iterator
from datetime import datetime, timezone

from looptrace.common import attributes as attr
from looptrace.common.jsonio import dumps_line
from looptrace.common.sequences import common_prefix
from looptrace.trace_store.recorded_sessions import Recorded, ReplayError, open_reader, session_steps

from .atif import trajectories
from .formats import TRAINERS
from .output import out_refusal, writing
from .rollouts import rollout_rows
from .tenant import TenantView

FIELDS = ("session", "step", "trace_id", "model", "prompt_ids", "completion_ids", "completion_logprobs", "mask",
          "tool_calls", "finish_reason")


def run(args: argparse.Namespace) -> int:
    if args.format in ("parquet", "prime-rl") and not args.out:
        print(f"looptrace export: --format {args.format} writes Parquet, a file: give --out FILE", file=sys.stderr)
        return 2
    refused = out_refusal(args.out)
    if refused:
        print(f"looptrace export: {refused}", file=sys.stderr)
        return 2
    trainer = args.format in TRAINERS
    if args.per is not None and not trainer:
        print("looptrace export: --per is for a trainer's format (verl, skyrl, prime-rl, nemo-gym, tinker)",
              file=sys.stderr)
        return 2
    try:
        if args.format == "atif":
            store = reader(args)
            count = write(list(trajectories(store, _keys(store, args), args.store)), "jsonl", args.out)
            print(f"looptrace export: {count} trajectories", file=sys.stderr)
            return 0
        if trainer:
            store = reader(args)
            sessions = [(key, session_steps(store, key)) for key in _keys(store, args)]
            records = rollout_rows(sessions, args.format, args.per or "rollout", args.store)
            count = write_prime_rl(records, args.out) if args.format == "prime-rl" else write(records, "jsonl", args.out)
        else:
            records = list(exported(args))
            count = write(records, args.format, args.out)
    except ReplayError as exc:
        print(f"looptrace export: {exc}", file=sys.stderr)
        return 2
    print(f"looptrace export: {count} {'rows' if trainer else 'steps'}", file=sys.stderr)
    return 0


def reader(args: argparse.Namespace):
    """The store's read side: tenant T's records alone with --tenant T, else everyone's."""
    store, tenant = open_reader(args.store), getattr(args, "tenant", None)  # a caller's Namespace may lack it
    return store if tenant is None else TenantView(store, tenant)


def _keys(store, args: argparse.Namespace) -> list[str]:
    return [args.session] if args.session is not None else _sessions_since(store, args.since)


def exported(args: argparse.Namespace) -> Iterator[dict]:
    store = reader(args)
    for key in _keys(store, args):
        yield from session_records(key, session_steps(store, key))


def _sessions_since(store, since: str) -> list[str]:
    """The keys of every session active since `since`, the one first active earliest first."""
    since_ns = _nanoseconds(since)
    keys, before = [], None
    while True:
        page = store.list_sessions(since_ns=since_ns, before=before, limit=500)
        keys += [(s["first_ns"], s["key"]) for s in page["data"]]
        if not page["next"]:
            return [key for _, key in sorted(keys)]
        stamp, _, key = page["next"].partition(":")
        before = (int(stamp), key)


def _nanoseconds(value: str) -> int:
    """Unix seconds or an ISO 8601 time (a zone, else UTC)."""
    try:
        seconds = float(value)
    except ValueError:
        try:
            moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise ReplayError(f"--since {value!r}: not Unix seconds or an ISO 8601 time") from None
        seconds = (moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)).timestamp()
    if not (math.isfinite(seconds) and 0 <= seconds < 9.2e9):
        raise ReplayError(f"--since {value!r}: not a time between 1970 and 2262")
    return int(seconds * 1e9)


def session_records(key: str, steps: list[Recorded]) -> Iterator[dict]:
    """Each step of one session, its mask carried along the conversation."""
    held: list[int] = []  # the conversation as the model last saw it: prompt + answer
    held_mask: list[int] = []
    for recorded in steps:
        if recorded.skipped:
            continue
        prompt = recorded.prompt_ids
        completion = [t["id"] for t in recorded.tokens]
        kept = common_prefix(held, prompt)
        forced_at = len(prompt) - recorded.forced
        prompt_mask = held_mask[:kept] + [0] * (len(prompt) - kept)
        prompt_mask[forced_at:] = [0] * recorded.forced  # a forced opening is the server's, not the model's
        # A redacted step's stored ids are not what the model read (common/redaction.py): masked 0 throughout.
        mask = [0] * (len(prompt) + len(completion)) if recorded.request.get(attr.REDACTED) else \
            prompt_mask + [1] * len(completion)
        yield {"session": key, "step": recorded.step, "trace_id": recorded.trace_id, "model": recorded.model,
               "prompt_ids": prompt, "completion_ids": completion,
               "completion_logprobs": [t.get("logprob") for t in recorded.tokens], "mask": mask,
               "tool_calls": [{k: c[k] for k in ("name", "arguments", "outcome") if k in c} for c in recorded.calls],
               "finish_reason": recorded.finish_reason}
        held, held_mask = prompt + completion, mask


def write(records: list[dict], fmt: str, out: str | None) -> int:
    with writing(out):
        if fmt == "parquet":
            _parquet(records, out)
            return len(records)
        stream = open(out, "w", encoding="utf-8") if out else sys.stdout
        try:
            for record in records:
                stream.write(dumps_line(record) + "\n")  # strict JSON, whatever reached the store
            stream.flush()
        finally:
            if out:
                stream.close()
    return len(records)


def _parquet(records: list[dict], out: str) -> None:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise ReplayError("--format parquet needs pyarrow: pip install 'looptrace[export]'") from exc
    call = pa.struct([("name", pa.string()), ("arguments", pa.string()), ("outcome", pa.string())])
    schema = pa.schema([
        ("session", pa.string()), ("step", pa.int32()), ("trace_id", pa.string()), ("model", pa.string()),
        ("prompt_ids", pa.list_(pa.int32())), ("completion_ids", pa.list_(pa.int32())),
        ("completion_logprobs", pa.list_(pa.float64())), ("mask", pa.list_(pa.int8())),
        ("tool_calls", pa.list_(call)), ("finish_reason", pa.string()),
    ])
    table = pa.Table.from_pylist(records, schema=schema)
    pq.write_table(table, out)


def write_prime_rl(records: list[dict], out: str) -> int:
    """prime-rl's rows as its Parquet columns (formats.py), the looptrace record as JSON text."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise ReplayError("--format prime-rl needs pyarrow: pip install 'looptrace[export]'") from exc
    schema = pa.schema([
        ("input_tokens", pa.list_(pa.int32())), ("output_tokens", pa.list_(pa.int32())),
        ("input_logprobs", pa.list_(pa.float32())), ("output_logprobs", pa.list_(pa.float32())),
        ("advantages", pa.float32()), ("rewards", pa.float32()), ("task_rewards", pa.float32()),
        ("length_penalties", pa.float32()), ("proofs", pa.binary()), ("step", pa.int32()),
        ("target_lengths", pa.int32()), ("loss_mask", pa.list_(pa.int8())), ("looptrace", pa.string()),
    ])
    rows = [{**r, "looptrace": dumps_line(r["looptrace"])} for r in records]
    with writing(out):
        pq.write_table(pa.Table.from_pylist(rows, schema=schema), out)
    return len(rows)
