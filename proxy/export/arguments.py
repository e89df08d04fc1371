"""The command line of `looptrace export` (its work is in command.py, imported only when it runs:
`looptrace --help` stays quick)."""

from __future__ import annotations

import argparse


def add_command(commands) -> None:
    """`looptrace export`, under the CLI's subparsers; it names the function that runs it in `run`."""
    export = commands.add_parser(
        "export", help="export recorded steps token-exact (JSON Lines, Parquet, a trainer's format, ATIF) for training",
        description="Every step's prompt ids, completion ids, per-token logprobs, a mask of the tokens the model "
        "wrote and its tool calls, token-exact (never re-tokenized).")
    export_arguments(export)
    export.set_defaults(run="looptrace.proxy.export.command:run")


def export_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--store", required=True, metavar="PATH_OR_URL",
                        help="the trace store, as --trace-db takes it (a SQLite file or a PostgreSQL URL)")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--session", metavar="KEY", help="one session, by the key the viewer shows")
    which.add_argument("--since", metavar="TIME",
                       help="every session active since TIME (Unix seconds or ISO 8601), oldest step first")
    parser.add_argument("--tenant", metavar="T",
                        help="only tenant T's sessions and steps (a key's tenant: looptrace keys list); without it, "
                        "every tenant's: this command reads the store itself, as the operator who holds it")
    parser.add_argument("--format", choices=["jsonl", "parquet", "verl", "skyrl", "prime-rl", "nemo-gym", "tinker",
                                             "atif"],
                        default="jsonl", help="jsonl or parquet: looptrace's own record per step; verl, skyrl, "
                        "prime-rl, nemo-gym, tinker: that trainer's rows, with the rollout's reward (JSON Lines; "
                        "prime-rl Parquet); atif: one ATIF v1.8 trajectory per session (JSON Lines)")
    parser.add_argument("--per", choices=["rollout", "step"], default=None,
                        help="a trainer format's rows: one per rollout, its steps stitched token-exact (the default), "
                        "or one per step")
    parser.add_argument("--out", metavar="FILE", help="where to write (default: standard output; Parquet needs a file)")
