"""Command-line numbers checked as argparse reads them (its `type=`), so that a value no setting can
have is refused in one line before anything starts: `float` reads "nan" and "inf", and a NaN memory
bound once failed the model's load and left the server up, serving nothing (issue 41, L3)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def _checked(kind: type, low: float, high: float, what: str, *, above: bool = False) -> Callable[[str], float]:
    def convert(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
        if not (math.isfinite(value) and low <= value <= high) or (above and value == low):
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}")
        return value

    convert.__name__ = what  # argparse names the type by it in its own messages
    return convert


amount = _checked(float, 0, math.inf, "a number, 0 or more")  # megabytes, days, seconds of audio
seconds = _checked(float, 0, math.inf, "a number of seconds above 0", above=True)
count = _checked(int, 0, 1 << 62, "an integer, 0 or more")
positive = _checked(int, 1, 1 << 62, "an integer, 1 or more")
port = _checked(int, 0, 65535, "a port, 0 to 65535")
gpu_layers = _checked(int, -1, 1 << 20, "a number of layers, or -1 for all")
