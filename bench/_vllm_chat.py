"""The vLLM test double (tests/support/vllm_double.py) with vLLM's POST /v1/chat/completions added: what
the relay benchmark's direct client and LiteLLM's proxy call. Messages are rendered with the
checkpoint's chat template and streamed, content only (no reasoning or tool-call parser, as vLLM
started without them, and no logprobs). tests/integration/test_vllm_protocol.py checks its chunks against vLLM's
own protocol models, so the benchmark's "direct" figures are those of vLLM's wire format.

    python bench/_vllm_chat.py --model DIR --port P [--fast] [--served-model-name NAME]
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from pathlib import Path

from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))
from vllm_double import Double, DoubleProcess, Refusal, _frame, error_response, main  # noqa: E402


class ChatDouble(Double):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.chat_prompts: dict[str, list[int]] = {}  # rendered once per conversation: a benchmark repeats one

    def app(self) -> web.Application:
        app = super().app()
        app.router.add_post("/v1/chat/completions", self.chat)
        return app

    async def chat(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except json.JSONDecodeError as exc:
            return error_response(f"JSON decode error: {exc}")
        entry = self._record(request, body)
        messages = body.get("messages") if isinstance(body, dict) else None
        if not isinstance(messages, list) or not messages:
            return error_response("1 validation error:\n  {'type': 'missing', 'loc': 'body.messages', "
                                  "'msg': 'Field required'}", "Bad Request", 400, "body.messages")
        try:
            prompt = self._chat_prompt(messages, body.get("chat_template_kwargs") or {})
            # The token routes' checks and settings; chat's `logprobs` is a switch, and unsupported here.
            max_tokens = body.get("max_completion_tokens")
            max_tokens = body.get("max_tokens") if max_tokens is None else max_tokens
            _, params = self._read({**body, "prompt": prompt, "max_tokens": max_tokens, "logprobs": None}, False)
        except Refusal as refusal:
            return refusal.response
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
        await response.prepare(request)
        entry["outcome"] = "streaming"
        try:
            entry["outcome"] = await self._stream_chat(response, prompt, params, body, entry)
        except asyncio.CancelledError:
            entry["outcome"] = "cancelled"
            raise
        return response

    def _chat_prompt(self, messages: list, template_kwargs: dict) -> list[int]:
        key = json.dumps([messages, template_kwargs], sort_keys=True)
        if key not in self.chat_prompts:
            try:
                text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                                          **template_kwargs)
            except Exception as exc:  # the template's own refusal (a bad role order, a missing field)
                raise Refusal(error_response(str(exc))) from exc
            if len(self.chat_prompts) > 256:
                self.chat_prompts.clear()
            self.chat_prompts[key] = self.tokenizer.encode(text, add_special_tokens=False)
        return self.chat_prompts[key]

    async def _stream_chat(self, response, prompt, params, body, entry) -> str:
        """One chunk per token, each with exactly the fields vLLM's chat serving sets on it (it
        serialises with exclude_unset): a first chunk with the role, token chunks with the text, the
        finish reason on the last token's chunk, then the usage chunk when asked for."""
        from tokenizers.decoders import DecodeStream

        head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion.chunk", "created": int(time.time()),
                "model": self.model}
        return_ids = bool(body.get("return_token_ids"))
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        await response.write(_frame({**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                                          "logprobs": None, "finish_reason": None}],
                                     "prompt_token_ids": prompt if return_ids else None, "prompt_text": None}))
        stream = DecodeStream(skip_special_tokens=body.get("skip_special_tokens", True))  # chat's default: skip
        backend = self.tokenizer.backend_tokenizer
        eos, stops = self.tokenizer.eos_token_id, params["stop_token_ids"]
        cached = self.cache.lookup(prompt)
        self.publish(self.cache.store(prompt, cached // self.cache.block_size))  # its prefill's blocks
        produced: list[int] = entry["token_ids"]
        steps = self.engine.steps(prompt, params)
        try:
            async for token, *_ in steps:
                produced.append(token)
                finish = stop_reason = None
                if token in stops or (token == eos and not params["ignore_eos"]):
                    finish, stop_reason = "stop", (token if token in stops else None)
                elif len(produced) >= params["max_tokens"]:
                    finish = "length"
                text = "" if finish == "stop" else stream.step(backend, token) or ""  # the stop token has no text
                choice = {"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": finish}
                if finish:
                    choice.update(stop_reason=stop_reason, token_ids=[token] if return_ids else None,
                                  weight_versions=None)
                else:
                    choice["token_ids"] = [token] if return_ids else None
                chunk = {**head, "choices": [choice], "kv_transfer_params": None}
                if finish and not include_usage:  # else the usage chunk carries it
                    chunk["system_fingerprint"] = self.fingerprint
                await response.write(_frame(chunk))
                if finish:
                    break
        finally:
            await steps.aclose()
        self.publish(self.cache.store(prompt + produced[:-1], len(prompt) // self.cache.block_size))
        if include_usage:
            usage = {"prompt_tokens": len(prompt), "total_tokens": len(prompt) + len(produced),
                     "completion_tokens": len(produced), "prompt_tokens_details": {"cached_tokens": cached}}
            entry["usage"] = usage
            await response.write(_frame({**head, "choices": [], "usage": usage,
                                         "system_fingerprint": self.fingerprint}))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return "done"


class ChatDoubleProcess(DoubleProcess):
    """`python bench/_vllm_chat.py ...` as a child process."""

    program = (str(Path(__file__).resolve()),)


if __name__ == "__main__":
    main(double_class=ChatDouble, prog="python bench/_vllm_chat.py")
