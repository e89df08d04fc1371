"""A vLLM server that looptrace starts itself: `--backend vllm` without `--vllm-url`.

The command (`--vllm-command`, `{model}` and `{port}` filled in, a free loopback port chosen; `{kv_events}`
with vLLM's --kv-events-config, publishing on sockets of a folder of its own, which looptrace follows:
routing/kv_events.py) runs in a process group of its own; its output is logged line by line with a `vllm|`
prefix and its last lines kept, so that when it exits or never gets ready the reason is said, not
guessed. looptrace waits for its /health while saying how long it has waited and what it printed last;
once ready, a server that dies is started again (after 1, 2, 5 … 30 s), and stopping looptrace stops
the whole group (and, on Linux, the kernel stops it should looptrace itself be killed).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import logging
import os
import shlex
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable

import aiohttp

log = logging.getLogger("looptrace")

DEFAULT_COMMAND = "vllm serve {model} --host 127.0.0.1 --port {port} --kv-events-config {kv_events}"
WITHOUT_EVENTS = "vllm serve {model} --host 127.0.0.1 --port {port}"
KEPT_LINES = 40  # the server's last lines, said when it fails
PROGRESS_SECONDS = 15.0  # between "still starting" lines
RESTART_SECONDS = (1, 2, 5, 10, 30)
STOP_SECONDS = 15.0  # between SIGTERM and SIGKILL


def free_port() -> int:
    """A port nobody listens on now (another process may take it before vLLM does: then vLLM fails
    to bind and says so, which is reported like any other failure to start)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def kv_events_missing() -> str | None:
    """Why vLLM's KV events cannot be read here, or None."""
    if all(importlib.util.find_spec(name) for name in ("zmq", "msgpack")):
        return None
    return "reading vLLM's KV events needs pyzmq and msgpack: pip install 'looptrace[vllm]'"


def default_command() -> str:
    """vLLM with its KV events on, when they can be read here (else routing estimates what it holds)."""
    missing = kv_events_missing()
    if missing:
        log.warning("%s; the vLLM looptrace starts publishes none, and routing estimates what it holds", missing)
        return WITHOUT_EVENTS
    return DEFAULT_COMMAND


def kv_events_config(folder: str) -> tuple[str, str]:
    """vLLM's --kv-events-config publishing on two sockets in `folder` (ipc://: nothing listens on the network),
    and the endpoints looptrace reads, as --vllm-kv-events takes them."""
    endpoint, replay = f"ipc://{folder}/kv-events", f"ipc://{folder}/kv-replay"
    config = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": endpoint, "replay_endpoint": replay,
              "topic": "kv-events"}
    return json.dumps(config, separators=(",", ":")), f"{endpoint},{replay}"


def command_line(template: str, model: str, port: int, kv_events: str = "") -> list[str]:
    """The template split as a shell would, then `{model}`, `{port}` and `{kv_events}` filled in each word
    (never str.format: a JSON flag's braces stay as they are)."""
    return [word.replace("{model}", model).replace("{port}", str(port)).replace("{kv_events}", kv_events)
            for word in shlex.split(template)]


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM it when looptrace's process goes (Linux's PR_SET_PDEATHSIG)."""
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)


class SpawnedVLLM:
    def __init__(self, template: str, model: str, *, start_timeout: float) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.kv_events: str | None = None  # where its KV events are read (ENDPOINT,REPLAY), when it publishes them
        self._folder: str | None = None
        config = ""
        if "{kv_events}" in template:
            missing = kv_events_missing()
            if missing:
                raise RuntimeError(f"--vllm-command has {{kv_events}}: {missing}")
            self._folder = tempfile.mkdtemp(prefix="looptrace-vllm-")
            config, self.kv_events = kv_events_config(self._folder)
        self.command = command_line(template, model, self.port, config)
        self.start_timeout = start_timeout
        self.lines: deque[str] = deque(maxlen=KEPT_LINES)
        self.restarts = 0
        self._process: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task | None = None
        self._watcher: asyncio.Task | None = None
        self._stopping = False

    async def start(self, progress: Callable[[str], None]) -> None:
        """Starts the server and waits until /health answers; a RuntimeError with its last lines when it
        exits first or is not ready within the start timeout. `progress` hears how it goes."""
        await self._spawn()
        await self._until_ready(progress)
        self._watcher = asyncio.create_task(self._watch())

    async def _spawn(self) -> None:
        log.info("starting vLLM: %s", shlex.join(self.command))
        try:
            self._process = await asyncio.create_subprocess_exec(
                *self.command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
                stdin=asyncio.subprocess.DEVNULL, start_new_session=True, preexec_fn=_die_with_parent)
        except OSError as exc:  # not installed, not executable
            raise RuntimeError(f"--vllm-command could not be run ({shlex.join(self.command)}): {exc}; install vLLM "
                               "or give --vllm-command the way to start it") from exc
        self._reader = asyncio.create_task(self._read(self._process))

    async def _read(self, process: asyncio.subprocess.Process) -> None:
        async for raw in process.stdout:
            line = raw.decode(errors="replace").rstrip()
            if line:
                self.lines.append(line)
                log.info("vllm| %s", line)

    async def _until_ready(self, progress: Callable[[str], None]) -> None:
        started = time.monotonic()
        said = started
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session:
            while True:
                if self._process.returncode is not None:
                    await self._drained()
                    raise RuntimeError(f"vLLM exited with code {self._process.returncode} before it was ready; "
                                       f"its last lines:\n{self.last_lines()}")
                waited = time.monotonic() - started
                if waited > self.start_timeout:
                    await self.stop()
                    raise RuntimeError(f"vLLM was not ready after {self.start_timeout:g} s (--vllm-start-timeout); "
                                       f"its last lines:\n{self.last_lines()}")
                if await _healthy(session, self.url):
                    log.info("vLLM is ready at %s after %.0f s", self.url, waited)
                    return
                if time.monotonic() - said >= PROGRESS_SECONDS:
                    said = time.monotonic()
                    log.info("vLLM still starting (%.0f s): %s", waited, self.lines[-1] if self.lines else "no output")
                progress(f"starting vLLM ({waited:.0f} s): {self.lines[-1] if self.lines else 'no output yet'}")
                await asyncio.sleep(0.5)

    async def _watch(self) -> None:
        """Once ready: a server that exits is started again, until looptrace stops."""
        attempt = 0
        while not self._stopping:
            await self._process.wait()
            if self._stopping:
                return
            await self._drained()
            delay = RESTART_SECONDS[min(attempt, len(RESTART_SECONDS) - 1)]
            log.warning("vLLM exited with code %s; starting it again in %d s. Its last lines:\n%s",
                        self._process.returncode, delay, self.last_lines())
            await asyncio.sleep(delay)
            try:
                await self._spawn()
                await self._until_ready(lambda _: None)
                self.restarts += 1
                attempt = 0
            except RuntimeError as exc:
                log.error("%s", exc)
                attempt += 1

    async def _drained(self) -> None:
        """Its output read to the end, so the last lines are all there."""
        if self._reader is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._reader), 5)

    def last_lines(self) -> str:
        return "\n".join(self.lines) or "(it printed nothing)"

    def health(self) -> dict:
        process = self._process
        return {"command": shlex.join(self.command), "pid": process.pid if process else None,
                "running": process is not None and process.returncode is None, "restarts": self.restarts}

    async def stop(self) -> None:
        """The whole process group: SIGTERM, then SIGKILL if it has not gone in STOP_SECONDS."""
        self._stopping = True
        if self._watcher is not None:
            self._watcher.cancel()
        if self._folder is not None:  # its sockets' folder: vLLM binds them again should it be started again
            shutil.rmtree(self._folder, ignore_errors=True)
        process = self._process
        if process is None or process.returncode is not None:
            return
        for sig, wait in ((signal.SIGTERM, STOP_SECONDS), (signal.SIGKILL, 5.0)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, sig)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(process.wait(), wait)
                break
        if self._reader is not None:
            self._reader.cancel()


async def _healthy(session: aiohttp.ClientSession, url: str) -> bool:
    try:
        async with session.get(url + "/health") as response:
            return response.status == 200
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
        return False
