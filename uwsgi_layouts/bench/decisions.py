"""The key comparisons: what a run exists to decide, and what a budgeted compare measures until
each is settled (``bench.kinds.closedloop``'s rounds added until decided).

A pair is settled when more rounds would not change what the report says about it: for the
article verdict's pairs (``bench.verdict``), the claim at that level decided (both targets
cleared, or one missed); for the others, the paired comparison decided or equivalent.
"""

from __future__ import annotations

import enum
import math
import statistics
from dataclasses import dataclass

from uwsgi_layouts.bench.analysis import (
    Group,
    alternatives,
    best_and_runner_up,
    compare_groups,
    group_cells,
    rule_of,
    tail_seconds,
)
from uwsgi_layouts.bench.paired import Comparison, compare_rounds
from uwsgi_layouts.bench.results import Results
from uwsgi_layouts.bench.verdict import article_verdict


@dataclass(frozen=True)
class KeyComparison:
    """One comparison a run exists to decide: the article verdict's pair at P or 2P (throughput
    and p99), the best layout at a level against the runner-up (throughput), and with peers each
    peer's best variant against its next (throughput) and the best uWSGI layout against the best
    peer at 2P (the targets, throughput and p99). ``settled``:
    decided or equivalent (no more rounds needed); for the verdict's pairs, the claim at that level
    decided (``bench.verdict``: both targets cleared, or one missed); ``thin``: a p99 of
    either group rests on fewer than MIN_SLOWER_REQUESTS requests above it (more rounds would let it
    be quoted); ``quotes_tails``: the verdict quotes this pair's p99s, so a thin one needs rounds as
    much as an undecided comparison does."""

    kind: str  # "verdict", "best" (vs the runner-up), "variant" (a peer's best variant), "target" (vs the best peer)
    scenario: str
    level: int
    groups: tuple[Group, Group]
    comparisons: tuple[Comparison, ...]
    settled: bool
    quotes_tails: bool = False

    @property
    def layouts(self) -> tuple[str, str]:
        return self.groups[0].layout, self.groups[1].layout

    @property
    def rounds(self) -> int:
        return min(len(g.rounds) or g.rps.n for g in self.groups)

    @property
    def thin(self) -> bool:
        return any(not g.p99_quotable for g in self.groups)

    @property
    def name(self) -> str:
        a, b = self.layouts
        return f"{a} vs {b} at {self.level} connections ({self.scenario})"


def key_comparisons(results: Results) -> list[KeyComparison]:
    """The verdict's pairs (demo runs with the article scenario) first, then, per scenario and
    level, the best layout against the runner-up (a pair already listed is not listed twice)."""
    out: list[KeyComparison] = []
    seen: set[tuple] = set()
    demo = (results.arguments.get("app") or {}).get("demo", True)
    if demo and "article" in results.scenarios:
        for judged in article_verdict(results).levels:
            lv = judged.pair
            # Settled when the claim at this level is decided (holds, or a target is missed): the
            # direction against 1 is the decisions' question and spends no rounds of the verdict's.
            out.append(KeyComparison("verdict", "article", lv.concurrency, (lv.mapped, lv.shared), (lv.rps, lv.p99),
                                     judged.decided, quotes_tails=True))
            seen.add(("article", lv.concurrency, frozenset((lv.mapped.layout, lv.shared.layout))))
    for sc in results.scenarios:
        for level, b in best_and_runner_up(group_cells(results, sc)).items():
            pair = (sc, level, frozenset((b.best.layout, b.runner_up.layout))) if b.runner_up is not None else None
            if pair is None or pair in seen:
                continue
            seen.add(pair)
            out.append(KeyComparison("best", sc, level, (b.best, b.runner_up), (b.rps,), b.settled))
    # With peers: which variant of each peer is its best (what "each peer at its best" rests on), and
    # the best uWSGI layout against the best peer at 2P, settled when each target is met or missed.
    for sc in results.scenarios:
        alt = alternatives(results, sc)
        if alt is None:
            continue
        for c in alt.choices:
            pair = (sc, c.concurrency, frozenset((c.best.layout, c.runner_up.layout))) if c.runner_up else None
            if pair is None or pair in seen:
                continue
            seen.add(pair)
            out.append(KeyComparison("variant", sc, c.concurrency, (c.best, c.runner_up), (c.rps,), c.rps.settled))
        m = alt.target
        if m is not None and (sc, m.concurrency, frozenset((m.uwsgi.layout, m.peer.layout))) not in seen:
            out.append(KeyComparison("target", sc, m.concurrency, (m.uwsgi, m.peer), (m.rps, m.p99), m.settled))
    return out


def next_blocks(keys: list[KeyComparison]) -> dict[str, dict[str, list[int]]]:
    """What the next round added until decided measures: the verdict's undecided levels first (they
    are what a run exists to answer, and a budget rarely holds a round of everything), then every
    other unsettled key comparison, then the thin tails of the rest. The verdict's own thin tails
    are not here: once no verdict level is undecided, they get rounds of their own, sized from the
    observed rates (``tail_blocks``), and those rounds are no look of the claim's."""
    verdict = [k for k in keys if k.kind == "verdict"]
    others = [k for k in keys if k.kind != "verdict"]
    return (extension_blocks([k for k in verdict if not k.settled]) or extension_blocks(others)
            or extension_blocks(others, thin_too=True))


def tail_blocks(keys: list[KeyComparison]) -> dict[str, dict[str, dict[int, float]]]:
    """The verdict's cells whose pooled p99 cannot be quoted yet: layout -> scenario -> level -> the
    seconds more of it (at its observed rate, ``tail_seconds``) that make it quotable. A cell that
    served nothing has no rate to size it by, and is left out."""
    out: dict[str, dict[str, dict[int, float]]] = {}
    for k in keys:
        if k.kind != "verdict":
            continue
        for g in k.groups:
            seconds = tail_seconds(g)
            if 0 < seconds < math.inf:
                out.setdefault(g.layout, {}).setdefault(k.scenario, {})[k.level] = seconds
    return out


def extension_blocks(keys: list[KeyComparison], thin_too: bool = False) -> dict[str, dict[str, list[int]]]:
    """What one more round measures: layout -> scenario -> levels, for every unsettled key
    comparison and every thin pair whose p99s the verdict quotes (with ``thin_too``, also the
    other pairs whose p99 cannot be quoted yet)."""
    out: dict[str, dict[str, list[int]]] = {}
    for k in keys:
        if k.settled and not ((thin_too or k.quotes_tails) and k.thin):
            continue
        for layout in k.layouts:
            levels = out.setdefault(layout, {}).setdefault(k.scenario, [])
            if k.level not in levels:
                levels.append(k.level)
    return {layout: {sc: sorted(lv) for sc, lv in scs.items()} for layout, scs in out.items()}



class Lead(enum.StrEnum):
    """What the layout to run has over its runner-up (``Recommendation.overall``), as stated."""

    NONE = "none"  # no runner-up, or no round measured both: nothing to compare
    AHEAD = "ahead"  # more throughput over the levels, beyond noise
    EQUIVALENT = "equivalent"  # within the margin
    BEHIND = "behind"  # the runner-up had more throughput beyond noise, yet was beaten at more levels
    UNDECIDED = "undecided"  # the interval holds 1: no order between the two
    UNMEASURED = "not measured well enough"  # too few rounds, or an interval too wide to say anything

    @classmethod
    def of(cls, c: Comparison | None) -> "Lead":
        if c is None or not c.rounds:
            return cls.NONE
        if c.outcome == "better":
            return cls.AHEAD
        if c.outcome == "worse":
            return cls.BEHIND
        if c.outcome == "equivalent":
            return cls.EQUIVALENT
        if c.uninformative:
            return cls.UNMEASURED
        return cls.UNDECIDED


@dataclass(frozen=True)
class Recommendation:
    """The one layout to run here, for one scenario, over every level measured (one answer, one
    reason, whatever the level): the layout beaten beyond noise (another had more throughput,
    paired by round) at the fewest levels; among those, the most throughput over the levels (per
    round, the geometric mean of its throughput at each level). ``runner_up``: the next layout
    by the same order; ``overall``: the two's paired comparison of those per-round means, which
    says whether the order between them is decided or within noise."""

    scenario: str
    layout: str
    levels: tuple[int, ...]  # every level measured
    beaten_at: tuple[int, ...]  # the levels where another layout had more throughput beyond noise
    runner_up: str = ""
    runner_up_beaten_at: tuple[int, ...] = ()
    overall: Comparison | None = None  # throughput over the levels, layout / runner_up
    lead: Lead | None = None  # what ``overall`` says, as stated (None: judged from it on creation)

    def __post_init__(self):
        if any(lv not in self.levels for lv in self.beaten_at):
            raise ValueError("beaten_at: must be measured levels")
        if self.overall is not None and not self.runner_up:
            raise ValueError("overall: a comparison needs the runner-up it was made with")
        # A stored lead stays what the run said (the rule may change); it must fit its comparison.
        judged = Lead.of(self.overall)
        lead = judged if self.lead is None else Lead(self.lead)
        if (lead is Lead.NONE) != (judged is Lead.NONE):
            raise ValueError(f"lead: {lead.value} does not fit the runner-up's comparison "
                             f"({'none' if judged is Lead.NONE else 'made'})")
        object.__setattr__(self, "lead", lead)


def recommend(results: Results, scenario: str) -> Recommendation | None:
    """The layout to run for ``scenario`` (None when nothing was measured or served for it)."""
    groups = [g for g in group_cells(results, scenario) if g.requests]  # a layout that served nothing is no answer
    if not groups:
        return None
    levels = tuple(sorted({g.concurrency for g in groups}))
    by_layout: dict[str, dict[int, Group]] = {}
    for g in groups:
        by_layout.setdefault(g.layout, {})[g.concurrency] = g
    most = max(len(x) for x in by_layout.values())
    candidates = {name: x for name, x in by_layout.items() if len(x) == most}  # measured at the most levels
    beaten = {name: tuple(lv for lv, g in sorted(x.items()) if _beaten(g, by_layout)) for name, x in candidates.items()}
    scores = {name: _round_means(x) for name, x in candidates.items()}
    common = set.intersection(*(set(s) for s in scores.values()))
    order = sorted(candidates, key=lambda name: (len(beaten[name]), -_mean(scores[name], common), name))
    best = order[0]
    if len(order) == 1:
        return Recommendation(scenario, best, levels, beaten[best])
    runner = order[1]
    overall = compare_rounds(scores[best], scores[runner], True, "rps", rule_of(results))
    return Recommendation(scenario, best, levels, beaten[best], runner, beaten[runner], overall)


def _beaten(g: Group, by_layout: dict[str, dict[int, Group]]) -> bool:
    """Another layout at ``g``'s level had more throughput beyond noise."""
    return any(h is not g and compare_groups(h, g, "rps").outcome == "better"
               for x in by_layout.values() for h in [x.get(g.concurrency)] if h is not None)


def _round_means(at_levels: dict[int, Group]) -> dict[int, float]:
    """Round -> the geometric mean of the layout's throughput over its levels, for the rounds that
    measured every level (the rounds added for a few levels only are left out)."""
    per_level = [g.per_round.get("rps", {}) for g in at_levels.values()]
    rounds = set.intersection(*(set(x) for x in per_level)) if per_level else set()
    return {r: math.exp(statistics.fmean(math.log(x[r]) for x in per_level))
            for r in sorted(rounds) if all(x[r] > 0 for x in per_level)}


def _mean(scores: dict[int, float], rounds: set[int]) -> float:
    """The geometric mean of ``scores`` over ``rounds`` (over all of them when none is shared)."""
    values = [scores[r] for r in (rounds or scores) if r in scores]
    return math.exp(statistics.fmean(math.log(v) for v in values)) if values else 0.0
