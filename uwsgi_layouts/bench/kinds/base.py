"""What every experiment kind shares: how it plugs into the CLI, and how a run ends.

A kind is a ``Kind``: its subcommand name, a help line, a function that adds its arguments to
its subparser, and a function that runs it (returns the exit code; raises ``BadArgument`` for
bad input, which the CLI prints as one line with exit 2). ``bench.kinds.KINDS`` lists them.
"""

from __future__ import annotations

import argparse
import signal
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from uwsgi_layouts.bench.report import AnySummary, judged, terminal_lines
from uwsgi_layouts.bench.report.exporters import export_all
from uwsgi_layouts.bench.results import Results
from uwsgi_layouts.bench.summary import SUMMARY_NAME

RESULTS_NAME = "results.json"


@dataclass(frozen=True)
class Kind:
    name: str  # the subcommand: uwsgi-layouts NAME
    help: str  # one line for `uwsgi-layouts --help`
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]  # the exit code


def _interrupt(signum, frame):
    raise KeyboardInterrupt


@contextmanager
def sigterm_interrupts():
    """Inside: SIGTERM raises KeyboardInterrupt as Ctrl-C does, so every ``with`` stops its
    stacks and the kind can save what it measured before it exits."""
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def publish(results: Results, out: Path, saved: Path | None = None, screen: list[str] | None = None,
            summary: AnySummary | None = None) -> list[Path]:
    """Write every report format of ``results`` into ``out`` (report.txt, report.md, the
    kind's plots), print the terminal report (or ``screen``: what the kind shows instead, e.g.
    compare's headline) and what was written (``saved``: the results file, when this run wrote it).
    ``summary``: a compare, tune or doctor run's judgements, made by the run that measured (or read
    from its summary.json), which every format renders; with ``saved``, it is also stored beside the
    results as summary.json (``report`` renders from it later). Given none (a run stored without
    it), they are made once here for every format and not stored: summary.json holds only what the
    run itself concluded."""
    out.mkdir(parents=True, exist_ok=True)
    given = summary
    summary = judged(results, summary)
    written = export_all(results, out, summary=summary)
    if given is not None and saved is not None:
        written.insert(0, given.save(saved.parent / SUMMARY_NAME))
    print("\n".join(terminal_lines(results, summary) if screen is None else screen))
    names = ", ".join(p.name for p in written)
    print(f"\nwrote {saved} and {names} in {out}" if saved else f"\nwrote {names} in {out}")
    return written
