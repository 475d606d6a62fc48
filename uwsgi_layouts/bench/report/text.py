"""Formatting helpers every report section uses: numbers, figures across repeats, aligned
text tables, wrapped lines, Markdown tables. Functions return strings or lines; nothing prints.
"""

from __future__ import annotations

import json
import textwrap

from uwsgi_layouts.bench.analysis import Group, Interval, Stat
from uwsgi_layouts.bench.results import Results

WIDTH = 100  # terminal lines are wrapped/kept to this many columns
NOISY_MARK = " ~"


def num(x: float, digits: int | None = None) -> str:
    """A number with ``digits`` decimals, or about three significant figures when ``digits`` is None."""
    if digits is None:
        ax = abs(x)
        digits = 0 if ax >= 100 else 1 if ax >= 10 else 2
    return f"{x:.{digits}f}"


def fmt_stat(stat: Stat, unit: str = "", digits: int | None = 1, mark_noisy: bool = True) -> str:
    """``"19.7 (19.1–20.3)"``: the median and the low–high range across repeats.

    A unit goes after the range (``"258 (250–270) ms"``); a noisy figure (spread above
    ``NOISY_SPREAD``) ends with ``" ~"``. One repeat shows the median alone, none shows ``"n/a"``.
    ``digits=None`` picks the decimals from the size of the median. ``mark_noisy=False`` for figures
    whose relative spread means little (a coefficient of variation near 0).
    """
    if stat.n == 0:
        return "n/a"
    if digits is None:
        digits = 0 if abs(stat.median) >= 100 else 1 if abs(stat.median) >= 10 else 2
    text = num(stat.median, digits)
    if stat.n > 1:
        text += f" ({num(stat.low, digits)}–{num(stat.high, digits)})"
    if unit:
        text += f" {unit}"
    if mark_noisy and stat.noisy:
        text += NOISY_MARK
    return text


def pm(stat: Stat, digits: int | None = None) -> str:
    """Terminal form: the median and half the low–high range as a percentage, ``"18.6 ±2%"``."""
    if stat.n == 0:
        return "n/a"
    text = num(stat.median, digits)
    if stat.n > 1:
        text += f" ±{stat.spread * 50:.0f}%"
    return text


def fmt_interval(interval: Interval, digits: int | None = None) -> str:
    """``"310 (290–350)"``: the estimate and its interval (a range of one value shows alone)."""
    text = num(interval.value, digits)
    if interval.low != interval.high:
        text += f" ({num(interval.low, digits)}–{num(interval.high, digits)})"
    return text


def quoted_p99(g: Group, digits: int | None = None, unit: str = "") -> str:
    """The p99 a report may quote: pooled (or, for cells without histograms, the median of the
    repeats' own), only when at least MIN_SLOWER_REQUESTS requests lie above it; else "n/q"."""
    if not g.p99_quotable:
        return "n/q"
    return num(g.p99, digits) + unit


def quoted_p99_interval(g: Group) -> str:
    """The pooled p99 with its interval where it may be quoted, else "n/q"."""
    if not g.p99_quotable:
        return "n/q"
    return fmt_interval(g.tails.p99) if g.tails.pooled else fmt_stat(g.latency["p99"], digits=None)


def pct(share: float | None) -> str:
    """A share as a whole percentage (``"38%"``); ``"n/a"`` for None."""
    return "n/a" if share is None else f"{share:.0%}"


def table(headers: list[str], rows: list[list[str]], align: str) -> list[str]:
    """An aligned plain-text table; a header may hold one "\\n" to take two lines."""
    split = [h.split("\n") for h in headers]
    depth = max(len(h) for h in split)
    split = [[""] * (depth - len(h)) + h for h in split]
    widths = [max([len(x) for x in split[i]] + [len(r[i]) for r in rows]) for i in range(len(headers))]

    def line(cells: list[str]) -> str:
        padded = (c.ljust(w) if a == "<" else c.rjust(w) for c, w, a in zip(cells, widths, align, strict=True))
        return "  ".join(padded).rstrip()

    out = [line([h[d] for h in split]) for d in range(depth)]
    out.append("  ".join("-" * w for w in widths))
    out.extend(line(r) for r in rows)
    return out


def wrap(text: str, indent: str = "", subsequent: str | None = None) -> list[str]:
    return textwrap.wrap(text, WIDTH, initial_indent=indent,
                         subsequent_indent=indent + "  " if subsequent is None else subsequent,
                         break_long_words=False, break_on_hyphens=False) or [""]


def md_cell(value) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return text.replace("|", "\\|").replace("\n", " ")


def md_table(headers: list[str], rows: list[list[str]], align: str | None = None) -> list[str]:
    align = align or "<" * len(headers)
    sep = ["---:" if a == ">" else "---" for a in align]
    return ["| " + " | ".join(md_cell(h) for h in headers) + " |", "| " + " | ".join(sep) + " |"] + [
        "| " + " | ".join(md_cell(c) for c in r) + " |" for r in rows
    ]


def comment(results: Results) -> str:
    """A ``_comment`` recorded in the environment or arguments (e.g. "synthetic fixture")."""
    return str(results.environment.get("_comment") or results.arguments.get("_comment") or "")


def md_kv(title: str, data: dict, skip: tuple[str, ...] = ()) -> list[str]:
    rows = [[str(k), v if isinstance(v, str) else json.dumps(v)] for k, v in data.items() if k not in skip]
    if not rows:
        return [f"## {title}", "", "Not recorded.", ""]
    return [f"## {title}", ""] + md_table(["key", "value"], rows) + [""]




def md_footer(results: Results, plot_files: list[str]) -> list[str]:
    """A report's end: the command that reproduces the run, the environment, the other arguments, the plots."""
    command = results.arguments.get("command")
    out = ["## How to reproduce", "", "```sh", command, "```", ""] if command else []
    out += md_kv("Environment", results.environment)
    out += md_kv("Arguments", results.arguments, skip=("command",))
    return out + plot_lines(plot_files)


def plot_lines(plot_files: list[str]) -> list[str]:
    """A Markdown "Plots" section embedding ``plot_files`` (paths relative to the report)."""
    if not plot_files:
        return []
    out = ["## Plots", ""]
    for name in plot_files:
        out += [f"![{name.rsplit('/', 1)[-1].rsplit('.', 1)[0]}]({name})", ""]
    return out
