"""What the in-flight sampler costs: throughput with and without it, interleaved, in one run.

One stack (default 2x4-mapped, the article's mix, 2P connections) stays up; cells alternate the
sampler off and on in ABBA order (off on, on off, off on, ...) so a drifting machine hits both
alike. Each cell is measured exactly as ``compare`` measures one (``LiveRunner.measure``), only
the sampler rate differs. Prints each pair, the throughput ratio on / off (median and low–high
over pairs), the noise of the machine meanwhile (spread of the sampler-off cells alone) and the
sampler thread's own CPU; saves every cell as a compare results file (scenarios
``article-sampler-off`` / ``article-sampler-25hz``) that ``uwsgi-layouts report`` renders.

    .venv/bin/python scripts/sampler-cost.py [--pairs 8] [--duration 10] [--hz 25] [--out DIR]
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import shlex  # noqa: E402

from one_stack import abba, pair_ratios, stack_options, the_stack  # noqa: E402

from uwsgi_layouts.bench.environment import capture  # noqa: E402
from uwsgi_layouts.bench.kinds.base import RESULTS_NAME, sigterm_interrupts  # noqa: E402
from uwsgi_layouts.bench.kinds.closedloop import LiveRunner  # noqa: E402
from uwsgi_layouts.bench.load.wrk import run_wrks  # noqa: E402
from uwsgi_layouts.bench.options import prepare_out  # noqa: E402
from uwsgi_layouts.bench.paired import judge_ratios  # noqa: E402
from uwsgi_layouts.bench.results import Results, utc_now  # noqa: E402
from uwsgi_layouts.bench.stack import Lab, dir_name  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = stack_options(__doc__.split("\n\n")[0])
    p.add_argument("--hz", type=float, default=25.0)
    p.add_argument("--out")
    args = p.parse_args(argv)
    processes, threads, level, scenario = the_stack(args)
    out = prepare_out(args.out)
    labels = {0.0: f"{args.scenario}-sampler-off", args.hz: f"{args.scenario}-sampler-{args.hz:g}hz"}
    cells = []
    with Lab() as lab, sigterm_interrupts():
        runner = LiveRunner(lab, out / "raw", {args.scenario: scenario}, args.duration, 2.0, 10.0)
        with lab.stack(args.layout, name=dir_name(args.layout)) as stack:
            (probe,), _ = run_wrks(runner.main_load(stack.layout, scenario, 1, 2.0))  # warm-up + unloaded latency
            for pair in range(1, args.pairs + 1):
                for hz in abba(pair, 0.0, args.hz):
                    runner.inflight_hz = hz
                    cell = runner.measure(stack, stack.layout, scenario, level, pair, probe.latency_ms.p50,
                                          label=args.layout)
                    stack.check_alive()
                    cells.append(dataclasses.replace(cell, scenario=labels[hz]))
                    print(f"pair {pair} sampler {'off' if not hz else f'{hz:g} Hz'}: {cell.rps:.2f} req/s"
                          + (f", {cell.inflight['samples']} samples, sampler CPU {cell.inflight['sampler_cpu_s']:.3f} s"
                             if cell.inflight else ""), flush=True)
    results = Results(environment=capture(), cells=tuple(cells), created=utc_now(),
                      arguments={"layouts": [args.layout], "concurrency": [level], "repeats": args.pairs,
                                 "duration": args.duration, "processes": processes, "threads": threads,
                                 "inflight_hz": args.hz,
                                 "command": "python scripts/sampler-cost.py " + shlex.join(sys.argv[1:] if argv is None
                                                                                           else argv)},
                      workload={label: scenario.to_dict() for label in labels.values()})
    results.save(out / RESULTS_NAME)
    for line in summary(cells, labels[0.0], labels[args.hz], args.duration):
        print(line)
    print(f"wrote {out / RESULTS_NAME}")
    return 0


def summary(cells, off_label: str, on_label: str, duration: float) -> list[str]:
    ratios = pair_ratios(cells, off_label, on_label)
    off = [c.rps for c in cells if c.scenario == off_label]
    on = [c.rps for c in cells if c.scenario == on_label]
    cpu = [c.inflight["sampler_cpu_s"] / duration for c in cells if c.scenario == on_label and c.inflight]
    if not ratios:
        return ["no complete pair: nothing to compare"]
    med = statistics.median(ratios)
    noise = (max(off) - min(off)) / statistics.median(off) if len(off) > 1 else 0.0
    # Judged as every comparison of this tool is (bench.paired): the paired interval of on / off.
    c = judge_ratios(ratios, higher_is_better=True, figure="rps")
    verdict = {"equivalent": "equivalent (the sampler costs less than the margin)",
               "worse": "the sampler costs throughput beyond noise", "better": "faster with the sampler (noise?)",
               "undecided": "undecided: measure more pairs"}[c.outcome] + f": {c.describe()}"
    return [
        f"throughput off: median {statistics.median(off):.2f} req/s ({min(off):.2f}–{max(off):.2f}); "
        f"on: median {statistics.median(on):.2f} req/s ({min(on):.2f}–{max(on):.2f})",
        f"on / off per pair: median {med:.3f} ({min(ratios):.3f}–{max(ratios):.3f}) over {len(ratios)} pairs: "
        f"sampler cost {1 - med:+.1%} of throughput",
        f"machine noise meanwhile: sampler-off cells spread {noise:.0%} (high - low) / median",
        f"verdict: {verdict}"
        + (f"; the sampler thread itself used {statistics.median(cpu):.2%} of one core (median)" if cpu else ""),
    ]


if __name__ == "__main__":
    sys.exit(main())
