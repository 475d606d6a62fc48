"""The command line's shared parts, under every room: the parser every command uses (a usage
error is one line, exit 2) and the validators options are parsed with (argparse ``type=``).

Each validator is built from its range, written once: the same object checks the value and shows
the range in the help (``help=f"... ({PROCESSES})"`` prints ``1..256``). A bad value is refused
while parsing, before anything starts or is written, in one line naming the option and what is
allowed::

    uwsgi-layouts compare: error: argument --processes: must be an integer in 1..256, got 0

Checks that need several options together (a budget against the plan it must hold) stay with
the command, after parsing; they too are one line and exit 2.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from typing import Callable

EXIT_BAD_INPUT = 2
# The tool's name, as its console script is called: every usage and error line starts with it.
PROG = "uwsgi-layouts"


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (and exit 2), like every other bad input."""

    def error(self, message: str):
        # argparse echoes tokens raw: escape control characters (\n, \f...) so it stays one line.
        message = "".join(c if c.isprintable() else repr(c)[1:-1] for c in message)
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message}\n")


def refuse(allowed: str, got) -> argparse.ArgumentTypeError:
    """The error a validator raises: argparse prefixes it with ``argument --OPTION:``."""
    return argparse.ArgumentTypeError(f"must be {allowed}, got {got}")


def _convert(raw, convert: Callable[[str], float], allowed: str):
    try:
        return convert(str(raw).strip())
    except ValueError:
        raise refuse(allowed, repr(raw)) from None


@dataclass(frozen=True)
class Ints:
    """Integers in ``low..high``, both ends included."""

    low: int
    high: int

    def __post_init__(self):
        if self.low > self.high:
            raise ValueError(f"empty range {self.low}..{self.high}")

    def __str__(self) -> str:
        return f"{self.low}..{self.high}"

    @property
    def allowed(self) -> str:
        return f"an integer in {self}"

    def __call__(self, raw) -> int:
        value = _convert(raw, int, self.allowed)
        if not self.low <= value <= self.high:
            raise refuse(self.allowed, value)
        return value


@dataclass(frozen=True)
class Numbers:
    """Finite numbers from ``low`` to ``high`` (no upper bound when infinite); ``open_low`` and
    ``open_high`` leave that end out. ``noun`` says what the number is ("a share", "a number of
    seconds"), ``example`` ends the message (", e.g. 0.05 for ±5%"), and ``off``, when set, is
    one more value allowed outside the range (0 = off)."""

    low: float
    high: float = math.inf
    open_low: bool = False
    open_high: bool = False
    noun: str = "a number"
    example: str = ""
    off: float | None = None

    def __post_init__(self):
        if not self.low < self.high:
            raise ValueError(f"empty range {self}")

    def __str__(self) -> str:
        if math.isinf(self.high):
            return f"{'>' if self.open_low else '>='} {self.low:g}"
        if not (self.open_low or self.open_high):
            return f"{self.low:g}..{self.high:g}"
        return f"{'(' if self.open_low else '['}{self.low:g}, {self.high:g}{')' if self.open_high else ']'}"

    @property
    def allowed(self) -> str:
        where = f"{self}" if math.isinf(self.high) else f"in {self}"
        off = f"{self.off:g} (off) or " if self.off is not None else ""
        return f"{off}{self.noun} {where}" + (f", e.g. {self.example}" if self.example else "")

    def __contains__(self, value: float) -> bool:
        if not math.isfinite(value):  # NaN and inf: never a setting
            return False
        above = value > self.low if self.open_low else value >= self.low
        below = value < self.high if self.open_high else value <= self.high
        return value == self.off or (above and below)

    def __call__(self, raw) -> float:
        value = _convert(raw, float, self.allowed)
        if value not in self:
            raise refuse(self.allowed, f"{value:g}")
        return value


@dataclass(frozen=True)
class OneOf:
    """One of ``names`` (argparse's ``choices=`` for an item of a ``CommaList``)."""

    names: tuple[str, ...]

    def __str__(self) -> str:
        return ", ".join(self.names)

    def __call__(self, raw) -> str:
        text = str(raw).strip()
        if text not in self.names:
            raise refuse(f"one of {self}", repr(raw))
        return text


@dataclass(frozen=True)
class CommaList:
    """Comma-separated values, each checked by ``item`` (an ``Ints`` or ``Numbers``): a tuple
    in the order given. ``what`` names one value for the empty list's message."""

    item: Callable
    what: str

    def __str__(self) -> str:
        return f"comma-separated, each {self.item}"

    def __call__(self, raw) -> tuple:
        parts = [x.strip() for x in str(raw).split(",") if x.strip()]
        if not parts:
            raise argparse.ArgumentTypeError(f"give at least one {self.what}")
        return tuple(self.item(x) for x in parts)


ON = ("on", "true", "yes", "1")
OFF = ("off", "false", "no", "0")


def on_off(raw) -> bool:
    """``on``/``off`` (or true/false, yes/no, 1/0) as a bool."""
    text = str(raw).strip().lower()
    if text in ON or text in OFF:
        return text in ON
    raise refuse("on or off", repr(raw))
