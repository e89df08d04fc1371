"""A URL's query parameters, read the same way by every API package: integers in bounds, a page's
cursor, a time; and a route's parameters as one frozen model (`Query`), read once."""

from __future__ import annotations

import math
import re
from datetime import datetime
from typing import Annotated, Any, TypeVar

from aiohttp import web
from pydantic import BaseModel, BeforeValidator, ConfigDict

from .errors import invalid

Q = TypeVar("Q", bound="Query")

# A query parameter's number as ASCII digits only: int() and float() also read fullwidth and other
# scripts' digits ("１" is 1), signs, spaces and underscores, none of which a link or a client writes.
_QUERY_INT = re.compile(r"[0-9]{1,19}")
_QUERY_NUMBER = re.compile(r"[0-9]{1,19}(\.[0-9]{1,19})?")


def query_int(value: str, name: str, low: int, high: int) -> int:
    """An integer query parameter from `low` to `high`, else a 400 naming it."""
    if not _QUERY_INT.fullmatch(value) or not low <= int(value) <= high:
        raise invalid(f"'{name}' must be an integer from {low} to {high}, in ASCII digits.", param=name)
    return int(value)


def query_number(value: str, name: str) -> float | None:
    """A decimal query parameter (digits, and a fraction after a point), or None when it is not one."""
    return float(value) if _QUERY_NUMBER.fullmatch(value) else None


def cursor(value: str | None) -> tuple[int, str] | None:
    """`?before=`: the `next` of a previous page, "NANOSECONDS:KEY"."""
    if not value:
        return None
    stamp, _, key = value.partition(":")
    if not (stamp.isascii() and stamp.isdigit()) or len(stamp) > 19 or int(stamp) >= 1 << 63 or not key:
        raise invalid("'before' must be the 'next' value of a previous page.", param="before")
    return int(stamp), key


MAX_SECONDS = (1 << 63) / 1e9  # nanoseconds past this do not fit SQLite's 64-bit integers (year 2262)


def timestamp(value: str | None, name: str) -> int | None:
    """Unix seconds or an ISO 8601 time → nanoseconds."""
    if not value:
        return None
    seconds = query_number(value, name)
    if seconds is None:
        try:
            if not value.isascii():  # fromisoformat reads other scripts' digits too
                raise ValueError(value)
            seconds = datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        except (ValueError, OverflowError):
            raise invalid(f"'{name}' must be Unix seconds or an ISO 8601 time.", param=name) from None
    if not (math.isfinite(seconds) and 0 <= seconds < MAX_SECONDS):
        raise invalid(f"'{name}' must be Unix seconds or an ISO 8601 time between 1970 and 2262.", param=name)
    return int(seconds * 1e9)


class Query(BaseModel):
    """A route's query parameters as a model: the fields it names (each a string, or one of the types
    below), parsed once with `of`; a parameter it does not name is ignored, as before."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    @classmethod
    def of(cls: type[Q], request: web.Request) -> Q:
        query = request.query
        # A parameter given twice is read as its first, as MultiDict's get reads it. Every check raises
        # the house's 400 itself (an APIError passes pydantic untouched), and every field takes a string.
        return cls.model_validate({name: query[name] for name in query})


def _checked(read) -> BeforeValidator:
    """A validator of `read(value, name)`: its 400 (an APIError, no ValueError) passes pydantic untouched,
    in the words every route's query has had."""
    return BeforeValidator(lambda value, info: read(value, info.field_name))


def between(low: int, high: int) -> Any:
    """An integer parameter from `low` to `high` (its default is the field's)."""
    return Annotated[int, _checked(lambda value, name: query_int(value, name, low, high))]


Time = Annotated[int | None, _checked(timestamp)]  # nanoseconds
Cursor = Annotated[tuple[int, str] | None, _checked(lambda value, name: cursor(value))]
