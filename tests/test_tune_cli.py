"""``python -m bench tune`` refuses bad input with one line and exit 2, before anything starts or is
written (no results directory). In-process through ``bench.cli.main``; nothing is measured."""

from __future__ import annotations

import pytest

from bench.cli import main
from bench.kinds import tune as kind
from bench.load.scenarios import SCENARIOS


@pytest.mark.parametrize("args, expected", [
    (["--p99-ms", "0"], "error: p99_ms: must be a number in 1..600000, got 0"),
    (["--p99-ms", "fast"], "error: p99_ms: must be a number in 1..600000, got 'fast'"),
    (["--memory-mb", "-5"], "error: memory_mb: must be a number in 1..1e+06, got -5"),
    (["--budget", "0"], "error: budget: must be a number in 1..1440, got 0"),
    (["--budget", "5000"], "error: budget: must be a number in 1..1440, got 5000"),
    (["--budget", "1"], "error: budget: 1 min is too short to screen 15 candidates"),
    (["--concurrency", "0"], "error: concurrency: must be an integer in 1..1000, got 0"),
    (["--concurrency", "999", "--max-processes", "2", "--threads", "1,2"],
     "error: concurrency: no candidate holds 999 requests in flight"),
    (["--strategies", ""], "error: strategies: give at least one of shared, thunder, mapped, overflow"),
    (["--strategies", " , "], "error: strategies: give at least one of"),
    (["--strategies", "mapped,fastest"], "error: strategies: unknown strategy 'fastest'; allowed: shared, thunder"),
    (["--stall-share", "0.7"], "error: stall_share: must be a number in 0..0.5, got 0.7"),
    (["--stall-share", "0"], "error: stall_share: must be a share in (0, 0.5], got 0"),
    (["--stall-ms", "3000"], "error: stall_ms: only with --stall-share"),
    (["--stall-share", "0.05", "--stall-ms", "0"], "error: stall_ms: must be an integer in 1..60000, got 0"),
    (["--threads", ""], "error: threads: give at least one thread count"),
    (["--threads", "4,0"], "error: threads: must be an integer in 1..256, got 0"),
    (["--max-processes", "0"], "error: max_processes: must be an integer in 1..256, got 0"),
    (["--scenario", "stall"], "error: scenario: unknown or not a steady mix 'stall'"),
    (["--transport", "udp"], "error: transport: must be tcp or unix, got 'udp'"),
    (["--request", "GET"], "error: request: 'GET' is not a request line"),
    (["--app", "nope"], "error: app: expected an importable module:callable"),
    (["--replay", "/nonexistent/results.json"], "error: /nonexistent/results.json: cannot read results JSON"),
])
def test_bad_input_exits_2_with_one_line_and_writes_nothing(args, expected, tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["tune", *args, "--out", str(out)])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith(expected), lines
    assert not out.exists()


def test_a_peer_is_refused_until_bench_can_measure_it(tmp_path, capsys, monkeypatch):
    """Peers (gunicorn, granian) join the list once bench measures their cells
    (``MEASURED_SERVERS``); until then, one line says which strategies are measurable."""
    monkeypatch.setattr(kind, "MEASURED_SERVERS", ("uwsgi",))
    out = tmp_path / "run"
    assert main(["tune", "--strategies", "mapped,gunicorn", "--out", str(out)]) == 2
    line = capsys.readouterr().err.strip()
    assert line.startswith("error: strategies: gunicorn runs gunicorn, whose cells bench cannot measure yet")
    assert "measurable now: shared, thunder, mapped, overflow" in line and not out.exists()


def test_a_replay_of_another_kind_is_refused(tmp_path, capsys):
    from tests.fixtures.make_fixture import OUT_TAILS

    out = tmp_path / "run"
    assert main(["tune", "--replay", str(OUT_TAILS), "--out", str(out)]) == 2
    assert capsys.readouterr().err.strip().startswith("error: replay: ") and not out.exists()


def test_steady_scenarios_offered_are_the_demo_mixes():
    assert kind.record.steady_scenarios() == ["article", "io-heavy", "cpu-heavy"]
    assert all(SCENARIOS[n].stall is None for n in kind.record.steady_scenarios())
