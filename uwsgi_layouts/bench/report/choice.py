"""Choosing a layout across scenarios (steady state and stalls): the choices, the goal they are
judged by and the answer (``analysis.layout_choice``, ``goal_answer``, ``lowest_p99``, decided in
the ``Summary``), as one section written by each view."""

from __future__ import annotations

from uwsgi_layouts.bench.analysis import GOAL_P99_SLACK, GOAL_RPS_OF_MAPPED, Answer, group_cells
from uwsgi_layouts.bench.readings import only_nginx
from uwsgi_layouts.bench.report.text import num, quoted_p99
from uwsgi_layouts.bench.report.views import Conclusion, Grid, Items, MarkdownView, Note, Section, TextView, written
from uwsgi_layouts.bench.results import Results
from uwsgi_layouts.bench.summary import Summary


def goal_words(summary: Summary) -> str:
    """The layout choice's conclusion (``Summary.goal``) in one or two sentences."""
    goal, by = summary.goal, {c.layout: c for c in summary.choices}
    named = [by[x] for x in goal.named]
    if goal.answer is Answer.MEETS:
        return ("Meets the goal: " + ", ".join(f"{c.layout} (worst p99 {c.worst_p99_ratio:.2f}x of the best, "
                                               f"at {c.worst_where})" for c in named) + "."
                + (" Undecided: " + ", ".join(goal.undecided) + "." if goal.undecided else ""))
    if goal.answer is Answer.CANNOT_BE_CHECKED:
        best = named[0]
        return (f"The goal cannot be checked: {best.missing} (its throughput half needs the mapped layout's "
                f"steady-state throughput). By healthy p99 alone, {best.layout} is closest to the best everywhere "
                f"(worst {best.worst_p99_ratio:.2f}x, at {best.worst_where})"
                + (f"; missed beyond noise by {', '.join(goal.missed)}" if goal.missed else "") + ".")
    if goal.answer is Answer.UNDECIDED:
        return ("No layout meets the goal beyond noise; undecided (an interval straddles a threshold: measure "
                "more): " + ", ".join(f"{c.layout} (worst p99 {c.worst_p99_ratio:.2f}x, at {c.worst_where})"
                                      for c in named) + ".")
    if goal.answer is Answer.CLOSEST:
        close = named[0]
        return (f"No layout meets the goal here; closest: {close.layout}, whose worst healthy p99 is "
                f"{close.worst_p99_ratio:.2f}x the best ({close.worst_where}).")
    return "No layouts to compare."


def choice_section(results: Results, summary: Summary) -> Section | None:
    """Which layout to run across scenarios: each layout's worst healthy p99 relative to the
    best layout (per scenario, over levels), its steady-state throughput relative to the
    mapped layout, the stalled requests' p99, and whether it meets the goal. Only shown when
    the run has more than one scenario or a stall scenario."""
    stall = summary.stall_scenarios
    if (len(results.scenarios) <= 1 and not stall) or only_nginx(results):
        return None
    p, t = results.arguments.get("processes"), results.arguments.get("threads")
    headers = (("layout",) + tuple(f"p99/best {sc}" for sc in results.scenarios)
               + ("rps/mapped",) + tuple(f"stalled p99 {sc}" for sc in stall) + ("goal",))
    rows = tuple((c.layout,) + tuple(f"{c.p99_vs_best[sc]:.2f}x" if sc in c.p99_vs_best else ""
                                     for sc in results.scenarios)
                 + (f"{c.steady_rps_vs_mapped:.2f}x" if c.steady_rps_vs_mapped is not None else "n/a",)
                 + tuple(num(c.stalled_p99_ms[sc]) if sc in c.stalled_p99_ms else "" for sc in stall) + (c.goal,)
                 for c in summary.choices)
    goal = (f"p99/best: healthy p99 / the best layout's, paired by round (worst level); rps/mapped: steady-state "
            f"throughput / {p}x{t}-mapped's, paired (worst level); stalled p99 in ms. Goal: healthy p99 within "
            f"{GOAL_P99_SLACK - 1:.0%} of the best layout in every scenario and level, and at least "
            f"{GOAL_RPS_OF_MAPPED:.0%} of the mapped layout's steady-state throughput. Each half is met when the "
            "ratio's whole interval is on the right side of its threshold, missed when it is wholly on the wrong "
            "side, undecided otherwise; it cannot be checked when its inputs were not measured.")
    groups = {(g.scenario, g.layout, g.concurrency): g for g in group_cells(results)}
    lowest = tuple(f"{x.scenario}: lowest healthy p99 at {x.concurrency} connections is {x.layout} "
                   f"({quoted_p99(g, unit=' ms')}, {num(g.rps.median)} req/s)"
                   for x in summary.lowest for g in [groups[(x.scenario, x.layout, x.concurrency)]])
    return Section("Choosing a layout: steady state and stalls",
                   (Note(goal), Grid(headers, rows, "<" + ">" * (len(headers) - 1)), Conclusion(goal_words(summary)),
                    Items(lowest)), text_title="choosing a layout (steady state and stalls)")


def choice_lines(results: Results, summary: Summary, markdown: bool = False) -> list[str]:
    """The choice section of ``summary``, in one format."""
    return written(MarkdownView() if markdown else TextView(), choice_section(results, summary))
