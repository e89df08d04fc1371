"""The MCP server's tools, read-only: each reads the trace store through its own queries (queries.py, the
readers the viewer's HTTP routes call), as one tenant (None: the operator, every tenant's records), and
answers text an agent can read, within the bounds below whatever the store holds.

Bounds: a list at most LIST_MAX sessions; a session's page at most STEPS_MAX steps, each message part
within PART_CHARS; a step's prompt within PROMPT_CHARS; a diff within DIFF_LINES lines; and every
result within RESULT_CHARS characters (past it, elided with the count, as every long text is).
"""

from __future__ import annotations

import re

from looptrace.common import attributes as attr
from looptrace.trace_store.interface import StoreUnavailable
from looptrace.trace_store.recorded_sessions import tool_calls
from looptrace.trace_store.records import request_span
from looptrace.trace_store.steps import searchable_text

from .text import Refused, clean, elided, json_attribute, messages_text, one_line, since_ns, when

LIST_MAX = 100
STEPS_MAX = 50
PART_CHARS = 1_500
PROMPT_CHARS = 24_000
RESULT_CHARS = 60_000
LEAST_LIKELY = 10
SEARCH_CHARS, SEARCH_WORDS = 256, 16  # as the HTTP API's ?q= (viewer/sessions.py): past them, only cost
# The store says which sessions match, not which steps: the snippets are looked for in the first
# SNIPPET_STEPS steps of the first SNIPPET_SESSIONS sessions found, so a search reads that much at most.
SNIPPET_SESSIONS, SNIPPET_STEPS = 5, 100
_WORD = re.compile(r"\w+")


def bounded(text: str) -> str:
    return elided(text, RESULT_CHARS, head=0.9)


def _read(query, *args, **kwargs):
    """A store query; a store with nothing written yet reads as None, one that cannot be read is refused."""
    try:
        return query(*args, **kwargs)
    except FileNotFoundError:
        return None
    except (StoreUnavailable, OSError) as exc:
        raise Refused(f"The trace store at {getattr(query.__self__, 'where', '?')} cannot be read now: "
                      f"{one_line(exc, 300)}") from exc


def _given(value: str, name: str) -> str:
    if "\x00" in value:
        raise Refused(f"{name} must not hold a NUL character")
    return value


def search_text(q: str) -> str:
    text = _given(q.strip(), "q")
    if len(text) > SEARCH_CHARS:
        raise Refused(f"q is {len(text):,} characters; a search takes at most {SEARCH_CHARS}")
    if len(_WORD.findall(text)) > SEARCH_WORDS:
        raise Refused(f"q holds more than {SEARCH_WORDS} words; a search takes at most {SEARCH_WORDS}")
    return text


def session_line(s: dict) -> str:
    tools = s.get("tool_calls") or {}
    calls = sum(v or 0 for v in tools.values())
    agents = s.get("agents")
    steps = s["steps_total"] if "steps_total" in s else s.get("steps", 0)  # a session read whole lists its steps
    line = (f"- {one_line(s['key'], 200)}  client={one_line(s.get('client') or '?', 60)}  "
            f"model={one_line(s.get('model') or '?', 80)}  steps={steps}  "
            f"tokens={s.get('input_tokens') or 0:,} in / {s.get('output_tokens') or 0:,} out  "
            f"tool_calls={calls}  errors={s.get('errors') or 0}  last={when(s.get('last_ns'))}")
    if isinstance(agents, list):
        line += f"  agents={len(agents)}"
    elif isinstance(agents, int):
        line += f"  agents={agents}"
    return line


def list_sessions(store, tenant: str | None, *, model: str = "", client: str = "", since: str = "", q: str = "",
                  limit: int = 20) -> str:
    page = _read(store.list_sessions, model=_given(model, "model") or None, client=_given(client, "client") or None,
                 since_ns=since_ns(since), text=search_text(q) or None, limit=limit, tenant=tenant)
    rows = (page or {}).get("data", [])
    if not rows:
        return "No sessions match."
    more = " (more: narrow with since, model, client or q)" if page.get("next") else ""
    return bounded(f"{len(rows)} sessions, most recently active first{more}:\n" + "\n".join(map(session_line, rows)))


def _session(store, tenant, key: str, offset: int = 0, limit: int | None = None) -> dict:
    found = _read(store.session, _given(key, "key"), offset, limit, tenant) if key else None
    if found is None:
        raise Refused(f"No session {one_line(key, 200)!r} in the store (list_sessions shows the keys).")
    return found


def _agents_text(agents) -> list[str]:
    if not isinstance(agents, list) or not agents:
        return []
    lines = ["agents:"]
    for agent in agents:
        if isinstance(agent, dict):
            parent, steps = agent.get("parent"), agent.get("steps", "?")
            lines.append(f"  - {one_line(agent.get('id'), 100)} ({one_line(agent.get('type') or 'main', 60)})"
                         f"{' under ' + one_line(parent, 100) if parent else ''}: {steps} step{'' if steps == 1 else 's'}")
    return lines


def step_heading(number: int, step: dict) -> str:
    """A step's line: its number (0: not known, a step named by its trace id), trace id, agent, time, status."""
    agent = step.get("agent")
    shown = f"  agent={one_line(agent if not isinstance(agent, dict) else agent.get('id'), 100)}" if agent else ""
    return (f"## {f'step {number}  ' if number else ''}trace_id={one_line(step.get('trace_id'), 40)}{shown}  "
            f"{when(step.get('start_ns'))}  status={one_line(step.get('status') or '?', 20)}  "
            f"tokens={step.get('input_tokens') or 0:,} in / {step.get('output_tokens') or 0:,} out"
            + (f"  error={one_line(step['error'], 80)}" if step.get("error") else ""))


def calls_text(calls: list, limit: int) -> list[str]:
    return [f"tool call {one_line(c.get('name'), 80)}({elided(c.get('arguments') or '', limit)}) → "
            f"{one_line(c.get('outcome') or '?', 20)}" for c in calls if isinstance(c, dict)]


def get_session(store, tenant: str | None, *, key: str, offset: int = 0, limit: int = 20) -> str:
    found = _session(store, tenant, key, offset, limit)
    total = found.get("steps_total", len(found["steps"]))
    lines = [f"# session {one_line(found['key'], 200)}", session_line(found)[2:], *_agents_text(found.get("agents")),
             f"steps {offset + 1}–{offset + len(found['steps'])} of {total}; each shows what its prompt added "
             "(new messages) and the answer; get_step shows one whole"]
    for n, step in enumerate(found["steps"], offset + 1):
        lines += ["", step_heading(n, step)]
        new = messages_text(step.get("new_messages"), PART_CHARS)
        lines += ["new in the prompt:", *new] if new else ["new in the prompt: (not recorded)"]
        answer = messages_text(step.get("output"), PART_CHARS)
        lines += ["answer:", *answer] if answer else ["answer: (none recorded)"]
        lines += calls_text(step.get("tool_calls") or [], 300)
    if offset + len(found["steps"]) < total:
        lines += ["", f"[{total - offset - len(found['steps'])} more steps: get_session with offset="
                      f"{offset + len(found['steps'])}]"]
    return bounded("\n".join(lines))


def trace_of(store, tenant, key: str, step: int, trace_id: str = "") -> dict:
    """A step's trace: by its trace id, or by its number in a session (from 1)."""
    if trace_id:
        trace_id = _given(trace_id.strip().lower(), "trace_id")
    else:
        if step < 1:
            raise Refused("Name the step: key and step (its number in the session, from 1), or trace_id.")
        steps = _session(store, tenant, key, step - 1, 1)["steps"]
        if not steps:
            raise Refused(f"The session has no step {step}.")
        trace_id = steps[0]["trace_id"]
    found = _read(store.get_trace, trace_id, tenant)
    if found is None:
        raise Refused(f"No trace {one_line(trace_id, 64)!r} in the store.")
    return found


def _spans(trace: dict) -> tuple[dict, dict, dict]:
    by_name = {s["name"]: s for s in trace["spans"]}
    root = request_span(trace["spans"]) or {"attributes": {}}
    return root, by_name.get(attr.SPAN_RENDER, {}), by_name.get(attr.SPAN_DECODE, {})


def prompt_of(trace: dict) -> str | None:
    _, render, _ = _spans(trace)
    text = render.get("attributes", {}).get(attr.PROMPT_TEXT)
    return text if isinstance(text, str) else None


def least_likely(tokens: list[dict], count: int = LEAST_LIKELY) -> list[str]:
    scored = [t for t in tokens if isinstance(t.get("logprob"), (int, float))]
    scored.sort(key=lambda t: t["logprob"])
    lines = []
    for t in sorted(scored[:count], key=lambda t: t.get("index", 0)):
        others = [f"{one_line(piece, 24)!r} {p:.3f}" for piece, p in zip(t.get("top_pieces") or (), t.get("top_p") or ())
                  if isinstance(p, (int, float)) and piece != t.get("piece")][:4]
        p = t.get("p")
        chance = f"{p:.4f}" if isinstance(p, (int, float)) else "?"
        instead = f"  (instead: {', '.join(others)})" if others else ""
        lines.append(f"  #{t.get('index', '?')} {one_line(t.get('text', t.get('piece')), 40)!r} p={chance}{instead}")
    return lines


def get_step(store, tenant: str | None, *, key: str = "", step: int = 0, trace_id: str = "") -> str:
    trace = trace_of(store, tenant, key, step, trace_id)
    root, _, decode = _spans(trace)
    summary = trace.get("step") or {}
    lines = [step_heading(step if not trace_id else 0, {**summary, "trace_id": trace["trace_id"]}),
             f"session={one_line(trace.get('session') or '?', 200)}  model="
             f"{one_line(root['attributes'].get(attr.GEN_AI_REQUEST_MODEL) or '?', 80)}"]
    prompt = prompt_of(trace)
    if prompt is None:
        lines += ["prompt: (not recorded: --no-trace-content, or the prompt was refused)"]
    else:
        lines += [f"prompt, exactly as the model read it ({len(prompt):,} characters):",
                  elided(prompt, PROMPT_CHARS, head=0.25)]
    answer = messages_text(json_attribute(root["attributes"].get(attr.GEN_AI_OUTPUT_MESSAGES)), PROMPT_CHARS // 4)
    lines += ["answer:", *answer] if answer else ["answer: (none recorded)"]
    lines += calls_text(tool_calls(trace["spans"]), 2_000)
    tokens = decode.get("tokens") or []
    unlikely = least_likely(tokens)
    if unlikely:
        lines += [f"the {len(unlikely)} least likely of its {len(tokens)} generated tokens (position, text, "
                  "probability; the likelier candidates):", *unlikely]
    return bounded("\n".join(lines))


def search(store, tenant: str | None, *, q: str, limit: int = 10) -> str:
    text = search_text(q)
    if not text:
        raise Refused("q is empty: give a conversation id or a few words")
    page = _read(store.list_sessions, text=text, limit=limit, tenant=tenant)
    rows = (page or {}).get("data", [])
    if not rows:
        return f"Nothing in the store matches {one_line(text, 80)!r}."
    lines = [f"{len(rows)} sessions match {one_line(text, 80)!r}" + (" (more: raise limit)" if page.get("next") else "")
             + ":"]
    for place, row in enumerate(rows):
        lines += ["", session_line(row)]
        if place < SNIPPET_SESSIONS:
            lines += snippets(store, tenant, row["key"], text)
    return bounded("\n".join(lines))


def snippets(store, tenant: str | None, key: str, text: str, most: int = 3) -> list[str]:
    """Up to `most` of the session's first SNIPPET_STEPS steps that hold `text`, each with the words around it."""
    found = _read(store.session, key, 0, SNIPPET_STEPS, tenant) or {"steps": []}
    needle, lines = text.lower(), []
    for n, step in enumerate(found["steps"], 1):
        said = clean(searchable_text(step))
        at = said.lower().find(needle)
        if at >= 0:
            lines.append(f"  step {n} (trace_id={one_line(step.get('trace_id'), 40)}): "
                         f"…{one_line(said[max(0, at - 80):at + len(text) + 80], 240)}…")
            if len(lines) == most:
                break
    return lines
