"""`looptrace replay`: a recorded session run again against another server, step by step, its
agreement reported for CI and the replay stored as a session beside the original.

    looptrace replay --store PATH_OR_URL --session KEY --target URL [--mode forced|step]
                     --report report.json [--junit report.xml] [--min-agreement X]

Exit status: 0 when the agreement reaches --min-agreement (or none is given), 1 below it, 2 when the
replay could not run (no such session, a target that does not answer, a vocabulary that differs).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import sys
import time
from datetime import datetime, timezone
from urllib.parse import quote

from looptrace.common import attributes as attr
from looptrace.common.jsonio import dumps
from looptrace.trace_store.recorded_sessions import Recorded, ReplayError, open_reader, open_writer, session_steps

from ..observe.genai import output_message
from . import figures as compare
from .arguments import EXTRA_TOKENS
from .report import write_json, write_junit
from .target import Target, connect
from .write import Recorder, forced_tokens, session_key


def run(args: argparse.Namespace) -> int:
    if args.min_agreement is not None and not 0 <= args.min_agreement <= 1:
        print("looptrace replay: --min-agreement must be between 0 and 1", file=sys.stderr)
        return 2
    if not 0 < args.timeout < float("inf"):
        print("looptrace replay: --timeout must be a number of seconds above 0", file=sys.stderr)
        return 2
    try:
        report = replay(args)
    except ReplayError as exc:
        print(f"looptrace replay: {exc}", file=sys.stderr)
        return 2
    write_json(report, args.report)
    if args.junit:
        write_junit(report, args.junit)
    print(summary(report), file=sys.stderr)
    return 0 if report["passed"] else 1


def replay(args: argparse.Namespace) -> dict:
    started = time.time()
    steps = session_steps(open_reader(args.store), args.session)
    target = connect(args.target, api_key=args.api_key, timeout=args.timeout)
    key = session_key(args.session, args.mode)
    recorder = Recorder(open_writer(args.store), key, original=args.session, mode=args.mode, target=target.shown,
                        model=target.model, backend=target.backend, version=_version())
    results = []
    try:
        for recorded in steps:
            if recorded.skipped:
                results.append({"step": recorded.step, "trace_id": recorded.trace_id, "skipped": recorded.skipped})
                continue
            results.append(_replayed(args, target, recorder, recorded))
    finally:
        lost = recorder.close()
    figures = compare.session(args.mode, results)
    agreement = figures["agreement"]
    passed = args.min_agreement is None or (agreement is not None and agreement >= args.min_agreement)
    return {
        "session": args.session, "replay_session": key, "mode": args.mode, "target": target.shown,
        "target_kind": target.kind, "model": target.model, "backend": target.backend,
        "recorded_models": sorted({s.model for s in steps if s.model}),
        "started": datetime.fromtimestamp(started, timezone.utc).isoformat(timespec="seconds"),
        "seconds": round(time.time() - started, 3), **figures, "min_agreement": args.min_agreement,
        "passed": passed, "spans_lost": lost, "steps": results,
        "compare_path": f"/compare/{quote(args.session, safe='')}/{quote(key, safe='')}",
    }


def _replayed(args: argparse.Namespace, target: Target, recorder: Recorder, recorded: Recorded) -> dict:
    began, began_ns = time.perf_counter(), time.time_ns()
    if args.mode == "forced":
        scores = target.score(recorded.prompt_ids, [t["id"] for t in recorded.tokens])
        _same_vocabulary(target, recorded, scores)
        result = compare.forced(recorded, scores)
        tokens, calls = forced_tokens(recorded, scores), recorded.calls
        finish, output = recorded.finish_reason, recorded.request.get(attr.GEN_AI_OUTPUT_MESSAGES)
    else:
        generated = target.generate(_generate_body(args, recorded))
        result = compare.step(recorded, generated)
        tokens, calls, finish = generated["tokens"], generated["tool_calls"], generated["finish_reason"]
        output = dumps([output_message(generated["reasoning"], generated["text"], [c for c in calls if c.get("id")],
                                       finish)])
    trace_id = recorder.step(recorded, result, tokens, calls, finish, output, began_ns)
    return {"step": recorded.step, "trace_id": recorded.trace_id, "replay_trace_id": trace_id, **result,
            "seconds": round(time.perf_counter() - began, 3)}


def _generate_body(args: argparse.Namespace, recorded: Recorded) -> dict:
    cut = len(recorded.prompt_ids) - recorded.forced
    allowed = recorded.sampling.get("max_tokens") or None
    budget = args.max_tokens or len(recorded.tokens) + EXTRA_TOKENS
    body = {"prompt_ids": recorded.prompt_ids[:cut], "answer_prefix": recorded.prompt_ids[cut:],
            "thinking": recorded.thinking, "tools": recorded.tools,
            "max_tokens": min(budget, allowed) if allowed else budget}
    if args.sampling == "greedy":
        body["temperature"] = 0.0
    else:
        body.update({k: v for k, v in recorded.sampling.items() if k != "max_tokens" and v is not None})
    return body


def _same_vocabulary(target: Target, recorded: Recorded, scores: list[dict]) -> None:
    """The target reads ids as the recording wrote them: its pieces must be the recording's (a looptrace
    target names them; a vLLM server's are not checked here)."""
    for token, scored in zip(recorded.tokens, scores):
        if "piece" in scored and token.get("piece") is not None and scored["piece"] != token["piece"]:
            raise ReplayError(f"the target's vocabulary is not the recording's: token {token['id']} is "
                              f"{scored['piece']!r} there, {token['piece']!r} in step {recorded.step}; its ids would "
                              "mean other text")


def summary(report: dict) -> str:
    agreement = report["agreement"]
    shown = "n/a" if agreement is None else f"{agreement:.4f}"
    lines = [f"{report['mode']} replay of {report['session']} against {report['target']} ({report['model']}): "
             f"agreement {shown}" + (f" (minimum {report['min_agreement']})" if report["min_agreement"] is not None
                                     else "")]
    first = report.get("first_divergence")
    if first:
        lines.append(f"first divergence: step {first['step']}, token {first['token']}")
    if report.get("first_different_step"):
        lines.append(f"first step acted differently: {report['first_different_step']}")
    lines.append(f"stored as session {report['replay_session']}; compare at {report['compare_path']}")
    if report["spans_lost"]:
        lines.append(f"{report['spans_lost']} spans of the replay could not be stored")
    return "\n".join(lines)


def _version() -> str:
    try:
        return importlib.metadata.version("looptrace")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"
