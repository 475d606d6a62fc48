"""Decisions from paired rounds, as pure logic: the paired comparison (``bench.paired``), its
stopping rule under repeated looks, measuring until decided (``run_sweep`` with ``Until``) on a
fake runner and a fake clock, the machine's evidence, and what cannot be checked.

Everything here is SYNTHETIC: per-round ratios drawn from known distributions (so the truth is
known), cells made up by ``FakeRunner`` from a model of each layout, a clock that advances by what
a live block would take. Nothing is measured, nothing is started.
"""

from __future__ import annotations

import math
import subprocess
import sys
import zlib
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from tests.refusals import refusal
from uwsgi_layouts.bench import cli as bench_cli
from uwsgi_layouts.bench.analysis import (
    compare_groups,
    group_cells,
    group_of,
    layout_choice,
    machine_cautions,
    peer_choices,
    ranked_at_level,
    rule_of,
    unpaired_note,
)
from uwsgi_layouts.bench.decisions import key_comparisons, recommend
from uwsgi_layouts.bench.environment import Machine, busy_ticks, cpu_ticks, others_share, own_cpu_s, steal_share
from uwsgi_layouts.bench.kinds.closedloop import TAILS_KEPT, Plan, ReplayRunner, Until, run_sweep
from uwsgi_layouts.bench.kinds.closedloop.plan import EXTENSION_FACTOR, block_time
from uwsgi_layouts.bench.load.wrk import compress
from uwsgi_layouts.bench.paired import (
    Comparison,
    Rule,
    check_margin,
    compare_rounds,
    compare_unpaired,
    judge_ratios,
    outcome_of,
    request_weight,
    t_quantile,
)
from uwsgi_layouts.bench.report import terminal_lines
from uwsgi_layouts.bench.report.choice import choice_lines
from uwsgi_layouts.bench.report.headline import run_here
from uwsgi_layouts.bench.results import Cell, load
from uwsgi_layouts.bench.summary import summarize

FIXTURES = Path(__file__).parent / "fixtures"


# ------------------------------------------------------------------------------ the interval


def test_t_quantiles_match_the_tables():
    assert t_quantile(0.025, 2) == pytest.approx(4.303, abs=1e-3)
    assert t_quantile(0.025, 5) == pytest.approx(2.571, abs=1e-3)
    assert t_quantile(0.025, 10) == pytest.approx(2.228, abs=1e-3)
    assert t_quantile(0.005, 4) == pytest.approx(4.604, abs=1e-3)
    assert t_quantile(0.025, 10_000) == pytest.approx(1.960, abs=1e-3)
    with pytest.raises(ValueError):
        t_quantile(0.7, 3)


def test_three_rounds_use_the_t_interval_at_the_runs_one_level():
    values = [1.25, 3.04, 1.43]
    c = judge_ratios(values, higher_is_better=True, figure="rps")
    logs = np.log(values)
    half = t_quantile(0.025, 2) * logs.std(ddof=1) / math.sqrt(3)
    assert (c.method, c.rounds, c.level) == ("t", 3, 0.95)  # the same level as from 4 rounds on
    assert (c.low, c.high) == pytest.approx((math.exp(logs.mean() - half), math.exp(logs.mean() + half)))
    assert c.ratio == pytest.approx((1.25 * 3.04 * 1.43) ** (1 / 3))
    # The range (1.25-3.04) called this "better" at 75%; at 95% three such scattered rounds decide nothing.
    assert c.describe() == "1.76x (0.53–5.78; t over 3 rounds, 95%): undecided"
    assert judge_ratios([1.30, 1.34, 1.31], True).outcome == "better"
    assert judge_ratios([0.97, 1.02, 1.04], True).outcome == "undecided"
    assert judge_ratios([0.99, 1.01, 1.00], True).outcome == "equivalent"
    assert judge_ratios([0.7, 0.8, 0.75], False, "p99").outcome == "better"  # a lower p99 is better
    assert judge_ratios([1.02, 1.025, 1.03], True).outcome == "equivalent"  # excludes 1 but inside the margin


def test_four_rounds_and_more_use_t_on_the_log_ratios():
    values = [1.10, 1.20, 1.15, 1.12, 1.18]
    c = judge_ratios(values, True)
    logs = np.log(values)
    half = t_quantile(0.025, 4) * logs.std(ddof=1) / math.sqrt(5)
    assert c.method == "t" and c.level == 0.95
    assert (c.low, c.high) == pytest.approx((math.exp(logs.mean() - half), math.exp(logs.mean() + half)))
    # an outlier round widens the interval instead of deciding
    assert judge_ratios([1.1, 1.12, 1.15, 0.6], True).outcome == "undecided"
    # repeated looks: each look (3 to 8 rounds: 6) spends a share of the 5%
    corrected = judge_ratios(values, True, rule=Rule(first=3, last=8))
    assert corrected.level == pytest.approx(1 - 0.05 / 6) and corrected.low < c.low and corrected.high > c.high


def test_too_few_rounds_decide_nothing():
    for values in ([], [2.0]):
        c = judge_ratios(values, True)
        assert c.outcome == "undecided" and c.method == "too few rounds" and not c.settled
    # Two rounds: a t interval with 1 degree of freedom (12.7 standard errors each way at 95%).
    assert judge_ratios([2.0, 2.1], True).describe() == "2.05x (1.50–2.79; t over 2 rounds, 95%): better"
    assert judge_ratios([2.0, 0.9], True).outcome == "undecided"


def test_pairs_are_made_by_round_and_zeros_are_left_out():
    a = {1: 10.0, 2: 20.0, 3: 30.0, 4: 0.0, 5: 11.0}
    b = {1: 5.0, 2: 10.0, 3: 15.0, 4: 7.0}  # round 5 only in a; round 4: a served nothing
    c = compare_rounds(a, b, True)
    assert c.rounds == 3 and c.ratio == pytest.approx(2.0) and c.outcome == "better"


def test_outcomes_and_the_margin():
    assert outcome_of(0.96, 1.04, True, 0.05) == "equivalent"
    assert outcome_of(1.01, 1.20, True, 0.05) == "better" and outcome_of(1.01, 1.20, False, 0.05) == "worse"
    assert outcome_of(0.80, 0.99, True, 0.05) == "worse"
    assert outcome_of(0.97, 1.08, True, 0.05) == "undecided"
    assert outcome_of(0.97, 1.08, True, 0.10) == "equivalent"
    for bad in (0, 0.5, -0.1, 0.7, True):
        with pytest.raises(ValueError, match=r"margin: must be a share in \(0, 0.5\)"):
            check_margin(bad)


def test_unpaired_is_conservative_and_says_so():
    c = compare_unpaired([10, 11, 12], [8, 9, 10], True)
    assert c.method == "unpaired" and not c.paired and (c.low, c.high) == (1.0, 1.5) and c.outcome == "undecided"
    assert "unpaired" in c.describe()
    assert compare_unpaired([20, 21, 22], [8, 9, 10], True).outcome == "better"


def test_looks_share_the_error():
    assert Rule().t_looks == 1 and Rule().look_alpha == pytest.approx(0.05)
    rule = Rule(first=3, last=10)  # looks at 3, 4, ... 10: 8 looks, each at the same level
    assert rule.t_looks == 8 and rule.look_alpha == pytest.approx(0.05 / 8)
    assert rule.level(3) == rule.level(5) == pytest.approx(1 - 0.05 / 8) and rule.level(1) == 0.0
    with pytest.raises(ValueError, match="confidence"):
        Rule(confidence=0.75)  # below the 90% a run's decisions are held to


# ------------------------------------------------------------------------------ the stopping rule


def sequential(rng, mu: float, sigma: float, first: int, last: int, reps: int) -> dict[str, float]:
    """The share of SYNTHETIC runs (log ratios ~ N(mu, sigma)) each outcome ended in, looking after
    the first ``first`` rounds and after every round up to ``last``, stopping at the first
    settled look: the procedure ``run_sweep`` follows for a key comparison."""
    rule = Rule(first=first, last=last)
    ends = {"better": 0, "worse": 0, "equivalent": 0, "undecided": 0, "t looks decided": 0}
    for _ in range(reps):
        ratios = list(np.exp(rng.normal(mu, sigma, last)))
        for n in range(first, last + 1):
            c = judge_ratios(ratios[:n], True, rule=rule)
            if c.settled:
                ends[c.outcome] += 1
                ends["t looks decided"] += c.method == "t" and c.decided
                break
        else:
            ends["undecided"] += 1
    return {k: v / reps for k, v in ends.items()}


def test_repeated_looks_keep_the_error_rate_stated():
    """With no difference at all (ratio 1) and noise well above the margin, the looks from the
    planned 3 rounds to 10 call a difference at most 5% of the time together (the Bonferroni
    share), the first look included: one level for the whole run."""
    rng = np.random.default_rng(20250125)
    null = sequential(rng, 0.0, 0.2, 3, 10, 3000)
    assert null["t looks decided"] <= 0.05
    assert null["better"] + null["worse"] <= 0.05 + 0.01  # 3,000 runs: 1 point of sampling slack
    # without the correction the same looks would call many more: that is what the rule prevents
    uncorrected = 0
    for _ in range(1000):
        ratios = list(np.exp(rng.normal(0.0, 0.2, 10)))
        if ratios[:3] and not judge_ratios(ratios[:3], True).settled and any(
                judge_ratios(ratios[:n], True).decided for n in range(4, 11)):
            uncorrected += 1
    assert uncorrected / 1000 > null["t looks decided"]


def test_equivalence_is_rarely_called_just_outside_the_margin():
    rng = np.random.default_rng(7)
    outside = sequential(rng, math.log(1.08), 0.03, 3, 10, 2000)
    assert outside["equivalent"] <= 0.05


def test_a_real_difference_is_decided_more_often_with_more_rounds():
    rng = np.random.default_rng(11)
    three = sequential(rng, math.log(1.15), 0.15, 3, 3, 2000)
    ten = sequential(rng, math.log(1.15), 0.15, 3, 10, 2000)
    assert ten["better"] > three["better"] + 0.05


# ------------------------------------------------------------------------------ measuring until decided


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class FakeRunner:
    """SYNTHETIC blocks: per (layout, level), a throughput and a p99 scale, times a seeded noise
    per round (the same machine drift for every layout of a round, plus each cell's own noise);
    2,000 requests per cell so that pooled p99s can be quoted. The clock advances as a block of
    ``overhead_s`` + warm-up + cells would."""

    def __init__(self, model: dict, clock: FakeClock, plan: Plan, noise: float = 0.02, overhead_s: float = 2.0):
        self.model, self.clock, self.plan, self.noise, self.overhead_s = model, clock, plan, noise, overhead_s
        self.blocks: list[tuple[str, int, tuple[int, ...], tuple[str, ...]]] = []
        self.durations: list[float] = []

    def run_pair(self, specs, repeat, levels, scenarios, on_cell=None, durations=None):
        """Two blocks' worth of time and cells, in a paired block's order (level by level)."""
        cells = [c for spec in specs for c in self.run_block(spec, repeat, levels, scenarios,
                                                              durations=(durations or {}).get(spec))]
        return sorted(cells, key=lambda c: (c.scenario, c.concurrency))  # stable: the specs' order per level

    def run_block(self, spec, repeat, levels, scenarios, on_cell=None, durations=None):
        self.blocks.append((spec, repeat, tuple(levels), tuple(scenarios)))
        durations = durations or {lv: self.plan.duration for lv in levels}
        self.durations.append(max(durations.values()))
        self.clock.t += block_time(self.overhead_s, self.plan.warmup, durations.values(), len(scenarios))
        out = []
        for sc in scenarios:
            for level in levels:
                rng = np.random.default_rng([repeat, level, zlib.crc32(spec.encode())])
                drift = float(np.random.default_rng([repeat]).normal(1, 0.1))
                rps, p99_ms = self.model[(spec, level)]
                rate = rps * drift * float(rng.normal(1, self.noise))
                values = np.round(rng.lognormal(math.log(p99_ms * 1000 / 2.5), 0.4, 2000)).astype(int)
                v, counts = np.unique(values, return_counts=True)
                hist = compress(zip(v.tolist(), counts.tolist(), strict=True))
                out.append(Cell(layout=spec, concurrency=level, repeat=repeat, round=repeat, scenario=sc,
                                duration_s=2000 / rate, requests=2000, rps=rate,
                                latency_ms={"p50": 1, "p90": 2, "p99": 3, "p999": 4, "max": 5}, errors={},
                                worker_requests={"1": 2000}, cpu_s={"app": 1.0}, unloaded_latency_ms=1.0,
                                capacity_rps=0.0, closed_loop_rps=0.0, efficiency=0.0, histogram=hist))
        return out


def plan_of(layouts=("2x4-shared", "2x4-mapped", "2x4-thunder"), repeats=3, budget_min=5.0) -> Plan:
    return Plan(layouts=layouts, concurrency=(2, 4), repeats=repeats, duration=3.0, warmup=1.0, processes=2,
                threads=4, scenarios=("article",), workload={"article": {}}, inflight_hz=0, budget_min=budget_min,
                app={"app": "app.wsgi:application", "demo": True})


def test_settled_at_the_planned_rounds_adds_nothing():
    # mapped well past the claim (>= 1.25x throughput, <= 0.70x p99) at both levels: every target clears
    model = {("2x4-shared", 2): (10, 300), ("2x4-shared", 4): (12, 500), ("2x4-mapped", 2): (15, 180),
             ("2x4-mapped", 4): (18, 300), ("2x4-thunder", 2): (10.5, 290), ("2x4-thunder", 4): (11, 480)}
    plan, clock = plan_of(), FakeClock()
    runner = FakeRunner(model, clock, plan)
    results = run_sweep(plan, runner, {}, until=Until(plan.budget_min * 60, clock))
    state = results.arguments["until_decided"]
    assert len(runner.blocks) == 9 and state["rounds"] == [] and state["stop"] == "every key comparison settled"
    assert all(k.settled for k in key_comparisons(results))
    assert results.arguments["max_rounds"] >= 3 and rule_of(results).first == 3


def test_undecided_key_comparisons_get_rounds_of_their_layouts_at_their_levels_only():
    # at 2 connections mapped sits on the claim's thresholds (1.25x throughput, 0.70x p99): both
    # straddle; at 4 mapped clears the claim by far, even at 3 rounds
    model = {("2x4-shared", 2): (10, 300), ("2x4-shared", 4): (12, 500), ("2x4-mapped", 2): (12.5, 210),
             ("2x4-mapped", 4): (24, 200), ("2x4-thunder", 2): (6, 600), ("2x4-thunder", 4): (6, 700)}
    plan, clock = plan_of(), FakeClock()
    runner = FakeRunner(model, clock, plan, noise=0.05)
    results = run_sweep(plan, runner, {}, until=Until(plan.budget_min * 60, clock))
    state = results.arguments["until_decided"]
    extra = [b for b in runner.blocks if b[1] > 3]
    assert extra and {b[0] for b in extra} == {"2x4-mapped", "2x4-shared"}  # never the thunder layout
    # 4 connections gets rounds only until its claim is judged (at 99.4% per look, 3 rounds of t can
    # leave even 2x straddling 1.25x); then only the undecided level
    settled = state["settled_at"].get("2x4-mapped vs 2x4-shared at 4 connections (article)")
    assert settled is not None and extra and all(b[2] == (2,) for b in extra if b[1] > settled)
    # the added rounds measure cells EXTENSION_FACTOR times the planned duration
    assert runner.durations[:9] == [plan.duration] * 9
    assert runner.durations[9:] == [plan.duration * EXTENSION_FACTOR] * len(extra)
    assert results.arguments["extension_duration"] == plan.duration * EXTENSION_FACTOR
    assert [r["round"] for r in state["rounds"]] == list(range(4, 4 + len(state["rounds"])))
    assert clock.t <= plan.budget_min * 60 - 10 or state["stop"] != "the budget ended"
    assert state["stop"] in ("every key comparison settled", "the budget ended", TAILS_KEPT,
                             f"the fixed maximum of {results.arguments['max_rounds']} rounds")
    # every extra round ran the pair as one paired block, shared first in odd rounds, mapped in even ones
    by_round = {}
    for spec, rnd, *_ in extra:
        by_round.setdefault(rnd, []).append(spec)
    assert all(specs == ["2x4-shared", "2x4-mapped"][::1 if rnd % 2 else -1] for rnd, specs in by_round.items())
    # the report says how many rounds each took, and which stayed undecided
    text = " ".join(" ".join(terminal_lines(results)).split())
    assert "Measured until decided within 5 min:" in text and f"stopped: {state['stop']}" in text
    # the replay takes the same rounds from the stored cells, measuring nothing
    replayed = run_sweep(plan, ReplayRunner(results), {}, until=Until(
        None, lambda: 0.0, max_rounds=results.arguments["max_rounds"],
        stored_rounds=frozenset(c.round for c in results.cells)))
    assert {(c.layout, c.concurrency, c.round) for c in replayed.cells} == \
        {(c.layout, c.concurrency, c.round) for c in results.cells}


def test_the_budget_bounds_the_rounds():
    model = {(x, lv): (10, 300) for x in ("2x4-shared", "2x4-mapped", "2x4-thunder") for lv in (2, 4)}
    plan, clock = plan_of(budget_min=4.0), FakeClock()
    runner = FakeRunner(model, clock, plan, noise=0.2)  # very noisy: nothing settles
    results = run_sweep(plan, runner, {}, until=Until(plan.budget_min * 60, clock))
    assert clock.t <= plan.budget_min * 60 - 10 + 1e-6
    stop, most = results.arguments["until_decided"]["stop"], results.arguments["max_rounds"]
    assert stop.startswith("the budget ended") or stop == f"the fixed maximum of {most} rounds"


@pytest.mark.parametrize("argv, message", [
    (["--budget", "0.5"], "error: budget: 0.5 min is less than the planned rounds need: about "),
    (["--budget", "0.05"], "uwsgi-layouts compare: error: argument --budget: must be auto or a number of minutes in "
                           "0.1..1440, got '0.05'"),
    (["--margin", "0.5"], "uwsgi-layouts compare: error: argument --margin: must be a share in (0, 0.5), e.g. 0.05 "
                          "for ±5%, got 0.5"),
    (["--margin", "0"], "uwsgi-layouts compare: error: argument --margin: must be a share in (0, 0.5)"),
    (["--margin", "five"], "uwsgi-layouts compare: error: argument --margin: must be a share in (0, 0.5)"),
])
def test_bad_budget_or_margin_exits_2_with_one_line(tmp_path, capsys, argv, message):
    out = tmp_path / "never"
    line = refusal(bench_cli.main, ["compare", "--processes", "2", "--out", str(out), *argv], capsys)
    assert line.startswith(message), line
    assert not out.exists()


def test_the_budget_error_names_the_minimum(capsys, tmp_path):
    bench_cli.main(["compare", "--processes", "2", "--budget", "1", "--out", str(tmp_path / "x")])
    err = capsys.readouterr().err
    least = float(err.split("give --budget ")[1].split()[0])
    assert least > 1 and f"about {least:g} min" in err


def test_auto_budget_leaves_the_venvs_build_room_in_six_minutes_on_two_cores():
    """make compare on a bare machine: 30-50 s of system packages and venv build, then the budget (plus a few
    seconds to start and to write the reports) within 6 minutes."""
    from uwsgi_layouts.bench.kinds.compare import budget_arg, plan_from_args

    plan, _ = plan_from_args(bench_cli.build_parser().parse_args(["compare", "--processes", "2"]))
    budget = budget_arg("auto", plan)
    # the planned rounds' estimate is below the minimum on 2 cores: the minimum it is, and with the
    # bare machine's 50 s (46 s measured: docs/measured.md) and 10 s to start and report, within 6 min
    assert budget == 5.0 and budget * 60 + 50 + 10 <= 6 * 60
    # a round of the verdict's pairs at P and 2P is left for the rounds until decided
    pairs = 2 * block_time(2.5, plan.warmup, [plan.key_duration] * 2, 1)
    assert plan.estimate_seconds() + 10 + pairs <= budget * 60


# ------------------------------------------------------------------------------ older files, the machine


def test_an_older_file_is_compared_unpaired_with_a_one_line_note():
    old = load(FIXTURES / "results-small.json")  # written before rounds were recorded
    assert not any(c.round for c in old.cells) and unpaired_note(old)
    g = {(x.layout, x.concurrency): x for x in group_cells(old)}
    c = compare_groups(g[("2x4-mapped", 4)], g[("2x4-shared", 4)], "rps")
    assert c.method == "unpaired" and not c.paired
    lines = terminal_lines(old)
    assert sum("this file records no rounds" in line for line in lines) == 1


def test_machine_samples_load_and_steal():
    ticks = iter([(0, 1000), (10, 2000), (160, 3000)])
    loads = iter([(0.5, 0, 0), (1.7, 0, 0)])
    clock = iter([0.0, 5.0, 10.0])
    m = Machine(clock=lambda: next(clock), ticks=lambda: next(ticks), loadavg=lambda: next(loads))
    m.sample()
    m.sample()
    rec = m.record()
    assert [s["steal"] for s in rec["samples"]] == [0.01, 0.15] and rec["samples"][1]["loadavg_1m"] == 1.7
    assert steal_share(None, (1, 2)) is None and steal_share((5, 100), (5, 100)) is None


def test_machine_cautions_at_half_the_cores_and_five_percent_steal():
    """Files written before "others" was sampled: judged on the load average during the run, as then."""
    quiet = {"nproc": 2, "loadavg_at_start": [0.4, 0, 0], "steal_at_start": 0.0,
             "machine": {"samples": [{"loadavg_1m": 0.9, "steal": 0.01}]}}
    assert machine_cautions(quiet) == []
    busy = {**quiet, "machine": {"samples": [{"loadavg_1m": 1.6, "steal": 0.08}]}}
    cautions = machine_cautions(busy)
    assert len(cautions) == 2 and "load average up to 1.6 on 2 cores" in cautions[0] and "8%" in cautions[1]
    assert machine_cautions({}) == []


def test_the_runs_own_load_is_no_caution_other_processes_cpu_is():
    """The run's own wrk and servers push the load average past the cores, and a run that just
    ended leaves a one-minute load average behind: neither is a neighbour. What other processes
    used just before the start and while measuring is."""
    own_load = {"nproc": 2, "loadavg_at_start": [1.7, 0, 0], "steal_at_start": 0.0, "others_at_start": 0.01,
                "machine": {"samples": [{"loadavg_1m": 3.9, "steal": 0.0, "others": 0.02},
                                        {"loadavg_1m": 4.2, "steal": 0.0, "others": 0.04}]}}
    assert machine_cautions(own_load) == []
    neighbour = {**own_load, "machine": {"samples": [{"loadavg_1m": 4.0, "steal": 0.0, "others": 0.26},
                                                     {"loadavg_1m": 4.4, "steal": 0.0, "others": 0.22}]}}
    [caution] = machine_cautions(neighbour)
    assert "other processes used up to 26% of the machine's CPU time" in caution
    busy_start = {**own_load, "others_at_start": 0.4}
    [caution] = machine_cautions(busy_start)
    assert "up to 40%" in caution


def test_others_share_is_busy_time_less_ours():
    # 2 cores, 10 s: 2000 ticks of 10 ms; 1200 busy, of which our tree used 9 s -> others 3 s of 20 s
    assert others_share((0, 0), (1200, 2000), own_s=9.0, tick_s=0.01) == 0.15
    assert others_share((0, 0), (1200, 2000), own_s=20.0, tick_s=0.01) == 0.0  # never below 0
    assert others_share(None, (1, 2), 0.0) is None and others_share((5, 100), (5, 100), 0.0) is None


def test_proc_stat_ticks(tmp_path):
    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal guest guest_nice
    stat.write_text("cpu  100 5 50 800 20 3 2 7 40 0\ncpu0 50 2 25 400 10 1 1 3 20 0\n")
    assert cpu_ticks(str(stat)) == (7, 987)  # guest is inside user: not added again
    assert busy_ticks(str(stat)) == (160, 987)  # idle, iowait and steal are not busy
    stat.write_text("cpu  100 5 50 800\n")  # an old kernel: no iowait, no steal
    assert cpu_ticks(str(stat)) == (0, 955) and busy_ticks(str(stat)) == (155, 955)
    stat.write_text("intr 1 2 3\n")
    assert cpu_ticks(str(stat)) is None and busy_ticks(str(stat)) is None
    assert cpu_ticks(str(tmp_path / "absent")) is None and busy_ticks(str(tmp_path / "absent")) is None


def test_own_cpu_counts_a_child_that_ended():
    # The child spins until it has used 0.2 CPU-s by its own clock, on a fast machine or a loaded one;
    # /proc counts in 10-ms ticks, so allow two of them.
    spin = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.2: pass"
    before = own_cpu_s()
    subprocess.run([sys.executable, "-c", spin], check=True)
    assert own_cpu_s() - before >= 0.18


# ------------------------------------------------------------------------------ cannot be checked


def test_a_goal_without_a_steady_scenario_cannot_be_checked():
    """The issue's stall-only run: every layout used to print goal: no and "No layout meets the goal
    here" although 2x8-mapped had the best healthy p99 and the throughput half had no inputs."""
    results = load(FIXTURES / "results-tails.json")
    stall_only = replace(results, cells=tuple(c for c in results.cells if c.scenario == "stall"))
    choices = {c.layout: c for c in layout_choice(stall_only)}
    assert all(c.steady_rps_vs_mapped is None for c in choices.values())
    assert {c.goal for c in choices.values()} <= {"cannot be checked", "no"}
    assert any(c.goal == "cannot be checked" for c in choices.values())
    text = " ".join(" ".join(choice_lines(stall_only, summarize(stall_only))).split())
    assert "The goal cannot be checked: run with a steady scenario too" in text
    assert "No layout meets the goal here" not in text


def test_a_budget_the_planned_rounds_used_up_adds_nothing_and_says_so():
    model = {(x, lv): (10, 300) for x in ("2x4-shared", "2x4-mapped", "2x4-thunder") for lv in (2, 4)}
    plan, clock = plan_of(budget_min=1.0), FakeClock()  # the planned rounds alone take longer
    runner = FakeRunner(model, clock, plan, noise=0.2)
    results = run_sweep(plan, runner, {}, until=Until(plan.budget_min * 60, clock))
    assert len(runner.blocks) == 9 and results.arguments["max_rounds"] == 3
    assert results.arguments["until_decided"]["stop"] == "the budget ended with the planned rounds"


# ------------------------------------------------------------------------------ rounds of different weight


def test_weighted_rounds_equal_weights_give_the_plain_interval():
    values = [1.03, 1.06, 1.01, 1.04, 1.02]
    plain, weighted = judge_ratios(values, True), judge_ratios(values, True, weights=[7.0] * 5)
    assert (plain.ratio, plain.low, plain.high) == pytest.approx((weighted.ratio, weighted.low, weighted.high))


def test_a_round_of_more_requests_counts_more():
    """Three short rounds that wander (66 requests a cell), three long ones that agree (198): the
    long ones carry the estimate, and the interval narrows to decide what the plain one cannot."""
    values = [0.985, 1.065, 1.06, 1.03, 1.028, 1.033]
    weights = [request_weight(66, 64)] * 3 + [request_weight(198, 192)] * 3
    rule = Rule(first=3, last=6)  # as compare looks: 3 planned rounds, at most 6
    plain, weighted = judge_ratios(values, True, rule=rule), judge_ratios(values, True, rule=rule, weights=weights)
    assert plain.outcome == "undecided" and weighted.outcome == "better", (plain.describe(), weighted.describe())
    assert abs(math.log(weighted.ratio) - math.log(1.031)) < abs(math.log(plain.ratio) - math.log(1.031))


def test_weighted_looks_keep_the_error_rate_under_the_null():
    """No difference, rounds of mixed length (variance 1/requests): the weighted t looks from 4 to
    9 rounds together call a difference in at most 5% of 4000 simulated runs (Bonferroni)."""
    rng = np.random.default_rng(20261126)
    rule = Rule(first=3, last=9)
    called = 0
    runs = 4000
    for _ in range(runs):
        requests = [66, 66, 66, 198, 198, 198, 198, 198, 198]
        logs = [rng.normal(0, 1.2 / math.sqrt(n)) for n in requests]
        ratios_ = [math.exp(x) for x in logs]
        for n in range(4, 10):
            c = judge_ratios(ratios_[:n], True, rule=rule, weights=[request_weight(r, r) for r in requests[:n]])
            if c.outcome in ("better", "worse"):
                called += 1
                break
    assert called / runs <= 0.05, called / runs


def test_compare_groups_weighs_rounds_by_their_requests():
    """Three planned rounds of 3-s cells, three added ones of 9 s: each round weighs by its requests."""
    rows = [(1, 66, 64), (2, 68, 64), (3, 64, 64), (4, 198, 192), (5, 198, 192), (6, 199, 193)]

    def cell(layout: str, rnd: int, requests: int) -> Cell:
        seconds = 3.0 if rnd < 4 else 9.0
        return Cell(layout=layout, concurrency=2, repeat=rnd, round=rnd, scenario="article", duration_s=seconds,
                    requests=requests, rps=requests / seconds,
                    latency_ms={"p50": 1, "p90": 2, "p99": 3, "p999": 4, "max": 5}, errors={}, worker_requests={},
                    cpu_s={"app": 1.0}, unloaded_latency_ms=1.0, capacity_rps=0.0, closed_loop_rps=0.0,
                    efficiency=0.0)

    a = group_of([cell("2x4-mapped", r, x) for r, x, _ in rows])
    b = group_of([cell("2x4-shared", r, y) for r, _, y in rows])
    c = compare_groups(a, b, "rps")
    assert c.method == "t" and c.rounds == 6
    expected = judge_ratios([x / y for _, x, y in rows], True, weights=[request_weight(x, y) for _, x, y in rows])
    assert (c.ratio, c.low, c.high) == pytest.approx((expected.ratio, expected.low, expected.high))


def test_the_best_of_three_agrees_with_the_paired_ratio_of_the_two_when_one_missed_rounds():
    """As measured for the peers' variants: two gunicorn variants got three added (longer) rounds
    until decided, a third only the five planned ones. Over the five rounds all three share,
    keepalive=off is ahead; over all eight the two share, weighted by requests, keep-alive on is
    ahead: the best named must be the one its own quoted ratio puts ahead."""
    rounds = {  # round: (keep-alive on, keepalive=off, reuse_port) requests; rounds 6-8 three times as long
        1: (230, 236, 200), 2: (228, 240, 190), 3: (232, 238, 205), 4: (229, 235, 199), 5: (231, 239, 201),
        6: (720, 690, 0), 7: (722, 688, 0), 8: (719, 692, 0)}

    def cell(layout: str, rnd: int, requests: int) -> Cell:
        seconds = 10.0 if rnd <= 5 else 30.0
        return Cell(layout=layout, concurrency=4, repeat=rnd, round=rnd, scenario="article", duration_s=seconds,
                    requests=requests, rps=requests / seconds,
                    latency_ms={"p50": 1, "p90": 2, "p99": 3, "p999": 4, "max": 5}, errors={}, worker_requests={},
                    cpu_s={"app": 1.0}, unloaded_latency_ms=1.0, capacity_rps=0.0, closed_loop_rps=0.0,
                    efficiency=0.0)

    layouts = ("2x4-gunicorn", "2x4-gunicorn@keepalive=off", "2x4-gunicorn@reuse_port=on,transport=tcp")
    groups = [group_of([cell(name, r, n[i]) for r, n in rounds.items() if n[i]]) for i, name in enumerate(layouts)]
    on, off, _ = groups
    assert compare_groups(on, off, "rps").ratio > 1  # over the 8 rounds the two share
    ranked = ranked_at_level(groups)
    assert ranked[0].layout == "2x4-gunicorn" and ranked[1].layout == "2x4-gunicorn@keepalive=off"
    choice, = peer_choices(groups)
    assert choice.best.layout == "2x4-gunicorn" and choice.rps.ratio > 1


def test_every_unbeaten_layout_is_ahead_of_the_next_by_its_paired_ratio():
    """Synthetic levels of 3-6 layouts, some missing the added rounds: in the ranked order, each
    unbeaten layout's paired throughput ratio to the next one is at least 1 (p99s alike, so the
    tail rule never reorders)."""
    rng = np.random.default_rng(7)

    def cell(layout: str, rnd: int, rps: float) -> Cell:
        return Cell(layout=layout, concurrency=4, repeat=rnd, round=rnd, scenario="article", duration_s=10.0,
                    requests=int(rps * 10), rps=rps,
                    latency_ms={"p50": 1, "p90": 2, "p99": 3, "p999": 4, "max": 5}, errors={}, worker_requests={},
                    cpu_s={"app": 1.0}, unloaded_latency_ms=1.0, capacity_rps=0.0, closed_loop_rps=0.0,
                    efficiency=0.0)

    checked = 0
    for _ in range(200):
        n = int(rng.integers(3, 7))
        groups = []
        for i in range(n):
            rounds = 5 + (3 if rng.random() < 0.5 else 0)
            level = 40 * (1 + rng.normal(0, 0.03))
            groups.append(group_of([cell(f"2x{i + 1}-mapped", r, level * (1 + rng.normal(0, 0.08)))
                                    for r in range(1, rounds + 1)]))
        ranked = ranked_at_level(groups)
        beaten = {g.layout for g in groups for h in groups if h is not g
                  and compare_groups(h, g, "rps").outcome == "better"}
        unbeaten = [g for g in ranked if g.layout not in beaten] or ranked
        assert ranked[:len(unbeaten)] == unbeaten  # the unbeaten come first
        for a, b in zip(unbeaten, unbeaten[1:], strict=False):
            assert compare_groups(a, b, "rps").ratio >= 1, (a.layout, b.layout)
            checked += 1
    assert checked > 300


# ------------------------------------------------------------------------------ the final look's share


def test_the_final_look_keeps_its_share_of_the_error():
    rule = Rule(first=3, last=11, final_share=0.75)  # looks at 3..11: 8 interim looks, then the final one
    assert rule.spends and rule.t_looks == 9
    assert rule.look_alpha == pytest.approx(0.05 * 0.25 / 8) and rule.final_alpha == pytest.approx(0.05 * 0.75)
    assert rule.level(5) == pytest.approx(1 - 0.05 * 0.25 / 8)  # while the run measures: an interim look
    stopped = replace(rule, final=7)  # the run stopped measuring at 7 rounds: that look was its final one
    assert stopped.level(7) == pytest.approx(0.9625) and stopped.level(6) == pytest.approx(rule.level(6))
    # the shares sum to the run's error: the interim looks before the final one, plus the final one
    assert 8 * rule.look_alpha + rule.final_alpha == pytest.approx(0.05)
    assert rule.looks_words() == "looks at 3-11 rounds: interim 99.8%, final 96.2%"
    assert Rule(first=3, last=3, final_share=0.75).look_alpha == pytest.approx(0.05)  # one look: all of it
    with pytest.raises(ValueError, match="final_share"):
        Rule(final_share=1.0)


def test_looks_with_a_final_share_keep_the_error_rate_under_the_null():
    """No difference, noise well above the margin: interim looks at 3..11 rounds at their small
    share, and the final look (where a run stops: the budget's end, or the maximum) at 3/4 of the
    error, call a difference in at most 5% of the runs together."""
    rng = np.random.default_rng(20261127)
    called, runs = 0, 3000
    for _ in range(runs):
        ratios = list(np.exp(rng.normal(0.0, 0.2, 12)))
        stop = int(rng.integers(4, 13))  # where the budget happens to end
        rule = Rule(first=3, last=12, final_share=0.75)
        for n in range(3, stop + 1):
            judged = replace(rule, final=stop) if n == stop else rule
            if judge_ratios(ratios[:n], True, rule=judged).decided:
                called += 1
                break
    assert called / runs <= 0.05 + 0.01, called / runs  # 3,000 runs: 1 point of sampling slack


def test_the_final_share_decides_a_near_miss_more_often_than_an_equal_split():
    """1.18x against a 1.25x threshold, 0.06 of noise a round, 10 rounds at most: the split that
    keeps most of the error for the end calls the miss more often than the equal one."""
    rng = np.random.default_rng(5)
    equal, final = Rule(first=3, last=10), Rule(first=3, last=10, final_share=0.75, final=10)
    wins = {"equal": 0, "final": 0}
    for _ in range(1000):
        ratios = list(np.exp(rng.normal(math.log(1.18), 0.06, 10)))
        for name, rule in (("equal", equal), ("final", final)):
            wins[name] += any(judge_ratios(ratios[:n], True, rule=rule).high < 1.25 for n in range(3, 11))
    assert wins["final"] > wins["equal"] + 50, wins


# ------------------------------------------------------------------------------ the layout to run here


def test_run_here_names_one_layout_over_every_level():
    """A layout first at one level by a hair and beaten beyond noise at another is not named for
    being first somewhere: the one never beaten is, with its lead over the levels."""
    model = {("2x4-shared", 2): (10, 300), ("2x4-shared", 4): (12, 500), ("2x4-shared", 8): (14, 900),
             ("2x4-mapped", 2): (12.5, 200), ("2x4-mapped", 4): (17, 300), ("2x4-mapped", 8): (17.5, 600),
             ("2x4-thunder", 2): (10.5, 290), ("2x4-thunder", 4): (12, 480), ("2x4-thunder", 8): (17.6, 620)}
    plan, clock = replace(plan_of(budget_min=None), concurrency=(2, 4, 8), repeats=5), FakeClock()
    results = run_sweep(plan, FakeRunner(model, clock, plan, noise=0.01), {})
    rec = recommend(results, "article")
    assert rec.layout == "2x4-mapped" and rec.beaten_at == () and rec.levels == (2, 4, 8)
    assert rec.runner_up == "2x4-thunder" and 2 in rec.runner_up_beaten_at
    assert rec.overall is not None and rec.overall.ratio > 1
    line = run_here(rec)
    assert line.startswith("Run here: 2x4-mapped: not beaten beyond noise at any of 2, 4 and 8 connections")
    assert "the throughput of 2x4-thunder (beaten at 2" in line


def test_run_here_names_nothing_when_nothing_was_served():
    """A run starved by its neighbours (every cell 0 requests): no layout is named."""
    model = {(x, lv): (10, 300) for x in ("2x4-shared", "2x4-mapped", "2x4-thunder") for lv in (2, 4)}
    plan, clock = plan_of(budget_min=None), FakeClock()
    results = run_sweep(plan, FakeRunner(model, clock, plan), {})
    starved = replace(results, cells=tuple(replace(c, requests=0, rps=0.0) for c in results.cells))
    assert recommend(starved, "article") is None and recommend(results, "article") is not None


def test_an_interval_of_a_few_noisy_rounds_prints_its_ends_as_bounds_not_sixty_digits():
    # two rounds of a noisy pair: t's quantile at 1 degree of freedom makes ends like 10^67
    wide = Comparison("rps", "undecided", 1.01, 1e-70, 2.1e67, rounds=2, method="t", level=0.95)
    assert wide.text() == "1.01x (<0.01–>100)"
    assert wide.describe().startswith("1.01x (<0.01–>100; t over 2 rounds")
    assert Comparison("rps", "better", 1.2, 1.1, 1.3, rounds=5, level=0.95).text() == "1.20x (1.10–1.30)"
