"""OpenAI's custom (free-form) tools in Chat Completions (`{"type": "custom", "custom": {"name",
"format"}}`): the model sees each as a function of one string, `input`, as the Responses surface
shows its custom tools (responses/request.py); the call it makes goes back to the client as the
custom call OpenAI answers (`{"type": "custom", "custom": {"name", "input"}}`), and a past one comes
in as that function's call, so the template renders it as the model made it."""

from __future__ import annotations

import json

from looptrace.common.jsonio import dumps

from .protocol import CustomTool, CustomToolCall

INPUT = "input"  # the one parameter the model fills


def as_function(tool: CustomTool) -> dict:
    """The function the model is offered for `tool`. A grammar goes in the parameter's description:
    nothing here constrains decoding to it, and the model can only follow what it is shown."""
    spec = tool.custom
    fmt = spec.format
    doc = "The tool's whole input, as free-form text."
    grammar = fmt.grammar if fmt is not None and fmt.type == "grammar" else None
    if grammar is not None and isinstance(grammar.definition, str):
        doc = f"The tool's whole input, as text matching this {grammar.syntax or ''} grammar:\n" \
              f"{grammar.definition}"
    function: dict = {"name": spec.name}
    if spec.description is not None:
        function["description"] = spec.description
    function["parameters"] = {"type": "object", "properties": {INPUT: {"type": "string", "description": doc}},
                              "required": [INPUT]}
    return {"type": "function", "function": function}


def history_call(call: CustomToolCall) -> dict:
    """A past custom call as the engine's function call (arguments `{"input": …}`)."""
    out = {"type": "function", "function": {"name": call.custom.name, "arguments": {INPUT: call.custom.input}}}
    if isinstance(call.id, str):
        out["id"] = call.id
    return out


def answer_call(call_id: str, name: str, arguments: str) -> dict:
    """The model's call of a custom tool, in the shape OpenAI answers it."""
    return {"id": call_id, "type": "custom", "custom": {"name": name, INPUT: input_of(arguments)}}


def input_of(arguments: str) -> str:
    """The free-form input from the function call the model made of the tool: its `input`, or its one
    argument under another name; arguments that are not an object go through as the text they are."""
    try:
        args = json.loads(arguments)
    except json.JSONDecodeError:
        return arguments
    if isinstance(args, dict):
        value = args.get(INPUT)
        if isinstance(value, str):
            return value
        if len(args) == 1:
            (only,) = args.values()
            return only if isinstance(only, str) else dumps(only)
    return arguments
