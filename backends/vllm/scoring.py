"""Teacher-forced scoring on a vLLM server, for the vLLM backend: the request prompt_logprobs.py
writes, sent to one of the servers, its answer read there; a refusal's own words passed on."""

from __future__ import annotations

import json

import aiohttp

from ..base import BackendError, TokenScore
from . import protocol
from .prompt_logprobs import read_scores, score_body
from .upstream import Upstream, describe


async def score_on(up: Upstream, prompt_ids: list[int], answer_ids: list[int],
                   cache_salt: str | None = None) -> list[TokenScore]:
    if len(prompt_ids) + len(answer_ids) + 1 > up.max_model_len:  # + the one token vLLM must generate
        raise BackendError(f"{len(prompt_ids)} prompt tokens and {len(answer_ids)} answer tokens do not fit in the "
                           f"context of {up.max_model_len}", status=400, code="context_length_exceeded")
    data = json.dumps(protocol.salted(score_body(up.model, prompt_ids, answer_ids), cache_salt)).encode()
    headers = {**up.headers, "Content-Type": "application/json"}
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=up.timeout, sock_read=up.timeout)
    up.running += 1
    try:
        async with await up.send(protocol.COMPLETIONS, data, headers, timeout) as response:
            text = await response.text()
            status = response.status
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise BackendError(f"cannot score on the vLLM server at {up.url}: {describe(exc)}", status=502,
                           code="upstream_unreachable") from exc
    finally:
        up.running -= 1
    try:
        body = json.loads(text)
    except json.JSONDecodeError:
        body = None
    if status != 200:  # its refusal's own words are the useful part
        message = protocol.error_message(body, text.strip())
        raise BackendError(f"the vLLM server at {up.url} refused to score ({status}): {message}",
                           status=400 if status < 500 else 502, code="upstream_rejected")
    try:
        return read_scores(body, len(prompt_ids), answer_ids)
    except (ValueError, KeyError, TypeError) as exc:
        raise BackendError(f"the vLLM server at {up.url} answered the scoring request in a shape looptrace cannot "
                           f"read: {exc}", status=502, code="upstream_protocol") from exc
