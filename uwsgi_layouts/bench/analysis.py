"""From records to conclusions: medians and spread over repeats, pooled tails with intervals,
requests in flight, best layout, verdict; the open loop's step verdicts.

Pure functions of a ``Results`` (or of a parsed httperf summary): no timing, no processes, so
they are tested on fixtures and used unchanged by ``report`` for a live run and a replayed one.

Honest tails. A 5-s cell holds 60-80 requests, so its own p99 is its maximum. Each group
(scenario, layout, level) therefore pools its repeats' latency histograms (``Cell.histogram``:
the requests wrk measured) and reads p50/p99 from the pool, with a bootstrap confidence interval
(``pooled_tails``). Resampling: first the repeats (with replacement), then the requests of the
drawn repeats (from their histograms; ``bootstrap_percentiles``). Requests of one cell are not
independent (they queue behind each other, on one machine state) and repeats drift on a noisy
machine; resampling requests alone would treat every request as independent and give intervals
far too narrow, while resampling repeats first carries the between-repeat spread into the
interval. The repeat draws are the same for every group with the same number of repeats, so two
layouts' replicates are paired by repeat number (repeats are interleaved: repeat r of each
layout ran under the same machine drift), which is what the ratio's interval uses. Everything is
seeded: the same file gives the same intervals.

Comparisons (``compare_groups``, the one function every decision calls: the verdict, the best
per level, the alternatives, the layout choice and tune): paired by round (``bench.paired``):
the per-round ratios of throughput, or of each round's p99, with their interval, and one of
"better", "worse", "equivalent" (within the margin) or "undecided". Cells that record no round
(older files) are compared unpaired, conservatively, and reports say so. The margin and the
looks of the stopping rule come from the run's arguments (``rule_of``). The pooled p99 with its
bootstrap interval is what tables quote (only when at least ``MIN_SLOWER_REQUESTS`` requests lie
above it); files without histograms fall back to per-cell figures: the median of the repeats'
p99 with its low–high range (``Tails.pooled`` False).
"""

from __future__ import annotations

import functools
import math
import re
import statistics
import zlib
from dataclasses import dataclass, field

import numpy as np

from uwsgi_layouts.bench.load.httperf import CLIENT_ERRORS, SERVER_ERRORS
from uwsgi_layouts.bench.paired import (
    DEFAULT_MARGIN,
    MIN_ROUNDS,
    Comparison,
    Rule,
    compare_rounds,
    compare_unpaired,
    request_weight,
)
from uwsgi_layouts.bench.results import PERCENTILES, STATUS_CLASSES, Cell, Results
from uwsgi_layouts.deploy.model import STRATEGIES

NOISY_SPREAD = 0.10  # (max - min) / median across repeats above this is flagged
MIN_REQUESTS_FOR_P99 = 100  # below this a "p99" is the sample's max


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


# --- honest tails: pooled histograms, bootstrap intervals, comparisons ---------------------

CONFIDENCE = 0.95
BOOTSTRAP_REPLICATES = 1000
BOOTSTRAP_SEED = 20240901  # fixed: one stored run always renders the same intervals
MIN_SLOWER_REQUESTS = 10  # a p99 with fewer pooled requests above it is flagged
TAIL_QUANTILES = {"p50": 5000, "p99": 9900}  # in basis points, so ranks are exact integers


@dataclass(frozen=True)
class Interval:
    """A figure with its interval. ``method``: "pooled" (percentile of the pooled histograms,
    bootstrap interval), "repeats" (median of the repeats, interval = their low–high range).
    ``replicates``: the bootstrap values behind it (paired by repeat across groups), for ratios."""

    value: float
    low: float
    high: float
    method: str
    replicates: np.ndarray | None = field(default=None, repr=False, compare=False)

    def overlaps(self, other: "Interval") -> bool:
        return self.low <= other.high and other.low <= self.high


def rank(total: int, basis_points: int) -> int:
    """The nearest-rank position of a percentile: ceil(q x N), at least 1 (integer arithmetic)."""
    return max(1, -(-total * basis_points // 10000))


def percentile_of(histogram, basis_points: int) -> float:
    """The smallest latency whose cumulative count reaches ``rank`` (0.0 for an empty histogram)."""
    total = sum(c for _, c in histogram)
    if not total:
        return 0.0
    need, seen = rank(total, basis_points), 0
    for value, count in histogram:
        seen += count
        if seen >= need:
            return float(value)
    return float(histogram[-1][0])


def pool(histograms) -> tuple[tuple[float, int], ...]:
    """Several histograms as one (counts of equal latencies added), ascending."""
    merged: dict[float, int] = {}
    for h in histograms:
        for value, count in h:
            merged[value] = merged.get(value, 0) + count
    return tuple(sorted(merged.items()))


def slower_than(histogram, value: float) -> int:
    """Requests strictly slower than ``value``."""
    return sum(c for v, c in histogram if v > value)


def repeat_draws(n: int, replicates: int = BOOTSTRAP_REPLICATES, seed: int = BOOTSTRAP_SEED) -> np.ndarray:
    """(replicates x n) indices of repeats drawn with replacement; the same for every group with
    ``n`` repeats, which pairs two groups' replicates by repeat."""
    return np.random.default_rng([seed, n]).integers(0, n, size=(replicates, n))


def _bounds(replicates: np.ndarray, confidence: float) -> tuple[float, float]:
    alpha = (1 - confidence) / 2
    return (float(np.quantile(replicates, alpha, method="lower")),
            float(np.quantile(replicates, 1 - alpha, method="higher")))


def bootstrap_percentiles(histograms, quantiles=(5000, 9900),
                          replicates: int = BOOTSTRAP_REPLICATES, seed: int = BOOTSTRAP_SEED,
                          confidence: float = CONFIDENCE) -> dict[int, Interval]:
    """Pooled percentiles (basis points -> Interval) of the repeats' ``histograms`` (in repeat
    order), each with a bootstrap interval. Per replicate: draw the repeats with replacement, then
    as many requests as the drawn repeats hold from their pooled distribution, and read the
    percentile. The k-th smallest of N draws from a distribution F is F^-1 of a Beta(k, N - k + 1)
    variable, so that is one Beta draw per replicate, not N (fast on long runs). Drawing the N
    requests from the drawn repeats' mixture, rather than exactly n from each, lets each repeat's
    share vary a little: a slightly wider interval, never a narrower one."""
    hists = [tuple(h) for h in histograms if h]
    if not hists:
        return {}
    pooled = pool(hists)
    grid = np.array([v for v, _ in pooled], dtype=float)
    sizes = np.array([sum(c for _, c in h) for h in hists], dtype=float)
    cdf = np.zeros((len(hists), len(grid)))
    for r, h in enumerate(hists):
        cdf[r, np.searchsorted(grid, [v for v, _ in h])] = [c for _, c in h]
    cdf = np.cumsum(cdf, axis=1) / sizes[:, None]
    picks = repeat_draws(len(hists), replicates, seed)
    drawn = np.stack([(picks == r).sum(axis=1) for r in range(len(hists))], axis=1) * sizes  # requests per repeat
    total = drawn.sum(axis=1)
    mixture = (drawn @ cdf) / total[:, None]
    rng = np.random.default_rng([seed, zlib.crc32(repr(hists).encode())])  # its own stream per data set
    out = {}
    for q in quantiles:
        k = np.maximum(1, -(-total.astype(np.int64) * q // 10000))
        u = rng.beta(k, total - k + 1)
        values = grid[np.minimum((mixture < u[:, None]).sum(axis=1), len(grid) - 1)]
        out[q] = Interval(percentile_of(pooled, q), *_bounds(values, confidence), "pooled", values)
    return out


def repeats_interval(values, replicates: int = BOOTSTRAP_REPLICATES, seed: int = BOOTSTRAP_SEED) -> Interval:
    """The median of per-repeat ``values`` (in repeat order) with their low–high range; the
    replicates are medians of repeats drawn as in ``bootstrap_percentiles`` (paired by repeat)."""
    v = np.asarray(list(values), dtype=float)
    if not len(v):
        return Interval(0.0, 0.0, 0.0, "repeats", np.zeros(0))
    reps = np.median(v[repeat_draws(len(v), replicates, seed)], axis=1)
    return Interval(float(np.median(v)), float(v.min()), float(v.max()), "repeats", reps)


@dataclass(frozen=True)
class Tails:
    """A group's latency figures in ms. ``pooled``: read from the pooled histograms (bootstrap
    intervals); else (files without histograms) the repeats' per-cell p50/p99, median and range."""

    p50: Interval
    p99: Interval
    pooled: bool
    requests: int = 0  # requests in the pooled histograms
    slower: int = 0  # pooled requests slower than the pooled p99
    per_cell: dict = field(default_factory=dict, compare=False)  # "p50"/"p99" -> the repeats' own, always

    @property
    def thin(self) -> bool:
        """The p99 rests on fewer than MIN_SLOWER_REQUESTS requests above it."""
        return self.pooled and self.slower < MIN_SLOWER_REQUESTS


@functools.lru_cache(maxsize=1024)
def _tails(histograms: tuple, p50s: tuple, p99s: tuple) -> Tails:
    per_cell = {"p50": repeats_interval(p50s), "p99": repeats_interval(p99s)}
    if histograms and all(histograms):
        q = bootstrap_percentiles(histograms)
        ms = {name: _scaled(q[bp], 1 / 1000) for name, bp in TAIL_QUANTILES.items()}
        pooled = pool(histograms)
        return Tails(ms["p50"], ms["p99"], True, sum(c for _, c in pooled),
                     slower_than(pooled, q[TAIL_QUANTILES["p99"]].value), per_cell)
    return Tails(per_cell["p50"], per_cell["p99"], False, per_cell=per_cell)


def _scaled(i: Interval, factor: float) -> Interval:
    reps = None if i.replicates is None else i.replicates * factor
    return Interval(i.value * factor, i.low * factor, i.high * factor, i.method, reps)


def pooled_tails(cells: list[Cell]) -> Tails:
    """p50/p99 (ms) of ``cells`` (one group's repeats): pooled with bootstrap intervals when every
    cell has a histogram, else per-cell medians with the repeats' range."""
    cells = sorted(cells, key=lambda c: c.repeat)
    return _tails(tuple(c.histogram for c in cells), tuple(c.latency_ms.p50 for c in cells),
                  tuple(c.latency_ms.p99 for c in cells))


# --- requests in flight per worker (the mechanism) -------------------------------------------


@dataclass(frozen=True)
class Inflight:
    """A group's in-flight figures (``Cell.inflight``) over its repeats."""

    pileup: Stat | None  # share of time piled up (bench.observe.inflight_summary); None = n/a
    full: Stat  # share of time some worker had every thread busy
    shares: dict[str, dict[str, float]]  # worker -> in-flight count -> share of samples, pooled
    samples: int
    threads: int


def inflight_of(cells: list[Cell]) -> Inflight | None:
    cells = [c for c in cells if c.inflight]
    if not cells:
        return None
    samples = sum(c.inflight["samples"] for c in cells)
    shares: dict[str, dict[str, float]] = {}
    for c in cells:
        weight = c.inflight["samples"] / samples
        for w, dist in c.inflight["workers"].items():
            for n, share in dist.items():
                shares.setdefault(w, {}).setdefault(n, 0.0)
                shares[w][n] += share * weight
    shares = {w: dict(sorted(d.items(), key=lambda kv: int(kv[0]))) for w, d in sorted(shares.items(),
                                                                                      key=lambda kv: int(kv[0]))}
    piles = [c.inflight["pileup"] for c in cells if c.inflight.get("pileup") is not None]
    return Inflight(pileup=Stat.of(piles) if piles else None,
                    full=Stat.of([c.inflight.get("full", 0.0) for c in cells]), shares=shares, samples=samples,
                    threads=int(max(c.inflight.get("threads", 0) for c in cells)))


@dataclass(frozen=True)
class Group:
    """One (scenario, layout, concurrency) over its repeats (rounds)."""

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
    tails: Tails | None = None  # pooled p50/p99 with intervals (or per-cell, for old files)
    throughput: Interval | None = None  # median req/s, interval = the repeats' range
    inflight: Inflight | None = None  # requests in flight per worker; None when not sampled
    # Answers per status class, summed over repeats ({} when the cells did not count them).
    status: dict[str, int] = field(default_factory=dict)
    # Memory figures (cell.memory keys) over repeats; "worker_pss_mb" is each cell's mean per worker.
    memory: dict[str, Stat] = field(default_factory=dict)
    # Per figure ("rps", "p50", "p99"): round -> that round's value (empty when the cells record
    # no round), and the values in repeat order (what an unpaired comparison uses).
    per_round: dict[str, dict[int, float]] = field(default_factory=dict, compare=False)
    per_repeat: dict[str, tuple[float, ...]] = field(default_factory=dict, compare=False)
    # round -> the requests its cell measured: what that round weighs in a paired comparison.
    round_requests: dict[int, int] = field(default_factory=dict, compare=False)
    rule: Rule = field(default_factory=Rule, compare=False)  # how comparisons with it are judged

    def interval(self, figure: str) -> Interval:
        """"rps", "p50" or "p99" with its interval."""
        if figure == "rps":
            return self.throughput
        return getattr(self.tails, figure)

    @property
    def paired(self) -> bool:
        """Every cell records its round: comparisons with this group can be paired."""
        return bool(self.per_round.get("rps")) and len(self.per_round["rps"]) == self.rps.n

    @property
    def rounds(self) -> tuple[int, ...]:
        return tuple(sorted(self.per_round.get("rps", {})))

    @property
    def p99(self) -> float:
        """The p99 tables quote: pooled when the cells have histograms, else the median."""
        return self.tails.p99.value

    @property
    def p99_quotable(self) -> bool:
        """At least MIN_SLOWER_REQUESTS requests lie above the p99: pooled ones, or (cells without
        histograms) each cell's own, which needs 100 x that many requests per cell."""
        if self.tails.pooled:
            return self.tails.slower >= MIN_SLOWER_REQUESTS
        return self.min_cell_requests >= requests_for_p99()

    @property
    def non_2xx(self) -> int:
        return sum(n for k, n in self.status.items() if k != "2xx")

    @property
    def noisy_figures(self) -> list[str]:
        figures = {"rps": self.rps, "p99": self.latency["p99"]}
        return [name for name, stat in figures.items() if stat.noisy]


def rule_of(results: Results) -> Rule:
    """The run's rule for comparisons: its equivalence margin (``--margin``) and, when it measured
    until decided (``--budget``), the looks of the stopping rule: the first after the planned
    repeats, the last at the fixed maximum of rounds it set before its first extra round."""
    a = results.arguments
    margin = a.get("margin", DEFAULT_MARGIN)
    repeats = a.get("repeats") if isinstance(a.get("repeats"), int) else 0
    last = a.get("max_rounds") if isinstance(a.get("max_rounds"), int) else 0
    # A run written before the final look kept a share of its own split the error equally.
    share = a.get("final_share") if isinstance(a.get("final_share"), (int, float)) else 0.0
    final = a.get("final_round") if isinstance(a.get("final_round"), int) else 0
    return Rule(margin=margin, first=repeats, last=last, final_share=share, final=final)


def group_cells(results: Results, scenario: str | None = None) -> list[Group]:
    out = []
    rule = rule_of(results)
    scenarios = results.scenarios if scenario is None else [scenario]
    for sc in scenarios:
        for layout in results.layouts:
            for level in results.levels:
                cells = [c for c in results.cells if c.scenario == sc and c.layout == layout and c.concurrency == level]
                if cells:
                    out.append(group_of(cells, rule))
    return out


def cell_p99(cell: Cell) -> float:
    """A cell's own p99 in ms: from its histogram when it has one (the requests wrk measured),
    else wrk's figure."""
    return percentile_of(cell.histogram, TAIL_QUANTILES["p99"]) / 1000 if cell.histogram else cell.latency_ms.p99


def cell_p50(cell: Cell) -> float:
    return percentile_of(cell.histogram, TAIL_QUANTILES["p50"]) / 1000 if cell.histogram else cell.latency_ms.p50


def cell_cpu_ms(cell: Cell) -> float:
    """The serving side's CPU per request in ms: the app server's processes and nginx's (wrk, the
    client, left out); 0 for a cell without requests (left out of every ratio)."""
    return 1000 * (cell.cpu_s.get("app", 0.0) + cell.cpu_s.get("nginx", 0.0)) / cell.requests if cell.requests else 0.0


# The figures a comparison can be on; only throughput is better higher.
FIGURES = {"rps": lambda c: c.rps, "p50": cell_p50, "p99": cell_p99, "cpu": cell_cpu_ms}


def group_of(cells: list[Cell], rule: Rule | None = None) -> Group:
    """One group from its cells: the repeats of one (scenario, layout, concurrency)."""
    cells = sorted(cells, key=lambda c: c.repeat)
    first = cells[0]
    if any((c.scenario, c.layout, c.concurrency) != (first.scenario, first.layout, first.concurrency) for c in cells):
        raise ValueError("group_of: the cells must share scenario, layout and concurrency")
    pooled: dict[str, int] = {}
    for c in cells:
        for w, n in c.worker_requests.items():
            pooled[w] = pooled.get(w, 0) + n
    total = sum(pooled.values())
    cpu = [1000 * sum(c.cpu_s.values()) / c.requests for c in cells if c.requests]
    extra_keys = sorted({k for c in cells for k, v in c.extra.items() if isinstance(v, (int, float))})
    rounds = [c.round for c in cells]
    paired = all(rounds) and len(set(rounds)) == len(rounds)
    return Group(
        scenario=first.scenario,
        layout=first.layout,
        concurrency=first.concurrency,
        rps=Stat.of([c.rps for c in cells]),
        latency={p: Stat.of([getattr(c.latency_ms, p) for c in cells]) for p in PERCENTILES},
        efficiency=Stat.of([c.efficiency for c in cells]),
        # Only cells that counted per worker (a peer serving an app without the X-Worker-Pid
        # header counts nothing: n/a, not an even 0).
        cv=Stat.of([c.balance["cv"] for c in cells if c.worker_requests]),
        errors=sum(c.errors.total for c in cells),
        requests=sum(c.requests for c in cells),
        min_cell_requests=min(c.requests for c in cells),
        worker_share={w: n / total for w, n in sorted(pooled.items(), key=lambda kv: int(kv[0]))}
        if total else {},
        cpu_ms_per_request=Stat.of(cpu),
        extra={k: Stat.of([c.extra[k] for c in cells if k in c.extra]) for k in extra_keys},
        tails=pooled_tails(cells),
        throughput=repeats_interval([c.rps for c in cells]),
        inflight=inflight_of(cells),
        status=sum_status(cells),
        memory=memory_stats(cells),
        per_round={name: ({c.round: f(c) for c in cells} if paired else {}) for name, f in FIGURES.items()},
        round_requests={c.round: c.requests for c in cells} if paired else {},
        per_repeat={name: tuple(f(c) for c in cells) for name, f in FIGURES.items()},
        rule=rule or Rule(),
    )


def compare_groups(a: Group, b: Group, figure: str = "p99") -> Comparison:
    """Group ``a`` against ``b`` on "rps" (higher is better), "p50", "p99" or "cpu" (CPU per request,
    ``cell_cpu_ms``) (lower is better),
    paired by round (``bench.paired``): better, worse, equivalent or undecided, with the ratio
    a / b and its interval. Unpaired (and conservative) only when either group's cells record no
    round. The one comparison every decision uses, tune's included."""
    if figure not in FIGURES:
        raise ValueError(f"figure: must be one of {', '.join(FIGURES)}, got {figure!r}")
    higher = figure == "rps"
    if a.paired and b.paired:
        weights = {r: request_weight(a.round_requests.get(r, 0), b.round_requests.get(r, 0))
                   for r in set(a.round_requests) & set(b.round_requests)}
        return compare_rounds(a.per_round[figure], b.per_round[figure], higher, figure, a.rule, weights=weights)
    return compare_unpaired(list(a.per_repeat[figure]), list(b.per_repeat[figure]), higher, figure, a.rule)


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


def throughput_scores(groups: list[Group]) -> dict[int, float]:
    """Per group (by id), the throughput that orders it among the others: the geometric mean over
    the rounds every group measured (it agrees with two groups' paired ratio when they measured no
    other rounds; ``ahead_of_next`` mends the order where they did), else, without shared rounds
    (unpaired cells), the median."""
    shared = set.intersection(*(set(g.per_round.get("rps", {})) for g in groups)) if groups else set()
    out = {}
    for g in groups:
        values = [g.per_round["rps"][r] for r in shared if g.per_round["rps"][r] > 0]
        out[id(g)] = math.exp(statistics.fmean(math.log(v) for v in values)) if values else g.rps.median
    return out


def ahead_of_next(ordered: list[Group]) -> list[Group]:
    """``ordered`` rearranged so that each group's paired throughput ratio to the next is at least
    1, the order the reports quote (best against runner-up). A score over the rounds all groups
    share can disagree with two groups' own ratio when a third missed rounds they measured (the
    rounds added until decided); an insertion sort on the paired ratio keeps every neighbour pair
    in agreement, even if the ratios of three are not transitive."""
    out: list[Group] = []
    for g in ordered:
        i = len(out)
        while i > 0 and _ahead(g, out[i - 1]):
            i -= 1
        out.insert(i, g)
    return out


def _ahead(a: Group, b: Group) -> bool:
    c = compare_groups(a, b, "rps")
    return c.rounds > 0 and c.ratio > 1


def ranked_at_level(groups: list[Group]) -> list[Group]:
    """One level's groups, best first. Unbeaten first (no other group had more throughput beyond
    noise, paired by round), by throughput (``throughput_scores``, then ``ahead_of_next``); an unbeaten group whose
    throughput is equivalent to that leader's and whose p99 is better beyond noise goes ahead of
    it; then the beaten ones, by throughput."""
    score = throughput_scores(groups)
    by_rps = sorted(groups, key=lambda g: (-score[id(g)], g.layout))
    beaten = {id(g) for g in groups for h in groups if h is not g and compare_groups(h, g, "rps").outcome == "better"}
    unbeaten = ahead_of_next([g for g in by_rps if id(g) not in beaten] or by_rps)
    leader = unbeaten[0]
    for g in unbeaten[1:]:
        if compare_groups(g, leader, "rps").outcome == "equivalent" and \
                compare_groups(g, leader, "p99").outcome == "better":
            leader = g
            break
    first = [leader] + [g for g in unbeaten if g is not leader]  # the mended order, not the score's
    return first + [g for g in by_rps if all(g is not h for h in first)]


def best_per_level(groups: list[Group]) -> dict[int, Group]:
    """Per concurrency, the first of ``ranked_at_level``."""
    levels = sorted({g.concurrency for g in groups})
    return {lv: ranked_at_level([g for g in groups if g.concurrency == lv])[0] for lv in levels}


@dataclass(frozen=True)
class BestAtLevel:
    """The best layout at one level against the runner-up (the next in ``ranked_at_level``): a
    key comparison, the one a budgeted compare measures until it is settled."""

    best: Group
    runner_up: Group | None

    @property
    def rps(self) -> Comparison | None:
        return compare_groups(self.best, self.runner_up, "rps") if self.runner_up is not None else None

    @property
    def settled(self) -> bool:
        return self.runner_up is None or self.rps.settled


def best_and_runner_up(groups: list[Group]) -> dict[int, BestAtLevel]:
    out = {}
    for lv in sorted({g.concurrency for g in groups}):
        ranked = ranked_at_level([g for g in groups if g.concurrency == lv])
        out[lv] = BestAtLevel(ranked[0], ranked[1] if len(ranked) > 1 else None)
    return out


def requests_for_p99(slower: int = MIN_SLOWER_REQUESTS) -> int:
    """Pooled requests for ``slower`` of them to lie above the p99 (1% of the requests)."""
    return slower * 100


def tail_advice(g: Group, duration: float | None = None) -> str:
    """``"p99 rests on N slower requests: use --duration X or more --repeats"``, X computed from
    the group's measured rate so that its repeats pool ``requests_for_p99()`` requests."""
    repeats = max(1, g.rps.n)
    rate = g.rps.median or 1e-9
    need = requests_for_p99()
    seconds = math.ceil(need / (repeats * rate))
    slower = f"{g.tails.slower} slower request" + ("" if g.tails.slower == 1 else "s")
    text = f"p99 rests on {slower}: use --duration {seconds} or more --repeats"
    if duration:
        text += f" (--repeats {math.ceil(need / (duration * rate))} at --duration {duration:g})"
    return text


LOAD_CAUTION_SHARE = 0.5  # older files: a load average above half the cores: other work shared them
OTHERS_CAUTION = 0.10  # other processes used more than 10% of the machine's CPU time while it measured
STEAL_CAUTION = 0.05  # more than 5% of CPU time stolen by the hypervisor


def _numbers(values) -> list[float]:
    return [float(x) for x in values if isinstance(x, (int, float)) and not isinstance(x, bool)]


def machine_cautions(environment: dict) -> list[str]:
    """Cautions from how busy the machine was (``bench.environment``): other processes' CPU above
    10% of the machine just before the run started or while it measured, CPU steal above 5%. []
    when the run recorded none of them. The load average is recorded, not judged: during the run it
    is mostly the run's own wrk and servers, and at the start a one-minute average still holds a run
    that has just ended. Files written before "others" was sampled are judged on their load average
    (above half the cores), as they were."""
    nproc = environment.get("nproc")
    samples = (environment.get("machine") or {}).get("samples") or []
    others = _numbers([environment.get("others_at_start"), *(s.get("others") for s in samples)])
    steals = _numbers([environment.get("steal_at_start"), *(s.get("steal") for s in samples)])
    out = []
    if not others:  # an older file: the load average was its only evidence
        start = environment.get("loadavg_at_start") or [None]
        loads = _numbers([start[0], *(s.get("loadavg_1m") for s in samples)])
        if isinstance(nproc, int) and nproc and loads and max(loads) > LOAD_CAUTION_SHARE * nproc:
            out.append(f"the machine was busy: load average up to {max(loads):.1f} on {nproc} cores (median "
                       f"{statistics.median(loads):.1f}; above {LOAD_CAUTION_SHARE * nproc:g}, half the cores, other "
                       "work shared them): paired rounds cancel slow drift, not bursts within a round; rerun on a "
                       "quieter machine before deciding on a few percent.")
    elif max(others) > OTHERS_CAUTION:
        out.append(f"other processes used up to {max(others):.0%} of the machine's CPU time at the start or while it "
                   f"measured (median {statistics.median(others):.0%}, above {OTHERS_CAUTION:.0%}): a neighbour "
                   "shared the cores; paired rounds cancel slow drift, not bursts within a round; rerun on a quieter "
                   "machine before deciding on a few percent.")
    if steals and max(steals) > STEAL_CAUTION:
        out.append(f"the hypervisor stole up to {max(steals):.0%} of the CPU time during the run (above "
                   f"{STEAL_CAUTION:.0%}): a neighbour on the host took cores this VM was given; figures may move "
                   "with it.")
    return out


def unpaired_note(results: Results) -> str:
    """One line when the cells record no round (written before rounds were), else ""."""
    if results.cells and not any(c.round for c in results.cells):
        return ("this file records no rounds (written before they were): comparisons are unpaired, with "
                "conservative intervals (every cross ratio of the repeats)")
    return ""


def warnings(results: Results) -> list[str]:
    """Advice the reader should act on, pyperf style: what is wrong and what to do."""
    out = machine_cautions(results.environment)
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
    thin_tails = [g for g in groups if g.tails.thin]
    if thin_tails:
        duration = results.arguments.get("duration")
        slowest = min(thin_tails, key=lambda g: g.rps.median)
        out.append(
            f"{len(thin_tails)} of {len(groups)} pooled p99 figures rest on fewer than {MIN_SLOWER_REQUESTS} slower "
            f"requests; for the slowest of them, {slowest.layout} at {slowest.concurrency} connections"
            + (f" ({slowest.scenario})" if len(results.scenarios) > 1 else "") + ": "
            + f"{tail_advice(slowest, duration if isinstance(duration, (int, float)) else None)}."
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
    """How one layout fares across every scenario of a run. Each half of the goal is a paired
    comparison against a threshold: met when the ratio's whole interval is on the right side of
    it, missed when the whole interval is on the wrong side, undecided otherwise."""

    layout: str
    p99_vs_best: dict[str, float]  # scenario -> worst (over levels) healthy p99 / best layout's p99
    worst_where: str  # "stall at 8 connections"
    steady_rps_vs_mapped: float | None  # worst over steady levels; None when it cannot be computed
    stalled_p99_ms: dict[str, float]  # stall scenario -> median over levels of the stalled requests' p99
    # Where the p99 is over the slack beyond noise (the whole interval above it): "stall at 8 connections".
    p99_misses: tuple[str, ...] = ()
    p99_unsure: tuple[str, ...] = ()  # where the interval straddles the slack
    rps_miss: bool = False  # some steady level's throughput ratio to mapped is below the goal beyond noise
    rps_unsure: bool = False  # ... or its interval straddles it
    missing: str = ""  # why the throughput half cannot be checked ("" when it can)

    @property
    def worst_p99_ratio(self) -> float:
        return max(self.p99_vs_best.values()) if self.p99_vs_best else 0.0

    @property
    def goal(self) -> str:
        """"meets" (both halves met beyond noise), "no" (a half missed beyond noise), "cannot be
        checked" (the throughput half has no inputs: no steady scenario or no mapped layout, and
        nothing missed), or "undecided" (some interval straddles a threshold: measure more)."""
        if self.p99_misses or self.rps_miss:
            return "no"
        if self.missing:
            return "cannot be checked"
        if self.p99_unsure or self.rps_unsure:
            return "undecided"
        return "meets"

    @property
    def meets_goal(self) -> bool:
        return self.goal == "meets"


def steady_scenarios(results: Results) -> list[str]:
    """Scenarios without a stall load (by their recorded mix, else by name)."""
    out = []
    for sc in results.scenarios:
        mix = results.workload.get(sc) if isinstance(results.workload.get(sc), dict) else {}
        if not mix.get("stall") and "stall" not in sc:
            out.append(sc)
    return out


def against(c: Comparison, threshold: float, at_most: bool) -> str:
    """A ratio's interval against a threshold: "met", "missed" or "unsure" (it straddles it)."""
    if c.method == "too few rounds" or (c.method != "unpaired" and c.rounds < MIN_ROUNDS):
        return "unsure"
    low_ok, high_ok = (c.high <= threshold, c.low <= threshold) if at_most else (c.low >= threshold,
                                                                                  c.high >= threshold)
    return "met" if low_ok else "unsure" if high_ok else "missed"


def layout_choice(results: Results) -> list[Choice]:
    groups = group_cells(results)
    by = {(g.scenario, g.layout, g.concurrency): g for g in groups}
    p, t = results.arguments.get("processes"), results.arguments.get("threads")
    mapped = f"{p}x{t}-mapped"
    steady = steady_scenarios(results)
    missing = ""
    if not steady:
        missing = "run with a steady scenario too (e.g. --scenario article,stall)"
    elif not any(g.layout == mapped for g in groups if g.scenario in steady):
        missing = f"run with {mapped} too"
    out = []
    for layout in results.layouts:
        ratios: dict[str, float] = {}
        worst, where = 0.0, ""
        stalled: dict[str, float] = {}
        rps: list[tuple[float, str]] = []  # (ratio to mapped, against the goal)
        misses, unsure = [], []
        for sc in results.scenarios:
            for level in results.levels:
                g = by.get((sc, layout, level))
                if g is None:
                    continue
                peers = [x for x in groups if x.scenario == sc and x.concurrency == level]
                best_group = min(peers, key=lambda x: x.p99)
                c = compare_groups(g, best_group, "p99") if g is not best_group else None
                ratio = c.ratio if c is not None else 1.0
                ratios[sc] = max(ratios.get(sc, 0.0), ratio)
                if ratio > worst:
                    worst, where = ratio, f"{sc} at {level} connections"
                state = against(c, GOAL_P99_SLACK, at_most=True) if c is not None else "met"
                (misses if state == "missed" else unsure if state == "unsure" else []).append(
                    f"{sc} at {level} connections")
                m = by.get((sc, mapped, level))
                if sc in steady and m is not None:
                    cm = compare_groups(g, m, "rps") if g is not m else None
                    rps.append((cm.ratio if cm else 1.0, against(cm, GOAL_RPS_OF_MAPPED, at_most=False)
                                if cm else "met"))
            stall_p99 = [by[(sc, layout, lv)].extra["stalled_p99_ms"].median for lv in results.levels
                         if (sc, layout, lv) in by and "stalled_p99_ms" in by[(sc, layout, lv)].extra]
            if stall_p99:
                stalled[sc] = statistics.median(stall_p99)
        out.append(Choice(layout, ratios, where, min(r for r, _ in rps) if rps else None, stalled, tuple(misses),
                          tuple(unsure), any(s == "missed" for _, s in rps), any(s == "unsure" for _, s in rps),
                          missing if not rps else ""))
    return out


# --- against the alternatives: the best uWSGI layout vs the peers (gunicorn, granian) ---------

UWSGI = "uwsgi"
# Targets from the peers issue, for the demo app's article request at 2P connections: the best
# uWSGI layout against the best peer (each the highest median throughput at that level).
TARGET_VS_PEER_RPS = 1.05  # throughput, uWSGI / peer, at least
TARGET_VS_PEER_P99 = 0.85  # p99, uWSGI / peer, at most
_STRATEGY_RE = re.compile(r"^\d+x\d+-([a-z]+)")


def server_of(layout: str) -> str:
    """The app server a layout label names (``2x4-gunicorn@reuse_port=on`` -> "gunicorn"); ""
    when the label names no strategy this tool knows."""
    m = _STRATEGY_RE.match(layout)
    strategy = STRATEGIES.get(m[1]) if m else None
    return strategy.server if strategy else ""


@dataclass(frozen=True)
class Matchup:
    """The best uWSGI layout at one level against a peer's layout: every ratio is uWSGI / peer,
    from ``compare_groups`` ("better" = uWSGI better beyond noise, "worse" = the peer better)."""

    concurrency: int
    uwsgi: Group
    peer: Group

    @property
    def rps(self) -> Comparison:
        return compare_groups(self.uwsgi, self.peer, "rps")

    @property
    def p99(self) -> Comparison:
        return compare_groups(self.uwsgi, self.peer, "p99")

    @property
    def targets(self) -> dict[str, str]:
        """Each target judged by its paired interval (``against``): "met", "missed" or "unsure"."""
        return {f"throughput >= {TARGET_VS_PEER_RPS}x the best peer's": against(self.rps, TARGET_VS_PEER_RPS,
                                                                                  at_most=False),
                f"p99 <= {TARGET_VS_PEER_P99}x the best peer's": against(self.p99, TARGET_VS_PEER_P99, at_most=True)}

    @property
    def settled(self) -> bool:
        """Every target met or missed beyond noise: more rounds would not change the answer."""
        return all(v != "unsure" for v in self.targets.values())


@dataclass(frozen=True)
class PeerChoice:
    """One peer server's measured variants at one level (``2x4-gunicorn``, ``2x4-gunicorn@keepalive=off``...):
    the best by ``ranked_at_level`` (not beaten on throughput beyond noise, then the highest) and
    the runner-up it was judged against, ``compare_groups`` on throughput."""

    concurrency: int
    server: str
    best: Group
    runner_up: Group | None
    variants: tuple[str, ...]  # every layout of this server measured at this level

    @property
    def rps(self) -> Comparison | None:
        return compare_groups(self.best, self.runner_up, "rps") if self.runner_up is not None else None


def peer_choices(groups: list[Group]) -> list[PeerChoice]:
    """Per level and peer server (in the order first measured), its best variant."""
    out = []
    for lv in sorted({g.concurrency for g in groups}):
        at = [g for g in groups if g.concurrency == lv]
        for server in dict.fromkeys(server_of(g.layout) for g in at):
            ranked = ranked_at_level([g for g in at if server_of(g.layout) == server])
            out.append(PeerChoice(lv, server, ranked[0], ranked[1] if len(ranked) > 1 else None,
                                  tuple(g.layout for g in ranked)))
    return out


@dataclass(frozen=True)
class Alternatives:
    """One scenario's uWSGI layouts against its peers at P and 2P connections: each peer at its
    best measured variant."""

    scenario: str
    levels: tuple[int, ...]  # P and 2P, where both kinds were measured
    matchups: tuple[Matchup, ...]  # per level: the best uWSGI layout against each peer's best variant
    target: Matchup | None  # at 2P: the best uWSGI layout against the best peer
    # At 2P (else P): the best against the worst uWSGI layout, on throughput (None with one layout).
    layout_spread: Comparison | None = None
    worst_uwsgi: Group | None = None
    missing: str = ""  # why P or 2P is not there
    choices: tuple[PeerChoice, ...] = ()  # per level and peer: which variant was its best

    @property
    def peers(self) -> list[str]:
        """The peer servers, in the order measured."""
        return list(dict.fromkeys(server_of(m.peer.layout) for m in self.matchups))


def alternatives(results: Results, scenario: str) -> Alternatives | None:
    """The best uWSGI layout (``best_per_level``) at P and 2P against the best measured variant of
    each peer (``peer_choices``), and at 2P against the best of those (the target); None when the
    scenario has no uWSGI layout or no peer."""
    groups = group_cells(results, scenario)
    ours = [g for g in groups if server_of(g.layout) == UWSGI]
    theirs = [g for g in groups if server_of(g.layout) not in (UWSGI, "")]
    if not ours or not theirs:
        return None
    p = results.arguments.get("processes")
    if not isinstance(p, int) or p < 1:
        return Alternatives(scenario, (), (), None, missing="the run does not record processes (P)")
    measured = lambda gs, lv: any(g.concurrency == lv for g in gs)  # noqa: E731
    levels = tuple(lv for lv in (p, 2 * p) if measured(ours, lv) and measured(theirs, lv))
    absent = [lv for lv in (p, 2 * p) if lv not in levels]
    best_ours = best_per_level(ours)
    choices = tuple(c for c in peer_choices([g for g in theirs if g.concurrency in levels]))
    matchups = tuple(Matchup(c.concurrency, best_ours[c.concurrency], c.best) for c in choices)
    at_2p = [c.best for c in choices if c.concurrency == 2 * p]
    target = Matchup(2 * p, best_ours[2 * p], ranked_at_level(at_2p)[0]) if at_2p else None
    spread, worst = None, None
    if levels:
        best = best_ours[levels[-1]]
        others = [g for g in ours if g.concurrency == levels[-1] and g is not best]  # the best may not be the fastest
        if others:
            worst = min(others, key=lambda g: g.rps.median)
            spread = compare_groups(best, worst, "rps")
    missing = ""
    if absent:
        missing = (f"uWSGI layouts and peers were not both measured at {' and '.join(map(str, absent))} "
                   "connections")
    return Alternatives(scenario, levels, matchups, target, spread, worst if spread else None, missing, choices)


# --- memory: what one more process and one more thread cost ---------------------------------

LAYOUT_SIZE_RE = re.compile(r"^(\d+)x(\d+)-")
MEMORY_KEY = "app_pss_mb"


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
    server: str = "uwsgi"  # the app server whose layouts were fitted (servers differ: never mixed)


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


def memory_cost(results: Results, scenario: str, key: str = MEMORY_KEY, server: str = "uwsgi") -> MemoryCost | None:
    """What one more process and one more thread cost in PSS, from the run's layouts of one app
    server (None when fewer than three of its layouts with enough different P and T recorded
    memory)."""
    cells = [c for c in results.cells if c.scenario == scenario and key in c.memory
             and LAYOUT_SIZE_RE.match(c.layout) and "@" not in c.layout and server_of(c.layout) == server]
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
                      Stat.of([f[2] for f in fits]), tuple(x for x in results.layouts if x in used), level, worst,
                      server)


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
