"""The sweep: every block of the plan in interleaved order, a partial save after each, then (with
``Until``) measuring until decided; the progress line it prints."""

from __future__ import annotations

import sys
import time
from typing import Callable

from uwsgi_layouts.bench.kinds.closedloop.plan import Plan, block_time, units
from uwsgi_layouts.bench.kinds.closedloop.runners import Runner
from uwsgi_layouts.bench.kinds.closedloop.until import Until, fixed_block_cost, measure_until_decided
from uwsgi_layouts.bench.results import Cell, Results, utc_now


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
        overhead = fixed_block_cost(seconds, plan) if until.budget_s is not None else 0.0
        measure_until_decided(plan, until, snapshot, block, overhead, more)
    results = snapshot(complete=True)
    if save:
        save(results)
    return results
