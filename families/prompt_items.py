"""What a conversation holds, counted before it is rendered: its messages, content parts, tools, the
keys of their schemas, past tool calls and the keys of their arguments. Each kind has a limit, and each
item adds at least some tokens through the family's own template.

Rendering walks every item in Python (the template is jinja) and the tokenizer then holds each token:
200,000 one-character messages took 15 s and 850 MB to be refused for the context, 200,000 tools 48 s
and 3 GB, because the bound before rendering counted the content's bytes alone. So the items are
counted first, in one walk that stops at a limit: past a kind's limit a request is refused at once,
whatever the context; under it, each item's least cost is added to the prompt's lower bound
(prompt_length.py), and a conversation of many small items that cannot fit is refused unrendered.

An item's least cost is measured once per family, on its own template: runs of 2 and of 6 empty items
rendered, the difference shared among the 4 (so what a run renders once, Gemma 4's one turn for
assistant messages in a row, is not counted per item), less one token for what an item's text may
merge with. A kind the template does not render (Gemma 4 drops a tool message no call precedes)
costs 0, and its limit alone bounds it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

# Kind → (the most a request may hold, the request field it is in). The limits are far past an agent's
# longest session and short of what renders in a few seconds (16,384 Qwen3.5 messages: about 2 s).
ITEM_LIMITS: dict[str, tuple[int, str]] = {
    "messages": (16_384, "messages"),
    "content parts": (16_384, "messages"),
    "tools": (4_096, "tools"),
    "keys in tool definitions": (65_536, "tools"),
    "past tool calls": (16_384, "messages"),
    "keys in past calls' arguments": (65_536, "messages"),
}
ROLES = ("system", "user", "assistant", "tool")
RUN, LONGER_RUN = 2, 6


class TooManyItems(ValueError):
    """More items of a kind than its limit: the message is for the client, `param` names the field."""

    def __init__(self, kind: str, limit: int, param: str) -> None:
        super().__init__(f"The request holds more than {limit:,} {kind}; at most {limit:,} are read.")
        self.kind, self.limit, self.param = kind, limit, param


class ItemCounts:
    """A conversation's items by kind (messages by role), counted in one walk that refuses at a limit."""

    __slots__ = ("roles", "kinds", "properties", "arguments")

    def __init__(self, messages: list[dict], tools: list[dict] | None) -> None:
        self.roles = dict.fromkeys(ROLES, 0)
        self.kinds = dict.fromkeys(ITEM_LIMITS, 0)
        self.properties = 0  # the keys of each tool's parameters' `properties`, which every template writes
        self.arguments = 0  # the keys of each past call's arguments, each written as one parameter
        for message in messages:
            self._add("messages", 1)
            role = message.get("role")
            if role in self.roles:
                self.roles[role] += 1
            content = message.get("content")
            if isinstance(content, list):
                self._add("content parts", len(content))
            for call in message.get("tool_calls") or ():
                self._add("past tool calls", 1)
                function = call.get("function") if isinstance(call, dict) else None
                arguments = function.get("arguments") if isinstance(function, dict) else None
                if isinstance(arguments, dict):
                    self.arguments += len(arguments)
                    self._keys("keys in past calls' arguments", arguments)
        for tool in tools or ():
            self._add("tools", 1)
            function = tool.get("function") if isinstance(tool, dict) else None
            parameters = function.get("parameters") if isinstance(function, dict) else None
            properties = parameters.get("properties") if isinstance(parameters, dict) else None
            if isinstance(properties, dict):
                self.properties += len(properties)
            self._keys("keys in tool definitions", tool)

    def _add(self, kind: str, n: int) -> None:
        count = self.kinds[kind] = self.kinds[kind] + n
        limit, param = ITEM_LIMITS[kind]
        if count > limit:
            raise TooManyItems(kind, limit, param)

    def _keys(self, kind: str, value: object) -> None:
        """The keys of every object in `value`, at any depth (the API bounds the depth)."""
        stack = [value]
        while stack:
            item = stack.pop()
            if isinstance(item, dict):
                self._add(kind, len(item))
                stack.extend(v for v in item.values() if isinstance(v, (dict, list)))
            elif isinstance(item, list):
                stack.extend(v for v in item if isinstance(v, (dict, list)))


class ItemCosts:
    """The fewest tokens one item of each kind adds through a family's template (see the module's note)."""

    __slots__ = ("roles", "tool", "property", "call", "argument")

    def __init__(self, count: Callable[[list[dict], list[dict] | None], int]) -> None:
        """`count(messages, tools)`: the rendered prompt's length in tokens (raises if refused)."""
        ask = {"role": "user", "content": "a"}

        def each(shapes: Callable[[int], Iterable[tuple[list[dict], list[dict] | None]]]) -> int:
            least = None
            for few, more in zip(shapes(RUN), shapes(LONGER_RUN)):
                try:
                    added = (count(*more) - count(*few)) // (LONGER_RUN - RUN)
                except Exception:  # noqa: BLE001 - a template that refuses the shape: nothing is assumed
                    return 0
                least = added if least is None else min(least, added)
            return max(0, (least or 0) - 1)

        def messages(role: str) -> Callable[[int], list]:
            extra = {"tool_call_id": ""} if role == "tool" else {}
            return lambda n: [([ask, *[{"role": role, "content": "", **extra}] * n, ask], None)]

        def calls(arguments: Callable[[int], dict], n_calls: Callable[[int], int]) -> Callable[[int], list]:
            def shapes(n: int) -> list:
                call = {"type": "function", "function": {"name": "", "arguments": arguments(n)}}
                return [([ask, {"role": "assistant", "content": "", "tool_calls": [call] * n_calls(n)}, ask], None)]
            return shapes

        def keys(n: int, value: object) -> dict:
            return {chr(ord("a") + i): value for i in range(n)}

        tool = {"type": "function", "function": {"name": "f", "parameters": {}}}
        self.roles = {role: each(messages(role)) for role in ROLES}
        self.tool = each(lambda n: [([ask], [tool] * n)])
        self.property = each(lambda n: [([ask], [{"type": "function", "function": {
            "name": "f", "parameters": {"type": "object", "properties": keys(n, {})}}}])])
        self.call = each(calls(lambda n: {}, lambda n: n))
        self.argument = min(each(calls(lambda n, v=v: keys(n, v), lambda n: 1)) for v in ("", 0))

    def tokens(self, counts: ItemCounts) -> int:
        """The least the counted items add to the prompt, however their text reads."""
        return (sum(n * self.roles[role] for role, n in counts.roles.items())
                + counts.kinds["tools"] * self.tool + counts.properties * self.property
                + counts.kinds["past tool calls"] * self.call + counts.arguments * self.argument)
