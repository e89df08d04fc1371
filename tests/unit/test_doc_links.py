"""README.md is a front door of at most 300 lines whose every link leads somewhere, and the manual in docs/
is whole: every page in mkdocs.yml's nav, every link between pages to a file and heading that exist
(`mkdocs build --strict` in .ci/run checks the same again, with MkDocs itself)."""

from __future__ import annotations

import re

from manual import DOCS, README, ROOT, broken_links, links, page, pages, slug, without_code


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


PACKAGES = ("proxy", "families", "backends", "trace_store", "common")  # pyproject.toml's package folders


def modules_on_disk() -> set[str]:
    return {str(p.relative_to(ROOT)) for package in PACKAGES for p in (ROOT / package).rglob("*.py")
            if p.name != "__init__.py"}


def modules_in_map(text: str) -> set[str]:
    """The modules the development page's map names: its first code block is a tree of folders (a line
    that starts with `name/` and a gap opens one, its indent says inside which) whose text names their
    modules (`request.py`, or `chat/request.py` under a folder, or `families/deltas.py` from the root)."""
    block = text.split("```\n", 2)[1]
    folders: list[tuple[int, str]] = []  # (indent, path) from the root down
    named = set()
    for line in block.splitlines():
        indent = len(line) - len(line.lstrip())
        opened = re.match(r"([\w.]+/)\s{2,}", line.lstrip())
        if opened:
            while folders and folders[-1][0] >= indent:
                folders.pop()
            folders.append((indent, (folders[-1][1] if folders else "") + opened.group(1)))
        here = folders[-1][1] if folders else ""
        for name in re.findall(r"[\w/]*\w\.py\b", line):
            named.add(name if name.split("/")[0] in (*PACKAGES, "bench", "tests") else here + name)
    return named


def test_the_map_parser_reads_folders_inside_folders_and_paths_from_the_root():
    text = ("```\nproxy/     the server: cli.py\n  api/     app.py, chat/request.py\n    openai/  the\n"
            "             surface: routes.py\n  engine/  runtime.py (families/deltas.py dispatches)\n"
            "families/  one module each\n```\n")
    assert modules_in_map(text) == {"proxy/cli.py", "proxy/api/app.py", "proxy/api/chat/request.py",
                                    "proxy/api/openai/routes.py", "proxy/engine/runtime.py", "families/deltas.py"}


def test_the_development_pages_map_names_every_module_and_only_modules_that_are():
    """A module added, moved or renamed is found on the map where a reader of the code looks for it."""
    named = modules_in_map(page("development.md"))
    on_disk = modules_on_disk()
    assert not sorted(on_disk - named), f"modules the map of docs/development.md does not name: {sorted(on_disk - named)}"
    gone = sorted(n for n in named - on_disk if n.split("/")[0] in PACKAGES)
    assert not gone, f"the map names modules that are not there: {gone}"
