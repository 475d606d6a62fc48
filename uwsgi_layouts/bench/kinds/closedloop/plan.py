"""The sweep's plan: which layouts, levels and scenarios, in which order (rounds interleaved, the
verdict's pair as one paired block) and how long each block and round takes."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


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


# The rounds added until decided measure cells this many times longer than the planned ones: a
# round's ratio moves by one request in N (a 3-s cell at 2 connections holds about 66 requests,
# 1.5% each), so longer cells decide a small difference in fewer rounds, and the paired interval
# weighs each round by its requests (bench.paired).
EXTENSION_FACTOR = 3


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


def extension_duration(plan: Plan) -> float:
    """The cell duration of the rounds added until decided (a key cell: at least its own)."""
    return plan.duration * EXTENSION_FACTOR


def round_seconds(blocks: dict[str, dict[str, list[int]]], plan: Plan, overhead_s: float) -> float:
    """What one added round of ``blocks`` (layout -> scenario -> levels) takes."""
    return sum(block_time(overhead_s, plan.warmup,
                          plan.durations(spec, sorted({lv for x in scs.values() for lv in x}), added=True).values(),
                          len(scs))
               for spec, scs in blocks.items())
