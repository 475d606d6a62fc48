"""What plan's one-connection warm-up proves (bench.warm_up): the rule that refuses a plan before
any step, each of its parts at its edge, the warm-up's figures validated and stored, the requests
it counts from nginx's log, and a refused run's report rendered again from plan.json. Pure, no
stack; the real refusal is tests/integration/test_plan.py."""

from __future__ import annotations

import json

import pytest

from uwsgi_layouts.bench import cli
from uwsgi_layouts.bench.capacity import PlanError
from uwsgi_layouts.bench.kinds.plan import answered_times, request_times
from uwsgi_layouts.bench.report.plan import read_plan, write_plan_reports
from uwsgi_layouts.bench.results import ResultsError
from uwsgi_layouts.bench.warm_up import LOAD_MARGIN, MIN_TIMED, RuledOut, WarmUp, ruled_out

LAYOUT = "1x1-mapped@cpus=0.5"


def warm(fastest_ms=101.0, timed=12, throttled_s=0.0, p99=130.0) -> WarmUp:
    return WarmUp(seconds=2.01, rate=9.5, timed=timed, fastest_ms=fastest_ms, p99_ms=p99, throttled_s=throttled_s)


def test_every_request_slower_than_the_target_refuses_in_one_line():
    refusal = ruled_out(LAYOUT, warm(), 50, threads=1)
    assert isinstance(refusal, RuledOut) and isinstance(refusal, PlanError)
    assert str(refusal) == ("p99_ms: one replica of 1x1-mapped@cpus=0.5 cannot keep p99 within 50 ms: its fastest "
                            "request with one connection took 101 ms (12 timed in the warm-up), and no rate is "
                            "faster than one connection: give a --p99-ms above it")
    assert refusal.warm_up == warm()
    assert ruled_out(LAYOUT, warm(fastest_ms=40), 50, threads=1) is None  # one request within it: the ladder


def test_two_of_nginx_milliseconds_above_a_small_target():
    # logged 7: took more than 6 ms; a step's request as long may be logged 6, never 5
    assert ruled_out(LAYOUT, warm(fastest_ms=7), 5, threads=1) is not None
    assert ruled_out(LAYOUT, warm(fastest_ms=7), 5.5, threads=1) is None
    assert ruled_out(LAYOUT, warm(fastest_ms=7), 6, threads=1) is None


def test_a_fastest_request_only_just_past_the_target_is_left_to_the_ladder():
    # other load may have slowed the seconds of warm-up: refused from LOAD_MARGIN x the target on
    assert LOAD_MARGIN == 1.2
    assert ruled_out(LAYOUT, warm(fastest_ms=60), 50, threads=1) is not None
    assert ruled_out(LAYOUT, warm(fastest_ms=59), 50, threads=1) is None
    assert ruled_out(LAYOUT, warm(fastest_ms=101), 99, threads=1) is None


def test_too_few_requests_or_no_more_than_the_workers_prove_nothing():
    assert ruled_out(LAYOUT, warm(timed=MIN_TIMED - 1), 50, threads=1) is None
    assert ruled_out(LAYOUT, warm(timed=MIN_TIMED), 50, threads=1) is not None
    # 12 threads (processes x threads): 12 requests could each be a thread's first
    assert ruled_out("12x1-mapped@cpus=0.5", warm(timed=12), 50, threads=12) is None
    assert ruled_out("12x1-mapped@cpus=0.5", warm(timed=13), 50, threads=12) is not None
    assert ruled_out(LAYOUT, WarmUp(seconds=2, rate=0, timed=0, fastest_ms=None, p99_ms=None), 50, 1) is None


def test_the_quotas_throttling_is_taken_off_the_fastest_request():
    # 101 ms of which up to 40 waited on the quota: 61 unthrottled, still 1.2 x 50 or more
    refusal = ruled_out(LAYOUT, warm(throttled_s=0.04), 50, threads=1)
    assert refusal is not None and "(12 timed in the warm-up, 40 ms of the warm-up throttled by the quota)" in str(
        refusal)
    # up to 50 ms: 51 unthrottled, within 1.2 x 50 (and a step's request might log it as 50)
    assert ruled_out(LAYOUT, warm(throttled_s=0.05), 50, threads=1) is None
    # a small target, where the 2 ms decide: 47 less 40 throttled is 7, past 5 + 2; less 42, 5
    assert ruled_out(LAYOUT, warm(fastest_ms=47, throttled_s=0.04), 5, threads=1) is not None
    assert ruled_out(LAYOUT, warm(fastest_ms=47, throttled_s=0.042), 5, threads=1) is None
    # back to back under a quota (each request finds what the last left of the period): no proof
    assert ruled_out(LAYOUT, warm(fastest_ms=160, throttled_s=0.9, p99=240), 120, threads=1) is None


def test_warm_up_figures_validated_and_stored():
    figures = WarmUp.of(2.01, 9.54321, [0.101, 0.104, 0.102], throttled_s=0.0)
    assert figures == WarmUp(seconds=2.01, rate=9.543, timed=3, fastest_ms=101.0, p99_ms=104.0, throttled_s=0.0)
    assert WarmUp.from_dict(figures.to_dict()) == figures
    assert WarmUp.of(1, 0, []).fastest_ms is None
    for bad in ({"timed": -1}, {"fastest_ms": None}, {"rate": float("nan")}, {"throttled_s": -0.1},
                {"fastest_ms": 200.0}):
        with pytest.raises(ValueError, match="warm_up."):
            WarmUp(**(warm().__dict__ | bad))
    with pytest.raises(ValueError, match="warm_up: missing p99_ms"):
        WarmUp.from_dict({k: v for k, v in warm().to_dict().items() if k != "p99_ms"})


LOG = """\
127.0.0.1 [28/Nov/2026:03:40:00 +0000] "GET /healthz HTTP/1.1" 200 0.000 upstream=unix:/r/a upstream_time=0.000
127.0.0.1 [28/Nov/2026:03:40:01 +0000] "GET /?io_ms=100 HTTP/1.1" 200 0.102 upstream=unix:/r/a upstream_time=0.101
127.0.0.1 [28/Nov/2026:03:40:01 +0000] "GET /?io_ms=100 HTTP/1.1" 200 0.101 upstream=unix:/r/a upstream_time=0.101
127.0.0.1 [28/Nov/2026:03:40:01 +0000] "GET /?io_ms=100 HTTP/1.1" 502 0.003 upstream=unix:/r/a upstream_time=0.003
127.0.0.1 [28/Nov/2026:03:40:02 +0000] "GET /?io_ms=100 HTTP/1.1" 499 0.041 upstream=unix:/r/a upstream_time=-
"""


def test_the_warm_up_counts_the_requests_nginx_answered_after_its_start(tmp_path):
    log = tmp_path / "access.log"
    log.write_text(LOG)
    offset = len(LOG.splitlines(keepends=True)[0])  # the healthz poll came before the warm-up
    # wrk's last request, cut at its duration (499 after 41 ms), and a fast error say nothing of the request's time
    assert answered_times(log, offset) == [0.102, 0.101]
    assert request_times(log, offset) == [0.102, 0.101, 0.003, 0.041]  # a step's: every request (errors fail it)


def refused_plan() -> dict:
    line = str(ruled_out(LAYOUT, warm(), 50, threads=1))
    return {"format_version": 2, "kind": "plan", "load_before": "1.00 1.00 1.00", "load_after": "1.10 1.00 1.00",
            "arguments": {"layout": LAYOUT, "rate": 20, "p99_ms": 50, "min_requests": 40, "resolution": 0.05},
            "warm_up": warm().to_dict(), "steps": [], "plan": None, "error": line,
            "judgement": {"met": [], "next_miss": None, "validation": None}}


def test_a_refused_runs_report_renders_again_from_plan_json(tmp_path, capsys):
    (tmp_path / "plan.json").write_text(json.dumps(refused_plan()))
    lines = write_plan_reports(tmp_path / "first", read_plan(tmp_path / "plan.json"))
    assert lines[1] == ("warm-up: one connection for 2.01 s, 9.5 req/s; 12 answered requests timed, fastest 101 ms, "
                        "p99 130 ms; the replica throttled 0 ms")
    assert "One replica under its quota: no rate offered (the warm-up ruled every rate out)" in lines
    assert lines[-1] == f"NO PLAN: {refused_plan()['error']}"
    assert cli.main(["report", str(tmp_path), "--out", str(tmp_path / "again")]) == 0
    assert (tmp_path / "again" / "report.txt").read_text().splitlines() == lines
    bad = refused_plan() | {"warm_up": warm().to_dict() | {"timed": -3}}
    (tmp_path / "plan.json").write_text(json.dumps(bad))
    with pytest.raises(ResultsError, match=r"a bad plan, step or warm-up \(warm_up.timed"):
        read_plan(tmp_path / "plan.json")
    capsys.readouterr()
