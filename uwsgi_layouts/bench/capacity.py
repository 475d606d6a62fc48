"""The capacity plan's arithmetic (``uwsgi-layouts plan``, bench/kinds/plan.py): pure, no I/O.

One replica of a layout, under its CPU quota, is offered fixed rates (open loop, httperf); a
rate *meets* the target when httperf's step passes (``bench.analysis.judge_step``: replies kept
up, no server-side error) and the p99 of nginx's ``$request_time`` over the step's requests is
within the target. The highest rate that meets it is the replica's rate. Then:

    replicas = ceil(target rate / (replica's rate x headroom)) + spare     (spare: 1 for a lost pod)

The autoscaler's targets are what one replica showed at its design rate (its rate x headroom),
interpolated between the measured steps: CPU used as a share of its limit (a Kubernetes HPA's
``averageUtilization`` on ``limits.cpu``) and the busy-thread ratio (threads inside a request /
threads, from uWSGI's stats server: a custom metric). Memory: replicas x one replica's PSS, and a
request of PSS + 25% per replica (as tune recommends it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

DEFAULT_HEADROOM = 0.8
DEFAULT_SPARE = 1
# A memory request is a replica's PSS after load plus this share (bench.report.limits says why).
MEMORY_MARGIN = 0.25
# When the first rate misses the target: rates tried down the ladder before saying no rate meets it.
DOWN_RUNGS = 3
MIN_RATE = 0.1


class PlanError(ValueError):
    """No plan can be made (one line, names what is wrong)."""


def p99_ms(times_s: list[float]) -> float | None:
    """The 99th percentile (nearest rank, as nginx logs times: to the millisecond) in ms; None
    without a time."""
    if not times_s:
        return None
    ordered = sorted(times_s)
    rank = max(1, math.ceil(0.99 * len(ordered)))
    return round(ordered[rank - 1] * 1000, 3)


@dataclass(frozen=True)
class RateStep:
    """One open-loop step at ``rate`` req/s: httperf's verdict, the p99 nginx logged, the CPU the
    replica's cgroup used as a share of its quota, and the busy-thread ratio."""

    rate: float
    verdict: str  # "pass", "fail" or "invalid" (bench.analysis.judge_step)
    p99_ms: float | None
    cpu_share: float | None = None  # CPU used / (cpus x seconds); None without @cpus
    busy_ratio: float | None = None  # mean threads inside a request / threads
    reasons: tuple[str, ...] = ()
    requests_logged: int = 0

    def __post_init__(self):
        if not (isinstance(self.rate, (int, float)) and self.rate > 0):
            raise ValueError(f"rate: must be > 0, got {self.rate!r}")
        if self.verdict not in ("pass", "fail", "invalid"):
            raise ValueError(f"verdict: must be pass, fail or invalid, got {self.verdict!r}")
        for name in ("p99_ms", "cpu_share", "busy_ratio"):
            value = getattr(self, name)
            if value is not None and not (value >= 0 and math.isfinite(value)):
                raise ValueError(f"{name}: must be a finite number >= 0, got {value!r}")

    def meets(self, target_p99_ms: float) -> bool:
        return self.verdict == "pass" and self.p99_ms is not None and self.p99_ms <= target_p99_ms

    def to_dict(self) -> dict:
        return {"rate": self.rate, "verdict": self.verdict, "p99_ms": self.p99_ms, "cpu_share": self.cpu_share,
                "busy_ratio": self.busy_ratio, "reasons": list(self.reasons),
                "requests_logged": self.requests_logged}


def best_rate(steps: list[RateStep], target_p99_ms: float) -> float | None:
    """The highest rate that met the target below the first rate that did not (a rate that
    passes above a failure is noise on a busy machine, not capacity); None when none met it."""
    best = None
    for step in sorted(steps, key=lambda s: s.rate):
        if not step.meets(target_p99_ms):
            break
        best = step.rate
    return best


def best_p99(steps: list[RateStep]) -> RateStep | None:
    """The step with the lowest p99 seen (what to say when no rate meets the target)."""
    seen = [s for s in steps if s.p99_ms is not None]
    return min(seen, key=lambda s: s.p99_ms) if seen else None


def replicas_needed(target_rate: float, per_replica: float, headroom: float, spare: int = DEFAULT_SPARE) -> int:
    """ceil(target / (per_replica x headroom)) + spare, at least 1 + spare."""
    if not (target_rate > 0 and per_replica > 0 and 0 < headroom <= 1 and spare >= 0):
        raise ValueError(f"target {target_rate}, per replica {per_replica}, headroom {headroom}, spare {spare}")
    # A hair of tolerance: 30 / (10 x 0.75) is 4, not 4.000000000000001 -> 5.
    return max(1, math.ceil(target_rate / (per_replica * headroom) - 1e-9)) + spare


def interpolate(points: list[tuple[float, float]], x: float) -> float | None:
    """y at ``x`` on the line through the measured (x, y) points (clamped to their ends)."""
    pts = sorted(points)
    if not pts:
        return None
    if x <= pts[0][0]:
        return pts[0][1]
    for (x0, y0), (x1, y1) in zip(pts, pts[1:], strict=False):
        if x0 <= x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return pts[-1][1]


@dataclass(frozen=True)
class Plan:
    """The plan for ``target_rate`` req/s within ``target_p99_ms``, from one replica's steps."""

    layout: str
    cpus: float | None
    target_rate: float
    target_p99_ms: float
    headroom: float
    spare: int
    per_replica_rate: float
    replicas: int
    cpu_target: float | None  # CPU used / limit at the design rate (HPA averageUtilization)
    busy_target: float | None  # busy threads / threads at the design rate
    pss_mb: float | None  # one replica's PSS after the steps
    steps: tuple[RateStep, ...] = field(default_factory=tuple)

    def __post_init__(self):
        if self.replicas < 1 + self.spare or not self.per_replica_rate > 0:
            raise ValueError(f"a plan of {self.replicas} replicas at {self.per_replica_rate} req/s each")

    @property
    def design_rate(self) -> float:
        """The rate each replica is planned to carry at most: its measured rate x headroom."""
        return round(self.per_replica_rate * self.headroom, 3)

    @property
    def serving(self) -> int:
        """Replicas that carry the target rate (the rest are spare, for a lost pod)."""
        return self.replicas - self.spare

    @property
    def memory_request_mb(self) -> float | None:
        return round(self.pss_mb * (1 + MEMORY_MARGIN), 1) if self.pss_mb is not None else None

    @property
    def memory_total_mb(self) -> float | None:
        return round(self.pss_mb * self.replicas, 1) if self.pss_mb is not None else None

    def to_dict(self) -> dict:
        return {"layout": self.layout, "cpus": self.cpus, "target_rate": self.target_rate,
                "target_p99_ms": self.target_p99_ms, "headroom": self.headroom, "spare": self.spare,
                "per_replica_rate": self.per_replica_rate, "design_rate": self.design_rate,
                "replicas": self.replicas, "cpu_target": self.cpu_target, "busy_target": self.busy_target,
                "pss_mb": self.pss_mb, "memory_request_mb": self.memory_request_mb,
                "memory_total_mb": self.memory_total_mb, "steps": [s.to_dict() for s in self.steps]}


def make_plan(layout: str, cpus: float | None, steps: list[RateStep], target_rate: float, target_p99_ms: float,
              headroom: float = DEFAULT_HEADROOM, spare: int = DEFAULT_SPARE, pss_mb: float | None = None) -> Plan:
    """The plan, or PlanError (one line, with the best p99 seen) when no rate met the target."""
    per_replica = best_rate(steps, target_p99_ms)
    if per_replica is None:
        best = best_p99(steps)
        seen = (f"best p99 seen {best.p99_ms:g} ms at {best.rate:g} req/s ({best.verdict})" if best is not None
                else "no request was timed")
        lowest = min(s.rate for s in steps) if steps else None
        raise PlanError(f"p99_ms: one replica of {layout} cannot keep p99 within {target_p99_ms:g} ms at any rate "
                        f"tried (from {lowest:g} req/s); {seen}: give a larger pod (@cpus), a lower rate to "
                        "start from (--start) or a looser --p99-ms")
    design = per_replica * headroom
    cpu_points = [(s.rate, s.cpu_share) for s in steps if s.cpu_share is not None and s.rate <= per_replica]
    busy_points = [(s.rate, s.busy_ratio) for s in steps if s.busy_ratio is not None and s.rate <= per_replica]
    cpu = interpolate(cpu_points, design)
    busy = interpolate(busy_points, design)
    return Plan(layout=layout, cpus=cpus, target_rate=target_rate, target_p99_ms=target_p99_ms, headroom=headroom,
                spare=spare, per_replica_rate=per_replica,
                replicas=replicas_needed(target_rate, per_replica, headroom, spare),
                cpu_target=round(cpu, 3) if cpu is not None else None,
                busy_target=round(busy, 3) if busy is not None else None,
                pss_mb=round(pss_mb, 1) if pss_mb is not None else None, steps=tuple(steps))


def next_rate(tried: list[RateStep], target_p99_ms: float, factor: float, bisections_left: int) -> float | None:
    """The next rate to offer, or None when the search is done: up the ladder (the highest rate
    tried x ``factor``) while every step met the target; after a step that did not, a bisection
    between the highest rate that met it and the lowest that did not, while ``bisections_left``;
    while none met it, down the ladder (the lowest / ``factor``) until DOWN_RUNGS rates were tried."""
    if not tried:
        raise ValueError("the search starts from a first rate")
    missed = [s.rate for s in tried if not s.meets(target_p99_ms)]
    if not missed:
        return round(max(s.rate for s in tried) * factor, 2)
    low_miss = min(missed)
    below = [s.rate for s in tried if s.meets(target_p99_ms) and s.rate < low_miss]
    if not below:
        # Nothing met it yet: down the ladder, a few rungs (one noisy step on a busy machine must
        # not end the search), then no rate does.
        down = round(low_miss / factor, 2)
        return down if len(tried) < DOWN_RUNGS and down >= MIN_RATE else None
    if bisections_left <= 0:
        return None  # refined enough
    mid = round((max(below) + low_miss) / 2, 2)
    return None if mid in (max(below), low_miss) else mid
