"""The compare report's "against the alternatives" section: the best uWSGI layout against each
peer (gunicorn, granian) at its best measured variant (``2x4-gunicorn`` or
``2x4-gunicorn@keepalive=off``...: which one won, and how, is said), at P and 2P connections.

It words what ``bench.readings.peers`` judged (``Summary.peers``): every ratio is uWSGI / peer,
paired by round, throughput and each round's p99, with the interval of their per-round ratios;
"equivalent" within the margin, "undecided" where the interval straddles 1 (no winner named).
Where a peer wins, it says by how much. For the demo app's article request the targets at 2P
(the best uWSGI layout against the best peer) are shown as judged, pass or MISS with the margin;
per scenario, one sentence says whether the choice of layout or of server moved throughput more.
The medians and ranges in the tables are the measured groups' (from the results). Lines only;
nothing prints, nothing is judged here.
"""

from __future__ import annotations

from uwsgi_layouts.bench.analysis import Group, group_cells
from uwsgi_layouts.bench.paired import Comparison
from uwsgi_layouts.bench.readings import (
    TARGET_SCENARIOS,
    Matters,
    PeerReading,
    PeerVariants,
    Side,
    TargetMatchup,
    TargetReading,
    TargetState,
    VariantWin,
    peer_readings,
    target_readings,
)
from uwsgi_layouts.bench.report.text import fmt_stat, md_table, num, quoted_p99, quoted_p99_interval, table, wrap
from uwsgi_layouts.bench.results import Results
from uwsgi_layouts.bench.summary import Summary

NOTE = ("Ratios are the best uWSGI layout's figure over each peer's best variant (the best at that level: not "
        "beaten on throughput beyond noise, then the highest), paired by round: the geometric mean of the per-round "
        "ratios of throughput and of each round's p99, with their interval (a t interval on the log ratios at the "
        "run's one confidence level). Equivalent: the interval lies within the margin; undecided: it straddles 1: "
        "no winner.")


def _level(results: Results, level: int) -> str:
    p = results.arguments.get("processes")
    return " (P)" if level == p else " (2P)" if p and level == 2 * p else ""


def figure_text(c: Comparison, figure: str, side: Side, peer: str) -> str:
    """``"1.12x (1.01–1.25) its throughput (uWSGI ahead by 12%)"``, honest in either direction."""
    what = "its throughput" if figure == "rps" else "its p99"
    if side is Side.UWSGI:
        by = f"uWSGI ahead by {c.ratio - 1:.0%}" if figure == "rps" else f"uWSGI's tail {1 - c.ratio:.0%} shorter"
    elif side is Side.PEER:
        if figure == "rps":
            by = f"{peer} ahead by {1 / c.ratio - 1:.0%}" if c.ratio else f"{peer} ahead"
        else:
            by = f"{peer}'s tail {1 - 1 / c.ratio:.0%} shorter" if c.ratio else f"{peer}'s tail shorter"
    elif side is Side.TOO_FEW:
        by = "too few rounds: no interval, no winner"
    elif side is Side.EQUIVALENT:
        by = f"equivalent within ±{c.margin:.0%}"
    else:
        by = "undecided"
    return f"{c.text()} {what} ({by})"


def peer_sentence(results: Results, reading: PeerReading, peer: str) -> str:
    """One sentence for one peer server across P and 2P, against its best variant at each level,
    honest in either direction: where the peer is ahead beyond noise the sentence starts with it,
    and says by how much."""
    parts = [f"at {m.concurrency} connections{_level(results, m.concurrency)} the best uWSGI layout, "
             f"{m.uwsgi}, against {peer}'s best variant, {m.peer}, had "
             f"{figure_text(m.rps, 'rps', m.rps_side, peer)} and {figure_text(m.p99, 'p99', m.p99_side, peer)}"
             for m in reading.matchups if m.server == peer]
    won = [f"{fig} at {' and '.join(map(str, levels))} connections"
           for fig, levels in reading.peer_wins(peer).items() if levels]
    head = f"{peer} is ahead on {' and on '.join(won)}: " if won else f"{peer}: "
    return head + "; ".join(parts) + "."


HOW = {VariantWin.BETTER: "better beyond noise", VariantWin.SHORTER_P99: "equivalent, and a shorter p99 beyond noise",
       VariantWin.HIGHER: "equivalent: the higher of the two",
       VariantWin.UNDECIDED: "undecided: the higher of the two, no winner beyond noise"}


def variants_sentence(results: Results, v: PeerVariants) -> str:
    """Which of a peer's measured variants was its best at each level and how that was decided
    (paired throughput against the runner-up); with one variant, which others to measure."""
    peer = v.server
    if len(v.measured) == 1:
        more = f": measure {', '.join(v.to_measure)} too, so that {peer} is compared at its best" if v.to_measure \
            else ""
        return f"{peer}: one variant measured ({v.measured[0]}), so it stands for {peer}{more}."
    parts = []
    for c in v.levels:
        level = f"at {c.concurrency} connections{_level(results, c.concurrency)}"
        if c.win is VariantWin.ONLY:
            parts.append(f"{level} only {c.best} was measured")
        else:
            parts.append(f"{level} {c.best}, {c.rps.text()} the throughput of {c.runner_up} ({HOW[c.win]})")
    return f"{peer}'s variants ({', '.join(v.measured)}): " + "; ".join(parts) + "."


MATTERS = {Matters.LAYOUT: ": here the layout matters more than the server.",
           Matters.SERVER: ": here the server matters more than the layout.",
           Matters.NEITHER: ": neither stands out beyond noise."}


def what_matters(results: Results, reading: PeerReading) -> str:
    """Which choice moved throughput more here: the uWSGI layout (best / worst) or the server
    (best uWSGI / best peer), at 2P (else P)."""
    w = reading.matters
    if w is None:
        return ""
    word = lambda c: "beyond noise" if c.decided else c.outcome  # noqa: E731
    return (f"{reading.scenario}, {w.concurrency} connections{_level(results, w.concurrency)}: the choice of uWSGI "
            f"layout moved throughput {w.layout.text()} (best {w.best_uwsgi} / worst {w.worst_uwsgi}: "
            f"{word(w.layout)}), the choice of server {w.server.text()} (best uWSGI / best peer {w.best_peer}: "
            f"{word(w.server)})" + MATTERS[w.answer])


RESULT = {TargetState.MET: "pass", TargetState.MISSED: "MISS"}


def _result(t: TargetReading) -> str:
    """``pass (by 0.05x)``, ``MISS (short by 0.02x)``: a decided target with the point ratio's
    distance from the threshold (``TargetReading.margin``); ``undecided: 2% past, 4%
    short``: an undecided one with how far its interval reaches either side."""
    if t.state is TargetState.UNSURE:
        return f"undecided: {t.straddle}"
    if t.point_clears:
        return f"{RESULT[t.state]} (by {t.margin:.2f}x)"
    return f"{RESULT[t.state]} ({'over' if t.at_most else 'short'} by {-t.margin:.2f}x)"


def target_rows(m) -> list[list[str]]:
    """[target, measured, result] for the target matchup (a ``TargetMatchup``, or an
    ``analysis.Matchup`` judged here by ``readings.target_readings``): pass (the whole interval
    clears the threshold), MISS (none of it does) or undecided, with the point ratio's margin,
    and who is ahead beyond noise."""
    readings = m.target_readings if isinstance(m, TargetMatchup) else target_readings(m)
    rows = []
    for t in readings:
        ahead = f"{t.side} ahead" if t.side in (Side.UWSGI, Side.PEER) else str(t.side)
        rows.append([t.label, f"{t.comparison.text()}, {ahead}", _result(t)])
    return rows


def _matchup_rows(results: Results, reading: PeerReading, groups: dict, markdown: bool) -> list[list[str]]:
    rows = []
    for m in reading.matchups:
        level = f"{m.concurrency}{_level(results, m.concurrency)}"
        rps, p99 = m.rps_side, m.p99_side
        if markdown:
            peer, ours = groups[(m.peer, m.concurrency)], groups[(m.uwsgi, m.concurrency)]
            rows.append([level, m.peer, fmt_stat(peer.rps), quoted_p99_interval(peer), m.uwsgi, fmt_stat(ours.rps),
                         quoted_p99_interval(ours), f"{m.rps.text()}: {rps}", f"{m.p99.text()}: {p99}"])
        else:
            rows.append([level, m.peer, m.uwsgi, f"{m.rps.text()} {rps}", f"{m.p99.text()} {p99}"])
    return rows


def _target_head(results: Results, m: TargetMatchup, groups: dict[tuple[str, int], Group]) -> str:
    ours, theirs = groups[(m.uwsgi, m.concurrency)], groups[(m.peer, m.concurrency)]
    return (f"Target at {m.concurrency} connections{_level(results, m.concurrency)}, the best uWSGI layout "
            f"{m.uwsgi} ({num(ours.rps.median)} req/s, p99 {quoted_p99(ours, unit=' ms')}) against the best peer "
            f"{m.peer} ({num(theirs.rps.median)} req/s, p99 {quoted_p99(theirs, unit=' ms')})")


def alternatives_lines(results: Results, markdown: bool = False, summary: Summary | None = None) -> list[str]:
    """The section, per scenario with both uWSGI layouts and peers ([] when no scenario has both),
    as ``summary`` judged it (by default, as the readings of ``results`` judge it)."""
    found = summary.peers if summary is not None else peer_readings(results)
    if not found:
        return []
    out = (["## Against the alternatives", "", NOTE, ""] if markdown
           else ["", "against the alternatives (best uWSGI layout / each peer):"] + wrap(NOTE, indent="  ",
                                                                                          subsequent="  "))
    for reading in found:
        groups = {(g.layout, g.concurrency): g for g in group_cells(results, reading.scenario)}
        if markdown:
            named = len(found) > 1 or reading.scenario != TARGET_SCENARIOS[0]  # the first target mix alone: no heading
            out += [f"### Scenario: {reading.scenario}", ""] if named else []
        else:
            out += ["", f"  scenario {reading.scenario}:"]
        if reading.missing:
            out += [f"Not compared: {reading.missing}.", ""] if markdown else wrap(f"not compared: {reading.missing}",
                                                                                   indent="  ", subsequent="  ")
        if reading.matchups:
            if markdown:
                out += md_table(["connections", "peer", "peer req/s", "peer p99 ms", "best uWSGI", "its req/s",
                                 "its p99 ms", "throughput uWSGI/peer", "p99 uWSGI/peer"],
                                _matchup_rows(results, reading, groups, True), "<<>><>>>>") + [""]
            else:
                out += ["  " + x for x in table(["conns", "peer", "best uWSGI", "req/s uWSGI/peer",
                                                 "p99 uWSGI/peer"], _matchup_rows(results, reading, groups, False),
                                                "<<<<<")]
        variants = {v.server: v for v in reading.variants}
        sentences = [x for peer in reading.peers
                     for x in (variants_sentence(results, variants[peer]) if peer in variants else "",
                               peer_sentence(results, reading, peer)) if x]
        matters = what_matters(results, reading)
        sentences += [matters] if matters else []
        for text in sentences:
            out += [f"- {text}"] if markdown else wrap(text, indent="  - ", subsequent="    ")
        if reading.target is not None:
            head = _target_head(results, reading.target, groups)
            rows = target_rows(reading.target)
            if markdown:
                out += ["", head + ":", ""] + md_table(["target", "measured (uWSGI / peer)", "result"], rows, "<<<")
            else:
                out += [""] + wrap(head + ":", indent="  ", subsequent="  ")
                out += ["  " + x for x in table(["target", "measured (uWSGI / peer)", "result"], rows, "<<<")]
        out += [""] if markdown else []
    return out
