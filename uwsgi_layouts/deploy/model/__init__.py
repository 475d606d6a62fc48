"""The model: what to run, as data. Parse and validate a layout (processes x threads x
strategy x options), its strategies and app hosts, the errors every room raises, and the pure
parts of nginx's file-id map. No I/O, no subprocess: ``deploy.machine`` checks a layout
against this machine.

Other rooms import these names from ``deploy.model``, never its modules.
"""

from uwsgi_layouts.deploy.model.apps import APP_SYNTAX, AppTarget, parse_app
from uwsgi_layouts.deploy.model.errors import LayoutError, RenderError, StackError
from uwsgi_layouts.deploy.model.fields import (
    OPEN_FILE_CACHE_ON,
    RISKS,
    check_static_dir,
    config_path,
    int_in,
    parse_cpus,
    parse_env,
    parse_memory_mb,
    parse_open_file_cache,
    parse_static,
)
from uwsgi_layouts.deploy.model.hosts import (
    CA_CERT,
    CA_KEY,
    CLIENT_CERT,
    CLIENT_KEY,
    DEFAULT_TLS_NAME,
    SSL_CIPHERS,
    SSL_PROTOCOLS,
    certificate_files,
    check_name,
    host_cert,
    host_key,
    is_loopback,
    parse_hosts,
    tls_dir_text,
)
from uwsgi_layouts.deploy.model.layout import (
    APP_RE,
    DEFAULT_APP,
    MAX_PROCESSES,
    MAX_THREADS,
    THREAD_POOL,
    TRANSPORTS,
    UNIX_PATH_MAX,
    UNIX_SOCKET_MODE,
    Layout,
    RunAs,
    Socket,
)
from uwsgi_layouts.deploy.model.nginx_map import (
    FACTS_NAME,
    ID_VARIABLE,
    MAP_NAME,
    PATH_VARIABLE,
    ROUTE_PREFIX,
    HashSizing,
    MapError,
    MapFacts,
    map_text,
    size_hash,
)
from uwsgi_layouts.deploy.model.replicas import (
    MAX_REPLICAS,
    REPLICAS_DIR,
    parse_replicas,
    replica_dir,
    replica_file,
    replica_name,
    server_layouts,
    total_limits,
    variant_replicas,
)
from uwsgi_layouts.deploy.model.specs import OPTION_FIELDS, layout_from_record, parse_layout, parse_variant
from uwsgi_layouts.deploy.model.strategies import STRATEGIES, ServerPlan, SocketPlan, Strategy, get_strategy

__all__ = [
    "APP_RE", "APP_SYNTAX", "AppTarget", "CA_CERT", "CA_KEY", "CLIENT_CERT", "CLIENT_KEY", "DEFAULT_APP",
    "DEFAULT_TLS_NAME", "FACTS_NAME", "HashSizing", "ID_VARIABLE", "Layout", "LayoutError", "MAP_NAME",
    "MAX_PROCESSES", "MAX_THREADS", "MapError", "MapFacts", "OPEN_FILE_CACHE_ON", "OPTION_FIELDS", "PATH_VARIABLE",
    "RISKS", "ROUTE_PREFIX", "RenderError", "RunAs", "SSL_CIPHERS", "SSL_PROTOCOLS", "STRATEGIES", "ServerPlan",
    "Socket", "SocketPlan", "StackError", "Strategy", "THREAD_POOL", "TRANSPORTS", "UNIX_PATH_MAX",
    "UNIX_SOCKET_MODE", "certificate_files", "check_name", "check_static_dir", "config_path", "get_strategy",
    "host_cert", "host_key", "int_in", "is_loopback", "layout_from_record", "map_text", "parse_app", "parse_cpus",
    "parse_env", "parse_hosts", "parse_layout", "parse_memory_mb", "parse_open_file_cache", "parse_static",
    "parse_variant", "size_hash", "tls_dir_text",
    # replicas (deploy/model/replicas.py)
    "MAX_REPLICAS", "REPLICAS_DIR", "parse_replicas", "replica_dir", "replica_file", "replica_name",
    "server_layouts", "total_limits", "variant_replicas",
]
