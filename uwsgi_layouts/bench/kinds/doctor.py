"""``uwsgi-layouts doctor``: diagnose a running uWSGI from its stats server, without a benchmark.

    uwsgi-layouts doctor --stats ADDRESS [--for SECONDS] [--hz N] [--access-log FILE] [--out DIR]

ADDRESS is a uWSGI stats server: a unix socket path (the bundle's ``/run/NAME/SLOT/stats.sock``,
the lab's ``RUN_DIR/control/stats.sock``) or ``HOST:PORT``. Doctor only reads it (the server
writes one JSON document per connection and closes), ``--hz`` times a second for ``--for``
seconds, with compare's in-flight sampler (``bench.observe.Sampler``); where the service runs on
this machine it also reads the workers' memory (PSS when readable, else RSS), which sockets each
worker holds (/proc/PID/fd), unix sockets' listen queues (sock_diag) and the kernel's TCP listen
overflows. ``--access-log``: nginx's log of the site, read from its end for the same window.
Nothing of a request's variables (headers, cookies) is kept: the stats reader (deploy.machine's
``read_stats``) drops them. A stats server other local users can open (TCP on any address, or a
unix socket others may connect to and reach) is the first finding, with what to change.

The window's figures become one ``Diagnosis`` (``bench.diagnosis``) in ``results.json`` of kind
``doctor``, and what they mean (the findings, the ``bench tune`` suggestion) is judged once into
``summary.json`` beside it (``bench.doctor_summary``); both are printed with the layout in use, and
written with a timeline plot (``bench.report.doctor``); ``uwsgi-layouts report`` renders them again
from the two files.

Exit codes: 0 the window was watched (whatever it found, "no traffic" included), 1 the service
stopped answering during the window (the figures so far are written, and say so), 2 bad input
(no stats server at ADDRESS, not a stats server, an option out of range: one line, nothing
written), 130 interrupted (the figures so far are written).
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

from uwsgi_layouts.arguments import Ints, Numbers
from uwsgi_layouts.bench.diagnosis import Window, diagnose, layout_of, layout_words, summarise_access
from uwsgi_layouts.bench.doctor_summary import summarize
from uwsgi_layouts.bench.environment import capture
from uwsgi_layouts.bench.kinds.base import RESULTS_NAME, Kind, publish, sigterm_interrupts
from uwsgi_layouts.bench.observe import (
    LogTail,
    Sample,
    Sampler,
    kernel_listen_overflows,
    read_sample,
    socket_holdings,
    uwsgi_config,
    worker_memory,
    workers_are_local,
)
from uwsgi_layouts.bench.options import BadArgument, command_line, prepare_out, stats_address
from uwsgi_layouts.bench.results import Results, utc_now
from uwsgi_layouts.deploy.machine import is_unix_address, read_stats, stats_exposure

DEFAULT_FOR_S = 60
MAX_FOR_S = 3600
DEFAULT_HZ = 25.0
MAX_HZ = 100.0
MAX_SAMPLES = 36_000  # an hour at 10 Hz; about 1 KB each with 2 workers (more with more workers)
FOR_S = Ints(1, MAX_FOR_S)
HZ = Numbers(1, MAX_HZ)
PROBE_TIMEOUT_S = 2.0
STOPPED_AFTER_S = 1.0  # reads failing this long: the service stopped
MEMORY_EVERY_S = 5.0
POLL_S = 0.1
EXIT_STOPPED = 1
EXIT_INTERRUPTED = 130


def add_arguments(p) -> None:
    p.add_argument("--stats", required=True, metavar="ADDRESS", type=stats_address,
                   help="the uWSGI stats server: a unix socket path (the bundle's /run/NAME/SLOT/stats.sock) or "
                        "HOST:PORT (e.g. 127.0.0.1:9191); only read, never written to")
    p.add_argument("--for", dest="for_s", metavar="SECONDS", type=FOR_S, default=DEFAULT_FOR_S,
                   help=f"how long to watch, {FOR_S} s (default {DEFAULT_FOR_S}); at most {MAX_SAMPLES} reads, so "
                        f"beyond {int(MAX_SAMPLES / DEFAULT_HZ)} s lower --hz")
    p.add_argument("--hz", type=HZ, default=DEFAULT_HZ,
                   help=f"stats-server reads per second, {HZ} (default {DEFAULT_HZ:g})")
    p.add_argument("--access-log", metavar="FILE",
                   help="nginx's access log of the site (the bundle's, i.e. combined, or combined with "
                        "$upstream_response_time), read from its end for the same window: latency per status "
                        "class and per upstream socket")
    p.add_argument("--out", help="output directory (default results/<timestamp>-doctor)")


def probe(address: str) -> dict:
    """The stats server's first document, or BadArgument saying in one line why there is none."""
    try:
        doc = read_stats(address, timeout=PROBE_TIMEOUT_S)
        read_sample(doc, 0.0)  # every field the sampler needs is there
        return doc
    except (FileNotFoundError, ConnectionRefusedError) as exc:
        raise BadArgument(f"stats: no stats server at {address} ({exc.strerror})") from None
    except PermissionError:
        raise BadArgument(f"stats: {address}: permission denied (run as root, or as a member of the socket's "
                          "group)") from None
    except (TimeoutError, socket.timeout):
        raise BadArgument(f"stats: {address} is not a uWSGI stats server (no document within "
                          f"{PROBE_TIMEOUT_S:g} s)") from None
    except OSError as exc:
        raise BadArgument(f"stats: cannot read {address} ({exc.strerror or exc})") from None
    except (ValueError, KeyError, TypeError) as exc:
        reason = f"no field {exc}" if isinstance(exc, KeyError) else str(exc).splitlines()[0][:120]
        raise BadArgument(f"stats: {address} is not a uWSGI stats server ({reason})") from None


def exposure(address: str) -> dict:
    """Who besides the service's own users can open its stats server ({} = nobody), as recorded."""
    found = stats_exposure(address)
    return found.to_dict() if found.who else {}


def open_log(path: str | None) -> LogTail | None:
    if not path:
        return None
    try:
        return LogTail(path)
    except OSError as exc:
        raise BadArgument(f"access_log: cannot read {path} ({exc.strerror or exc})") from None


# --------------------------------------------------------------------------- this machine's view


class MemoryWatch:
    """Each worker's memory every ``MEMORY_EVERY_S``: PSS (or RSS) from /proc when the service is
    local, else the RSS the stats server reports (with uWSGI's memory-report)."""

    def __init__(self, local: bool):
        self.local = local
        self.kind = ""
        self.series: dict[int, list[tuple[float, int, int]]] = {}

    def take(self, sample: Sample | None) -> None:
        if sample is None:
            return
        for wid, (pid, _, _) in sample.workers.items():
            reading = worker_memory(pid) if self.local else None
            if reading is None and sample.counters.get(wid) and sample.counters[wid].rss:
                reading = ("rss", sample.counters[wid].rss)
            if reading is None or (self.kind and reading[0] != self.kind):
                continue
            self.kind = reading[0]
            self.series.setdefault(wid, []).append((sample.t, pid, reading[1]))


def queue_source(doc: dict) -> str:
    names = [str(s["name"]) for s in doc.get("sockets", [])]
    unix = sum(1 for n in names if is_unix_address(n))
    parts = []
    if unix:
        parts.append("unix sockets: the kernel (sock_diag), every sample")
    if len(names) > unix:
        parts.append("TCP sockets: uWSGI's master, refreshed once a second")
    return "; ".join(parts)


# --------------------------------------------------------------------------- the window


def watch(sampler: Sampler, for_s: float, master: int, memory: MemoryWatch) -> tuple[str, str, Sample | None]:
    """Wait out the window: (how it ended, a note, the last full sample of this master)."""
    next_memory = 0.0
    last_good: Sample | None = None
    while True:
        now = sampler.now()
        latest = sampler.latest
        if latest is not None and latest.master == master:
            last_good = latest
        elif latest is not None:
            return "stopped", (f"uWSGI was restarted at {latest.t:.1f} s of {for_s:g} (master pid {master} -> "
                               f"{latest.master}): the figures cover the window up to then"), last_good
        failing = sampler.failing_since
        if failing is not None and now - failing >= STOPPED_AFTER_S:
            return "stopped", (f"the stats server stopped answering at {failing:.1f} s of {for_s:g} "
                               f"({sampler.last_error}): the figures cover the window up to then"), last_good
        if now >= for_s:
            memory.take(last_good)
            return "complete", "", last_good
        if now >= next_memory and last_good is not None:
            memory.take(last_good)
            next_memory = now + MEMORY_EVERY_S
        time.sleep(min(POLL_S, max(0.0, for_s - now)))  # the sampler thread reads; this only watches the clock


def run(args) -> int:
    address, for_s, hz = args.stats, args.for_s, args.hz
    if for_s * hz > MAX_SAMPLES:
        raise BadArgument(f"for: at {hz:g} Hz at most {int(MAX_SAMPLES / hz)} s ({MAX_SAMPLES} samples); lower "
                          "--hz for a longer window")
    doc = probe(address)
    tail = open_log(args.access_log)
    try:
        out = prepare_out(args.out, "-doctor")
        local = workers_are_local(doc)
        config, app = uwsgi_config(doc["pid"]) if local else ("", {})
        layout = layout_of(doc, socket_holdings(doc) if local else None, app, config)
        print(f"doctor: watching uWSGI {layout['uwsgi']} at {address} for {for_s} s, {hz:g} reads/s: "
              f"{layout_words(layout)} ({layout['evidence']}); Ctrl-C ends the window early", flush=True)
        tcp = any(not is_unix_address(str(s["name"])) for s in doc.get("sockets", []))
        overflows_before = kernel_listen_overflows() if tcp and local else None
        memory = MemoryWatch(local)
        sampler = Sampler(address, interval=1 / hz, unix_queues=True)
        with sigterm_interrupts(), sampler:
            try:
                ended, note, last = watch(sampler, for_s, int(doc["pid"]), memory)
            except KeyboardInterrupt:
                ended, note, last = "interrupted", f"interrupted at {sampler.now():.1f} s of {for_s}", sampler.latest
        overflows_after = kernel_listen_overflows() if overflows_before is not None else None
        lines = tail.read() if tail else []
    finally:
        if tail:
            tail.close()
    samples = [s for s in sampler.samples if s.master == doc["pid"] and (last is None or s.t <= last.t)]
    record = diagnose(Window(
        address=address, planned_s=for_s, hz=hz, layout=layout, samples=samples, first=sampler.first, latest=last,
        memory=memory.series, memory_kind=memory.kind, queue_source=queue_source(doc),
        kernel_overflows=(max(0, overflows_after - overflows_before) if overflows_after is not None
                          and overflows_before is not None else None),
        access=summarise_access(lines, str(args.access_log), tail.cut) if tail else {},
        ended=ended, end_note=note, exposure=exposure(address)))
    results = Results(kind="doctor", environment=capture(), created=utc_now(), diagnoses=(record,), workload={},
                      arguments={"stats": address, "for": for_s, "hz": hz, "access_log": args.access_log,
                                 "command": command_line("doctor", getattr(args, "argv", None))})
    saved = results.save(Path(out) / RESULTS_NAME)
    publish(results, Path(out), saved=saved, summary=summarize(results))  # judged once: every view, summary.json
    return {"complete": 0, "stopped": EXIT_STOPPED}.get(ended, EXIT_INTERRUPTED)


KIND = Kind("doctor", "diagnose a running uWSGI from its stats server (pile-up, saturation, listen queue, "
                      "harakiri, memory) and suggest a layout to try, without a benchmark", add_arguments, run)
