"""codex's app-server (`codex app-server`), driven over its stdio transport: JSON-RPC 2.0 without the
`jsonrpc` field, one message a line (as codex 0.169's `app-server generate-json-schema` describes it).
What a rich client (the VS Code extension) does: start a thread, run turns, compact it on demand."""

from __future__ import annotations

import json
import queue
import subprocess
import threading
from pathlib import Path

import clients
import waiting


class AppServer:
    def __init__(self, installed: clients.Clients, home: Path, api_key: str, **env: str) -> None:
        environment = clients.client_env(home, api_key, CODEX_HOME=str(home / ".codex"), **env)
        self.process = subprocess.Popen([str(installed.codex), "app-server"], env=environment, cwd=home,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True, bufsize=1)
        self.notifications: list[dict] = []
        self._answers: dict[int, dict] = {}
        self._arrived: queue.Queue = queue.Queue()
        self._next = 0
        self._stderr: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=lambda: self._stderr.extend(self.process.stderr), daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            if line.strip():
                self._arrived.put(json.loads(line))
        self._arrived.put(None)

    def _pump(self) -> None:
        """One message read, if one arrives within a moment: an answer kept by id, a notification appended;
        a request of the server's (an approval) is refused, as a client that allows nothing would."""
        try:
            message = self._arrived.get(timeout=0.5)  # blocks until a message: the wait is on its arrival
        except queue.Empty:
            return
        if message is None:
            raise RuntimeError(f"codex app-server exited ({self.process.poll()}): {''.join(self._stderr)[-3000:]}")
        if "id" in message and "method" in message:
            self.send({"id": message["id"], "error": {"code": -32601, "message": "not allowed by the test"}})
        elif "id" in message:
            self._answers[message["id"]] = message
        else:
            self.notifications.append(message)

    def send(self, message: dict) -> None:
        self.process.stdin.write(json.dumps(message) + "\n")
        self.process.stdin.flush()

    def call(self, method: str, params: dict | None = None, timeout: float = 60) -> dict:
        self._next += 1
        number = self._next
        self.send({"method": method, "id": number, "params": params or {}})

        def answered() -> dict | None:
            if number not in self._answers:
                self._pump()
            return self._answers.pop(number, None)

        answer = waiting.wait_until(answered, timeout, every=0,
                                    what=lambda: f"{method}'s answer; stderr: {''.join(self._stderr)[-3000:]}")
        if "error" in answer:
            raise RuntimeError(f"{method}: {answer['error']}")
        return answer["result"]

    def wait_for(self, method: str, after: int = 0, timeout: float = 120, **params) -> dict:
        """The first notification `method` (its params including `params`) from index `after` on."""
        def found() -> dict | None:
            note = next((n for n in self.notifications[after:]
                         if n["method"] == method and params.items() <= n.get("params", {}).items()), None)
            if note is None:
                self._pump()
            return note

        return waiting.wait_until(found, timeout, every=0, what=lambda: (
            f"{method}; seen: {[n['method'] for n in self.notifications[after:]]}; "
            f"stderr: {''.join(self._stderr)[-3000:]}"))

    def start(self, cwd: Path) -> str:
        """Initialized, and a thread started in `cwd` that asks for no approval: its id."""
        self.call("initialize", {"clientInfo": {"name": "looptrace-tests", "version": "1"}})
        self.send({"method": "initialized"})
        thread = self.call("thread/start", {"cwd": str(cwd), "approvalPolicy": "never", "sandbox": "read-only"})
        return thread["thread"]["id"]

    def turn(self, thread: str, text: str) -> dict:
        """A turn run to its end: its turn/completed notification."""
        mark = len(self.notifications)
        self.call("turn/start", {"threadId": thread, "input": [{"type": "text", "text": text}]})
        return self.wait_for("turn/completed", after=mark, threadId=thread)

    def compact(self, thread: str) -> dict:
        """thread/compact/start, run to its end: its turn/completed notification."""
        mark = len(self.notifications)
        self.call("thread/compact/start", {"threadId": thread})
        return self.wait_for("turn/completed", after=mark, threadId=thread)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
