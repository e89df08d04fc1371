"""`looptrace serve`: the command line.

Defaults are Settings' (settings.py), read from there, never written twice. The options only some
backends read, and the checks on them, are the backends' registry entries'
(looptrace.backends.registry): this module adds them under each backend's heading.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import logging
import os
import sys

from looptrace.backends import registry
from looptrace.common.option_values import amount, count, port, positive, seconds
from looptrace.trace_store.location import refusal as store_refusal

from . import workers
from .engine import model_runtime
from .erase import add_command as add_erase
from .keys import add_command as add_keys
from .mcp.arguments import add_command as add_mcp
from .export.arguments import add_command as add_export
from .replay.arguments import add_command as add_replay
from .settings import DEFAULT_MODEL, Settings

DEFAULTS = Settings()


def _default(name: str):
    return getattr(DEFAULTS, name)


class _ShowDefaults(argparse.HelpFormatter):
    """Each option's default in its help, from Settings, where it has one worth saying."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.default not in (None, False, [], argparse.SUPPRESS) and action.option_strings:
            text += " (default: %(default)s)"
        return text


class _OneLineParser(argparse.ArgumentParser):
    """A mistake on the command line said in one line and exit 2, as every refusal of looptrace's
    commands is (argparse writes its whole usage first: dozens of lines for `serve`)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: {message} (--help lists the options)\n")


def _text_file(path: str) -> str:
    try:
        text = open(os.path.expanduser(path), encoding="utf-8").read()
    except (OSError, UnicodeDecodeError) as exc:
        raise argparse.ArgumentTypeError(f"cannot read {path!r} as UTF-8 text: {exc}") from exc
    if not text.strip():
        raise argparse.ArgumentTypeError(f"{path!r} is empty")
    return path


# What --sampling-defaults takes, as requests take it (api/request_parts.py).
SAMPLING_RANGES = {"temperature": (float, lambda v: 0 <= v <= 2, "from 0 to 2"),
                   "top_p": (float, lambda v: 0 < v <= 1, "above 0 and at most 1"),
                   "top_k": (int, lambda v: 0 <= v < 1 << 31, "a whole number from 0 (all)")}


def _sampling_defaults(text: str) -> dict:
    def refuse(constant: str):
        raise ValueError(f"{constant} is not a number")

    try:
        given = json.loads(text, parse_constant=refuse)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a JSON object: {exc}") from exc
    if not isinstance(given, dict):
        raise argparse.ArgumentTypeError('a JSON object is wanted, e.g. \'{"temperature": 0}\'')
    for key, value in given.items():
        if key not in SAMPLING_RANGES:
            raise argparse.ArgumentTypeError(f"{key!r} is not one of {', '.join(SAMPLING_RANGES)}")
        kind, within, said = SAMPLING_RANGES[key]
        kinds = (int, float) if kind is float else int
        if isinstance(value, bool) or not isinstance(value, kinds) or not within(value):
            raise argparse.ArgumentTypeError(f"{key} must be {said}, not {value!r}")
    return given


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(prog="looptrace",
                            description="An OpenAI-compatible server that traces what the model does.")
    commands = parser.add_subparsers(dest="command", required=True)
    add_replay(commands)  # proxy/replay/
    add_export(commands)  # proxy/export/
    add_erase(commands)  # proxy/erase.py
    add_keys(commands)  # proxy/keys.py
    add_mcp(commands)  # proxy/mcp/
    serve = commands.add_parser("serve", help="serve a model over the OpenAI API", formatter_class=_ShowDefaults)
    serve.add_argument("model", nargs="?", default=None,
                       help=f"a Hugging Face id, a checkpoint folder or a .gguf file (default {DEFAULT_MODEL}; "
                       "with --backend vllm, the model the server serves)")
    _server_options(serve)
    _prompt_options(serve)
    _media_options(serve)
    serve.add_argument("--backend", choices=registry.names(), default=None,
                       help="; ".join(f"{e.name}: {e.help}" for e in registry.ENTRIES))
    groups: dict[str, argparse._ArgumentGroup] = {}
    for option, readers in registry.options():
        heading = f"for --backend {' and '.join(readers)}"
        group = groups.get(heading) or groups.setdefault(heading, serve.add_argument_group(heading))
        kwargs = {"default": _default(option.dest), **option.kwargs}
        if kwargs.get("action") == "append":
            kwargs["default"] = []
        group.add_argument(*option.flags, dest=option.dest, **kwargs)
    _trace_options(serve)
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"], help="")
    return parser


def _server_options(serve: argparse.ArgumentParser) -> None:
    serve.add_argument("--host", default=_default("host"), help="address to bind (127.0.0.1: this machine only)")
    serve.add_argument("--port", type=port, default=_default("port"))
    serve.add_argument("--served-model-name", help="the model id clients use (default: MODEL as given)")
    serve.add_argument("--revision", help="a branch, tag or commit of a Hub checkpoint, pinned for reproducibility")
    serve.add_argument("--api-key", default=os.environ.get("LOOPTRACE_API_KEY"),
                       help="require 'Authorization: Bearer KEY' (default: $LOOPTRACE_API_KEY)")
    serve.add_argument("--allowed-host", dest="allowed_hosts", action="append", default=[], metavar="NAME",
                       help="a Host name clients reach this server by, besides IP addresses and localhost, which are "
                       "always answered (repeat for more; '*': any, behind a proxy that checks names): any other "
                       "name is refused with a 403, so that a web page cannot read traces by DNS rebinding")
    serve.add_argument("--max-model-len", type=positive, help="context length to allow (default: the checkpoint's)")
    serve.add_argument("--workers", type=int, default=_default("workers"), metavar="N",
                       help="server processes on the one port, for a relay (--backend vllm or replay): each has an "
                       "event loop of its own; this process supervises them and holds no model")
    serve.add_argument("--worker-slot", type=int, help=argparse.SUPPRESS)  # set by the supervisor for its workers
    serve.add_argument("--stream-write-timeout", type=seconds, default=_default("stream_write_timeout"),
                       metavar="S", help="how long a stream waits for a client that stopped reading before it is "
                       "treated as gone: its generation stops and the model is free for the next request")


def _prompt_options(serve: argparse.ArgumentParser) -> None:
    group = serve.add_argument_group("prompts")
    group.add_argument("--render-cache-mb", type=amount, default=_default("render_cache_mb"), metavar="MB",
                       help="memory for each conversation's last prompt (its text, ids and where it may be cut), so "
                       "that the next turn tokenizes only where it departs from it; 0: every prompt tokenized whole")
    group.add_argument("--render-check-every", type=count, default=_default("render_check_every"), metavar="N",
                       help="tokenize every N-th such prompt whole as well and count any difference "
                       "(looptrace_render_checks_total); 0: never")
    group.add_argument("--no-render-windows", dest="render_windows", action="store_false",
                       help="render the chat template over the whole conversation every turn, not over only what "
                       "the turn adds (certified against the last turn's text, checked as often as the encoding: "
                       "looptrace_render_drift_total)")
    group.add_argument("--token-continuity", choices=["off", "check", "keep"], default=_default("token_continuity"),
                       help="whether a conversation's next prompt holds the ids the model read and wrote before: "
                       "check classifies each turn (clean, realign, fork), keep builds the prompt of them and "
                       "renders only the new messages (agent RL); a request may ask for its own with the "
                       "X-Token-Continuity header or a token_continuity field")
    group.add_argument("--sampling-defaults", type=_sampling_defaults, metavar="JSON",
                       help='the sampling a request gets for what it does not set itself, over the model\'s own '
                       'generation_config: a JSON object of temperature, top_p and top_k, e.g. \'{"temperature": 0}\' '
                       "for greedy answers to clients that send no temperature")
    group.add_argument("--compaction-prompt", type=_text_file, metavar="FILE",
                       help="a file holding the prompt a compaction asks the model for its summary with, in place of "
                       "looptrace's own (docs/clients.md)")


def _media_options(serve: argparse.ArgumentParser) -> None:
    group = serve.add_argument_group("attached media (images, audio, video)")
    group.add_argument("--media-max-mb", type=amount, default=_default("media_max_mb"), metavar="MB",
                       help="the largest attached item, as sent")
    group.add_argument("--media-max-pixels", type=count, default=_default("media_max_pixels"), metavar="N",
                       help="the most pixels an attached image (or a video's frame) may have (8K)")
    group.add_argument("--media-max-request-pixels", type=count, default=_default("media_max_request_pixels"),
                       metavar="N", help="the most pixels one request's images may have in all, as their headers "
                       "say (checked before any is decoded)")
    group.add_argument("--media-max-items", type=count, default=_default("media_max_items"), metavar="N",
                       help="the most items one request may attach")
    group.add_argument("--allowed-media-domains", nargs="+", default=[], metavar="HOST",
                       help="hosts whose http(s) media URLs may be fetched (exact names; an IP or localhost only "
                       "when listed as itself); none by default: media comes as data URLs")
    group.add_argument("--media-fetch-timeout", type=seconds, default=_default("media_fetch_timeout"), metavar="S",
                       help="seconds one media fetch may take, all of it")
    group.add_argument("--media-max-audio-seconds", type=amount, default=_default("media_max_audio_seconds"),
                       metavar="S", help="the longest audio clip (what Gemma 4's audio encoder reads)")
    group.add_argument("--media-max-video-frames", type=count, default=_default("media_max_video_frames"), metavar="N",
                       help="the most frames the model's processor may sample from one video (Gemma 4 samples 32, "
                       "Qwen3.5 two a second)")


def _on_off(text: str) -> bool:
    if text not in ("on", "off"):
        raise argparse.ArgumentTypeError(f"expected on or off, not {text!r}")
    return text == "on"


def _trace_options(serve: argparse.ArgumentParser) -> None:
    group = serve.add_argument_group("traces")
    group.add_argument("--trace-db", metavar="PATH|URL", help="the trace store: a SQLite file, a PostgreSQL URL "
                       "(postgresql://user:password@host:5432/db, shared by every process that names it), or 'off' "
                       "(default: traces.sqlite3 in the user's data directory)")
    group.add_argument("--no-trace-content", dest="trace_content", action="store_false",
                       help="record timings, counts and probabilities, but no prompt, token or argument text")
    group.add_argument("--redact", type=_on_off, default=_default("redact"), metavar="on|off",
                       help="replace credentials (API keys, tokens, private keys, passwords) in everything recorded, "
                       "exported and logged by a marker naming the kind and a short hash (default: on); the "
                       "model still gets the real text. off: keep them, for raw data (warned at start)")
    group.add_argument("--otlp-endpoint", metavar="URL", default=os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"),
                       help="also export every span over OTLP/HTTP, e.g. http://localhost:4318 (Tempo, Jaeger, Phoenix)")
    group.add_argument("--trace-retention-days", type=amount, default=_default("trace_retention_days"),
                       help="drop stored traces older than this")
    group.add_argument("--allow-unknown-rollout-rewards", action="store_true",
                       help="take POST /v1/rollouts/{id}/reward for a rollout the trace store does not hold (one "
                       "judged elsewhere); refused by default: each takes a slot of the rollouts kept")
    group.add_argument("--trace-max-mb", type=amount, default=_default("trace_max_mb"),
                       help="drop the oldest stored traces past this size")


def settings_from(args: argparse.Namespace) -> Settings:
    """Every Settings field the parser has, by its name; MODEL's default depends on the backend."""
    entry = registry.entry(args.backend) if args.backend else registry.default_for(args.model)
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(Settings) if hasattr(args, f.name)}
    given["backend"] = entry.name
    given["model"] = args.model or (DEFAULT_MODEL if entry.default_model else None)
    given["api_key"] = args.api_key or None
    if any(option.dest == "vllm_api_key" for option in entry.options):  # only where it is read
        given["vllm_api_key"] = given.get("vllm_api_key") or os.environ.get("VLLM_API_KEY") or None
    return Settings(**given)


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command != "serve":  # replay, export, erase: the module each names runs it
        module, _, function = args.run.partition(":")
        sys.exit(getattr(importlib.import_module(module), function)(args))
    settings = settings_from(args)
    refused = registry.refusal(settings, DEFAULTS) or workers.refusal(settings) or store_refusal(settings.trace_db)
    if refused:
        print(f"looptrace serve: {refused}", file=sys.stderr)
        sys.exit(2)
    missing = registry.entry(settings.backend).missing()
    if missing:  # a relay's install has no torch: the line that adds what this backend needs
        print(f"looptrace serve: {missing}", file=sys.stderr)
        sys.exit(2)
    worker = "" if args.worker_slot is None else f" [worker {args.worker_slot}]"
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format=f"%(asctime)s %(levelname)s %(name)s{worker}: %(message)s")
    if settings.workers > 1 and args.worker_slot is None:
        sys.exit(workers.supervise(settings, sys.argv[1:] if argv is None else argv))
    if args.backend is None and settings.model and settings.model.endswith(".gguf"):
        _say_how_gguf_decodes(settings)
    if not registry.entry(settings.backend).needs.model_runtime:
        model_runtime.keep_out()  # before anything imports transformers
    from aiohttp import web  # after the arguments: `looptrace --help` answers at once

    from .api.app import create_app
    from .api.errors import ProtocolErrorsInOneLine

    logging.getLogger("aiohttp.server").addFilter(ProtocolErrorsInOneLine())
    settings.freeze_after_load = True
    app = create_app(settings)
    # handler_cancellation: a client that disconnects cancels its handler, which stops its generation.
    # reuse_port: a worker shares the port with the others (SO_REUSEPORT).
    web.run_app(app, host=settings.host, port=settings.port, handler_cancellation=True, access_log=None,
                reuse_port=args.worker_slot is not None, print=lambda *_: logging.getLogger("looptrace").info(
                    "serving %s on http://%s:%d/v1", settings.model or ", ".join(settings.vllm_urls), settings.host,
                    settings.port))


def _say_how_gguf_decodes(settings: Settings) -> None:
    log = logging.getLogger("looptrace")
    if registry.entry(settings.backend).claims(settings.model):
        log.info("%s is a GGUF file: decoding with %s (--backend local decodes it with transformers instead)",
                 settings.model, settings.backend)
    else:
        log.info("%s is a GGUF file: transformers dequantizes it, several times slower than llama.cpp; pip install "
                 "'looptrace[llama-cpp]' to decode it with llama.cpp", settings.model)


if __name__ == "__main__":
    main()
