"""A session's agents as `invoke_agent` spans, made on the way out over OTLP: the tree Phoenix draws.

Each request stays its own trace (the store, the viewer, forks and every link name a step by its trace
id), so a subagent's requests cannot be children of its parent's: a span's parent is in its own trace.
Beside them, each session whose requests came from more than one agent (a subagent, or a side request
its harness labels) gets one more trace, its agent tree:

    invoke_agent main                    the main agent: its steps' extent, its first input, last answer
    ├── invoke_agent Explore             a subagent, under the agent that spawned it
    │   └── invoke_agent general-purpose its own subagent
    └── invoke_agent review              a side request's kind

Each agent span links to its steps' request spans (and names their trace ids), a subagent's to the
`execute_tool` span of its parent's call that spawned it (the rule of agent_tree.py). The ids are
derived from the tenant, the session and the agent, so any process serving a session's requests names
the same spans. The spans never reach the store (it answers the tree itself: agent_tree.py); they are
built here from the spans the OTLP sink sends, on its exporting thread, never on the serving path.

An agent span is sent once its agent and every agent under it have been quiet for QUIET_SECONDS (a
span is sent whole, once: Phoenix keeps the first it receives of a span id), all of them at shutdown.
Steps an agent takes after its span went are not in it; a subagent spawned later still nests under it.
A session of the main agent alone sends none: its requests are the whole story.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from typing import Callable

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import Link, SpanContext, SpanKind, TraceFlags

from looptrace.common import attributes as attr

from .agent_tree import MAIN, SPAWNING_TOOLS

QUIET_SECONDS = 60.0  # an agent's subtree quiet this long: its span goes
MAX_SESSIONS = 1024  # sessions followed at most (the least recently active goes first, its spans sent)
MAX_AGENTS = 256  # agents of one session at most; later ones are not drawn (their requests still are)
MAX_STEPS_NAMED = 64  # steps an agent span links to and names at most (it counts them all)
MAX_CALLS_AWAITED = 4096  # traces whose tool calls are kept until their request span comes
RECENT_CALLS = 16  # an agent's last steps with tool calls, where its subagents' spawning call is looked for
SAMPLED = TraceFlags(TraceFlags.SAMPLED)
# Copied from an agent's first step: the harness's own words for it.
AGENT_WORDS = (attr.AGENT_ID, attr.AGENT_PARENT_ID, attr.AGENT_TYPE, attr.AGENT_SIDE)


def _id(bits: int, *parts: str) -> int:
    digest = hashlib.sha256("\0".join(("looptrace agents", *parts)).encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:bits // 8], "big") or 1


def agent_trace_id(tenant: str | None, session: str) -> int:
    """The trace id of a session's agent tree (the same on every process serving it)."""
    return _id(128, tenant or "", session)


def agent_span_id(tenant: str | None, session: str, agent: str) -> int:
    return _id(64, tenant or "", session, agent)


class Agent:
    __slots__ = ("id", "name", "parent", "span_id", "start", "end", "steps", "named", "input", "output", "words",
                 "spawned_by", "calls", "sent")

    def __init__(self, agent: str, parent: Agent | None, span_id: int) -> None:
        self.id, self.name, self.parent, self.span_id = agent, agent, parent, span_id
        self.start = self.end = 0  # ns: its steps' and its subagents' extent (0: none yet)
        self.steps = 0
        self.named: list[tuple[int, int]] = []  # (trace id, span id) of its first steps' request spans
        self.input: str | None = None  # its first step's input.value, its last step's output.value
        self.output: str | None = None
        self.words: dict = {}
        self.spawned_by: tuple[int, int, str] | None = None  # the spawning execute_tool span: trace, span, call id
        self.calls: list[tuple[int, int, list[tuple[int, str, str]]]] = []  # (start, trace, [(span, call id, name)])
        self.sent = False

    def covers(self, start: int, end: int) -> None:
        self.start = min(self.start, start) if self.start else start
        self.end = max(self.end, end)

    def spawning_call(self, before: int) -> tuple[int, int, str] | None:
        """The call of this agent's that spawned a subagent first heard at `before` (agent_tree.py's rule)."""
        fallback = None
        for start, trace, calls in reversed(self.calls):
            if start >= before:
                continue
            for span, call_id, name in calls:
                if name in SPAWNING_TOOLS:
                    return trace, span, call_id
            fallback = fallback or (trace, calls[-1][0], calls[-1][1])
        return fallback


class Tree:
    """One session's agents, as this process has seen them."""

    def __init__(self, tenant: str | None, session: str, request: ReadableSpan) -> None:
        self.tenant, self.session = tenant, session
        self.trace_id = agent_trace_id(tenant, session)
        self.resource, self.scope = request.resource, request.instrumentation_scope
        self.agents: dict[str, Agent] = {}
        self.waiting = 0  # its agents whose spans wait to be sent

    def agent(self, attributes, start: int) -> Agent | None:
        """The agent of a request with these attributes, made (under its parent) the first time it is seen."""
        name = str(attributes.get(attr.GEN_AI_AGENT_ID, MAIN))
        found = self.agents.get(name)
        if found is not None or len(self.agents) >= MAX_AGENTS:
            return found
        parent = None
        if name != MAIN:
            parent = self.agents.get(str(attributes.get(attr.AGENT_PARENT_ID))) or self.agent({}, start)
        found = self.agents[name] = Agent(name, parent, agent_span_id(self.tenant, self.session, name))
        found.name = str(attributes.get(attr.GEN_AI_AGENT_NAME) or name)
        found.words = {k: attributes[k] for k in AGENT_WORDS if k in attributes}
        if parent is not None:
            found.spawned_by = parent.spawning_call(start)
        return found

    def span(self, agent: Agent) -> ReadableSpan:
        context = SpanContext(self.trace_id, agent.span_id, is_remote=False, trace_flags=SAMPLED)
        parent = agent.parent and SpanContext(self.trace_id, agent.parent.span_id, is_remote=False, trace_flags=SAMPLED)
        attributes = {attr.GEN_AI_OPERATION_NAME: attr.SPAN_INVOKE_AGENT, attr.GEN_AI_PROVIDER_NAME: "looptrace",
                      attr.GEN_AI_AGENT_ID: agent.id, attr.GEN_AI_AGENT_NAME: agent.name,
                      attr.GEN_AI_CONVERSATION_ID: self.session, attr.OPENINFERENCE_SPAN_KIND: "AGENT",
                      **agent.words, attr.AGENT_STEPS: agent.steps,
                      attr.AGENT_STEP_TRACE_IDS: [format(trace, "032x") for trace, _ in agent.named]}
        if self.tenant:
            attributes[attr.TENANT] = self.tenant
        if agent.input is not None:
            attributes.update({attr.INPUT_VALUE: agent.input, attr.INPUT_MIME_TYPE: "text/plain"})
        if agent.output is not None:
            attributes.update({attr.OUTPUT_VALUE: agent.output, attr.OUTPUT_MIME_TYPE: "text/plain"})
        links = [Link(SpanContext(trace, span, is_remote=False, trace_flags=SAMPLED), {attr.LINK: "step"})
                 for trace, span in agent.named]
        if agent.spawned_by is not None:
            trace, span, call_id = agent.spawned_by
            attributes.update({attr.AGENT_SPAWNED_BY_TRACE_ID: format(trace, "032x"),
                               attr.AGENT_SPAWNED_BY_TOOL_CALL_ID: call_id})
            links.append(Link(SpanContext(trace, span, is_remote=False, trace_flags=SAMPLED),
                              {attr.LINK: "spawned_by"}))
        return ReadableSpan(name=f"{attr.SPAN_INVOKE_AGENT} {agent.name}", context=context, parent=parent or None,
                            resource=self.resource, attributes=attributes, links=links, kind=SpanKind.INTERNAL,
                            start_time=agent.start, end_time=max(agent.end, agent.start),
                            instrumentation_scope=self.scope)


class AgentSpans:
    """`saw(span)`: each span the sink sends; `take(everything)`: the agent spans due now (`everything`:
    all, at shutdown); `due_in()`: seconds until one may be (None: none waits); `held`: spans waiting."""

    def __init__(self, *, quiet: float = QUIET_SECONDS, max_sessions: int = MAX_SESSIONS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._quiet, self._max_sessions, self._clock = quiet, max_sessions, clock
        self._trees: OrderedDict[tuple[str | None, str], Tree] = OrderedDict()  # least recently active first
        self._waiting: OrderedDict[tuple[Tree, Agent], float] = OrderedDict()  # unsent, by last activity
        self._calls: OrderedDict[int, list[tuple[int, str, str]]] = OrderedDict()  # trace → its tool calls
        self.held = 0  # agent spans waiting to be sent (a lone main agent's is none: nothing would be)

    def saw(self, span: ReadableSpan) -> list[ReadableSpan]:
        """Notes a request span (its agent's step) or a tool call's; returns spans the bounds pushed out."""
        attributes = span.attributes or {}
        if span.name.startswith(attr.SPAN_EXECUTE_TOOL) and attributes.get(attr.GEN_AI_TOOL_CALL_ID):
            call_id, name = str(attributes[attr.GEN_AI_TOOL_CALL_ID]), attributes.get(attr.GEN_AI_TOOL_NAME)
            self._calls.setdefault(span.context.trace_id, []).append((span.context.span_id, call_id, name))
            while len(self._calls) > MAX_CALLS_AWAITED:
                self._calls.popitem(last=False)
            return []
        session = attributes.get(attr.GEN_AI_CONVERSATION_ID)
        if attr.ENDPOINT not in attributes or not session:
            return []
        key = (attributes.get(attr.TENANT), str(session))
        tree = self._trees.get(key)
        out = []
        if tree is None:
            tree = self._trees[key] = Tree(key[0], key[1], span)
            while len(self._trees) > self._max_sessions:
                out += self._release_tree(self._trees.popitem(last=False)[1])
        self._trees.move_to_end(key)
        alone = len(tree.agents) < 2
        agent = tree.agent(attributes, span.start_time)
        if alone and len(tree.agents) > 1:  # a subagent came: what waited of the main agent is to be sent
            self.held += tree.waiting
        if agent is not None:
            self._step(tree, agent, span, attributes)
        return out

    def _step(self, tree: Tree, agent: Agent, span: ReadableSpan, attributes) -> None:
        trace = span.context.trace_id
        calls = self._calls.pop(trace, None)
        if calls:
            agent.calls = [*agent.calls[-RECENT_CALLS + 1:], (span.start_time, trace, calls)]
        agent.steps += 1
        if len(agent.named) < MAX_STEPS_NAMED:
            agent.named.append((trace, span.context.span_id))
        if agent.input is None and attributes.get(attr.INPUT_VALUE) is not None:
            agent.input = str(attributes[attr.INPUT_VALUE])
        if attributes.get(attr.OUTPUT_VALUE) is not None:
            agent.output = str(attributes[attr.OUTPUT_VALUE])
        now, above = self._clock(), agent
        while above is not None:  # a parent covers its subagents, and waits for them
            above.covers(span.start_time, span.end_time or span.start_time)
            if not above.sent:
                if (tree, above) not in self._waiting:
                    tree.waiting += 1
                    self.held += len(tree.agents) > 1
                self._waiting[(tree, above)] = now
                self._waiting.move_to_end((tree, above))
            above = above.parent

    def take(self, everything: bool = False) -> list[ReadableSpan]:
        now, out = self._clock(), []
        while self._waiting:
            (tree, agent), active = next(iter(self._waiting.items()))
            if not everything and now - active < self._quiet:
                break
            out += self._send(tree, agent)
        return out

    def due_in(self) -> float | None:
        if not self._waiting:
            return None
        return max(next(iter(self._waiting.values())) + self._quiet - self._clock(), 0.0)

    def _send(self, tree: Tree, agent: Agent) -> list[ReadableSpan]:
        """An agent's span, no longer waiting; none for a main agent alone (until a subagent comes)."""
        del self._waiting[(tree, agent)]
        tree.waiting -= 1
        if len(tree.agents) < 2:
            return []
        self.held -= 1
        agent.sent = True
        return [tree.span(agent)]

    def _release_tree(self, tree: Tree) -> list[ReadableSpan]:
        return [span for agent in list(tree.agents.values()) if (tree, agent) in self._waiting
                for span in self._send(tree, agent)]
