"""Results: small immutable records, validated on creation, saved as ONE versioned JSON format.

Every experiment kind saves a ``Results``: its ``kind``, when it was ``created``, the
``environment``, the ``arguments`` (the full argument set, including the command line), the
``workload``, and the kind's records (``KIND_RECORDS`` says which field a kind fills):

- ``cells``  (``Cell``):        closed-loop measurements, one per layout x concurrency x repeat
                                (compare, and tune: ``bench.tune.record`` checks its arguments);
- ``steps``  (``Step``):        open-loop rate steps (openloop);
- ``faults`` (``FaultRecord``): fault experiments with their checks (faults);
- ``diagnoses`` (``Diagnosis``): a running uWSGI watched over a window (doctor: ``bench.diagnosis``
                                registers the kind).

Everything a report shows is derived from this file, so a stored run can be re-reported (or
replayed) without timing anything. Derived values (a cell's ``balance``, the open loop's
``knee``) are written for readers of the JSON but recomputed on load, never trusted from it.

Format version 2 (this one). ``load`` also reads the version-1 files written before, migrating
them: compare's ``results.json`` (no ``kind``) and openloop's ``openloop.json`` (``kind:
openloop``). Anything else (a newer version, not JSON, a missing field) raises ResultsError with
one line saying why.

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
                 ``threads``, ``full``, ``sampler_cpu_s``); every share in 0..1;
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

import datetime as dt
import json
import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from uwsgi_layouts.files import write_atomic

FORMAT_VERSION = 2
READS_VERSIONS = (1, 2)
# oom: workers the kernel's OOM killer ended in the app server's cgroup (a layout's @memory limit).
ERROR_CLASSES = ("connect", "read", "write", "timeout", "status", "oom")
PERCENTILES = ("p50", "p90", "p99", "p999", "max")
STATUS_CLASSES = ("2xx", "3xx", "4xx", "5xx")

# Experiment kind -> the record field its Results fill. ``register_kind`` adds one (e.g. tune).
KIND_RECORDS: dict[str, str] = {"compare": "cells", "openloop": "steps", "faults": "faults"}
RECORD_FIELDS = ("cells", "steps", "faults", "diagnoses")


class ResultsError(ValueError):
    """A results file or record that cannot be trusted (bad version, missing field)."""


# Experiment kind -> a check of its whole Results (e.g. its own arguments), run on creation and load.
KIND_CHECKS: dict[str, Callable[["Results"], None]] = {}


def register_kind(name: str, records: str, check: Callable[["Results"], None] | None = None) -> None:
    """Let a new experiment kind save ``Results``: ``records`` is the field it fills; ``check``
    (optional) validates what else the kind stores, raising ResultsError with one line."""
    if records not in RECORD_FIELDS:
        raise ValueError(f"records: must be one of {', '.join(RECORD_FIELDS)}, got {records!r}")
    if KIND_RECORDS.get(name, records) != records:
        raise ValueError(f"kind {name!r} is already registered with {KIND_RECORDS[name]!r}")
    KIND_RECORDS[name] = records
    if check is not None:
        KIND_CHECKS[name] = check


# --------------------------------------------------------------------------- validation helpers


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


READ_ONLY = "a results record is read-only after creation: make a new one (dataclasses.replace)"


class ReadOnlyDict(dict):
    """A dict that refuses every change: what a ``Results`` or ``Cell`` hands out. Still a dict
    (``isinstance`` checks, ``json``, ``{**d}`` and ``d | other`` work as before); copies (``dict(d)``,
    ``d | other``) are ordinary dicts."""

    def _refuse(self, *args, **kwargs):
        raise TypeError(READ_ONLY)

    __setitem__ = __delitem__ = __ior__ = clear = pop = popitem = setdefault = update = _refuse

    def __reduce__(self):
        return (ReadOnlyDict, (dict(self),))


class ReadOnlyList(list):
    """A list that refuses every change (see ``ReadOnlyDict``)."""

    def _refuse(self, *args, **kwargs):
        raise TypeError(READ_ONLY)

    __setitem__ = __delitem__ = __iadd__ = __imul__ = append = extend = insert = remove = pop = clear = sort = \
        reverse = _refuse

    def __reduce__(self):
        return (ReadOnlyList, (list(self),))


def read_only(value):
    """``value`` with every dict and list in it, at any depth, made read-only (copied: the
    caller's own dict stays the caller's)."""
    if isinstance(value, dict):
        return ReadOnlyDict((k, read_only(v)) for k, v in value.items())
    if isinstance(value, list):
        return ReadOnlyList(read_only(v) for v in value)
    return value


def _mapping(x, name: str, what: str = "a mapping") -> dict:
    _check(isinstance(x, dict), f"{name}: must be {what}, got {type(x).__name__}")
    return x


def _digits(key, name: str) -> str:
    key = str(key)
    _check(key.isdigit(), f"{name}: keys must be numbers (worker ids, counts), got {key!r}")
    return key


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


# --------------------------------------------------------------------------- closed loop (cells)


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


def _build(cls, data: dict, label: str):
    """``cls(**data)``, with a wrong or missing field reported as one ResultsError line."""
    try:
        return cls(**data)
    except ResultsError as exc:
        raise ResultsError(f"{label}: {exc}") from None
    except (TypeError, ValueError, AttributeError) as exc:
        raise ResultsError(f"{label}: {exc}") from None


def balance(worker_requests: dict[str, int]) -> dict[str, float]:
    counts = list(worker_requests.values())
    if not counts or sum(counts) == 0:
        return {"max_min_ratio": 0.0, "cv": 0.0}
    mean = sum(counts) / len(counts)
    cv = math.sqrt(sum((c - mean) ** 2 for c in counts) / len(counts)) / mean
    low = min(counts)
    ratio = max(counts) / low if low else math.inf
    return {"max_min_ratio": ratio if math.isfinite(ratio) else -1.0, "cv": cv}


# --------------------------------------------------------------------------- open loop (steps)

HTTP_CLASSES = ("1xx", "2xx", "3xx", "4xx", "5xx")  # httperf's "Reply status" line
HTTPERF_ERRORS = ("total", "client_timo", "socket_timo", "connrefused", "connreset",
                  "fd_unavail", "addrunavail", "ftab_full", "other")
VERDICTS = ("pass", "fail", "invalid")


def _counts(value, name: str, keys: tuple[str, ...]) -> dict[str, int]:
    _mapping(value, name)
    missing = [k for k in keys if k not in value]
    _check(not missing, f"{name}: lacks {', '.join(missing)}")
    for k in keys:
        _check(_is_count(value[k]), f"{name}.{k}: must be an integer >= 0, got {value[k]!r}")
    return {k: value[k] for k in keys}


def _numbers(value, name: str, keys: tuple[str, ...]) -> dict:
    _mapping(value, name)
    missing = [k for k in keys if k not in value]
    _check(not missing, f"{name}: lacks {', '.join(missing)}")
    for k in keys:
        _finite_nonneg(value[k], f"{name}.{k}")
    return dict(value)


@dataclass(frozen=True)
class Step:
    """One open-loop step: httperf offering ``rate`` new connections per second, one request
    each, for ``num_conns`` connections; its summary, the server's CPU and the verdict."""

    rate: float
    num_conns: int
    connections: int
    requests: int
    replies: int
    test_duration_s: float
    # replies/s: {"min", "avg", "max", "stddev", "samples"[, "each": one figure per 5-s sample]}
    reply_rate: dict
    status: dict  # HTTP status class (1xx..5xx) -> replies
    errors: dict  # httperf's error counters, HTTPERF_ERRORS
    server_cpu_cores: float  # uWSGI + nginx CPU seconds per second of the step
    verdict: str  # "pass", "fail" or "invalid" (the rule: bench.analysis.judge_step)
    reasons: tuple[str, ...] = ()
    raw_output: str = ""  # httperf's output, relative to the results directory
    connection_ms: dict = field(default_factory=dict)  # {"min", "avg", "max", "median", "stddev"}, if printed
    request_rate: float | None = None  # requests/s httperf achieved, if printed
    client_cpu_pct: float | None = None  # httperf's own CPU share, if printed

    def __post_init__(self):
        _check(_is_number(self.rate) and self.rate > 0, f"rate: must be a number > 0, got {self.rate!r}")
        _check(_is_count(self.num_conns, 1), f"num_conns: must be an integer >= 1, got {self.num_conns!r}")
        for name in ("connections", "requests", "replies"):
            _check(_is_count(getattr(self, name)), f"{name}: must be an integer >= 0, got {getattr(self, name)!r}")
        for name in ("test_duration_s", "server_cpu_cores"):
            object.__setattr__(self, name, _finite_nonneg(getattr(self, name), name))
        rate = _numbers(self.reply_rate, "reply_rate", ("min", "avg", "max", "stddev"))
        _check(_is_count(rate.get("samples")), f"reply_rate.samples: must be an integer >= 0, "
                                               f"got {rate.get('samples')!r}")
        if "each" in rate:
            _check(isinstance(rate["each"], list), "reply_rate.each: must be a list of numbers")
            for x in rate["each"]:
                _finite_nonneg(x, "reply_rate.each")
        object.__setattr__(self, "reply_rate", rate)
        object.__setattr__(self, "status", _counts(self.status, "status", HTTP_CLASSES))
        object.__setattr__(self, "errors", _counts(self.errors, "errors", HTTPERF_ERRORS))
        _check(self.verdict in VERDICTS, f"verdict: must be one of {', '.join(VERDICTS)}, got {self.verdict!r}")
        _check(isinstance(self.reasons, (list, tuple)) and all(isinstance(r, str) for r in self.reasons),
               "reasons: must be a list of strings")
        object.__setattr__(self, "reasons", tuple(self.reasons))
        _check(isinstance(self.raw_output, str), "raw_output: must be a path string")
        if self.connection_ms:
            object.__setattr__(self, "connection_ms", _numbers(self.connection_ms, "connection_ms",
                                                               ("min", "avg", "max", "median", "stddev")))
        for name in ("request_rate", "client_cpu_pct"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, _finite_nonneg(getattr(self, name), name))

    def to_dict(self) -> dict:
        data = {"rate": self.rate, "num_conns": self.num_conns, "connections": self.connections,
                "requests": self.requests, "replies": self.replies, "test_duration_s": self.test_duration_s,
                "reply_rate": self.reply_rate, "status": self.status, "errors": self.errors}
        if self.connection_ms:
            data["connection_ms"] = self.connection_ms
        for name in ("request_rate", "client_cpu_pct"):
            if getattr(self, name) is not None:
                data[name] = getattr(self, name)
        data.update({"server_cpu_cores": self.server_cpu_cores, "verdict": self.verdict,
                     "reasons": list(self.reasons), "raw_output": self.raw_output})
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "Step":
        _check(isinstance(data, dict), f"step: must be an object, got {type(data).__name__}")
        return _build(cls, data, f"step at rate {data.get('rate', '?')}")


def find_knee(steps) -> dict:
    """The last passing rate before the first step that did not pass (derived, never stored)."""
    last_pass, first_bad = None, None
    for step in sorted(steps, key=lambda s: s.rate):
        if step.verdict == "pass":
            last_pass = step
            continue
        first_bad = step
        break
    if first_bad is None:
        status = "not reached" if last_pass else "no steps"
    elif first_bad.verdict == "invalid":
        status = "client-limited"
    else:
        status = "found" if last_pass else "below the first rate"
    return {"rate": last_pass.rate if last_pass else None,
            "next_rate": first_bad.rate if first_bad else None,
            "next_verdict": first_bad.verdict if first_bad else None,
            "next_reasons": list(first_bad.reasons) if first_bad else [],
            "status": status}


# --------------------------------------------------------------------------- faults


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
    experiment could not run ("" when it ran)."""

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
            object.__setattr__(self, "figures", json.loads(json.dumps(self.figures)))
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


# --------------------------------------------------------------------------- doctor (diagnoses)

END_STATES = ("complete", "stopped", "interrupted")


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
    (``bench.diagnosis.findings``), written for readers of the JSON and recomputed by reports."""

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

    def to_dict(self) -> dict:
        data = asdict(self)
        data["findings"] = list(self.findings)
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "Diagnosis":
        _check(isinstance(data, dict), f"diagnosis: must be an object, got {type(data).__name__}")
        return _build(cls, data, f"diagnosis of {data.get('address', '?')}")


RECORD_TYPES = {"cells": Cell, "steps": Step, "faults": FaultRecord, "diagnoses": Diagnosis}


# --------------------------------------------------------------------------- the results file


@dataclass(frozen=True)
class Results:
    environment: dict
    arguments: dict
    workload: dict
    cells: tuple[Cell, ...] = ()
    created: str = ""
    format_version: int = FORMAT_VERSION
    kind: str = "compare"
    steps: tuple[Step, ...] = ()
    faults: tuple[FaultRecord, ...] = ()
    diagnoses: tuple[Diagnosis, ...] = ()

    def __post_init__(self):
        _check(self.format_version == FORMAT_VERSION,
               f"format_version: this tool writes version {FORMAT_VERSION}, got {self.format_version!r}")
        _check(self.kind in KIND_RECORDS, f"kind: must be one of {', '.join(KIND_RECORDS)}, got {self.kind!r}")
        for name in ("environment", "arguments", "workload"):
            object.__setattr__(self, name, read_only(_mapping(getattr(self, name), name)))
        _check(isinstance(self.created, str), "created: must be a string (ISO 8601 time)")
        for name, cls in RECORD_TYPES.items():
            records = getattr(self, name)
            _check(isinstance(records, (list, tuple)), f"{name}: must be a list")
            _check(not records or name == KIND_RECORDS[self.kind], f"{name}: the results of kind {self.kind} hold "
                                                            f"{KIND_RECORDS[self.kind]}, not {name}")
            object.__setattr__(self, name, tuple(r if isinstance(r, cls) else cls.from_dict(r) for r in records))
        keys = [(c.scenario, *c.key) for c in self.cells]
        _check(len(keys) == len(set(keys)), "cells: a (scenario, layout, concurrency, repeat) appears twice")
        if self.kind in KIND_CHECKS:
            KIND_CHECKS[self.kind](self)

    @property
    def records(self) -> tuple:
        """This kind's records (cells, steps, faults or diagnoses)."""
        return getattr(self, KIND_RECORDS[self.kind])

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

    @property
    def knee(self) -> dict:
        """The open loop's knee, derived from the steps."""
        return find_knee(self.steps)

    def to_dict(self) -> dict:
        records = KIND_RECORDS[self.kind]
        data = {
            "format_version": self.format_version,
            "kind": self.kind,
            "created": self.created,
            "environment": self.environment,
            "arguments": self.arguments,
            "workload": self.workload,
            records: [r.to_dict() for r in self.records],
        }
        if records == "steps":
            data["knee"] = self.knee  # for readers of the JSON; recomputed on load
        return data

    def save(self, path: Path | str) -> Path:
        """Write atomically (temp file + rename): a crash never leaves half a results file. A pair
        of numbers (a histogram's ``[latency_us, count]``) stays on one line."""
        text = _PAIR.sub(r"[\1, \2]", json.dumps(self.to_dict(), indent=2, sort_keys=False))
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        return write_atomic(path, text + "\n")


# Only structural whitespace: JSON strings cannot hold a raw newline, so nothing inside one matches.
_PAIR = re.compile(r"\[\n\s*(-?[0-9][0-9.eE+-]*),\n\s*(-?[0-9][0-9.eE+-]*)\n\s*\]")


def load(path: Path | str) -> Results:
    """A results file of any kind and of any version this tool reads (version 1 is migrated)."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ResultsError(f"{path}: cannot read results JSON ({exc.strerror or exc})") from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ResultsError(f"{path}: cannot read results JSON ({exc})") from None
    return from_dict(data, source=str(path))


def from_dict(data, source: str = "results") -> Results:
    if not isinstance(data, dict):
        raise ResultsError(f"{source}: not a results object")
    version = data.get("format_version")
    if version not in READS_VERSIONS:
        raise ResultsError(f"{source}: format_version {version!r} is not supported (this tool reads "
                           f"{' and '.join(map(str, READS_VERSIONS))})")
    if version == 1:
        data = migrate_v1(data, source)
    kind = data.get("kind")
    if kind not in KIND_RECORDS:
        # Kinds beyond the three built in register themselves when their module is imported.
        raise ResultsError(f"{source}: kind {kind!r} is not one this tool reads ({', '.join(KIND_RECORDS)}); "
                           "in Python, import uwsgi_layouts.bench.kinds first: it registers every kind")
    records = KIND_RECORDS[kind]
    missing = [k for k in ("environment", "arguments", "workload", records) if k not in data]
    if missing:
        raise ResultsError(f"{source}: missing {', '.join(missing)}")
    for name in RECORD_FIELDS:
        if name in data and not isinstance(data[name], list):
            raise ResultsError(f"{source}: {name} must be a list")
    try:
        return Results(
            environment=data["environment"], arguments=data["arguments"], workload=data["workload"],
            created=data.get("created", ""), kind=kind,
            **{name: tuple(data.get(name) or ()) for name in RECORD_FIELDS},
        )
    except ResultsError as exc:
        raise ResultsError(f"{source}: {exc}") from None


def migrate_v1(data: dict, source: str) -> dict:
    """Version 1 as version 2: compare's results.json had no ``kind``; openloop's openloop.json
    had ``kind: openloop``, its arguments and steps, and a stored knee (dropped: derived)."""
    kind = data.get("kind", "compare")
    if kind == "compare":
        return {**data, "kind": "compare", "format_version": FORMAT_VERSION}
    if kind == "openloop":
        arguments = data.get("arguments", {})
        if not isinstance(arguments, dict):
            raise ResultsError(f"{source}: arguments must be an object")
        data = {k: v for k, v in data.items() if k != "knee"}
        return {**data, "format_version": FORMAT_VERSION,
                "workload": {"path": arguments.get("path", ""), "files": arguments.get("files", "")}}
    raise ResultsError(f"{source}: format_version 1 files of kind {kind!r} were never written by this tool")


def utc_now() -> str:
    """``created``: the time a run started, ISO 8601 in UTC to the second."""
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
