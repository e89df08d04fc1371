"""The command line of `looptrace replay` (its work is in run.py, imported only when it runs: `looptrace
--help` stays quick)."""

from __future__ import annotations

import argparse
import os

EXTRA_TOKENS = 256  # step mode: how far past the recorded answer's length the target may write, by default
DEFAULT_TIMEOUT = 60.0  # seconds one request to the target may take: what a person would wait for


def add_command(commands) -> None:
    """`looptrace replay`, under the CLI's subparsers; it names the function that runs it in `run`."""
    replay = commands.add_parser(
        "replay", help="replay a recorded session against another server and report where it diverges",
        description="Replay a recorded session against a looptrace or vLLM server, token by token: the agreement "
        "goes to a JSON report (and JUnit), and the replay is stored as a session beside the original. Exit status "
        "1 below --min-agreement, 2 when the replay cannot run.")
    replay_arguments(replay)
    replay.set_defaults(run="looptrace.proxy.replay.run:run")


def replay_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--store", required=True, metavar="PATH_OR_URL",
                        help="the trace store holding the session, as --trace-db takes it (a SQLite file or a "
                        "PostgreSQL URL); the replay is stored there too")
    parser.add_argument("--session", required=True, metavar="KEY", help="the session's key, as the viewer shows it")
    parser.add_argument("--target", required=True, metavar="URL",
                        help="a looptrace server (any backend) or a vLLM server (forced mode only): an http:// or "
                        "https:// URL, asked where it points (a redirect is refused, not followed)")
    parser.add_argument("--mode", choices=["forced", "step"], default="forced",
                        help="forced: the target reads each recorded answer (teacher forced) and its greedy choice is "
                        "compared token by token; step: the target decodes each recorded prompt afresh and its tool "
                        "calls are compared")
    parser.add_argument("--report", required=True, metavar="FILE", help="where the JSON report goes")
    parser.add_argument("--junit", metavar="FILE", help="also a JUnit XML report: a test case per step")
    parser.add_argument("--min-agreement", type=float, metavar="X",
                        help="exit 1 when the session's agreement is below X (0 to 1)")
    parser.add_argument("--sampling", choices=["recorded", "greedy"], default="recorded",
                        help="step mode: each step's recorded temperature, top-p, top-k and seed, or greedy decoding")
    parser.add_argument("--max-tokens", type=int, metavar="N",
                        help=f"step mode: the most tokens the target may write per step (default: the recorded "
                        f"answer's length + {EXTRA_TOKENS}, within what the step allowed)")
    parser.add_argument("--api-key", default=os.environ.get("LOOPTRACE_API_KEY"),
                        help="the target's API key (default: $LOOPTRACE_API_KEY)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="SECONDS",
                        help=f"how long one request to the target may take (default {DEFAULT_TIMEOUT:g} s; a step "
                        "that decodes a long answer on a slow target may need more)")
