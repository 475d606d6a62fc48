"""How close ``bench tune`` comes to an exhaustive search, and in how much time: a benchmark.

    python -m bench.tune.accuracy [--mixes article,io-heavy] [--concurrency 4] [--repeats 3]
        [--duration 8] [--p99-ms article=1500,io-heavy=300] [--budget-share 0.25] [--out DIR]
    (make tune-accuracy ARGS=...; --grids DIR reruns tune against the grids of an earlier run)

Per mix of the demo app:
1. the grid: every candidate of the space (P 1..max, T in the set, each strategy; with one process
   ``shared`` and ``mapped`` are one stack, measured once as ``shared``), ``--repeats``
   interleaved repeats of ``--duration`` s at the concurrency (``compare``'s sweep:
   ``bench.kinds.closedloop``), timed; results in DIR/grid-MIX/results.json;
2. ``python -m bench tune`` with the same space and objective and a budget of ``--budget-share``
   of the grid's time (less 10%, its allowed overrun), timed; results in DIR/tune-MIX/;
3. both judged by the same objective (``bench.tune.objective``) on the grid's own cells: the
   grid's best (the tie rule included), tune's choice as the grid measured it, the ratio of their
   throughputs, whether they are within noise of each other, and the ratio of the times.

Writes DIR/accuracy.json and prints a table. Nothing is asserted: the machine is shared and
noisy (the load average is recorded at every step), so figures are quoted with their spread.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bench.environment import capture
from bench.kinds.base import sigterm_interrupts
from bench.kinds.closedloop import LiveRunner, Plan, run_sweep
from bench.load.scenarios import SCENARIOS
from bench.options import RESULTS_ROOT, float_arg, int_arg, prepare_out, timestamp_dir
from bench.results import Results, load
from bench.stack import Lab
from bench.tune.objective import Objective, decide, evaluate, rps_comparison
from bench.tune.record import objective_of, outcome_of
from bench.tune.space import (
    DEFAULT_STRATEGIES,
    DEFAULT_THREADS,
    Candidate,
    candidate_space,
    one_process_twin,
)
from deploy.layout import PROJECT_ROOT

# The I/O-heavy mix mostly sleeps: its p99 holds still under CPU load from other users of the
# machine (about 210 ms with enough threads, 400+ when requests queue), so a limit there is
# meaningful; the article's mix is CPU-bound, its latencies move with the machine's load: no limit.
DEFAULT_P99_MS = {"io-heavy": 400.0}
TARGET_RATIO = 0.95
TARGET_TIME_SHARE = 0.25


def grid_specs(max_processes: int, threads: tuple[int, ...], strategies: tuple[str, ...]
               ) -> tuple[list[str], list[str]]:
    """(measured, left out as one-process duplicates of a measured one)."""
    space = candidate_space(max_processes, threads, strategies)
    allowed = {c.strategy for c in space}
    measured, dropped = [], []
    for c in space:
        (dropped if one_process_twin(c, allowed) else measured).append(c.spec)
    return measured, dropped


def run_grid(mix: str, specs: list[str], concurrency: int, repeats: int, duration: float, out: Path
             ) -> tuple[Results, float]:
    scenario = SCENARIOS[mix].resolved(1)
    plan = Plan(layouts=tuple(specs), concurrency=(concurrency,), repeats=repeats, duration=duration, warmup=1.0,
                processes=1, threads=1, scenarios=(mix,), workload={mix: scenario.to_dict()}, inflight_hz=0,
                command=f"python -m bench.tune.accuracy (grid of {mix})", options={"transport": "tcp"})
    done = [0]

    def progress(cell):
        done[0] += 1
        print(f"  grid {mix} [{done[0]}/{plan.cell_count}] {cell.layout} r{cell.repeat}: {cell.rps:.1f} req/s, p99 "
              f"{cell.latency_ms.p99:.0f} ms (load {os.getloadavg()[0]:.1f})", flush=True)

    start = time.monotonic()
    with Lab() as lab:
        runner = LiveRunner(lab, out / "raw", {mix: scenario}, duration, 1.0, 10.0,
                            layout_options={"transport": "tcp"}, inflight_hz=0)
        results = run_sweep(plan, runner, capture(), save=lambda r: r.save(out / "results.json"), progress=progress)
    return results, time.monotonic() - start


def grid_evaluations(grid: Results, objective: Objective, mix: str) -> dict:
    out = {}
    for spec in grid.layouts:
        cells = [c for c in grid.cells if c.layout == spec and c.scenario == mix]
        if cells:
            out[spec] = evaluate(Candidate.parse(spec), cells, [], objective)
    return out


def judge(grid: Results, tune: Results, mix: str) -> dict:
    objective = objective_of(tune.arguments)
    evals = grid_evaluations(grid, objective, mix)
    best = decide(list(evals.values()))
    outcome = outcome_of(tune)
    choice = outcome.chosen.spec if outcome.chosen else None
    mine = evals.get(choice) if choice else None  # tune keeps shared at P=1, as the grid does
    meets = [e for e in evals.values() if e.meets]
    ranked = sorted(meets, key=lambda e: -e.rps.value)
    data = {
        "objective": objective.words(),
        "grid_best": best.chosen.spec if best.chosen else None,
        "grid_leader": best.leader.spec if best.leader else None,
        "grid_best_rps": best.chosen.rps.value if best.chosen else None,
        "grid_best_rps_range": [best.chosen.rps.low, best.chosen.rps.high] if best.chosen else None,
        "grid_best_p99_ms": best.chosen.p99.value if best.chosen else None,
        "grid_tied": [e.spec for e in best.tied],
        "grid_meets": len(meets),
        "tune_choice": choice,
        "tune_choice_in_grid_rps": mine.rps.value if mine else None,
        "tune_choice_in_grid_range": [mine.rps.low, mine.rps.high] if mine else None,
        "tune_choice_meets_in_grid": bool(mine and mine.meets),
        "tune_choice_rank_in_grid": next((i + 1 for i, e in enumerate(ranked) if mine is not None and e is mine), None),
        "tune_own_rps": outcome.chosen.rps.value if outcome.chosen else None,
        "tune_stop": outcome.stop,
    }
    if mine and best.chosen:
        ratio = rps_comparison(mine, best.chosen)
        data |= {"ratio": mine.rps.value / best.chosen.rps.value, "ratio_interval": [ratio.low, ratio.high],
                 "within_noise": ratio.outcome == "within noise" or mine is best.chosen}
        leader = best.leader
        data["ratio_to_leader"] = mine.rps.value / leader.rps.value if leader else None
    return data


@dataclass(frozen=True)
class Setup:
    mixes: tuple[str, ...]
    concurrency: int
    max_processes: int
    threads: tuple[int, ...]
    strategies: tuple[str, ...]
    repeats: int
    duration: float
    share: float  # of the grid's time, for tune's budget
    p99_ms: dict[str, float]
    grids: str | None  # reuse the grids of an earlier run

    def tune_command(self, mix: str, budget_min: float, out: Path) -> list[str]:
        cmd = [sys.executable, "-m", "bench", "tune", "--scenario", mix, "--concurrency", str(self.concurrency),
               "--max-processes", str(self.max_processes), "--threads", ",".join(map(str, self.threads)),
               "--strategies", ",".join(self.strategies), "--budget", f"{budget_min:.2f}", "--out", str(out)]
        return cmd + (["--p99-ms", f"{self.p99_ms[mix]:g}"] if mix in self.p99_ms else [])


def parse(argv: list[str] | None) -> tuple[Setup, str | None]:
    nproc = os.cpu_count() or 1
    p = argparse.ArgumentParser(prog="python -m bench.tune.accuracy", description=__doc__.splitlines()[0])
    p.add_argument("--mixes", default="article,io-heavy")
    p.add_argument("--concurrency", default=str(2 * nproc))
    p.add_argument("--max-processes", default=str(2 * nproc))
    p.add_argument("--threads", default=",".join(map(str, DEFAULT_THREADS)))
    p.add_argument("--strategies", default=",".join(DEFAULT_STRATEGIES))
    p.add_argument("--repeats", default="3")
    p.add_argument("--duration", default="8")
    p.add_argument("--p99-ms", default=",".join(f"{k}={v:g}" for k, v in DEFAULT_P99_MS.items()),
                   help="per mix, MIX=MS (a mix left out has no p99 limit)")
    p.add_argument("--budget-share", default=str(TARGET_TIME_SHARE))
    p.add_argument("--grids", metavar="DIR", help="reuse the grids of an earlier run (DIR/grid-MIX/results.json and "
                                                   "their times in DIR/accuracy.json) and run tune only")
    p.add_argument("--out")
    a = p.parse_args(argv)
    setup = Setup(
        mixes=tuple(m.strip() for m in a.mixes.split(",") if m.strip()),
        concurrency=int_arg("concurrency", a.concurrency, 1, 1000),
        max_processes=int_arg("max_processes", a.max_processes, 1, 64),
        threads=tuple(int_arg("threads", t, 1, 256) for t in a.threads.split(",")),
        strategies=tuple(s.strip() for s in a.strategies.split(",")),
        repeats=int_arg("repeats", a.repeats, 1, 20), duration=float_arg("duration", a.duration, 1, 120),
        share=float_arg("budget_share", a.budget_share, 0.01, 1),
        p99_ms={k: float(v) for k, _, v in (x.partition("=") for x in a.p99_ms.split(",") if x)}, grids=a.grids)
    return setup, a.out


def main(argv: list[str] | None = None) -> int:
    setup, out_arg = parse(argv)
    out = prepare_out(out_arg or str(RESULTS_ROOT / (timestamp_dir() + "-tune-accuracy")))
    specs, left_out = grid_specs(setup.max_processes, setup.threads, setup.strategies)
    summary = {"environment": capture(), "concurrency": setup.concurrency, "grid_layouts": specs,
               "grid_left_out": left_out, "repeats": setup.repeats, "duration_s": setup.duration,
               "p99_ms": setup.p99_ms, "mixes": {}}
    print(f"grid: {len(specs)} layouts ({len(left_out)} one-process duplicates left out) x {setup.repeats} repeats "
          f"of {setup.duration:g} s at {setup.concurrency} connections, per mix; then tune on {setup.share:.0%} of "
          "the grid's time", flush=True)
    with sigterm_interrupts():  # SIGTERM stops the stacks as Ctrl-C does
        for mix in setup.mixes:
            data = one_mix(setup, mix, specs, out)
            if data is None:
                return 1
            summary["mixes"][mix] = data
            (out / "accuracy.json").write_text(json.dumps(summary, indent=2) + "\n")
            print("\n".join(summary_lines(mix, data)), flush=True)
    print("\n" + "\n".join(table_lines(summary)))
    print(f"\nwrote {out / 'accuracy.json'}")
    return 0


def one_mix(setup: Setup, mix: str, specs: list[str], out: Path) -> dict | None:
    """The grid (or a stored one), then tune, then both judged; None if tune failed."""
    load_before = os.getloadavg()
    if setup.grids:
        grid = load(Path(setup.grids) / f"grid-{mix}" / "results.json")
        grid_s = json.loads((Path(setup.grids) / "accuracy.json").read_text())["mixes"][mix]["grid_s"]
    else:
        grid, grid_s = run_grid(mix, specs, setup.concurrency, setup.repeats, setup.duration, out / f"grid-{mix}")
    budget_min = max(1.0, grid_s * setup.share / 1.1 / 60)  # a 10% overrun still stays within the share
    tune_dir = out / f"tune-{mix}"
    cmd = setup.tune_command(mix, budget_min, tune_dir)
    print(f"tune {mix}: {' '.join(cmd[1:])}", flush=True)
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=PROJECT_ROOT, text=True, capture_output=True)
    tune_s = time.monotonic() - start
    if tune_dir.exists():
        (tune_dir / "stdout.txt").write_text(proc.stdout + proc.stderr)
    if proc.returncode not in (0, 3):
        print(proc.stdout[-2000:] + proc.stderr[-2000:], file=sys.stderr)
        return None
    data = judge(grid, load(tune_dir / "results.json"), mix)
    return data | {"grid_s": grid_s, "grid_from": setup.grids, "tune_s": tune_s, "tune_budget_min": budget_min,
                   "tune_exit": proc.returncode, "time_share": tune_s / grid_s, "loadavg_before": list(load_before),
                   "loadavg_after": list(os.getloadavg()), "grid_cells": len(grid.cells)}


def summary_lines(mix: str, d: dict) -> list[str]:
    ratio = d.get("ratio")
    return [
        f"{mix}: grid best {d['grid_best']} {d['grid_best_rps']:.1f} req/s (p99 {d['grid_best_p99_ms']:.0f} ms) in "
        f"{d['grid_s'] / 60:.1f} min; tune chose {d['tune_choice']} in {d['tune_s'] / 60:.1f} min "
        f"({d['time_share']:.0%} of the grid's time): "
        + (f"{d['tune_choice_in_grid_rps']:.1f} req/s in the grid = {ratio:.2f}x the best"
           + (" (within noise)" if d.get("within_noise") else "") if ratio is not None else "no ratio")
    ]


def table_lines(summary: dict) -> list[str]:
    """A Markdown table of every mix (what the README quotes)."""
    rows = ["| mix | grid: cells, time | grid's best, req/s (low–high) | tune: time, share of the grid's | tune's "
            "choice, req/s in the grid | ratio (interval) | load average |", "|---|---|---|---|---|---|---|"]
    for mix, d in summary["mixes"].items():
        best = "none meets" if d["grid_best"] is None else (
            f"{d['grid_best']} {d['grid_best_rps']:.1f} ({d['grid_best_rps_range'][0]:.1f}–"
            f"{d['grid_best_rps_range'][1]:.1f})")
        mine = "no choice" if d.get("tune_choice_in_grid_rps") is None else (
            f"{d['tune_choice']} {d['tune_choice_in_grid_rps']:.1f} ({d['tune_choice_in_grid_range'][0]:.1f}–"
            f"{d['tune_choice_in_grid_range'][1]:.1f})")
        ratio = "n/a" if d.get("ratio") is None else (
            f"{d['ratio']:.2f} ({d['ratio_interval'][0]:.2f}–{d['ratio_interval'][1]:.2f})"
            + (", within noise" if d.get("within_noise") else ""))
        rows.append(f"| {mix} | {d['grid_cells']}, {d['grid_s'] / 60:.1f} min | {best} | {d['tune_s'] / 60:.1f} min, "
                    f"{d['time_share']:.0%} | {mine} | {ratio} | {d['loadavg_before'][0]:.1f} → "
                    f"{d['loadavg_after'][0]:.1f} |")
    return rows


if __name__ == "__main__":
    sys.exit(main())
