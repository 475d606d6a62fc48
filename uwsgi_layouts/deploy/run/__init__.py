"""Run: the processes of a rendered stack. ``Stack`` starts one app-server master (uWSGI,
gunicorn or granian) per app host and one nginx, polls them ready, and stops every process
tree on every exit path; ``claim`` locks a run directory for a stack (and stops what a dead
owner left running there); ``chain_reload`` replaces uWSGI's workers one at a time; ``Net``
makes network namespaces for several hosts on one machine; ``ServerCgroup`` puts an app server
under a layout's CPU quota and memory limit, ``open_leftover`` a load generator on the CPU
a quota-limited stack leaves idle; free ports for lab stacks.

Other rooms (and bench/) import these names from ``deploy.run``, never its modules.
"""

from uwsgi_layouts.deploy.machine import read_stats
from uwsgi_layouts.deploy.run.cgroup import ServerCgroup, remove_cgroups
from uwsgi_layouts.deploy.run.cgroup import clean_stale as clean_stale_cgroups
from uwsgi_layouts.deploy.run.cgroup import existing as existing_cgroups
from uwsgi_layouts.deploy.run.leftover import open_leftover
from uwsgi_layouts.deploy.run.netns import Net, NetnsError, clean_stale, existing, unavailable
from uwsgi_layouts.deploy.run.ownership import DirLock, claim, holder, reap_orphans
from uwsgi_layouts.deploy.run.ports import free_consecutive_ports, port_is_free
from uwsgi_layouts.deploy.run.processes import (
    child_setup,
    die_with_parent,
    http_get,
    nginx_binary,
    tail,
    terminate_group,
    uwsgi_binary,
)
from uwsgi_layouts.deploy.run.reload import ReloadResult, chain_reload, load_run_layout
from uwsgi_layouts.deploy.run.servers import LAUNCHER, PROCESSES, Member, ServerProcess, process_for
from uwsgi_layouts.deploy.run.stack import Placement, Stack, port_taken

__all__ = [
    "DirLock", "LAUNCHER", "Member", "Net", "NetnsError", "PROCESSES", "Placement", "ReloadResult", "ServerCgroup",
    "ServerProcess", "Stack", "chain_reload", "child_setup", "claim", "clean_stale", "clean_stale_cgroups",
    "die_with_parent", "existing", "existing_cgroups", "free_consecutive_ports", "holder", "http_get",
    "load_run_layout", "nginx_binary", "open_leftover", "port_is_free", "port_taken", "process_for", "read_stats",
    "reap_orphans", "remove_cgroups", "tail", "terminate_group", "unavailable", "uwsgi_binary",
]
