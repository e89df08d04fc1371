"""Talking to looptrace processes that share one store (tests/integration/test_shared_store.py): each
request carries a traceparent of the test's own making, so the test knows every request's trace id."""

from __future__ import annotations

import http.client
import json
import secrets
import urllib.request

from server import Server


class Client:
    def __init__(self, server: Server) -> None:
        self.server = server

    def get(self, path: str, **kw) -> tuple[int, dict]:
        return self.server.get(path, **kw)

    def request(self, method: str, path: str, body: object | None = None, **kw) -> tuple[int, dict]:
        return self.server.request(method, path, body, **kw)

    def _traced(self, path: str, body: dict, headers: dict) -> tuple[int, dict, str]:
        trace_id = secrets.token_hex(16)
        headers = {**headers, "traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-01"}
        status, answer = self.server.post(path, body, headers=headers, timeout=60)
        return status, answer, trace_id

    def chat(self, conversation: str, messages: list[dict], max_tokens: int = 8) -> tuple[int, dict, str]:
        """Chat Completions as pi sends it: its session id in a header."""
        body = {"model": "m", "messages": messages, "max_tokens": max_tokens, "temperature": 0,
                "chat_template_kwargs": {"enable_thinking": False}}
        return self._traced("/v1/chat/completions", body, {"session_id": conversation})

    def respond(self, conversation: str, body: dict) -> tuple[int, dict, str]:
        """Responses as codex sends it: its session in `session-id`."""
        return self._traced("/v1/responses", body, {"session-id": conversation})

    def stream_quietly(self, conversation: str, messages: list[dict]) -> None:
        """A streamed answer read until it ends, or until the server goes away."""
        body = {"model": "m", "messages": messages, "max_tokens": 400, "stream": True, "temperature": 0}
        request = urllib.request.Request(self.server.url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json", "session_id": conversation})
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                while response.read(1024):
                    pass
        except (OSError, http.client.HTTPException):  # cut off: what the test is after
            pass

    def running(self) -> int:
        status, health = self.get("/health")
        return health.get("requests_running", 0) if status == 200 else 0

    def session(self, key: str, steps: int) -> dict | None:
        """The session, once it holds `steps` steps."""
        status, found = self.get(f"/v1/sessions/{key}")
        return found if status == 200 and len(found["steps"]) >= steps else None

    def stored(self, trace_id: str) -> dict | None:
        """The trace, once it is whole or known to have lost spans."""
        status, found = self.get(f"/v1/traces/{trace_id}")
        return found if status == 200 and (found["complete"] or found.get("lost_spans")) else None

    def metrics(self) -> str:
        with urllib.request.urlopen(self.server.url + "/metrics", timeout=30) as response:
            return response.read().decode()


def metric(text: str, name: str, labels: str = "") -> float:
    """One sample's value from a Prometheus text exposition (0 when absent)."""
    prefix = name + ("{" + labels + "}" if labels else "")
    for line in text.splitlines():
        if line.startswith(prefix + " "):
            return float(line.split()[-1])
    return 0.0
