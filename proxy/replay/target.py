"""The server a session is replayed against, reached over HTTP: another looptrace (any backend it
serves: POST /v1/score and /v1/generate, proxy/api/native/score.py and generate.py) or a vLLM server
directly (scoring by its `prompt_logprobs`, backends/vllm/prompt_logprobs.py: the same request and the
same reading as the vLLM backend's own).

Which one a URL is, is found by asking: looptrace's /health answers JSON naming its backend, vLLM's
answers an empty 200. Requests are plain blocking HTTP (urllib): a replay asks one thing at a time,
of an http(s) URL only, never following a redirect (a target is asked exactly where it was named),
and what it answers is checked for the shape read before anything reads it: a server that is not one
of these says so in a line, never a traceback.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from urllib.parse import urlsplit, urlunsplit

from looptrace.backends.vllm.prompt_logprobs import read_scores, score_body
from looptrace.trace_store.recorded_sessions import ReplayError

from .arguments import DEFAULT_TIMEOUT


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: PLR0913 - urllib's signature
        return None  # the 3xx is then an HTTPError, answered in Target.call


_OPENER = urllib.request.build_opener(_NoRedirects)


def _checked_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        shown = url.split("://", 1)[0] + "://…" if "://" in url else repr(url[:80])
        raise ReplayError(f"--target must be an http:// or https:// URL of a server, not {shown}")
    return url


def _one_line(text: str, most: int = 200) -> str:
    """What a server answered, as a line of a message: an HTML page is not shown whole."""
    line = " ".join(text.split())
    return line if len(line) <= most else line[:most] + "…"


class Target:
    kind = ""  # "looptrace" or "vllm"

    def __init__(self, url: str, api_key: str | None, timeout: float) -> None:
        url = _checked_url(url).rstrip("/")
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
            with _OPENER.open(request, timeout=self.timeout) as response:
                status, raw = response.status, response.read()
        except urllib.error.HTTPError as err:
            status, raw = err.code, err.read()
            if 300 <= status < 400:
                raise ReplayError(f"the target {self.shown} answered {path} with a redirect ({status}, to "
                                  f"{_one_line(err.headers.get('Location') or '?', 120)}); a replay does not follow "
                                  "redirects: give --target the URL of the server itself") from None
        except (urllib.error.URLError, OSError) as exc:
            raise ReplayError(f"cannot reach the target {self.shown}: {getattr(exc, 'reason', exc)}") from exc
        try:
            return status, json.loads(raw) if raw.strip() else None
        except ValueError:  # not JSON, or not even UTF-8 (an HTML page)
            return status, raw.decode(errors="replace")

    def asked(self, path: str, body: dict) -> dict:
        status, answer = self.call("POST", path, body)
        if status != 200:
            error = answer.get("error") if isinstance(answer, dict) else answer
            message = error.get("message") if isinstance(error, dict) else error
            raise ReplayError(f"the target {self.shown} refused {path} ({status}): {_one_line(str(message))}")
        if not isinstance(answer, dict):
            raise self.misshapen(path, f"not a JSON object but {_one_line(str(answer), 80)}")
        return answer

    def misshapen(self, path: str, what: str) -> ReplayError:
        return ReplayError(f"the target {self.shown} answered {path} in a shape this replay cannot read: {what} (is "
                           "it a looptrace or vLLM server of a version that speaks it?)")

    def score(self, prompt_ids: list[int], answer_ids: list[int]) -> list[dict]:
        raise NotImplementedError

    def generate(self, body: dict) -> dict:
        raise ReplayError(f"step mode decodes each prompt afresh and parses the answer, which needs a looptrace "
                          f"target; {self.shown} is a {self.kind} server (put looptrace --backend {self.kind} in front "
                          "of it)")


class LooptraceTarget(Target):
    kind = "looptrace"

    def score(self, prompt_ids: list[int], answer_ids: list[int]) -> list[dict]:
        tokens = self.asked("/v1/score", {"model": self.model, "prompt_ids": prompt_ids,
                                          "answer_ids": answer_ids}).get("tokens")
        if not isinstance(tokens, list) or len(tokens) != len(answer_ids):
            raise self.misshapen("/v1/score", f"'tokens' is not a list of {len(answer_ids)} scores")
        for token in tokens:
            if not _has(token, {"greedy_id": int, "rank": int, "logprob": float, "greedy_logprob": float}) or not (
                    token["logprob"] <= 0 and token["greedy_logprob"] <= 0):
                raise self.misshapen("/v1/score", "a token without an integer greedy_id and rank and a logprob and "
                                     "greedy_logprob at most 0")
        return tokens

    def generate(self, body: dict) -> dict:
        generated = self.asked("/v1/generate", {"model": self.model, **body}).get("looptrace")
        if not _has(generated, {"tokens": list, "tool_calls": list, "reasoning": str, "text": str}) or (
                "finish_reason" not in generated) or not all(
                _has(t, {"id": int, "logprob": float}) for t in generated["tokens"]) or not all(
                isinstance(c, dict) for c in generated["tool_calls"]):
            raise self.misshapen("/v1/generate", "no 'looptrace' object with tokens (each an id and a logprob), "
                                 "tool_calls, reasoning, text and finish_reason")
        return generated


def _has(value: object, fields: dict[str, type]) -> bool:
    """Whether `value` is an object with each field of its type (float: any number; never a bool)."""
    if not isinstance(value, dict):
        return False
    for name, kind in fields.items():
        field = value.get(name)
        taken = (int, float) if kind is float else kind
        if not isinstance(field, taken) or isinstance(field, bool):
            return False
    return True


class VLLMTarget(Target):
    kind = "vllm"

    def score(self, prompt_ids: list[int], answer_ids: list[int]) -> list[dict]:
        answer = self.asked("/v1/completions", score_body(self.model, prompt_ids, answer_ids))
        try:
            return read_scores(answer, len(prompt_ids), answer_ids)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ReplayError(f"the vLLM server at {self.shown} answered in a shape this replay cannot read: {exc}") \
                from exc


def connect(url: str, *, api_key: str | None = None, timeout: float = DEFAULT_TIMEOUT) -> Target:
    """The target at `url`, its kind found and its model named."""
    probe = Target(url, api_key, timeout)
    status, health = probe.call("GET", "/health")
    is_looptrace = isinstance(health, dict) and "backend" in health
    target = (LooptraceTarget if is_looptrace else VLLMTarget)(url, api_key, timeout)
    if is_looptrace and health.get("status") != "ready":
        raise ReplayError(f"the target {target.shown} is not ready: {health.get('status')} {health.get('error', '')}")
    status, models = target.call("GET", "/v1/models")
    listed = models.get("data") if isinstance(models, dict) else None
    first = listed[0] if isinstance(listed, list) and listed else None
    if status != 200 or not isinstance(first, dict) or not isinstance(first.get("id"), str):
        raise ReplayError(f"the target {target.shown} does not list a model at /v1/models ({status}): is it a looptrace "
                          "or vLLM server?")
    target.model = first["id"]
    target.max_model_len = first.get("max_model_len") or 0
    target.backend = health.get("backend", "") if is_looptrace else "vllm"
    return target
