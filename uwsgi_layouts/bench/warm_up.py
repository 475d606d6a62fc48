"""What ``plan``'s one-connection warm-up proves before the first step: pure, no I/O.

Before its ladder of open-loop steps, ``plan`` (bench/kinds/plan.py) sends one connection's
requests back to back for ``--warmup`` seconds. nginx times them as it times the steps' (the
``$request_time`` of its access log), so the warm-up is a sample of the request at the least load
there is: one request at a time, none queued ahead of it, none sharing its worker or its CPU (the
CPU quota is the exception, below). When every timed request of that sample took longer than the
p99 target, no rate can meet it: at any rate the p99 of a step is at least as slow as the step's
fastest request, and no request at more load is faster than one connection's fastest. Then
``plan`` says no in seconds (``ruled_out``), where the ladder would take minutes (three rates down
from the first, each step long enough for ``--min-requests``).

The exact rule, and why each part (``ruled_out``):

- **only requests nginx answered below 400** count. wrk stops at its duration with a request in
  flight: nginx logs it 499 with the time until wrk hung up, shorter than the request; a fast
  error (a 5xx) says nothing of the request's own time, and fails every step anyway.
- **at least ``MIN_TIMED`` of them, and more than the replica's threads (processes x
  threads).** The odds are not the worry: if some rate kept 99% of requests within the target,
  one connection (less load) would too, and N requests all slower would have a chance of at most
  0.01^N. What is not random is a thread's first request (lazy imports, a connection opened per
  thread, a cache filled), slower than the rest: with more timed requests than threads, at least
  one was not a first, whatever the balancing (pigeonhole); and ten requests span more than one
  stall (a page-in, a collection).
  A warm-up with fewer (a request of seconds, a short ``--warmup``) proves nothing: the ladder
  decides as before.
- **the fastest less the time the replica's cgroup was throttled over the warm-up.** Back to back,
  one connection can be the most load for the CPU quota, not the least: each request finds what
  the previous left of the CFS period's quota, where a request at a low rate arrives after an
  idle gap with all of it. The kernel's ``throttled_usec`` adds every throttled interval of each
  CPU's run queue, so no request waited on the quota longer than the total: the fastest request,
  less that, is what it would have taken unthrottled, which no rate beats. Without a quota (or
  without throttling) nothing is subtracted.
- **at least the target + 2 ms** (two of nginx's ticks, ``LOG_TICK_MS``). nginx logs
  ``$request_time`` to the millisecond, from its clock cached (and cut to the millisecond) at the
  request's first byte read and at its last byte sent: a request logged at T ms took more than
  T - 1 and less than T + 1. So the fastest warm-up request took more than its logged time - 1 ms
  (less the throttling), a step's request at least that long is logged above that - 1 ms, and
  with the fastest at the target + 2 ms or more every such request is logged above the target: a
  p99 within it needs a request logged within it.
- **and at least ``LOAD_MARGIN`` x the target.** Other load on the machine (a compile, a test
  suite) slows every request of a warm-up of seconds, where the steps last minutes: a fastest
  request only just past the target is left to the ladder. The margin is a judgement, not a
  measurement: a heavy enough load slows every request by more (the steps too).

What the rule cannot see: a machine whose other load slowed every warm-up request by more than the
margin (it would slow the steps too, but the steps last minutes and the warm-up seconds). The
refusal names the fastest request and how many were timed, and plan.json records the warm-up, so
such a refusal shows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from uwsgi_layouts.bench.capacity import PlanError, p99_ms

MIN_TIMED = 10  # timed warm-up requests below which the warm-up proves nothing (see above)
LOG_TICK_MS = 1.0  # nginx's $request_time resolution
LOAD_MARGIN = 1.2  # the fastest warm-up request past the target by this factor at least (see above)
ANSWERED_BELOW = 400  # statuses that count as an answered request


@dataclass(frozen=True)
class WarmUp:
    """The one-connection warm-up before the first step: how long it ran (s), the rate wrk reached
    (req/s), how many requests nginx answered below 400 and timed, the fastest of them and their
    p99 (ms), and how long the replica's cgroup was throttled over it (s; 0 without a quota)."""

    seconds: float
    rate: float
    timed: int
    fastest_ms: float | None
    p99_ms: float | None
    throttled_s: float = 0.0

    def __post_init__(self):
        for name in ("seconds", "rate", "throttled_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and value >= 0 and math.isfinite(value)):
                raise ValueError(f"warm_up.{name}: must be a finite number >= 0, got {value!r}")
        if not (isinstance(self.timed, int) and self.timed >= 0):
            raise ValueError(f"warm_up.timed: must be an integer >= 0, got {self.timed!r}")
        for name in ("fastest_ms", "p99_ms"):
            value = getattr(self, name)
            if (value is None) != (self.timed == 0):
                raise ValueError(f"warm_up.{name}: must be given exactly when a request was timed, got {value!r} "
                                 f"with {self.timed} timed")
            if value is not None and not (isinstance(value, (int, float)) and value >= 0 and math.isfinite(value)):
                raise ValueError(f"warm_up.{name}: must be a finite number >= 0, got {value!r}")
        if self.fastest_ms is not None and self.fastest_ms > self.p99_ms:
            raise ValueError(f"warm_up.fastest_ms: {self.fastest_ms} is above its p99 {self.p99_ms}")

    @classmethod
    def of(cls, seconds: float, rate: float, times_s: list[float], throttled_s: float = 0.0) -> "WarmUp":
        """From nginx's $request_time (s) of the warm-up's answered requests."""
        return cls(seconds=seconds, rate=round(rate, 3), timed=len(times_s),
                   fastest_ms=round(min(times_s) * 1000, 3) if times_s else None, p99_ms=p99_ms(times_s),
                   throttled_s=round(throttled_s, 6))

    def to_dict(self) -> dict:
        return {"seconds": self.seconds, "rate": self.rate, "timed": self.timed, "fastest_ms": self.fastest_ms,
                "p99_ms": self.p99_ms, "throttled_s": self.throttled_s}

    @classmethod
    def from_dict(cls, data: dict) -> "WarmUp":
        """A stored warm-up (plan.json's ``warm_up``). ValueError names a bad or missing field."""
        if not isinstance(data, dict):
            raise ValueError(f"warm_up: must be a mapping, got {type(data).__name__}")
        missing = [f for f in cls.__dataclass_fields__ if f not in data]
        if missing:
            raise ValueError(f"warm_up: missing {', '.join(missing)}")
        return cls(**{f: data[f] for f in cls.__dataclass_fields__})


class RuledOut(PlanError):
    """The warm-up proved that no rate meets the p99 target: the line, and the warm-up."""

    def __init__(self, line: str, warm_up: WarmUp):
        super().__init__(line)
        self.warm_up = warm_up


def unthrottled_floor_ms(warm: WarmUp) -> float | None:
    """The fastest warm-up request less every throttled interval over the warm-up (ms): what it
    would have taken had the quota not held it (None without a timed request)."""
    return None if warm.fastest_ms is None else warm.fastest_ms - 1000 * warm.throttled_s


def ruled_out(layout: str, warm: WarmUp, target_p99_ms: float, threads: int) -> RuledOut | None:
    """The refusal when ``warm`` proves no rate of one replica of ``layout`` (``threads``: its
    processes x threads) can keep the p99 within ``target_p99_ms``; None when it does not prove it
    (the module's docstring says why each part of the rule)."""
    if warm.timed < max(MIN_TIMED, threads + 1):
        return None
    floor = unthrottled_floor_ms(warm)
    if floor is None or floor < max(target_p99_ms + 2 * LOG_TICK_MS, LOAD_MARGIN * target_p99_ms):
        return None
    throttled = (f", {1000 * warm.throttled_s:g} ms of the warm-up throttled by the quota" if warm.throttled_s
                 else "")
    return RuledOut(f"p99_ms: one replica of {layout} cannot keep p99 within {target_p99_ms:g} ms: its fastest "
                    f"request with one connection took {warm.fastest_ms:g} ms ({warm.timed} timed in the warm-up"
                    f"{throttled}), and no rate is faster than one connection: give a --p99-ms above it", warm)
