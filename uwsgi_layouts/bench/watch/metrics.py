"""``watch``'s metrics: what its sources hold, as Prometheus metric families at every scrape.

Every name starts with ``uwsgi_layouts_`` (uwsgi_exporter's ``uwsgi_`` names mean other things).
``METRICS`` lists them with their help: the rules and the dashboard (``bench.watch.rules``) use
only these, and the tests hold both to it. Nothing of a request's variables (headers, cookies:
the stats document carries them for requests in flight) reaches a metric: the sampler keeps
counts only (``bench.observe.read_sample``).
"""

from __future__ import annotations

import time

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from uwsgi_layouts.bench.watch.sources import LatencyHistograms, LogWatch, SocketWatch, StatsWatch, kernel_listeners

PREFIX = "uwsgi_layouts_"
LATENCY = PREFIX + "upstream_response_seconds"

# name (without the prefix) -> (type, help). Counters are named without _total here, as prometheus_client takes them.
METRICS: dict[str, tuple[str, str]] = {
    "up": ("gauge", "1 while the uWSGI stats server answered its last read, else 0"),
    "restarts": ("counter", "times watch saw uWSGI's master pid change (a restart of the service)"),
    "worker_busy_threads": ("gauge", "threads of the worker inside a request at the last read (uWSGI: requests in "
                                     "flight, one per busy thread)"),
    "worker_threads": ("gauge", "threads (uWSGI cores) of the worker"),
    "worker_requests_in_flight_mean": ("gauge", "requests in flight in the worker, mean over the window"),
    "worker_requests": ("counter", "requests the worker slot served (uWSGI's counter: reset by a restart)"),
    "worker_busy_seconds": ("counter", "time the worker's threads spent in requests (uWSGI's running_time)"),
    "worker_respawns": ("counter", "times uWSGI spawned the worker slot (1 after the first spawn)"),
    "worker_harakiri": ("counter", "requests of the worker killed by harakiri"),
    "worker_exceptions": ("counter", "exceptions the worker's app raised"),
    "pileup_share": ("gauge", "share of the window's reads in which some worker held 2+ requests while another had "
                              "at least 2 fewer (doctor's pile-up); absent with one worker or one thread per worker"),
    "all_busy_share": ("gauge", "share of the window's reads with every thread of every worker busy (doctor's "
                                "saturated)"),
    "worker_full_share": ("gauge", "share of the window's reads in which some worker had every thread busy"),
    "busy_ratio": ("gauge", "busy threads over all threads, mean over the window (source=stats: uWSGI's stats "
                            "server; source=access_log: the upstream time nginx logged over --slots, Little's law): "
                            "the figure an autoscaler can target"),
    "slots": ("gauge", "threads in total (processes x threads) the busy ratio is over"),
    "window_reads": ("gauge", "stats-server reads the window's shares are computed over"),
    "window_seconds": ("gauge", "the time the window's reads span"),
    "listening": ("gauge", "1 while the socket listens (the kernel has it), else 0: a server restarting or stopped"),
    "listen_queue": ("gauge", "connections waiting in the socket's accept queue, read from the kernel at the scrape"),
    "listen_queue_max": ("gauge", "the highest accept queue seen in the window (read hz times a second)"),
    "listen_backlog": ("gauge", "the socket's accept queue size (listen(2)'s backlog, capped by somaxconn)"),
    "listen_queue_errors": ("counter", "times uWSGI's master found a TCP listen queue full (uWSGI's counter)"),
    "responses": ("counter", "answers nginx logged, by status class"),
    "log_lines": ("counter", "access log lines read, by whether they carried upstream times (format=timed|untimed)"),
    "upstream_response_seconds": ("histogram", "time nginx waited for each upstream attempt ($upstream_response_time), "
                                               "by upstream socket and status class"),
}


def _family(name: str, labels: tuple[str, ...] = ()):
    kind, text = METRICS[name]
    cls = GaugeMetricFamily if kind == "gauge" else CounterMetricFamily
    return cls(PREFIX + name, text, labels=list(labels))


class WatchCollector(Collector):
    """Collects from whichever sources watch runs (each may be None); ``sockets``: the listening
    sockets to read at each scrape; ``slots``: threads in total of a server without a stats server."""

    def __init__(self, stats: StatsWatch | None, socket_watch: SocketWatch | None, log: LogWatch | None,
                 slots: int | None = None):
        self.stats = stats
        self.socket_watch = socket_watch
        self.log = log
        self.slots = slots

    def describe(self):
        return []  # no description: registering must not collect (the sources may not have started)

    def collect(self):
        if self.stats is not None:
            yield from self._stats()
        if self.socket_watch is not None:
            yield from self._sockets()
        if self.log is not None:
            yield from self._log()

    def _stats(self):
        up = _family("up", ("stats",))
        up.add_metric([self.stats.address], 1.0 if self.stats.up() else 0.0)
        yield up
        restarts = _family("restarts", ("stats",))
        restarts.add_metric([self.stats.address], self.stats.restarts)
        yield restarts
        latest = self.stats.latest()
        if latest is None:
            return  # a stopped service has no workers to report: only up 0
        figures = self.stats.figures()
        per_worker = {name: _family(name, ("worker",)) for name in (
            "worker_busy_threads", "worker_threads", "worker_requests_in_flight_mean", "worker_requests",
            "worker_busy_seconds", "worker_respawns", "worker_harakiri", "worker_exceptions")}
        for wid, (_, requests, _) in sorted(latest.workers.items()):
            worker = [str(wid)]
            per_worker["worker_busy_threads"].add_metric(worker, latest.inflight.get(wid, 0))
            per_worker["worker_threads"].add_metric(worker, latest.cores)
            per_worker["worker_requests"].add_metric(worker, requests)
            if figures is not None and wid in figures.mean_inflight:
                per_worker["worker_requests_in_flight_mean"].add_metric(worker, figures.mean_inflight[wid])
            counters = latest.counters.get(wid)
            if counters is not None:
                per_worker["worker_busy_seconds"].add_metric(worker, counters.running_us / 1e6)
                per_worker["worker_respawns"].add_metric(worker, counters.respawns)
                per_worker["worker_harakiri"].add_metric(worker, counters.harakiri)
                per_worker["worker_exceptions"].add_metric(worker, counters.exceptions)
        yield from per_worker.values()
        errors = _family("listen_queue_errors")
        errors.add_metric([], latest.queue_errors)
        yield errors
        if figures is None:
            return
        window = {"all_busy_share": figures.all_busy, "worker_full_share": figures.worker_full,
                  "slots": figures.slots, "window_reads": figures.samples, "window_seconds": figures.span_s}
        if figures.pileup is not None:
            window["pileup_share"] = figures.pileup
        for name, value in window.items():
            family = _family(name)
            family.add_metric([], value)
            yield family
        busy = _family("busy_ratio", ("source",))
        busy.add_metric(["stats"], figures.busy_ratio)
        yield busy

    def _sockets(self):
        names = self.socket_watch.names()
        now = kernel_listeners(names)
        highest = self.socket_watch.window_max()
        queue, backlog, most, listening = (_family(n, ("socket",)) for n in (
            "listen_queue", "listen_backlog", "listen_queue_max", "listening"))
        for name in names:
            listener = now.get(name)
            listening.add_metric([name], 0.0 if listener is None else 1.0)
            if listener is None:
                continue  # not listening now (a restart in progress): no queue rather than a made-up 0
            queue.add_metric([name], listener.queue)
            backlog.add_metric([name], listener.backlog)
            most.add_metric([name], max(listener.queue, highest.get(name, 0)))
        yield from (listening, queue, backlog, most)

    def _log(self):
        histograms, lines = self.log.snapshot()
        yield from latency_families(histograms)
        log_lines = _family("log_lines", ("format",))
        for fmt, n in sorted(lines.items()):
            log_lines.add_metric([fmt], n)
        yield log_lines
        if self.slots and self.stats is None:
            seconds, span = self.log.busy_seconds(time.monotonic())
            if span > 0:
                busy = _family("busy_ratio", ("source",))
                busy.add_metric(["access_log"], min(1.0, seconds / span / self.slots))
                yield busy
                slots = _family("slots")
                slots.add_metric([], self.slots)
                yield slots


def latency_families(histograms: LatencyHistograms):
    """The latency histogram (cumulative buckets, as Prometheus wants them) and the answers per status class."""
    latency = HistogramMetricFamily(LATENCY, METRICS["upstream_response_seconds"][1],
                                    labels=["upstream", "status_class"])
    for (upstream, status_class), counts in sorted(histograms.counts.items()):
        cumulative, running = [], 0
        for bound, n in zip((*histograms.buckets, float("inf")), counts, strict=True):
            running += n
            cumulative.append(("+Inf" if bound == float("inf") else f"{bound:g}", running))
        latency.add_metric([upstream, status_class], cumulative, sum_value=histograms.sums[(upstream, status_class)])
    yield latency
    responses = _family("responses", ("status_class",))
    for status_class, n in sorted(histograms.answers.items()):
        responses.add_metric([status_class], n)
    yield responses
