"""POST /v1/score: what a replay asks of a looptrace server in forced mode (`looptrace replay --target`).

    {"prompt_ids": [...], "answer_ids": [...], "model"}

Each answer token's logprob, rank and the model's greedy choice, read in one prefill (the backend's
`score`, teacher forced: nothing generated). Ids in the served model's vocabulary (a replay sends a
recorded prompt as it was, never re-tokenized); `model`, if given, must be the one served. Traced as
a request of its own."""

from __future__ import annotations

from aiohttp import web

from looptrace.common import attributes as attr
from looptrace.common.jsonio import dumps

from ..errors import invalid
from ..protocol import parse
from ..serving import traced
from ..validation import json_body
from .protocol import ScoreRequest
from .stored_run import cache_salt_of, ready_for, token_ids


async def score(request: web.Request) -> web.Response:
    async with traced(request, attr.ENDPOINT_SCORE) as trace:
        body = parse(ScoreRequest, await json_body(request))
        runtime = await ready_for(request, body.model, "score", "scoring")
        trace.requested(runtime.model_name, stream=False, conversation=None)
        trace.checked()
        prompt, answer = token_ids(body.prompt_ids, "prompt_ids", runtime), \
            token_ids(body.answer_ids, "answer_ids", runtime)
        if not prompt or not answer:
            raise invalid("'prompt_ids' and 'answer_ids' must each hold at least one token.",
                          param="prompt_ids" if not prompt else "answer_ids")
        if len(prompt) + len(answer) - 1 > runtime.max_model_len:
            raise invalid(f"{len(prompt)} prompt tokens and {len(answer)} answer tokens do not fit in this model's "
                          f"context of {runtime.max_model_len}.", param="answer_ids", code="context_length_exceeded")
        scores = await runtime.backend.score(prompt, answer, cache_salt_of(request))
        pieces = runtime.vocab.pieces
        return web.json_response({
            "object": "score", "model": runtime.model_name, "trace_id": trace.trace_id,
            "backend": runtime.backend.name,
            # Each token's piece, so a caller can tell that the ids mean in this vocabulary what they meant in its own.
            "tokens": [{**s, "piece": pieces[s["id"]], "greedy_piece": pieces[s["greedy_id"]]} for s in scores],
        }, dumps=dumps)
