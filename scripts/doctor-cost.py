"""What ``doctor`` (or ``watch``) costs the service it watches: throughput with and without it attached, in pairs.

One stack (default 2x4-mapped, the article's mix, 2P connections) stays up. Each pair is two
cells, doctor detached and attached, in ABBA order (off on, on off, off on, ...) so a drifting
machine hits both alike. A cell is measured exactly as ``compare`` measures one
(``LiveRunner.measure``, compare's own sampler off in both), only doctor differs: for an
"attached" cell ``uwsgi-layouts doctor --stats ADDRESS --for D+2`` runs as a user runs it, in
its own process, and the cell starts once it prints that it is watching. Prints each pair, the
per-pair throughput ratio attached / detached, their geometric mean with the paired interval
every comparison of this tool uses (``bench.paired``: a t interval on the log ratios from 4
pairs), and the verdict against the issue's budget (at most 2% of
throughput): within it only when the whole interval is above 0.98, over it only when the whole
interval is below, else undecided (measure more pairs). Saves every cell as a compare results
file (scenarios ``article-doctor-off`` / ``article-doctor-on``) that ``uwsgi-layouts report``
renders, and each attached doctor's own output under ``doctor/``.

``--tool watch`` measures the Prometheus exporter instead: ``uwsgi-layouts watch --stats ADDRESS``
(at its own default, 2 reads a second) runs through each attached cell, is scraped once at its end (the
figures must be there), and is stopped with SIGTERM (scenarios ``article-watch-off`` / ``-on``).

    .venv/bin/python scripts/doctor-cost.py [--tool doctor|watch] [--pairs 12] [--duration 10] [--hz 25]
                                            [--transport unix|tcp] [--out DIR]

Run it alone on a quiet machine: its figures are ratios of a few percent.
"""

from __future__ import annotations

import dataclasses
import math
import os
import resource
import shlex
import signal
import statistics
import subprocess
import sys
import threading
import urllib.request
from contextlib import nullcontext
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from one_stack import abba, pair_ratios, stack_options, the_stack  # noqa: E402

from uwsgi_layouts.bench.analysis import against  # noqa: E402
from uwsgi_layouts.bench.environment import capture  # noqa: E402
from uwsgi_layouts.bench.kinds.base import RESULTS_NAME, sigterm_interrupts  # noqa: E402
from uwsgi_layouts.bench.kinds.closedloop import LiveRunner  # noqa: E402
from uwsgi_layouts.bench.kinds.doctor import DEFAULT_HZ as DOCTOR_HZ  # noqa: E402
from uwsgi_layouts.bench.load.wrk import run_wrks  # noqa: E402
from uwsgi_layouts.bench.options import prepare_out  # noqa: E402
from uwsgi_layouts.bench.paired import judge_ratios  # noqa: E402
from uwsgi_layouts.bench.results import Results, utc_now  # noqa: E402
from uwsgi_layouts.bench.stack import Lab, dir_name, find_free_ports  # noqa: E402
from uwsgi_layouts.bench.watchcli import DEFAULT_HZ as WATCH_HZ  # noqa: E402

BUDGET = 0.98  # attached / detached throughput, at least (the issue: at most 2% of throughput)
START_TIMEOUT_S = 30.0


class Attached:
    """``uwsgi-layouts doctor`` on the stack's stats server for one cell, in its own process:
    entered once it prints that it is watching; left once it has exited (its CPU is then known)."""

    ready = "doctor: watching"

    def __init__(self, stats: str, seconds: float, hz: float, out: Path):
        self.cmd = [sys.executable, "-m", "uwsgi_layouts", "doctor", "--stats", stats, "--for", str(math.ceil(seconds)),
                    "--hz", f"{hz:g}", "--out", str(out)]
        self.proc: subprocess.Popen | None = None
        self.cpu_s = 0.0
        self.output = ""

    def __enter__(self) -> "Attached":
        self.before = resource.getrusage(resource.RUSAGE_CHILDREN)
        self.proc = subprocess.Popen(self.cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        first: list[str] = []
        reader = threading.Thread(target=lambda: first.append(self.proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(START_TIMEOUT_S)
        if not first or not first[0].startswith(self.ready):
            self.stop()
            raise RuntimeError(f"{self.cmd[3]} did not start watching within {START_TIMEOUT_S:g} s: {''.join(first)}"
                               f"{self.output}")
        return self

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
        if self.proc:
            self.output += self.proc.communicate()[0] or ""

    def end(self) -> None:
        """Called when the cell is over: doctor ends its window on its own."""

    def __exit__(self, *exc) -> None:
        try:
            self.end()
            rest, _ = self.proc.communicate(timeout=START_TIMEOUT_S + 60)
            self.output += rest or ""
        finally:
            self.stop()
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        self.cpu_s = (after.ru_utime - self.before.ru_utime) + (after.ru_stime - self.before.ru_stime)
        if exc[0] is None and self.proc.returncode != 0:
            raise RuntimeError(f"{self.cmd[3]} exited with {self.proc.returncode}:\n{self.output[-2000:]}")


class AttachedWatch(Attached):
    """``uwsgi-layouts watch`` on the stack's stats server through one cell: scraped once when the
    cell is over (its metrics must be there), then stopped with SIGTERM (it runs until told)."""

    ready = "watch: serving metrics"

    def __init__(self, stats: str, seconds: float, hz: float, out: Path):
        super().__init__(stats, seconds, hz, out)
        self.port = find_free_ports(1)[0]
        self.cmd = [sys.executable, "-m", "uwsgi_layouts", "watch", "--stats", stats, "--hz", f"{hz:g}", "--listen",
                    f"127.0.0.1:{self.port}"]

    def end(self) -> None:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=10) as r:
            if b"uwsgi_layouts_up{" not in r.read():
                raise RuntimeError("watch served no uwsgi_layouts_up")
        self.proc.send_signal(signal.SIGTERM)


TOOLS = {"doctor": (Attached, DOCTOR_HZ), "watch": (AttachedWatch, WATCH_HZ)}  # each at its own default


def main(argv: list[str] | None = None) -> int:
    p = stack_options(__doc__.split("\n\n")[0], pairs=12)
    p.add_argument("--tool", default="doctor", choices=sorted(TOOLS), help="what to attach (default doctor)")
    p.add_argument("--hz", type=float,
                   help=f"its reads per second (default: doctor {DOCTOR_HZ:g}, watch {WATCH_HZ:g}, their own defaults)")
    # unix by default, as deploy's layouts and bundles are: doctor then also reads each socket's
    # listen queue from the kernel (sock_diag) at every sample, the heavier case.
    p.add_argument("--transport", default="unix", choices=("tcp", "unix"))
    p.add_argument("--out")
    args = p.parse_args(argv)
    processes, threads, level, scenario = the_stack(args)
    tool, default_hz = TOOLS[args.tool]
    hz = args.hz or default_hz
    out = prepare_out(args.out, f"-{args.tool}-cost")
    labels = {False: f"{args.scenario}-{args.tool}-off", True: f"{args.scenario}-{args.tool}-on"}
    cells, doctor_cpu = [], []
    environment = capture()  # before the first cell: its loadavg_at_start is the run's start
    load_before = os.getloadavg()
    with Lab() as lab, sigterm_interrupts():
        runner = LiveRunner(lab, out / "raw", {args.scenario: scenario}, args.duration, 2.0, 10.0)
        runner.inflight_hz = 0.0  # compare's own sampler off in both arms: only the attached tool differs
        with lab.stack(args.layout, name=dir_name(args.layout), transport=args.transport) as stack:
            (probe,), _ = run_wrks(runner.main_load(stack.layout, scenario, 1, 2.0))  # warm-up + unloaded latency
            for pair in range(1, args.pairs + 1):
                for attached in abba(pair, False, True):
                    doctor = tool(stack.layout.stats_address, args.duration + 2, hz,
                                  out / args.tool / f"pair-{pair}") if attached else nullcontext()
                    with doctor:
                        cell = runner.measure(stack, stack.layout, scenario, level, pair, probe.latency_ms.p50,
                                              label=args.layout)
                    if attached:
                        doctor_cpu.append(doctor.cpu_s)
                    stack.check_alive()
                    cells.append(dataclasses.replace(cell, scenario=labels[attached]))
                    print(f"pair {pair} {args.tool} {'attached' if attached else 'detached'}: {cell.rps:.2f} req/s"
                          + (f", {args.tool} process CPU {doctor_cpu[-1]:.2f} s" if attached else ""), flush=True)
    command = "python scripts/doctor-cost.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    results = Results(environment={**environment, "loadavg_at_end": list(os.getloadavg())}, cells=tuple(cells),
                      created=utc_now(), workload={label: scenario.to_dict() for label in labels.values()},
                      arguments={"layouts": [args.layout], "concurrency": [level], "repeats": args.pairs,
                                 "duration": args.duration, "processes": processes, "threads": threads,
                                 f"{args.tool}_hz": hz, "transport": args.transport, "command": command})
    results.save(out / RESULTS_NAME)
    for line in summary(cells, labels[False], labels[True], doctor_cpu, args.duration, load_before, args.tool):
        print(line)
    print(f"wrote {out / RESULTS_NAME}")
    return 0


def summary(cells, off_label: str, on_label: str, doctor_cpu: list[float], duration: float,
            load_before: tuple[float, ...], tool: str = "doctor") -> list[str]:
    ratios = pair_ratios(cells, off_label, on_label)
    if not ratios:
        return ["no complete pair: nothing to compare"]
    off = [c.rps for c in cells if c.scenario == off_label]
    # The paired rounds' interval, as every decision of this tool takes it (bench.paired), and the
    # budget judged on the whole interval (analysis.against): met only when all of it is above 0.98.
    c = judge_ratios(ratios, higher_is_better=True, figure="rps")
    mean, low, high = c.ratio, c.low, c.high
    state = against(c, BUDGET, at_most=False)
    if state == "met":
        verdict = f"within the 2% budget: the whole interval is above {BUDGET}"
    elif state == "missed":
        verdict = f"over the 2% budget: the whole interval is below {BUDGET}"
    else:
        verdict = (f"undecided: the interval straddles {BUDGET}; measure more pairs (--pairs {2 * len(ratios)}) or "
                   "on a quieter machine")
    noise = (max(off) - min(off)) / statistics.median(off) if len(off) > 1 else 0.0
    return [
        "attached / detached per pair: " + " ".join(f"{r:.3f}" for r in ratios),
        f"geometric mean {mean:.3f} ({low:.3f}-{high:.3f}; {c.how()}) over {len(ratios)} pairs: "
        f"throughput {mean - 1:+.1%} with {tool} attached",
        f"verdict: {verdict}",
        f"machine meanwhile: detached cells spread {noise:.0%} (high - low) / median; load average "
        f"{load_before[0]:.2f} at the start, {os.getloadavg()[0]:.2f} at the end",
        (f"doctor's whole process (start, {duration + 2:g}-s window, report and plot) used " if tool == "doctor" else
         f"{tool}'s whole process (start, the cell, a scrape, stop) used ")
        + f"{statistics.median(doctor_cpu):.2f} CPU-s per attached cell (median)" if doctor_cpu else "",
    ]


if __name__ == "__main__":
    sys.exit(main())
