"""The cross-checks: the rendered files read back against each other and the layout. nginx
sends only to the server's sockets and reaches each, no address is used twice, the uwsgi
protocol stays on loopback, 0660 unix sockets or mutual TLS, the balancing is the strategy's,
no client value reaches a UWSGI_* variable, nothing serves requests as root, static aliases
cannot climb out, the app's environment is the layout's, and the data set's map is nginx's alone.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path

from uwsgi_layouts.deploy.machine import check_tls_dir, plain_allowed, read_map_facts
from uwsgi_layouts.deploy.model import (
    FACTS_NAME,
    ID_VARIABLE,
    MAP_NAME,
    PATH_VARIABLE,
    ROUTE_PREFIX,
    Layout,
    server_layouts,
)
from uwsgi_layouts.deploy.render.nginx_conf import find_directives, nginx_summary, parse_nginx, upstream_of
from uwsgi_layouts.deploy.render.servers import server_for
from uwsgi_layouts.deploy.render.texts import pass_target

# nginx variables a client controls: none may reach a UWSGI_* variable (those load code).
CLIENT_CONTROLLED = ("$arg", "$args", "$query_string", "$request_uri", "$http_", "$cookie_", "$request_body",
                     "$uri", "$document_uri", "$request")


def _is_loopback(address: str) -> bool:
    host = address.rpartition(":")[0]
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def host_facts(layout: Layout, conf_dir: Path, config_file: str = "") -> list[tuple[Layout, object]]:
    """(the layout an app server runs, its config file read back) per app host: one on a single
    machine (``config_file``, default the server's own name), else each host's own file under
    hosts/ADDR/."""
    server = server_for(layout)
    # A bundle (deploy.ship) stands in for a layout here: it has hosts, never replicas.
    if not layout.hosts and getattr(layout, "replicas", 1) == 1:
        return [(layout, server.facts(layout, conf_dir, config_file or server.config_file))]
    return [(own, server.facts(own, conf_dir / directory)) for directory, own in server_layouts(layout)]


def crosscheck(layout: Layout, conf_dir: Path, *, config_file: str = "", nginx_conf: str = "nginx.conf",
               upstream_name: str = "", site: bool = False) -> list[str]:
    """Check the rendered files against each other and the layout; return the problems.

    ``config_file``, ``nginx_conf``: the files to read, relative to ``conf_dir`` (default: the
    server's own config file name, nginx.conf; with hosts, each host's hosts/ADDR/uwsgi.ini).
    ``site``: the nginx file is a site that the distribution's nginx.conf includes (a bundle,
    deploy/ship/): the distribution sets nginx's user and runs several workers, so the
    workers' user is not checked and the upstream needs a zone."""
    server = server_for(layout)
    per_host = host_facts(layout, conf_dir, config_file)  # the server's config file(s), read back
    nginx = nginx_summary(conf_dir / nginx_conf)
    problems: list[str] = [p for _, facts in per_host for p in facts.problems]

    for _, host in per_host:
        if host.processes != layout.processes or host.threads != layout.threads:
            problems.append(f"{server.config_file} processes/threads differ from layout {layout.name}")
    sockets = [a for _, facts in per_host for a in facts.addresses]
    facts = per_host[0][1]  # what every host's file shares (checked per host where it matters)

    # 1. nginx sends only to the server's sockets, reaches every one of them, and speaks its protocol.
    name = upstream_name or server.upstream
    upstream = nginx["upstreams"].get(name)
    if upstream is None:
        return problems + [f"{nginx_conf} has no upstream {name!r}"]
    target = pass_target(layout, name)
    for protocol, directive in (("uwsgi", "uwsgi_pass"), ("http", "proxy_pass")):
        want = {target} if protocol == layout.nginx_protocol else set()
        if set(nginx[directive]) != want:
            problems.append(f"{directive} targets {nginx[directive]} instead of "
                            f"{'upstream ' + name if want else f'nothing: nginx speaks {layout.nginx_protocol}'}")
    if layout.nginx_protocol == "http":
        problems += _keepalive_problems(layout, nginx, upstream)
    servers = [args[0].removeprefix("unix:") for args in upstream["servers"]]
    primaries = [args[0].removeprefix("unix:") for args in upstream["servers"] if "backup" not in args[1:]]
    backups = [args[0].removeprefix("unix:") for args in upstream["servers"] if "backup" in args[1:]]
    # A socket may appear twice only as the retry alias: once as primary, once as backup.
    if (set(servers) != set(sockets) or len(set(primaries)) != len(primaries)
            or len(set(backups)) != len(backups) or len(servers) > len(sockets) + len(set(primaries) & set(backups))):
        problems.append(f"nginx upstream servers {servers} != {server.label} sockets {sockets}")

    # 2. No address used twice across nginx listen, the server's sockets and its stats server
    #    (each host has its own loopback: its stats server only clashes with its own sockets).
    #    Replicas share this machine's loopback: every replica's stats server counts.
    addresses = nginx["listens"] + sockets + ([] if layout.hosts else [a for _, f in per_host for a in f.private])
    dupes = {a for a in addresses if addresses.count(a) > 1}
    for _, host in per_host if layout.hosts else ():
        own = host.addresses + host.private
        dupes |= {a for a in own if own.count(a) > 1}
    if dupes:
        problems.append(f"addresses used twice: {sorted(dupes)}")

    # 3. The uwsgi protocol can load code (and no server needs more): loopback or 0660 unix
    #    sockets, or, off loopback, TLS with a client certificate uWSGI requires (see 11).
    for _, host in per_host:
        for address in host.private:  # the stats server: its JSON holds every request in flight's variables
            if address.startswith("/") and (host.unix_mode is None or host.unix_mode & ~0o660):
                problems.append(f"the stats server's unix socket {address} needs chmod-socket 660 or tighter")
            elif not address.startswith("/") and not _is_loopback(address):
                problems.append(f"{address} is not a loopback address")
            elif not address.startswith("/") and not layout.allows("tcp-stats"):
                problems.append(f"the stats server listens on TCP {address}, open to every local user, and the "
                                "risk tcp-stats was not accepted")
        for address in host.addresses:
            tls = host.socket_tls.get(address)
            if address.startswith("/") or plain_allowed(address):
                continue
            if address.rpartition(":")[0] in ("", "0.0.0.0", "*"):
                problems.append(f"{address} is not a loopback address: it binds every interface (bind the host's "
                                "own address)")
            elif not tls or not tls.get("required"):
                problems.append(f"{address} is not a loopback address and takes clients without a certificate "
                                "(needs ssl-socket = ADDR,CERT,KEY,CIPHERS,!CA)")
    if any(a.startswith("/") for a in sockets) and (facts.unix_mode is None or facts.unix_mode & ~0o660):
        got = "none or unreadable" if facts.unix_mode is None else f"{facts.unix_mode:o}"
        problems.append(f"unix sockets need {MODE_SETTING[server.name]} giving 660 or tighter, got {got}")

    # 4. The balancing the strategy promises is what nginx was told (least_conn, max_conns, backup).
    strategy = layout.strategy_obj
    balancers = {"least_conn", "ip_hash", "hash", "random", "least_time"} & set(upstream["directives"])
    if balancers != ({strategy.balancer} if strategy.balancer else set()):
        problems.append(f"upstream balancing {sorted(balancers) or 'round robin'} != strategy's "
                        f"{strategy.balancer or 'round robin'}")
    rendered_params = [tuple(args[1:]) for args in upstream["servers"]]
    expected_params = [params for _, params in layout.upstream_servers]
    if rendered_params != expected_params:
        problems.append(f"upstream server parameters {rendered_params} != layout's {expected_params}")

    # 5. No UWSGI_* variable (they make uWSGI load and run code) takes a client's value.
    for args in nginx["uwsgi_params"]:
        param, value = args[0], " ".join(args[1:])
        if param.upper().startswith("UWSGI_") and any(v in value for v in CLIENT_CONTROLLED):
            problems.append(f"uwsgi_param {param} takes a client-controlled value {value!r}")

    # 6. Started as root: nothing serves requests as root. The lab starts the app server as the
    #    run user (deploy.run): uWSGI's ini names no uid/gid, since a master that changes its
    #    credentials loses the signal that stops it when the stack's process dies (with TLS the
    #    master reads its key as root and stays root: master-as-root, only its workers drop);
    #    gunicorn's names the same user (no change). A bundle's uWSGI names them (systemd starts
    #    it as them).
    root_master = not site and server.name == "uwsgi" and layout.uwsgi_tls != "off"
    names_user = {"gunicorn", "uwsgi"} if site or root_master else {"gunicorn"}
    for _, host in per_host:
        if layout.drops_privileges and server.name in names_user and host.run_as != (layout.user, layout.group):
            problems.append(f"{server.config_file} must drop to uid/gid {layout.user}/{layout.group}, has "
                            f"{host.run_as or 'none'}")
        if layout.drops_privileges and host.master_as_root != root_master:
            problems.append(f"{server.config_file} {'lacks' if root_master else 'sets'} master-as-root: "
                            + ("the master must keep root to stay tied to the stack" if root_master else
                               "only the lab's TLS hosts keep a root master"))
        if not site and server.name == "uwsgi" and host.run_as and not root_master:
            problems.append(f"uwsgi.ini switches to uid/gid {'/'.join(host.run_as)} itself: the stack starts uWSGI "
                            "as its run user, and a master that changes credentials outlives a killed stack")
        if host.run_as and set(host.run_as) & {"0", "root"}:
            problems.append(f"{server.config_file} switches to root ({host.run_as})")
    if layout.drops_privileges and not site and nginx["user"][:1] != [layout.user]:
        problems.append(f"nginx workers must run as {layout.user}, nginx.conf says {nginx['user'] or 'nothing'}")

    # 7. The data set's internal location is internal: clients must not reach it directly.
    internal = nginx["locations"].get("/_internal_files/")
    if internal is not None and "internal" not in internal:
        problems.append("location /_internal_files/ is not `internal`")

    # 8. With several nginx workers, balancing state must live in a shared zone.
    if (site or nginx["worker_processes"] != "1") and "zone" not in upstream["directives"]:
        problems.append("nginx has several workers but the upstream has no zone")
    if layout.strategy_obj.needs_zone and "zone" not in upstream["directives"]:
        problems.append(f"strategy {layout.strategy} needs an upstream zone")

    # 9. Aliases: a location and its alias both end in "/" or neither does, else "/static../x"
    #    reaches the parent of the aliased directory (the classic alias traversal). No listing.
    for where, directives in nginx["location_args"].items():
        alias = directives.get("alias")
        if alias and where.endswith("/") != alias[0].endswith("/"):
            problems.append(f"location {where} has alias {alias[0]}: one ends in '/' and the other does not")
        if directives.get("autoindex", ["off"])[0] != "off":
            problems.append(f"location {where} lists directories (autoindex)")
    served_static = {where.removeprefix("^~ ").rstrip("/"): d.get("alias", [""])[0].rstrip("/")
                     for where, d in nginx["location_args"].items()
                     if where.startswith("^~ ") and where != f"^~ {ROUTE_PREFIX}"}
    if served_static != dict(layout.static):
        problems.append(f"nginx static locations {served_static} differ from the layout's {dict(layout.static)}")

    # 10. The app's environment is what the layout says (for uWSGI once it has read "%%" as "%").
    expected_env = ([("UL_DATA_DIR", layout.data_dir)] if layout.data_dir else []) + list(layout.env)
    for _, host in per_host:
        if host.env != expected_env:
            problems.append(f"{server.config_file} env lines {host.env} differ from the layout's {expected_env}")

    # 11. TLS: what the layout asks for on both sides, the same in every location that passes
    #     to the upstream, and certificates that fit (deploy.machine.check_tls_dir).
    problems += _tls_problems(layout, per_host, nginx, name)

    # 12. /nfiles/<id> is nginx's alone: it never reaches the app, opens only files/ + a map value,
    #     and the map is the data set's with the hash sizes made for it.
    if layout.data_dir:
        problems += _file_map_problems(layout, conf_dir)
    return problems


def _file_map_problems(layout: Layout, conf_dir: Path) -> list[str]:
    facts = read_map_facts(Path(layout.data_dir))
    parsed = parse_nginx(conf_dir / "nginx.conf", single=True)
    problems = []
    outer = [d for d in find_directives(parsed, "location") if d["args"] == ["^~", ROUTE_PREFIX]]
    if len(outer) != 1:
        return [f"nginx.conf needs exactly one `location ^~ {ROUTE_PREFIX}`, found {len(outer)}"]
    block = outer[0].get("block", [])
    for name in ("uwsgi_pass", "proxy_pass", "alias", "autoindex"):
        if find_directives(block, name):
            problems.append(f"location {ROUTE_PREFIX} must not use {name}")
    inner = [d for d in block if d["directive"] == "location"]
    if [d["directive"] for d in block if d["directive"] != "location"] != ["return"] or len(inner) != 1:
        problems.append(f"location {ROUTE_PREFIX} must hold one id location and `return 404` for the rest")
    else:
        args = {d["directive"]: d["args"] for d in inner[0].get("block", [])}
        if args.get("root") != [f"{layout.data_dir}/files"]:
            problems.append(f"the {ROUTE_PREFIX}<id> location's root is {args.get('root')}, not the data "
                            "set's files/")
        if args.get("try_files") != [f"/${PATH_VARIABLE}", "=404"]:
            problems.append(f"the {ROUTE_PREFIX}<id> location must end in try_files "
                            f"/${PATH_VARIABLE} =404")
    maps = [d for d in find_directives(parsed, "map") if d["args"] == [f"${ID_VARIABLE}",
                                                                       f"${PATH_VARIABLE}"]]
    body = [(d["directive"], d["args"]) for d in maps[0].get("block", [])] if len(maps) == 1 else []
    if body != [("default", [""]), ("include", [f"{layout.data_dir}/{MAP_NAME}"])]:
        problems.append(f"the map of ${ID_VARIABLE} must be default \"\" plus the data set's "
                        f"{MAP_NAME}, got {body or 'no such map'}")
    http = next((d.get("block", []) for d in parsed if d["directive"] == "http"), [])
    sizes = {d["directive"]: d["args"] for d in http if d["directive"].startswith("map_hash_")}
    want = {"map_hash_max_size": [str(facts.sizing.max_size)], "map_hash_bucket_size": [str(facts.sizing.bucket_size)]}
    if sizes != want:
        problems.append(f"map hash sizes {sizes} differ from the data set's {FACTS_NAME}: {want}")
    return problems


def _tls_problems(layout: Layout, per_host, nginx: dict, name: str) -> list[str]:
    problems = []
    passing = [p for p in nginx["pass_locations"] if upstream_of(p["target"]) == name]
    # Never mix: one location with the client certificate and one without (or with other TLS
    # settings) on one upstream would let a resumed session in without the certificate.
    seen = {(p["target"].partition("://")[0] if "://" in p["target"] else "", tuple(sorted(
        (k, tuple(v)) for k, v in p["ssl"].items()))) for p in passing}
    if len(seen) > 1:
        where = ", ".join(sorted({p["location"] or "(server)" for p in passing}))
        problems.append(f"locations {where} pass to upstream {name} with different TLS settings (client "
                        "certificate, verification, scheme): never mix them on one upstream")
    kind = {"suwsgi": "ssl", "https": "https", "off": "plain"}[layout.uwsgi_tls]
    for view, host in per_host:
        files = view.uwsgi_tls_files if kind != "plain" else {}
        for address in host.addresses:
            tls = host.socket_tls.get(address, {"kind": "plain"})
            if tls["kind"] != kind:
                problems.append(f"{address} is a {tls['kind']} socket but the layout's tls is {layout.uwsgi_tls}")
            elif kind != "plain" and (tls.get("cert"), tls.get("key"), tls.get("ca"), tls.get("required")) != \
                    (files["cert"], files["key"], files["ca"], True):
                problems.append(f"{address}: certificate, key or required client CA differ from the layout's "
                                f"{files['cert']}, {files['key']}, !{files['ca']}")
    if layout.uwsgi_tls == "off":
        return problems
    files = layout.uwsgi_tls_files
    expected = {"ssl_certificate": [files["client_cert"]], "ssl_certificate_key": [files["client_key"]],
                "ssl_trusted_certificate": [files["ca"]], "ssl_verify": ["on"], "ssl_name": [layout.uwsgi_tls_name]}
    for p in passing:
        got = {k: p["ssl"].get(k) for k in expected}
        if got != expected:
            wrong = next(k for k in expected if got[k] != expected[k])
            problems.append(f"location {p['location'] or '(server)'}: {p['directive'].split('_')[0]}_{wrong} is "
                            f"{got[wrong]}, the layout needs {expected[wrong]}")
    problems += check_tls_dir(layout.uwsgi_tls_dir, layout.app_hosts, layout.uwsgi_tls_name)
    return problems


# The setting that gives a server's unix sockets their mode.
MODE_SETTING = {"uwsgi": "chmod-socket", "gunicorn": "umask", "granian": "GRANIAN_UDS_PERMISSIONS"}


def _keepalive_problems(layout: Layout, nginx: dict, upstream: dict) -> list[str]:
    """HTTP upstreams: nginx keeps connections open only with all three of these, and must keep
    none where the layout says so (@keepalive=off), or where the server closes after every
    answer (uWSGI's http-socket: a kept connection would be reset, a 502)."""
    problems = []
    if not layout.upstream_keepalive:
        if "keepalive" in upstream["directives"]:
            why = ("uWSGI's http-socket closes after every answer, so a kept connection would fail" if
                   layout.server == "uwsgi" else "the layout says keepalive off")
            problems.append(f"the HTTP upstream keeps connections (keepalive) but {why}")
        return problems
    if "keepalive" not in upstream["directives"]:
        problems.append("the HTTP upstream has no keepalive: nginx would open a connection per request")
    location = nginx["location_args"].get("/", {})
    if location.get("proxy_http_version") != ["1.1"]:
        problems.append("location / needs proxy_http_version 1.1 for upstream keep-alive")
    headers = [args for d, args in nginx["location_headers"] if d == "/"]
    if ["Connection", ""] not in headers:
        problems.append('location / needs proxy_set_header Connection "" for upstream keep-alive')
    return problems
