"""A cgroup that runs only on the CPU everything else leaves idle: where a load generator that
busy-polls (httperf keeps a core at ~100% at any rate) goes when the stack it loads is held to a
CPU quota, so that the generator takes no CPU the app server's quota, nginx or the kernel want.

The cgroup is made beside the app servers' cgroups (``ServerCgroup.open``: the same parent, the
same ownership, state file and next-run cleanup, named ``ul-loadgen-ID-PID``), without a quota or
memory limit, and given the lowest CPU priority the kernel offers a cgroup:

- ``cpu.idle`` 1 where the kernel has it (5.15 and later, on v1 and v2): the cgroup is scheduled
  as SCHED_IDLE. Its weight is the kernel's minimum (3, against 1024 for a default cgroup or a
  nice-0 task), any other task's wakeup preempts it at once, and a CPU running only it counts as
  idle when the kernel places a waking task (``sched_idle_cpu``), so a server worker is not queued
  behind the generator.
- otherwise the lowest weight: ``cpu.weight`` 1 (v2; default 100) or ``cpu.shares`` 2 (v1;
  default 1024). It still loses nearly every contended tick, but a waking task may wait for the
  generator's slice to end.

Weights compete among siblings: the generator's cgroup sits at the level of the app servers'
cgroups: nginx, in this process's cgroup, is a task beside them on cgroup v1 and inside a sibling
cgroup (user.slice, say) on v2; either way every one of them wins over it.
"""

from __future__ import annotations

from pathlib import Path

from uwsgi_layouts.deploy.model import StackError
from uwsgi_layouts.deploy.run.cgroup import ServerCgroup

LABEL = "loadgen"
IDLE_FILE = "cpu.idle"
LOWEST = {2: ("cpu.weight", "1"), 1: ("cpu.shares", "2")}  # the kernel's floor for each version


def lowest_priority(cpu_dir: Path, version: int) -> tuple[str, str]:
    """(file, value) that gives the cgroup in ``cpu_dir`` the lowest CPU priority there is."""
    if (cpu_dir / IDLE_FILE).exists():
        return IDLE_FILE, "1"
    return LOWEST[version]


def open_leftover(report=None) -> tuple[ServerCgroup, str]:
    """A new generator cgroup at the lowest priority; (it, ``FILE = VALUE`` as written).
    The caller closes it (every exit path), as a server's."""
    group = ServerCgroup.open(None, None, report, label=LABEL)
    try:
        cpu_dir = group.directories.get("cpu") or group.directories[""]
        name, value = lowest_priority(cpu_dir, group.homes.version)
        try:
            with open(cpu_dir / name, "w") as f:
                f.write(value)
        except OSError as exc:
            raise StackError(f"cgroup {cpu_dir}: the kernel refused {name} = {value}: {exc.strerror}") from None
    except BaseException:
        group.close()
        raise
    return group, f"{name} = {value}"
