"""The app server's and nginx's processes: CPU seconds of their trees, requests per worker, a cell's
snapshot and limit record, and memory (PSS, USS, RSS) per process and per worker."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import psutil

from uwsgi_layouts.deploy.machine import CgroupReading
from uwsgi_layouts.deploy.model import StackError

if TYPE_CHECKING:  # annotations only: watch reads processes without loading the stack machinery
    from uwsgi_layouts.deploy.run import Stack

# --------------------------------------------------------------------------- CPU and requests


def tree_cpu_seconds(pid: int) -> float:
    """user+system CPU of a process and its live descendants (threads included)."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    return sum(cpu_seconds(p) for p in procs)


def cpu_seconds(proc: psutil.Process) -> float:
    try:
        t = proc.cpu_times()
        return t.user + t.system
    except psutil.NoSuchProcess:
        return 0.0


def worker_requests(stats: dict, first: int = 0) -> dict[str, int]:
    """Requests served so far per uWSGI worker id, from the stats server's JSON document
    (ids shifted by ``first``: with several hosts, host i's workers are numbered after host i-1's)."""
    return {str(first + w["id"]): int(w["requests"]) for w in stats["workers"]}


def requests_by_worker(pid_counts: dict, *pid_maps: dict[int, int]) -> tuple[dict[str, int], int]:
    """Answers counted per worker pid (wrk's ``X-Worker-Pid`` count) as requests per worker number,
    with ``pid_maps`` (worker number -> pid, e.g. taken before and after the cell; a pid seen in
    several maps keeps its last number). Returns (counts by worker number as digit strings, in
    order; answers from pids in no map). A worker respawned during the cell keeps its number, as
    uWSGI's slots do: the old and the new pid both count for it."""
    number = {int(pid): n for pids in pid_maps for n, pid in pids.items()}
    counts: dict[int, int] = {}
    unmatched = 0
    for pid, n in pid_counts.items():
        worker = number.get(int(pid))
        if worker is None:
            unmatched += n
        else:
            counts[worker] = counts.get(worker, 0) + n
    return {str(w): counts[w] for w in sorted(counts)}, unmatched


def _worker_pids(stack: Stack) -> dict[int, int]:
    try:
        return stack.worker_pids()
    except (OSError, ValueError, KeyError, StackError):
        return {}


@dataclass
class Snapshot:
    """The CPU of every app server tree and of nginx at one moment, and who the workers are:
    uWSGI's per-worker request counters (stats servers; with several app hosts, workers numbered
    host after host, and the requests per host), or for a server without a stats server its
    workers' pids (its requests are counted from the app's X-Worker-Pid header instead)."""

    workers: dict[str, int]  # uWSGI worker number -> requests served so far; {} without a stats server
    app_cpu: float
    nginx_cpu: float
    pids: dict[int, int] = field(default_factory=dict)  # worker number -> pid, without a stats server
    hosts: dict[str, int] = field(default_factory=dict)  # host -> requests so far, with several hosts
    # The app server's cgroup counters (a layout with @cpus/@memory; the first host's), else None.
    limit: CgroupReading | None = None
    t: float = field(default_factory=time.monotonic)

    @classmethod
    def take(cls, stack: Stack) -> "Snapshot":
        workers: dict[str, int] = {}
        hosts: dict[str, int] = {}
        if stack.layout.has_stats:
            for host, stats in stack.host_stats().items():
                counts = worker_requests(stats, first=len(workers))
                workers |= counts
                hosts[host] = sum(counts.values())
        return cls(workers, sum(tree_cpu_seconds(pid) for pid in stack.app_pids),
                   tree_cpu_seconds(stack.pids["nginx"]), {} if stack.layout.has_stats else _worker_pids(stack),
                   hosts if len(hosts) > 1 else {}, stack.cgroup_reading())


def limit_record(cpus: float | None, memory_mb: int | None, before: CgroupReading | None,
                 after: CgroupReading | None, seconds: float) -> dict:
    """A cell's ``limit`` record (bench.results): the layout's limit and its cgroup's counters
    over the window between two readings ({} without a limit)."""
    if before is None or after is None:
        return {}
    d = after.since(before)
    return {"cpus": cpus, "memory_mb": memory_mb, "periods": d.periods, "throttled_periods": d.throttled_periods,
            "throttled_s": round(d.throttled_s, 4), "cpu_s": round(d.cpu_s, 4), "oom_kills": d.oom_kills,
            "throttled_share": round(d.throttled_periods / d.periods, 4) if d.periods else None,
            "quota_share": round(d.cpu_s / (cpus * seconds), 4) if cpus and seconds > 0 else None}


# --------------------------------------------------------------------------- memory

MB = 1e6  # memory figures are in MB of 10^6 bytes, as every other *_mb figure of a cell


@dataclass(frozen=True)
class ProcessMemory:
    """One process's memory in bytes. PSS (proportional set size) counts each page shared by N
    processes as 1/N, so PSS adds up across processes; USS is what only this process holds
    (freed if it exits); RSS counts shared pages in full, in every process that maps them."""

    pss: int
    uss: int
    rss: int


def process_memory(pid: int) -> ProcessMemory | None:
    """psutil's memory_full_info (from /proc/PID/smaps_rollup); None if the process is gone."""
    try:
        info = psutil.Process(pid).memory_full_info()
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return None
    return ProcessMemory(info.pss, info.uss, info.rss)


def worker_memory(pid: int) -> tuple[str, int] | None:
    """("pss", bytes) when the process's smaps are readable (our own process, or as root), else
    ("rss", bytes) from /proc/PID/statm, which every user may read; None if it is gone."""
    try:
        proc = psutil.Process(pid)
        try:
            return "pss", proc.memory_full_info().pss
        except psutil.AccessDenied:
            return "rss", proc.memory_info().rss
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return None


def tree_memory(root_pid: int) -> dict[int, ProcessMemory]:
    """pid -> memory of a process and its live descendants (threads share their process's)."""
    try:
        root = psutil.Process(root_pid)
        pids = [root.pid, *(p.pid for p in root.children(recursive=True))]
    except psutil.NoSuchProcess:
        return {}
    return {pid: m for pid in pids if (m := process_memory(pid)) is not None}


def memory_record(server: dict[int, ProcessMemory], nginx: dict[int, ProcessMemory], workers: dict[str, int],
                  prefix: str = "app") -> dict:
    """A cell's ``memory`` from process readings: the app server's tree (``server``: master and
    workers) in total, PSS per worker id (``workers``: id -> pid; a worker not in the tree is left
    out), and nginx's tree. MB, rounded to 0.01."""
    def total(tree: dict[int, ProcessMemory], attr: str) -> float:
        return round(sum(getattr(m, attr) for m in tree.values()) / MB, 2)

    record: dict = {}
    if server:
        record.update({f"{prefix}_pss_mb": total(server, "pss"), f"{prefix}_uss_mb": total(server, "uss"),
                       f"{prefix}_rss_mb": total(server, "rss")})
    if nginx:
        record["nginx_pss_mb"] = total(nginx, "pss")
    ordered = sorted(workers.items(), key=lambda kv: int(kv[0]))
    per_worker = {str(w): round(server[pid].pss / MB, 2) for w, pid in ordered if pid in server}
    if per_worker:
        record["worker_pss_mb"] = per_worker
    return record


def stack_memory(stack: Stack) -> dict:
    """The memory of a running stack now: the app server's tree (its workers numbered by
    ``Stack.worker_pids``: uWSGI's stats server, a peer's master's children) and nginx's. With
    several app hosts: every host's tree, workers numbered host after host (as ``Snapshot``)."""
    if len(stack.members) > 1:
        try:
            pids = [w["pid"] for stats in stack.host_stats().values() for w in stats["workers"]]
            workers = {str(i): pid for i, pid in enumerate(pids, 1)}
        except (OSError, ValueError, KeyError):
            workers = {}
    else:
        workers = {str(w): pid for w, pid in _worker_pids(stack).items()}
    server = {pid: m for root in stack.app_pids for pid, m in tree_memory(root).items()}
    return memory_record(server, tree_memory(stack.pids["nginx"]), workers)
