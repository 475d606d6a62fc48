"""Processes of a stack, one by one: the binaries, how a child is set up between fork and exec
(dies with us, its own process group, maybe inside a network namespace), how a process group
is stopped, and what a running one answers (uWSGI's stats server, HTTP through nginx, its log).
"""

from __future__ import annotations

import ctypes
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
from pathlib import Path

from deploy.machine import connect, enter, find_uwsgi
from deploy.model import StackError

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass
    os.setsid()  # own process group, so stop() can signal workers too


def child_setup(namespace: str):
    """preexec_fn: die with us, own process group, and (if named) enter a network namespace."""
    if not namespace:
        return die_with_parent

    def setup():
        die_with_parent()
        enter(namespace)

    return setup


def uwsgi_binary() -> str:
    found = find_uwsgi()
    if not found:
        raise StackError("uwsgi is not installed: run `make venv` (pip install uwsgi)")
    return found


def nginx_binary() -> str:
    found = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    if not found:
        raise StackError("nginx is not installed: run scripts/install-system-deps.sh (apt-get install nginx)")
    return found


def read_stats(address: str, timeout: float = 2.0, namespace: str = "") -> dict:
    """The uWSGI stats server's JSON (it writes one document and closes), read from inside
    ``namespace`` when given."""
    host, _, port = address.rpartition(":")
    conn = connect(namespace, host, int(port), timeout) if namespace else \
        socket.create_connection((host, int(port)), timeout=timeout)
    with conn:
        chunks = []
        while chunk := conn.recv(65536):
            chunks.append(chunk)
    return json.loads(b"".join(chunks).decode("utf-8", "replace"))


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
