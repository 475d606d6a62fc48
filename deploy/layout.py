"""The layout: processes x threads x socket strategy x options, validated on creation.

One ``Layout`` is the single source of every generated file (nginx.conf and the app server's
config: uwsgi.ini, gunicorn.conf.py or granian.env), so the nginx upstream and the server's
socket list cannot drift apart. Every field is checked here, with a message that names the
field and the allowed range; nothing touches the disk.
"""

from __future__ import annotations

import grp
import ipaddress
import os
import pwd
import re
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from deploy import hosts as multihost
from deploy.appenv import server_python, virtualenv_python
from deploy.certs import CA_CERT, CLIENT_CERT, CLIENT_KEY, DEFAULT_TLS_NAME, host_cert, host_key
from deploy.errors import LayoutError
from deploy.nginx_map import MapError, read_map_facts
from deploy.strategies import STRATEGIES, SocketPlan, get_strategy

PROJECT_ROOT = Path(__file__).resolve().parent.parent
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
PROTOCOLS = ("http", "uwsgi")  # what nginx speaks to gunicorn
LOCK_ENGINES = ("", "ipcsem")  # uWSGI's lock-engine: "" = its default (pthread robust mutexes)
# Options only some strategies take (Strategy.options), with the value meaning "not used".
STRATEGY_OPTIONS = {"reuse_port": False, "protocol": "http", "lock_engine": ""}

SPEC_RE = re.compile(r"^(?P<p>[+-]?\d+)x(?P<t>[+-]?\d+)-(?P<strategy>[A-Za-z0-9_-]+)$")
APP_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$")


def somaxconn() -> int | None:
    """The kernel's cap on listen backlogs; uWSGI refuses to start above it on Linux."""
    try:
        return int(Path("/proc/sys/net/core/somaxconn").read_text().strip())
    except (OSError, ValueError):
        return None


def _int_in(field_name: str, raw, low: int, high: int) -> int:
    if isinstance(raw, bool):
        raise LayoutError(field_name, f"must be an integer in {low}..{high}, got {raw!r}")
    if isinstance(raw, str):
        text = raw.strip()
        if not re.fullmatch(r"[+-]?\d{1,9}", text):
            raise LayoutError(field_name, f"must be an integer in {low}..{high}, got {raw!r}")
        raw = int(text)
    if not isinstance(raw, int) or not low <= raw <= high:
        raise LayoutError(field_name, f"must be an integer in {low}..{high}, got {raw!r}")
    return raw


def _is(path: Path, kind: str) -> bool:
    """path.is_dir()/is_file(), False instead of OSError (e.g. a name over 255 bytes)."""
    try:
        return path.is_dir() if kind == "dir" else path.is_file()
    except OSError:
        return False


# uWSGI expands %x and $(VAR) in uwsgi.ini values; nginx.conf takes socket paths and the
# data-set alias unquoted, so its syntax characters would change what it reads.
UWSGI_EXPANDS = "%$"
NGINX_SYNTAX = " \t;{}#'\"\\"


def _config_path(field_name: str, path: str, nginx: bool = False) -> str:
    """A directory that is written into uwsgi.ini (and, with ``nginx``, into nginx.conf)."""
    refused = UWSGI_EXPANDS + (NGINX_SYNTAX if nginx else "")
    bad = next((c for c in path if not c.isprintable() or c in refused), None)
    if bad is not None:
        raise LayoutError(field_name, f"{path!r} contains {bad!r}, which the generated config files cannot "
                                      "hold; use another directory")
    return path


# --- the app's environment: virtualenv, env, static ----------------------------------------

ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# uWSGI reads uwsgi.ini values through three passes that replace $(VAR) with an environment
# variable, @(FILE) with a file's content (read as root, before dropping privileges) and
# %(NAME) with an option (core/uwsgi.c uwsgi_apply_config_pass). None has an escape.
UWSGI_VALUE_SEQUENCES = {"$(": "an environment variable", "@(": "a file's content", "%(": "another option"}
# Keys the stack sets itself (or uWSGI reads as options).
RESERVED_ENV = {"PYTHONHOME": "--virtualenv sets it", "UL_DATA_DIR": "--data-dir sets it"}
STATIC_SEGMENT_RE = re.compile(r"^[A-Za-z0-9._~-]+$")
# Locations the project's own data set takes (--data-dir): nginx serves /static/,
# /_internal_files/ and /nfiles/<id> (through its map of the index), the app answers /files/<id>.
DATA_DIR_PREFIXES = ("/files", "/_internal_files", "/static", "/nfiles")
# open_file_cache: "on" keeps this many entries per nginx worker; a number sets it.
OPEN_FILE_CACHE_ON = 1000
MAX_OPEN_FILE_CACHE = 1_000_000


def check_virtualenv(raw, server: str = "uwsgi") -> str:
    """The resolved virtualenv directory, or LayoutError("virtualenv", ...). Its Python
    major.minor must be the one ``server`` (uwsgi, gunicorn, granian) runs on."""
    text = _config_path("virtualenv", str(raw))
    venv = Path(os.path.expanduser(text)).resolve()
    _config_path("virtualenv", str(venv))  # where a symlink led
    (major, minor), how = server_python(server)
    label = "uWSGI" if server == "uwsgi" else server
    make = f"python{major}.{minor} -m venv {venv}"
    try:
        exists = venv.is_dir()
        shaped = (venv / "pyvenv.cfg").is_file() and os.access(venv / "bin" / "python", os.X_OK)
    except OSError as exc:
        raise LayoutError("virtualenv", f"unusable path {text!r}: {exc.strerror}") from None
    if not exists:
        raise LayoutError("virtualenv", f"{text!r} does not exist: create it with {make}")
    if not shaped:
        raise LayoutError("virtualenv", f"{venv} is not a virtualenv (it needs pyvenv.cfg and bin/python): "
                                        f"create one with {make}")
    found = virtualenv_python(venv)
    if found is None:
        raise LayoutError("virtualenv", f"cannot tell the Python version of {venv} (no version in pyvenv.cfg, "
                                        f"bin/python does not run): recreate it with {make}")
    if found != (major, minor):
        raise LayoutError(
            "virtualenv",
            f"{venv} is Python {found[0]}.{found[1]} but our {label} runs Python {major}.{minor} ({how}): recreate it "
            f"with {make} and reinstall your requirements, or rebuild our venv with that Python "
            f"(rm -rf .venv; make venv PYTHON=python{found[0]}.{found[1]})",
        )
    return str(venv)


def _pairs(field_name: str, raw, example: str) -> list[tuple[str, str]]:
    """Accept "K=V" strings or (k, v) pairs (from layout.json), one or many."""
    items = [raw] if isinstance(raw, str) else list(raw or ())
    pairs = []
    for item in items:
        if isinstance(item, str):
            key, sep, value = item.partition("=")
            if not sep:
                raise LayoutError(field_name, f"expected {example}, got {item!r}")
        elif isinstance(item, (list, tuple)) and len(item) == 2 and all(isinstance(x, str) for x in item):
            key, value = item
        else:
            raise LayoutError(field_name, f"expected {example}, got {item!r}")
        pairs.append((key, value))
    return pairs


def parse_env(raw) -> tuple[tuple[str, str], ...]:
    """``--env KEY=VALUE`` items -> ((key, value), ...): uWSGI ``env = KEY=VALUE`` lines."""
    out: list[tuple[str, str]] = []
    for key, value in _pairs("env", raw, "KEY=VALUE such as DJANGO_SETTINGS_MODULE=shop.settings"):
        if not ENV_KEY_RE.match(key):
            raise LayoutError("env", f"key {key!r} must be a name of letters, digits and _ (not starting with a "
                                     "digit), e.g. DJANGO_SETTINGS_MODULE")
        if key.upper().startswith("UWSGI_"):
            raise LayoutError("env", f"{key} is refused: uWSGI reads UWSGI_* variables as its own options")
        if key.upper().startswith("GRANIAN_"):
            raise LayoutError("env", f"{key} is refused: granian reads GRANIAN_* variables as its own options")
        if key in RESERVED_ENV:
            raise LayoutError("env", f"{key} is refused: {RESERVED_ENV[key]}")
        if any(key == k for k, _ in out):
            raise LayoutError("env", f"{key} is given twice")
        bad = next((c for c in value if not c.isprintable()), None)
        if bad is not None:
            raise LayoutError("env", f"value of {key} contains {bad!r}: uwsgi.ini values are one line of "
                                     "printable characters")
        if value != value.rstrip(" \t"):
            raise LayoutError("env", f"value of {key} ends with whitespace, which uWSGI strips from ini values")
        for seq, what in UWSGI_VALUE_SEQUENCES.items():
            if seq in value:
                raise LayoutError("env", f"value of {key} contains {seq!r}, which uWSGI replaces with {what} "
                                         "in uwsgi.ini (no escape exists): export it in the environment that "
                                         "starts the stack instead (uWSGI passes its environment on to the app)")
        out.append((key, value))
    return tuple(out)


def _nests(a: str, b: str) -> bool:
    return a == b or a.startswith(b + "/") or b.startswith(a + "/")


def parse_static(raw, data_dir: str = "", local: bool = True) -> tuple[tuple[str, str], ...]:
    """``--static PREFIX=DIR`` items -> ((prefix, dir), ...), prefix without a trailing slash,
    dir resolved. nginx serves DIR under PREFIX/ itself. ``local=False``: DIR is a path on
    another machine (a bundle's server), so it is only normalised, never resolved or checked."""
    out: list[tuple[str, str]] = []
    for prefix, directory in _pairs("static", raw, "PREFIX=DIR such as /static=/srv/shop/static"):
        clean = prefix[:-1] if prefix.endswith("/") and prefix != "/" else prefix
        if clean == "/":
            raise LayoutError("static", "prefix '/' would hide the app behind nginx: use a path such as /static")
        segments = clean.split("/")[1:]
        if (not clean.startswith("/") or any(s in ("", ".", "..") for s in segments)
                or not all(STATIC_SEGMENT_RE.match(s) for s in segments)):
            raise LayoutError("static", f"prefix {prefix!r} must be a clean URL path such as /static or "
                                        "/media/uploads (segments of letters, digits, . _ ~ -; no . or ..)")
        if not directory:
            raise LayoutError("static", f"{prefix}= needs a directory after '='")
        if not local:
            if not directory.startswith("/"):
                raise LayoutError("static", f"{directory!r} (for {clean}/) must be an absolute path on the server")
            path = Path(os.path.normpath(_config_path("static", directory, nginx=True)))
        else:
            path = Path(os.path.expanduser(_config_path("static", directory, nginx=True))).resolve()
            if not _is(path, "dir"):
                raise LayoutError("static", f"{directory!r} (for {clean}/) must be an existing directory")
        if path == Path("/"):
            raise LayoutError("static", f"{clean}/ would serve the whole filesystem: name the static directory")
        _config_path("static", str(path), nginx=True)
        for other, _ in out:
            if _nests(clean, other):
                raise LayoutError("static", f"prefixes {other}/ and {clean}/ overlap: nginx would serve one "
                                            "from inside the other; give each its own path")
        if data_dir:
            taken = next((p for p in DATA_DIR_PREFIXES if _nests(clean, p)), None)
            if taken:
                raise LayoutError("static", f"prefix {clean}/ overlaps {taken}/, which --data-dir uses; "
                                            "choose another prefix")
        out.append((clean, str(path)))
    return tuple(out)


def _bool(field_name: str, raw) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in ("1", "true", "on", "yes"):
        return True
    if text in ("0", "false", "off", "no"):
        return False
    raise LayoutError(field_name, f"must be on or off, got {raw!r}")


def parse_open_file_cache(raw) -> int:
    """``off`` (0), ``on`` (OPEN_FILE_CACHE_ON entries) or a number of entries per nginx worker."""
    text = str(raw).strip().lower() if not isinstance(raw, bool) else ("on" if raw else "off")
    if text in ("off", "false", "no"):
        return 0
    if text in ("on", "true", "yes"):
        return OPEN_FILE_CACHE_ON
    if re.fullmatch(r"\d{1,7}", text) and int(text) <= MAX_OPEN_FILE_CACHE:
        return int(text)
    raise LayoutError("open_file_cache", f"must be off, on ({OPEN_FILE_CACHE_ON} entries per nginx worker) or a "
                                         f"number of entries in 1..{MAX_OPEN_FILE_CACHE} (0 = off), got {raw!r}")


def _default_unprivileged_user() -> str:
    for name in ("www-data", "nobody"):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            continue
    raise LayoutError("user", "running as root but neither www-data nor nobody exists: pass --user NAME")


def _resolve_user(raw) -> str:
    """The user uWSGI and nginx workers run as. Only root can switch users."""
    current = pwd.getpwuid(os.getuid()).pw_name
    name = str(raw or "").strip()
    if os.geteuid() != 0:
        if name and name != current:
            raise LayoutError("user", f"only root can run the stack as another user; you are {current!r}")
        return current
    name = name or _default_unprivileged_user()
    try:
        pwd.getpwnam(name)
    except KeyError:
        raise LayoutError("user", f"no such user {name!r}") from None
    return name


def _parse_host_port(field_name: str, raw: str) -> tuple[str, int]:
    host, sep, port = str(raw).rpartition(":")
    if not sep or not host:
        raise LayoutError(field_name, f"expected IPV4:PORT such as 127.0.0.1:8000, got {raw!r}")
    if host == "localhost":
        host = "127.0.0.1"
    try:
        ipaddress.IPv4Address(host)
    except ValueError:
        raise LayoutError(field_name, f"expected an IPv4 address before ':PORT', got {host!r}") from None
    return host, _int_in(field_name, port, 1, 65535)


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
    app_dir: str = str(PROJECT_ROOT)
    transport: str = "tcp"
    base_port: int = 5000
    listen: str = "127.0.0.1:8000"
    nginx_workers: int | str = 1  # a count, or "auto" (one per core)
    backlog: int = 100
    stats_port: int = 9191
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
    # "" = 2 on one machine, 1 with hosts (deploy.hosts.failure_policy).
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
    # A data set (python -m bench.dataset): served as /files/<id> by the app through
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
    # gunicorn: what nginx speaks to it, http (proxy_pass) or uwsgi (uwsgi_pass).
    protocol: str = "http"
    # thunder: uWSGI's lock engine for the thunder lock ("" = uWSGI's default, or ipcsem).
    lock_engine: str = ""
    # Several app hosts (deploy/hosts.py): every host runs this layout's uWSGI bound to its own
    # address, and nginx balances over every socket of every host. () = this machine only.
    hosts: tuple[str, ...] = ()
    # How nginx talks to uWSGI: off (plain uwsgi: loopback only), suwsgi (uwsgi over TLS, with
    # a client certificate uWSGI requires), https (uWSGI's https-socket). "" = suwsgi when a
    # socket is not on loopback, else off.
    uwsgi_tls: str = ""
    # The certificates (python -m deploy certs DIR --hosts ...), and the name every host's
    # certificate carries, which nginx verifies (uwsgi_ssl_name).
    uwsgi_tls_dir: str = ""
    uwsgi_tls_name: str = DEFAULT_TLS_NAME
    # nginx marks a socket down for fail_timeout seconds after max_fails failures within that
    # time. "" = for where the sockets are: never on one machine; measured values with hosts.
    max_fails: int | str = ""
    fail_timeout: int | str = ""

    def __post_init__(self):
        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731  (frozen dataclass)
        set_("processes", _int_in("processes", self.processes, 1, MAX_PROCESSES))
        set_("threads", _int_in("threads", self.threads, 1, MAX_THREADS))
        strategy = get_strategy(self.strategy)
        if not isinstance(self.app, str) or not APP_RE.match(self.app):
            raise LayoutError(
                "app", f"expected an importable module:callable such as app.wsgi:application, got {self.app!r}"
            )
        app_dir = Path(os.path.expanduser(str(self.app_dir))).resolve()
        if not _is(app_dir, "dir"):
            raise LayoutError("app_dir", f"must be an existing directory, got {str(self.app_dir)!r}")
        set_("app_dir", _config_path("app_dir", str(app_dir)))
        if self.transport not in TRANSPORTS:
            raise LayoutError("transport", f"must be one of {', '.join(TRANSPORTS)}, got {self.transport!r}")
        set_("base_port", _int_in("base_port", self.base_port, 1, 65535))
        host, port = _parse_host_port("listen", self.listen)
        set_("listen", f"{host}:{port}")
        if str(self.nginx_workers).strip() == "auto":
            set_("nginx_workers", "auto")
        else:
            set_("nginx_workers", _int_in("nginx_workers", self.nginx_workers, 1, MAX_NGINX_WORKERS))
        cap = somaxconn() or 65535
        backlog = _int_in("backlog", self.backlog, 1, 2**31 - 1)
        if backlog > cap:
            raise LayoutError(
                "backlog",
                f"must be in 1..{cap} (net.core.somaxconn; uWSGI refuses a larger listen queue), got {backlog}",
            )
        set_("backlog", backlog)
        set_("stats_port", _int_in("stats_port", self.stats_port, 1, 65535))
        set_("access_log", _bool("access_log", self.access_log))
        set_("harakiri", _int_in("harakiri", self.harakiri, 0, 3600))
        set_("user", _resolve_user(self.user))
        for flag in ("reuseport", "accept_mutex", "multi_accept", "sendfile"):
            set_(flag, _bool(flag, getattr(self, flag)))
        chunk = str(self.sendfile_max_chunk or "").strip()
        if chunk and not re.fullmatch(r"[1-9]\d{0,6}[kKmM]?", chunk):
            raise LayoutError("sendfile_max_chunk", f"expected a size such as 512k or 2m, got {chunk!r}")
        set_("sendfile_max_chunk", chunk.lower())
        if self.aio not in AIO_MODES:
            raise LayoutError("aio", f"must be one of {', '.join(AIO_MODES)}, got {self.aio!r}")
        set_("aio_threads", _int_in("aio_threads", self.aio_threads, 1, 1024))
        set_("aio_max_queue", _int_in("aio_max_queue", self.aio_max_queue, 0, 10_000_000))
        set_("open_file_cache", parse_open_file_cache(self.open_file_cache))
        if self.data_dir:
            data = Path(os.path.expanduser(str(self.data_dir))).resolve()
            if not _is(data / "files", "dir") or not _is(data / "index.json", "file"):
                raise LayoutError("data_dir", f"{self.data_dir!r} is not a data set (files/ and index.json): "
                                              "create one with `make dataset`")
            try:
                read_map_facts(data)  # nginx's id -> path map for /nfiles/, written with the data set
            except MapError as exc:
                raise LayoutError("data_dir", f"{exc}: write it with `python -m bench.dataset --root {data} "
                                              "--map-only`") from None
            set_("data_dir", _config_path("data_dir", str(data), nginx=True))
        if not self.run_dir:
            raise LayoutError("run_dir", "must be set (the directory the stack runs in)")
        run_dir = str(Path(os.path.expanduser(str(self.run_dir))).resolve())
        set_("run_dir", _config_path("run_dir", run_dir, nginx=self.transport == "unix"))
        if self.virtualenv:
            set_("virtualenv", check_virtualenv(self.virtualenv, strategy.server))
        else:
            set_("virtualenv", sys.prefix if sys.prefix != sys.base_prefix else "")
        set_("env", parse_env(self.env))
        set_("static", parse_static(self.static, self.data_dir))
        set_("reuse_port", _bool("reuse_port", self.reuse_port))
        if self.protocol not in PROTOCOLS:
            raise LayoutError("protocol", f"must be one of {', '.join(PROTOCOLS)} (what nginx speaks to gunicorn), "
                                          f"got {self.protocol!r}")
        if self.lock_engine not in LOCK_ENGINES:
            raise LayoutError("lock_engine", f"must be ipcsem (System V semaphores) or empty for uWSGI's default "
                                             f"(pthread robust mutexes), got {self.lock_engine!r}")
        self._check_strategy_options(strategy)
        multihost.resolve(self, set_)  # hosts, uwsgi_tls*, max_fails, fail_timeout, retries, connect_timeout
        self._check_addresses()

    # --- derived views --------------------------------------------------------------

    @property
    def name(self) -> str:
        return f"{self.processes}x{self.threads}-{self.strategy}"

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
        return "uwsgi" if self.server == "uwsgi" or self.protocol == "uwsgi" else "http"

    @property
    def has_stats(self) -> bool:
        """Only uWSGI has a stats server (per-worker pids and request counts)."""
        return self.server == "uwsgi"

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
        """Every socket nginx reaches: each app host's, host after host."""
        return [s for host in self.app_hosts for s in self.host_sockets(host)]

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
        servers = [(self.host_sockets(h)[p.socket_index], p.params) for h in self.app_hosts for p in plans]
        primaries = [s for s, params in servers if "backup" not in params]
        if self.retries and len(primaries) == 1 and len(servers) == 1:
            # nginx never retries a lone server, so a request whose worker died would fail.
            # The same socket again, as backup, gives the retry a peer: any other worker
            # accepting on that socket takes it. It carries no traffic otherwise.
            servers.append((primaries[0], ("backup",)))
        # uWSGI's master keeps every socket open (so does gunicorn's; with SO_REUSEPORT the
        # other workers' listeners stay), so a failure means one dead or busy worker that is
        # back within milliseconds (or seconds: granian respawns after 3.5 s). nginx's default
        # (max_fails=1 fail_timeout=10s) would shut the socket out for 10 s: measured, after a
        # kill -9 on mapped throughput fell from ~200 to ~95 req/s for 10 s, and a full backlog
        # left "no live upstreams" for 7-9 s after the load stopped. Never mark a socket down.
        # Across hosts a whole host can be down: see deploy.hosts.failure_policy.
        failure = (f"max_fails={self.max_fails}", f"fail_timeout={self.fail_timeout}s") if self.max_fails \
            else ("max_fails=0",)
        return [(s, (*failure, *params)) for s, params in servers]

    @property
    def drops_privileges(self) -> bool:
        """True when started as root: uWSGI binds as root, then runs as ``user``; a peer is
        started as ``user``; nginx's workers run as ``user``."""
        return os.geteuid() == 0 and self.user != "root"

    @property
    def group(self) -> str:
        return grp.getgrgid(pwd.getpwnam(self.user).pw_gid).gr_name

    @property
    def stats_address(self) -> str:
        # Loopback only: the stats server exposes pids, memory and request counts.
        return f"127.0.0.1:{self.stats_port}"

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
        if self.reuse_port and self.transport != "tcp":
            raise LayoutError("reuse_port", "needs --transport tcp: SO_REUSEPORT spreads TCP connections, and "
                                            "each worker would replace the others' unix socket")

    def _check_addresses(self) -> None:
        n = len(self.socket_plans)
        if self.transport == "tcp":
            last = self.base_port + n - 1
            if last > 65535:
                raise LayoutError(
                    "base_port",
                    f"{n} sockets need ports {self.base_port}..{last}; must end at 65535 or below",
                )
            ports = {self.base_port + i: f"{self.server} socket {i}" for i in range(n)}
            taken = {self.stats_port: "stats_port"} if self.has_stats else {}
            if self.listen_host in ("127.0.0.1", "0.0.0.0", *self.hosts):
                taken[self.listen_port] = "listen"
            for port, what in ports.items():
                if port in taken:
                    raise LayoutError(
                        "base_port",
                        f"{what} would use port {port}, already taken by {taken[port]}; "
                        f"choose ports {self.base_port}..{last} clear of listen and stats_port",
                    )
        else:
            longest = max((s.address for s in self.sockets), key=len)
            if len(longest.encode()) + 1 > UNIX_PATH_MAX:
                raise LayoutError(
                    "run_dir",
                    f"unix socket path {longest!r} is {len(longest.encode())} bytes; the kernel allows "
                    f"{UNIX_PATH_MAX - 1} (108 with the NUL): use a shorter --out/--run-dir",
                )
        if self.has_stats and self.listen_host in ("127.0.0.1", "0.0.0.0") and self.listen_port == self.stats_port:
            raise LayoutError("stats_port", f"port {self.stats_port} is already the nginx listen port; pick another")


def parse_layout(spec: str, **options) -> Layout:
    """Build a Layout from ``PxT-STRATEGY`` plus keyword options (strings or values)."""
    match = SPEC_RE.match(spec.strip()) if isinstance(spec, str) else None
    if not match:
        raise LayoutError(
            "layout",
            f"expected PxT-STRATEGY such as 2x4-mapped (strategies: {', '.join(STRATEGIES)}), got {spec!r}",
        )
    unknown = set(options) - set(Layout.__dataclass_fields__) - {"name"}
    if unknown:
        raise LayoutError(sorted(unknown)[0], "unknown option")
    from_spec = sorted(set(options) & {"processes", "threads", "strategy"})
    if from_spec:  # would reach Layout() twice and raise TypeError
        raise LayoutError(from_spec[0], f"comes from the layout spec {spec.strip()!r}, not from an option")
    return Layout(
        processes=_int_in("processes", match["p"], 1, MAX_PROCESSES),
        threads=_int_in("threads", match["t"], 1, MAX_THREADS),
        strategy=match["strategy"],
        **{k: v for k, v in options.items() if v is not None and k != "name"},  # name is derived (see to_dict)
    )


def layout_from_record(data: dict) -> Layout:
    """The Layout a layout.json records, validated again (the app or its venv may have changed)."""
    return Layout(**{k: data[k] for k in Layout.__dataclass_fields__ if k in data})


def parse_variant(text: str, **defaults) -> Layout:
    """``PxT-STRATEGY@option=value,option=value``: a layout plus options under one label, so
    a benchmark can compare e.g. ``2x4-mapped@aio=threads`` with ``2x4-mapped@aio=off``.
    Options after ``@`` override ``defaults``."""
    spec, sep, extra = str(text).partition("@")
    options = dict(defaults)
    if sep:
        for item in extra.split(","):
            key, eq, value = item.partition("=")
            key = key.strip().replace("-", "_")
            if not eq or not key:
                raise LayoutError("layout", f"expected OPTION=VALUE after '@' in {text!r}, got {item!r}")
            if key in ("run_dir", "listen", "base_port", "stats_port"):
                raise LayoutError(key, "is chosen by the benchmark, not by a variant")
            options[key] = value.strip()
    return parse_layout(spec, **options)
