"""SYNTHETIC stand-ins for the tune search's tests: a fake clock and a fake measure that makes
cells from a made-up model of each layout. Nothing here is measured, nothing starts a process.

``Model`` says, per candidate, the throughput, the median latency, the memory, failed requests
and (under a stall) the healthy latency; each cell draws its latencies from a lognormal around the
median and its throughput with a small seeded noise, so a run is deterministic. ``FakeMeasure``
advances ``FakeClock`` by what a live block would take (a fixed overhead, the warm-up and the
load of each scenario), so budget accounting is tested without timing anything.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from uwsgi_layouts.bench.analysis import percentile_of
from uwsgi_layouts.bench.cli import build_parser
from uwsgi_layouts.bench.kinds import tune as kind
from uwsgi_layouts.bench.load.wrk import compress
from uwsgi_layouts.bench.results import Cell, Errors, Latency, Results
from uwsgi_layouts.bench.tune.search import Inputs, Settings, run_search
from uwsgi_layouts.bench.tune.space import Candidate

# The synthetic cells' latencies keep 3 significant digits, as when the stored fixtures and the
# figures their tests assert were made (runs keep 4 since 2026-11-28: bench.load.wrk).
FIXTURE_DIGITS = 3


class FakeClock:
    """Seconds of a pretend run; every read recorded, as the live TapeClock does."""

    def __init__(self):
        self.t = 0.0
        self.reads: list[float] = []

    def now(self) -> float:
        value = round(self.t, 3)
        self.reads.append(value)
        return value


@dataclass(frozen=True)
class Figures:
    rps: float
    p50_ms: float
    memory_mb: float
    failed: int = 0
    stall_p50_ms: float | None = None  # healthy latency under the stall (default: as steady)


Model = Callable[[Candidate], Figures]


def memory_of(c: Candidate, base: float = 9.0, per_process: float = 6.4, per_thread: float = 0.1) -> float:
    return base + per_process * c.processes + per_thread * c.processes * (c.threads - 1)


def article_model(c: Candidate) -> Figures:
    """Made up, shaped after the article on 2 cores: more processes help up to 2, mapped beats
    shared with several processes, one process is GIL-bound."""
    rps = {1: 10.0, 2: 19.0, 3: 19.5, 4: 19.8}.get(c.processes, 20.0)
    if c.strategy != "mapped" and c.processes > 1:
        rps *= 0.8
    return Figures(rps, 4000 / rps, memory_of(c))


class FakeMeasure:
    """SYNTHETIC blocks: cells drawn from ``model``; the clock advances by overhead + per
    scenario (warm-up + duration)."""

    def __init__(self, clock: FakeClock, model: Model, level: int, steady: str = "article", overhead_s: float = 2.5,
                 warmup_s: float = 1.0, noise: float = 0.04, spread: float = 0.25, seed: int = 7):
        self.clock, self.model, self.level, self.steady = clock, model, level, steady
        self.overhead_s, self.warmup_s, self.noise, self.spread = overhead_s, warmup_s, noise, spread
        self.rng = np.random.default_rng(seed)
        self.calls: list[tuple[str, int, int, int]] = []
        self.workload = {steady: {"description": "synthetic"}}

    def block(self, spec: str, repeat: int, duration_s: int, stall_clients: int) -> list[Cell]:
        self.calls.append((spec, repeat, duration_s, stall_clients))
        c = Candidate.parse(spec)
        f = self.model(c)
        out = [self.cell(c, repeat, duration_s, self.steady, f.rps, f.p50_ms, f)]
        if stall_clients:
            self.workload["stall"] = {"description": "synthetic stall", "stall": {"clients": stall_clients}}
            out.append(self.cell(c, repeat, duration_s, "stall", f.rps * 0.8, f.stall_p50_ms or f.p50_ms, f,
                                 stall_clients))
        self.clock.t += self.overhead_s + len(out) * (self.warmup_s + duration_s)
        return out

    def cell(self, c: Candidate, repeat: int, duration_s: int, scenario: str, rps: float, p50_ms: float, f: Figures,
             stall_clients: int = 0) -> Cell:
        rps = rps * float(self.rng.normal(1, self.noise))
        n = max(1, int(round(rps * duration_s)))
        values = np.round(self.rng.lognormal(math.log(p50_ms * 1000), self.spread, n)).astype(int)
        v, counts = np.unique(values, return_counts=True)
        hist = compress(zip(v.tolist(), counts.tolist(), strict=True), digits=FIXTURE_DIGITS)
        pct = {name: percentile_of(hist, bp) / 1000 for name, bp in
               (("p50", 5000), ("p90", 9000), ("p99", 9900), ("p999", 9990))}
        extra = {"stall_clients": stall_clients, "stalled_requests": 2, "stalled_p50_ms": 3000.0,
                 "stalled_errors": 0} if scenario == "stall" else {}
        return Cell(layout=c.spec, concurrency=self.level, repeat=repeat, scenario=scenario,
                    duration_s=float(duration_s), requests=n, rps=n / duration_s,
                    latency_ms=Latency(pct["p50"], pct["p90"], pct["p99"], pct["p999"], hist[-1][0] / 1000),
                    errors=Errors(timeout=f.failed), worker_requests={str(i + 1): n // c.processes
                                                                      for i in range(c.processes)},
                    cpu_s={"app": 0.5, "nginx": 0.05, "wrk": 0.02}, unloaded_latency_ms=p50_ms / 2, capacity_rps=0.0,
                    closed_loop_rps=0.0, efficiency=0.0, extra=extra, histogram=hist,
                    memory={"app_pss_mb": round(f.memory_mb, 2), "nginx_pss_mb": 2.5},
                    status={"2xx": max(0, n - f.failed)}, round=repeat)


def tune_args(**given) -> argparse.Namespace:
    """What ``uwsgi-layouts tune`` parses from ``given`` (strings, as on the command line; a list
    for a repeatable option), through tune's own parser: each value checked as there."""
    argv = ["tune", *(f"--{k.replace('_', '-')}={v}" for k, values in given.items()
                      for v in (values if isinstance(values, list) else [values]))]
    args = build_parser().parse_args(argv)
    args.argv = argv
    return args


def fake_run(model: Model = article_model, overhead_s: float = 2.5, noise: float = 0.04, seed: int = 7,
             progress=None, **given) -> tuple[Results, "kind.Outcome", FakeMeasure, FakeClock]:
    """A whole tune run on the fake measure, stored as the kind stores it: (results, outcome,
    measure, clock). ``given``: command-line options (strings)."""
    config = kind.config_from_args(tune_args(**given))
    clock = FakeClock()
    measure = FakeMeasure(clock, model, config.inputs.objective.concurrency, config.steady.name, overhead_s,
                          config.inputs.settings.warmup_s, noise, seed=seed)
    recording = kind.RecordingMeasure(measure)
    outcome = run_search(config.inputs, recording, clock, progress=progress)
    results = kind.snapshot(config, outcome, recording.cells, clock.reads, {"_comment": "SYNTHETIC: fake measure"},
                            measure.workload, "2026-01-01T00:00:00+00:00", complete=not outcome.interrupted,
                            wall_s=clock.t)
    return results, outcome, measure, clock


def inputs(objective, space, budget_s: float = 600.0, steady: str = "article", **settings) -> Inputs:
    return Inputs(objective, tuple(space), Settings(budget_s=budget_s, **settings), steady, "stall", 2)
