"""Results: small immutable records, validated on creation, saved as versioned JSON.

A ``Results`` holds the environment, the arguments and one ``Cell`` per
layout x concurrency x repeat. Everything the report shows is derived from this file,
so a stored run can be re-reported (or replayed) without timing anything.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

FORMAT_VERSION = 1
ERROR_CLASSES = ("connect", "read", "write", "timeout", "status")
PERCENTILES = ("p50", "p90", "p99", "p999", "max")


class ResultsError(ValueError):
    """A results file or record that cannot be trusted (bad version, missing field)."""


def _check(cond: bool, what: str) -> None:
    if not cond:
        raise ResultsError(what)


def _finite_nonneg(x, name: str) -> float:
    _check(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0,
           f"{name}: must be a finite number >= 0, got {x!r}")
    return float(x)


@dataclass(frozen=True)
class Latency:
    """Latency percentiles in milliseconds, as measured by wrk."""

    p50: float
    p90: float
    p99: float
    p999: float
    max: float
    mean: float = 0.0

    def __post_init__(self):
        for name in (*PERCENTILES, "mean"):
            object.__setattr__(self, name, _finite_nonneg(getattr(self, name), f"latency_ms.{name}"))
        _check(self.p50 <= self.p90 <= self.p99 <= self.p999 <= self.max,
               f"latency_ms: percentiles must not decrease, got {asdict(self)}")


@dataclass(frozen=True)
class Errors:
    """wrk's error classes; ``status`` counts HTTP responses with status >= 400."""

    connect: int = 0
    read: int = 0
    write: int = 0
    timeout: int = 0
    status: int = 0

    def __post_init__(self):
        for name in ERROR_CLASSES:
            v = getattr(self, name)
            _check(isinstance(v, int) and v >= 0, f"errors.{name}: must be an integer >= 0, got {v!r}")

    @property
    def total(self) -> int:
        return sum(getattr(self, n) for n in ERROR_CLASSES)


@dataclass(frozen=True)
class Cell:
    """One measurement: one layout at one concurrency, in one repeat."""

    layout: str
    concurrency: int
    repeat: int
    duration_s: float
    requests: int
    rps: float
    latency_ms: Latency
    errors: Errors
    # uWSGI worker id (1-based, as a string for JSON) -> requests served during the cell.
    worker_requests: dict[str, int]
    # CPU seconds used during the cell by the uWSGI tree, the nginx tree and wrk.
    cpu_s: dict[str, float]
    # Median latency of one request alone (wrk -c1 during warm-up), for the closed-loop bound.
    unloaded_latency_ms: float
    # Upper bounds on throughput and how close the layout came to the smaller one.
    capacity_rps: float
    closed_loop_rps: float
    efficiency: float
    scenario: str = "article"
    raw_output: str = ""  # path of wrk's raw output, relative to the results directory
    # Scenario-specific measurements (e.g. the stalled clients of the `stall` scenario).
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        _check(isinstance(self.layout, str) and self.layout != "", "layout: must be a non-empty string")
        _check(isinstance(self.scenario, str) and self.scenario.replace("-", "").isalnum(),
               f"scenario: must be a name of letters, digits and '-', got {self.scenario!r}")
        for name, low in (("concurrency", 1), ("repeat", 1), ("requests", 0)):
            v = getattr(self, name)
            _check(isinstance(v, int) and not isinstance(v, bool) and v >= low,
                   f"{name}: must be an integer >= {low}, got {v!r}")
        for name in ("duration_s", "rps", "unloaded_latency_ms", "capacity_rps", "closed_loop_rps", "efficiency"):
            object.__setattr__(self, name, _finite_nonneg(getattr(self, name), name))
        if isinstance(self.latency_ms, dict):
            object.__setattr__(self, "latency_ms", Latency(**self.latency_ms))
        if isinstance(self.errors, dict):
            object.__setattr__(self, "errors", Errors(**self.errors))
        _check(isinstance(self.latency_ms, Latency), "latency_ms: must be an object of percentiles")
        _check(isinstance(self.errors, Errors), "errors: must be an object of error counts")
        _check(isinstance(self.worker_requests, dict), "worker_requests: must be a mapping")
        _check(all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in self.worker_requests.values()),
               "worker_requests: counts must be integers >= 0")
        object.__setattr__(self, "worker_requests", {str(k): v for k, v in self.worker_requests.items()})
        _check(isinstance(self.cpu_s, dict), "cpu_s: must be a mapping")
        object.__setattr__(self, "cpu_s", {k: _finite_nonneg(v, f"cpu_s.{k}") for k, v in self.cpu_s.items()})
        _check(isinstance(self.extra, dict), "extra: must be a mapping")

    @property
    def key(self) -> tuple[str, int, int]:
        return (self.layout, self.concurrency, self.repeat)

    @property
    def balance(self) -> dict[str, float]:
        """max/min share of requests across workers, and their coefficient of variation."""
        return balance(self.worker_requests)

    def to_dict(self) -> dict:
        data = asdict(self)
        data["balance"] = self.balance
        data["errors"]["total"] = self.errors.total
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "Cell":
        data = dict(data)
        data.pop("balance", None)
        errors = dict(data.get("errors", {}))
        errors.pop("total", None)
        data["errors"] = errors
        try:
            return cls(**data)
        except ResultsError:
            raise
        except (TypeError, ValueError, AttributeError) as exc:
            raise ResultsError(f"cell {data.get('layout', '?')}: {exc}") from None


def balance(worker_requests: dict[str, int]) -> dict[str, float]:
    counts = list(worker_requests.values())
    if not counts or sum(counts) == 0:
        return {"max_min_ratio": 0.0, "cv": 0.0}
    mean = sum(counts) / len(counts)
    cv = math.sqrt(sum((c - mean) ** 2 for c in counts) / len(counts)) / mean
    low = min(counts)
    ratio = max(counts) / low if low else math.inf
    return {"max_min_ratio": ratio if math.isfinite(ratio) else -1.0, "cv": cv}


@dataclass(frozen=True)
class Results:
    environment: dict
    arguments: dict
    workload: dict
    cells: tuple[Cell, ...]
    created: str = ""
    format_version: int = FORMAT_VERSION

    def __post_init__(self):
        _check(self.format_version == FORMAT_VERSION,
               f"format_version: this tool reads version {FORMAT_VERSION}, got {self.format_version!r}")
        object.__setattr__(self, "cells", tuple(c if isinstance(c, Cell) else Cell.from_dict(c) for c in self.cells))
        keys = [(c.scenario, *c.key) for c in self.cells]
        _check(len(keys) == len(set(keys)), "cells: a (scenario, layout, concurrency, repeat) appears twice")

    @property
    def layouts(self) -> list[str]:
        """Layouts in the order they were given."""
        order = self.arguments.get("layouts") or []
        seen = [c.layout for c in self.cells]
        return [x for x in order if x in seen] + sorted({x for x in seen if x not in order})

    @property
    def levels(self) -> list[int]:
        return sorted({c.concurrency for c in self.cells})

    @property
    def scenarios(self) -> list[str]:
        return list(dict.fromkeys(c.scenario for c in self.cells))

    def to_dict(self) -> dict:
        return {
            "format_version": self.format_version,
            "created": self.created,
            "environment": self.environment,
            "arguments": self.arguments,
            "workload": self.workload,
            "cells": [c.to_dict() for c in self.cells],
        }

    def save(self, path: Path | str) -> Path:
        """Write atomically (temp file + rename): a crash never leaves half a results file."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".results-", suffix=".json", dir=path.parent)
        try:
            with os.fdopen(fd, "w") as fh:
                json.dump(self.to_dict(), fh, indent=2, sort_keys=False)
                fh.write("\n")
            os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide results from the rest of the team
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path


def load(path: Path | str) -> Results:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ResultsError(f"{path}: cannot read results JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ResultsError(f"{path}: not a results object")
    version = data.get("format_version")
    if version != FORMAT_VERSION:
        raise ResultsError(f"{path}: format_version {version!r} is not supported (this tool reads {FORMAT_VERSION})")
    missing = [k for k in ("environment", "arguments", "workload", "cells") if k not in data]
    if missing:
        raise ResultsError(f"{path}: missing {', '.join(missing)}")
    if not isinstance(data["cells"], list):
        raise ResultsError(f"{path}: cells must be a list")
    return Results(
        environment=data.get("environment", {}),
        arguments=data.get("arguments", {}),
        workload=data.get("workload", {}),
        cells=tuple(data.get("cells", [])),
        created=data.get("created", ""),
        format_version=version,
    )
