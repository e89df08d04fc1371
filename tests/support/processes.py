"""Programs a test starts (looptrace, Prometheus, Phoenix, …): a log file, a readiness wait, a clean stop."""

from __future__ import annotations

import os
import socket
import subprocess
import urllib.request
from pathlib import Path
from typing import Callable, TypeVar

import waiting

T = TypeVar("T")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def answers_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


class Service:
    """One child process whose output goes to a log file, shown whenever it fails."""

    name = "service"

    def __init__(self, command: list[str], log_path: Path, *, env: dict | None = None, cwd: Path | None = None,
                 inherit_env: bool = True) -> None:
        """`env` is added to this process's environment, or with `inherit_env=False` is the whole of it."""
        self.log_path = log_path
        self._log = open(log_path, "wb")
        self.process = subprocess.Popen(command, cwd=cwd, stdout=self._log, stderr=subprocess.STDOUT,
                                        env={**(os.environ if inherit_env else {}), **(env or {})})

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_until(self, ready: Callable[[], T], timeout: float) -> T:
        """`ready()`'s first answer that is something; a process that exits first, or the time running
        out, fails with its log."""
        def answered() -> T:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.process.returncode}:\n{self.log()}")
            return ready()

        try:
            return waiting.wait_until(answered, timeout, every=0.2)
        except AssertionError:
            raise TimeoutError(f"{self.name} was not ready after {timeout} s:\n{self.log()}") from None

    def stop(self, timeout: float = 20) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()
