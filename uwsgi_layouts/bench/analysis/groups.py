"""Groups of cells (scenario, layout, level) and how they compare: the run's rule (``rule_of``),
``compare_groups`` (the one function every decision calls), ranking per level and the best with
its runner-up, and how many requests a quotable p99 needs."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from uwsgi_layouts.bench.analysis.tails import (
    MIN_SLOWER_REQUESTS,
    TAIL_QUANTILES,
    Inflight,
    Interval,
    Stat,
    Tails,
    inflight_of,
    percentile_of,
    pooled_tails,
    repeats_interval,
)
from uwsgi_layouts.bench.paired import (
    DEFAULT_MARGIN,
    Comparison,
    Rule,
    compare_rounds,
    compare_unpaired,
    request_weight,
)
from uwsgi_layouts.bench.results import PERCENTILES, STATUS_CLASSES, Cell, Results


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
    def ties_at_p99(self) -> bool:
        """Pooled the requests a quotable p99 needs (``requests_for_p99()``), yet ties at it (latencies
        kept to 4 significant digits from 10 ms, ``bench.load.wrk``) left fewer than MIN_SLOWER_REQUESTS above it."""
        return self.tails.pooled and self.tails.requests >= requests_for_p99() and not self.p99_quotable

    @property
    def p999_quotable(self) -> bool:
        """The repeats' own p99.9 can be quoted: every cell held 10 x ``requests_for_p99()``
        requests (10 above its p99.9)."""
        return self.min_cell_requests >= 10 * requests_for_p99()

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


# Tails sized to this many times requests_to_quote(): ties in a pooled histogram can leave a little
# under 1% of the requests above its p99 (at 1.1 and 3 significant digits, before bench.load.wrk kept
# 4 from 10 ms, five verdict cells of make compare here pooled 1,102-1,139 requests and had 7-9 above
# their p99), and a rate measured in a few short cells can fall short.
TAILS_HEADROOM = 1.2


def requests_to_quote(g: Group) -> int:
    """The pooled requests ``g``'s p99 needs to be quotable: ``requests_for_p99()``, or, where it pooled
    that many and ties at its p99 (latencies kept to 4 significant digits from 10 ms) still left fewer than
    MIN_SLOWER_REQUESTS above it, as many as the share above it seen so far says (none above: ten times as many)."""
    target = requests_for_p99()
    if g.tails is not None and g.ties_at_p99:
        return max(target, math.ceil(MIN_SLOWER_REQUESTS * g.tails.requests / max(g.tails.slower, 1)))
    return target


def tail_seconds(g: Group, more_requests: float = 0.0) -> float:
    """Seconds more of ``g``'s cells, at its median rate, until its pooled p99 is quotable (``TAILS_HEADROOM``
    x ``requests_to_quote``); 0 when it is or cannot be (cells without histograms), inf when it served
    nothing to measure a rate by.
    ``more_requests``: as if it had pooled that many more (rounds still to come)."""
    if g.p99_quotable or (g.tails is not None and not g.tails.pooled):
        return 0.0  # a group without histograms has only each cell's own p99: more rounds pool nothing
    pooled = (g.tails.requests if g.tails is not None else g.requests) + more_requests
    need = math.ceil(requests_to_quote(g) * TAILS_HEADROOM) - pooled
    rate = g.rps.median
    return max(0.0, need / rate) if rate > 0 else math.inf


def tail_advice(g: Group, duration: float | None = None) -> str:
    """``"p99 rests on N slower requests: use --duration X or more --repeats"``, X computed from
    the group's measured rate so that its repeats pool ``requests_to_quote`` requests."""
    repeats = max(1, g.rps.n)
    rate = g.rps.median or 1e-9
    need = requests_to_quote(g)
    seconds = math.ceil(need / (repeats * rate))
    slower = f"{g.tails.slower} slower request" + ("" if g.tails.slower == 1 else "s")
    text = f"p99 rests on {slower}: use --duration {seconds} or more --repeats"
    if duration:
        text += f" (--repeats {math.ceil(need / (duration * rate))} at --duration {duration:g})"
    return text
