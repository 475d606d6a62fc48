"""Observers of a running stack: what its processes, its stats server and its logs show.

Nothing here starts or stops anything (``bench.stack`` does); every function reads:

- CPU seconds of the app server's (uWSGI, gunicorn, granian) and nginx's process trees
  (``tree_cpu_seconds``, ``Snapshot``);
- memory of the app server's process tree, per worker, and of nginx (``stack_memory``: PSS, USS,
  RSS read by psutil from /proc/PID/smaps_rollup; ``memory_record`` assembles the figures);
- requests served per uWSGI worker, from the stats server (``worker_requests``, ``Snapshot``),
  and over time in the background (``Sampler``: pids, request counters, accepting flags, and
  requests in flight per worker, summarised per cell by ``inflight_summary``); for a server
  without a stats server, from the app's ``X-Worker-Pid`` header as wrk counted it, mapped to
  worker numbers (``requests_by_worker``);
- how nginx's workers share the clients (``nginx_workers``, ``busiest_connections``,
  ``spread_extra``);
- nginx's error and access logs (``error_kinds``, ``access_log``).
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

import psutil

from deploy.model import StackError
from deploy.run import Stack, read_stats

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
                   hosts if len(hosts) > 1 else {})


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


# --------------------------------------------------------------------------- the stats server over time


@dataclass
class Sample:
    t: float  # seconds since the sampler started
    workers: dict[int, tuple[int, int, int]]  # id -> (pid, requests, accepting)
    inflight: dict[int, int] = field(default_factory=dict)  # id -> its cores (threads) inside a request
    cores: int = 0  # cores (threads) per worker


def read_sample(stats: dict, t: float) -> Sample:
    """One sample from a stats document. A core counts as in flight while uWSGI marks it
    ``in_request``: set when it starts reading a request (``wsgi_req_recv``), cleared when the
    request is closed (``uwsgi_close_request``), uWSGI 2.0 core/utils.c."""
    workers, inflight, cores = {}, {}, 0
    for w in stats["workers"]:
        workers[w["id"]] = (w["pid"], w["requests"], w.get("accepting", 0))
        threads = w.get("cores") or []
        inflight[w["id"]] = sum(1 for c in threads if c.get("in_request"))
        cores = max(cores, len(threads))
    return Sample(t, workers, inflight, cores)


class Sampler:
    """Polls the uWSGI stats server in the background, ``1 / interval`` times a second on a fixed
    schedule (a slow read skips ticks rather than shifting the later ones, so samples stay evenly
    spread in time): worker pids, request counters, accepting flags and requests in flight.
    ``address`` None (a server without a stats server) records nothing. ``cpu_s``: the CPU the
    sampling thread used, read when it stops (its cost on the machine under test)."""

    def __init__(self, stats_address: str | None, interval: float = 0.1, namespace: str = ""):
        self.address = stats_address
        self.namespace = namespace  # the network namespace the stats server is in ("" = here)
        self.interval = interval
        self.samples: list[Sample] = []
        self.cpu_s = 0.0
        self.t0 = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        cpu0, tick = time.thread_time(), 0
        while not self._stop.is_set():
            try:
                self.samples.append(read_sample(read_stats(self.address, timeout=1.0, namespace=self.namespace),
                                                time.monotonic() - self.t0))
            except (OSError, ValueError, KeyError, TypeError):
                pass
            tick = max(tick + 1, int(self.now() / self.interval) + 1)  # the next tick not yet past
            self._stop.wait(max(0.0, tick * self.interval - self.now()))
        self.cpu_s = time.thread_time() - cpu0

    def __enter__(self) -> "Sampler":
        if self.address:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
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


def inflight_summary(samples: list[Sample], t_from: float = 0.0, t_to: float = math.inf) -> dict:
    """A cell's ``inflight`` record from the samples taken between ``t_from`` and ``t_to`` (the
    load's own window): {} without samples (no stats server). Keys:

    * ``samples``: how many; ``interval_ms``: the mean time between them;
    * ``workers``: per worker id, the share of samples at each in-flight count (the share of time,
      samples being evenly spread): ``{"1": {"0": 0.2, "1": 0.5, "2": 0.3}, ...}``;
    * ``pileup``: the share of samples in which some worker had 2 or more requests in flight
      while another worker had at least 2 fewer (so at least 2 idle threads): a request could
      have run on an idle thread of a less busy worker instead of sharing a GIL. 3 requests on
      2 workers must put 2 in one: that split (2 / 1) is not a pile-up, 3 / 0 is. ``None`` (n/a)
      with one worker (nowhere else to go) or one thread per worker (a worker never holds 2
      requests; they queue in the socket instead);
    * ``threads``: cores per worker; ``full``: the share of samples in which every thread of
      some worker was busy (that worker could take no more).
    """
    window = [s for s in samples if t_from <= s.t <= t_to and s.inflight]
    if not window:
        return {}
    ids = sorted({w for s in window for w in s.inflight})
    threads = max(s.cores for s in window)
    counts = {w: Counter(s.inflight.get(w, 0) for s in window) for w in ids}
    n = len(window)
    piled = sum(1 for s in window if max(s.inflight.values()) >= 2
                and max(s.inflight.values()) - min(s.inflight.get(w, 0) for w in ids) >= 2)
    full = sum(1 for s in window if threads and max(s.inflight.values()) >= threads)
    span = window[-1].t - window[0].t
    return {
        "samples": n,
        "interval_ms": round(1000 * span / (n - 1), 3) if n > 1 else 0.0,
        "threads": threads,
        "pileup": None if len(ids) < 2 or threads < 2 else piled / n,
        "full": full / n,
        "workers": {str(w): {str(k): c / n for k, c in sorted(counts[w].items())} for w in ids},
    }


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
