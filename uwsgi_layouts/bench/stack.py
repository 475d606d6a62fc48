"""The one stack lifecycle for experiments: a ``Lab`` hands out rendered stacks and cleans up.

Every experiment kind gets its stacks here:

    with Lab() as lab:                                   # one work dir under /tmp, mode 0711
        with lab.stack("2x4-mapped@aio=threads", transport="unix") as stack:
            ...                                          # started, polled until ready
        # stopped here; and everything the lab handed out is stopped and removed on close

``lab.stack(spec, **options)`` finds free loopback ports (``deploy.run.free_consecutive_ports``),
builds the layout from the spec and the options (``deploy.model.parse_variant``, then
``deploy.machine.checked``: a variant's own ``@option=value`` wins over ``options``), renders
it into its own run directory (``deploy.render.write_layout``: cross-checks and ``nginx -t``)
and returns a ``deploy.run.Stack``: used as a context manager it
starts uWSGI and nginx, polls until both are ready, and stops them on every exit path. What a
running stack shows (CPU, per-worker counts, logs) is read by ``bench.observe``.

The lab holds a lock on its work directory while it lives (``lab.lock``). Its stacks die with
it, even when it is killed with SIGKILL (deploy.run: PR_SET_PDEATHSIG); what outlives that
anyway (a process that could not act on the signal) is stopped by the next lab: it finds work
directories whose lab is gone, stops the process groups their stacks recorded, removes them,
and says so in one line each.

``Lab(hosts=N)`` runs every stack across network namespaces (``deploy.run.Net``: N app hosts
and a front on one bridge, made on first use and removed on close) with certificates made for
them in the lab's directory: each layout gets ``hosts``, ``uwsgi_tls_dir`` and a listen address on the
front (reached from here over the bridge), TLS by default (``@uwsgi_tls=off`` measures plain uwsgi,
allowed only inside those namespaces).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Callable, Protocol

from uwsgi_layouts.deploy.machine import checked
from uwsgi_layouts.deploy.model import Layout, parse_variant, variant_replicas
from uwsgi_layouts.deploy.render import write_layout
from uwsgi_layouts.deploy.run import DirLock, Net, Placement, Stack, free_consecutive_ports, holder, reap_orphans
from uwsgi_layouts.deploy.ship import make_certs

PORT_RANGE = (20000, 59999)
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
LAB_LOCK = "lab.lock"


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def reap_dead_labs(prefix: str, root: Path = Path("/tmp")) -> list[str]:
    """Work directories ``root/prefix*`` of ours whose lab is gone (its lock free): stop the process
    groups their stacks recorded, remove them. One line per directory that still ran something."""
    lines = []
    for work in sorted(root.glob(prefix + "*")):
        try:
            if work.is_symlink() or not work.is_dir() or work.stat().st_uid != os.geteuid():
                continue
            if not (work / LAB_LOCK).is_file() or holder(work, LAB_LOCK) is not None:
                continue  # another lab's (a live one, or one that predates the lock)
        except OSError:
            continue
        stopped = [line for record in sorted(work.glob("**/stack.json")) if (line := reap_orphans(record.parent))]
        shutil.rmtree(work, ignore_errors=True)
        if stopped:
            lines.append("; ".join(stopped) + " (a killed benchmark's work directory: removed)")
    return lines


def find_free_ports(n: int) -> list[int]:
    """``n`` free consecutive loopback ports below the kernel's ephemeral range."""
    return free_consecutive_ports(n, *PORT_RANGE)


def traversable_dir(path: Path) -> Path:
    """``path`` made enterable (not listable) by others: started as root, the stack runs as an
    unprivileged user, who must reach the run directories below it."""
    os.chmod(path, 0o711)
    return path


def dir_name(spec: str) -> str:
    """A layout label as a file name: ``2x4-mapped@aio=threads,sendfile=on`` ->
    ``2x4-mapped_aio-threads_sendfile-on``."""
    return spec.replace("@", "_").replace(",", "_").replace("=", "-")


class ConfPatch(Protocol):
    """An experiment-only edit of a rendered nginx.conf (see bench.faultkit.Patch)."""

    def apply(self, conf: Path, layout: Layout) -> None: ...


class Lab:
    """Where experiments run stacks: one short work directory (``/tmp/ul-bench-*``, mode 0711,
    so unix socket paths stay short and the run user can traverse it), free loopback ports, and
    every stack handed out. ``close`` (or leaving ``with``) stops those stacks and removes the
    directory. Tests hand in their own factories (``new_dir``: a fresh 0711 directory per call;
    ``free_ports(n)``), so their leak checks see the directories."""

    def __init__(self, new_dir: Callable[[], Path] | None = None,
                 free_ports: Callable[[int], list[int]] | None = None, prefix: str = "ul-bench-", hosts: int = 0):
        self._new_dir = new_dir
        self.free_ports = free_ports or find_free_ports
        self.prefix = prefix
        self._work_dir: Path | None = None
        self._own_work_dir = new_dir is None
        self._stacks: list[Stack] = []
        self.hosts = hosts
        self._net: Net | None = None
        self._tls_dir: Path | None = None
        self._lock: DirLock | None = None
        self._warned: set[str] = set()  # transports warned about

    @property
    def net(self) -> Net | None:
        """The namespaces (a front and ``hosts`` app hosts), made on first use; None without hosts."""
        if self.hosts and self._net is None:
            net = Net(hosts=self.hosts)
            net.__enter__()
            self._net = net
            self._tls_dir = make_certs(self.new_dir("certs") / "uwsgi_tls", net.host_addresses).directory
        return self._net

    @property
    def placement(self) -> Placement | None:
        return self.net.placement() if self.net else None

    @property
    def work_dir(self) -> Path:
        """The lab's directory, made on first use (scripts and request lists go here too)."""
        if self._work_dir is None:
            if self._new_dir:
                self._work_dir = self._new_dir()
            else:
                for line in reap_dead_labs(self.prefix):
                    say(line)
                self._work_dir = traversable_dir(Path(tempfile.mkdtemp(prefix=self.prefix, dir="/tmp")))
                self._lock = DirLock(self._work_dir, LAB_LOCK, what="a running benchmark").acquire()
        return self._work_dir

    def new_dir(self, name: str = "") -> Path:
        """A directory for one stack or app: ``work_dir/name`` when named (the same one again for
        the same name, e.g. a layout across repeats), else a fresh one."""
        if self._new_dir:
            return self._new_dir()
        if name:
            path = self.work_dir / name
            path.mkdir(exist_ok=True)
            return traversable_dir(path)
        return traversable_dir(Path(tempfile.mkdtemp(dir=self.work_dir)))

    def layout(self, spec: str, name: str = "", **options) -> Layout:
        """``spec`` (``PxT-STRATEGY[@option=value,...]``) with free ports and its own run directory."""
        # Only to count the ports: every replica's sockets (with --transport tcp) and the listen port;
        # each replica's stats server is a unix socket in its own run directory.
        replicas = variant_replicas(spec, options)
        n = len(parse_variant(spec.partition("@")[0], run_dir="/tmp/x").sockets) * replicas
        ports = self.free_ports(n + 1)
        options.setdefault("base_port", ports[0])
        if self.net:
            options.setdefault("hosts", self.net.host_addresses)
            options.setdefault("uwsgi_tls_dir", str(self._tls_dir))
            options.setdefault("listen", f"{self.net.front.address}:{ports[n]}")
        options.setdefault("listen", f"127.0.0.1:{ports[n]}")
        options.setdefault("run_dir", str(self.new_dir(name)))
        layout = checked(parse_variant(spec, **options))
        if layout.warnings and layout.transport not in self._warned:  # once per lab, not once per stack
            self._warned.add(layout.transport)
            say(f"warning: {layout.warnings[0]}")
        return layout

    def stack(self, spec: str, patch: ConfPatch | None = None, name: str = "", **options) -> Stack:
        """A rendered (cross-checked, ``nginx -t``'d) stack, not started: use it as a context
        manager. ``patch`` edits the rendered nginx.conf first (experiments only)."""
        layout = self.layout(spec, name=name, **options)
        placement = self.placement
        write_layout(layout, layout.run_dir, front_netns=placement.front if placement else "")
        if patch:
            patch.apply(Path(layout.run_dir) / "nginx.conf", layout)
        stack = Stack(layout, start_timeout=START_TIMEOUT_S, stop_timeout=STOP_TIMEOUT_S, placement=placement)
        self._stacks.append(stack)
        return stack

    def close(self) -> None:
        for stack in self._stacks:
            stack.stop()  # a no-op for a stack already stopped
        self._stacks.clear()
        if self._net is not None:
            self._net.close()
            self._net = None
        if self._own_work_dir and self._work_dir is not None:
            shutil.rmtree(self._work_dir, ignore_errors=True)
        if self._lock is not None:
            self._lock.release()
            self._lock = None
        self._work_dir = None

    def __enter__(self) -> "Lab":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
