"""Everything `looptrace serve` can be told, in one place, read once at start-up."""

from __future__ import annotations

from dataclasses import dataclass, field

DEFAULT_MODEL = "Qwen/Qwen3.5-0.8B"


@dataclass(slots=True)
class Settings:
    model: str | None = DEFAULT_MODEL
    host: str = "127.0.0.1"
    port: int = 8000
    served_model_name: str | None = None
    revision: str | None = None
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    api_key: str | None = None
    # Host names answered besides IP addresses and localhost (api/hosts.py: DNS rebinding); "*": any.
    allowed_hosts: list[str] = field(default_factory=list)
    max_model_len: int | None = None  # None: the checkpoint's own
    # Loading's objects moved out of the garbage collector's walks once loaded (engine/runtime.py): set
    # by `looptrace serve`, a process serving one model; not by tests, whose many apps in one process
    # would keep whatever cycles theirs made.
    freeze_after_load: bool = False
    workers: int = 1  # server processes on the one port (a relay's backend only; proxy/workers.py)
    enforce_eager: bool = False  # no CUDA graph for the decode step
    # Each conversation's last prompt, kept so that the next turn is tokenized from where it departs
    # (families/incremental.py); 0: every prompt tokenized whole.
    render_cache_mb: float = 256.0
    render_check_every: int = 100  # every N-th incremental encoding is checked against a whole one; 0: never
    render_windows: bool = True  # a turn's template text rendered from what it adds (families/render_windows.py)
    # Whether a turn's prompt keeps the ids the model read and wrote before (proxy/engine/continuity.py):
    # off, check (classified: clean, realign, fork) or keep (built of them).
    token_continuity: str = "off"
    # Rewards for rollouts the trace store does not hold (judged elsewhere): refused unless allowed, since
    # each takes a slot of the kept rollouts (proxy/api/rollouts/rewards.py).
    allow_unknown_rollout_rewards: bool = False
    # A file holding the prompt a compaction asks the model for its summary with (api/openai/responses/compaction/plan.py);
    # None: looptrace's own.
    compaction_prompt: str | None = None
    # Sampling for a request that sets none of its own (temperature, top_p, top_k), over the checkpoint's
    # generation_config: vLLM's --override-generation-config, SGLang's --preferred-sampling-params.
    sampling_defaults: dict | None = None
    max_queue: int = 64  # requests waiting for the model before new ones get a 429
    # Seconds a stream waits for its client to take what was written; past that the client is gone and
    # its generation stops (one that never reads would otherwise hold the model: api/streaming.py).
    stream_write_timeout: float = 30.0
    prefix_cache_tokens: int = 65536  # prompt tokens whose state the local backend keeps for the next turn; 0: off
    prefix_cache_mb: float = 2048.0  # and the memory those states may hold, their tensors counted
    # Local backend: speculative decoding (backends/speculative/drafting.py), as --speculative-config's
    # JSON; None: plain decoding.
    speculative_config: str | None = None
    # Attached media: the largest item as sent, an image's pixels, items per request (400s beyond).
    media_max_mb: float = 20.0
    media_max_pixels: int = 33_554_432  # 8K: a 5K or 6K screenshot fits, a decompression bomb does not
    media_max_request_pixels: int = 33_554_432  # a request's images in all: its processor holds ~40 bytes a pixel
    media_max_items: int = 16
    media_max_audio_seconds: float = 30.0  # what Gemma 4's audio encoder reads (750 tokens of 40 ms)
    media_max_video_frames: int = 64  # as the processor samples them: Gemma 4 takes 32, Qwen3.5 2 a second
    allowed_media_domains: list[str] = field(default_factory=list)  # hosts media URLs may be fetched from
    media_fetch_timeout: float = 10.0  # seconds for one fetch, all of it
    backend: str = "local"  # a name in looptrace.backends.registry (the command line may pick one by MODEL)
    replay: str | None = None  # the recorded steps, for --backend replay
    vllm_urls: list[str] = field(default_factory=list)  # the vLLM servers, for --backend vllm (one model)
    vllm_api_key: str | None = None
    vllm_timeout: float = 60.0  # seconds to wait for the first token, and between tokens
    routing: str = "rendezvous"  # which vLLM server takes a request (backends/vllm/routing/policies.py's POLICIES)
    # Each --vllm-url's KV-event sockets ("ENDPOINT[,REPLAY_ENDPOINT]" or "none"), in the same order.
    vllm_kv_events: list[str] = field(default_factory=list)
    # Without vllm_urls: the command that starts vLLM ({model}, {port}, {kv_events}; None: `vllm serve`, in
    # backends/vllm/spawn.py), and how long it may take to get ready (the first start compiles for minutes on a CPU).
    vllm_command: str | None = None
    vllm_start_timeout: float = 900.0
    # vllm: where the served checkpoint's tokenizer is here (None: its root); llama.cpp: a checkpoint
    # whose tokenizer, template and config to use (None: the GGUF's own)
    tokenizer: str | None = None
    threads: int | None = None  # llama.cpp: decoding threads (None: one per physical core)
    n_gpu_layers: int = 0  # llama.cpp: layers offloaded to a GPU (-1: all), for builds of the binding with one
    # Tracing: the embedded store (a path, or "off"), OTLP export, and whether content is recorded.
    trace_db: str | None = None  # None: under the user's data directory
    trace_content: bool = True
    redact: bool = True  # credentials in what is recorded, exported and logged become markers (common/redaction.py)
    otlp_endpoint: str | None = None
    trace_retention_days: float = 7.0
    trace_max_mb: float = 1024.0
