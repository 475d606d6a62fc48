"""Does httperf in its lowest-priority cgroup time requests as it does where it ran before?

``plan`` and ``openloop`` run httperf in a cgroup of its own at the lowest CPU priority when the
stack has a CPU quota (bench.load.generator): it gets only the CPU the stack leaves idle. A
generator that waits for the CPU sends late and reads replies late, so its own connection times
grow. This measures that on one stack (default ``1x2-mapped@cpus=0.5``) at a trivial request and
a low rate, where the stack leaves most of the machine idle: steps alternate the two places in
ABBA order (own cgroup, niced; niced, own cgroup; ...) so a drifting machine hits both alike.
Per step: httperf's connection time (median, mean, max: it prints no percentile), the p99 nginx
logged for the same requests ($request_time, which does not see the generator's delays), and
httperf's own CPU (% of one core over its run).

    .venv/bin/python scripts/loadgen-latency.py [--layout 1x2-mapped@cpus=0.5] [--rate 20]
        [--step 15] [--pairs 3] [--path '/?rounds=1&fib=1&io_ms=0']
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from uwsgi_layouts.bench.capacity import p99_ms  # noqa: E402
from uwsgi_layouts.bench.kinds.base import sigterm_interrupts  # noqa: E402
from uwsgi_layouts.bench.kinds.plan import request_times  # noqa: E402
from uwsgi_layouts.bench.load import httperf  # noqa: E402
from uwsgi_layouts.bench.load.generator import NICED, OWN_CGROUP, GeneratorPlace, placed  # noqa: E402
from uwsgi_layouts.bench.load.wrk import WrkProcess, run_wrks  # noqa: E402
from uwsgi_layouts.bench.options import require_tools  # noqa: E402
from uwsgi_layouts.bench.stack import Lab, dir_name  # noqa: E402
from uwsgi_layouts.bench.subject import VALIDATE_RUN_DIR  # noqa: E402
from uwsgi_layouts.deploy.model import LayoutError, parse_variant  # noqa: E402


def one_step(stack, place: GeneratorPlace, a) -> dict:
    layout = stack.layout
    log = Path(layout.run_dir) / "logs" / "access.log"
    offset = log.stat().st_size if log.exists() else 0
    cmd = httperf.command(layout.listen_port, a.path, a.rate, a.step, 5, nice=19)
    parsed = httperf.parse(httperf.run(cmd, a.step * 2 + 40, place.join_files))
    c = parsed.get("connection_ms", {})
    return {"place": place.kind, "median": c.get("median"), "avg": c.get("avg"), "max": c.get("max"),
            "nginx_p99": p99_ms(request_times(log, offset)), "cpu": parsed.get("client_cpu_pct"),
            "replies": parsed["replies"], "requests": parsed["requests"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layout", default="1x2-mapped@cpus=0.5")
    p.add_argument("--rate", type=float, default=20.0)
    p.add_argument("--step", type=float, default=15.0)
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--path", default="/?rounds=1&fib=1&io_ms=0")  # the demo app, next to no work
    a = p.parse_args(argv)
    if a.pairs < 1 or a.rate <= 0 or a.step <= 0:
        p.error("--pairs must be 1 or more, --rate and --step above 0")
    try:  # without a quota both arms would be niced: nothing to compare
        quota = parse_variant(a.layout, run_dir=VALIDATE_RUN_DIR).cpus is not None
    except LayoutError as e:
        p.error(f"--layout: {e}")
    if not quota:
        p.error("--layout: needs a CPU quota (@cpus=N): without one httperf is niced in both arms")
    require_tools("httperf", "wrk")
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    rows = []
    with Lab() as lab, sigterm_interrupts(), lab.stack(a.layout, name=dir_name(a.layout), access_log="on") as stack:
        run_wrks(WrkProcess(f"http://{stack.layout.listen}{a.path}", 1, 2, timeout_s=5))  # warm-up
        for pair in range(a.pairs):
            order = ("own", "niced") if pair % 2 == 0 else ("niced", "own")
            for kind in order:
                if kind == "own":
                    with placed(stack.layout) as place:
                        row = one_step(stack, place, a)
                else:
                    row = one_step(stack, GeneratorPlace(NICED), a)
                rows.append(row)
                print(f"  {row['place']:>10}: connection ms median {row['median']} avg {row['avg']} max "
                      f"{row['max']}; nginx p99 {row['nginx_p99']} ms; httperf CPU {row['cpu']}%; "
                      f"{row['replies']}/{row['requests']} replies", flush=True)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for kind in (OWN_CGROUP, NICED):
        mine = [r for r in rows if r["place"] == kind]
        print(f"{kind:>10}: median of medians {statistics.median(r['median'] for r in mine):g} ms, "
              f"largest max {max(r['max'] for r in mine):g} ms, median nginx p99 "
              f"{statistics.median(r['nginx_p99'] for r in mine):g} ms, median httperf CPU "
              f"{statistics.median(r['cpu'] for r in mine):g}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
