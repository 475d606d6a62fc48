"""Choosing a layout: across scenarios (steady state against stalls), and the best uWSGI layout
against the peers (gunicorn, granian) with the targets it is judged by."""

from __future__ import annotations

import enum
import re
import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from uwsgi_layouts.bench.analysis.groups import Group, best_per_level, compare_groups, group_cells, ranked_at_level
from uwsgi_layouts.bench.paired import (
    MIN_ROUNDS,
    Comparison,
)
from uwsgi_layouts.bench.results import Results
from uwsgi_layouts.deploy.model import STRATEGIES

# --- choosing a layout across scenarios (steady state vs stalls) ---------------------------

GOAL_P99_SLACK = 1.10  # within 10% of the best healthy p99, in every scenario and level
GOAL_RPS_OF_MAPPED = 0.95  # "the mapped layout's steady-state throughput", within 5% noise


@dataclass(frozen=True)
class Choice:
    """How one layout fares across every scenario of a run. Each half of the goal is a paired
    comparison against a threshold: met when the ratio's whole interval is on the right side of
    it, missed when the whole interval is on the wrong side, undecided otherwise."""

    layout: str
    p99_vs_best: Mapping[str, float]  # scenario -> worst (over levels) healthy p99 / best layout's p99
    worst_where: str  # "stall at 8 connections"
    steady_rps_vs_mapped: float | None  # worst over steady levels; None when it cannot be computed
    stalled_p99_ms: Mapping[str, float]  # stall scenario -> median over levels of the stalled requests' p99
    # Where the p99 is over the slack beyond noise (the whole interval above it): "stall at 8 connections".
    p99_misses: tuple[str, ...] = ()
    p99_unsure: tuple[str, ...] = ()  # where the interval straddles the slack
    rps_miss: bool = False  # some steady level's throughput ratio to mapped is below the goal beyond noise
    rps_unsure: bool = False  # ... or its interval straddles it
    missing: str = ""  # why the throughput half cannot be checked ("" when it can)

    def __post_init__(self):
        # Read-only copies: a choice is not changed after the analysis made it.
        object.__setattr__(self, "p99_vs_best", MappingProxyType(dict(self.p99_vs_best)))
        object.__setattr__(self, "stalled_p99_ms", MappingProxyType(dict(self.stalled_p99_ms)))

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


class Answer(enum.StrEnum):
    """What the layout choice concludes over every layout (``answer``)."""

    MEETS = "meets"  # some layout meets the goal beyond noise
    CANNOT_BE_CHECKED = "cannot be checked"  # its throughput half has no inputs
    UNDECIDED = "undecided"  # none meets it, some straddle a threshold
    CLOSEST = "closest"  # none meets it: the closest
    NOTHING = "nothing"  # no layouts


@dataclass(frozen=True)
class GoalAnswer:
    """The choice's conclusion: ``named`` (the layouts that meet the goal, are undecided, or the
    one closest: by healthy p99 alone when the goal cannot be checked), ``undecided`` (beside
    layouts that meet it), ``missed`` (missed beyond noise, said when the goal cannot be checked)."""

    answer: Answer
    named: tuple[str, ...] = ()
    undecided: tuple[str, ...] = ()
    missed: tuple[str, ...] = ()

    def __post_init__(self):
        if not isinstance(self.answer, Answer):
            object.__setattr__(self, "answer", Answer(self.answer))
        if (self.answer is Answer.NOTHING) != (not self.named):
            raise ValueError("named: the layouts the answer is about (none only when there are no layouts)")


def goal_answer(choices: list[Choice]) -> GoalAnswer:
    """Which layouts meet the goal; else why not and which comes closest."""
    winners = [c.layout for c in choices if c.meets_goal]
    undecided = [c.layout for c in choices if c.goal == "undecided"]
    unchecked = [c for c in choices if c.goal == "cannot be checked"]
    if winners:
        return GoalAnswer(Answer.MEETS, tuple(winners), tuple(undecided))
    if unchecked:
        best = min(unchecked, key=lambda c: c.worst_p99_ratio)
        return GoalAnswer(Answer.CANNOT_BE_CHECKED, (best.layout,),
                          missed=tuple(c.layout for c in choices if c.goal == "no"))
    if undecided:
        return GoalAnswer(Answer.UNDECIDED, tuple(undecided))
    if choices:
        close = min(choices, key=lambda c: (c.worst_p99_ratio, -(c.steady_rps_vs_mapped or 0)))
        return GoalAnswer(Answer.CLOSEST, (close.layout,))
    return GoalAnswer(Answer.NOTHING)


@dataclass(frozen=True)
class Lowest:
    """The layout with the lowest healthy p99 at a scenario's highest level."""

    scenario: str
    concurrency: int
    layout: str


def lowest_p99(results: Results) -> tuple[Lowest, ...]:
    out = []
    for sc in results.scenarios:
        groups = group_cells(results, sc)
        if groups:
            level = max(g.concurrency for g in groups)
            best = min((g for g in groups if g.concurrency == level), key=lambda g: g.p99)
            out.append(Lowest(sc, level, best.layout))
    return tuple(out)


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

    @property
    def p99(self) -> Comparison | None:
        """The best's p99 against the runner-up's: what puts an equivalent variant ahead."""
        return compare_groups(self.best, self.runner_up, "p99") if self.runner_up is not None else None


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
