"""A URL's query parameters, read the same way by every API package: integers in bounds, a page's
cursor, a time."""

from __future__ import annotations

import math
from datetime import datetime

from .errors import invalid


def bounded_int(value: str, name: str, low: int, high: int) -> int:
    try:
        number = int(value)
    except ValueError:
        raise invalid(f"'{name}' must be an integer.", param=name) from None
    if not low <= number <= high:
        raise invalid(f"'{name}' must be between {low} and {high}.", param=name)
    return number


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
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        except (ValueError, OverflowError):
            raise invalid(f"'{name}' must be Unix seconds or an ISO 8601 time.", param=name) from None
    if not (math.isfinite(seconds) and 0 <= seconds < MAX_SECONDS):
        raise invalid(f"'{name}' must be Unix seconds or an ISO 8601 time between 1970 and 2262.", param=name)
    return int(seconds * 1e9)
