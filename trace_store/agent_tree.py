"""A session's agents as a tree, from its steps' `subagent` (steps.py): the main agent, its subagents
and theirs, and the side requests its harness labels (titles, reviews, compactions).

Exactly one agent has no parent: the main agent. Its id is what its subagents name as their parent
where that is no subagent of the session (codex's root thread id), else "main" (Claude Code names
none). Each subagent is placed under the parent's step that spawned it where that can be told: the
parent's last step before the subagent's first whose answer called a spawning tool (Claude Code's
Task or Agent, codex's spawn_agent), else its last step with any tool call before then; the tool
call's id is said. Where the parent made no call before, `spawned_by` is absent.
"""

from __future__ import annotations

MAIN = "main"
SPAWNING_TOOLS = frozenset({"Task", "Agent", "spawn_agent"})


def agent_tree(steps: list[dict]) -> tuple[list[dict], list[str]]:
    """(the agents, first seen first: id, parent, type, steps, first_ns, last_ns and, where told,
    spawned_by {trace_id, tool_call_id}; each step's agent id, in the steps' order)."""
    named = {s["subagent"]["id"] for s in steps if s.get("subagent")}
    main = next((s["subagent"]["parent"] for s in steps if s.get("subagent", {}).get("parent")
                 and s["subagent"]["parent"] not in named), MAIN)
    agents: dict[str, dict] = {main: _agent(main, None, MAIN)}
    of_step = []
    for step in steps:
        said = step.get("subagent") or {}
        agent = said.get("id", main)
        if agent not in agents:
            parent = said.get("parent") if said.get("parent") in named else main
            agents[agent] = _agent(agent, parent, said.get("type"), side=said.get("side", False))
        found = agents[agent]
        found["steps"] += 1
        found["first_ns"] = step["start_ns"] if found["first_ns"] is None else found["first_ns"]
        found["last_ns"] = max(found["last_ns"] or 0, step.get("end_ns") or step["start_ns"])
        of_step.append(agent)
    if not any(a == main for a in of_step):
        agents[main]["first_ns"] = agents[main]["last_ns"] = None  # only its subagents' steps are stored
    for found in agents.values():
        if found["parent"] is not None:
            spawned = _spawning_call(steps, of_step, found["parent"], found["first_ns"])
            if spawned:
                found["spawned_by"] = spawned
    return list(agents.values()), of_step


def _agent(agent: str, parent: str | None, kind: str | None, *, side: bool = False) -> dict:
    found = {"id": agent, "parent": parent, "type": kind, "steps": 0, "first_ns": None, "last_ns": None}
    return {**found, "side": True} if side else found


def _spawning_call(steps: list[dict], of_step: list[str], parent: str, before_ns: int) -> dict | None:
    """The parent's tool call that spawned a subagent first heard at `before_ns` (module docstring)."""
    fallback = None
    for step, agent in zip(reversed(steps), reversed(of_step)):
        if agent != parent or step["start_ns"] >= before_ns or not step.get("tool_calls"):
            continue
        for call in step["tool_calls"]:
            if call.get("name") in SPAWNING_TOOLS:
                return {"trace_id": step["trace_id"], "tool_call_id": call.get("id")}
        fallback = fallback or {"trace_id": step["trace_id"], "tool_call_id": step["tool_calls"][-1].get("id")}
    return fallback
