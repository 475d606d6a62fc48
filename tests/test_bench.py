"""Bench logic without timing anything (pure logic; the fixtures are REAL captured output:
tests/fixtures/wrk-2x4-mapped-c2.txt is wrk's raw output from a compare run, and
uwsgi-stats-2x4-mapped.json a document read from a running uWSGI stats server).
The sweep is exercised through ReplayRunner on the synthetic results fixture."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from tests.refusals import names, refusal
from uwsgi_layouts.bench import cli as bench_cli
from uwsgi_layouts.bench.analysis import group_cells
from uwsgi_layouts.bench.kinds import compare
from uwsgi_layouts.bench.kinds.closedloop import (
    Plan,
    Progress,
    ReplayError,
    ReplayRunner,
    default_layouts,
    default_levels,
    run_sweep,
    units,
)
from uwsgi_layouts.bench.load.scenarios import SCENARIOS
from uwsgi_layouts.bench.load.wrk import WrkError, fraction_script, parse_output, to_run
from uwsgi_layouts.bench.observe import worker_requests
from uwsgi_layouts.bench.results import ResultsError, load
from uwsgi_layouts.bench.verdict import article_verdict

FIXTURES = Path(__file__).parent / "fixtures"


def test_parse_real_wrk_output():
    raw = (FIXTURES / "wrk-2x4-mapped-c2.txt").read_text()
    data = parse_output(raw)
    run = to_run(data, raw)
    assert run.requests == data["requests"] > 0
    assert run.duration_s == pytest.approx(data["duration_us"] / 1e6)
    assert run.rps == pytest.approx(run.requests / run.duration_s)
    assert run.latency_ms.p99 == pytest.approx(data["latency_us"]["p99"] / 1000)
    assert run.latency_ms.p50 <= run.latency_ms.p90 <= run.latency_ms.p99 <= run.latency_ms.max
    assert run.errors.total == 0
    # wrk's own text report agrees with the JSON line (same run, two renderings)
    assert f"{run.requests} requests in" in raw


def test_wrk_output_without_json_line_is_an_error():
    with pytest.raises(WrkError, match="no WRK_JSON"):
        parse_output("Running 5s test @ http://127.0.0.1:8000/\n")
    with pytest.raises(WrkError, match="malformed"):
        parse_output('WRK_JSON {"requests": \n')


def test_error_classes_are_carried():
    raw = (FIXTURES / "wrk-2x4-mapped-c2.txt").read_text()
    data = parse_output(raw)
    data["errors"] = {"connect": 1, "read": 2, "write": 0, "status": 3, "timeout": 4}
    run = to_run(data, raw)
    assert (run.errors.connect, run.errors.read, run.errors.status, run.errors.timeout) == (1, 2, 3, 4)
    assert run.errors.total == 10


def test_worker_requests_from_real_stats():
    stats = json.loads((FIXTURES / "uwsgi-stats-2x4-mapped.json").read_text())
    counts = worker_requests(stats)
    assert set(counts) == {"1", "2"}
    assert counts == {str(w["id"]): w["requests"] for w in stats["workers"]}
    assert all(isinstance(v, int) for v in counts.values())


def test_default_matrix_follows_processes_and_threads():
    assert default_levels(2, 4) == (2, 4, 8)
    assert default_levels(4, 4) == (4, 8, 16)
    assert default_levels(3, 4) == (3, 6, 12)
    assert default_levels(1, 1) == (1,)
    # gunicorn at its best on the article's mix: without nginx's upstream keep-alive
    assert default_layouts(2, 4) == ("1x4-shared", "2x1-shared", "2x4-shared", "2x4-thunder", "2x4-mapped",
                                     "2x4-gunicorn@keepalive=off")
    assert default_layouts(1, 4) == ("1x4-shared", "1x1-shared", "1x4-thunder", "1x4-mapped",
                                     "1x4-gunicorn@keepalive=off")


def test_the_verdicts_cells_run_longer_than_the_context_cells():
    args = bench_cli.build_parser().parse_args(["compare", "--processes", "2"])
    plan, _ = compare.plan_from_args(args)
    assert plan.key_cells == (("2x4-mapped", 2), ("2x4-mapped", 4), ("2x4-shared", 2), ("2x4-shared", 4))
    assert plan.durations("2x4-mapped", (2, 4, 8)) == {2: 4, 4: 4, 8: 2}
    assert plan.durations("2x4-thunder", (2, 4, 8)) == {2: 2, 4: 2, 8: 2}
    # rounds added until decided: a key cell as long as in every other round (its rounds stay alike)
    assert plan.durations("2x4-mapped", (2, 8), added=True) == {2: 4, 8: 6}
    assert plan.arguments()["key_cells"][0] == ["2x4-mapped", 2] and plan.arguments()["key_duration"] == 4
    # never shorter than --duration; none without the pair, or for another app's requests
    longer, _ = compare.plan_from_args(bench_cli.build_parser().parse_args(
        ["compare", "--processes", "2", "--duration", "20"]))
    assert longer.durations("2x4-shared", (2,)) == {2: 20}
    without, _ = compare.plan_from_args(bench_cli.build_parser().parse_args(
        ["compare", "--processes", "2", "--layouts", "2x4-mapped,2x4-thunder"]))
    assert without.key_cells == () and without.durations("2x4-mapped", (2,)) == {2: 2}


def plan_like(results, **kw) -> Plan:
    a = results.arguments
    data = dict(layouts=tuple(a["layouts"]), concurrency=tuple(a["concurrency"]), repeats=a["repeats"],
                duration=a["duration"], warmup=2, processes=a["processes"], threads=a["threads"],
                scenarios=("article",), workload=results.workload)
    data.update(kw)
    return Plan(**data)


def test_blocks_are_interleaved():
    plan = Plan(layouts=("A", "B", "C"), concurrency=(1,), repeats=2, duration=1, warmup=1, processes=1,
                threads=1, scenarios=("article",), workload={})
    # reversed in even rounds: a steady drift of the machine cancels in the paired ratios
    assert [layout for _, layout in plan.blocks] == ["A", "B", "C", "C", "B", "A"]
    assert [r for r, _ in plan.blocks] == [1, 1, 1, 2, 2, 2]


def test_the_verdicts_pair_runs_as_one_paired_block():
    """The verdict's two layouts run as one block where the first of them stands in the round,
    both stacks up, each level measured on one and then the other; the order alternates by round."""
    args = bench_cli.build_parser().parse_args(["compare", "--processes", "2"])
    plan, _ = compare.plan_from_args(args)
    assert plan.pair == ("2x4-shared", "2x4-mapped")
    run = units(plan, plan.blocks)
    first, second = [[specs for r, specs in run if r == n] for n in (1, 2)]
    assert ("2x4-shared", "2x4-mapped") in first and ("2x4-mapped", "2x4-shared") in second
    assert all(len(specs) == 1 for specs in first + second if "2x4-mapped" not in specs)
    assert sorted(x for specs in first for x in specs) == sorted(plan.layouts)
    without, _ = compare.plan_from_args(bench_cli.build_parser().parse_args(
        ["compare", "--processes", "2", "--layouts", "2x4-mapped,2x4-thunder"]))
    assert without.pair == () and all(len(specs) == 1 for _, specs in units(without, without.blocks))


def test_a_paired_block_replays_level_by_level():
    stored = load(FIXTURES / "results-small.json")
    seen = []
    ReplayRunner(stored).run_pair(("2x4-shared", "2x4-mapped"), 1, [2, 4], ["article"],
                                  on_cell=lambda c: seen.append((c.layout, c.concurrency)))
    assert seen == [("2x4-shared", 2), ("2x4-mapped", 2), ("2x4-shared", 4), ("2x4-mapped", 4)]


def test_replay_runs_the_sweep_in_interleaved_order_and_reproduces_the_results():
    stored = load(FIXTURES / "results-small.json")
    plan = plan_like(stored)
    seen, saves = [], []
    stream = io.StringIO()
    progress = Progress(plan, stream=stream)
    replayed = run_sweep(plan, ReplayRunner(stored), stored.environment, save=saves.append,
                         progress=lambda c: (seen.append(c.key), progress(c)))
    # Order: all levels of layout A, then B, ... within repeat 1, then repeat 2 ...
    expected = [(layout, level, r) for r, layout in plan.blocks for level in plan.concurrency]
    assert seen == expected
    # A partial save after every block, then the complete one.
    assert len(saves) == len(plan.blocks) + 1
    assert saves[0].arguments["complete"] is False and saves[-1].arguments["complete"] is True
    assert len(saves[0].cells) == len(plan.concurrency)
    # Same cells, so the same conclusions.
    assert sorted(c.key for c in replayed.cells) == sorted(c.key for c in stored.cells)
    assert article_verdict(replayed) == article_verdict(stored)
    assert [g.rps.median for g in group_cells(replayed)] == [g.rps.median for g in group_cells(stored)]
    lines = stream.getvalue().splitlines()
    assert len(lines) == plan.cell_count
    assert lines[-1].startswith(f"[{plan.cell_count}/{plan.cell_count}]") and "0 cells left" in lines[-1]


def test_replay_refuses_a_cell_it_does_not_have():
    stored = load(FIXTURES / "results-small.json")
    plan = plan_like(stored, concurrency=(2, 3))
    with pytest.raises(ReplayError, match="at 3 connections"):
        run_sweep(plan, ReplayRunner(stored), {})


def test_progress_eta_counts_down():
    stored = load(FIXTURES / "results-small.json")
    plan = plan_like(stored)
    now = [0.0]
    progress = Progress(plan, stream=io.StringIO(), clock=lambda: now[0])
    first = progress.eta_seconds()
    assert first == pytest.approx(plan.estimate_seconds())
    for cell in stored.cells[:5]:
        now[0] += 10
        progress(cell)
    assert progress.eta_seconds() == pytest.approx(10 * (plan.cell_count - 5))


def test_default_plan_leaves_half_the_budget_to_the_rounds_until_decided():
    parser = bench_cli.build_parser()
    args = parser.parse_args(["compare", "--processes", "2"])
    plan, _ = compare.plan_from_args(args)
    assert plan.layouts == default_layouts(2, 4) and plan.concurrency == (2, 4, 8) and plan.repeats == 2
    assert plan.estimate_seconds() <= compare.AUTO_BUDGET_MIN * 60 / 2 + 10


@pytest.mark.parametrize("argv,field", [
    (["--duration", "0"], "--duration"),
    (["--duration", "soon"], "--duration"),
    (["--key-duration", "0"], "--key-duration"),
    (["--repeats", "0"], "--repeats"),
    (["--concurrency", "2,x"], "--concurrency"),
    (["--concurrency", "0"], "--concurrency"),
    (["--layouts", "0x4-mapped"], "processes"),
    (["--layouts", "2x4-bogus"], "strategy"),
    (["--scenario", "nope"], "--scenario"),
    (["--fib", "31"], "--fib"),
    (["--rounds", "20", "--io-ms", "2000"], "rounds*io_ms"),
    (["--stall-fraction", "0.9"], "--stall-fraction"),
    (["--transport", "udp"], "--transport"),
])
def test_bad_compare_arguments_exit_2_with_one_line(tmp_path, capsys, argv, field):
    out = tmp_path / "out"
    line = refusal(bench_cli.main, ["compare", "--out", str(out), *argv], capsys)
    assert names(line, field, "compare"), line
    assert not out.exists()


def test_report_refuses_unknown_version(tmp_path, capsys):
    data = json.loads((FIXTURES / "results-small.json").read_text())
    data["format_version"] = 999
    path = tmp_path / "results.json"
    path.write_text(json.dumps(data))
    assert bench_cli.main(["report", str(path)]) == 2
    assert "format_version 999" in capsys.readouterr().err
    with pytest.raises(ResultsError):
        load(path)


def test_compare_replay_writes_results_and_report(tmp_path, capsys):
    out = tmp_path / "replayed"
    assert bench_cli.main(["compare", "--replay", str(FIXTURES / "results-small.json"), "--out", str(out)]) == 0
    names = {p.name for p in out.iterdir()}
    assert {"results.json", "report.md", "report.txt", "throughput.png", "p99.png"} <= names
    replayed = load(out / "results.json")
    assert replayed.environment["replayed_from"].endswith("results-small.json")
    shown = capsys.readouterr().out
    # the headline, not the tables: those are in report.txt (or on the terminal with --full)
    assert "== the answer ==" in shown and "the article's claim (>= 1.25x" in shown and "Run here: " in shown
    assert "best at 2 connections" not in shown and "best at 2 connections" in (out / "report.txt").read_text()


def test_scenarios_resolve_stall_defaults():
    stall = SCENARIOS["stall"].resolved(threads=4)
    assert stall.stall.clients == 4 and stall.stall.wait_ms == 3000 and stall.stall.fraction == 0
    frac = SCENARIOS["stall"].resolved(threads=4, stall_fraction=0.1, stall_ms=500)
    assert frac.stall.clients == 0 and frac.stall.fraction == 0.1 and frac.stall.wait_ms == 500
    assert "io_ms=500" in frac.stall.query
    assert SCENARIOS["article"].resolved(threads=4).stall is None


def test_fraction_script_stalls_every_nth_request(tmp_path):
    path = fraction_script(tmp_path, "/?rounds=5", "/?rounds=1&fib=0&io_ms=3000", 0.1)
    text = path.read_text()
    assert "n % 10 == 0" in text and "io_ms=3000" in text
    assert "done = function" in text  # the JSON reporting hook is kept
