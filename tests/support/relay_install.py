"""looptrace as a relay installs it: `pip install looptrace`, no extras, in a clean virtual environment.

What pip resolves for the wheel (its dependencies, from the index) is installed once into the test
cache, keyed by pyproject's dependency list, and looptrace itself taken out of it again; each run then
makes a fresh environment holding only the wheel built from this checkout, with the cached
dependencies beside it (a .pth line: the fresh environment's own packages come first). `looptrace` is
a namespace package, so no other copy of it may be on that path: a module the wheel lacks would be
found there. bench/install_size.py measures both installs' sizes (docs/benchmarks.md).
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
import venv
from pathlib import Path

from build_cache import cached

ROOT = Path(__file__).resolve().parents[2]


def build_wheel(out: Path) -> Path:
    """This checkout's wheel, without its dependencies."""
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                           str(out), str(ROOT)], capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(done.stdout + done.stderr)
    (wheel,) = out.glob("looptrace-*.whl")
    return wheel


def site_packages(python: Path) -> Path:
    found = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                           capture_output=True, text=True, check=True)
    return Path(found.stdout.strip())


def installed(folder: Path, requirement: str) -> Path:
    """A new environment in `folder` where `pip install REQUIREMENT` ran (from the index): its python."""
    venv.create(folder, with_pip=True)
    python = folder / "bin" / "python"
    done = subprocess.run([str(python), "-m", "pip", "install", "-q", requirement], capture_output=True, text=True,
                          timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(done.stdout[-3000:] + done.stderr[-3000:])
    return python


def dependencies() -> Path:
    """The site-packages of what `pip install looptrace` installs beside looptrace, built once."""
    requirements = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]

    def build(out: Path) -> dict:
        python = installed(out / "venv", str(build_wheel(out / "wheel")))
        subprocess.run([str(python), "-m", "pip", "uninstall", "-q", "-y", "looptrace"], check=True)
        listed = subprocess.run([str(python), "-m", "pip", "list", "--format", "freeze"], capture_output=True,
                                text=True, check=True).stdout.split()
        return {"packages": listed}

    folder = cached("relay-dependencies", {"dependencies": requirements, "python": sys.version.split()[0]}, build)
    return site_packages(folder / "venv" / "bin" / "python")


def relay_environment(folder: Path, wheel: Path) -> Path:
    """A fresh environment holding the wheel alone, the cached dependencies beside it: its bin/."""
    venv.create(folder, with_pip=True)
    python = folder / "bin" / "python"
    done = subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(done.stdout + done.stderr)
    (site_packages(python) / "relay-dependencies.pth").write_text(f"{dependencies()}\n")
    return folder / "bin"
