"""The per-level table of the compare report, one spec for both formats (hyperfine's exporters):
``level_columns`` says which columns a level's groups have, in which order, and what each shows;
each column says how its cell is written in report.txt (terse: ``18.6 ±2%``, medians) and in
report.md (the median with its low–high range). A column with no text form is Markdown's only:
report.txt shows those figures in tables of their own (scenario figures, pooled tails).

Which p99 may be quoted is the analysis's (``Group.p99_quotable``, ``p999_quotable``): the
columns only write what it decided.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from uwsgi_layouts.bench.analysis import CONFIDENCE, MEMORY_KEY, Group, Stat
from uwsgi_layouts.bench.report.memory import pss_column
from uwsgi_layouts.bench.report.subject import any_non_2xx, status_text
from uwsgi_layouts.bench.report.text import fmt_interval, fmt_stat, md_table, num, pct, pm, table


@dataclass(frozen=True)
class Column:
    """A column: its header and cell in report.txt (``text`` None: not in the text table) and in
    report.md."""

    text: str | None
    md: str
    text_cell: Callable[[Group], str] | None
    md_cell: Callable[[Group], str]


def table_p99(g: Group, per_cell: Callable[[Stat], str]) -> str:
    """The table's p99: pooled where the cells hold histograms, else the repeats' own (written by
    ``per_cell``); "n/q" (not quoted) when fewer than MIN_SLOWER_REQUESTS requests lie above it."""
    if not g.p99_quotable:
        return "n/q"
    return num(g.p99) if g.tails.pooled else per_cell(g.latency["p99"])


def _p999(g: Group, text: str) -> str:
    return text if g.p999_quotable else "n/q"


def pileup(g: Group) -> str:
    if g.inflight is None:
        return ""
    pile = g.inflight.pileup
    if pile is None:
        return "n/a"
    # A share near 0 makes a relative spread meaningless: show the repeats' range in points.
    return pct(pile.median) + (f" ({100 * pile.low:.0f}–{100 * pile.high:.0f})" if pile.n > 1 else "")


def _stat(figure: str) -> Callable[[Group], str]:
    return lambda g: fmt_stat(g.latency[figure], digits=None)


def _median(figure: str) -> Callable[[Group], str]:
    return lambda g: num(g.latency[figure].median)


def level_columns(groups: list[Group]) -> list[Column]:
    """The columns of one level's table, in order; the optional ones only where a group has them."""
    keys = sorted({k for g in groups for k in g.extra})
    cols = [
        Column("layout", "layout", lambda g: g.layout, lambda g: g.layout),
        Column("req/s", "req/s", lambda g: pm(g.rps), lambda g: fmt_stat(g.rps)),
        Column("p50", "p50 ms", _median("p50"), _stat("p50")),
        Column("p90", "p90 ms", _median("p90"), _stat("p90")),
        Column("p99", "p99 ms", lambda g: table_p99(g, pm),
               lambda g: table_p99(g, lambda s: fmt_stat(s, digits=None))),
        Column("p99.9", "p99.9 ms", lambda g: _p999(g, _median("p999")(g)), lambda g: _p999(g, _stat("p999")(g))),
        Column("max", "max ms", _median("max"), _stat("max")),
        Column("errors", "errors", lambda g: str(g.errors),
               lambda g: f"{g.errors} of {g.requests}" if g.errors else "0"),
        Column("eff.", "efficiency", lambda g: f"{g.efficiency.median:.2f}",
               lambda g: fmt_stat(g.efficiency, digits=2)),
        Column("worker\nCV", "worker CV", lambda g: f"{g.cv.median:.2f}" if g.cv.n else "n/a",
               lambda g: fmt_stat(g.cv, digits=2, mark_noisy=False)),
        Column("CPU ms\n/req", "CPU ms/req", lambda g: num(g.cpu_ms_per_request.median),
               lambda g: fmt_stat(g.cpu_ms_per_request, digits=None)),
    ]
    cols += [Column(None, k, None, lambda g, k=k: fmt_stat(g.extra[k], digits=None) if k in g.extra else "")
             for k in keys]
    if any(g.tails.pooled for g in groups):
        cols += [Column(None, f"p99 pooled ms ({CONFIDENCE:.0%} interval)", None,
                        lambda g: (fmt_interval(g.tails.p99) if g.p99_quotable else "n/q") if g.tails.pooled else ""),
                 Column(None, ">p99", None,
                        lambda g: f"{g.tails.slower}" + (" ⚠" if g.tails.thin else "") if g.tails.pooled else "")]
    if any(g.inflight for g in groups):
        cols.append(Column(None, "pile-up", None, pileup))
    if any(g.memory.get(MEMORY_KEY) for g in groups):
        cols.append(Column("PSS\nMB", "server PSS MB", lambda g: pss_column(g)[0], lambda g: pss_column(g)[1]))
    if any_non_2xx(groups):
        cols.append(Column("non-2xx", "non-2xx", lambda g: str(g.non_2xx), lambda g: status_text(g.status)))
    cols.append(Column("noisy", "noisy", lambda g: " ".join(g.noisy_figures),
                       lambda g: "⚠ " + ", ".join("req/s" if f == "rps" else f for f in g.noisy_figures)
                       if g.noisy_figures else ""))
    return cols


def _align(n: int) -> str:
    return "<" + ">" * (n - 2) + "<"


def text_level_table(groups: list[Group]) -> list[str]:
    cols = [c for c in level_columns(groups) if c.text is not None]
    return table([c.text for c in cols], [[c.text_cell(g) for c in cols] for g in groups], _align(len(cols)))


def md_level_table(groups: list[Group], best: str) -> list[str]:
    """``best``: the layout in bold (the best at this level)."""
    cols = level_columns(groups)
    rows = [[c.md_cell(g) for c in cols] for g in groups]
    for g, row in zip(groups, rows, strict=True):
        row[0] = f"**{g.layout}**" if g.layout == best else g.layout
    return md_table([c.md for c in cols], rows, _align(len(cols)))
