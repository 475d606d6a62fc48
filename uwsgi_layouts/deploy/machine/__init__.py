"""The machine: checks of a layout against this machine, and what the upper rooms need to
know about it. Its Pythons (our uWSGI's libpython, a virtualenv's version, the peers'
packages), the run user and what that user can read, the app's directories, the data set's
map, the certificates, the network (backlog cap, listen address, network namespaces), and
the pre-flight import of the app as the workers will run it, and uWSGI's stats server (the one
reader, without request variables, and who else could read it). It reads; it never writes.

``checked(layout)`` is the way in: every command passes its layout through it once, before
rendering or running anything. Other rooms import these names from ``deploy.machine``.
"""

from uwsgi_layouts.deploy.machine.app import MAX_PREFLIGHT_TIMEOUT, PREFLIGHT_TIMEOUT, PROBE_PATH, preflight
from uwsgi_layouts.deploy.machine.certificates import check_tls_dir, resolve_tls_dir
from uwsgi_layouts.deploy.machine.cgroups import CgroupReading, Homes, check_limits, homes, read_v1, read_v2
from uwsgi_layouts.deploy.machine.cpus import CpuLimit, cpu_limit, default_cpus, usable_cpus
from uwsgi_layouts.deploy.machine.datasets import check_data_dir, map_is_current, read_map_facts
from uwsgi_layouts.deploy.machine.environment import stack_environment, worker_environment
from uwsgi_layouts.deploy.machine.netns import (
    NETNS_DIR,
    connect,
    enter,
    is_isolated,
    mark_isolated,
    plain_allowed,
    run_in,
    unmark_isolated,
)
from uwsgi_layouts.deploy.machine.network import check_listen_address, somaxconn
from uwsgi_layouts.deploy.machine.nginx import find_nginx
from uwsgi_layouts.deploy.machine.paths import PACKAGE_DIR, output_dir, within
from uwsgi_layouts.deploy.machine.python import (
    app_virtualenv,
    check_virtualenv,
    find_uwsgi,
    linked_python,
    pyuwsgi_site,
    script_interpreter,
    server_package_dir,
    server_python,
    tool_command,
    uwsgi_has_routing,
    uwsgi_has_ssl,
    uwsgi_python,
    virtualenv_python,
)
from uwsgi_layouts.deploy.machine.replicas import check_replicas
from uwsgi_layouts.deploy.machine.resolve import check_hosts, checked
from uwsgi_layouts.deploy.machine.risks import (
    accept,
    check_dirs_not_writable,
    check_static_locations,
    code_dirs_of,
    writable_by_others,
)
from uwsgi_layouts.deploy.machine.stats import Exposure, is_unix_address, read_stats, stats_exposure, without_requests
from uwsgi_layouts.deploy.machine.users import (
    blocked_at,
    check_reachable,
    check_readable,
    group_of,
    resolve_user,
    run_user_ids,
)

__all__ = [
    "CgroupReading", "CpuLimit", "Exposure", "Homes", "MAX_PREFLIGHT_TIMEOUT", "NETNS_DIR", "PACKAGE_DIR",
    "PREFLIGHT_TIMEOUT", "PROBE_PATH", "accept", "app_virtualenv", "blocked_at", "check_data_dir",
    "check_dirs_not_writable", "find_nginx", "check_hosts", "check_limits", "check_listen_address", "check_reachable",
    "check_readable", "check_replicas", "check_static_locations", "check_tls_dir", "check_virtualenv", "checked",
    "code_dirs_of", "connect", "cpu_limit", "default_cpus", "enter", "find_uwsgi", "group_of", "homes", "is_isolated",
    "is_unix_address", "linked_python", "map_is_current", "mark_isolated", "output_dir", "plain_allowed", "preflight",
    "pyuwsgi_site",
    "read_map_facts", "read_stats", "read_v1", "read_v2", "resolve_tls_dir", "resolve_user", "run_in", "run_user_ids",
    "script_interpreter", "server_package_dir", "server_python", "somaxconn", "stack_environment", "stats_exposure",
    "tool_command", "unmark_isolated", "usable_cpus", "uwsgi_has_routing", "uwsgi_has_ssl", "uwsgi_python",
    "virtualenv_python", "within", "without_requests", "worker_environment", "writable_by_others",
]
