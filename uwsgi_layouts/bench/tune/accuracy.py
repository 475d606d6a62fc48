"""How close ``bench tune`` comes to an exhaustive search, and in how much time: a benchmark.

    uwsgi-layouts tune-accuracy [--mixes article,io-heavy,traffic] [--concurrency 4] [--repeats 5]
        [--duration 8] [--p99-ms article=1500,io-heavy=300] [--budget-share 0.25]
        [--background-load 0.5] [--cpus 1 [--memory MB]] [--app ... --requests FILE] [--out DIR]
    (make tune-accuracy ARGS=...; --grids DIR reruns tune against the grids of an earlier run)

Per mix (a mix of the demo app, or ``traffic``: your app and requests, given with compare's app
and traffic options, e.g. the Flask test app that ``scripts/flask-shop.py`` builds):
1. the grid: every candidate of the space (P 1..max, T in the set, each strategy; with one process
   ``shared`` and ``mapped`` are one stack, measured once as ``shared``), ``--repeats``
   interleaved rounds (at least 5 by default) of ``--duration`` s at the concurrency
   (``compare``'s sweep: ``bench.kinds.closedloop``), timed; results in DIR/grid-MIX/results.json;
2. ``uwsgi-layouts tune`` with the same space and objective and a budget of ``--budget-share``
   of the grid's time (less 10%, its allowed overrun), timed; results in DIR/tune-MIX/;
3. both judged by the same objective (``bench.tune.objective``) on the grid's own cells: tune's
   choice as the grid measured it against the objective's best over the whole grid (the tie rule
   included), the best of the candidates that hold N requests at once (those tune may choose) and
   the fastest that meets the objective: ratios of throughput paired by the grid's rounds, with
   their intervals, and whether the 0.95x target is met, missed or undecided (judged by that
   interval); and the ratio of the times. ``--judge DIR`` does this step again on a finished run's
   files.

``--cpus N`` (``--memory MB``): inside a pod's limit. Every layout of the grid runs in a cgroup of
its own with that quota (as ``@cpus``), tune is run with ``--cpus N``, the space and the
concurrency default to the pod's CPUs (2 x N rounded up, as tune's), and each figure carries the
throttled share its cells measured (median over the rounds).

``--background-load FRACTION``: a process of ours burns that share of one core in short duty
cycles for the whole run (grid and tune alike; ``bench.load.background``, stopped on every exit
path), so accuracy under a noisy neighbour is a figure too.

Writes DIR/accuracy.json and prints a table. Nothing is asserted: the machine is shared and
noisy (the load average is recorded at every step), so figures are quoted with their spread.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from uwsgi_layouts.arguments import PROG, CommaList, Ints, Numbers, OneLineParser
from uwsgi_layouts.bench import subject as subj
from uwsgi_layouts.bench.environment import Machine, capture
from uwsgi_layouts.bench.kinds.base import sigterm_interrupts
from uwsgi_layouts.bench.kinds.closedloop import LiveRunner, Plan, run_sweep
from uwsgi_layouts.bench.load.background import BackgroundLoad, fraction_arg
from uwsgi_layouts.bench.load.scenarios import SCENARIOS
from uwsgi_layouts.bench.options import CONNECTIONS, BadArgument, prepare_out, results_root, timestamp_dir
from uwsgi_layouts.bench.results import Results, load
from uwsgi_layouts.bench.stack import Lab
from uwsgi_layouts.bench.tune.objective import Objective, decide, evaluate, rps_comparison
from uwsgi_layouts.bench.tune.record import objective_of, outcome_of
from uwsgi_layouts.bench.tune.space import (
    DEFAULT_STRATEGIES,
    DEFAULT_THREADS,
    Candidate,
    candidate_space,
    one_process_twin,
)
from uwsgi_layouts.deploy.machine import default_cpus
from uwsgi_layouts.deploy.model import LayoutError, parse_cpus, parse_memory_mb

# The I/O-heavy mix mostly sleeps: its p99 holds still under CPU load from other users of the
# machine (about 210 ms with enough threads, 400+ when requests queue), so a limit there is
# meaningful; the article's mix is CPU-bound, its latencies move with the machine's load: no limit.
DEFAULT_P99_MS = {"io-heavy": 400.0}
TARGET_RATIO = 0.95
TARGET_TIME_SHARE = 0.25
DEFAULT_REPEATS = 5  # interleaved rounds per layout: enough for a paired t interval
TRAFFIC = subj.TRAFFIC  # the mix of your own app and requests (--app ... --requests)
APP_OPTIONS = ("app", "app_dir", "virtualenv", "env", "static", "request", "requests", "header", "access_log")


def grid_specs(max_processes: int, threads: tuple[int, ...], strategies: tuple[str, ...]
               ) -> tuple[list[str], list[str]]:
    """(measured, left out as one-process duplicates of a measured one)."""
    space = candidate_space(max_processes, threads, strategies)
    allowed = {c.strategy for c in space}
    measured, dropped = [], []
    for c in space:
        (dropped if one_process_twin(c, allowed) else measured).append(c.spec)
    return measured, dropped


def run_grid(mix: str, specs: list[str], concurrency: int, repeats: int, duration: float, out: Path,
             subject: subj.Subject | None = None, limits: dict | None = None) -> tuple[Results, float]:
    scenario = SCENARIOS[mix].resolved(1)
    # As tune measures by default (and under the same pod limits, as tune --cpus sets them): the grid
    # judges tune's choice on equal terms.
    options = {"transport": "unix"} | (limits or {})
    if mix == TRAFFIC:
        scenario = scenario.with_mix(subject.mix)
        options |= subject.layout_options
    plan = Plan(layouts=tuple(specs), concurrency=(concurrency,), repeats=repeats, duration=duration, warmup=1.0,
                processes=1, threads=1, scenarios=(mix,), workload={mix: scenario.to_dict()}, inflight_hz=0,
                command=f"uwsgi-layouts tune-accuracy (grid of {mix})", options=options,
                app=subject.record if subject is not None and mix == TRAFFIC else {})
    done = [0]

    def progress(cell):
        done[0] += 1
        print(f"  grid {mix} [{done[0]}/{plan.cell_count}] {cell.layout} r{cell.repeat}: {cell.rps:.1f} req/s, p99 "
              f"{cell.latency_ms.p99:.0f} ms (load {os.getloadavg()[0]:.1f})", flush=True)

    start = time.monotonic()
    environment, machine = capture(), Machine()
    with Lab() as lab:
        runner = LiveRunner(lab, out / "raw", {mix: scenario}, duration, 1.0, 10.0, layout_options=options,
                            inflight_hz=0)
        results = run_sweep(plan, runner, environment, save=lambda r: r.save(out / "results.json"),
                            progress=progress, on_block=lambda: environment.update(machine=machine.sample() and
                                                                                   machine.record()))
    return results, time.monotonic() - start


def grid_evaluations(grid: Results, objective: Objective, mix: str) -> dict:
    out = {}
    for spec in grid.layouts:
        cells = [c for c in grid.cells if c.layout == spec and c.scenario == mix]
        if cells:
            out[spec] = evaluate(Candidate.parse(spec), cells, [], objective)
    return out


def _figures(e, grid: Results, mix: str) -> dict:
    return {"spec": e.spec, "rps": e.rps.value, "rps_range": [e.rps.low, e.rps.high], "p99_ms": e.p99.value,
            "memory_mb": e.memory_mb, "throttled_share": throttled_share(grid, e.spec, mix)}


def throttled_share(grid: Results, spec: str, mix: str) -> float | None:
    """Median over the grid's rounds of the share of CFS periods in which ``spec``'s server used
    up its quota (None without a CPU limit)."""
    shares = [c.limit["throttled_share"] for c in grid.cells if c.layout == spec and c.scenario == mix and c.limit
              and c.limit.get("throttled_share") is not None]
    return statistics.median(shares) if shares else None


def judge(grid: Results, tune: Results, mix: str) -> dict:
    """Tune's choice against three references, all as the grid measured them (same cells, same
    conditions): the objective's choice over every candidate of the grid (the tie rule included),
    the same among the candidates that hold N requests at once (P x T >= N: those tune may choose),
    and the fastest (highest median throughput) that meets the objective."""
    objective = objective_of(tune.arguments)
    evals = grid_evaluations(grid, objective, mix)
    n = objective.concurrency
    outcome = outcome_of(tune)
    choice = outcome.chosen.spec if outcome.chosen else None
    mine = evals.get(choice) if choice else None  # tune keeps shared at P=1, as the grid does
    every = decide(list(evals.values()))
    holding = decide([e for e in evals.values() if e.candidate.processes * e.candidate.threads >= n])
    references = {"best": every.chosen, "best_holding_n": holding.chosen, "fastest": every.leader}
    ranked = sorted((e for e in evals.values() if e.meets), key=lambda e: -e.rps.value)
    data = {
        "objective": objective.words(),
        "grid_meets": len(ranked),
        "grid_tied_with_fastest": [e.spec for e in every.tied],
        "tune_choice": choice,
        "tune_choice_in_grid": _figures(mine, grid, mix) if mine else None,
        "tune_choice_meets_in_grid": bool(mine and mine.meets),
        "tune_choice_rank_by_throughput": next((i + 1 for i, e in enumerate(ranked) if e is mine), None),
        "tune_own_rps": outcome.chosen.rps.value if outcome.chosen else None,
        "tune_stop": outcome.stop,
        "tune_blocks": len(outcome.blocks),
    }
    for name, ref in references.items():
        entry = _figures(ref, grid, mix) if ref else None
        if ref and mine:
            ratio = rps_comparison(mine, ref)
            entry |= {"ratio": 1.0 if mine is ref else ratio.ratio,
                      "ratio_interval": [1.0, 1.0] if mine is ref else [ratio.low, ratio.high],
                      "outcome": "the same layout" if mine is ref else ratio.outcome,
                      "judged": "" if mine is ref else ratio.how(), "target": target_state(mine is ref, ratio)}
        data[name] = entry
    return data


def target_state(same: bool, ratio) -> str:
    """Tune's choice against the target (at least TARGET_RATIO x the reference's throughput), by the
    paired interval: "met" (the same layout, equivalent, better, or the whole interval at or above
    the target), "missed" (the whole interval below it) or "undecided"."""
    if same or ratio.outcome in ("equivalent", "better") or ratio.low >= TARGET_RATIO:
        return "met"
    return "missed" if ratio.high < TARGET_RATIO else "undecided"


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
    background_load: float | None = None  # share of one core burnt by our neighbour for the whole run
    app_argv: tuple[str, ...] = ()  # the traffic mix's app and request options, as given
    subject: subj.Subject | None = None
    cpus: float | None = None  # the pod's CPU limit: the grid under @cpus, tune with --cpus
    memory: int | None = None  # its memory limit in MB

    @property
    def limits(self) -> dict:
        return {k: v for k, v in (("cpus", self.cpus), ("memory", self.memory)) if v is not None}

    def tune_command(self, mix: str, budget_min: float, out: Path) -> list[str]:
        what = list(self.app_argv) if mix == TRAFFIC else ["--scenario", mix]
        cmd = [sys.executable, "-m", "uwsgi_layouts", "tune", *what, "--concurrency", str(self.concurrency),
               "--max-processes", str(self.max_processes), "--threads", ",".join(map(str, self.threads)),
               "--strategies", ",".join(self.strategies), "--budget", f"{budget_min:.2f}", "--out", str(out)]
        cmd += [a for k, v in self.limits.items() for a in (f"--{k}", f"{v:g}")]
        return cmd + (["--p99-ms", f"{self.p99_ms[mix]:g}"] if mix in self.p99_ms else [])


# The ranges of tune-accuracy's options (each checked while parsing and shown in the help).
GRID_PROCESSES = Ints(1, 64)
GRID_THREADS = CommaList(Ints(1, 256), "thread count")
GRID_REPEATS = Ints(1, 20)
GRID_DURATION_S = Numbers(1, 120)
BUDGET_SHARE = Numbers(0.01, 1)


def build_parser() -> OneLineParser:
    p = OneLineParser(prog=f"{PROG} tune-accuracy", description=__doc__.splitlines()[0])
    p.add_argument("--mixes", default="article,io-heavy")
    p.add_argument("--concurrency", type=CONNECTIONS,
                   help=f"requests in flight ({CONNECTIONS}; default 2 x the usable CPUs, or the pod's with --cpus)")
    p.add_argument("--max-processes", type=GRID_PROCESSES,
                   help=f"largest P of the grid ({GRID_PROCESSES}; default as --concurrency)")
    p.add_argument("--threads", type=GRID_THREADS, default=DEFAULT_THREADS,
                   help=f"comma-separated T values of the grid, each {GRID_THREADS.item} (default "
                        f"{','.join(map(str, DEFAULT_THREADS))})")
    p.add_argument("--strategies", default=",".join(DEFAULT_STRATEGIES))
    p.add_argument("--repeats", type=GRID_REPEATS, default=DEFAULT_REPEATS,
                   help=f"interleaved rounds of every layout of the grid ({GRID_REPEATS}; default {DEFAULT_REPEATS})")
    p.add_argument("--duration", type=GRID_DURATION_S, default=8.0,
                   help=f"seconds per cell of the grid ({GRID_DURATION_S}; default 8)")
    p.add_argument("--p99-ms", default=",".join(f"{k}={v:g}" for k, v in DEFAULT_P99_MS.items()),
                   help="per mix, MIX=MS (a mix left out has no p99 limit)")
    p.add_argument("--budget-share", type=BUDGET_SHARE, default=TARGET_TIME_SHARE,
                   help=f"tune's budget as a share of the grid's time ({BUDGET_SHARE}; default "
                        f"{TARGET_TIME_SHARE:g})")
    p.add_argument("--grids", metavar="DIR", help="reuse the grids of an earlier run (DIR/grid-MIX/results.json and "
                                                   "their times in DIR/accuracy.json) and run tune only")
    p.add_argument("--judge", metavar="DIR", help="judge a finished run again from its stored files (measures "
                                                   "nothing) and rewrite DIR/accuracy.json")
    p.add_argument("--cpus", help="the pod's CPU limit (fractions allowed): the grid runs under it, tune gets "
                                  "--cpus")
    p.add_argument("--memory", help="the pod's memory limit in MB, as --cpus")
    p.add_argument("--background-load", metavar="FRACTION", help="a process of ours burns this share of one core "
                                                                  "(0..1] in short duty cycles for the whole run")
    subj.add_arguments(p)  # the traffic mix: your app and requests, as for compare and tune
    p.add_argument("--out")
    return p


def parse(argv: list[str] | None) -> tuple[Setup, str | None, str | None]:
    nproc = default_cpus()
    argv = list(sys.argv[1:] if argv is None else argv)
    a = build_parser().parse_args(argv)
    try:
        cpus, memory = parse_cpus(a.cpus), parse_memory_mb(a.memory)
    except LayoutError as exc:
        raise BadArgument(str(exc)) from None
    if cpus is not None and cpus > (os.cpu_count() or 1):
        raise BadArgument(f"cpus: {cpus:g} is more than this machine's {os.cpu_count()} CPUs")
    if cpus is not None:  # a pod of that size: its CPUs, not this machine's, size the grid (as tune does)
        nproc = max(1, math.ceil(cpus - 1e-9))
    setup = Setup(
        mixes=tuple(m.strip() for m in a.mixes.split(",") if m.strip()),
        concurrency=a.concurrency if a.concurrency is not None else 2 * nproc,
        # the default, like the option, stays in the grid's range (a machine of 33+ CPUs: 64)
        max_processes=a.max_processes if a.max_processes is not None else min(2 * nproc, GRID_PROCESSES.high),
        cpus=cpus, memory=memory,
        threads=tuple(a.threads),
        strategies=tuple(s.strip() for s in a.strategies.split(",")),
        repeats=a.repeats, duration=a.duration, share=a.budget_share,
        p99_ms={k: float(v) for k, _, v in (x.partition("=") for x in a.p99_ms.split(",") if x)}, grids=a.grids)
    if a.background_load is not None:
        try:
            setup = dataclasses.replace(setup, background_load=fraction_arg(a.background_load))
        except ValueError as exc:
            raise BadArgument(str(exc)) from None
    if TRAFFIC in setup.mixes:
        subject = subj.from_args(a)
        if subject.mix is None:
            raise BadArgument("mixes: traffic measures your app and requests: give --app, --app-dir, --virtualenv "
                              "and --request or --requests (e.g. the Flask test app: scripts/flask-shop.py DIR)")
        setup = dataclasses.replace(setup, subject=subject, app_argv=tuple(app_argv(argv)))
    unknown = [m for m in setup.mixes if m != TRAFFIC and m not in SCENARIOS]
    if unknown:
        raise BadArgument(f"mixes: unknown mix {unknown[0]!r}; allowed: {TRAFFIC} and the demo app's scenarios")
    return setup, a.out, a.judge


def app_argv(argv: list[str]) -> list[str]:
    """The app and traffic options of ``argv`` (passed on to tune as given)."""
    flags = {f"--{name.replace('_', '-')}" for name in APP_OPTIONS} | {"--include-unsafe"}
    out, i = [], 0
    while i < len(argv):
        flag, _, value = argv[i].partition("=")
        if flag in flags:
            if value or flag == "--include-unsafe":
                out.append(argv[i])
            elif i + 1 < len(argv):
                out += [argv[i], argv[i + 1]]
                i += 1
        i += 1
    return out


def main(argv: list[str] | None = None) -> int:
    try:
        setup, out_arg, judge_dir = parse(argv)
        if judge_dir:
            return rejudge(Path(judge_dir))
        out = prepare_out(out_arg or str(results_root() / (timestamp_dir() + "-tune-accuracy")))
    except ValueError as exc:  # BadArgument, TrafficError, LayoutError: one line, exit 2
        print(f"error: {exc}", file=sys.stderr)
        return 2
    specs, left_out = grid_specs(setup.max_processes, setup.threads, setup.strategies)
    neighbour = BackgroundLoad(setup.background_load) if setup.background_load else None
    # Written with every mix, so a run that fails or is interrupted says under what load it measured:
    # what was asked for from the start, what the neighbour took once it stopped.
    asked = {"fraction": neighbour.fraction, "period_ms": neighbour.period_ms, "cpu_share_taken": None} \
        if neighbour is not None else None
    summary = {"environment": capture(), "concurrency": setup.concurrency, "limits": setup.limits,
               "grid_layouts": specs,
               "grid_left_out": left_out, "repeats": setup.repeats, "duration_s": setup.duration,
               "p99_ms": setup.p99_ms, "background_load": asked, "mixes": {}}
    print(f"grid: {len(specs)} layouts ({len(left_out)} one-process duplicates left out) x {setup.repeats} rounds "
          f"of {setup.duration:g} s at {setup.concurrency} connections, per mix; then tune on {setup.share:.0%} of "
          "the grid's time" + (f"; a background load of {setup.background_load:g} of one core throughout"
                               if setup.background_load else ""), flush=True)
    failed = False
    try:
        with sigterm_interrupts(), (neighbour if neighbour is not None else contextlib.nullcontext()):
            for mix in setup.mixes:
                data = one_mix(setup, mix, specs, out)
                if data is None:
                    failed = True
                    break
                summary["mixes"][mix] = data
                (out / "accuracy.json").write_text(json.dumps(summary, indent=2) + "\n")
                print("\n".join(summary_lines(mix, data)), flush=True)
    finally:
        if neighbour is not None:  # stopped by now, on every path: the share of one core it took
            summary["background_load"] = neighbour.record()
            (out / "accuracy.json").write_text(json.dumps(summary, indent=2) + "\n")
    if failed:
        return 1
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
        grid, grid_s = run_grid(mix, specs, setup.concurrency, setup.repeats, setup.duration, out / f"grid-{mix}",
                                setup.subject, setup.limits)
    budget_min = max(1.0, grid_s * setup.share / 1.1 / 60)  # a 10% overrun still stays within the share
    tune_dir = out / f"tune-{mix}"
    cmd = setup.tune_command(mix, budget_min, tune_dir)
    print(f"tune {mix}: {' '.join(cmd[1:])}", flush=True)
    start = time.monotonic()
    proc = subprocess.run(cmd, text=True, capture_output=True)
    tune_s = time.monotonic() - start
    if tune_dir.exists():
        (tune_dir / "stdout.txt").write_text(proc.stdout + proc.stderr)
    if proc.returncode not in (0, 3):
        print(proc.stdout[-2000:] + proc.stderr[-2000:], file=sys.stderr)
        return None
    data = judge(grid, load(tune_dir / "results.json"), mix)
    return data | {"concurrency": setup.concurrency, "grid_s": grid_s, "grid_from": setup.grids, "tune_s": tune_s,
                   "tune_budget_min": budget_min, "tune_exit": proc.returncode, "time_share": tune_s / grid_s,
                   "loadavg_before": list(load_before), "loadavg_after": list(os.getloadavg()),
                   "grid_cells": len(grid.cells)}


def _ratio(entry: dict | None) -> str:
    if not entry or "ratio" not in entry:
        return "n/a"
    if entry.get("outcome") == "the same layout":
        return "1.00 (the same layout)"
    low, high = entry["ratio_interval"]
    # files judged before the paired judge recorded "within_noise" instead of an outcome
    outcome = entry.get("outcome") or ("within noise" if entry.get("within_noise") else "")
    target = f"; target {entry['target']}" if entry.get("target") else ""
    return f"{entry['ratio']:.2f} ({low:.2f}–{high:.2f}, {outcome}{target})"


def _ref(entry: dict | None, unit: str = "") -> str:
    if not entry:
        return "none meets"
    low, high = entry["rps_range"]
    share = entry.get("throttled_share")  # under a pod's CPU limit: how often the quota held it back
    return f"{entry['spec']} {entry['rps']:.1f} ({low:.1f}–{high:.1f}){unit}" + (
        f", throttled {share:.0%}" if share is not None else "")


def summary_lines(mix: str, d: dict) -> list[str]:
    mine = d["tune_choice_in_grid"]
    return [f"{mix}: tune chose {d['tune_choice']} in {d['tune_s'] / 60:.1f} min ({d['time_share']:.0%} of the grid's "
            f"{d['grid_s'] / 60:.1f} min); in the grid {_ref(mine, ' req/s') if mine else 'n/a'}; against the grid's "
            f"best {_ref(d['best'])}: {_ratio(d['best'])}; best holding {d.get('concurrency', 'N')} requests "
            f"{_ref(d['best_holding_n'])}: {_ratio(d['best_holding_n'])}; fastest {_ref(d['fastest'])}: "
            f"{_ratio(d['fastest'])}"]


def table_lines(summary: dict) -> list[str]:
    """A Markdown table of every mix (what the README quotes): req/s as the grid measured them,
    median (low–high over its repeats); ratios = tune's choice / the reference (95% interval)."""
    load = summary.get("background_load")
    taken = load.get("cpu_share_taken") if load else None
    rows = [f"background load: {load['fraction']:g} of one core asked, "
            + (f"{taken:.2f} taken" if taken is not None else "what it took unknown (the run did not end)")
            if load else "background load: none"]
    limits = summary.get("limits") or {}
    rows += [("inside a pod's limit: " + ", ".join(f"{k} {v:g}" for k, v in limits.items()) + " (every grid layout "
              "and tune's candidates; throttled = median share of CFS periods the quota held the server back)")
             if limits else "no pod limit", ""]
    rows += ["| mix | grid: cells, time | tune: time (share) | tune's choice | the objective's best | ratio | best of "
             "those holding N | ratio | fastest | ratio | load average |", "|" + "---|" * 11]
    for mix, d in summary["mixes"].items():
        mine = d["tune_choice_in_grid"]
        rows.append(f"| {mix} | {d['grid_cells']}, {d['grid_s'] / 60:.1f} min | {d['tune_s'] / 60:.1f} min "
                    f"({d['time_share']:.0%}) | {_ref(mine) if mine else 'none'} | {_ref(d['best'])} | "
                    f"{_ratio(d['best'])} | {_ref(d['best_holding_n'])} | {_ratio(d['best_holding_n'])} | "
                    f"{_ref(d['fastest'])} | {_ratio(d['fastest'])} | {d['loadavg_before'][0]:.1f} → "
                    f"{d['loadavg_after'][0]:.1f} |")
    return rows


def rejudge(directory: Path) -> int:
    """Judge a finished run again from its stored grids and tune runs (nothing measured)."""
    path = directory / "accuracy.json"
    summary = json.loads(path.read_text())
    for mix, d in summary["mixes"].items():
        grid = load(directory / f"grid-{mix}" / "results.json")
        fresh = judge(grid, load(directory / f"tune-{mix}" / "results.json"), mix)
        keep = {k: d[k] for k in ("concurrency", "grid_s", "grid_from", "tune_s", "tune_budget_min", "tune_exit",
                                  "time_share", "loadavg_before", "loadavg_after", "grid_cells") if k in d}
        summary["mixes"][mix] = fresh | keep | {"concurrency": summary["concurrency"]}
        print("\n".join(summary_lines(mix, summary["mixes"][mix])))
    path.write_text(json.dumps(summary, indent=2) + "\n")
    print("\n" + "\n".join(table_lines(summary)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
