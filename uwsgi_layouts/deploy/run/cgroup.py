"""The app server's own cgroup: a CPU quota and a memory limit around its whole process tree, as
a container runtime sets them (Kubernetes ``limits.cpu``/``limits.memory``, ``docker run
--cpus/--memory``); nginx and the load generator stay outside.

``ServerCgroup.open(cpus, memory_mb)`` makes one cgroup (v2: one directory; v1: one per
controller: cpu, cpuacct where it is a mount of its own, memory) where ``deploy.machine.homes``
says, with the quota over the 100 ms period runtimes use and the memory limit, swap included where
the kernel accounts it (v1 ``memory.memsw`` at the same figure, v2 ``memory.swap.max`` 0), so the
limit is not dodged by swapping. The server joins it between
fork and exec (``join_files``: its pid into each ``cgroup.procs``, before it drops privileges),
so every worker it forks is inside. A limit the kernel refuses (a v1 quota above a parent's)
is bad input (LayoutError naming the field: one line, exit 2), and nothing is left behind.

Ownership, as deploy/run/netns.py does for namespaces: every name carries a random run id and
this process's pid, and a state file in /run/ul-cgroups/ records the owner (pid and start time)
and every directory *before* any is made. ``close`` (the stack's every exit path) kills what
still runs inside and removes the directories and the file. A run killed harder (SIGKILL)
leaves its state file; the next one removes exactly the directories recorded there once that
owner is gone (``clean_stale``), and says so.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from uwsgi_layouts.deploy.machine import CgroupReading, Homes, homes, read_v1, read_v2
from uwsgi_layouts.deploy.model import LayoutError, StackError
from uwsgi_layouts.deploy.run.owners import dead_owners, state_lock, write_state

STATE_DIR = Path("/run/ul-cgroups")
PREFIX = "ul-"
PERIOD_US = 100_000  # the CFS period Kubernetes and docker use
EMPTY_TIMEOUT_S = 5.0
SWAP_FILES = ("memory.memsw.limit_in_bytes", "memory.swap.max")


def _write(path: Path, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _pids(directory: Path) -> list[int]:
    try:
        return [int(x) for x in (directory / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def remove_cgroups(directories: list[str]) -> None:
    """Kill what still runs in each directory, then remove it once empty (the kernel refuses to
    remove a cgroup while a process, even a dying one, is in it: EBUSY)."""
    for text in directories:
        directory = Path(text)
        if not directory.is_dir():
            continue
        deadline = time.monotonic() + EMPTY_TIMEOUT_S
        while True:
            for pid in _pids(directory):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            try:
                directory.rmdir()
                break
            except OSError as exc:
                if exc.errno == errno.ENOENT:
                    break
                if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                    raise StackError(f"cgroup {directory} could not be removed: {exc.strerror}") from None
                time.sleep(0.02)  # polling interval while the killed processes are reaped


def clean_stale() -> list[str]:
    """Remove the cgroups of runs whose owner died; return what was removed (one line each)."""
    if os.geteuid() != 0 or not STATE_DIR.is_dir():  # only root makes cgroups (deploy.machine.homes)
        return []
    with state_lock(STATE_DIR):
        return _clean_stale()


def _clean_stale() -> list[str]:
    cleaned = []
    for path, state in dead_owners(STATE_DIR):
        name = f"{PREFIX}{state.get('id', '?')}-{state.get('pid', '?')}"
        directories = [d for d in state.get("directories", []) if Path(d).name == name]  # ours, nothing else
        remove_cgroups(directories)
        path.unlink(missing_ok=True)
        cleaned.append(f"removed cgroup {name} left by a run that died (pid {state.get('pid')}): "
                       f"{', '.join(directories) or 'already gone'}")
    return cleaned


def _limits(homes_: Homes, cpus: float | None, memory_mb: int | None) -> dict[str, list[tuple[str, str]]]:
    """controller -> [(file, value)] in the order they are written."""
    quota = str(round(cpus * PERIOD_US)) if cpus is not None else None
    memory = str(memory_mb * 1024 * 1024) if memory_mb is not None else None
    if homes_.version == 2:
        files = ([("cpu.max", f"{quota} {PERIOD_US}")] if quota else []) + \
            ([("memory.max", memory), ("memory.swap.max", "0")] if memory else [])
        return {"": files}
    return {"cpu": [("cpu.cfs_period_us", str(PERIOD_US))] + ([("cpu.cfs_quota_us", quota)] if quota else []),
            "memory": ([("memory.limit_in_bytes", memory), ("memory.memsw.limit_in_bytes", memory)] if memory else [])}


@dataclass
class ServerCgroup:
    """One app server's cgroup, owned by this process until ``close``."""

    homes: Homes
    run_id: str
    directories: dict[str, Path] = field(default_factory=dict)  # controller -> its directory
    cpus: float | None = None
    memory_mb: int | None = None
    owner: int = field(default_factory=os.getpid)  # in its name: the next run knows whose it was
    _state: Path | None = None

    @property
    def name(self) -> str:
        return f"{PREFIX}{self.run_id}-{self.owner}"

    @classmethod
    def open(cls, cpus: float | None, memory_mb: int | None, report=None, label: str = "") -> "ServerCgroup":
        """``label``: a word put in the name (``ul-LABEL-ID-PID``), so a reader (and the next run's
        cleanup line) sees what the cgroup was for."""
        if label and not label.isalpha():
            raise ValueError(f"label: letters only, got {label!r}")
        found, why = homes()
        if found is None:
            raise LayoutError("cpus" if cpus is not None else "memory", why)
        with state_lock(STATE_DIR):
            for line in _clean_stale():
                if report is not None:
                    report(line)
            run_id = f"{label}-{secrets.token_hex(3)}" if label else secrets.token_hex(3)
            group = cls(found, run_id, cpus=cpus, memory_mb=memory_mb)
            wanted = {c: Path(d) / group.name for c, d in found.parents if c != "memory" or memory_mb is not None}
            group._write_state([str(d) for d in wanted.values()])
        try:
            limits = _limits(found, cpus, memory_mb)
            for controller, directory in wanted.items():
                directory.mkdir(mode=0o755)
                group.directories[controller] = directory
                for name, value in limits.get(controller, []):
                    target = directory / name
                    if name in SWAP_FILES and not target.exists():
                        continue  # swap not accounted by this kernel: the memory limit holds alone
                    try:
                        _write(target, value)
                    except OSError as exc:  # bad input (exit 2): the limit does not fit here
                        raise LayoutError("memory" if name.startswith("memory") else "cpus",
                                          f"the kernel refused {name} = {value} in {directory}: {exc.strerror}"
                                          + (" (a parent cgroup's quota is smaller)" if name == "cpu.cfs_quota_us"
                                             and exc.errno == errno.EINVAL else "")) from None
        except BaseException:
            group.close()
            raise
        return group

    def _write_state(self, directories: list[str]) -> None:
        self._state = write_state(STATE_DIR, self.run_id, directories=directories)

    def describe(self) -> str:
        """One line: the limits and where they are (``1.5 CPUs, 512 MB in cgroup ul-...: DIRS``)."""
        limits = [f"{self.cpus:g} CPU{'s' if self.cpus != 1 else ''}" if self.cpus is not None else "",
                  f"{self.memory_mb} MB" if self.memory_mb is not None else ""]
        where = ", ".join(str(d) for d in self.directories.values())
        return f"{' and '.join(x for x in limits if x)} in cgroup {self.name} ({where})"

    @property
    def join_files(self) -> tuple[str, ...]:
        """The ``cgroup.procs`` files a child writes its pid into to enter (every controller)."""
        return tuple(str(d / "cgroup.procs") for d in self.directories.values())

    def pids(self) -> list[int]:
        first = next(iter(self.directories.values()), None)
        return _pids(first) if first is not None else []

    def reading(self) -> CgroupReading:
        """Its counters now (cumulative since it was made)."""
        if self.homes.version == 2:
            return read_v2(self.directories[""])
        cpu = self.directories["cpu"]
        return read_v1(cpu, self.directories.get("cpuacct", cpu), self.directories.get("memory"))

    def close(self) -> None:
        """Kill what still runs inside, remove every directory and the state file."""
        if self._state is None:
            return
        try:
            state = json.loads(self._state.read_text())
            directories = state["directories"]
        except (OSError, ValueError, KeyError):
            directories = [str(d) for d in self.directories.values()]
        remove_cgroups(directories)
        self._state.unlink(missing_ok=True)
        self._state = None
        self.directories = {}


def existing() -> list[str]:
    """This project's cgroups that exist now, under every home (for leak checks)."""
    found, _ = homes()
    if found is None:
        return []
    return sorted(str(p) for _, d in found.parents for p in Path(d).glob(f"{PREFIX}*") if p.is_dir())
