"""One installed `looptrace` namespace that lives beside other packages, proxy.py's `proxy` among them:
the wheel built, and installed into a fresh virtual environment. The layer contracts are checked in
tests/unit/test_layout.py."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import packaged

ROOT = Path(__file__).resolve().parents[2]


def test_the_wheel_installs_beside_proxy_py(tmp_path):
    wheels = tmp_path / "wheels"
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(wheels), str(ROOT)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = wheels.glob("looptrace-*.whl")

    env_dir = tmp_path / "fresh"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    installed = subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                                str(packaged.proxy_py_wheel()), str(wheel)], capture_output=True, text=True,
                               timeout=300)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    # looptrace's dependencies (aiohttp, torch, ...) from this environment, after the fresh one's own
    # packages; a .pth line only extends sys.path, so this environment's editable looptrace stays out.
    fresh_site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                capture_output=True, text=True, check=True).stdout.strip()
    (Path(fresh_site) / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    check = """
import proxy, proxy.proxy
import looptrace.proxy.api.app, looptrace.proxy.cli, looptrace.families, looptrace.backends.base
import looptrace.trace_store.sqlite
assert callable(proxy.main), "proxy.py's own entry point"
assert callable(looptrace.proxy.api.app.create_app)
print(proxy.__file__)
print(looptrace.proxy.api.app.__file__)
"""
    done = subprocess.run([str(python), "-c", check], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    proxy_file, looptrace_file = done.stdout.split()
    assert proxy_file.startswith(fresh_site) and proxy_file.endswith("proxy/__init__.py")
    assert looptrace_file == str(Path(fresh_site) / "looptrace" / "proxy" / "api" / "app.py")

    help_text = subprocess.run([str(env_dir / "bin" / "looptrace"), "serve", "--help"], capture_output=True,
                               text=True, timeout=120)
    assert help_text.returncode == 0 and "--trace-db" in help_text.stdout, help_text.stderr
