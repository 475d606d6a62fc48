"""A production bundle: the files a Debian/Ubuntu server takes as they are.

``python -m deploy bundle LAYOUT --out DIR`` writes, for a bundle called NAME::

    nginx/sites-available/NAME.conf  -> /etc/nginx/sites-available/NAME.conf (+ sites-enabled link)
    uwsgi/NAME.ini                   -> /etc/uwsgi-layouts/NAME.ini
    systemd/NAME.service             -> /etc/systemd/system/NAME.service
    logrotate/NAME                   -> /etc/logrotate.d/NAME
    tls/NAME.crt, tls/NAME.key       -> /etc/ssl/certs/NAME.crt, /etc/ssl/private/NAME.key (with TLS)
    INSTALL.md, bundle.json          (not installed: the commands for this bundle; what install reads)

With ``--hosts A,B`` (app hosts behind one front, deploy/hosts.py) it writes one bundle for the
front and one per app host (``write_host_bundles``): ``front/`` holds the site (its upstream
lists every socket of every host, over TLS with nginx's client certificate, in
/etc/nginx/uwsgi-tls/NAME/), ``hosts/ADDR/`` the uwsgi.ini (ssl-sockets bound to ADDR, the
host's certificate in /etc/uwsgi-layouts/NAME-tls/), the unit and logrotate file. Each is
installed with ``deploy install`` on its machine; all of them are cross-checked together.

A bundle depends on nothing of the machine it is rendered on: the app's directory, virtualenv,
uWSGI binary and static directories are paths on the *server*, checked for shape here and for
existence by ``deploy install`` on the server (deploy/install.py), which also runs the app's
pre-flight import there. The topology (processes x threads x strategy, failover, timeouts)
comes from the same ``Layout`` the lab renders, and the files are cross-checked with the lab's
``render.crosscheck`` before the bundle directory appears.
"""

from __future__ import annotations

import ipaddress
import json
import os
import pwd
import re
import shutil
import ssl
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from deploy.errors import LayoutError, RenderError
from deploy.hosts import SSL_CIPHERS, SSL_PROTOCOLS
from deploy.layout import APP_RE, DEFAULT_APP, Layout, Socket, parse_env, parse_layout, parse_static
from deploy.render import TEMPLATES_DIR, _env, crosscheck, make_staging, parse_uwsgi_ini
from deploy.servers import server_for
from deploy.strategies import STRATEGIES

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

# NAME names a systemd unit, /run/NAME, /var/log/NAME, files and an nginx upstream and zone.
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,39}$")
# Debian's adduser accepts these by default (NAME_REGEX); systemd's User= too.
ACCOUNT_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
# Server paths go unquoted into nginx, uwsgi.ini ($, %) and systemd (%, $, spaces, quotes).
SERVER_PATH_RE = re.compile(r"^(/[A-Za-z0-9._+@-]+)+$")
HOSTNAME_RE = re.compile(r"^(\*\.)?([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}"
                         r"[A-Za-z0-9])?)*$")
BODY_SIZE_RE = re.compile(r"^(0|[1-9][0-9]{0,5}[kKmMgG]?)$")
# Where a bundle writes; an app path below one of these would be relocated by `install --root`
# or hidden by the unit's sandbox, so none may be.
SYSTEM_DIRS = ("/etc", "/run", "/var/log", "/proc", "/sys", "/dev", "/boot")
TMP_DIRS = ("/tmp", "/var/tmp")  # PrivateTmp= hides them from the service
HOME_DIRS = ("/home", "/root", "/run/user")  # ProtectHome= hides them

# Mozilla's "intermediate" profile (ssl-config.mozilla.org, guidelines 6.0) for nginx 1.22 with
# OpenSSL 3.0 (Debian 12): X25519MLKEM768 needs OpenSSL 3.5, so it is left out of the curves.
TLS_PROTOCOLS = "TLSv1.2 TLSv1.3"
TLS_CURVES = "X25519:prime256v1:secp384r1"
TLS_CIPHERS = ("ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES256-GCM-SHA384:"
               "ECDHE-RSA-AES256-GCM-SHA384:ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305")
HSTS_MAX_AGE = 63072000


def _under(path: str, roots: tuple[str, ...]) -> str:
    return next((r for r in roots if path == r or path.startswith(r + "/")), "")


def server_path(field_name: str, raw, what: str) -> str:
    """An absolute, normalised path on the server, in characters every generated file can hold."""
    text = str(raw or "")
    if not text:
        raise LayoutError(field_name, f"a bundle needs {what} as an absolute path on the server")
    clean = os.path.normpath(text) if text.startswith("/") else text
    if clean.startswith("//"):
        clean = "/" + clean.lstrip("/")
    if not clean.startswith("/") or clean == "/":
        raise LayoutError(field_name, f"{text!r} must be an absolute path on the server (such as /srv/shop), not /")
    if not SERVER_PATH_RE.match(clean):
        raise LayoutError(field_name, f"{text!r} may hold only letters, digits and . _ + @ - between slashes "
                                      "(it goes unquoted into nginx, uwsgi.ini and the systemd unit)")
    taken = _under(clean, SYSTEM_DIRS)
    if taken:
        raise LayoutError(field_name, f"{clean} is under {taken}, where the bundle's own files live: "
                                      "put the app under /srv or /opt")
    return clean


def _account(field_name: str, raw, default: str) -> str:
    name = str(raw or default)
    if not ACCOUNT_RE.match(name):
        raise LayoutError(field_name, f"{name!r} must be a user/group name of lowercase letters, digits, _ and - "
                                      "(starting with a letter or _, at most 32)")
    if field_name in ("user", "group") and name == "root":
        raise LayoutError(field_name, "root is refused: uWSGI runs the app, which must not run as root")
    return name


def _listen(field_name: str, raw: str) -> str:
    """``PORT``, ``IPV4:PORT`` or ``[IPV6]:PORT`` as nginx's listen takes it."""
    text = str(raw).strip()
    host, sep, port = text.rpartition(":") if not text.isdigit() else ("", "", text)
    if host:
        try:
            if host.startswith("[") and host.endswith("]"):
                ipaddress.IPv6Address(host[1:-1])
            else:
                ipaddress.IPv4Address(host)
        except ValueError:
            host = "bad"
    if host == "bad" or (sep and not host) or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise LayoutError(field_name, f"expected PORT, IPV4:PORT or [IPV6]:PORT such as 80, 127.0.0.1:8080 or "
                                      f"[::]:80, got {text!r}")
    return f"{host}:{int(port)}" if host else str(int(port))


def port_of(listen: str) -> int:
    return int(listen.rpartition(":")[2])


def _server_names(raw) -> tuple[str, ...]:
    names = tuple(raw or ()) or ("_",)
    for name in names:
        if name != "_" and not HOSTNAME_RE.match(name):
            raise LayoutError("server_name", f"{name!r} must be a host name such as shop.example.com or "
                                             "*.example.com (or _ for any)")
    return names


def _read_pem(field_name: str, path: str) -> str:
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or "not a text file"
        raise LayoutError(field_name, f"cannot read {path}: {reason}") from None
    return text


def read_tls(cert: str | None, key: str | None) -> tuple[str, str]:
    """(certificate chain, private key) as PEM text, checked to belong together; ("", "") without TLS."""
    if not cert and not key:
        return "", ""
    if not cert or not key:
        given, missing = ("tls_cert", "--tls-key") if cert else ("tls_key", "--tls-cert")
        raise LayoutError(given, f"needs {missing} too: nginx serves HTTPS with a certificate and its key")
    cert_text, key_text = _read_pem("tls_cert", cert), _read_pem("tls_key", key)
    if "-----BEGIN CERTIFICATE-----" not in cert_text:
        raise LayoutError("tls_cert", f"{cert} holds no PEM certificate (-----BEGIN CERTIFICATE-----)")
    if "PRIVATE KEY-----" in cert_text:
        raise LayoutError("tls_cert", f"{cert} also holds a private key, and the certificate is installed "
                                      "world-readable: give the key alone with --tls-key")
    if not re.search(r"-----BEGIN [A-Z ]*PRIVATE KEY-----", key_text):
        raise LayoutError("tls_key", f"{key} holds no PEM private key")

    class Encrypted(Exception):
        pass

    def no_passphrase():
        raise Encrypted

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(cert, key, password=no_passphrase)
    except Encrypted:
        raise LayoutError("tls_key", f"{key} is encrypted: nginx would ask for its passphrase at every start; "
                                     f"decrypt it (openssl pkey -in {key} -out KEY.pem)") from None
    except ssl.SSLError as exc:
        why = "does not belong to the certificate" if "KEY_VALUES_MISMATCH" in str(exc) else f"is unusable ({exc})"
        raise LayoutError("tls_key", f"{key} {why} in {cert}") from None
    return cert_text, key_text


# --- the bundle ------------------------------------------------------------------------------


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
    env: tuple[tuple[str, str], ...] = ()
    static: tuple[tuple[str, str], ...] = ()
    writable: tuple[str, ...] = ()
    server_names: tuple[str, ...] = ("_",)
    listen: tuple[str, ...] = DEFAULT_HTTP_LISTEN
    tls_listen: tuple[str, ...] = DEFAULT_HTTPS_LISTEN
    tls_cert: str = ""  # PEM text (copied into the bundle), "" = plain HTTP
    tls_key: str = ""
    client_max_body_size: str = DEFAULT_BODY_SIZE
    # Several app hosts: "front" (the site only) or "host" (uWSGI only, bound to ``host``); "" = one
    # machine. ``uwsgi_tls_pem``: the PEM texts of the TLS between them (deploy certs), by file.
    role: str = ""
    host: str = ""
    uwsgi_tls_pem: tuple[tuple[str, str], ...] = ()

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
    has_stats = property(lambda self: self.layout.has_stats)
    # Across app hosts (deploy/hosts.py): the failure policy and TLS between nginx and uWSGI.
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
    def run_dir(self) -> str:
        return f"/run/{self.name}"

    @property
    def log_dir(self) -> str:
        return f"/var/log/{self.name}"

    @property
    def upstream_name(self) -> str:
        return f"uwsgi_{self.name}"

    @property
    def unit(self) -> str:
        return f"{self.name}.service"

    @property
    def sockets(self) -> list[Socket]:
        if self.layout.hosts:  # each host binds its own address: a host its own sockets, the front all
            return self.layout.host_sockets(self.host) if self.role == "host" else self.layout.sockets
        out = []
        for s in self.layout.sockets:
            address = (f"{self.run_dir}/uwsgi-{s.index}.sock" if self.transport == "unix"
                       else f"127.0.0.1:{self.layout.base_port + s.index}")
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
    def stats_address(self) -> str:
        return f"{self.run_dir}/stats.sock"

    @property
    def https_redirect(self) -> str:
        port = port_of(self.tls_listen[0])
        return "https://$host" + ("" if port == 443 else f":{port}") + "$request_uri"

    @property
    def protect_home(self) -> str:
        """ProtectHome=: "yes" unless an app path lives under /home or /root (then read-only)."""
        return "read-only" if any(_under(p, HOME_DIRS) for p in self.app_paths) else "yes"

    @property
    def private_tmp(self) -> bool:
        return not any(_under(p, TMP_DIRS) for p in self.app_paths)

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

    def files(self) -> list[BundleFile]:
        return bundle_files(self.name, self.tls, self.group, self.role)


@dataclass(frozen=True)
class BundleFile:
    path: str  # inside the bundle directory
    target: str  # absolute path on the server
    mode: int
    group: str = "root"


def bundle_files(name: str, tls: bool, group: str, role: str = "") -> list[BundleFile]:
    """Every installed file of bundle ``name``: where it lives in the bundle and on the server.
    ``role``: "" (one machine), "front" (the site) or "host" (uWSGI) of a bundle across hosts."""
    site = [BundleFile(f"nginx/sites-available/{name}.conf", f"/etc/nginx/sites-available/{name}.conf", 0o644)]
    service = [
        # The app's environment (--env) may hold secrets: readable by root and the run group only.
        BundleFile(f"uwsgi/{name}.ini", f"{UWSGI_CONF_DIR}/{name}.ini", 0o640, group),
        BundleFile(f"systemd/{name}.service", f"/etc/systemd/system/{name}.service", 0o644),
        BundleFile(f"logrotate/{name}", f"/etc/logrotate.d/{name}", 0o644),
    ]
    files = (site if role != "host" else []) + (service if role != "front" else [])
    if role == "front":  # nginx's master reads its client key as root
        base = f"{FRONT_TLS_DIR}/{name}"
        files += [BundleFile("uwsgi-tls/ca.crt", f"{base}/ca.crt", 0o644),
                  BundleFile("uwsgi-tls/front.crt", f"{base}/front.crt", 0o644),
                  BundleFile("uwsgi-tls/front.key", f"{base}/front.key", 0o600)]
    if role == "host":  # systemd starts uWSGI as the run user, who reads the key (group, 0640)
        base = f"{UWSGI_CONF_DIR}/{name}-tls"
        files += [BundleFile("uwsgi-tls/ca.crt", f"{base}/ca.crt", 0o644),
                  BundleFile("uwsgi-tls/host.crt", f"{base}/host.crt", 0o644),
                  BundleFile("uwsgi-tls/host.key", f"{base}/host.key", 0o640, group)]
    if tls and role != "host":
        files += [
            BundleFile(f"tls/{name}.crt", f"/etc/ssl/certs/{name}.crt", 0o644),
            # nginx's master reads the key as root before starting workers.
            BundleFile(f"tls/{name}.key", f"/etc/ssl/private/{name}.key", 0o600),
        ]
    return files


def site_link(name: str) -> tuple[str, str]:
    """(link, target) that enables the site, as Debian's nginx.conf includes sites-enabled/*."""
    return f"/etc/nginx/sites-enabled/{name}.conf", f"/etc/nginx/sites-available/{name}.conf"


def system_paths(name: str) -> tuple[str, ...]:
    """The system paths a bundle's files name; ``install --root`` moves exactly these."""
    return ("/etc/nginx", "/etc/ssl", UWSGI_CONF_DIR, "/etc/systemd/system", "/etc/logrotate.d",
            f"/run/{name}", f"/var/log/{name}", "/var/log/nginx")


def _topology(spec: str, name: str, options: dict) -> Layout:
    """The lab's Layout for processes x threads x strategy and the uWSGI/nginx tuning options. Its
    lab-only fields (run dir, listen, stats port, user) never reach a bundle file: they get values
    that always validate and cannot collide with the sockets."""
    transport = options.get("transport") or ("tcp" if options.get("hosts") else "unix")
    probe = parse_layout(spec, transport="unix", run_dir=f"/run/{name}", user=pwd.getpwuid(os.geteuid()).pw_name)
    count = len(probe.sockets)
    base = options.get("base_port") or 5000
    try:
        first = int(str(base).strip())
    except ValueError:
        first = 5000  # parse_layout names the bad value below
    spare = [p for p in (1, 2, 65534, 65535) if not first <= p < first + count][:2]
    return parse_layout(spec, transport=transport, base_port=base, listen=f"127.0.0.1:{spare[0]}",
                        stats_port=spare[1], run_dir=f"/run/{name}", user=pwd.getpwuid(os.geteuid()).pw_name,
                        **{k: v for k, v in options.items() if k not in ("transport", "base_port")})


def uwsgi_server(strategy) -> str:
    """The server a strategy runs: "uwsgi" unless the strategy says otherwise (``server``)."""
    return str(getattr(strategy, "server", "uwsgi") or "uwsgi")


def default_name(app: str) -> str:
    return app.partition(":")[0].split(".")[0].lower().replace("_", "-")


def build_bundle(spec: str, *, app=None, app_dir=None, virtualenv=None, env=None, static=None, name=None,
                 uwsgi=None, user=None, group=None, nginx_group=None, writable=None, server_names=None,
                 listen=None, tls_listen=None, tls_cert=None, tls_key=None, client_max_body_size=None,
                 **layout_options) -> Bundle:
    """A validated Bundle, or LayoutError naming the field. Reads only the TLS files given."""
    app = str(app or DEFAULT_APP)
    if not APP_RE.match(app):
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
    app_dir = server_path("app_dir", app_dir, "--app-dir (the app's directory)")
    venv = server_path("virtualenv", virtualenv, "--virtualenv (the app's virtualenv, which holds uWSGI)")
    uwsgi_bin = server_path("uwsgi", uwsgi or f"{venv}/bin/uwsgi", "--uwsgi")
    static_dirs = parse_static(static or (), local=False)
    for prefix, directory in static_dirs:
        server_path("static", directory, f"the directory for {prefix}/")
    writable_dirs = tuple(server_path("writable", d, "--writable DIR") for d in (writable or ()))
    user_name = _account("user", user, DEBIAN_NGINX_GROUP)
    tls_cert_text, tls_key_text = read_tls(tls_cert, tls_key)
    http = tuple(dict.fromkeys(_listen("listen", x) for x in (listen or DEFAULT_HTTP_LISTEN)))
    https = tuple(dict.fromkeys(_listen("tls_listen", x) for x in (tls_listen or DEFAULT_HTTPS_LISTEN)))
    if tls_listen and not tls_cert_text:
        raise LayoutError("tls_listen", "needs --tls-cert and --tls-key: without them the site is plain HTTP")
    clash = sorted({port_of(a) for a in http} & {port_of(a) for a in https}) if tls_cert_text else []
    if clash:
        raise LayoutError("tls_listen", f"port {clash[0]} is given to both --listen and --tls-listen")
    if layout.transport == "tcp":
        taken = {port_of(a) for a in http + (https if tls_cert_text else ())}
        ports = {layout.base_port + s.index for s in layout.sockets}
        if taken & ports:
            raise LayoutError("base_port", f"uWSGI socket port {min(taken & ports)} is also an nginx listen port: "
                                           "choose another --base-port")
    size = str(client_max_body_size or DEFAULT_BODY_SIZE).strip()
    if not BODY_SIZE_RE.match(size):
        raise LayoutError("client_max_body_size", f"expected a size such as 10m, 512k or 0 (no limit), got {size!r}")
    return Bundle(
        layout=layout, name=bundle_name, app=app, app_dir=app_dir, virtualenv=venv, uwsgi=uwsgi_bin,
        user=user_name, group=_account("group", group, user_name),
        nginx_group=_account("nginx_group", nginx_group, DEBIAN_NGINX_GROUP),
        env=parse_env(env or ()), static=static_dirs, writable=writable_dirs, server_names=_server_names(server_names),
        listen=http, tls_listen=https if tls_cert_text else (), tls_cert=tls_cert_text, tls_key=tls_key_text,
        client_max_body_size=size.lower(), **_across_hosts(layout),
    )


def _across_hosts(layout: Layout) -> dict:
    """With hosts: the front's role and the PEM texts of the TLS between front and hosts (read
    from the layout's uwsgi_tls_dir, which deploy.hosts checked). A bundle ships suwsgi only."""
    if not layout.hosts:
        return {}
    if layout.uwsgi_tls != "suwsgi":
        raise LayoutError("uwsgi_tls", f"a bundle across hosts speaks suwsgi to them, not {layout.uwsgi_tls} "
                                       "(https was measured no better: README, Several hosts)")
    from deploy.certs import CA_CERT, CLIENT_CERT, CLIENT_KEY, host_cert, host_key

    base = Path(layout.uwsgi_tls_dir)
    names = {"ca.crt": CA_CERT, "front.crt": CLIENT_CERT, "front.key": CLIENT_KEY}
    for h in layout.hosts:
        names |= {f"{h}/host.crt": host_cert(h), f"{h}/host.key": host_key(h)}
    pem = tuple((key, _read_pem("uwsgi_tls_dir", str(base / source))) for key, source in names.items())
    return {"role": "front", "uwsgi_tls_pem": pem}


def host_bundles(front: Bundle) -> list[Bundle]:
    """One bundle per app host of a front bundle (uWSGI bound to that host, its certificate)."""
    return [front.host_layout(h) for h in front.layout.hosts]


# --- rendering ---------------------------------------------------------------------------------


def outdent(text: str, width: int = 4) -> str:
    """Remove ``width`` leading spaces from every line: the lab's partials are indented for a
    server {} inside http {}, a site's server {} is at the top of its file."""
    prefix = " " * width
    return "\n".join(line[width:] if line.startswith(prefix) else line for line in text.split("\n"))


def render_bundle(bundle: Bundle) -> dict[str, str]:
    """Bundle-relative path -> text, every file with the generated header."""
    env = _env()
    env.filters["outdent"] = outdent
    context = {
        "layout": bundle, "bundle": bundle, "server": server_for(bundle.layout), "unix_mode": "660",
        "files": bundle.files(),
        "site_link": site_link(bundle.name), "conf_dir": UWSGI_CONF_DIR,
        "tls_protocols": TLS_PROTOCOLS, "tls_curves": TLS_CURVES, "tls_ciphers": TLS_CIPHERS,
        "hsts_max_age": HSTS_MAX_AGE, "ssl_ciphers": SSL_CIPHERS, "ssl_protocols": SSL_PROTOCOLS,
    }
    name = bundle.name
    texts = {}
    if bundle.role != "host":
        texts[f"nginx/sites-available/{name}.conf"] = env.get_template("bundle/site.conf.j2").render(context)
    if bundle.role != "front":
        texts |= {
            f"uwsgi/{name}.ini": env.get_template("bundle/uwsgi.ini.j2").render(context),
            f"systemd/{name}.service": env.get_template("bundle/unit.service.j2").render(context),
            f"logrotate/{name}": env.get_template("bundle/logrotate.j2").render(context),
        }
    header = env.get_template("bundle/pem_header.j2").render(context)
    if bundle.tls and bundle.role != "host":
        texts[f"tls/{name}.crt"] = header + bundle.tls_cert.lstrip()
        texts[f"tls/{name}.key"] = header + bundle.tls_key.lstrip()
    pem = dict(bundle.uwsgi_tls_pem)
    wanted = {"front": ("ca.crt", "front.crt", "front.key"),
              "host": ("ca.crt", f"{bundle.host}/host.crt", f"{bundle.host}/host.key")}.get(bundle.role, ())
    for key in wanted:
        texts[f"uwsgi-tls/{key.rpartition('/')[2]}"] = header + pem[key].lstrip()
    texts["INSTALL.md"] = env.get_template("bundle/INSTALL.md.j2").render(context)
    texts[BUNDLE_JSON] = json.dumps(bundle_record(bundle), indent=2) + "\n"
    return texts


def bundle_record(bundle: Bundle) -> dict:
    """bundle.json: what `deploy install` needs besides the files (names, the app's server paths)."""
    return {
        "format_version": BUNDLE_JSON_VERSION,
        "generated_by": "python -m deploy bundle",
        "name": bundle.name,
        "layout": bundle.layout.name,
        "tls": bundle.tls,
        **({"role": bundle.role, "host": bundle.host, "hosts": list(bundle.layout.hosts)} if bundle.role else {}),
        "server_names": list(bundle.server_names),
        "unit": bundle.unit,
        "run_dir": bundle.run_dir,
        "log_dir": bundle.log_dir,
        "server": {
            "user": bundle.user, "group": bundle.group, "nginx_group": bundle.nginx_group,
            "uwsgi": bundle.uwsgi, "app": bundle.app, "app_dir": bundle.app_dir, "virtualenv": bundle.virtualenv,
            "env": [list(kv) for kv in bundle.env], "static": [list(kv) for kv in bundle.static],
            "writable": list(bundle.writable), "sockets": [s.address for s in bundle.sockets],
        },
        "files": [{"path": f.path, "target": f.target, "mode": f"{f.mode:04o}", "group": f.group}
                  for f in bundle.files()],
        "links": [dict(zip(("link", "target"), site_link(bundle.name), strict=True))],
    }


# --- checks on the rendered files --------------------------------------------------------------

# Directives of the main and events contexts: a site included inside http {} must hold none.
MAIN_CONTEXT = {"http", "events", "user", "worker_processes", "pid", "error_log", "include", "stream", "mail",
                "load_module", "worker_rlimit_nofile", "daemon", "master_process"}


def unit_directives(text: str) -> list[tuple[str, str, str]]:
    """(section, key, value) of a systemd unit file, in order."""
    out, section = [], ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        key, _, value = line.partition("=")
        out.append((section, key.strip(), value.strip()))
    return out


def check_bundle(bundle: Bundle, staging: Path) -> list[str]:
    """Cross-check the rendered bundle in ``staging``: the lab's checks (upstream == sockets, the
    mapping, loopback and 0660 only, balancer, UWSGI_* params, static aliases, env) on the site
    as Debian's nginx.conf includes it, plus what only a bundle has. Returns the problems."""
    name = bundle.name
    site = staging / f"nginx/sites-available/{name}.conf"
    problems = _crosscheck_site(bundle, site, {"": staging / f"uwsgi/{name}.ini"})
    if problems and problems[0].startswith("the site does not parse"):
        return problems
    return problems + _site_checks(bundle, site) + _service_checks(bundle, staging)


def check_host_bundles(front: Bundle, front_dir: Path, host_dirs: dict[str, Path]) -> list[str]:
    """The front's site against every host's uwsgi.ini (the lab's cross-checks, TLS included),
    then what only a bundle has: the site's, and each host's ini and unit."""
    name = front.name
    site = front_dir / f"nginx/sites-available/{name}.conf"
    problems = _crosscheck_site(front, site, {h: d / f"uwsgi/{name}.ini" for h, d in host_dirs.items()})
    if problems and problems[0].startswith("the site does not parse"):
        return problems
    problems += _site_checks(front, site)
    for host, directory in host_dirs.items():
        problems += [f"{host}: {p}" for p in _service_checks(front.host_layout(host), directory)]
    return problems


def _crosscheck_site(bundle: Bundle, site: Path, inis: dict[str, Path]) -> list[str]:
    """render.crosscheck on the site as Debian's nginx.conf includes it (inside http {}, with
    uwsgi_params next to nginx.conf), against uWSGI's ini (``inis[""]``) or each host's."""
    check = Path(tempfile.mkdtemp(prefix=".check-", dir=site.parent))
    try:
        shutil.copy(TEMPLATES_DIR / "uwsgi_params", check / "uwsgi_params")
        (check / "nginx.conf").write_text(f"events {{}}\nhttp {{\n    include {site};\n}}\n")
        for host, ini in inis.items():
            target = check / "hosts" / host / "uwsgi.ini" if host else check / "uwsgi.ini"
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(ini, target)
        try:
            return crosscheck(bundle, check, nginx_conf="nginx.conf", upstream_name=bundle.upstream_name, site=True)
        except RenderError as exc:
            return [f"the site does not parse inside http {{}}: {exc}"]
    finally:
        shutil.rmtree(check, ignore_errors=True)


def _site_checks(bundle: Bundle, site: Path) -> list[str]:
    import crossplane

    problems = []
    alone = crossplane.parse(str(site), single=True, check_ctx=False, catch_errors=False)["config"][0]["parsed"]
    top = sorted({d["directive"] for d in alone} - {"upstream", "server"})
    if top:
        problems.append(f"the site file has {top} at its top level: only upstream and server blocks belong there")
    parsed = parse_nginx_site(site)
    passes = [d for d in _walk(parsed) if d["directive"] == "uwsgi_pass"]
    if not passes:
        problems.append("the site never passes a request to uWSGI")
    params = {d["args"][0]: " ".join(d["args"][1:]) for d in _walk(parsed) if d["directive"] == "uwsgi_param"}
    for key, value in {"HTTP_HOST": "$host", "HTTP_X_FORWARDED_PROTO": "$scheme"}.items():
        if params.get(key) != value:
            problems.append(f"uwsgi_param {key} is {params.get(key)!r}, not {value}")
    return problems


def _service_checks(bundle: Bundle, staging: Path) -> list[str]:
    """uwsgi.ini and the unit: how systemd starts, stops and reloads uWSGI, where it writes."""
    name = bundle.name
    ini = f"uwsgi/{name}.ini"
    problems = []
    opts = parse_uwsgi_ini((staging / ini).read_text())
    keys = [k for k, _ in opts]
    values = lambda key: [v for k, v in opts if k == key]  # noqa: E731
    unit = unit_directives((staging / f"systemd/{name}.service").read_text())
    unit_value = lambda key: [v for _, k, v in unit if k == key]  # noqa: E731
    # uWSGI 2.0 swaps SIGTERM and SIGQUIT under die-on-term (core/master.c): systemd's SIGQUIT
    # would then be a brutal reload, and `systemctl stop` would wait for the SIGKILL.
    if unit_value("KillSignal") != ["SIGQUIT"] or "die-on-term" in keys:
        problems.append("the unit must stop uWSGI with KillSignal=SIGQUIT and uwsgi.ini must not set die-on-term")
    for key in ("pidfile", "master-fifo", "stats", "logto"):
        where = bundle.log_dir if key == "logto" else bundle.run_dir
        if [v.rpartition("/")[0] for v in values(key)] != [where]:
            problems.append(f"uwsgi.ini {key} {values(key)} is not in {where}")
    if bundle.transport == "unix" and any(not s.startswith(bundle.run_dir + "/") for s in values("socket")):
        problems.append(f"unix sockets {values('socket')} are not all in {bundle.run_dir}")
    if values("chown-socket") and values("chown-socket") != [f"{bundle.user}:{bundle.nginx_group}"]:
        problems.append(f"chown-socket {values('chown-socket')} is not {bundle.user}:{bundle.nginx_group}")
    expected_unit = {
        "Type": ["notify"], "NotifyAccess": ["all"], "User": [bundle.user], "Group": [bundle.group],
        "RuntimeDirectory": [name], "LogsDirectory": [name], "Restart": ["on-failure"],
        "ExecStart": [f"{bundle.uwsgi} --ini {UWSGI_CONF_DIR}/{name}.ini"],
        "ExecReload": [f"/bin/sh -c 'echo c > {bundle.run_dir}/master.fifo'"],
    }
    for key, expected in expected_unit.items():
        if unit_value(key) != expected:
            problems.append(f"the unit's {key}= is {unit_value(key)}, not {expected}")
    if values("master-fifo") != [f"{bundle.run_dir}/master.fifo"]:
        problems.append("ExecReload writes to a master FIFO uwsgi.ini does not create")
    return problems




def parse_nginx_site(site: Path) -> list[dict]:
    import crossplane

    return crossplane.parse(str(site), single=True, check_ctx=False, catch_errors=False)["config"][0]["parsed"]


def _walk(block: list[dict]):
    for d in block:
        yield d
        yield from _walk(d.get("block", []))


# --- writing -----------------------------------------------------------------------------------


def check_out_dir(out: Path) -> None:
    """--out must be new or empty: a bundle is never merged into older files."""
    try:
        if out.exists() and (not out.is_dir() or any(out.iterdir())):
            raise LayoutError("out", f"{out} is not an empty directory: give a new one (a bundle never mixes with "
                                     "older files)")
    except PermissionError:
        raise LayoutError("out", f"{out} cannot be read") from None


def _write_texts(directory: Path, texts: dict[str, str]) -> None:
    for rel, text in texts.items():
        path = directory / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600 if rel.endswith(".key") else 0o644)
        with os.fdopen(fd, "w") as handle:
            handle.write(text)


def write_host_bundles(front: Bundle, out_dir: Path | str) -> dict[str, list[str]]:
    """A bundle across hosts: ``out_dir/front`` and ``out_dir/hosts/ADDR`` for each app host,
    rendered and cross-checked together; nothing appears in ``out_dir`` unless every check
    passed. Returns each bundle's directory (relative to ``out_dir``) and its file names."""
    out = Path(out_dir).absolute()
    check_out_dir(out)
    hosts = host_bundles(front)
    rendered = {"front": render_bundle(front), **{f"hosts/{b.host}": render_bundle(b) for b in hosts}}
    staging = make_staging(out)
    try:
        for rel, texts in rendered.items():
            _write_texts(staging / rel, texts)
        problems = check_host_bundles(front, staging / "front", {b.host: staging / "hosts" / b.host for b in hosts})
        if problems:
            raise RenderError("cross-check failed: " + "; ".join(problems))
        for path in [staging, *staging.rglob("*")]:  # keys and the app's environment: the owner's alone
            if path.is_dir():
                path.chmod(0o700)
        if out.exists():
            out.rmdir()
        else:
            out.parent.mkdir(parents=True, exist_ok=True)
        os.rename(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return {rel: sorted(texts) for rel, texts in rendered.items()}


def write_bundle(bundle: Bundle, out_dir: Path | str) -> list[str]:
    """Render, check and move the bundle into ``out_dir`` (new or empty). Returns the file names.
    Nothing appears in ``out_dir`` unless every check passed."""
    out = Path(out_dir).absolute()
    check_out_dir(out)
    texts = render_bundle(bundle)  # pure: fails before anything is written
    staging = make_staging(out)
    try:
        _write_texts(staging, texts)
        problems = check_bundle(bundle, staging)
        if problems:
            raise RenderError("cross-check failed: " + "; ".join(problems))
        # The bundle may hold a private key and the app's environment: its owner's alone.
        staging.chmod(0o700)
        if out.exists():
            out.rmdir()  # empty (checked above); rename() cannot replace it with a non-empty one
        else:
            out.parent.mkdir(parents=True, exist_ok=True)
        os.rename(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return sorted(texts)


# --- reading a bundle back (deploy install) -------------------------------------------------------

HEADER_RE = re.compile(r"^(?:[#;] |<!-- )?Generated for bundle ([a-z0-9_-]+) \(layout [^)]*\) by "
                       r"`python -m deploy bundle`: do not edit\.")


def generated_for(text: str) -> str | None:
    """The bundle a file was generated for (its first line), or None."""
    first = text.split("\n", 1)[0]
    match = HEADER_RE.match(first)
    return match[1] if match else None
