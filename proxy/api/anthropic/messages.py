"""POST /v1/messages (Anthropic's Messages API, which Claude Code speaks) and
POST /v1/messages/count_tokens. Errors on these routes leave in Anthropic's shape (errors.py)."""

from __future__ import annotations

from dataclasses import replace

from aiohttp import web

from looptrace.common import attributes as attr

from ...engine.request import GenerationRequest
from ..keys import RUNTIME
from ..serving import collected, prepared, streamed, traced
from ..validation import json_body
from . import context_edits
from .answer import MessageCollector
from .request import MessagesOptions, parse_messages
from .stream import MessageStream


async def create_message(request: web.Request) -> web.StreamResponse:
    async with traced(request, attr.ENDPOINT_MESSAGES) as trace:
        body = await json_body(request)
        generation_request, options = parse_messages(body)
        generation_request, applied = await edited(request, body, generation_request, options)
        generation = await prepared(request, trace, body, generation_request, model=options.model,
                                    stream=options.stream)
        shown = {"token_ids": options.token_ids, "thinking_shown": options.thinking_shown, "applied_edits": applied}
        if options.stream:
            return await streamed(request, trace, generation, MessageStream(options.model, **shown))
        return await collected(trace, generation, MessageCollector(options.model, **shown))


async def edited(request: web.Request, body: dict, generation: GenerationRequest,
                 options: MessagesOptions) -> tuple[GenerationRequest, list[dict] | None]:
    """The request with its context_management edits applied (context_edits.py), and what they
    cleared; (it, None) when it asks for none. An edit triggered by input tokens waits on the unedited
    prompt's count (rendered once more, untraced) unless the body is too short to reach it."""
    management = options.context_management
    if management is None:
        return generation, None
    tokens = None
    if context_edits.needs_prompt_tokens(management, request.content_length):
        tokens = (await prepared(request, None, body, generation, model=options.model, stream=False)).prompt_tokens
    count = context_edits.counter(request.app[RUNTIME].tokenizer)
    result = context_edits.apply(management, generation.messages, count, tokens)
    if result.messages is not generation.messages:
        generation = replace(generation, messages=result.messages)  # its media plan made again, of these
    return generation, result.applied


async def count_tokens(request: web.Request) -> web.Response:
    """The prompt's tokens as the model would read them: rendered with the template, tools and
    thinking, images included, after the context edits the body asks for. Not traced: nothing is
    generated."""
    body = await json_body(request)
    generation_request, options = parse_messages(body, counting=True)
    generation_request, _ = await edited(request, body, generation_request, options)
    generation = await prepared(request, None, body, generation_request, model=options.model, stream=False)
    return web.json_response({"input_tokens": generation.prompt_tokens})
