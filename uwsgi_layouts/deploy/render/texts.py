"""A layout's files as texts: nginx.conf (+ mime.types), the server's config (uwsgi.ini + uwsgi_params,
gunicorn.conf.py or granian.env; with hosts, each host's own) and layout.json."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from uwsgi_layouts.deploy.machine import read_map_facts
from uwsgi_layouts.deploy.model import (
    ID_VARIABLE,
    MAP_NAME,
    PATH_VARIABLE,
    ROUTE_PREFIX,
    SSL_CIPHERS,
    SSL_PROTOCOLS,
    THREAD_POOL,
    UNIX_SOCKET_MODE,
    Layout,
    LayoutError,
    MapError,
    server_layouts,
)
from uwsgi_layouts.deploy.render.nginx_workers import auto_comment, nginx_worker_processes
from uwsgi_layouts.deploy.render.servers import (
    ENTRY_FILE,
    GRACEFUL_STOP,
    NGINX_WORKER_CONNECTIONS,
    PEER_IDLE_TIMEOUT,
    UPSTREAM_KEEPALIVE_TIMEOUT,
    server_for,
)
from uwsgi_layouts.deploy.render.templates import TEMPLATES_DIR, environment

LAYOUT_JSON_VERSION = 2  # 2: protocol is every server's (format 1 wrote gunicorn's default for uWSGI too)


def pass_target(layout: Layout, upstream: str = "") -> str:
    """What location / passes to: ``uwsgi_app``, ``suwsgi://uwsgi_app``, ``http://...``, ``https://...``."""
    upstream = upstream or server_for(layout).upstream
    return upstream if layout.nginx_scheme == "uwsgi" else f"{layout.nginx_scheme}://{upstream}"


def host_file(host: str, name: str) -> str:
    """Where a rendered app host's file goes, relative to the run dir (hosts/ADDR/uwsgi.ini)."""
    return f"hosts/{host}/{name}"


def render_texts(layout: Layout) -> dict[str, str]:
    env = environment()
    server = server_for(layout)
    context = {
        "layout": layout, "server": server, "unix_mode": UNIX_SOCKET_MODE, "thread_pool": THREAD_POOL,
        "worker_connections": NGINX_WORKER_CONNECTIONS, "upstream_keepalive_timeout": UPSTREAM_KEEPALIVE_TIMEOUT,
        "peer_idle_timeout": PEER_IDLE_TIMEOUT, "graceful_stop": GRACEFUL_STOP, "sys_prefix": sys.prefix,
        **_file_map_context(layout),
        "pass_target": pass_target(layout), "ssl_ciphers": SSL_CIPHERS, "ssl_protocols": SSL_PROTOCOLS,
        "nginx_worker_processes": nginx_worker_processes(layout),
        "nginx_workers_why": auto_comment() if layout.nginx_workers == "auto" else "",
    }
    texts = {"nginx.conf": env.get_template("nginx.conf.j2").render(context),
             "mime.types": (TEMPLATES_DIR / "mime.types").read_text()}  # nginx's own list (templates/mime.types)
    # Each app server's config (and entry module), from its own view, in its own directory (hosts/ADDR,
    # replicas/N; the run dir for one server); the front keeps uwsgi_params.
    for directory, own in server_layouts(layout):
        for name, text in _server_texts(env, context | {"layout": own}).items():
            texts[f"{directory}/{name}" if directory and name in (server.config_file, ENTRY_FILE) else name] = text
    texts["layout.json"] = json.dumps({"format_version": LAYOUT_JSON_VERSION, **layout.to_dict()}, indent=2) + "\n"
    return texts


def _server_texts(env, context: dict) -> dict[str, str]:
    """The server's config file(s) and, for an app factory it cannot call, the entry module
    that calls it (ENTRY_FILE, named in the config)."""
    layout = context["layout"]
    server = server_for(layout)
    entry = server.entry_files(layout)
    context = context | {"entry_file": entry[0] if entry else "", "target": layout.app_target}
    texts = server.render(env, context)
    if entry:
        texts[ENTRY_FILE] = env.get_template("entry.py.j2").render(context)
    return texts


def _file_map_context(layout: Layout) -> dict:
    """The data set's nginx map (for /nfiles/<id>): its facts and the names the templates share."""
    if not layout.data_dir:
        return {}
    try:
        facts = read_map_facts(Path(layout.data_dir))
    except MapError as exc:  # changed since the layout was validated
        raise LayoutError("data_dir", f"{exc}: write it with `uwsgi-layouts dataset --root {layout.data_dir} "
                                      "--map-only`") from None
    return {"file_map": facts, "map_name": MAP_NAME, "id_variable": ID_VARIABLE,
            "path_variable": PATH_VARIABLE, "nginx_prefix": ROUTE_PREFIX}
