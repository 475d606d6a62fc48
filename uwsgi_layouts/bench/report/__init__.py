"""Reports of a stored run, for every experiment kind, from ``Results`` only.

    terminal_lines(results)              the plain-text report (printed; report.txt)
    markdown_lines(results, plot_files)  report.md, embedding the plots

A run's judgements come from its kind's summary (given, e.g. loaded from summary.json, or made
from the results): compare's ``bench.summary.Summary``, tune's ``bench.tune.summary.TuneSummary``,
doctor's ``bench.doctor_summary.DoctorSummary`` (``Renderer.summary``); openloop and faults take none.
A summary not given is made once per report by ``judged`` (``Renderer.judge``) and handed to every
view: a kind's own ``terminal_lines`` and ``markdown_lines`` take it and never judge.

Both dispatch on ``results.kind`` through ``RENDERERS``: ``compare`` (with the nginx
scenarios' sections of ``nginx``), ``openloop``, ``faults``, ``tune`` and ``doctor`` each render in their own module.
``text`` holds the formatting helpers every section shares; ``plots`` draws each kind's PNGs
from stored JSON; ``exporters`` writes every format (txt, md, png) behind one interface.
A new kind adds its module and one ``RENDERERS`` entry (and its plots to ``plots.PLOTS``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from uwsgi_layouts.bench import doctor_summary
from uwsgi_layouts.bench import summary as compare_summary
from uwsgi_layouts.bench.doctor_summary import DoctorSummary
from uwsgi_layouts.bench.report import compare, doctor, faults, openloop, tune
from uwsgi_layouts.bench.results import Results, ResultsError
from uwsgi_layouts.bench.summary import Summary
from uwsgi_layouts.bench.tune import summary as tune_summary
from uwsgi_layouts.bench.tune.summary import TuneSummary

AnySummary = Summary | TuneSummary | DoctorSummary


@dataclass(frozen=True)
class Renderer:
    terminal_lines: Callable[..., list[str]]  # (results) or, for a summarized kind, (results, summary)
    markdown_lines: Callable[..., list[str]]  # (results, plot_files) or (results, plot_files, summary)
    summary: type | None = None  # the kind's stored judgements (summary.json): a class with load and matches
    judge: Callable[[Results], AnySummary] | None = None  # makes them from the results (a run stored without)


RENDERERS: dict[str, Renderer] = {
    "compare": Renderer(compare.terminal_lines, compare.markdown_lines, Summary, compare_summary.summarize),
    "openloop": Renderer(openloop.terminal_lines, openloop.markdown_lines),
    "faults": Renderer(faults.terminal_lines, faults.markdown_lines),
    "tune": Renderer(tune.terminal_lines, tune.markdown_lines, TuneSummary, tune_summary.summarize),
    "doctor": Renderer(doctor.terminal_lines, doctor.markdown_lines, DoctorSummary, doctor_summary.summarize),
}


def renderer(results: Results) -> Renderer:
    try:
        return RENDERERS[results.kind]
    except KeyError:
        raise ResultsError(f"kind: no report for results of kind {results.kind!r} "
                           f"(reports exist for {', '.join(RENDERERS)})") from None


def judged(results: Results, summary: AnySummary | None = None) -> AnySummary | None:
    """The run's judgements, for every view of one report: ``summary`` when given (stored, or the
    run's own), else made here, once, from the results (a run stored without its summary: the
    search taken again, the figures judged again); None for a kind that takes none. A caller
    rendering several views calls this first and hands every view its answer."""
    if summary is not None:
        return summary
    judge = renderer(results).judge
    return None if judge is None else judge(results)


def _summary_args(summary: AnySummary | None) -> tuple:
    return () if summary is None else (summary,)


def terminal_lines(results: Results, summary: AnySummary | None = None) -> list[str]:
    """The plain-text report of any kind (lines of at most about 100 columns); ``summary`` as
    ``judged`` takes it."""
    return renderer(results).terminal_lines(results, *_summary_args(judged(results, summary)))


def markdown_lines(results: Results, plot_files: list[str], summary: AnySummary | None = None) -> list[str]:
    """The Markdown report of any kind; ``plot_files`` are embedded by relative link; ``summary``
    as ``judged`` takes it."""
    return renderer(results).markdown_lines(results, plot_files, *_summary_args(judged(results, summary)))
