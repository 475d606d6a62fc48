"""``uwsgi-layouts watch``: a running service's figures as a Prometheus endpoint, until stopped.

    uwsgi-layouts watch [--stats ADDRESS] [--socket ADDRESS ...] [--access-log FILE | --access-log-socket PATH]
                        [--slots N]
                        [--listen ADDRESS] [--allow-public-listen] [--window SECONDS] [--hz N]

What it reads (``bench.watch``): a uWSGI stats server (per worker busy threads, requests,
respawns, harakiri; pile-up and every-thread-busy shares over the sliding window, as doctor
computes them), the kernel's accept queue and backlog of any server's listening sockets (the
stats server's by default, ``--socket`` for gunicorn or granian), and nginx's access log in a
timed format (latency histograms per upstream socket and status class), tailed from a file or
received as syslog datagrams on a unix socket it creates (``--access-log-socket``: a pod's
sidecar, where a file would grow with nothing to rotate it). A stats server that
does not answer, or a service restarting, is no error: ``uwsgi_layouts_up`` says 0 until it
answers again, and the change is said once on stderr.

The endpoint listens on loopback (default 127.0.0.1:9717) or a unix socket; another address only
with ``--allow-public-listen``. Exit codes: 0 stopped by SIGTERM or Ctrl-C, 2 bad input (one line:
a malformed or public address, a port in use, an access log not in a timed format, nothing to
watch; nothing is left running).

A tool of its own (``console.TOOLS``), not an experiment kind: a process that runs for months
loads no more than it uses (about 30 MB; the kinds' plotting libraries would add 50).
"""

from __future__ import annotations

import signal
import threading
from argparse import ArgumentTypeError

from prometheus_client import CollectorRegistry, ProcessCollector

from uwsgi_layouts.arguments import PROG, Ints, Numbers, OneLineParser
from uwsgi_layouts.bench.observe import parse_timed_line
from uwsgi_layouts.bench.options import BadArgument, stats_address, tool_main
from uwsgi_layouts.bench.watch import (
    DatagramLog,
    LogWatch,
    MetricsServer,
    SocketWatch,
    StatsWatch,
    WatchCollector,
    is_loopback,
    is_timed,
    last_lines,
    listen_address,
    say,
)
from uwsgi_layouts.deploy.machine import accept
from uwsgi_layouts.deploy.model import RISKS

DEFAULT_LISTEN = "127.0.0.1:9717"
DEFAULT_WINDOW_S = 60
MAX_WINDOW_S = 3600
# Two reads a second: enough samples for a 60-s window's shares (120 reads), and measured within
# the 2% throughput budget on the article's mix where 10 a second cost 1.6% (docs/watch.md).
DEFAULT_HZ = 2.0
MAX_HZ = 50.0
MAX_SLOTS = 100_000
SLOTS = Ints(1, MAX_SLOTS)
WINDOW_S = Ints(5, MAX_WINDOW_S)
HZ = Numbers(1, MAX_HZ)
# Upper bounds in seconds: fine where web requests end, coarse in the tail (the p99 is read to a bucket's width).
DEFAULT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.125, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5, 2.0,
                   3.0, 5.0, 10.0, 30.0)
HELP = ("export a running service's figures to Prometheus, continuously (uWSGI's stats server: pile-up, busy "
        "threads; any server: accept queues, busy ratio; nginx's log: latency histograms)")
# What a timed line looks like: the bundle's log_format (deploy's site.conf.j2).
TIMED_FORMAT = ("nginx's combined format followed by rt=$request_time urt=\"$upstream_response_time\" "
                "ua=\"$upstream_addr\" (the bundle's log_format uwsgi_layouts_NAME_timed)")


def build_parser(prog: str = f"{PROG} watch") -> OneLineParser:
    p = OneLineParser(prog=prog, description=HELP)
    p.add_argument("--stats", metavar="ADDRESS", type=stats_address,
                   help="a uWSGI stats server: HOST:PORT (e.g. 127.0.0.1:9191) or a unix socket path (the bundle's "
                        "/run/NAME/SLOT/stats.sock); only read")
    p.add_argument("--socket", action="append", metavar="ADDRESS", type=socket_address,
                   help="a listening socket of the app server whose accept queue to export: a unix path or "
                        "HOST:PORT (repeatable; default: the stats server's sockets); for gunicorn or granian")
    p.add_argument("--access-log", metavar="FILE",
                   help=f"nginx's access log of the site, tailed, in a timed format: {TIMED_FORMAT}")
    p.add_argument("--access-log-socket", metavar="PATH",
                   help="instead of --access-log: a unix datagram socket watch creates (mode 0660, removed on exit) "
                        "for nginx's `access_log syslog:server=unix:PATH,nohostname FORMAT` in a timed format")
    p.add_argument("--slots", metavar="N", type=SLOTS,
                   help=f"threads in total (workers x threads) of a server without a stats server (gunicorn, "
                        f"granian), {SLOTS}: the busy ratio from the access log's upstream times is over these")
    p.add_argument("--listen", metavar="ADDRESS",
                   help=f"where to serve /metrics: HOST:PORT or a unix socket path (default {DEFAULT_LISTEN}); an "
                        "address beyond loopback needs --allow-public-listen")
    p.add_argument("--allow-public-listen", action="store_true", help=f"accept the risk: {RISKS['public-listen']}"
                   " (here: the metrics endpoint)")
    p.add_argument("--window", metavar="SECONDS", type=WINDOW_S, default=DEFAULT_WINDOW_S,
                   help=f"the sliding window of the shares and the busy ratio, {WINDOW_S} s (default "
                        f"{DEFAULT_WINDOW_S})")
    p.add_argument("--hz", type=HZ, default=DEFAULT_HZ,
                   help=f"stats-server and socket reads per second, {HZ} (default {DEFAULT_HZ:g})")
    return p


def socket_address(raw: str) -> str:
    """--socket: a listening socket's address, HOST:PORT (or :PORT) or a unix socket path."""
    text = raw.strip()
    try:
        listen_address(text if not text.startswith(":") else "0.0.0.0" + text)
    except ValueError as exc:
        raise ArgumentTypeError(str(exc)) from None
    return text


def listen_arg(raw: str | None, allow_public: bool) -> tuple[str, str, int]:
    try:
        kind, host, port = listen_address(raw or DEFAULT_LISTEN)
    except ValueError as exc:
        raise BadArgument(f"listen: {exc}") from None
    if kind == "tcp" and not allow_public and not is_loopback(host):
        shown = "every interface" if host in ("0.0.0.0", "::") else host
        raise BadArgument(f"listen: {raw} would serve the metrics on {shown}, reachable by other machines; listen on "
                          f"127.0.0.1 or a unix socket, or pass {accept('public-listen')}")
    return kind, host, port


def log_socket_arg(raw: str | None, access_log: str | None) -> str | None:
    if raw is None:
        return None
    if access_log:
        raise BadArgument("access_log_socket: give --access-log (a file) or --access-log-socket, not both")
    path = raw.strip()
    if not path.startswith("/") or len(path.encode()) > 107:
        raise BadArgument(f"access_log_socket: a unix socket path must be absolute and at most 107 bytes, got {raw!r}")
    return path


def check_log(path: str) -> None:
    """Refuse a log whose recent lines carry no upstream times (an empty log is taken: it may fill)."""
    try:
        lines = [x for x in last_lines(path) if x.strip()]
    except OSError as exc:
        raise BadArgument(f"access_log: cannot read {path} ({exc.strerror or exc})") from None
    if lines and not any(is_timed(parse_timed_line(x)) for x in lines):
        raise BadArgument(f"access_log: {path} is not in a timed format (no line carries $upstream_response_time); "
                          f"needed: {TIMED_FORMAT}")


def run(args) -> int:
    stats, sockets, slots, window_s, hz = args.stats, args.socket or [], args.slots, args.window, args.hz
    listen = listen_arg(args.listen, args.allow_public_listen)
    log_socket = log_socket_arg(args.access_log_socket, args.access_log)
    if stats is None and not sockets and not args.access_log and not log_socket:
        raise BadArgument("stats: nothing to watch: give --stats (uWSGI), --socket (any server) or --access-log")
    if slots is not None and (stats is not None or not (args.access_log or log_socket)):
        raise BadArgument("slots: only for a server without a stats server, with --access-log (uWSGI's busy ratio "
                          "comes from --stats)")
    if args.access_log:
        check_log(args.access_log)
    stats_watch = StatsWatch(stats, hz, window_s) if stats else None

    def socket_names() -> list[str]:
        latest = stats_watch.latest() if stats_watch else None
        return list(dict.fromkeys([*sockets, *(latest.sockets if latest and not sockets else ())]))

    socket_watch = SocketWatch(socket_names, hz, window_s) if stats or sockets else None
    registry = CollectorRegistry(auto_describe=False)
    ProcessCollector(registry=registry)  # the exporter's own CPU and memory: what it costs
    try:
        server = MetricsServer(*listen, registry)
    except OSError as exc:
        raise BadArgument(f"listen: cannot listen on {args.listen or DEFAULT_LISTEN} ({exc.strerror or exc})") from None
    log_watch = None
    running: list = []
    try:
        if args.access_log:
            try:
                log_watch = LogWatch(args.access_log, DEFAULT_BUCKETS, window_s)
            except OSError as exc:
                raise BadArgument(f"access_log: cannot read {args.access_log} ({exc.strerror or exc})") from None
        elif log_socket:
            try:
                log_watch = LogWatch(log_socket, DEFAULT_BUCKETS, window_s, tail=DatagramLog(log_socket))
            except OSError as exc:
                raise BadArgument(f"access_log_socket: cannot create {log_socket} ({exc.strerror or exc})") from None
        registry.register(WatchCollector(stats_watch, socket_watch, log_watch, slots))
        stop = threading.Event()
        previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            server.start()
            watched = [f"stats {stats}" if stats else "", f"sockets {', '.join(sockets)}" if sockets else "",
                       f"access log {args.access_log}" if args.access_log else "",
                       f"access log datagrams on {log_socket}" if log_socket else ""]
            # The first line out, before any source can say something: what a supervisor waits for.
            print(f"watch: serving metrics on {server.url} ({'; '.join(w for w in watched if w)}, a {window_s}-s "
                  f"window, {hz:g} reads/s); SIGTERM or Ctrl-C stops", flush=True)
            for source in (stats_watch, socket_watch, log_watch):
                if source is not None:
                    source.start()
                    running.append(source)
            # As often as the stats server is read: a master pid must be seen before a restart replaces it.
            while True:
                if stats_watch is not None:
                    stats_watch.check()
                failed = [s.failure for s in (socket_watch, log_watch) if s is not None and s.failure]
                if failed:
                    say(f"stopping: {failed[0]}")
                    return 1
                if stop.wait(1 / hz):
                    break
            say("stopped")
            return 0
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    finally:
        server.close()
        for source in reversed(running):
            source.stop()
        if log_watch is not None and log_watch not in running:
            log_watch.tail.close()


def main(argv: list[str] | None = None) -> int:
    return tool_main(build_parser, run, argv)
