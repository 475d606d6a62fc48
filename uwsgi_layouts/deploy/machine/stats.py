"""uWSGI's stats server, as this project reads it: the one reader (``read_stats``) every part
uses (the lab's stacks, chain reloads, the bundle's install, bench's samplers, doctor), and who
else on this machine could read it (``stats_exposure``).

The stats server writes one JSON document per connection and closes. Besides pids and request
counters it holds, per worker thread (``cores[]``), the variables of the request it is serving
(``vars``: HTTP_COOKIE, HTTP_AUTHORIZATION, every header) and its details (``req_info``). Nothing
this project keeps needs them, and a reader that kept them would copy session cookies into
results.json, doctor's records and every exporter: ``without_requests`` drops them as the document
is read, before any caller sees it.
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import socket
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from uwsgi_layouts.deploy.machine.netns import connect
from uwsgi_layouts.deploy.machine.risks import group_members

STATS_MAX_BYTES = 64 * 1024 * 1024  # a document this large is not a stats server's (P x T cores of vars)
# What a core (a worker's thread) says of the request it is serving: its variables and its details.
REQUEST_KEYS = ("vars", "req_info")


def is_unix_address(address: str) -> bool:
    """A unix socket path (``/run/shop/stats.sock``; nginx's ``unix:`` prefix allowed), not HOST:PORT."""
    return address.startswith(("/", "unix:"))


def without_requests(doc: dict) -> dict:
    """The stats document without what it says of requests in flight (each core's ``vars`` and
    ``req_info``); the counters, flags and pids stay. The document itself is left as it was."""
    workers = doc.get("workers")
    if not isinstance(workers, list):
        return doc
    clean = []
    for worker in workers:
        if isinstance(worker, dict) and isinstance(worker.get("cores"), list):
            cores = [{k: v for k, v in core.items() if k not in REQUEST_KEYS} if isinstance(core, dict) else core
                     for core in worker["cores"]]
            worker = {**worker, "cores": cores}
        clean.append(worker)
    return {**doc, "workers": clean}


def _open(address: str, timeout: float, namespace: str) -> socket.socket:
    if is_unix_address(address):  # a path: the same file in every network namespace
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.settimeout(timeout)
            conn.connect(address.removeprefix("unix:"))
        except BaseException:
            conn.close()
            raise
        return conn
    host, _, port = address.rpartition(":")
    conn = connect(namespace, host, int(port), timeout) if namespace else \
        socket.create_connection((host, int(port)), timeout=timeout)
    conn.settimeout(timeout)
    return conn


def read_stats(address: str, timeout: float = 2.0, namespace: str = "") -> dict:
    """The uWSGI stats server's JSON document without request variables (``without_requests``),
    read from a unix socket (a path) or over TCP (``HOST:PORT``, from inside network namespace
    ``namespace`` when given). Reading never writes a byte to it. Raises OSError (nothing there,
    refused, permission denied, timed out) or ValueError (not JSON, not a stats document)."""
    deadline = time.monotonic() + timeout
    with _open(address, timeout, namespace) as conn:
        chunks, size = [], 0
        while chunk := conn.recv(65536):
            chunks.append(chunk)
            size += len(chunk)
            if size > STATS_MAX_BYTES or time.monotonic() > deadline:
                raise ValueError(f"more than {STATS_MAX_BYTES} bytes or {timeout:g} s of data: not a stats document")
    doc = json.loads(b"".join(chunks).decode("utf-8", "replace"))
    if not isinstance(doc, dict) or not isinstance(doc.get("workers"), list):
        raise ValueError("a JSON document without a list of workers")
    return without_requests(doc)


# --------------------------------------------------------------------------- who else can read it


@dataclass(frozen=True)
class Exposure:
    """Who besides the stats server's own users can open it: ``who`` in words ("" = nobody else),
    ``why`` (the address, or the socket's and its directories' modes) and ``fix`` (what to change)."""

    address: str
    who: str
    why: str
    fix: str

    def __post_init__(self):
        if not self.address or (self.who and not (self.why and self.fix)):
            raise ValueError("an exposure needs its address, and when someone can read it, why and the fix")

    def to_dict(self) -> dict:
        return {"address": self.address, "who": self.who, "why": self.why, "fix": self.fix}


def _name(lookup, key: int) -> str:
    try:
        return lookup(key)[0]
    except KeyError:
        return str(key)


def stats_exposure(address: str) -> Exposure:
    """Who besides the service's own user can open the stats server at ``address``: any local user
    reaches a TCP port (on any address, loopback included); a unix socket needs write permission on
    it and search (x) permission on every directory above it: for everyone (o+w, o+x all the way
    up), or for the members of its group (g+w) when the group has members besides its owner."""
    if not is_unix_address(address):
        host = address.rpartition(":")[0]
        where = "every local user" + ("" if host in ("127.0.0.1", "localhost", "[::1]", "::1") else
                                      " and whoever reaches this machine's network")
        return Exposure(address, where, f"the stats server listens on TCP {address}: a TCP port has no owner, so "
                                        "anyone who can connect reads the variables of every request in flight "
                                        "(Cookie, Authorization headers)",
                        f"replace `stats = {address}` with a unix socket, e.g. `stats = /run/NAME/stats.sock`, in a "
                        "directory only the service's users can traverse, with chmod-socket = 660 (uWSGI applies it "
                        "to the stats socket too)")
    path = Path(address.removeprefix("unix:"))
    try:
        st = path.stat()
    except OSError:
        return Exposure(address, "", "", "")  # doctor read it, then it went: nothing to judge
    owner, group = _name(pwd.getpwuid, st.st_uid), _name(grp.getgrgid, st.st_gid)
    shown = f"the socket is mode {stat.S_IMODE(st.st_mode):03o} ({owner}:{group})"
    fix = ("set chmod-socket = 660 in uwsgi.ini (uWSGI applies it to the stats socket too) and keep the socket's "
           f"directory {path.parent} closed to others (chmod o-rwx)")
    if st.st_mode & stat.S_IWOTH and all(_passes(d, stat.S_IXOTH) for d in path.parents):
        return Exposure(address, "every local user",
                        f"{shown} and every directory above it lets others through (o+x): anyone can connect and "
                        "read the variables of every request in flight (Cookie, Authorization headers)", fix)
    members = sorted(group_members(st.st_gid) - {owner, "root"})
    if st.st_mode & stat.S_IWGRP and members and all(_passes(d, stat.S_IXOTH) or _passes(d, stat.S_IXGRP, st.st_gid)
                                                      for d in path.parents):
        names = ", ".join(members[:3]) + (", ..." if len(members) > 3 else "")
        return Exposure(address, f"the other members of group {group} ({names})",
                        f"{shown}: its group may connect, and has members besides the service's user, who read the "
                        "variables of every request in flight (Cookie, Authorization headers)",
                        "run uWSGI with a group only the service's users are in (its gid =: the stats socket gets "
                        f"uWSGI's own group), and keep {path.parent} closed to others")
    return Exposure(address, "", "", "")


def _passes(directory: Path, bit: int, gid: int | None = None) -> bool:
    """``directory`` has the search (x) ``bit`` (and, given, belongs to group ``gid``); one that
    cannot be read counts as passable (the worst case)."""
    try:
        st = os.stat(directory)
    except OSError:
        return True
    return bool(st.st_mode & bit) and (gid is None or st.st_gid == gid)
