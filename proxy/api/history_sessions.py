"""Sessions for clients that name none (Gemini CLI, Copilot CLI on Chat Completions, Cline, the agent
SDKs): a request joins the session whose last prompt and answer its messages start with, else it
starts one named by its own trace id.

Each tenant has a bounded LRU of digests (never the text), each to a session key:
- the history a turn was asked, extended by the answer looptrace gave: a request whose messages
  start with it continues that turn;
- each tool call id looptrace minted in an answer (`call_…`, 128 random bits: families/base.py
  new_id): a request that sends one back is that session's, even where the client rewrote the
  history around it (a compacted or trimmed system prompt).

The messages are read as a sequence of units (an assistant's text, each of its calls, every other
message whole), each digested as canonical JSON (keys sorted), the history as a chain of BLAKE2b
over them: so an answer split by a client into several assistant messages, or its arguments
re-serialized, reads the same. A turn walks its request's messages once (the client sends them all);
what it keeps costs only its answer's units, chained on from there. A unit of strings alone (a
message's text, an answer's text) is digested once: its digest is kept by its text, per tenant and
bounded by bytes, so that a long session's turn writes as JSON only what it adds.

The map is this process's memory: with `--workers` a turn that lands on another worker starts a
session of its own (the headers in clients.py group across workers; these are a fallback).
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict

from looptrace.common.byte_bounded import ByteBounded

from ..engine.observer import Generation, Observer

MAX_ENTRIES = 4096  # digests kept per tenant
MAX_BYTES = 1 << 20  # and their bytes (session keys included), per tenant
MAX_TENANTS = 1024  # tenants with a map: the least recently served one's is dropped first
ENTRY_OVERHEAD = 120  # bytes an entry costs beyond its key's text (two 16-byte digests, the dict's slot)
MAX_UNIT_BYTES = 64 << 20  # units' text kept with their digests, every tenant together (about: 4 bytes a character)

HISTORY = "history"  # the grouping recorded (attr.SESSION_GROUPED_BY) for a request that named no session


def _digest(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=16).digest()


def _canonical(value) -> bytes:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"),
                      default=str).encode("utf-8", "surrogatepass")


def _arguments(arguments):
    """A call's arguments as a value: a client may send back the JSON with other spacing or order."""
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments


def _text(content) -> str:
    """An assistant's text, spacing aside (a client may trim it or join its parts)."""
    if isinstance(content, list):
        content = "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
    return " ".join(content.split()) if isinstance(content, str) else ""


def _call_unit(call_id, name, arguments) -> list:
    return ["call", call_id, name, _arguments(arguments)]


def units(message: dict) -> list[list]:
    """A message as the units its digest chain is made of: an assistant's text (when it has any) and
    each of its calls; any other message whole (role, content, the call it answers)."""
    role, content = message.get("role"), message.get("content")
    if role != "assistant":
        return [[role, content, message.get("tool_call_id")]]
    found = [["text", text]] if (text := _text(content)) else []
    for call in message.get("tool_calls") or ():
        if isinstance(call, dict):
            function = call.get("function") or {}
            found.append(_call_unit(call.get("id"), function.get("name"), function.get("arguments")))
    return found


def _chain(start: bytes, unit: list) -> bytes:
    return _digest(start + _digest(_canonical(unit)))


class _UnitDigests:
    """Each tenant's units of strings alone (and None), their digest kept by their text, least recently
    used out past a bound on bytes. Only such units: equal strings are the same JSON, where an equal
    number may not be (1, 1.0 and true are equal in Python), so any other unit is digested each time."""

    def __init__(self, max_bytes: int) -> None:
        self._kept: ByteBounded[bytes] = ByteBounded(max_bytes)

    def digest(self, tenant: str | None, unit: list) -> bytes:
        if not all(type(part) is str or part is None for part in unit):
            return _digest(_canonical(unit))
        key = (tenant, tuple(unit))
        found = self._kept.get(key)
        if found is None:
            found = _digest(_canonical(unit))
            self._kept.put(key, found, ENTRY_OVERHEAD + 4 * sum(len(part) for part in unit if part))
        return found


class _TenantMap:
    """One tenant's digests → session keys, least recently used dropped first, bounded by count and bytes."""

    def __init__(self) -> None:
        self.entries: OrderedDict[bytes, str] = OrderedDict()
        self.bytes = 0

    def get(self, key: bytes) -> str | None:
        session = self.entries.get(key)
        if session is not None:
            self.entries.move_to_end(key)
        return session

    def put(self, key: bytes, session: str) -> None:
        old = self.entries.pop(key, None)
        if old is not None:
            self.bytes -= ENTRY_OVERHEAD + len(old)
        self.entries[key] = session
        self.bytes += ENTRY_OVERHEAD + len(session)
        while len(self.entries) > MAX_ENTRIES or self.bytes > MAX_BYTES:
            _, dropped = self.entries.popitem(last=False)
            self.bytes -= ENTRY_OVERHEAD + len(dropped)


class HistorySessions:
    """Every tenant's map (tenant None: the operator's, or an open server's)."""

    def __init__(self) -> None:
        self._tenants: OrderedDict[str | None, _TenantMap] = OrderedDict()
        self._units = _UnitDigests(MAX_UNIT_BYTES)

    def _map(self, tenant: str | None) -> _TenantMap:
        found = self._tenants.get(tenant)
        if found is None:
            found = self._tenants[tenant] = _TenantMap()
            while len(self._tenants) > MAX_TENANTS:
                self._tenants.popitem(last=False)
        self._tenants.move_to_end(tenant)
        return found

    def join(self, tenant: str | None, messages: list[dict], trace_id: str) -> Grouping:
        """The session `messages` continue (None: a new one, named by `trace_id`), and what to keep of
        the answer once it is given."""
        known = self._map(tenant)
        chain, found, calls = b"", None, None
        flat = [u for m in messages for u in units(m)]
        for n, unit in enumerate(flat):
            chain = _digest(chain + self._units.digest(tenant, unit))
            if unit[0] == "call" and isinstance(unit[1], str):
                calls = known.get(b"c" + _digest(unit[1].encode("utf-8", "surrogatepass"))) or calls
            if unit[0] in ("text", "call") and (n + 1 == len(flat) or flat[n + 1][0] not in ("text", "call")):
                found = known.get(b"h" + chain) or found  # the end of an answer: the longest known history wins
        session = found or calls
        return Grouping(self, tenant, chain, session or f"trace:{trace_id}", joined=session is not None)

    def keep(self, tenant: str | None, chain: bytes, answer: list[list], session: str) -> None:
        known = self._map(tenant)
        for unit in answer:
            chain = _chain(chain, unit)
            if unit[0] == "call" and isinstance(unit[1], str):
                known.put(b"c" + _digest(unit[1].encode("utf-8", "surrogatepass")), session)
        if answer:
            known.put(b"h" + chain, session)


class Grouping(Observer):
    """A request's session as its history says, and the observer that keeps its answer for the next turn."""

    def __init__(self, sessions: HistorySessions, tenant: str | None, chain: bytes, session: str,
                 joined: bool) -> None:
        self.sessions, self.tenant, self.chain = sessions, tenant, chain
        self.session, self.joined = session, joined

    def finished(self, generation: Generation) -> None:
        """The answer is complete, before the client hears its end: the next turn can find it."""
        answer = [["text", text]] if (text := _text("".join(generation.text))) else []
        answer += [_call_unit(c["id"], c["name"], c["arguments"]) for c in generation.tool_calls]
        self.sessions.keep(self.tenant, self.chain, answer, self.session)
