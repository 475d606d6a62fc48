"""App servers' configs: uWSGI and its peers (gunicorn, granian) behind the same nginx.

A strategy names its server (``Strategy.server``); ``server_for(layout)`` returns the
``ServerConfig`` that renders the server's config file(s) from the layout (``render``) and
reads them back for render's cross-checks (``facts``: render checks files, not the model).
Starting and watching the server is ``deploy.run``'s (``deploy.run.servers``).

Peers run in the app's own interpreter (its virtualenv's ``bin/python``, as uWSGI's
``virtualenv =``) through ``deploy/run/peer_launch.py``, which takes only the server's
packages from our venv; gunicorn.conf.py and granian.env are what it hands them.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from uwsgi_layouts.deploy.render.nginx_workers import nginx_worker_processes
from uwsgi_layouts.deploy.render.templates import TEMPLATES_DIR

if TYPE_CHECKING:
    import jinja2

    from uwsgi_layouts.deploy.model import Layout

# nginx.conf's events { worker_connections }: the most connections one nginx worker opens.
NGINX_WORKER_CONNECTIONS = 768
# nginx closes an idle upstream connection after this many seconds: before the peers close
# theirs (PEER_IDLE_TIMEOUT), so nginx never sends a request on a connection being closed
# (a POST is never retried: it would get a 502).
UPSTREAM_KEEPALIVE_TIMEOUT = 20
PEER_IDLE_TIMEOUT = 30
# Seconds a peer gives in-flight requests on SIGTERM before its workers are killed.
GRACEFUL_STOP = 5
# For an app factory the server cannot call itself (uWSGI never; granian not with arguments):
# a generated module, relative to the run dir, whose ``application`` is the factory's app.
# In a directory of its own, so putting it on sys.path (granian) exposes nothing else; named
# so that no app has a module of that name.
ENTRY_FILE = "entry/uwsgi_layouts_entry.py"
ENTRY_CALLABLE = "application"


@dataclass
class ServerFacts:
    """What a rendered server config says, read back from the file."""

    processes: int | None
    threads: int | None
    addresses: list[str]  # where it accepts requests: HOST:PORT or an absolute unix socket path
    private: list[str] = field(default_factory=list)  # other listening addresses (uWSGI's stats server)
    unix_mode: int | None = None  # the mode its unix sockets get (None: unknown or none set)
    env: list[tuple[str, str | None]] = field(default_factory=list)  # the app's environment
    run_as: tuple[str, str] | None = None  # user, group the config switches to
    problems: list[str] = field(default_factory=list)  # what only this server can check
    # address -> {"kind": "ssl" | "https" | "plain", "cert", "key", "ca", "required"} (uWSGI's TLS sockets)
    socket_tls: dict[str, dict] = field(default_factory=dict)
    master_as_root: bool = False  # uWSGI's master keeps root while its workers run as run_as


class ServerConfig:
    name = ""
    label = ""  # as people write it: uWSGI, gunicorn, granian
    config_file = ""
    upstream = ""  # the nginx upstream's name

    def files(self, layout: Layout) -> list[str]:
        """The files this server adds to the run dir (besides nginx.conf and layout.json)."""
        return [self.config_file, *self.entry_files(layout)]

    def calls_factory(self, layout: Layout) -> bool:
        """Whether the server itself calls the layout's app factory (else: ENTRY_FILE does)."""
        return False

    def entry_files(self, layout: Layout) -> list[str]:
        """[ENTRY_FILE] when the layout's app is a factory this server cannot call, else []."""
        return [ENTRY_FILE] if layout.app_target.is_factory and not self.calls_factory(layout) else []

    def render(self, env: jinja2.Environment, context: dict) -> dict[str, str]:
        return {self.config_file: env.get_template(f"{self.config_file}.j2").render(context)}

    def facts(self, layout: Layout, conf_dir: Path, config_file: str = "") -> ServerFacts:
        """What the server's config file (``conf_dir / config_file``, default its own name) says."""
        raise NotImplementedError

    def config_path(self, layout: Layout) -> Path:
        return Path(layout.run_dir) / self.config_file

    def deadline_why(self, layout: Layout) -> str:
        """What kills a request that runs longer than layout.harakiri (the failover comments)."""
        raise NotImplementedError


# --- uWSGI ----------------------------------------------------------------------------------------


def read_uwsgi_ini_value(raw: str) -> str | None:
    """What uWSGI makes of an ini value written by ``templates.uwsgi_ini_value``; None when a lone ``%``
    would be eaten as a magic variable."""
    return raw.replace("%%", "%") if re.fullmatch(r"(?:[^%]|%%)*", raw) else None


def parse_uwsgi_ini(text: str) -> list[tuple[str, str]]:
    """(key, value) pairs of the [uwsgi] section, in order; repeated keys are kept."""
    pairs, section = [], None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in ";#":
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1].strip()
            continue
        if section == "uwsgi" and "=" in line:
            key, _, value = line.partition("=")
            pairs.append((key.strip(), value.strip()))
    return pairs


def _int_or_none(text) -> int | None:
    try:
        return int(str(text))
    except (TypeError, ValueError):
        return None


# uWSGI options that bind a socket (core/uwsgi.c): each takes the next socket index.
UWSGI_SOCKET_OPTIONS = {"socket": "plain", "uwsgi-socket": "plain", "http-socket": "plain", "http11-socket": "plain",
                        "fastcgi-socket": "plain", "scgi-socket": "plain", "raw-socket": "plain",
                        "shared-socket": "plain", "ssl-socket": "ssl", "suwsgi-socket": "ssl",
                        "https-socket": "https"}


def read_tls_socket(option: str, value: str) -> dict:
    """What a socket option's value says about TLS: ``ADDR,CERT,KEY[,CIPHERS[,CA]]`` for ssl and
    https sockets, a ``!`` before CA making the client certificate required (core/uwsgi.c
    uwsgi_opt_add_ssl_socket)."""
    kind = UWSGI_SOCKET_OPTIONS[option]
    if kind == "plain":
        return {"kind": "plain"}
    fields = value.split(",", 4)
    ca = fields[4] if len(fields) == 5 else ""
    return {"kind": kind, "cert": fields[1] if len(fields) > 1 else "", "key": fields[2] if len(fields) > 2 else "",
            "ca": ca.removeprefix("!"), "required": ca.startswith("!") and len(ca) > 1}


# The routing rules (templates/uwsgi/_master.j2) that answer 403 to a packet which would make a
# worker load code: every uwsgi.ini must hold both, with `strict` (a build without routing then
# refuses the file instead of ignoring them).
CODE_LOADING_ROUTES = (
    "empty:${UWSGI_FILE}${UWSGI_SCRIPT}${UWSGI_MODULE}${UWSGI_CALLABLE} break:403 Forbidden",
    "empty:${UWSGI_APPID}${UWSGI_PYHOME}${UWSGI_HOME}${UWSGI_CHDIR} break:403 Forbidden",
)


def routing_problems(opts: list[tuple[str, str]]) -> list[str]:
    """What a uwsgi.ini (its options in order) lacks to refuse code-loading packets: both rules,
    first among its request routes (an earlier rule could end routing before them), and strict."""
    routes = [(k, v) for k, v in opts if k.startswith("route")]
    problems = []
    if routes[:2] != [("route-if-not", rule) for rule in CODE_LOADING_ROUTES]:
        missing = next((r for r in CODE_LOADING_ROUTES if ("route-if-not", r) not in routes), None)
        problems.append((f"uwsgi.ini lacks `route-if-not = {missing}`" if missing else
                         "uwsgi.ini has routing rules before the two that refuse code-loading packets")
                        + ": a uwsgi packet with UWSGI_FILE, UWSGI_MODULE or an app id could make a worker "
                          "load and run code")
    if [v for k, v in opts if k == "strict"][-1:] not in (["true"], ["1"]):
        problems.append("uwsgi.ini must set strict = true (a uWSGI without routing would ignore route-if-not)")
    return problems


class UWSGI(ServerConfig):
    name, label, config_file, upstream = "uwsgi", "uWSGI", "uwsgi.ini", "uwsgi_app"

    def files(self, layout):
        return ["uwsgi.ini", "uwsgi_params", *self.entry_files(layout)]

    def render(self, env, context):
        return {"uwsgi.ini": env.get_template("uwsgi.ini.j2").render(context),
                "uwsgi_params": (TEMPLATES_DIR / "uwsgi_params").read_text()}

    def facts(self, layout, conf_dir, config_file=""):
        opts = parse_uwsgi_ini((conf_dir / (config_file or self.config_file)).read_text())
        values = lambda key: [v for k, v in opts if k == key]  # noqa: E731
        processes = _int_or_none(values("processes")[-1]) if values("processes") else 1
        threads = _int_or_none(values("threads")[0]) if len(values("threads")) == 1 else None
        # Every option that binds a socket, in order (their order gives the socket indices).
        bound = [(k, v) for k, v in opts if k in UWSGI_SOCKET_OPTIONS]
        sockets = [v.split(",")[0] for _, v in bound]
        tls = {v.split(",")[0]: read_tls_socket(k, v) for k, v in bound}
        problems = self._socket_map_problems(layout, values, processes or 1, sockets) + routing_problems(opts)
        # What nginx speaks must be what every plain socket speaks (uwsgi-socket is socket's alias).
        plain = {"uwsgi-socket": "socket"}
        kinds = sorted({plain.get(k, k) for k, _ in bound if UWSGI_SOCKET_OPTIONS[k] == "plain"})
        if kinds and kinds != [layout.uwsgi_socket_option]:
            problems.append(f"uwsgi.ini binds {', '.join(kinds)} but nginx speaks {layout.protocol} to it "
                            f"({layout.uwsgi_socket_option})")
        engines = values("lock-engine")
        if engines != ([layout.lock_engine] if layout.lock_engine else []):
            problems.append(f"uwsgi.ini lock-engine {engines} differs from the layout's {layout.lock_engine!r}")
        modes = values("chmod-socket")
        unix_mode = int(modes[-1], 8) if modes and re.fullmatch(r"[0-7]{3,4}", modes[-1]) else None
        if any(s.startswith("/") for s in sockets) and unix_mode is None:
            problems.append(f"unix sockets need chmod-socket 660 or tighter, got {modes or 'none (666)'}")
        for key in ("uid", "gid"):
            if values(key) and values(key)[-1] in ("0", "root"):
                problems.append(f"uwsgi.ini sets {key} to root")
        uid, gid = values("uid"), values("gid")
        run_as = (uid[-1] if len(uid) == 1 else "", gid[-1] if len(gid) == 1 else "") if uid or gid else None
        env = [(key, read_uwsgi_ini_value(value)) for key, _, value in (v.partition("=") for v in values("env"))]
        return ServerFacts(processes, threads, sockets, private=values("stats"), unix_mode=unix_mode, env=env,
                           run_as=run_as, problems=problems, socket_tls=tls,
                           master_as_root=values("master-as-root")[-1:] in (["true"], ["1"]))

    @staticmethod
    def _socket_map_problems(layout, values, processes, sockets) -> list[str]:
        """map-socket = SOCKET_INDEX:WORKER_ID[,WORKER_ID...] (socket indices from 0, worker ids
        from 1); an unmapped socket is served by all workers."""
        problems = []
        served: dict[int, set[int]] = {i: set(range(1, processes + 1)) for i in range(len(sockets))}
        mapped_once: set[int] = set()
        for entry in values("map-socket"):
            idx_text, _, workers_text = entry.partition(":")
            try:
                idx, workers = int(idx_text), {int(w) for w in workers_text.split(",")}
            except ValueError:
                problems.append(f"map-socket {entry!r} is not INDEX:WORKER[,WORKER]")
                continue
            if idx not in served:
                problems.append(f"map-socket {entry!r}: socket index {idx} does not exist (0..{len(sockets) - 1})")
                continue
            if not workers <= set(range(1, processes + 1)):
                problems.append(f"map-socket {entry!r}: worker ids must be in 1..{processes}")
            served[idx] = set() if idx not in mapped_once else served[idx]
            served[idx] |= workers
            mapped_once.add(idx)
        sockets_of = {w: {i for i, ws in served.items() if w in ws} for w in range(1, processes + 1)}
        idle = [w for w, s in sockets_of.items() if not s]
        if idle:
            problems.append(f"workers {idle} accept on no socket")
        expected = {s.index: set(s.workers) if s.workers else set(range(1, processes + 1)) for s in layout.sockets}
        if served != expected:
            problems.append(f"socket->workers mapping {served} differs from the layout's {expected}")
        if layout.strategy_obj.one_socket_per_worker:
            if any(len(ws) != 1 for ws in served.values()) or any(len(s) != 1 for s in sockets_of.values()):
                problems.append("strategy needs exactly one socket per worker and one worker per socket")
        return problems

    def deadline_why(self, layout):
        return ("uWSGI's harakiri kills the worker (its deadline is in whole seconds, so the kill lands "
                f"between {layout.harakiri - 1} and {layout.harakiri + 1} s after the start)")


# --- peers: gunicorn and granian ------------------------------------------------------------------


def _literal_assignments(text: str) -> dict[str, object]:
    """``name = <literal>`` statements anywhere in a Python file (the last one wins); other
    statements are skipped. Parsed, never executed."""
    found: dict[str, object] = {}
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return found
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                found[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                continue
    return found


class Peer(ServerConfig):
    package = ""
    # Top-level packages the server imports besides its own (deploy/run/peer_launch.py SERVER_PACKAGES).
    requires: tuple[str, ...] = ()


class Gunicorn(Peer):
    name, label, config_file, upstream, package = "gunicorn", "gunicorn", "gunicorn.conf.py", "gunicorn_app", "gunicorn"

    def files(self, layout):
        return ["gunicorn.conf.py", "uwsgi_params"] if layout.nginx_protocol == "uwsgi" else ["gunicorn.conf.py"]

    def calls_factory(self, layout):
        return True  # wsgi_app = "module:factory(literals)": gunicorn's own syntax (util.import_app)

    def render(self, env, context):
        texts = super().render(env, context)
        if context["layout"].nginx_protocol == "uwsgi":
            texts["uwsgi_params"] = (TEMPLATES_DIR / "uwsgi_params").read_text()
        return texts

    def worker_class(self, layout) -> str:
        return "sync" if layout.threads == 1 else "gthread"

    def ready_file(self, layout, pid: int) -> Path:
        """Written by a worker once it has loaded the app (gunicorn.conf.py post_worker_init)."""
        return Path(layout.run_dir) / "control" / f"gunicorn-worker-{pid}.ready"

    def facts(self, layout, conf_dir, config_file=""):
        text = (conf_dir / (config_file or self.config_file)).read_text()
        conf = _literal_assignments(text)
        problems = []
        worker_class = conf.get("worker_class", "sync")
        if worker_class != self.worker_class(layout):
            problems.append(f"gunicorn worker_class {worker_class!r} != {self.worker_class(layout)!r} "
                            f"for {layout.threads} thread(s)")
        threads = conf.get("threads", 1) if worker_class == "gthread" else 1
        binds = conf.get("bind", [])
        binds = [binds] if isinstance(binds, str) else list(binds) if isinstance(binds, (list, tuple)) else []
        addresses = [str(b).removeprefix("unix:") for b in binds]
        umask = conf.get("umask", 0)
        unix_mode = 0o777 & ~umask if isinstance(umask, int) else None
        if not re.search(r"(?m)^def post_worker_init\(", text):
            problems.append("gunicorn.conf.py defines no post_worker_init: the stack could not tell when workers "
                            "are ready")
        if bool(conf.get("reuse_port", False)) != layout.reuse_port:
            problems.append(f"gunicorn reuse_port {conf.get('reuse_port', False)} != layout's {layout.reuse_port}")
        if conf.get("protocol", "http") != layout.nginx_protocol:
            problems.append(f"gunicorn protocol {conf.get('protocol', 'http')!r} but nginx speaks "
                            f"{layout.nginx_protocol}")
        raw_env = conf.get("raw_env", [])
        env = [tuple(str(item).partition("=")[::2]) for item in raw_env] if isinstance(raw_env, list) else []
        run_as = (str(conf.get("user", "")), str(conf.get("group", ""))) if "user" in conf or "group" in conf \
            else None
        return ServerFacts(_int_or_none(conf.get("workers")), _int_or_none(threads), addresses, unix_mode=unix_mode,
                           env=env, run_as=run_as, problems=problems)

    def deadline_why(self, layout):
        if layout.threads == 1:
            return "gunicorn's timeout kills a sync worker that is silent for that long, as uWSGI's harakiri does"
        return ("gunicorn's gthread worker has no per-request deadline (its timeout only catches a stuck main "
                "loop): nginx giving up is the only bound, and the request keeps its thread until it ends")


class Granian(Peer):
    name, label, config_file, upstream, package = "granian", "granian", "granian.env", "granian_app", "granian"
    requires = ("click",)

    def calls_factory(self, layout):
        return not layout.app_target.has_arguments  # --factory calls it without arguments

    def target(self, layout) -> str:
        """What granian is started with: the app, the factory (with GRANIAN_FACTORY), or the
        entry module's path (granian imports a file target from its own directory)."""
        if self.entry_files(layout):
            return f"{Path(layout.run_dir) / ENTRY_FILE}:{ENTRY_CALLABLE}"
        return layout.app_target.reference

    @staticmethod
    def backpressure(layout) -> int:
        """Every connection nginx can open to it: backpressure counts connections, not requests,
        and nginx keeps idle ones open (upstream keepalive)."""
        return NGINX_WORKER_CONNECTIONS * nginx_worker_processes(layout)

    @staticmethod
    def read_env_file(text: str) -> dict[str, str]:
        """As deploy/run/peer_launch.py load_env_file reads it."""
        out = {}
        for line in text.splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                key, _, value = line.partition("=")
                out[key.strip()] = value
        return out

    def facts(self, layout, conf_dir, config_file=""):
        values = self.read_env_file((conf_dir / (config_file or self.config_file)).read_text())
        problems = []
        if values.get("GRANIAN_INTERFACE") != "wsgi":
            problems.append(f"granian interface {values.get('GRANIAN_INTERFACE')!r} is not wsgi")
        factory = layout.app_target.is_factory and self.calls_factory(layout)
        if (values.get("GRANIAN_FACTORY") == "true") != factory:
            problems.append(f"granian factory {values.get('GRANIAN_FACTORY')!r} but the app {layout.app} "
                            f"{'is' if factory else 'is not'} a factory granian calls")
        backpressure = _int_or_none(values.get("GRANIAN_BACKPRESSURE"))
        if backpressure is None or backpressure < self.backpressure(layout):
            problems.append(f"granian backpressure {backpressure} is below the {self.backpressure(layout)} "
                            "connections nginx may keep open to it: a worker would stop accepting")
        if "GRANIAN_UDS" in values:
            addresses = [values["GRANIAN_UDS"]]
            mode = values.get("GRANIAN_UDS_PERMISSIONS", "")
            # granian reads the mode as octal only with a leading 0 ("660" would be decimal 660).
            unix_mode = int(mode, 8) if re.fullmatch(r"0[0-7]{3}", mode) else None
        else:
            addresses = [f"{values.get('GRANIAN_HOST', '127.0.0.1')}:{values.get('GRANIAN_PORT', '8000')}"]
            unix_mode = None
        env = [(k, v) for k, v in values.items() if not k.startswith("GRANIAN_")]
        return ServerFacts(_int_or_none(values.get("GRANIAN_WORKERS")),
                           _int_or_none(values.get("GRANIAN_BLOCKING_THREADS")), addresses, unix_mode=unix_mode,
                           env=env, problems=problems)

    def deadline_why(self, layout):
        return ("granian has no per-request deadline: nginx giving up is the only bound, and the request "
                "keeps its blocking thread until it ends")


SERVERS: dict[str, ServerConfig] = {s.name: s for s in (UWSGI(), Gunicorn(), Granian())}
# Every config file any server writes: a re-render for another server removes the stale ones.
CONFIG_FILES = ("uwsgi.ini", "uwsgi_params", "gunicorn.conf.py", "granian.env", ENTRY_FILE)


def server_for(layout: Layout) -> ServerConfig:
    return SERVERS[layout.server]
