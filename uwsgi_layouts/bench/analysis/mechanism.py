"""What the requests in flight per worker say (the mechanism behind a shared socket's tail),
decided here and rendered by the report as sentences: at which level the layouts' pile-up
differs most, which layout piled up most and least there, whether the one with less also had
the shorter tail (their paired comparison), from which level every layout's workers were full,
and where per-worker totals look even while requests piled up.
"""

from __future__ import annotations

from dataclasses import dataclass

from uwsgi_layouts.bench.analysis.groups import Group, compare_groups
from uwsgi_layouts.bench.paired import Comparison

SATURATED = 0.9  # some worker of every layout had every thread busy at least this share of the time
PILEUP_ALIKE = 0.05  # pile-up shares closer than this are "about the same"
EVEN_TOTALS = 1.25  # busiest / idlest worker's share of requests at most this: the totals look even
PILED_UP = 0.2  # ... while some worker was piled up at least this share of the time


@dataclass(frozen=True)
class Mechanism:
    """One scenario's in-flight reading. At ``level``: ``piled`` (the layout with the most
    pile-up, share ``piled_share``, a worker full ``piled_full`` of the time) against ``calm``
    (the least; the same layout when only one has a figure), ``alike`` when their shares differ
    by less than PILEUP_ALIKE, and ``p99``/``rps``: calm against piled, paired (None with one
    layout). ``saturated_from``: the lowest level from which every layout had a worker full at
    least SATURATED of the time (0: none), ``pileup_after`` the most pile-up from there on."""

    scenario: str
    level: int
    piled: str
    calm: str
    piled_share: float
    calm_share: float
    piled_full: float
    calm_full: float
    alike: bool
    p99: Comparison | None
    rps: Comparison | None
    saturated_from: int
    pileup_after: float | None

    def __post_init__(self):
        if (self.p99 is None) != (self.piled == self.calm):
            raise ValueError("p99: calm against piled, exactly when they are two layouts")
        if not 0 <= self.calm_share <= self.piled_share <= 1:
            raise ValueError(f"calm_share, piled_share: 0 <= calm <= piled <= 1, got {self.calm_share}, "
                             f"{self.piled_share}")


@dataclass(frozen=True)
class EvenTotals:
    """A layout whose per-worker totals (``shares``) look even at ``concurrency`` while a worker
    was piled up ``pileup`` of the time: the totals hide the mechanism (its most piled-up group)."""

    scenario: str
    layout: str
    concurrency: int
    shares: tuple[float, ...]
    pileup: float


def pileup_level(groups: list[Group], processes: int | None) -> int | None:
    """The level a scenario's mechanism is read at: where pile-up differs most between layouts
    (2P on a tie, then the lowest)."""
    with_pile = [g for g in groups if g.inflight and g.inflight.pileup is not None]
    levels = sorted({g.concurrency for g in with_pile})
    if not levels:
        return None

    def gap(level):
        at = [g.inflight.pileup.median for g in with_pile if g.concurrency == level]
        return (round(max(at) - min(at), 2), level == (2 * processes if processes else None), -level)
    return max(levels, key=gap)


def mechanism_of(scenario: str, groups: list[Group], processes: int | None) -> Mechanism | None:
    """The scenario's reading, or None when no group has a pile-up figure."""
    level = pileup_level(groups, processes)
    if level is None:
        return None
    at = [g for g in groups if g.concurrency == level and g.inflight and g.inflight.pileup is not None]
    hi = max(at, key=lambda g: g.inflight.pileup.median)
    lo = min(at, key=lambda g: g.inflight.pileup.median)
    a, b = hi.inflight.pileup.median, lo.inflight.pileup.median
    two = lo is not hi
    layouts = {g.layout for g in groups if g.inflight}
    full_levels = sorted(lv for lv in {g.concurrency for g in groups}
                         if {g.layout for g in groups if g.concurrency == lv and g.inflight
                             and g.inflight.full.median >= SATURATED} == layouts)
    piles = [g.inflight.pileup.median for g in groups if full_levels and g.concurrency >= full_levels[0]
             and g.inflight and g.inflight.pileup is not None]
    return Mechanism(scenario, level, hi.layout, lo.layout, a, b, hi.inflight.full.median, lo.inflight.full.median,
                     a - b < PILEUP_ALIKE, compare_groups(lo, hi, "p99") if two else None,
                     compare_groups(lo, hi, "rps") if two else None, full_levels[0] if full_levels else 0,
                     max(piles) if piles else None)


def even_totals(groups: list[Group]) -> tuple[EvenTotals, ...]:
    """Per layout, the group (most piled up) whose per-worker totals look even (busiest / idlest
    share at most EVEN_TOTALS) while a worker was piled up at least PILED_UP of the time."""
    found: dict[str, Group] = {}
    for g in groups:
        shares = list(g.worker_share.values())
        if (len(shares) > 1 and min(shares) and max(shares) / min(shares) <= EVEN_TOTALS and g.inflight
                and g.inflight.pileup is not None and g.inflight.pileup.median >= PILED_UP):
            cur = found.get(g.layout)
            if cur is None or g.inflight.pileup.median > cur.inflight.pileup.median:
                found[g.layout] = g
    return tuple(EvenTotals(g.scenario, g.layout, g.concurrency, tuple(g.worker_share.values()),
                            g.inflight.pileup.median) for g in found.values())
