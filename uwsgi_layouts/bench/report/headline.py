"""The headline of a compare run: the last screen of ``make compare`` and the top of report.md.

At most about 15 lines, each answering one question: which layout to run here and why
(``decisions.recommend``), what one socket per worker changed at P and 2P and whether the
article's claim holds (``bench.verdict``: per level and per target, each with its paired ratio
and interval), whether the verdict's pooled p99s can be quoted, how sure (the run's confidence
level and rounds), how busy the machine was (its environment record) and where the full report
is. It renders what the analysis decided; the tables, decisions and warnings it summarises are
in report.txt and report.md (or on the terminal with ``--full``).
"""

from __future__ import annotations

from uwsgi_layouts.bench.analysis import MIN_SLOWER_REQUESTS, requests_for_p99
from uwsgi_layouts.bench.decisions import Lead, Recommendation
from uwsgi_layouts.bench.paired import percent
from uwsgi_layouts.bench.readings import only_nginx
from uwsgi_layouts.bench.report.text import wrap
from uwsgi_layouts.bench.results import Results
from uwsgi_layouts.bench.summary import Summary
from uwsgi_layouts.bench.verdict import (
    ARTICLE,
    TARGET_P99_RATIO,
    TARGET_RPS_RATIO,
    LevelJudgement,
    Standing,
    Verdict,
    confidence_words,
)


def at_level(v: Verdict, concurrency: int) -> str:
    """``2 connections (P)``."""
    name = v.level_name(concurrency)
    return f"{concurrency} connections" + (f" ({name})" if name else "")


def claim_sentence(v: Verdict) -> str:
    """``the article's claim (2x4-mapped: >= 1.25x the throughput ... at P and 2P): does not hold here.``"""
    return (f"the article's claim ({v.mapped or 'PxT-mapped'}: >= {TARGET_RPS_RATIO:g}x the throughput and "
            f"<= {TARGET_P99_RATIO:g}x the p99 of {v.shared or 'PxT-shared'} at P and 2P connections): "
            f"{v.outcome.value}" + (" here" if v.levels else "") + ".")


def level_sentence(v: Verdict, lv: LevelJudgement) -> str:
    """``at 2 connections (P): does not hold: throughput 1.03x (1.00–1.07): misses it, far below
    the 1.25x claimed; p99 ...``."""
    parts = [f"{'throughput' if t.figure == 'rps' else t.figure} {t.words()}" for t in lv.claim_targets]
    return f"at {at_level(v, lv.concurrency)}: {lv.outcome.value}: " + "; ".join(parts)


def _levels(levels) -> str:
    items = [str(x) for x in levels]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def run_here(rec: Recommendation) -> str:
    """``Run here: 2x4-mapped: not beaten beyond noise at any of 2, 4 and 8 connections; over them
    1.12x (1.05–1.19) the throughput of 2x4-gunicorn@keepalive=off (beaten at 2): more beyond
    noise.``: the lead over the runner-up as ``Recommendation.lead`` states it; only a decided or
    equivalent one is quoted as a ratio."""
    levels = _levels(rec.levels)
    if not rec.beaten_at:
        text = f"Run here: {rec.layout}: not beaten beyond noise at any of {levels} connections"
    else:
        text = (f"Run here: {rec.layout}: beaten beyond noise at {_levels(rec.beaten_at)} of {levels} connections, "
                f"the fewest of any layout")
    c = rec.overall
    if c is None or rec.lead is Lead.NONE:
        return text + "."
    beaten = f" (beaten at {_levels(rec.runner_up_beaten_at)})" if rec.runner_up_beaten_at else ""
    # Only a decided (or equivalent) lead is quoted as a ratio; an undecided one is said to be
    # undecided, with its interval, and one too wide to order anything as not measured well enough.
    if rec.lead is Lead.AHEAD:
        text += f"; over them {c.text()} the throughput of {rec.runner_up}{beaten}: more beyond noise"
    elif rec.lead is Lead.EQUIVALENT:
        text += f"; over them {c.text()} the throughput of {rec.runner_up}{beaten}: equivalent within ±{c.margin:.0%}"
    elif rec.lead is Lead.BEHIND:
        text += (f"; over them {rec.runner_up}{beaten} had more throughput beyond noise ({c.text()} of its "
                 "throughput), yet was beaten at more levels")
    elif rec.lead is Lead.UNDECIDED:
        text += f"; against {rec.runner_up}{beaten} over them: undecided (throughput interval {c.bounds()} holds 1)"
    else:
        rounds = f"{c.rounds} paired round{'s' if c.rounds != 1 else ''}"
        interval = f"interval {c.bounds()}" if c.method != "too few rounds" else "no interval"
        text += f"; against {rec.runner_up}{beaten} over them: not measured well enough to order ({rounds}, {interval})"
    return text + "."


def short_claim(v: Verdict) -> str:
    """``One socket per worker (2x4-mapped vs 2x4-shared) against the article's claim (>= 1.25x
    throughput, <= 0.7x p99 at P and 2P): does not hold here.``: what it changed at each level,
    with its intervals, is in the level lines that follow."""
    pair = f"One socket per worker ({v.mapped} vs {v.shared}) against the article's claim" if v.levels else \
        "The article's claim"  # neither layout measured at P or 2P: nothing changed to speak of
    return (f"{pair} (>= {TARGET_RPS_RATIO:g}x throughput, <= {TARGET_P99_RATIO:g}x p99 at P and 2P): "
            f"{v.outcome.value}" + (" here" if v.levels else "") + ".")


def short_level(v: Verdict, lv: LevelJudgement) -> str:
    """``P: does not hold: throughput 1.03x (1.00–1.07) far below 1.25x; p99 ...``."""
    name = v.level_name(lv.concurrency) or f"{lv.concurrency} connections"
    parts = [f"{'throughput' if t.figure == 'rps' else t.figure} {t.brief()}" for t in lv.claim_targets]
    return f"{name}: {lv.outcome.value}: " + "; ".join(parts)


def tails(v: Verdict) -> str:
    """Whether the verdict's cells pooled enough requests to quote their p99 (at least
    MIN_SLOWER_REQUESTS above it): one line. The p99 targets are judged either way, from each
    round's own p99, paired (docs/compare.md, "Quoting a p99")."""
    groups = [g for lv in v.levels for g in lv.tails]
    if not groups:
        return ""
    thin = [g for g in groups if not g.quotable]
    pooled = sorted(g.requests for g in groups)
    spread = f"{pooled[0]:,}" if pooled[0] == pooled[-1] else f"{pooled[0]:,}-{pooled[-1]:,}"
    if not thin:
        return f"Tails: every verdict cell's pooled p99 quotable ({spread} requests, {MIN_SLOWER_REQUESTS}+ above it)."
    # Each thin cell with the requests it pooled, level by level (the strategy names the layout: the
    # claim's line above names both): what the budget or the rounds left short, on one screen line.
    short = []
    for lv in v.levels:
        cells = [f"{g.layout.partition('-')[2] or g.layout} {g.requests:,}" + (" (ties at its p99)" if g.ties else "")
                 for g in lv.tails if not g.quotable]
        if cells:
            short.append(f"{v.level_name(lv.concurrency) or lv.concurrency} {', '.join(cells)}")
    return f"Tails: p99 not quotable (need {requests_for_p99():,} requests): {'; '.join(short)}."


def how_sure(summary: Summary, v: Verdict | None) -> str:
    """The confidence level, the rounds and what measuring until decided did."""
    rule = summary.rule
    text = f"How sure: {confidence_words(v)}" if v is not None and v.levels else \
        f"How sure: {percent(rule.confidence)} intervals"
    if rule.last > rule.first:
        text += f" ({rule.looks_words()})"
    ext = summary.extension
    if ext is not None:
        added = ext.added
        text += (f"; {len(added)} round{'s' if len(added) != 1 else ''} added until decided" if added else
                 "; no round added") + f", stopped: {ext.stop or 'interrupted'}"
    straddling = [t for t in (v.targets if v is not None else ()) if t.claim and t.standing is Standing.STRADDLES]
    if straddling:
        text += "; a straddling target needs more rounds (--budget 10)"
    return text + "."


def machine(results: Results, busy: bool) -> str:
    """The machine's state from the environment record, and whether the analysis found it busy."""
    env = results.environment
    samples = (env.get("machine") or {}).get("samples") or []
    others = [x for x in [env.get("others_at_start"), *(s.get("others") for s in samples)]
              if isinstance(x, (int, float)) and not isinstance(x, bool)]
    load = (env.get("loadavg_at_start") or [None])[0]
    parts = []
    if others:
        parts.append(f"other processes used up to {max(others):.0%} of the CPU")
    if isinstance(load, (int, float)):
        parts.append(f"load average {load:.1f} at the start")
    if env.get("nproc"):
        parts.append(f"{env['nproc']} cores")
    text = "Machine: " + (", ".join(parts) if parts else "no load recorded")
    return text + ("; busy: differences of a few percent are suspect." if busy else ".")


def headline_lines(results: Results, summary: Summary, where: str | None = None) -> list[str]:
    """The headline (terminal form) of ``summary``; ``where``: the directory holding the full
    report (None: the report that follows it, as in report.md)."""
    out = ["", "== the answer =="]
    rec = summary.run_here
    if rec is not None:
        out += wrap(run_here(rec))
    # The verdict's line here needs the article's scenario (the full report says why it is missing).
    v = summary.verdict if not only_nginx(results) and ARTICLE in results.scenarios else None
    if v is not None:
        out += wrap(short_claim(v))
        for lv in v.levels:
            out += wrap(short_level(v, lv), indent="  - ", subsequent="    ")
        if v.missing:
            out += wrap(f"Not checked: {v.missing}.", indent="  ", subsequent="  ")
        if v.levels:
            out += wrap(tails(v))
    out += wrap(how_sure(summary, v))
    out += wrap(machine(results, summary.busy))
    count = len(summary.cautions)
    more = f"{count} warning{'s' if count != 1 else ''}"
    if where is not None:
        out += wrap(f"Full report ({more}): {where}/report.txt and report.md (--full prints it here).")
    else:
        out += wrap(f"The full report ({more}) follows.")
    return out


def headline_markdown(results: Results, summary: Summary) -> list[str]:
    """The same headline at the top of report.md."""
    lines = headline_lines(results, summary)[2:]
    text = "\n".join(lines)
    return ["## The answer", "", "```text", text, "```", ""]
