"""The backends looptrace serves with: one entry each, holding its command-line options and their
checks, what it needs, what it can do, and where its loader lives.

The server knows backends only through these entries and the Backend protocol (base.py); no other
module compares a backend's name (tests/unit/test_backend_registry.py fails if one does). Adding a
backend is its own module (a `Loader` and the backend), its entry here, and its tests.

Entries import nothing heavy: a backend's module (torch, llama.cpp, aiohttp) is imported only when
that backend is chosen, so a relay process never holds a model runtime in its memory.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from looptrace.common.option_values import amount, count, gpu_layers, seconds

from .speculative.config import SpeculativeConfig


@dataclass(frozen=True, slots=True)
class Option:
    """A command-line option only some backends read: `dest` is its Settings field, whose default is
    the option's; `flags` and `kwargs` go to argparse as they are."""

    dest: str
    flags: tuple[str, ...]
    kwargs: dict = field(default_factory=dict)
    elsewhere: str = ""  # said when it is given to a backend that does not read it

    @property
    def flag(self) -> str:
        return self.flags[0]


@dataclass(frozen=True, slots=True)
class Needs:
    weights: bool = False  # the checkpoint's weights are fetched (else its tokenizer, template and config)
    model_runtime: bool = False  # torch and transformers' model code in this process
    modules: tuple[str, ...] = ()  # what it imports that a relay's install lacks (torch)
    extras: tuple[str, ...] = ()  # and the extras of `pip install 'looptrace[…]'` that install them
    gpu: bool = False  # a GPU at all (none does yet: each runs on a CPU, some faster on a GPU)


@dataclass(frozen=True, slots=True)
class Capabilities:
    fork: bool = False  # decodes a stored prompt again from any token (POST /v1/traces/{id}/fork)
    score: bool = False  # reads a given answer after a given prompt, teacher forced (POST /v1/score)
    media: bool = False  # images, audio or video beside the prompt (which kinds: the checkpoint's processor)
    speculation: bool = False  # --speculative-config
    upstreams: bool = False  # forwards to servers of its own, several of them (per-server metrics, /health)
    workers: bool = False  # several looptrace processes may serve with it (no model in their memory)


@dataclass(frozen=True, slots=True)
class BackendEntry:
    name: str
    help: str
    loader: str  # "module:Class", imported when the backend is chosen
    needs: Needs
    can: Capabilities
    options: tuple[Option, ...] = ()
    check: Callable[[Any], str | None] = lambda settings: None  # a reason to refuse the settings, or None
    default_model: bool = True  # MODEL defaults to the server's default checkpoint (vLLM: what the server serves)
    claims: Callable[[str], bool] = lambda model: False  # the default backend for such a MODEL

    def missing(self) -> str | None:
        """What this backend imports and is not installed, said with the one line that installs it; else None."""
        absent = [name for name in self.needs.modules if importlib.util.find_spec(name) is None]
        if not absent:
            return None
        return (f"--backend {self.name} decodes on this machine with {' and '.join(absent)}, not installed: "
                f"pip install 'looptrace[{','.join(self.needs.extras)}]'")

    def load(self, settings, host) -> Any:
        """The backend's Loader for these settings (base.Loader), its module imported now."""
        module, _, name = self.loader.partition(":")
        return getattr(importlib.import_module(module), name)(settings, host)


# -- options several backends share --

MAX_QUEUE = Option("max_queue", ("--max-queue",), {
    "type": count, "metavar": "N",
    "help": "requests that may wait for the model before a 429 (0: none wait; one runs at a time)"})
PREFIX_CACHE_TOKENS = Option("prefix_cache_tokens", ("--prefix-cache-tokens",), {
    "type": count, "metavar": "N",
    "help": "keep the model's state after recent prompts, up to N tokens in all, so a conversation's next turn "
            "prefills only what is new (0: off)"})
PREFIX_CACHE_MB = Option("prefix_cache_mb", ("--prefix-cache-mb",), {
    "type": amount, "metavar": "MB", "help": "the prefix cache's bound in memory as well, its tensors counted"})
SPECULATIVE = Option("speculative_config", ("--speculative-config",), {
    "metavar": "JSON",
    "help": "speculative decoding, as vLLM's flag: '{\"method\": \"ngram\", \"num_speculative_tokens\": 8, "
            "\"prompt_lookup_max\": 4, \"prompt_lookup_min\": 2}' (prompt lookup, any model); '{\"method\": "
            "\"suffix\"}' (suffix decoding over this and earlier requests); '{\"method\": \"mtp\"}' (the "
            "checkpoint's own drafter); off by default"},
    elsewhere=" (a vLLM server takes its own --speculative-config)")
TOKENIZER = Option("tokenizer", ("--tokenizer",), {
    "metavar": "PATH",
    "help": "vllm: the served checkpoint's folder (or Hub id) here, when the server loaded it from a path this "
            "machine lacks; llama.cpp: a checkpoint whose tokenizer, template and config go with the GGUF's weights"})


def _speculation(settings, methods: tuple[str, ...]) -> str | None:
    if not settings.speculative_config:
        return None
    try:
        method = SpeculativeConfig.parse(settings.speculative_config).method
    except ValueError as exc:
        return str(exc)
    if method not in methods:
        return (f"--speculative-config: {method} does not run on --backend {settings.backend}; use "
                f"{' or '.join(methods)}")
    return None


def _check_llama_cpp(settings) -> str | None:
    if settings.threads is not None and settings.threads < 1:
        return "--threads must be at least 1"
    return _speculation(settings, ("ngram", "suffix"))


ROUTING = ("rendezvous", "least-loaded", "cache-aware")  # backends/vllm/routing/policies.py's POLICIES, in its order


def _check_vllm(settings) -> str | None:
    urls = settings.vllm_urls
    if not urls and not settings.model:
        return "--backend vllm without --vllm-url starts vLLM itself (--vllm-command): give MODEL, the checkpoint to serve"
    if urls and settings.vllm_command:
        return "--vllm-command starts a vLLM server when no --vllm-url is given; give one or the other"
    if len({url.rstrip("/").removesuffix("/v1") for url in urls}) < len(urls):
        return "--vllm-url: a server is named twice (each URL once, one per server)"
    return _check_kv_events(settings.vllm_kv_events, urls)


def _check_kv_events(endpoints: list[str], urls: list[str]) -> str | None:
    if not endpoints:
        return None
    if not urls:
        return "--vllm-kv-events names the sockets of --vllm-url servers; the vLLM looptrace starts publishes its own"
    if len(endpoints) != len(urls):
        return (f"--vllm-kv-events: one per --vllm-url, in the same order ('none' for a server without them): "
                f"{len(endpoints)} for {len(urls)} servers")
    for spec in endpoints:
        parts = spec.split(",")
        if spec != "none" and (len(parts) > 2 or not all(_is_zmq_endpoint(p) for p in parts)):
            return f"--vllm-kv-events {spec!r}: give ENDPOINT[,REPLAY_ENDPOINT], each tcp://HOST:PORT or ipc://PATH"
    if any(spec != "none" for spec in endpoints) and not all(importlib.util.find_spec(n) for n in ("zmq", "msgpack")):
        return "--vllm-kv-events: reading vLLM's KV events needs pyzmq and msgpack: pip install 'looptrace[vllm]'"
    return None


def _is_zmq_endpoint(text: str) -> bool:
    """tcp://HOST:PORT (a name, an address, [an IPv6 one]) or ipc://PATH, as ZeroMQ connects to them:
    read here, so that one it would refuse later (tcp://[::1, a port past 65535) is refused now."""
    if text.startswith("ipc://"):
        return len(text) > len("ipc://")
    if not text.startswith("tcp://"):
        return False
    try:
        url = urlsplit(text)
        port = url.port
    except ValueError:
        return False
    return bool(url.hostname) and bool(port) and not (url.path or url.query or url.fragment or url.username)


def _is_gguf_with_binding(model: str) -> bool:
    """llama.cpp for a GGUF file when its binding is installed: the weights stay quantized, and decode
    several times faster than through transformers, which dequantizes them."""
    return model.endswith(".gguf") and importlib.util.find_spec("llama_cpp") is not None


ENTRIES: tuple[BackendEntry, ...] = (
    BackendEntry(
        "local", "decode here with transformers", "looptrace.backends.local.loading:LocalLoader",
        Needs(weights=True, model_runtime=True, modules=("torch",), extras=("local",)),
        Capabilities(fork=True, score=True, media=True, speculation=True),
        options=(
            Option("dtype", ("--dtype",), {"choices": ["auto", "float32", "bfloat16", "float16"],
                                           "help": "auto: float32 on CPU, bfloat16 on GPU"}),
            Option("device", ("--device",), {"help": "auto, cpu, cuda or cuda:N"}),
            Option("enforce_eager", ("--enforce-eager",), {
                "action": "store_true",
                "help": "on a GPU, decode with plain calls instead of replaying a captured CUDA graph"}),
            MAX_QUEUE, PREFIX_CACHE_TOKENS, PREFIX_CACHE_MB, SPECULATIVE),
        check=lambda settings: _speculation(settings, ("ngram", "suffix", "draft_model", "mtp")),
    ),
    BackendEntry(
        "llama.cpp", "decode a .gguf here with llama.cpp (the default for a .gguf when looptrace[llama-cpp] is "
        "installed)", "looptrace.backends.llama_cpp.backend:LlamaCppLoader",
        Needs(model_runtime=True, modules=("torch", "llama_cpp"), extras=("local", "llama-cpp")),
        Capabilities(fork=True, score=True, speculation=True),
        options=(
            Option("threads", ("--threads",), {
                "type": int, "metavar": "N",
                "help": "threads that decode (default: one per physical core this process may use)"}),
            Option("n_gpu_layers", ("--n-gpu-layers",), {
                "type": gpu_layers, "metavar": "N",
                "help": "layers to offload to the GPU, for a build of llama-cpp-python with one (Metal, CUDA); "
                        "-1: all (default 0: the CPU only)"}),
            TOKENIZER, MAX_QUEUE, PREFIX_CACHE_TOKENS, PREFIX_CACHE_MB, SPECULATIVE),
        check=_check_llama_cpp, claims=_is_gguf_with_binding,
    ),
    BackendEntry(
        "vllm", "forward token ids to vLLM servers (--vllm-url), or to one it starts (--vllm-command)", "looptrace.backends.vllm.backend:VLLMLoader",
        Needs(), Capabilities(fork=True, score=True, media=True, upstreams=True, workers=True),
        options=(
            Option("vllm_urls", ("--vllm-url",), {
                "metavar": "URL", "action": "append",
                "help": "a vLLM server to forward token ids to (give --revision too if it was started with one); "
                        "repeat it for several servers of one model: each conversation stays on one of them"}),
            Option("vllm_api_key", ("--vllm-api-key",), {"help": "the vLLM servers' API key (default: $VLLM_API_KEY)"}),
            Option("vllm_timeout", ("--vllm-timeout",), {
                "type": seconds, "metavar": "SECONDS",
                "help": "how long to wait for a server's first token, and between tokens"}),
            Option("routing", ("--routing",), {
                "choices": list(ROUTING),
                "help": "which server takes a request: rendezvous (each conversation on its hashed home), "
                        "least-loaded, or cache-aware (the least expected time to first token: the prompt tokens each server "
                        "would read after its cache, and its queue, over its measured prefill rate; home on near-ties)"}),
            Option("vllm_kv_events", ("--vllm-kv-events",), {
                "metavar": "ENDPOINT[,REPLAY]", "action": "append",
                "help": "a --vllm-url server's KV-event sockets (vLLM's --kv-events-config endpoint and "
                        "replay_endpoint, e.g. tcp://gpu-a:5557,tcp://gpu-a:5558, or 'none'): one per --vllm-url, "
                        "in order; routing then knows what each holds"}),
            Option("vllm_command", ("--vllm-command",), {
                "metavar": "COMMAND",
                "help": "without --vllm-url, the command that starts vLLM, {model}, {port} and {kv_events} filled "
                        "in (default: 'vllm serve {model} --host 127.0.0.1 --port {port} --kv-events-config "
                        "{kv_events}')"}),
            Option("vllm_start_timeout", ("--vllm-start-timeout",), {
                "type": seconds, "metavar": "SECONDS", "help": "how long a vLLM server it starts may take to get ready"}),
            TOKENIZER),
        check=_check_vllm, default_model=False,
    ),
    BackendEntry(
        "replay", "serve recorded output (--replay)", "looptrace.backends.recorded:ReplayLoader",
        Needs(), Capabilities(workers=True),
        options=(Option("replay", ("--replay",), {
            "metavar": "SPEC",
            "help": "JSON Lines of recorded steps, trace ids from the store (ID[,ID…]) or conversation:ID"}),),
        check=lambda settings: None if settings.replay else "--backend replay needs --replay FILE",
    ),
)

DEFAULT = "local"  # when nothing claims MODEL


def names() -> list[str]:
    return [entry.name for entry in ENTRIES]


def entry(name: str) -> BackendEntry:
    for candidate in ENTRIES:
        if candidate.name == name:
            return candidate
    raise ValueError(f"no backend {name!r}; there are {', '.join(names())}")


def default_for(model: str | None) -> BackendEntry:
    """The backend a MODEL gets when --backend is not given."""
    for candidate in ENTRIES:
        if model and candidate.claims(model):
            return candidate
    return entry(DEFAULT)


def options() -> list[tuple[Option, list[str]]]:
    """Every backend option once, with the backends that read it, in the entries' order."""
    found: dict[str, tuple[Option, list[str]]] = {}
    for candidate in ENTRIES:
        for option in candidate.options:
            found.setdefault(option.dest, (option, []))[1].append(candidate.name)
    return list(found.values())


def refusal(settings, defaults) -> str | None:
    """Why these settings cannot serve: an option of another backend given, or the chosen backend's
    own check. `defaults`: a Settings as it is before anything is given."""
    chosen = entry(settings.backend)
    own = {option.dest for option in chosen.options}
    for option, readers in options():
        if option.dest not in own and getattr(settings, option.dest) != getattr(defaults, option.dest):
            return f"{option.flag} is for --backend {' and '.join(readers)}{option.elsewhere}"
    return chosen.check(settings)
