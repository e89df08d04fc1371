"""What every API surface's protocol models share: a request body is parsed once, at the door, into
immutable pydantic models, and a validation error becomes the house's 400 naming its place
(`tools[0].type`), in the words the API's own servers use.

Each surface has a protocol module of its own (openai/chat/protocol.py, openai/responses/protocol.py,
anthropic/protocol.py, gemini/protocol.py); its request module turns the model into the engine's request.

- Fields a model does not name are kept (`model_extra`) and pass through as they do today.
- Types are strict, as JSON's are: an integer is not a bool, a string is not a number; a number is
  taken where a float is.
- A field sent as null is absent, so an optional field is declared `T | None = None` and its default
  given where it is read (pydantic has no "null means the default"; a validator per object would cost
  more than the whole parse).
- The pre-parse guard (validation.py: how many values, how deep, surrogates, numbers JSON has not)
  runs before a body reaches a model.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, TypeVar, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Field, StringConstraints, Tag, ValidationError
from pydantic_core import PydanticCustomError

from looptrace.families.prompt_items import ITEM_LIMITS, TooManyItems

from .errors import APIError, invalid
from .validation import TOOL_NAME, describe

M = TypeVar("M", bound="Protocol")


class Protocol(BaseModel):
    """The base of every request model."""

    model_config = ConfigDict(extra="allow", frozen=True, strict=True, populate_by_name=True)


def parse(model: type[M], data: Any, where: str = "") -> M:
    """`data` as `model`, or the house's 400 for the first thing wrong; `where` prefixes its place
    (`input[3]` for an item parsed on its own)."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise refusal(exc, where) from None


_OURS: set[str] = set()


def refused(code: str, message: str) -> PydanticCustomError:
    """An error a model's validator raises: `message` may name `{param}`, the place it is found at
    (filled in by `refusal`); `code` is the 400's code."""
    _OURS.add(code)
    return PydanticCustomError(code, message, {"code": code})


def one_of(kind_of: Callable[[Any], str | None], **models: type) -> Any:
    """A union picked by `kind_of(value)` (the name of one of `models`, or None: a 400 naming the
    value's `type`), as OpenAI's item and part unions are: by their `type`, not by trying each."""
    tags = {name: f"<{name}>" for name in models}
    by_model = {model: tags[name] for name, model in models.items()}
    first = tags[next(iter(models))]

    def named(kind: str | None) -> str | None:
        return None if kind is None else tags.get(kind) or f"<{kind}>"

    def other(value: Any) -> str | None:
        if isinstance(value, BaseModel):  # a dump: the value's own model's branch
            return by_model.get(type(value))
        if not isinstance(value, dict):
            return first  # any branch refuses a non-object with "expected an object"
        return named(kind_of(value))

    table = getattr(kind_of, "table", None)
    if table is None:
        def tag(value: Any) -> str | None:
            return named(kind_of(value)) if type(value) is dict else other(value)
    else:  # by_type's table read here, in one call: `tag` runs for every item of every request
        branches, otherwise, absent = table
        found = {kind: named(name) for kind, name in branches.items()}
        rest = named(otherwise)

        def tag(value: Any) -> str | None:
            if type(value) is not dict:
                return other(value)
            kind = value.get("type", absent)
            return found.get(kind, rest) if kind is None or isinstance(kind, str) else rest

    branches = tuple(Annotated[model, Tag(f"<{name}>")] for name, model in models.items())
    return Annotated[Union[branches], Discriminator(tag, custom_error_type="unknown_type",
                                                   custom_error_message="unknown type")]


def by_type(branches: dict[str | None, str], other: str | None,
            absent: str | None = None) -> Callable[[dict], str | None]:
    """How one_of picks a union's branch by the object's `type`: `branches`' name for it (a `type` sent
    as null is None there), `absent`'s where there is none (None: as null), `other` for the rest."""
    def kind_of(value: dict) -> str | None:
        kind = value.get("type", absent)
        return branches.get(kind, other) if kind is None or isinstance(kind, str) else other
    kind_of.table = (branches, other, absent)  # for one_of, which reads it inline
    return kind_of


# An offered tool's name, on every surface, as the model will write it in a call (validation.TOOL_NAME):
# never a control token. pydantic-core checks the pattern itself; `refusal` words its error.
_TOOL_NAME = f"^{TOOL_NAME.pattern}$"
ToolName = Annotated[str, StringConstraints(pattern=_TOOL_NAME)]

# (the field's name, its limit) -> the kind of item `capped` counts there, for `refusal`'s words; the
# name folded, since an error's place names a field by its alias where one was sent (functionDeclarations).
_CAPS: dict[tuple[str, int], str] = {}


def capped(kind: str, field: str) -> Any:
    """An array's bound (`messages: Annotated[list[Message], capped("messages", "messages")]`): more
    items than the engine would take of `kind` (families/prompt_items.py) are refused. pydantic-core
    checks it natively, and stops at the first item past the limit, so that the parse never builds
    more than it would of a request at the limit."""
    limit = ITEM_LIMITS[kind][0]
    _CAPS[_folded(field), limit] = kind
    return Field(max_length=limit)


# pydantic's error types → what a value should have been, in OpenAI's words ("expected a string").
_EXPECTED = {
    "string_type": "a string", "int_type": "an integer", "int_from_float": "an integer", "bool_type": "a boolean",
    "float_type": "a number", "list_type": "an array", "dict_type": "an object", "model_type": "an object",
    "model_attributes_type": "an object", "tuple_type": "an array",
}


def refusal(exc: ValidationError, where: str = "") -> APIError:
    """A ValidationError as the house's 400. Of a union's errors (one per branch), the one that got
    furthest into the value is the client's mistake; where the branches failed at the value itself,
    the 400 names what each would have taken ("a string or an array")."""
    errors = exc.errors(include_url=False, include_context=True, include_input=True)
    places = [_place(where, e["loc"]) for e in errors]
    depth = max(p.count(".") + p.count("[") for p in places)
    at = next(i for i, p in enumerate(places) if p.count(".") + p.count("[") == depth)
    error, param = errors[at], places[at]
    kind = error["type"]
    if kind == "missing" or (kind in _EXPECTED and error["input"] is None and isinstance(error["loc"][-1], str)):
        # A field that takes no null, sent as null: absent, as every optional one is when null.
        return invalid(f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter")
    if kind in _EXPECTED:
        expected = " or ".join(dict.fromkeys(_EXPECTED[e["type"]] for e, p in zip(errors, places)
                                             if p == param and e["type"] in _EXPECTED))
        return invalid(f"Invalid type for '{param}': expected {expected}, but got {describe(error.get('input'))}.",
                       param=param, code="invalid_type")
    context = error.get("ctx") or {}
    if kind == "literal_error":
        return invalid(f"Invalid value for '{param}': {_shown(error.get('input'))}; expected one of "
                       f"{context.get('expected', '')}.", param=param)
    bound = {"greater_than_equal": "at least", "less_than_equal": "at most", "greater_than": "more than",
             "less_than": "less than"}.get(kind)
    if bound is not None:
        limit = next(iter(v for k, v in context.items() if k in ("ge", "le", "gt", "lt")), "")
        return invalid(f"Invalid value for '{param}': {error.get('input')} is not {bound} {limit}.", param=param)
    if kind == "unknown_type":  # one_of found no branch for the value's `type`
        given = error["input"].get("type") if isinstance(error["input"], dict) else None
        return invalid(f"Invalid value for '{param}.type': {given!r}.", param=f"{param}.type")
    if kind == "string_pattern_mismatch" and context.get("pattern") == _TOOL_NAME:
        return _bad_tool_name(error["input"], param)
    if kind == "too_long" and (kind_of := _CAPS.get((_folded(_field(error["loc"])), context.get("max_length")))):
        return invalid(str(TooManyItems(kind_of, context["max_length"], param)), param=param, code="too_many_items")
    if kind in _OURS:  # raised by a model's validator (`refused`)
        return invalid(error["msg"].replace("{param}", param), param=param, code=context.get("code", kind))
    return invalid(f"Invalid value for '{param}': {error['msg']}.", param=param)


def _bad_tool_name(name: str, param: str) -> APIError:
    if not name:
        return invalid(f"'{param}' must not be empty.", param=param, code="invalid_value")
    return invalid(f"Invalid '{param}': string does not match pattern. Expected a string that matches the pattern "
                   f"'{_TOOL_NAME}' (letters, digits, '_', '-' and '.', at most 128).", param=param, code="invalid_value")


def _field(loc: tuple) -> str:
    """The name of the field an error's place ends at (`content` of messages[3].content)."""
    return next((part for part in reversed(loc) if isinstance(part, str) and not _is_branch(part)), "")


def _folded(name: str) -> str:
    return name.replace("_", "").lower()


def _place(where: str, loc: tuple) -> str:
    """('tools', 0, 'function', 'name') → tools[0].function.name; a union's branch names (a model's or
    a tag's, which pydantic puts in the path) are left out: the client named none of them."""
    out = where
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif isinstance(part, str) and not _is_branch(part):
            out = f"{out}.{part}" if out else part
    return out


def _is_branch(part: str) -> bool:
    # one_of's tags are <name>; a plain union's branches are named by their types.
    return part in _SCALARS or part[:1].isupper() or part.startswith(("<", "list[", "dict[", "literal[", "function-",
                                                                       "tuple[", "nullable["))


_SCALARS = frozenset(("str", "int", "float", "bool", "none", "any"))


def _shown(value: Any) -> str:
    return f"'{value}'" if isinstance(value, str) else describe(value)
