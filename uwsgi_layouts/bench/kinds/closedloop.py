"""Closed-loop cells: the sweep and the runners that measure or replay its cells.

The sweep decides which layouts, which levels, in which order: repeats are interleaved (A B C, A
B C, ...) so that drift of a noisy machine hits every layout alike, with a progress line (ETA)
and a partial save after every block. Repeat r of every layout runs in round r, and each cell
records it (``Cell.round``): the pairs every comparison is made of (``bench.paired``). A runner
does the measuring: ``LiveRunner`` for real, ``ReplayRunner`` to rerun this logic on stored
cells without timing anything. ``compare`` runs a sweep; ``tune`` will run its own plans through
the same runners.

``LiveRunner.run_block`` starts one layout's stack once (``bench.stack.Lab``), warms it up,
loads it at each level (``bench.load.wrk``) and stops it. The app server is uWSGI or a peer
(gunicorn, granian): every cell is measured the same way, except where only uWSGI can say. Per
cell: wrk's figures, the per-worker request counts (uWSGI: its stats server, delta over the
cell; a peer has none: the answers wrk counted per ``X-Worker-Pid`` header, mapped to worker
numbers with ``Stack.worker_pids``; absent for an app without the header), and the CPU seconds
of the app server's tree (``cpu_s["app"]``), the nginx tree and wrk (``bench.observe``), the
requests in flight per worker sampled from the stats server while the load runs (``inflight``,
``--inflight-hz`` times a second; not for peers), wrk's latency histogram of the measured
requests (``histogram``), the answers per status class (``status``: report.lua's count) and,
right after the load, the memory of the app server's tree (PSS, USS, RSS; PSS per worker) and
of nginx (``memory``). A scenario with the user's requests
(``Scenario.mix``) sends them through a generated wrk script (``bench.load.traffic``), seeded with
the repeat number. File scenarios also record, in
``extra``, the bytes the data set's block device read during the cell, the page-cache
residency before and after (cold-cache cells are evicted first), the hot file's latencies,
and for ``nginx_spread`` scenarios the connections and CPU of each nginx worker. From wrk's
figures and the CPU come two bounds on throughput and the efficiency = throughput / the
smaller bound:
  * capacity: cores / CPU-seconds per request (all three share the machine's cores);
  * closed loop: connections / the latency of one request alone (wrk -c1 while warming up).
"""

from __future__ import annotations

import math
import resource
import sys
import time
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable, Protocol

from uwsgi_layouts.bench import dataset as ds
from uwsgi_layouts.bench.analysis import tail_seconds
from uwsgi_layouts.bench.decisions import key_comparisons, next_blocks, tail_blocks
from uwsgi_layouts.bench.load.files import RANDOM_FILES_LUA, request_paths, weighted_paths, write_lines
from uwsgi_layouts.bench.load.scenarios import Scenario
from uwsgi_layouts.bench.load.traffic import Mix, write_mix_script
from uwsgi_layouts.bench.load.wrk import WrkProcess, fraction_script, run_wrks
from uwsgi_layouts.bench.observe import (
    Sampler,
    Snapshot,
    busiest_connections,
    cpu_seconds,
    inflight_summary,
    limit_record,
    nginx_workers,
    requests_by_worker,
    spread_extra,
    stack_memory,
)
from uwsgi_layouts.bench.paired import FINAL_SHARE
from uwsgi_layouts.bench.results import Cell, Results, utc_now
from uwsgi_layouts.bench.stack import Lab, dir_name
from uwsgi_layouts.deploy.machine import usable_cpus
from uwsgi_layouts.deploy.model import Layout, total_limits


@dataclass(frozen=True)
class Plan:
    layouts: tuple[str, ...]
    concurrency: tuple[int, ...]
    repeats: int
    duration: float
    warmup: float
    processes: int
    threads: int
    scenarios: tuple[str, ...]
    workload: dict  # scenario name -> its resolved mix (query strings, stall settings)
    timeout: float = 10.0
    inflight_hz: float = 25.0  # stats-server samples per second during each cell; 0 = off
    command: str = ""
    options: dict = field(default_factory=dict)
    hosts: int = 0  # app hosts, each in its own network namespace (0 = this machine alone)
    # Which app was measured (bench.subject.Subject.record): app, app_dir, virtualenv, demo.
    app: dict = field(default_factory=dict)
    margin: float = 0.05  # equivalence margin of every comparison (bench.paired)
    budget_min: float | None = None  # measure until decided within this many minutes (None: the planned rounds)
    # The cells the verdict quotes ((layout, level): PxT-mapped and PxT-shared at P and 2P) run
    # key_duration seconds, the others duration: the budget goes where the verdict needs tails it
    # can quote (10 requests above the pooled p99), the context layouts get shorter cells.
    key_duration: float | None = None
    key_cells: tuple[tuple[str, int], ...] = ()

    @property
    def blocks(self) -> list[tuple[int, str]]:
        """(repeat, layout) in run order: every layout once per repeat, interleaved, in the plan's
        order in odd rounds and reversed in even ones (A B C, C B A, ...: a machine that drifts
        steadily slows the first layout in one round and the last in the next, so its drift
        cancels in the paired ratios instead of favouring whichever always runs first)."""
        return [(r, layout) for r in range(1, self.repeats + 1) for layout in round_order(self.layouts, r)]

    @property
    def pair(self) -> tuple[str, ...]:
        """The verdict's two layouts (those of ``key_cells``, in the plan's order), which run as one
        paired block (``Runner.run_pair``); () without key cells."""
        keyed = {x for x, _ in self.key_cells}
        pair = tuple(x for x in self.layouts if x in keyed)
        return pair if len(pair) == 2 else ()

    @property
    def cell_count(self) -> int:
        return len(self.blocks) * len(self.concurrency) * len(self.scenarios)

    def estimate_seconds(self, per_block_overhead: float = 2.5) -> float:
        return sum(block_time(per_block_overhead, self.warmup, self.durations(spec, self.concurrency).values(),
                              len(self.scenarios)) for _, spec in self.blocks)

    def cell_seconds(self, spec: str, level: int, added: bool = False) -> float:
        """How long a cell of ``spec`` at ``level`` runs: a key cell ``key_duration`` in every
        round (its rounds stay alike: the verdict's noise comes from round to round, not from
        within a cell, so rounds, not longer cells, narrow its interval); another cell of a round
        added until decided ``EXTENSION_FACTOR`` times the planned duration."""
        if self.key_duration and (spec, level) in self.key_cells:
            return self.key_duration
        return self.duration * EXTENSION_FACTOR if added else self.duration

    def durations(self, spec: str, levels, added: bool = False) -> dict[int, float]:
        """Level -> seconds, for one block of ``spec``."""
        return {lv: self.cell_seconds(spec, lv, added) for lv in levels}

    def arguments(self) -> dict:
        data = asdict(self)
        data.pop("workload")
        for key in ("layouts", "concurrency", "scenarios"):
            data[key] = list(data[key])
        data["key_cells"] = [list(x) for x in self.key_cells]
        data["scenario"] = self.scenarios[0]
        return data


def round_order(layouts, repeat: int) -> list:
    """``layouts`` in round ``repeat``'s order: as given in odd rounds, reversed in even ones."""
    return list(layouts) if repeat % 2 else list(reversed(layouts))


def block_seconds(overhead_s: float, warmup_s: float, duration_s: float, scenarios: int, levels: int) -> float:
    """What one block takes: stack start and stop, a warm-up per scenario, a cell per scenario and level."""
    return block_time(overhead_s, warmup_s, [duration_s] * levels, scenarios)


def block_time(overhead_s: float, warmup_s: float, durations, scenarios: int) -> float:
    """What one block takes whose levels run ``durations`` seconds each (per scenario)."""
    return overhead_s + scenarios * (warmup_s + sum(d + 0.3 for d in durations))


def default_levels(processes: int, threads: int) -> tuple[int, ...]:
    """P and 2P (where the article's effect shows), doubling up to P*T, and P*T itself."""
    levels, c = set(), processes
    while c <= processes * threads:
        levels.add(c)
        c *= 2
    levels.add(processes * threads)
    return tuple(sorted(levels))


def default_layouts(processes: int, threads: int) -> tuple[str, ...]:
    """The article's uWSGI layouts, and the peer a team would pick instead (gunicorn, gthread) at
    its best on the article's mix: without nginx's upstream keep-alive (docs/alternatives.md:
    behind kept connections one gthread worker holds them all, 21 against 38 req/s at 8
    connections), so that the default never compares uWSGI with a crippled peer."""
    p, t = processes, threads
    wanted = [f"1x{t}-shared", f"{p}x1-shared", f"{p}x{t}-shared", f"{p}x{t}-thunder", f"{p}x{t}-mapped",
              f"{p}x{t}-gunicorn@keepalive=off"]
    return tuple(dict.fromkeys(wanted))  # P=1 or T=1 would repeat a layout


def host_shares(before: Snapshot, after: Snapshot) -> dict:
    """With several app hosts: each host's share of the requests served during the cell
    (``host1_share``... in the order of the layout's hosts) and the busiest host's share."""
    served = [max(0, after.hosts[h] - before.hosts.get(h, 0)) for h in after.hosts]
    total = sum(served)
    if not total:
        return {}
    return {"hosts": len(served), "host_share_max": max(served) / total,
            **{f"host{i}_share": n / total for i, n in enumerate(served, 1)}}


class Runner(Protocol):
    def run_block(self, spec: str, repeat: int, levels: list[int], scenarios: list[str],
                  on_cell: Callable[[Cell], None] | None = None,
                  durations: dict[int, float] | None = None) -> list[Cell]: ...

    def run_pair(self, specs: tuple[str, str], repeat: int, levels: list[int], scenarios: list[str],
                 on_cell: Callable[[Cell], None] | None = None,
                 durations: dict[str, dict[int, float]] | None = None) -> list[Cell]:
        """Both layouts' stacks up at once, each level measured on one then the other (``specs``'
        order), back to back: the two cells of a pair lie seconds apart instead of a block apart."""
        ...


class ReplayRunner:
    """Serves stored cells in place of measuring: the sweep, results and report logic run
    exactly as live, in milliseconds. Missing cells are an error, not invented."""

    def __init__(self, stored: Results):
        self.cells = {(c.scenario, *c.key): c for c in stored.cells}

    def run_block(self, spec, repeat, levels, scenarios, on_cell=None, durations=None):
        out = []  # a stored cell keeps the duration it was measured with
        for scenario in scenarios:
            for level in levels:
                try:
                    cell = self.cells[(scenario, spec, level, repeat)]
                except KeyError:
                    raise ReplayError(f"replay: no stored {scenario} cell for {spec} at {level} connections, "
                                      f"repeat {repeat}") from None
                out.append(cell)
                if on_cell:
                    on_cell(cell)
        return out

    def run_pair(self, specs, repeat, levels, scenarios, on_cell=None, durations=None):
        """The stored cells in a paired block's order: per scenario and level, one layout then the other."""
        return [c for sc in scenarios for level in levels for spec in specs
                for c in self.run_block(spec, repeat, [level], [sc], on_cell)]


class ReplayError(KeyError):
    def __str__(self) -> str:
        return str(self.args[0])


class Progress:
    """One status line on stderr: layout, level, cells left, ETA (rewritten in place on a TTY)."""

    def __init__(self, plan: Plan, stream=None, clock=time.monotonic):
        self.plan, self.stream, self.clock = plan, stream or sys.stderr, clock
        self.done, self.start = 0, clock()
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()

    def eta_seconds(self) -> float:
        left = self.plan.cell_count - self.done
        if self.done == 0:
            return self.plan.estimate_seconds()
        return (self.clock() - self.start) / self.done * left

    def line(self, cell: Cell) -> str:
        scenario = f"{cell.scenario} " if len(self.plan.scenarios) > 1 else ""
        if self.done > self.plan.cell_count:  # a round added until decided: no plan to count down
            return (f"[round {cell.round}, until decided] {scenario}{cell.layout} c={cell.concurrency}: "
                    f"{cell.rps:.1f} req/s, p99 {cell.latency_ms.p99:.0f} ms, {cell.errors.total} errors"
                    f"{_non_2xx(cell)}")
        eta = self.eta_seconds()
        return (f"[{self.done}/{self.plan.cell_count}] {scenario}{cell.layout} c={cell.concurrency} "
                f"repeat {cell.repeat}/"
                f"{self.plan.repeats}: {cell.rps:.1f} req/s, p99 {cell.latency_ms.p99:.0f} ms, "
                f"{cell.errors.total} errors{_non_2xx(cell)} | {self.plan.cell_count - self.done} cells left, "
                f"ETA {int(eta // 60)}m{int(eta % 60):02d}s")

    def __call__(self, cell: Cell) -> None:
        self.done += 1
        text = self.line(cell)
        if self.tty:
            self.stream.write("\r\033[K" + text + ("\n" if self.done >= self.plan.cell_count else ""))
        else:
            self.stream.write(text + "\n")
        self.stream.flush()


def _non_2xx(cell: Cell) -> str:
    """``, 3xx 12 4xx 3`` when some answers were not 2xx, else ""."""
    other = [f"{k} {n}" for k, n in cell.status.items() if k != "2xx" and n]
    return ", " + " ".join(other) if other else ""


MAX_ROUNDS = 16  # the most rounds a comparison may reach by measuring until decided
# The rounds the claim keeps (when the budget holds them) before the verdict's tails get a share of
# the budget: about what make compare's budget gives it on 2 cores, where the claim was decided.
CLAIM_ROUNDS = 8
# The rounds added until decided measure cells this many times longer than the planned ones: a
# round's ratio moves by one request in N (a 3-s cell at 2 connections holds about 66 requests,
# 1.5% each), so longer cells decide a small difference in fewer rounds, and the paired interval
# weighs each round by its requests (bench.paired).
EXTENSION_FACTOR = 3
RESERVE_S = 10.0  # of a budget, kept for writing the results and reports


@dataclass
class Until:
    """Measuring until decided (``--budget``): after the planned rounds, more interleaved rounds
    of the layouts in key comparisons (``decisions.key_comparisons``) that are not settled, until
    each is, or the budget or the fixed maximum of rounds ends. ``budget_s`` None: a replay, which
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


def run_sweep(plan: Plan, runner: Runner, environment: dict, save=None, progress=None,
              kind: str = "compare", until: Until | None = None, on_block: Callable[[], None] | None = None
              ) -> Results:
    """Run every block in interleaved order; ``save(results)`` after each block keeps what was
    measured if the run is interrupted (``on_block()`` first: e.g. a sample of the machine's load).
    With ``until``, then measure until decided (``Until``)."""
    cells: list[Cell] = []
    created = utc_now()
    more: dict = {}  # what measuring until decided adds to the arguments
    seconds: list[float] = []  # each planned block's wall time

    def snapshot(complete: bool) -> Results:
        args = plan.arguments() | more | {"complete": complete}
        return Results(environment=environment, arguments=args, workload=plan.workload,
                       cells=tuple(cells), created=created, kind=kind)

    clock = until.clock if until is not None else time.monotonic  # the budget's clock times the blocks too

    def block(specs: tuple[str, ...], repeat: int, levels: list[int], scenarios: list[str],
              added: bool = False, cell_seconds: dict[str, dict[int, float]] | None = None) -> None:
        """One layout's block, or the verdict's pair as one paired block (``Runner.run_pair``);
        ``cell_seconds``: layout -> level -> the cell's duration (a round for the tails), else the plan's."""
        start = clock()
        durations = {spec: (cell_seconds or {}).get(spec) or plan.durations(spec, levels, added) for spec in specs}
        if len(specs) == 2:
            cells.extend(runner.run_pair(specs, repeat, levels, scenarios, on_cell=progress, durations=durations))
        else:
            cells.extend(runner.run_block(specs[0], repeat, levels, scenarios, on_cell=progress,
                                          durations=durations[specs[0]]))
        if not added:  # the planned blocks': what a block's fixed cost (per stack) is read from
            cost = sum(block_time(0.0, plan.warmup, d.values(), len(scenarios)) for d in durations.values())
            seconds.append((clock() - start - cost) / len(specs))
        if on_block:
            on_block()
        if save:
            save(snapshot(complete=False))

    for repeat, specs in units(plan, plan.blocks):
        block(specs, repeat, list(plan.concurrency), list(plan.scenarios))
    if until is not None:
        overhead = _overhead(seconds, plan) if until.budget_s is not None else 0.0
        _until_decided(plan, until, snapshot, block, overhead, more)
    results = snapshot(complete=True)
    if save:
        save(results)
    return results


def units(plan: Plan, blocks) -> list[tuple[int, tuple[str, ...]]]:
    """``blocks`` ((repeat, layout) in run order) as what runs: each layout alone, except the
    verdict's pair (``Plan.pair``), which runs as one paired block where its first layout stands,
    in the round's order (shared first in odd rounds, mapped first in even ones)."""
    out, done = [], set()
    for repeat, spec in blocks:
        if (repeat, spec) in done:
            continue
        if spec in plan.pair and all((repeat, x) in blocks for x in plan.pair):
            specs = tuple(x for _, x in blocks if _ == repeat and x in plan.pair)
            done.update((repeat, x) for x in specs)
            out.append((repeat, specs))
        else:
            out.append((repeat, (spec,)))
    return out


def _overhead(seconds: list[float], plan: Plan) -> float:
    """A block's fixed cost (stack start and stop, reads): the median of the planned blocks' wall
    times beyond their warm-ups and cells."""
    fixed = sorted(max(0.5, s) for s in seconds)
    return fixed[len(fixed) // 2] if fixed else 2.5


def extension_duration(plan: Plan) -> float:
    """The cell duration of the rounds added until decided (a key cell: at least its own)."""
    return plan.duration * EXTENSION_FACTOR


def round_seconds(blocks: dict[str, dict[str, list[int]]], plan: Plan, overhead_s: float) -> float:
    """What one added round of ``blocks`` (layout -> scenario -> levels) takes."""
    return sum(block_time(overhead_s, plan.warmup,
                          plan.durations(spec, sorted({lv for x in scs.values() for lv in x}), added=True).values(),
                          len(scs))
               for spec, scs in blocks.items())


def _until_decided(plan: Plan, until: Until, snapshot, block, overhead_s: float, more: dict) -> None:
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
        # still do); where it cannot (a 4.5-min budget on 2 cores: the tails alone need about
        # 250 s), the claim gets it all: the answer before its tails.
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


def tail_round_seconds(seconds: dict[str, dict[str, dict[int, float]]], plan: Plan, overhead_s: float) -> float:
    """What one round for the tails (layout -> scenario -> level -> seconds of its cell) takes, as
    ``_tail_round`` runs it."""
    return sum(block_time(overhead_s, plan.warmup, durations[x].values(), len(scenarios))
               for specs, levels, scenarios, durations in _tail_blocks(plan, 0, seconds) for x in specs)


def tails_reserve_s(keys, plan: Plan, overhead_s: float, added: int) -> float:
    """The seconds the rounds for the verdict's tails would still take after ``added`` more rounds
    of its undecided levels (each pooling a cell's duration at its observed rate); 0 when none
    would be thin, inf when a cell served nothing to measure a rate by."""
    need: dict[str, dict[str, dict[int, float]]] = {}
    for k in keys:
        if k.kind != "verdict":
            continue
        for g in k.groups:
            more = 0 if k.settled else added * g.rps.median * plan.cell_seconds(g.layout, k.level)
            seconds = tail_seconds(g, more)
            if seconds == math.inf:
                return math.inf
            if seconds > 0:
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
    """Why no verdict cell needs another round for its tails: each is quotable, or each pooled the
    requests a quotable p99 needs while ties at its p99 (many equal latencies) leave fewer than
    MIN_SLOWER_REQUESTS above it, which more of the same rounds would not change."""
    if all(g.p99_quotable for k in keys if k.kind == "verdict" for g in k.groups):
        return "every verdict cell's p99 quotable"
    return "every verdict cell pooled the requests a p99 needs (ties at some p99 leave it unquotable)"


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


class LiveRunner:
    """Runs blocks for real. ``run_block`` is the unit the sweep interleaves: one stack
    start, a warm-up, then every scenario at every level, then stop."""

    SPREAD_SAMPLE_S = 0.25  # how often per-nginx-worker connections are counted during a cell

    def __init__(self, lab: Lab, raw_dir: Path, scenarios: dict[str, Scenario],
                 duration: float, warmup: float, timeout: float, layout_options: dict | None = None,
                 inflight_hz: float = 25.0):
        self.lab, self.raw_dir = lab, raw_dir
        self.inflight_hz = inflight_hz
        self.scenarios = scenarios
        self.duration, self.warmup, self.timeout = duration, warmup, timeout
        self.layout_options = layout_options or {}
        self.cores = usable_cpus()  # a quota on this process (a pod) bounds what the three can share
        self._index: ds.Index | None = None
        self._lists: dict[str, Path] = {}
        self._mix_scripts: dict[Mix, Path] = {}

    # --- file scenarios -----------------------------------------------------------------

    @property
    def index(self) -> ds.Index:
        if self._index is None:
            root = self.layout_options.get("data_dir")
            index = ds.read_index(Path(root)) if root else None
            if index is None:
                raise ds.DatasetError("data_dir", f"no valid data set at {root!r}: run uwsgi-layouts dataset")
            self._index = index
        return self._index

    def path_list(self, scenario: Scenario) -> Path:
        """The scenario's request list (written once per run)."""
        if scenario.name not in self._lists:
            f = scenario.files
            paths = weighted_paths(self.index, f.mode, f.which, f.large_share)
            self._lists[scenario.name] = write_lines(self.lab.work_dir / "lists" / f"{scenario.name}.txt", paths)
        return self._lists[scenario.name]

    def hot_url(self, layout: Layout) -> str:
        return f"http://{layout.listen}{request_paths(self.index, 'hot')[0]}"

    def main_load(self, layout: Layout, scenario: Scenario, connections: int, duration: float, seed: int = 1,
                  timeout: float | None = None) -> WrkProcess:
        """The scenario's own load: the app's query, or random paths from its file list."""
        timeout = self.timeout if timeout is None else timeout
        if scenario.mix is not None:
            return WrkProcess(layout.url, connections, duration, timeout_s=timeout,
                              script=self.mix_script(scenario.mix), script_args=[str(seed)])
        if scenario.files is not None:
            return WrkProcess(layout.url, connections, duration, timeout_s=timeout, script=RANDOM_FILES_LUA,
                              script_args=[str(self.path_list(scenario)), str(seed)])
        return WrkProcess(f"{layout.url}?{scenario.workload.query}", connections, duration, timeout_s=timeout)

    def mix_script(self, mix: Mix) -> Path:
        """The wrk script sending the user's requests (written once per run)."""
        if mix not in self._mix_scripts:
            path = self.lab.work_dir / "traffic" / f"mix-{len(self._mix_scripts) + 1}.lua"
            self._mix_scripts[mix] = write_mix_script(path, mix)
        return self._mix_scripts[mix]

    # --- blocks and cells ---------------------------------------------------------------

    def run_block(self, spec: str, repeat: int, levels: list[int], scenarios: list[str], on_cell=None,
                  durations: dict[int, float] | None = None) -> list[Cell]:
        """``spec`` may carry options (``2x4-mapped@aio=threads``); it stays the cells' label.
        ``durations``: level -> seconds of this block's cells (a key cell, a round added until
        decided), else the planned duration."""
        planned = self.duration
        try:
            return self._run_block(spec, repeat, levels, scenarios, on_cell, durations or {}, planned)
        finally:
            self.duration = planned

    def _run_block(self, spec: str, repeat: int, levels: list[int], scenarios: list[str], on_cell,
                   durations: dict[int, float], planned: float) -> list[Cell]:
        cells = []
        with self.lab.stack(spec, name=dir_name(spec), **self.layout_options) as stack:
            layout = stack.layout
            for name in scenarios:
                scenario = self.scenarios[name]
                unloaded_ms = self._warm(layout, scenario, repeat)
                for level in levels:
                    self.duration = durations.get(level, planned)  # the cell's, and its sampler window
                    cell = self.measure(stack, layout, scenario, level, repeat, unloaded_ms, label=spec)
                    stack.check_alive()
                    cells.append(cell)
                    if on_cell:
                        on_cell(cell)
        return cells

    def run_pair(self, specs: tuple[str, str], repeat: int, levels: list[int], scenarios: list[str], on_cell=None,
                 durations: dict[str, dict[int, float]] | None = None) -> list[Cell]:
        """Both stacks started (each its own ports and run directory) and warmed up, then each
        level measured on one and at once on the other: one stack idles while the other is
        loaded. ``durations``: layout -> level -> seconds."""
        planned = self.duration
        durations = durations or {}
        try:
            with ExitStack() as running:
                stacks = [running.enter_context(self.lab.stack(spec, name=dir_name(spec), **self.layout_options))
                          for spec in specs]
                return self._measure_pair(specs, stacks, repeat, levels, scenarios, on_cell, durations, planned)
        finally:
            self.duration = planned

    def _measure_pair(self, specs, stacks, repeat, levels, scenarios, on_cell, durations, planned) -> list[Cell]:
        cells = []
        for name in scenarios:
            scenario = self.scenarios[name]
            unloaded = [self._warm(stack.layout, scenario, repeat) for stack in stacks]
            for level in levels:
                for spec, stack, probe_ms in zip(specs, stacks, unloaded, strict=True):
                    self.duration = durations.get(spec, {}).get(level, planned)
                    cell = self.measure(stack, stack.layout, scenario, level, repeat, probe_ms, label=spec)
                    stack.check_alive()
                    cells.append(cell)
                    if on_cell:
                        on_cell(cell)
        return cells

    def _warm(self, layout: Layout, scenario: Scenario, repeat: int) -> float:
        """The warm-up, which doubles as the unloaded-latency probe (one connection, nothing
        queued): its p50 in ms."""
        if scenario.files is not None and not scenario.files.cold_cache:
            ds.warm(self.index.paths())  # a warm-cache scenario measures nginx and the app, not the disk
        (probe,), _ = run_wrks(self.main_load(layout, scenario, 1, self.warmup, seed=repeat))
        self._save_raw(f"{scenario.name}-{layout.name}-warmup-r{repeat}", probe.raw)
        return probe.latency_ms.p50

    def _before_files(self, scenario: Scenario) -> dict:
        """Evict (cold cache) and note the residency and the disk's read counter."""
        state: dict = {}
        if scenario.files.cold_cache:
            state["evicted_mb"] = ds.evict(self.index.root) / 1e6
            hot = self.index.path(self.index.hot_id)
            ds.warm([hot])  # the hot file stays hot, as in the thread-pool article
            state["resident_before"] = self._resident()
        state["disk"] = ds.disk_read_bytes(self.index.files_dir)
        return state

    def _after_files(self, scenario: Scenario, state: dict) -> dict:
        extra: dict = {}
        disk = ds.disk_read_bytes(self.index.files_dir)
        if disk is not None and state["disk"] is not None:
            extra["disk_read_mb"] = max(0, disk - state["disk"]) / 1e6
        if scenario.files.cold_cache:
            extra["evicted_mb"] = state["evicted_mb"]
            after = self._resident()
            if state["resident_before"] is not None and after is not None:
                extra["resident_before"] = state["resident_before"]
                extra["resident_after"] = after
        return extra

    def _resident(self) -> float | None:
        try:
            return ds.resident_fraction(self.index.paths())
        except ds.MincoreUnavailable:
            return None

    def _sample_spread(self, stack, layout: Layout, loads: list[WrkProcess]) -> list[int]:
        """Each nginx worker's client connections while the loads run (the busiest sample)."""
        return busiest_connections(nginx_workers(stack.pids["nginx"]), layout.listen_port,
                                   running=lambda: any(w.proc.poll() is None for w in loads),
                                   deadline=time.monotonic() + max(w.limit for w in loads),
                                   interval=self.SPREAD_SAMPLE_S)

    def measure(self, stack, layout, scenario: Scenario, level: int, repeat: int, unloaded_ms: float,
                label: str = "") -> Cell:
        label = label or layout.name
        healthy_url = f"{layout.url}?{scenario.workload.query}"
        stall = scenario.stall
        files = scenario.files
        script_dir = Path(layout.run_dir)
        file_state = self._before_files(scenario) if files is not None else None
        workers = nginx_workers(stack.pids["nginx"]) if scenario.nginx_spread else []
        worker_cpu = [cpu_seconds(w) for w in workers]
        before = Snapshot.take(stack)
        rusage = resource.getrusage(resource.RUSAGE_CHILDREN)
        if stall and stall.fraction:
            script = fraction_script(script_dir, f"/?{scenario.workload.query}", f"/?{stall.query}", stall.fraction)
            loads = [WrkProcess(healthy_url, level, self.duration, timeout_s=self.timeout + stall.wait_ms / 1000,
                                script=script)]
        else:
            loads = [self.main_load(layout, scenario, level, self.duration, seed=repeat)]
        if stall and stall.clients:
            # Stalled clients in their own wrk, so their latencies don't mix with the healthy ones.
            loads.append(WrkProcess(f"{layout.url}?{stall.query}", stall.clients, self.duration,
                                    timeout_s=self.timeout + stall.wait_ms / 1000))
        if files is not None and files.hot_clients:
            # The hot-file clients in their own wrk too: their latencies are the figure of interest.
            loads.append(WrkProcess(self.hot_url(layout), files.hot_clients, self.duration, timeout_s=self.timeout))
        with self._inflight(layout, loads[0]) as inflight:
            conns = self._sample_spread(stack, layout, loads) if workers else []
            runs, wrk_cpu = run_wrks(*loads, rusage_before=rusage)
        memory = stack_memory(stack)  # right after the load, before the next cell
        after = Snapshot.take(stack)
        name = dir_name(f"{scenario.name}-{label}-c{level}-r{repeat}")
        raw_name = self._save_raw(name, "\n".join(r.raw for r in runs))
        extra = {}
        if stall and stall.clients:
            s = runs[1]
            extra = {"stall_clients": stall.clients, "stalled_requests": s.requests,
                     "stalled_p50_ms": s.latency_ms.p50, "stalled_p99_ms": s.latency_ms.p99,
                     "stalled_max_ms": s.latency_ms.max, "stalled_errors": s.errors.total}
        elif stall and stall.fraction:
            extra = {"stall_fraction": stall.fraction}
        if files is not None:
            extra.update(self._after_files(scenario, file_state))
            if files.hot_clients:
                h = runs[-1]
                extra.update({"hot_clients": files.hot_clients, "hot_requests": h.requests, "hot_rps": h.rps,
                              "hot_p50_ms": h.latency_ms.p50, "hot_p99_ms": h.latency_ms.p99,
                              "hot_errors": h.errors.total})
        if workers:
            extra.update(spread_extra(conns, [max(0.0, cpu_seconds(w) - c) for w, c in zip(workers, worker_cpu,
                                                                                           strict=True)]))
        # With replicas: every replica's cgroup summed, against every replica's quota.
        limit = limit_record(*total_limits(layout), before.limit, after.limit, after.t - before.t)
        return self.make_cell(label, level, repeat, scenario.name, runs[0], wrk_cpu, before, after,
                              unloaded_ms, raw_name, extra, inflight=inflight, histogram=runs[0].histogram,
                              status=runs[0].status, memory=memory, limit=limit)

    @contextmanager
    def _inflight(self, layout: Layout, load: WrkProcess):
        """Samples the stats server while the block runs; afterwards the yielded dict is the cell's
        ``inflight`` record over the load's own window (``bench.observe.inflight_summary``, plus
        the sampler's own CPU seconds). Empty at ``inflight_hz`` 0 or without a stats server."""
        hz = self.inflight_hz
        # Peer servers (gunicorn, granian) have no stats server (``Layout.has_stats``): nothing to sample;
        # nor across several app hosts or replicas (one stats server each: the in-flight record is per stack).
        stats = layout.stats_address if hz and getattr(layout, "has_stats", True) and \
            not getattr(layout, "hosts", ()) and getattr(layout, "replicas", 1) == 1 else None
        sampler = Sampler(stats, interval=1 / hz if hz else 1.0)
        record: dict = {}
        with sampler:
            yield record
        start = load.started - sampler.t0
        summary = inflight_summary(sampler.samples, start, start + self.duration)
        if summary:
            record.update(summary, sampler_cpu_s=round(sampler.cpu_s, 4))

    def make_cell(self, spec, level, repeat, scenario, run, wrk_cpu, before, after, unloaded_ms, raw_name,
                  extra=None, **optional) -> Cell:
        """``optional``: Cell's optional fields (``inflight``, ``histogram``, ...)."""
        cpu = {
            "app": max(0.0, after.app_cpu - before.app_cpu),
            "nginx": max(0.0, after.nginx_cpu - before.nginx_cpu),
            "wrk": wrk_cpu,
        }
        # Stalled requests cost almost no CPU; counting only healthy ones keeps the bound honest.
        per_request = sum(cpu.values()) / run.requests if run.requests else 0.0
        capacity = self.cores / per_request if per_request else 0.0
        cpus = optional.get("limit", {}).get("cpus")
        if cpus and cpu["app"] > 0 and run.requests:  # a quota of its own bounds the server alone
            capacity = min(capacity, cpus / (cpu["app"] / run.requests))
        closed_loop = level / (unloaded_ms / 1000) if unloaded_ms else 0.0
        bounds = [b for b in (capacity, closed_loop) if b > 0]
        bound = min(bounds) if bounds else 0.0
        extra = dict(extra or {})
        if before.pids or after.pids:  # no stats server: the answers wrk counted per X-Worker-Pid
            workers, unmatched = requests_by_worker(run.worker_pids, before.pids, after.pids)
            if unmatched:
                extra["worker_pid_unmatched"] = unmatched  # answers from pids that were no worker we saw
        else:
            workers = {w: max(0, after.workers.get(w, 0) - before.workers.get(w, 0)) for w in after.workers}
        extra |= host_shares(before, after)
        return Cell(
            layout=spec, concurrency=level, repeat=repeat, scenario=scenario,
            duration_s=run.duration_s, requests=run.requests, rps=run.rps,
            latency_ms=run.latency_ms, worker_requests=workers, cpu_s=cpu,
            # A worker the OOM killer ended is an error, whatever the clients saw.
            errors=replace(run.errors, oom=optional.get("limit", {}).get("oom_kills", 0)),
            unloaded_latency_ms=unloaded_ms, capacity_rps=capacity, closed_loop_rps=closed_loop,
            efficiency=run.rps / bound if bound else 0.0, raw_output=raw_name, extra=extra, round=repeat, **optional,
        )

    def _save_raw(self, name: str, text: str) -> str:
        self.raw_dir.mkdir(parents=True, exist_ok=True)
        path = self.raw_dir / f"{name}.txt"
        path.write_text(text)
        return str(Path(self.raw_dir.name) / path.name)
