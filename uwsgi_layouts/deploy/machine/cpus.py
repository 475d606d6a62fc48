"""The CPUs this process may use: the smaller of its CPU affinity and the tightest CFS quota of
its cgroup and every ancestor, as a container runtime sets them (Kubernetes ``limits.cpu``,
``docker run --cpus``). ``os.cpu_count()`` counts the host's CPUs and ignores both, so a default
derived from it overloads a pod: 2 x 64 workers inside a 1-CPU quota on a 64-core node.

The quota is read from cgroup v2 ``cpu.max`` ("QUOTA PERIOD", or "max PERIOD": none) and from
cgroup v1 ``cpu.cfs_quota_us`` (-1: none) over ``cpu.cfs_period_us``, on whichever hierarchy
carries the cpu controller (both are read on a hybrid machine, and the tighter wins). A parent's
quota bounds its children, so every directory from this process's cgroup up to the hierarchy's
root counts. Reading takes a root directory (``/`` here; a fixture tree in tests) under which
``proc/self/cgroup`` and ``sys/fs/cgroup`` are found.

Inside a container with its own cgroup namespace ``/proc/self/cgroup`` says ``/`` and the
mount is the container's own cgroup; without one it names a path the mount does not hold (the
mount's root is the container's cgroup): then the longest tail of the path that exists under
the mount is taken, and the mount's root at worst.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

CGROUP_MOUNT = Path("sys/fs/cgroup")
# Where a hybrid machine mounts the v2 hierarchy beside the v1 controllers (systemd's choice).
HYBRID_UNIFIED = "unified"


@dataclass(frozen=True)
class CpuLimit:
    """What bounds this process's CPU: the host's CPUs, the CPUs of its affinity mask, and the
    tightest CFS quota along its cgroup path in CPUs (None: no quota), with the cgroup file that
    set it."""

    host: int
    affinity: int
    quota: float | None = None
    quota_source: str = ""

    def __post_init__(self):
        if self.host < 1 or self.affinity < 1:
            raise ValueError(f"host CPUs {self.host} and affinity {self.affinity} must be at least 1")
        if self.quota is not None and not self.quota > 0:
            raise ValueError(f"a CPU quota must be positive, got {self.quota}")

    @property
    def usable(self) -> float:
        """The CPUs this process may use, as a fraction (a 1.5-CPU quota is 1.5)."""
        return min(float(self.affinity), self.quota) if self.quota is not None else float(self.affinity)

    @property
    def whole(self) -> int:
        """``usable`` rounded up, at least 1: the count that replaces nproc in defaults (a 0.5-CPU
        pod still runs one process; a 1.5-CPU pod can keep two busy part of the time)."""
        return max(1, math.ceil(self.usable - 1e-9))

    def to_dict(self) -> dict:
        return {"host": self.host, "affinity": self.affinity, "quota": self.quota,
                "quota_source": self.quota_source, "usable": round(self.usable, 4)}


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def cgroup_paths(root: Path) -> dict[str, str]:
    """Controller (or "" for the v2 hierarchy) -> this process's cgroup path, from
    ``/proc/self/cgroup`` ("ID:CONTROLLERS:PATH" lines; v2's line is "0::PATH")."""
    out: dict[str, str] = {}
    for line in (_read(root / "proc/self/cgroup") or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if not controllers:
            out[""] = path
        for name in controllers.split(","):
            if name:
                out[name] = path
    return out


def v1_mount(root: Path, controller: str) -> Path | None:
    """The v1 mount holding ``controller`` (``cpu``, or ``cpu,cpuacct`` where they share one)."""
    base = root / CGROUP_MOUNT
    try:
        entries = sorted(p for p in base.iterdir() if p.is_dir() and not p.is_symlink())
    except OSError:
        return None
    return next((p for p in entries if controller in p.name.split(",") and p.name != HYBRID_UNIFIED), None)


def v2_mount(root: Path) -> Path | None:
    """The v2 hierarchy: the cgroup mount itself (unified) or its ``unified`` directory (hybrid)."""
    base = root / CGROUP_MOUNT
    for candidate in (base, base / HYBRID_UNIFIED):
        if (candidate / "cgroup.controllers").exists():
            return candidate
    return None


def own_dir(mount: Path, path: str) -> Path:
    """This process's cgroup directory under ``mount``: the path as /proc/self/cgroup gives it,
    else its longest tail that exists (a mount rooted at a container's cgroup), else the root."""
    parts = [p for p in path.split("/") if p]
    for start in range(len(parts) + 1):
        candidate = mount.joinpath(*parts[start:])
        if candidate.is_dir():
            return candidate
    return mount


def _ancestry(mount: Path, leaf: Path) -> list[Path]:
    """``leaf`` and every directory above it up to ``mount``, leaf first."""
    out = [leaf]
    while out[-1] != mount and mount in out[-1].parents:
        out.append(out[-1].parent)
    return out


def v2_quota(text: str | None) -> float | None:
    """``cpu.max``: "QUOTA PERIOD" -> QUOTA / PERIOD CPUs; "max PERIOD" (or unreadable) -> None."""
    parts = (text or "").split()
    if len(parts) != 2 or parts[0] == "max":
        return None
    try:
        quota, period = int(parts[0]), int(parts[1])
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def v1_quota(quota_text: str | None, period_text: str | None) -> float | None:
    """``cpu.cfs_quota_us`` over ``cpu.cfs_period_us``; -1 (or unreadable) -> None."""
    try:
        quota, period = int(quota_text or ""), int(period_text or "")
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def _tightest(found: list[tuple[float, str]]) -> tuple[float | None, str]:
    if not found:
        return None, ""
    return min(found, key=lambda entry: entry[0])


def cgroup_quota(root: Path | str = "/") -> tuple[float | None, str]:
    """The tightest CPU quota along this process's cgroup path (in CPUs) and the file that sets
    it (relative to ``root``), or (None, "")."""
    root = Path(root)
    paths = cgroup_paths(root)
    found: list[tuple[float, str]] = []
    v2 = v2_mount(root)
    if v2 is not None and "" in paths:
        for directory in _ancestry(v2, own_dir(v2, paths[""])):
            quota = v2_quota(_read(directory / "cpu.max"))
            if quota is not None:
                found.append((quota, str((directory / "cpu.max").relative_to(root))))
    v1 = v1_mount(root, "cpu")
    if v1 is not None and "cpu" in paths:
        for directory in _ancestry(v1, own_dir(v1, paths["cpu"])):
            quota = v1_quota(_read(directory / "cpu.cfs_quota_us"), _read(directory / "cpu.cfs_period_us"))
            if quota is not None:
                found.append((quota, str((directory / "cpu.cfs_quota_us").relative_to(root))))
    return _tightest(found)


def cpu_limit(root: Path | str = "/", affinity: set[int] | None = None, host: int | None = None) -> CpuLimit:
    """This process's CPU limit. ``affinity`` and ``host`` default to this process's
    (``os.sched_getaffinity``) and this machine's (``os.cpu_count``); tests pass their own."""
    host = host if host is not None else (os.cpu_count() or 1)
    cpus = affinity if affinity is not None else os.sched_getaffinity(0)
    quota, source = cgroup_quota(root)
    return CpuLimit(host=host, affinity=max(1, len(cpus)), quota=quota, quota_source=source)


def usable_cpus() -> float:
    """The CPUs this process may use, as a fraction: what replaces ``os.cpu_count()``."""
    return cpu_limit().usable


def default_cpus() -> int:
    """The whole CPUs this process may use (at least 1): what replaces nproc in defaults."""
    return cpu_limit().whole
