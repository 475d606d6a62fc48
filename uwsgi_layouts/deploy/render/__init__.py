"""Render: templates -> files. A checked layout (``deploy.machine.checked``) becomes nginx.conf,
the app server's config (uwsgi.ini + uwsgi_params, gunicorn.conf.py or granian.env) and
layout.json, cross-checked against each other, tested with ``nginx -t``, and moved into the run
directory only when all passed (``write_layout``). The same cross-checks read a production
bundle's files (``deploy.ship``).

Other rooms import these names from ``deploy.render``, never its modules.
"""

from uwsgi_layouts.deploy.render.checks import crosscheck, host_facts
from uwsgi_layouts.deploy.render.nginx_conf import (
    find_directives,
    nginx_summary,
    parse_nginx,
    pass_locations,
    upstream_of,
)
from uwsgi_layouts.deploy.render.nginx_map import write_map
from uwsgi_layouts.deploy.render.servers import (
    CONFIG_FILES,
    GRACEFUL_STOP,
    NGINX_WORKER_CONNECTIONS,
    SERVERS,
    Granian,
    Gunicorn,
    ServerConfig,
    ServerFacts,
    parse_uwsgi_ini,
    read_uwsgi_ini_value,
    server_for,
)
from uwsgi_layouts.deploy.render.templates import GENERATED, TEMPLATES_DIR, environment, uwsgi_ini_value
from uwsgi_layouts.deploy.render.texts import LAYOUT_JSON_VERSION, host_file, pass_target, render_texts
from uwsgi_layouts.deploy.render.write import (
    RUN_SUBDIRS,
    RenderResult,
    make_staging,
    new_run_dir,
    nginx_test,
    write_layout,
)

__all__ = [
    "CONFIG_FILES", "GENERATED", "GRACEFUL_STOP", "LAYOUT_JSON_VERSION", "NGINX_WORKER_CONNECTIONS", "RUN_SUBDIRS",
    "SERVERS", "TEMPLATES_DIR", "Granian", "Gunicorn", "RenderResult", "ServerConfig", "ServerFacts", "crosscheck",
    "environment", "find_directives", "host_facts", "host_file", "make_staging", "new_run_dir", "nginx_summary",
    "nginx_test", "parse_nginx", "parse_uwsgi_ini", "pass_locations", "pass_target", "read_uwsgi_ini_value",
    "render_texts", "server_for", "upstream_of", "uwsgi_ini_value", "write_layout", "write_map",
]
