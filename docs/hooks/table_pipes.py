"""MkDocs hook: a `|` in a table cell is written `\\|`, as GitHub's tables need, and GitHub shows it without
the backslash, code spans included; Python-Markdown keeps the backslash in a code span, so it is
dropped here, in tables only."""

from __future__ import annotations

import re


def on_page_content(html: str, **_: object) -> str:
    return re.sub(r"<table>.*?</table>", lambda table: table.group(0).replace("\\|", "|"), html, flags=re.DOTALL)
