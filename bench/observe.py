"""Observers of a running stack: what its processes, its stats server and its logs show.

Nothing here starts or stops anything (``bench.stack`` does); every function reads:

- CPU seconds of the uWSGI and nginx process trees (``tree_cpu_seconds``, ``Snapshot``);
- requests served per uWSGI worker, from the stats server (``worker_requests``, ``Snapshot``),
  and over time in the background (``Sampler``: pids, request counters, accepting flags);
- how nginx's workers share the clients (``nginx_workers``, ``busiest_connections``,
  ``spread_extra``);
- nginx's error and access logs (``error_kinds``, ``access_log``).
"""

from __future__ import annotations

import re
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

import psutil

from deploy.errors import StackError
from deploy.stack import Stack, read_stats

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


@dataclass
class Snapshot:
    """Per-worker request counters and the CPU of every app server tree and of nginx at one
    moment; with several app hosts, the requests per host too (workers numbered host after host)."""

    workers: dict[str, int]
    uwsgi_cpu: float
    nginx_cpu: float
    hosts: dict[str, int] = field(default_factory=dict)

    @classmethod
    def take(cls, stack: Stack) -> "Snapshot":
        workers: dict[str, int] = {}
        hosts: dict[str, int] = {}
        for host, stats in stack.host_stats().items():
            counts = worker_requests(stats, first=len(workers))
            workers |= counts
            hosts[host] = sum(counts.values())
        return cls(workers, sum(tree_cpu_seconds(pid) for pid in stack.app_pids),
                   tree_cpu_seconds(stack.pids["nginx"]), hosts if len(hosts) > 1 else {})


# --------------------------------------------------------------------------- the stats server over time


@dataclass
class Sample:
    t: float  # seconds since the sampler started
    workers: dict[int, tuple[int, int, int]]  # id -> (pid, requests, accepting)


class Sampler:
    """Polls the uWSGI stats server in the background (every ``interval`` s): worker pids,
    request counters and accepting flags over time."""

    def __init__(self, stats_address: str, interval: float = 0.1, namespace: str = ""):
        self.address = stats_address
        self.namespace = namespace  # the network namespace the stats server is in ("" = here)
        self.interval = interval
        self.samples: list[Sample] = []
        self.t0 = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                stats = read_stats(self.address, timeout=1.0, namespace=self.namespace)
                workers = {w["id"]: (w["pid"], w["requests"], w.get("accepting", 0)) for w in stats["workers"]}
                self.samples.append(Sample(time.monotonic() - self.t0, workers))
            except (OSError, ValueError, KeyError):
                pass
            self._stop.wait(self.interval)

    def __enter__(self) -> "Sampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def now(self) -> float:
        return time.monotonic() - self.t0

    def wait_flowing(self, at_least: int, timeout: float = 10.0) -> float:
        """Poll until ``at_least`` more requests were served than when called; return the time."""
        base = None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.samples:
                total = sum(r for _, r, _ in self.samples[-1].workers.values())
                base = total if base is None else base
                if total - base >= at_least:
                    return self.samples[-1].t
            time.sleep(self.interval / 2)
        raise StackError(f"requests are not flowing: fewer than {at_least} served in {timeout:.0f} s")

    def served_per_worker(self, t_from: float, t_to: float) -> dict[int, int]:
        """Requests each worker id served between two times. (uWSGI keeps a worker slot's
        counter across respawns; a counter that went down is counted from 0.)"""
        window = [s for s in self.samples if t_from <= s.t <= t_to]
        out: dict[int, int] = {}
        for a, b in zip(window, window[1:], strict=False):
            for wid, (_, req, _) in b.workers.items():
                prev = a.workers.get(wid)
                if prev is not None:
                    out[wid] = out.get(wid, 0) + (req - prev[1] if req >= prev[1] else req)
        return out


# --------------------------------------------------------------------------- nginx's workers


def nginx_workers(master_pid: int) -> list[psutil.Process]:
    """The nginx master's worker processes (its children)."""
    try:
        return psutil.Process(master_pid).children()
    except psutil.Error:
        return []


def client_connections(proc: psutil.Process, port: int) -> int:
    """Established TCP connections ``proc`` holds on local ``port`` (accepted clients)."""
    try:
        return sum(1 for c in proc.net_connections(kind="tcp")
                   if c.status == psutil.CONN_ESTABLISHED and c.laddr and c.laddr.port == port)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return 0


def busiest_connections(workers: list[psutil.Process], port: int, running: Callable[[], bool], deadline: float,
                        interval: float = 0.25) -> list[int]:
    """While ``running()`` (and before the monotonic ``deadline``), count each nginx worker's
    client connections every ``interval`` s; keep the sample with the most connections in total
    (wrk opens its connections once)."""
    best: list[int] = [0] * len(workers)
    while running() and time.monotonic() < deadline:
        sample = [client_connections(w, port) for w in workers]
        if sum(sample) > sum(best):
            best = sample
        time.sleep(interval)  # sampling interval while the load runs, not a readiness wait
    return best


def spread_extra(conns: list[int], cpu: list[float]) -> dict:
    """Per-nginx-worker figures for a cell's ``extra``: connections (the busiest sample) and
    CPU seconds, each sorted high to low, and the busiest worker's share of each."""
    conns, cpu = sorted(conns, reverse=True), sorted((round(c, 4) for c in cpu), reverse=True)
    return {
        "nginx_workers": len(conns),
        "nginx_worker_conns": conns,
        "nginx_worker_cpu_s": cpu,
        "nginx_conn_max_share": conns[0] / sum(conns) if conns and sum(conns) else 0.0,
        "nginx_cpu_max_share": cpu[0] / sum(cpu) if cpu and sum(cpu) else 0.0,
    }


# --------------------------------------------------------------------------- nginx's logs


def nginx_log_lines(stack: Stack, since: int = 0) -> list[str]:
    try:
        data = stack.nginx_log.read_bytes()[since:]
    except OSError:
        return []
    return data.decode("utf-8", "replace").splitlines()


def error_kinds(lines: list[str]) -> Counter:
    """nginx error log lines grouped by their message (pids, times and addresses removed)."""
    kinds = Counter()
    for line in lines:
        m = re.search(r"\[(error|warn|crit|alert|emerg)\] \d+#\d+: \*?\d* ?(.*?)(, client:|$)", line)
        if m:
            text = re.sub(r"unix:/\S+|127\.0\.0\.1:\d+", "ADDR", m[2])
            kinds[f"[{m[1]}] {text}"] += 1
    return kinds


ACCESS_RE = re.compile(r'"(?P<method>[A-Z]+) (?P<uri>\S+)[^"]*" (?P<status>\d{3}) (?P<seconds>[\d.]+) '
                       r'upstream=(?P<upstreams>.*?) upstream_time=')


@dataclass(frozen=True)
class Access:
    method: str
    uri: str
    status: int
    seconds: float
    upstreams: tuple[str, ...]  # more than one: nginx retried the request on another server


def access_log(stack: Stack) -> list[Access]:
    """nginx's access log (rendered with ``access_log``): each request with the upstream(s) it went to."""
    try:
        text = (stack.run_dir / "logs" / "access.log").read_text(errors="replace")
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        m = ACCESS_RE.search(line)
        if m:
            ups = tuple(u.strip() for u in re.split(r"[,:]\s(?=\S)", m["upstreams"]) if u.strip())
            out.append(Access(m["method"], m["uri"], int(m["status"]), float(m["seconds"]), ups))
    return out
