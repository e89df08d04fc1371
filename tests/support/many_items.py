"""Conversations and request bodies of many small items (issue 31): messages, content parts, tools,
schema properties, past calls and their arguments, each as small as it can be.

- `conversation()`: a hypothesis strategy of conversations in the engine's format (Hugging Face's
  messages and OpenAI tools), runs of small items of every kind with short texts chosen to merge
  with the template's own (whitespace, punctuation, markup typed as text): what the per-item lower
  bound on tokens (families/prompt_items.py) must never overestimate.
- `body(kind, n)`: a request body of `n` items of one kind, written as bytes by repetition, so that a
  test can send 2,000,000 of them without building them; `KINDS` are the kinds it writes.
- `bodies()`: a hypothesis strategy of such bodies, from a few items to far past every limit.
"""

from __future__ import annotations

from hypothesis import strategies as st

SMALL_TEXT = st.sampled_from(["", "a", " ", "\n", "\n\n", "x y", ":", '"', "{}", "<", "</", ">", "<think>", "é", "0"])
NAME = st.sampled_from(["", "a", "f", "_", "x.y", "<tool_call>"])
VALUE = st.one_of(SMALL_TEXT, st.sampled_from([0, 1, -1, 0.5, True, False, None, [], {}, [1], {"k": ""}]))


@st.composite
def conversation(draw, most: int = 40) -> tuple[list[dict], list[dict] | None]:
    """Runs of small messages of every role (assistants with calls), between user questions; tools
    with small schemas, or none."""
    messages: list[dict] = [{"role": "system", "content": draw(SMALL_TEXT)}] if draw(st.booleans()) else []
    for _ in range(draw(st.integers(1, 4))):
        messages.append({"role": "user", "content": "question " + draw(SMALL_TEXT)})
        role = draw(st.sampled_from(["user", "assistant", "tool", "calls"]))
        for _ in range(draw(st.integers(0, most))):
            if role == "calls":
                calls = [{"id": draw(NAME), "type": "function", "function": {
                    "name": draw(NAME), "arguments": draw(st.dictionaries(NAME, VALUE, max_size=4))}}
                    for _ in range(draw(st.integers(1, 3)))]
                messages.append({"role": "assistant", "content": draw(SMALL_TEXT), "tool_calls": calls})
            elif role == "tool":
                messages.append({"role": "tool", "tool_call_id": draw(NAME), "content": draw(SMALL_TEXT)})
            else:
                messages.append({"role": role, "content": draw(SMALL_TEXT)})
    messages.append({"role": "user", "content": "last " + draw(SMALL_TEXT)})
    if not draw(st.booleans()):
        return messages, None
    tools = []
    for _ in range(draw(st.integers(1, most))):
        properties = draw(st.dictionaries(NAME, st.sampled_from([{}, {"type": "string"}, {"type": "integer"}]),
                                          max_size=6))
        tools.append({"type": "function", "function": {"name": draw(NAME.filter(bool)), "parameters": {
            "type": "object", "properties": properties}}})
    return messages, tools


# -- request bodies ---------------------------------------------------------------------------------

KINDS = ("messages", "tools", "properties", "calls", "arguments", "parts", "input")
USER = '{"role": "user", "content": "a"}'


def _run(item: str, n: int) -> str:
    return ",".join([item] * n)


def body(kind: str, n: int, model: str) -> tuple[str, bytes]:
    """(path, body) of a request holding `n` items of `kind`, each as small as the API takes it."""
    chat, head = "/v1/chat/completions", f'{{"model": "{model}", "max_tokens": 4, '
    if kind == "messages":
        return chat, f'{head}"messages": [{_run(USER, n)}]}}'.encode()
    if kind == "tools":
        tool = '{"type": "function", "function": {"name": "f", "parameters": {}}}'
        return chat, f'{head}"messages": [{USER}], "tools": [{_run(tool, n)}]}}'.encode()
    if kind == "properties":
        properties = ",".join(f'"p{i}": {{}}' for i in range(n))
        tool = ('{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {'
                + properties + "}}}}")
        return chat, f'{head}"messages": [{USER}], "tools": [{tool}]}}'.encode()
    if kind in ("calls", "arguments"):
        arguments = "{" + ",".join(f'"k{i}": 1' for i in range(n if kind == "arguments" else 0)) + "}"
        call = '{"id": "c", "type": "function", "function": {"name": "f", "arguments": ' + arguments + "}}"
        calls = _run(call, n if kind == "calls" else 1)
        assistant = f'{{"role": "assistant", "content": null, "tool_calls": [{calls}]}}'
        return chat, f'{head}"messages": [{USER}, {assistant}, {USER}]}}'.encode()
    if kind == "parts":
        part = '{"type": "text", "text": "a"}'
        image = '{"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}'
        return chat, f'{head}"messages": [{{"role": "user", "content": [{image}, {_run(part, n)}]}}]}}'.encode()
    if kind == "input":
        return "/v1/responses", f'{{"model": "{model}", "max_output_tokens": 4, "input": [{_run(USER, n)}]}}'.encode()
    raise ValueError(kind)


def bodies(model: str) -> st.SearchStrategy:
    """(kind, n, path, body): a few items to far past every limit (16,384 messages, 4,096 tools, the
    body's 262,144 JSON values), sizes drawn around each bound."""
    sizes = st.sampled_from([1, 50, 4_096, 4_097, 16_384, 16_385, 65_537, 87_381, 87_382, 200_000, 600_000])
    return st.tuples(st.sampled_from(KINDS), sizes).map(lambda kn: (kn[0], kn[1], *body(kn[0], kn[1], model)))
