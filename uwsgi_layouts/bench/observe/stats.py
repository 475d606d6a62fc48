"""uWSGI's stats server over time: one sample of its workers (pids, counters, requests in flight,
listen queues), the background sampler, and the per-cell summary of requests in flight."""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from uwsgi_layouts.bench.observe.sockets import unix_listen_queues
from uwsgi_layouts.deploy.machine import is_unix_address, read_stats
from uwsgi_layouts.deploy.model import StackError

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
    # Ticks of the sampler's schedule that passed with no read since the previous sample (a read,
    # failed or not, or the thread's wake-up, ran past them: a late stats server or a busy
    # machine); a failed read's own tick is not among them.
    missed: int = 0


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
    spread in time; ``Sample.missed`` counts the ticks skipped before each sample): worker pids,
    request counters, accepting flags, requests in flight and the sockets' listen queues
    (``samples``); the workers' cumulative counters in ``first`` and ``latest`` only (the window's
    two ends are all that their differences need).
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
        self._missed = 0  # ticks skipped since the last sample, carried by the next one
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
        sample.missed, self._missed = self._missed, 0
        self.first = self.first or sample
        self.latest = sample
        self.samples.append(replace(sample, counters={}))

    def _run(self) -> None:
        cpu0, tick = time.thread_time(), 0
        while not self._stop.is_set():
            self._read()
            due = max(tick + 1, int(self.now() / self.interval) + 1)  # the next tick not yet past
            self._missed += due - tick - 1
            tick = due
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

    * ``samples``: how many; ``interval_ms``: the mean time between them; ``missed``: the ticks of
      the sampler's schedule between the first and the last sample that passed while a read was
      still running or the thread was kept from waking (a late stats server, a busy machine): with
      the samples, every tick of that stretch but the failed reads' own (a failed read's tick is
      neither a sample nor missed; the ticks that pass during its timeout are missed, carried by
      the next sample);
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
        "missed": sum(s.missed for s in window[1:]),  # the first one's lie before the window
        "threads": threads,
        "pileup": None if len(ids) < 2 or threads < 2 else piled / n,
        "full": full / n,
        "workers": {str(w): {str(k): c / n for k, c in sorted(counts[w].items())} for w in ids},
    }
