"""A production bundle: the files a Debian/Ubuntu server takes as they are.

``uwsgi-layouts bundle LAYOUT --out DIR`` writes, for a bundle called NAME::

    SLOT/nginx/sites-available/NAME.conf -> /etc/nginx/sites-available/NAME.conf (+ sites-enabled link)
    SLOT/uwsgi/NAME@SLOT.ini             -> /etc/uwsgi-layouts/NAME@SLOT.ini
    SLOT/systemd/NAME@SLOT.service       -> /etc/systemd/system/NAME@SLOT.service
    logrotate/NAME                       -> /etc/logrotate.d/NAME
    INSTALL.md, bundle.json              (not installed: the commands for this bundle; what install reads)

SLOT is blue or green: two copies of the service that differ only in their names, run
directory (/run/NAME/SLOT: sockets, FIFO, stats) and, with TCP, ports. One serves; an upgrade
that changes uWSGI's configuration starts the other beside it, points nginx at it and stops the
first (deploy/ship/installer.py). The site of each slot names that slot's sockets.

Certificates are used where they are (``--tls-cert``/``--tls-key`` name files on the server,
which renewal tools such as certbot rewrite in place): the site names them, nothing copies them.

With ``--hosts A,B`` (app hosts behind one front, deploy/model/hosts.py) it writes one bundle for the
front and one per app host (``write_host_bundles``): ``front/`` holds the site (its upstream
lists every socket of every host, over TLS with nginx's client certificate, in
/etc/nginx/uwsgi-tls/NAME/), ``hosts/ADDR/`` the uwsgi.ini (ssl-sockets bound to ADDR, the
host's certificate in /etc/uwsgi-layouts/NAME-tls/), the unit and logrotate file. Each is
installed with ``deploy install`` on its machine; all of them are cross-checked together.

A bundle depends on nothing of the machine it is rendered on: the app's directory, virtualenv,
uWSGI binary and static directories are paths on the *server*, checked for shape here and for
existence by ``deploy install`` on the server (deploy/ship/preinstall.py), which also runs the app's
pre-flight import there. The topology (processes x threads x strategy, failover, timeouts)
comes from the same ``Layout`` the lab renders, and the files are cross-checked with the lab's
``render.crosscheck`` before the bundle directory appears.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from pathlib import Path

from uwsgi_layouts.deploy.machine import check_hosts, check_static_locations, script_interpreter, within
from uwsgi_layouts.deploy.model import (
    APP_RE,
    CA_CERT,
    CLIENT_CERT,
    CLIENT_KEY,
    DEFAULT_APP,
    STRATEGIES,
    Layout,
    LayoutError,
    Socket,
    host_cert,
    host_key,
    parse_app,
    parse_env,
    parse_layout,
    parse_static,
)
from uwsgi_layouts.deploy.ship.server_fields import (
    BODY_SIZE_RE,
    HOME_DIRS,
    NAME_RE,
    TMP_DIRS,
    account_name,
    check_tls_pair,
    listen_address,
    nobody_ids,
    port_of,
    read_pem,
    server_name_list,
    server_path,
    tls_paths,
)
from uwsgi_layouts.deploy.ship.watch import watch_listen as watch_listen_address
from uwsgi_layouts.deploy.ship.watch import watch_program, watch_unit_of

BUNDLE_JSON = "bundle.json"
BUNDLE_JSON_VERSION = 1
# Where nginx's workers run on Debian/Ubuntu (the `user` of /etc/nginx/nginx.conf).
DEBIAN_NGINX_GROUP = "www-data"
DEFAULT_HTTP_LISTEN = ("80", "[::]:80")
DEFAULT_HTTPS_LISTEN = ("443", "[::]:443")
DEFAULT_BODY_SIZE = "10m"
# Configs for our uWSGI, outside /etc/uwsgi/apps-enabled, which Debian's uwsgi package starts
# with /usr/bin/uwsgi and the system Python.
UWSGI_CONF_DIR = "/etc/uwsgi-layouts"
# The front's client certificate for the app hosts, and the CA it checks them against.
FRONT_TLS_DIR = "/etc/nginx/uwsgi-tls"

# The two side-by-side copies of a single-machine bundle's service (see the module's docstring).
SLOTS = ("blue", "green")
# With --transport tcp, green's sockets are blue's ports plus this (a layout has at most 256 sockets).
SLOT_PORT_OFFSET = 1000
# What install wrote, by bundle (deploy/ship/manifest.py): what uninstall removes.
STATE_DIR = "/var/lib/uwsgi-layouts"
# Debian's nginx logs: www-data:adm 0640 (/etc/logrotate.d/nginx creates them so).
NGINX_LOG_OWNER = ("www-data", "adm")
NGINX_LOG_MODE = 0o640
# Without --stop-grace and without harakiri: how long `systemctl stop` waits for requests in flight.
DEFAULT_STOP_GRACE = 30
MAX_STOP_GRACE = 3600

# A layout's limits a bundle ships, as systemd's resource control sets them on the unit's cgroup.
BUNDLE_LIMITS = ("cpus", "memory")


# --- the bundle ------------------------------------------------------------------------------


# The uWSGI a bundle installs (pyuwsgi from this sdist, or the binary): 2.0.28 is the first whose
# graceful stop ("q") waits for threaded workers' requests in flight.
UWSGI_PIN = "uwsgi>=2.0.28,<2.1"

@dataclass(frozen=True)
class Bundle:
    """A layout with the server's paths and names. Besides its own fields it answers the
    attributes the shared templates (nginx/_upstream.j2, _failover.j2, _static.j2, uwsgi/_app.j2,
    _sockets.j2...) and ``render.crosscheck`` read from a ``Layout``, with server values."""

    layout: Layout  # processes x threads x strategy and the failover/timeouts; its lab paths are unused
    name: str
    app: str
    app_dir: str
    virtualenv: str
    uwsgi: str
    user: str
    group: str
    nginx_group: str
    # uwsgi is pyuwsgi (a script run by the virtualenv's python3: the default) rather than a uWSGI
    # binary: uwsgi.ini then sets binary-path, and install checks the server's file is one.
    pyuwsgi: bool = True
    env: tuple[tuple[str, str], ...] = ()
    static: tuple[tuple[str, str], ...] = ()
    writable: tuple[str, ...] = ()
    server_names: tuple[str, ...] = ("_",)
    listen: tuple[str, ...] = DEFAULT_HTTP_LISTEN
    tls_listen: tuple[str, ...] = DEFAULT_HTTPS_LISTEN
    tls_cert: str = ""  # the certificate's path on the server, used in place; "" = plain HTTP
    tls_key: str = ""
    acme_webroot: str = ""  # port 80 serves /.well-known/acme-challenge/ from here (certbot --webroot -w)
    client_max_body_size: str = DEFAULT_BODY_SIZE
    stop_grace: int = DEFAULT_STOP_GRACE  # seconds `systemctl stop` lets requests in flight finish
    slot: str = ""  # "blue" | "green" on one machine (these files are that copy's), "" across hosts
    # Several app hosts: "front" (the site only) or "host" (uWSGI only, bound to ``host``); "" = one
    # machine. ``uwsgi_tls_pem``: the PEM texts of the TLS between them (deploy certs), by file.
    role: str = ""
    host: str = ""
    uwsgi_tls_pem: tuple[tuple[str, str], ...] = ()
    # ``--watch``: the server's uwsgi-layouts program and the loopback address of its metrics
    # (deploy/ship/watch.py); "" = no exporter unit.
    watch_bin: str = ""
    watch_listen: str = ""

    # --- what the templates and crosscheck read as from a Layout ---------------------------
    processes = property(lambda self: self.layout.processes)
    threads = property(lambda self: self.layout.threads)
    strategy = property(lambda self: self.layout.strategy)
    strategy_obj = property(lambda self: self.layout.strategy_obj)
    transport = property(lambda self: self.layout.transport)
    backlog = property(lambda self: self.layout.backlog)
    harakiri = property(lambda self: self.layout.harakiri)
    retries = property(lambda self: self.layout.retries)
    connect_timeout = property(lambda self: self.layout.connect_timeout)
    lock_engine = property(lambda self: self.layout.lock_engine)
    server = property(lambda self: self.layout.server)
    nginx_protocol = property(lambda self: self.layout.nginx_protocol)
    upstream_keepalive = property(lambda self: self.layout.upstream_keepalive)
    uwsgi_socket_option = property(lambda self: self.layout.uwsgi_socket_option)
    has_stats = property(lambda self: self.layout.has_stats)
    # Across app hosts (deploy/model/hosts.py): the failure policy and TLS between nginx and uWSGI.
    hosts = property(lambda self: self.layout.hosts)
    app_hosts = property(lambda self: self.layout.app_hosts)
    socket_plans = property(lambda self: self.layout.socket_plans)
    max_fails = property(lambda self: self.layout.max_fails)
    fail_timeout = property(lambda self: self.layout.fail_timeout)
    uwsgi_tls = property(lambda self: self.layout.uwsgi_tls)
    uwsgi_tls_name = property(lambda self: self.layout.uwsgi_tls_name)
    uwsgi_tls_dir = property(lambda self: self.layout.uwsgi_tls_dir)
    nginx_scheme = property(lambda self: self.layout.nginx_scheme)
    data_dir = ""  # the lab's data set never ships
    # The distribution's nginx.conf says `worker_processes auto`: balancing counts need a zone.
    nginx_workers = "auto"
    # uid/gid and chown-socket are always written (see the unit for who starts uWSGI).
    drops_privileges = True

    @property
    def socket_group(self) -> str:
        return self.nginx_group

    @property
    def tls(self) -> bool:
        return bool(self.tls_cert)

    @property
    def instance(self) -> str:
        """The service's name: NAME@SLOT on one machine, NAME on an app host."""
        return f"{self.name}@{self.slot}" if self.slot else self.name

    def for_slot(self, slot: str) -> "Bundle":
        return replace(self, slot=slot)

    @property
    def slots(self) -> tuple[str, ...]:
        """The slots this bundle's service comes in: both on one machine, none across hosts."""
        return SLOTS if self.role != "host" and not self.layout.hosts else ()

    @property
    def run_dir(self) -> str:
        return f"/run/{self.name}/{self.slot}" if self.slot else f"/run/{self.name}"

    @property
    def ini_path(self) -> str:
        return f"{UWSGI_CONF_DIR}/{self.instance}.ini"

    @property
    def master_fifos(self) -> list[str]:
        """Every master FIFO of this bundle's service (one per slot): logrotate writes to each."""
        return [f"{self.for_slot(s).run_dir}/master.fifo" for s in self.slots] or [f"{self.run_dir}/master.fifo"]

    @property
    def catch_all(self) -> bool:
        """Named hosts get a catch-all server before the site's own: other Host headers are closed
        (444) and other or missing SNI refused, so they never reach the app."""
        return self.server_names != ("_",)

    @property
    def catch_all_name(self) -> str:
        # Unique per bundle (.invalid is reserved, RFC 2606): two catch-alls without a name would
        # both be server_name "", which nginx reports as a conflicting server name.
        return f"unknown-host.{self.name}.invalid"

    @property
    def log_dir(self) -> str:
        return f"/var/log/{self.name}"

    @property
    def upstream_name(self) -> str:
        return f"uwsgi_{self.name}"

    @property
    def log_format(self) -> str:
        """The site's access-log format: nginx's names are global to http {}, hence the bundle's name."""
        return f"uwsgi_layouts_{self.name}_timed"

    @property
    def unit(self) -> str:
        return f"{self.instance}.service"

    @property
    def sockets(self) -> list[Socket]:
        if self.layout.hosts:  # each host binds its own address: a host its own sockets, the front all
            return self.layout.host_sockets(self.host) if self.role == "host" else self.layout.sockets
        out = []
        offset = SLOT_PORT_OFFSET if self.slot == SLOTS[1] else 0
        for s in self.layout.sockets:
            address = (f"{self.run_dir}/uwsgi-{s.index}.sock" if self.transport == "unix"
                       else f"127.0.0.1:{self.layout.base_port + offset + s.index}")
            out.append(replace(s, address=address))
        return out

    @property
    def upstream_servers(self) -> list[tuple[Socket, tuple[str, ...]]]:
        """The lab's servers (retry alias, max_fails=0, the strategy's parameters) on our sockets."""
        if self.layout.hosts:
            return self.layout.upstream_servers
        ours = self.sockets
        return [(ours[s.index], params) for s, params in self.layout.upstream_servers]

    @property
    def cpu_quota(self) -> str:
        """The unit's CPUQuota=: the layout's ``@cpus`` in per cent of one CPU ("" = no quota)."""
        return f"{round(self.layout.cpus * 100)}%" if self.layout.cpus is not None else ""

    @property
    def memory_max(self) -> str:
        """The unit's MemoryMax=: the layout's ``@memory`` in MiB (systemd's M is 1024 x 1024)."""
        return f"{self.layout.memory}M" if self.layout.memory is not None else ""

    @property
    def stats_address(self) -> str:
        return f"{self.run_dir}/stats.sock"

    @property
    def https_redirect(self) -> str:
        port = port_of(self.tls_listen[0])
        return "https://$host" + ("" if port == 443 else f":{port}") + "$request_uri"

    @property
    def protect_home(self) -> str:
        """ProtectHome=: "yes" unless an app path lives under /home or /root (then read-only)."""
        return "read-only" if any(within(p, HOME_DIRS) for p in self.app_paths) else "yes"

    @property
    def private_tmp(self) -> bool:
        return not any(within(p, TMP_DIRS) for p in self.app_paths)

    @property
    def watch_private_tmp(self) -> bool:
        """The exporter's unit gets a private /tmp unless its program lives under /tmp or /var/tmp."""
        return not within(self.watch_bin, TMP_DIRS)

    @property
    def app_paths(self) -> list[str]:
        return [self.app_dir, self.virtualenv, self.uwsgi, *(d for _, d in self.static), *self.writable]

    def host_layout(self, host: str) -> "Bundle":
        """The bundle of one app host (crosscheck reads each host's uwsgi.ini through it)."""
        return replace(self, role="host", host=host)

    @property
    def uwsgi_tls_files(self) -> dict[str, str]:
        """Where the TLS files between the front and the hosts live on the server, by role."""
        if self.role == "front":
            base = f"{FRONT_TLS_DIR}/{self.name}"
            return {"ca": f"{base}/ca.crt", "client_cert": f"{base}/front.crt", "client_key": f"{base}/front.key"}
        if self.role == "host":
            base = f"{UWSGI_CONF_DIR}/{self.name}-tls"
            return {"ca": f"{base}/ca.crt", "cert": f"{base}/host.crt", "key": f"{base}/host.key"}
        return {}

    @property
    def watch_unit(self) -> str:
        return watch_unit_of(self.name, self.slot)

    @property
    def access_log(self) -> str:
        """The site's access log (nginx's, in the timed format the exporter reads)."""
        return f"/var/log/nginx/{self.name}.access.log"

    def files(self) -> list[BundleFile]:
        return bundle_files(self.name, self.group, self.role, watch=bool(self.watch_bin))


@dataclass(frozen=True)
class BundleFile:
    path: str  # inside the bundle directory
    target: str  # absolute path on the server
    mode: int
    group: str = "root"
    slot: str = ""  # "blue"/"green": install takes the files of one slot; "" = the bundle's only copy
    kind: str = ""  # site | ini | unit | logrotate | tls: what install does when it changes


def bundle_files(name: str, group: str, role: str = "", watch: bool = False) -> list[BundleFile]:
    """Every installed file of bundle ``name``: where it lives in the bundle and on the server.
    ``role``: "" (one machine: the site, ini and unit of each slot), "front" (the site) or
    "host" (uWSGI) of a bundle across hosts. ``watch``: each slot's exporter unit too."""
    def site(slot: str = "") -> BundleFile:
        inside = f"{slot}/" if slot else ""
        return BundleFile(f"{inside}nginx/sites-available/{name}.conf", f"/etc/nginx/sites-available/{name}.conf",
                          0o644, slot=slot, kind="site")

    def service(slot: str = "") -> list[BundleFile]:
        inside, instance = (f"{slot}/", f"{name}@{slot}") if slot else ("", name)
        return [
            # The app's environment (--env) may hold secrets: readable by root and the run group only.
            BundleFile(f"{inside}uwsgi/{instance}.ini", f"{UWSGI_CONF_DIR}/{instance}.ini", 0o640, group, slot, "ini"),
            BundleFile(f"{inside}systemd/{instance}.service", f"/etc/systemd/system/{instance}.service", 0o644,
                       slot=slot, kind="unit"),
        ]

    def exporter(slot: str) -> list[BundleFile]:
        unit = watch_unit_of(name, slot)
        return [BundleFile(f"{slot}/systemd/{unit}", f"/etc/systemd/system/{unit}", 0o644, slot=slot,
                           kind="watch")] if watch else []

    logrotate = [BundleFile(f"logrotate/{name}", f"/etc/logrotate.d/{name}", 0o644, kind="logrotate")]
    if not role:
        return [f for slot in SLOTS for f in (site(slot), *service(slot), *exporter(slot))] + logrotate
    files = [site()] if role == "front" else [*service(), *logrotate]
    if role == "front":  # nginx's master reads its client key as root
        base = f"{FRONT_TLS_DIR}/{name}"
        files += [BundleFile("uwsgi-tls/ca.crt", f"{base}/ca.crt", 0o644, kind="tls"),
                  BundleFile("uwsgi-tls/front.crt", f"{base}/front.crt", 0o644, kind="tls"),
                  BundleFile("uwsgi-tls/front.key", f"{base}/front.key", 0o600, kind="tls")]
    if role == "host":  # systemd starts uWSGI as the run user, who reads the key (group, 0640)
        base = f"{UWSGI_CONF_DIR}/{name}-tls"
        files += [BundleFile("uwsgi-tls/ca.crt", f"{base}/ca.crt", 0o644, kind="tls"),
                  BundleFile("uwsgi-tls/host.crt", f"{base}/host.crt", 0o644, kind="tls"),
                  BundleFile("uwsgi-tls/host.key", f"{base}/host.key", 0o640, group, kind="tls")]
    return files


def site_link(name: str) -> tuple[str, str]:
    """(link, target) that enables the site, as Debian's nginx.conf includes sites-enabled/*."""
    return f"/etc/nginx/sites-enabled/{name}.conf", f"/etc/nginx/sites-available/{name}.conf"


def system_paths(name: str) -> tuple[str, ...]:
    """The system paths a bundle's files name; ``install --root`` moves exactly these. (The
    certificates, ACME webroot and app paths are the server's own and stay where they are.)"""
    return ("/etc/nginx", UWSGI_CONF_DIR, "/etc/systemd/system", "/etc/logrotate.d",
            f"/run/{name}", f"/var/log/{name}", "/var/log/nginx")


def site_logs(name: str) -> list[str]:
    """The site's nginx logs, named for the bundle (Debian's logrotate file for nginx rotates them)."""
    return [f"/var/log/nginx/{name}.{kind}.log" for kind in ("access", "error")]


def relocate(text: str, name: str, root: Path) -> str:
    """``text`` with the bundle's system paths moved under ``root`` (unchanged for /)."""
    if root == Path("/"):
        return text
    prefixes = sorted(system_paths(name), key=len, reverse=True)
    pattern = re.compile(r"(?<![\w./-])(" + "|".join(re.escape(p) for p in prefixes) + r")(?=[/\s;:\"']|$)",
                         re.MULTILINE)
    return pattern.sub(lambda m: f"{root}{m[1]}", text)


def under(root: Path, path: str) -> Path:
    """Where the server path ``path`` lands when installing into ``root``."""
    return root / path.lstrip("/")


def unit_of(name: str, slot: str) -> str:
    """The systemd unit of the bundle ``name`` in ``slot`` ("" across hosts: one unit, no slots)."""
    return f"{name}@{slot}.service" if slot else f"{name}.service"


def _topology(spec: str, name: str, options: dict) -> Layout:
    """The lab's Layout for processes x threads x strategy and the uWSGI/nginx tuning options. Its
    lab-only fields (run dir, listen, user) never reach a bundle file: they get values
    that always validate and cannot collide with the sockets. Across hosts, the certificates are
    read from this machine (``_across_hosts`` copies them into the bundle)."""
    spec, limits = _limits(spec)
    options = {**options, **limits}
    transport = options.get("transport") or ("tcp" if options.get("hosts") else "unix")
    probe = parse_layout(spec, transport="unix", run_dir=f"/run/{name}")
    count = len(probe.sockets)
    base = options.get("base_port") or 5000
    try:
        first = int(str(base).strip())
    except ValueError:
        first = 5000  # parse_layout names the bad value below
    spare = [p for p in (1, 2, 65534, 65535) if not first <= p < first + count][:1]
    layout = parse_layout(spec, transport=transport, base_port=base, listen=f"127.0.0.1:{spare[0]}",
                          run_dir=f"/run/{name}",
                          **{k: v for k, v in options.items() if k not in ("transport", "base_port")})
    return replace(layout, uwsgi_tls_dir=check_hosts(layout))


def _limits(spec: str) -> tuple[str, dict[str, str]]:
    """``PxT-STRATEGY@cpus=N,memory=MB``: the layout and the pod-sized limits the unit carries
    (CPUQuota=, MemoryMax=). Every other option after ``@`` is a lab variant, refused by name: a
    bundle's tuning options are its flags."""
    base, sep, extra = str(spec).partition("@")
    limits: dict[str, str] = {}
    for item in extra.split(",") if sep else ():
        key, eq, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if key not in BUNDLE_LIMITS or not eq:
            raise LayoutError("layout", f"a bundle takes only {' and '.join(f'{k}=' for k in BUNDLE_LIMITS)} after "
                                        f"'@' (the unit's CPUQuota= and MemoryMax=), got {item.strip()!r} in "
                                        f"{spec!r}; give other options as flags")
        limits[key] = value.strip()
    return base, limits


def uwsgi_server(strategy) -> str:
    """The server a strategy runs: "uwsgi" unless the strategy says otherwise (``server``)."""
    return str(getattr(strategy, "server", "uwsgi") or "uwsgi")


def default_name(app: str) -> str:
    return app.partition(":")[0].split(".")[0].lower().replace("_", "-")


def build_bundle(spec: str, *, app=None, app_dir=None, virtualenv=None, env=None, static=None, name=None,
                 uwsgi=None, user=None, group=None, nginx_group=None, writable=None, server_names=None,
                 listen=None, tls_listen=None, tls_cert=None, tls_key=None, acme_webroot=None,
                 client_max_body_size=None, stop_grace=None, allow=(), watch=None, watch_listen=None,
                 **layout_options) -> Bundle:
    """A validated Bundle, or LayoutError naming the field. Reads only the TLS files given, and
    only when they exist on this machine (``install`` checks them on the server in any case).
    ``allow``: risks accepted by name (``system-static``: a static directory under /var/lib,
    /root...; the directories of /etc, /run, /proc... that the bundle writes to are never taken)."""
    app = str(app or DEFAULT_APP)
    if not APP_RE.match(app):
        target = parse_app(app)  # raises, saying what is allowed, unless it is a factory
        raise LayoutError("app", f"{target.text} is an app factory, which a bundle's uwsgi.ini cannot call: write "
                                 f"`from {target.module} import {target.name}; application = {target.callable_text}` "
                                 "into a module of your app (wsgi.py) and give --app wsgi:application")
        raise LayoutError("app", f"expected an importable module:callable such as shop.wsgi:application, got {app!r}")
    bundle_name = str(name) if name is not None else default_name(app)
    if not NAME_RE.match(bundle_name):
        raise LayoutError("name", f"{bundle_name!r} must be 1-40 lowercase letters, digits, _ and -, starting with a "
                                  "letter or digit (it names the unit, /run/NAME, /var/log/NAME and the files)")
    layout = _topology(spec, bundle_name, {k: v for k, v in layout_options.items() if v is not None})
    runs = uwsgi_server(layout.strategy_obj)
    if runs != "uwsgi":
        ours = ", ".join(n for n, s in STRATEGIES.items() if uwsgi_server(s) == "uwsgi")
        raise LayoutError("layout", f"strategy {layout.strategy} runs {runs}, not uWSGI: a bundle ships uWSGI only "
                                    f"(uWSGI strategies: {ours})")
    if layout.uwsgi_bin:
        raise LayoutError("uwsgi_bin", "is the lab's uWSGI; a bundle names the server's with --uwsgi")
    if layout.protocol != "uwsgi":
        raise LayoutError("protocol", f"a bundle's nginx speaks uwsgi to uWSGI (uwsgi_pass); {layout.protocol} "
                                      "is a variant to measure in the lab, not shipped")
    app_dir = server_path("app_dir", app_dir, "--app-dir (the app's directory)")
    venv = server_path("virtualenv", virtualenv, "--virtualenv (the app's virtualenv, which holds uWSGI)")
    uwsgi_bin = server_path("uwsgi", uwsgi or f"{venv}/bin/uwsgi", "--uwsgi")
    # The default is pyuwsgi in the app's virtualenv (INSTALL.md); a --uwsgi path is pyuwsgi when
    # it is a script here (bundled on the server, or at the same path), else a uWSGI binary.
    pyuwsgi = not uwsgi or (os.path.isfile(uwsgi_bin) and script_interpreter(Path(uwsgi_bin)) is not None)
    static_dirs = parse_static(static or (), local=False)
    for prefix, directory in static_dirs:
        server_path("static", directory, f"the directory for {prefix}/")
    check_static_locations(static_dirs, tuple(allow or ()))  # /var/lib, /root... as the lab's run refuses them
    writable_dirs = tuple(server_path("writable", d, "--writable DIR") for d in (writable or ()))
    user_name = account_name("user", user, DEBIAN_NGINX_GROUP)
    cert_path, key_path = tls_paths(tls_cert, tls_key)
    if cert_path and (os.path.lexists(cert_path) or os.path.lexists(key_path)):
        check_tls_pair(cert_path, key_path, nobody_ids())
    webroot = server_path("acme_webroot", acme_webroot, "--acme-webroot DIR") if acme_webroot else ""
    http = tuple(dict.fromkeys(listen_address("listen", x) for x in (listen or DEFAULT_HTTP_LISTEN)))
    https = tuple(dict.fromkeys(listen_address("tls_listen", x) for x in (tls_listen or DEFAULT_HTTPS_LISTEN)))
    if tls_listen and not cert_path:
        raise LayoutError("tls_listen", "needs --tls-cert and --tls-key: without them the site is plain HTTP")
    clash = sorted({port_of(a) for a in http} & {port_of(a) for a in https}) if cert_path else []
    if clash:
        raise LayoutError("tls_listen", f"port {clash[0]} is given to both --listen and --tls-listen")
    if layout.transport == "tcp":
        taken = {port_of(a) for a in http + (https if cert_path else ())}
        # On one machine the green slot's sockets sit SLOT_PORT_OFFSET above blue's.
        offsets = (0,) if layout.hosts else (0, SLOT_PORT_OFFSET)
        ports = {layout.base_port + o + s.index for o in offsets for s in layout.sockets}
        if max(ports) > 65535:
            raise LayoutError("base_port", f"the second slot's sockets need ports up to {max(ports)} "
                                           f"(--base-port + {SLOT_PORT_OFFSET}): choose a lower --base-port")
        if taken & ports:
            raise LayoutError("base_port", f"uWSGI socket port {min(taken & ports)} is also an nginx listen port: "
                                           "choose another --base-port")
    if watch_listen is not None and watch is None:
        raise LayoutError("watch_listen", "needs --watch (the path of uwsgi-layouts on the server)")
    if watch is not None and layout.hosts:
        raise LayoutError("watch", "is for a bundle on one machine; across --hosts, run uwsgi-layouts watch on each "
                                   "app host by hand (docs/watch.md)")
    watch_bin = watch_program(watch) if watch is not None else ""
    nginx_ports = {port_of(a) for a in http + (https if cert_path else ())}
    metrics = watch_listen_address(watch_listen, nginx_ports) if watch_bin else ""
    size = str(client_max_body_size or DEFAULT_BODY_SIZE).strip()
    if not BODY_SIZE_RE.match(size):
        raise LayoutError("client_max_body_size", f"expected a size such as 10m, 512k or 0 (no limit), got {size!r}")
    return Bundle(
        layout=layout, name=bundle_name, app=app, app_dir=app_dir, virtualenv=venv, uwsgi=uwsgi_bin, pyuwsgi=pyuwsgi,
        user=user_name, group=account_name("group", group, user_name),
        nginx_group=account_name("nginx_group", nginx_group, DEBIAN_NGINX_GROUP),
        env=parse_env(env or ()), static=static_dirs, writable=writable_dirs,
        server_names=server_name_list(server_names),
        listen=http, tls_listen=https if cert_path else (), tls_cert=cert_path, tls_key=key_path,
        acme_webroot=webroot, client_max_body_size=size.lower(), stop_grace=_stop_grace(stop_grace, layout.harakiri),
        watch_bin=watch_bin, watch_listen=metrics,
        **_across_hosts(layout),
    )


def _stop_grace(raw, harakiri: int) -> int:
    """Seconds `systemctl stop` waits for requests in flight: --stop-grace, else the harakiri limit
    (no request runs longer), else DEFAULT_STOP_GRACE."""
    if raw is None:
        return harakiri or DEFAULT_STOP_GRACE
    text = str(raw).strip()
    if not text.isdigit() or not 1 <= int(text) <= MAX_STOP_GRACE:
        raise LayoutError("stop_grace", f"expected whole seconds in 1..{MAX_STOP_GRACE}, got {text!r}")
    return int(text)


def _across_hosts(layout: Layout) -> dict:
    """With hosts: the front's role and the PEM texts of the TLS between front and hosts (read
    from the layout's uwsgi_tls_dir, which ``_topology`` checked). A bundle ships suwsgi only."""
    if not layout.hosts:
        return {}
    if layout.uwsgi_tls != "suwsgi":
        raise LayoutError("uwsgi_tls", f"a bundle across hosts speaks suwsgi to them, not {layout.uwsgi_tls} "
                                       "(https was measured no better: README, Several hosts)")
    base = Path(layout.uwsgi_tls_dir)
    names = {"ca.crt": CA_CERT, "front.crt": CLIENT_CERT, "front.key": CLIENT_KEY}
    for h in layout.hosts:
        names |= {f"{h}/host.crt": host_cert(h), f"{h}/host.key": host_key(h)}
    pem = tuple((key, read_pem("uwsgi_tls_dir", str(base / source))) for key, source in names.items())
    return {"role": "front", "uwsgi_tls_pem": pem}


def host_bundles(front: Bundle) -> list[Bundle]:
    """One bundle per app host of a front bundle (uWSGI bound to that host, its certificate)."""
    return [front.host_layout(h) for h in front.layout.hosts]
