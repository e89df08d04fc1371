"""`looptrace export --format atif`: each session (an agent's run, or a rollout) as one trajectory of
the Agent Trajectory Interchange Format (ATIF v1.8, Harbor's RFC 0001; the `atif` package's pydantic
models are what the tests validate it with), one JSON document per line.

The trajectory's `agent` is the harness that called (its name and version from the User-Agent), with
the served model and the tools it offered; its steps are written by atif_steps.py. A subagent's
requests share its parent's conversation and carry its id (`looptrace.agent.id`, from Claude Code's
and codex's headers): they make a trajectory of their own, embedded in its parent's
`subagent_trajectories`, and the parent's call that spawned it gets a `subagent_trajectory_ref` in its
observation. Which call that was, no header says: the call of the parent's last step before the
subagent began whose result came back after the subagent's last request (a tool that ran the
subagent returns once it is done), else that step's first call not linked yet.
"""

from __future__ import annotations

from collections.abc import Iterator

from looptrace.common import attributes as attr
from looptrace.trace_store.location import open_state
from looptrace.trace_store.recorded_sessions import ReplayError, read_step
from looptrace.trace_store.rollouts import Rollouts

from .atif_steps import StepWriter, Turn

SCHEMA_VERSION = "ATIF-v1.8"


def trajectories(store, keys: list[str], spec: str) -> Iterator[dict]:
    """One trajectory per session, in the order of `keys`; `spec` is the store as --store names it."""
    rollouts = _rollouts(spec)
    for key in keys:
        yield trajectory(store, key, _rollout(rollouts, key))


def trajectory(store, key: str, rollout: dict | None = None) -> dict:
    session = store.session(key)
    if session is None:
        raise ReplayError(f"no session {key!r} in the store (the key is the conversation id the viewer shows, or "
                          "trace:TRACE_ID for a request that carried none)")
    turns, missing = [], 0
    for n, summary in enumerate(session["steps"], 1):
        recorded = read_step(store, n, summary["trace_id"])
        if recorded.request:
            turns.append(Turn(summary, recorded))
        else:
            missing += 1
    agents: dict[str | None, list[Turn]] = {None: []}  # None: the main agent; else a subagent's id
    for turn in turns:
        agents.setdefault(turn.attributes.get(attr.AGENT_ID), []).append(turn)
    writers = {agent: _written(agent_turns) for agent, agent_turns in agents.items()}
    documents = {agent: _document(key, agent, session, agents[agent], writer) for agent, writer in writers.items()}
    _link_subagents(key, agents, writers, documents)
    main = documents[None]
    extra = {"session": key, "conversation": session.get("conversation")}
    if rollout:
        extra["rollout"] = rollout
    main["extra"] = {**main.get("extra", {}), **{k: v for k, v in extra.items() if v is not None}}
    if missing:
        main["notes"] = f"{missing} of the session's requests are not in the store whole and are left out."
    return main


def _written(turns: list[Turn]) -> StepWriter:
    writer = StepWriter()
    for turn in turns:
        writer.add(turn)
    return writer


def _document(key: str, agent: str | None, session: dict, turns: list[Turn], writer: StepWriter) -> dict:
    first = turns[0] if turns else None
    agent_info = {"name": session.get("client") or "unknown", "version": session.get("client_version") or "unknown",
                  "model_name": session.get("model")}
    if first is not None:
        tools = first.json(attr.GEN_AI_TOOL_DEFINITIONS)
        if tools:
            agent_info["tool_definitions"] = [_openai_tool(t) for t in tools]
        served = {"served_by": "looptrace", "family": first.recorded.render.get(attr.FAMILY),
                  "template_sha256": first.recorded.render.get(attr.TEMPLATE_SHA256),
                  "tokenizer_sha256": first.recorded.render.get(attr.TOKENIZER_SHA256)}
        agent_info["extra"] = {k: v for k, v in served.items() if v is not None}
    document = {"schema_version": SCHEMA_VERSION, "session_id": key, "trajectory_id": agent or key,
                "agent": {k: v for k, v in agent_info.items() if v is not None}, "steps": writer.steps,
                "final_metrics": _final_metrics(writer.steps)}
    if agent is not None and first is not None:
        about = {"agent_type": first.attributes.get(attr.AGENT_TYPE),
                 "parent_agent_id": first.attributes.get(attr.AGENT_PARENT_ID)}
        document["extra"] = {k: v for k, v in about.items() if v is not None}
    return document


def _openai_tool(definition: dict) -> dict:
    """A tool as gen_ai.tool.definitions holds it, as the OpenAI function tool ATIF's agent lists."""
    function = {k: definition[k] for k in ("name", "description", "parameters") if definition.get(k) is not None}
    return {"type": "function", "function": function}


def _final_metrics(steps: list[dict]) -> dict:
    called = [s["metrics"] for s in steps if "metrics" in s]
    totals = {"total_prompt_tokens": sum(m.get("prompt_tokens") or 0 for m in called),
              "total_completion_tokens": sum(m.get("completion_tokens") or 0 for m in called),
              "total_cached_tokens": sum(m.get("cached_tokens") or 0 for m in called), "total_steps": len(steps)}
    return totals


def _link_subagents(key: str, agents: dict, writers: dict, documents: dict) -> None:
    """Each subagent's trajectory embedded in its parent's (a subagent seen earlier, else the main
    agent: never one seen later, so no document can hold itself), and referenced from the call."""
    order = list(agents)
    linked: set[str] = set()
    for place, agent in enumerate(order):
        if agent is None or not agents[agent]:
            continue
        parent = agents[agent][0].attributes.get(attr.AGENT_PARENT_ID)
        parent = parent if parent in order[1:place] else None
        documents[parent].setdefault("subagent_trajectories", []).append(documents[agent])
        turns = agents[agent]
        found = _spawning_call(writers[parent], turns[0].summary["start_ns"], turns[-1].summary["start_ns"], linked)
        if found is None:
            continue
        step, call_id = found
        linked.add(call_id)
        ref = {"trajectory_id": agent, "session_id": key}
        results = step.setdefault("observation", {"results": []})["results"]
        result = next((r for r in results if r.get("source_call_id") == call_id), None)
        if result is None:
            results.append({"source_call_id": call_id, "subagent_trajectory_ref": [ref]})
        else:
            result.setdefault("subagent_trajectory_ref", []).append(ref)


def _spawning_call(writer: StepWriter, first_ns: int, last_ns: int, linked: set[str]) -> tuple[dict, str] | None:
    before = [step for start, step in writer.agent_steps if start < first_ns and step.get("tool_calls")]
    if not before:
        return None
    step = before[-1]
    calls = [c["tool_call_id"] for c in step["tool_calls"] if c["tool_call_id"] not in linked]
    waited = [c for c in calls if writer.result_at.get(c, last_ns + 1) > last_ns]
    chosen = (waited or calls or [None])[0]
    return (step, chosen) if chosen is not None else None


def _rollouts(spec: str) -> Rollouts | None:
    try:
        state = open_state(spec)
    except ValueError:
        return None
    return Rollouts(state) if state is not None else None


def _rollout(rollouts: Rollouts | None, key: str) -> dict | None:
    """The rollout's group, reward and info, where a reward was posted (POST /v1/rollouts/{id}/reward)."""
    if rollouts is None:
        return None
    try:
        head = rollouts.get(key) or {}
    except Exception:  # noqa: BLE001 - a store made before rollouts existed: none were posted
        return None
    found = {k: head.get(k) for k in ("group", "reward", "info", "steps")}
    return {k: v for k, v in found.items() if v not in (None, [])} or None
