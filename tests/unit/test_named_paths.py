"""Every file a docstring, a comment or the manual names exists: a module moved or split leaves no
reader looking for the old one (13 docstrings named files that no longer existed after the second
round of moves: the old vllm_scoring, llama_cpp_reuse and families/media modules, ...).

A name is checked when it ends in .py or .md and stands in a docstring or a comment (string literals
in code are data: a test's `a.py`; the comments of pyproject.toml, the scripts and configuration too)
or in README.md and docs/ (outside code blocks, which show a user's own files; code spans are read).
It resolves as a path from the repository's root, from the naming file's folder, or as the end of a
tracked path (`vllm/routing/kv_index.py` is backends/vllm/routing/kv_index.py). Names of other projects' files say
whose they are with a prefix from EXTERNAL."""

from __future__ import annotations

import ast
import io
import re
import subprocess
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NAME = re.compile(r"(?<![\w/.:@~$-])((?:\.\./)*(?:[\w.-]+/)*[\w-]+\.(?:py|md))(?![\w/-])")
# Other projects' files, named where we say what we follow; `../shared/` is beside the checkout.
EXTERNAL = ("../shared/", "vllm/distributed/", "vllm/v1/", "vllm/entrypoints/", "vllm/model_executor/",
            "vllm/sampling_params.py", "verl/", "skyrl/", "src/", "nemo_gym/", "transformers/", "openai/",
            "codex-rs/", "docs/sources/tempo/")  # Grafana's Tempo documentation, in compose/tempo.yaml
# Files that are examples, not ours: the PyPI package a generic name would collide with, and files a
# benchmark or test writes into a scratch folder of its own.
EXAMPLES = {"proxy.py", "a.py", "b.py", "inventory.py", "test_inventory.py", "test_parser.py", "tests/test_parser.py",
            "src/parse.py"}


SCRIPTS = (".toml", ".sh", ".yaml", ".yml")  # their comments too: pyproject.toml's name the modules an extra serves


def tracked() -> list[str]:
    """The working tree's files git knows or would add: a file deleted but not yet committed is gone."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.split()
    return sorted({path for path in listed if (ROOT / path).is_file()})


def prose_of_python(source: str) -> list[tuple[int, str]]:
    """(line, text) of a module's docstrings and comments."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                found.append((first.lineno, first.value.value))
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            found.append((token.start[0], token.string))
    return found


def stale_names(files: list[str]) -> list[str]:
    """'file:line name' for every name that resolves to nothing tracked."""
    known = set(files)
    stale = []
    for path in files:
        if path.endswith(".py"):
            prose = prose_of_python((ROOT / path).read_text(encoding="utf-8"))
        elif path.endswith(".md") and (path == "README.md" or path.startswith("docs/")):
            prose = [(1, _outside_blocks((ROOT / path).read_text(encoding="utf-8")))]
        elif path.endswith(SCRIPTS) or Path(path).name in ("Dockerfile", "run"):
            lines = (ROOT / path).read_text(encoding="utf-8").splitlines()
            prose = [(n, line.partition("#")[2]) for n, line in enumerate(lines, 1) if "#" in line]
        else:
            continue
        folder = Path(path).parent
        for line, text in prose:
            for match in NAME.finditer(text):
                name = match.group(1)
                if name in EXAMPLES or name.startswith(EXTERNAL) or _resolves(name, folder, known):
                    continue
                stale.append(f"{path}:{line + text.count(chr(10), 0, match.start())} {name}")
    return stale


def _outside_blocks(text: str) -> str:
    """A page less its fenced and indented blocks (a user's own files), lines kept in place."""
    blank = lambda match: "\n" * match.group(0).count("\n")  # noqa: E731
    text = re.sub(r"^ *```.*?^ *```", blank, text, flags=re.MULTILINE | re.DOTALL)
    return re.sub(r"^(?: {4}|\t).*$", "", text, flags=re.MULTILINE)


def _resolves(name: str, folder: Path, known: set[str]) -> bool:
    if name in known or (folder / name).as_posix() in known:
        return True
    if name.startswith("../"):
        return (ROOT / folder / name).resolve().is_relative_to(ROOT) and \
            (ROOT / folder / name).resolve().relative_to(ROOT).as_posix() in known
    return any(path.endswith("/" + name) for path in known)


def test_every_file_a_docstring_comment_or_page_names_exists():
    stale = stale_names(tracked())
    assert not stale, "files named that do not exist:\n" + "\n".join(stale)


def test_the_check_finds_a_moved_module_and_passes_a_path_by_its_end(tmp_path, monkeypatch):
    """The check can fail: a docstring naming a module that moved is found, wherever in the docstring;
    a path named by its end, a test's data and another project's file are not."""
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "pkg" / "vllm").mkdir(parents=True)
    (tmp_path / "pkg" / "vllm" / "kv_index.py").write_text("")
    (tmp_path / "pkg" / "mod.py").write_text(
        '"""Reads what vllm/kv_index.py keeps.\n\nOnce in vllm_scoring.py; vLLM\'s vllm/v1/core/block_pool.py."""\n'
        'DATA = "a_test_file.py"  # now in llama_cpp_reuse.py\n')
    assert stale_names(["pkg/vllm/kv_index.py", "pkg/mod.py"]) == ["pkg/mod.py:3 vllm_scoring.py",
                                                                   "pkg/mod.py:4 llama_cpp_reuse.py"]
