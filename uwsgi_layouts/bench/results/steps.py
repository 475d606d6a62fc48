"""Open-loop records: one ``Step`` per rate httperf offered (openloop), and what is derived from
them, never stored, recomputed on load: each step's steady minimum (``steady_min``, the figure its
verdict held against the offered rate) and the knee (``find_knee``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from uwsgi_layouts.bench.results.checks import _build, _check, _finite_nonneg, _is_count, _is_number, _mapping
from uwsgi_layouts.bench.results.frozen import read_only

HTTP_CLASSES = ("1xx", "2xx", "3xx", "4xx", "5xx")  # httperf's "Reply status" line
HTTPERF_ERRORS = ("total", "client_timo", "socket_timo", "connrefused", "connreset",
                  "fd_unavail", "addrunavail", "ftab_full", "other")
VERDICTS = ("pass", "fail", "invalid")


def steady_min(reply_rate: Mapping) -> float:
    """The lowest reply-rate sample, leaving out the first when there are others: the first
    5-s window holds the ramp-up (no reply comes back before one response time has passed),
    which at low rates alone costs more than 5% of the window. Without per-sample figures
    (httperf run without --verbose), httperf's own min. (Here, with the record: the step's
    verdict (``bench.analysis.judge_step``) and every report read this one figure.)"""
    each = reply_rate.get("each") or []
    if len(each) >= 2:
        return min(each[1:])
    return reply_rate["min"]


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
    each, for ``num_conns`` connections; its summary, the server's CPU and the verdict. Its
    mappings are read-only copies (``frozen``), at any depth."""

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
    server_cpu_cores: float  # app server (every member) + nginx CPU seconds per second of the step
    verdict: str  # "pass", "fail" or "invalid" (the rule: bench.analysis.judge_step)
    reasons: tuple[str, ...] = ()
    raw_output: str = ""  # httperf's output, relative to the results directory
    connection_ms: dict = field(default_factory=dict)  # {"min", "avg", "max", "median", "stddev"}, if printed
    request_rate: float | None = None  # requests/s httperf achieved, if printed
    client_cpu_pct: float | None = None  # httperf's own CPU share, if printed
    # the most connections httperf opened in one pass of its loop (bench.load.sending), if printed
    max_burst: int | None = None

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
        _check(self.max_burst is None or _is_count(self.max_burst),
               f"max_burst: must be an integer >= 0, got {self.max_burst!r}")
        for name in ("reply_rate", "status", "errors", "connection_ms"):  # reply_rate["each"]: a list inside
            object.__setattr__(self, name, read_only(getattr(self, name)))

    @property
    def steady_min(self) -> float:
        """The lowest steady reply-rate sample (``steady_min``): what the verdict held against the rate."""
        return steady_min(self.reply_rate)

    def to_dict(self) -> dict:
        data = {"rate": self.rate, "num_conns": self.num_conns, "connections": self.connections,
                "requests": self.requests, "replies": self.replies, "test_duration_s": self.test_duration_s,
                "reply_rate": self.reply_rate, "status": self.status, "errors": self.errors}
        if self.connection_ms:
            data["connection_ms"] = self.connection_ms
        for name in ("request_rate", "client_cpu_pct"):
            if getattr(self, name) is not None:
                data[name] = getattr(self, name)
        if self.max_burst is not None:
            data["max_burst"] = self.max_burst
        data.update({"server_cpu_cores": self.server_cpu_cores, "verdict": self.verdict,
                     "reasons": list(self.reasons), "raw_output": self.raw_output})
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "Step":
        """A stored openloop step. A field this version does not know is left out, not refused: a
        newer tool adds optional fields within the format version (as ``max_burst`` was added), and
        a missing required field is still refused by name."""
        _check(isinstance(data, dict), f"step: must be an object, got {type(data).__name__}")
        known = {name: data[name] for name in cls.__dataclass_fields__ if name in data}
        return _build(cls, known, f"step at rate {data.get('rate', '?')}")


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
