"""``uwsgi-layouts plan`` for real: one replica under a 0.5-CPU quota, real nginx, uWSGI and
httperf. The demo app sleeping 125 ms on one thread serves at most 8 req/s whatever the CPU, so
on a quiet machine the ladder ends on its second step (6 req/s met, 9 falls behind); on a busy
one it may go down instead, and each rung is checked against the ladder's rule: the plan follows its arithmetic
from the rate that met the p99, each step held the requests it was sized for, ``report DIR``
re-renders it, and nothing is left running. The request comes from a ``--requests`` file, as
compare takes one. A p99 below the request's own 100 ms is met at no rate, and the one-connection
warm-up proves it (every request it timed took 100 ms or more): one line, exit 2, before any step.
(The ladder's own refusal, for what the warm-up cannot rule out, is tested on a modelled replica:
tests/test_capacity_search.py.)

httperf busy-polls a core through every step, and a step lasts at least 15 s (``--step``'s
minimum: the ramp's 5-s sample and two steady ones), so a step costs up to a CPU-second a second:
hence two steps where two prove the ladder and its end, at 90 requests each, what 15 s at 6 req/s
holds."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_cli import cli_in_process
from uwsgi_layouts.bench.capacity import RateStep, next_rate
from uwsgi_layouts.bench.kinds.plan import LATE_RETRIES
from uwsgi_layouts.bench.load.sending import starved
from uwsgi_layouts.deploy.machine import homes
from uwsgi_layouts.deploy.run import existing_cgroups

HOMES, WHY = homes()
pytestmark = [pytest.mark.integration, pytest.mark.timeout(300),
              pytest.mark.skipif(HOMES is None, reason=f"no writable cgroup controller: {WHY}")]
REPO = Path(__file__).resolve().parents[2]
REFUSED_EARLY = re.compile(r"error: (p99_ms: one replica of 1x1-mapped@cpus=0\.5 cannot keep p99 within 25 ms: its "
                           r"fastest request with one connection took ([\d.]+) ms \((\d+) timed in the warm-up"
                           r"(?:, [\d.]+ ms of the warm-up throttled by the quota)?\), and no rate is faster "
                           r"than one connection: give a --p99-ms above it)")
LEFTOVER_NOTE = re.compile(r"removed cgroup ul-[\w-]+ left by a run that died \(pid \d+\): ")
SLEEPY = "/?rounds=1&fib=1&io_ms=100"  # 100 ms per request, almost no CPU: ~10 req/s on one thread
SLEEPIER = "/?rounds=1&fib=1&io_ms=250"  # 250 ms per request: ~4 req/s on one thread
# 125 ms per request: 8 req/s on one thread, between the ladder's first two rates (6 at 75% of it,
# 9 an eighth over it: its replies fall behind by far more than the 3% a step may)
SLOWER = "/?rounds=1&fib=1&io_ms=125"


PLAN = ("plan", "--layout", "1x1-mapped@cpus=0.5", "--start", "6", "--bisections", "0")


def plan(out: Path, *args: str) -> subprocess.CompletedProcess:
    """The command run to its end; every cgroup it made (named with its pid) is gone after."""
    proc = subprocess.Popen([sys.executable, "-m", "uwsgi_layouts", *PLAN, "--warmup", "1", "--out", str(out), *args],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stdout, stderr = proc.communicate(timeout=280)
    assert not [d for d in existing_cgroups() if d.endswith(f"-{proc.pid}")]
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def test_plan_from_one_replica(tmp_run_dir, leftover_processes):
    out = tmp_run_dir / "plan"
    requests = tmp_run_dir / "traffic.txt"
    requests.write_text(f"# the demo app sleeping 125 ms\nGET {SLOWER}\n")
    res = plan(out, "--rate", "20", "--p99-ms", "1500", "--requests", str(requests), "--min-requests", "90")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "pre-flight: 1 distinct requests answered 200" in res.stdout
    data = json.loads((out / "plan.json").read_text())
    assert data["arguments"]["traffic"]["requests"][0]["target"] == SLOWER
    steps = data["steps"]
    # Each rung is the one the ladder's rule gives after the steps before it (x1.5 while every step
    # met the p99, /1.5 while none did; no bisection, --bisections 0), and the search ended where the
    # rule says. On a quiet machine that is [6, 9]: 6 met, 9 fell behind. On 2 cores kept busy by 8
    # other runnable processes, the server's wake-ups come late enough that 6 req/s fell behind (57
    # of 60 replies, p99 881 ms) or missed the p99 (2,075 ms), and the ladder went down to 4, which
    # met it: a measurement of that machine, which the test does not dispute. (At four xdist workers
    # per core httperf itself, at the lowest CPU priority, once had 2-3% of a core and sent in bursts:
    # such a step is now offered again; still late, it is invalid, and a failure of the replica only
    # when its own figures show it at its limit: its thread busy, its quota used or throttled.)
    rungs = [RateStep.from_dict(s) for s in steps]
    assert rungs[0].rate == 6 and len(rungs) >= 2, res.stdout[-3000:]
    for i in range(1, len(rungs)):
        assert rungs[i].rate == next_rate(rungs[:i], 1500, bisections_left=0), res.stdout[-3000:]
    assert next_rate(rungs, 1500, bisections_left=0) is None
    assert any(r.meets(1500) for r in rungs) and any(not r.meets(1500) for r in rungs)
    # whatever the machine's load, no rate above what one thread of 125 ms can serve met the target
    # (it falls behind: the kept-up part of the verdict)
    assert all(r.rate <= 8 for r in rungs if r.meets(1500)), res.stdout[-3000:]
    for s in steps:  # every step held >= 90 requests, all timed from nginx's log (one per connection httperf opened)
        assert s["step_s"] % 5 == 0 and s["rate"] * s["step_s"] >= 90, s
        assert s["requests_logged"] >= 0.99 * s["rate"] * s["step_s"], s
        assert s["busy_ratio"] is not None and 0 <= s["busy_ratio"] <= 1
        assert s["cpu_share"] is not None and s["cpu_share"] < 0.5  # sleeping, not computing
        # an invalid step (late with no steady sample, or client errors) has no kept_up
        assert (s["kept_up"] is not None or s["verdict"] == "invalid") and s["errors"] >= 0
        assert s["client_cpu_pct"] is not None  # httperf's own CPU, which says whether it waited for the CPU
        # invalid only when httperf sent late after every retry (bench.load.sending), and said so
        # (a late step whose replica was at its limit fails instead: bench.load.sending.judge_late)
        assert s["verdict"] != "invalid" or (starved(s["reasons"]) and s["late_tries"] == LATE_RETRIES), s
    assert data["load_generator"].startswith("httperf in a cgroup of its own")  # the layout has a quota
    p = data["plan"]
    met = [s["rate"] for s in steps if s["verdict"] == "pass" and s["p99_ms"] <= 1500]
    assert p["per_replica_rate"] == max(met)
    # what the report states of the steps, stored beside them (bench.readings.judge_plan)
    assert data["judgement"]["met"] == met and data["judgement"]["validation"] is None
    assert p["replicas"] == math.ceil(20 / (p["per_replica_rate"] * 0.8)) + 1
    assert p["pss_mb"] > 0 and p["memory_total_mb"] == pytest.approx(p["pss_mb"] * p["replicas"], abs=0.2)
    report = (out / "report.txt").read_text()
    assert f"PLAN: {p['replicas']} replicas of 1x1-mapped@cpus=0.5" in report and "AUTOSCALER:" in report
    assert "load " in report.splitlines()[0]
    assert leftover_processes([str(out)], timeout=5) == []
    warm = data["warm_up"]  # one connection at 125 ms a request for 1 s: a handful, none faster than the sleep
    # (nginx's millisecond clock may log a request 1 ms short)
    assert warm["fastest_ms"] >= 124 and 0 < warm["timed"] <= 10, warm
    assert report.splitlines()[2].startswith("warm-up: one connection for ")
    (out / "report.txt").unlink()
    again = cli_in_process("report", str(out))
    assert again.returncode == 0, again.stderr
    assert (out / "report.txt").read_text() == report


def test_a_p99_below_the_request_is_refused_after_the_warm_up(tmp_run_dir, leftover_processes):
    """Run in this process (the command as a real process is the test above): 4 s of warm-up time
    about 15 requests of a 250-ms sleep, every one slower than 25 ms: no step is offered. At six
    test workers on 2 cores the quota's throttled time over the warm-up, taken off the fastest
    request, twice left it to the ladder: a 2-s warm-up of the 100-ms sleep against 50 ms, then a
    3-s one against 25 ms (more than 70 ms throttled). A 250-ms sleep leaves 220 ms to take off."""
    out = tmp_run_dir / "plan"
    res = cli_in_process(*PLAN, "--warmup", "4", "--out", str(out), "--rate", "20", "--p99-ms", "25", "--path",
                         SLEEPIER, "--min-requests", "40")
    assert not [d for d in existing_cgroups() if d.endswith(f"-{os.getpid()}")]
    assert res.returncode == 2, res.stdout[-3000:] + res.stderr[-3000:]
    # Besides the error, only what any run on this machine says when it removes a cgroup another
    # run left behind (a run killed elsewhere on the machine, earlier or at the same time).
    *notes, line = res.stderr.strip().splitlines()
    assert all(LEFTOVER_NOTE.match(note) for note in notes), res.stderr
    m = REFUSED_EARLY.fullmatch(line)
    assert m, line
    error, fastest, timed = m[1], float(m[2]), int(m[3])
    # the sleep (to nginx's millisecond); enough requests to prove it (bench.warm_up.MIN_TIMED)
    assert fastest >= 249 and timed >= 10
    assert " req/s for " not in res.stdout  # no step ran
    data = json.loads((out / "plan.json").read_text())
    assert data["plan"] is None and data["steps"] == [] and data["error"] == error
    assert data["warm_up"]["fastest_ms"] == fastest and data["warm_up"]["timed"] == timed
    assert data["warm_up"]["p99_ms"] >= fastest and data["warm_up"]["seconds"] >= 4
    assert data["judgement"] == {"met": [], "next_miss": None, "validation": None}
    report = (out / "report.txt").read_text()
    assert f"NO PLAN: {error}" in report and "no rate offered (the warm-up ruled every rate out)" in report
    assert not list((out / "raw").glob("step-*"))
    assert leftover_processes([str(out)], timeout=5) == []
