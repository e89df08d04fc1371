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

from array import array

from looptrace.common.redaction import Found

LINES_AROUND = 1  # lines of context each side: a run's edge tokens tokenize as in the whole prompt


def redacted_ids(tokenizer, ids, text: str, redacted: str, found: list[Found]) -> list[int]:
    """`ids` (the encoding of `text`) with the tokens of each credential in `found` replaced by ids of
    `redacted`'s markers there: the same count, decoding to no credential."""
    out = list(ids)
    for a, b, spans in _windows(text, found):
        run = _run(tokenizer, out, text, a, b, spans)
        if run is None:
            return same_count(tokenizer, redacted, len(out))
        start, end, run_text = run
        for span in spans:
            run_text = run_text.replace(text[span.start:span.end], redacted[span.start:span.end])
        out[start:end] = same_count(tokenizer, run_text, end - start)
    return out


def _windows(text: str, found: list[Found]) -> list[tuple[int, int, list[Found]]]:
    """Each credential's lines and LINES_AROUND more each side, windows that overlap merged."""
    windows: list[tuple[int, int, list[Found]]] = []
    for span in sorted(found):
        a = span.start
        for _ in range(LINES_AROUND + 1):
            a = text.rfind("\n", 0, a - 1) + 1 if a > 1 else 0
        b = span.end
        for _ in range(LINES_AROUND + 1):
            at = text.find("\n", b + 1)
            b = len(text) if at < 0 else at
        if windows and a <= windows[-1][1]:
            a0, _, spans = windows.pop()
            windows.append((a0, max(b, span.end), [*spans, span]))
        else:
            windows.append((a, b, [span]))
    return windows


def _run(tokenizer, ids: list[int], text: str, a: int, b: int, spans: list[Found]) -> tuple[int, int, str] | None:
    """(start, end) of the one run of `ids` that holds the window `text[a:b]`'s credentials, and that
    run's text; None when it cannot be told for sure."""
    window = tokenizer.encode(text[a:b], add_special_tokens=False)
    # A window's edge tokens may merge otherwise with the text beyond it: left out of the search.
    inner = window[1 if a else 0:len(window) - (1 if b < len(text) else 0)]
    if not inner:
        return None
    haystack, needle = array("i", ids).tobytes(), array("i", inner).tobytes()
    at = _aligned_find(haystack, needle, 0)
    if at < 0 or _aligned_find(haystack, needle, at + 4) >= 0:
        return None
    start = at // 4
    end = start + len(inner)
    run_text = tokenizer.decode(ids[start:end], skip_special_tokens=False, clean_up_tokenization_spaces=False)
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
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) < count:
        pad = tokenizer.encode("*", add_special_tokens=False) or [0]
        ids += pad * (count - len(ids))
    return ids[:count]
