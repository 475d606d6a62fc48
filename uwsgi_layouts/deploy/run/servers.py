"""App servers' processes: how ``Stack`` starts uWSGI, gunicorn and granian, when their
workers are up and who they are. (Their config files are ``deploy.render.servers``'.)

The lifecycle (process group, PDEATHSIG, SIGTERM then SIGKILL, readiness by polling, nginx)
is ``deploy.run.stack.Stack``'s, one for all servers; ``process_for(layout)`` returns what
differs per server: the command and how it is spawned (``command``, ``run_as``,
``death_signal``), when its workers are ready (``ready``: as answered by the processes this
stack started, never by whoever else holds the port) and who they are (``worker_pids``).

Peers run in the app's own interpreter (its virtualenv's ``bin/python``, as uWSGI's
``virtualenv =``) through ``deploy/run/peer_launch.py``, which takes only the server's packages
from our venv; so does pyuwsgi, our default uWSGI, through
``deploy/run/pyuwsgi_launch.py``. Started as root, Stack starts every app server already as the run user (uWSGI
included: its master never changes credentials, which would clear its parent-death signal);
they bind loopback ports above 1024 or unix sockets in a directory that user owns, and read
only files that user can read, so they never need root.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import psutil

from uwsgi_layouts.deploy.machine import pyuwsgi_site, read_stats, run_user_ids, server_package_dir
from uwsgi_layouts.deploy.model import Layout, StackError
from uwsgi_layouts.deploy.render import SERVERS, Granian, Gunicorn, ServerConfig
from uwsgi_layouts.deploy.run.processes import uwsgi_binary

LAUNCHER = Path(__file__).resolve().parent / "peer_launch.py"
PYUWSGI_LAUNCHER = Path(__file__).resolve().parent / "pyuwsgi_launch.py"
INSTALL_PEERS = "it is a dependency of uwsgi-layouts: reinstall it (in a checkout: make venv)"


@dataclass
class Member:
    """One app host's server: its layout (a host's own view with ``hosts``), namespace, process."""

    host: str
    layout: Layout
    netns: str = ""
    proc: subprocess.Popen | None = None

    @property
    def log(self) -> Path:
        return Path(self.layout.run_dir) / "logs" / f"{self.layout.server}.log"


class ServerProcess:
    # What the server gets when the stack's own process dies (PR_SET_PDEATHSIG): a stop.
    death_signal = signal.SIGTERM

    def __init__(self, config: ServerConfig):
        self.config = config  # its config file and names (deploy.render.servers)

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def label(self) -> str:
        return self.config.label

    def check_installed(self) -> None:
        """Raise StackError with one line saying how to install the server, if it is missing."""

    def command(self, layout: Layout) -> list[str]:
        raise NotImplementedError

    def run_as(self, layout: Layout) -> tuple[int, int, list[int]] | None:
        """(uid, gid, groups) the server is started as: the run user when started as root (the
        whole server, master included, with that user's groups only), else None (as we are)."""
        if not layout.drops_privileges:
            return None
        uid, gid, _ = run_user_ids(layout.user)
        return uid, gid, os.getgrouplist(layout.user, gid)

    def ready(self, members: list[Member]) -> bool:
        """Every app host's server is up, its workers loaded and accepting."""
        raise NotImplementedError

    def member_ready(self, member: Member) -> bool:
        """One app host's server is ready (a peer runs on one machine only: the whole stack)."""
        return self.ready([member])

    def worker_pids(self, members: list[Member]) -> dict[int, int]:
        """Worker number (from 1) -> pid, of the first app host's server."""
        raise NotImplementedError


class UWSGIProcess(ServerProcess):
    # SIGINT stops uWSGI whatever die-on-term says (SIGTERM without it is a reload, which would
    # keep a master running for nobody).
    death_signal = signal.SIGINT

    def command(self, layout):
        binary = layout.uwsgi_bin or uwsgi_binary()
        ini = str(self.config.config_path(layout))
        site = pyuwsgi_site(Path(binary))
        if site is None:  # a uWSGI binary: it embeds libpython and reads virtualenv = itself
            return [binary, "--ini", ini]
        # pyuwsgi (make venv's default): the app's virtualenv's python runs uWSGI, so the app's Python
        # is the python3 executable and its packages the virtualenv's. binary-path: a full reload
        # (SIGHUP) re-executes that interpreter, not /proc/self/exe's python3, which has no venv.
        python = python_for(layout)
        return [python, str(PYUWSGI_LAUNCHER), str(site), "--binary-path", python, "--ini", ini]

    def run_as(self, layout):
        # With TLS the master reads the host's private key as root and keeps root (master-as-root,
        # templates/uwsgi/_control.j2); its workers drop to the run user themselves.
        return None if layout.uwsgi_tls != "off" else super().run_as(layout)

    def ready(self, members):
        return all(self.member_ready(m) for m in members)

    def member_ready(self, member):
        try:
            stats = read_stats(member.layout.stats_address, namespace=member.netns)
            workers = stats["workers"]
        except (OSError, ValueError, KeyError):
            return False
        # The stats server that answered must be our master's, not another uWSGI on that port.
        if member.proc is None or stats.get("pid") != member.proc.pid:
            return False
        return len(workers) == member.layout.processes and all(
            w.get("pid", 0) > 0 and w.get("accepting") == 1 for w in workers
        )

    def worker_pids(self, members):
        first = members[0]
        return {w["id"]: w["pid"] for w in read_stats(first.layout.stats_address, namespace=first.netns)["workers"]}


def python_for(layout: Layout) -> str:
    """The interpreter a peer runs the app with: the app's virtualenv's, else ours."""
    return str(Path(layout.virtualenv) / "bin" / "python") if layout.virtualenv else sys.executable


class PeerProcess(ServerProcess):
    def check_installed(self):
        if server_package_dir(self.config.package) is None:
            raise StackError(f"{self.name} is not installed in {sys.prefix}: {INSTALL_PEERS}")

    def site(self) -> Path:
        self.check_installed()
        return server_package_dir(self.config.package).parent

    def command(self, layout):
        return [python_for(layout), str(LAUNCHER), self.name, str(self.site()),
                str(self.config.config_path(layout))]

    def _workers(self, member: Member) -> list[psutil.Process]:
        """The master's live children, oldest first."""
        if member.proc is None:
            return []
        try:
            children = psutil.Process(member.proc.pid).children()
        except psutil.Error:
            return []
        alive = []
        for child in children:
            try:
                if child.status() != psutil.STATUS_ZOMBIE:
                    alive.append((child.create_time(), child.pid, child))
            except psutil.Error:  # gone meanwhile
                continue
        return [child for *_, child in sorted(alive, key=lambda entry: entry[:2])]

    def ready(self, members):
        # No stats server: the master is up with P live workers, each of which has loaded the
        # app (as far as the server lets us see it). nginx answering /healthz through to the
        # app is Stack's second check. A peer runs on one machine: one member.
        layout = members[0].layout
        workers = self._workers(members[0])
        return len(workers) == layout.processes and all(self.worker_ready(layout, w) for w in workers)

    def worker_ready(self, layout, worker: psutil.Process) -> bool:
        return True

    def worker_pids(self, members):
        return {i + 1: p.pid for i, p in enumerate(self._workers(members[0]))}


class GunicornProcess(PeerProcess):
    config: Gunicorn

    def worker_ready(self, layout, worker):
        return self.config.ready_file(layout, worker.pid).exists()


class GranianProcess(PeerProcess):
    config: Granian

    def command(self, layout):
        return [*super().command(layout), self.config.target(layout)]

    def worker_ready(self, layout, worker):
        # Over TCP (on Linux) each worker binds its own SO_REUSEPORT listener once it has loaded
        # the app; a unix socket is the master's, shared: nothing more to see there.
        if layout.transport != "tcp":
            return True
        try:
            return any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == layout.base_port
                       for c in worker.net_connections(kind="tcp"))
        except psutil.Error:
            return False


PROCESSES: dict[str, ServerProcess] = {
    "uwsgi": UWSGIProcess(SERVERS["uwsgi"]),
    "gunicorn": GunicornProcess(SERVERS["gunicorn"]),
    "granian": GranianProcess(SERVERS["granian"]),
}


def process_for(layout: Layout) -> ServerProcess:
    return PROCESSES[layout.server]
