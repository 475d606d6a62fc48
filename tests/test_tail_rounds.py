"""The verdict's tails within the budget: once no level of the claim is undecided, its cells whose
pooled p99 cannot be quoted get rounds sized from their observed rates, until each is quotable or
the budget ends; those rounds are no look of the claim's (the verdict is judged on the rounds up to
the look that decided it, ``until_decided.judged_through``). Replayed on SYNTHETIC cells whose
request counts follow their duration (``RateRunner``), so that tails are as thin as a real run's."""

from __future__ import annotations

import math
import zlib
from dataclasses import replace

import numpy as np
import pytest

from tests.test_decisions import FakeClock, FakeRunner
from uwsgi_layouts.bench.analysis import group_cells, requests_for_p99, rule_of, tail_seconds
from uwsgi_layouts.bench.decisions import KeyComparison, key_comparisons, next_blocks, tail_blocks
from uwsgi_layouts.bench.kinds.closedloop import (
    CLAIM_ROUNDS,
    MAX_ROUNDS,
    RESERVE_S,
    TAILS_KEPT,
    Plan,
    ReplayRunner,
    Until,
    run_sweep,
)
from uwsgi_layouts.bench.kinds.closedloop.until import _tails_done, tails_reserve_s
from uwsgi_layouts.bench.load.wrk import compress
from uwsgi_layouts.bench.report import terminal_lines
from uwsgi_layouts.bench.report.headline import headline_lines
from uwsgi_layouts.bench.results import Cell, Results
from uwsgi_layouts.bench.summary import summarize
from uwsgi_layouts.bench.verdict import Outcome, TailCount, article_verdict

# mapped far past the claim at both levels (decided within a few added rounds), at a real run's rates:
# 4-s cells of 50-110 requests, so that the rounds that decide it pool a few hundred per cell
MODEL = {("2x4-shared", 2): (13, 300), ("2x4-shared", 4): (18, 500), ("2x4-mapped", 2): (20, 150),
         ("2x4-mapped", 4): (27, 250), ("2x4-thunder", 2): (14, 290), ("2x4-thunder", 4): (19, 480)}


class RateRunner(FakeRunner):
    """FakeRunner whose cells hold what their rate and duration give (rate x seconds requests)."""

    def run_block(self, spec, repeat, levels, scenarios, on_cell=None, durations=None):
        self.blocks.append((spec, repeat, tuple(levels), tuple(scenarios)))
        durations = durations or {lv: self.plan.duration for lv in levels}
        self.durations.append(max(durations.values()))
        self.clock.t += sum(self.overhead_s + self.plan.warmup + sum(d + 0.3 for d in durations.values())
                            for _ in scenarios)
        out = []
        for sc in scenarios:
            for level in levels:
                rng = np.random.default_rng([repeat, level, zlib.crc32(spec.encode())])
                drift = float(np.random.default_rng([repeat]).normal(1, 0.05))
                rps, p99_ms = self.model[(spec, level)]
                rate = rps * drift * float(rng.normal(1, self.noise))
                n = max(1, round(rate * durations[level]))
                values = np.round(rng.lognormal(math.log(p99_ms * 1000 / 2.5), 0.4, n)).astype(int)
                v, counts = np.unique(values, return_counts=True)
                out.append(Cell(layout=spec, concurrency=level, repeat=repeat, round=repeat, scenario=sc,
                                duration_s=durations[level], requests=n, rps=n / durations[level],
                                latency_ms={"p50": 1, "p90": 2, "p99": 3, "p999": 4, "max": 5}, errors={},
                                worker_requests={"1": n}, cpu_s={"app": 1.0}, unloaded_latency_ms=1.0,
                                capacity_rps=0.0, closed_loop_rps=0.0, efficiency=0.0,
                                histogram=compress(zip(v.tolist(), counts.tolist(), strict=True))))
        return out


def plan_of(budget_min: float) -> Plan:
    return Plan(layouts=("2x4-shared", "2x4-mapped", "2x4-thunder"), concurrency=(2, 4), repeats=3, duration=2.0,
                warmup=1.0, processes=2, threads=4, scenarios=("article",), workload={"article": {}}, inflight_hz=0,
                budget_min=budget_min, app={"app": "app.wsgi:application", "demo": True}, key_duration=4.0,
                key_cells=tuple((x, lv) for x in ("2x4-mapped", "2x4-shared") for lv in (2, 4)))


def verdict_groups(results):
    return [g for lv in article_verdict(results).levels for g in (lv.pair.mapped, lv.pair.shared)]


def measure(budget_min: float):
    plan, clock = plan_of(budget_min), FakeClock()
    runner = RateRunner(MODEL, clock, plan, noise=0.02)
    results = run_sweep(plan, runner, {}, until=Until(plan.budget_min * 60, clock))
    return plan, clock, runner, results


def test_a_decided_level_gets_rounds_for_its_tails_until_every_quoted_p99_is_quotable():
    plan, clock, runner, results = measure(budget_min=10)
    state = results.arguments["until_decided"]
    # each level judged at the look that decided it (its 4-s cells pooled a few hundred requests by then)
    through = {int(lv): r for lv, r in state["judged_through"].items()}
    assert set(through) == {2, 4}
    decided = {k.level: k for k in key_comparisons(results) if k.kind == "verdict"}
    assert all(state["settled_at"][decided[lv].name] == r for lv, r in through.items())
    assert state["tails"] and state["tails_stop"] == "every verdict cell's p99 quotable"
    assert state["tails"][0]["round"] == max(through.values()) + 1
    assert all(g.p99_quotable for g in verdict_groups(results))
    assert all(g.tails.requests >= requests_for_p99() for g in verdict_groups(results))
    # sized from the observed rates: one round did it, no context layout measured in it
    tails_round = state["tails"][0]["round"]
    assert len(state["tails"]) == 1 and {b[0] for b in runner.blocks if b[1] == tails_round} == {"2x4-mapped",
                                                                                               "2x4-shared"}
    # the claim is judged on the rounds that decided it, not on the round for the tails
    v = article_verdict(results)
    assert v.outcome is Outcome.HOLDS and v.rounds == tuple(sorted(set(through.values())))
    assert all(t.comparison.rounds == through[t.concurrency] for t in v.targets if t.comparison is not None)
    assert clock.t <= plan.budget_min * 60 - RESERVE_S
    head = " ".join(headline_lines(results, summarize(results), "x"))
    assert "every verdict cell's pooled p99 quotable" in head


def test_the_tails_stop_at_the_budget_and_the_headline_says_how_many_requests_they_had():
    # room for the rounds that decide the claim and one level's tails (2P's: the cheaper)
    plan, clock, runner, results = measure(budget_min=5.5)
    state = results.arguments["until_decided"]
    assert clock.t <= plan.budget_min * 60 - RESERVE_S + 1e-6
    assert len(state["tails"]) == 1 and state["tails_stop"] == "the budget ended"
    assert [lv for lv in (2, 4) if all(g.p99_quotable for g in verdict_groups(results) if g.concurrency == lv)] == [4]
    thin = [g for g in verdict_groups(results) if not g.p99_quotable]
    assert thin, "the budget was meant to end first"
    head = " ".join(" ".join(headline_lines(results, summarize(results), "x")).split())
    for g in thin:
        assert f"{g.layout.partition('-')[2]} {g.requests:,}" in head, head
    assert f"need {requests_for_p99():,} requests" in head
    # the decisions are the looks' that made them, whatever the tails got
    through = sorted(set(state["judged_through"].values()))
    assert article_verdict(results).rounds == tuple(through) and state["tails"][0]["round"] > through[-1]


def test_a_budget_that_holds_no_level_whole_starts_none():
    # the claim decided at the fixed maximum of rounds, with too little left for either level's tails
    plan, clock, runner, results = measure(budget_min=4.0)
    state = results.arguments["until_decided"]
    assert set(state["judged_through"]) == {"2", "4"}
    assert all(k.settled for k in key_comparisons(results) if k.kind == "verdict")
    assert state["tails"] == [] and state["tails_stop"] == "the budget ended"
    assert not any(b[1] > results.arguments["max_rounds"] for b in runner.blocks)
    assert not all(g.p99_quotable for g in verdict_groups(results))


def test_a_tails_round_is_replayed_as_it_ran():
    plan, _, _, results = measure(budget_min=10)
    stored = results.arguments
    replayed = run_sweep(plan, ReplayRunner(results), {}, until=Until(
        None, lambda: 0.0, max_rounds=stored["max_rounds"], stored_rounds=frozenset(c.round for c in results.cells),
        final_share=stored["final_share"], stored_tails=tuple(stored["until_decided"]["tails"]),
        stored_cells=frozenset((c.layout, c.concurrency, c.round) for c in results.cells)))
    assert {(c.layout, c.concurrency, c.round) for c in replayed.cells} == \
        {(c.layout, c.concurrency, c.round) for c in results.cells}
    assert replayed.arguments["until_decided"]["judged_through"] == stored["until_decided"]["judged_through"]
    assert rule_of(replayed) == rule_of(results)
    # without the stored reason the replay's decisions section said the tails were "interrupted"
    assert replayed.arguments["until_decided"].get("tails_stop", "") == ""
    again = run_sweep(plan, ReplayRunner(results), {}, until=Until(
        None, lambda: 0.0, max_rounds=stored["max_rounds"], stored_rounds=frozenset(c.round for c in results.cells),
        final_share=stored["final_share"], stored_tails=tuple(stored["until_decided"]["tails"]),
        stored_tails_stop=stored["until_decided"]["tails_stop"],
        stored_cells=frozenset((c.layout, c.concurrency, c.round) for c in results.cells)))
    assert again.arguments["until_decided"]["tails_stop"] == stored["until_decided"]["tails_stop"] != ""


def test_a_run_without_a_verdict_records_no_rounds_for_tails():
    # the user's own app: no article scenario, so no verdict and nothing said about its tails
    plan = replace(plan_of(10), app={"app": "shop:app", "demo": False}, scenarios=("traffic",),
                   workload={"traffic": {}})
    clock = FakeClock()
    runner = RateRunner(MODEL, clock, plan, noise=0.02)
    results = run_sweep(plan, runner, {}, until=Until(plan.budget_min * 60, clock))
    state = results.arguments["until_decided"]
    assert not [k for k in key_comparisons(results) if k.kind == "verdict"]
    assert state.get("tails", []) == [] and not state.get("tails_stop")
    assert "for the verdict's tails" not in " ".join(terminal_lines(results))


def test_tails_rounds_leave_a_recorded_decision_alone():
    """The same cells, judged with and without the record of the look that decided them: the rounds
    for the tails would otherwise enter the claim's interval (more rounds than the rule's looks)."""
    _, _, _, results = measure(budget_min=10)
    unfrozen = replace(results, arguments={**results.arguments, "until_decided": {
        **results.arguments["until_decided"], "judged_through": {}}})
    through = sorted(set(results.arguments["until_decided"]["judged_through"].values()))
    assert article_verdict(results).rounds == tuple(through)
    assert max(article_verdict(unfrozen).rounds) > max(through)


@pytest.mark.parametrize("settled", [False, True])
def test_the_verdicts_thin_tails_are_no_round_until_decided(settled):
    """next_blocks: a decided level's thin tails never take a 4-s round of the undecided level's
    kind; tail_blocks sizes them instead, from each cell's rate."""
    _, _, _, results = measure(budget_min=4.0)  # decided, thin
    keys = [k for k in key_comparisons(results) if k.kind == "verdict"]
    assert all(k.settled for k in keys) and not all(g.p99_quotable for k in keys for g in k.groups)
    keys = keys if settled else [replace(keys[0], settled=False), *keys[1:]]
    blocks = next_blocks(keys)
    if settled:
        assert blocks == {}
    else:
        assert blocks == {"2x4-mapped": {"article": [keys[0].level]}, "2x4-shared": {"article": [keys[0].level]}}
    need = tail_blocks(keys)
    for k in keys:
        for g in k.groups:
            if not g.p99_quotable:
                seconds = need[g.layout]["article"][k.level]
                assert seconds == pytest.approx((1200 - g.tails.requests) / g.rps.median)


def test_a_budget_that_holds_the_claims_rounds_and_the_tails_keeps_time_for_the_tails():
    """6 minutes: without a share kept for them, the claim's rounds run to the end of the budget and
    P's tails stay thin (5.5 minutes below shows the shape); with it, the maximum of rounds stops
    where the tails still fit, never below CLAIM_ROUNDS."""
    plan, clock, runner, results = measure(budget_min=6.0)
    state = results.arguments["until_decided"]
    assert CLAIM_ROUNDS <= results.arguments["max_rounds"] < MAX_ROUNDS
    assert state["tails_stop"] == "every verdict cell's p99 quotable"
    assert all(g.p99_quotable for g in verdict_groups(results))
    assert clock.t <= plan.budget_min * 60 - RESERVE_S + 1e-6
    # the share is only kept where the claim keeps CLAIM_ROUNDS: at 5 minutes the maximum set at the
    # first look cannot hold both, and the claim's rounds stop at CLAIM_ROUNDS, where a level's tails
    # still fit after them
    _, _, _, short = measure(budget_min=5.0)
    state = short.arguments["until_decided"]
    assert short.arguments["max_rounds"] > CLAIM_ROUNDS and state["stop"] == TAILS_KEPT
    assert max(state["judged_through"].values()) == CLAIM_ROUNDS and len(state["tails"]) == 1


def test_past_claim_rounds_the_claim_stops_where_its_tails_would_no_longer_fit():
    """2P straddles the claim (22.5 against 18 req/s: 1.25x) round after round: its rounds used to run
    to the maximum set at the first look (11 here) and leave no round for the tails. Past
    CLAIM_ROUNDS a claim round runs only if the tails still fit after it."""
    model = MODEL | {("2x4-mapped", 4): (22.5, 340)}
    plan, clock = plan_of(5.0), FakeClock()
    runner = RateRunner(model, clock, plan, noise=0.02)
    results = run_sweep(plan, runner, {}, until=Until(plan.budget_min * 60, clock))
    state = results.arguments["until_decided"]
    assert results.arguments["max_rounds"] > CLAIM_ROUNDS  # the maximum allowed more claim rounds
    assert state["stop"] == TAILS_KEPT and max(state["judged_through"].values()) == CLAIM_ROUNDS
    assert results.arguments["final_round"] == CLAIM_ROUNDS  # the last look keeps the final share
    assert len(state["tails"]) == 1
    assert all(g.p99_quotable for g in verdict_groups(results) if g.concurrency == 4)
    assert clock.t <= plan.budget_min * 60 - RESERVE_S + 1e-6


def test_the_decisions_section_says_what_the_rounds_for_the_tails_did():
    _, _, _, results = measure(budget_min=10)
    rounds = [t["round"] for t in results.arguments["until_decided"]["tails"]]
    text = " ".join(" ".join(terminal_lines(results)).split())
    assert f"Then 1 round for the verdict's tails (rounds {rounds[0]}–{rounds[-1]}): every verdict cell's p99 " \
           "quotable." in text


class CoarseRunner(RateRunner):
    """RateRunner whose latencies come in 50-ms bins: ties at a p99 leave fewer than 10 requests
    above it even once a cell pooled 1,200."""

    def run_block(self, *args, **kwargs):
        out = []
        for c in super().run_block(*args, **kwargs):
            binned: dict[int, int] = {}
            for value, count in c.histogram:
                binned[value // 50000 * 50000] = binned.get(value // 50000 * 50000, 0) + count
            out.append(replace(c, histogram=compress(sorted(binned.items()))))
        return out


def test_ties_at_a_p99_get_another_round_sized_from_the_share_above_it():
    plan, clock = plan_of(10), FakeClock()
    results = run_sweep(plan, CoarseRunner(MODEL, clock, plan, noise=0.02), {},
                        until=Until(plan.budget_min * 60, clock))
    state = results.arguments["until_decided"]
    assert len(state["tails"]) >= 2, state["tails"]
    first, second = state["tails"][0]["round"], state["tails"][1]["round"]
    # a cell in the second round had pooled what 1,000 requests need (1,200) by the end of the first:
    # only ties at its p99 asked for more of it
    asked = [(x, int(lv)) for x, scs in state["tails"][1]["seconds"].items() for lv in scs["article"]]
    pooled = {key: sum(c.requests for c in results.cells if (c.layout, c.concurrency) == key and c.round <= first)
              for key in asked}
    assert any(n >= 1200 for n in pooled.values()), pooled
    assert second == first + 1
    thin = [g for g in verdict_groups(results) if not g.p99_quotable]
    assert state["tails_stop"] in (("the budget ended", "3 rounds for the tails") if thin
                                   else ("every verdict cell's p99 quotable",))
    head = " ".join(" ".join(headline_lines(results, summarize(results), "x")).split())
    for g in thin:  # the headline says why a cell with the requests is still not quotable
        mark = " (ties at its p99)" if g.tails.requests >= requests_for_p99() else ""
        assert f"{g.layout.partition('-')[2]} {g.requests:,}{mark}" in head, head
    assert any(g.tails.requests >= requests_for_p99() for g in thin), "the fixture was meant to leave ties"


class UnhistogrammedRunner(RateRunner):
    """RateRunner whose first cell of 2x4-mapped at 2 connections has no histogram (wrk's output
    not read as one): that group's latencies cannot be pooled."""

    def run_block(self, spec, repeat, levels, scenarios, on_cell=None, durations=None):
        return [replace(c, histogram=()) if (c.layout, c.concurrency, c.round) == ("2x4-mapped", 2, 1) else c
                for c in super().run_block(spec, repeat, levels, scenarios, on_cell, durations)]


def test_a_verdict_cell_without_a_histogram_gets_no_round_and_the_stop_says_why():
    plan, clock = plan_of(10), FakeClock()
    results = run_sweep(plan, UnhistogrammedRunner(MODEL, clock, plan, noise=0.02), {},
                        until=Until(plan.budget_min * 60, clock))
    state = results.arguments["until_decided"]
    unpooled = [g for g in verdict_groups(results) if not g.tails.pooled]
    assert [(g.layout, g.concurrency) for g in unpooled] == [("2x4-mapped", 2)]
    assert all(g.p99_quotable for g in verdict_groups(results) if g.tails.pooled)
    assert state["tails_stop"] == ("a verdict cell's latencies cannot be pooled (a cell without a histogram): more "
                                   "rounds would not help")
    # never asked for on its own account: where it ran in a round for the tails, its partner needed the
    # paired block, and it ran the plan's duration
    for record in state["tails"]:
        asked = record["seconds"].get("2x4-mapped", {}).get("article", {}).get("2")
        assert asked is None or asked == plan.duration


def test_a_cell_with_no_rate_to_size_it_by_gets_no_round_and_the_stop_says_why():
    # a verdict cell whose pooled p99 is thin and whose rate reads 0: tail_seconds has nothing to divide by
    cells = [Cell(layout="2x4-mapped", concurrency=2, repeat=r, round=r, scenario="article", duration_s=4.0,
                  requests=50, rps=0.0, latency_ms={"p50": 1, "p90": 2, "p99": 3, "p999": 4, "max": 5}, errors={},
                  worker_requests={"1": 50}, cpu_s={"app": 1.0}, unloaded_latency_ms=1.0, capacity_rps=0.0,
                  closed_loop_rps=0.0, efficiency=0.0, histogram=((100000, 50),)) for r in (1, 2)]
    (g,) = group_cells(Results(environment={}, arguments={}, workload={}, cells=tuple(cells)))
    assert g.tails.pooled and not g.p99_quotable and tail_seconds(g) == math.inf
    keys = [KeyComparison("verdict", "article", 2, (g,), (), True)]
    assert tail_blocks(keys) == {}
    assert tails_reserve_s(keys, plan_of(5.0), 2.5, 1) == 0.0  # no round for it, so nothing kept for one
    assert _tails_done(keys) == "a verdict cell served nothing to size its rounds by"


def test_a_tail_blames_ties_only_with_the_requests_and_no_quote():
    assert TailCount("2x4-mapped", 1200, False, True).ties
    for requests, quotable in ((400, False), (1200, True)):
        with pytest.raises(ValueError, match="ties: only a tail that pooled 1,000 requests or more"):
            TailCount("2x4-mapped", requests, quotable, True)
