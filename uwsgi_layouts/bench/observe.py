"""Observers of a running stack: what its processes, its stats server and its logs show.

Nothing here starts or stops anything (``bench.stack`` does); every function reads:

- CPU seconds of the app server's (uWSGI, gunicorn, granian) and nginx's process trees
  (``tree_cpu_seconds``, ``Snapshot``), and under a layout's ``@cpus``/``@memory`` its cgroup's
  counters (periods, throttling, CPU used, OOM kills), a cell's ``limit`` record (``limit_record``);
- memory of the app server's process tree, per worker, and of nginx (``stack_memory``: PSS, USS,
  RSS read by psutil from /proc/PID/smaps_rollup; ``memory_record`` assembles the figures);
- requests served per uWSGI worker, from the stats server (``worker_requests``, ``Snapshot``),
  and over time in the background (``Sampler``: pids, request counters, accepting flags, and
  requests in flight per worker, summarised per cell by ``inflight_summary``; the sockets' listen
  queues and the workers' cumulative counters, for ``doctor``); for a server without a stats
  server, from the app's ``X-Worker-Pid`` header as wrk counted it, mapped to worker numbers
  (``requests_by_worker``). A stats server is a unix socket (a path: the lab's
  ``RUN_DIR/control/stats.sock``, the bundle's ``/run/NAME/stats.sock``) or, where the user accepted
  the risk, ``HOST:PORT``; it is read by deploy.machine's ``read_stats`` only, which drops the
  variables of requests in flight (cookies, Authorization headers) before anything here sees them;
- the kernel's view of listening sockets: unix listen queues (``unix_listen_queues``, sock_diag
  netlink: uWSGI cannot see them on stock Linux), TCP listen overflows (``kernel_listen_overflows``),
  which listening sockets a process holds (``process_listeners``);
- how nginx's workers share the clients (``nginx_workers``, ``busiest_connections``,
  ``spread_extra``);
- nginx's error and access logs (``error_kinds``, ``access_log``), and an access log read from
  its end while a window runs (``LogTail``, ``parse_timed_line``: status, request and upstream
  times, upstream addresses).
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
import socket
import struct
import threading
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, NamedTuple

import psutil

from uwsgi_layouts.deploy.machine import CgroupReading, is_unix_address, read_stats
from uwsgi_layouts.deploy.model import StackError
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


# --------------------------------------------------------------------------- the stats server over time

class WorkerCounters(NamedTuple):
    """A worker slot's cumulative counters (uWSGI keeps them across the slot's respawns)."""

    running_us: int  # time spent in requests, all its threads (core/utils.c: += each request's time)
    harakiri: int
    respawns: int  # 1 after the first spawn
    exceptions: int
    rss: int  # bytes; 0 unless uWSGI runs with memory-report


@dataclass
class Sample:
    t: float  # seconds since the sampler started
    workers: dict[int, tuple[int, int, int]]  # id -> (pid, requests, accepting)
    inflight: dict[int, int] = field(default_factory=dict)  # id -> its cores (threads) inside a request
    cores: int = 0  # cores (threads) per worker
    # socket name -> (requests waiting in its listen queue, the queue's size). uWSGI's master reads
    # TCP queues once a second; unix ones it cannot read on stock Linux (0, 0) unless the sampler
    # reads them from the kernel (``Sampler(unix_queues=True)``).
    sockets: dict[str, tuple[int, int]] = field(default_factory=dict)
    master: int = 0  # the master's pid: a new one means uWSGI was restarted
    # Worker id -> cumulative counters; the Sampler keeps them in its first and latest samples only.
    counters: dict[int, WorkerCounters] = field(default_factory=dict)
    # uWSGI's own count, since it started, of the times its master found a listen queue full
    # (``listen_queue_errors``: TCP sockets, read once a second; this service only, unlike the kernel's).
    queue_errors: int = 0


def read_sample(stats: dict, t: float) -> Sample:
    """One sample from a stats document. A core counts as in flight while uWSGI marks it
    ``in_request``: set when it starts reading a request (``wsgi_req_recv``), cleared when the
    request is closed (``uwsgi_close_request``), uWSGI 2.0 core/utils.c. Nothing of a request's
    variables (``cores[].vars``: headers, cookies) is kept."""
    workers, inflight, counters, cores = {}, {}, {}, 0
    for w in stats["workers"]:
        workers[w["id"]] = (w["pid"], w["requests"], w.get("accepting", 0))
        threads = w.get("cores") or []
        inflight[w["id"]] = sum(1 for c in threads if c.get("in_request"))
        cores = max(cores, len(threads))
        counters[w["id"]] = WorkerCounters(int(w.get("running_time", 0)), int(w.get("harakiri_count", 0)),
                                           int(w.get("respawn_count", 0)), int(w.get("exceptions", 0)),
                                           int(w.get("rss", 0)))
    sockets = {str(s["name"]): (int(s.get("queue", 0)), int(s.get("max_queue", 0))) for s in stats.get("sockets", [])}
    return Sample(t, workers, inflight, cores, sockets, int(stats.get("pid", 0)), counters,
                  int(stats.get("listen_queue_errors", 0) or 0))


class Sampler:
    """Polls the uWSGI stats server in the background, ``1 / interval`` times a second on a fixed
    schedule (a slow read skips ticks rather than shifting the later ones, so samples stay evenly
    spread in time): worker pids, request counters, accepting flags, requests in flight and the
    sockets' listen queues (``samples``); the workers' cumulative counters in ``first`` and
    ``latest`` only (the window's two ends are all that their differences need).
    ``address`` None (a server without a stats server) records nothing. ``cpu_s``: the CPU the
    sampling thread used, read when it stops (its cost on the machine under test).
    ``unix_queues``: also read unix sockets' listen queues from the kernel (``unix_listen_queues``;
    the sampler must be in the sockets' network namespace). While reads fail, ``failing_since``
    holds when the first failing read started and ``last_error`` why (a stopped service)."""

    def __init__(self, stats_address: str | None, interval: float = 0.1, namespace: str = "",
                 unix_queues: bool = False):
        self.address = stats_address
        self.namespace = namespace  # the network namespace the stats server is in ("" = here)
        self.interval = interval
        self.unix_queues = unix_queues
        self.samples: list[Sample] = []
        self.first: Sample | None = None
        self.latest: Sample | None = None
        self.failing_since: float | None = None
        self.last_error = ""
        self.cpu_s = 0.0
        self.t0 = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _read(self) -> None:
        started = self.now()
        try:
            sample = read_sample(read_stats(self.address, timeout=1.0, namespace=self.namespace), self.now())
        except (OSError, ValueError, KeyError, TypeError) as exc:
            if self.failing_since is None:
                self.failing_since = started
            self.last_error = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
            return
        self.failing_since = None
        if self.unix_queues and any(is_unix_address(name) for name in sample.sockets):
            queues = unix_listen_queues()
            sample.sockets = {name: queues.get(name.removeprefix("unix:"), value)
                              for name, value in sample.sockets.items()}
        self.first = self.first or sample
        self.latest = sample
        self.samples.append(replace(sample, counters={}))

    def _run(self) -> None:
        cpu0, tick = time.thread_time(), 0
        while not self._stop.is_set():
            self._read()
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


# --------------------------------------------------------------------------- the kernel's listening sockets

# sock_diag netlink (linux/sock_diag.h, linux/unix_diag.h): what `ss -xl` reads.
NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
UDIAG_SHOW_NAME, UDIAG_SHOW_RQLEN = 0x01, 0x10
UNIX_DIAG_NAME, UNIX_DIAG_RQLEN = 0, 4
TCP_LISTEN = 10
_NLMSG = struct.Struct("=IHHII")  # nlmsghdr: len, type, flags, seq, pid
_UNIX_DIAG_REQ = struct.Struct("=BBHIIIII")  # family, protocol, pad, states, ino, show, cookie x2
_UNIX_DIAG_MSG = struct.Struct("=BBBBIII")  # family, type, state, pad, ino, cookie x2
_RTATTR = struct.Struct("=HH")  # len, type
# linux/inet_diag.h: inet_diag_req_v2 (family, protocol, ext, pad, states, then an inet_diag_sockid of
# 48 bytes: ports, addresses, interface, cookie) and inet_diag_msg (family, state, timer, retrans,
# the sockid: ports big-endian, then expires, rqueue, wqueue, uid, inode).
_INET_DIAG_REQ = struct.Struct("=BBBBI")
_INET_SOCKID_SIZE = 48
_INET_DIAG_MSG = struct.Struct("=BBBB2s2s16s16sI8sIIIII")


class Listener(NamedTuple):
    name: str  # a unix path, or HOST:PORT
    inode: int
    queue: int  # connections waiting to be accepted
    backlog: int  # the queue's size (listen(2)'s backlog, capped by somaxconn)


def _sock_diag_dump(request: bytes, parse: Callable[[bytes], Listener | None], timeout: float) -> list[Listener]:
    """One sock_diag dump (``request``: the family's request struct) -> the listeners ``parse``
    finds in its messages. [] (or what came before the failure) when netlink is unavailable."""
    found: list[Listener] = []
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG) as nl:
            nl.settimeout(timeout)
            nl.sendall(_NLMSG.pack(_NLMSG.size + len(request), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, 1, 0)
                       + request)
            while True:
                data = nl.recv(65536)
                offset = 0
                while offset + _NLMSG.size <= len(data):
                    length, kind, _, _, _ = _NLMSG.unpack_from(data, offset)
                    if kind == NLMSG_DONE or kind == NLMSG_ERROR or length < _NLMSG.size:
                        return found
                    listener = parse(data[offset + _NLMSG.size: offset + length])
                    if listener:
                        found.append(listener)
                    offset += (length + 3) & ~3
    except OSError:
        return found


def unix_listeners(timeout: float = 1.0) -> list[Listener]:
    """Every listening unix stream socket of this network namespace with a path, from the
    kernel (sock_diag: no privilege needed). For a listening socket the kernel reports its accept
    queue as the receive queue and its backlog as the send queue. [] when netlink is unavailable."""
    request = _UNIX_DIAG_REQ.pack(socket.AF_UNIX, 0, 0, 1 << TCP_LISTEN, 0, UDIAG_SHOW_NAME | UDIAG_SHOW_RQLEN,
                                  0xFFFFFFFF, 0xFFFFFFFF)
    return _sock_diag_dump(request, _unix_listener, timeout)


def inet_listeners(timeout: float = 1.0) -> list[Listener]:
    """Every listening TCP socket (IPv4 and IPv6) of this network namespace, from the kernel
    (sock_diag's inet_diag, what `ss -ltn` reads; no privilege needed): for a listening socket
    idiag_rqueue is its accept queue and idiag_wqueue its backlog (/proc/net/tcp has no backlog)."""
    found: list[Listener] = []
    for family in (socket.AF_INET, socket.AF_INET6):
        request = _INET_DIAG_REQ.pack(family, socket.IPPROTO_TCP, 0, 0, 1 << TCP_LISTEN) + bytes(_INET_SOCKID_SIZE)
        found += _sock_diag_dump(request, _inet_listener, timeout)
    return found


def _inet_listener(payload: bytes) -> Listener | None:
    if len(payload) < _INET_DIAG_MSG.size:
        return None
    family, _, _, _, port, _, src, _, _, _, _, queue, backlog, _, inode = _INET_DIAG_MSG.unpack_from(payload)
    host = ipaddress.ip_address(src[:4] if family == socket.AF_INET else src)
    return Listener(f"{host}:{int.from_bytes(port, 'big')}", inode, queue, backlog)


def _unix_listener(payload: bytes) -> Listener | None:
    if len(payload) < _UNIX_DIAG_MSG.size:
        return None
    inode = _UNIX_DIAG_MSG.unpack_from(payload)[4]
    name, queue, backlog = "", 0, 0
    offset = _UNIX_DIAG_MSG.size
    while offset + _RTATTR.size <= len(payload):
        length, kind = _RTATTR.unpack_from(payload, offset)
        if length < _RTATTR.size:
            break
        value = payload[offset + _RTATTR.size: offset + length]
        if kind == UNIX_DIAG_NAME and value[:1] not in (b"", b"\0"):  # abstract sockets have no path
            name = value.split(b"\0", 1)[0].decode("utf-8", "replace")
        elif kind == UNIX_DIAG_RQLEN and len(value) >= 8:
            queue, backlog = struct.unpack_from("=II", value)
        offset += (length + 3) & ~3
    return Listener(name, inode, queue, backlog) if name else None


def unix_listen_queues() -> dict[str, tuple[int, int]]:
    """Unix socket path -> (connections waiting, backlog), for every listening one."""
    return {s.name: (s.queue, s.backlog) for s in unix_listeners()}


def tcp_listeners() -> list[Listener]:
    """Listening TCP sockets (IPv4 and IPv6) of this network namespace, from /proc/net/tcp{,6}:
    local address, inode, and for a listening socket its accept queue (rx_queue)."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if len(cols) < 10 or cols[3] != "0A":  # 0A: TCP_LISTEN
                continue
            host_hex, port_hex = cols[1].split(":")
            raw = bytes.fromhex(host_hex)
            # /proc prints the address as 32-bit words in host (little-endian) order.
            packed = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            host = str(ipaddress.ip_address(packed))
            found.append(Listener(f"{host}:{int(port_hex, 16)}", int(cols[9]), int(cols[4].split(":")[1], 16), 0))
    return found


def same_listener(uwsgi_name: str, kernel_name: str) -> bool:
    """A uWSGI socket name (``/run/x.sock``, ``127.0.0.1:5000``, ``:5000``) against a kernel one."""
    if is_unix_address(uwsgi_name):
        return uwsgi_name.removeprefix("unix:") == kernel_name
    host, _, port = uwsgi_name.rpartition(":")
    k_host, _, k_port = kernel_name.rpartition(":")
    return port == k_port and (host in ("", "0.0.0.0", "*", "[::]") or host.strip("[]") == k_host)


def process_listeners(pid: int, listeners: list[Listener]) -> list[Listener] | None:
    """Which of ``listeners`` the process holds open (its file descriptors name their inodes);
    None when its descriptors cannot be read (another user's process, not root) or it is gone."""
    try:
        names = os.listdir(f"/proc/{pid}/fd")
        inodes = set()
        for fd in names:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(int(target[8:-1]))
    except OSError:
        return None
    return [s for s in listeners if s.inode in inodes]


def workers_are_local(stats: dict) -> bool:
    """The stats document's workers are processes of this machine (and pid namespace): each
    one's parent is the master the document names."""
    try:
        return all(psutil.Process(w["pid"]).ppid() == stats["pid"] for w in stats["workers"])
    except (psutil.Error, KeyError, TypeError):
        return False


def socket_holdings(stats: dict) -> dict[int, list[str]] | None:
    """Worker id -> the stats document's sockets that worker holds open (a mapped worker closes
    the sockets of the others: uWSGI 2.0 core/socket.c uwsgi_map_sockets); None when a worker's
    descriptors cannot be read."""
    kernel = tcp_listeners() + unix_listeners()
    names = [str(s["name"]) for s in stats.get("sockets", [])]
    out = {}
    for w in stats["workers"]:
        held = process_listeners(w["pid"], kernel)
        if held is None:
            return None
        out[w["id"]] = [n for n in names if any(same_listener(n, k.name) for k in held)]
    return out


def kernel_listen_overflows() -> int | None:
    """TcpExt ListenOverflows of this network namespace (/proc/net/netstat): connections the
    kernel dropped because a TCP listen queue was full, every socket counted. None if unreadable."""
    try:
        lines = Path("/proc/net/netstat").read_text().splitlines()
    except OSError:
        return None
    for names, values in zip(lines, lines[1:], strict=False):
        if names.startswith("TcpExt:") and values.startswith("TcpExt:"):
            table = dict(zip(names.split()[1:], values.split()[1:], strict=False))
            return int(table["ListenOverflows"]) if "ListenOverflows" in table else None
    return None


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


# --------------------------------------------------------------------------- an access log over a window

LOG_LIMIT_BYTES = 256 * 1024 * 1024  # read at most this much of what a window appended


class LogTail:
    """An nginx access log read from its end: opening it notes where the file ends now, ``read``
    returns the complete lines appended since. Follows a rotation (the file renamed and a new one
    made: the rest of the old file, then the new one from its start) and a truncation
    (copytruncate: from the start). Reads at most ``limit`` bytes (``cut`` says so). Raises
    OSError when the file cannot be opened."""

    def __init__(self, path: Path | str, limit: int = LOG_LIMIT_BYTES):
        self.path = Path(path)
        self.limit = limit
        self.cut = False
        self._fh = open(self.path, "rb")  # noqa: SIM115 (kept open for the window; closed by close())
        self._fh.seek(0, os.SEEK_END)
        self._inode = os.fstat(self._fh.fileno()).st_ino
        self._partial = b""  # a last line still being written: completed by the next read

    def read(self) -> list[str]:
        data = self._drain(self._fh)
        try:
            rotated = os.stat(self.path).st_ino != self._inode
        except OSError:
            rotated = False
        if rotated:
            with open(self.path, "rb") as new:
                data += self._drain(new, len(data))
        *lines, self._partial = (self._partial + data).split(b"\n")
        return [line.decode("utf-8", "replace") for line in lines]

    def _drain(self, fh, already: int = 0) -> bytes:
        if os.fstat(fh.fileno()).st_size < fh.tell():  # truncated in place
            fh.seek(0)
        budget = self.limit - already
        data = fh.read(budget + 1) if budget > 0 else b""
        if len(data) > budget:
            self.cut, data = True, data[:budget]
        return data

    def close(self) -> None:
        self._fh.close()


class TimedLine(NamedTuple):
    """What an access log line says of one request: its status, how long nginx took
    ($request_time), and each upstream attempt's address and time ($upstream_addr and
    $upstream_response_time; None where nginx logged "-")."""

    status: int
    request_s: float | None
    upstreams: tuple[str, ...]
    upstream_s: tuple[float | None, ...]
    format: str  # "upstreams" (this project's lab format), "combined", "combined+times"


_QUOTED = r'"(?:[^"\\]|\\.)*"'
COMBINED_TIMED_RE = re.compile(r'^\S+ \S+ \S+ \[[^\]]*\] ' + _QUOTED + r' (\d{3}) (?:\d+|-)(?: ' + _QUOTED + " "
                               + _QUOTED + r')?(.*)$')
UPSTREAMS_TIMED_RE = re.compile(r'^\S+ \[[^\]]*\] ' + _QUOTED + r' (\d{3}) ([\d.]+) upstream=(.*?) upstream_time=(.*)$')
_TIME_LIST = re.compile(r"^(?:\d+(?:\.\d+)?|-)(?:,(?:\d+(?:\.\d+)?|-))*$")
_ADDRESS = r"(?:unix:\S+?|\[[0-9a-fA-F:.]+\]:\d+|[\w.-]+:\d+|-)"
_ADDRESS_LIST = re.compile(rf"^{_ADDRESS}(?:,{_ADDRESS})*$")
_FIELD = re.compile(r'(?:(\w+)=)?("[^"]*"|\S+)')
# Names a log_format may give these fields (nginx's own examples use rt=, urt=, ua=).
REQUEST_TIME_KEYS = ("rt", "request_time")
UPSTREAM_TIME_KEYS = ("urt", "upstream_response_time", "upstream_time")
UPSTREAM_ADDR_KEYS = ("ua", "upstream_addr", "upstream")


def _times(text: str) -> tuple[float | None, ...]:
    return tuple(None if x == "-" else float(x) for x in text.split(","))


def _as_list(text: str) -> str:
    """nginx separates attempts with ", " and internal redirects with " : "; one comma each here."""
    return re.sub(r"\s*,\s*|\s+:\s+", ",", text.strip())


def parse_timed_line(line: str) -> TimedLine | None:
    """A line of this project's ``upstreams`` format, or of nginx's ``combined`` with fields
    appended: ``key=value`` (``rt``/``request_time``, ``urt``/``upstream_response_time``/
    ``upstream_time``, ``ua``/``upstream_addr``/``upstream``; values may be quoted) or bare
    (``$upstream_addr $upstream_response_time``; with two bare times the first is $request_time).
    None for a line in neither format."""
    m = UPSTREAMS_TIMED_RE.match(line)
    if m:
        addrs = _as_list(m[3])
        times = _as_list(m[4])
        return TimedLine(int(m[1]), float(m[2]), tuple(addrs.split(",")) if _ADDRESS_LIST.match(addrs) else (),
                         _times(times) if _TIME_LIST.match(times) else (), "upstreams")
    m = COMBINED_TIMED_RE.match(line)
    if not m:
        return None
    request_s, upstream_s, addrs, bare = None, (), (), []
    for key, raw in _FIELD.findall(_as_list(m[2])):
        value = raw.strip('"')
        if key in REQUEST_TIME_KEYS and _TIME_LIST.match(value):
            request_s = _times(value)[0]
        elif key in UPSTREAM_TIME_KEYS and _TIME_LIST.match(value):
            upstream_s = _times(value)
        elif key in UPSTREAM_ADDR_KEYS and _ADDRESS_LIST.match(value):
            addrs = tuple(value.split(","))
        elif not key and _TIME_LIST.match(value) and value != "-":
            bare.append(_times(value))
        elif not key and _ADDRESS_LIST.match(value) and value != "-":
            addrs = tuple(value.split(","))
    if bare and not upstream_s:
        upstream_s = bare[-1]
        if len(bare) > 1 and request_s is None:
            request_s = bare[0][0]
    timed = request_s is not None or bool(upstream_s)
    return TimedLine(int(m[1]), request_s, addrs, upstream_s, "combined+times" if timed else "combined")


# --------------------------------------------------------------------------- uWSGI's own configuration

# uWSGI options -> the app options of ``deploy``/``bench`` (--app, --app-dir, --virtualenv).
APP_OPTIONS = {"module": "module", "wsgi": "module", "callable": "callable", "wsgi-file": "wsgi_file",
               "file": "wsgi_file", "chdir": "app_dir", "virtualenv": "virtualenv", "venv": "virtualenv",
               "home": "virtualenv", "pyhome": "virtualenv"}


def uwsgi_config(master_pid: int) -> tuple[str, dict]:
    """(the ini file the uWSGI master was started with, the app options it names: ``app``
    (module:callable), ``app_dir``, ``virtualenv``), from the master's command line (readable by
    every user) and the file (when this user may read it: the bundle's is root:NAME 0640).
    ("", {}) without an ini file; (path, {}) when it cannot be read."""
    try:
        proc = psutil.Process(master_pid)
        argv = proc.cmdline()
    except psutil.Error:
        return "", {}
    path = ""
    for i, arg in enumerate(argv[1:], 1):
        if arg == "--ini" and i + 1 < len(argv):
            path = argv[i + 1]
        elif arg.startswith("--ini="):
            path = arg.split("=", 1)[1]
        elif arg.endswith(".ini") and not argv[i - 1].startswith("-"):
            path = arg
    if not path:
        return "", {}
    if not os.path.isabs(path):
        try:
            path = os.path.join(proc.cwd(), path)
        except psutil.Error:
            return path, {}
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return path, {}
    options = app_options_of_ini(text)
    entry = options.pop("wsgi_file", "")
    if Path(entry).name == ENTRY_NAME:  # our generated entry module: the app is the factory it calls
        try:
            factory = factory_of_entry(Path(entry).read_text(errors="replace"))
        except OSError:
            factory = ""
        if factory:
            options["app"] = factory
    return path, options


# The module `render` writes for an app factory (deploy's ENTRY_FILE), and the line in it that names
# the --app it was made from: what a user would pass again.
ENTRY_NAME = "uwsgi_layouts_entry.py"
_ENTRY_APP = re.compile(r"^# --app (.+?) is an app factory", re.MULTILINE)


def factory_of_entry(text: str) -> str:
    """The ``--app`` an entry module was generated for (``storefront:create_app()``), or ""."""
    m = _ENTRY_APP.search(text)
    return m[1] if m else ""


def app_options_of_ini(text: str) -> dict:
    """The app options of a uWSGI ini file's [uwsgi] section (the last value of a repeated key),
    the names of the variables its ``env`` lines set (``env_names``: never their values, which may
    be secrets), and ``wsgi_file`` when it names one."""
    found: dict[str, str] = {}
    env_names: list[str] = []
    section = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith((";", "#")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1].strip()
            continue
        key, sep, value = line.partition("=")
        key = key.strip().replace("_", "-")
        if section == "uwsgi" and sep and key in APP_OPTIONS:
            found[APP_OPTIONS[key]] = value.strip()
        elif section == "uwsgi" and sep and key == "env":
            name = value.strip().partition("=")[0].strip()
            if name and name not in env_names and not name.startswith("UL_"):  # UL_*: the lab's own
                env_names.append(name)
    out: dict = {}
    callable_name = found.get("callable", "application")
    if found.get("module"):
        module = found["module"]
        out["app"] = module if ":" in module else f"{module}:{callable_name}"
    elif found.get("wsgi_file"):
        wsgi = Path(found["wsgi_file"])
        out["app"] = f"{wsgi.stem}:{callable_name}"
        out["app_dir"] = str(wsgi.parent)
        out["wsgi_file"] = found["wsgi_file"]
    if found.get("app_dir"):
        out["app_dir"] = found["app_dir"]
    if found.get("virtualenv"):
        out["virtualenv"] = found["virtualenv"]
    if env_names:
        out["env_names"] = env_names
    return out
