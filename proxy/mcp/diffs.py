"""diff_steps: two steps' prompts as a unified diff (difflib's), bounded.

Agent prompts mostly grow at the end, so the lines both share at the start and at the end are set
aside first (a count, never compared line by line), and difflib compares only the middle, at most
MIDDLE_LINES lines a side: past that its matching is quadratic, and the diff says it was cut.
"""

from __future__ import annotations

import difflib
import re

from .text import clean, one_line
from .tools import Refused, bounded, prompt_of, trace_of

DIFF_LINES = 400  # lines of the diff shown
LINE_CHARS = 400  # characters of each diff line
MIDDLE_LINES = 5_000
CONTEXT = 3


def _shared_ends(a: list[str], b: list[str]) -> tuple[int, int]:
    start = 0
    while start < len(a) and start < len(b) and a[start] == b[start]:
        start += 1
    end = 0
    while end < len(a) - start and end < len(b) - start and a[-1 - end] == b[-1 - end]:
        end += 1
    return start, end


def diff_text(before: str, after: str, names: tuple[str, str]) -> str:
    a, b = clean(before).splitlines(), clean(after).splitlines()
    start, end = _shared_ends(a, b)
    middle_a, middle_b = a[start:len(a) - end], b[start:len(b) - end]
    cut = max(len(middle_a), len(middle_b)) > MIDDLE_LINES
    head = [f"{names[0]}: {len(before):,} characters, {len(a):,} lines; {names[1]}: {len(after):,} characters, "
            f"{len(b):,} lines; the first {start:,} lines and the last {end:,} are the same"]
    if not middle_a and not middle_b:
        return "\n".join(head + ["The prompts are the same."])
    if cut:
        head.append(f"[the changed middle is over {MIDDLE_LINES:,} lines: only its first {MIDDLE_LINES:,} on each "
                    "side are compared]")
    keep = min(start, CONTEXT)  # the shared start's last lines and the shared end's first, as context
    after_end = a[len(a) - end:len(a) - end + CONTEXT] if end else []
    lines = list(difflib.unified_diff(a[start - keep:start] + middle_a[:MIDDLE_LINES] + after_end,
                                      b[start - keep:start] + middle_b[:MIDDLE_LINES] + after_end,
                                      names[0], names[1], n=CONTEXT, lineterm=""))
    lines = [_numbered(line, start - keep) if line.startswith("@@") else line for line in lines]
    shown = [line if len(line) <= LINE_CHARS else f"{line[:LINE_CHARS]}[… {len(line) - LINE_CHARS:,} more]"
             for line in lines[:DIFF_LINES]]
    if len(lines) > DIFF_LINES:
        shown.append(f"[… {len(lines) - DIFF_LINES:,} more diff lines elided …]")
    return "\n".join(head + shown)


_HUNK = re.compile(r"^@@ -(\d+)((?:,\d+)?) \+(\d+)((?:,\d+)?) @@")


def _numbered(hunk: str, offset: int) -> str:
    """A hunk's header with the prompts' own line numbers (difflib counts from the part it was given)."""
    return _HUNK.sub(lambda m: f"@@ -{int(m[1]) + offset}{m[2]} +{int(m[3]) + offset}{m[4]} @@", hunk)


def diff_steps(store, tenant: str | None, *, key: str, a: int, b: int, other_key: str = "") -> str:
    """Step `a` of session `key` against step `b` of `other_key` (default: the same session)."""
    prompts = []
    for session, number in ((key, a), (other_key or key, b)):
        prompt = prompt_of(trace_of(store, tenant, session, number))
        if prompt is None:
            raise Refused(f"Step {number} of {one_line(session, 200)!r} was recorded without its prompt.")
        prompts.append(prompt)
    names = (f"step {a}", f"step {b}" if not other_key else f"{one_line(other_key, 100)} step {b}")
    return bounded(diff_text(prompts[0], prompts[1], names))
