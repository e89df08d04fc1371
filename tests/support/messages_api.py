"""Helpers for the Anthropic Messages API's tests (test_anthropic_*.py, test_fuzz.py): a replay backend
that keeps the prompts it was given, the stream's frames read strictly, and a Claude Code-like tool."""

from __future__ import annotations

import json

from looptrace.backends.recorded import ReplayBackend

BASH = {"name": "Bash", "description": "Run a shell command.",
        "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}


def qwen_call(name: str, **params) -> str:
    """A tool call as Qwen3.5 writes it."""
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


class Capture:
    """The replay backend answering `answer` to everything, keeping the prompt ids it was given."""

    def __init__(self, vocab, answer: str = "Ok.<|im_end|>") -> None:
        self.vocab, self.answer, self.prompts = vocab, answer, []
        self.name, self.route, self.running, self.waiting = "replay", None, 0, 0
        self.serving, self.upstreams, self.expands_media, self.media_refusal = True, (), False, ""

    def health_details(self) -> dict:
        return {}

    async def generate(self, request):
        self.prompts.append(list(request.prompt_ids))
        async for event in ReplayBackend([{"text": self.answer}], self.vocab).generate(request):
            yield event

    async def close(self) -> None:
        return None


def frames(data: bytes) -> list[tuple[str, dict]]:
    """(event name, payload) of each frame; every frame is `event: TYPE` + `data: {...}` with the same
    type, as Anthropic sends them."""
    out = []
    for block in data.decode().split("\n\n"):
        if not block.strip():
            continue
        head, body = block.split("\n")
        assert head.startswith("event: ") and body.startswith("data: "), block
        payload = json.loads(body[len("data: "):])
        assert payload["type"] == head[len("event: "):], block
        out.append((payload["type"], payload))
    return out


def post_messages(app, body: dict, headers: dict | None = None, path: str = "/v1/messages") -> tuple[int, bytes]:
    """(status, body) of a POST, with any headers (urllib sends them as given)."""
    import urllib.error
    import urllib.request

    request = urllib.request.Request(app.url + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()
