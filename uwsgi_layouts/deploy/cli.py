"""Command line: ``uwsgi-layouts render|run|reload|bundle LAYOUT [options]``, ``install DIR``,
``uninstall NAME``, ``certs DIR --hosts ...``.

Bad input exits 2 with one line naming the field and what is allowed; nothing is written.
An app that does not import (the pre-flight of run and reload) is bad input too, and so is
risky input (deploy/machine/risks.py) unless its ``--allow-RISK`` option is given.
"""

from __future__ import annotations

import argparse
import re
import shutil
import signal
import sys
import time
from pathlib import Path

from uwsgi_layouts.arguments import EXIT_BAD_INPUT, PROG, Numbers, OneLineParser
from uwsgi_layouts.deploy.machine import (
    MAX_PREFLIGHT_TIMEOUT,
    PREFLIGHT_TIMEOUT,
    PROBE_PATH,
    app_virtualenv,
    checked,
    output_dir,
    preflight,
)
from uwsgi_layouts.deploy.model import (
    DEFAULT_TLS_NAME,
    RISKS,
    STRATEGIES,
    Layout,
    LayoutError,
    RenderError,
    StackError,
    parse_variant,
)
from uwsgi_layouts.deploy.render import new_run_dir, write_layout
from uwsgi_layouts.deploy.run import Stack, chain_reload, claim, holder, process_for
from uwsgi_layouts.deploy.ship import (
    TARGETS,
    build_bundle,
    build_container_bundle,
    install,
    make_certs,
    uninstall,
    write_bundle,
    write_container_bundle,
    write_host_bundles,
)

# The ranges of the options deploy checks itself (the layout's own options are the model's: a
# variant's @option=value takes them too, so the model is where their ranges live).
IMPORT_TIMEOUT_S = Numbers(0, MAX_PREFLIGHT_TIMEOUT, open_low=True, noun="a number of seconds")
RUN_FOR_S = Numbers(0, 7 * 24 * 3600, open_low=True, noun="a number of seconds")
RELOAD_TIMEOUT_S = Numbers(0, 3600, open_low=True, noun="a number of seconds")


# The layout's own options (render, run): given as strings to the model, whose parse_variant checks
# each one as it checks a variant's @option=value (so their ranges live there, once). Name -> help.
LAYOUT_OPTIONS = {
    "transport": "app-server sockets: unix (default: 0660, only the run user and nginx's workers "
        "connect) or tcp (loopback, any local user connects: a warning says so)",
    "base_port": "first app-server TCP port; sockets use consecutive ports (default 5000)",
    "listen": "nginx listen IPV4:PORT (default 127.0.0.1:8000)",
    "nginx_workers": "nginx worker_processes (default 1, as in the article)",
    "backlog": "uWSGI listen backlog per socket (default 100, at most net.core.somaxconn)",
    "stats_port": "put uWSGI's stats server on this 127.0.0.1 TCP port, where every local user "
        "reads the variables of requests in flight; needs --allow-tcp-stats "
        "(default: a unix socket, RUN_DIR/control/stats.sock, mode 0660)",
    "access_log": "on: nginx logs each request with its upstream socket (default off)",
    "user": "run uWSGI and nginx workers as this user when started as root "
        "(default www-data, else nobody)",
    "harakiri": "seconds before uWSGI kills a stuck request's worker (default 30, 0 = off)",
    "retries": "extra attempts nginx makes for GET/HEAD on another socket (default 1)",
    "connect_timeout": "seconds nginx waits to connect to a uWSGI socket "
        "(default 2; 1 with hosts)",
    "reuseport": "on: one nginx listen socket per worker, balanced by the kernel",
    "accept_mutex": "on: nginx workers take turns to accept (default off)",
    "multi_accept": "on: an nginx worker accepts all pending connections at once",
    "sendfile": "on: nginx sends file bytes with sendfile() (default off)",
    "sendfile_max_chunk": "bound one sendfile() call, e.g. 512k",
    "aio": "off or threads: nginx reads files in a thread pool (default off)",
    "aio_threads": "threads in the pool with --aio threads (default 32)",
    "aio_max_queue": "queued tasks the pool holds before refusing (default 65536)",
    "open_file_cache": "off, on (1000 entries per nginx worker) or a number of entries: nginx "
        "keeps file descriptors open between requests (default off)",
    "data_dir": "a data set (make dataset): enables /files/<id>, /nfiles/<id> and /static/",
    "hosts": "app hosts ADDR[,ADDR...]: each runs the layout's uWSGI on its own address, "
        "nginx balances over every host's sockets (default: this machine)",
    "uwsgi_tls": "off, suwsgi or https: TLS between nginx and uWSGI (default suwsgi when a "
        "socket is off loopback, which then requires it)",
    "uwsgi_tls_dir": "the certificates, made by uwsgi-layouts certs DIR --hosts ...",
    "uwsgi_tls_name": f"the name the hosts' certificates carry (default {DEFAULT_TLS_NAME})",
    "max_fails": "nginx marks a socket down after this many failures (default 0 on one "
        "machine, T+1 with hosts)",
    "fail_timeout": "seconds a failed socket stays down (default 10 with hosts)",
}


def add_layout_options(p: argparse.ArgumentParser, preflight: bool = True) -> None:
    p.add_argument("layout", help=f"PxT-STRATEGY[@option=value,...], e.g. 2x4-mapped or 2x4-gunicorn@reuse_port=on "
                                  f"(strategies: {', '.join(STRATEGIES)})")
    add_app_options(p, preflight)
    add_risk_options(p, *RISKS)
    for name, text in LAYOUT_OPTIONS.items():
        p.add_argument(f"--{name.replace('_', '-')}", help=text)


def add_app_options(parser: argparse.ArgumentParser, preflight: bool = True) -> None:
    """The app options every command that starts (or renders) a stack takes; ``preflight``: the
    command imports and calls the app before it starts anything (--import-timeout)."""
    parser.add_argument("--app", help="the WSGI app as module:callable, or an app factory called once per worker, "
                                      "with literal arguments as gunicorn takes them: 'shop:create_app()', "
                                      "\"shop:create_app('prod', debug=False)\" (default: this project's demo app, "
                                      "app.wsgi:application)")
    parser.add_argument("--app-dir", help="directory to import the app from (default with --app: the current "
                                          "directory; without: this project's)")
    parser.add_argument("--virtualenv", metavar="DIR",
                        help="the app's own virtualenv (default with --app: the active one, $VIRTUAL_ENV, else .venv "
                             "or venv in the app's directory; without: this project's); its Python major.minor "
                             "must be the one our uWSGI runs")
    parser.add_argument("--env", action="append", metavar="KEY=VALUE",
                        help="environment variable for the app (repeatable), e.g. DJANGO_SETTINGS_MODULE=shop.settings")
    parser.add_argument("--static", action="append", metavar="PREFIX=DIR",
                        help="nginx serves DIR under PREFIX/ itself (repeatable), e.g. /static=/srv/shop/static")
    if preflight:
        add_import_timeout(parser)


def add_risk_options(parser: argparse.ArgumentParser, *risks: str) -> None:
    """``--allow-RISK`` for each of ``risks`` (deploy.model's RISKS): accept what is refused otherwise."""
    for risk in risks:
        parser.add_argument(f"--allow-{risk}", action="store_true", help=f"accept the risk: {RISKS[risk]}")


def add_import_timeout(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--import-timeout", metavar="SECONDS", type=IMPORT_TIMEOUT_S,
                        help="how long the pre-flight may take: import the app, call its factory and send it one "
                             f"GET {PROBE_PATH} (default {PREFLIGHT_TIMEOUT:g}; {IMPORT_TIMEOUT_S})")


def import_timeout(args: argparse.Namespace) -> float:
    """--import-timeout in seconds (checked while parsing), else PREFLIGHT_TIMEOUT."""
    value = getattr(args, "import_timeout", None)
    return PREFLIGHT_TIMEOUT if value is None else value


def app_options(args: argparse.Namespace, here: bool = True, notes: list[str] | None = None) -> dict:
    """Layout keyword arguments from ``add_app_options``' and ``add_risk_options``' options (only
    those given). ``here``: the paths are on this machine, so with --app the defaults follow the
    app's directory (the current one) and its virtualenv; one line says which were picked,
    appended to ``notes`` (printed when None). Without --app: the demo app, its directory and our
    venv."""
    allowed = tuple(r for r in RISKS if getattr(args, f"allow_{r.replace('-', '_')}", False))
    given = {
        "app": args.app,
        "app_dir": args.app_dir,
        "virtualenv": args.virtualenv,
        "env": tuple(args.env) if args.env else None,
        "static": tuple(args.static) if args.static else None,
        "allow": allowed or None,
    }
    if here and args.app is not None and (args.app_dir is None or args.virtualenv is None):
        picked = []
        if args.app_dir is None:
            given["app_dir"] = str(Path.cwd())
            picked.append(f"app dir {given['app_dir']} (the current directory)")
        if args.virtualenv is None:
            venv, how = app_virtualenv(Path(given["app_dir"]))
            given["virtualenv"] = venv or None
            picked.append(f"virtualenv {venv} ({how})" if venv else
                          f"this tool's own Python ({how}: give --virtualenv if the app has one)")
        line = f"--app {args.app}: {', '.join(picked)}"
        if notes is None:
            print(line, flush=True)
        else:
            notes.append(line)
    return {key: value for key, value in given.items() if value is not None}


def layout_from_args(args, run_dir: Path) -> Layout:
    """The layout the options describe, checked against this machine."""
    given = {name: getattr(args, name) for name in LAYOUT_OPTIONS}
    return checked(parse_variant(args.layout, **app_options(args), **given, run_dir=str(run_dir)))


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    parser = OneLineParser(prog=prog, description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    render = sub.add_parser("render", help="write nginx.conf, uwsgi.ini and layout.json for a layout")
    add_layout_options(render, preflight=False)
    render.add_argument("--out", help="output directory (default build/LAYOUT)")
    render.add_argument("--no-nginx-test", action="store_true", help="skip `nginx -t`")
    run = sub.add_parser("run", help="render into a run directory and serve the layout until Ctrl-C")
    add_layout_options(run)
    run.add_argument("--run-dir", help="where the stack lives (default build/run/LAYOUT)")
    run.add_argument("--for", dest="duration", metavar="SECONDS", type=RUN_FOR_S, default=None,
                     help=f"stop by itself after this many seconds ({RUN_FOR_S}; default: until Ctrl-C / SIGTERM)")
    reload = sub.add_parser("reload", help="chain-reload the uWSGI workers of a running layout, one at a time")
    reload.add_argument("layout", help="the layout given to `run` (locates build/run/LAYOUT)")
    reload.add_argument("--run-dir", help="the run directory given to `run` (default build/run/LAYOUT)")
    reload.add_argument("--timeout", type=RELOAD_TIMEOUT_S, default=120.0,
                        help=f"seconds to wait for every worker to be replaced (default 120; {RELOAD_TIMEOUT_S})")
    add_import_timeout(reload)
    certs = sub.add_parser("certs", help="make a CA, one server certificate per app host and nginx's client "
                                         "certificate, for --uwsgi-tls")
    certs.add_argument("dir", help="where to write them (keys 0600; an existing CA there is reused)")
    certs.add_argument("--hosts", required=True, help="the app hosts' addresses, ADDR[,ADDR...]")
    certs.add_argument("--name", default=DEFAULT_TLS_NAME,
                       help=f"the name every host certificate carries, which nginx verifies "
                            f"(default {DEFAULT_TLS_NAME})")
    certs.add_argument("--force", action="store_true", help="replace existing front and host certificates")
    add_bundle_parsers(sub)
    return parser


def add_bundle_parsers(sub) -> None:
    bundle = sub.add_parser("bundle", help="write a production bundle (nginx site, uwsgi.ini, systemd unit, "
                                           "INSTALL.md) for a Debian/Ubuntu server")
    bundle.add_argument("layout", help=f"PxT-STRATEGY, e.g. 2x4-mapped (strategies: {', '.join(STRATEGIES)})")
    add_app_options(bundle, preflight=False)  # --app-dir, --virtualenv and --static DIRs are paths on the server
    bundle.add_argument("--out", required=True, help="a new (or empty) directory for the bundle")
    bundle.add_argument("--name", help="names the unit, /run/NAME, /var/log/NAME and the files "
                                       "(default: the app's top-level module)")
    bundle.add_argument("--server-name", action="append", metavar="HOST",
                        help="a host name the site answers (repeatable); other hosts are closed (444) and other or "
                             "missing SNI refused. Required unless --any-host")
    bundle.add_argument("--any-host", action="store_true",
                        help="answer every Host header (server_name _; a forged Host then reaches the app)")
    bundle.add_argument("--tls-cert", metavar="PATH",
                        help="the certificate (with intermediates) on the server, used in place (renewals rewrite "
                             "it): HTTPS, HTTP redirects")
    bundle.add_argument("--tls-key", metavar="PATH", help="its private key on the server (unencrypted, not readable "
                                                          "by others)")
    bundle.add_argument("--acme-webroot", metavar="DIR",
                        help="serve /.well-known/acme-challenge/ from DIR on port 80 (certbot --webroot -w DIR)")
    bundle.add_argument("--stop-grace", metavar="SECONDS",
                        help="how long `systemctl stop` lets requests in flight finish (default: --harakiri)")
    bundle.add_argument("--client-max-body-size", metavar="SIZE", help="nginx's request body limit (default 10m)")
    bundle.add_argument("--listen", action="append", metavar="ADDR",
                        help="nginx HTTP listen: PORT, IPV4:PORT or [IPV6]:PORT (repeatable; default 80 [::]:80)")
    bundle.add_argument("--tls-listen", action="append", metavar="ADDR",
                        help="nginx HTTPS listen (repeatable; default 443 [::]:443)")
    bundle.add_argument("--user", help="the user uWSGI runs as on the server (default www-data)")
    bundle.add_argument("--group", help="its group (default: the user's name)")
    bundle.add_argument("--nginx-group", help="the group nginx's workers run as, owner of the sockets "
                                              "(default www-data)")
    bundle.add_argument("--uwsgi", metavar="PATH", help="uWSGI on the server (default VIRTUALENV/bin/uwsgi)")
    bundle.add_argument("--writable", action="append", metavar="DIR",
                        help="a directory the app writes to (uploads): ReadWritePaths= (repeatable)")
    bundle.add_argument("--transport", help="uWSGI sockets: unix (default, in /run/NAME) or tcp (127.0.0.1)")
    bundle.add_argument("--base-port", help="first uWSGI TCP port with --transport tcp (default 5000)")
    bundle.add_argument("--backlog", help="uWSGI listen backlog per socket (default 100)")
    bundle.add_argument("--harakiri", help="seconds before uWSGI kills a stuck request's worker (default 30)")
    bundle.add_argument("--retries", help="extra attempts nginx makes for GET/HEAD on another socket (default 1)")
    bundle.add_argument("--connect-timeout", help="seconds nginx waits to connect to a uWSGI socket "
                                                  "(default 2; 1 with hosts)")
    bundle.add_argument("--hosts", help="app hosts ADDR[,ADDR...]: one bundle for the front (OUT/front) and one per "
                                        "host (OUT/hosts/ADDR), TLS between them (needs --uwsgi-tls-dir)")
    bundle.add_argument("--uwsgi-tls-dir", help="with --hosts: the certificates (uwsgi-layouts certs DIR --hosts)")
    bundle.add_argument("--uwsgi-tls-name", help=f"the name the hosts' certificates carry (default {DEFAULT_TLS_NAME})")
    bundle.add_argument("--max-fails", help="with --hosts: failures before nginx leaves a socket out (default T+1)")
    bundle.add_argument("--fail-timeout", help="with --hosts: seconds a failed socket stays out (default 10)")
    bundle.add_argument("--watch", metavar="PROGRAM",
                        help="also ship an exporter unit per slot running `PROGRAM watch` as the app's user "
                             "(PROGRAM: uwsgi-layouts on the server, an absolute path; docs/watch.md)")
    bundle.add_argument("--watch-listen", metavar="HOST:PORT",
                        help="with --watch: the exporter's loopback address (default 127.0.0.1:9717); with "
                             "--watch-sidecar: where /metrics listens in the pod, IPV4:PORT (default 0.0.0.0:9717, the "
                             "pod's own interfaces, for Prometheus; 127.0.0.1:PORT keeps it inside the pod)")
    add_risk_options(bundle, "system-static")
    add_container_options(bundle)
    install_p = sub.add_parser("install", help="install a bundle: copy, enable, nginx -t (undone if it fails), "
                                               "start where systemd runs")
    install_p.add_argument("bundle", help="the directory `bundle --out` wrote")
    install_p.add_argument("--root", default="/", help="install under this prefix instead of / (a trial root: "
                                                       "system paths in the files move under it too)")
    install_p.add_argument("--dry-run", action="store_true", help="list what would change; change nothing")
    install_p.add_argument("--no-app-check", action="store_true",
                           help="skip the checks of the app, its virtualenv and uWSGI, and the pre-flight import")
    uninstall_p = sub.add_parser("uninstall", help="remove what install wrote for a bundle: the site first (nginx "
                                                   "reloaded), then the app (stopped gracefully), then the files")
    uninstall_p.add_argument("name", help="the bundle's name (--name of bundle)")
    uninstall_p.add_argument("--root", default="/", help="the prefix it was installed under (default /)")
    uninstall_p.add_argument("--dry-run", action="store_true", help="list what would be removed; change nothing")
    uninstall_p.add_argument("--purge", action="store_true", help="remove the logs too (/var/log/NAME and the site's "
                                                                  "nginx logs)")
    add_risk_options(install_p, "world-writable")
    add_import_timeout(install_p)


# The options of --target container|kubernetes (deploy/ship/container/), and the Debian ones they refuse.
CONTAINER_OPTIONS = ("image", "base_image", "nginx_base_image", "python", "cpus", "memory", "replicas", "max_replicas",
                     "cpu_target", "probe_port", "from_tune", "plan", "watch_sidecar", "metrics_namespace")
SERVER_ONLY_OPTIONS = ("server_name", "any_host", "tls_cert", "tls_key", "acme_webroot", "tls_listen", "user", "group",
                       "nginx_group", "uwsgi", "writable", "hosts", "uwsgi_tls_dir", "uwsgi_tls_name", "base_port",
                       "watch")


def add_container_options(bundle: argparse.ArgumentParser) -> None:
    bundle.add_argument("--target", default="debian", choices=TARGETS,
                        help="debian (default): a Debian/Ubuntu server's bundle; container: a build context for an "
                             "app image and an nginx sidecar image; kubernetes: that, the manifests and compose.yaml "
                             "(--app-dir is then the app on this machine, copied into the image)")
    bundle.add_argument("--image", metavar="REF", help="the app image to build and run, REGISTRY/NAME:TAG (default "
                                                       "localhost/NAME:latest); the sidecar is REGISTRY/NAME-nginx:TAG")
    bundle.add_argument("--base-image", metavar="REF", help="the Containerfile's default BASE_IMAGE (default: the "
                                                            "official Python slim image of the app's major.minor)")
    bundle.add_argument("--nginx-base-image", metavar="REF", help="the default NGINX_IMAGE the sidecar is built on")
    bundle.add_argument("--python", metavar="X.Y", help="the app's Python (default: its virtualenv's, "
                                                        ".python-version, else this tool's)")
    bundle.add_argument("--cpus", help="kubernetes: the app container's CPU limit (and request), e.g. 2 or 1500m "
                                       "(default: the layout's @cpus or tune's; a different figure is refused)")
    bundle.add_argument("--memory", help="kubernetes: its memory limit, e.g. 512Mi (default: the layout's @memory or "
                                         "tune's)")
    bundle.add_argument("--from-tune", metavar="DIR",
                        help="kubernetes: the results of `tune --cpus N [--memory MB]` for this layout: the app "
                             "container's CPUs, memory limit and measured memory request (PSS after load + 25%%)")
    bundle.add_argument("--plan", metavar="FILE",
                        help="kubernetes: plan.json of `uwsgi-layouts plan` for this layout: the autoscaler's "
                             "minimum replicas and CPU utilisation target")
    bundle.add_argument("--replicas", help="kubernetes: the fewest pods (default: the plan's, the layout's @replicas, "
                                           "else 2)")
    bundle.add_argument("--max-replicas", help="kubernetes: the most pods the autoscaler starts (default: twice the "
                                               "plan's, else 4)")
    bundle.add_argument("--cpu-target", help="kubernetes: the autoscaler's CPU target, per cent of the app container's "
                                             "request (default: the plan's, else 70)")
    bundle.add_argument("--watch-sidecar", action="store_true",
                        help="kubernetes: add an exporter sidecar (`uwsgi-layouts watch`: the stats socket and "
                             "nginx's timed log as Prometheus metrics) and a NetworkPolicy")
    bundle.add_argument("--metrics-namespace", metavar="NS",
                        help="with --watch-sidecar: the namespace whose pods (Prometheus) the NetworkPolicy lets reach "
                             "the metrics port (default monitoring)")
    bundle.add_argument("--probe-port", help="the sidecar's port for the probes (default 8081; --listen PORT is the "
                                             "HTTP port, default 8080)")


def cmd_container_bundle(args) -> int:
    for option in SERVER_ONLY_OPTIONS:
        if getattr(args, option) not in (None, False):
            raise LayoutError(option, f"is for a Debian server's bundle, not --target {args.target}")
    given = {k: getattr(args, k) for k in ("name", "harakiri", "retries", "connect_timeout", "backlog",
                                           "transport", "stop_grace", "client_max_body_size")}
    container = {k: getattr(args, k) for k in CONTAINER_OPTIONS}
    options = [f"--{k.replace('_', '-')}" + ("" if v is True else f" {v}")
               for k, v in {**given, **container, "watch_listen": args.watch_listen}.items() if v not in (None, False)]
    container["watch"] = container.pop("watch_sidecar")
    container["watch_listen"] = args.watch_listen
    options += [f"--listen {address}" for address in args.listen or ()]
    cb = build_container_bundle(args.layout, target=args.target, **app_options(args, here=False),
                                listen=args.listen, options=options, **given, **container)
    out = output_dir("out", args.out)
    files = write_container_bundle(cb, out)
    print(f"{args.target} bundle {cb.name} ({cb.layout.name}) written to {out}: {', '.join(files)}, image/app/")
    print(f"next: podman build --target app -t {cb.image} {out / 'image'}; podman build --target nginx -t "
          f"{cb.nginx_image} {out / 'image'}"
          + (f"; podman build --target watch -t {cb.watch_image} {out / 'image'}" if cb.watch else "")
          + (f"; podman kube play {out / 'kubernetes/deployment.yaml'}" if args.target == "kubernetes" else ""))
    return 0


def cmd_bundle(args) -> int:
    if args.target != "debian":
        return cmd_container_bundle(args)
    for option in CONTAINER_OPTIONS:
        if getattr(args, option) not in (None, False):
            raise LayoutError(option, "is for --target container or kubernetes")
    bundle = build_bundle(
        args.layout, **app_options(args, here=False), name=args.name, server_names=args.server_name,
        tls_cert=args.tls_cert, tls_key=args.tls_key, acme_webroot=args.acme_webroot, stop_grace=args.stop_grace,
        client_max_body_size=args.client_max_body_size, listen=args.listen,
        tls_listen=args.tls_listen, user=args.user, group=args.group, nginx_group=args.nginx_group,
        uwsgi=args.uwsgi, writable=args.writable, transport=args.transport, base_port=args.base_port,
        backlog=args.backlog, harakiri=args.harakiri, retries=args.retries, connect_timeout=args.connect_timeout,
        hosts=args.hosts, uwsgi_tls_dir=args.uwsgi_tls_dir, uwsgi_tls_name=args.uwsgi_tls_name,
        max_fails=args.max_fails, fail_timeout=args.fail_timeout, watch=args.watch, watch_listen=args.watch_listen,
    )
    # A site answers its own names only, unless told otherwise by an option named for the risk.
    if bool(args.server_name) == args.any_host:
        raise LayoutError("server_name", "give the site's host names with --server-name HOST (other hosts never reach "
                                         "the app), or --any-host to answer every Host header"
                          if not args.any_host else "--any-host answers every host: drop --server-name or --any-host")
    out = output_dir("out", args.out)  # a symlink is refused, never followed
    if bundle.role == "front":
        written = write_host_bundles(bundle, out)
        for rel, files in written.items():
            print(f"bundle {bundle.name} ({bundle.layout.name}, {rel}) written to {out / rel}: {', '.join(files)}")
        print(f"next: on the front, uwsgi-layouts install {out / 'front'}; on each app host ADDR, uwsgi-layouts "
              f"install {out}/hosts/ADDR (see INSTALL.md in each)")
        return 0
    files = write_bundle(bundle, out)
    warn(bundle.layout)  # after the refusals, which are one line each
    print(f"bundle {bundle.name} ({bundle.layout.name}) written to {out}: {', '.join(files)}")
    if bundle.tls and not Path(bundle.tls_cert).exists():
        print(f"note: {bundle.tls_cert} is not on this machine: install checks it and {bundle.tls_key} on the "
              "server")
    print(f"next, on the server: uwsgi-layouts install {out} --dry-run (see {out / 'INSTALL.md'})")
    return 0


def cmd_install(args) -> int:
    result = install(args.bundle, root=args.root, dry_run=args.dry_run, app_check=not args.no_app_check,
                     progress=lambda line: print(line, flush=True), import_timeout=import_timeout(args),
                     allow=("world-writable",) if args.allow_world_writable else ())
    changed = len(result.changed) + len(result.retired)
    verb = "would change" if result.dry_run else "changed"
    serving = f", slot {result.slot}" if result.slot else ""
    if result.nothing_changed:
        print(f"{'dry run: ' if result.dry_run else ''}bundle {result.name} under {result.root}{serving}: nothing "
              "changed")
        return 0
    print(f"{'dry run: ' if result.dry_run else ''}bundle {result.name} under {result.root}{serving}: {verb} "
          f"{changed} of {len(result.steps) + len(result.retired)} paths"
          + (", the app's code changed" if result.code_changed else ""))
    return 0


def cmd_uninstall(args) -> int:
    result = uninstall(args.name, root=args.root, dry_run=args.dry_run, purge=args.purge,
                       progress=lambda line: print(line, flush=True))
    if result.dry_run:
        print(f"dry run: bundle {result.name} under {result.root}: nothing changed")
    else:
        kept = f"; kept {len(result.kept)} log path(s) (--purge removes them)" if result.kept else ""
        print(f"bundle {result.name} uninstalled from {result.root}: removed {len(result.removed)} paths{kept}")
    return 0


def _default_dir(args, *parts: str) -> Path:
    # The spec only names a directory once it parsed; a bad spec fails in parse_layout first.
    safe = args.layout if all(c.isalnum() or c in "x-_@=," for c in args.layout) else "layout"
    return Path.cwd().joinpath(*parts, safe)


def warn(layout: Layout) -> None:
    """The risks the user chose (--transport tcp), once the command went through."""
    for line in layout.warnings:
        print(f"warning: {line}", file=sys.stderr, flush=True)


def cmd_render(args) -> int:
    out = output_dir("out", args.out) if args.out else _default_dir(args, "build")
    layout = layout_from_args(args, out)
    live = holder(out)
    if live:
        raise LayoutError("out", f"{out} is the run directory of a live stack (pid {live}): its files are in use; "
                                 "stop it first or give another --out")
    result = write_layout(layout, out, check_nginx=not args.no_nginx_test)
    warn(layout)
    print(f"rendered {layout.name} into {result.out_dir}: {', '.join(result.files)}")
    if result.nginx_test:
        print("nginx -t: ok")
    else:
        print("nginx -t: skipped (nginx not installed or --no-nginx-test)")
    return 0


class Stop(Exception):
    pass


def _raise_stop(signum, frame):
    raise Stop(signal.Signals(signum).name)


def claim_run_dir(layout: Layout):
    """Create (if new), lock and render the run directory: a live stack's is refused naming its
    pid, orphans of a dead one are stopped (one line), and files that are not ours are never
    replaced. Returns the held lock; on failure nothing is left that was not there before."""
    run_dir = Path(layout.run_dir)
    created = not run_dir.exists()
    if created:
        new_run_dir(layout)
    lock = None
    try:
        lock = claim(run_dir)
        if lock.reaped:
            print(lock.reaped, file=sys.stderr, flush=True)
        write_layout(layout, run_dir)
    except BaseException:
        if lock is not None:
            lock.release()
        if created:
            shutil.rmtree(run_dir, ignore_errors=True)
        raise
    return lock


def cmd_run(args) -> int:
    run_dir = output_dir("run_dir", args.run_dir) if args.run_dir else _default_dir(args, "build", "run")
    layout = layout_from_args(args, run_dir)
    if len(layout.hosts) > 1:
        raise LayoutError("hosts", "`run` serves one machine; with several hosts each runs its own uWSGI: render the "
                                   "files (uwsgi-layouts render ... --hosts) and start hosts/ADDR/uwsgi.ini on each")
    preflight(layout, timeout=import_timeout(args))  # the app imports as the workers will, or exit 2
    server = process_for(layout)
    server.check_installed()  # a peer missing from our venv: one line saying how to install it (exit 1)
    lock = claim_run_dir(layout)
    signal.signal(signal.SIGTERM, _raise_stop)
    signal.signal(signal.SIGHUP, _raise_stop)
    try:
        with Stack(layout, lock=lock) as stack:
            warn(layout)
            stats = (f"uWSGI stats: {', '.join(m.layout.stats_address for m in stack.members)}" if layout.has_stats
                     else f"{server.label}, no stats server")
            print(f"serving {layout.name} on {layout.url}  ({stats}; logs: {run_dir / 'logs'})  Ctrl-C to stop",
                  flush=True)
            for cgroup in stack.cgroups.values():
                print(f"  {server.label} limited to {cgroup.describe()}", flush=True)
            deadline = None if args.duration is None else time.monotonic() + args.duration
            while deadline is None or time.monotonic() < deadline:
                stack.check_alive()
                time.sleep(0.2)  # supervision tick
    except (KeyboardInterrupt, Stop):
        pass
    finally:
        lock.release()
    print(f"stopped nginx and {server.label}", flush=True)
    return 0


# argparse takes "-1x4-mapped" for an option; such a spec is still a layout (a bad one).
NEGATIVE_SPEC = re.compile(r"^-\d+x")
SPEC_MARK = "\x00spec:"


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None):
    argv = list(sys.argv[1:] if argv is None else argv)
    marked = [SPEC_MARK + a if NEGATIVE_SPEC.match(a) else a for a in argv]
    args = parser.parse_args(marked)
    for key, value in vars(args).items():
        if isinstance(value, str) and value.startswith(SPEC_MARK):
            setattr(args, key, value[len(SPEC_MARK):])
    return args


def cmd_reload(args) -> int:
    run_dir = Path(args.run_dir).resolve() if args.run_dir else _default_dir(args, "build", "run")
    result = chain_reload(run_dir, timeout=args.timeout, progress=lambda line: print(line, flush=True),
                          import_timeout=import_timeout(args))
    print(result.summary(), flush=True)
    return 0


def cmd_certs(args) -> int:
    made = make_certs(args.dir, args.hosts, name=args.name, force=args.force)
    kept = f" (kept {', '.join(made.kept)})" if made.kept else ""
    print(f"wrote {', '.join(made.written)} in {made.directory}{kept}")
    print(f"use: --hosts {args.hosts} --uwsgi-tls-dir {made.directory}"
          + (f" --uwsgi-tls-name {args.name}" if args.name != DEFAULT_TLS_NAME else ""))
    return 0


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    args = parse_args(build_parser(prog), argv)
    try:
        return {"render": cmd_render, "run": cmd_run, "reload": cmd_reload, "bundle": cmd_bundle,
                "install": cmd_install, "uninstall": cmd_uninstall, "certs": cmd_certs}[args.command](args)
    except LayoutError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except RenderError as exc:
        print(f"error: {exc}", file=sys.stderr)
        if exc.details:
            print(exc.details, file=sys.stderr)
        return 1
    except StackError as exc:
        print(f"error: {exc}", file=sys.stderr)
        if exc.log_tail:
            print("--- last log lines ---\n" + exc.log_tail, file=sys.stderr)
        return 1
