"""The manual as the tests read it: README.md, the front door, and the pages of docs/ that MkDocs builds
(mkdocs.yml). The tests that hold the documentation to the code read the page where each table lives."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"


def page(name: str) -> str:
    """One page of docs/, e.g. `page("metrics.md")`."""
    return (DOCS / name).read_text()


def pages() -> list[Path]:
    return sorted(DOCS.glob("*.md"))


def slug(heading: str) -> str:
    """A heading's anchor as GitHub writes it, and MkDocs too (mkdocs.yml sets pymdownx's slugify to the
    same rule): markup dropped, lower case, what is neither a word character, a hyphen nor a space
    dropped, each space a hyphen."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = re.sub(r"</?[^>]*>|[`*]", "", text).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def without_code(text: str) -> str:
    """The text less fenced blocks, indented blocks and code spans, where a `[x](y)` is no link."""
    text = re.sub(r"^ *```.*?^ *```", "", text, flags=re.MULTILINE | re.DOTALL)
    text = re.sub(r"^(?: {4}|\t).*$", "", text, flags=re.MULTILINE)
    return re.sub(r"`[^`\n]*`", "", text)


def anchors(text: str) -> set[str]:
    """The anchors of a page's headings (outside code), a repeated one numbered as GitHub and MkDocs do."""
    found: set[str] = set()
    for line in re.sub(r"^ *```.*?^ *```", "", text, flags=re.MULTILINE | re.DOTALL).splitlines():
        if match := re.match(r"^#{1,6} +(.*?) *#*$", line):
            base = anchor = slug(match.group(1))
            n = 0
            while anchor in found:
                n += 1
                anchor = f"{base}-{n}"
            found.add(anchor)
    return found


def links(text: str) -> list[str]:
    """Every link and image target of a Markdown text, code left out."""
    return re.findall(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(<?([^)\s>]+)>?(?: \"[^\"]*\")?\)", without_code(text))


def broken_links(path: Path) -> list[str]:
    """The relative links of a Markdown file that lead nowhere: a file that is not there, or an anchor
    that none of its headings makes. Links with a scheme (https:, mailto:) are not followed."""
    broken = []
    for target in links(path.read_text()):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):
            continue
        file, _, anchor = target.partition("#")
        resolved = (path.parent / file).resolve() if file else path
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and (resolved.suffix != ".md" or anchor not in anchors(resolved.read_text())):
            broken.append(f"{target}: no heading makes #{anchor}")
    return broken
