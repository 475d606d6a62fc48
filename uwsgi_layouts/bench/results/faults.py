"""Fault records: one ``FaultRecord`` per fault experiment (faults), with the ``Check`` of each
of its targets."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from uwsgi_layouts.bench.results.checks import ResultsError, _build, _check, _finite_nonneg, _is_count, _mapping
from uwsgi_layouts.bench.results.frozen import read_only


@dataclass(frozen=True)
class Check:
    """One target of a fault experiment, with what was measured against it."""

    target: str
    ok: bool
    measured: str

    def __post_init__(self):
        _check(isinstance(self.target, str) and self.target, "check.target: must be a non-empty string")
        _check(isinstance(self.ok, bool), f"check.ok: must be true or false, got {self.ok!r}")
        _check(isinstance(self.measured, str), "check.measured: must be a string")


@dataclass(frozen=True)
class FaultRecord:
    """One fault experiment: the load held, the faults injected, requests sent and failed
    (wrk's error classes, non-2xx included), data lost (e.g. POST handlers that ran twice),
    notes, the checks of its targets and the raw figures behind them. ``error``: why the
    experiment could not run ("" when it ran). ``figures`` is a read-only copy (``frozen``), at
    any depth; notes and checks are tuples."""

    name: str
    layout: str
    load: str  # e.g. "wrk -c8 6 s GET"
    faults_injected: int
    requests_sent: int
    requests_failed: int
    data_lost: int
    notes: tuple[str, ...] = ()
    checks: tuple[Check, ...] = ()
    patch: str = ""  # the experiment-only nginx.conf patch this ran with ("" = as rendered)
    figures: dict = field(default_factory=dict, compare=False, hash=False)
    seconds: float = 0.0  # how long the experiment took, stack start and stop included
    error: str = ""

    def __post_init__(self):
        for name in ("name", "layout"):
            _check(isinstance(getattr(self, name), str) and getattr(self, name), f"{name}: must be a non-empty string")
        for name in ("load", "patch", "error"):
            _check(isinstance(getattr(self, name), str), f"{name}: must be a string")
        for name in ("faults_injected", "requests_sent", "requests_failed", "data_lost"):
            _check(_is_count(getattr(self, name)), f"{name}: must be an integer >= 0, got {getattr(self, name)!r}")
        _check(isinstance(self.notes, (list, tuple)) and all(isinstance(n, str) for n in self.notes),
               "notes: must be a list of strings")
        object.__setattr__(self, "notes", tuple(self.notes))
        _check(isinstance(self.checks, (list, tuple)), "checks: must be a list")
        object.__setattr__(self, "checks", tuple(c if isinstance(c, Check) else _build(Check, _mapping(c, "check"),
                                                                                      "check")
                                                 for c in self.checks))
        _mapping(self.figures, "figures")
        try:  # stored as JSON: what is kept in memory is what a reload gives back
            object.__setattr__(self, "figures", read_only(json.loads(json.dumps(self.figures))))
        except (TypeError, ValueError) as exc:
            raise ResultsError(f"figures: must be JSON data ({exc})") from None
        object.__setattr__(self, "seconds", _finite_nonneg(self.seconds, "seconds"))

    @property
    def ok(self) -> bool:
        return not self.error and all(c.ok for c in self.checks)

    @property
    def failed_checks(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    def explain(self) -> str:
        lines = [f"{self.name} on {self.layout} ({self.load}):"]
        lines += [f"  [{'ok' if c.ok else 'FAILED'}] {c.target}: {c.measured}" for c in self.checks]
        lines += [f"  note: {n}" for n in self.notes]
        lines += [f"  could not run: {self.error}"] if self.error else []
        return "\n".join(lines)

    def to_dict(self) -> dict:
        data = asdict(self)
        if not data["error"]:
            del data["error"]
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "FaultRecord":
        _check(isinstance(data, dict), f"fault: must be an object, got {type(data).__name__}")
        return _build(cls, data, f"fault {data.get('name', '?')}")
