"""What the MCP tools' results are made of: stored text bounded for an agent to read, a step's messages
as lines, times as ISO 8601.

Everything from the store is a client's text (a prompt can hold anything): it goes out as the text of
a result, which the SDK writes as a JSON string (newlines, quotes and control characters escaped: it
cannot end a JSON-RPC message). What is done here is only what JSON cannot carry: a lone surrogate
becomes U+FFFD, so no message fails to be encoded.
"""

from __future__ import annotations

import math
import re
from datetime import datetime, timezone

from looptrace.common.jsonio import dumps, loads


_SURROGATE = re.compile("[\ud800-\udfff]")  # a code point UTF-8 cannot encode


class Refused(ValueError):
    """A tool's argument that cannot be used: said to the agent as the tool's error."""


def clean(text: object) -> str:
    """Text that UTF-8 (and so JSON) can carry whatever the store held."""
    value = text if isinstance(text, str) else "" if text is None else str(text)
    return value if value.isascii() else _SURROGATE.sub("\ufffd", value)


def elided(text: object, limit: int, *, head: float = 0.4) -> str:
    """`text` within `limit` characters: its start and its end (a prompt's latest turn is at its end),
    and between them how much was left out, "[… 48,113 characters elided …]"."""
    value = clean(text)
    if len(value) <= limit:
        return value
    first = int(limit * head)
    last = limit - first
    gone = len(value) - first - last
    return f"{value[:first]}\n[… {gone:,} characters elided …]\n{value[len(value) - last:]}"


def one_line(text: object, limit: int = 120) -> str:
    """A short value on one line (a key, an argument, a token's piece): newlines shown as \\n."""
    value = clean(text).replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")
    return value if len(value) <= limit else f"{value[:limit]}[… {len(value) - limit:,} more]"


def when(ns: int | None) -> str:
    if not ns:
        return "?"
    return datetime.fromtimestamp(ns / 1e9, timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def since_ns(value: str) -> int | None:
    """Unix seconds or an ISO 8601 time (a zone, else UTC) → nanoseconds; "" → None."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            if not value.isascii():  # fromisoformat reads other scripts' digits too
                raise ValueError(value)
            moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise Refused(f"since {one_line(value, 40)!r} is not Unix seconds or an ISO 8601 time") from None
        seconds = (moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)).timestamp()
    if not (math.isfinite(seconds) and 0 <= seconds < 9.2e9):
        raise Refused("since must be a time between 1970 and 2262")
    return int(seconds * 1e9)


def part_text(part: dict, limit: int) -> str:
    """One part of a message in the GenAI conventions' shape, as a line or a few."""
    kind = part.get("type")
    if kind == "tool_call":
        return f"→ call {one_line(part.get('name'), 80)}({elided(_json_text(part.get('arguments')), limit)})"
    if kind == "tool_call_response":
        return f"← result: {elided(_json_text(part.get('response')), limit)}"
    if kind == "reasoning":
        return f"(thinking) {elided(part.get('content'), limit)}"
    if "content" in part:
        return elided(part.get("content"), limit)
    return f"[{one_line(kind, 40)} part]"


def messages_text(messages: list | None, limit: int) -> list[str]:
    """Messages as "[role] text" lines, each part within `limit` characters."""
    lines = []
    for message in messages or ():
        if not isinstance(message, dict):
            continue
        role = one_line(message.get("role") or "?", 40)
        for part in message.get("parts") or ():
            if isinstance(part, dict):
                lines.append(f"[{role}] {part_text(part, limit)}")
    return lines


def json_attribute(value) -> list | None:
    """A span attribute that holds JSON text (the GenAI messages), read; None where it is not."""
    if not isinstance(value, str):
        return value if isinstance(value, list) else None
    try:
        found = loads(value)
    except ValueError:
        return None
    return found if isinstance(found, list) else None


def _json_text(value) -> str:
    return value if isinstance(value, str) else dumps(value)
