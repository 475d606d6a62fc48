"""Processes of a stack, one by one: the binaries, how a child is set up between fork and exec
(its own process group, maybe inside a network namespace, as the run user, dying with us), how
a process group is stopped, and what a running one answers (HTTP through nginx, its log;
uWSGI's stats server is read by deploy.machine's ``read_stats``).

Dying with us: PR_SET_PDEATHSIG sends the child a signal when our process dies, SIGKILL
included. The kernel clears it whenever the child's credentials change, so a child that is to
run as another user is switched *before* it is armed, and must never switch itself (uWSGI's
uid/gid options would: the lab's uwsgi.ini has none, see templates/uwsgi/_control.j2).
"""

from __future__ import annotations

import ctypes
import http.client
import os
import signal
import subprocess
from pathlib import Path

from uwsgi_layouts.deploy.machine import enter, find_nginx, find_uwsgi
from uwsgi_layouts.deploy.model import StackError

PR_SET_PDEATHSIG = 1


def _libc():
    try:
        return ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:
        return None


def die_with_parent() -> None:  # runs in the child between fork and exec
    libc = _libc()
    if libc is not None:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    os.setsid()  # own process group, so stop() can signal workers too


def child_setup(namespace: str = "", run_as: tuple[int, int, list[int]] | None = None,
                death_signal: int = signal.SIGTERM, cgroup_files: tuple[str, ...] = (), own_group: bool = True):
    """preexec_fn: its own process group (stop() signals the workers too; not with ``own_group``
    False, for a child that should get the terminal's Ctrl-C as its parent does), the network
    namespace ``namespace`` (entered as root), the cgroup whose ``cgroup.procs`` files are
    ``cgroup_files`` (joined as root, so every process it forks is inside), the user
    ``run_as`` = (uid, gid, groups), and
    only then ``death_signal`` when we die (a credential change would clear it). A parent that
    died before the signal was armed ends the child at once."""
    libc = _libc()  # loaded here: dlopen() between fork and exec could deadlock
    parent = os.getpid()

    def setup():
        if own_group:
            os.setsid()
        if namespace:
            enter(namespace)
        for procs in cgroup_files:
            fd = os.open(procs, os.O_WRONLY)
            try:
                os.write(fd, str(os.getpid()).encode())
            finally:
                os.close(fd)
        if run_as is not None:
            uid, gid, groups = run_as
            os.setgroups(groups)
            os.setgid(gid)
            os.setuid(uid)
        if libc is not None:
            libc.prctl(PR_SET_PDEATHSIG, int(death_signal))
        if os.getppid() != parent:
            os._exit(1)

    return setup


def uwsgi_binary() -> str:
    found = find_uwsgi()
    if not found:
        raise StackError("uwsgi is not installed: run `make venv` (pip install uwsgi)")
    return found


def nginx_binary() -> str:
    found = find_nginx()
    if not found:
        raise StackError("nginx is not installed: run scripts/install-system-deps.sh (apt-get install nginx)")
    return found


def tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"(no log at {path})"


def http_get(host: str, port: int, path: str, timeout: float = 5.0) -> tuple[int, dict, bytes]:
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def terminate_group(proc: subprocess.Popen, timeout: float) -> None:
    """SIGTERM the master (nginx: fast shutdown; uWSGI die-on-term: stop; gunicorn, granian:
    graceful stop), then SIGKILL the group."""
    if proc.poll() is None:
        try:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
    # The master may be gone while a worker lingers: the group catches both.
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pass
