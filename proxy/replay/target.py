"""The server a session is replayed against, reached over HTTP: another looptrace (any backend it
serves: POST /v1/score and /v1/generate, proxy/api/targets.py) or a vLLM server directly (scoring by
its `prompt_logprobs`, backends/prompt_logprobs.py: the same request and the same reading as the vLLM
backend's own).

Which one a URL is, is found by asking: looptrace's /health answers JSON naming its backend, vLLM's
answers an empty 200. Requests are plain blocking HTTP (urllib): a replay asks one thing at a time.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from urllib.parse import urlsplit, urlunsplit

from looptrace.backends.prompt_logprobs import read_scores, score_body

from .recorded import ReplayError


class Target:
    kind = ""  # "looptrace" or "vllm"

    def __init__(self, url: str, api_key: str | None, timeout: float) -> None:
        url = url.rstrip("/")
        self.url = url[: -len("/v1")] if url.endswith("/v1") else url  # an OpenAI base URL works too
        self.api_key, self.timeout = api_key, timeout
        self.model, self.backend, self.max_model_len = "", "", 0

    @property
    def shown(self) -> str:
        """The URL as a report and a trace may show it: no user or password."""
        parts = urlsplit(self.url)
        host = parts.hostname or ""
        netloc = (f"[{host}]" if ":" in host else host) + (f":{parts.port}" if parts.port else "")
        return urlunsplit((parts.scheme, netloc, parts.path, "", ""))

    def call(self, method: str, path: str, body: dict | None = None) -> tuple[int, object]:
        """(status, the JSON answer); a server that cannot be reached is a ReplayError."""
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                status, raw = response.status, response.read()
        except urllib.error.HTTPError as err:
            status, raw = err.code, err.read()
        except (urllib.error.URLError, OSError) as exc:
            raise ReplayError(f"cannot reach the target {self.shown}: {getattr(exc, 'reason', exc)}") from exc
        try:
            return status, json.loads(raw) if raw.strip() else None
        except json.JSONDecodeError:
            return status, raw.decode(errors="replace")

    def asked(self, path: str, body: dict) -> dict:
        status, answer = self.call("POST", path, body)
        if status != 200 or not isinstance(answer, dict):
            message = answer.get("error", {}).get("message") if isinstance(answer, dict) else answer
            raise ReplayError(f"the target {self.shown} refused {path} ({status}): {message}")
        return answer

    def score(self, prompt_ids: list[int], answer_ids: list[int]) -> list[dict]:
        raise NotImplementedError

    def generate(self, body: dict) -> dict:
        raise ReplayError(f"step mode decodes each prompt afresh and parses the answer, which needs a looptrace "
                          f"target; {self.shown} is a {self.kind} server (put looptrace --backend {self.kind} in front "
                          "of it)")


class LooptraceTarget(Target):
    kind = "looptrace"

    def score(self, prompt_ids: list[int], answer_ids: list[int]) -> list[dict]:
        return self.asked("/v1/score", {"model": self.model, "prompt_ids": prompt_ids,
                                        "answer_ids": answer_ids})["tokens"]

    def generate(self, body: dict) -> dict:
        return self.asked("/v1/generate", {"model": self.model, **body})["looptrace"]


class VLLMTarget(Target):
    kind = "vllm"

    def score(self, prompt_ids: list[int], answer_ids: list[int]) -> list[dict]:
        answer = self.asked("/v1/completions", score_body(self.model, prompt_ids, answer_ids))
        try:
            return read_scores(answer, len(prompt_ids), answer_ids)
        except ValueError as exc:
            raise ReplayError(f"the vLLM server at {self.shown} answered in a shape this replay cannot read: {exc}") \
                from exc


def connect(url: str, *, api_key: str | None = None, timeout: float = 600.0) -> Target:
    """The target at `url`, its kind found and its model named."""
    probe = Target(url, api_key, timeout)
    status, health = probe.call("GET", "/health")
    is_looptrace = isinstance(health, dict) and "backend" in health
    target = (LooptraceTarget if is_looptrace else VLLMTarget)(url, api_key, timeout)
    if is_looptrace and health.get("status") != "ready":
        raise ReplayError(f"the target {target.shown} is not ready: {health.get('status')} {health.get('error', '')}")
    status, models = target.call("GET", "/v1/models")
    if status != 200 or not isinstance(models, dict) or not models.get("data"):
        raise ReplayError(f"the target {target.shown} does not list a model at /v1/models ({status}): is it a looptrace "
                          "or vLLM server?")
    first = models["data"][0]
    target.model = first["id"]
    target.max_model_len = first.get("max_model_len") or 0
    target.backend = health.get("backend", "") if is_looptrace else "vllm"
    return target
