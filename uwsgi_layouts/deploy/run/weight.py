"""The CPU weight of the app server's cgroup, as Kubernetes gives a container one from its CPU
request: ``cpu.shares`` = CPUs x 1024 (v1), ``cpu.weight`` from those shares (v2, kubelet's
conversion). A CFS quota caps a cgroup; the weight decides its share when the machine is
contended. Left at the kernel's default (1024, or 100 on v2) every cgroup weighs one task, so on a
busy machine R replicas of 1/R CPU each would get R times the CPU of one pod of the same total
quota (measured here: 4 x 0.5 CPU against 1 x 2 CPUs, with other jobs on the cores), and a
comparison at equal total CPU would not be one. With the weight proportional to the quota, as
on a Kubernetes node with requests = limits, pods of equal total CPU weigh the same.
"""

from __future__ import annotations

from uwsgi_layouts.deploy.model import StackError
from uwsgi_layouts.deploy.run.cgroup import ServerCgroup

SHARES_PER_CPU = 1024
MIN_SHARES, MAX_SHARES = 2, 262144  # the kernel's cpu.shares bounds (v1)


def shares(cpus: float) -> int:
    """cpu.shares for a CPU request, as the kubelet computes it (milli-CPUs x 1024 / 1000)."""
    return min(MAX_SHARES, max(MIN_SHARES, round(cpus * SHARES_PER_CPU)))


def weight_v2(cpu_shares: int) -> int:
    """cgroup v2's cpu.weight (1..10000) for v1 shares: the kubelet's CPUSharesToCPUWeight."""
    return 1 + ((cpu_shares - 2) * 9999) // 262142


def weigh(cgroup: ServerCgroup, cpus: float | None) -> None:
    """Set the cgroup's CPU weight from its quota (nothing without one)."""
    if cpus is None:
        return
    if cgroup.homes.version == 2:
        target, value = cgroup.directories[""] / "cpu.weight", weight_v2(shares(cpus))
    else:
        target, value = cgroup.directories["cpu"] / "cpu.shares", shares(cpus)
    try:
        with open(target, "w") as f:
            f.write(str(value))
    except OSError as exc:
        raise StackError(f"cgroup {target.parent}: the kernel refused {target.name} = {value}: "
                         f"{exc.strerror}") from None
