"""The capacity plan's arithmetic (``uwsgi-layouts plan``, bench/kinds/plan.py): pure, no I/O.

One replica of a layout, under its CPU quota, is offered fixed rates (open loop, httperf); a
rate *meets* the target when its step passes (``judge_rate``) and the p99 of nginx's
``$request_time`` over that step's requests is within the target. The highest rate that meets it
below the first that does not is the replica's rate (``search_capacity``: a x1.5 ladder, then
bisections down to a stated resolution). Then:

    replicas = ceil(target rate / (replica's rate x headroom)) + spare     (spare: 1 for a lost pod)

The autoscaler's targets are what one replica showed at its design rate (its rate x headroom),
interpolated between the measured steps: CPU used as a share of its limit (a Kubernetes HPA's
``averageUtilization`` on ``limits.cpu``) and the busy-thread ratio (threads inside a request /
threads, from uWSGI's stats server: a custom metric). Memory: replicas x one replica's PSS, and a
request of PSS + 25% per replica (as tune recommends it).

The pass rule at one rate (``judge_rate``), sound at a few req/s. openloop's rule (every 5-s
reply-rate sample after the first >= 95% of the rate) decides on one sample of ~15-35 replies at
3-7 req/s, where one reply more or less is 3-7%: a replica that keeps up fails a step by chance.
Here:

- a step lasts long enough for ``MIN_REQUESTS`` requests per replica (``step_seconds``), so the
  p99 is the 2nd-slowest of 200 rather than the slowest of 75, and a whole multiple of httperf's
  5-s sample, so its samples line up with the sending;
- *kept up* is judged on every steady sample together: the replies in the 5-s samples after the
  first (the ramp) and within the sending (after it, only the backlog drains), against what the
  rate sends in them. httperf sends at fixed intervals, so in steady state each such sample holds
  rate x 5 replies whatever the latency; summed over consecutive samples, only the two outer
  edges can move a reply in or out (``LAG_SLACK``), however long the step. So the step keeps
  up when it is short by at most max(LAG_SLACK, (1 - ``KEPT_UP``) x expected): with the >= 150
  steady replies a step of 200 requests holds, a server more than 3% short of the rate fails;
- any server-side error (httperf's timeouts, refused or reset connections, a 4xx/5xx) fails the
  step, counted; a reply missing, or a request nginx did not log, too; a client-side error
  (httperf's own limits) makes it invalid;
- httperf sending late (``bench.load.sending``: it got too little CPU, at the lowest priority on
  a busy machine) when the server answered every request it was sent without an error, is judged
  by the rule both verdicts share (``bench.load.sending.judge_late``, at this rule's share): the
  step is invalid when the lateness accounts for the whole shortfall (the server held to what it
  was sent, short by at most the rule's allowance plus what httperf's largest burst held back),
  and further behind it fails only when the replica's own figures over the step show it at its
  limit (its threads busy or its CPU quota used: ``RateStep``'s busy_ratio and cpu_share; not its
  throttled share, see ``judge_rate``); without that evidence it is invalid, since a generator can be silent longer
  than its largest burst shows. An error or an unanswered request is the server's whatever the
  generator did: the step fails.

``check_verdict`` says what ``plan --check`` found of the replica counts it ran: confirmed,
oversized, undersized, or not judged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

from uwsgi_layouts.bench.load.httperf import CLIENT_ERRORS, SERVER_ERRORS

# One figure each, shared with the late-generator rule: httperf's reply-rate sample (--verbose),
# and the replies the two outer edges of consecutive samples can move in or out (LAG_SLACK).
from uwsgi_layouts.bench.load.sending import LAG_SLACK, SAMPLE_S, judge_late, starved, steady_samples

DEFAULT_HEADROOM = 0.8
DEFAULT_SPARE = 1
# A memory request is a replica's PSS after load plus this share (bench.report.limits says why).
MEMORY_MARGIN = 0.25
# When the first rate misses the target: rates tried down the ladder before saying no rate meets it.
DOWN_RUNGS = 3
MIN_RATE = 0.1
# The search: the ladder's factor, and when bisecting stops (the gap between the highest rate met
# and the lowest missed, relative to the met one; at most MAX_BISECTIONS rates).
LADDER_FACTOR = 1.5
DEFAULT_RESOLUTION = 0.05
MAX_BISECTIONS = 8
MAX_STEPS = 20
# The pass rule (see the module's docstring).
MIN_REQUESTS = 200  # per replica and step
KEPT_UP = 0.97  # steady replies / what the rate sends in those samples


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
    """One open-loop step at ``rate`` req/s: its verdict (``judge_rate``), the p99 nginx logged,
    the CPU the replicas' cgroups used as a share of their quota and the share of CFS periods in
    which they were throttled, the busy-thread ratio, the server-side errors counted, the steady
    replies as a share of what the rate sent, and how long the step lasted."""

    rate: float
    verdict: str  # "pass", "fail" or "invalid" (judge_rate)
    p99_ms: float | None
    cpu_share: float | None = None  # CPU used / (cpus x seconds); None without @cpus
    busy_ratio: float | None = None  # mean threads inside a request / threads
    reasons: tuple[str, ...] = ()
    requests_logged: int = 0
    errors: int = 0  # server-side: httperf's timeouts, refused, reset; 4xx/5xx replies
    kept_up: float | None = None  # steady replies / rate x their seconds
    step_s: float | None = None
    throttled_share: float | None = None  # throttled periods / periods
    # httperf's own CPU time over its run, % of one core: a busy-poller takes all it is given, so
    # well under 100% means it waited for the CPU (bench.load.generator says where it ran)
    client_cpu_pct: float | None = None
    # the tries at this rate before this one in which httperf sent late, each offered again
    # (bench.kinds.plan.until_judged): their output is in raw/, their figures are not the step's
    late_tries: int = 0

    def __post_init__(self):
        if not (isinstance(self.rate, (int, float)) and self.rate > 0):
            raise ValueError(f"rate: must be > 0, got {self.rate!r}")
        if self.verdict not in ("pass", "fail", "invalid"):
            raise ValueError(f"verdict: must be pass, fail or invalid, got {self.verdict!r}")
        for name in ("p99_ms", "cpu_share", "busy_ratio", "kept_up", "step_s", "throttled_share", "client_cpu_pct"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, (int, float)) and value >= 0 and math.isfinite(value)):
                raise ValueError(f"{name}: must be a finite number >= 0, got {value!r}")
        for name in ("requests_logged", "errors", "late_tries"):
            if not (isinstance(getattr(self, name), int) and getattr(self, name) >= 0):
                raise ValueError(f"{name}: must be an integer >= 0, got {getattr(self, name)!r}")

    def meets(self, target_p99_ms: float) -> bool:
        return self.verdict == "pass" and self.p99_ms is not None and self.p99_ms <= target_p99_ms

    def to_dict(self) -> dict:
        return {"rate": self.rate, "verdict": self.verdict, "p99_ms": self.p99_ms, "cpu_share": self.cpu_share,
                "busy_ratio": self.busy_ratio, "reasons": list(self.reasons),
                "requests_logged": self.requests_logged, "errors": self.errors, "kept_up": self.kept_up,
                "step_s": self.step_s, "throttled_share": self.throttled_share, "client_cpu_pct": self.client_cpu_pct,
                "late_tries": self.late_tries}

    @classmethod
    def from_dict(cls, data: dict) -> "RateStep":
        """A stored step (plan.json; files written before errors, kept_up, step_s, throttled_share
        and late_tries were recorded load without them). ValueError names a bad field."""
        if not isinstance(data, dict):
            raise ValueError(f"step: must be a mapping, got {type(data).__name__}")
        known = {f: data[f] for f in cls.__dataclass_fields__ if f in data}
        missing = [f for f in ("rate", "verdict", "p99_ms") if f not in known]
        if missing:
            raise ValueError(f"step: missing {', '.join(missing)}")
        return cls(**known | {"reasons": tuple(known.get("reasons") or ())})


def step_seconds(rate_per_replica: float, min_requests: int = MIN_REQUESTS, min_step_s: float = 15) -> int:
    """How long a step at ``rate_per_replica`` req/s per replica lasts: long enough for
    ``min_requests`` per replica and at least ``min_step_s``, rounded up to httperf's 5-s samples."""
    if not (rate_per_replica > 0 and min_requests >= 1 and min_step_s > 0):
        raise ValueError(f"rate {rate_per_replica}, requests {min_requests}, step {min_step_s}")
    seconds = max(min_step_s, min_requests / rate_per_replica)
    return int(SAMPLE_S * math.ceil(seconds / SAMPLE_S - 1e-9))


@dataclass(frozen=True)
class Judgement:
    verdict: str
    reasons: tuple[str, ...]
    errors: int
    kept_up: float | None


def judge_rate(rate: float, parsed: dict, requests_logged: int, busy_ratio: float | None = None,
               cpu_share: float | None = None) -> Judgement:
    """The verdict of one step at ``rate`` req/s (all replicas together) from httperf's parsed
    summary (``bench.load.httperf.parse``, with its per-sample reply rates), the number of this
    step's requests nginx logged and the replicas' own figures over the step (``RateStep``'s: None
    when not measured), which say whether they were at their limit when httperf sent late
    (busy threads and CPU quota used; not the throttled share: see the comment below). See
    the module's docstring for why each part."""
    e = parsed["errors"]
    client = {k: e[k] for k in CLIENT_ERRORS if e.get(k)}
    if client:
        return Judgement("invalid", ("client-side errors " + ", ".join(f"{k}={v}" for k, v in client.items())
                                     + ": the load generator, not the server, was the limit",), 0, None)
    server = {k: e[k] for k in SERVER_ERRORS if e.get(k)} | {
        k: parsed["status"][k] for k in ("4xx", "5xx") if parsed["status"].get(k)}
    errors = sum(server.values())
    answered = not errors and parsed["replies"] >= parsed["requests"] <= requests_logged
    steady = steady_samples(parsed["reply_rate"].get("each") or [], parsed["connections"] / rate)
    replies = sum(steady) * SAMPLE_S
    expected = len(steady) * SAMPLE_S * rate
    kept_up = round(replies / expected, 4) if steady else None
    # httperf sent late and the server answered all it was sent: the one rule for both verdicts
    # (bench.load.sending.judge_late), with the replica's figures over the step as the evidence of
    # its limit. Not the throttled share: the kernel counts only the CFS periods in which the
    # replica ran, so a replica idle most of the step is throttled in nearly all of them when a late
    # generator's burst takes it above its quota; the quota used already says whether it used it.
    judged = judge_late(rate, parsed, KEPT_UP, {"busy threads": busy_ratio, "CPU quota used": cpu_share}) \
        if answered else None
    if judged is not None:
        verdict, reasons = judged
        return Judgement(verdict, reasons, 0, kept_up if verdict == "fail" else None)
    if not steady:
        return Judgement("invalid", ("no steady reply-rate sample (httperf samples every 5 s, the first is the ramp): "
                                     "a step of at least 10 s with --verbose",), errors, None)
    reasons = []
    if expected - replies > max(LAG_SLACK, (1 - KEPT_UP) * expected) + 1e-6:
        reasons.append(f"replies fell behind: {replies:.0f} in {len(steady)} steady 5-s samples, {rate:g}/s sends "
                       f"{expected:.1f} (short by more than {LAG_SLACK} and {1 - KEPT_UP:.0%})")
    if errors:
        reasons.append(f"{errors} server-side error(s): " + ", ".join(f"{k}={v}" for k, v in server.items()))
    if parsed["replies"] < parsed["requests"]:
        reasons.append(f"{parsed['requests'] - parsed['replies']} of {parsed['requests']} requests unanswered")
    if requests_logged < parsed["requests"]:
        reasons.append(f"nginx logged {requests_logged} of {parsed['requests']} requests")
    return Judgement("fail" if reasons else "pass", tuple(reasons), errors, kept_up)


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

    @classmethod
    def from_dict(cls, data: dict) -> "Plan":
        """A stored plan (plan.json's ``plan``); the derived figures (design rate, memory) are
        recomputed, not read. ValueError (or KeyError) names a bad or missing field."""
        keys = ("layout", "cpus", "target_rate", "target_p99_ms", "headroom", "spare", "per_replica_rate",
                "replicas", "cpu_target", "busy_target", "pss_mb")
        return cls(**{k: data[k] for k in keys}, steps=tuple(RateStep.from_dict(s) for s in data.get("steps") or ()))


def make_plan(layout: str, cpus: float | None, steps: list[RateStep], target_rate: float, target_p99_ms: float,
              headroom: float = DEFAULT_HEADROOM, spare: int = DEFAULT_SPARE, pss_mb: float | None = None) -> Plan:
    """The plan, or PlanError (one line, with the best p99 seen) when no rate met the target."""
    per_replica = best_rate(steps, target_p99_ms)
    late = [s for s in steps if s.verdict == "invalid" and starved(s.reasons)]
    if per_replica is None and steps and len(late) == len(steps):
        raise PlanError(f"httperf: no step could be judged, the load generator sent late in all {len(steps)} "
                        f"({late[0].rate:g} req/s: {late[0].reasons[0]}): run plan on a quieter machine, or leave "
                        "httperf a CPU (fewer other tasks, or a smaller @cpus)")
    if per_replica is None:
        best = best_p99(steps)
        seen = (f"best p99 seen {best.p99_ms:g} ms at {best.rate:g} req/s ({best.verdict})" if best is not None
                else "no request was timed")
        lowest = min(s.rate for s in steps) if steps else None
        raise PlanError(f"p99_ms: one replica of {layout} cannot keep p99 within {target_p99_ms:g} ms at any rate "
                        f"tried (from {lowest:g} req/s); {seen}: give a larger pod (@cpus), a lower rate to "
                        "start from (--start) or a looser --p99-ms" + (
                            f"; {len(late)} of {len(steps)} steps were not judged, httperf sent late (the load "
                            "generator got too little CPU): run plan on a quieter machine, or leave httperf a CPU"
                            if late else ""))
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


def next_rate(tried: list[RateStep], target_p99_ms: float, factor: float = LADDER_FACTOR,
              resolution: float = DEFAULT_RESOLUTION, bisections_left: int = MAX_BISECTIONS) -> float | None:
    """The next rate to offer, or None when the search is done: up the ladder (the highest rate
    tried x ``factor``) while every step met the target; after a step that did not, a bisection
    between the highest rate that met it and the lowest that did not, until their gap is within
    ``resolution`` of the rate met (or no ``bisections_left``); while none met it, down the ladder
    (the lowest / ``factor``) until DOWN_RUNGS rates were tried."""
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
    met = max(below)
    if bisections_left <= 0 or (low_miss - met) <= resolution * met + 1e-9:
        return None  # refined enough
    mid = round((met + low_miss) / 2, 2)
    return None if mid in (met, low_miss) else mid


def search_capacity(offer: Callable[[float], RateStep], start: float, target_p99_ms: float,
                    factor: float = LADDER_FACTOR, resolution: float = DEFAULT_RESOLUTION,
                    bisections: int = MAX_BISECTIONS, max_steps: int = MAX_STEPS) -> list[RateStep]:
    """Offer rates from ``start`` (``offer(rate)`` runs one step) as ``next_rate`` says; every
    step, in the order run. ``best_rate`` of them is the capacity, to within ``resolution`` when
    the search ended on it (or on ``bisections`` rates between one met and one missed)."""
    if not start >= MIN_RATE:
        raise ValueError(f"start: must be >= {MIN_RATE} req/s, got {start!r}")
    steps: list[RateStep] = []
    rate: float | None = start
    done = 0
    while rate is not None and len(steps) < max_steps:
        done += is_bisection(steps, rate, target_p99_ms)
        steps.append(offer(rate))
        rate = next_rate(steps, target_p99_ms, factor, resolution, bisections - done)
    return steps


def is_bisection(tried: list[RateStep], rate: float, target_p99_ms: float) -> bool:
    """Whether ``rate`` lies between a rate that met the target and one that did not (a rung down
    the ladder after a first miss is not a bisection)."""
    return (any(s.meets(target_p99_ms) and s.rate < rate for s in tried)
            and any(not s.meets(target_p99_ms) and s.rate > rate for s in tried))


def resolved(steps: list[RateStep], target_p99_ms: float) -> float | None:
    """The gap between the capacity found and the lowest rate above it that missed, relative to
    the capacity (what the search resolved it to); None without both."""
    best = best_rate(steps, target_p99_ms)
    above = [s.rate for s in steps if best is not None and s.rate > best and not s.meets(target_p99_ms)]
    return round(min(above) / best - 1, 4) if above else None


def check_verdict(count: int, runs: list[dict], target_p99_ms: float) -> str:
    """The planned count meets the p99 and one fewer does not: confirmed; else by how much not. A
    run httperf sent late says nothing of the replicas (NOT JUDGED: a quieter machine would judge
    it); another invalid run (httperf's own limits, no steady sample) is INVALID, with its reasons'
    own advice. Either for one fewer: the planned count met, nothing confirmed below it."""
    planned = runs[0]
    if planned["verdict"] == "invalid":
        reasons = "; ".join(planned["reasons"])
        if starved(planned["reasons"]):
            return (f"NOT JUDGED: {count} replicas at {planned['rate']:g} req/s: {reasons} "
                    "(run the check on a quieter machine)")
        return f"INVALID: {count} replicas at {planned['rate']:g} req/s: {reasons}"
    if not planned["meets"]:
        return (f"UNDERSIZED: {count} replicas missed p99 {target_p99_ms:g} ms at {planned['rate']:g} req/s "
                f"(p99 {planned['p99_ms']} ms, {planned['verdict']})")
    smallest = min(r["replicas"] for r in runs if r["meets"])
    unjudged = [r for r in runs if r["verdict"] == "invalid"]
    if smallest == count and unjudged:
        return (f"MET: {count} replicas met p99 {target_p99_ms:g} ms at {planned['rate']:g} req/s; "
                f"{count - 1} not judged, so not confirmed the smallest: " + "; ".join(unjudged[0]["reasons"]))
    if smallest == count:
        return (f"CONFIRMED: {count} replicas met p99 {target_p99_ms:g} ms at {planned['rate']:g} req/s and "
                f"{count - 1} did not" if count > 1 else f"CONFIRMED: 1 replica met p99 {target_p99_ms:g} ms")
    extra = count - smallest
    return (f"OVERSIZED by {extra} replica{'s' if extra > 1 else ''} ({extra / count:.0%}): {smallest} met p99 "
            f"{target_p99_ms:g} ms at {planned['rate']:g} req/s"
            + (f", {smallest - 1} not judged: " + "; ".join(unjudged[0]["reasons"]) if unjudged else
               f", {smallest - 1} did not" if any(not r["meets"] for r in runs) else ""))
