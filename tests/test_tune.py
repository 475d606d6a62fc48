"""``bench tune``'s search logic on SYNTHETIC cells (tests/tunefakes.py: a made-up model of each
layout, a fake clock): deterministic, nothing started, nothing timed. Stages, early stops, ties,
budget accounting, the objective's constraints, pruning, the stall, the stored record and its
replay, the report, and the exit-3 case."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from tests.tunefakes import FakeClock, FakeMeasure, Figures, fake_run, inputs, memory_of
from uwsgi_layouts.bench.cli import main
from uwsgi_layouts.bench.report import markdown_lines, terminal_lines
from uwsgi_layouts.bench.report.plots import plot_all
from uwsgi_layouts.bench.results import Results, ResultsError, load
from uwsgi_layouts.bench.tune import record
from uwsgi_layouts.bench.tune.objective import Objective, decide, evaluate, why_lost
from uwsgi_layouts.bench.tune.search import Settings, minimum_budget_s
from uwsgi_layouts.bench.tune.space import (
    Candidate,
    MemoryModel,
    candidate_space,
    memory_probes,
    memory_prune,
    one_process_twin,
    prune_static,
)
from uwsgi_layouts.bench.tune.summary import TuneSummary

SPACE = candidate_space(4, (1, 2, 4, 8, 16, 32), ("mapped", "shared"))


def specs(cands) -> list[str]:
    return [c.spec for c in cands]


# ------------------------------------------------------------------------------ the space and pruning


def test_pruning_before_measuring_says_why_and_what_stands_in():
    kept, pruned = prune_static(SPACE, 4)
    by = {p.spec: p for p in pruned}
    assert len(SPACE) == 48 and len(kept) == 15 and len(pruned) == 33
    # too few threads: P x T < 4
    assert by["2x1-mapped"].rule == "threads" and "2 threads for 4 requests in flight" in by["2x1-mapped"].reason
    assert {p.spec for p in pruned if p.rule == "threads"} == {f"{p}x{t}-{s}" for s in ("mapped", "shared")
                                                               for p, t in ((1, 1), (1, 2), (2, 1), (3, 1))}
    # idle threads: T above the smallest T >= 4 behaves as T = 4; the one-process twin stands in
    assert by["3x16-shared"].rule == "idle-threads" and by["3x16-shared"].kept == "3x4-shared"
    assert by["1x8-mapped"].kept == "1x4-shared"
    # one process: mapped is shared
    assert by["1x4-mapped"].rule == "duplicate" and by["1x4-mapped"].kept == "1x4-shared"
    assert "1x4-shared" in specs(kept) and "4x1-mapped" in specs(kept) and "4x1-shared" in specs(kept)


def test_a_peer_is_tried_with_its_variants():
    space = candidate_space(2, (1, 4), ("mapped", "gunicorn", "granian"))
    assert specs(space) == ["1x1-mapped", "1x4-mapped", "2x1-mapped", "2x4-mapped",
                            "1x1-gunicorn", "1x4-gunicorn", "2x1-gunicorn", "2x4-gunicorn",
                            "1x1-gunicorn@keepalive=off", "1x4-gunicorn@keepalive=off", "2x1-gunicorn@keepalive=off",
                            "2x4-gunicorn@keepalive=off",
                            "1x1-granian", "1x4-granian", "2x1-granian", "2x4-granian",
                            "1x1-granian@keepalive=off", "1x4-granian@keepalive=off", "2x1-granian@keepalive=off",
                            "2x4-granian@keepalive=off"]
    assert all(Candidate.parse(c.spec) == c for c in space)
    # an idle-threads stand-in keeps the variant; one-process duplicates are uWSGI's only
    _, pruned = prune_static(candidate_space(2, (4, 8), ("gunicorn",)), 4)
    assert {p.spec: p.kept for p in pruned} == {"1x8-gunicorn": "1x4-gunicorn", "2x8-gunicorn": "2x4-gunicorn",
                                                "1x8-gunicorn@keepalive=off": "1x4-gunicorn@keepalive=off",
                                                "2x8-gunicorn@keepalive=off": "2x4-gunicorn@keepalive=off"}


def test_the_search_recommends_a_peers_variant_when_it_is_the_fastest(tmp_path):
    # SYNTHETIC, as the hand measurement of the peers issue: gthread behind keep-alive serves
    # one worker's worth, without it both workers'.
    def model(c: Candidate) -> Figures:
        rps = 10.0 * (c.processes if c.variant == "keepalive=off" else 1) if c.threads >= 4 else 5.0
        return Figures(rps, 4000 / rps, memory_of(c))

    results, outcome, measure, _ = fake_run(model, noise=0.01, concurrency="4", budget="10", strategies="gunicorn",
                                            max_processes="2", threads="4")
    assert {s for s, *_ in measure.calls} == {"1x4-gunicorn", "2x4-gunicorn", "1x4-gunicorn@keepalive=off",
                                              "2x4-gunicorn@keepalive=off"}
    assert outcome.chosen.spec == "2x4-gunicorn@keepalive=off"
    assert "2x4-gunicorn@keepalive=off" in "\n".join(terminal_lines(results))


def test_pruning_without_the_idle_rule_and_for_more_requests_in_flight():
    kept, _ = prune_static(SPACE, 4, idle_rule=False)
    assert "2x32-mapped" in specs(kept)
    kept, pruned = prune_static(SPACE, 7)  # 4 healthy + 3 stalled
    assert "2x2-mapped" not in specs(kept) and "2x4-mapped" in specs(kept) and "2x8-mapped" in specs(kept)
    assert "2x16-mapped" not in specs(kept) and "1x8-shared" in specs(kept)


def test_one_process_duplicates_keep_the_plainest_and_never_overflow():
    assert one_process_twin(Candidate(1, 4, "mapped"), {"mapped", "shared"}) == Candidate(1, 4, "shared")
    assert one_process_twin(Candidate(1, 4, "mapped"), {"mapped", "thunder"}) == Candidate(1, 4, "thunder")
    assert one_process_twin(Candidate(1, 4, "shared"), {"mapped", "shared"}) is None
    assert one_process_twin(Candidate(1, 4, "overflow"), {"overflow", "shared"}) is None
    assert one_process_twin(Candidate(2, 4, "mapped"), {"mapped", "shared"}) is None


def test_memory_prediction_prunes_only_beyond_its_margin():
    model = MemoryModel("uwsgi", 9.0, 6.4, 0.1, 0.5, 3)
    assert model.predict(Candidate(4, 8, "mapped")) == pytest.approx(9 + 25.6 + 2.8)
    kept, pruned = memory_prune([Candidate(4, 8, "mapped"), Candidate(2, 4, "mapped")], {"uwsgi": model}, 30)
    assert specs(kept) == ["2x4-mapped"] and pruned[0].rule == "memory" and "> 30 MB" in pruned[0].reason
    # within the margin (5% or 2 MB): measured, not pruned
    kept, pruned = memory_prune([Candidate(3, 4, "mapped")], {"uwsgi": model}, 29.5)
    assert specs(kept) == ["3x4-mapped"] and not pruned
    assert specs(memory_probes([Candidate(p, t, "mapped") for p in (1, 2, 4) for t in (1, 4, 32)])) == [
        "1x1-mapped", "4x1-mapped", "4x32-mapped"]


# ------------------------------------------------------------------------------ the objective


def test_objective_in_words():
    assert Objective(4).words() == ("highest throughput at 4 concurrent requests; no failed or non-2xx requests; "
                                    "a candidate beaten on paired rounds is never chosen; ties (throughput "
                                    "equivalent) go to less memory, then fewer processes")
    words = Objective(8, 250, 600, 0.05, 3000).words()
    assert words.startswith("highest throughput at 8 concurrent requests with p99 <= 250 ms and <= 600 MB of uWSGI "
                            "PSS, also while 5% of requests stall 3000 ms")
    assert words.endswith("ties (throughput equivalent) go to less memory, then fewer processes")


def cells_for(figures: Figures, c: Candidate, repeats: int = 3, seed: int = 3, duration: int = 10):
    fake = FakeMeasure(FakeClock(), lambda _: figures, 4, seed=seed)
    return [cell for r in range(1, repeats + 1) for cell in fake.block(c.spec, r, duration, 0)]


def test_constraints_by_point_and_beyond_noise():
    c = Candidate(2, 4, "mapped")
    fast = cells_for(Figures(20, 200, 30), c)
    e = evaluate(c, fast, [], Objective(4, p99_ms=1000, memory_mb=100))
    assert e.meets and not e.sure_misses and e.violation < 1
    e = evaluate(c, fast, [], Objective(4, p99_ms=100))  # p99 ~ 350 ms: beyond noise over 100
    assert not e.meets and e.sure_misses and "beyond noise" in e.sure_misses[0]
    p99 = evaluate(c, fast, [], Objective(4)).p99
    e = evaluate(c, fast, [], Objective(4, p99_ms=(p99.low + p99.value) / 2))  # point over, interval straddles
    assert not e.meets and not e.sure_misses and e.borderline
    e = evaluate(c, fast, [], Objective(4, memory_mb=25))
    assert e.misses == ("memory 30.0 MB > 25 MB",) and e.violation == pytest.approx(1.2)
    failing = cells_for(Figures(20, 200, 30, failed=2), c)
    e = evaluate(c, failing, [], Objective(4))
    assert not e.meets and e.errors == 6 and "6 failed or non-2xx requests" in e.misses[0]


def test_ties_go_to_less_memory_then_fewer_processes():
    small, big, other = Candidate(2, 2, "mapped"), Candidate(4, 4, "mapped"), Candidate(2, 4, "shared")
    obj = Objective(4)
    evals = [evaluate(small, cells_for(Figures(20.0, 200, 22.0), small, seed=1), [], obj),
             evaluate(big, cells_for(Figures(20.0, 200, 35.8), big, seed=2), [], obj)]
    d = decide(evals)
    assert {e.spec for e in d.tied} == {"2x2-mapped", "4x4-mapped"}  # throughput within noise
    assert d.chosen.spec == "2x2-mapped"  # less memory wins, whichever had the higher median
    assert d.runner_up.spec == "4x4-mapped" and "uses more memory: 35.8 vs 22.0 MB" in d.why
    # same memory (within 1 MB): fewer processes
    one = Candidate(1, 8, "shared")
    evals = [evaluate(one, cells_for(Figures(20.0, 200, 22.5), one, seed=1), [], obj),
             evaluate(other, cells_for(Figures(20.0, 200, 22.0), other, seed=2), [], obj)]
    d = decide(evals)
    assert d.chosen.spec == "1x8-shared" and "more processes: 2 vs 1" in d.why
    # beyond noise: the faster one wins whatever its memory
    evals = [evaluate(small, cells_for(Figures(10, 400, 22.0), small, seed=1), [], obj),
             evaluate(big, cells_for(Figures(20, 200, 35.8), big, seed=2), [], obj)]
    d = decide(evals)
    assert d.chosen.spec == "4x4-mapped" and d.why.startswith("lower throughput beyond noise")


def test_nothing_meets_names_the_closest():
    obj = Objective(4, p99_ms=50)
    a, b = Candidate(2, 4, "mapped"), Candidate(2, 4, "shared")
    d = decide([evaluate(a, cells_for(Figures(20, 100, 22), a), [], obj),
                evaluate(b, cells_for(Figures(20, 300, 22), b), [], obj)])
    assert d.chosen is None and d.closest.spec == "2x4-mapped" and d.runner_up is None


# ------------------------------------------------------------------------------ the search


def test_stages_screen_all_then_narrow_interleaved_then_final():
    events = []
    results, outcome, measure, clock = fake_run(concurrency="4", p99_ms="400", progress=events.append)
    stages = outcome.stages
    assert [s.number for s in stages] == [1, 2, 3]
    assert len(stages[0].candidates) == 15 and stages[0].repeats == 1
    assert len(stages[1].candidates) == 5 and stages[1].repeats == 2 and len(stages[2].candidates) == 3
    assert 2 <= stages[0].duration_s <= 6 and stages[0].duration_s <= stages[1].duration_s <= 15
    # every survivor screened once, in stage 1, before anything else
    first = [c for c in measure.calls[:15]]
    assert sorted(s for s, *_ in first) == sorted(stages[0].candidates) and all(r == 1 for _, r, *_ in first)
    # stage 2 interleaves: A B C D E, A B C D E
    narrow = [s for s, *_ in measure.calls[15:25]]
    assert narrow[:5] == narrow[5:] == list(stages[1].candidates)
    # the shared layouts of the model (0.8x) never reach the final; 1x4 (GIL-bound) misses the p99
    assert all("mapped" in s for s in stages[2].candidates)
    assert outcome.states["1x4-shared"].dropped_at == "stage 1"
    assert outcome.chosen is not None and outcome.chosen.spec in stages[2].candidates
    # every candidate of the space says where it stopped
    assert all(s.dropped_at or s.spec == outcome.chosen.spec for s in outcome.states.values())
    # one progress event per block; the best so far is one still in the race when the stage ends
    assert len(events) == len(outcome.blocks) and [e.stage for e in events] == [b.stage for b in outcome.blocks]
    assert events[-1].best.spec in stages[2].candidates and events[-1].done == events[-1].total
    assert all(e.left_s <= 600 and e.stage_eta_s >= 0 for e in events)


def test_budget_is_kept_and_replanned_from_measured_times():
    for budget, overhead in ((600, 2.5), (600, 8.0), (240, 2.5), (120, 5.0)):
        _, outcome, measure, clock = fake_run(concurrency="4", budget=str(budget / 60), overhead_s=overhead)
        reserve = Settings(budget_s=budget).reserve_s
        assert clock.t + reserve <= budget * 1.1, (budget, overhead, clock.t)
        assert clock.t >= budget * 0.5, (budget, overhead, clock.t)  # the budget is used, not wasted
        for b in outcome.blocks:
            assert b.seconds == pytest.approx(overhead + len(b.scenarios) * (1.0 + b.duration_s))
    # slower blocks: the search re-estimates their fixed cost from stage 1 and plans shorter cells
    _, fast, *_ = fake_run(concurrency="4", budget="10")
    _, slow, *_ = fake_run(concurrency="4", budget="10", overhead_s=8.0)
    assert fast.stages[1].candidates == slow.stages[1].candidates
    assert slow.stages[1].duration_s < fast.stages[1].duration_s


def test_a_budget_too_small_for_the_space_is_refused_up_front():
    assert minimum_budget_s(15, Settings(budget_s=60)) == pytest.approx(10 + 15 * 6 + 2 * 6 + 8)
    with pytest.raises(Exception, match="budget: 1 min is too short to screen 15 candidates"):
        fake_run(concurrency="4", budget="1")


def test_early_stop_when_decided():
    def model(c: Candidate) -> Figures:
        rps = 40.0 if c.spec == "2x4-mapped" else 10.0 + c.processes
        return Figures(rps, 4000 / rps, memory_of(c))

    _, outcome, _, clock = fake_run(model, noise=0.01, concurrency="4", budget="10")
    assert outcome.chosen.spec == "2x4-mapped"
    assert outcome.stop.startswith("decided: 2x4-mapped is ahead of every other finalist beyond noise")
    assert [s.number for s in outcome.stages] == [1, 2] and clock.t < 0.7 * 600


def test_early_stop_when_the_leaders_cannot_be_told_apart_then_the_tie_rule():
    def model(c: Candidate) -> Figures:
        return Figures(20.0 if c.strategy == "mapped" else 12.0, 200.0, memory_of(c))

    _, outcome, _, clock = fake_run(model, noise=0.002, concurrency="4", budget="10")
    assert outcome.stop.startswith("the leaders cannot be told apart: every throughput ratio to")
    assert outcome.stop.endswith("lies within ±5%")
    # every mapped candidate is as fast: the least memory wins (2 processes x 2 threads, not 1 x 4: GIL-free model)
    finalists = [outcome.evaluations[s] for s in outcome.finalists]
    least = min(e.memory_mb for e in finalists)
    assert outcome.chosen.memory_mb == least
    assert clock.t < 600


def test_memory_limit_prunes_predictions_and_holds():
    _, outcome, measure, _ = fake_run(concurrency="4", memory_mb="30")
    assert [s for s, *_ in measure.calls[:3]] == ["1x4-shared", "4x1-mapped", "4x4-mapped"]  # the memory probes
    model = outcome.memory_models["uwsgi"]
    assert model.per_process_mb == pytest.approx(6.4, abs=0.01) and model.per_thread_mb == pytest.approx(0.1, abs=0.01)
    memory_pruned = [p for p in outcome.pruned if p.rule == "memory"]
    assert memory_pruned and all(s not in {c for c, *_ in measure.calls} for s in (p.spec for p in memory_pruned))
    assert outcome.chosen.memory_mb <= 30


def test_p99_limit_excludes_the_fast_layout_with_a_slow_tail():
    def model(c: Candidate) -> Figures:
        if c.spec == "4x4-mapped":
            return Figures(25.0, 450.0, memory_of(c))  # fastest, but its p99 is ~800 ms
        return Figures(18.0, 180.0, memory_of(c))

    _, outcome, *_ = fake_run(model, concurrency="4", p99_ms="400")
    assert outcome.chosen.spec != "4x4-mapped" and outcome.chosen.p99.value <= 400
    assert "p99" in outcome.states["4x4-mapped"].reason


def test_stall_is_sized_from_the_pilot_and_prunes_what_cannot_hold_it():
    def model(c: Candidate) -> Figures:
        # under the stall, layouts with few threads queue healthy requests behind stalled ones
        stall_p50 = 200.0 if c.processes * c.threads >= 12 else 900.0
        return Figures(20.0, 200.0, memory_of(c), stall_p50_ms=stall_p50)

    results, outcome, measure, _ = fake_run(model, concurrency="4", p99_ms="500", stall_share="0.05",
                                            stall_ms="3000")
    pilot = measure.calls[0]
    assert pilot[0] == "2x4-mapped" and pilot[3] == 0  # P = nproc, T = the concurrency, first strategy
    k = outcome.stall_clients
    pilot_cell = next(c for c in results.cells if c.layout == "2x4-mapped" and c.repeat == 1)
    assert k == max(1, math.ceil(0.05 * pilot_cell.rps * 3))  # Little's law: share x throughput x stall time
    assert 2 <= k <= 4 and outcome.stall_note.startswith(f"{k} stalled requests in flight = 0.05 x ")
    in_flight = 4 + k
    assert all(Candidate.parse(s).processes * Candidate.parse(s).threads >= in_flight
               for s, *_ in measure.calls[1:])
    assert all(stall == k for _, _, _, stall in measure.calls if stall)  # stalls in stages 2 and 3 only
    assert {b.stage for b in outcome.blocks if "stall" in b.scenarios} == {2, 3}
    assert outcome.chosen.stall is not None and outcome.chosen.stall.tails.p99.value <= 500
    assert outcome.chosen.candidate.processes * outcome.chosen.candidate.threads >= 12
    assert "stall" in {c.scenario for c in results.cells}


# ------------------------------------------------------------------------------ stored runs and replay


def test_the_record_round_trips_and_the_replay_takes_the_same_decisions(tmp_path):
    results, outcome, *_ = fake_run(concurrency="4", p99_ms="400")
    path = results.save(tmp_path / "results.json")
    loaded = load(path)
    assert loaded.kind == "tune" and loaded.arguments["tune"]["decision"]["chosen"] == outcome.chosen.spec
    again = record.replay(loaded)
    assert [b.to_dict() for b in again.blocks] == [b.to_dict() for b in outcome.blocks]
    assert again.chosen.spec == outcome.chosen.spec and again.stop == outcome.stop
    assert {s: (x.dropped_at, x.reason) for s, x in again.states.items()} == \
           {s: (x.dropped_at, x.reason) for s, x in outcome.states.items()}


def test_replay_with_another_objective_and_of_an_interrupted_run(tmp_path):
    results, outcome, *_ = fake_run(concurrency="4", p99_ms="400")
    other = record.inputs_of({**results.arguments, "p99_ms": 100000.0})
    try:
        replayed = record.replay(results, other)
    except record.ReplayError as exc:
        assert str(exc).startswith("replay: no stored block for")
    else:
        assert replayed.decision is not None
    half = results.arguments["tune"]["blocks"][:20]
    keys = {(b["spec"], b["repeat"]) for b in half}
    cut = Results(environment=results.environment, workload=results.workload, kind="tune",
                  arguments={**results.arguments, "complete": False,
                             "tune": {**results.arguments["tune"], "blocks": half}},
                  cells=tuple(c for c in results.cells if (c.layout, c.repeat) in keys))
    replayed = record.replay(cut)
    assert replayed.interrupted and len(replayed.blocks) == 20 and replayed.stop == "interrupted after 20 blocks"


@pytest.mark.parametrize("change, message", [
    (lambda t: t.update(version=2), "arguments.tune: version 2 is not supported"),
    (lambda t: t.update(clock=[0.0, 5.0, 4.0]), "arguments.tune: clock[2] goes back in time"),
    (lambda t: t["blocks"][0].update(stage=4), "arguments.tune: blocks[0].stage must be 1, 2 or 3"),
    (lambda t: t["blocks"][0].update(repeat=9), "arguments.tune: blocks[0]: no stored article cell for"),
    (lambda t: t["settings"].update(budget_s=-1), "arguments.tune: settings.budget_s must be a number >= 1"),
])
def test_a_damaged_record_is_refused_with_one_line(tmp_path, change, message):
    results, *_ = fake_run(concurrency="4")
    data = json.loads(json.dumps(results.to_dict()))
    change(data["arguments"]["tune"])
    path = tmp_path / "results.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ResultsError) as exc:
        load(path)
    assert message in str(exc.value) and "\n" not in str(exc.value)


# ------------------------------------------------------------------------------ report, CLI replay, exit 3


def test_report_says_what_was_chosen_and_why_every_candidate_stopped(tmp_path):
    results, outcome, *_ = fake_run(concurrency="4", p99_ms="400")
    text = "\n".join(terminal_lines(results))
    chosen = outcome.chosen.spec
    assert f"RECOMMENDATION: {chosen}: " in text and "req/s" in text and "p99" in text and "uWSGI PSS" in text
    assert f"runner-up: {outcome.decision.runner_up.spec}" in text
    assert "objective: highest throughput at 4 concurrent requests with p99 <= 400 ms" in text
    assert "candidates: 48 in the space, 15 measured, 33 pruned" in text
    assert "too few threads (8, " in text and "idle threads (24, " in text and "duplicates (1, " in text
    assert "stage 1 screen: 15 candidates x 1 cell of" in text and "wall time: " in text
    for spec in outcome.evaluations:
        assert f"  {spec}: " in text
    md = "\n".join(markdown_lines(results, ["p99-throughput.png"]))
    assert "## Recommendation" in md and "## Every candidate measured" in md and "## Pruned before measuring" in md
    assert "![p99-throughput](p99-throughput.png)" in md
    written = plot_all(results, tmp_path)
    assert [p.name for p in written] == ["p99-throughput.png"] and written[0].stat().st_size > 0


def test_cli_replay_and_report_rerender(tmp_path, tmp_run_dir, capsys):
    results, outcome, *_ = fake_run(concurrency="4", p99_ms="400")
    stored = results.save(tmp_path / "stored" / "results.json")
    out = tmp_run_dir / "replayed"  # the run user (www-data under root) must reach recommended/
    assert main(["tune", "--replay", str(stored), "--out", str(out)]) == 0
    shown = capsys.readouterr()
    assert f"RECOMMENDATION: {outcome.chosen.spec}" in shown.out
    assert (out / "recommended" / "uwsgi.ini").is_file() and (out / "recommended" / "RUN.md").is_file()
    assert (out / "recommended" / "bundle" / "INSTALL.md").is_file()
    assert TuneSummary.load(out / "summary.json").choice.chosen == outcome.chosen.spec  # judged once, stored
    replayed = load(out / "results.json")
    assert replayed.arguments["tune"]["recommended"]["layout"] == outcome.chosen.spec
    assert main(["report", str(out / "results.json")]) == 0
    shown = capsys.readouterr()
    assert f"RECOMMENDATION: {outcome.chosen.spec}" in shown.out and shown.err == ""  # rendered from summary.json


def test_exit_3_when_no_layout_meets_the_objective(tmp_path, tmp_run_dir, capsys):
    results, *_ = fake_run(concurrency="4")
    stored = results.save(tmp_path / "stored" / "results.json")
    out = tmp_run_dir / "strict"
    # a p99 limit no candidate can meet, decided again on the same cells
    code = main(["tune", "--replay", str(stored), "--p99-ms", "1", "--out", str(out)])
    text = capsys.readouterr().out
    assert code == 3, text
    assert "NO LAYOUT MEETS THE OBJECTIVE." in text and "closest: " in text and "misses: p99" in text
    assert not (out / "recommended").exists() and (out / "results.json").is_file()


def test_a_stall_no_layout_can_hold_leaves_no_choice_and_names_the_closest():
    def model(c: Candidate) -> Figures:
        return Figures(20.0, 200.0, memory_of(c))

    # 50% of 20 req/s stalled 10 s: 100 stalled requests in flight, more than 4 x 8 threads hold
    _, outcome, measure, _ = fake_run(model, concurrency="4", threads="1,2,4,8", stall_share="0.5",
                                      stall_ms="10000")
    assert outcome.stall_clients == 100 and len(measure.calls) == 1  # the pilot, then everything pruned
    assert outcome.chosen is None and outcome.decision.closest.spec == measure.calls[0][0]
    assert outcome.stop == "no candidate left after stage 1"
    assert outcome.states[measure.calls[0][0]].reason.startswith("pruned after its cell with 100 stalled: ")


def test_a_cut_keeps_the_cheapest_tied_ones_and_the_fastest():
    from uwsgi_layouts.bench.tune.search import Search

    cands = [Candidate(2, 2, "mapped"), Candidate(3, 4, "mapped"), Candidate(4, 4, "mapped"), Candidate(2, 4, "shared")]
    # within 1.5% of each other with 0.2% noise: every paired interval (95% over the looks, 3 rounds) lies
    # within ±5%, equivalent
    figures = {"2x2-mapped": Figures(20.5, 200, 22.0), "3x4-mapped": Figures(20.5, 200, 29.0),
               "4x4-mapped": Figures(20.8, 200, 36.0), "2x4-shared": Figures(10.0, 400, 22.5)}
    fake = FakeMeasure(FakeClock(), lambda c: figures[c.spec], 4, noise=0.002, seed=1)
    search = Search(inputs(Objective(4), cands), fake, fake.clock)
    for _ in range(3):
        for c in cands:
            search.run_block(2, c, 10, False, 0.0)
    tied = decide(list(search.out.evaluations.values()))
    assert tied.leader.spec == "4x4-mapped" and {e.spec for e in tied.tied} >= {"2x2-mapped", "4x4-mapped"}
    kept = search.cut(2, cands, lambda n: 2)
    assert specs(kept) == ["2x2-mapped", "4x4-mapped"]  # the tie rule's choice, and the fastest
    assert search.out.states["3x4-mapped"].reason.startswith("equivalent on throughput to 4x4-mapped")
    assert search.out.states["2x4-shared"].reason.startswith("rank 4 of 4")


def rounds_cells(spec: str, rates: list[float], p50_ms: float = 200.0) -> list:
    """SYNTHETIC cells of ``spec`` with these throughputs in rounds 1, 2, ...: latencies as the fake draws them."""
    fake = FakeMeasure(FakeClock(), lambda c: Figures(1.0, p50_ms, memory_of(c)), 4, noise=0.0)
    out = []
    for r, rate in enumerate(rates, start=1):
        (cell,) = fake.block(spec, r, 10, 0)
        out.append(dataclasses.replace(cell, rps=rate, requests=int(rate * 10)))
    return out


def test_an_unsteady_candidate_is_flagged_and_does_not_lead_on_its_median():
    """The issue's demo-app case: 2x2-shared's cells swung 24.5-35.4 req/s and tune chose it on its
    median. Undecided against a steady 2x4-mapped, it is flagged and the steady one is chosen."""
    obj = Objective(4)
    rates = {"2x4-mapped": [30.0, 30.5, 29.5, 30.2, 29.8], "4x1-mapped": [28.0, 28.4, 27.6, 28.2, 27.9],
             "2x2-shared": [24.5, 35.4, 31.0, 36.0, 26.0]}
    evals = [evaluate(Candidate.parse(s), rounds_cells(s, r), [], obj) for s, r in rates.items()]
    d = decide(evals)
    assert d.leader.spec == "2x2-shared"  # the highest median throughput...
    assert d.unsteady == ("2x2-shared",) and "2x2-shared" not in d.beaten
    assert d.chosen.spec == "2x4-mapped"  # ...but a steadier candidate it did not beat is recommended
    assert d.beaten == {"4x1-mapped": "2x4-mapped"}
    reasons = {e.spec: why_lost(e, d) for e in d.order[1:]}
    assert reasons["2x2-shared"].startswith("unsteady: its throughput spread 37% across its 5 rounds")
    assert reasons["4x1-mapped"].startswith("lower throughput beyond noise: 0.93x")
    # an unsteady candidate that beats the others beyond noise is still chosen (and flagged)
    rates["2x2-shared"] = [40.0, 52.0, 44.0, 55.0, 41.0]
    evals = [evaluate(Candidate.parse(s), rounds_cells(s, r), [], obj) for s, r in rates.items()]
    d = decide(evals)
    assert d.chosen.spec == "2x2-shared" and d.unsteady == ("2x2-shared",)
