"""Render a layout into nginx.conf + the app server's config (uwsgi.ini + uwsgi_params,
gunicorn.conf.py or granian.env) + layout.json, safely.

Files are rendered into a staging directory next to the destination, cross-checked
(nginx upstream == the server's sockets, worker/socket mapping, no reused address, loopback
only), tested with ``nginx -t``, and only then moved into place. A failure at any step
leaves the destination untouched.
"""

from __future__ import annotations

import ipaddress
import json
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import jinja2

from deploy import netns, nginx_map
from deploy.appenv import blocked_at, check_readable, find_uwsgi, run_user_ids
from deploy.certs import check_tls_dir
from deploy.errors import LayoutError, RenderError
from deploy.hosts import SSL_CIPHERS, SSL_PROTOCOLS, plain_allowed, uwsgi_has_ssl
from deploy.layout import PROJECT_ROOT, THREAD_POOL, UNIX_SOCKET_MODE, Layout
from deploy.servers import (
    CONFIG_FILES,
    GRACEFUL_STOP,
    NGINX_WORKER_CONNECTIONS,
    PEER_IDLE_TIMEOUT,
    SERVERS,
    UPSTREAM_KEEPALIVE_TIMEOUT,
    parse_uwsgi_ini,
    read_uwsgi_ini_value,
    server_for,
    uwsgi_ini_value,
)

__all__ = ["crosscheck", "nginx_test", "parse_uwsgi_ini", "read_uwsgi_ini_value", "render_texts", "uwsgi_ini_value",
           "write_layout"]

TEMPLATES_DIR = PROJECT_ROOT / "templates"
LAYOUT_JSON_VERSION = 1
UPSTREAM_NAME = SERVERS["uwsgi"].upstream
# Directories nginx and the app server write into at run time, created with the files.
RUN_SUBDIRS = ("logs", "tmp", "sockets", "control")
# Directories the unprivileged run user must own (uWSGI's vacuum, pid file, master FIFO;
# the peers' sockets and pid files).
USER_OWNED_SUBDIRS = ("sockets", "control")
# What every file render writes starts with (templates/_header.j2), after the comment leader.
GENERATED = "Generated from layout "
# nginx variables a client controls: none may reach a UWSGI_* variable (those load code).
CLIENT_CONTROLLED = ("$arg", "$args", "$query_string", "$request_uri", "$http_", "$cookie_", "$request_body",
                     "$uri", "$document_uri", "$request")


@dataclass
class RenderResult:
    out_dir: Path
    files: list[str]
    nginx_test: str = ""  # nginx -t output ("" when nginx is not installed)
    notes: list[str] = field(default_factory=list)


def _env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES_DIR)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
    env.filters["uwsgi_ini_value"] = uwsgi_ini_value
    env.filters["pyrepr"] = repr  # a Python literal in gunicorn.conf.py: any string, exactly
    return env


def pass_target(layout: Layout, upstream: str = "") -> str:
    """What location / passes to: ``uwsgi_app``, ``suwsgi://uwsgi_app``, ``http://...``, ``https://...``."""
    upstream = upstream or server_for(layout).upstream
    return upstream if layout.nginx_scheme == "uwsgi" else f"{layout.nginx_scheme}://{upstream}"


def host_file(host: str, name: str) -> str:
    """Where a rendered app host's file goes, relative to the run dir (hosts/ADDR/uwsgi.ini)."""
    return f"hosts/{host}/{name}"


def render_texts(layout: Layout) -> dict[str, str]:
    env = _env()
    server = server_for(layout)
    context = {
        "layout": layout, "server": server, "unix_mode": UNIX_SOCKET_MODE, "thread_pool": THREAD_POOL,
        "worker_connections": NGINX_WORKER_CONNECTIONS, "upstream_keepalive_timeout": UPSTREAM_KEEPALIVE_TIMEOUT,
        "peer_idle_timeout": PEER_IDLE_TIMEOUT, "graceful_stop": GRACEFUL_STOP, "sys_prefix": sys.prefix,
        **_file_map_context(layout),
        "pass_target": pass_target(layout), "ssl_ciphers": SSL_CIPHERS, "ssl_protocols": SSL_PROTOCOLS,
    }
    texts = {"nginx.conf": env.get_template("nginx.conf.j2").render(context)}
    if layout.hosts:  # each host's config, from its own view; the front keeps uwsgi_params
        for host in layout.hosts:
            for name, text in server.render(env, context | {"layout": layout.host_layout(host)}).items():
                texts[host_file(host, name) if name == server.config_file else name] = text
    else:
        texts |= server.render(env, context)
    texts["layout.json"] = json.dumps({"format_version": LAYOUT_JSON_VERSION, **layout.to_dict()}, indent=2) + "\n"
    return texts


def _file_map_context(layout: Layout) -> dict:
    """The data set's nginx map (for /nfiles/<id>): its facts and the names the templates share."""
    if not layout.data_dir:
        return {}
    try:
        facts = nginx_map.read_map_facts(Path(layout.data_dir))
    except nginx_map.MapError as exc:  # changed since the layout was validated
        raise LayoutError("data_dir", f"{exc}: write it with `python -m bench.dataset --root {layout.data_dir} "
                                      "--map-only`") from None
    return {"file_map": facts, "map_name": nginx_map.MAP_NAME, "id_variable": nginx_map.ID_VARIABLE,
            "path_variable": nginx_map.PATH_VARIABLE, "nginx_prefix": nginx_map.ROUTE_PREFIX}


# --- parsing the generated files back (the cross-checks read files, not the model) ------


def parse_nginx(conf_path: Path, single: bool = False) -> list[dict]:
    """The parsed directives of nginx.conf (includes resolved unless ``single``) via crossplane.
    ``map`` blocks are skipped unless ``single``: the data set's map includes a line per file
    (a million of them take crossplane minutes), and no other check reads maps."""
    import crossplane

    payload = crossplane.parse(str(conf_path), combine=True, catch_errors=False, single=single,
                               ignore=() if single else ("map",))
    if payload["status"] != "ok":
        raise RenderError(f"nginx.conf does not parse: {payload['errors']}")
    return payload["config"][0]["parsed"]


def find_directives(block: list[dict], name: str) -> list[dict]:
    """All directives called ``name`` anywhere below ``block`` (depth first)."""
    found = []
    for d in block:
        if d["directive"] == name:
            found.append(d)
        found.extend(find_directives(d.get("block", []), name))
    return found


def nginx_summary(conf_path: Path) -> dict:
    """What the cross-checks need from nginx.conf: upstreams, listens, worker count."""
    parsed = parse_nginx(conf_path)
    upstreams = {}
    for up in find_directives(parsed, "upstream"):
        block = up.get("block", [])
        upstreams[up["args"][0]] = {
            "servers": [d["args"] for d in block if d["directive"] == "server"],
            "directives": [d["directive"] for d in block],
        }
    workers = [d["args"][0] for d in parsed if d["directive"] == "worker_processes"]
    users = [d["args"] for d in parsed if d["directive"] == "user"]
    return {
        "user": users[0] if users else [],
        "uwsgi_params": [d["args"] for d in find_directives(parsed, "uwsgi_param")],
        # location path -> the directive names inside it
        "locations": {" ".join(d["args"]): [x["directive"] for x in d.get("block", [])]
                      for d in find_directives(parsed, "location")},
        # location path -> {directive: args} of the directives inside it (last one wins)
        "location_args": {" ".join(d["args"]): {x["directive"]: x["args"] for x in d.get("block", [])}
                          for d in find_directives(parsed, "location")},
        "upstreams": upstreams,
        "listens": [d["args"][0] for d in find_directives(parsed, "listen")],
        "uwsgi_pass": [d["args"][0] for d in find_directives(parsed, "uwsgi_pass")],
        "proxy_pass": [d["args"][0] for d in find_directives(parsed, "proxy_pass")],
        # (location path, args) of every proxy_set_header (a location holds several)
        "location_headers": [(" ".join(loc["args"]), d["args"]) for loc in find_directives(parsed, "location")
                             for d in loc.get("block", []) if d["directive"] == "proxy_set_header"],
        "worker_processes": workers[0] if workers else "1",
        "pass_locations": pass_locations(parsed),
    }


SSL_DIRECTIVES = ("ssl_certificate", "ssl_certificate_key", "ssl_trusted_certificate", "ssl_verify", "ssl_name",
                   "ssl_protocols", "ssl_session_reuse", "ssl_server_name")


def pass_locations(parsed: list[dict]) -> list[dict]:
    """Every location that passes requests on (uwsgi_pass, proxy_pass): its path, directive,
    target, and the uwsgi_ssl_* / proxy_ssl_* settings in force there (its own, else inherited
    from the enclosing server or http block, as nginx inherits them)."""
    out: list[dict] = []

    def walk(block: list[dict], inherited: dict, where: str) -> None:
        here = dict(inherited)
        for d in block:
            name = d["directive"]
            for prefix in ("uwsgi_", "proxy_"):
                if name.startswith(prefix) and name[len(prefix):] in SSL_DIRECTIVES:
                    here[name] = d["args"]
        for d in block:
            if d["directive"] in ("uwsgi_pass", "proxy_pass"):
                prefix = d["directive"].split("_")[0] + "_"
                out.append({"location": where, "directive": d["directive"], "target": d["args"][0],
                            "ssl": {k[len(prefix):]: v for k, v in here.items() if k.startswith(prefix)}})
            if d["directive"] in ("http", "server", "location", "if", "limit_except") and "block" in d:
                walk(d["block"], here, " ".join(d["args"]) if d["directive"] == "location" else where)

    walk(parsed, {}, "")
    return out


def upstream_of(target: str) -> str:
    """``suwsgi://uwsgi_app`` -> ``uwsgi_app``."""
    return target.partition("://")[2] if "://" in target else target


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
    if not layout.hosts:
        return [(layout, server.facts(layout, conf_dir, config_file or server.config_file))]
    return [(layout.host_layout(h), server.facts(layout.host_layout(h), conf_dir / "hosts" / h)) for h in layout.hosts]


def crosscheck(layout: Layout, conf_dir: Path, *, config_file: str = "", nginx_conf: str = "nginx.conf",
               upstream_name: str = "", site: bool = False) -> list[str]:
    """Check the rendered files against each other and the layout; return the problems.

    ``config_file``, ``nginx_conf``: the files to read, relative to ``conf_dir`` (default: the
    server's own config file name, nginx.conf; with hosts, each host's hosts/ADDR/uwsgi.ini).
    ``site``: the nginx file is a site that the distribution's nginx.conf includes (a bundle,
    deploy/bundle.py): the distribution sets nginx's user and runs several workers, so the
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
        problems += _keepalive_problems(nginx, upstream)
    servers = [args[0].removeprefix("unix:") for args in upstream["servers"]]
    primaries = [args[0].removeprefix("unix:") for args in upstream["servers"] if "backup" not in args[1:]]
    backups = [args[0].removeprefix("unix:") for args in upstream["servers"] if "backup" in args[1:]]
    # A socket may appear twice only as the retry alias: once as primary, once as backup.
    if (set(servers) != set(sockets) or len(set(primaries)) != len(primaries)
            or len(set(backups)) != len(backups) or len(servers) > len(sockets) + len(set(primaries) & set(backups))):
        problems.append(f"nginx upstream servers {servers} != {server.label} sockets {sockets}")

    # 2. No address used twice across nginx listen, the server's sockets and its stats server
    #    (each host has its own loopback: its stats server only clashes with its own sockets).
    addresses = nginx["listens"] + sockets + ([] if layout.hosts else facts.private)
    dupes = {a for a in addresses if addresses.count(a) > 1}
    for _, host in per_host if layout.hosts else ():
        own = host.addresses + host.private
        dupes |= {a for a in own if own.count(a) > 1}
    if dupes:
        problems.append(f"addresses used twice: {sorted(dupes)}")

    # 3. The uwsgi protocol can load code (and no server needs more): loopback or 0660 unix
    #    sockets, or, off loopback, TLS with a client certificate uWSGI requires (see 11).
    for _, host in per_host:
        for address in host.private:
            if not address.startswith("/") and not _is_loopback(address):
                problems.append(f"{address} is not a loopback address")
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

    # 6. Started as root: nothing serves requests as root. uWSGI and gunicorn name the user in
    #    their config (granian has no such option: Stack starts it as that user).
    for _, host in per_host:
        if layout.drops_privileges and server.name in ("uwsgi", "gunicorn") and \
                host.run_as != (layout.user, layout.group):
            problems.append(f"{server.config_file} must drop to uid/gid {layout.user}/{layout.group}, has "
                            f"{host.run_as or 'none'}")
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
                     if where.startswith("^~ ") and where != f"^~ {nginx_map.ROUTE_PREFIX}"}
    if served_static != dict(layout.static):
        problems.append(f"nginx static locations {served_static} differ from the layout's {dict(layout.static)}")

    # 10. The app's environment is what the layout says (for uWSGI once it has read "%%" as "%").
    expected_env = ([("UL_DATA_DIR", layout.data_dir)] if layout.data_dir else []) + list(layout.env)
    for _, host in per_host:
        if host.env != expected_env:
            problems.append(f"{server.config_file} env lines {host.env} differ from the layout's {expected_env}")

    # 11. TLS: what the layout asks for on both sides, the same in every location that passes
    #     to the upstream, and certificates that fit (deploy.certs.check_tls_dir).
    problems += _tls_problems(layout, per_host, nginx, name)

    # 12. /nfiles/<id> is nginx's alone: it never reaches the app, opens only files/ + a map value,
    #     and the map is the data set's with the hash sizes made for it.
    if layout.data_dir:
        problems += _file_map_problems(layout, conf_dir)
    return problems


def _file_map_problems(layout: Layout, conf_dir: Path) -> list[str]:
    facts = nginx_map.read_map_facts(Path(layout.data_dir))
    parsed = parse_nginx(conf_dir / "nginx.conf", single=True)
    problems = []
    outer = [d for d in find_directives(parsed, "location") if d["args"] == ["^~", nginx_map.ROUTE_PREFIX]]
    if len(outer) != 1:
        return [f"nginx.conf needs exactly one `location ^~ {nginx_map.ROUTE_PREFIX}`, found {len(outer)}"]
    block = outer[0].get("block", [])
    for name in ("uwsgi_pass", "proxy_pass", "alias", "autoindex"):
        if find_directives(block, name):
            problems.append(f"location {nginx_map.ROUTE_PREFIX} must not use {name}")
    inner = [d for d in block if d["directive"] == "location"]
    if [d["directive"] for d in block if d["directive"] != "location"] != ["return"] or len(inner) != 1:
        problems.append(f"location {nginx_map.ROUTE_PREFIX} must hold one id location and `return 404` for the rest")
    else:
        args = {d["directive"]: d["args"] for d in inner[0].get("block", [])}
        if args.get("root") != [f"{layout.data_dir}/files"]:
            problems.append(f"the {nginx_map.ROUTE_PREFIX}<id> location's root is {args.get('root')}, not the data "
                            "set's files/")
        if args.get("try_files") != [f"/${nginx_map.PATH_VARIABLE}", "=404"]:
            problems.append(f"the {nginx_map.ROUTE_PREFIX}<id> location must end in try_files "
                            f"/${nginx_map.PATH_VARIABLE} =404")
    maps = [d for d in find_directives(parsed, "map") if d["args"] == [f"${nginx_map.ID_VARIABLE}",
                                                                       f"${nginx_map.PATH_VARIABLE}"]]
    body = [(d["directive"], d["args"]) for d in maps[0].get("block", [])] if len(maps) == 1 else []
    if body != [("default", [""]), ("include", [f"{layout.data_dir}/{nginx_map.MAP_NAME}"])]:
        problems.append(f"the map of ${nginx_map.ID_VARIABLE} must be default \"\" plus the data set's "
                        f"{nginx_map.MAP_NAME}, got {body or 'no such map'}")
    http = next((d.get("block", []) for d in parsed if d["directive"] == "http"), [])
    sizes = {d["directive"]: d["args"] for d in http if d["directive"].startswith("map_hash_")}
    want = {"map_hash_max_size": [str(facts.sizing.max_size)], "map_hash_bucket_size": [str(facts.sizing.bucket_size)]}
    if sizes != want:
        problems.append(f"map hash sizes {sizes} differ from the data set's {nginx_map.FACTS_NAME}: {want}")
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


def _keepalive_problems(nginx: dict, upstream: dict) -> list[str]:
    """HTTP peers: nginx keeps upstream connections open only with all three of these."""
    problems = []
    if "keepalive" not in upstream["directives"]:
        problems.append("the HTTP upstream has no keepalive: nginx would open a connection per request")
    location = nginx["location_args"].get("/", {})
    if location.get("proxy_http_version") != ["1.1"]:
        problems.append("location / needs proxy_http_version 1.1 for upstream keep-alive")
    headers = [args for d, args in nginx["location_headers"] if d == "/"]
    if ["Connection", ""] not in headers:
        problems.append('location / needs proxy_set_header Connection "" for upstream keep-alive')
    return problems


def nginx_test(conf_dir: Path, namespace: str = "") -> tuple[bool, str]:
    """Run ``nginx -t`` on a rendered directory (inside network namespace ``namespace``, where
    nginx will run: it binds the listen address). Returns (ok, output); ("", True) without nginx."""
    binary = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    if binary is None:
        return True, ""
    # -p: relative paths resolve inside conf_dir; -e: don't touch the compiled-in /var/log path.
    cmd = [binary, "-t", "-p", f"{conf_dir}/", "-c", str(conf_dir / "nginx.conf"), "-e", "stderr"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30,
                          preexec_fn=(lambda: netns.enter(namespace)) if namespace else None)
    return proc.returncode == 0, (proc.stdout + proc.stderr).strip()


def make_staging(out: Path) -> Path:
    """A fresh private directory to render ``out`` into, inside its nearest existing ancestor:
    same filesystem (so the final rename is atomic), and missing parent directories are only
    created once everything passed. LayoutError("out", ...) when there is none."""
    try:
        ancestor = next((a for a in [out, *out.parents] if a.exists()), Path("/"))
    except OSError as exc:  # e.g. a name over 255 bytes
        raise LayoutError("out", f"unusable directory {str(out)!r}: {exc.strerror}") from None
    if not ancestor.is_dir():
        raise LayoutError("out", f"{ancestor} exists and is not a directory")
    if not os.access(ancestor, os.W_OK):
        raise LayoutError("out", f"{ancestor} is not writable")
    stage_in = ancestor if ancestor != out else out.parent
    try:
        return Path(tempfile.mkdtemp(prefix=f".{out.name}.staging-", dir=stage_in))
    except OSError as exc:
        raise LayoutError("out", f"cannot write in {stage_in}: {exc.strerror or exc}") from None


def write_layout(layout: Layout, out_dir: Path | str, check_nginx: bool = True, front_netns: str = "") -> RenderResult:
    """Render, check and install the files for ``layout`` into ``out_dir`` (its run_dir).
    ``front_netns``: the network namespace nginx will run in (its listen address is checked there)."""
    out = Path(out_dir).resolve()
    if str(out) != layout.run_dir:
        raise RenderError(f"layout run_dir {layout.run_dir} differs from output directory {out}")
    _check_uwsgi_ssl(layout)
    texts = render_texts(layout)  # pure: fails before anything is written
    staging = make_staging(out)
    try:
        for directory in run_dirs(layout, staging):
            for sub in RUN_SUBDIRS:
                (directory / sub).mkdir(mode=0o750, parents=True)
        for name, text in texts.items():
            (staging / name).write_text(text)
        check_reachable(layout, out)
        netns.run_in(front_netns, lambda: _check_listen_address(layout))
        problems = crosscheck(layout, staging)
        if problems:
            raise RenderError("cross-check failed: " + "; ".join(problems))
        ok, output = nginx_test(staging, front_netns) if check_nginx else (True, "")
        if not ok:
            raise RenderError("nginx -t rejected the rendered nginx.conf", details=output)
        if "could not build optimal map_hash" in output:  # the sizes were made for another map
            raise RenderError(f"nginx -t: the map hash sizes do not fit the data set's map; rewrite them with "
                              f"`python -m bench.dataset --root {layout.data_dir} --map-only`", details=output)
        # Drop what nginx -t created in staging (pid file, empty logs, temp dirs).
        top = {name.split("/")[0] for name in texts}
        for entry in staging.iterdir():
            if entry.name not in top and entry.name not in RUN_SUBDIRS:
                entry.unlink() if entry.is_file() else shutil.rmtree(entry)
        for sub in ("logs", "tmp"):
            shutil.rmtree(staging / sub)
            (staging / sub).mkdir(mode=0o750)
        for directory in run_dirs(layout, staging):
            directory.chmod(0o750)
        _apply_ownership(layout, staging)
        _install(layout, staging, out, list(texts))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return RenderResult(out_dir=out, files=list(texts), nginx_test=output)


def run_dirs(layout: Layout, root: Path) -> list[Path]:
    """The run directory and, with hosts, each app host's (hosts/ADDR), under ``root``."""
    return [root, *(root / "hosts" / h for h in layout.hosts)]


def _check_uwsgi_ssl(layout: Layout) -> None:
    if layout.uwsgi_tls == "off" or layout.server != "uwsgi":
        return
    binary = find_uwsgi()
    if binary and not uwsgi_has_ssl(binary):
        raise RenderError(f"tls: {binary} was built without SSL (no ssl-socket): install libssl-dev "
                          "(scripts/install-system-deps.sh), then rebuild it: rm -rf .venv && make venv")


def _ids(layout: Layout) -> tuple[int, int]:
    entry = pwd.getpwnam(layout.user)
    return entry.pw_uid, entry.pw_gid


def _apply_ownership(layout: Layout, run_dir: Path) -> None:
    """Under root: the run dir and its subdirs are group-owned by the run user's group (so
    nginx workers can reach sockets and temp files); sockets/ and control/ are owned by the
    run user (uWSGI manages files there after dropping privileges). Nothing is world-readable."""
    if not layout.drops_privileges or not run_dir.exists():
        return
    uid, gid = _ids(layout)
    for directory in run_dirs(layout, run_dir):
        if directory != run_dir:
            os.chown(directory.parent, 0, gid)
            directory.parent.chmod(0o750)
        os.chown(directory, 0, gid)
        directory.chmod(0o750)
        for sub in RUN_SUBDIRS:
            path = directory / sub
            path.mkdir(mode=0o750, exist_ok=True)
            os.chown(path, uid if sub in USER_OWNED_SUBDIRS else 0, gid)
            path.chmod(0o750)


def _check_listen_address(layout: Layout) -> None:
    """nginx (and so `nginx -t`) binds the listen address: it must be one of this machine's."""
    if layout.listen_host == "0.0.0.0":
        return
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((layout.listen_host, 0))
        except OSError as exc:
            raise LayoutError("listen", f"{layout.listen_host} is not an address of this machine "
                                        f"({exc.strerror}); nginx could not bind it") from None


def check_reachable(layout: Layout, out: Path) -> None:
    """Under root, the unprivileged run user must reach the run dir and read the app, its
    virtualenv, Python's standard library and the static dirs, or uWSGI dies right after
    dropping privileges."""
    if not layout.drops_privileges:
        return
    uid, _, gids = run_user_ids(layout.user)
    blocked = blocked_at(out.parent, uid, gids, need_read=False)
    if blocked is not None:
        raise LayoutError(
            "run_dir",
            f"user {layout.user} cannot reach {out}: {blocked} is mode {blocked.stat().st_mode & 0o777:o}; "
            f"use another --out/--run-dir (or chmod o+x {blocked})",
        )
    check_readable(layout)


def _install(layout: Layout, staging: Path, out: Path, names: list[str]) -> None:
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        os.rename(staging, out)  # atomic: the directory appears complete or not at all
        return
    for directory in run_dirs(layout, out):
        for sub in RUN_SUBDIRS:
            (directory / sub).mkdir(mode=0o750, parents=True, exist_ok=True)
    for name in names:  # each replace is atomic; all were validated before the first one
        os.replace(staging / name, out / name)
    for stale in set(CONFIG_FILES) - set(names):  # another server's config, from an earlier render
        if _written_by_render(out / stale):
            (out / stale).unlink()
    _apply_ownership(layout, out)  # an existing directory keeps its own modes otherwise


def _written_by_render(path: Path) -> bool:
    """True for a file render wrote (its generated header), never for anyone else's."""
    if path.name == "uwsgi_params":  # a copy of templates/uwsgi_params, which has no header
        return path.is_file() and path.read_bytes() == (TEMPLATES_DIR / "uwsgi_params").read_bytes()
    try:
        with open(path, errors="replace") as f:
            return f.readline()[2:].startswith(GENERATED)
    except OSError:
        return False
