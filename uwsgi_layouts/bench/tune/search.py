"""The search: successive halving sized to a wall-clock budget, on any measure (live or replayed).

    outcome = run_search(inputs, measure, clock, progress=..., on_block=...)

Stages (each block = one stack start, a warm-up, one cell per scenario at the concurrency N):

1. screen: every candidate left after pruning (``bench.tune.space``), one short cell each. The
   first cell is the pilot: with ``--stall-share``, its throughput sizes the stall (Little's law:
   stalled requests in flight = share x throughput x stall time), and the candidates that cannot
   hold N + that many requests are pruned. With ``--memory-mb``, the next cells are memory probes
   (few and many processes, many threads): once three are measured, the fitted cost of a process
   and a thread predicts the rest, and those predicted over the budget are pruned unmeasured.
   Candidates that miss the objective beyond noise are dropped; the best third (at least
   ``min_keep``) go on, ranked by ``objective.by_rank``.
2. narrow: those, ``narrow_repeats`` longer cells each, interleaved (A B C, A B C), with a stall
   cell beside each steady one when a stall is asked for. The best ``finalists`` go on.
3. final: rounds of one more cell each (interleaved), until one of the early stops, the round
   limit or the budget: the leader is ahead of every other finalist beyond noise ("decided"),
   or every other finalist is beaten or equivalent to it within +-tie_band, the equivalence
   margin ("cannot be told apart": the tie rule picks less memory, then fewer processes), or
   nothing left can meet the objective. The decision (``objective.decide``) takes every round of
   each finalist; comparisons are paired by round (every stage measures its candidates in
   lockstep rounds: stage 1 is round 1, each stage-2 and stage-3 round one more), and judged by
   ``rule()``: the margin, and the looks of stage 3 (the rounds after stage 2 up to the most
   stage 3 may run) sharing the error as ``bench.paired`` explains.

Budget: a block's cost is estimated as a fixed part (stack start and stop, reads; re-estimated
from the blocks measured: the median of the last eight) plus the warm-up and the load of each
scenario. Stage sizes are planned from what is left (stage 1 takes ``screen_share`` of it,
stage 2 ``narrow_share`` of the rest), re-planned from measured times before each stage, and a
block (a round, in stage 3) starts only if it fits before the budget minus ``reserve_s`` (kept
for writing the results). The clock is read only through ``clock.now()``; a live run records
every read (``TapeClock``), so a replay sees the same clock and takes the same decisions.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from dataclasses import asdict
from typing import Callable

from uwsgi_layouts.bench.analysis import fit_memory
from uwsgi_layouts.bench.results import Cell
from uwsgi_layouts.bench.tune.objective import (
    Decision,
    Evaluation,
    by_rank,
    decide,
    evaluate,
    rps_comparison,
    server_pss,
    why_lost,
)
from uwsgi_layouts.bench.tune.outcome import (
    Block,
    Clock,
    Event,
    Inputs,
    Measure,
    Outcome,
    Settings,
    StageRecord,
    State,
    Stopped,
)
from uwsgi_layouts.bench.tune.space import Candidate, MemoryModel, memory_probes, memory_prune, prune_static

MAX_STALL_CLIENTS = 512


class TapeClock:
    """Seconds since the run started; every read is recorded (``reads``) for replays."""

    def __init__(self, start: float | None = None):
        self.t0 = time.monotonic() if start is None else start
        self.reads: list[float] = []

    def now(self) -> float:
        value = round(time.monotonic() - self.t0, 3)
        self.reads.append(value)
        return value


def block_cost(overhead_s: float, warmup_s: float, scenarios: int, duration_s: float) -> float:
    return overhead_s + scenarios * (warmup_s + duration_s)


def minimum_budget_s(candidates: int, settings: Settings, setup_s: float = 10.0) -> float:
    """The least budget that screens ``candidates`` with the shortest cells, keeps as much again
    for the later stages, and the reserve: below it, the budget is refused up front."""
    screen = candidates * block_cost(settings.block_overhead_s, settings.warmup_s, 1, settings.min_duration_s)
    later = min(2, candidates) * block_cost(settings.block_overhead_s, settings.warmup_s, 1, settings.min_duration_s)
    return setup_s + screen + later + settings.reserve_s


class Search:
    def __init__(self, inputs: Inputs, measure: Measure, clock: Clock,
                 progress: Callable[[Event], None] | None = None, on_block: Callable[[Outcome], None] | None = None):
        self.inputs, self.measure, self.clock = inputs, measure, clock
        self.objective, self.settings = inputs.objective, inputs.settings
        self.progress, self.on_block = progress, on_block
        self.out = Outcome(inputs, states={c.spec: State(c.spec) for c in inputs.space})
        self.cells: dict[str, dict[str, list[Cell]]] = {}  # spec -> scenario -> cells
        self.repeats: dict[str, int] = {}
        self.overheads: list[float] = []

    # --- the clock and the budget -------------------------------------------------------------

    @property
    def overhead_s(self) -> float:
        recent = self.overheads[-8:]
        return statistics.median(recent) if recent else self.settings.block_overhead_s

    def cost(self, scenarios: int, duration_s: float) -> float:
        return block_cost(self.overhead_s, self.settings.warmup_s, scenarios, duration_s)

    def left_s(self, now: float) -> float:
        """Seconds left for measuring: the budget minus the reserve minus what has passed."""
        return self.settings.budget_s - self.settings.reserve_s - now

    # --- measuring ------------------------------------------------------------------------------

    def scenarios(self, with_stall: bool) -> tuple[str, ...]:
        return (self.inputs.steady, self.inputs.stall) if with_stall else (self.inputs.steady,)

    def run_block(self, stage: int, c: Candidate, duration_s: int, with_stall: bool, started: float) -> Block:
        repeat = self.repeats.get(c.spec, 0) + 1
        cells = self.measure.block(c.spec, repeat, duration_s, self.out.stall_clients if with_stall else 0)
        ended = self.clock.now()
        self.repeats[c.spec] = repeat
        mine = self.cells.setdefault(c.spec, {})
        for cell in cells:
            mine.setdefault(cell.scenario, []).append(cell)
        scenarios = self.scenarios(with_stall)
        block = Block(stage, c.spec, repeat, scenarios, duration_s, started, round(ended - started, 3))
        self.out.blocks.append(block)
        self.overheads.append(block.seconds - len(scenarios) * (self.settings.warmup_s + duration_s))
        self.out.states[c.spec].reached = stage
        self.out.evaluations[c.spec] = self.evaluate(c)
        self.out.ended_s = ended
        if self.on_block:
            self.on_block(self.out)
        return block

    def evaluate(self, c: Candidate) -> Evaluation:
        mine = self.cells[c.spec]
        return evaluate(c, mine.get(self.inputs.steady, []), mine.get(self.inputs.stall, []), self.objective,
                        self.settings.rule())

    def report(self, stage: int, done: int, total: int, block: Block, stage_eta_s: float) -> None:
        if not self.progress:
            return
        alive = [e for e in self.out.evaluations.values() if not self.out.states[e.spec].dropped_at]
        best = decide(alive or list(self.out.evaluations.values()))  # among those still in the race
        cells = tuple(self.cells[block.spec][s][-1] for s in block.scenarios if s in self.cells[block.spec])
        self.progress(Event(stage, done, total, block, cells, best.chosen or best.closest, stage_eta_s,
                            max(0.0, self.settings.budget_s - self.out.ended_s)))

    def drop(self, spec: str, where: str, reason: str) -> None:
        state = self.out.states[spec]
        state.dropped_at, state.reason = where, reason

    # --- the stages -----------------------------------------------------------------------------

    def run(self) -> None:
        now = self.clock.now()
        self.out.started_s = self.out.ended_s = now
        survivors = self.prune(list(self.inputs.space), self.objective.concurrency,
                               idle_rule=not self.objective.stall_share)
        survivors = self.screen(survivors)
        if not survivors:
            return self.finish([], "no candidate left after stage 1")
        narrowed = self.narrow(survivors)
        self.final(narrowed)

    def prune(self, candidates: list[Candidate], in_flight: int, idle_rule: bool = True, after: str = ""
              ) -> list[Candidate]:
        kept, pruned = prune_static(candidates, in_flight, idle_rule)
        for p in pruned:
            measured = p.spec in self.out.evaluations
            reason = (f"{after}: " if after else "") + p.reason + (f" (kept {p.kept})" if p.kept else "")
            if measured:
                self.drop(p.spec, "stage 1", "pruned after its cell " + reason)
            else:
                self.drop(p.spec, "pruned", reason)
        self.out.pruned.extend(p for p in pruned if p.spec not in self.out.evaluations)
        return kept

    def screen_order(self, survivors: list[Candidate]) -> list[Candidate]:
        """The pilot (with a stall), the memory probes (with a memory limit), the rest shuffled
        (seeded: drift over the stage hits no group of candidates more than another)."""
        first: list[Candidate] = []
        if self.objective.stall_share:
            n, p = self.objective.concurrency, self.inputs.pilot_processes
            strategies = [c.strategy for c in self.inputs.space]
            first.append(min(survivors, key=lambda c: (abs(c.processes - p), c.threads < n, abs(c.threads - n),
                                                       strategies.index(c.strategy))))
        if self.objective.memory_mb is not None:
            first += [c for c in memory_probes(survivors) if c not in first]
        rest = [c for c in survivors if c not in first]
        random.Random(self.settings.seed).shuffle(rest)
        return first + rest

    def screen(self, survivors: list[Candidate]) -> list[Candidate]:
        s = self.settings
        order = self.screen_order(survivors)
        now = self.clock.now()
        per_block = s.screen_share * self.left_s(now) / max(1, len(order))
        duration = int(max(s.min_duration_s, min(s.screen_max_s, per_block - self.overhead_s - s.warmup_s)))
        record = StageRecord(1, tuple(c.spec for c in order), 1, duration, self.scenarios(False),
                             round(len(order) * self.cost(1, duration), 1))
        measured: list[Candidate] = []
        done, start = 0, now
        while order:
            c = order.pop(0)
            if now + self.cost(1, duration) > s.budget_s - s.reserve_s:
                for left in [c, *order]:
                    self.drop(left.spec, "budget", "not measured: the budget ran out during stage 1")
                record = _with(record, note=f"the budget ran out after {done} of {done + 1 + len(order)} cells")
                break
            block = self.run_block(1, c, duration, False, now)
            measured.append(c)
            done += 1
            if self.objective.stall_share and not self.out.stall_clients:
                order, measured = self.size_stall(c, order, measured)
            if self.objective.memory_mb is not None:
                order = self.predict_memory(measured, order)
            now = self.clock.now()
            self.report(1, done, done + len(order), block, len(order) * self.cost(1, duration))
        self.out.stages.append(_with(record, seconds=round(now - start, 1)))
        return self.cut(1, measured, self.keep_after_screen)

    def keep_after_screen(self, n: int) -> int:
        return min(n, max(self.settings.min_keep, math.ceil(n * self.settings.keep_share)))

    def size_stall(self, pilot: Candidate, order: list[Candidate], measured: list[Candidate]
                   ) -> tuple[list[Candidate], list[Candidate]]:
        """From the pilot's throughput, the stalled requests in flight (Little's law), then the
        pruning that needed them."""
        o = self.objective
        rps = self.out.evaluations[pilot.spec].rps.value
        wanted = o.stall_share * rps * o.stall_ms / 1000
        clients = max(1, min(MAX_STALL_CLIENTS, math.ceil(wanted)))
        self.out.stall_clients = clients
        self.out.stall_note = (f"{clients} stalled request{'s' if clients > 1 else ''} in flight = "
                               f"{o.stall_share:g} x {rps:.1f} req/s ({pilot.spec}, the first cell) x "
                               f"{o.stall_ms / 1000:g} s"
                               + (", rounded up" if clients > wanted else "")
                               + (f" (capped at {MAX_STALL_CLIENTS})" if wanted > MAX_STALL_CLIENTS else ""))
        in_flight = o.concurrency + clients
        keep = {c.spec for c in self.prune([*measured, *order], in_flight, after=f"with {clients} stalled")}
        return [c for c in order if c.spec in keep], [c for c in measured if c.spec in keep]

    def predict_memory(self, measured: list[Candidate], order: list[Candidate]) -> list[Candidate]:
        for server in dict.fromkeys(c.server for c in measured):
            points = []
            for c in measured:
                if c.server != server:
                    continue
                for cell in self.cells[c.spec].get(self.inputs.steady, []):
                    mb = server_pss(cell.memory)
                    if mb is not None:
                        points.append((c.processes, c.threads, mb))
            fitted = fit_memory(points) if len({(p, t) for p, t, _ in points}) >= 3 else None
            if fitted is not None:
                (base, per_p, per_t), worst = fitted
                self.out.memory_models[server] = MemoryModel(server, base, per_p, per_t, worst, len(points))
        if not self.out.memory_models:
            return order
        kept, pruned = memory_prune(order, self.out.memory_models, self.objective.memory_mb)
        for p in pruned:
            self.drop(p.spec, "pruned", p.reason)
        self.out.pruned.extend(pruned)
        return kept

    def cut(self, stage: int, measured: list[Candidate], keep: Callable[[int], int]) -> list[Candidate]:
        """After a stage: drop sure misses, keep the best ``keep(n)`` of the rest."""
        evals = [self.out.evaluations[c.spec] for c in measured if not self.out.states[c.spec].dropped_at]
        alive = []
        for e in evals:
            if e.sure_misses:
                self.drop(e.spec, f"stage {stage}", "misses the objective: " + "; ".join(e.sure_misses))
            else:
                alive.append(e)
        # The decision's order: the chosen, then those equivalent to the leader by the tie rule
        # (less memory, fewer processes), then the rest by rank: a cut keeps what a tie would choose.
        decision = decide(alive) if alive else None
        ranked = list(decision.order) if decision else []
        n = keep(len(ranked))
        leader = decision.leader if decision else None
        if n and leader is not None and leader not in ranked[:n]:
            # The fastest goes on too: more cells may separate it from the cheaper ones it is tied with.
            ranked.remove(leader)
            ranked.insert(n - 1, leader)
        for i, e in enumerate(ranked[n:], start=n + 1):
            last = ranked[n - 1]
            if e in decision.tied:
                why = (f"equivalent on throughput to {decision.head.spec} (paired rounds), and the tie rule puts "
                       f"less memory and fewer processes first: {_figures(e)}, {_mb(e)}; {n} went on (the "
                       f"cheapest equivalent ones and the fastest; #{n - 1}: {ranked[max(0, n - 2)].spec}, "
                       f"{_mb(ranked[max(0, n - 2)])})")
            else:
                why = (f"rank {i} of {len(ranked)}: {_figures(e)}; the top {n} went on (#{n}: {last.spec}, "
                       f"{_figures(last)})")
            self.drop(e.spec, f"stage {stage}", why)
        return [e.candidate for e in ranked[:n]]

    def plan_repeated(self, n: int, repeats: int, share: float, scenarios: int, now: float
                      ) -> tuple[int, int, int]:
        """(candidates, repeats, cell seconds) that fit ``share`` of the time left: the longest
        cells that fit, else fewer repeats, else fewer candidates; (0, 0, 0) when nothing fits."""
        s = self.settings
        time_for = share * self.left_s(now)
        while n >= 1:
            for r in range(repeats, 0, -1):
                per_block = time_for / (n * r)
                d = int(min(s.max_duration_s, (per_block - self.overhead_s) / scenarios - s.warmup_s))
                if d >= s.min_duration_s:
                    return n, r, d
            n -= 1
        return 0, 0, 0

    def narrow(self, survivors: list[Candidate]) -> list[Candidate]:
        s = self.settings
        stall = bool(self.out.stall_clients)
        n_sc = 2 if stall else 1
        now = self.clock.now()
        share = s.narrow_share if len(survivors) > 1 else 1.0
        n, repeats, duration = self.plan_repeated(len(survivors), s.narrow_repeats, share, n_sc, now)
        for c in survivors[n:]:
            self.drop(c.spec, "stage 1", f"no time for it in stage 2 (the budget fits {n} candidates)")
        picked = survivors[:n]
        if not picked:
            return self.finish_early(survivors, "budget: no time left for stage 2")
        record = StageRecord(2, tuple(c.spec for c in picked), repeats, duration, self.scenarios(stall),
                             round(n * repeats * self.cost(n_sc, duration), 1))
        start, done = now, 0
        for r in range(repeats):
            round_cost = len(picked) * self.cost(n_sc, duration)
            if now + round_cost > s.budget_s - s.reserve_s:
                record = _with(record, note=f"the budget ran out after {r} of {repeats} rounds")
                break
            for c in picked:
                block = self.run_block(2, c, duration, stall, now)
                done += 1
                now = self.clock.now()
                left = len(picked) * repeats - done
                self.report(2, done, len(picked) * repeats, block, left * self.cost(n_sc, duration))
        self.out.stages.append(_with(record, seconds=round(now - start, 1)))
        return picked

    def settled(self, finalists: list[Candidate]) -> str:
        """Why no more measuring is needed ("" to go on)."""
        evals = [self.out.evaluations[c.spec] for c in finalists]
        meets = [e for e in evals if e.meets]
        if not meets:
            if any(e.borderline for e in evals):
                return ""
            return "no finalist meets the objective, and none is within noise of it"
        if len(evals) == 1:
            return f"{evals[0].spec} is the only candidate left"
        decision = decide(meets)
        leader = decision.head
        others = [e for e in evals if e is not leader and (e.meets or e.borderline)]
        if not others:
            return f"only {leader.spec} meets the objective"
        if leader.borderline:
            return ""
        # A finalist another one beat beyond noise can no longer be chosen: nothing to measure for it.
        comparisons = [rps_comparison(e, leader) for e in others if e.spec not in decision.beaten]
        if all(c.outcome == "worse" for c in comparisons):
            return f"decided: {leader.spec} is ahead of every other finalist beyond noise"
        band = self.settings.tie_band
        if all(c.outcome in ("worse", "equivalent") for c in comparisons):
            return (f"the leaders cannot be told apart: every throughput ratio to {leader.spec} not beaten beyond "
                    f"noise lies within ±{band:.0%}")
        return ""

    def final(self, narrowed: list[Candidate]) -> None:
        s = self.settings
        if not narrowed:
            return self.finish([], self.out.stop or "nothing left to measure")
        finalists = self.cut(2, narrowed, lambda n: min(n, s.finalists)) if len(self.out.stages) >= 2 else narrowed
        if not finalists:
            return self.finish(narrowed, "no candidate left after stage 2")
        why = self.settled(finalists)
        if why:
            return self.finish(finalists, why)
        stall = bool(self.out.stall_clients)
        n_sc = 2 if stall else 1
        duration = self.out.stages[-1].duration_s
        now = self.clock.now()
        start = now
        while self.cost(n_sc, duration) * len(finalists) > self.left_s(now) and duration > s.min_duration_s:
            duration -= 1
        rounds_fit = int(self.left_s(now) // (self.cost(n_sc, duration) * len(finalists)))
        planned = min(s.max_rounds, rounds_fit)
        record = StageRecord(3, tuple(c.spec for c in finalists), planned, duration, self.scenarios(stall),
                             round(planned * len(finalists) * self.cost(n_sc, duration), 1))
        rounds = 0
        while rounds < s.max_rounds:
            if now + len(finalists) * self.cost(n_sc, duration) > s.budget_s - s.reserve_s:
                why = "the budget ran out" if rounds else "budget: no time left for stage 3"
                break
            for c in finalists:
                block = self.run_block(3, c, duration, stall, now)
                now = self.clock.now()
                self.report(3, rounds * len(finalists) + finalists.index(c) + 1, planned * len(finalists), block,
                            (len(finalists) - finalists.index(c) - 1) * self.cost(n_sc, duration))
            rounds += 1
            why = self.settled(finalists)
            if why:
                break
        else:
            why = f"{s.max_rounds} rounds measured (the most stage 3 runs)"
        self.out.stages.append(_with(record, repeats=rounds, seconds=round(now - start, 1)))
        self.finish(finalists, why)

    def finish_early(self, candidates: list[Candidate], why: str) -> list[Candidate]:
        self.out.stop = why
        self.finish(candidates, why)
        return []

    def finish(self, finalists: list[Candidate], why: str) -> None:
        if self.out.decision is not None:
            return
        self.out.stop = why
        evals = [self.out.evaluations[c.spec] for c in finalists if c.spec in self.out.evaluations]
        if not evals:  # nothing left to choose from: name the closest of all that was measured
            ranked = by_rank(list(self.out.evaluations.values()))
            self.out.decision = Decision(None, ranked[0] if ranked else None, (), None, None, why, ())
            return
        decision = decide(evals)
        self.out.decision = decision
        for e in decision.order:
            if decision.chosen is not None and e is decision.chosen:
                continue
            if not self.out.states[e.spec].dropped_at:
                loser_why = (decision.why if e is decision.runner_up else
                             _lost(e, decision)) if decision.chosen else "misses the objective: " + "; ".join(e.misses)
                self.drop(e.spec, "final", loser_why)


def _lost(e: Evaluation, decision: Decision) -> str:
    return why_lost(e, decision)


def _figures(e: Evaluation) -> str:
    return f"{e.rps.value:.1f} req/s, p99 {e.p99.value:.0f} ms" + ("" if e.meets else " (misses)")


def _mb(e: Evaluation) -> str:
    return "memory n/a" if e.memory_mb is None else f"{e.memory_mb:.1f} MB"


def _with(record: StageRecord, **changes) -> StageRecord:
    return StageRecord(**{**asdict(record), **changes})


def run_search(inputs: Inputs, measure: Measure, clock: Clock, progress: Callable[[Event], None] | None = None,
               on_block: Callable[[Outcome], None] | None = None) -> Outcome:
    """Run the stages on ``measure``; the outcome (with ``interrupted`` set when the measure
    stopped early)."""
    search = Search(inputs, measure, clock, progress, on_block)
    try:
        search.run()
    except Stopped:
        search.out.interrupted = True
        search.out.stop = f"interrupted after {len(search.out.blocks)} blocks"
    return search.out
