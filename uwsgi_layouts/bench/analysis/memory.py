"""Memory: what one more process and one more thread cost, fitted over the measured layouts."""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from uwsgi_layouts.bench.analysis.choice import server_of
from uwsgi_layouts.bench.analysis.tails import Stat
from uwsgi_layouts.bench.results import Results

# --- memory: what one more process and one more thread cost ---------------------------------

LAYOUT_SIZE_RE = re.compile(r"^(\d+)x(\d+)-")
MEMORY_KEY = "app_pss_mb"


@dataclass(frozen=True)
class MemoryCost:
    """The app server tree's PSS fitted over layouts as base + per_process * P + per_thread *
    P * (T - 1): ``per_process`` is one more worker process (with its first thread),
    ``per_thread`` each further thread, ``base`` what no worker adds (the master). One fit per
    repeat, on each layout's cell at the highest level measured; medians and ranges over repeats."""

    scenario: str
    base: Stat
    per_process: Stat
    per_thread: Stat
    layouts: tuple[str, ...]
    level: int
    worst_residual_mb: float  # the largest |measured - fitted| of any layout in any repeat
    server: str = "uwsgi"  # the app server whose layouts were fitted (servers differ: never mixed)


def fit_memory(points: list[tuple[int, int, float]]) -> tuple[list[float], float] | None:
    """Least squares of PSS = base + b * P + c * P * (T - 1) over (P, T, PSS) points:
    ([base, b, c], worst |residual|), or None when the layouts cannot separate the three (the
    design matrix's rank is below 3)."""
    a = np.array([(1.0, float(p), float(p * (t - 1))) for p, t, _ in points])
    y = np.array([pss for _, _, pss in points])
    if len(points) < 3 or np.linalg.matrix_rank(a) < 3:
        return None
    coef, *_ = np.linalg.lstsq(a, y, rcond=None)
    worst = float(np.max(np.abs(y - a @ coef)))
    return [float(c) for c in coef], worst


def memory_cost(results: Results, scenario: str, key: str = MEMORY_KEY, server: str = "uwsgi") -> MemoryCost | None:
    """What one more process and one more thread cost in PSS, from the run's layouts of one app
    server (None when fewer than three of its layouts with enough different P and T recorded
    memory)."""
    cells = [c for c in results.cells if c.scenario == scenario and key in c.memory
             and LAYOUT_SIZE_RE.match(c.layout) and "@" not in c.layout and server_of(c.layout) == server]
    if not cells:
        return None
    level = max(c.concurrency for c in cells)
    at = [c for c in cells if c.concurrency == level]
    fits, worst, used = [], 0.0, set()
    for repeat in sorted({c.repeat for c in at}):
        points = []
        for c in at:
            if c.repeat == repeat:
                m = LAYOUT_SIZE_RE.match(c.layout)
                points.append((int(m[1]), int(m[2]), c.memory[key]))
                used.add(c.layout)
        fitted = fit_memory(points) if len(points) >= 3 else None
        if fitted is not None:
            fits.append(fitted[0])
            worst = max(worst, fitted[1])
    if not fits:
        return None
    return MemoryCost(scenario, Stat.of([f[0] for f in fits]), Stat.of([f[1] for f in fits]),
                      Stat.of([f[2] for f in fits]), tuple(x for x in results.layouts if x in used), level, worst,
                      server)


def memory_costs(results: Results) -> tuple[MemoryCost, ...]:
    """Per scenario, the process/thread cost fit of each app server with enough layouts in the run
    (servers in the order the run first measured them): what the memory section states."""
    servers = [s for s in dict.fromkeys(server_of(x) for x in results.layouts) if s]
    return tuple(c for sc in results.scenarios for s in servers
                 if (c := memory_cost(results, sc, server=s)) is not None)
