"""The capacity plan's arithmetic and parsing (bench.capacity, bench.kinds.plan's arguments and
check verdicts, its report lines): pure, no stack. The real run is tests/integration/test_plan.py."""

from __future__ import annotations

import pytest

from uwsgi_layouts.arguments import OneLineParser
from uwsgi_layouts.bench.capacity import (
    Plan,
    PlanError,
    RateStep,
    best_rate,
    check_verdict,
    interpolate,
    make_plan,
    next_rate,
    p99_ms,
    replicas_needed,
)
from uwsgi_layouts.bench.kinds.plan import add_arguments, check_counts, request_times, resolve_args
from uwsgi_layouts.bench.load.traffic import TrafficError
from uwsgi_layouts.bench.options import BadArgument
from uwsgi_layouts.bench.readings import met_rates, next_miss, validation_of
from uwsgi_layouts.bench.report.plan import check_lines, plan_lines, step_lines, validation_lines
from uwsgi_layouts.deploy.model import LayoutError


def step(rate, verdict="pass", p99=100.0, cpu=None, busy=None):
    return RateStep(rate=rate, verdict=verdict, p99_ms=p99, cpu_share=cpu, busy_ratio=busy)


def test_p99_nearest_rank_in_ms():
    assert p99_ms([]) is None
    assert p99_ms([0.1]) == 100.0
    times = [0.001 * i for i in range(1, 101)]  # 1..100 ms
    assert p99_ms(times) == 99.0
    assert p99_ms([0.010] * 98 + [0.500, 0.900]) == 500.0  # 99th of 100: the second slowest


def test_replicas_needed_is_ceil_plus_spare():
    assert replicas_needed(100, 10, 0.8) == 14  # ceil(12.5) + 1
    assert replicas_needed(30, 10, 0.75) == 5  # exactly 4 (no float creep to 5) + 1
    assert replicas_needed(1, 1000, 0.8, spare=0) == 1
    assert replicas_needed(100, 25, 1.0, spare=2) == 6
    for bad in ((0, 10, 0.8), (10, 0, 0.8), (10, 10, 0), (10, 10, 1.5)):
        with pytest.raises(ValueError):
            replicas_needed(*bad)


def test_best_rate_stops_at_the_first_miss():
    steps = [step(10), step(15), step(22.5, p99=400), step(18.75), step(34, p99=90)]
    assert best_rate(steps, 300) == 18.75  # 34 meets again above a miss: noise, not capacity
    assert best_rate([step(10, verdict="fail")], 300) is None
    assert best_rate([step(10, p99=301)], 300) is None
    assert best_rate([step(10, p99=None)], 300) is None  # nothing timed: not met


def test_next_rate_ladder_then_bisections_to_the_resolution():
    steps = [step(10)]
    assert next_rate(steps, 300, 1.5, 0.05, 2) == 15
    steps.append(step(15, p99=500))
    assert next_rate(steps, 300, 1.5, 0.05, 2) == 12.5
    steps.append(step(12.5))
    assert next_rate(steps, 300, 1.5, 0.05, 1) == 13.75
    assert next_rate(steps, 300, 1.5, 0.05, 0) is None  # no bisection left
    assert next_rate(steps, 300, 1.5, 0.25, 5) is None  # 15 is within 25% of 12.5: resolved
    steps.append(step(13.75, p99=400))
    assert next_rate(steps, 300, 1.5, 0.05, 5) == 13.12  # 13.75 is 10% above 12.5: not yet 5%
    steps.append(step(13.12))
    assert next_rate(steps, 300, 1.5, 0.05, 5) is None  # 13.75 is 4.8% above 13.12
    # The first rate misses: down the ladder, 3 rates in all, then no rate meets it.
    missed = [step(9, verdict="fail")]
    assert next_rate(missed, 300, 1.5, 0.05, 2) == 6
    missed.append(step(6, p99=400))
    assert next_rate(missed, 300, 1.5, 0.05, 2) == 4
    missed.append(step(4, p99=350))
    assert next_rate(missed, 300, 1.5, 0.05, 2) is None
    assert next_rate([step(0.12, verdict="fail")], 300, 1.5, 0.05, 2) is None  # below 0.1 req/s: no
    # ... and a lower rate that meets it turns the search back to bisections above it
    assert next_rate([step(9, verdict="fail"), step(6)], 300, 1.5, 0.05, 2) == 7.5
    with pytest.raises(ValueError):
        next_rate([], 300, 1.5)


def test_interpolate_between_and_clamped():
    pts = [(10, 0.2), (20, 0.4)]
    assert interpolate(pts, 15) == pytest.approx(0.3)
    assert interpolate(pts, 5) == 0.2 and interpolate(pts, 30) == 0.4
    assert interpolate([], 1) is None


def test_make_plan_from_steps():
    steps = [step(10, cpu=0.2, busy=0.1), step(20, cpu=0.4, busy=0.3), step(30, p99=900, cpu=0.9, busy=0.9)]
    plan = make_plan("2x2-mapped@cpus=1", 1.0, steps, target_rate=100, target_p99_ms=250, headroom=0.8, spare=1,
                     pss_mb=40)
    assert plan.per_replica_rate == 20 and plan.design_rate == 16
    assert plan.replicas == 8 and plan.serving == 7  # ceil(100 / 16) = 7, + 1
    assert plan.cpu_target == pytest.approx(0.32) and plan.busy_target == pytest.approx(0.22)
    assert plan.memory_total_mb == 320 and plan.memory_request_mb == 50
    data = plan.to_dict()
    assert data["replicas"] == 8 and len(data["steps"]) == 3 and data["steps"][2]["p99_ms"] == 900
    text = "\n".join(plan_lines(plan, next_miss(plan)))
    assert "PLAN: 8 replicas of 2x2-mapped@cpus=1 = ceil(100 / (20 x 0.8)) + 1 spare" in text
    assert "CPU utilisation target 32% of its limit (limits.cpu 1000m)" in text and "30 req/s did not" in text
    assert "MEMORY: 8 x 40 MB PSS = 320 MB; request 50 MB per replica" in text
    assert "no" in step_lines(plan, met_rates(plan.steps, 250))[-1]


def test_no_rate_meets_is_one_line_with_the_best_p99():
    steps = [step(5, p99=700), step(2.5, verdict="fail", p99=450)]
    with pytest.raises(PlanError) as info:
        make_plan("1x1-mapped@cpus=0.1", 0.1, steps, 10, 300)
    text = str(info.value)
    assert "\n" not in text and text.startswith("p99_ms: one replica of 1x1-mapped@cpus=0.1 cannot keep p99 within")
    assert "best p99 seen 450 ms at 2.5 req/s (fail)" in text and "from 2.5 req/s" in text


def test_rate_step_and_plan_validated_on_creation():
    with pytest.raises(ValueError):
        RateStep(rate=0, verdict="pass", p99_ms=1)
    with pytest.raises(ValueError):
        RateStep(rate=1, verdict="maybe", p99_ms=1)
    with pytest.raises(ValueError):
        RateStep(rate=1, verdict="pass", p99_ms=-1)
    with pytest.raises(ValueError):
        Plan("x", 1, 10, 100, 0.8, 1, per_replica_rate=10, replicas=1, cpu_target=None, busy_target=None,
             pss_mb=None)


def parse(*argv):
    p = OneLineParser(prog="uwsgi-layouts plan")
    add_arguments(p)
    return resolve_args(p.parse_args(argv))


def test_arguments(capsys):
    a = parse("--layout", "2x2-mapped@cpus=1", "--rate", "100", "--p99-ms", "250")
    assert (a.rate, a.p99_ms, a.headroom, a.spare, a.bisections, a.step) == (100, 250, 0.8, 1, 8, 15)
    assert (a.resolution, a.min_requests, a.timeout) == (0.05, 200, 5)
    assert parse("--layout", "1x1-mapped", "--rate", "1", "--p99-ms", "4000").timeout == 8  # 2 x the target
    for argv, field in ((("--layout", "1x1-mapped", "--p99-ms", "1"), "rate: give"),
                        (("--layout", "1x1-mapped", "--rate", "1"), "p99_ms: give"),
                        (("--rate", "1", "--p99-ms", "5"), "layout: give the pod"),
                        (("--layout", "1x1-mapped@replicas=2", "--rate", "1", "--p99-ms", "5"), "leave @replicas"),
                        (("--layout", "1x1-gunicorn", "--rate", "1", "--p99-ms", "5"), "stats server"),
                        (("--layout", "1x1-mapped", "--rate", "1", "--p99-ms", "3000", "--timeout", "3"),
                         "timeout: must be above the p99 target")):
        with pytest.raises(BadArgument, match=field):
            parse(*argv)
    # A value out of its range is refused while parsing, naming the option and the range.
    for argv, line in ((("--rate", "0"), "--rate: must be a number in (0, 100000], got 0"),
                       (("--rate", "x"), "--rate: must be a number in (0, 100000], got 'x'"),
                       (("--rate", "inf"), "--rate: must be a number in (0, 100000], got inf"),
                       (("--p99-ms", "-5"), "--p99-ms: must be a number in (0, 100000], got -5"),
                       (("--headroom", "1.2"), "--headroom: must be a number in 0.05..1, got 1.2"),
                       (("--step", "5"), "--step: must be a number in 15..600, got 5"),
                       (("--resolution", "0"), "--resolution: must be a number in 0.01..0.5, got 0"),
                       (("--min-requests", "5"), "--min-requests: must be an integer in 20..100000, got 5")):
        with pytest.raises(SystemExit) as exit_:
            parse("--layout", "1x1-mapped", "--rate", "1", "--p99-ms", "5", *argv)
        assert exit_.value.code == 2
        assert capsys.readouterr().err == f"uwsgi-layouts plan: error: argument {line}\n"
    with pytest.raises(LayoutError, match="cpus"):
        parse("--layout", "1x1-mapped@cpus=0", "--rate", "1", "--p99-ms", "5")


def test_your_requests_as_compare_takes_them(tmp_path):
    requests = tmp_path / "traffic.txt"
    requests.write_text("# two GETs, weighted\n3*GET /?rounds=1&fib=1&io_ms=10\nGET /healthz\n")
    a = parse("--layout", "1x1-mapped@cpus=0.5", "--rate", "5", "--p99-ms", "500", "--requests", str(requests))
    assert [r.target for r in a.mix.requests] == ["/?rounds=1&fib=1&io_ms=10", "/healthz"]
    assert a.arguments()["traffic"]["requests"] and a.arguments()["path"] == ""
    assert a.stack_options["access_log"] == "on"
    with pytest.raises(TrafficError, match="request: httperf .* sends GET requests only"):
        parse("--layout", "1x1-mapped", "--rate", "5", "--p99-ms", "500", "--request", "POST /x")
    with pytest.raises(TrafficError, match="path: your requests"):
        parse("--layout", "1x1-mapped", "--rate", "5", "--p99-ms", "500", "--request", "GET /", "--path", "/x")
    with pytest.raises(TrafficError, match="header: Authorization"):
        parse("--layout", "1x1-mapped", "--rate", "5", "--p99-ms", "500", "--request", "GET /", "--header",
              "Authorization: Bearer x")
    with pytest.raises(TrafficError, match="requests"):
        parse("--layout", "1x1-mapped", "--rate", "5", "--p99-ms", "500", "--requests", str(tmp_path / "none.txt"))


def plan_of(per_replica, cpus=0.5, target=40.0, headroom=0.8):
    return make_plan("1x2-mapped", cpus, [step(per_replica), step(per_replica * 2, p99=999)], target, 300, headroom)


def test_check_counts_fit_or_the_largest_that_fits():
    plan = plan_of(10)  # serving ceil(40 / 8) = 5 replicas of 0.5 CPU
    assert check_counts(plan, 4) == (5, 40.0, "")  # 2.5 CPUs fit 4
    assert check_counts(plan, 2) == (4, 32.0, "5 serving replicas x 0.5 CPUs do not fit this machine's 2 CPUs: "
                                              "checked the largest count that fits, 4, at the rate the plan gives "
                                              "it, 32 req/s")
    assert check_counts(plan_of(10, cpus=0.25), 2) == (5, 40.0, "")
    assert check_counts(plan_of(10, cpus=4), 2)[0] == 0


def test_check_verdicts():
    run = lambda n, meets: {"replicas": n, "rate": 40, "meets": meets, "p99_ms": 100 if meets else 900,  # noqa: E731
                            "verdict": "pass" if meets else "fail"}
    assert check_verdict(3, [run(3, True), run(2, False)], 300).startswith("CONFIRMED: 3 replicas met p99 300 ms at "
                                                                          "40 req/s and 2 did not")
    assert check_verdict(3, [run(3, False)], 300).startswith("UNDERSIZED: 3 replicas missed")
    text = check_verdict(4, [run(4, True), run(3, True), run(2, False)], 300)
    assert text == "OVERSIZED by 1 replica (25%): 3 met p99 300 ms at 40 req/s, 2 did not"
    check = {"rate": 40, "note": "", "verdict": text,
             "runs": [run(4, True) | {"per_replica_rate": 10, "predicted": True}]}
    assert check_lines(check)[-1] == f"CHECK: {text}"


def test_request_times_from_the_access_log(tmp_path):
    log = tmp_path / "access.log"
    log.write_text('127.0.0.1 [27/Nov/2026:07:00:00 +0000] "GET /healthz HTTP/1.1" 200 0.001 upstream=unix:/x '
                   'upstream_time=0.001\n')
    offset = log.stat().st_size
    with open(log, "a") as f:
        f.write('127.0.0.1 [27/Nov/2026:07:00:01 +0000] "GET /?a=1 HTTP/1.0" 200 0.120 upstream=unix:/x '
                'upstream_time=0.119\n')
        f.write("garbage\n")
        f.write('127.0.0.1 [27/Nov/2026:07:00:01 +0000] "GET /?a=1 HTTP/1.0" 502 0.005 upstream=- upstream_time=-\n')
    assert request_times(log, offset) == [0.12, 0.005]
    assert request_times(tmp_path / "missing.log", 0) == []


def test_validation_lines():
    rows = [{"replicas": 1, "rate": 4.5, "per_replica_rate": 4.5, "plan_per_replica_rate": 4.58, "difference": 0.0178,
             "resolution": 0.04},
            {"replicas": 2, "rate": None, "per_replica_rate": None, "plan_per_replica_rate": 4.58, "difference": None},
            {"replicas": 3, "rate": 12, "per_replica_rate": 4, "plan_per_replica_rate": 4.58, "difference": 0.145,
             "resolution": None}]
    rows[2]["steps"] = [RateStep(12, "pass", 900, cpu_share=0.61, client_cpu_pct=42.5).to_dict(),
                        RateStep(13, "fail", 3000, cpu_share=0.66, client_cpu_pct=30).to_dict()]
    lines = validation_lines(rows, validation_of(rows))
    assert lines[0].startswith("VALIDATION:")
    assert lines[4].split()[-2:] == ["61%", "42.5%"]  # at the count's capacity: the replicas' CPU, httperf's
    assert lines[2].split() == ["1", "4.5", "4.5", "4%", "4.58", "+2%", "-", "-"]
    assert lines[3].split() == ["2", "-", "-", "-", "4.58", "-", "-", "-"]
    assert lines[-1] == ("VALIDATION: the plan's rate per replica is NOT within 10% of every count measured (largest "
                         "difference +14%, 3 replica(s))")
    first = validation_lines(rows[:1], validation_of(rows[:1]))[-1]
    assert first.startswith("VALIDATION: the plan's rate per replica is within 10%")
