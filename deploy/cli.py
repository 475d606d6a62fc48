"""Command line: ``python -m deploy render|run|reload|bundle LAYOUT [options]``, ``install DIR``,
``certs DIR --hosts ...``.

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

from deploy.machine import PROJECT_ROOT, checked, output_dir, preflight
from deploy.model import (
    DEFAULT_TLS_NAME,
    RISKS,
    STRATEGIES,
    Layout,
    LayoutError,
    RenderError,
    StackError,
    parse_variant,
)
from deploy.render import new_run_dir, write_layout
from deploy.run import Stack, chain_reload, claim, holder, process_for
from deploy.ship import build_bundle, install, make_certs, write_bundle, write_host_bundles

EXIT_BAD_INPUT = 2


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (and exit 2), like every other bad input."""

    def error(self, message: str):
        # argparse echoes tokens raw: escape control characters (\n, \f...) so it stays one line.
        message = "".join(c if c.isprintable() else repr(c)[1:-1] for c in message)
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message}\n")


def add_layout_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("layout", help=f"PxT-STRATEGY[@option=value,...], e.g. 2x4-mapped or 2x4-gunicorn@reuse_port=on "
                                  f"(strategies: {', '.join(STRATEGIES)})")
    add_app_options(p)
    add_risk_options(p, *RISKS)
    p.add_argument("--transport", help="app-server sockets: unix (default: 0660, only the run user and nginx's workers "
                                       "connect) or tcp (loopback, any local user connects: a warning says so)")
    p.add_argument("--base-port", help="first app-server TCP port; sockets use consecutive ports (default 5000)")
    p.add_argument("--listen", help="nginx listen IPV4:PORT (default 127.0.0.1:8000)")
    p.add_argument("--nginx-workers", help="nginx worker_processes (default 1, as in the article)")
    p.add_argument("--backlog", help="uWSGI listen backlog per socket (default 100, at most net.core.somaxconn)")
    p.add_argument("--stats-port", help="uWSGI stats server port on 127.0.0.1 (default 9191)")
    p.add_argument("--access-log", help="on: nginx logs each request with its upstream socket (default off)")
    p.add_argument("--user", help="run uWSGI and nginx workers as this user when started as root "
                                  "(default www-data, else nobody)")
    p.add_argument("--harakiri", help="seconds before uWSGI kills a stuck request's worker (default 30, 0 = off)")
    p.add_argument("--retries", help="extra attempts nginx makes for GET/HEAD on another socket (default 1)")
    p.add_argument("--connect-timeout", help="seconds nginx waits to connect to a uWSGI socket "
                                             "(default 2; 1 with hosts)")
    p.add_argument("--reuseport", help="on: one nginx listen socket per worker, balanced by the kernel")
    p.add_argument("--accept-mutex", help="on: nginx workers take turns to accept (default off)")
    p.add_argument("--multi-accept", help="on: an nginx worker accepts all pending connections at once")
    p.add_argument("--sendfile", help="on: nginx sends file bytes with sendfile() (default off)")
    p.add_argument("--sendfile-max-chunk", help="bound one sendfile() call, e.g. 512k")
    p.add_argument("--aio", help="off or threads: nginx reads files in a thread pool (default off)")
    p.add_argument("--aio-threads", help="threads in the pool with --aio threads (default 32)")
    p.add_argument("--aio-max-queue", help="queued tasks the pool holds before refusing (default 65536)")
    p.add_argument("--open-file-cache", help="off, on (1000 entries per nginx worker) or a number of entries: nginx "
                                             "keeps file descriptors open between requests (default off)")
    p.add_argument("--data-dir", help="a data set (make dataset): enables /files/<id>, /nfiles/<id> and /static/")
    p.add_argument("--hosts", help="app hosts ADDR[,ADDR...]: each runs the layout's uWSGI on its own address, "
                                   "nginx balances over every host's sockets (default: this machine)")
    p.add_argument("--uwsgi-tls", help="off, suwsgi or https: TLS between nginx and uWSGI (default suwsgi when a "
                                 "socket is off loopback, which then requires it)")
    p.add_argument("--uwsgi-tls-dir", help="the certificates, made by python -m deploy certs DIR --hosts ...")
    p.add_argument("--uwsgi-tls-name", help=f"the name the hosts' certificates carry (default {DEFAULT_TLS_NAME})")
    p.add_argument("--max-fails", help="nginx marks a socket down after this many failures (default 0 on one "
                                       "machine, T+1 with hosts)")
    p.add_argument("--fail-timeout", help="seconds a failed socket stays down (default 10 with hosts)")


def add_app_options(parser: argparse.ArgumentParser) -> None:
    """The app options every command that starts (or renders) a stack takes."""
    parser.add_argument("--app", help="WSGI callable as module:callable (default app.wsgi:application)")
    parser.add_argument("--app-dir", help="directory to import the app from (default: this project)")
    parser.add_argument("--virtualenv", metavar="DIR",
                        help="the app's own virtualenv, used by uWSGI (default: this project's); its Python "
                             "major.minor must be the one our uWSGI runs")
    parser.add_argument("--env", action="append", metavar="KEY=VALUE",
                        help="environment variable for the app (repeatable), e.g. DJANGO_SETTINGS_MODULE=shop.settings")
    parser.add_argument("--static", action="append", metavar="PREFIX=DIR",
                        help="nginx serves DIR under PREFIX/ itself (repeatable), e.g. /static=/srv/shop/static")


def add_risk_options(parser: argparse.ArgumentParser, *risks: str) -> None:
    """``--allow-RISK`` for each of ``risks`` (deploy.model's RISKS): accept what is refused otherwise."""
    for risk in risks:
        parser.add_argument(f"--allow-{risk}", action="store_true", help=f"accept the risk: {RISKS[risk]}")


def app_options(args: argparse.Namespace) -> dict:
    """Layout keyword arguments from ``add_app_options``' and ``add_risk_options``' options (only those given)."""
    allowed = tuple(r for r in RISKS if getattr(args, f"allow_{r.replace('-', '_')}", False))
    given = {
        "app": args.app,
        "app_dir": args.app_dir,
        "virtualenv": args.virtualenv,
        "env": tuple(args.env) if args.env else None,
        "static": tuple(args.static) if args.static else None,
        "allow": allowed or None,
    }
    return {key: value for key, value in given.items() if value is not None}


def layout_from_args(args, run_dir: Path) -> Layout:
    """The layout the options describe, checked against this machine."""
    return checked(parse_variant(
        args.layout,
        **app_options(args),
        transport=args.transport,
        base_port=args.base_port,
        listen=args.listen,
        nginx_workers=args.nginx_workers,
        backlog=args.backlog,
        stats_port=args.stats_port,
        access_log=args.access_log,
        user=args.user,
        harakiri=args.harakiri,
        retries=args.retries,
        connect_timeout=args.connect_timeout,
        reuseport=args.reuseport,
        accept_mutex=args.accept_mutex,
        multi_accept=args.multi_accept,
        sendfile=args.sendfile,
        sendfile_max_chunk=args.sendfile_max_chunk,
        aio=args.aio,
        aio_threads=args.aio_threads,
        aio_max_queue=args.aio_max_queue,
        open_file_cache=args.open_file_cache,
        data_dir=args.data_dir,
        hosts=args.hosts,
        uwsgi_tls=args.uwsgi_tls,
        uwsgi_tls_dir=args.uwsgi_tls_dir,
        uwsgi_tls_name=args.uwsgi_tls_name,
        max_fails=args.max_fails,
        fail_timeout=args.fail_timeout,
        run_dir=str(run_dir),
    ))


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="python -m deploy", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    render = sub.add_parser("render", help="write nginx.conf, uwsgi.ini and layout.json for a layout")
    add_layout_options(render)
    render.add_argument("--out", help="output directory (default build/LAYOUT)")
    render.add_argument("--no-nginx-test", action="store_true", help="skip `nginx -t`")
    run = sub.add_parser("run", help="render into a run directory and serve the layout until Ctrl-C")
    add_layout_options(run)
    run.add_argument("--run-dir", help="where the stack lives (default build/run/LAYOUT)")
    run.add_argument("--for", dest="duration", type=float, default=None,
                     help="stop by itself after this many seconds (default: until Ctrl-C / SIGTERM)")
    reload = sub.add_parser("reload", help="chain-reload the uWSGI workers of a running layout, one at a time")
    reload.add_argument("layout", help="the layout given to `run` (locates build/run/LAYOUT)")
    reload.add_argument("--run-dir", help="the run directory given to `run` (default build/run/LAYOUT)")
    reload.add_argument("--timeout", type=float, default=120.0,
                        help="seconds to wait for every worker to be replaced (default 120)")
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
    add_app_options(bundle)  # --app-dir, --virtualenv and --static DIRs are paths on the server
    bundle.add_argument("--out", required=True, help="a new (or empty) directory for the bundle")
    bundle.add_argument("--name", help="names the unit, /run/NAME, /var/log/NAME and the files "
                                       "(default: the app's top-level module)")
    bundle.add_argument("--server-name", action="append", metavar="HOST", help="nginx server_name (repeatable; "
                                                                              "default _)")
    bundle.add_argument("--tls-cert", metavar="PEM", help="certificate (with intermediates): HTTPS, HTTP redirects")
    bundle.add_argument("--tls-key", metavar="PEM", help="its private key (unencrypted)")
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
    bundle.add_argument("--uwsgi-tls-dir", help="with --hosts: the certificates (python -m deploy certs DIR --hosts)")
    bundle.add_argument("--uwsgi-tls-name", help=f"the name the hosts' certificates carry (default {DEFAULT_TLS_NAME})")
    bundle.add_argument("--max-fails", help="with --hosts: failures before nginx leaves a socket out (default T+1)")
    bundle.add_argument("--fail-timeout", help="with --hosts: seconds a failed socket stays out (default 10)")
    install_p = sub.add_parser("install", help="install a bundle: copy, enable, nginx -t (undone if it fails), "
                                               "start where systemd runs")
    install_p.add_argument("bundle", help="the directory `bundle --out` wrote")
    install_p.add_argument("--root", default="/", help="install under this prefix instead of / (a trial root: "
                                                       "system paths in the files move under it too)")
    install_p.add_argument("--dry-run", action="store_true", help="list what would change; change nothing")
    install_p.add_argument("--no-app-check", action="store_true",
                           help="skip the checks of the app, its virtualenv and uWSGI, and the pre-flight import")


def cmd_bundle(args) -> int:
    bundle = build_bundle(
        args.layout, **app_options(args), name=args.name, server_names=args.server_name, tls_cert=args.tls_cert,
        tls_key=args.tls_key, client_max_body_size=args.client_max_body_size, listen=args.listen,
        tls_listen=args.tls_listen, user=args.user, group=args.group, nginx_group=args.nginx_group,
        uwsgi=args.uwsgi, writable=args.writable, transport=args.transport, base_port=args.base_port,
        backlog=args.backlog, harakiri=args.harakiri, retries=args.retries, connect_timeout=args.connect_timeout,
        hosts=args.hosts, uwsgi_tls_dir=args.uwsgi_tls_dir, uwsgi_tls_name=args.uwsgi_tls_name,
        max_fails=args.max_fails, fail_timeout=args.fail_timeout,
    )
    out = output_dir("out", args.out)  # a symlink is refused, never followed
    if bundle.role == "front":
        written = write_host_bundles(bundle, out)
        for rel, files in written.items():
            print(f"bundle {bundle.name} ({bundle.layout.name}, {rel}) written to {out / rel}: {', '.join(files)}")
        print(f"next: on the front, python -m deploy install {out / 'front'}; on each app host ADDR, python -m "
              f"deploy install {out}/hosts/ADDR (see INSTALL.md in each)")
        return 0
    files = write_bundle(bundle, out)
    warn(bundle.layout)  # after the refusals, which are one line each
    print(f"bundle {bundle.name} ({bundle.layout.name}) written to {out}: {', '.join(files)}")
    print(f"next, on the server: python -m deploy install {out} --dry-run (see {out / 'INSTALL.md'})")
    return 0


def cmd_install(args) -> int:
    result = install(args.bundle, root=args.root, dry_run=args.dry_run, app_check=not args.no_app_check,
                     progress=lambda line: print(line, flush=True))
    changed = len(result.changed)
    verb = "would change" if result.dry_run else "changed"
    print(f"{'dry run: ' if result.dry_run else ''}bundle {result.name} under {result.root}: {verb} {changed} "
          f"of {len(result.steps)} paths")
    return 0


def _default_dir(args, *parts: str) -> Path:
    # The spec only names a directory once it parsed; a bad spec fails in parse_layout first.
    safe = args.layout if all(c.isalnum() or c in "x-_@=," for c in args.layout) else "layout"
    return PROJECT_ROOT.joinpath(*parts, safe)


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
    if args.duration is not None and not 0 < args.duration <= 7 * 24 * 3600:
        raise LayoutError("for", f"must be a number of seconds in (0, {7 * 24 * 3600}], got {args.duration:g}")
    layout = layout_from_args(args, run_dir)
    if len(layout.hosts) > 1:
        raise LayoutError("hosts", "`run` serves one machine; with several hosts each runs its own uWSGI: render the "
                                   "files (python -m deploy render ... --hosts) and start hosts/ADDR/uwsgi.ini on each")
    preflight(layout)  # the app imports as the workers will, or exit 2 before anything is written
    server = process_for(layout)
    server.check_installed()  # a peer missing from our venv: one line saying how to install it (exit 1)
    lock = claim_run_dir(layout)
    signal.signal(signal.SIGTERM, _raise_stop)
    signal.signal(signal.SIGHUP, _raise_stop)
    try:
        with Stack(layout, lock=lock) as stack:
            warn(layout)
            stats = f"uWSGI stats: {layout.stats_address}" if layout.has_stats else f"{server.label}, no stats server"
            print(f"serving {layout.name} on {layout.url}  ({stats}; logs: {run_dir / 'logs'})  Ctrl-C to stop",
                  flush=True)
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
    if not 0 < args.timeout <= 3600:
        raise LayoutError("timeout", f"must be a number of seconds in (0, 3600], got {args.timeout:g}")
    result = chain_reload(run_dir, timeout=args.timeout, progress=lambda line: print(line, flush=True))
    print(result.summary(), flush=True)
    return 0


def cmd_certs(args) -> int:
    made = make_certs(args.dir, args.hosts, name=args.name, force=args.force)
    kept = f" (kept {', '.join(made.kept)})" if made.kept else ""
    print(f"wrote {', '.join(made.written)} in {made.directory}{kept}")
    print(f"use: --hosts {args.hosts} --uwsgi-tls-dir {made.directory}"
          + (f" --uwsgi-tls-name {args.name}" if args.name != DEFAULT_TLS_NAME else ""))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(build_parser(), argv)
    try:
        return {"render": cmd_render, "run": cmd_run, "reload": cmd_reload, "bundle": cmd_bundle,
                "install": cmd_install, "certs": cmd_certs}[args.command](args)
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
