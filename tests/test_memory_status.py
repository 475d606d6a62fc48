"""Memory and status classes as pure logic: figure assembly from process readings, statistics over
repeats, the process/thread cost fit, and how reports and plots show them.

FAKE DATA, labelled: ``FAKE_READINGS`` are invented psutil-like readings (no process is read here),
and the cells get invented ``memory``/``status`` values on top of the SYNTHETIC results fixture
(tests/fixtures/results-small.json). Real readings are checked in
tests/integration/test_yourapp_compare.py.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from uwsgi_layouts.bench.analysis import fit_memory, group_cells, memory_cost
from uwsgi_layouts.bench.load.wrk import status_classes
from uwsgi_layouts.bench.observe import MB, ProcessMemory, memory_record
from uwsgi_layouts.bench.report import markdown_lines, plots, terminal_lines
from uwsgi_layouts.bench.report.exporters import export_all
from uwsgi_layouts.bench.results import Results, ResultsError, load

FIXTURE = Path(__file__).parent / "fixtures" / "results-small.json"

# FAKE: a uWSGI master (pid 10) with two workers (11, 12), an nginx master (20) and worker (21).
FAKE_READINGS = {
    10: ProcessMemory(pss=6_000_000, uss=5_000_000, rss=20_000_000),
    11: ProcessMemory(pss=22_500_000, uss=18_000_000, rss=40_000_000),
    12: ProcessMemory(pss=23_500_000, uss=19_000_000, rss=41_000_000),
}
FAKE_NGINX = {20: ProcessMemory(1_000_000, 500_000, 5_000_000), 21: ProcessMemory(2_000_000, 1_500_000, 6_000_000)}


def test_memory_record_from_fake_readings():
    record = memory_record(FAKE_READINGS, FAKE_NGINX, {"2": 12, "1": 11})
    assert record == {"app_pss_mb": 52.0, "app_uss_mb": 42.0, "app_rss_mb": 101.0, "nginx_pss_mb": 3.0,
                      "worker_pss_mb": {"1": 22.5, "2": 23.5}}
    assert list(record["worker_pss_mb"]) == ["1", "2"]  # by worker id
    assert MB == 1e6


def test_memory_record_leaves_out_what_was_not_read():
    # worker 3's pid (13) is not in the tree (respawned or gone between the two reads)
    record = memory_record(FAKE_READINGS, {}, {"1": 11, "2": 12, "3": 13}, prefix="app")
    assert "nginx_pss_mb" not in record and set(record["worker_pss_mb"]) == {"1", "2"}
    assert record["app_pss_mb"] == 52.0
    assert memory_record({}, {}, {}) == {}


def test_status_classes_from_the_json_line():
    data = {"status": {"2xx": 90, "3xx": 5, "4xx": 4, "5xx": 1}}
    assert status_classes(data) == {"2xx": 90, "3xx": 5, "4xx": 4, "5xx": 1}
    assert status_classes({}) == {}  # a script without the count (an older raw file)
    assert status_classes({"status": {"2xx": 3}}) == {"2xx": 3, "3xx": 0, "4xx": 0, "5xx": 0}


def pss(layout: str, repeat: int) -> float:
    """FAKE: 6 MB master + 20 MB per process + 0.5 MB per further thread, repeat 2 a bit higher."""
    p, t = (int(x) for x in layout.split("-")[0].split("x"))
    return 6 + 20 * p + 0.5 * p * (t - 1) + (0.3 if repeat == 2 else 0.0)


@pytest.fixture
def results() -> Results:
    base = load(FIXTURE)
    cells = []
    for c in base.cells:
        p = int(c.layout.split("x")[0])
        total = pss(c.layout, c.repeat)
        memory = {"app_pss_mb": total, "app_uss_mb": total - 4, "app_rss_mb": total * 1.8,
                  "nginx_pss_mb": 3.0, "worker_pss_mb": {str(w): (total - 6) / p for w in range(1, p + 1)}}
        status = {"2xx": c.requests, "3xx": 0, "4xx": 0, "5xx": 0}
        if c.layout == "2x4-shared" and c.concurrency == 8:
            status = {"2xx": c.requests - 7, "3xx": 5, "4xx": 2, "5xx": 0}
        cells.append(dataclasses.replace(c, memory=memory, status=status))
    return dataclasses.replace(base, cells=tuple(cells))


def test_groups_carry_status_sums_and_memory_stats(results):
    g = next(g for g in group_cells(results) if g.layout == "2x4-shared" and g.concurrency == 8)
    assert g.status["3xx"] == 15 and g.status["4xx"] == 6 and g.non_2xx == 21
    assert g.memory["app_pss_mb"].median == pytest.approx(pss("2x4-shared", 1))
    assert g.memory["app_pss_mb"].high == pytest.approx(pss("2x4-shared", 2))
    assert g.memory["worker_pss_mb"].median == pytest.approx((pss("2x4-shared", 1) - 6) / 2)
    quiet = next(g for g in group_cells(results) if g.layout == "2x4-mapped" and g.concurrency == 8)
    assert quiet.non_2xx == 0


def test_fit_recovers_known_costs():
    points = [(p, t, 6 + 20 * p + 0.5 * p * (t - 1)) for p, t in ((1, 1), (2, 1), (4, 1), (2, 4), (2, 8))]
    (base, per_process, per_thread), worst = fit_memory(points)
    assert (base, per_process, per_thread) == pytest.approx((6, 20, 0.5))
    assert worst == pytest.approx(0, abs=1e-9)
    assert fit_memory([(2, 4, 50.0), (2, 4, 51.0), (2, 4, 52.0)]) is None  # one shape cannot separate them


def test_memory_cost_over_repeats(results):
    cost = memory_cost(results, "article")
    assert cost.level == 8 and cost.per_process.n == 3
    assert cost.per_process.median == pytest.approx(20) and cost.per_thread.median == pytest.approx(0.5)
    assert cost.base.low == pytest.approx(6) and cost.base.high == pytest.approx(6.3)
    assert set(cost.layouts) == {"1x4-shared", "2x1-shared", "2x4-shared", "2x4-thunder", "2x4-mapped"}
    only_2x4 = dataclasses.replace(results, cells=tuple(c for c in results.cells if c.layout.startswith("2x4")))
    assert memory_cost(only_2x4, "article") is None


def test_terminal_report_shows_memory_and_non_2xx(results):
    lines = terminal_lines(results)
    text = " ".join(" ".join(lines).split())  # wrapped lines joined
    assert "PSS" in text and "memory after load" in text
    assert "3xx 5, 4xx 2" not in text and "3xx 15, 4xx 6" in text  # summed over repeats
    assert "one more worker process (with its first thread) costs 20.0 (20.0–20.0) MB" in text
    assert "one more thread 0.5" in text
    assert "Verdict:" in text  # the demo app on its own scenario: the article's verdict stays
    assert max(len(line) for line in lines) <= 110


def test_non_2xx_column_only_when_some_answer_was_not_2xx(results):
    clean = dataclasses.replace(results, cells=tuple(dataclasses.replace(c, status={"2xx": c.requests})
                                                     for c in results.cells))
    assert "non-2xx" not in "\n".join(terminal_lines(clean))
    assert "non-2xx" not in "\n".join(markdown_lines(clean, []))
    assert "non-2xx" in "\n".join(terminal_lines(results))


def test_markdown_report_memory_status_and_plot(results, tmp_path):
    md = "\n".join(markdown_lines(results, []))
    assert "## Memory" in md and "server PSS MB" in md and "| non-2xx |" in md.replace(" non-2xx |", "| non-2xx |")
    assert "3xx 15, 4xx 6" in md
    assert plots.plot_file_names(results)[-1] == "memory.png"
    written = export_all(results, tmp_path, formats=("png",))
    assert (tmp_path / "memory.png").read_bytes().startswith(b"\x89PNG")
    assert [p.name for p in written] == plots.plot_file_names(results)


def test_runs_without_memory_render_as_before():
    base = load(FIXTURE)
    assert "memory.png" not in plots.plot_file_names(base)
    text = "\n".join(terminal_lines(base))
    assert "memory after load" not in text and "PSS" not in text
    assert "## Memory" not in "\n".join(markdown_lines(base, []))


def user_app_results(results: Results) -> Results:
    app = {"app": "shop:app", "app_dir": "/srv/shop", "virtualenv": "/srv/shop/venv", "demo": False,
           "env": ["SHOP_GREETING"], "static": []}
    mix = {"source": "2 --request", "total_weight": 3, "headers": [["Host", "shop.example"]],
           "requests": [{"method": "GET", "target": "/", "weight": 1, "share": 1 / 3},
                        {"method": "GET", "target": "/api/items", "weight": 2, "share": 2 / 3}]}
    cells = tuple(dataclasses.replace(c, scenario="traffic") for c in results.cells)
    return dataclasses.replace(results, cells=cells, arguments=results.arguments | {"app": app},
                               workload={"traffic": {"description": "your requests", "traffic": mix}})


def test_report_of_another_app_names_it_and_hides_the_article(results):
    other = user_app_results(results)
    text = "\n".join(terminal_lines(other))
    assert "app: shop:app from /srv/shop, virtualenv /srv/shop/venv, env SHOP_GREETING" in text
    assert "traffic (traffic): 2 requests: GET /api/items 67%, GET / 33%; headers Host; from 2 --request" in text
    assert "Verdict" not in text and "article" not in text
    md = "\n".join(markdown_lines(other, []))
    assert "## What was measured" in md and "| virtualenv | /srv/shop/venv |" in md
    assert "| GET /api/items | 2 | 66.7% |" in md
    assert "## Verdict" not in md and "fib" not in md and "rounds=" not in md and '"rounds"' not in md


def test_stored_memory_and_status_are_validated(results, tmp_path):
    path = results.save(tmp_path / "results.json")
    again = load(path)
    assert again.cells[0].memory == results.cells[0].memory and again.cells[0].status == results.cells[0].status
    with pytest.raises(ResultsError, match="memory.app_pss_mb: must be a finite number >= 0"):
        dataclasses.replace(results.cells[0], memory={"app_pss_mb": -1.0})
    with pytest.raises(ResultsError, match="status: keys must be among 2xx, 3xx, 4xx, 5xx"):
        dataclasses.replace(results.cells[0], status={"1xx": 1})


def test_single_threaded_layouts_cannot_separate_a_threads_cost():
    assert fit_memory([(1, 1, 50.0), (2, 1, 80.0), (4, 1, 140.0)]) is None
