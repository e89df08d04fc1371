"""Which agent of a session sent a request, and the conversation line its turns belong to.

A harness's subagents and side requests (titles, summaries, reviews, compactions) arrive in the main
agent's session. Each agent is its own conversation line: token continuity, the engine's memory of
the last turn, the render cache and compaction are keyed by the line, so a subagent's turns neither
fork the main agent's nor are forks themselves. The session stays the grouping the viewer shows.

    main agent        line = session
    subagent a1       line = session#agent:a1     (clients.py's subagent_of: Claude Code's, codex's headers)
    side request      line = session#side:KIND    (below: what the harness labels it)
"""

from __future__ import annotations

from collections.abc import Mapping

from looptrace.common import attributes as attr

MAX_LABEL_CHARS = 256
MAIN = "main"  # the main agent's id where its harness names none

# Claude Code (2.1.x) labels each request's class; a side request's kind is its auxiliary type where
# it says one. codex labels a side request with x-openai-subagent and no parent thread (a spawned
# child sends its parent's: a subagent, clients.py).
CLAUDE_CLASS, CLAUDE_AUXILIARY = "x-claude-code-request-class", "x-claude-code-auxiliary-type"
CLAUDE_SIDE_CLASSES = frozenset({"auxiliary", "side_reply", "compaction"})
CODEX_KIND, CODEX_PARENT = "x-openai-subagent", "x-codex-parent-thread-id"


def side_request_of(headers: Mapping[str, str]) -> dict:
    """A side request's agent attributes (its kind as id and type; its parent, the main agent: none
    named), or {} for a request of an agent's own line."""
    kind = None
    if headers.get(CLAUDE_CLASS) in CLAUDE_SIDE_CLASSES:
        kind = _label(headers.get(CLAUDE_AUXILIARY)) or headers[CLAUDE_CLASS]
    elif headers.get(CODEX_KIND) and not headers.get(CODEX_PARENT):
        kind = _label(headers[CODEX_KIND])
    return {attr.AGENT_ID: kind, attr.AGENT_TYPE: kind, attr.AGENT_SIDE: True} if kind else {}


def genai_agent(agent: Mapping[str, object]) -> dict:
    """The GenAI conventions' names for the agent (`gen_ai.agent.id`, `.name`), beside looptrace's: the
    main agent is "main" (its harness names it nothing on the wire)."""
    return {attr.GEN_AI_AGENT_ID: agent.get(attr.AGENT_ID, MAIN),
            attr.GEN_AI_AGENT_NAME: agent.get(attr.AGENT_TYPE) or agent.get(attr.AGENT_ID, MAIN)}


def line_of(session: str | None, agent: Mapping[str, object]) -> str | None:
    """The conversation line of a request of `session` sent by `agent` (its attributes; {}: the main agent)."""
    if session is None or attr.AGENT_ID not in agent:
        return session
    return f"{session}#{'side' if agent.get(attr.AGENT_SIDE) else 'agent'}:{agent[attr.AGENT_ID]}"


def _label(value: str | None) -> str | None:
    """A harness's label as recorded: printable and short, else none (shown and exported, never trusted)."""
    return value if value and len(value) <= MAX_LABEL_CHARS and value.isprintable() else None
