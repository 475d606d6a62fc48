"""Network namespaces as this process sees them: stepping into one, and which isolated test
networks this process made (``deploy.run.netns.Net`` makes and removes them).

Processes are started inside a namespace by ``setns`` between fork and exec (``enter``: the
pid stays the program's own, owned by the caller as any other: process group, PDEATHSIG), and
sockets are opened inside one from a short-lived thread (``connect``: a thread's network
namespace is its own), which is how each host's loopback-only stats server is read.
``is_isolated(addr)`` says whether an address belongs to a network this process made: only
there may plain uwsgi go off loopback (``plain_allowed``: the benchmark measures what TLS
costs against plain sockets).
"""

from __future__ import annotations

import ctypes
import ipaddress
import os
import socket
import threading
from pathlib import Path

from uwsgi_layouts.deploy.model import is_loopback

NETNS_DIR = Path("/run/netns")
CLONE_NEWNET = 0x40000000

_isolated: list[ipaddress.IPv4Network] = []
_isolated_lock = threading.Lock()


def is_isolated(address: str) -> bool:
    """True when ``address`` is inside a network a live ``Net`` of this process made."""
    try:
        addr = ipaddress.IPv4Address(address)
    except ValueError:
        return False
    with _isolated_lock:
        return any(addr in net for net in _isolated)


def mark_isolated(subnet: ipaddress.IPv4Network) -> None:
    """A network this process made, with no route out: plain uwsgi may cross it."""
    with _isolated_lock:
        _isolated.append(subnet)


def unmark_isolated(subnet: ipaddress.IPv4Network) -> None:
    with _isolated_lock:
        if subnet in _isolated:
            _isolated.remove(subnet)


def plain_allowed(address: str) -> bool:
    """May nginx speak plain uwsgi to this host (or HOST:PORT)? Loopback, or an address in an
    isolated network this process made, nowhere else."""
    host = address.rpartition(":")[0] if address.count(":") == 1 else address
    return is_loopback(host) or is_isolated(host)


def _setns(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if ctypes.CDLL("libc.so.6", use_errno=True).setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({path}): {os.strerror(err)}")
    finally:
        os.close(fd)


def enter(name: str) -> None:
    """Move the calling thread (a child between fork and exec, or a throwaway thread) into
    network namespace ``name``."""
    _setns(str(NETNS_DIR / name))


def run_in(name: str, fn, timeout: float = 30.0):
    """``fn()`` in a fresh thread inside namespace ``name`` (a thread's namespace is its own; the
    thread ends with the call, so nothing else ever runs there). Returns its value or raises."""
    if not name:
        return fn()
    out: dict = {}

    def target():
        try:
            enter(name)
            out["value"] = fn()
        except BaseException as exc:  # handed to the caller
            out["error"] = exc

    thread = threading.Thread(target=target, name=f"netns-{name}", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise TimeoutError(f"no answer inside {name} within {timeout:.0f} s")
    if "error" in out:
        raise out["error"]
    return out["value"]


def connect(name: str, host: str, port: int, timeout: float = 5.0) -> socket.socket:
    """A TCP connection opened inside namespace ``name`` ("" = here); it stays there."""
    return run_in(name, lambda: socket.create_connection((host, port), timeout=timeout), timeout=timeout + 5)
