"""A redacted prompt's ids, re-encoded where its credentials were, not whole.

A prompt that held a credential is stored as text with markers of the same length and ids that
decode to those markers, as many as before (every token offset kept into them stays right).
Re-encoding the whole redacted prompt did that at the cost of a second full tokenization (4 ms for
10 KB on these machines, most of what redaction added to a request). Here each credential's own
lines are encoded again, found among the prompt's ids, and only that run is replaced. Each step is
checked (the run is found once, and decodes to text that holds the credential); any doubt re-encodes
the whole prompt, as before.
"""

from __future__ import annotations

import functools
from array import array

from looptrace.common.redaction import Found

CONTEXT_CHARS = 24  # of text each side of a credential: its edge tokens may tokenize otherwise in the window


def redacted_ids(tokenizer, ids, text: str, redacted: str, found: list[Found]) -> list[int]:
    """`ids` (the encoding of `text`) with the tokens of each credential in `found` replaced by ids of
    `redacted`'s markers there: the same count, decoding to no credential."""
    haystack = array("i", ids).tobytes()  # searched as first encoded: windows do not overlap
    out = list(ids)
    for a, b, spans in _windows(text, found):
        run = _run(tokenizer, out, haystack, text, a, b, spans)
        if run is None:
            return same_count(tokenizer, redacted, len(out))
        start, end, run_text = run
        for span in spans:
            run_text = run_text.replace(text[span.start:span.end], redacted[span.start:span.end])
        out[start:end] = same_count(tokenizer, run_text, end - start)
    return out


def _windows(text: str, found: list[Found]) -> list[tuple[int, int, list[Found]]]:
    """Each credential with about CONTEXT_CHARS more each side, cut at whitespace (where a tokenizer's
    pre-tokenizer splits, so that all but a window's edge tokens are those of the whole prompt);
    windows that overlap merged."""
    windows: list[tuple[int, int, list[Found]]] = []
    for span in sorted(found):
        before, after = max(span.start - CONTEXT_CHARS, 0), span.end + CONTEXT_CHARS
        a = max(text.rfind(" ", 0, before), text.rfind("\n", 0, before), 0)
        ends = [at for at in (text.find(" ", after), text.find("\n", after)) if at >= 0]
        b = min(ends) if ends else len(text)
        if windows and a <= windows[-1][1]:
            a0, _, spans = windows.pop()
            windows.append((a0, b, [*spans, span]))
        else:
            windows.append((a, b, [span]))
    return windows


def _run(tokenizer, ids: list[int], haystack: bytes, text: str, a: int, b: int,
         spans: list[Found]) -> tuple[int, int, str] | None:
    """(start, end) of the one run of `ids` that holds the window `text[a:b]`'s credentials, and that
    run's text; None when it cannot be told for sure."""
    window = _encode(tokenizer, text[a:b])
    # A window's edge tokens may merge otherwise with the text beyond it: left out of the search.
    inner = window[1 if a else 0:len(window) - (1 if b < len(text) else 0)]
    if not inner:
        return None
    needle = array("i", inner).tobytes()
    at = _aligned_find(haystack, needle, 0)
    if at < 0 or _aligned_find(haystack, needle, at + 4) >= 0:
        return None
    start = at // 4
    end = start + len(inner)
    run_text = _decode(tokenizer, ids[start:end])
    if any(text[span.start:span.end] not in run_text for span in spans):
        return None
    return start, end, run_text


def _aligned_find(haystack: bytes, needle: bytes, at: int) -> int:
    """The first offset ≥ `at` where `needle` starts on an id's boundary (4 bytes), or -1."""
    while (at := haystack.find(needle, at)) >= 0 and at % 4:
        at += 1
    return at


def same_count(tokenizer, text: str, count: int) -> list[int]:
    """Ids of `text`, exactly `count` of them: cut, or padded with the ids of `*`."""
    ids = _encode(tokenizer, text)
    if len(ids) < count:
        pad = _star(tokenizer)
        ids += pad * (count - len(ids))
    return ids[:count]


@functools.lru_cache(maxsize=8)
def _star(tokenizer) -> list[int]:
    return _encode(tokenizer, "*") or [0]


def _decode(tokenizer, ids: list[int]) -> str:
    """The fast tokenizer's own decoding where there is one (transformers' checks each id first)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        return backend.decode(ids, skip_special_tokens=False)
    return tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def _encode(tokenizer, text: str) -> list[int]:
    """The fast tokenizer's own encoding where there is one (a fifth of transformers' cost for a line)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return tokenizer.encode(text, add_special_tokens=False)
    fast = getattr(backend, "encode_batch_fast", None)  # tokenizers ≥ 0.21: no offsets made, half the cost
    if fast is not None:
        return fast([text], add_special_tokens=False)[0].ids
    return backend.encode(text, add_special_tokens=False).ids
