"""A stored trace as the trace viewer shows it: the prompt token by token, what changed since the
step before, and each generated token's alternatives as text.

The comparison is with what the model had seen at the end of the previous step, its prompt and then
its answer: everything after the common start is what this step's template added or rewrote, and
whatever the previous step had that this prompt lacks is what the template dropped (reasoning of
earlier turns, a system message moved).
"""

from __future__ import annotations

from difflib import SequenceMatcher

from looptrace.common import attributes as attr
from looptrace.common.jsonio import loads
from looptrace.common.vocabulary import AlternativeTexts, Vocabulary
from looptrace.trace_store.records import span_named

DIFF_LIMIT = 4000  # tokens on either side of the changed middle compared token by token; past that, whole


def _render(trace: dict) -> dict:
    return next((s["attributes"] for s in trace["spans"] if s["name"] == attr.SPAN_RENDER), {})


def _media(render: dict) -> list[dict]:
    """The attached items the render span describes (kind, size, digest, tokens, thumbnail)."""
    media = render.get(attr.PROMPT_MEDIA)
    try:
        items = loads(media) if isinstance(media, str) else []
    except ValueError:
        return []
    return [i for i in items if isinstance(i, dict)] if isinstance(items, list) else []


def generated_ids(trace: dict) -> list[int]:
    return [t["id"] for t in span_named(trace, attr.SPAN_DECODE)["tokens"] if "id" in t]


def with_alternative_texts(trace: dict, vocab: Vocabulary) -> dict:
    texts = AlternativeTexts(vocab)
    for span in trace["spans"]:
        texts.add_to(span.get("tokens", ()))
    return trace


def prompt_tokens(ids: list[int], vocab: Vocabulary) -> list[list]:
    """[id, text, special] per token; the texts join to the decoded prompt (a character split across
    byte tokens shows on the token that completes it)."""
    detokenizer = vocab.detokenizer()
    special = vocab.special
    out = [[token_id, detokenizer.step(token_id), token_id in special] for token_id in ids]
    if out:
        out[-1][1] += detokenizer.flush()
    return out


def diff(before: list[int], after: list[int]) -> list[dict]:
    """Edits that turn `before` into `after`: {"op": "equal" | "insert" | "delete" | "replace",
    "a": [start, end] in before, "b": [start, end] in after}."""
    head = 0
    limit = min(len(before), len(after))
    while head < limit and before[head] == after[head]:
        head += 1
    tail = 0
    while tail < limit - head and before[-1 - tail] == after[-1 - tail]:
        tail += 1
    a_mid, b_mid = before[head:len(before) - tail], after[head:len(after) - tail]
    ops: list[dict] = []
    if head:
        ops.append({"op": "equal", "a": [0, head], "b": [0, head]})
    if a_mid or b_mid:
        if len(a_mid) <= DIFF_LIMIT and len(b_mid) <= DIFF_LIMIT:
            for op, i1, i2, j1, j2 in SequenceMatcher(None, a_mid, b_mid, autojunk=False).get_opcodes():
                ops.append({"op": op, "a": [head + i1, head + i2], "b": [head + j1, head + j2]})
        else:
            ops.append({"op": "replace" if a_mid and b_mid else "insert" if b_mid else "delete",
                        "a": [head, len(before) - tail], "b": [head, len(after) - tail]})
    if tail:
        ops.append({"op": "equal", "a": [len(before) - tail, len(before)], "b": [len(after) - tail, len(after)]})
    return ops


def prompt_view(trace: dict, previous: dict | None, vocab: Vocabulary | None) -> dict:
    """What GET /v1/traces/{id}/prompt answers. `vocab` is None when the trace is of another model
    than the one served: then the text alone, without token boundaries."""
    render = _render(trace)
    if not render:  # refused before rendering (a prompt far past the context, a template error)
        return {"text": None, "tokens": None, "not_kept": "not_rendered"}
    ids = render.get(attr.PROMPT_IDS)
    view: dict = {"text": render.get(attr.PROMPT_TEXT), "tokens": None,
                  "new_offset": render.get(attr.PROMPT_NEW_OFFSET, 0),
                  "thinking": render.get(attr.PROMPT_THINKING),
                  "count": render.get(attr.PROMPT_TOKENS),
                  "not_kept": render.get(attr.PROMPT_NOT_KEPT),
                  "media": _media(render)}
    if ids is None:
        return view  # recorded without content
    view["count"] = len(ids)
    if vocab is not None:
        view["tokens"] = prompt_tokens(ids, vocab)
    if previous is not None:
        seen = (_render(previous).get(attr.PROMPT_IDS) or []) + generated_ids(previous)
        edits = diff(seen, ids)
        view["against"] = previous["trace_id"]
        view["diff"] = edits
        if vocab is not None:  # the text the template dropped, which this prompt has no tokens for
            view["removed"] = {str(e["b"][0]): vocab.tokenizer.decode(seen[e["a"][0]:e["a"][1]])
                               for e in edits if e["op"] in ("delete", "replace")}
    return view
