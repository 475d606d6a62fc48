"""Where this machine lets us put an app server under a CPU quota and a memory limit, whether a
layout's limit fits this machine, and what a cgroup's files say (CPU used, throttling, OOM
kills). It reads; making, filling and removing the cgroup is ``deploy/run/cgroup.py``'s.

Two layouts of the cgroup filesystem exist. v2 (most distributions today): one hierarchy, a
cgroup's ``cpu.max``, ``memory.max``, ``cpu.stat`` (``usage_usec``, ``nr_periods``,
``nr_throttled``, ``throttled_usec``) and ``memory.events`` (``oom_kill``); a new cgroup goes
under the hierarchy's root, whose ``cgroup.subtree_control`` must hand down cpu and memory (the
root is the one cgroup that may hold processes and children with controllers at once). v1 (and
hybrid machines, with v1 controllers beside an empty v2): one mount per controller, a cgroup's
``cpu.cfs_quota_us``/``cpu.cfs_period_us`` and ``cpu.stat`` (``nr_periods``, ``nr_throttled``,
``throttled_time`` in ns), CPU used in the cpuacct controller (``cpuacct.usage``, ns; the same
directory where cpu and cpuacct share a mount), ``memory.limit_in_bytes`` and
``memory.oom_control`` (``oom_kill``); a new cgroup goes under this process's own cgroup of each
controller, so it stays inside whatever limits this process already lives in.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from uwsgi_layouts.deploy.machine.cpus import cgroup_paths, cpu_limit, own_dir, v1_mount, v2_mount
from uwsgi_layouts.deploy.model import Layout, LayoutError

V1_CONTROLLERS = ("cpu", "cpuacct", "memory")
NEEDED = ("the cgroup cpu controller writable by this process (root, with cgroup v2's cpu controller enabled at its "
          "root's cgroup.subtree_control, or cgroup v1's cpu controller mounted)")


@dataclass(frozen=True)
class Homes:
    """Where a new cgroup is made: v2, one parent directory (key ""); v1, one per controller
    (cpu, cpuacct, memory), deduplicated where controllers share a mount."""

    version: int
    parents: tuple[tuple[str, str], ...]  # (controller, directory)

    def __post_init__(self):
        if self.version not in (1, 2) or not self.parents:
            raise ValueError(f"cgroup v{self.version} with parents {self.parents!r}")

    memory: bool = True  # the memory controller is there too (v2: handed down by the root)

    def parent(self, controller: str) -> Path | None:
        return next((Path(d) for c, d in self.parents if c == controller), None)


def homes(root: Path | str = "/") -> tuple[Homes | None, str]:
    """Where this process can make a cgroup with a CPU quota (and memory limit), or (None, why
    not, one line)."""
    root = Path(root)
    if os.geteuid() != 0 and str(root) == "/":
        return None, f"a CPU limit needs root: {NEEDED}"
    paths = cgroup_paths(root)
    v2 = v2_mount(root)
    if v2 is not None and "cpu" in (_read(v2 / "cgroup.controllers") or "").split():
        delegated = (_read(v2 / "cgroup.subtree_control") or "").split()
        if "cpu" not in delegated:
            return None, (f"{v2}/cgroup.subtree_control does not enable cpu (its children get no quota): {NEEDED}")
        return Homes(2, (("", str(v2)),), memory="memory" in delegated), ""
    v1 = v1_mount(root, "cpu")
    if v1 is None or "cpu" not in paths:
        return None, f"no cgroup cpu controller is mounted here: {NEEDED}"
    parents: list[tuple[str, str]] = []
    seen: set[Path] = set()
    for controller in V1_CONTROLLERS:
        mount = v1_mount(root, controller)
        if mount is None or controller not in paths:
            continue
        parent = own_dir(mount, paths[controller])
        if parent in seen:  # cpu,cpuacct share one directory
            continue
        seen.add(parent)
        if not os.access(parent, os.W_OK):
            if controller == "cpu":
                return None, f"{parent} is not writable: {NEEDED}"
            continue
        parents.append((controller, str(parent)))
    return Homes(1, tuple(parents), memory=any(c == "memory" for c, _ in parents)), ""


def check_limits(layout: Layout, root: Path | str = "/") -> None:
    """A layout's ``cpus`` within this machine's CPUs, and a place to enforce it (LayoutError)."""
    if layout.cpus is None and layout.memory is None:
        return
    host = cpu_limit(root).host
    if layout.cpus is not None and layout.cpus > host:
        raise LayoutError("cpus", f"{layout.cpus:g} is more than this machine's {host} CPUs; give at most {host}")
    found, why = homes(root)
    if found is None:
        raise LayoutError("cpus" if layout.cpus is not None else "memory", why)
    if layout.memory is not None and not found.memory:
        raise LayoutError("memory", "needs the cgroup memory controller writable by this process (cgroup v1's "
                                    "memory controller mounted, or cgroup v2's enabled at its root's "
                                    "cgroup.subtree_control)")


# --- what a cgroup's files say -----------------------------------------------------------------


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def keyed(text: str | None) -> dict[str, int]:
    """``KEY VALUE`` lines (cpu.stat, memory.events, memory.oom_control) -> {key: value}."""
    out = {}
    for line in (text or "").splitlines():
        key, _, value = line.partition(" ")
        if value.strip().lstrip("-").isdigit():
            out[key] = int(value)
    return out


@dataclass(frozen=True)
class CgroupReading:
    """One reading of a cgroup's counters, cumulative since it was made: CPU periods, the
    throttled ones, time throttled and CPU used (s), OOM kills. Deltas between two readings are
    a cell's."""

    periods: int
    throttled_periods: int
    throttled_s: float
    cpu_s: float
    oom_kills: int

    def __post_init__(self):
        if min(self.periods, self.throttled_periods, self.oom_kills) < 0 or self.throttled_s < 0 or self.cpu_s < 0:
            raise ValueError(f"a cgroup's counters are never negative: {self}")

    def since(self, earlier: "CgroupReading") -> "CgroupReading":
        return CgroupReading(self.periods - earlier.periods, self.throttled_periods - earlier.throttled_periods,
                             round(self.throttled_s - earlier.throttled_s, 6), round(self.cpu_s - earlier.cpu_s, 6),
                             self.oom_kills - earlier.oom_kills)


def read_v2(directory: Path) -> CgroupReading:
    stat = keyed(_read(directory / "cpu.stat"))
    events = keyed(_read(directory / "memory.events"))
    return CgroupReading(stat.get("nr_periods", 0), stat.get("nr_throttled", 0), stat.get("throttled_usec", 0) / 1e6,
                         stat.get("usage_usec", 0) / 1e6, events.get("oom_kill", 0))


def read_v1(cpu: Path, cpuacct: Path | None, memory: Path | None) -> CgroupReading:
    stat = keyed(_read(cpu / "cpu.stat"))
    usage_ns = int((_read(cpuacct / "cpuacct.usage") or "0").strip() or 0) if cpuacct is not None else 0
    oom = keyed(_read(memory / "memory.oom_control")) if memory is not None else {}
    return CgroupReading(stat.get("nr_periods", 0), stat.get("nr_throttled", 0), stat.get("throttled_time", 0) / 1e9,
                         usage_ns / 1e9, oom.get("oom_kill", 0))
