"""`looptrace serve`: the command line."""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import sys

from .settings import DEFAULT_MODEL, Settings


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="looptrace", description="An OpenAI-compatible server that traces what the model does.")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve a model over the OpenAI API")
    serve.add_argument("model", nargs="?", default=None,
                       help=f"a Hugging Face id, a checkpoint folder or a .gguf file (default {DEFAULT_MODEL}; "
                       "with --backend vllm, the model the server serves)")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--served-model-name", help="the model id clients use (default: MODEL as given)")
    serve.add_argument("--revision", help="a branch, tag or commit of a Hub checkpoint, pinned for reproducibility")
    serve.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"], default="auto",
                       help="auto: float32 on CPU, bfloat16 on GPU")
    serve.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    serve.add_argument("--api-key", default=os.environ.get("LOOPTRACE_API_KEY"),
                       help="require 'Authorization: Bearer KEY' (default: $LOOPTRACE_API_KEY)")
    serve.add_argument("--max-model-len", type=int, help="context length to allow (default: the checkpoint's)")
    serve.add_argument("--enforce-eager", action="store_true",
                       help="on a GPU, decode with plain calls instead of replaying a captured CUDA graph")
    serve.add_argument("--max-queue", type=int, default=64,
                       help="requests that may wait for the model before a 429 (0: none wait; one runs at a time)")
    serve.add_argument("--prefix-cache-tokens", type=int, default=65536, metavar="N",
                       help="local and llama.cpp backends: keep the model's state after recent prompts, up to N tokens "
                       "in all, so a conversation's next turn prefills only what is new (0: off; default 65536)")
    serve.add_argument("--prefix-cache-mb", type=float, default=2048, metavar="MB",
                       help="local and llama.cpp backends: the prefix cache's bound in memory as well, its tensors "
                       "counted (default 2048)")
    serve.add_argument("--speculative-config", metavar="JSON",
                       help="local and llama.cpp backends: speculative decoding, as vLLM's flag: "
                       "'{\"method\": \"ngram\", \"num_speculative_tokens\": 8, \"prompt_lookup_max\": 4, "
                       "\"prompt_lookup_min\": 2}' (prompt lookup, any model); off by default")
    serve.add_argument("--media-max-mb", type=float, default=20, metavar="MB",
                       help="the largest attached item, as sent (default 20)")
    serve.add_argument("--media-max-pixels", type=int, default=33_554_432, metavar="N",
                       help="the most pixels an attached image (or a video's frame) may have (default 33,554,432: 8K)")
    serve.add_argument("--media-max-items", type=int, default=16, metavar="N",
                       help="the most items one request may attach (default 16)")
    serve.add_argument("--allowed-media-domains", nargs="+", default=[], metavar="HOST",
                       help="hosts whose http(s) media URLs may be fetched (exact names; an IP or localhost only "
                       "when listed as itself); none by default: media comes as data URLs")
    serve.add_argument("--media-fetch-timeout", type=float, default=10, metavar="S",
                       help="seconds one media fetch may take, all of it (default 10)")
    serve.add_argument("--media-max-audio-seconds", type=float, default=30, metavar="S",
                       help="the longest audio clip (default 30: what Gemma 4's audio encoder reads)")
    serve.add_argument("--media-max-video-frames", type=int, default=64, metavar="N",
                       help="the most frames the model's processor may sample from one video (default 64; Gemma 4 "
                       "samples 32, Qwen3.5 two a second)")
    serve.add_argument("--backend", choices=["local", "llama.cpp", "replay", "vllm"], default=None,
                       help="local: decode here with transformers; llama.cpp: decode a .gguf here with llama.cpp "
                       "(the default for a .gguf when looptrace[llama-cpp] is installed; otherwise local); "
                       "replay: serve recorded output (--replay); vllm: forward token ids to a vLLM server (--vllm-url)")
    serve.add_argument("--threads", type=int, metavar="N",
                       help="llama.cpp: threads that decode (default: one per physical core this process may use)")
    serve.add_argument("--n-gpu-layers", type=int, default=0, metavar="N",
                       help="llama.cpp: layers to offload to the GPU, for a build of llama-cpp-python with one "
                       "(Metal, CUDA); -1: all (default 0: the CPU only)")
    serve.add_argument("--replay", metavar="FILE", help="JSON Lines of recorded steps, one per request, for --backend replay")
    serve.add_argument("--vllm-url", metavar="URL", action="append", dest="vllm_urls", default=[],
                       help="a vLLM server to forward token ids to, for --backend vllm (give --revision too if it was "
                       "started with one); repeat it for several servers of one model: each conversation stays on "
                       "one of them")
    serve.add_argument("--vllm-api-key", default=os.environ.get("VLLM_API_KEY"),
                       help="the vLLM server's API key (default: $VLLM_API_KEY)")
    serve.add_argument("--vllm-timeout", type=float, default=60.0, metavar="SECONDS",
                       help="how long to wait for the vLLM server's first token, and between tokens (default 60)")
    serve.add_argument("--tokenizer", metavar="PATH", help="for --backend vllm: the served checkpoint's folder (or "
                       "Hub id) here, when the server loaded it from a path this machine lacks; its tokenizer, "
                       "chat template and config must be the server's. For --backend llama.cpp: a checkpoint "
                       "folder (or Hub id) whose tokenizer, template and config to use instead of the GGUF's own")
    serve.add_argument("--trace-db", metavar="PATH", help="the SQLite trace store, or 'off' (default: "
                       "traces.sqlite3 in the user's data directory)")
    serve.add_argument("--no-trace-content", dest="trace_content", action="store_false",
                       help="record timings, counts and probabilities, but no prompt, token or argument text")
    serve.add_argument("--otlp-endpoint", metavar="URL", default=os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"),
                       help="also export every span over OTLP/HTTP, e.g. http://localhost:4318 (Tempo, Jaeger, Phoenix)")
    serve.add_argument("--trace-retention-days", type=float, default=7.0, help="drop stored traces older than this")
    serve.add_argument("--trace-max-mb", type=float, default=1024.0, help="drop the oldest stored traces past this size")
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return parser


def settings_from(args: argparse.Namespace) -> Settings:
    return Settings(
        model=args.model or (None if args.backend == "vllm" else DEFAULT_MODEL),  # vllm: what the server serves
        host=args.host, port=args.port, served_model_name=args.served_model_name,
        revision=args.revision, dtype=args.dtype, device=args.device, api_key=args.api_key or None,
        max_model_len=args.max_model_len, enforce_eager=args.enforce_eager, max_queue=args.max_queue,
        prefix_cache_tokens=args.prefix_cache_tokens, prefix_cache_mb=args.prefix_cache_mb,
        backend=args.backend or default_backend(args.model),
        speculative_config=args.speculative_config,
        threads=args.threads, n_gpu_layers=args.n_gpu_layers,
        replay=args.replay,
        media_max_mb=args.media_max_mb, media_max_pixels=args.media_max_pixels, media_max_items=args.media_max_items,
        media_max_audio_seconds=args.media_max_audio_seconds, media_max_video_frames=args.media_max_video_frames,
        allowed_media_domains=args.allowed_media_domains,
        media_fetch_timeout=args.media_fetch_timeout,
        vllm_urls=args.vllm_urls, vllm_api_key=args.vllm_api_key or None, vllm_timeout=args.vllm_timeout,
        tokenizer=args.tokenizer, trace_db=args.trace_db, trace_content=args.trace_content, otlp_endpoint=args.otlp_endpoint,
        trace_retention_days=args.trace_retention_days, trace_max_mb=args.trace_max_mb,
    )


def default_backend(model: str | None) -> str:
    """llama.cpp for a GGUF file when its binding is installed (the weights stay quantized, and decode
    several times faster than through transformers, which dequantizes them); local otherwise."""
    if model and model.endswith(".gguf") and importlib.util.find_spec("llama_cpp") is not None:
        return "llama.cpp"
    return "local"


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    chosen = args.backend is None  # by MODEL's kind, said in the log below
    args.backend = args.backend or default_backend(args.model)
    if args.backend == "replay" and not args.replay:
        parser.error("--backend replay needs --replay FILE")
    if args.backend == "vllm" and not args.vllm_urls:
        parser.error("--backend vllm needs --vllm-url URL")
    if len({url.rstrip("/").removesuffix("/v1") for url in args.vllm_urls}) < len(args.vllm_urls):
        parser.error("--vllm-url: a server is named twice (each URL once, one per server)")
    if (args.threads is not None or args.n_gpu_layers) and args.backend != "llama.cpp":
        parser.error("--threads and --n-gpu-layers are for --backend llama.cpp")
    if args.threads is not None and args.threads < 1:
        parser.error("--threads must be at least 1")
    if args.tokenizer and args.backend not in ("vllm", "llama.cpp"):
        parser.error("--tokenizer is for --backend vllm and llama.cpp (elsewhere MODEL is the checkpoint, tokenizer "
                     "included)")
    if args.speculative_config:
        if args.backend not in ("local", "llama.cpp"):
            parser.error("--speculative-config is for the local and llama.cpp backends (a vLLM server takes its own "
                         "--speculative-config)")
        from looptrace.backends.speculative import SpeculativeConfig

        try:
            speculative = SpeculativeConfig.parse(args.speculative_config)
        except ValueError as exc:
            parser.error(str(exc))
        if args.backend == "llama.cpp" and speculative.method != "ngram":
            parser.error(f"--speculative-config: {speculative.method} runs on the local backend only; with llama.cpp, "
                         "use ngram (prompt lookup)")
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    if chosen and args.model and args.model.endswith(".gguf"):
        if args.backend == "llama.cpp":
            logging.getLogger("looptrace").info("%s is a GGUF file: decoding with llama.cpp (--backend local decodes "
                                                "it with transformers instead)", args.model)
        else:
            logging.getLogger("looptrace").info("%s is a GGUF file: transformers dequantizes it, several times slower "
                                                "than llama.cpp; pip install 'looptrace[llama-cpp]' to decode it with "
                                                "llama.cpp", args.model)
    from aiohttp import web  # after the arguments: `looptrace --help` answers at once

    from .api.app import create_app
    from .api.errors import ProtocolErrorsInOneLine

    logging.getLogger("aiohttp.server").addFilter(ProtocolErrorsInOneLine())

    settings = settings_from(args)
    app = create_app(settings)
    # handler_cancellation: a client that disconnects cancels its handler, which stops its generation.
    web.run_app(app, host=settings.host, port=settings.port, handler_cancellation=True, access_log=None,
                print=lambda *_: logging.getLogger("looptrace").info(
                    "serving %s on http://%s:%d/v1", settings.model or ", ".join(settings.vllm_urls), settings.host, settings.port))


if __name__ == "__main__":
    main()
