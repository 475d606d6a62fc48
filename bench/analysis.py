"""From records to conclusions: medians and spread over repeats, best layout, verdict; the
open loop's step verdicts.

Pure functions of a ``Results`` (or of a parsed httperf summary): no timing, no processes, so
they are tested on fixtures and used unchanged by ``report`` for a live run and a replayed one.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field

from bench.load.httperf import CLIENT_ERRORS, SERVER_ERRORS
from bench.results import PERCENTILES, STATUS_CLASSES, Results

NOISY_SPREAD = 0.10  # (max - min) / median across repeats above this is flagged
MIN_REQUESTS_FOR_P99 = 100  # below this a "p99" is the sample's max

# Targets from the benchmark issue, at P and 2P connections, medians of repeats.
TARGET_RPS_RATIO = 1.25  # mapped / shared throughput, at least
TARGET_P99_RATIO = 0.70  # mapped / shared p99, at most
TARGET_EFFICIENCY = 0.85  # mapped, at least


@dataclass(frozen=True)
class Stat:
    """One figure across repeats."""

    median: float
    low: float
    high: float
    n: int

    @classmethod
    def of(cls, values: list[float]) -> "Stat":
        values = list(values)
        if not values:
            return cls(0.0, 0.0, 0.0, 0)
        return cls(statistics.median(values), min(values), max(values), len(values))

    @property
    def spread(self) -> float:
        return (self.high - self.low) / self.median if self.median else 0.0

    @property
    def noisy(self) -> bool:
        return self.n > 1 and self.spread > NOISY_SPREAD


@dataclass(frozen=True)
class Group:
    """One (scenario, layout, concurrency) over its repeats."""

    scenario: str
    layout: str
    concurrency: int
    rps: Stat
    latency: dict[str, Stat]
    efficiency: Stat
    cv: Stat
    errors: int
    requests: int
    min_cell_requests: int
    worker_share: dict[str, float]  # pooled over repeats, worker id -> share of requests
    cpu_ms_per_request: Stat
    extra: dict = field(default_factory=dict)
    # Answers per status class, summed over repeats ({} when the cells did not count them).
    status: dict[str, int] = field(default_factory=dict)
    # Memory figures (cell.memory keys) over repeats; "worker_pss_mb" is each cell's mean per worker.
    memory: dict[str, Stat] = field(default_factory=dict)

    @property
    def non_2xx(self) -> int:
        return sum(n for k, n in self.status.items() if k != "2xx")

    @property
    def noisy_figures(self) -> list[str]:
        figures = {"rps": self.rps, "p99": self.latency["p99"]}
        return [name for name, stat in figures.items() if stat.noisy]


def group_cells(results: Results, scenario: str | None = None) -> list[Group]:
    out = []
    scenarios = results.scenarios if scenario is None else [scenario]
    for sc in scenarios:
        for layout in results.layouts:
            for level in results.levels:
                cells = [c for c in results.cells if c.scenario == sc and c.layout == layout and c.concurrency == level]
                if not cells:
                    continue
                pooled: dict[str, int] = {}
                for c in cells:
                    for w, n in c.worker_requests.items():
                        pooled[w] = pooled.get(w, 0) + n
                total = sum(pooled.values())
                cpu = [1000 * sum(c.cpu_s.values()) / c.requests for c in cells if c.requests]
                extra_keys = sorted({k for c in cells for k, v in c.extra.items() if isinstance(v, (int, float))})
                out.append(
                    Group(
                        scenario=sc,
                        layout=layout,
                        concurrency=level,
                        rps=Stat.of([c.rps for c in cells]),
                        latency={p: Stat.of([getattr(c.latency_ms, p) for c in cells]) for p in PERCENTILES},
                        efficiency=Stat.of([c.efficiency for c in cells]),
                        cv=Stat.of([c.balance["cv"] for c in cells]),
                        errors=sum(c.errors.total for c in cells),
                        requests=sum(c.requests for c in cells),
                        min_cell_requests=min(c.requests for c in cells),
                        worker_share={w: n / total for w, n in sorted(pooled.items(), key=lambda kv: int(kv[0]))}
                        if total else {},
                        cpu_ms_per_request=Stat.of(cpu),
                        extra={k: Stat.of([c.extra[k] for c in cells if k in c.extra]) for k in extra_keys},
                        status=sum_status(cells),
                        memory=memory_stats(cells),
                    )
                )
    return out


def sum_status(cells) -> dict[str, int]:
    """Answers per status class over ``cells``, in class order ({} if none counted them)."""
    total: dict[str, int] = {}
    for c in cells:
        for k, n in c.status.items():
            total[k] = total.get(k, 0) + n
    return {k: total[k] for k in STATUS_CLASSES if k in total}


def memory_stats(cells) -> dict[str, Stat]:
    """Each memory figure over ``cells`` (repeats); per-worker PSS as each cell's mean per worker."""
    keys = list(dict.fromkeys(k for c in cells for k, v in c.memory.items() if not isinstance(v, dict)))
    out = {k: Stat.of([c.memory[k] for c in cells if k in c.memory]) for k in keys}
    means = [statistics.fmean(c.memory["worker_pss_mb"].values()) for c in cells if c.memory.get("worker_pss_mb")]
    if means:
        out["worker_pss_mb"] = Stat.of(means)
    return out


def best_per_level(groups: list[Group]) -> dict[int, Group]:
    """Per concurrency: highest median throughput; ties (within 2%) go to the lower p99."""
    best: dict[int, Group] = {}
    for g in groups:
        cur = best.get(g.concurrency)
        if cur is None:
            best[g.concurrency] = g
            continue
        if g.rps.median > cur.rps.median * 1.02 or (
            g.rps.median >= cur.rps.median * 0.98 and g.latency["p99"].median < cur.latency["p99"].median
        ):
            best[g.concurrency] = g
    return dict(sorted(best.items()))


@dataclass(frozen=True)
class ClaimAtLevel:
    concurrency: int
    shared: Group
    mapped: Group

    @property
    def rps_ratio(self) -> float:
        return self.mapped.rps.median / self.shared.rps.median if self.shared.rps.median else 0.0

    @property
    def p99_ratio(self) -> float:
        s = self.shared.latency["p99"].median
        return self.mapped.latency["p99"].median / s if s else 0.0

    @property
    def claim_holds(self) -> bool:
        """The article's claim, directionally: more throughput AND a lower p99."""
        return self.rps_ratio > 1.0 and self.p99_ratio < 1.0

    @property
    def targets(self) -> dict[str, bool]:
        return {
            f"throughput >= {TARGET_RPS_RATIO}x shared": self.rps_ratio >= TARGET_RPS_RATIO,
            f"p99 <= {TARGET_P99_RATIO}x shared": self.p99_ratio <= TARGET_P99_RATIO,
            f"efficiency >= {TARGET_EFFICIENCY}": self.mapped.efficiency.median >= TARGET_EFFICIENCY,
            "zero errors": self.mapped.errors == 0 and self.shared.errors == 0,
        }


@dataclass(frozen=True)
class Verdict:
    levels: list[ClaimAtLevel]
    missing: str = ""  # why the claim could not be checked, if it could not

    @property
    def reproduced(self) -> bool:
        # Both P and 2P must have been measured: half a check is not a reproduction.
        return bool(self.levels) and not self.missing and all(lv.claim_holds for lv in self.levels)

    @property
    def targets_met(self) -> bool:
        return bool(self.levels) and not self.missing and all(all(lv.targets.values()) for lv in self.levels)


def article_verdict(results: Results, scenario: str = "article") -> Verdict:
    """Does `PxT-mapped` beat `PxT-shared` at P and 2P connections, as in the article?"""
    p, t = results.arguments.get("processes"), results.arguments.get("threads")
    if not p or not t:
        return Verdict([], missing="the run does not record processes/threads")
    shared_name, mapped_name = f"{p}x{t}-shared", f"{p}x{t}-mapped"
    groups = {(g.layout, g.concurrency): g for g in group_cells(results, scenario)}
    levels, absent = [], []
    for level in (p, 2 * p):
        s, m = groups.get((shared_name, level)), groups.get((mapped_name, level))
        if s is None or m is None:
            absent.append(level)
            continue
        levels.append(ClaimAtLevel(level, s, m))
    missing = ""
    if absent:
        missing = (f"{shared_name} and {mapped_name} were not both measured at "
                   f"{' and '.join(map(str, absent))} connections")
    return Verdict(levels, missing=missing)


def warnings(results: Results) -> list[str]:
    """Advice the reader should act on, pyperf style: what is wrong and what to do."""
    out = []
    groups = group_cells(results)
    noisy = [g for g in groups if g.noisy_figures]
    if noisy:
        worst = max(noisy, key=lambda g: max(g.rps.spread, g.latency["p99"].spread))
        out.append(
            f"{len(noisy)} of {len(groups)} cells are noisy (spread > {NOISY_SPREAD:.0%} across repeats; worst: "
            f"{worst.layout} at {worst.concurrency} connections, throughput spread {worst.rps.spread:.0%}, "
            f"p99 spread {worst.latency['p99'].spread:.0%}): rerun with a longer --duration, more --repeats, "
            f"or on a quieter machine."
        )
    thin = [g for g in groups if g.min_cell_requests < MIN_REQUESTS_FOR_P99]
    if thin:
        duration = results.arguments.get("duration", 0) or 0
        slowest = min(thin, key=lambda g: g.rps.median or 1e9)
        need = MIN_REQUESTS_FOR_P99 / slowest.rps.median if slowest.rps.median else 0
        out.append(
            f"{len(thin)} cells completed fewer than {MIN_REQUESTS_FOR_P99} requests, so their p99 is close to "
            f"their max: use --duration {max(need, duration):.0f} or more for tail figures you can quote."
        )
    errors = sum(g.errors for g in groups)
    if errors:
        out.append(f"{errors} requests failed (see the errors column): figures of cells with errors are suspect.")
    return out


# --- choosing a layout across scenarios (steady state vs stalls) ---------------------------

GOAL_P99_SLACK = 1.10  # within 10% of the best healthy p99, in every scenario and level
GOAL_RPS_OF_MAPPED = 0.95  # "the mapped layout's steady-state throughput", within 5% noise


@dataclass(frozen=True)
class Choice:
    """How one layout fares across every scenario of a run."""

    layout: str
    p99_vs_best: dict[str, float]  # scenario -> worst (over levels) healthy p99 / best layout's p99
    worst_where: str  # "stall at 8 connections"
    steady_rps_vs_mapped: float | None  # worst over steady levels; None without a mapped layout
    stalled_p99_ms: dict[str, float]  # stall scenario -> median over levels of the stalled requests' p99

    @property
    def worst_p99_ratio(self) -> float:
        return max(self.p99_vs_best.values()) if self.p99_vs_best else 0.0

    @property
    def meets_goal(self) -> bool:
        return (self.worst_p99_ratio <= GOAL_P99_SLACK and self.steady_rps_vs_mapped is not None
                and self.steady_rps_vs_mapped >= GOAL_RPS_OF_MAPPED)


def steady_scenarios(results: Results) -> list[str]:
    """Scenarios without a stall load (by their recorded mix, else by name)."""
    out = []
    for sc in results.scenarios:
        mix = results.workload.get(sc) if isinstance(results.workload.get(sc), dict) else {}
        if not mix.get("stall") and "stall" not in sc:
            out.append(sc)
    return out


def layout_choice(results: Results) -> list[Choice]:
    groups = group_cells(results)
    by = {(g.scenario, g.layout, g.concurrency): g for g in groups}
    p, t = results.arguments.get("processes"), results.arguments.get("threads")
    mapped = f"{p}x{t}-mapped"
    steady = steady_scenarios(results)
    out = []
    for layout in results.layouts:
        ratios: dict[str, float] = {}
        worst, where = 0.0, ""
        stalled: dict[str, float] = {}
        rps_ratios = []
        for sc in results.scenarios:
            for level in results.levels:
                g = by.get((sc, layout, level))
                if g is None:
                    continue
                peers = [x for x in groups if x.scenario == sc and x.concurrency == level]
                best = min(x.latency["p99"].median for x in peers)
                ratio = g.latency["p99"].median / best if best else 0.0
                ratios[sc] = max(ratios.get(sc, 0.0), ratio)
                if ratio > worst:
                    worst, where = ratio, f"{sc} at {level} connections"
                m = by.get((sc, mapped, level))
                if sc in steady and m is not None and m.rps.median:
                    rps_ratios.append(g.rps.median / m.rps.median)
            stall_p99 = [by[(sc, layout, lv)].extra["stalled_p99_ms"].median for lv in results.levels
                         if (sc, layout, lv) in by and "stalled_p99_ms" in by[(sc, layout, lv)].extra]
            if stall_p99:
                stalled[sc] = statistics.median(stall_p99)
        out.append(Choice(layout, ratios, where, min(rps_ratios) if rps_ratios else None, stalled))
    return out


# --- memory: what one more process and one more thread cost ---------------------------------

LAYOUT_SIZE_RE = re.compile(r"^(\d+)x(\d+)-")
MEMORY_KEY = "uwsgi_pss_mb"


@dataclass(frozen=True)
class MemoryCost:
    """The app server tree's PSS fitted over layouts as base + per_process * P + per_thread *
    P * (T - 1): ``per_process`` is one more worker process (with its first thread),
    ``per_thread`` each further thread, ``base`` what no worker adds (the master). One fit per
    repeat, on each layout's cell at the highest level measured; medians and ranges over repeats."""

    scenario: str
    base: Stat
    per_process: Stat
    per_thread: Stat
    layouts: tuple[str, ...]
    level: int
    worst_residual_mb: float  # the largest |measured - fitted| of any layout in any repeat


def _solve3(a: list[list[float]], b: list[float]) -> list[float] | None:
    """x with a x = b for a 3x3 system (Gaussian elimination, partial pivoting); None if singular."""
    m = [row[:] + [v] for row, v in zip(a, b, strict=True)]
    for col in range(3):
        pivot = max(range(col, 3), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) < 1e-9:
            return None
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(3):
            if r != col:
                f = m[r][col] / m[col][col]
                m[r] = [x - f * y for x, y in zip(m[r], m[col], strict=True)]
    return [m[i][3] / m[i][i] for i in range(3)]


def fit_memory(points: list[tuple[int, int, float]]) -> tuple[list[float], float] | None:
    """Least squares of PSS = base + b * P + c * P * (T - 1) over (P, T, PSS) points:
    ([base, b, c], worst |residual|), or None when the layouts cannot separate the three."""
    rows = [(1.0, float(p), float(p * (t - 1))) for p, t, _ in points]
    ys = [y for _, _, y in points]
    ata = [[sum(r[i] * r[j] for r in rows) for j in range(3)] for i in range(3)]
    aty = [sum(r[i] * y for r, y in zip(rows, ys, strict=True)) for i in range(3)]
    coef = _solve3(ata, aty)
    if coef is None:
        return None
    worst = max(abs(y - sum(c * x for c, x in zip(coef, r, strict=True))) for r, y in zip(rows, ys, strict=True))
    return coef, worst


def memory_cost(results: Results, scenario: str, key: str = MEMORY_KEY) -> MemoryCost | None:
    """What one more process and one more thread cost in PSS, from the run's layouts (None when
    fewer than three layouts with enough different P and T recorded memory)."""
    cells = [c for c in results.cells if c.scenario == scenario and key in c.memory
             and LAYOUT_SIZE_RE.match(c.layout) and "@" not in c.layout]
    if not cells:
        return None
    level = max(c.concurrency for c in cells)
    at = [c for c in cells if c.concurrency == level]
    fits, worst, used = [], 0.0, set()
    for repeat in sorted({c.repeat for c in at}):
        points = []
        for c in at:
            if c.repeat == repeat:
                m = LAYOUT_SIZE_RE.match(c.layout)
                points.append((int(m[1]), int(m[2]), c.memory[key]))
                used.add(c.layout)
        fitted = fit_memory(points) if len(points) >= 3 else None
        if fitted is not None:
            fits.append(fitted[0])
            worst = max(worst, fitted[1])
    if not fits:
        return None
    return MemoryCost(scenario, Stat.of([f[0] for f in fits]), Stat.of([f[1] for f in fits]),
                      Stat.of([f[2] for f in fits]), tuple(x for x in results.layouts if x in used), level, worst)


# --- the open loop: one step's verdict ---------------------------------------------------

REPLIES_OF_REQUESTS = 0.99  # a step passes with at least this share of its requests answered
MIN_RATE_OF_TARGET = 0.95  # ... and its lowest steady reply-rate sample at least this share of the offered rate


def steady_min(reply_rate: dict) -> float:
    """The lowest reply-rate sample, leaving out the first when there are others: the first
    5-s window holds the ramp-up (no reply comes back before one response time has passed),
    which at low rates alone costs more than 5% of the window. Without per-sample figures
    (httperf run without --verbose), httperf's own min."""
    each = reply_rate.get("each") or []
    if len(each) >= 2:
        return min(each[1:])
    return reply_rate["min"]


def judge_step(rate: float, parsed: dict) -> tuple[str, list[str]]:
    """("pass" | "fail" | "invalid", reasons) for one open-loop step at ``rate`` from httperf's
    parsed summary (see bench.kinds.openloop)."""
    e = parsed["errors"]
    client = {k: e[k] for k in CLIENT_ERRORS if e[k]}
    if client:
        return "invalid", ["client-side errors " + ", ".join(f"{k}={v}" for k, v in client.items())
                           + ": the load generator, not the server, was the limit"]
    reasons = []
    if parsed["reply_rate"]["samples"] == 0:
        return "invalid", ["no reply-rate sample (httperf samples every 5 s): use a longer --step"]
    if parsed["replies"] < REPLIES_OF_REQUESTS * parsed["requests"]:
        reasons.append(f"replies {parsed['replies']} < {REPLIES_OF_REQUESTS:.0%} of {parsed['requests']} requests")
    low = steady_min(parsed["reply_rate"])
    if low < MIN_RATE_OF_TARGET * rate:
        reasons.append(f"min reply rate {low:g}/s < {MIN_RATE_OF_TARGET:.0%} of {rate:g}/s")
    server = {k: e[k] for k in SERVER_ERRORS if e[k]}
    bad_status = {k: parsed["status"][k] for k in ("4xx", "5xx") if parsed["status"][k]}
    if server or bad_status:
        reasons.append("server-side errors " + ", ".join(f"{k}={v}" for k, v in {**bad_status, **server}.items()))
    return ("fail" if reasons else "pass"), reasons
