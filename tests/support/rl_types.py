"""The RL frameworks' own types, for checking `looptrace export`'s trainer formats against them.

verl's `AgentLoopOutput` and SkyRL's `TrajectoryOutput` live in modules that import Ray, hydra, vLLM
clients and more (and skyrl-train needs Python 3.12), so the classes are taken from the pinned wheel's
own source, each with the classes it names, and defined alone (pydantic, dataclasses, typing, torch for
annotations): the real definitions, not a copy. The wheels are downloaded once into the test cache
(`pip download --no-deps`), never installed.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import typing
import zipfile
from pathlib import Path

from build_cache import cached

WHEELS = {"verl": "verl==0.9.1", "skyrl": "skyrl==0.3.0"}
CLASSES = {"verl": ("verl/experimental/agent_loop/agent_loop.py", ("AgentLoopMetrics", "AgentLoopOutput")),
           "skyrl": ("skyrl/train/generators/skyrl_gym_generator.py", ("TrajectoryOutput",))}


def _download(folder: Path, requirement: str) -> None:
    done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(folder), requirement],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"pip download {requirement} failed: {done.stderr[-2000:]}")


def wheel(name: str) -> Path:
    folder = cached(f"rl-wheel-{name}", {"requirement": WHEELS[name]}, lambda out: _download(out, WHEELS[name]))
    (found,) = folder.glob("*.whl")
    return found


def framework_classes(name: str) -> dict[str, type]:
    """The named classes of the framework's module, defined from its wheel's source."""
    path, names = CLASSES[name]
    with zipfile.ZipFile(wheel(name)) as archive:
        source = archive.read(path).decode()
    tree = ast.parse(source)
    wanted = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name in names]
    assert [n.name for n in wanted] == list(names), f"{path} no longer defines {names}"
    import dataclasses

    import pydantic
    import torch

    namespace = {**vars(typing), "BaseModel": pydantic.BaseModel, "ConfigDict": pydantic.ConfigDict,
                 "dataclass": dataclasses.dataclass, "field": dataclasses.field, "torch": torch}
    module = ast.Module(body=wanted, type_ignores=[])
    exec(compile(module, f"{name}:{path}", "exec"), namespace)  # noqa: S102 - the framework's own class definitions
    classes = {n: namespace[n] for n in names}
    for cls in classes.values():  # a model naming another defined beside it: resolved now they all exist
        if hasattr(cls, "model_rebuild"):
            cls.model_rebuild(_types_namespace=namespace)
    return classes
