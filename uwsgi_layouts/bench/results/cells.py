"""Closed-loop records: one ``Cell`` per layout x concurrency x repeat (compare, tune), with
wrk's latency percentiles (``Latency``) and error classes (``Errors``).

A ``Cell`` carries optional fields that later work fills; each is empty by default, validated
when given, and written to the JSON only when non-empty (so files and reports without them do
not change):

- ``status``:    responses per HTTP status class, ``{"2xx": n, "3xx": n, "4xx": n, "5xx": n}``
                 (any subset of these keys; counts are integers >= 0);
- ``memory``:    megabytes, ``{"app_pss_mb": x, "app_uss_mb": x, "app_rss_mb": x,
                 "nginx_pss_mb": x, "worker_pss_mb": {"1": x, "2": x, ...}}``: every value a number
                 >= 0, or a mapping of worker id (digits) to a number >= 0 (``app_*``: the app
                 server's tree, master and workers, whichever server the layout names);
- ``inflight``:  requests in flight per uWSGI worker, sampled from the stats server:
                 ``{"samples": n, "pileup": share, "workers": {"1": {"0": share, "1": share, ...},
                 ...}}``: ``samples`` an integer >= 1; ``pileup`` the share of samples in which some
                 worker had 2 or more requests in flight while another had at least 2 fewer
                 (``bench.observe.inflight_summary`` defines it), or null where it cannot happen
                 (one worker, or one thread per worker: 0 would read as "balanced"); per worker,
                 the share of samples at each in-flight count (keys: digits), summing to 1 (within
                 0.01); other keys allowed when they hold numbers >= 0 (``interval_ms``,
                 ``missed``, ``threads``, ``full``, ``sampler_cpu_s``); every share in 0..1;
- ``histogram``: wrk's latency histogram, ``[[latency_us, count], ...]``: latencies numbers >= 0
                 in strictly ascending order, counts integers > 0;
- ``round``:     the interleaved round the cell ran in (an integer >= 1): cells of different layouts
                 with the same scenario, concurrency and round ran one after the other on the same
                 machine state, and ``bench.paired`` compares them as a pair. Cells written before
                 rounds were recorded have none (0): they are compared unpaired, and reports say so;
- ``limit``:     the layout's CPU/memory limit (``@cpus``, ``@memory``) and its cgroup's counters over
                 the cell (deltas): ``{"cpus": x|null, "memory_mb": n|null, "periods": n,
                 "throttled_periods": n, "throttled_s": x, "cpu_s": x, "oom_kills": n,
                 "throttled_share": share|null, "quota_share": x|null}``: CFS periods in which the
                 server ran and those in which it hit its quota, the time it was held back, CPU seconds
                 it used, OOM kills (also counted in ``errors.oom``); ``throttled_share`` = throttled
                 periods / periods, ``quota_share`` = CPU used / (cpus x the cell's seconds).

Server-neutral names. Since the peers (gunicorn, granian) run in the same cells as uWSGI, the
app server's figures are named for their role, not for uWSGI: ``cpu_s["app"]`` and
``memory["app_pss_mb"|"app_uss_mb"|"app_rss_mb"]`` (the layout's name says which server it was).
Records written before named them ``cpu_s["uwsgi"]`` and ``uwsgi_*_mb`` (when every server was
uWSGI): a ``Cell`` renames those keys when it is built (``LEGACY_KEYS``), so files of every
version load and render, and code still writing the old keys is read the same way.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Callable

from uwsgi_layouts.bench.results.checks import (
    _build,
    _check,
    _digits,
    _finite_nonneg,
    _is_count,
    _is_number,
    _mapping,
    _share,
)
from uwsgi_layouts.bench.results.frozen import read_only

# oom: workers the kernel's OOM killer ended in the app server's cgroup (a layout's @memory limit).
ERROR_CLASSES = ("connect", "read", "write", "timeout", "status", "oom")
PERCENTILES = ("p50", "p90", "p99", "p999", "max")
STATUS_CLASSES = ("2xx", "3xx", "4xx", "5xx")


def _status(value) -> dict[str, int]:
    _mapping(value, "status", "a mapping of HTTP status class to count")
    for k, v in value.items():
        _check(k in STATUS_CLASSES, f"status: keys must be among {', '.join(STATUS_CLASSES)}, got {k!r}")
        _check(_is_count(v), f"status.{k}: must be an integer >= 0, got {v!r}")
    return dict(value)


def _memory(value) -> dict:
    _mapping(value, "memory", "a mapping of figure name to megabytes")
    out: dict = {}
    for k, v in value.items():
        _check(isinstance(k, str) and k != "", f"memory: keys must be non-empty names, got {k!r}")
        if isinstance(v, dict):
            out[k] = {_digits(w, f"memory.{k}"): _finite_nonneg(x, f"memory.{k}.{w}") for w, x in v.items()}
        else:
            out[k] = _finite_nonneg(v, f"memory.{k}")
    return out


def _inflight(value) -> dict:
    _mapping(value, "inflight")
    if not value:
        return {}
    _check(_is_count(value.get("samples"), 1), f"inflight.samples: must be an integer >= 1, got "
                                               f"{value.get('samples')!r}")
    pileup = value.get("pileup", ...)
    _check(pileup is not ..., "inflight.pileup: missing (a share in 0..1, or null where it cannot happen)")
    out: dict = {"samples": value["samples"], "pileup": None if pileup is None else _share(pileup, "inflight.pileup")}
    workers = _mapping(value.get("workers"), "inflight.workers", "a mapping of worker id to shares")
    out["workers"] = {}
    for w, shares in workers.items():
        name = f"inflight.workers.{w}"
        _mapping(shares, name, "a mapping of in-flight count to share")
        clean = {_digits(n, name): _share(s, f"{name}.{n}") for n, s in shares.items()}
        _check(abs(sum(clean.values()) - 1) <= 0.01, f"{name}: shares must sum to 1, got {sum(clean.values()):.3f}")
        out["workers"][_digits(w, "inflight.workers")] = clean
    for k, v in value.items():
        if k not in out:
            out[k] = _finite_nonneg(v, f"inflight.{k}")
    return out


def _histogram(value) -> tuple[tuple[float, int], ...]:
    _check(isinstance(value, (list, tuple)), "histogram: must be a list of [latency_us, count] pairs")
    out = []
    for i, pair in enumerate(value):
        _check(isinstance(pair, (list, tuple)) and len(pair) == 2,
               f"histogram[{i}]: must be a [latency_us, count] pair, got {pair!r}")
        latency, count = pair
        _check(_is_number(latency) and latency >= 0, f"histogram[{i}]: latency_us must be a number >= 0, "
                                                     f"got {latency!r}")
        _check(_is_count(count, 1), f"histogram[{i}]: count must be an integer > 0, got {count!r}")
        _check(not out or latency > out[-1][0], f"histogram[{i}]: latencies must be strictly ascending")
        out.append((latency, count))
    return tuple(out)


LIMIT_COUNTS = ("periods", "throttled_periods", "oom_kills")
LIMIT_SECONDS = ("throttled_s", "cpu_s")


def _limit(value) -> dict:
    _check(isinstance(value, dict), "limit: must be a mapping")
    if not value:
        return {}
    known = {"cpus", "memory_mb", "throttled_share", "quota_share", *LIMIT_COUNTS, *LIMIT_SECONDS}
    _check(set(value) <= known, f"limit: unknown keys {sorted(set(value) - known)}")
    for key in LIMIT_COUNTS:
        _check(_is_count(value.get(key, 0)), f"limit.{key}: must be an integer >= 0, got {value.get(key)!r}")
    for key in LIMIT_SECONDS:
        _finite_nonneg(value.get(key, 0.0), f"limit.{key}")
    cpus, memory = value.get("cpus"), value.get("memory_mb")
    _check(cpus is None or (_is_number(cpus) and cpus > 0), f"limit.cpus: must be a number > 0 or null, got {cpus!r}")
    _check(memory is None or _is_count(memory, 1), f"limit.memory_mb: must be an integer >= 1 or null, got {memory!r}")
    _check(value.get("throttled_periods", 0) <= value.get("periods", 0),
           "limit.throttled_periods: must not exceed periods")
    for key in ("throttled_share", "quota_share"):
        share = value.get(key)
        _check(share is None or (_is_number(share) and share >= 0 and (key != "throttled_share" or share <= 1)),
               f"limit.{key}: must be a share >= 0 (throttled_share at most 1) or null, got {share!r}")
    return dict(value)


def _round(value) -> int:
    _check(_is_count(value), f"round: must be an integer >= 1 (0 when not recorded), got {value!r}")
    return value


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
    oom: int = 0  # OOM kills in the app server's cgroup: written only when some happened

    def __post_init__(self):
        for name in ERROR_CLASSES:
            v = getattr(self, name)
            _check(isinstance(v, int) and v >= 0, f"errors.{name}: must be an integer >= 0, got {v!r}")

    @property
    def total(self) -> int:
        return sum(getattr(self, n) for n in ERROR_CLASSES)


# Keys named for uWSGI before the peers ran in the same cells -> their server-neutral names.
LEGACY_KEYS: dict[str, dict[str, str]] = {
    "cpu_s": {"uwsgi": "app"},
    "memory": {"uwsgi_pss_mb": "app_pss_mb", "uwsgi_uss_mb": "app_uss_mb", "uwsgi_rss_mb": "app_rss_mb"},
}


def server_neutral(field_name: str, value):
    """``value`` (a cell's ``cpu_s`` or ``memory``) with the uWSGI-era keys renamed (a key present
    under both names keeps the new one's value)."""
    renames = LEGACY_KEYS[field_name]
    if not isinstance(value, dict) or not any(k in value for k in renames):
        return value
    out = {renames.get(k, k): v for k, v in value.items() if k not in renames}
    out.update({new: value[old] for old, new in renames.items() if old in value and new not in value})
    return out


# Optional Cell fields (see the module docstring): validator, and written only when non-empty.
CELL_OPTIONAL: dict[str, Callable] = {"status": _status, "memory": _memory, "inflight": _inflight,
                                      "histogram": _histogram, "round": _round, "limit": _limit}


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
    # Worker number (1-based, as a string for JSON) -> requests served during the cell: uWSGI's
    # stats server, or for a server without one the app's X-Worker-Pid header; {} when neither.
    worker_requests: dict[str, int]
    # CPU seconds used during the cell by the app server's tree ("app"), the nginx tree and wrk.
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
    # Optional, filled by later work (schemas in the module docstring).
    status: dict = field(default_factory=dict)
    memory: dict = field(default_factory=dict)
    inflight: dict = field(default_factory=dict)
    histogram: tuple = ()
    round: int = 0  # the interleaved round (0: not recorded, an older file)
    # The layout's @cpus/@memory limit and what its cgroup said over the cell (module docstring).
    limit: dict = field(default_factory=dict)

    def __post_init__(self):
        _check(isinstance(self.layout, str) and self.layout != "", "layout: must be a non-empty string")
        _check(isinstance(self.scenario, str) and self.scenario.replace("-", "").isalnum(),
               f"scenario: must be a name of letters, digits and '-', got {self.scenario!r}")
        for name, low in (("concurrency", 1), ("repeat", 1), ("requests", 0)):
            v = getattr(self, name)
            _check(_is_count(v, low), f"{name}: must be an integer >= {low}, got {v!r}")
        for name in ("duration_s", "rps", "unloaded_latency_ms", "capacity_rps", "closed_loop_rps", "efficiency"):
            object.__setattr__(self, name, _finite_nonneg(getattr(self, name), name))
        if isinstance(self.latency_ms, dict):
            object.__setattr__(self, "latency_ms", Latency(**self.latency_ms))
        if isinstance(self.errors, dict):
            object.__setattr__(self, "errors", Errors(**self.errors))
        _check(isinstance(self.latency_ms, Latency), "latency_ms: must be an object of percentiles")
        _check(isinstance(self.errors, Errors), "errors: must be an object of error counts")
        _check(isinstance(self.worker_requests, dict), "worker_requests: must be a mapping")
        _check(all(_is_count(v) for v in self.worker_requests.values()),
               "worker_requests: counts must be integers >= 0")
        object.__setattr__(self, "worker_requests", {str(k): v for k, v in self.worker_requests.items()})
        for name in LEGACY_KEYS:
            object.__setattr__(self, name, server_neutral(name, getattr(self, name)))
        _check(isinstance(self.cpu_s, dict), "cpu_s: must be a mapping")
        object.__setattr__(self, "cpu_s", {k: _finite_nonneg(v, f"cpu_s.{k}") for k, v in self.cpu_s.items()})
        _check(isinstance(self.extra, dict), "extra: must be a mapping")
        for name, validate in CELL_OPTIONAL.items():
            object.__setattr__(self, name, validate(getattr(self, name)))
        for name in ("worker_requests", "cpu_s", "extra", "status", "memory", "inflight", "limit"):
            object.__setattr__(self, name, read_only(getattr(self, name)))

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
        if not data["errors"]["oom"]:  # files of runs without a memory limit stay as they were
            del data["errors"]["oom"]
        data["histogram"] = [list(pair) for pair in self.histogram]
        for name in CELL_OPTIONAL:
            if not data[name]:
                del data[name]
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "Cell":
        _check(isinstance(data, dict), f"cell: must be an object, got {type(data).__name__}")
        data = dict(data)
        data.pop("balance", None)
        errors = dict(data.get("errors", {}))
        errors.pop("total", None)
        data["errors"] = errors
        return _build(cls, data, f"cell {data.get('layout', '?')}")


def balance(worker_requests: dict[str, int]) -> dict[str, float]:
    counts = list(worker_requests.values())
    if not counts or sum(counts) == 0:
        return {"max_min_ratio": 0.0, "cv": 0.0}
    mean = sum(counts) / len(counts)
    cv = math.sqrt(sum((c - mean) ** 2 for c in counts) / len(counts)) / mean
    low = min(counts)
    ratio = max(counts) / low if low else math.inf
    return {"max_min_ratio": ratio if math.isfinite(ratio) else -1.0, "cv": cv}
