"""Reports of a stored run, for every experiment kind, from ``Results`` only.

    terminal_lines(results)              the plain-text report (printed; report.txt)
    markdown_lines(results, plot_files)  report.md, embedding the plots

A compare run's judgements come from its ``bench.summary.Summary`` (given, e.g. loaded from
summary.json, or made from the results); the other kinds take none.

Both dispatch on ``results.kind`` through ``RENDERERS``: ``compare`` (with the nginx
scenarios' sections of ``nginx``), ``openloop``, ``faults``, ``tune`` and ``doctor`` each render in their own module.
``text`` holds the formatting helpers every section shares; ``plots`` draws each kind's PNGs
from stored JSON; ``exporters`` writes every format (txt, md, png) behind one interface.
A new kind adds its module and one ``RENDERERS`` entry (and its plots to ``plots.PLOTS``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from uwsgi_layouts.bench.report import compare, doctor, faults, openloop, tune
from uwsgi_layouts.bench.results import Results, ResultsError
from uwsgi_layouts.bench.summary import Summary


@dataclass(frozen=True)
class Renderer:
    terminal_lines: Callable[..., list[str]]  # (results) or, for a summarized kind, (results, summary)
    markdown_lines: Callable[..., list[str]]  # (results, plot_files) or (results, plot_files, summary)


RENDERERS: dict[str, Renderer] = {
    "compare": Renderer(compare.terminal_lines, compare.markdown_lines),
    "openloop": Renderer(openloop.terminal_lines, openloop.markdown_lines),
    "faults": Renderer(faults.terminal_lines, faults.markdown_lines),
    "tune": Renderer(tune.terminal_lines, tune.markdown_lines),
    "doctor": Renderer(doctor.terminal_lines, doctor.markdown_lines),
}


def renderer(results: Results) -> Renderer:
    try:
        return RENDERERS[results.kind]
    except KeyError:
        raise ResultsError(f"kind: no report for results of kind {results.kind!r} "
                           f"(reports exist for {', '.join(RENDERERS)})") from None


def _summary_args(summary: Summary | None) -> tuple:
    return () if summary is None else (summary,)


def terminal_lines(results: Results, summary: Summary | None = None) -> list[str]:
    """The plain-text report of any kind (lines of at most about 100 columns)."""
    return renderer(results).terminal_lines(results, *_summary_args(summary))


def markdown_lines(results: Results, plot_files: list[str], summary: Summary | None = None) -> list[str]:
    """The Markdown report of any kind; ``plot_files`` are embedded by relative link."""
    return renderer(results).markdown_lines(results, plot_files, *_summary_args(summary))
