"""Reporting layer: tables, verdict, Markdown, plots and exporters, on a stored results file.

Pure logic, no processes: everything here reads ``tests/fixtures/results-small.json`` (a
SYNTHETIC results file, see ``tests/fixtures/make_fixture.py``) or variants of it built with
``dataclasses.replace``; nothing starts nginx, uWSGI or wrk, and nothing is timed. Expected
figures are computed from the raw JSON with ``statistics.median``, independently of
``bench.analysis``.
"""

from __future__ import annotations

import importlib.util
import json
import re
import statistics
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from uwsgi_layouts.bench.analysis import Stat
from uwsgi_layouts.bench.report import markdown_lines, plots, terminal_lines
from uwsgi_layouts.bench.report.compare import verdict_lines
from uwsgi_layouts.bench.report.exporters import EXPORTERS, MarkdownExporter, PlotExporter, TerminalExporter, export_all
from uwsgi_layouts.bench.report.text import fmt_stat
from uwsgi_layouts.bench.results import Latency, Results, ResultsError, load
from uwsgi_layouts.bench.summary import summarize
from uwsgi_layouts.bench.verdict import TARGET_EFFICIENCY

FIXTURES = Path(__file__).parent / "fixtures"
FIXTURE = FIXTURES / "results-small.json"
LAYOUTS = ["1x4-shared", "2x1-shared", "2x4-shared", "2x4-thunder", "2x4-mapped"]
LEVELS = [2, 4, 8]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PLOT_NAMES = ["throughput.png", "p99.png", "worker-share.png"]


@pytest.fixture
def results() -> Results:
    return load(FIXTURE)


@pytest.fixture(scope="module")
def raw() -> dict:
    return json.loads(FIXTURE.read_text())


def raw_median(raw: dict, layout: str, level: int, get) -> float:
    values = [get(c) for c in raw["cells"] if c["layout"] == layout and c["concurrency"] == level]
    assert len(values) == 3
    return statistics.median(values)


def with_cells(results: Results, cells) -> Results:
    return replace(results, cells=tuple(cells))


def mapped_worse(results: Results) -> Results:
    """The fixture with 2x4-mapped made slower and later than 2x4-shared everywhere."""
    def worse(c):
        if c.layout != "2x4-mapped":
            return c
        lat = {k: v * 2.0 for k, v in vars(c.latency_ms).items()}
        return replace(c, rps=c.rps * 0.6, latency_ms=Latency(**lat))
    return with_cells(results, (worse(c) for c in results.cells))


def with_stall(results: Results) -> Results:
    """The fixture plus a second scenario whose cells carry scenario-specific numbers in ``extra``."""
    stall = [replace(c, scenario="stall", extra={"stalled_p99_ms": 900.0 + c.concurrency, "note": "x"})
             for c in results.cells]
    return with_cells(results, (*results.cells, *stall))


# ------------------------------------------------------------------------------ fixture


def test_fixture_is_synthetic_and_shaped_as_documented(results, raw):
    assert "synthetic" in results.environment["_comment"]
    assert raw["format_version"] == 1
    assert results.layouts == LAYOUTS
    assert results.levels == LEVELS
    assert {c.repeat for c in results.cells} == {1, 2, 3}
    assert len(results.cells) == len(LAYOUTS) * len(LEVELS) * 3
    assert any(c.errors.total for c in results.cells)
    assert results.arguments["command"]


def test_fixture_matches_its_generator(results):
    spec = importlib.util.spec_from_file_location("make_fixture", FIXTURES / "make_fixture.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.build() == results, "rerun tests/fixtures/make_fixture.py"


# ------------------------------------------------------------------------------ fmt_stat


def test_fmt_stat_shows_median_and_range():
    assert fmt_stat(Stat(19.7, 19.1, 20.3, 3)) == "19.7 (19.1–20.3)"
    assert fmt_stat(Stat(258.0, 250.0, 270.0, 3), unit="ms", digits=0) == "258 (250–270) ms"
    assert fmt_stat(Stat(0.93, 0.9, 0.95, 3), digits=2) == "0.93 (0.90–0.95)"


def test_fmt_stat_marks_noisy_figures():
    noisy = Stat(20.0, 17.0, 21.0, 3)
    assert noisy.noisy
    assert fmt_stat(noisy).endswith(" ~")
    assert not fmt_stat(noisy, mark_noisy=False).endswith("~")
    assert not fmt_stat(Stat(20.0, 19.9, 20.1, 3)).endswith("~")


def test_fmt_stat_one_repeat_and_none():
    assert fmt_stat(Stat(19.7, 19.7, 19.7, 1)) == "19.7"
    assert fmt_stat(Stat.of([])) == "n/a"


@given(st.lists(st.floats(min_value=0, max_value=1e6, allow_nan=False), min_size=1, max_size=7))
def test_fmt_stat_any_sample(values):
    stat = Stat.of(values)
    text = fmt_stat(stat, digits=2)
    assert text.startswith(f"{stat.median:.2f}")
    assert text.endswith(" ~") == stat.noisy
    if stat.n > 1:
        assert f"({stat.low:.2f}–{stat.high:.2f})" in text


# ------------------------------------------------------------------------------ terminal


def test_terminal_lists_every_layout_and_level(results):
    lines = terminal_lines(results)
    text = "\n".join(lines)
    for layout in LAYOUTS:
        rows = [line for line in lines if re.match(rf"{re.escape(layout)}\s+\d", line)]
        assert len(rows) == len(LEVELS), layout
    for level in LEVELS:
        assert any(line.startswith(f"{level} connections") for line in lines), level
        assert f"best at {level} connections: " in text
    assert "note: synthetic fixture" in text


def test_terminal_verdict_states_the_ratios(results, raw):
    text = "\n".join(terminal_lines(results))
    assert re.search(r"Verdict: the article's claim \(.*\): holds here\.", " ".join(text.split()))
    for level in (2, 4):  # P and 2P for 2 processes
        m = raw_median(raw, "2x4-mapped", level, lambda c: c["rps"])
        s = raw_median(raw, "2x4-shared", level, lambda c: c["rps"])
        mp = raw_median(raw, "2x4-mapped", level, lambda c: c["latency_ms"]["p99"])
        sp = raw_median(raw, "2x4-shared", level, lambda c: c["latency_ms"]["p99"])
        assert m / s > 1.25 and mp / sp < 0.7  # the fixture's design: mapped clearly better
        # unpaired (a version-1 file records no rounds): the ratio of the medians with the
        # conservative interval of every cross ratio, each clearing its threshold
        row = rf"{level} \(2?P\)\s+"
        assert re.search(row + rf"throughput >= 1.25x shared\s+{m / s:.2f}x \(\d\.\d\d–\d\.\d\d\)\s+clears", text)
        assert re.search(row + rf"p99 <= 0.7x shared\s+{mp / sp:.2f}x \(\d\.\d\d–\d\.\d\d\)\s+clears", text)


def test_terminal_fits_100_columns(results):
    for lines in (terminal_lines(results), terminal_lines(with_stall(results))):
        too_long = [line for line in lines if len(line) > 100]
        assert not too_long


def test_terminal_rows_flag_noise_and_errors(results):
    lines = terminal_lines(results)
    at8 = lines[next(i for i, line in enumerate(lines) if line.startswith("8 connections")):]
    thunder = next(line for line in at8 if line.startswith("2x4-thunder "))
    assert thunder.endswith("rps p99")
    two_by_one = next(line for line in at8 if line.startswith("2x1-shared "))
    assert re.search(r"\s2\s+\d\.\d\d\s", two_by_one), two_by_one  # errors column, then eff.
    assert any("requests failed" in line for line in lines)


def test_verdict_reports_the_missed_target_and_by_how_much(results, raw):
    eff = raw_median(raw, "2x4-mapped", 4, lambda c: c["efficiency"])
    assert eff < TARGET_EFFICIENCY  # the fixture misses the efficiency target at 2P
    text = "\n".join(verdict_lines(summarize(results)))
    assert re.search(rf"4 \(2P\)\s+efficiency >= 0.85 \(check\)\s+{eff:.2f}\s+"
                     rf"misses: \w* ?below by {TARGET_EFFICIENCY - eff:.2f}", text)
    assert len(re.findall(r"\s{2}clears", text)) == 7
    assert "holds here" in " ".join(text.split())  # efficiency is the run's check, not the article's claim


def test_verdict_not_reproduced_when_mapped_is_worse(results, raw):
    lines = verdict_lines(summarize(mapped_worse(results)))
    text = " ".join(line.strip() for line in lines)
    assert lines[0].startswith("Verdict: the article's claim") and "): does not hold here." in text
    m = raw_median(raw, "2x4-mapped", 2, lambda c: c["rps"]) * 0.6
    s = raw_median(raw, "2x4-shared", 2, lambda c: c["rps"])
    assert re.search(rf"at 2 connections \(P\): does not hold: throughput {m / s:.2f}x \(\d\.\d\d–\d\.\d\d\): "
                     r"misses it, far below the 1.25x claimed", text)
    md = " ".join("\n".join(markdown_lines(mapped_worse(results), [])).split())
    assert "**The article's claim" in md and "does not hold here.**" in md


def test_verdict_explains_a_missing_layout(results):
    r = with_cells(results, (c for c in results.cells if c.layout != "2x4-mapped"))
    text = " ".join(verdict_lines(summarize(r)))
    assert "cannot be checked" in text
    assert "2x4-mapped" in text and "at 2 and 4 connections" in text
    assert "cannot be checked.**" in "\n".join(markdown_lines(r, []))


def test_verdict_explains_missing_processes_and_scenario(results):
    no_pt = replace(results, arguments={k: v for k, v in results.arguments.items() if k != "processes"})
    assert "processes/threads" in " ".join(verdict_lines(summarize(no_pt)))
    stall_only = with_cells(results, (replace(c, scenario="stall") for c in results.cells))
    assert "no 'article' scenario" in " ".join(verdict_lines(summarize(stall_only)))


def test_several_scenarios_and_extra_fields(results):
    r = with_stall(results)
    text = "\n".join(terminal_lines(r))
    assert "== scenario: article ==" in text and "== scenario: stall ==" in text
    assert "stalled_p99_ms" in text and "note" not in text.split("== scenario: stall ==")[1].split("\n")[0]
    md = "\n".join(markdown_lines(r, plots.plot_file_names(r)))
    assert "### Scenario: stall" in md and "| CPU ms/req | stalled_p99_ms | noisy |" in md
    assert "![throughput-stall](throughput-stall.png)" in md


# ------------------------------------------------------------------------------ markdown


def test_markdown_report_sections_and_verdict_first(results):
    lines = markdown_lines(results, PLOT_NAMES)
    md = "\n".join(lines)
    assert lines[0].startswith("# ")
    order = ["## Verdict", "## How to reproduce", "## Environment", "## Workload", "## Results",
             "## Per-worker shares", "## Warnings", "## Plots"]
    positions = [lines.index(h) for h in order]
    assert positions == sorted(positions)
    assert "holds here.**" in md and "does not hold" not in md
    assert lines.index("## The answer") < lines.index("## Verdict")  # the headline first
    assert "synthetic fixture" in md
    assert f"```sh\n{results.arguments['command']}\n```" in md
    assert "| nproc | 4 |" in md and "| fib | 25 |" in md
    assert "closed-loop bound" in md and "CPU-seconds per request" in md


def test_markdown_tables_have_median_and_range(results, raw):
    md = markdown_lines(results, [])
    m = raw_median(raw, "2x4-mapped", 2, lambda c: c["rps"])
    lo = min(c["rps"] for c in raw["cells"] if c["layout"] == "2x4-mapped" and c["concurrency"] == 2)
    hi = max(c["rps"] for c in raw["cells"] if c["layout"] == "2x4-mapped" and c["concurrency"] == 2)
    row = next(line for line in md if line.startswith("| 2x4-mapped |") or line.startswith("| **2x4-mapped** |"))
    assert f"| {m:.1f} ({lo:.1f}–{hi:.1f}) |" in row
    headers = [line for line in md if line.startswith("| layout | req/s |")]
    assert len(headers) == len(LEVELS)
    figure = re.compile(r"^\d+(\.\d+)? \(\d+(\.\d+)?–\d+(\.\d+)?\)( ~)?$")
    start = md.index(headers[0])
    rows = [line for line in md[start:] if re.match(r"^\| (\*\*)?\dx\d-", line)][: len(LAYOUTS) * len(LEVELS)]
    assert len(rows) == len(LAYOUTS) * len(LEVELS)
    for line in rows:
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert len(cells) == headers[0].count("|") - 1, line
        for value in cells[1:7] + cells[8:11]:  # req/s, latencies, efficiency, worker CV, CPU ms/req
            assert figure.match(value) or value == "n/q", (value, line)
        assert cells[4] == cells[5] == "n/q"  # p99 and p99.9 of cells of ~150 requests: not quoted


def test_markdown_flags_noisy_cells_with_advice(results):
    md = markdown_lines(results, [])
    thunder8 = [line for line in md if line.startswith("| 2x4-thunder |") and "⚠" in line]
    assert len(thunder8) == 1 and "req/s, p99" in thunder8[0] and " ~ |" in thunder8[0]
    assert any(line.startswith("> ⚠ Noisy: 2x4-thunder") and "--repeats" in line for line in md)


def test_markdown_embeds_plots_by_relative_link(results):
    md = markdown_lines(results, PLOT_NAMES)
    for name in PLOT_NAMES:
        assert f"![{name[:-4]}]({name})" in md
    assert "![throughput](throughput.png)" in md
    assert not any(line.startswith("![") for line in markdown_lines(results, []))


def test_markdown_best_and_worker_shares(results):
    md = "\n".join(markdown_lines(results, []))
    assert "Best at 4 connections: 2x4-mapped" in md
    assert "| 2x4-shared | 2 | 50% | 66% / 34% (max/min 1.9" in md


def test_reports_of_an_empty_run(results):
    empty = with_cells(results, ())
    assert any("no cells" in line for line in terminal_lines(empty))
    assert any("cannot be checked" in line.lower() for line in markdown_lines(empty, []))
    assert plots.plot_all(empty, Path("/nonexistent-never-written")) == []


# ------------------------------------------------------------------------------ plots and exporters


def test_export_all_writes_valid_files(results, tmp_path):
    written = export_all(results, tmp_path / "out")
    names = [p.name for p in written]
    assert names == [*PLOT_NAMES, "report.md", "report.txt"]
    for p in written:
        assert p.is_file() and p.stat().st_size > 0, p
    for p in written[:3]:
        assert p.read_bytes()[:8] == PNG_MAGIC, p
    md = (tmp_path / "out" / "report.md").read_text()
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md)
    assert links == PLOT_NAMES and all((tmp_path / "out" / link).is_file() for link in links)
    assert (tmp_path / "out" / "report.txt").read_text() == "\n".join(terminal_lines(results)) + "\n"
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(names)  # no temp files left


def test_export_all_per_scenario_plot_names(results, tmp_path):
    r = with_stall(results)
    written = export_all(r, tmp_path, formats=("png",))
    assert [p.name for p in written] == plots.plot_file_names(r)
    assert {p.name for p in written} == {f"{stem}-{sc}.png" for stem in ("throughput", "p99", "worker-share")
                                         for sc in ("article", "stall")}
    assert all(p.read_bytes()[:8] == PNG_MAGIC for p in written)


def test_markdown_alone_links_only_existing_plots(results, tmp_path):
    (md,) = export_all(results, tmp_path, formats=("md",))
    assert "![" not in md.read_text()
    PlotExporter().export(results, tmp_path)
    MarkdownExporter().export(results, tmp_path)
    assert "![p99](p99.png)" in md.read_text()


def test_export_rejects_unknown_formats(results, tmp_path):
    with pytest.raises(ValueError, match="pdf"):
        export_all(results, tmp_path, formats=("md", "pdf"))
    assert not list(tmp_path.iterdir())


def test_exporters_share_one_interface():
    for fmt, cls in EXPORTERS.items():
        exporter = cls()
        assert exporter.name == fmt and callable(exporter.export)
    assert {MarkdownExporter.name, PlotExporter.name, TerminalExporter.name} == set(EXPORTERS)


def test_worker_share_level_defaults_to_2p(results, tmp_path):
    from uwsgi_layouts.bench.analysis import group_cells

    groups = group_cells(results, "article")
    assert plots.share_level(results, groups) == 4
    no_p = replace(results, arguments={})
    assert plots.share_level(no_p, groups) == 8
    with pytest.raises(ValueError, match="16"):
        plots.plot_worker_share(results, tmp_path / "w.png", level=16)
    (path,) = plots.plot_worker_share(results, tmp_path / "w.png", level=2)
    assert path.read_bytes()[:8] == PNG_MAGIC


# ------------------------------------------------------------------------------ results JSON


def test_json_round_trip(results, tmp_path):
    path = results.save(tmp_path / "results.json")
    assert load(path) == results
    r = with_stall(results)
    assert load(r.save(tmp_path / "stall.json")) == r


def test_unsupported_format_version_is_refused(raw, tmp_path):
    data = dict(raw, format_version=999)
    path = tmp_path / "future.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ResultsError, match="999"):
        load(path)


@pytest.mark.parametrize("field", ["rps", "latency_ms", "worker_requests", "cpu_s", "latency_ms.p99"])
def test_missing_field_is_refused(raw, tmp_path, field):
    data = json.loads(json.dumps(raw))
    cell = data["cells"][0]
    if "." in field:
        outer, inner = field.split(".")
        del cell[outer][inner]
    else:
        del cell[field]
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ResultsError):
        load(path)


def test_verdict_with_one_level_missing_is_not_a_reproduction(results):
    # Only the P level (2 connections) measured: the claim may hold there, but 2P is unchecked.
    r = with_cells(results, (c for c in results.cells if c.concurrency != 4))
    lines = verdict_lines(summarize(r))
    text = " ".join(line.strip() for line in lines)
    assert lines[0].startswith("Verdict: the article's claim") and "): holds in part here." in text
    assert "at 2 connections (P): holds:" in text and "Not checked" in text and "at 4 connections" in text
    md = "\n".join(markdown_lines(r, []))
    assert "holds in part here.**" in md
