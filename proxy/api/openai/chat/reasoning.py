"""Thinking in Chat Completions, as each client asks for it and reads it.

Asked: vLLM's `chat_template_kwargs.enable_thinking` first, then OpenAI's `reasoning_effort`, then
OpenRouter's `reasoning: {enabled, effort, max_tokens, exclude}` (Cline and other clients of
OpenRouter-style providers). `max_tokens` turns thinking on or off (0 is off); no budget is held to.

Read: servers disagree on the delta field that carries thinking (vLLM's `reasoning_content`,
OpenRouter's and Ollama's `reasoning`), and clients read one or the other; some read both and show
it twice, some break on the one they do not expect. So the answer uses the field the client's own
history uses (a client sends back what it read), `reasoning` for a client that asked OpenRouter's
way, and both where nothing tells (a first turn without the OpenRouter field).
"""

from __future__ import annotations

from .protocol import ChatRequest

REASONING_CONTENT, REASONING = "reasoning_content", "reasoning"
BOTH = (REASONING_CONTENT, REASONING)


def thinking_of(chat: ChatRequest) -> bool | None:
    """Whether the request asks for thinking; None: the template's own default."""
    if chat.chat_template_kwargs and chat.chat_template_kwargs.enable_thinking is not None:
        return chat.chat_template_kwargs.enable_thinking
    if chat.reasoning_effort is not None:
        return chat.reasoning_effort != "none"
    options = chat.reasoning
    if options is None:
        return None
    if options.enabled is not None:
        return options.enabled
    if options.effort is not None:
        return options.effort != "none"
    if options.max_tokens is not None:
        return options.max_tokens > 0
    return True  # `reasoning: {}` (or only `exclude`) is OpenRouter's way of turning it on


def reasoning_fields(chat: ChatRequest) -> tuple[str, ...]:
    """The delta and message fields the answer's thinking goes out under."""
    for message in reversed(chat.messages):
        if message.role != "assistant":
            continue
        if message.reasoning_content is not None:
            return (REASONING_CONTENT,)
        if message.reasoning is not None:
            return (REASONING,)
    return (REASONING,) if chat.reasoning is not None else BOTH
