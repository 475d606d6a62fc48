"""The article's claim, judged: each target's paired interval against its threshold, and the verdict.

The claim: ``PxT-mapped`` (one socket per worker, nginx least_conn) has at least
``TARGET_RPS_RATIO`` (1.25x) the throughput and at most ``TARGET_P99_RATIO`` (0.70x) the p99 of
``PxT-shared`` (one shared socket), at P and at 2P connections, P being the processes. Each
(level, target) is one ``TargetJudgement``: the paired comparison's interval (``bench.paired``, at
the run's one confidence level) either clears the threshold (the whole interval on the claimed
side), misses it (the whole interval on the other side) or straddles it (more rounds could still
tip it). At each level the claim is a conjunction (``combine``): it holds when both targets
clear, does not hold as soon as one is missed (the other may still straddle), and is undecided
otherwise (nothing missed, something straddles: it says by how much). The ``Verdict`` combines
the levels (``combine_levels``): holds (at P and 2P), holds in part (at one, not at the other),
does not hold (at some level, and holds at none) or undecided. The run's own
checks (the mapped layout's efficiency, zero errors) are judged alongside but are not the claim.

The verdict line, the headline and the target table all render this one object, so they cannot
disagree. Whether mapped is better than shared at all (the direction: better, worse, equivalent
against 1) is another question, the decisions' (``ClaimAtLevel.outcome``): a run can show mapped
better beyond noise (1.03x, 1.01-1.06) while the claim of 1.25x plainly does not hold.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

from uwsgi_layouts.bench.analysis import (
    Group,
    compare_groups,
    group_cells,
    group_of,
    requests_for_p99,
    rule_of,
    tail_advice,
)
from uwsgi_layouts.bench.paired import MIN_ROUNDS, UNPAIRED_MIN, Comparison, Direction, percent
from uwsgi_layouts.bench.results import Results

ARTICLE = "article"  # the scenario whose request is the article's
TARGET_RPS_RATIO = 1.25  # mapped / shared throughput, at least
TARGET_P99_RATIO = 0.70  # mapped / shared p99, at most
TARGET_EFFICIENCY = 0.85  # mapped, at least (a check of the run, not the article's claim)
# A miss or a straddle is described by how far the interval's nearer end lies from the threshold,
# as a share of it: beyond FAR it is "far", within NEAR "just".
FAR, NEAR = 0.10, 0.03


TARGET_FIGURES = ("rps", "p99", "efficiency", "errors")
# A field with this metadata is held in memory only: ``bench.summary`` does not store it.
IN_MEMORY = {"stored": False}


class Standing(enum.Enum):
    """One interval against one threshold."""

    CLEARS = "clears"
    MISSES = "misses"
    STRADDLES = "straddles"


class PairDirection(enum.StrEnum):
    """Mapped against shared at one level, both figures together (the decisions' question, not
    the claim's): more throughput and a lower p99 beyond noise, either worse, neither worse with
    one equivalent, or measure more."""

    HOLDS = "holds"
    FAILS = "fails"
    NO_DIFFERENCE = "no difference"
    UNDECIDED = "undecided"


def pair_direction(rps: Comparison, p99: Comparison) -> PairDirection:
    """Mapped against shared on both figures (``PairDirection``)."""
    outcomes = (rps.outcome, p99.outcome)
    if Direction.WORSE in outcomes:
        return PairDirection.FAILS
    if outcomes == (Direction.BETTER, Direction.BETTER):
        return PairDirection.HOLDS
    if Direction.EQUIVALENT in outcomes and Direction.UNDECIDED not in outcomes:
        return PairDirection.NO_DIFFERENCE
    return PairDirection.UNDECIDED


class Outcome(enum.Enum):
    """The claim's verdict, for one level or for the run."""

    HOLDS = "holds"
    DOES_NOT_HOLD = "does not hold"
    PARTLY = "holds in part"
    UNDECIDED = "undecided"
    CANNOT_BE_CHECKED = "cannot be checked"


def standing_of(low: float, high: float, threshold: float, at_most: bool) -> Standing:
    """Where the interval [low, high] lies against ``threshold`` (the claim: at most, or at least, it)."""
    if low > high:
        raise ValueError(f"interval: low {low} above high {high}")
    cleared, missed = (high <= threshold, low > threshold) if at_most else (low >= threshold, high < threshold)
    return Standing.CLEARS if cleared else Standing.MISSES if missed else Standing.STRADDLES


# How an undecided target says by how much it straddles (``straddle_words``, ``TargetJudgement.how_far``).
TOO_FEW = "too few rounds"
TOO_WIDE = "too wide to say by how much"


def reach(low: float, high: float, threshold: float, at_most: bool) -> tuple[float, float]:
    """How far [low, high] reaches on the claimed side of ``threshold`` and on the other, each as
    a share of it (``(0.03, 0.10)``: 3% past it, 10% short of it)."""
    t = threshold or 1.0
    if at_most:
        return max(0.0, (t - low) / t), max(0.0, (high - t) / t)
    return max(0.0, (high - t) / t), max(0.0, (t - low) / t)


def _reach_words(reached: tuple[float, float]) -> str:
    past, short = reached
    return f"{_share(past)} past, {_share(short)} short"


def straddle_words(c: Comparison, threshold: float, at_most: bool) -> str:
    """By how much a target left undecided (``analysis.against``: its interval straddles the
    threshold, or too few rounds) straddles it: ``4% past, 10% short``; ``too wide to say by how
    much`` (``Comparison.uninformative``); ``too few rounds`` (an open interval, or paired rounds
    fewer than MIN_ROUNDS). ValueError for a decided one."""
    if c.method == "too few rounds" or math.isinf(c.high) or (c.method != "unpaired" and c.rounds < MIN_ROUNDS):
        return TOO_FEW
    if standing_of(c.low, c.high, threshold, at_most) is not Standing.STRADDLES:
        raise ValueError(f"{c.text()} against {threshold:g} is decided: it does not straddle it")
    return TOO_WIDE if c.uninformative else _reach_words(reach(c.low, c.high, threshold, at_most))


def combine(standings) -> Outcome:
    """The claim at one level, a conjunction of its targets: it does not hold as soon as one
    target is missed (whatever the others do: the claim needs both), it holds when every target
    cleared, else it is undecided (nothing missed, something straddles)."""
    s = set(standings)
    if not s:
        return Outcome.CANNOT_BE_CHECKED
    if Standing.MISSES in s:
        return Outcome.DOES_NOT_HOLD
    return Outcome.HOLDS if s == {Standing.CLEARS} else Outcome.UNDECIDED


def combine_levels(outcomes) -> Outcome:
    """The claim over its levels (P and 2P): it holds when it holds at every level, holds in part
    when it holds at some and does not hold at others, does not hold when it does not hold at some
    level and holds at none (an undecided level cannot rescue a claim made for every level), else
    it is undecided."""
    s = set(outcomes)
    if not s:
        return Outcome.CANNOT_BE_CHECKED
    if s == {Outcome.HOLDS}:
        return Outcome.HOLDS
    if Outcome.DOES_NOT_HOLD in s:
        return Outcome.PARTLY if Outcome.HOLDS in s else Outcome.DOES_NOT_HOLD
    return Outcome.UNDECIDED


@dataclass(frozen=True)
class TargetJudgement:
    """One target at one level: the measured point with its interval against the threshold.
    ``claim``: part of the article's claim (the ratios); else a check of the run (efficiency,
    errors: a point, low = high). ``comparison``: the paired comparison behind a ratio."""

    concurrency: int
    figure: str  # "rps", "p99", "efficiency", "errors"
    threshold: float
    at_most: bool
    value: float
    low: float
    high: float
    standing: Standing
    claim: bool
    comparison: Comparison | None = None

    def __post_init__(self):
        if self.figure not in TARGET_FIGURES:
            raise ValueError(f"figure: must be one of {', '.join(TARGET_FIGURES)}, got {self.figure!r}")
        if not isinstance(self.standing, Standing):
            raise ValueError(f"standing: must be a Standing, got {self.standing!r}")
        if self.claim and self.comparison is None:
            raise ValueError("comparison: a target of the claim is judged by its paired comparison")
        # An open interval (high infinite: too few rounds to judge) straddles by definition; any
        # other standing is the interval's, so a stored judgement cannot contradict its figures.
        if not math.isinf(self.high) and self.standing is not standing_of(self.low, self.high, self.threshold,
                                                                           self.at_most):
            raise ValueError(f"standing: {self.low:g}–{self.high:g} against {self.threshold:g} "
                             f"{'at most' if self.at_most else 'at least'} is not {self.standing.value}")

    @property
    def label(self) -> str:
        """``throughput >= 1.25x shared``: the target as the tables name it."""
        sign = "<=" if self.at_most else ">="
        if self.figure in ("rps", "p99"):
            return f"{'throughput' if self.figure == 'rps' else 'p99'} {sign} {self.threshold:g}x shared"
        return f"efficiency {sign} {self.threshold:g}" if self.figure == "efficiency" else "zero errors"

    @property
    def measured(self) -> str:
        """``1.03x (1.00–1.07)``, ``0.91``, ``0 failed``."""
        if self.comparison is not None:
            return self.comparison.text()
        return f"{self.value:.2f}" if self.figure == "efficiency" else f"{self.value:g} failed"

    @property
    def unjudged(self) -> bool:
        """Too few rounds for an interval (or, unpaired, for an interval of the claim: its high end
        open): a straddle with nothing to say by how much."""
        return self.comparison is not None and (self.comparison.method == "too few rounds" or math.isinf(self.high))

    @property
    def too_wide(self) -> bool:
        """A straddle whose interval is too wide to say by how much (``Comparison.uninformative``): its
        reach would read "99% past, 37046% short"."""
        return self.standing is Standing.STRADDLES and self.comparison is not None and self.comparison.uninformative

    @property
    def how_far(self) -> str:
        """A straddle, said as the target table and the headline say it: ``too few rounds``, ``too
        wide to say by how much`` or ``4% past, 10% short`` (``straddle_words``'s words)."""
        return TOO_FEW if self.unjudged else TOO_WIDE if self.too_wide else _reach_words(self.reach)

    @property
    def nearer_end(self) -> float:
        """The end of a cleared or missed interval nearer the threshold."""
        return self.high if (self.standing is Standing.MISSES) != self.at_most else self.low

    @property
    def gap(self) -> float:
        """How far the interval's nearer end lies from the threshold, as a share of it (0 for a
        straddle); for a straddle see ``reach``."""
        if self.standing is Standing.STRADDLES or not self.threshold:
            return 0.0
        return abs(self.nearer_end - self.threshold) / self.threshold

    @property
    def reach(self) -> tuple[float, float]:
        """For a straddle: how far the interval reaches on the claimed side and on the other,
        each as a share of the threshold (``(0.03, 0.10)``: 3% past it, 10% short of it)."""
        return reach(self.low, self.high, self.threshold, self.at_most)

    @property
    def side(self) -> str:
        """``far below``, ``above``, ``just above``: where a cleared or missed interval lies."""
        side = ("above" if self.at_most else "below") if self.standing is Standing.MISSES else \
            ("below" if self.at_most else "above")
        return ("far " if self.gap > FAR else "just " if self.gap < NEAR else "") + side

    def words(self) -> str:
        """``1.03x (1.00–1.07): misses it, far below the 1.25x claimed``; a check: ``0.91: meets it,
        above 0.85``."""
        what = f"the {self.threshold:g}x claimed" if self.claim else f"{self.threshold:g}"
        if self.figure == "errors":
            return "no failed requests" if self.standing is Standing.CLEARS else f"{self.value:g} failed requests"
        if self.unjudged:
            return f"{self.measured}: too few rounds to judge against {what}"
        if self.too_wide:
            return f"{self.measured}: straddles {what} (an interval too wide to say by how much)"
        if self.standing is Standing.STRADDLES:
            past, short = self.reach
            return (f"{self.measured}: straddles {what} (the interval reaches {_share(past)} past it and "
                    f"{_share(short)} short of it)")
        verb = "meets" if self.standing is Standing.CLEARS else "misses"
        return f"{self.measured}: {verb} it, {self.side} {what}"

    def judged(self) -> str:
        """The target table's cell: ``misses: far below by 0.18``, ``straddles: 4% past, 10% short``."""
        if self.unjudged or self.standing is Standing.STRADDLES:
            return f"straddles: {self.how_far}"
        if self.figure == "errors":
            return self.standing.value
        return f"{self.standing.value}: {self.side} by {abs(self.nearer_end - self.threshold):.2f}"

    def brief(self) -> str:
        """``1.03x (1.00–1.07) far below 1.25x``, ``1.21x (1.13–1.30) straddles 1.25x (4% past, 10% short)``."""
        if self.unjudged:
            return f"{self.measured}: {TOO_FEW}"
        if self.standing is Standing.STRADDLES:
            return f"{self.measured} straddles {self.threshold:g}x ({self.how_far})"
        return f"{self.measured} {self.side} {self.threshold:g}x"


def _share(x: float) -> str:
    """``10%``; below 1%, one decimal (``0.4%``), so that a sliver past a threshold does not read 0%."""
    return f"{x:.1%}" if 0 < x < 0.01 else f"{x:.0%}"


@dataclass(frozen=True)
class ClaimAtLevel:
    """mapped against shared at one level, on throughput and p99, each a paired comparison; its
    ``outcome`` is the direction (the decisions' question), not the claim's verdict.
    ``shared``/``mapped``: every round (their pooled tails, the efficiency); ``judged``: (mapped,
    shared) over the rounds the claim was judged on, when a budgeted run fixed them (the look that
    decided the level, or the last look of the rounds added until decided: the rounds measured after
    it, for the tails, are no look of the claim's; ``judged_through``)."""

    concurrency: int
    shared: Group
    mapped: Group
    judged: tuple[Group, Group] | None = None

    @property
    def rps(self) -> Comparison:
        """mapped vs shared throughput, paired by round."""
        return compare_groups(*(self.judged or (self.mapped, self.shared)), "rps")

    @property
    def p99(self) -> Comparison:
        """mapped vs shared p99 (each round's own), paired by round."""
        return compare_groups(*(self.judged or (self.mapped, self.shared)), "p99")

    @property
    def outcome(self) -> PairDirection:
        """The direction: "holds" (more throughput and a lower p99, both beyond noise), "fails"
        (either one worse beyond noise), "no difference" (neither worse, one equivalent) or
        "undecided" (measure more)."""
        return pair_direction(self.rps, self.p99)

    @property
    def settled(self) -> bool:
        return self.outcome is not PairDirection.UNDECIDED

    def cautions(self) -> tuple[str, ...]:
        """Why a figure may not be trusted: noisy groups, a thin pooled tail."""
        groups = (self.mapped, self.shared)
        return tuple([f"{g.layout} is noisy here ({', '.join(g.noisy_figures)})" for g in groups if g.noisy_figures]
                     + [f"{g.layout}: {tail_advice(g)}" for g in groups if not g.p99_quotable and g.tails.pooled])

    def judgements(self) -> tuple[TargetJudgement, ...]:
        """The claim's two targets, then the run's two checks, at this level."""
        out = []
        for figure, threshold, at_most in (("rps", TARGET_RPS_RATIO, False), ("p99", TARGET_P99_RATIO, True)):
            c = self.rps if figure == "rps" else self.p99
            # An interval with a level behind it: a paired t interval, or unpaired cells enough for their
            # cross-ratio range to decide (fewer: that range can be a single point, which clears nothing).
            judged = c.method == "t" or (c.method == "unpaired" and c.rounds >= UNPAIRED_MIN)
            standing = standing_of(c.low, c.high, threshold, at_most) if judged else Standing.STRADDLES
            out.append(TargetJudgement(self.concurrency, figure, threshold, at_most, c.ratio, c.low,
                                       c.high if judged else float("inf"), standing, True, c))
        eff = self.mapped.efficiency.median
        out.append(TargetJudgement(self.concurrency, "efficiency", TARGET_EFFICIENCY, False, eff, eff, eff,
                                   standing_of(eff, eff, TARGET_EFFICIENCY, False), False))
        errors = float(self.mapped.errors + self.shared.errors)
        out.append(TargetJudgement(self.concurrency, "errors", 0.0, True, errors, errors, errors,
                                   standing_of(errors, errors, 0.0, True), False))
        return tuple(out)


@dataclass(frozen=True)
class TailCount:
    """A verdict group's pooled tail: how many requests it pooled, whether its p99 can be quoted,
    and whether it pooled the requests a p99 needs yet ties at it (latencies kept to 4 significant digits from
    10 ms) left fewer than MIN_SLOWER_REQUESTS above it (``ties``; absent from older summaries: False)."""

    layout: str
    requests: int
    quotable: bool
    ties: bool = False

    def __post_init__(self):
        if self.requests < 0:
            raise ValueError(f"requests: must be 0 or more, got {self.requests}")
        if self.ties and (self.quotable or self.requests < requests_for_p99()):
            raise ValueError(f"ties: only a tail that pooled {requests_for_p99():,} requests or more and cannot be "
                             "quoted has ties to blame")

    @classmethod
    def of(cls, g: Group) -> "TailCount":
        return cls(g.layout, g.requests, g.p99_quotable, g.ties_at_p99)


@dataclass(frozen=True)
class LevelJudgement:
    """The claim at one level: every target's judgement, the two paired comparisons behind them
    with their direction, the verdict groups' tails (mapped, then shared) and the cautions. Built
    from the pair (``of``); stored and loaded without it (``pair`` None), since every view reads
    only what is decided here."""

    concurrency: int
    targets: tuple[TargetJudgement, ...]
    rps: Comparison
    p99: Comparison
    direction: PairDirection
    tails: tuple[TailCount, ...]
    cautions: tuple[str, ...] = ()
    pair: ClaimAtLevel | None = field(default=None, compare=False, repr=False, metadata=IN_MEMORY)

    def __post_init__(self):
        if any(t.concurrency != self.concurrency for t in self.targets):
            raise ValueError(f"targets: every target must be at {self.concurrency} connections")
        if (self.rps.figure, self.p99.figure) != ("rps", "p99"):
            raise ValueError(f"rps, p99: comparisons of rps and p99, got {self.rps.figure} and {self.p99.figure}")
        if self.direction != pair_direction(self.rps, self.p99):
            raise ValueError(f"direction: the comparisons say {pair_direction(self.rps, self.p99).value}, "
                             f"not {PairDirection(self.direction).value}")
        if len(self.tails) != 2:
            raise ValueError(f"tails: the mapped and the shared group's, got {len(self.tails)}")

    @classmethod
    def of(cls, pair: ClaimAtLevel) -> "LevelJudgement":
        tails = tuple(TailCount.of(g) for g in (pair.mapped, pair.shared))
        return cls(pair.concurrency, pair.judgements(), pair.rps, pair.p99, pair.outcome, tails, pair.cautions(),
                   pair)

    @property
    def claim_targets(self) -> tuple[TargetJudgement, ...]:
        return tuple(t for t in self.targets if t.claim)

    @property
    def outcome(self) -> Outcome:
        return combine(t.standing for t in self.claim_targets)

    @property
    def straddles(self) -> bool:
        """Some target of the claim straddles its threshold: more rounds could decide it."""
        return any(t.standing is Standing.STRADDLES for t in self.claim_targets)

    @property
    def decided(self) -> bool:
        """The claim at this level holds or does not hold: more rounds would not change the
        verdict (a straddling target beside a missed one cannot rescue the level)."""
        return self.outcome in (Outcome.HOLDS, Outcome.DOES_NOT_HOLD)


@dataclass(frozen=True)
class Verdict:
    """The article's claim in this run: per level (P, then 2P) and over both. ``missing``: why a
    level (or the whole check) could not be made; ``confidence``: the level of every interval."""

    levels: tuple[LevelJudgement, ...]
    mapped: str = ""
    shared: str = ""
    processes: int = 0
    missing: str = ""
    confidence: float = 0.0

    def __post_init__(self):
        if not self.levels and not self.missing:
            raise ValueError("missing: a verdict without levels must say why")

    @property
    def targets(self) -> tuple[TargetJudgement, ...]:
        """Every judgement, level by level: the rows of the target table."""
        return tuple(t for lv in self.levels for t in lv.targets)

    @property
    def outcome(self) -> Outcome:
        """Over every level's claim targets; with a level missing, a claim that held where it was
        measured holds only in part (half a check is not a reproduction)."""
        if not self.levels:
            return Outcome.CANNOT_BE_CHECKED
        out = combine_levels(lv.outcome for lv in self.levels)
        return Outcome.PARTLY if self.missing and out is Outcome.HOLDS else out

    @property
    def rounds(self) -> tuple[int, ...]:
        """The paired rounds the claim's comparisons rest on, each count once, ascending."""
        return tuple(sorted({t.comparison.rounds for t in self.targets if t.comparison is not None}))

    def level_name(self, concurrency: int) -> str:
        """``P`` or ``2P`` (``""`` for another level)."""
        return {self.processes: "P", 2 * self.processes: "2P"}.get(concurrency, "") if self.processes else ""


def app_record(results: Results) -> dict:
    app = results.arguments.get("app")
    return app if isinstance(app, dict) else {}


def mixes(results: Results) -> dict[str, dict]:
    """Scenario -> its recorded request mix, for scenarios that sent the user's requests."""
    out = {}
    for name, data in results.workload.items():
        if isinstance(data, dict) and isinstance(data.get("traffic"), dict):
            out[name] = data["traffic"]
    return out


def is_demo_run(results: Results) -> bool:
    """The demo app with its own requests: the article's verdict applies (it is about the demo app's
    request, not the user's)."""
    return app_record(results).get("demo", True) is not False and not mixes(results)


def article_verdict(results: Results, scenario: str = ARTICLE) -> Verdict:
    """Does ``PxT-mapped`` reach the claim against ``PxT-shared`` at P and 2P connections?"""
    p, t = results.arguments.get("processes"), results.arguments.get("threads")
    confidence = rule_of(results).confidence
    if not p or not t:
        return Verdict((), missing="the run does not record processes/threads", confidence=confidence)
    shared_name, mapped_name = f"{p}x{t}-shared", f"{p}x{t}-mapped"
    if scenario not in results.scenarios:
        have = ", ".join(results.scenarios) or "none"
        return Verdict((), mapped_name, shared_name, p, f"this run has no '{scenario}' scenario (scenarios: {have})",
                       confidence)
    groups = {(g.layout, g.concurrency): g for g in group_cells(results, scenario)}
    through = judged_through(results)
    levels, absent = [], []
    for level in (p, 2 * p):
        s, m = groups.get((shared_name, level)), groups.get((mapped_name, level))
        if s is None or m is None:
            absent.append(level)
            continue
        judged = None
        if level in through:
            cut = [[c for c in results.cells if c.scenario == scenario and c.layout == name and c.concurrency == level
                    and c.round is not None and c.round <= through[level]] for name in (mapped_name, shared_name)]
            judged = tuple(group_of(cells, rule_of(results)) for cells in cut) if all(cut) else None
        levels.append(LevelJudgement.of(ClaimAtLevel(level, s, m, judged)))
    missing = ""
    if absent:
        missing = (f"{shared_name} and {mapped_name} were not both measured at "
                   f"{' and '.join(map(str, absent))} connections")
    return Verdict(tuple(levels), mapped_name, shared_name, p, missing, confidence)


def judged_through(results: Results) -> dict[int, int]:
    """Level -> the last round the claim at that level was judged on, as a budgeted run recorded it
    (``until_decided.judged_through``): the rounds after it measured the verdict's tails only. {}
    for a run without (every round is judged)."""
    state = results.arguments.get("until_decided") or {}
    raw = state.get("judged_through") if isinstance(state, dict) else None
    return {int(level): int(r) for level, r in (raw or {}).items()}


def confidence_words(v: Verdict) -> str:
    """``95% confidence for all looks together, paired over 3 and 5 rounds``: the level is the
    run's, split over the looks at the rounds (Bonferroni), so each interval is wider than 95%."""
    if any(t.comparison is not None and not t.comparison.paired for t in v.targets):
        return f"conservative unpaired intervals (the cells record no rounds), {percent(v.confidence)} otherwise"
    counts = [str(n) for n in v.rounds]
    rounds = counts[0] if len(counts) == 1 else ", ".join(counts[:-1]) + " and " + counts[-1]
    return (f"{percent(v.confidence)} confidence for all looks together, paired over {rounds} rounds" if counts
            else percent(v.confidence))
