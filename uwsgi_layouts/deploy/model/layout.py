"""The layout: processes x threads x socket strategy x options, validated on creation.

One ``Layout`` is the single source of every generated file (nginx.conf and the app server's
config: uwsgi.ini, gunicorn.conf.py or granian.env), so the nginx upstream and the server's
socket list cannot drift apart. Every field is checked here, with a message that names the
field and the allowed range. Nothing here touches the disk or asks the system: paths are
checked for what the files can hold, and ``deploy.machine.checked(layout)`` resolves them on
this machine (directories exist, the run user, the virtualenv's Python, the certificates) and
attaches ``run_as``, what the derived views of privileges need.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from uwsgi_layouts.deploy.model import hosts as multihost
from uwsgi_layouts.deploy.model import replicas as copies
from uwsgi_layouts.deploy.model.apps import AppTarget, parse_app
from uwsgi_layouts.deploy.model.errors import LayoutError
from uwsgi_layouts.deploy.model.fields import (
    RISKS,
    boolean,
    config_path,
    int_in,
    parse_allow,
    parse_cpus,
    parse_env,
    parse_host_port,
    parse_memory_mb,
    parse_open_file_cache,
    parse_static,
)
from uwsgi_layouts.deploy.model.hosts import CA_CERT, CLIENT_CERT, CLIENT_KEY, DEFAULT_TLS_NAME, host_cert, host_key
from uwsgi_layouts.deploy.model.strategies import STRATEGIES, SocketPlan, get_strategy

DEFAULT_APP = "app.wsgi:application"

MAX_PROCESSES = 256
MAX_THREADS = 256
MAX_NGINX_WORKERS = 64
# sockaddr_un.sun_path is 108 bytes on Linux, including the terminating NUL.
UNIX_PATH_MAX = 108
TRANSPORTS = ("tcp", "unix")
AIO_MODES = ("off", "threads")
THREAD_POOL = "ul_pool"
UNIX_SOCKET_MODE = "660"  # never uWSGI's bare `chmod-socket`, which means 666
STATS_SOCKET = "stats.sock"  # the lab's uWSGI stats server, in RUN_DIR/control/
# What nginx speaks to each app server, its default first. uWSGI: uwsgi (uwsgi_pass), http
# (http-socket: HTTP/1.0, a connection per request) or http11 (http11-socket: HTTP/1.1, connections
# kept alive by nginx's upstream); gunicorn: http or uwsgi; granian: http.
PROTOCOLS = {"uwsgi": ("uwsgi", "http", "http11"), "gunicorn": ("http", "uwsgi"), "granian": ("http",)}
# The uWSGI option that binds a plain socket of each protocol.
UWSGI_SOCKET_OPTION = {"uwsgi": "socket", "http": "http-socket", "http11": "http11-socket"}
LOCK_ENGINES = ("", "ipcsem")  # uWSGI's lock-engine: "" = its default (pthread robust mutexes)
# Options only some strategies take (Strategy.options), with the value meaning "not used".
STRATEGY_OPTIONS = {"reuse_port": False, "lock_engine": "", "keepalive": True}
# The largest listen backlog any kernel takes; deploy.machine checks this one's somaxconn.
MAX_BACKLOG = 2**31 - 1

# A module-level callable (no factory): what a production bundle's uwsgi.ini can name (module =).
APP_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class RunAs:
    """Who runs the stack on the machine that checked the layout (deploy.machine.checked): the
    run user's primary group, and whether this process is root (then the app server is started
    as the run user, and nginx's workers run as that user)."""

    group: str
    as_root: bool


@dataclass(frozen=True)
class Socket:
    """One app-server socket: its index (0-based; for uWSGI the order of `socket` lines) and
    who serves it."""

    index: int
    address: str  # "127.0.0.1:5000" or an absolute unix socket path
    workers: tuple[int, ...] | None  # 1-based worker ids; None = every worker
    role: str
    host: str = ""  # the app host that binds it ("" for a unix socket)

    @property
    def is_unix(self) -> bool:
        return self.address.startswith("/")

    @property
    def nginx_address(self) -> str:
        return f"unix:{self.address}" if self.is_unix else self.address


@dataclass(frozen=True)
class Layout:
    processes: int
    threads: int
    strategy: str
    app: str = DEFAULT_APP
    # The directory the app is imported from. "" = this project's (the demo app's).
    app_dir: str = ""
    # How nginx reaches the app server: unix sockets (0660: only the run user and nginx's workers
    # can connect) or tcp (loopback: any local user can connect and send raw uwsgi packets).
    # "" = unix, or tcp with what needs it: hosts (each binds its own address), uwsgi_tls, reuse_port.
    transport: str = ""
    base_port: int = 5000
    listen: str = "127.0.0.1:8000"
    nginx_workers: int | str = 1  # a count, or "auto" (one per core)
    backlog: int = 100
    # uWSGI's stats server: 0 = a unix socket (stats_address: RUN_DIR/control/stats.sock, mode 0660 in
    # the run user's 0750 control/), which only the stack's own users can open. A port puts it on
    # 127.0.0.1 TCP, where every local user reads the variables of requests in flight (cookies,
    # Authorization headers): refused unless the user accepts the risk tcp-stats (deploy.machine.risks).
    stats_port: int = 0
    # Per-request nginx log with the upstream each request went to (off: it costs CPU).
    access_log: bool = False
    # Started as root, uWSGI (uid/gid) and nginx's workers run as this user. "" = the
    # default: www-data (or nobody) under root, the invoking user otherwise.
    user: str = ""
    # Seconds after which uWSGI kills a stuck request's worker (0 = never).
    harakiri: int = 30
    # Extra attempts nginx makes on another socket for an idempotent request whose worker
    # failed (GET/HEAD only: a POST is never replayed). "" = 1 on one machine; with hosts, the
    # sockets of one host, so a request can skip every socket of a failed host.
    retries: int | str = ""
    # Seconds nginx waits to connect to a uWSGI socket; a full TCP backlog drops SYNs, so
    # this bounds how long an excess request hangs before failing.
    # "" = 2 on one machine, 1 with hosts (deploy.model.hosts.failure_policy).
    connect_timeout: int | str = ""
    # nginx's own I/O and accept tuning (defaults: nginx's own defaults).
    reuseport: bool = False  # one listen socket per nginx worker, balanced by the kernel
    accept_mutex: bool = False
    multi_accept: bool = False
    sendfile: bool = False
    sendfile_max_chunk: str = ""  # e.g. 512k; "" = nginx's default
    aio: str = "off"  # off | threads: blocking reads and sendfile go to a thread pool
    aio_threads: int = 32
    aio_max_queue: int = 65536
    # Entries per nginx worker in open_file_cache (descriptors, sizes, lookups kept between
    # requests, so a repeated file skips open()); 0 = off, nginx's default.
    open_file_cache: int = 0
    # A data set (uwsgi-layouts dataset): served as /files/<id> by the app through
    # X-Accel-Redirect, and as /static/<path> by nginx alone. "" = no file locations.
    data_dir: str = ""
    # Where the stack lives: nginx prefix, logs, pid files, unix sockets. Absolute.
    run_dir: str = ""
    # The app's virtualenv, used by uWSGI (`virtualenv =`) and by the pre-flight import.
    # "" = this project's venv (sys.prefix), which holds our uWSGI and the demo app.
    virtualenv: str = field(default="")
    # Environment variables for the app: ((KEY, VALUE), ...), rendered as uWSGI `env` lines.
    env: tuple[tuple[str, str], ...] = ()
    # Directories nginx serves itself: ((PREFIX, DIR), ...), PREFIX without trailing slash.
    static: tuple[tuple[str, str], ...] = ()
    # Options of some strategies only (variants such as 2x4-gunicorn@reuse_port=on):
    # gunicorn: every worker binds its own SO_REUSEPORT socket and the kernel spreads connections.
    reuse_port: bool = False
    # What nginx speaks to the app server (PROTOCOLS; "" = the server's default: uwsgi for uWSGI,
    # http for the peers). uWSGI's http and http11 sockets are variants to measure (README).
    protocol: str = ""
    # gunicorn, granian over HTTP: nginx keeps upstream connections open (upstream `keepalive`).
    # Off, every request opens a connection, so the server's workers accept each one anew.
    keepalive: bool = True
    # thunder: uWSGI's lock engine for the thunder lock ("" = uWSGI's default, or ipcsem).
    lock_engine: str = ""
    # The uWSGI binary to run, absolute ("" = the one beside this interpreter, the project's):
    # another build of the same uWSGI to measure (scripts/build-uwsgi.sh). A bundle names its
    # own (--uwsgi).
    uwsgi_bin: str = ""
    # Several app hosts (deploy/model/hosts.py): every host runs this layout's uWSGI bound to its own
    # address, and nginx balances over every socket of every host. () = this machine only.
    hosts: tuple[str, ...] = ()
    # How nginx talks to uWSGI: off (plain uwsgi: loopback only), suwsgi (uwsgi over TLS, with
    # a client certificate uWSGI requires), https (uWSGI's https-socket). "" = suwsgi when a
    # socket is not on loopback, else off.
    uwsgi_tls: str = ""
    # The certificates (uwsgi-layouts certs DIR --hosts ...), and the name every host's
    # certificate carries, which nginx verifies (uwsgi_ssl_name).
    uwsgi_tls_dir: str = ""
    uwsgi_tls_name: str = DEFAULT_TLS_NAME
    # nginx marks a socket down for fail_timeout seconds after max_fails failures within that
    # time. "" = for where the sockets are: never on one machine; measured values with hosts.
    max_fails: int | str = ""
    fail_timeout: int | str = ""
    # The app server's whole process tree runs in a cgroup of its own with this CPU quota (CPUs,
    # fractions allowed) and memory limit (MB), as a container runtime sets them (deploy/run/cgroup.py);
    # nginx and the load generator stay outside. None = no limit.
    cpus: float | None = None
    memory: int | None = None
    # Copies of the app server on this machine (deploy/model/replicas.py), each with its own sockets,
    # run directory, stats server and cgroup (the quota and memory limit above, each), behind one upstream.
    replicas: int = 1
    # The risks the user accepted, each by name (RISKS): deploy.machine.checked() refuses them otherwise.
    allow: tuple[str, ...] = ()
    # Filled by deploy.machine.checked(), never by a user: not an option, not in layout.json.
    run_as: RunAs | None = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731  (frozen dataclass)
        set_("processes", int_in("processes", self.processes, 1, MAX_PROCESSES))
        set_("threads", int_in("threads", self.threads, 1, MAX_THREADS))
        strategy = get_strategy(self.strategy)
        set_("app", parse_app(self.app).text)  # module:callable or module:factory(literals), normalised
        set_("app_dir", config_path("app_dir", str(self.app_dir)))
        if not self.transport:
            several = self.hosts.strip() if isinstance(self.hosts, str) else self.hosts
            tls = str(self.uwsgi_tls or "").strip().lower() not in ("", "off")
            reuse = str(self.reuse_port).strip().lower() in ("1", "true", "on", "yes")
            set_("transport", "tcp" if several or tls or reuse else "unix")
        if self.transport not in TRANSPORTS:
            raise LayoutError("transport", f"must be one of {', '.join(TRANSPORTS)}, got {self.transport!r}")
        set_("base_port", int_in("base_port", self.base_port, 1, 65535))
        host, port = parse_host_port("listen", self.listen)
        set_("listen", f"{host}:{port}")
        if str(self.nginx_workers).strip() == "auto":
            set_("nginx_workers", "auto")
        else:
            set_("nginx_workers", int_in("nginx_workers", self.nginx_workers, 1, MAX_NGINX_WORKERS))
        set_("backlog", int_in("backlog", self.backlog, 1, MAX_BACKLOG))
        set_("stats_port", int_in("stats_port", self.stats_port, 0, 65535))
        set_("access_log", boolean("access_log", self.access_log))
        set_("harakiri", int_in("harakiri", self.harakiri, 0, 3600))
        set_("user", str(self.user or "").strip())
        for flag in ("reuseport", "accept_mutex", "multi_accept", "sendfile"):
            set_(flag, boolean(flag, getattr(self, flag)))
        chunk = str(self.sendfile_max_chunk or "").strip()
        if chunk and not re.fullmatch(r"[1-9]\d{0,6}[kKmM]?", chunk):
            raise LayoutError("sendfile_max_chunk", f"expected a size such as 512k or 2m, got {chunk!r}")
        set_("sendfile_max_chunk", chunk.lower())
        if self.aio not in AIO_MODES:
            raise LayoutError("aio", f"must be one of {', '.join(AIO_MODES)}, got {self.aio!r}")
        set_("aio_threads", int_in("aio_threads", self.aio_threads, 1, 1024))
        set_("aio_max_queue", int_in("aio_max_queue", self.aio_max_queue, 0, 10_000_000))
        set_("open_file_cache", parse_open_file_cache(self.open_file_cache))
        if self.data_dir:
            set_("data_dir", config_path("data_dir", str(self.data_dir), nginx=True))
        if not self.run_dir:
            raise LayoutError("run_dir", "must be set (the directory the stack runs in)")
        set_("run_dir", config_path("run_dir", str(self.run_dir), nginx=self.transport == "unix"))
        set_("virtualenv", config_path("virtualenv", str(self.virtualenv or "")))
        set_("env", parse_env(self.env))
        set_("static", parse_static(self.static, self.data_dir))
        set_("reuse_port", boolean("reuse_port", self.reuse_port))
        set_("keepalive", boolean("keepalive", self.keepalive))
        allowed = PROTOCOLS[strategy.server]
        set_("protocol", str(self.protocol or "").strip() or allowed[0])
        if self.protocol not in allowed:
            takers = [s for s, protocols in PROTOCOLS.items() if self.protocol in protocols]
            also = f" (only {' and '.join(takers)} speak it)" if takers else ""
            raise LayoutError("protocol", f"{strategy.server} speaks {', '.join(allowed)} to nginx, got "
                                          f"{self.protocol!r}{also}")
        if self.lock_engine not in LOCK_ENGINES:
            raise LayoutError("lock_engine", f"must be ipcsem (System V semaphores) or empty for uWSGI's default "
                                             f"(pthread robust mutexes), got {self.lock_engine!r}")
        set_("allow", parse_allow(self.allow))
        set_("cpus", parse_cpus(self.cpus))
        set_("memory", parse_memory_mb(self.memory))
        self._check_strategy_options(strategy)
        set_("uwsgi_bin", config_path("uwsgi_bin", str(self.uwsgi_bin or "")))
        if self.uwsgi_bin and strategy.server != "uwsgi":
            raise LayoutError("uwsgi_bin", f"is uWSGI's binary; {self.strategy} runs {strategy.server}")
        self._check_protocol()  # before the certificates are looked for: a TLS conflict says so first
        multihost.validate(self, set_)  # hosts, uwsgi_tls*, max_fails, fail_timeout, retries, connect_timeout
        self._check_protocol()  # again with uwsgi_tls resolved ("" is suwsgi off loopback)
        copies.validate(self, set_)  # replicas: uWSGI only, not with hosts
        self._check_addresses()

    # --- derived views --------------------------------------------------------------

    @property
    def name(self) -> str:
        return f"{self.processes}x{self.threads}-{self.strategy}"

    @property
    def app_target(self) -> AppTarget:
        """The app parsed: module, callable, and the factory's arguments when it is a factory."""
        return parse_app(self.app)

    @property
    def strategy_obj(self):
        return STRATEGIES[self.strategy]

    @property
    def socket_plans(self) -> list[SocketPlan]:
        return self.strategy_obj.sockets(self.processes, self.threads)

    @property
    def server(self) -> str:
        """The program that runs the app: uwsgi, gunicorn or granian."""
        return self.strategy_obj.server

    @property
    def nginx_protocol(self) -> str:
        """What nginx speaks to the app server: uwsgi (uwsgi_pass) or http (proxy_pass; over TLS
        for uWSGI's https-socket)."""
        if self.uwsgi_tls == "https":
            return "http"
        return "uwsgi" if self.protocol == "uwsgi" else "http"

    @property
    def upstream_keepalive(self) -> bool:
        """nginx keeps connections to the app server open (upstream ``keepalive``, HTTP/1.1 and an
        empty Connection header): the HTTP peers unless ``keepalive`` is off, uWSGI's http11
        sockets (and its https sockets, as before). Never over the uwsgi protocol (nginx cannot)
        nor to uWSGI's http-socket (it closes after every answer, so a kept connection would fail)."""
        if self.nginx_protocol != "http":
            return False
        if self.server == "uwsgi":
            return self.uwsgi_tls == "https" or self.protocol == "http11"
        return self.keepalive

    @property
    def uwsgi_socket_option(self) -> str:
        """The uWSGI option of a plain socket: socket, http-socket or http11-socket."""
        return UWSGI_SOCKET_OPTION[self.protocol] if self.server == "uwsgi" else "socket"

    @property
    def has_stats(self) -> bool:
        """Only uWSGI has a stats server (per-worker pids and request counts)."""
        return self.server == "uwsgi"

    @property
    def unix_stats(self) -> bool:
        """uWSGI's stats server is a unix socket (stats_address), the default."""
        return self.has_stats and not self.stats_port

    @property
    def app_hosts(self) -> tuple[str, ...]:
        """The addresses uWSGI binds: the hosts, or this machine's loopback ("" for unix sockets)."""
        return self.hosts or (("127.0.0.1",) if self.transport == "tcp" else ("",))

    def host_sockets(self, host: str) -> list[Socket]:
        """The sockets one app host binds (indices from 0, as in its own uwsgi.ini)."""
        out = []
        for i, plan in enumerate(self.socket_plans):
            if self.transport == "unix":
                address = str(Path(self.run_dir) / "sockets" / f"{self.server}-{i}.sock")
            else:
                address = f"{host}:{self.base_port + i}"
            out.append(Socket(index=i, address=address, workers=plan.workers, role=plan.role, host=host))
        return out

    @property
    def sockets(self) -> list[Socket]:
        """Every socket nginx reaches: each app host's, host after host (with replicas, each
        replica's, replica after replica)."""
        return [s for copy in self.app_copies for host in copy.app_hosts for s in copy.host_sockets(host)]

    @property
    def app_copies(self) -> list["Layout"]:
        """The layouts of the app servers on one app host: each replica's, or this one alone."""
        return copies.replica_layouts(self) or [self]

    def host_layout(self, host: str) -> "Layout":
        """The layout one app host runs: its own sockets, and its own run directory
        (run_dir/hosts/ADDR: uwsgi.ini, control/, logs/) for its uWSGI."""
        if host not in self.hosts:
            raise LayoutError("hosts", f"{host} is not one of the layout's hosts {', '.join(self.hosts)}")
        return replace(self, hosts=(host,), run_dir=str(self.host_dir(host)))

    def host_dir(self, host: str) -> Path:
        return Path(self.run_dir) / "hosts" / host

    @property
    def uwsgi_tls_files(self) -> dict[str, str]:
        """The certificate paths the configs name: ca, client_cert, client_key (nginx's), and
        cert/key of the layout's single host (a host layout's own)."""
        if self.uwsgi_tls == "off":
            return {}
        base = Path(self.uwsgi_tls_dir)
        files = {"ca": base / CA_CERT, "client_cert": base / CLIENT_CERT, "client_key": base / CLIENT_KEY}
        if len(self.app_hosts) == 1:
            files |= {"cert": base / host_cert(self.app_hosts[0]), "key": base / host_key(self.app_hosts[0])}
        return {k: str(v) for k, v in files.items()}

    @property
    def nginx_scheme(self) -> str:
        """What uwsgi_pass/proxy_pass names before the upstream: uwsgi (none), suwsgi, http, https."""
        if self.nginx_protocol == "uwsgi":
            return "suwsgi" if self.uwsgi_tls == "suwsgi" else "uwsgi"
        return "https" if self.uwsgi_tls == "https" else "http"

    @property
    def upstream_servers(self) -> list[tuple[Socket, tuple[str, ...]]]:
        plans = self.strategy_obj.servers(self.socket_plans, self.threads)
        servers = []
        for copy in self.app_copies:
            for h in self.app_hosts:
                # Once per host, not per server: 256 sockets would build 256 x 256 of them.
                own = copy.host_sockets(h)
                servers += [(own[p.socket_index], p.params) for p in plans]
        if self.server == "uwsgi" and self.protocol == "http11":
            # A kept connection holds one uWSGI thread: at most T connections per worker's socket.
            servers = [(s, params if any(p.startswith("max_conns=") for p in params)
                        else (*params, f"max_conns={self.threads}")) for s, params in servers]
        primaries = [s for s, params in servers if "backup" not in params]
        if self.retries and len(primaries) == 1 and len(servers) == 1 and self.protocol != "http11":
            # nginx never retries a lone server, so a request whose worker died would fail.
            # The same socket again, as backup, gives the retry a peer: any other worker
            # accepting on that socket takes it. It carries no traffic otherwise. (Not for
            # http11: a second entry would let nginx keep 2 x T connections to T threads.)
            servers.append((primaries[0], ("backup",)))
        # uWSGI's master keeps every socket open (so does gunicorn's; with SO_REUSEPORT the
        # other workers' listeners stay), so a failure means one dead or busy worker that is
        # back within milliseconds (or seconds: granian respawns after 3.5 s). nginx's default
        # (max_fails=1 fail_timeout=10s) would shut the socket out for 10 s: measured, after a
        # kill -9 on mapped throughput fell from ~200 to ~95 req/s for 10 s, and a full backlog
        # left "no live upstreams" for 7-9 s after the load stopped. Never mark a socket down.
        # Across hosts a whole host can be down: see deploy.model.hosts.failure_policy.
        failure = (f"max_fails={self.max_fails}", f"fail_timeout={self.fail_timeout}s") if self.max_fails \
            else ("max_fails=0",)
        return [(s, (*failure, *params)) for s, params in servers]

    def allows(self, risk: str) -> bool:
        """Did the user accept ``risk`` (one of RISKS: ``--allow-RISK``)?"""
        if risk not in RISKS:  # a programming error: a check names a risk nobody can accept
            raise KeyError(risk)
        return risk in self.allow

    @property
    def warnings(self) -> list[str]:
        """What this layout exposes that the user chose and should hear about (one line each)."""
        out = []
        if self.has_stats and self.stats_port:
            out.append(f"stats on {self.stats_address} (--allow-tcp-stats): any local user can read uWSGI's stats "
                       "server, and with it the variables of every request in flight (Cookie, Authorization "
                       "headers); the default, a unix socket only the run user's group can open, keeps them out")
        if self.transport != "tcp" or self.hosts or self.uwsgi_tls != "off" or self.server != "uwsgi":
            return out
        first, last = self.base_port, self.base_port + len(self.socket_plans) - 1
        ports = str(first) if first == last else f"{first}-{last}"
        return out + [f"transport tcp: any local user can send raw uwsgi packets to 127.0.0.1:{ports}, bypassing nginx "
                "(UWSGI_SETENV changes a worker's environment, UWSGI_POSTFILE reads a file as the run user); "
                "code-loading packets get a 403; unix sockets (the default) keep other users out"]

    @property
    def checked_here(self) -> RunAs:
        if self.run_as is None:  # a programming error: the machine room runs before render and run
            raise RuntimeError(f"layout {self.name} was not checked against this machine: pass it through "
                               "deploy.machine.checked() first")
        return self.run_as

    @property
    def drops_privileges(self) -> bool:
        """True when started as root: the app server is started as ``user`` (with TLS uWSGI's
        master stays root, its workers run as ``user``); nginx's workers run as ``user``."""
        return self.checked_here.as_root and self.user != "root"

    @property
    def group(self) -> str:
        return self.checked_here.group

    @property
    def stats_address(self) -> str:
        """A unix socket beside uWSGI's pid file and master FIFO (control/: the run user's, 0750),
        or with a stats_port, loopback TCP: the stats server shows every request in flight."""
        return f"127.0.0.1:{self.stats_port}" if self.stats_port else str(Path(self.run_dir) / "control" / STATS_SOCKET)

    @property
    def listen_host(self) -> str:
        return self.listen.rpartition(":")[0]

    @property
    def listen_port(self) -> int:
        return int(self.listen.rpartition(":")[2])

    @property
    def url(self) -> str:
        return f"http://{self.listen}/"

    def to_dict(self) -> dict:
        data = asdict(self)
        del data["run_as"]
        data["name"] = self.name
        data["sockets"] = [
            {"index": s.index, "address": s.address, "workers": list(s.workers) if s.workers else None, "role": s.role,
             **({"host": s.host} if self.hosts else {})}
            for s in self.sockets
        ]
        data["upstream"] = [{"address": s.nginx_address, "params": list(p)} for s, p in self.upstream_servers]
        data["server"] = self.server
        data["stats"] = self.stats_address if self.has_stats else None
        return data

    # --- validation helpers -----------------------------------------------------------

    def _check_strategy_options(self, strategy) -> None:
        for option, unused in STRATEGY_OPTIONS.items():
            if getattr(self, option) == unused or option in strategy.options:
                continue
            takers = [name for name, s in STRATEGIES.items() if option in s.options]
            raise LayoutError(option, f"does not apply to {self.strategy} (only to {', '.join(takers)}); "
                                      f"remove it or use e.g. {self.processes}x{self.threads}-{takers[0]}")
        if not self.keepalive and self.protocol != "http":
            raise LayoutError("keepalive", f"applies to HTTP only: over {self.protocol} nginx keeps no upstream "
                                           "connection anyway; remove it")
        if self.reuse_port and self.transport != "tcp":
            raise LayoutError("reuse_port", "needs transport tcp (--transport tcp, or @reuse_port=on,transport=tcp "
                                            "in a variant): SO_REUSEPORT spreads TCP connections, and each worker "
                                            "would replace the others' unix socket")

    def _check_protocol(self) -> None:
        """uWSGI's HTTP sockets, in the forms that work behind nginx (see the README's overhead
        section): plain HTTP on one machine, http11 only where nginx can never hold more kept
        connections to a socket than it has threads (a kept connection pins a uWSGI thread,
        which then accepts nothing else until uWSGI's socket-timeout)."""
        if self.server != "uwsgi" or self.protocol == "uwsgi":
            return
        if self.uwsgi_tls not in ("", "off"):
            raise LayoutError("protocol", f"{self.protocol} is plain HTTP; with uwsgi_tls {self.uwsgi_tls} uWSGI "
                                          "speaks TLS (uwsgi_tls https is HTTP over TLS): drop one of them")
        if self.protocol == "http11":
            if self.strategy == "overflow" or (self.processes > 1 and not self.strategy_obj.one_socket_per_worker):
                raise LayoutError("protocol", f"http11 needs one socket per worker (mapped) or one worker: with "
                                              f"{self.strategy} kept connections can pin more threads of one worker "
                                              "than it has")
            if self.nginx_workers != 1:
                raise LayoutError("protocol", "http11 needs nginx_workers 1: each nginx worker keeps its own "
                                              "connections, and more kept connections than threads stall requests "
                                              "for uWSGI's socket-timeout")

    def _check_addresses(self) -> None:
        n = len(self.socket_plans) * self.replicas  # replica after replica (deploy/model/replicas.py)
        stats_ports = range(self.stats_port, self.stats_port + self.replicas) if self.has_stats and self.stats_port \
            else range(0)
        if stats_ports and stats_ports[-1] > 65535:
            raise LayoutError("stats_port", f"{self.replicas} replicas need stats ports {self.stats_port}.."
                                            f"{stats_ports[-1]}; must end at 65535 or below")
        if self.listen_host in ("127.0.0.1", "0.0.0.0") and self.listen_port in stats_ports:
            raise LayoutError("stats_port", f"port {self.listen_port} is already the nginx listen port; pick another"
                              + (f" (replicas use stats ports {self.stats_port}..{stats_ports[-1]})"
                                 if self.replicas > 1 else ""))
        if self.transport == "tcp":
            last = self.base_port + n - 1
            if last > 65535:
                raise LayoutError(
                    "base_port",
                    f"{n} sockets need ports {self.base_port}..{last}; must end at 65535 or below",
                )
            ports = {self.base_port + i: f"{self.server} socket {i}" for i in range(n)}
            taken = {port: "stats_port" for port in stats_ports}
            if self.listen_host in ("127.0.0.1", "0.0.0.0", *self.hosts):
                taken[self.listen_port] = "listen"
            for port, what in ports.items():
                if port in taken:
                    raise LayoutError(
                        "base_port",
                        f"{what} would use port {port}, already taken by {taken[port]}; "
                        f"choose ports {self.base_port}..{last} clear of listen and stats_port",
                    )
        unix = [s.address for s in self.sockets if s.is_unix] + ([self.stats_address] if self.unix_stats else [])
        if unix:
            longest = max(unix, key=len)
            if len(longest.encode()) + 1 > UNIX_PATH_MAX:
                raise LayoutError(
                    "run_dir",
                    f"unix socket path {longest!r} is {len(longest.encode())} bytes; the kernel allows "
                    f"{UNIX_PATH_MAX - 1} (108 with the NUL): use a shorter --out/--run-dir",
                )
