"""What the scripts that measure two arms on one running stack share (sampler-cost.py,
doctor-cost.py, header-cost.py): the stack's options, the ABBA order of a pair's two arms (a
drifting machine hits both alike) and the per-pair throughput ratios of the two arms' cells."""

from __future__ import annotations

import argparse

from uwsgi_layouts.bench.load.scenarios import SCENARIOS, Scenario
from uwsgi_layouts.bench.options import require_tools


def stack_options(description: str, layout: str = "2x4-mapped", scenario: str = "article",
                  duration: float = 10.0, pairs: int = 8) -> argparse.ArgumentParser:
    """A parser with the options every such script takes (``--duration`` of ``duration``'s type)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--layout", default=layout)
    p.add_argument("--scenario", default=scenario)
    p.add_argument("--concurrency", type=int, default=0, help="default: 2P")
    p.add_argument("--duration", type=type(duration), default=duration)
    p.add_argument("--pairs", type=int, default=pairs)
    return p


def the_stack(args) -> tuple[int, int, int, Scenario]:
    """What the options name: the layout's processes and threads, the connections (``--concurrency``,
    else 2P) and the scenario resolved for those threads. wrk must be installed (one line, exit 2)."""
    require_tools("wrk")
    processes, threads = (int(x) for x in args.layout.split("-")[0].split("x"))
    return processes, threads, args.concurrency or 2 * processes, SCENARIOS[args.scenario].resolved(threads)


def abba(pair: int, first, second) -> tuple:
    """Pair ``pair``'s arms in ABBA order: ``first`` first in odd pairs, ``second`` first in even ones."""
    return (first, second) if pair % 2 else (second, first)


def pair_ratios(cells, off_label: str, on_label: str) -> list[float]:
    """Per pair (the cells' ``repeat``), the throughput of the ``on_label`` cell over the
    ``off_label`` one; pairs missing an arm (an interrupted run) or without throughput are left out."""
    by = {(c.scenario, c.repeat): c for c in cells}
    return [by[(on_label, r)].rps / by[(off_label, r)].rps for r in sorted({c.repeat for c in cells})
            if (on_label, r) in by and (off_label, r) in by and by[(off_label, r)].rps]
