"""Doctor's records: one ``Diagnosis`` per running uWSGI watched over a window (doctor:
``bench.diagnosis`` registers the kind)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from uwsgi_layouts.bench.results.cells import _inflight
from uwsgi_layouts.bench.results.checks import (
    ResultsError,
    _build,
    _check,
    _count,
    _digits,
    _finite_nonneg,
    _int_map,
    _is_count,
    _is_number,
    _mapping,
    _numbers_list,
    _share,
)
from uwsgi_layouts.bench.results.frozen import read_only

END_STATES = ("complete", "stopped", "interrupted")

def _diag_layout(value) -> dict:
    _mapping(value, "layout")
    for name in ("processes", "threads"):
        _check(_is_count(value.get(name), 1), f"layout.{name}: must be an integer >= 1, got {value.get(name)!r}")
    _check(isinstance(value.get("strategy"), str), "layout.strategy: must be a string")
    sockets = value.get("sockets")
    _check(isinstance(sockets, list), "layout.sockets: must be a list")
    for i, s in enumerate(sockets):
        _mapping(s, f"layout.sockets[{i}]")
        _check(isinstance(s.get("name"), str) and s["name"], f"layout.sockets[{i}].name: must be a non-empty string")
        _numbers_list(s.get("workers", []), f"layout.sockets[{i}].workers", _count)
    return dict(value)


def _diag_workers(value) -> dict:
    _mapping(value, "workers")
    out = {}
    for w, figures in value.items():
        name = f"workers.{w}"
        _mapping(figures, name)
        for k, v in figures.items():
            if k == "mean_ms":
                _finite_nonneg(v, f"{name}.mean_ms")
            else:
                _count(v, f"{name}.{k}")
        out[_digits(w, "workers")] = dict(figures)
    return out


def _diag_queue(value) -> dict:
    _mapping(value, "queue")
    for sock, figures in _mapping(value.get("sockets", {}), "queue.sockets").items():
        _mapping(figures, f"queue.sockets.{sock}")
        _count(figures.get("max"), f"queue.sockets.{sock}.max")
        _count(figures.get("backlog", 0), f"queue.sockets.{sock}.backlog")
        _share(figures.get("nonempty", 0.0), f"queue.sockets.{sock}.nonempty")
    if value.get("kernel_overflows") is not None:
        _count(value["kernel_overflows"], "queue.kernel_overflows")
    if value.get("uwsgi_queue_errors") is not None:
        _count(value["uwsgi_queue_errors"], "queue.uwsgi_queue_errors")
    return dict(value)


def _diag_timeline(value) -> dict:
    _mapping(value, "timeline")
    if not value:
        return {}
    t = _numbers_list(value.get("t"), "timeline.t")
    _check(all(a <= b for a, b in zip(t, t[1:], strict=False)), "timeline.t: times must not decrease")
    series = {"timeline.queue": value.get("queue")}
    series |= {f"timeline.inflight.{w}": v for w, v in _mapping(value.get("inflight"), "timeline.inflight").items()}
    for name, values in series.items():
        _check(len(_numbers_list(values, name, _count)) == len(t), f"{name}: must have one value per time ({len(t)})")
    return dict(value)


def _diag_memory(value) -> dict:
    _mapping(value, "memory")
    if not value:
        return {}
    _check(value.get("kind") in ("pss", "rss"), f"memory.kind: must be pss or rss, got {value.get('kind')!r}")
    for w, figures in _mapping(value.get("workers"), "memory.workers").items():
        name = f"memory.workers.{_digits(w, 'memory.workers')}"
        _mapping(figures, name)
        for k in ("first_mb", "last_mb", "span_s"):
            _finite_nonneg(figures.get(k), f"{name}.{k}")
        _check(_is_number(figures.get("growth_mb_per_h")), f"{name}.growth_mb_per_h: must be a finite number")
    return dict(value)


EXPOSURE_KEYS = ("address", "who", "why", "fix")
# The fields a Diagnosis holds as mappings (findings: a tuple of them), read-only once validated.
MAPPINGS = ("layout", "workers", "inflight", "queue", "timeline", "memory", "access", "exposure", "findings")


def _diag_exposure(value) -> dict:
    """{} (only the service's own users can open its stats server) or who else can, why, and the fix."""
    _mapping(value, "exposure")
    if not value:
        return {}
    _check(set(value) == set(EXPOSURE_KEYS) and all(isinstance(value[k], str) and value[k] for k in EXPOSURE_KEYS),
           f"exposure: must hold the non-empty strings {', '.join(EXPOSURE_KEYS)}")
    return dict(value)


def _diag_access(value) -> dict:
    _mapping(value, "access")
    if not value:
        return {}
    _check(isinstance(value.get("file"), str), "access.file: must be a path string")
    for name in ("lines", "used"):
        _count(value.get(name), f"access.{name}")
    _int_map(value.get("formats", {}), "access.formats")
    _int_map(value.get("codes", {}), "access.codes")
    for group in ("status", "upstreams"):
        for key, figures in _mapping(value.get(group, {}), f"access.{group}").items():
            _mapping(figures, f"access.{group}.{key}")
            _count(figures.get("requests"), f"access.{group}.{key}.requests")
            for k, v in figures.items():
                if k != "requests":
                    _finite_nonneg(v, f"access.{group}.{key}.{k}")
    return dict(value)


@dataclass(frozen=True)
class Diagnosis:
    """One watch of a running uWSGI by ``doctor``: what its stats server (and, given, nginx's
    access log) showed during a window of ``observed_s`` seconds sampled ``hz`` times a second.

    ``layout``: processes, threads, ``strategy`` (shared, thunder, mapped, overflow, or a
    description), ``evidence`` (how the sockets per worker were known), ``sockets`` (name, the
    workers holding it); ``requests`` served in the window; ``workers``: per worker
    id its pid, requests, ``mean_ms`` (time in requests / requests), harakiri, respawns and
    exceptions in the window; ``inflight``: ``Cell.inflight``'s record plus ``peak`` (most
    requests in flight at once, all workers); ``queue``: per socket the longest listen queue,
    its size and the share of samples it was not empty, where the queue was read (``source``),
    the kernel's TCP listen overflows meanwhile; ``timeline``: times, in flight per worker and
    queued (all sockets), at most a few thousand points; ``memory``: per worker PSS (or RSS) at
    the window's ends and its growth per hour; ``access``: the access log's lines of the window,
    latency per status class and upstream socket. ``ended``: complete, stopped (the service
    stopped answering: ``end_note`` says when and why) or interrupted. ``exposure``: who besides
    the service's own users can open its stats server (``address``, ``who``, ``why``, ``fix``), {}
    when nobody: its JSON holds the variables of requests in flight. ``findings``: derived
    (``bench.diagnosis.findings``), written for readers of the JSON and recomputed by reports.
    Every mapping (``MAPPINGS``) is a read-only copy (``frozen``), at any depth."""

    address: str
    planned_s: float
    observed_s: float
    hz: float
    layout: dict
    requests: int
    workers: dict
    inflight: dict
    queue: dict
    timeline: dict = field(default_factory=dict)
    memory: dict = field(default_factory=dict)
    access: dict = field(default_factory=dict)
    ended: str = "complete"
    end_note: str = ""
    findings: tuple = ()
    exposure: dict = field(default_factory=dict)

    def __post_init__(self):
        _check(isinstance(self.address, str) and self.address, "address: must be a non-empty string")
        for name in ("planned_s", "observed_s", "hz"):
            object.__setattr__(self, name, _finite_nonneg(getattr(self, name), name))
        _count(self.requests, "requests")
        _check(self.ended in END_STATES, f"ended: must be one of {', '.join(END_STATES)}, got {self.ended!r}")
        _check(isinstance(self.end_note, str), "end_note: must be a string")
        object.__setattr__(self, "layout", _diag_layout(self.layout))
        object.__setattr__(self, "workers", _diag_workers(self.workers))
        inflight = _mapping(self.inflight, "inflight")
        extra = {"peak": _count(inflight["peak"], "inflight.peak")} if "peak" in inflight else {}
        object.__setattr__(self, "inflight", {**_inflight({k: v for k, v in inflight.items() if k != "peak"}), **extra})
        for name, validate in (("queue", _diag_queue), ("timeline", _diag_timeline), ("memory", _diag_memory),
                               ("access", _diag_access), ("exposure", _diag_exposure)):
            object.__setattr__(self, name, validate(getattr(self, name)))
        _check(isinstance(self.findings, (list, tuple)), "findings: must be a list")
        for i, f in enumerate(self.findings):
            _mapping(f, f"findings[{i}]")
            _check(all(isinstance(f.get(k), str) for k in ("name", "text", "action")),
                   f"findings[{i}]: must hold the strings name, text and action")
        object.__setattr__(self, "findings", tuple(dict(f) for f in self.findings))
        try:  # stored as JSON: what is kept in memory is what a reload gives back
            for name in ("layout", "workers", "queue", "timeline", "memory", "access"):
                object.__setattr__(self, name, json.loads(json.dumps(getattr(self, name), allow_nan=False)))
        except (TypeError, ValueError) as exc:
            raise ResultsError(f"diagnosis: must be JSON data ({exc})") from None
        for name in MAPPINGS:
            object.__setattr__(self, name, read_only(getattr(self, name)))

    def to_dict(self) -> dict:
        data = asdict(self)
        data["findings"] = list(self.findings)
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "Diagnosis":
        _check(isinstance(data, dict), f"diagnosis: must be an object, got {type(data).__name__}")
        return _build(cls, data, f"diagnosis of {data.get('address', '?')}")
