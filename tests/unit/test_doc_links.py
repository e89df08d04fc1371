"""README.md is a front door of at most 300 lines whose every link leads somewhere, and the manual in docs/
is whole: every page in mkdocs.yml's nav, every link between pages to a file and heading that exist
(`mkdocs build --strict` in .ci/run checks the same again, with MkDocs itself)."""

from __future__ import annotations

import re

from manual import DOCS, README, ROOT, broken_links, links, pages, slug, without_code


def test_the_checker_finds_a_missing_file_and_a_missing_anchor(tmp_path):
    (tmp_path / "page.md").write_text("# A page\n\n## Several worker processes (`--workers`)\n\n## Twice\n\n## Twice\n")
    doc = tmp_path / "doc.md"
    doc.write_text("[ok](page.md#several-worker-processes---workers) [ok](page.md#twice-1) [self](#top)\n"
                   "[gone](gone.md) [no anchor](page.md#nowhere) ![picture](missing.png)\n"
                   "`[in code](nowhere.md)` [out](https://example.com/x#y)\n\n# Top\n")
    assert broken_links(doc) == ["gone.md: no such file", "page.md#nowhere: no heading makes #nowhere",
                                 "missing.png: no such file"]
    assert slug("`looptrace serve`") == "looptrace-serve" and slug("llama.cpp (GGUF files)") == "llamacpp-gguf-files"


def test_readme_is_a_front_door_whose_links_resolve():
    text = README.read_text()
    assert len(text.splitlines()) <= 300
    targets = links(text)
    # It leads into the manual, and shows the viewer.
    assert any(t.startswith("docs/") and t.endswith(".png") for t in targets)
    assert {t.partition("#")[0] for t in targets if t.endswith(".md") or ".md#" in t} >= {"docs/index.md", "docs/development.md"}
    assert not broken_links(README)


def test_every_page_is_in_the_nav_and_every_link_between_pages_resolves():
    nav = re.findall(r"^\s+- [^:\n]+: (\S+\.md)$", (ROOT / "mkdocs.yml").read_text(), re.MULTILINE)
    assert sorted(nav) == sorted(p.name for p in pages()) and len(nav) == len(set(nav))
    assert (DOCS / "index.md") in pages()
    broken = {p.name: broken_links(p) for p in pages() if broken_links(p)}
    assert not broken
    # Every page has one title, the heading MkDocs shows.
    titles = {p.name: [line for line in without_code(p.read_text()).splitlines() if line.startswith("# ")]
              for p in pages()}
    assert all(len(found) == 1 for found in titles.values()), titles
