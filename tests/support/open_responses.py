"""The Open Responses compliance suite, ported to Python: the tests of `src/lib/compliance-tests.ts`
and the stream reading of `src/lib/sse-parser.ts` (openresponses/openresponses, as read at 0cb939c
for tool-calling-streaming and at the later revision that added function-call-roundtrip, file-input
and previous-response-id; its schemas: open_responses_schema.py).

The suite is TypeScript run with bun from a clone of its repository, and is not published on npm,
which is all a test here may install from: hence this port. Each test sends the same request, and
checks the same things, in the same order: the HTTP status, the response object (or a stream's last
`response.completed` / `failed` / `incomplete`) against `ResponseResource`, then the test's own
validators; a stream's every event against the events' union. The two optional tests (file search,
offline web search) are skipped there unless configured, and are not ported. One difference: the
suite runs its tests at once (`Promise.all`), this port one after another in the order of
`TESTS`, so a replay backend can be given each request's recorded answer.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field

from open_responses_schema import EVENT, RESPONSE, issues

# The suite's fixtures, as it sends them: a red heart, 32 × 32, and a one-page PDF titled
# "OpenResponses File Input Fixture".
HEART_PNG = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAACAAAAAgCAIAAAD8GO2jAAABmklEQVR42tyWAaTyUBzFew/eG4AHz+MBSAHK"
    "BiJRGFKwIgQQJKLUIioBIhCAiCAAEizAQIAECaASqFFJq84nudjnaqvuPnxzgP9xfrq5938csPn7PwHTKSoViCIEAYEAMhmoKsU2mUCW"
    "EQqB5xEMIp/HaGQG2G6RSuH9HQ7H34rFrtPbdz4jl6PbwmEsl3QA1mt4vcRKk8dz9eg6IpF7tt9fzGY0gCgafFRFo5Blc5vLhf3eCOj1"
    "yNhM5GRMVK0aATxPZoz09YXjkQDmczJgquGQAPp9WwCNBgG027YACgUC6HRsAZRKBDAY2AJoNv/ZnwzA6WScznG3p4UAymXGAEkyXrTF"
    "Ah8fLAGqagQAyGaZpYsi7bHTNPz8MEj//LxuFPo+UBS8vb0KaLXubrRa7aX0RMLCykwmn0z3+XA4WACcTpCkh9MFAZpmuVXo+mO/w+/H"
    "ZvNgbblcUCxaSo/Hyck80Yu6XXDcvfVZr79cvMZjuN2U9O9vKAqjZrfbIZ0mV4TUi9Xqz6jddNy//7+e3n8Fhf/Llo2kxi8AQyGRoDkm"
    "AhAAAAAASUVORK5CYII=")
TITLE_PDF = (
    "data:application/pdf;base64,JVBERi0xLjEKMSAwIG9iago8PCAvVHlwZSAvQ2F0YWxvZyAvUGFnZXMgMiAwIFIgPj4KZW5kb2Jq"
    "CjIgMCBvYmoKPDwgL1R5cGUgL1BhZ2VzIC9LaWRzIFszIDAgUl0gL0NvdW50IDEgPj4KZW5kb2JqCjMgMCBvYmoKPDwgL1R5cGUgL1Bh"
    "Z2UgL1BhcmVudCAyIDAgUiAvTWVkaWFCb3ggWzAgMCAzMDAgMTQ0XSAvQ29udGVudHMgNCAwIFIgL1Jlc291cmNlcyA8PCAvRm9udCA8"
    "PCAvRjEgNSAwIFIgPj4gPj4gPj4KZW5kb2JqCjQgMCBvYmoKPDwgL0xlbmd0aCA3NCA+PgpzdHJlYW0KQlQKL0YxIDEyIFRmCjcyIDcy"
    "IFRkCihUaXRsZTogT3BlblJlc3BvbnNlcyBGaWxlIElucHV0IEZpeHR1cmUpIFRqCkVUCmVuZHN0cmVhbQplbmRvYmoKNSAwIG9iago8"
    "PCAvVHlwZSAvRm9udCAvU3VidHlwZSAvVHlwZTEgL0Jhc2VGb250IC9IZWx2ZXRpY2EgPj4KZW5kb2JqCnRyYWlsZXIKPDwgL1Jvb3Qg"
    "MSAwIFIgPj4KJSVFT0Y=")
WEATHER = {
    "type": "function", "name": "get_weather", "description": "Get the current weather for a location",
    "parameters": {"type": "object", "properties": {"location": {
        "type": "string", "description": "The city and state, e.g. San Francisco, CA"}}, "required": ["location"]},
}
SF = "What's the weather like in San Francisco?"


@dataclass
class Parsed:
    """A stream as sse-parser.ts reads it: its events, the errors found, its final response."""

    events: list[dict] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    final: dict | None = None


@dataclass
class Result:
    id: str
    status: str  # "passed" | "failed"
    errors: list[str]
    responses: list = field(default_factory=list)
    events: list[dict] = field(default_factory=list)


class Client:
    def __init__(self, base_url: str, model: str, api_key: str = "none", timeout: float = 120) -> None:
        self.base_url, self.model, self.api_key, self.timeout = base_url.rstrip("/"), model, api_key, timeout

    def post(self, body: dict, stream: bool = False) -> tuple[int, bytes]:
        """makeRequest: POST {baseUrl}/responses with `stream` set either way."""
        data = json.dumps({**body, "stream": stream}).encode()
        request = urllib.request.Request(f"{self.base_url}/responses", data=data, method="POST", headers={
            "Content-Type": "application/json", "Authorization": f"Bearer {self.api_key}"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as answer:
                return answer.status, answer.read()
        except urllib.error.HTTPError as err:
            return err.code, err.read()


def parse_sse(data: bytes) -> Parsed:
    """parseSSEStream: `event:` and `data:` lines, a blank line ends an event; `[DONE]` is skipped;
    each event is checked against the union; the last completed/failed/incomplete is the response."""
    parsed = Parsed()
    event, payload = "", ""
    for line in data.decode().split("\n"):
        if line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            payload = line[5:].strip()
        elif line == "" and payload:
            if payload != "[DONE]":
                try:
                    value = json.loads(payload)
                except json.JSONDecodeError:
                    parsed.errors.append(f"Failed to parse event data: {payload}")
                else:
                    parsed.events.append(value)
                    found = issues(EVENT, value)
                    if found:
                        parsed.errors.append(f"Event validation failed for {value.get('type', 'unknown')}: {found}")
                    if value.get("type") in ("response.completed", "response.failed", "response.incomplete"):
                        parsed.final = value.get("response")
            event, payload = "", ""
    return parsed


# -- validators: (response, parsed stream or None) → errors ------------------------------------------

Validator = Callable[[dict, Parsed | None], list[str]]


def has_output(response: dict, _: Parsed | None) -> list[str]:
    return [] if response.get("output") else ["Response has no output items"]


def has_output_type(kind: str) -> Validator:
    def check(response: dict, _: Parsed | None) -> list[str]:
        found = any(item.get("type") == kind for item in response.get("output") or ())
        return [] if found else [f'Expected output item of type "{kind}" but none found']
    return check


def completed_status(response: dict, _: Parsed | None) -> list[str]:
    status = response.get("status")
    return [] if status == "completed" else [f'Expected status "completed" but got "{status}"']


def streaming_events(_: dict, parsed: Parsed | None) -> list[str]:
    return ["No streaming events received"] if parsed is not None and not parsed.events else []


def streaming_schema(_: dict, parsed: Parsed | None) -> list[str]:
    return list(parsed.errors) if parsed is not None else []


def function_call_events(_: dict, parsed: Parsed | None) -> list[str]:
    if parsed is None:
        return []
    events = parsed.events
    kinds = [e.get("type") for e in events]
    errors = []
    if not any(e.get("type") == "response.output_item.added" and (e.get("item") or {}).get("type") == "function_call"
               for e in events):
        errors.append("Missing response.output_item.added event with function_call item")
    if "response.function_call_arguments.delta" not in kinds:
        errors.append("Missing response.function_call_arguments.delta event")
    if "response.function_call_arguments.done" not in kinds:
        errors.append("Missing response.function_call_arguments.done event")
    if not any(e.get("type") == "response.output_item.done" and (e.get("item") or {}).get("type") == "function_call"
               for e in events):
        errors.append("Missing response.output_item.done event with function_call item")
    return errors


# -- running a test ---------------------------------------------------------------------------------

def _answer(client: Client, body: dict, stream: bool) -> tuple[dict | None, Parsed | None, list[str]]:
    """parseResponse: the status, then the response object against ResponseResource."""
    status, data = client.post(body, stream)
    if not 200 <= status < 300:
        return None, None, [f"HTTP {status}: {data.decode(errors='replace')}"]
    parsed = parse_sse(data) if stream else None
    response = parsed.final if parsed is not None else json.loads(data)
    found = issues(RESPONSE, response)
    return (None if found else response), parsed, found


def single(test_id: str, body: Callable[[str], dict], validators: list[Validator], stream: bool = False):
    def run(client: Client) -> Result:
        response, parsed, errors = _answer(client, body(client.model), stream)
        if response is None:
            return Result(test_id, "failed", errors, events=parsed.events if parsed else [])
        errors = [e for v in validators for e in v(response, parsed)]
        return Result(test_id, "failed" if errors else "passed", errors, [response],
                      parsed.events if parsed else [])
    return test_id, run


def chained(test_id: str, first: Callable[[str], dict], second: Callable[[str, dict], dict | str]):
    """A test of two requests, the second built from the first's response (or an error string)."""
    def run(client: Client) -> Result:
        one, _, errors = _answer(client, first(client.model), False)
        if one is None:
            return Result(test_id, "failed", errors)
        body = second(client.model, one)
        if isinstance(body, str):
            return Result(test_id, "failed", [body], [one])
        two, _, errors = _answer(client, body, False)
        if two is None:
            return Result(test_id, "failed", errors, [one])
        errors = [e for v in (has_output, completed_status) for e in v(two, None)]
        return Result(test_id, "failed" if errors else "passed", errors, [one, two])
    return test_id, run


def _message(text: str, role: str = "user") -> dict:
    return {"type": "message", "role": role, "content": text}


def _weather_then_output(model: str, first: dict) -> dict | str:
    call = next((item for item in first["output"] if item.get("type") == "function_call"), None)
    if call is None or "call_id" not in call:
        return "First response did not include a function_call with call_id"
    return {"model": model, "previous_response_id": first["id"],
            "input": [{"type": "function_call_output", "call_id": call["call_id"], "output": "64 degrees and clear"}]}


TESTS = dict([
    single("basic-response", lambda m: {"model": m, "input": [_message("Say hello in exactly 3 words.")]},
           [has_output, completed_status]),
    single("streaming-response", lambda m: {"model": m, "input": [_message("Count from 1 to 5.")]},
           [streaming_events, streaming_schema, completed_status], stream=True),
    single("system-prompt", lambda m: {"model": m, "input": [
        _message("You are a pirate. Always respond in pirate speak.", "system"), _message("Say hello.")]},
        [has_output, completed_status]),
    single("tool-calling", lambda m: {"model": m, "input": [_message(SF)], "tools": [WEATHER]},
           [has_output, has_output_type("function_call")]),
    single("tool-calling-streaming", lambda m: {"model": m, "input": [_message(SF)], "tools": [WEATHER]},
           [streaming_events, streaming_schema, function_call_events], stream=True),
    chained("function-call-roundtrip", lambda m: {
        "model": m, "input": "Use the weather tool to get the temperature in San Francisco.", "tools": [WEATHER],
        "tool_choice": {"type": "function", "name": "get_weather"}}, _weather_then_output),
    single("image-input", lambda m: {"model": m, "input": [{"type": "message", "role": "user", "content": [
        {"type": "input_text", "text": "What do you see in this image? Answer in one sentence."},
        {"type": "input_image", "image_url": HEART_PNG}]}]}, [has_output, completed_status]),
    single("file-input", lambda m: {"model": m, "input": [{"type": "message", "role": "user", "content": [
        {"type": "input_text", "text": "Read the attached file and answer with its title only."},
        {"type": "input_file", "filename": "openresponses-fixture.pdf", "file_data": TITLE_PDF}]}]},
        [has_output, completed_status]),
    single("multi-turn", lambda m: {"model": m, "input": [
        _message("My name is Alice."),
        _message("Hello Alice! Nice to meet you. How can I help you today?", "assistant"),
        _message("What is my name?")]}, [has_output, completed_status]),
    chained("previous-response-id",
            lambda m: {"model": m, "input": "Remember this code word: papaya. Reply with only OK."},
            lambda m, first: {"model": m, "previous_response_id": first["id"],
                              "input": "What code word did I ask you to remember?"}),
])


def run_all(base_url: str, model: str, only: list[str] | None = None) -> list[Result]:
    """Each test (or those named), in order; an exception is the test's failure, as runTest makes it."""
    client = Client(base_url, model)
    results = []
    for test_id in only or TESTS:
        try:
            results.append(TESTS[test_id](client))
        except Exception as exc:  # noqa: BLE001 - runTest reports any error as the test's failure
            results.append(Result(test_id, "failed", [f"{type(exc).__name__}: {exc}"]))
    return results
