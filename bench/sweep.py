"""The sweep: which layouts, which levels, in which order; progress and partial saves.

Repeats are interleaved (A B C, A B C, ...) so that drift of a noisy machine hits every
layout alike. The runner does the measuring: ``LiveRunner`` for real, ``ReplayRunner``
to rerun this logic on stored cells without timing anything.
"""

from __future__ import annotations

import datetime as dt
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Protocol

from bench.results import Cell, Results


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
    command: str = ""
    options: dict = field(default_factory=dict)

    @property
    def blocks(self) -> list[tuple[int, str]]:
        """(repeat, layout) in run order: every layout once per repeat, interleaved."""
        return [(r, layout) for r in range(1, self.repeats + 1) for layout in self.layouts]

    @property
    def cell_count(self) -> int:
        return len(self.blocks) * len(self.concurrency) * len(self.scenarios)

    def estimate_seconds(self, per_block_overhead: float = 2.5) -> float:
        per_cell = self.duration + 0.3
        warmups = len(self.blocks) * len(self.scenarios) * self.warmup
        return len(self.blocks) * per_block_overhead + warmups + self.cell_count * per_cell

    def arguments(self) -> dict:
        data = asdict(self)
        data.pop("workload")
        for key in ("layouts", "concurrency", "scenarios"):
            data[key] = list(data[key])
        data["scenario"] = self.scenarios[0]
        return data


def default_levels(processes: int, threads: int) -> tuple[int, ...]:
    """P and 2P (where the article's effect shows), doubling up to P*T, and P*T itself."""
    levels, c = set(), processes
    while c <= processes * threads:
        levels.add(c)
        c *= 2
    levels.add(processes * threads)
    return tuple(sorted(levels))


def default_layouts(processes: int, threads: int) -> tuple[str, ...]:
    p, t = processes, threads
    wanted = [f"1x{t}-shared", f"{p}x1-shared", f"{p}x{t}-shared", f"{p}x{t}-thunder", f"{p}x{t}-mapped"]
    return tuple(dict.fromkeys(wanted))  # P=1 or T=1 would repeat a layout


class Runner(Protocol):
    def run_block(self, spec: str, repeat: int, levels: list[int], scenarios: list[str],
                  on_cell: Callable[[Cell], None] | None = None) -> list[Cell]: ...


class ReplayRunner:
    """Serves stored cells in place of measuring: the sweep, results and report logic run
    exactly as live, in milliseconds. Missing cells are an error, not invented."""

    def __init__(self, stored: Results):
        self.cells = {(c.scenario, *c.key): c for c in stored.cells}

    def run_block(self, spec, repeat, levels, scenarios, on_cell=None):
        out = []
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
        eta = self.eta_seconds()
        scenario = f"{cell.scenario} " if len(self.plan.scenarios) > 1 else ""
        return (f"[{self.done}/{self.plan.cell_count}] {scenario}{cell.layout} c={cell.concurrency} "
                f"repeat {cell.repeat}/"
                f"{self.plan.repeats}: {cell.rps:.1f} req/s, p99 {cell.latency_ms.p99:.0f} ms, "
                f"{cell.errors.total} errors | {self.plan.cell_count - self.done} cells left, "
                f"ETA {int(eta // 60)}m{int(eta % 60):02d}s")

    def __call__(self, cell: Cell) -> None:
        self.done += 1
        text = self.line(cell)
        if self.tty:
            self.stream.write("\r\033[K" + text + ("\n" if self.done == self.plan.cell_count else ""))
        else:
            self.stream.write(text + "\n")
        self.stream.flush()


def run_sweep(plan: Plan, runner: Runner, environment: dict, save=None, progress=None) -> Results:
    """Run every block in interleaved order; ``save(results)`` after each block keeps
    what was measured if the run is interrupted."""
    cells: list[Cell] = []
    created = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")

    def snapshot(complete: bool) -> Results:
        args = plan.arguments() | {"complete": complete}
        return Results(environment=environment, arguments=args, workload=plan.workload,
                       cells=tuple(cells), created=created)

    for repeat, spec in plan.blocks:
        cells.extend(runner.run_block(spec, repeat, list(plan.concurrency), list(plan.scenarios), on_cell=progress))
        if save:
            save(snapshot(complete=False))
    results = snapshot(complete=True)
    if save:
        save(results)
    return results


def timestamp_dir() -> str:
    return dt.datetime.now().strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"
