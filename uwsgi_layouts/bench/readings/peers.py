"""uWSGI against the peers (gunicorn, granian), judged once, as data: what the compare report's
"against the alternatives" section says, per scenario (``PeerReading``).

``analysis.alternatives`` pairs the best uWSGI layout with each peer's best variant at P and 2P;
here every judgement the section states is taken: who is ahead beyond noise on each figure
(``Side``), how each peer's best variant won (``VariantWin``) and which variants to measure too,
whether the choice of layout or of server moved throughput more (``Matters``), and the targets
against the best peer with their thresholds (``TargetReading``). The report only words them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from uwsgi_layouts.bench.analysis import (
    TARGET_VS_PEER_P99,
    TARGET_VS_PEER_RPS,
    Alternatives,
    Matchup,
    PeerChoice,
    against,
    alternatives,
    server_of,
)
from uwsgi_layouts.bench.paired import Comparison, Direction
from uwsgi_layouts.bench.results import Results
from uwsgi_layouts.bench.verdict import is_demo_run, straddle_words
from uwsgi_layouts.deploy.model import STRATEGIES

TARGET_SCENARIOS = ("article", "io-heavy")  # the demo app's mixes the peers' targets are set for


class Side(enum.StrEnum):
    """Who is ahead on one figure, uWSGI / peer, beyond noise."""

    UWSGI = "uWSGI"
    PEER = "peer"
    EQUIVALENT = "equivalent"
    UNDECIDED = "undecided"
    TOO_FEW = "too few rounds"  # fewer than 2 paired rounds: no interval to judge by

    @classmethod
    def of(cls, c: Comparison) -> "Side":
        if c.method == "too few rounds":
            return cls.TOO_FEW
        return {Direction.BETTER: cls.UWSGI, Direction.WORSE: cls.PEER, Direction.EQUIVALENT: cls.EQUIVALENT}.get(
            c.outcome, cls.UNDECIDED)


class TargetState(enum.StrEnum):
    """A target judged by its paired interval (``analysis.against``)."""

    MET = "met"
    MISSED = "missed"
    UNSURE = "unsure"  # the interval straddles the threshold


class VariantWin(enum.StrEnum):
    """How a peer's best variant came first against its runner-up."""

    ONLY = "only"  # the only variant measured at that level
    BETTER = "better"  # more throughput beyond noise
    SHORTER_P99 = "shorter p99"  # equivalent throughput, a shorter p99 beyond noise
    HIGHER = "higher"  # equivalent throughput: the higher of the two
    UNDECIDED = "undecided"  # neither beaten beyond noise: the higher of the two


class Matters(enum.StrEnum):
    """Which choice moved throughput more beyond noise."""

    LAYOUT = "layout"
    SERVER = "server"
    NEITHER = "neither"

    @classmethod
    def of(cls, layout: Comparison, server: Comparison) -> "Matters":
        """The choice whose paired comparison is decided and the larger (a decided one beats an undecided one)."""
        if layout.decided and (not server.decided or _size(layout) > _size(server)):
            return cls.LAYOUT
        if server.decided and (not layout.decided or _size(server) > _size(layout)):
            return cls.SERVER
        return cls.NEITHER


@dataclass(frozen=True)
class MatchupReading:
    """The best uWSGI layout against one peer's best variant at one level: ratios uWSGI / peer."""

    concurrency: int
    uwsgi: str
    peer: str
    server: str
    rps: Comparison
    p99: Comparison
    rps_side: Side
    p99_side: Side

    @classmethod
    def of(cls, m: Matchup) -> "MatchupReading":
        rps, p99 = m.rps, m.p99
        return cls(m.concurrency, m.uwsgi.layout, m.peer.layout, server_of(m.peer.layout), rps, p99, Side.of(rps),
                   Side.of(p99))


@dataclass(frozen=True)
class TargetReading:
    """One target of the best uWSGI layout against the best peer: its label, threshold, paired
    comparison, state, who is ahead, and the point ratio's margin past the threshold (negative:
    short of it), with whether the point clears it."""

    label: str
    figure: str
    threshold: float
    at_most: bool
    comparison: Comparison
    state: TargetState
    side: Side
    margin: float
    point_clears: bool

    @classmethod
    def of(cls, label: str, figure: str, c: Comparison, threshold: float, at_most: bool) -> "TargetReading":
        """The target judged: its state by the paired interval, who is ahead, the point's margin."""
        clears = c.ratio <= threshold if at_most else c.ratio >= threshold
        margin = threshold - c.ratio if at_most else c.ratio - threshold
        return cls(label, figure, threshold, at_most, c, TargetState(against(c, threshold, at_most)), Side.of(c),
                   margin, clears)

    @property
    def straddle(self) -> str:
        """An undecided target: by how much its interval straddles the threshold (``2% past, 4%
        short``, ``verdict.straddle_words``); "" for a decided one."""
        return straddle_words(self.comparison, self.threshold, self.at_most) if self.state is TargetState.UNSURE \
            else ""


def target_readings(m: Matchup) -> tuple[TargetReading, ...]:
    """Both targets of a matchup: throughput at least ``TARGET_VS_PEER_RPS`` x the peer's, p99 at
    most ``TARGET_VS_PEER_P99`` x."""
    return (TargetReading.of(f"throughput >= {TARGET_VS_PEER_RPS}x the best peer's", "rps", m.rps,
                             TARGET_VS_PEER_RPS, False),
            TargetReading.of(f"p99 <= {TARGET_VS_PEER_P99}x the best peer's", "p99", m.p99, TARGET_VS_PEER_P99, True))


@dataclass(frozen=True)
class TargetMatchup:
    """At 2P: the best uWSGI layout against the best peer, with both targets."""

    concurrency: int
    uwsgi: str
    peer: str
    target_readings: tuple[TargetReading, ...]


@dataclass(frozen=True)
class VariantReading:
    """Which of a peer's measured variants was its best at one level, and how it won."""

    concurrency: int
    server: str
    best: str
    runner_up: str  # "" when only one variant was measured there
    rps: Comparison | None  # best / runner-up
    win: VariantWin

    @classmethod
    def of(cls, c: PeerChoice) -> "VariantReading":
        if c.runner_up is None:
            return cls(c.concurrency, c.server, c.best.layout, "", None, VariantWin.ONLY)
        rps = c.rps
        if rps.outcome is Direction.BETTER:
            win = VariantWin.BETTER
        elif rps.outcome is Direction.EQUIVALENT:
            win = VariantWin.SHORTER_P99 if c.p99.outcome is Direction.BETTER else VariantWin.HIGHER
        else:  # the best is never beaten beyond noise: undecided
            win = VariantWin.UNDECIDED
        return cls(c.concurrency, c.server, c.best.layout, c.runner_up.layout, rps, win)


@dataclass(frozen=True)
class PeerVariants:
    """One peer's measured variants (in the order first measured) and, when only one was measured,
    the others its strategy has, to measure too so that the peer is compared at its best."""

    server: str
    measured: tuple[str, ...]
    to_measure: tuple[str, ...]
    levels: tuple[VariantReading, ...]


@dataclass(frozen=True)
class WhatMatters:
    """At the highest of P and 2P: the best / worst uWSGI layout against the best uWSGI / best peer."""

    concurrency: int
    best_uwsgi: str
    worst_uwsgi: str
    best_peer: str
    layout: Comparison
    server: Comparison
    answer: Matters


@dataclass(frozen=True)
class PeerReading:
    """One scenario's section: the matchups per level and peer, each peer's variants, what matters
    more, and (for the demo app's own requests) the targets against the best peer."""

    scenario: str
    levels: tuple[int, ...]
    missing: str
    matchups: tuple[MatchupReading, ...]
    peers: tuple[str, ...]
    variants: tuple[PeerVariants, ...]
    matters: WhatMatters | None
    target: TargetMatchup | None  # None also where the targets do not apply

    def peer_wins(self, peer: str) -> dict[str, tuple[int, ...]]:
        """"throughput" / "p99" -> the levels where ``peer`` was ahead beyond noise."""
        mine = [m for m in self.matchups if m.server == peer]
        return {"throughput": tuple(m.concurrency for m in mine if m.rps_side is Side.PEER),
                "p99": tuple(m.concurrency for m in mine if m.p99_side is Side.PEER)}


def _size(c: Comparison) -> float:
    return max(c.ratio, 1 / c.ratio) if c.ratio else float("inf")


def what_matters(alt: Alternatives) -> WhatMatters | None:
    if not alt.levels or alt.layout_spread is None:
        return None
    level = alt.levels[-1]
    best = max((m for m in alt.matchups if m.concurrency == level), key=lambda m: m.peer.rps.median)
    layout, server = alt.layout_spread, best.rps
    return WhatMatters(level, best.uwsgi.layout, alt.worst_uwsgi.layout, best.peer.layout, layout, server,
                       Matters.of(layout, server))


def peer_variants(alt: Alternatives, peer: str) -> PeerVariants | None:
    mine = [c for c in alt.choices if c.server == peer]
    if not mine:
        return None
    measured = tuple(dict.fromkeys(v for c in mine for v in c.variants))
    others: tuple[str, ...] = ()
    if len(measured) == 1:
        spec = measured[0].partition("@")[0]
        strategy = STRATEGIES.get(spec.partition("-")[2])
        others = tuple(f"{spec}@{v}" for v in (strategy.variants if strategy else ())
                       if f"{spec}@{v}" not in measured)
    return PeerVariants(peer, measured, others, tuple(VariantReading.of(c) for c in mine))


def peer_reading(results: Results, scenario: str) -> PeerReading | None:
    """The section of one scenario (None: it has no uWSGI layout or no peer). The targets are set
    for the demo app with its own requests (``verdict.is_demo_run``), in ``TARGET_SCENARIOS``."""
    alt = alternatives(results, scenario)
    if alt is None:
        return None
    target = None
    if alt.target is not None and scenario in TARGET_SCENARIOS and is_demo_run(results):
        m = alt.target
        target = TargetMatchup(m.concurrency, m.uwsgi.layout, m.peer.layout, target_readings(m))
    variants = tuple(v for peer in alt.peers if (v := peer_variants(alt, peer)) is not None)
    return PeerReading(scenario, alt.levels, alt.missing, tuple(MatchupReading.of(m) for m in alt.matchups),
                       tuple(alt.peers), variants, what_matters(alt), target)


def peer_readings(results: Results) -> tuple[PeerReading, ...]:
    return tuple(r for sc in results.scenarios if (r := peer_reading(results, sc)) is not None)
