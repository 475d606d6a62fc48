"""``uwsgi-layouts tune`` refuses bad input with one line and exit 2, before anything starts or is
written (no results directory). In-process through ``bench.cli.main``; nothing is measured."""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

import pytest

from uwsgi_layouts.bench.cli import main
from uwsgi_layouts.bench.kinds import tune as kind
from uwsgi_layouts.bench.load.scenarios import SCENARIOS

PARSE = "uwsgi-layouts tune: error: argument "  # a value refused while parsing names its option


def exit_code(argv: list[str]) -> int:
    """bench.cli.main's exit status: returned, or raised by the parser (a value out of its range)."""
    try:
        return main(argv)
    except SystemExit as exc:
        return exc.code


@pytest.mark.parametrize("args, expected", [
    (["--p99-ms", "0"], PARSE + "--p99-ms: must be a number in 1..600000, got 0"),
    (["--p99-ms", "fast"], PARSE + "--p99-ms: must be a number in 1..600000, got 'fast'"),
    (["--memory-mb", "-5"], PARSE + "--memory-mb: must be a number in 1..1e+06, got -5"),
    (["--budget", "0"], PARSE + "--budget: must be a number in 1..1440, got 0"),
    (["--budget", "5000"], PARSE + "--budget: must be a number in 1..1440, got 5000"),
    (["--budget", "1"], "error: budget: 1 min is too short to screen 15 candidates"),
    (["--concurrency", "0"], PARSE + "--concurrency: must be an integer in 1..1000, got 0"),
    (["--concurrency", "999", "--max-processes", "2", "--threads", "1,2"],
     "error: concurrency: no candidate holds 999 requests in flight"),
    (["--strategies", ""], PARSE + "--strategies: give at least one of shared, thunder, mapped, overflow"),
    (["--strategies", " , "], PARSE + "--strategies: give at least one of"),
    (["--strategies", "mapped,fastest"], PARSE + "--strategies: unknown strategy 'fastest'; allowed: shared, thunder"),
    (["--stall-share", "0.7"], PARSE + "--stall-share: must be a share in (0, 0.5], got 0.7"),
    (["--stall-share", "0"], PARSE + "--stall-share: must be a share in (0, 0.5], got 0"),
    (["--stall-ms", "3000"], "error: stall_ms: only with --stall-share"),
    (["--stall-share", "0.05", "--stall-ms", "0"], PARSE + "--stall-ms: must be an integer in 1..60000, got 0"),
    (["--threads", ""], PARSE + "--threads: give at least one thread count"),
    (["--threads", "4,0"], PARSE + "--threads: must be an integer in 1..256, got 0"),
    (["--max-processes", "0"], PARSE + "--max-processes: must be an integer in 1..256, got 0"),
    (["--scenario", "stall"], "error: scenario: unknown or not a steady mix 'stall'"),
    (["--transport", "udp"], PARSE + "--transport: invalid choice: 'udp'"),
    (["--request", "GET"], "error: request: 'GET' is not a request line"),
    (["--app", "nope"], "error: app: expected module:callable"),
    (["--replay", "/nonexistent/results.json"], "error: /nonexistent/results.json: cannot read results JSON"),
])
def test_bad_input_exits_2_with_one_line_and_writes_nothing(args, expected, tmp_path, capsys):
    out = tmp_path / "run"
    code = exit_code(["tune", *args, "--out", str(out)])
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
    assert exit_code(["tune", "--strategies", "mapped,gunicorn", "--out", str(out)]) == 2
    line = capsys.readouterr().err.strip()
    assert line.startswith(PARSE + "--strategies: gunicorn runs gunicorn, whose cells bench cannot measure yet")
    assert "measurable now: shared, thunder, mapped, overflow" in line and not out.exists()


def test_a_replay_of_another_kind_is_refused(tmp_path, capsys):
    from tests.fixtures.make_fixture import OUT_TAILS

    out = tmp_path / "run"
    assert main(["tune", "--replay", str(OUT_TAILS), "--out", str(out)]) == 2
    assert capsys.readouterr().err.strip().startswith("error: replay: ") and not out.exists()


def test_steady_scenarios_offered_are_the_demo_mixes():
    assert kind.record.steady_scenarios() == ["article", "hello", "io-heavy", "cpu-heavy", "overhead"]
    assert all(SCENARIOS[n].stall is None for n in kind.record.steady_scenarios())


# ------------------------------------------------------------------------------ the lab's stall middleware


def test_the_stall_middleware_holds_the_thread_and_passes_everything_else(tmp_path, monkeypatch):
    """app/tune_stall.py, called directly: it imports nothing of this project, loads the app from
    its directory, holds ``/?ul_tune_stall_ms=N`` for N ms and answers it itself."""
    from uwsgi_layouts.app import tune_stall

    (tmp_path / "toyapp.py").write_text(
        "def app(environ, start_response):\n"
        "    start_response('200 OK', [('Content-Type', 'text/plain')])\n"
        "    return [b'toy ' + environ.get('QUERY_STRING', '').encode()]\n")
    monkeypatch.chdir("/")
    monkeypatch.setattr(sys, "path", list(sys.path))  # load() puts the app's directory first
    monkeypatch.delitem(sys.modules, "toyapp", raising=False)
    wrapped = tune_stall.wrap(tune_stall.load("toyapp:app", str(tmp_path)))
    assert os.getcwd() == str(tmp_path) and sys.path[0] == str(tmp_path)  # as uWSGI's chdir and pythonpath
    seen = {}

    def start_response(status, headers):
        seen["status"], seen["headers"] = status, headers

    assert wrapped({"PATH_INFO": "/", "QUERY_STRING": "page=2"}, start_response) == [b"toy page=2"]
    start = time.monotonic()
    assert wrapped({"PATH_INFO": "/", "QUERY_STRING": "ul_tune_stall_ms=200"}, start_response) == [b"stalled\n"]
    assert time.monotonic() - start >= 0.2 and seen["status"] == "200 OK"
    # only the whole query on / is the stall: anything else is the app's
    assert wrapped({"PATH_INFO": "/x", "QUERY_STRING": "ul_tune_stall_ms=5"}, start_response) == [
        b"toy ul_tune_stall_ms=5"]
    assert wrapped({"PATH_INFO": "/", "QUERY_STRING": "ul_tune_stall_ms=5&a=1"}, start_response) == [
        b"toy ul_tune_stall_ms=5&a=1"]
    assert tune_stall.stall_ms({"PATH_INFO": "/", "QUERY_STRING": "ul_tune_stall_ms=999999"}) == 60000
    (tmp_path / "toyfactory.py").write_text(  # an app factory, called once with its literal arguments
        "def create_app(word, punct='.'):\n"
        "    def app(environ, start_response):\n"
        "        start_response('200 OK', [])\n"
        "        return [(word + punct).encode()]\n"
        "    return app\n")
    monkeypatch.delitem(sys.modules, "toyfactory", raising=False)
    made = tune_stall.wrap(tune_stall.load("toyfactory:create_app('hi', punct='!')", str(tmp_path)))
    assert made({"PATH_INFO": "/", "QUERY_STRING": ""}, start_response) == [b"hi!"]
    source = Path(tune_stall.__file__).read_text()  # the copy runs alone, in the app's virtualenv
    assert not re.search(r"^(from|import) (bench|deploy|app)\b", source, re.M)
