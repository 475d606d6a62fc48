"""How many workers the lab's nginx runs when a layout says ``nginx_workers=auto``.

nginx's own ``worker_processes auto`` counts the CPUs of the machine (sysconf, or the affinity
mask where nginx reads one), never a cgroup's CPU quota: inside a 1-CPU pod on a 64-core node it
would start 64 workers, each taking connections it gets little CPU to serve. The lab renders the
number instead: one worker per CPU this process may use (the smaller of its affinity and the
tightest quota of its cgroup, rounded up: ``deploy.machine.cpus``). nginx runs outside a layout's
own ``@cpus`` cgroup (only the app server is in the pod), so that quota does not count here.
"""

from __future__ import annotations

from uwsgi_layouts.deploy.machine import CpuLimit, cpu_limit


def nginx_worker_processes(layout, limit: CpuLimit | None = None) -> int:
    """The number ``worker_processes`` gets: the layout's own count, or for ``auto`` the whole
    CPUs ``limit`` (this process's, by default) leaves usable."""
    if layout.nginx_workers != "auto":
        return int(layout.nginx_workers)
    return (limit or cpu_limit()).whole


def auto_comment(limit: CpuLimit | None = None) -> str:
    """Why the number is not nginx's ``auto``, for the rendered nginx.conf."""
    limit = limit or cpu_limit()
    bound = f"a CPU quota of {limit.quota:g}" if limit.quota is not None and limit.quota < limit.affinity else \
        f"an affinity of {limit.affinity} CPUs"
    return (f"nginx_workers=auto: one worker per usable CPU ({bound} on a {limit.host}-CPU host); nginx's own "
            "auto would count the host's CPUs and ignore a cgroup quota")
