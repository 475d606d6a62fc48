"""Output formats behind one small interface: each exporter writes files and returns their paths.

    export_all(results, out_dir)                   # report.txt, report.md and the PNG plots
    export_all(results, out_dir, formats=("md",))  # one format

Every exporter works for every results kind: the report and the plots dispatch on
``results.kind`` (``bench.report.RENDERERS``, ``bench.report.plots.PLOTS``).

Every file is written atomically (temp file in the same directory + ``os.replace``), so a reader
never sees half a report. Exporters never print: showing ``report.txt`` is the CLI's job.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Protocol

from uwsgi_layouts.bench.report import AnySummary, judged, markdown_lines, terminal_lines
from uwsgi_layouts.bench.results import Results
from uwsgi_layouts.files import write_atomic


def plots() -> ModuleType:
    """``bench.report.plots``, imported on first use, on purpose (with map-scale's numpy, timed
    apart, bench's only import inside a function). It loads matplotlib (about 0.7 CPU-s), and
    every bench command imports this module at start (each kind ends with ``kinds.base.publish``),
    so a top-level import made ``compare --help`` or a refused option pay for a plotting library
    they never use. Only a run that writes its report reaches here. (Python caches the module:
    the second call is a lookup.)"""
    from uwsgi_layouts.bench.report import plots as drawing

    return drawing


class Exporter(Protocol):
    name: str  # the format, as given to ``export_all``: "png", "md", "txt"

    def export(self, results: Results, out_dir: Path) -> list[Path]:
        """Write this format's files for ``results`` into ``out_dir``; return the written paths."""
        ...


@dataclass
class PlotExporter:
    """The kind's PNG plots (``bench.report.plots``; compare: throughput, p99, worker share per scenario)."""

    summary: AnySummary | None = None  # tune's plot draws its judgements (None: made from the results)
    name = "png"

    def export(self, results: Results, out_dir: Path) -> list[Path]:
        return plots().plot_all(results, Path(out_dir), self.summary)


@dataclass
class MarkdownExporter:
    """``report.md``, embedding plots by relative link.

    ``plot_files``: names (relative to ``out_dir``) to embed, as ``PlotExporter`` returned them.
    When None, embed the plots ``PlotExporter`` would write that already exist in ``out_dir``,
    so the report never links an image that is not there.
    """

    plot_files: list[str] | None = None
    filename: str = "report.md"
    summary: AnySummary | None = None  # a compare, tune or doctor run's judgements (None: made from the results)
    name = "md"

    def export(self, results: Results, out_dir: Path) -> list[Path]:
        out_dir = Path(out_dir)
        files = self.plot_files
        if files is None:
            files = [n for n in plots().plot_file_names(results) if (out_dir / n).is_file()]
        text = "\n".join(markdown_lines(results, list(files), self.summary)).rstrip("\n") + "\n"
        return [write_atomic(out_dir / self.filename, text)]


@dataclass
class TerminalExporter:
    """``report.txt``: the plain-text tables, verdict and warnings of ``terminal_lines``."""

    filename: str = "report.txt"
    summary: AnySummary | None = None  # a compare, tune or doctor run's judgements (None: made from the results)
    lines: list[str] | None = None  # the report already rendered (``export_all`` renders it before writing)
    name = "txt"

    def export(self, results: Results, out_dir: Path) -> list[Path]:
        lines = self.lines if self.lines is not None else terminal_lines(results, self.summary)
        text = "\n".join(lines) + "\n"
        return [write_atomic(Path(out_dir) / self.filename, text)]


EXPORTERS: dict[str, type] = {"png": PlotExporter, "md": MarkdownExporter, "txt": TerminalExporter}
# Plots first, so the Markdown report can embed exactly the files that were written.
ORDER = ("png", "md", "txt")


def export_all(results: Results, out_dir: Path | str, formats: tuple[str, ...] | list[str] = ORDER,
               summary: AnySummary | None = None) -> list[Path]:
    """Write every requested format into ``out_dir``; return the written paths (plots, md, txt
    order). ``summary``: a compare, tune or doctor run's judgements, which every format renders
    (given none, made once here, not once per format)."""
    unknown = [f for f in formats if f not in EXPORTERS]
    if unknown:
        raise ValueError(f"unknown report format(s) {unknown}; choose from {list(EXPORTERS)}")
    summary = judged(results, summary)
    # The text report first, in memory: a stored run the text view cannot render (a field of the
    # wrong shape, refused by the report's specs) is refused before any file is written.
    text = terminal_lines(results, summary) if "txt" in formats else None
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    plot_files: list[str] | None = None
    for fmt in (f for f in ORDER if f in formats):
        exporter: Exporter
        if fmt == "png":
            exporter = PlotExporter(summary=summary)
        elif fmt == "md":
            exporter = MarkdownExporter(plot_files=plot_files, summary=summary)
        else:
            exporter = TerminalExporter(summary=summary, lines=text)
        paths = exporter.export(results, out_dir)
        if fmt == "png":
            plot_files = [p.relative_to(out_dir).as_posix() for p in paths]
        written.extend(paths)
    return written
