"""Measuring until decided (``--budget``): after the planned rounds, rounds of the layouts in key
comparisons that are not settled, then rounds for the verdict's tails, within the budget and a
fixed maximum of rounds; a replay replays the stored run's rounds as they ran."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from uwsgi_layouts.bench.analysis import tail_seconds
from uwsgi_layouts.bench.decisions import key_comparisons, next_blocks, tail_blocks
from uwsgi_layouts.bench.kinds.closedloop.plan import (
    Plan,
    block_time,
    extension_duration,
    round_order,
    round_seconds,
    units,
)
from uwsgi_layouts.bench.paired import FINAL_SHARE

MAX_ROUNDS = 16  # the most rounds a comparison may reach by measuring until decided
# The rounds the claim keeps (when the budget holds them) before the verdict's tails get a share of
# the budget: about what make compare's budget gives it on 2 cores, where the claim was decided.
CLAIM_ROUNDS = 8
RESERVE_S = 10.0  # of a budget, kept for writing the results and reports
# Why the claim's rounds stopped before their maximum: the rest of the budget holds the verdict's tails.
TAILS_KEPT = "the rest of the budget kept for the verdict's tails"


@dataclass
class Until:
    """Measuring until decided (``--budget``): after the planned rounds, more interleaved rounds
    of the layouts in key comparisons (``decisions.key_comparisons``) that are not settled, until
    each is, or the budget or the fixed maximum of rounds ends, or, past CLAIM_ROUNDS, what is left
    of the budget is kept for the verdict's tails (``TAILS_KEPT``). ``budget_s`` None: a replay, which
    takes the stored run's rounds (``stored_rounds``) and its fixed maximum (``max_rounds``)."""

    budget_s: float | None
    clock: Callable[[], float]  # seconds since the run started
    reserve_s: float = RESERVE_S
    max_rounds: int = 0  # replay: the stored run's
    stored_rounds: frozenset[int] = frozenset()
    final_share: float = FINAL_SHARE  # of the error, kept for the final look (replay: the stored run's)
    # replay: the stored run's rounds for the verdict's tails (``until_decided.tails``), replayed as they
    # ran, and its cells as (layout, level, round): a round the logic asks for that was not stored ends it
    stored_tails: tuple[dict, ...] = ()
    stored_tails_stop: str = ""  # replay: why the stored run's tails rounds stopped
    stored_cells: frozenset[tuple[str, int, int]] = frozenset()

    def left_s(self) -> float:
        return (self.budget_s or 0.0) - self.reserve_s - self.clock()


def fixed_block_cost(seconds: list[float], plan: Plan) -> float:
    """A block's fixed cost (stack start and stop, reads): the median of the planned blocks' wall
    times beyond their warm-ups and cells."""
    fixed = sorted(max(0.5, s) for s in seconds)
    return fixed[len(fixed) // 2] if fixed else 2.5


def measure_until_decided(plan: Plan, until: Until, snapshot, block, overhead_s: float, more: dict) -> None:
    """Add rounds after the planned ones; what the arguments record about them goes into ``more``
    at once (a partial save holds it too): ``max_rounds`` and ``until_decided``.

    The claim at a level is judged at the look that settled it, or at the last look of the rounds
    added until decided (``until_decided.judged_through``: level -> round, which ``bench.verdict``
    reads): the rounds measured after it for the verdict's tails (``_tail_rounds``) are no look
    of the claim's, so they neither change a recorded decision nor spend its error."""
    keys = key_comparisons(snapshot(False))
    if until.budget_s is None:
        max_rounds = until.max_rounds or plan.repeats
    else:
        # The stopping rule's fixed maximum, set at the first look (the planned rounds), before the
        # first added round: what the budget holds for the key comparisons still undecided then
        # (or, when all are settled, for the thin tails the rest of the budget goes to). The looks
        # it allows share the error. Sizing it as if every key comparison needed more rounds left
        # a third of the budget unused while the undecided ones stopped at 4 rounds.
        sizing = next_blocks(keys)
        per_round = round_seconds(sizing, plan, overhead_s)
        left = until.left_s()
        fit = int(left // per_round) if per_round > 0 else 0
        max_rounds = max(plan.repeats, min(MAX_ROUNDS, plan.repeats + fit))
        # Where the budget can hold the claim's rounds (at least CLAIM_ROUNDS of them) and the
        # verdict's tails after them, the maximum leaves the tails their time (the most rounds that
        # still do); where it cannot (at times with a 5-min budget on 2 cores: the tails alone need
        # about 160 s), the claim gets it all: the answer before its tails. Past CLAIM_ROUNDS the loop
        # below checks again, round by round (TAILS_KEPT).
        for r in range(max_rounds, min(max_rounds, CLAIM_ROUNDS) - 1, -1):
            if (r - plan.repeats) * per_round + tails_reserve_s(keys, plan, overhead_s, r - plan.repeats) <= left:
                max_rounds = r
                break
    state: dict = {"rounds": [], "settled_at": {}, "judged_through": {}, "tails": [], "stop": ""}
    # The error's split over the looks is fixed here too, before the first added round: the final
    # look keeps FINAL_SHARE of it (bench.paired.Rule), the interim ones share the rest.
    more.update({"max_rounds": max_rounds, "until_decided": state, "extension_duration": extension_duration(plan),
                 "final_share": until.final_share})
    rounds = plan.repeats
    tails_done = False
    tails_rounds = {t["round"] for t in until.stored_tails}
    # The first look (the planned rounds) is judged with the same rule as every later one.
    keys = key_comparisons(snapshot(False))
    while True:
        for k in keys:
            if k.settled and k.name not in state["settled_at"]:
                state["settled_at"][k.name] = k.rounds
                if k.kind == "verdict":  # decided at this look: judged on the rounds measured so far
                    state["judged_through"][str(k.level)] = rounds
        verdict = [k for k in keys if k.kind == "verdict"]
        if verdict and not tails_done and all(k.settled for k in verdict):
            # Every level's claim decided: its tails before any other comparison's rounds.
            rounds = _tail_rounds(plan, until, snapshot, block, overhead_s, state, rounds)
            tails_done = True
            keys = key_comparisons(snapshot(False))
        blocks = next_blocks(keys)  # the verdict's undecided levels first, then the other key comparisons
        if not blocks:
            why = "every key comparison settled"
            break
        if rounds >= max_rounds:
            why = (f"the fixed maximum of {max_rounds} rounds" if max_rounds > plan.repeats or until.budget_s is None
                   else "the budget ended with the planned rounds")
            break
        if until.budget_s is None:
            if rounds + 1 not in until.stored_rounds or rounds + 1 in tails_rounds or \
                    not _stored(blocks, rounds + 1, until.stored_cells):
                why = "the stored run measured no more rounds"
                break
        elif round_seconds(blocks, plan, overhead_s) > until.left_s():
            why = "the budget ended"
            break
        elif rounds >= CLAIM_ROUNDS and not tails_done and \
                round_seconds(blocks, plan, overhead_s) + tails_reserve_s(keys, plan, overhead_s, 1) > until.left_s():
            # Past CLAIM_ROUNDS the claim's rounds go on only while the tails still fit after them. The
            # maximum was set at the first look, counting on every undecided level pooling more: a level
            # decided since pools nothing more, and one run spent its last round on 2P while P's cells
            # stayed at 377 requests, then had too little left for the ~36 s more each of them needed.
            why = TAILS_KEPT
            break
        rounds += 1
        for _, specs in units(plan, [(rounds, x) for x in round_order(plan.layouts, rounds) if x in blocks]):
            scenarios = [sc for sc in plan.scenarios if any(sc in blocks[x] for x in specs)]
            levels = sorted({lv for x in specs for sc in scenarios for lv in blocks[x].get(sc, [])})
            block(specs, rounds, levels, scenarios, added=True)
        state["rounds"].append({"round": rounds, "layouts": blocks})
        keys = key_comparisons(snapshot(False))
    state["stop"] = why
    # The final look keeps the final share of the error only where the budget or the maximum, not
    # the data, ended the run: stopping because the key comparisons settled is a look the data
    # chose, and every comparison then keeps the interim level it settled at.
    more["final_round"] = 0 if why == "every key comparison settled" else rounds
    # A level still undecided is judged at this, the last look; what is left of the budget goes to
    # the verdict's tails (the maximum of rounds, not the budget, may have ended the looks).
    for k in keys:
        if k.kind == "verdict":
            state["judged_through"].setdefault(str(k.level), rounds)
    if not tails_done and any(k.kind == "verdict" for k in keys):  # a run without a verdict has no tails to pool
        _tail_rounds(plan, until, snapshot, block, overhead_s, state, rounds)


def _stored(blocks: dict[str, dict[str, list[int]]], round_: int, cells: frozenset) -> bool:
    """Every cell of ``blocks`` was stored for ``round_`` (an empty ``cells``: not checked)."""
    return not cells or all((x, lv, round_) in cells for x, scs in blocks.items() for lvs in scs.values()
                            for lv in lvs)


MAX_TAIL_ROUNDS = 3  # a rate that fell short of its estimate gets another go, at most this many in all
# Why the rounds for the tails stopped with none left to ask for (``_tails_done``): ``tail_blocks``
# asks for more while a verdict cell's pooled p99 is not quotable, ties at it included.
TAILS_QUOTABLE = "every verdict cell's p99 quotable"
TAILS_UNPOOLED = "a verdict cell's latencies cannot be pooled (a cell without a histogram): more rounds would not help"
TAILS_NO_RATE = "a verdict cell served nothing to size its rounds by"


def tail_round_seconds(seconds: dict[str, dict[str, dict[int, float]]], plan: Plan, overhead_s: float) -> float:
    """What one round for the tails (layout -> scenario -> level -> seconds of its cell) takes, as
    ``_tail_round`` runs it."""
    return sum(block_time(overhead_s, plan.warmup, durations[x].values(), len(scenarios))
               for specs, levels, scenarios, durations in _tail_blocks(plan, 0, seconds) for x in specs)


def tails_reserve_s(keys, plan: Plan, overhead_s: float, added: int) -> float:
    """The seconds the rounds for the verdict's tails would still take after ``added`` more rounds
    of its undecided levels (each pooling a cell's duration at its observed rate); 0 when none
    would be thin or more rounds cannot pool it (no histograms). A cell that served nothing has no
    rate to size it by and gets no round (``decisions.tail_blocks``): it reserves nothing."""
    need: dict[str, dict[str, dict[int, float]]] = {}
    for k in keys:
        if k.kind != "verdict":
            continue
        for g in k.groups:
            more = 0 if k.settled else added * g.rps.median * plan.cell_seconds(g.layout, k.level)
            seconds = tail_seconds(g, more)
            if 0 < seconds < math.inf:
                need.setdefault(g.layout, {}).setdefault(k.scenario, {})[k.level] = max(plan.duration,
                                                                                        float(math.ceil(seconds)))
    return tail_round_seconds(need, plan, overhead_s) if need else 0.0


def _tail_rounds(plan: Plan, until: Until, snapshot, block, overhead_s: float, state: dict, rounds: int) -> int:
    """Rounds for the verdict's tails, once no verdict level is undecided: every cell whose pooled
    p99 cannot be quoted runs for the seconds its observed rate says it needs (``tail_seconds``),
    the levels that fit the budget left, cheapest first (a level that does not fit whole is not
    started: its tails would stay unquotable and the run would only end later). Returns the last
    round. A replay replays the stored rounds as they ran."""
    if until.budget_s is None:
        for record in until.stored_tails:
            if record["round"] != rounds + 1:
                break
            rounds += 1
            _tail_round(plan, block, rounds, {x: {sc: {int(lv): float(d) for lv, d in levels.items()}
                                                  for sc, levels in scs.items()}
                                              for x, scs in record["seconds"].items()})
            state["tails"].append(record)
        else:
            if until.stored_tails_stop:
                state["tails_stop"] = until.stored_tails_stop
        return rounds
    for _ in range(MAX_TAIL_ROUNDS):
        keys = key_comparisons(snapshot(False))
        need = tail_blocks(keys)
        if not need:
            state["tails_stop"] = _tails_done(keys)
            break
        seconds = _fitting_levels(need, plan, overhead_s, until.left_s())
        if not seconds:
            state["tails_stop"] = "the budget ended"
            break
        rounds += 1
        _tail_round(plan, block, rounds, seconds)
        state["tails"].append({"round": rounds, "seconds": {x: {sc: {str(lv): d for lv, d in lvs.items()}
                                                               for sc, lvs in scs.items()}
                                                           for x, scs in seconds.items()}})
    else:  # the last round may have pooled enough: say which ended them
        keys = key_comparisons(snapshot(False))
        state["tails_stop"] = _tails_done(keys) if not tail_blocks(keys) else f"{MAX_TAIL_ROUNDS} rounds for the tails"
    return rounds


def _tails_done(keys) -> str:
    """Why no verdict cell asks for another round for its tails."""
    groups = [g for k in keys if k.kind == "verdict" for g in k.groups]
    if all(g.p99_quotable for g in groups):
        return TAILS_QUOTABLE
    return TAILS_UNPOOLED if any(not g.tails.pooled for g in groups if not g.p99_quotable) else TAILS_NO_RATE


def _fitting_levels(need: dict[str, dict[str, dict[int, float]]], plan: Plan, overhead_s: float,
                    left_s: float) -> dict[str, dict[str, dict[int, float]]]:
    """Of the tails' needs (layout -> scenario -> level -> seconds), the levels whose cells fit in
    ``left_s`` together, cheapest level first; each cell at least the plan's duration, whole seconds."""
    by_level: dict[tuple[str, int], dict[str, float]] = {}
    for x, scs in need.items():
        for sc, levels in scs.items():
            for lv, d in levels.items():
                by_level.setdefault((sc, lv), {})[x] = max(plan.duration, float(math.ceil(d)))
    chosen: dict[str, dict[str, dict[int, float]]] = {}
    for (sc, lv), cells in sorted(by_level.items(), key=lambda kv: sum(kv[1].values())):
        trial = {x: {s: dict(levels) for s, levels in scs.items()} for x, scs in chosen.items()}
        for x, d in cells.items():
            trial.setdefault(x, {}).setdefault(sc, {})[lv] = d
        if tail_round_seconds(trial, plan, overhead_s) <= left_s:
            chosen = trial
    return chosen


def _tail_round(plan: Plan, block, rounds: int, seconds: dict[str, dict[str, dict[int, float]]]) -> None:
    """One round for the tails."""
    for specs, levels, scenarios, durations in _tail_blocks(plan, rounds, seconds):
        block(specs, rounds, levels, scenarios, added=True, cell_seconds=durations)


def _tail_blocks(plan: Plan, rounds: int, seconds: dict[str, dict[str, dict[int, float]]]) -> list[tuple]:
    """The blocks of a round for the tails, (specs, levels, scenarios, layout -> level -> seconds):
    the verdict's pair as one paired block where both need time (one that needs none at a level
    of the block runs the plan's duration there), else the one layout alone."""
    out = []
    for _, specs in units(plan, [(rounds, x) for x in round_order(plan.layouts, rounds) if x in seconds]):
        scenarios = [sc for sc in plan.scenarios if any(sc in seconds[x] for x in specs)]
        levels = sorted({lv for x in specs for sc in scenarios for lv in seconds[x].get(sc, {})})
        durations = {x: {lv: max(seconds[x].get(sc, {}).get(lv, plan.duration) for sc in scenarios)
                         for lv in levels} for x in specs}
        out.append((specs, levels, scenarios, durations))
    return out
