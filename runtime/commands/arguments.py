"""Argument types for numeric flags: a value out of range is refused by argparse, in one line
naming the flag, the value and the accepted range, before the command does anything."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def count(low: int, high: int) -> Callable[[str], int]:
    """An integer flag in ``low..high``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text!r} is not accepted; give an integer from {low} to {high}")
        return value

    return parse


def seconds(low: float, high: float) -> Callable[[str], float]:
    """A finite number of seconds in ``[low, high]`` (NaN and infinities are refused: a wait that
    never ends is not a number of seconds)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and low <= value <= high):
            raise argparse.ArgumentTypeError(f"{text!r} is not accepted; give a number of seconds from {low:g} "
                                             f"to {high:g}")
        return value

    return parse
