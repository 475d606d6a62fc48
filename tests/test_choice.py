"""Choosing a layout across steady and stall scenarios (pure logic on synthetic cells,
made with the real Cell/Results constructors; not a measurement)."""

from __future__ import annotations

from uwsgi_layouts.bench.analysis import layout_choice, steady_scenarios
from uwsgi_layouts.bench.report import markdown_lines, terminal_lines
from uwsgi_layouts.bench.report.choice import choice_lines
from uwsgi_layouts.bench.results import Cell, Results
from uwsgi_layouts.bench.summary import summarize

LAYOUTS = ("2x4-shared", "2x4-mapped", "2x4-overflow")


def cell(layout, scenario, level, repeat, rps, p99, stalled_p99=None) -> Cell:
    return Cell(
        layout=layout, concurrency=level, repeat=repeat, scenario=scenario, duration_s=10.0,
        requests=int(rps * 10), rps=rps,
        latency_ms={"p50": p99 * 0.6, "p90": p99 * 0.9, "p99": p99, "p999": p99, "max": p99 * 1.1},
        errors={}, worker_requests={"1": int(rps * 5), "2": int(rps * 5)}, cpu_s={"uwsgi": 1.0},
        unloaded_latency_ms=110.0, capacity_rps=30.0, closed_loop_rps=30.0, efficiency=rps / 30.0,
        extra={} if stalled_p99 is None else {"stall_clients": 4, "stalled_p99_ms": stalled_p99},
    )


def results(table: dict) -> Results:
    """table: (layout, scenario, level) -> (rps, p99[, stalled p99]); 3 identical repeats."""
    cells = [cell(lay, sc, lvl, r, *vals) for (lay, sc, lvl), vals in table.items() for r in (1, 2, 3)]
    return Results(
        environment={"nproc": 2}, cells=tuple(cells),
        arguments={"processes": 2, "threads": 4, "layouts": list(LAYOUTS), "scenarios": ["article", "stall"]},
        workload={"article": {"rounds": 5}, "stall": {"rounds": 5, "stall": {"clients": 4}}},
    )


def test_steady_scenarios_come_from_the_recorded_mix():
    r = results({("2x4-mapped", "article", 2): (20, 200), ("2x4-mapped", "stall", 2): (15, 400, 3000)})
    assert steady_scenarios(r) == ["article"]


def test_overflow_meets_the_goal_when_close_to_best_everywhere():
    r = results({
        ("2x4-shared", "article", 4): (16, 360), ("2x4-shared", "stall", 4): (12, 700, 3100),
        ("2x4-mapped", "article", 4): (20, 250), ("2x4-mapped", "stall", 4): (11, 900, 3100),
        ("2x4-overflow", "article", 4): (19.5, 260), ("2x4-overflow", "stall", 4): (14, 600, 3050),
    })
    by = {c.layout: c for c in layout_choice(r)}
    assert by["2x4-overflow"].p99_vs_best == {"article": 260 / 250, "stall": 1.0}
    assert by["2x4-overflow"].steady_rps_vs_mapped == 19.5 / 20
    assert by["2x4-overflow"].meets_goal
    assert not by["2x4-mapped"].meets_goal  # 900/600 = 1.5x the best p99 under stall
    assert by["2x4-mapped"].worst_where == "stall at 4 connections"
    assert not by["2x4-shared"].meets_goal  # p99 1.44x the best in steady state, and 0.8x the throughput
    assert by["2x4-overflow"].stalled_p99_ms == {"stall": 3050}
    text = "\n".join(choice_lines(r, summarize(r)))
    assert "Meets the goal: 2x4-overflow" in text
    assert all(len(line) <= 100 for line in terminal_lines(r)), "terminal lines fit 100 columns"
    assert "## Choosing a layout" in "\n".join(markdown_lines(r, []))


def test_no_layout_meets_the_goal_names_the_closest():
    r = results({
        ("2x4-mapped", "article", 4): (20, 250), ("2x4-mapped", "stall", 4): (11, 900, 3100),
        ("2x4-overflow", "article", 4): (17, 300), ("2x4-overflow", "stall", 4): (14, 600, 3050),
    })
    text = " ".join(choice_lines(r, summarize(r)))
    assert "No layout meets the goal" in text and "closest: 2x4-overflow" in text


def test_single_steady_scenario_has_no_choice_section():
    r = results({("2x4-mapped", "article", 2): (20, 200), ("2x4-shared", "article", 2): (15, 300)})
    assert choice_lines(r, summarize(r)) == []
