"""Prompts and input messages stored as what they add to the step before, made whole on read.

An agent sends its whole conversation every turn, and a step stored whole made a session's bytes
grow with turns × context (163 MB for one 150-turn session). So the tracer writes a step's prompt
as its base (the conversation's previous step), how much of the base's prompt comes first (ids and
characters, cut where an added token starts) and what follows; its input messages likewise (how
many of the base's come first, then the new ones). A step that continues nothing is stored whole:
a keyframe.

`trace_bases` holds, for every stored prompt and message list, the span that holds it and its base
(NULL for a keyframe), so that a step is made whole from one query: a recursive walk of its chain,
back to a keyframe. Every read of a trace goes through `make_whole`, so readers see each step as if
it had been stored whole; a step whose base the store no longer has says so (`base_missing`).
Retention makes a step whole (`materialize`) before it deletes the step it builds on: the oldest
step left of a session becomes its keyframe.
"""

from __future__ import annotations

from looptrace.common import attributes as attr
from looptrace.common.jsonio import dumps, loads

PROMPT, INPUT = "prompt", "input"  # trace_bases.kind
KEYS = {PROMPT: (attr.PROMPT_IDS, attr.PROMPT_BASE_TRACE_ID),  # kind: (held whole, held as what it adds)
        INPUT: (attr.GEN_AI_INPUT_MESSAGES, attr.INPUT_BASE_TRACE_ID)}
WHOLE_KEYS = {PROMPT: (attr.PROMPT_IDS, attr.PROMPT_TEXT), INPUT: (attr.GEN_AI_INPUT_MESSAGES,)}
BASE_KEYS = {PROMPT: (attr.PROMPT_BASE_TRACE_ID, attr.PROMPT_BASE_TOKENS, attr.PROMPT_BASE_CHARS),
             INPUT: (attr.INPUT_BASE_TRACE_ID, attr.INPUT_BASE_MESSAGES)}
DELTA_KEYS = {PROMPT: BASE_KEYS[PROMPT] + (attr.PROMPT_ADDED_IDS, attr.PROMPT_ADDED_TEXT), INPUT: BASE_KEYS[INPUT]}
MAX_DEPTH = 1_000_000  # a chain's length at most: steps are random ids, so a loop means a forged store

CHAIN = """
WITH RECURSIVE chain (trace_id, span_id, base, depth) AS (
    SELECT trace_id, span_id, base, 0 FROM trace_bases WHERE trace_id = ? AND kind = ?
    UNION ALL
    SELECT b.trace_id, b.span_id, b.base, c.depth + 1 FROM chain c
    JOIN trace_bases b ON b.trace_id = c.base AND b.kind = ? WHERE c.depth < ?)
SELECT c.depth, c.trace_id, c.base, s.attributes FROM chain c
JOIN spans s ON s.trace_id = c.trace_id AND s.span_id = c.span_id ORDER BY c.depth"""


def base_rows(trace_id: str, span_id: str, attrs: dict) -> list[tuple]:
    """The trace_bases rows a span being stored adds: (trace_id, kind, span_id, base)."""
    rows = []
    for kind, (whole, base) in KEYS.items():
        if whole in attrs:
            rows.append((trace_id, kind, span_id, None))
        elif base in attrs:
            rows.append((trace_id, kind, span_id, attrs[base]))
    return rows


def compacted(attrs: dict) -> dict:
    """A span's attributes as the store keeps them (a copy where they change): a prompt or message list
    held as what it adds without the whole beside it (which a span exported over OTLP also carries), the
    part new since the conversation's last request (`looptrace.prompt.new_text`), where it ends the
    added text, as its length (PROMPT_NEW_CHARS), and none of what only the export needs."""
    leave = [key for key in attr.EXPORTED_ONLY if key in attrs]
    for kind, (whole, base) in KEYS.items():
        if base in attrs and whole in attrs:
            leave += WHOLE_KEYS[kind]
    added, new = attrs.get(attr.PROMPT_ADDED_TEXT), attrs.get(attr.PROMPT_NEW_TEXT)
    shortened = bool(added and new and added.endswith(new))
    if not leave and not shortened:
        return attrs
    attrs = {key: value for key, value in attrs.items() if key not in leave}
    if shortened:
        del attrs[attr.PROMPT_NEW_TEXT]
        attrs[attr.PROMPT_NEW_CHARS] = len(new)
    return attrs


def exported(attrs) -> dict | None:
    """A span's attributes as OTLP exports them, where they differ (else None): whole, without the
    store's keys for what a step adds to the one before (the tracer wrote the whole beside them)."""
    leave = [key for kind, (whole, base) in KEYS.items() if base in attrs and whole in attrs
             for key in DELTA_KEYS[kind]]
    return {key: value for key, value in attrs.items() if key not in leave} if leave else None


def stored_partly(attrs: dict) -> list[str]:
    """The kinds this span's attributes hold as what they add to another step's."""
    return [kind for kind, (whole, base) in KEYS.items() if base in attrs and whole not in attrs]


def make_whole(db, trace_id: str, spans: list[dict]) -> None:
    """`spans` (a trace read back, attributes parsed) with every prompt and message list whole."""
    for span in spans:
        attrs = span["attributes"]
        for kind in stored_partly(attrs):
            _whole(db, trace_id, kind, attrs)




def materialize(db, doomed: str, update=None) -> int:
    """Makes whole, in place, every stored part whose base is among the traces in the table `doomed`
    and which is not itself (retention, before it deletes them): each becomes a keyframe. How many.
    `update(trace_id, span_id, attributes, old)`: how a span's attributes are rewritten, where a store
    counts more than the column (PostgreSQL's row bytes)."""
    made = 0
    for trace_id, kind, span_id in dependents(db, doomed):
        row = db.execute("SELECT attributes FROM spans WHERE trace_id = ? AND span_id = ?", (trace_id, span_id)).fetchone()
        if row is None:
            continue
        old = row[0]
        attrs = loads(old)
        _whole(db, trace_id, kind, attrs)
        if kind in stored_partly(attrs):
            continue  # its base is missing: nothing to make it whole from; it stays, and reads, as it is
        if update is None:
            db.execute("UPDATE spans SET attributes = ? WHERE trace_id = ? AND span_id = ?",
                       (dumps(attrs), trace_id, span_id))
        else:
            update(trace_id, span_id, dumps(attrs), old)
        db.execute("UPDATE trace_bases SET base = NULL WHERE trace_id = ? AND kind = ?", (trace_id, kind))
        made += 1
    return made


def _whole(db, trace_id: str, kind: str, attrs: dict) -> None:
    rows = db.execute(CHAIN, (trace_id, kind, kind, MAX_DEPTH)).fetchall()  # by position: any connection's rows
    if any(r[0] != depth for depth, r in enumerate(rows)):  # a step in the middle is gone
        _missing(kind, attrs)
        return
    chain = [loads(r[3]) for r in rows]
    keyframe = chain[-1] if chain and rows[-1][2] is None else None
    if keyframe is None and rows and rows[-1][2] is not None:
        keyframe = _stored_whole(db, rows[-1][2], kind)  # a base stored before trace_bases was kept
        if keyframe is not None:
            chain.append(keyframe)
    if keyframe is None or (attr.PROMPT_IDS if kind == PROMPT else attr.GEN_AI_INPUT_MESSAGES) not in keyframe:
        _missing(kind, attrs)
        return
    deltas = chain[-2::-1]  # oldest first, this span's own last
    if kind == PROMPT:
        ids, text = keyframe[attr.PROMPT_IDS], keyframe[attr.PROMPT_TEXT]
        for step in deltas:
            ids = ids[:step[attr.PROMPT_BASE_TOKENS]] + step[attr.PROMPT_ADDED_IDS]
            text = text[:step[attr.PROMPT_BASE_CHARS]] + step[attr.PROMPT_ADDED_TEXT]
        attrs[attr.PROMPT_IDS], attrs[attr.PROMPT_TEXT] = ids, text
        attrs.pop(attr.PROMPT_ADDED_IDS, None)
        attrs.pop(attr.PROMPT_ADDED_TEXT, None)
        new_chars = attrs.pop(attr.PROMPT_NEW_CHARS, None)
        if new_chars is not None:
            attrs[attr.PROMPT_NEW_TEXT] = text[len(text) - new_chars:]
    else:
        messages = loads(keyframe[attr.GEN_AI_INPUT_MESSAGES])
        for step in deltas:
            messages = messages[:step[attr.INPUT_BASE_MESSAGES]] + loads(step[attr.INPUT_NEW_MESSAGES])
        attrs[attr.GEN_AI_INPUT_MESSAGES] = dumps(messages)
    for key in BASE_KEYS[kind]:  # read back as if stored whole
        attrs.pop(key, None)


def _stored_whole(db, trace_id: str, kind: str) -> dict | None:
    """The span of `trace_id` holding `kind` whole, looked for among its spans (a rare path)."""
    key = attr.PROMPT_IDS if kind == PROMPT else attr.GEN_AI_INPUT_MESSAGES
    for row in db.execute("SELECT attributes FROM spans WHERE trace_id = ?", (trace_id,)).fetchall():
        attrs = loads(row[0])
        if key in attrs:
            return attrs
    return None


def _missing(kind: str, attrs: dict) -> None:
    """A step whose chain reaches a step the store no longer has (lost on the way, or a foreign
    retention): what it added is kept; the whole is not there."""
    if kind == PROMPT:
        attrs[attr.PROMPT_NOT_KEPT] = "base_missing"
        new_chars, added = attrs.pop(attr.PROMPT_NEW_CHARS, None), attrs.get(attr.PROMPT_ADDED_TEXT, "")
        if new_chars is not None:
            attrs[attr.PROMPT_NEW_TEXT] = added[len(added) - new_chars:]


def dependents(db, doomed: str) -> list[tuple]:
    """(trace_id, kind, span_id) of the stored parts whose base is in the table `doomed` and which
    are not themselves: what retention must make whole first."""
    return [tuple(r) for r in db.execute(
        f"SELECT b.trace_id, b.kind, b.span_id FROM trace_bases b WHERE b.base IN (SELECT trace_id FROM {doomed}) "
        f"AND b.trace_id NOT IN (SELECT trace_id FROM {doomed})").fetchall()]
