"""The faults report: one table row per experiment (load held, faults injected, requests sent,
failed, data lost, targets met), each experiment's notes and missed targets, and a summary.

Functions of a ``Results`` of kind ``faults`` (or of its records) that RETURN lines.
"""

from __future__ import annotations

from uwsgi_layouts.bench.report.subject import subject_lines, subject_markdown
from uwsgi_layouts.bench.report.text import comment, md_footer, md_table
from uwsgi_layouts.bench.results import FaultRecord, Results

COLUMNS = ("experiment", "layout", "load held", "faults", "sent", "failed", "data lost", "targets")
NUMERIC = {3, 4, 5, 6}


def _row(r: FaultRecord) -> tuple[str, ...]:
    missed = len(r.failed_checks)
    return (r.name, r.layout, r.load, str(r.faults_injected), str(r.requests_sent), str(r.requests_failed),
            str(r.data_lost), f"{len(r.checks) - missed}/{len(r.checks)} met")


def format_table(records: list[FaultRecord]) -> list[str]:
    """An aligned text table (one line per experiment), then each one's notes and any missed target."""
    rows = [COLUMNS, *(_row(r) for r in records)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    lines = []
    for n, row in enumerate(rows):
        cells = [cell.rjust(widths[i]) if i in NUMERIC and n else cell.ljust(widths[i]) for i, cell in enumerate(row)]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    lines += [f"* nginx.conf patched for this run (experiment only): {p}" for p in _patches(records)]
    lines.append("")
    for r in records:
        lines.append(f"{r.name} on {r.layout}:")
        lines += [f"  - {note}" for note in r.notes]
        lines += [f"  ! target missed: {c.target}: {c.measured}" for c in r.failed_checks]
    return lines


def _patches(records: list[FaultRecord]) -> list[str]:
    return sorted({r.patch for r in records if r.patch})


def summary_line(results: Results) -> str:
    """How many experiments ran and how long, whether every target was met, which could not run."""
    ran = [r for r in results.faults if not r.error]
    crashed = [r for r in results.faults if r.error]
    missed = sum(len(r.failed_checks) for r in ran)
    seconds = sum(r.seconds for r in results.faults)
    return (f"{len(ran)} experiments in {seconds:.0f} s; "
            + ("every target met" if not missed else f"{missed} target(s) missed (see '!' lines above)")
            + (f"; {len(crashed)} could not run: " + "; ".join(f"{r.name} on {r.layout}: {r.error}" for r in crashed)
               if crashed else ""))


def terminal_lines(results: Results) -> list[str]:
    out = [f"note: {comment(results)}", ""] if comment(results) else []
    out += [*subject_lines(results), ""] if subject_lines(results) else []  # another app than the demo
    return out + format_table([r for r in results.faults if not r.error]) + ["", summary_line(results)]


def markdown_lines(results: Results, plot_files: list[str]) -> list[str]:
    ran = [r for r in results.faults if not r.error]
    out = ["# Faults under load", "",
           f"Results created {results.created or '(time not recorded)'}; each experiment starts its own nginx + "
           "uWSGI stack, holds a wrk load and injects its fault at a measured moment.", ""]
    if comment(results):
        out += [f"> **Note:** {comment(results)}", ""]
    out += subject_markdown(results)
    out += [f"**{summary_line(results)}**", ""]
    out += md_table(list(COLUMNS), [list(_row(r)) for r in ran], "<<<>>>><") + [""]
    out += [f"- nginx.conf patched for this run (experiment only): `{p}`" for p in _patches(ran)]
    out += [""] if _patches(ran) else []
    for r in ran:
        out += [f"### {r.name} on {r.layout}", ""]
        out += [f"- [{'x' if c.ok else ' '}] {c.target}: {c.measured}" for c in r.checks]
        out += [f"- note: {n}" for n in r.notes] + [""]
    return out + md_footer(results, plot_files)
