"""Run a rendered layout: one app-server master (uWSGI, gunicorn or granian, + workers) per
app host (one on a single machine) and one nginx master (+ workers).

``Stack`` is a context manager that owns every process tree. Readiness is polled (uWSGI's
stats server says every worker is accepting; for a peer, its master has P live workers;
then nginx answers HTTP through to the app), never slept for, and must come from the
processes it started: the stats server's master pid is ours, nginx wrote its pid file (it
binds its listen address before that). A listen, stats or TCP socket port already taken fails
at once, with one line naming it. On every exit path every tree is stopped: a polite signal,
a bounded wait, then SIGKILL to the whole process group. Children also get PR_SET_PDEATHSIG
(set after they became the run user), so they die with us even if we are killed with SIGKILL;
the run directory is locked while the stack lives and records its process groups, so what
outlives that anyway is stopped by the next stack there (deploy/run/ownership.py). Every
process starts with a clean environment (deploy.machine.stack_environment), never ours.

A layout with ``cpus`` or ``memory`` runs each app host's server in a cgroup of its own with that
CPU quota and memory limit (``deploy.run.cgroup``: made before the server starts, joined by it
between fork and exec, removed when the stack stops; a SIGKILLed stack's is removed by the next
stack, which says so); nginx stays outside.

A layout with ``hosts`` runs one uWSGI per host, each from its own directory
(``run_dir/hosts/ADDR``), and a ``Placement`` says which network namespace each part runs in
(``deploy.run.netns``; ``deploy.machine`` enters one between fork and exec, so the pid and its ownership are unchanged;
each host's loopback-only stats server is read from inside its namespace).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import psutil

from uwsgi_layouts.deploy.machine import CgroupReading, read_stats, run_in, stack_environment, worker_environment
from uwsgi_layouts.deploy.model import Layout, StackError, replica_name, server_layouts
from uwsgi_layouts.deploy.run.cgroup import ServerCgroup, clean_stale
from uwsgi_layouts.deploy.run.ownership import DirLock, claim, forget, record
from uwsgi_layouts.deploy.run.processes import child_setup, http_get, nginx_binary, tail, terminate_group
from uwsgi_layouts.deploy.run.replicas import summed_readings
from uwsgi_layouts.deploy.run.servers import Member, process_for
from uwsgi_layouts.deploy.run.weight import weigh


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Placement:
    """Which network namespace each part of a stack runs in ("" = this one): the front (nginx)
    and each app host, by address."""

    front: str = ""
    hosts: dict[str, str] = field(default_factory=dict)


class Stack:
    """One app server (``layout.server``: uWSGI, gunicorn or granian) and one nginx, as a
    context manager. What differs per server (its command, how to drop privileges, when its
    workers are ready, who they are) is its ``deploy.run.servers.ServerProcess``; the lifecycle
    is this."""

    def __init__(self, layout: Layout, start_timeout: float = 30.0, stop_timeout: float = 10.0,
                 placement: Placement | None = None, lock: DirLock | None = None,
                 report: Callable[[str], None] = say):
        """``lock``: the run directory's lock, already held by the caller (``deploy run`` takes it
        before it writes the files); else the stack takes it when it starts and drops it when it
        stops. ``report``: where one-line notices go (an orphaned stack stopped)."""
        self.layout = layout
        self.lock = lock
        self._own_lock = lock is None
        self.report = report
        self.server = process_for(layout)
        self.run_dir = Path(layout.run_dir)
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.placement = placement or Placement()
        if layout.hosts:
            self.members = [Member(h, layout.host_layout(h), self.placement.hosts.get(h, "")) for h in layout.hosts]
        else:  # one app server, or one per replica (replica-N: its own run dir, sockets, stats and cgroup)
            self.members = [Member(replica_name(n) if layout.replicas > 1 else "", own)
                            for n, (_, own) in enumerate(server_layouts(layout), 1)]
        self.nginx: subprocess.Popen | None = None
        # Each app host's cgroup (by host), with the layout's cpus/memory limit: made when its
        # server starts, removed when the stack stops.
        self.cgroups: dict[str, ServerCgroup] = {}
        self.nginx_log = self.run_dir / "logs" / "error.log"

    @property
    def app(self) -> subprocess.Popen | None:
        """The (first) app server's master."""
        return self.members[0].proc

    @property
    def app_log(self) -> Path:
        return self.members[0].log

    def member(self, host: str) -> Member:
        found = next((m for m in self.members if m.host == host), None)
        if found is None:
            raise StackError(f"{host!r} is not an app host of this stack ({', '.join(m.host for m in self.members)})")
        return found

    # Names from before the peers, when the app server was always uWSGI.
    @property
    def uwsgi(self) -> subprocess.Popen | None:
        return self.app

    @property
    def uwsgi_log(self) -> Path:
        return self.app_log

    # --- lifecycle --------------------------------------------------------------------

    def __enter__(self) -> "Stack":
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        self.server.check_installed()  # one line saying how to install it, before anything starts
        if self.lock is None:
            self.lock = claim(self.run_dir)  # refused if another stack lives here; stops a dead one's orphans
            if self.lock.reaped:
                self.report(self.lock.reaped)
        self._check_ports()
        for line in clean_stale():  # cgroups of a stack that was SIGKILLed
            self.report(line)
        for member in self.members:
            self._start_member(member)
        self._wait(lambda: self.server.ready(self.members), self.server.label, self.app_log)
        nginx_cmd = [
            nginx_binary(), "-p", f"{self.run_dir}/", "-c", str(self.run_dir / "nginx.conf"),
            "-e", str(self.nginx_log), "-g", "daemon off;",
        ]
        (self.run_dir / "logs").mkdir(parents=True, exist_ok=True)
        self.nginx = self._spawn(nginx_cmd, self.run_dir / "logs" / "nginx.out", namespace=self.placement.front,
                                 env=stack_environment(self.layout))
        self._record()
        self._wait(self._nginx_ready, "nginx", self.nginx_log)

    def _start_member(self, member: Member) -> None:
        member.log.parent.mkdir(parents=True, exist_ok=True)
        limited = member.layout.cpus is not None or member.layout.memory is not None
        if limited and member.host not in self.cgroups:
            self.cgroups[member.host] = ServerCgroup.open(member.layout.cpus, member.layout.memory, self.report)
            weigh(self.cgroups[member.host], self.layout.replicas)  # R replicas weigh what one server does
        cgroup = self.cgroups.get(member.host)
        member.proc = self._spawn(self.server.command(member.layout), member.log, cwd=member.layout.run_dir,
                                  namespace=member.netns, run_as=self.server.run_as(member.layout),
                                  death_signal=self.server.death_signal, env=worker_environment(member.layout),
                                  cgroup_files=cgroup.join_files if cgroup else ())
        self._record()

    def _record(self) -> None:
        """The process groups started so far, for the next stack here if these outlive us."""
        record(self.run_dir, [(name, proc.pid) for name, proc, _ in self._processes() if proc is not None])

    def stop(self) -> None:
        # nginx first, so no new request reaches an app server that is going away.
        if self.nginx is not None:
            terminate_group(self.nginx, self.stop_timeout)
            self.nginx = None
        for member in self.members:
            if member.proc is not None:
                terminate_group(member.proc, self.stop_timeout)
                member.proc = None
        try:
            for cgroup in self.cgroups.values():  # whatever escaped the process group is killed inside
                cgroup.close()
        finally:
            self.cgroups = {}
            self._release()

    def _release(self) -> None:
        if self.lock is not None and self.lock.held:
            forget(self.run_dir)
            if self._own_lock:
                self.lock.release()
                self.lock = None

    # --- ports: taken ones fail at once, naming who holds them -----------------------------

    def _bound_addresses(self) -> list[tuple[str, str, str, int]]:
        """(what, namespace, host, port) of every TCP port the stack will listen on."""
        layout = self.layout
        out = [("listen", self.placement.front, layout.listen_host, layout.listen_port)]
        for m in self.members:
            where = f" of {m.host}" if len(self.members) > 1 else ""
            if m.layout.has_stats and m.layout.stats_port:
                host, _, port = m.layout.stats_address.rpartition(":")
                out.append((f"stats_port{where}", m.netns, host, int(port)))
            for s in m.layout.host_sockets(m.layout.app_hosts[0]) if m.layout.transport == "tcp" else ():
                host, _, port = s.address.rpartition(":")
                out.append((f"base_port{where} ({self.server.label} socket {s.index})", m.netns, host, int(port)))
        return out

    def _check_ports(self) -> None:
        for what, namespace, host, port in self._bound_addresses():
            if run_in(namespace, lambda h=host, p=port: port_taken(h, p)):
                who = "" if namespace else listener_of(port)
                raise StackError(f"{what}: port {port} on {host} is already in use{who}: stop that process or choose "
                                 f"another --{what.split()[0].replace('_', '-')}")

    # --- one host of several: its faults -------------------------------------------------

    def kill_host(self, host: str, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to every process of one host's app server (SIGKILL: the host's uWSGI is
        gone at once, as when its machine fails; its sockets then refuse connections)."""
        member = self.member(host)
        if member.proc is None:
            return
        try:
            os.killpg(member.proc.pid, sig)
        except ProcessLookupError:
            pass
        if sig == signal.SIGKILL:
            member.proc.wait(timeout=self.stop_timeout)
            member.proc = None

    def start_host(self, host: str) -> None:
        """Start one host's app server again and poll until its workers accept."""
        member = self.member(host)
        if member.proc is not None and member.proc.poll() is None:
            raise StackError(f"the app server of {host} is still running")
        self._start_member(member)
        self._wait(lambda: self.server.member_ready(member), f"{self.server.label} on {host}", member.log)

    def host_stats(self) -> dict[str, dict]:
        """Each app host's uWSGI stats, by host address ("" on a single machine)."""
        return {m.host: self.stats(m.host) for m in self.members}

    def _spawn(self, cmd: list[str], log_path: Path, cwd: str | Path | None = None, namespace: str = "",
               run_as: tuple[int, int, list[int]] | None = None, death_signal: int = signal.SIGTERM,
               env: dict[str, str] | None = None, cgroup_files: tuple[str, ...] = ()) -> subprocess.Popen:
        log = open(log_path, "ab")
        try:
            # The child switches to the run user before it arms PDEATHSIG (a switch clears it).
            return subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=cwd or self.run_dir,
                env=env, preexec_fn=child_setup(namespace, run_as, death_signal, cgroup_files),
            )
        finally:
            log.close()

    def _processes(self, nginx_log: Path | None = None):
        """(name, process, log) of every process started so far."""
        several = len(self.members) > 1
        for m in self.members:
            yield (f"{self.server.label} on {m.host}" if several else self.server.label), m.proc, m.log
        yield "nginx", self.nginx, nginx_log or self.nginx_log

    def _wait(self, ready, what: str, log: Path) -> None:
        deadline = time.monotonic() + self.start_timeout
        delay = 0.02
        while True:
            # Every process started so far: a peer whose workers fail to load the app exits
            # while nginx is being polled (its master was up with P workers a moment before).
            for name, proc, its_log in self._processes(log):
                if proc is not None and proc.poll() is not None:
                    # 40 lines: a peer's master may print its own traceback after the worker's.
                    raise StackError(f"{name} exited with code {proc.returncode} while starting", tail(its_log, 40))
            if ready():
                return
            if time.monotonic() > deadline:
                raise StackError(f"{what} not ready after {self.start_timeout:.0f} s", tail(log))
            time.sleep(delay)  # polling interval, not a readiness guess
            delay = min(delay * 1.5, 0.25)

    def _nginx_ready(self) -> bool:
        # Our nginx writes its pid file only once it has bound its listen address: before that,
        # whatever answers on the port is someone else.
        try:
            if self.nginx is None or int((self.run_dir / "nginx.pid").read_text().strip()) != self.nginx.pid:
                return False
        except (OSError, ValueError):
            return False
        try:
            status, headers, _ = run_in(self.placement.front, lambda: http_get(
                self.layout.listen_host, self.layout.listen_port, "/healthz", timeout=5))
        except OSError:
            return False
        # An app that names its worker (the demo app does) must name one of ours.
        worker = headers.get("x-worker-pid", "")
        if worker.isdigit() and int(worker) not in self._app_tree():
            return False
        # Any answer from the app proves nginx -> app server works (a user's app may 404 /healthz).
        return status not in (502, 503, 504)

    def _app_tree(self) -> set[int]:
        pids = set()
        for m in self.members:
            if m.proc is None:
                continue
            try:
                pids |= {m.proc.pid, *(c.pid for c in psutil.Process(m.proc.pid).children(recursive=True))}
            except psutil.Error:
                continue
        return pids

    # --- inspection ---------------------------------------------------------------------

    def stats(self, host: str | None = None) -> dict:
        """uWSGI's stats server (per-worker pids, request counts...) of one app host (default:
        the first), read inside its namespace. Peers have none."""
        if not self.layout.has_stats:
            raise StackError(f"{self.server.label} has no stats server: use worker_pids() (and count requests "
                             "by the app's X-Worker-Pid header)")
        member = self.members[0] if host is None else self.member(host)
        return read_stats(member.layout.stats_address, namespace=member.netns)

    def cgroup_reading(self, host: str | None = None) -> CgroupReading | None:
        """The counters of one app host's cgroup (default: the first; with replicas, every
        replica's summed, as a Deployment's pods add up): CPU used, periods, throttling, OOM
        kills, cumulative since it was made; None without a cpus/memory limit."""
        if host is None and self.layout.replicas > 1:
            readings = [cgroup.reading() for cgroup in self.cgroups.values()]
            return summed_readings(readings) if readings else None
        cgroup = self.cgroups.get(self.members[0].host if host is None else host)
        return cgroup.reading() if cgroup is not None else None

    def worker_pids(self) -> dict[int, int]:
        """Worker number (from 1) -> pid. uWSGI: its worker ids; peers: the master's live
        children in the order they started (a respawned worker takes the last number)."""
        return self.server.worker_pids(self.members)

    @property
    def pids(self) -> dict[str, int]:
        """Master pids: "app" and the server's name (e.g. "uwsgi") for the app server, "nginx"."""
        out = {}
        if self.app is not None:
            out |= {"app": self.app.pid, self.server.name: self.app.pid}
        for m in self.members[1:]:
            if m.proc is not None:
                out[f"{self.server.name}@{m.host}"] = m.proc.pid
        if self.nginx is not None:
            out["nginx"] = self.nginx.pid
        return out

    @property
    def app_pids(self) -> list[int]:
        """Every running app server master (one per host)."""
        return [m.proc.pid for m in self.members if m.proc is not None]

    def check_alive(self) -> None:
        for name, proc, log in self._processes():
            if proc is not None and proc.poll() is not None:
                raise StackError(f"{name} exited unexpectedly with code {proc.returncode}", tail(log))


def port_taken(host: str, port: int) -> bool:
    """Does a listening socket hold ``host:port``? (SO_REUSEADDR, as nginx and uWSGI bind: a
    port with only TIME_WAIT connections left is free.)"""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return True
    return False


def listener_of(port: int) -> str:
    """" (pid N: NAME)" for the process listening on ``port`` here, if it can be seen."""
    try:
        for conn in psutil.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
                return f" (pid {conn.pid}: {psutil.Process(conn.pid).name()})"
    except psutil.Error:
        pass
    return ""
