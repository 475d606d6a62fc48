"""The plan's pass rule at one rate (``bench.capacity.judge_rate``) and its search
(``search_capacity``), on replayed steps: httperf's real output of last session's 15-s steps
(tests/fixtures/plan-steps), and a modelled replica whose capacity is known. Pure, no stack."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from uwsgi_layouts.bench import cli
from uwsgi_layouts.bench.analysis import judge_step
from uwsgi_layouts.bench.capacity import (
    PlanError,
    RateStep,
    best_rate,
    judge_rate,
    make_plan,
    resolved,
    search_capacity,
    steady_samples,
    step_seconds,
)
from uwsgi_layouts.bench.load.httperf import parse
from uwsgi_layouts.bench.report.plan import read_plan, write_plan_reports
from uwsgi_layouts.bench.results import ResultsError

FIXTURES = Path(__file__).parent / "fixtures" / "plan-steps"


def recorded(rate: str) -> dict:
    return parse((FIXTURES / f"httperf-step-{rate}.txt").read_text())


def test_step_seconds_hold_the_requests_in_whole_samples():
    assert step_seconds(7) == 30  # 200 / 7 = 28.6 s, up to the next 5-s sample
    assert step_seconds(2.96) == 70
    assert step_seconds(100) == 15  # the shortest step
    assert step_seconds(100, min_step_s=17) == 20
    assert step_seconds(4, 200) == 50  # exactly 50 s: not 55
    # validation: 3 replicas at 21 req/s get the step one replica gets at 7 req/s (steps sized per replica)
    assert step_seconds(21 / 3) == step_seconds(7)
    with pytest.raises(ValueError):
        step_seconds(0)


def test_recorded_step_that_kept_up_passes_where_openloops_rule_failed_it():
    """2.96 req/s for 15 s: one steady sample of 14 replies (2.8/s, 95% of 2.96 is 2.81): openloop's
    lowest-sample rule failed it by one reply; 14 of 14.8 is within the edges' two replies."""
    parsed = recorded("2.96")
    assert judge_step(2.96, parsed)[0] == "fail"
    judged = judge_rate(2.96, parsed, requests_logged=44)
    assert judged.verdict == "pass", judged.reasons
    assert judged.kept_up == pytest.approx(14 / 14.8, abs=1e-3) and judged.errors == 0


def test_recorded_steps_at_and_above_capacity():
    """The same replica at 7.32 req/s kept up (75 steady replies for 73.2 sent), and at 8.23 it
    did not (33 in the one steady sample inside the sending, 41 sent): a capacity near 7.3."""
    assert judge_rate(7.32, recorded("7.32"), requests_logged=110).verdict == "pass"
    judged = judge_rate(8.23, recorded("8.23"), requests_logged=123)
    assert judged.verdict == "fail" and judged.reasons[0].startswith("replies fell behind: 33 in 1 steady 5-s")
    assert judged.kept_up == pytest.approx(33 / 41.15, abs=1e-3)


def httperf_summary(rate: float, seconds: float, served: float, errors: dict | None = None, status5xx: int = 0,
                    drain: int = 0) -> dict:
    """httperf's parsed summary of ``seconds`` at ``rate`` against a server replying ``served``/s
    at most: the first sample short (the ramp), ``drain`` samples after the sending."""
    conns = round(rate * seconds)
    steady = min(rate, served)
    each = [round(steady * 0.8, 1)] + [round(steady, 1)] * (int(seconds // 5) - 1) + [1.0] * drain
    e = {"client_timo": 0, "socket_timo": 0, "connrefused": 0, "connreset": 0, "fd_unavail": 0, "addrunavail": 0,
         "ftab_full": 0, "other": 0} | (errors or {})
    failed = sum(e.values())
    return {"connections": conns, "requests": conns, "replies": conns - failed,
            "reply_rate": {"min": min(each), "avg": steady, "max": max(each), "stddev": 0, "samples": len(each),
                           "each": each},
            "status": {"1xx": 0, "2xx": conns - failed - status5xx, "3xx": 0, "4xx": 0, "5xx": status5xx},
            "errors": {"total": failed, **e}}


def test_the_rule_counts_errors_and_catches_a_small_shortfall_over_a_long_step():
    assert judge_rate(7, httperf_summary(7, 30, 7), 210).verdict == "pass"
    # 4.3% short over 5 steady samples (175 sent, 167.5 replied: httperf's samples have one decimal):
    # more than 2 replies and 3%
    short = judge_rate(7, httperf_summary(7, 30, 6.7), 210)
    assert short.verdict == "fail" and "replies fell behind" in short.reasons[0]
    # 1.4% short (6.9/s): within the 3% the rule allows
    assert judge_rate(7, httperf_summary(7, 30, 6.9), 210).verdict == "pass"
    timed_out = judge_rate(7, httperf_summary(7, 30, 7, errors={"client_timo": 3}), 207)
    assert timed_out.verdict == "fail" and timed_out.errors == 3 and "3 server-side error(s): client_timo=3" in \
        timed_out.reasons[0]
    failed = judge_rate(7, httperf_summary(7, 30, 7, status5xx=2), 210)
    assert failed.verdict == "fail" and failed.errors == 2 and "5xx=2" in failed.reasons[0]
    unlogged = judge_rate(7, httperf_summary(7, 30, 7), 200)
    assert unlogged.verdict == "fail" and unlogged.reasons == ("nginx logged 200 of 210 requests",)
    client = judge_rate(7, httperf_summary(7, 30, 7, errors={"fd_unavail": 1}), 210)
    assert client.verdict == "invalid" and "load generator" in client.reasons[0]
    one_sample = httperf_summary(7, 5, 7)
    assert judge_rate(7, one_sample, 35).verdict == "invalid"  # the ramp only: nothing steady to judge


def test_steady_samples_leave_out_the_ramp_and_the_drain():
    # 30 s of sending; httperf went on sampling 2 more windows while the backlog drained
    assert steady_samples([5.6, 7, 7, 7, 7, 7, 3, 0.4], 30) == [7, 7, 7, 7, 7]
    assert steady_samples([5.6, 7, 7], 14.9) == [7]  # the third window ends after the sending
    assert steady_samples([5.6], 30) == []
    # a backlog draining after an overloaded step does not count as keeping up
    drained = httperf_summary(8, 30, 7, drain=2)
    assert judge_rate(8, drained, 240).verdict == "fail"


class ModelReplica:
    """A replica that serves ``capacity`` req/s: below it the p99 is its service time, above it
    requests queue for the rest of the step (the backlog grows by rate - capacity each second).
    ``offer`` judges each step with the real rule on httperf's summary the model would give."""

    def __init__(self, capacity: float, service_ms: float = 150, min_requests: int = 200):
        self.capacity, self.service_ms, self.min_requests = capacity, service_ms, min_requests
        self.offered: list[tuple[float, int]] = []

    def offer(self, rate: float) -> RateStep:
        seconds = step_seconds(rate, self.min_requests)
        self.offered.append((rate, seconds))
        backlog_s = max(0.0, (rate - self.capacity) * seconds / self.capacity)
        p99 = self.service_ms + 1000 * backlog_s
        parsed = httperf_summary(rate, seconds, self.capacity)
        judged = judge_rate(rate, parsed, parsed["requests"])
        return RateStep(rate=rate, verdict=judged.verdict, p99_ms=round(p99, 1), reasons=judged.reasons,
                        requests_logged=parsed["requests"], errors=judged.errors, kept_up=judged.kept_up,
                        step_s=seconds)


@pytest.mark.parametrize("capacity", [2.9, 7.3, 43.0, 180.0])
def test_the_search_finds_a_known_capacity_within_its_resolution(capacity):
    replica = ModelReplica(capacity)
    steps = search_capacity(replica.offer, start=round(capacity / 3, 2), target_p99_ms=2500, resolution=0.05)
    found = best_rate(steps, 2500)
    gap = resolved(steps, 2500)
    assert gap is not None and gap <= 0.05 + 1e-3, [(s.rate, s.verdict) for s in steps]
    # what the rule lets through above the capacity: within 3% (KEPT_UP), never more
    assert capacity * (1 - 0.05 - 1e-3) <= found <= capacity * 1.03, (found, [(s.rate, s.verdict) for s in steps])
    assert len(steps) <= 10
    assert all(requests >= 200 for rate, seconds in replica.offered for requests in [math.floor(rate * seconds)])


def test_a_tight_p99_ends_the_search_below_the_rate_the_replies_keep_up_with():
    # 2.5 s of p99 allows some backlog; 300 ms does not: the p99, not the replies, decides
    replica = ModelReplica(10, service_ms=200)
    steps = search_capacity(replica.offer, start=4, target_p99_ms=300, resolution=0.05)
    assert best_rate(steps, 300) <= 10 and all(s.verdict == "pass" for s in steps if s.rate <= 10)


def test_bisections_are_capped():
    replica = ModelReplica(7.3)
    steps = search_capacity(replica.offer, start=2, target_p99_ms=2500, resolution=0.01, bisections=1)
    first_miss = next(i for i, s in enumerate(steps) if not s.meets(2500))
    assert len(steps) - 1 - first_miss == 1


def test_rungs_down_the_ladder_are_not_bisections():
    """A first rate above the capacity: down the ladder to a rate that meets it, then bisections
    (one here), as the validation's searches start at 0.8 x count x the plan's rate."""
    replica = ModelReplica(3.5)
    steps = search_capacity(replica.offer, start=5.33, target_p99_ms=2500, resolution=0.01, bisections=1)
    assert [s.rate for s in steps] == [5.33, 3.55, 4.44]


def test_a_p99_no_rate_meets_ends_three_rates_down_the_ladder_in_one_line():
    """What the warm-up cannot rule out (bench.warm_up: too few requests timed, or a quota that held
    them) the ladder decides: a replica whose every request takes 100 ms, against 50, at the
    integration test's 40 requests a step: the first rate misses, two more down the ladder, 15 s
    each, then no plan, with the best p99 seen and the lowest rate tried."""
    replica = ModelReplica(10, service_ms=100, min_requests=40)
    steps = search_capacity(replica.offer, start=6, target_p99_ms=50, bisections=0)
    assert [s.rate for s in steps] == [6, 4, 2.67] and all(s.verdict == "pass" for s in steps)
    assert [seconds for _, seconds in replica.offered] == [15, 15, 15]
    with pytest.raises(PlanError) as info:
        make_plan("1x1-mapped@cpus=0.5", 0.5, steps, 20, 50)
    line = str(info.value)
    assert "\n" not in line and line.startswith("p99_ms: one replica of 1x1-mapped@cpus=0.5 cannot keep p99 within "
                                                "50 ms at any rate tried (from 2.67 req/s); best p99 seen 100 ms")


def plan_data(tmp_path: Path) -> dict:
    steps = [RateStep(rate=r, verdict=v, p99_ms=p, cpu_share=c, busy_ratio=b, requests_logged=n, kept_up=k,
                      step_s=t, throttled_share=0.1)
             for r, v, p, c, b, n, k, t in ((4, "pass", 300.0, 0.3, 0.2, 200, 1.0, 50), (6, "pass", 500.0, 0.45, 0.3,
                                                                                         210, 0.99, 35),
                                            (9, "fail", 4000.0, 0.7, 0.9, 270, 0.8, 30))]
    plan = make_plan("1x2-mapped@cpus=0.5", 0.5, steps, 20, 2500, pss_mb=20)
    return {"format_version": 2, "kind": "plan", "load_before": "1.00 1.00 1.00", "load_after": "2.00 2.00 2.00",
            "arguments": {"layout": "1x2-mapped@cpus=0.5", "rate": 20, "p99_ms": 2500, "min_requests": 200,
                          "resolution": 0.05},
            "plan": plan.to_dict(), "steps": [s.to_dict() for s in steps],
            "validation": [{"replicas": 1, "rate": 6.2, "per_replica_rate": 6.2, "plan_per_replica_rate": 6,
                            "difference": -0.0323, "resolution": 0.04, "steps": []}]}


def test_report_rerenders_a_stored_plan(tmp_path, capsys):
    data = plan_data(tmp_path)
    (tmp_path / "plan.json").write_text(json.dumps(data))
    lines = write_plan_reports(tmp_path / "first", read_plan(tmp_path / "plan.json"))
    assert "PLAN: 6 replicas of 1x2-mapped@cpus=0.5 = ceil(20 / (6 x 0.8)) + 1 spare for a lost pod" in lines
    assert cli.main(["report", str(tmp_path), "--out", str(tmp_path / "again")]) == 0
    assert (tmp_path / "again" / "report.txt").read_text().splitlines() == lines
    assert "# Capacity plan" in (tmp_path / "again" / "report.md").read_text()
    assert lines[-1].startswith("VALIDATION: the plan's rate per replica is within 10%")
    capsys.readouterr()


def test_report_refuses_a_bad_plan_in_one_line(tmp_path, capsys):
    data = plan_data(tmp_path)
    data["steps"][0]["verdict"] = "maybe"
    (tmp_path / "plan.json").write_text(json.dumps(data))
    with pytest.raises(ResultsError, match="a bad plan, step or warm-up"):
        read_plan(tmp_path / "plan.json")
    assert cli.main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "verdict" in err
    assert not (tmp_path / "report.txt").exists()
    assert cli.main(["report", str(tmp_path / "empty-dir-missing")]) == 2
    (tmp_path / "empty").mkdir()
    assert cli.main(["report", str(tmp_path / "empty")]) == 2
    assert "holds neither results.json nor plan.json" in capsys.readouterr().err
