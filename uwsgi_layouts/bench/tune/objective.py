"""The objective ``bench tune`` optimises, how one candidate is judged against it, and the tie rule.

Objective: the highest throughput at the production concurrency N, subject to
  * p99 <= --p99-ms: the pooled p99 of the candidate's healthy requests at N (its repeats'
    latency histograms pooled, ``bench.analysis.pooled_tails``), and under a stall too when one is
    asked for. The decision uses the pooled p99 itself (the point estimate): its 95% interval is
    shown, and a candidate whose interval straddles the limit is marked borderline. Screening
    (dropping a candidate before the last stage) needs the whole interval above the limit.
  * app-server memory <= --memory-mb: the PSS of the server's process tree after load (master
    and workers), median over the repeats;
  * no failed request: wrk's errors (connect, read, write, timeout), answers other than 2xx, and
    failed stalled requests all disqualify.
Deciding (``decide``), on pairs: two candidates are compared through the per-round ratios of
their throughput (``bench.analysis.compare_groups``: interleaved rounds are pairs), which says
"better", "worse", "equivalent" (within the margin, ±5% by default) or "undecided".
  * a candidate another one beat beyond noise is never recommended over it ("beaten");
  * among the rest, the highest median throughput leads, unless it is *unsteady* (its throughput
    spread across rounds more than twice the median spread of the others, and above 10%): then
    the steadiest-ranked candidate it did not beat leads instead, and the unsteady one is
    flagged (a layout that swings is not what users want to deploy; a shared socket's pile-up
    shows up exactly as such swings). An unsteady candidate that beat the others beyond noise
    is still chosen, and flagged;
  * the tie rule applies only among candidates *equivalent* to the leader: less memory (within
    max(1 MB, 2%)), then fewer processes, then fewer threads, then the higher median throughput.
    A candidate merely undecided against the leader is not tied with it: it loses to the leader
    on the median, and the report says the comparison stayed undecided.
Pure functions of ``Group``s: nothing is timed here.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from uwsgi_layouts.bench.analysis import NOISY_SPREAD, Group, Interval, compare_groups, group_of
from uwsgi_layouts.bench.paired import Comparison, Rule
from uwsgi_layouts.bench.results import Cell
from uwsgi_layouts.bench.tune.space import Candidate

MEMORY_TIE_MB = 1.0
MEMORY_TIE_SHARE = 0.02
UNSTEADY_FACTOR = 2.0  # a spread across rounds above this many times the others' median (and above 10%)
UNSTEADY_MIN_ROUNDS = 3


def server_pss(memory: dict) -> float | None:
    """The app server tree's PSS from a cell's (or group's) memory record (``app_pss_mb``, for
    uWSGI and the peers alike: ``Cell`` renames the keys of older records when it is built)."""
    return _value(memory["app_pss_mb"]) if "app_pss_mb" in memory else None


def _value(x) -> float | None:
    if isinstance(x, dict):
        return None
    return float(getattr(x, "median", x))


@dataclass(frozen=True)
class Objective:
    concurrency: int
    p99_ms: float | None = None
    memory_mb: float | None = None
    stall_share: float = 0.0
    stall_ms: int = 0
    server_label: str = "uWSGI"  # whose memory the limit is about, for the words

    def words(self) -> str:
        """The objective in one sentence."""
        limits = []
        if self.p99_ms is not None:
            limits.append(f"p99 <= {self.p99_ms:g} ms")
        if self.memory_mb is not None:
            limits.append(f"<= {self.memory_mb:g} MB of {self.server_label} PSS")
        text = f"highest throughput at {self.concurrency} concurrent requests"
        if limits:
            text += " with " + " and ".join(limits)
        if self.stall_share:
            text += (f", also while {self.stall_share:.0%} of requests stall {self.stall_ms} ms (healthy requests' "
                     "p99 and no errors under the stall)")
        return (text + "; no failed or non-2xx requests; a candidate beaten on paired rounds is never chosen; "
                "ties (throughput equivalent) go to less memory, then fewer processes")


@dataclass(frozen=True)
class Evaluation:
    """One candidate against the objective, from its steady group (and its stall group)."""

    candidate: Candidate
    steady: Group
    stall: Group | None
    memory_mb: float | None
    errors: int  # failed + non-2xx requests, steady and stall, stalled requests included
    misses: tuple[str, ...]  # by the point figures: what the decision uses
    sure_misses: tuple[str, ...]  # beyond noise: what screening drops on
    violation: float  # how far from meeting: max over the limits of measured / limit (<= 1 meets)
    borderline: bool  # a p99 interval straddles the limit

    @property
    def spec(self) -> str:
        return self.candidate.spec

    @property
    def meets(self) -> bool:
        return not self.misses

    @property
    def rps(self) -> Interval:
        return self.steady.throughput

    @property
    def p99(self) -> Interval:
        return self.steady.tails.p99

    @property
    def repeats(self) -> int:
        return self.steady.rps.n

    @property
    def spread(self) -> float:
        """Its throughput's (high - low) / median across its rounds."""
        return self.steady.rps.spread


def evaluate(candidate: Candidate, steady_cells: list[Cell], stall_cells: list[Cell], objective: Objective,
             rule: Rule | None = None) -> Evaluation:
    """``candidate`` judged on its cells at the concurrency: steady ones, and under the stall (if any).
    ``rule``: how its comparisons are judged (the margin and the search's looks)."""
    steady = group_of(steady_cells, rule)
    stall = group_of(stall_cells, rule) if stall_cells else None
    stalled_errors = sum(int(c.extra.get("stalled_errors", 0)) for c in stall_cells)
    misses: list[str] = []
    sure: list[str] = []
    violation = 0.0
    borderline = False
    errors = 0
    for label, group in (("", steady), ("under the stall: ", stall)):
        if group is None:
            continue
        failed = group.errors + group.non_2xx + (stalled_errors if group is stall else 0)
        errors += failed
        if failed:
            text = f"{label}{failed} failed or non-2xx request{'s' if failed > 1 else ''}"
            misses.append(text)
            sure.append(text)
            violation = max(violation, 1 + failed / max(group.requests, 1))
        if objective.p99_ms is not None:
            p99 = group.tails.p99
            ratio = p99.value / objective.p99_ms
            violation = max(violation, ratio)
            text = f"{label}p99 {p99.value:.0f} ms ({p99.low:.0f}–{p99.high:.0f}) > {objective.p99_ms:g} ms"
            if p99.value > objective.p99_ms:
                misses.append(text)
            if p99.low > objective.p99_ms:
                sure.append(text + ", beyond noise")
            if p99.low <= objective.p99_ms < p99.high:
                borderline = True
    memory = max((m for m in (server_pss(g.memory) for g in (steady, stall) if g is not None) if m is not None),
                 default=None)
    if objective.memory_mb is not None and memory is not None:
        violation = max(violation, memory / objective.memory_mb)
        if memory > objective.memory_mb:
            text = f"memory {memory:.1f} MB > {objective.memory_mb:g} MB"
            misses.append(text)
            sure.append(text)
    return Evaluation(candidate, steady, stall, memory, errors, tuple(misses), tuple(sure), violation, borderline)


def by_rank(evaluations: list[Evaluation]) -> list[Evaluation]:
    """Those that meet the objective by median throughput (highest first), then the others by how
    close they come (smallest violation first)."""
    meets = sorted((e for e in evaluations if e.meets), key=lambda e: (-e.rps.value, e.spec))
    others = sorted((e for e in evaluations if not e.meets), key=lambda e: (e.violation, -e.rps.value, e.spec))
    return meets + others


def memory_tolerance(mb: float) -> float:
    return max(MEMORY_TIE_MB, MEMORY_TIE_SHARE * mb)


@dataclass(frozen=True)
class Decision:
    """The choice among evaluated finalists. ``chosen`` None: none meets the objective
    (``closest`` is the nearest miss). ``leader``: the highest median throughput among those that
    meet (the fastest); ``head``: the candidate the tie rule starts from (not beaten, steady);
    ``tied``: ``head`` and those equivalent to it; ``runner_up`` and ``why``: the next best and why
    it lost; ``beaten``: spec -> the spec that beat it beyond noise; ``unsteady``: flagged specs."""

    chosen: Evaluation | None
    closest: Evaluation | None
    tied: tuple[Evaluation, ...]
    leader: Evaluation | None
    runner_up: Evaluation | None
    why: str
    order: tuple[Evaluation, ...]  # every finalist, best first
    head: Evaluation | None = None
    beaten: dict[str, str] = field(default_factory=dict)
    unsteady: tuple[str, ...] = ()


def tie_key(e: Evaluation, least_memory: float) -> tuple:
    """Within the tie: memory within tolerance of the least counts as least; then fewer
    processes, fewer threads, higher throughput."""
    heavier = e.memory_mb is not None and e.memory_mb > least_memory + memory_tolerance(least_memory)
    return (heavier, e.memory_mb if heavier else 0.0, e.candidate.processes, e.candidate.threads, -e.rps.value,
            e.spec)


def unsteady(e: Evaluation, others: list[Evaluation]) -> bool:
    """Its throughput spread across rounds is far wider than the others': above UNSTEADY_FACTOR x
    their median spread and above NOISY_SPREAD (each with at least UNSTEADY_MIN_ROUNDS rounds)."""
    if e.repeats < UNSTEADY_MIN_ROUNDS:
        return False
    spreads = [o.spread for o in others if o is not e and o.repeats >= UNSTEADY_MIN_ROUNDS]
    return bool(spreads) and e.spread > max(NOISY_SPREAD, UNSTEADY_FACTOR * statistics.median(spreads))


def decide(evaluations: list[Evaluation]) -> Decision:
    ranked = by_rank(evaluations)
    meets = [e for e in ranked if e.meets]
    if not meets:
        closest = ranked[0] if ranked else None
        return Decision(None, closest, (), None, None, "no candidate meets the objective", tuple(ranked))
    beaten: dict[str, str] = {}
    for e in meets:
        beater = next((f for f in meets if f is not e and rps_comparison(f, e).outcome == "better"), None)
        if beater is not None:
            beaten[e.spec] = beater.spec
    contenders = [e for e in meets if e.spec not in beaten] or meets
    flagged = tuple(e.spec for e in meets if unsteady(e, meets))
    steady = [e for e in contenders if e.spec not in flagged]
    head = steady[0] if steady else contenders[0]
    tied = [head] + [e for e in contenders if e is not head and e.spec not in flagged
                     and rps_comparison(e, head).outcome == "equivalent"]
    least = min((e.memory_mb for e in tied if e.memory_mb is not None), default=0.0)
    tied.sort(key=lambda e: tie_key(e, least))
    chosen = tied[0]
    rest = tied[1:] + [e for e in contenders if e not in tied] + [e for e in meets if e not in contenders] + \
        [e for e in ranked if not e.meets]
    runner_up = rest[0] if rest else None
    decision = Decision(chosen, chosen, tuple(tied), meets[0], runner_up, "", (chosen, *rest), head, beaten, flagged)
    why = why_lost(runner_up, decision) if runner_up else "no other candidate reached the last stage"
    return Decision(chosen, chosen, tuple(tied), meets[0], runner_up, why, (chosen, *rest), head, beaten, flagged)


def rps_comparison(a: Evaluation, b: Evaluation) -> Comparison:
    return compare_groups(a.steady, b.steady, "rps")


def why_lost(loser: Evaluation, decision: Decision) -> str:
    """One line: why ``loser`` was not chosen over ``decision.chosen``."""
    chosen, tied = decision.chosen, list(decision.tied)
    if not loser.meets:
        return "misses the objective: " + "; ".join(loser.misses)
    ratio = rps_comparison(loser, chosen)
    if loser.spec in decision.beaten:
        by = decision.beaten[loser.spec]
        against = ratio if by == chosen.spec else None
        return (f"lower throughput beyond noise: {against.describe()} of {chosen.spec}'s" if against is not None else
                f"lower throughput beyond noise than {by} (paired rounds), which the choice did not lose to")
    if loser.spec in decision.unsteady:
        spreads = [e.spread for e in decision.order if e is not loser and e.repeats >= UNSTEADY_MIN_ROUNDS]
        others = f" (the others' median {statistics.median(spreads):.0%})" if spreads else ""
        return (f"unsteady: its throughput spread {loser.spread:.0%} across its {loser.repeats} rounds, far wider "
                f"than the others'{others}; not recommended over {chosen.spec}, which it did not beat beyond noise "
                f"({ratio.describe()})")
    if loser not in tied:
        return (f"not beaten, but not equivalent either: {ratio.describe()} of {chosen.spec}'s; {chosen.spec} "
                + ("has the higher median throughput" if loser.rps.value <= decision.head.rps.value else
                   "is steadier") + " (more rounds may separate them: a larger --budget)")
    least = min((t.memory_mb for t in tied if t.memory_mb is not None), default=0.0)
    mem_l, mem_c = loser.memory_mb, chosen.memory_mb
    if mem_l is not None and mem_c is not None and mem_l > least + memory_tolerance(least):
        return (f"equivalent on throughput ({ratio.describe()}) and uses more memory: {mem_l:.1f} vs "
                f"{mem_c:.1f} MB")
    if loser.candidate.processes > chosen.candidate.processes:
        return (f"equivalent on throughput ({ratio.describe()}) and memory (within "
                f"{memory_tolerance(least):.1f} MB), with more processes: {loser.candidate.processes} vs "
                f"{chosen.candidate.processes}")
    if loser.candidate.threads > chosen.candidate.threads:
        return (f"equivalent on throughput ({ratio.describe()}), memory and processes, with more threads: "
                f"{loser.candidate.threads} vs {chosen.candidate.threads}")
    return f"equivalent on throughput ({ratio.describe()}), memory, processes and threads; lower median throughput"
