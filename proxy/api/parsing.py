"""Request parsing both APIs share: sampling ranges, past tool calls' arguments, tool_choice, media
parts, and warnings said once."""

from __future__ import annotations

import logging

from .errors import invalid
from .validation import embedded_json, field, in_range

log = logging.getLogger("looptrace")
_warned: set[str] = set()

# Media parts become a note the model reads in their place: an agent that attaches a screenshot (pi's
# `read` of an image, codex's `view_image`) goes on, and the model can say what it could not see.
MEDIA_PARTS = ("image_url", "input_image", "input_audio", "input_file", "file")
MEDIA_NOTE = "[an image or file was attached here; this server reads text only]"


def warn_once(key: str, message: str, *args) -> None:
    # Clients send the same things on every request of a session: say it once, not per request.
    if key not in _warned:
        _warned.add(key)
        log.warning(message, *args)


def media_note() -> str:
    warn_once("media", "media in a request were replaced by a note: this server reads text only")
    return MEDIA_NOTE


def temperature_and_top_p(body: dict) -> tuple[float | None, float | None]:
    temperature = field(body, "temperature", float, "temperature")
    in_range(temperature, "temperature", 0, 2)
    top_p = field(body, "top_p", float, "top_p")
    if top_p is not None and not 0 < top_p <= 1:
        raise invalid(f"Invalid value for 'top_p': {top_p} must be greater than 0 and at most 1.", param="top_p")
    return temperature, top_p


SEED_RANGE = (-(2**63), 2**64 - 1)  # what a torch generator (and vLLM) can be seeded with


def seed(body: dict) -> int | None:
    value = field(body, "seed", int, "seed")
    in_range(value, "seed", *SEED_RANGE)
    return value


def call_arguments(arguments: object, param: str) -> dict:
    """A past call's arguments (a JSON string or an object) as the dict templates iterate over."""
    if isinstance(arguments, str):
        arguments = embedded_json(arguments, param) if arguments.strip() else {}
    if not isinstance(arguments, dict):
        raise invalid(f"'{param}' must be a JSON object.", param=param)
    return arguments


def parse_tool_choice(choice: object, tools: list[dict] | None) -> str | dict:
    """"auto" | "none" | "required" | {"name": NAME}, checked against the tools offered."""
    if choice is None:
        return "auto"
    if isinstance(choice, str):
        if choice not in ("auto", "none", "required"):
            raise invalid(f"Invalid value for 'tool_choice': {choice!r}; expected 'auto', 'none', 'required' or a "
                          "named function.", param="tool_choice")
        if choice == "required" and not tools:
            raise invalid("'tool_choice' is 'required' but no tools were given.", param="tool_choice")
        return choice
    if isinstance(choice, dict):
        function = choice.get("function") if isinstance(choice.get("function"), dict) else choice
        name = function.get("name")
        if not isinstance(name, str):
            raise invalid("'tool_choice' names no function.", param="tool_choice")
        if name not in {t["function"]["name"] for t in tools or []}:
            raise invalid(f"'tool_choice' names the function {name!r}, which is not among the tools.",
                          param="tool_choice")
        return {"name": name}
    raise invalid("Invalid type for 'tool_choice': expected a string or an object.", param="tool_choice",
                  code="invalid_type")
