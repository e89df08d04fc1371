"""GET /v1/compare?a=KEY&b=KEY: two sessions side by side, aligned by step (an original and its replay,
or any two, such as one task run on two models), for the viewer's compare page (/compare/A/B).
&agent_a=ID &agent_b=ID: one agent's line of each (trace_store/agent_tree.py's ids), such as the two
runs' Explore subagents, whose ids differ from run to run.

Per step: both answers' tokens, the tokens where the two sides diverge, their tool calls and whether
they are the same calls, and how their prompts differ. A token diverges where both answers are the
same so far and either the chosen token or the model's most likely one differs there: for a forced
replay (the same tokens read by another model), exactly where the greedy choices differ; for two
answers that part ways, the token where they do (what follows no longer lines up, and is not marked).

On top: how many steps agree (no divergent token, the same tool calls), the first divergence, and
each side's mean surprise (the mean of -logprob over its tokens).
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict

from looptrace.common import attributes as attr
from looptrace.common.jsonio import dumps
from looptrace.common.sequences import common_prefix
from looptrace.trace_store.records import request_span, span_named

from ..auth import sees
from ..errors import APIError, invalid
from ..stored import read, store_of

MAX_STEPS = 200  # steps compared at most: each is two traces read whole
MAX_AGENT_CHARS = 256  # as long as a harness's agent id may be (api/agents.py)
SHOWN_CHARS = 2000  # of each prompt's differing part


async def compare_sessions(request: web.Request) -> web.Response:
    keys = [request.query.get(side, "") for side in ("a", "b")]
    for side, key in zip("ab", keys):
        if not key or len(key) > 1024 or "\x00" in key:
            raise invalid(f"'{side}' must be a session's key.", param=side)
    agents = [request.query.get(f"agent_{side}") or None for side in "ab"]
    for side, agent in zip("ab", agents):
        if agent is not None and (len(agent) > MAX_AGENT_CHARS or not agent.isprintable()):
            raise invalid(f"'agent_{side}' is an agent's id: 1 to {MAX_AGENT_CHARS} printable characters.",
                          param=f"agent_{side}")
    found = await read(compared, None, store_of(request), *keys, tenant=sees(request), agents=agents)
    if found is None:
        raise APIError(404, "No such session in the store.", param="a", code="session_not_found")
    if isinstance(found, tuple):  # (side, agent): the session has no such agent
        raise APIError(404, f"Session {keys['ab'.index(found[0])]!r} has no agent {found[1]!r}.",
                       param=f"agent_{found[0]}", code="agent_not_found")
    if isinstance(found, str):
        raise APIError(404, f"No session {found!r} in the store.", param="b" if found == keys[1] else "a",
                       code="session_not_found")
    return web.json_response(found, dumps=dumps)


def compared(store, key_a: str, key_b: str, tenant: str | None = None,
             agents: list[str | None] = (None, None)) -> dict | str | tuple[str, str]:
    """The comparison, or the key of a session that is not there (or is not `tenant`'s), or (side,
    agent) for an agent a session does not have. `agents`: each side's agent whose steps alone count."""
    sessions = []
    for side, key, agent in zip("ab", (key_a, key_b), agents):
        session = store.session(key, tenant=tenant)
        if session is None:
            return key
        if agent is not None:
            if not any(a["id"] == agent for a in session.get("agents", ())):
                return side, agent
            session = {**session, "steps": [s for s in session["steps"] if s.get("agent") == agent]}
        sessions.append(session)
    a, b = sessions
    pairs = list(zip(a["steps"], b["steps"]))[:MAX_STEPS]
    steps = [_step(n, store.get_trace(x["trace_id"], tenant), store.get_trace(y["trace_id"], tenant), x, y)
             for n, (x, y) in enumerate(pairs, 1)]
    return {"a": _head(a), "b": _head(b), "summary": _summary(steps, a, b), "steps": steps}


def _head(session: dict) -> dict:
    return {k: session[k] for k in ("key", "conversation", "model", "client", "client_version", "input_tokens",
                                     "output_tokens", "tool_calls")} | {"steps": len(session["steps"])}


def _step(n: int, trace_a: dict | None, trace_b: dict | None, step_a: dict, step_b: dict) -> dict:
    tokens_a, render_a = _parts(trace_a)
    tokens_b, render_b = _parts(trace_b)
    divergent, parted = _divergent(tokens_a, tokens_b)
    calls_a, calls_b = (_StepCalls.model_validate(step).tool_calls for step in (step_a, step_b))
    return {"step": n, "a": step_a, "b": step_b, "tokens_a": tokens_a, "tokens_b": tokens_b,
            "divergent": divergent, "first_divergence": divergent[0] if divergent else None, "parted_at": parted,
            "tool_calls_equal": [c.compared() for c in calls_a] == [c.compared() for c in calls_b],
            "replay": _replay(trace_b), "prompt": _prompt_diff(render_a, render_b)}


def _parts(trace: dict | None) -> tuple[list[dict], dict]:
    """The decode span's tokens and the render span's attributes (none of either where not stored)."""
    if trace is None:
        return [], {}
    return span_named(trace, attr.SPAN_DECODE)["tokens"], span_named(trace, attr.SPAN_RENDER)["attributes"]


def _divergent(a: list[dict], b: list[dict]) -> tuple[list[int], int | None]:
    """The tokens where two answers diverge while alike so far, and where their tokens part (or None)."""
    # Tokens are read as the stored dicts: a model per token costs about 8 µs, and a comparison reads thousands.
    out = []
    for i, (x, y) in enumerate(zip(a, b)):
        top_x, top_y = (x.get("top_ids") or [None])[0], (y.get("top_ids") or [None])[0]
        if x.get("id") != y.get("id"):
            out.append(i)
            return out, i
        if top_x != top_y:
            out.append(i)
    return out, (min(len(a), len(b)) if len(a) != len(b) else None)


class _Call(BaseModel):
    """A stored step's tool call, as two are compared: the same name, arguments (as JSON, keys sorted)
    and outcome, and for a call that did not parse, the same text."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    name: Any = None
    arguments: Any = None
    outcome: Any = None
    raw: Any = None

    def compared(self) -> tuple:
        try:
            arguments = json.dumps(json.loads(self.arguments or "null"), sort_keys=True)
        except (json.JSONDecodeError, TypeError):
            arguments = self.arguments
        return self.name, arguments, self.outcome, self.raw if self.outcome == "unparsed" else None


class _StepCalls(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)
    tool_calls: list[_Call] = []


def _replay(trace: dict | None) -> dict | None:
    """What a replayed step says of itself (looptrace.replay.*), when side b is a replay."""
    root = request_span(trace["spans"]) if trace else None
    if root is None or attr.REPLAY_TRACE_ID not in root["attributes"]:
        return None
    a = root["attributes"]
    return {"of": a[attr.REPLAY_TRACE_ID], "session": a.get(attr.REPLAY_SESSION), "mode": a.get(attr.REPLAY_MODE),
            "target": a.get(attr.REPLAY_TARGET), "agreeing": a.get(attr.REPLAY_AGREEING),
            "tokens": a.get(attr.REPLAY_TOKENS)}


def _prompt_diff(a: dict, b: dict) -> dict:
    ids_a, ids_b = a.get(attr.PROMPT_IDS), b.get(attr.PROMPT_IDS)
    text_a, text_b = a.get(attr.PROMPT_TEXT, ""), b.get(attr.PROMPT_TEXT, "")
    if ids_a is None or ids_b is None:
        return {"known": False}
    same = ids_a == ids_b
    out = {"known": True, "same": same, "tokens_a": len(ids_a), "tokens_b": len(ids_b),
           "common_tokens": common_prefix(ids_a, ids_b)}
    if not same:  # the part of each that differs: after their common start, before their common end
        start = common_prefix(text_a, text_b)
        end = common_prefix(text_a[start:][::-1], text_b[start:][::-1])
        out |= {"at_char": start, "text_a": text_a[start:len(text_a) - end][:SHOWN_CHARS],
                "text_b": text_b[start:len(text_b) - end][:SHOWN_CHARS]}
    return out


def _surprise(steps: list[dict], side: str) -> float | None:
    values = [-t["logprob"] for s in steps for t in s[f"tokens_{side}"] if isinstance(t.get("logprob"), (int, float))]
    return sum(values) / len(values) if values else None


def _summary(steps: list[dict], a: dict, b: dict) -> dict:
    agreeing = [s for s in steps if not s["divergent"] and s["parted_at"] is None and s["tool_calls_equal"]]
    first = next((s for s in steps if s["first_divergence"] is not None), None)
    return {"steps_a": len(a["steps"]), "steps_b": len(b["steps"]), "compared": len(steps),
            "steps_agreeing": len(agreeing),
            "first_divergence": {"step": first["step"], "token": first["first_divergence"]} if first else None,
            "mean_surprise_a": _surprise(steps, "a"), "mean_surprise_b": _surprise(steps, "b")}
