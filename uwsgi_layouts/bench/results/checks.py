"""The results package's validation vocabulary: ``ResultsError`` and the checks every record
type uses (a number, a count, a share, a mapping...), each raising one line that names the field.
The underscored names are the package's own: other modules import the records, not these."""

from __future__ import annotations

import math
from typing import Callable


class ResultsError(ValueError):
    """A results file or record that cannot be trusted (bad version, missing field)."""


def _check(cond: bool, what: str) -> None:
    if not cond:
        raise ResultsError(what)


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _is_count(x, low: int = 0) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= low


def _finite_nonneg(x, name: str) -> float:
    _check(_is_number(x) and x >= 0, f"{name}: must be a finite number >= 0, got {x!r}")
    return float(x)


def _share(x, name: str) -> float:
    _check(_is_number(x) and 0 <= x <= 1, f"{name}: must be a share in 0..1, got {x!r}")
    return float(x)


def _mapping(x, name: str, what: str = "a mapping") -> dict:
    _check(isinstance(x, dict), f"{name}: must be {what}, got {type(x).__name__}")
    return x


def _digits(key, name: str) -> str:
    key = str(key)
    _check(key.isdigit(), f"{name}: keys must be numbers (worker ids, counts), got {key!r}")
    return key


def _int_map(value, name: str) -> dict[str, int]:
    _mapping(value, name)
    for k, v in value.items():
        _check(_is_count(v), f"{name}.{k}: must be an integer >= 0, got {v!r}")
    return dict(value)


def _numbers_list(value, name: str, kind: Callable = _finite_nonneg) -> list:
    _check(isinstance(value, (list, tuple)), f"{name}: must be a list of numbers")
    return [kind(x, f"{name}[{i}]") for i, x in enumerate(value)]


def _count(x, name: str) -> int:
    _check(_is_count(x), f"{name}: must be an integer >= 0, got {x!r}")
    return x


def _build(cls, data: dict, label: str):
    """``cls(**data)``, with a wrong or missing field reported as one ResultsError line."""
    try:
        return cls(**data)
    except ResultsError as exc:
        raise ResultsError(f"{label}: {exc}") from None
    except (TypeError, ValueError, AttributeError) as exc:
        raise ResultsError(f"{label}: {exc}") from None
