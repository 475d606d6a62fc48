"""The CPU weight of each replica's cgroup (``@replicas=R``): together the R replicas weigh what
one app server's cgroup weighs (the kernel's default: ``cpu.shares`` 1024 on v1, ``cpu.weight``
100 on v2), so each gets 1/R of it.

A CFS quota caps a cgroup; the weight decides its share when the machine is contended. Left at
the default, every cgroup weighs one task: on a busy machine R replicas would get about R times
the CPU of one pod of the same total quota (measured here, other jobs on the cores: 4 x 0.5 CPU
served ~3-4x the requests of 1 x 2 CPUs, with the quota never reached), and a comparison at
equal total CPU would not be one. (A Kubernetes node weighs each container by its CPU request,
CPUs x 1024; one app server keeps the kernel's default here, as the stack always gave it.)
"""

from __future__ import annotations

from uwsgi_layouts.deploy.model import StackError
from uwsgi_layouts.deploy.run.cgroup import ServerCgroup

DEFAULT_SHARES = 1024  # cgroup v1 cpu.shares of a new cgroup
DEFAULT_WEIGHT = 100  # cgroup v2 cpu.weight of a new cgroup
MIN_SHARES = 2  # the kernel's floor (v1); v2's is 1


def replica_shares(replicas: int) -> int:
    return max(MIN_SHARES, round(DEFAULT_SHARES / replicas))


def replica_weight(replicas: int) -> int:
    return max(1, round(DEFAULT_WEIGHT / replicas))


def weigh(cgroup: ServerCgroup, replicas: int) -> None:
    """Give one of ``replicas`` replicas' cgroups its share of one server's weight (nothing for one)."""
    if replicas == 1:
        return
    if cgroup.homes.version == 2:
        target, value = cgroup.directories[""] / "cpu.weight", replica_weight(replicas)
    else:
        target, value = cgroup.directories["cpu"] / "cpu.shares", replica_shares(replicas)
    try:
        with open(target, "w") as f:
            f.write(str(value))
    except OSError as exc:
        raise StackError(f"cgroup {target.parent}: the kernel refused {target.name} = {value}: "
                         f"{exc.strerror}") from None
