"""What counting answers per X-Worker-Pid header costs wrk: its CPU per request with the count off
and on, interleaved, against one running stack.

The count (report.lua) is how a server without a stats server (gunicorn, granian) gets per-worker
request counts. wrk already copies every answer's headers into Lua for the status classes; the
count adds two table lookups and an increment per answer. One stack stays up (default
2x4-gunicorn, the ``hello`` scenario: the most answers per second, so the largest share of wrk's
work); runs alternate the count off and on in ABBA order (off on, on off, ...) so a drifting
machine hits both alike. Prints each pair and the medians (low–high over pairs) of wrk's CPU per
request and of the throughput ratio on / off. On a noisy machine those runs cannot resolve a cost
this small, so first a micro-benchmark times report.lua's ``response()`` hook itself inside wrk's
own LuaJIT (``os.clock`` around 2 million calls with a typical answer's headers, count off and
on, alternated): the cost of the count per answer in nanoseconds.

    .venv/bin/python scripts/header-cost.py [--layout 2x4-gunicorn] [--pairs 8] [--duration 5]
"""

from __future__ import annotations

import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from one_stack import abba, stack_options, the_stack  # noqa: E402

from uwsgi_layouts.bench.kinds.base import sigterm_interrupts  # noqa: E402
from uwsgi_layouts.bench.load.wrk import LUA_REPORT, WrkProcess, run_wrks, write_script  # noqa: E402
from uwsgi_layouts.bench.stack import Lab, dir_name  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = stack_options(__doc__.split("\n\n")[0], layout="2x4-gunicorn", scenario="hello", duration=5)
    args = p.parse_args(argv)
    _, _, level, scenario = the_stack(args)
    query = scenario.workload.query
    runs: dict[str, list[tuple[float, float, dict]]] = {"off": [], "on": []}  # (us/request, req/s, pids)
    with Lab() as lab, sigterm_interrupts():
        scripts = {"on": LUA_REPORT, "off": write_script(lab.work_dir / "count-off.lua", "count_worker_pids = false\n")}
        micro = {"on": write_script(lab.work_dir / "micro-on.lua", MICRO),
                 "off": write_script(lab.work_dir / "micro-off.lua", "count_worker_pids = false\n" + MICRO)}
        with lab.stack(args.layout, name=dir_name(args.layout)) as stack:
            url = f"{stack.layout.url}?{query}"
            for line in micro_benchmark(url, micro):
                print(line, flush=True)
            run_wrks(WrkProcess(url, level, 2, script=scripts["on"]))  # warm-up
            for pair in range(1, args.pairs + 1):
                for mode in abba(pair, "off", "on"):
                    (run,), cpu = run_wrks(WrkProcess(url, level, args.duration, script=scripts[mode]))
                    stack.check_alive()
                    per_request = 1e6 * cpu / run.requests if run.requests else 0.0
                    runs[mode].append((per_request, run.rps, run.worker_pids))
                    print(f"pair {pair} count {mode}: {run.rps:.0f} req/s, wrk {per_request:.2f} us CPU/request, "
                          f"{len(run.worker_pids)} pids counted", flush=True)
    for line in summary(runs):
        print(line)
    return 0


# Runs in each wrk thread's init(), after report.lua has defined response(): times the hook alone.
MICRO = """
function init(args)
  local headers = {["Server"] = "nginx/1.22.1", ["Date"] = "Mon, 01 Jan 2024 00:00:00 GMT",
                   ["Content-Type"] = "text/plain", ["Content-Length"] = "12", ["Connection"] = "keep-alive",
                   ["X-Worker-Id"] = "0", ["X-Worker-Pid"] = "12345"}
  local n = 2000000
  local t0 = os.clock()
  for i = 1, n do response(200, headers, "Hello, world") end
  io.stderr:write(string.format("MICRO_NS %.2f\\n", (os.clock() - t0) / n * 1e9))
end
"""


def micro_benchmark(url: str, scripts: dict, rounds: int = 3) -> list[str]:
    ns: dict[str, list[float]] = {"off": [], "on": []}
    for _ in range(rounds):
        for mode in ("off", "on"):
            load = WrkProcess(url, 1, 1, script=scripts[mode])
            (run,), _ = run_wrks(load)
            ns[mode] += [float(x) for x in re.findall(r"MICRO_NS ([\d.]+)", run.raw)]
    if not ns["off"] or not ns["on"]:
        return ["micro-benchmark: no timing printed"]
    extra = statistics.median(ns["on"]) - statistics.median(ns["off"])
    return [f"micro-benchmark, response() hook in wrk's LuaJIT: count off {_range(ns['off'], 1)} ns, on "
            f"{_range(ns['on'], 1)} ns per answer ({rounds} runs each): the count adds {extra:.1f} ns per answer"]


def _range(values: list[float], digits: int = 2) -> str:
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}–{max(values):.{digits}f})"


def summary(runs: dict[str, list[tuple[float, float, dict]]]) -> list[str]:
    pairs = min(len(runs["off"]), len(runs["on"]))
    if not pairs:
        return ["no complete pair: nothing to compare"]
    off, on = runs["off"][:pairs], runs["on"][:pairs]
    extra = [b[0] - a[0] for a, b in zip(off, on, strict=True)]
    ratio = [b[0] / a[0] for a, b in zip(off, on, strict=True) if a[0]]
    rps = [b[1] / a[1] for a, b in zip(off, on, strict=True) if a[1]]
    return [
        f"wrk CPU per request, count off: {_range([r[0] for r in off])} us; on: {_range([r[0] for r in on])} us "
        f"(median, low–high over {pairs} pairs)",
        f"on - off per pair: {_range(extra)} us per request; on / off {_range(ratio, 3)}",
        f"throughput on / off per pair: {_range(rps, 3)}",
        "counted pids: off " + ", ".join(str(len(r[2])) for r in off) + "; on " + ", ".join(str(len(r[2])) for r in on),
    ]


if __name__ == "__main__":
    sys.exit(main())
