"""The compare report's "against the alternatives" section: the best uWSGI layout against each
peer (gunicorn, granian) at its best measured variant (``2x4-gunicorn`` or
``2x4-gunicorn@keepalive=off``...: which one won, and how, is said), at P and 2P connections,
from ``bench.analysis.alternatives``.

Every ratio is uWSGI / peer from ``compare_groups``, paired by round: throughput and each
round's p99, with the interval of their per-round ratios; "equivalent" within the margin,
"undecided" where the interval straddles 1 (no winner named). Where a peer wins, it says by how
much. For the demo app's article request it checks the issue's target at 2P (the best uWSGI
layout against the best peer) and prints pass or MISS with the margin, as the article verdict
does; per scenario, one sentence says whether the choice of layout or of server moved throughput
more. Lines only; nothing prints.
"""

from __future__ import annotations

from uwsgi_layouts.bench.analysis import (
    TARGET_VS_PEER_P99,
    TARGET_VS_PEER_RPS,
    Alternatives,
    Group,
    Matchup,
    alternatives,
    server_of,
)
from uwsgi_layouts.bench.paired import Comparison
from uwsgi_layouts.bench.report.text import fmt_stat, md_table, num, quoted_p99, quoted_p99_interval, table, wrap
from uwsgi_layouts.bench.results import Results
from uwsgi_layouts.bench.verdict import is_demo_run
from uwsgi_layouts.deploy.model import STRATEGIES

TARGET_SCENARIOS = ("article", "io-heavy")  # the demo app's mixes the targets are set for
NOTE = ("Ratios are the best uWSGI layout's figure over each peer's best variant (the best at that level: not "
        "beaten on throughput beyond noise, then the highest), paired by round: the geometric mean of the per-round "
        "ratios of throughput and of each round's p99, with their interval (a t interval on the log ratios at the "
        "run's one confidence level). Equivalent: the interval lies within the margin; undecided: it straddles 1: "
        "no winner.")


def _level(results: Results, level: int) -> str:
    p = results.arguments.get("processes")
    return " (P)" if level == p else " (2P)" if p and level == 2 * p else ""


def _side(c: Comparison, figure: str, repeats: int) -> str:
    """Who is ahead beyond noise: "uWSGI", "peer", "equivalent", "undecided", or "too few rounds"
    (fewer than 3 paired rounds: no interval to judge by)."""
    if c.method == "too few rounds":
        return "too few rounds"
    return {"better": "uWSGI", "worse": "peer"}.get(c.outcome, c.outcome)


def _repeats(*groups: Group) -> int:
    return min(g.rps.n for g in groups)


def _p99(g: Group) -> str:
    return quoted_p99_interval(g)


def figure_text(c: Comparison, figure: str, side: str, peer: str) -> str:
    """``"1.12x (1.01–1.25) its throughput (uWSGI ahead by 12%)"``, honest in either direction."""
    what = "its throughput" if figure == "rps" else "its p99"
    if side == "uWSGI":
        by = f"uWSGI ahead by {c.ratio - 1:.0%}" if figure == "rps" else f"uWSGI's tail {1 - c.ratio:.0%} shorter"
    elif side == "peer":
        if figure == "rps":
            by = f"{peer} ahead by {1 / c.ratio - 1:.0%}" if c.ratio else f"{peer} ahead"
        else:
            by = f"{peer}'s tail {1 - 1 / c.ratio:.0%} shorter" if c.ratio else f"{peer}'s tail shorter"
    elif side == "too few rounds":
        by = "too few rounds: no interval, no winner"
    elif side == "equivalent":
        by = f"equivalent within ±{c.margin:.0%}"
    else:
        by = "undecided"
    return f"{c.text()} {what} ({by})"


def peer_sentence(results: Results, alt: Alternatives, peer: str) -> str:
    """One sentence for one peer server across P and 2P, against its best variant at each level,
    honest in either direction: where the peer is ahead beyond noise the sentence starts with it,
    and says by how much."""
    parts: list[str] = []
    wins: dict[str, list[str]] = {"throughput": [], "p99": []}
    for m in (m for m in alt.matchups if server_of(m.peer.layout) == peer):
        n = _repeats(m.uwsgi, m.peer)
        sides = {fig: _side(c, fig, n) for fig, c in (("rps", m.rps), ("p99", m.p99))}
        for fig, side in sides.items():
            if side == "peer":
                wins["throughput" if fig == "rps" else "p99"].append(str(m.concurrency))
        parts.append(f"at {m.concurrency} connections{_level(results, m.concurrency)} the best uWSGI layout, "
                     f"{m.uwsgi.layout}, against {peer}'s best variant, {m.peer.layout}, had "
                     f"{figure_text(m.rps, 'rps', sides['rps'], peer)} and "
                     f"{figure_text(m.p99, 'p99', sides['p99'], peer)}")
    won = [f"{fig} at {' and '.join(levels)} connections" for fig, levels in wins.items() if levels]
    head = f"{peer} is ahead on {' and on '.join(won)}: " if won else f"{peer}: "
    return head + "; ".join(parts) + "."


def variants_sentence(results: Results, alt: Alternatives, peer: str) -> str:
    """Which of a peer's measured variants was its best at each level and how that was decided
    (paired throughput against the runner-up); with one variant, which others to measure."""
    mine = [c for c in alt.choices if c.server == peer]
    if not mine:
        return ""
    measured = list(dict.fromkeys(v for c in mine for v in c.variants))
    if len(measured) == 1:
        spec = measured[0].partition("@")[0]
        strategy = STRATEGIES.get(spec.partition("-")[2])
        others = [f"{spec}@{v}" for v in (strategy.variants if strategy else ()) if f"{spec}@{v}" not in measured]
        more = f": measure {', '.join(others)} too, so that {peer} is compared at its best" if others else ""
        return f"{peer}: one variant measured ({measured[0]}), so it stands for {peer}{more}."
    parts = []
    for c in mine:
        level = f"at {c.concurrency} connections{_level(results, c.concurrency)}"
        if c.runner_up is None:
            parts.append(f"{level} only {c.best.layout} was measured")
            continue
        rps = c.rps
        if rps.outcome == "better":
            how = "better beyond noise"
        elif rps.outcome == "equivalent":
            tail = c.p99.outcome == "better"
            how = "equivalent, and a shorter p99 beyond noise" if tail else "equivalent: the higher of the two"
        else:  # the best is never beaten beyond noise: undecided
            how = "undecided: the higher of the two, no winner beyond noise"
        parts.append(f"{level} {c.best.layout}, {rps.text()} the throughput of {c.runner_up.layout} ({how})")
    return f"{peer}'s variants ({', '.join(measured)}): " + "; ".join(parts) + "."


def what_matters(results: Results, alt: Alternatives) -> str:
    """Which choice moved throughput more here: the uWSGI layout (best / worst) or the server
    (best uWSGI / best peer), at 2P (else P)."""
    if not alt.levels or alt.layout_spread is None:
        return ""
    level = alt.levels[-1]
    best = max((m for m in alt.matchups if m.concurrency == level), key=lambda m: m.peer.rps.median)
    layout, server = alt.layout_spread, best.rps
    noise = {id(layout): layout.decided, id(server): server.decided}
    word = lambda c: "beyond noise" if c.decided else c.outcome  # noqa: E731
    text = (f"{alt.scenario}, {level} connections{_level(results, level)}: the choice of uWSGI layout moved "
            f"throughput {layout.text()} (best {best.uwsgi.layout} / worst {alt.worst_uwsgi.layout}: "
            f"{word(layout)}), the choice of server {server.text()} (best uWSGI / best peer {best.peer.layout}: "
            f"{word(server)})")
    size = lambda c: max(c.ratio, 1 / c.ratio) if c.ratio else float("inf")  # noqa: E731
    if noise[id(layout)] and (not noise[id(server)] or size(layout) > size(server)):
        return text + ": here the layout matters more than the server."
    if noise[id(server)] and (not noise[id(layout)] or size(server) > size(layout)):
        return text + ": here the server matters more than the layout."
    return text + ": neither stands out beyond noise."


def _margin(label: str, ratio: float) -> tuple[bool, str]:
    if label.startswith("throughput"):
        ok = ratio >= TARGET_VS_PEER_RPS
        return ok, f"by {ratio - TARGET_VS_PEER_RPS:.2f}x" if ok else f"short by {TARGET_VS_PEER_RPS - ratio:.2f}x"
    ok = ratio <= TARGET_VS_PEER_P99
    return ok, f"by {TARGET_VS_PEER_P99 - ratio:.2f}x" if ok else f"over by {ratio - TARGET_VS_PEER_P99:.2f}x"


def target_rows(m: Matchup) -> list[list[str]]:
    """[target, measured, result] for the target matchup, judged by the paired interval: pass
    (the whole interval clears the threshold), MISS (none of it does) or undecided, with the point
    ratio's margin, and who is ahead beyond noise."""
    rows = []
    n = _repeats(m.uwsgi, m.peer)
    states = m.targets
    for label, fig, c in ((f"throughput >= {TARGET_VS_PEER_RPS}x the best peer's", "rps", m.rps),
                          (f"p99 <= {TARGET_VS_PEER_P99}x the best peer's", "p99", m.p99)):
        _, margin = _margin(label, c.ratio)
        side = _side(c, fig, n)
        ahead = f"{side} ahead" if side in ("uWSGI", "peer") else side
        result = {"met": "pass", "missed": "MISS", "unsure": "undecided (straddles it)"}[states[label]]
        rows.append([label, f"{c.text()}, {ahead}", f"{result} ({margin})"])
    return rows


def target_applies(results: Results, alt: Alternatives) -> bool:
    return alt.scenario in TARGET_SCENARIOS and is_demo_run(results) and alt.target is not None


def _matchup_rows(results: Results, alt: Alternatives, markdown: bool) -> list[list[str]]:
    rows = []
    for m in alt.matchups:
        level = f"{m.concurrency}{_level(results, m.concurrency)}"
        n = _repeats(m.uwsgi, m.peer)
        rps, p99 = _side(m.rps, "rps", n), _side(m.p99, "p99", n)
        if markdown:
            rows.append([level, m.peer.layout, fmt_stat(m.peer.rps), _p99(m.peer), m.uwsgi.layout,
                         fmt_stat(m.uwsgi.rps), _p99(m.uwsgi), f"{m.rps.text()}: {rps}", f"{m.p99.text()}: {p99}"])
        else:
            rows.append([level, m.peer.layout, m.uwsgi.layout, f"{m.rps.text()} {rps}", f"{m.p99.text()} {p99}"])
    return rows


def alternatives_lines(results: Results, markdown: bool = False) -> list[str]:
    """The section, per scenario with both uWSGI layouts and peers ([] when no scenario has both)."""
    found = [a for sc in results.scenarios if (a := alternatives(results, sc)) is not None]
    if not found:
        return []
    out = (["## Against the alternatives", "", NOTE, ""] if markdown
           else ["", "against the alternatives (best uWSGI layout / each peer):"] + wrap(NOTE, indent="  ",
                                                                                          subsequent="  "))
    for alt in found:
        if markdown:
            named = len(found) > 1 or alt.scenario != TARGET_SCENARIOS[0]  # one article section needs no heading
            out += [f"### Scenario: {alt.scenario}", ""] if named else []
        else:
            out += ["", f"  scenario {alt.scenario}:"]
        if alt.missing:
            out += [f"Not compared: {alt.missing}.", ""] if markdown else wrap(f"not compared: {alt.missing}",
                                                                                 indent="  ", subsequent="  ")
        if alt.matchups:
            if markdown:
                out += md_table(["connections", "peer", "peer req/s", "peer p99 ms", "best uWSGI", "its req/s",
                                 "its p99 ms", "throughput uWSGI/peer", "p99 uWSGI/peer"],
                                _matchup_rows(results, alt, True), "<<>><>>>>") + [""]
            else:
                out += ["  " + x for x in table(["conns", "peer", "best uWSGI", "req/s uWSGI/peer",
                                                 "p99 uWSGI/peer"], _matchup_rows(results, alt, False), "<<<<<")]
        sentences = [x for peer in alt.peers for x in (variants_sentence(results, alt, peer),
                                                       peer_sentence(results, alt, peer)) if x]
        matters = what_matters(results, alt)
        sentences += [matters] if matters else []
        for text in sentences:
            out += [f"- {text}"] if markdown else wrap(text, indent="  - ", subsequent="    ")
        if target_applies(results, alt):
            m = alt.target
            head = (f"Target at {m.concurrency} connections{_level(results, m.concurrency)}, the best uWSGI layout "
                    f"{m.uwsgi.layout} ({num(m.uwsgi.rps.median)} req/s, p99 {quoted_p99(m.uwsgi, unit=' ms')}) "
                    f"against the best peer {m.peer.layout} ({num(m.peer.rps.median)} req/s, p99 "
                    f"{quoted_p99(m.peer, unit=' ms')})")
            if markdown:
                out += ["", head + ":", ""] + md_table(["target", "measured (uWSGI / peer)", "result"],
                                                       target_rows(m), "<<<")
            else:
                out += [""] + wrap(head + ":", indent="  ", subsequent="  ")
                out += ["  " + x for x in table(["target", "measured (uWSGI / peer)", "result"], target_rows(m),
                                                 "<<<")]
        out += [""] if markdown else []
    return out
