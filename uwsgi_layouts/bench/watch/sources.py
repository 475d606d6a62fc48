"""What ``watch`` reads while it runs, each source in a thread of its own, each keeping only its
sliding window (a long-running exporter must not grow):

- ``StatsWatch``: a uWSGI stats server, read ``hz`` times a second by compare's and doctor's
  sampler (``bench.observe.Sampler``), its samples bounded to the window; whether it answers and
  whether uWSGI was restarted (a new master pid), each said once when it changes;
- ``SocketWatch``: the kernel's accept queue and backlog of listening sockets, unix or TCP, of
  any server (sock_diag: ``bench.observe.unix_listeners``, ``inet_listeners``), polled for the
  window's highest and read again at every scrape;
- ``LogWatch``: nginx's access log, tailed (``bench.observe.LogTail``: rotation and truncation
  followed), each line parsed by doctor's parser (``bench.observe.parse_timed_line``) into
  latency histograms per upstream socket and status class.

Nothing here writes anything but the lines it says; the figures are read by ``bench.watch.metrics``.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from uwsgi_layouts.bench.diagnosis import all_busy_share
from uwsgi_layouts.bench.observe import (
    Listener,
    LogTail,
    Sample,
    Sampler,
    TimedLine,
    inet_listeners,
    inflight_summary,
    parse_timed_line,
    same_listener,
    unix_listeners,
)
from uwsgi_layouts.bench.results import STATUS_CLASSES as RESULTS_STATUS_CLASSES
from uwsgi_layouts.deploy.machine import is_unix_address

LOG_POLL_S = 0.5  # how often the access log's new lines are read
FORMAT_PROBE_BYTES = 64 * 1024  # the end of an existing log, read at start to check its format
MAX_UPSTREAMS = 256  # latency label sets beyond this many upstream addresses go to "other"
STATUS_CLASSES = ("1xx", *RESULTS_STATUS_CLASSES)


def say(line: str) -> None:
    """One line to stderr (the journal, under systemd): a change of state, said once."""
    print(f"watch: {line}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- the stats server


@dataclass(frozen=True)
class WindowFigures:
    """The sliding window's figures of one uWSGI master, computed as doctor computes them."""

    samples: int
    span_s: float
    slots: int  # processes x threads
    pileup: float | None  # inflight_summary's: None with one worker or one thread per worker
    all_busy: float  # every thread of every worker busy (doctor's "saturated")
    worker_full: float  # some worker with every thread busy
    busy_ratio: float  # mean busy threads / slots
    mean_inflight: dict[int, float]  # worker id -> mean requests in flight

    def __post_init__(self):
        if self.samples < 1 or self.slots < 1 or not 0.0 <= self.busy_ratio <= 1.0 + 1e-9:
            raise ValueError(f"window figures out of range: {self}")


class StatsWatch:
    """A uWSGI stats server read in the background. ``up()``: its last read answered; ``check()``
    (called by the main loop) says once when that changes and when the master pid changes."""

    def __init__(self, address: str, hz: float, window_s: float, tell: Callable[[str], None] = say):
        self.address = address
        self.window_s = window_s
        self.tell = tell
        self.sampler = Sampler(address, interval=1 / hz)
        # The sampler keeps every sample for doctor's window; here only the sliding window's.
        self.sampler.samples = deque(maxlen=int(window_s * hz) + 2)  # type: ignore[assignment]
        self.restarts = 0
        self._master = 0
        self._was_up: bool | None = None
        self.reads_failed = 0

    def start(self) -> None:
        self.sampler.__enter__()

    def stop(self) -> None:
        self.sampler.__exit__(None, None, None)

    def up(self) -> bool:
        return self.sampler.latest is not None and self.sampler.failing_since is None

    def latest(self) -> Sample | None:
        """The latest full sample (with the workers' counters) while the server answers, else None."""
        return self.sampler.latest if self.up() else None

    def check(self) -> None:
        up = self.up()
        latest = self.sampler.latest
        if up and latest is not None and self._master and latest.master != self._master:
            self.restarts += 1
            self.tell(f"uWSGI at {self.address} was restarted (master pid {self._master} -> {latest.master})")
        if up and latest is not None:
            self._master = latest.master
        if up != self._was_up:
            if up and latest is not None:
                self.tell(f"stats server at {self.address} answers (uWSGI {len(latest.workers)} workers, master pid "
                          f"{latest.master}): uwsgi_layouts_up 1")
            elif self._was_up is not None or self.sampler.failing_since is not None:
                reason = self.sampler.last_error or "no answer yet"
                self.tell(f"stats server at {self.address} does not answer ({reason}): uwsgi_layouts_up 0 until it "
                          "does")
            else:
                return  # no read finished yet: nothing to say
            self._was_up = up

    def window(self) -> list[Sample]:
        """The window's samples of the master that answered last (a restart starts a new window)."""
        latest = self.latest()
        if latest is None:
            return []
        samples = list(self.sampler.samples)  # a copy: the sampler's thread appends meanwhile
        return [s for s in samples if s.master == latest.master and s.t >= latest.t - self.window_s]

    def figures(self) -> WindowFigures | None:
        samples = self.window()
        summary = inflight_summary(samples)
        if not summary:
            return None
        with_counts = [s for s in samples if s.inflight]
        ids = sorted({w for s in with_counts for w in s.inflight})
        slots = len(ids) * max(1, summary["threads"])
        n = len(with_counts)
        mean = {w: sum(s.inflight.get(w, 0) for s in with_counts) / n for w in ids}
        return WindowFigures(
            samples=n, span_s=with_counts[-1].t - with_counts[0].t, slots=slots, pileup=summary["pileup"],
            all_busy=all_busy_share(with_counts, slots), worker_full=summary["full"],
            busy_ratio=min(1.0, sum(mean.values()) / slots), mean_inflight=mean)


# --------------------------------------------------------------------------- the kernel's accept queues


def kernel_listeners(names: list[str]) -> dict[str, Listener]:
    """Each of ``names`` (a unix path, ``unix:PATH``, ``HOST:PORT`` or ``:PORT``) -> the kernel's
    listening socket of that name in this network namespace, for those that listen now."""
    kernel: list[Listener] = []
    if any(is_unix_address(n) for n in names):
        kernel += unix_listeners()
    if any(not is_unix_address(n) for n in names):
        kernel += inet_listeners()
    out = {}
    for name in names:
        match = next((k for k in kernel if same_listener(name, k.name)), None)
        if match is not None:
            out[name] = match
    return out


class Poller:
    """A daemon thread running ``_run`` until ``stop`` (which waits up to 5 s for it): what the
    socket and log watches share. ``_run`` loops until ``self._stop`` is set. An exception that
    ends ``_run`` is said and kept in ``failure``: the main loop then stops the exporter (exit 1,
    for its supervisor to restart it) rather than serve figures that no longer move."""

    tell: Callable[[str], None]

    def _init_thread(self, name: str) -> None:
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._guarded_run, daemon=True, name=name)
        self.failure: str | None = None

    def _run(self) -> None:
        raise NotImplementedError

    def _guarded_run(self) -> None:
        try:
            self._run()
        except Exception as exc:  # noqa: BLE001 -- any: a dead thread must not go unnoticed
            self.failure = f"{self._thread.name} stopped: {type(exc).__name__}: {exc}"
            self.tell(self.failure)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)


class SocketWatch(Poller):
    """Listening sockets' accept queues, polled ``hz`` times a second for the window's highest.
    ``names()``: the sockets to read now (given ones, and the stats server's as uWSGI names them).
    A socket that stops or starts listening (a server restarting) is said once per change."""

    def __init__(self, names: Callable[[], list[str]], hz: float, window_s: float, tell: Callable[[str], None] = say):
        self.names = names
        self.interval = 1 / hz
        self.window_s = window_s
        self.tell = tell
        self._seen: dict[str, deque[tuple[float, int]]] = {}
        self._listening: dict[str, bool] = {}
        self._init_thread("watch-sockets")

    def _run(self) -> None:
        failing = False
        while not self._stop.is_set():
            now = time.monotonic()
            names = self.names()
            try:
                found = kernel_listeners(names)
            except OSError as exc:  # sock_diag refused (a netlink hiccup, a lost capability): try again
                if not failing:
                    self.tell(f"cannot read the kernel's listening sockets ({exc.strerror or exc}): trying again")
                failing = True
                self._stop.wait(self.interval)
                continue
            if failing:
                self.tell("reading the kernel's listening sockets again")
            failing = False
            for name in names:
                if self._listening.get(name) != (name in found):
                    self.tell(f"socket {name} {'listens' if name in found else 'is not listening'}")
                    self._listening[name] = name in found
            with self._lock:
                for name, listener in found.items():
                    seen = self._seen.setdefault(name, deque())
                    seen.append((now, listener.queue))
                    while seen and seen[0][0] < now - self.window_s:
                        seen.popleft()
                for gone in set(self._seen) - set(names):
                    del self._seen[gone]
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - now)))

    def window_max(self) -> dict[str, int]:
        with self._lock:
            return {name: max(q for _, q in seen) for name, seen in self._seen.items() if seen}


# --------------------------------------------------------------------------- nginx's access log


def is_timed(parsed: TimedLine | None) -> bool:
    """A line that says how long the upstream took (the bundle's timed format, or the lab's)."""
    return parsed is not None and any(t is not None for t in parsed.upstream_s)


def last_lines(path: Path | str, size: int = FORMAT_PROBE_BYTES) -> list[str]:
    """The complete lines in the last ``size`` bytes of a file (the first, maybe cut, dropped
    unless the read started at the file's beginning). Raises OSError."""
    with open(path, "rb") as fh:
        end = fh.seek(0, os.SEEK_END)
        fh.seek(max(0, end - size))
        data = fh.read(size)
    lines = data.decode("utf-8", "replace").split("\n")[:-1]  # the last, unfinished or empty, dropped
    return lines if end <= size else lines[1:]


class LatencyHistograms:
    """Cumulative histograms of upstream response times per (upstream, status class), and the
    answers per status class; the buckets' upper bounds in seconds, ascending."""

    def __init__(self, buckets: tuple[float, ...]):
        if not buckets or list(buckets) != sorted(set(buckets)) or buckets[0] <= 0:
            raise ValueError(f"buckets must be ascending positive seconds, got {buckets}")
        self.buckets = buckets
        self.counts: dict[tuple[str, str], list[int]] = {}  # per bucket, not cumulative; the last: above all
        self.sums: dict[tuple[str, str], float] = {}
        self.answers: dict[str, int] = {}

    def add(self, line: TimedLine) -> list[float]:
        """Count one request; returns the upstream attempts' times it added."""
        status_class = f"{line.status // 100}xx"
        if status_class not in STATUS_CLASSES:
            return []
        self.answers[status_class] = self.answers.get(status_class, 0) + 1
        if len(line.upstreams) != len(line.upstream_s):
            return []
        added = []
        for addr, seconds in zip(line.upstreams, line.upstream_s, strict=True):
            if seconds is None or addr == "-":
                continue
            known = {u for u, _ in self.counts}
            upstream = addr if addr in known or len(known) < MAX_UPSTREAMS else "other"
            key = (upstream, status_class)
            counts = self.counts.setdefault(key, [0] * (len(self.buckets) + 1))
            counts[next((i for i, b in enumerate(self.buckets) if seconds <= b), len(self.buckets))] += 1
            self.sums[key] = self.sums.get(key, 0.0) + seconds
            added.append(seconds)
        return added

    def copy(self) -> "LatencyHistograms":
        out = LatencyHistograms(self.buckets)
        out.counts = {k: list(v) for k, v in self.counts.items()}
        out.sums = dict(self.sums)
        out.answers = dict(self.answers)
        return out


class LogWatch(Poller):
    """nginx's access log from its end, read every ``LOG_POLL_S``: latency histograms, lines that
    were or were not in a timed format, and the upstream time of the window (Little's law: the
    mean requests held by the servers). A line not in a timed format is said once."""

    def __init__(self, path: str, buckets: tuple[float, ...], window_s: float, tell: Callable[[str], None] = say,
                 tail=None):
        self.path = path
        self.window_s = window_s
        self.tell = tell
        # A file tailed, or any reader of lines with read() and close() (``datagrams.DatagramLog``).
        self.tail = tail if tail is not None else LogTail(path)  # raises OSError: the caller says so
        self.histograms = LatencyHistograms(buckets)
        self.lines = {"timed": 0, "untimed": 0}
        self.started = time.monotonic()
        self._busy: deque[tuple[float, float]] = deque()  # (when read, upstream seconds of the lines read then)
        self._said_untimed = False
        self._init_thread("watch-log")

    def stop(self) -> None:
        super().stop()
        self.tail.close()

    def _run(self) -> None:
        failing = False
        while not self._stop.wait(LOG_POLL_S):
            try:
                lines = self.tail.read()
            except OSError as exc:  # rotated away and not yet recreated, permissions changed: try again
                if not failing:
                    self.tell(f"cannot read {self.path} ({exc.strerror or exc}): trying again")
                failing = True
                continue
            if failing:
                self.tell(f"reading {self.path} again")
            failing = False
            self.feed(lines, time.monotonic())

    def feed(self, lines: list[str], now: float) -> None:
        busy = 0.0
        untimed = 0
        with self._lock:
            for raw in lines:
                if not raw.strip():
                    continue
                parsed = parse_timed_line(raw)
                if not is_timed(parsed):
                    untimed += 1
                    continue
                busy += sum(self.histograms.add(parsed))
            self.lines["untimed"] += untimed
            self.lines["timed"] += len([x for x in lines if x.strip()]) - untimed
            self._busy.append((now, busy))
            while self._busy and self._busy[0][0] < now - self.window_s:
                self._busy.popleft()
        if untimed and not self._said_untimed:
            self._said_untimed = True
            self.tell(f"{self.path}: {untimed} line(s) without upstream times (not the timed format) are counted "
                      "in uwsgi_layouts_log_lines_total{format=\"untimed\"} only")

    def snapshot(self) -> tuple[LatencyHistograms, dict[str, int]]:
        with self._lock:
            return self.histograms.copy(), dict(self.lines)

    def busy_seconds(self, now: float) -> tuple[float, float]:
        """(upstream seconds of the requests logged in the window, the window's length so far)."""
        with self._lock:
            total = sum(b for t, b in self._busy if t >= now - self.window_s)
        return total, min(self.window_s, now - self.started)
