"""Run a rendered layout: one app-server master (uWSGI, gunicorn or granian, + workers) per
app host (one on a single machine) and one nginx master (+ workers).

``Stack`` is a context manager that owns every process tree. Readiness is polled (uWSGI's
stats server says every worker is accepting; for a peer, its master has P live workers;
then nginx answers HTTP through to the app), never slept for. On every exit path every tree
is stopped: a polite signal, a bounded wait, then SIGKILL to the whole process group.
Children also get PR_SET_PDEATHSIG, so they die with us even if we are killed with SIGKILL.
Every process starts with a clean environment (deploy.machine.stack_environment), never ours.

A layout with ``hosts`` runs one uWSGI per host, each from its own directory
(``run_dir/hosts/ADDR``), and a ``Placement`` says which network namespace each part runs in
(``deploy.run.netns``; ``deploy.machine`` enters one between fork and exec, so the pid and its ownership are unchanged;
each host's loopback-only stats server is read from inside its namespace).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from deploy.machine import run_in, stack_environment, worker_environment
from deploy.model import Layout, StackError
from deploy.run.processes import child_setup, http_get, nginx_binary, read_stats, tail, terminate_group
from deploy.run.servers import Member, process_for


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
                 placement: Placement | None = None):
        self.layout = layout
        self.server = process_for(layout)
        self.run_dir = Path(layout.run_dir)
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.placement = placement or Placement()
        if layout.hosts:
            self.members = [Member(h, layout.host_layout(h), self.placement.hosts.get(h, "")) for h in layout.hosts]
        else:
            self.members = [Member("", layout)]
        self.nginx: subprocess.Popen | None = None
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
        self._wait(self._nginx_ready, "nginx", self.nginx_log)

    def _start_member(self, member: Member) -> None:
        member.log.parent.mkdir(parents=True, exist_ok=True)
        member.proc = self._spawn(self.server.command(member.layout), member.log, cwd=member.layout.run_dir,
                                  namespace=member.netns, env=worker_environment(member.layout),
                                  **self.server.spawn_options(member.layout))

    def stop(self) -> None:
        # nginx first, so no new request reaches an app server that is going away.
        if self.nginx is not None:
            terminate_group(self.nginx, self.stop_timeout)
            self.nginx = None
        for member in self.members:
            if member.proc is not None:
                terminate_group(member.proc, self.stop_timeout)
                member.proc = None

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
               **options) -> subprocess.Popen:
        log = open(log_path, "ab")
        try:
            # user/group (a peer started as the run user) are applied before preexec_fn runs,
            # so PDEATHSIG is set after the switch (changing credentials clears it).
            return subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                cwd=cwd or self.run_dir, preexec_fn=child_setup(namespace), **options,
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
        try:
            status, _, _ = run_in(self.placement.front, lambda: http_get(
                self.layout.listen_host, self.layout.listen_port, "/healthz", timeout=5))
        except OSError:
            return False
        # Any answer from the app proves nginx -> app server works (a user's app may 404 /healthz).
        return status not in (502, 503, 504)

    # --- inspection ---------------------------------------------------------------------

    def stats(self, host: str | None = None) -> dict:
        """uWSGI's stats server (per-worker pids, request counts...) of one app host (default:
        the first), read inside its namespace. Peers have none."""
        if not self.layout.has_stats:
            raise StackError(f"{self.server.label} has no stats server: use worker_pids() (and count requests "
                             "by the app's X-Worker-Pid header)")
        member = self.members[0] if host is None else self.member(host)
        return read_stats(member.layout.stats_address, namespace=member.netns)

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
