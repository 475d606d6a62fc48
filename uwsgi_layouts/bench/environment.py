"""What the results were measured on: recorded in every results.json.

The machine is part of the evidence: besides what it is (``capture``), how busy it was, at the
start and during the run (``Machine``): the load average, the share of CPU time the hypervisor
stole from this VM (``/proc/stat``'s steal column, over the time between two samples), the share
of the machine's CPU time that processes other than ours used (busy ticks in ``/proc/stat`` less
the CPU time of this process and everything it started), and the CPU frequency governor where
``/sys`` shows one. ``analysis.machine_cautions`` turns them into cautions.

Why "others" and not the load average during the run: the run's own wrk, nginx and app server
keep every core busy, so the load average while it measures says how hard it works, not whether a
neighbour shared the cores; it is recorded, and judged only at the start, before the run loads
the machine.
"""

from __future__ import annotations

import glob
import os
import platform
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil

from uwsgi_layouts.bench.load.wrk import FINE_FROM_US, HISTOGRAM_DIGITS
from uwsgi_layouts.deploy.machine import PACKAGE_DIR, cpu_limit
from uwsgi_layouts.deploy.run import nginx_binary, uwsgi_binary


def _first_line(cmd: list[str]) -> str:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "not found"
    text = (proc.stdout + proc.stderr).strip()
    return text.splitlines()[0] if text else "unknown"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _git_commit() -> str:
    commit = _first_line(["git", "-C", str(PACKAGE_DIR), "rev-parse", "--short=12", "HEAD"])
    if commit in ("not found", "unknown") or "fatal" in commit:
        return "unknown"
    dirty = subprocess.run(["git", "-C", str(PACKAGE_DIR), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    return commit + ("-dirty" if dirty else "")


def _cpu_line(path: str) -> list[int] | None:
    """The aggregate ``cpu`` line of /proc/stat as ticks since boot; None where unreadable."""
    try:
        with open(path) as fh:
            fields = fh.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu" or len(fields) < 5:
        return None
    return [int(x) for x in fields[1:]]


def cpu_ticks(path: str = "/proc/stat") -> tuple[int, int] | None:
    """(steal, total) CPU ticks since boot from the aggregate ``cpu`` line; None where unreadable."""
    values = _cpu_line(path)
    if values is None:
        return None
    # user nice system idle iowait irq softirq steal guest guest_nice: guest time is already in user
    steal = values[7] if len(values) > 7 else 0
    return steal, sum(values[:8])


def busy_ticks(path: str = "/proc/stat") -> tuple[int, int] | None:
    """(busy, total) CPU ticks since boot: busy is every column but idle, iowait and steal (time
    some process of this VM ran); None where unreadable."""
    values = _cpu_line(path)
    if values is None:
        return None
    values = values[:8]
    idle = values[3] + (values[4] if len(values) > 4 else 0) + (values[7] if len(values) > 7 else 0)
    return sum(values) - idle, sum(values)


def own_cpu_s() -> float:
    """CPU seconds used by this process and every process it started, the ended ones included
    (reaped children's times, which their parents collect in turn: a stopped stack's workers are in
    its master's, the master's in ours)."""
    me = psutil.Process()
    total = 0.0
    for proc in [me, *me.children(recursive=True)]:
        try:
            t = proc.cpu_times()
        except psutil.Error:  # ended while we looked: its time arrives with its parent's children times
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


def others_share(before: tuple[int, int] | None, after: tuple[int, int] | None, own_s: float,
                 tick_s: float | None = None) -> float | None:
    """The share of the machine's CPU time (all cores) that other processes used between two
    ``busy_ticks`` readings, while ours used ``own_s`` seconds."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    tick_s = tick_s or 1 / os.sysconf("SC_CLK_TCK")
    busy_s = (after[0] - before[0]) * tick_s
    total_s = (after[1] - before[1]) * tick_s
    return min(1.0, max(0.0, (busy_s - own_s) / total_s))


def steal_share(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    if before is None or after is None or after[1] <= before[1]:
        return None
    return max(0, after[0] - before[0]) / (after[1] - before[1])


def governor(root: str = "/sys/devices/system/cpu") -> str | None:
    """The CPU frequency governor(s), e.g. "performance" or "ondemand, performance"; None where the
    machine shows none (most VMs)."""
    found = set()
    for path in glob.glob(f"{root}/cpu[0-9]*/cpufreq/scaling_governor"):
        try:
            found.add(Path(path).read_text().strip())
        except OSError:
            continue
    return ", ".join(sorted(found)) if found else None


class Machine:
    """Samples of how busy the machine was while a run measured. ``sample()`` after each block;
    ``record()`` is what results.json stores under ``environment["machine"]``."""

    def __init__(self, clock=time.monotonic, ticks=cpu_ticks, loadavg=os.getloadavg, busy=busy_ticks,
                 own=own_cpu_s):
        self.clock, self.ticks, self.loadavg, self.busy, self.own = clock, ticks, loadavg, busy, own
        self.t0 = clock()
        self.last = ticks()
        self.last_busy, self.last_own = busy(), own()
        self.samples: list[dict] = []
        self.governor = governor()

    def sample(self) -> dict:
        now, busy, own = self.ticks(), self.busy(), self.own()
        entry = {"t_s": round(self.clock() - self.t0, 1), "loadavg_1m": round(self.loadavg()[0], 2),
                 "steal": _rounded(steal_share(self.last, now)),
                 "others": _rounded(others_share(self.last_busy, busy, own - self.last_own))}
        self.last, self.last_busy, self.last_own = now, busy, own
        self.samples.append(entry)
        return entry

    def record(self) -> dict:
        return {"governor": self.governor, "samples": list(self.samples)}


def _rounded(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def _at_start(window_s: float = 0.5) -> tuple[float | None, float | None]:
    """(steal, others' share of the CPU) over a short window before the run loads the machine.
    Why not the load average: it is a one-minute average, still high for a while after an earlier
    run ended; this window shows what runs now."""
    before, busy_before, own_before = cpu_ticks(), busy_ticks(), own_cpu_s()
    time.sleep(window_s)
    steal = steal_share(before, cpu_ticks())
    others = others_share(busy_before, busy_ticks(), own_cpu_s() - own_before)
    return _rounded(steal), _rounded(others)


def capture() -> dict:
    steal, others = _at_start()
    return {
        "nproc": os.cpu_count(),
        # What this process may use, apart: the host's CPUs, its affinity's, its cgroup's quota.
        "cpu_limit": cpu_limit().to_dict(),
        "cpu_model": _cpu_model(),
        "loadavg_at_start": list(os.getloadavg()),
        "steal_at_start": steal,
        "others_at_start": others,
        "cpu_governor": governor(),
        "kernel": platform.release(),
        "python": sys.version.split()[0],
        "uwsgi": _first_line([uwsgi_binary(), "--version"]),
        "nginx": _first_line([nginx_binary(), "-v"]).replace("nginx version: ", ""),
        "wrk": _first_line(["wrk", "-v"]).split("[")[0].strip(),
        # How the cells' latency histograms are rounded (bench.load.wrk.round_latency); files
        # without it kept 3 significant digits throughout (those of 8ec82be alone: 4 throughout).
        "histogram_digits": {"digits": HISTOGRAM_DIGITS, "from_us": FINE_FROM_US},
        "git_commit": _git_commit(),
        "hostname": socket.gethostname(),
    }
