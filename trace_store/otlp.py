"""What a span becomes on its way out over OTLP: whole, and a tool call's span with the tool's result.

The store keeps a conversation's later steps as what they add to the step before (chains.py) and
makes them whole when it reads; a collector (Tempo, Phoenix, any other) cannot. So where spans are
exported the tracer writes a continuing step's prompt and messages whole beside the deltas, the store
leaves the whole out (chains.compacted) and this leaves the deltas out (chains.exported).

An execute_tool span is made when the model calls the tool; the result comes back with the
conversation's next request, as an event of that request's render span. The store joins the two when
it writes them, but a collector takes a span once. So each execute_tool span is held here until its
result is known, then sent with `gen_ai.tool.call.result` (and the trace that brought it): from this
process's own render span, or from the store where another process sharing it served the next request
(--workers, several machines), asked every LOOKUP_SECONDS. A span whose result has not come within
WAIT_SECONDS, one pushed out by the bounds on what is held, and all of them at shutdown go without it.
Everything here runs on the OTLP sink's exporting thread, never on the serving path.

Beside them go a session's `invoke_agent` spans where more than one agent sent its requests: its
agent tree, as agent_spans.py builds it from the spans that pass here.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from typing import Callable

from opentelemetry.sdk.trace import ReadableSpan

from looptrace.common import attributes as attr

from .agent_spans import AgentSpans
from .chains import exported
from .processor import span_bytes

log = logging.getLogger("looptrace.trace")

WAIT_SECONDS = 600.0  # an agent's tool may run for minutes (a build, a test suite) before its result comes back
LOOKUP_SECONDS = 5.0  # how often the store is asked for the results of the spans held
MAX_HELD = 4096  # spans held at most…
MAX_HELD_BYTES = 64 << 20  # …and bytes (estimated as the queue estimates them): the oldest goes first

Lookup = Callable[[dict[str, tuple[str, str]]], dict[str, tuple[str, str | None]]]  # queries.tool_results


class Held:
    __slots__ = ("span", "since", "size", "ids")

    def __init__(self, span: ReadableSpan, since: float) -> None:
        self.span, self.since, self.size = span, since, span_bytes(span)
        self.ids = (format(span.context.trace_id, "032x"), format(span.context.span_id, "016x"))


class OutgoingSpans:
    """`take(batch)`: what to send now, from a batch the sink's queue gave; `due_in()`: seconds until
    something held is due without a new batch (None: nothing held)."""

    def __init__(self, *, hold: bool = True, lookup: Lookup | None = None, wait: float = WAIT_SECONDS,
                 lookup_every: float = LOOKUP_SECONDS, max_held: int = MAX_HELD, max_bytes: int = MAX_HELD_BYTES,
                 clock: Callable[[], float] = time.monotonic, agents: AgentSpans | None = None) -> None:
        self.hold = hold  # False where content is not recorded: no result would ever be added
        self.agents = agents if agents is not None else AgentSpans(clock=clock)  # the sessions' agent trees
        self._lookup, self._wait, self._lookup_every = lookup, wait, lookup_every
        self._max_held, self._max_bytes, self._clock = max_held, max_bytes, clock
        self._held: OrderedDict[str, Held] = OrderedDict()  # by call id, oldest first
        self.held_bytes = 0
        self._looked_up = clock()
        self._lookup_failing = False

    @property
    def held(self) -> int:
        return len(self._held) + self.agents.held

    def take(self, batch: list[ReadableSpan], everything: bool = False) -> list[ReadableSpan]:
        """What to send of `batch` and of what was held; `everything`: all that is held, result or not."""
        now, out = self._clock(), []
        for span in batch:
            out += self.agents.saw(span)
            attributes = span.attributes or {}
            call_id = attributes.get(attr.GEN_AI_TOOL_CALL_ID)
            if self.hold and call_id and span.name.startswith(attr.SPAN_EXECUTE_TOOL) and not everything:
                out += self._hold(str(call_id), Held(span, now))
                continue
            out += self._answered(span)
            whole = exported(attributes)
            out.append(span if whole is None else _with(span, whole))
        if self._held and self._lookup is not None and not everything and now - self._looked_up >= self._lookup_every:
            out += self._looked_up_results(now)
        out += self._expired(now, everything)
        return out + self.agents.take(everything)

    def due_in(self) -> float | None:
        agents = self.agents.due_in()
        if not self._held:
            return agents
        now, oldest = self._clock(), next(iter(self._held.values()))
        due = oldest.since + self._wait - now
        if self._lookup is not None:
            due = min(due, self._looked_up + self._lookup_every - now)
        return max(min(due, agents) if agents is not None else due, 0.0)

    def _hold(self, call_id: str, held: Held) -> list[ReadableSpan]:
        out = [self._release(call_id)] if call_id in self._held else []  # a call id again: the first goes
        self._held[call_id] = held
        self.held_bytes += held.size
        while len(self._held) > self._max_held or (self.held_bytes > self._max_bytes and len(self._held) > 1):
            out.append(self._release(next(iter(self._held))))
        return out

    def _release(self, call_id: str, result: str | None = None, result_trace: str | None = None) -> ReadableSpan:
        held = self._held.pop(call_id)
        self.held_bytes -= held.size
        if result is None:
            return held.span
        attributes = {**(held.span.attributes or {}), attr.GEN_AI_TOOL_CALL_RESULT: result}
        if result_trace:
            attributes[attr.TOOL_RESULT_TRACE_ID] = result_trace
        return _with(held.span, attributes)

    def _answered(self, span: ReadableSpan) -> list[ReadableSpan]:
        """The held calls whose results this span (a render span) brings: each linked to its call's span."""
        if not self._held or not span.events:
            return []
        linked = {(link.attributes or {}).get(attr.GEN_AI_TOOL_CALL_ID): link.context.span_id for link in span.links}
        out = []
        for event in span.events:
            if event.name != attr.EVENT_TOOL_RESULT:
                continue
            result = event.attributes or {}
            call_id, text = result.get(attr.GEN_AI_TOOL_CALL_ID), result.get(attr.TOOL_RESULT)
            held = self._held.get(call_id)
            if held is not None and isinstance(text, str) and linked.get(call_id) == held.span.context.span_id:
                out.append(self._release(call_id, text, format(span.context.trace_id, "032x")))
        return out

    def _looked_up_results(self, now: float) -> list[ReadableSpan]:
        """The results another process brought, as the store joined them."""
        self._looked_up = now
        try:
            found = self._lookup({call_id: held.ids for call_id, held in self._held.items()})
        except Exception as exc:  # noqa: BLE001 - a store that fails to answer only delays the results
            if not self._lookup_failing:
                log.warning("tool results for the OTLP export could not be read from the store: %s", exc)
            self._lookup_failing = True
            return []
        self._lookup_failing = False
        return [self._release(call_id, result, trace) for call_id, (result, trace) in found.items()
                if call_id in self._held]

    def _expired(self, now: float, everything: bool) -> list[ReadableSpan]:
        out = []
        while self._held:
            call_id, oldest = next(iter(self._held.items()))
            if not everything and now - oldest.since < self._wait:
                break
            out.append(self._release(call_id))
        return out


def _with(span: ReadableSpan, attributes: dict) -> ReadableSpan:
    """The same span with other attributes."""
    return ReadableSpan(name=span.name, context=span.context, parent=span.parent, resource=span.resource,
                        attributes=attributes, events=span.events, links=span.links, kind=span.kind,
                        status=span.status, start_time=span.start_time, end_time=span.end_time,
                        instrumentation_scope=span.instrumentation_scope)
