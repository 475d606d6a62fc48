"""Whether this machine can start a layout's replicas (``@replicas=R``, deploy/model/replicas.py):
the sum of their CPU quotas within the host's CPUs (a scheduler would not place more pods than
the node's allocatable CPUs either), the sum of their memory limits within the machine's memory,
and their processes and threads within the tasks this user and the kernel allow. Each refusal is
a LayoutError naming ``replicas``, the limit and the largest count that fits. It reads only.
"""

from __future__ import annotations

import math
import resource
from pathlib import Path

from uwsgi_layouts.deploy.machine.cpus import cpu_limit
from uwsgi_layouts.deploy.model import Layout, LayoutError

MB = 1024 * 1024


def _mem_total_mb(root: Path) -> int | None:
    try:
        for line in (root / "proc" / "meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _threads_max(root: Path) -> int | None:
    try:
        return int((root / "proc" / "sys" / "kernel" / "threads-max").read_text().strip())
    except (OSError, ValueError):
        return None


def tasks_per_replica(layout: Layout) -> int:
    """Threads one replica runs: its master and P workers of T threads (uWSGI's master adds
    none that count here; a worker of T threads is T tasks)."""
    return 1 + layout.processes * layout.threads


def task_limit(root: Path) -> tuple[int, str] | None:
    """The smaller of this user's process limit (RLIMIT_NPROC: tasks, threads included) and the
    kernel's threads-max, with its name; None when neither bounds it."""
    limits = []
    soft, _ = resource.getrlimit(resource.RLIMIT_NPROC)
    if soft != resource.RLIM_INFINITY:
        limits.append((soft, "this user's process limit (ulimit -u)"))
    threads_max = _threads_max(root)
    if threads_max is not None:
        limits.append((threads_max, "the kernel's threads-max"))
    return min(limits) if limits else None


def check_replicas(layout: Layout, root: Path | str = "/", host_cpus: int | None = None) -> None:
    """LayoutError("replicas", ...) when this machine cannot start the layout's replicas."""
    if layout.replicas == 1:
        return
    root = Path(root)
    r = layout.replicas
    if layout.cpus is not None:
        host = host_cpus if host_cpus is not None else cpu_limit(root).host
        total = round(r * layout.cpus, 2)
        if total > host:
            fits = math.floor(host / layout.cpus + 1e-9)
            raise LayoutError("replicas", f"{r} replicas x {layout.cpus:g} CPUs = {total:g} CPUs of quota, more than "
                                          f"this machine's {host} CPUs; at most {fits} replica(s) of "
                                          f"{layout.cpus:g} CPUs fit")
    total_mb = _mem_total_mb(root)
    if layout.memory is not None and total_mb is not None and r * layout.memory > total_mb:
        raise LayoutError("replicas", f"{r} replicas x {layout.memory} MB = {r * layout.memory} MB of memory limits, "
                                      f"more than this machine's {total_mb} MB; at most "
                                      f"{total_mb // layout.memory} replica(s) of {layout.memory} MB fit")
    limit = task_limit(root)
    need = r * tasks_per_replica(layout)
    if limit is not None and need > limit[0]:
        raise LayoutError("replicas", f"{r} replicas x {tasks_per_replica(layout)} threads = {need} threads, more than "
                                      f"{limit[1]} ({limit[0]})")
