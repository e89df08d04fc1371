"""What parsing one request body costs a surface: a 100-message, 40-tool agent request (a system
prompt, a task, then rounds of an assistant's tool calls and their outputs; tools with JSON-schema
parameters), timed on the event loop's thread as the server runs it, in two stages: the protocol
model's parse alone, and the surface's whole request function (that parse and the conversion into
the engine's request). Issue 54's bound: at most 0.3 ms p50.

    python bench/parse_cost.py [--surface chat|responses|anthropic] [--runs 2000]

Each run parses a fresh copy of the body (json.loads of its text, as json_body hands one over), so
nothing a parse caches on the objects is reused; the copy is made outside the timing. To measure
another checkout (the code before a change), put a folder holding `looptrace` -> that checkout
first on PYTHONPATH: the line printed names the module it timed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

MESSAGES, TOOLS = 100, 40


def schema(i: int) -> dict:
    """A tool's parameters as agent harnesses write them: a few typed properties, an enum, a nested array."""
    return {
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": f"The file the tool {i} reads or writes, relative to the root."},
            "mode": {"type": "string", "enum": ["read", "write", "append"], "description": "What to do with it."},
            "lines": {"type": "array", "items": {"type": "integer"}, "description": "Line numbers, 1-based."},
            "options": {"type": "object", "properties": {"recursive": {"type": "boolean"},
                                                         "limit": {"type": "integer", "minimum": 1}}},
        },
        "required": ["path", "mode"],
        "additionalProperties": False,
    }


def description(i: int) -> str:
    return f"Tool number {i}: does one thing to the workspace and says what it did, in a line or two of text."


def arguments(j: int) -> dict:
    return {"path": f"src/module_{j}.py", "mode": "read", "lines": [1, 2, 3, j], "options": {"recursive": False}}


def output(j: int) -> str:
    return f"def function_{j}(x):\n    return x * {j}\n" * 8


def rounds() -> int:
    return (MESSAGES - 2) // 2  # after the system prompt and the task: one call and its output a round


def chat_body() -> dict:
    tools = [{"type": "function", "function": {"name": f"tool_{i}", "description": description(i),
                                               "parameters": schema(i)}} for i in range(TOOLS)]
    messages: list[dict] = [{"role": "system", "content": "You are a careful coding agent."},
                            {"role": "user", "content": "Read the modules and fix the failing test."}]
    for j in range(rounds()):
        call_id = f"call_{j:04d}"
        messages.append({"role": "assistant", "content": f"Reading module {j}.", "tool_calls": [
            {"id": call_id, "type": "function",
             "function": {"name": f"tool_{j % TOOLS}", "arguments": json.dumps(arguments(j))}}]})
        messages.append({"role": "tool", "tool_call_id": call_id, "content": output(j)})
    return {"model": "agent", "messages": messages, "tools": tools, "tool_choice": "auto", "max_tokens": 1024,
            "temperature": 0.7, "top_p": 0.95, "stream": True, "stream_options": {"include_usage": True}}


def responses_body() -> dict:
    tools = [{"type": "function", "name": f"tool_{i}", "description": description(i), "parameters": schema(i)}
             for i in range(TOOLS)]
    items: list[dict] = [{"type": "message", "role": "user",
                          "content": [{"type": "input_text", "text": "Read the modules and fix the failing test."}]}]
    for j in range(rounds()):
        call_id = f"call_{j:04d}"
        items.append({"type": "function_call", "call_id": call_id, "name": f"tool_{j % TOOLS}",
                      "arguments": json.dumps(arguments(j))})
        items.append({"type": "function_call_output", "call_id": call_id, "output": output(j)})
    items.append({"type": "message", "role": "assistant",
                  "content": [{"type": "output_text", "text": "All modules read."}]})
    return {"model": "agent", "instructions": "You are a careful coding agent.", "input": items, "tools": tools,
            "tool_choice": "auto", "max_output_tokens": 1024, "temperature": 0.7, "top_p": 0.95, "stream": True,
            "store": False}


def anthropic_body() -> dict:
    tools = [{"name": f"tool_{i}", "description": description(i), "input_schema": schema(i)} for i in range(TOOLS)]
    messages: list[dict] = [{"role": "user", "content": "Read the modules and fix the failing test."}]
    for j in range(rounds()):
        call_id = f"toolu_{j:04d}"
        messages.append({"role": "assistant", "content": [
            {"type": "text", "text": f"Reading module {j}."},
            {"type": "tool_use", "id": call_id, "name": f"tool_{j % TOOLS}", "input": arguments(j)}]})
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": call_id, "content": output(j)}]})
    messages.append({"role": "user", "content": "Go on."})
    return {"model": "agent", "system": "You are a careful coding agent.", "messages": messages, "tools": tools,
            "tool_choice": {"type": "auto"}, "max_tokens": 1024, "temperature": 0.7, "top_p": 0.95, "stream": True}


def surface(name: str):
    """(the surface's request function, its protocol model, its module's file, a body)."""
    if name == "chat":
        from looptrace.proxy.api.openai.chat import protocol, request
        return request.parse_chat, protocol.ChatRequest, request.__file__, chat_body()
    if name == "responses":
        from looptrace.proxy.api.openai.responses import protocol, request
        return request.parse_responses, protocol.ResponsesRequest, request.__file__, responses_body()
    from looptrace.proxy.api.anthropic import protocol, request
    return request.parse_messages, protocol.MessagesRequest, request.__file__, anthropic_body()


def timed(step, text: str, runs: int, warmup: int) -> list[float]:
    """Milliseconds of `step` on a fresh copy of the body each run (the copy made outside the timing)."""
    times = []
    for n in range(warmup + runs):
        fresh = json.loads(text)
        start = time.perf_counter_ns()
        step(fresh)
        elapsed = time.perf_counter_ns() - start
        if n >= warmup:
            times.append(elapsed / 1e6)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--surface", choices=("chat", "responses", "anthropic"), default="chat")
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=100)
    args = parser.parse_args()
    parse, model, module, body = surface(args.surface)
    text = json.dumps(body)
    result: dict = {"surface": args.surface, "module": module, "messages": len(body.get("messages",
                    body.get("input", []))), "tools": len(body["tools"]), "body_kib": round(len(text) / 1024, 1)}
    try:
        parse(json.loads(text))
    except Exception as exc:  # a surface whose function was renamed or now takes something else: say so
        print(json.dumps({**result, "error": f"{type(exc).__name__}: {exc}"}))
        raise SystemExit(1) from None
    # The model's parse alone (pydantic: the body into the protocol's models), then the whole request
    # function: that parse and the conversion into the engine's request (past calls' arguments read
    # as JSON, parts joined, tools checked).
    from looptrace.proxy.api.protocol import parse as parse_model
    stages = {"model": timed(lambda b: parse_model(model, b), text, args.runs, args.warmup),
              "request": timed(parse, text, args.runs, args.warmup)}
    result["runs"] = args.runs
    for stage, times in stages.items():
        deciles = statistics.quantiles(times, n=10)
        result.update({f"{stage}_p50_ms": round(statistics.median(times), 4),
                       f"{stage}_p90_ms": round(deciles[8], 4), f"{stage}_min_ms": round(min(times), 4)})
    print(json.dumps(result))

if __name__ == "__main__":
    main()
