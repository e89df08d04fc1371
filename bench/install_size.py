"""How much a relay's install holds: `pip install looptrace` (a relay, a replay server, the viewer, the
exporters) against the same with the local extra after the CPU torch (README's serve command: what
every install held before the extra existed), each in a new virtual environment, measured with du.

    python bench/install_size.py [--keep DIR]

Sizes, not timings: they do not depend on how busy the machine is. Prints one JSON line per install
(MiB of the whole environment and of its largest packages); docs/benchmarks.md quotes them.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))
from relay_install import build_wheel, installed, site_packages  # noqa: E402

TORCH = "torch==2.13.0"  # README's CPU torch


def mib(path: Path) -> float:
    done = subprocess.run(["du", "-sk", str(path)], capture_output=True, text=True, check=True)
    return round(int(done.stdout.split()[0]) / 1024, 1)


def measured(name: str, folder: Path) -> dict:
    site = site_packages(folder / "bin" / "python")
    packages = sorted(((mib(p), p.name) for p in site.iterdir() if p.is_dir() and not p.name.endswith("-info")),
                      reverse=True)
    return {"install": name, "venv_mib": mib(folder), "largest": [f"{n} {s} MiB" for s, n in packages[:6]]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", type=Path, help="build the environments here and leave them")
    args = parser.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="relay-install-"))
    try:
        wheel = build_wheel(root / "wheel")
        relay = root / "relay"
        installed(relay, str(wheel))
        print(json.dumps(measured("pip install looptrace", relay)), flush=True)
        local = root / "local"
        installed(local, TORCH)  # the CPU torch first, as README's command does; then the extra
        subprocess.run([str(local / "bin" / "python"), "-m", "pip", "install", "-q", f"{wheel}[local]"], check=True)
        print(json.dumps(measured(f"pip install {TORCH} && pip install 'looptrace[local]'", local)), flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
