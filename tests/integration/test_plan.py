"""``uwsgi-layouts plan`` for real: one replica under a 0.5-CPU quota, real nginx, uWSGI and
httperf. The demo app sleeping 125 ms on one thread serves at most 8 req/s whatever the CPU, so
the ladder ends on its second step (6 req/s met, 9 falls behind): the plan follows its arithmetic
from the rate that met the p99, each step held the requests it was sized for, ``report DIR``
re-renders it, and nothing is left running. The request comes from a ``--requests`` file, as
compare takes one. A p99 below the request's own 100 ms is met at no rate (6, 4, 2.67 req/s tried:
down the ladder from the first): one line, exit 2, with the best p99 seen.

httperf busy-polls a core through every step (each at least 15 s), so a step costs up to a
CPU-second a second: hence two steps where two prove the ladder and its end."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from uwsgi_layouts.deploy.machine import homes
from uwsgi_layouts.deploy.run import existing_cgroups

HOMES, WHY = homes()
pytestmark = [pytest.mark.integration, pytest.mark.timeout(300),
              pytest.mark.skipif(HOMES is None, reason=f"no writable cgroup controller: {WHY}")]
REPO = Path(__file__).resolve().parents[2]
LEFTOVER_NOTE = re.compile(r"removed cgroup ul-[\w-]+ left by a run that died \(pid \d+\): ")
SLEEPY = "/?rounds=1&fib=1&io_ms=100"  # 100 ms per request, almost no CPU: ~10 req/s on one thread
# 125 ms per request: 8 req/s on one thread, between the ladder's first two rates (6 at 75% of it,
# 9 an eighth over it: its replies fall behind by far more than the 3% a step may)
SLOWER = "/?rounds=1&fib=1&io_ms=125"


def plan(out: Path, *args: str) -> subprocess.CompletedProcess:
    """The command run to its end; every cgroup it made (named with its pid) is gone after."""
    proc = subprocess.Popen([sys.executable, "-m", "uwsgi_layouts", "plan", "--layout", "1x1-mapped@cpus=0.5",
                             "--start", "6", "--bisections", "0", "--warmup", "1", "--out", str(out), *args],
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
    assert [s["rate"] for s in steps] == [6, 9]  # x1.5 up the ladder, no bisection (--bisections 0)
    assert steps[-1]["verdict"] == "fail" or steps[-1]["p99_ms"] > 1500  # the ladder ended on a miss
    for s in steps:  # every step held >= 90 requests, all timed from nginx's log (one per connection httperf opened)
        assert s["step_s"] % 5 == 0 and s["rate"] * s["step_s"] >= 90, s
        assert s["requests_logged"] >= 0.99 * s["rate"] * s["step_s"], s
        assert s["busy_ratio"] is not None and 0 <= s["busy_ratio"] <= 1
        assert s["cpu_share"] is not None and s["cpu_share"] < 0.5  # sleeping, not computing
        assert s["kept_up"] is not None and s["errors"] >= 0
        assert s["client_cpu_pct"] is not None  # httperf's own CPU, which says whether it waited for the CPU
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
    (out / "report.txt").unlink()
    again = subprocess.run([sys.executable, "-m", "uwsgi_layouts", "report", str(out)], cwd=REPO, capture_output=True,
                           text=True, timeout=60)
    assert again.returncode == 0, again.stderr
    assert (out / "report.txt").read_text() == report


def test_a_p99_no_rate_meets_is_one_line_exit_2(tmp_run_dir, leftover_processes):
    out = tmp_run_dir / "plan"
    res = plan(out, "--rate", "20", "--p99-ms", "50", "--path", SLEEPY, "--min-requests", "40")
    assert res.returncode == 2, res.stdout[-3000:] + res.stderr[-3000:]
    # Besides the error, only what any run on this machine says when it removes a cgroup another
    # run left behind (a run killed elsewhere on the machine, earlier or at the same time).
    *notes, line = res.stderr.strip().splitlines()
    assert all(LEFTOVER_NOTE.match(note) for note in notes), res.stderr
    assert "p99_ms: one replica of 1x1-mapped@cpus=0.5 cannot keep p99 within 50 ms" in line
    assert "best p99 seen" in line and "(from 2.67 req/s)" in line, line
    data = json.loads((out / "plan.json").read_text())
    # down the ladder from the first rate before saying no rate meets it; none beats the 100 ms sleep
    assert data["plan"] is None and [s["rate"] for s in data["steps"]] == [6, 4, 2.67]
    assert all(s["p99_ms"] >= 100 for s in data["steps"])
    assert data["judgement"] == {"met": [], "next_miss": None, "validation": None}
    assert leftover_processes([str(out)], timeout=5) == []
