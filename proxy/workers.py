"""`looptrace serve --workers N`: N server processes on one port, supervised by this one.

One event loop saturates before the relay's cores do: at 64 streams every stream's wait for its
first token queued behind every other stream's tokens. So N workers, each a whole `looptrace serve`
(its own event loop, tokenizer and trace writer), bind the same port with SO_REUSEPORT, and the
kernel spreads connections over them. This process holds no model and serves nothing: it checks that
the port is free, starts the workers, starts again one that dies (saying so), and on SIGTERM or SIGINT has each
drain its requests and stop; its exit code says whether all of them stopped cleanly.

Only backends whose registry entry says `can.workers` (a relay: no model in the process's memory)
may have several; the metrics of all of them are one /metrics (observe/metrics.py).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

from looptrace.backends import registry

from .settings import Settings

log = logging.getLogger("looptrace")

QUICK_DEATH_SECONDS = 10.0  # a worker that dies sooner after its start failed to start
GIVE_UP_AFTER = 5  # quick deaths in a row of one worker before the whole server stops
STOP_SECONDS = 75.0  # a worker's drain (aiohttp waits up to 60 s for its requests) and its exit
POLL_SECONDS = 0.1
CLI = __name__.rpartition(".")[0] + ".cli"  # each worker is `python -m` this package's command line


def refusal(settings: Settings) -> str | None:
    """Why these settings cannot run as several workers, or None."""
    if settings.workers < 1:
        return "--workers must be at least 1"
    if settings.workers == 1:
        return None
    entry = registry.entry(settings.backend)
    if not entry.can.workers:
        able = " and ".join(e.name for e in registry.ENTRIES if e.can.workers)
        return (f"--workers is for --backend {able}: --backend {settings.backend} holds the model in the process's "
                "memory, and each worker would load one of its own")
    if settings.port == 0:
        return "--workers needs a --port: every worker binds the same one"
    if entry.can.upstreams and not settings.vllm_urls:
        return "--workers needs --vllm-url: without it each worker would start a vLLM server of its own"
    return None


@dataclass(slots=True)
class _Worker:
    slot: int
    process: subprocess.Popen
    started: float
    quick_deaths: int = 0


class Supervisor:
    def __init__(self, settings: Settings, argv: list[str]) -> None:
        self.settings = settings
        self.argv = argv  # the command line, given again to each worker with --worker-slot
        self.workers: dict[int, _Worker] = {}
        self.metrics_dir = ""
        self._stopping = 0  # signals received: 1 drains, 2 stops at once

    def run(self) -> int:
        self._check_port()
        self.metrics_dir = tempfile.mkdtemp(prefix="looptrace-metrics-")  # fresh: no earlier run's counts
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            self._start(0)
            if self._first_up():  # it created or upgraded the trace store alone; now the others start
                for slot in range(1, self.settings.workers):
                    self._start(slot)
                log.info("%d workers on http://%s:%d/v1 (pids %s)", self.settings.workers, self.settings.host,
                         self.settings.port, ", ".join(str(w.process.pid) for w in self.workers.values()))
                code = self._supervise()
            else:
                stopped = self._stop_all()
                code = stopped if self._stopping else 1
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self._release()
        return code

    # -- the port --

    def _check_port(self) -> None:
        """Refuses a port something else listens on. The workers bind with SO_REUSEPORT, which would let
        them share the port unnoticed with another server of this user that does too (a second
        looptrace): so the check is a bind without it, which any listener refuses."""
        s = self.settings
        try:
            addresses = socket.getaddrinfo(s.host, s.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        except socket.gaierror as exc:
            raise SystemExit(f"looptrace: --host {s.host}: {exc.strerror}") from None
        for family, kind, proto, _, address in addresses:
            with socket.socket(family, kind, proto) as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as asyncio's: TIME_WAIT is no owner
                try:
                    sock.bind(address)
                except OSError as exc:
                    taken = exc.errno == errno.EADDRINUSE
                    raise SystemExit(f"looptrace: {s.host}:{s.port} is {'in use' if taken else 'not usable'}"
                                     f"{'' if taken else f' ({exc.strerror})'}") from None

    # -- the workers --

    def _start(self, slot: int) -> None:
        env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": self.metrics_dir}
        command = [sys.executable, "-m", CLI, *self.argv, "--worker-slot", str(slot)]
        # Its own session: a terminal's Ctrl-C reaches this process only, which stops each worker once.
        process = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, start_new_session=True,
                                   preexec_fn=_die_with_parent)
        previous = self.workers.get(slot)
        self.workers[slot] = _Worker(slot, process, time.monotonic(), previous.quick_deaths if previous else 0)

    def _first_up(self) -> bool:
        """Whether worker 0 came to answer on the port (its trace store is open by then), restarted as
        any worker is if it dies first; False when a stop was asked for or it kept dying."""
        url = f"http://{_reachable(self.settings.host)}:{self.settings.port}/health"
        while not self._stopping:
            first = self.workers[0]
            code = first.process.poll()
            if code is not None:
                self._forget(first)
                if not self._restart(first, code):
                    return False
                continue
            try:
                with urllib.request.urlopen(url, timeout=1):
                    return True
            except urllib.error.HTTPError:
                return True  # it answers (503 while loading)
            except OSError:
                time.sleep(POLL_SECONDS)
        return False

    def _supervise(self) -> int:
        """Restarts workers that die until a stop is asked for (or one keeps dying at start); then stops all."""
        while not self._stopping:
            for worker in list(self.workers.values()):
                code = worker.process.poll()
                if code is None:
                    continue
                self._forget(worker)
                if not self._restart(worker, code):
                    self._stop_all()
                    return 1
            time.sleep(POLL_SECONDS)
        return self._stop_all()

    def _restart(self, worker: _Worker, code: int) -> bool:
        lived = time.monotonic() - worker.started
        worker.quick_deaths = worker.quick_deaths + 1 if lived < QUICK_DEATH_SECONDS else 0
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
        if worker.quick_deaths >= GIVE_UP_AFTER:
            log.error("worker %d (pid %d) %s, %d times within %.0f s of starting: stopping (its log lines are above)",
                      worker.slot, worker.process.pid, how, worker.quick_deaths, QUICK_DEATH_SECONDS)
            return False
        pause = min(30.0, 2.0 ** (worker.quick_deaths - 1)) if worker.quick_deaths else 0.0
        log.warning("worker %d (pid %d) %s after %.1f s; restarting it%s", worker.slot, worker.process.pid, how,
                    lived, f" in {pause:.0f} s" if pause else "")
        deadline = time.monotonic() + pause
        while time.monotonic() < deadline and not self._stopping:
            time.sleep(POLL_SECONDS)
        if self._stopping:
            return True
        self._start(worker.slot)
        log.info("worker %d restarted (pid %d)", worker.slot, self.workers[worker.slot].process.pid)
        return True

    def _forget(self, worker: _Worker) -> None:
        """A dead worker's live gauges leave the sums; its counters and histograms stay counted."""
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.process.pid, self.metrics_dir)

    def _stop_all(self) -> int:
        """SIGTERM to each worker (it stops listening, finishes its requests, flushes its traces);
        0 when every one then exited cleanly, 1 when one failed or had to be killed."""
        running = [w for w in self.workers.values() if w.process.poll() is None]
        log.info("stopping %d workers: each finishes its requests first", len(running))
        for worker in running:
            with contextlib.suppress(ProcessLookupError):
                worker.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_SECONDS
        clean = True
        for worker in running:
            while worker.process.poll() is None and time.monotonic() < deadline and self._stopping < 2:
                time.sleep(POLL_SECONDS)
            if worker.process.poll() is None:
                log.error("worker %d (pid %d) did not stop in time: killing it", worker.slot, worker.process.pid)
                worker.process.kill()
                worker.process.wait()
            if worker.process.returncode != 0:
                clean = False
                log.error("worker %d (pid %d) stopped with code %s", worker.slot, worker.process.pid,
                          worker.process.returncode)
        log.info("workers stopped%s", "" if clean else ", not all of them cleanly")
        return 0 if clean else 1

    def _on_signal(self, signum: int, _frame) -> None:
        self._stopping += 1
        if self._stopping == 2:
            log.warning("%s again: stopping the workers without waiting for their requests",
                        signal.Signals(signum).name)

    def _release(self) -> None:
        if self.metrics_dir:
            shutil.rmtree(self.metrics_dir, ignore_errors=True)


def _reachable(host: str) -> str:
    """Where this machine reaches a server bound to `host`."""
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


def _die_with_parent() -> None:
    """In the worker, before exec: SIGTERM it when this process goes, even by SIGKILL (Linux's
    PR_SET_PDEATHSIG), so that no worker keeps serving the port on its own."""
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)


def supervise(settings: Settings, argv: list[str]) -> int:
    return Supervisor(settings, argv).run()
