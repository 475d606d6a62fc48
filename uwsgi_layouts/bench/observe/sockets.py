"""The kernel's view of listening sockets over sock_diag netlink (uWSGI cannot see a unix socket's
queue on stock Linux): unix and TCP listeners with their queue and backlog, listen overflows,
which listening sockets a process or a worker holds."""

from __future__ import annotations

import ipaddress
import os
import socket
import struct
from pathlib import Path
from typing import Callable, NamedTuple

import psutil

from uwsgi_layouts.deploy.machine import is_unix_address

# --------------------------------------------------------------------------- the kernel's listening sockets

# sock_diag netlink (linux/sock_diag.h, linux/unix_diag.h): what `ss -xl` reads.
NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
UDIAG_SHOW_NAME, UDIAG_SHOW_RQLEN = 0x01, 0x10
UNIX_DIAG_NAME, UNIX_DIAG_RQLEN = 0, 4
TCP_LISTEN = 10
_NLMSG = struct.Struct("=IHHII")  # nlmsghdr: len, type, flags, seq, pid
_UNIX_DIAG_REQ = struct.Struct("=BBHIIIII")  # family, protocol, pad, states, ino, show, cookie x2
_UNIX_DIAG_MSG = struct.Struct("=BBBBIII")  # family, type, state, pad, ino, cookie x2
_RTATTR = struct.Struct("=HH")  # len, type
# linux/inet_diag.h: inet_diag_req_v2 (family, protocol, ext, pad, states, then an inet_diag_sockid of
# 48 bytes: ports, addresses, interface, cookie) and inet_diag_msg (family, state, timer, retrans,
# the sockid: ports big-endian, then expires, rqueue, wqueue, uid, inode).
_INET_DIAG_REQ = struct.Struct("=BBBBI")
_INET_SOCKID_SIZE = 48
_INET_DIAG_MSG = struct.Struct("=BBBB2s2s16s16sI8sIIIII")


class Listener(NamedTuple):
    name: str  # a unix path, or HOST:PORT
    inode: int
    queue: int  # connections waiting to be accepted
    backlog: int  # the queue's size (listen(2)'s backlog, capped by somaxconn)


def _sock_diag_dump(request: bytes, parse: Callable[[bytes], Listener | None], timeout: float) -> list[Listener]:
    """One sock_diag dump (``request``: the family's request struct) -> the listeners ``parse``
    finds in its messages. [] (or what came before the failure) when netlink is unavailable."""
    found: list[Listener] = []
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG) as nl:
            nl.settimeout(timeout)
            nl.sendall(_NLMSG.pack(_NLMSG.size + len(request), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, 1, 0)
                       + request)
            while True:
                data = nl.recv(65536)
                offset = 0
                while offset + _NLMSG.size <= len(data):
                    length, kind, _, _, _ = _NLMSG.unpack_from(data, offset)
                    if kind == NLMSG_DONE or kind == NLMSG_ERROR or length < _NLMSG.size:
                        return found
                    listener = parse(data[offset + _NLMSG.size: offset + length])
                    if listener:
                        found.append(listener)
                    offset += (length + 3) & ~3
    except OSError:
        return found


def unix_listeners(timeout: float = 1.0) -> list[Listener]:
    """Every listening unix stream socket of this network namespace with a path, from the
    kernel (sock_diag: no privilege needed). For a listening socket the kernel reports its accept
    queue as the receive queue and its backlog as the send queue. [] when netlink is unavailable."""
    request = _UNIX_DIAG_REQ.pack(socket.AF_UNIX, 0, 0, 1 << TCP_LISTEN, 0, UDIAG_SHOW_NAME | UDIAG_SHOW_RQLEN,
                                  0xFFFFFFFF, 0xFFFFFFFF)
    return _sock_diag_dump(request, _unix_listener, timeout)


def inet_listeners(timeout: float = 1.0) -> list[Listener]:
    """Every listening TCP socket (IPv4 and IPv6) of this network namespace, from the kernel
    (sock_diag's inet_diag, what `ss -ltn` reads; no privilege needed): for a listening socket
    idiag_rqueue is its accept queue and idiag_wqueue its backlog (/proc/net/tcp has no backlog)."""
    found: list[Listener] = []
    for family in (socket.AF_INET, socket.AF_INET6):
        request = _INET_DIAG_REQ.pack(family, socket.IPPROTO_TCP, 0, 0, 1 << TCP_LISTEN) + bytes(_INET_SOCKID_SIZE)
        found += _sock_diag_dump(request, _inet_listener, timeout)
    return found


def _inet_listener(payload: bytes) -> Listener | None:
    if len(payload) < _INET_DIAG_MSG.size:
        return None
    family, _, _, _, port, _, src, _, _, _, _, queue, backlog, _, inode = _INET_DIAG_MSG.unpack_from(payload)
    host = ipaddress.ip_address(src[:4] if family == socket.AF_INET else src)
    return Listener(f"{host}:{int.from_bytes(port, 'big')}", inode, queue, backlog)


def _unix_listener(payload: bytes) -> Listener | None:
    if len(payload) < _UNIX_DIAG_MSG.size:
        return None
    inode = _UNIX_DIAG_MSG.unpack_from(payload)[4]
    name, queue, backlog = "", 0, 0
    offset = _UNIX_DIAG_MSG.size
    while offset + _RTATTR.size <= len(payload):
        length, kind = _RTATTR.unpack_from(payload, offset)
        if length < _RTATTR.size:
            break
        value = payload[offset + _RTATTR.size: offset + length]
        if kind == UNIX_DIAG_NAME and value[:1] not in (b"", b"\0"):  # abstract sockets have no path
            name = value.split(b"\0", 1)[0].decode("utf-8", "replace")
        elif kind == UNIX_DIAG_RQLEN and len(value) >= 8:
            queue, backlog = struct.unpack_from("=II", value)
        offset += (length + 3) & ~3
    return Listener(name, inode, queue, backlog) if name else None


def unix_listen_queues() -> dict[str, tuple[int, int]]:
    """Unix socket path -> (connections waiting, backlog), for every listening one."""
    return {s.name: (s.queue, s.backlog) for s in unix_listeners()}


def tcp_listeners() -> list[Listener]:
    """Listening TCP sockets (IPv4 and IPv6) of this network namespace, from /proc/net/tcp{,6}:
    local address, inode, and for a listening socket its accept queue (rx_queue)."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if len(cols) < 10 or cols[3] != "0A":  # 0A: TCP_LISTEN
                continue
            host_hex, port_hex = cols[1].split(":")
            raw = bytes.fromhex(host_hex)
            # /proc prints the address as 32-bit words in host (little-endian) order.
            packed = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            host = str(ipaddress.ip_address(packed))
            found.append(Listener(f"{host}:{int(port_hex, 16)}", int(cols[9]), int(cols[4].split(":")[1], 16), 0))
    return found


def same_listener(uwsgi_name: str, kernel_name: str) -> bool:
    """A uWSGI socket name (``/run/x.sock``, ``127.0.0.1:5000``, ``:5000``) against a kernel one."""
    if is_unix_address(uwsgi_name):
        return uwsgi_name.removeprefix("unix:") == kernel_name
    host, _, port = uwsgi_name.rpartition(":")
    k_host, _, k_port = kernel_name.rpartition(":")
    return port == k_port and (host in ("", "0.0.0.0", "*", "[::]") or host.strip("[]") == k_host)


def process_listeners(pid: int, listeners: list[Listener]) -> list[Listener] | None:
    """Which of ``listeners`` the process holds open (its file descriptors name their inodes);
    None when its descriptors cannot be read (another user's process, not root) or it is gone."""
    try:
        names = os.listdir(f"/proc/{pid}/fd")
        inodes = set()
        for fd in names:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(int(target[8:-1]))
    except OSError:
        return None
    return [s for s in listeners if s.inode in inodes]


def workers_are_local(stats: dict) -> bool:
    """The stats document's workers are processes of this machine (and pid namespace): each
    one's parent is the master the document names."""
    try:
        return all(psutil.Process(w["pid"]).ppid() == stats["pid"] for w in stats["workers"])
    except (psutil.Error, KeyError, TypeError):
        return False


def socket_holdings(stats: dict) -> dict[int, list[str]] | None:
    """Worker id -> the stats document's sockets that worker holds open (a mapped worker closes
    the sockets of the others: uWSGI 2.0 core/socket.c uwsgi_map_sockets); None when a worker's
    descriptors cannot be read."""
    kernel = tcp_listeners() + unix_listeners()
    names = [str(s["name"]) for s in stats.get("sockets", [])]
    out = {}
    for w in stats["workers"]:
        held = process_listeners(w["pid"], kernel)
        if held is None:
            return None
        out[w["id"]] = [n for n in names if any(same_listener(n, k.name) for k in held)]
    return out


def kernel_listen_overflows() -> int | None:
    """TcpExt ListenOverflows of this network namespace (/proc/net/netstat): connections the
    kernel dropped because a TCP listen queue was full, every socket counted. None if unreadable."""
    try:
        lines = Path("/proc/net/netstat").read_text().splitlines()
    except OSError:
        return None
    for names, values in zip(lines, lines[1:], strict=False):
        if names.startswith("TcpExt:") and values.startswith("TcpExt:"):
            table = dict(zip(names.split()[1:], values.split()[1:], strict=False))
            return int(table["ListenOverflows"]) if "ListenOverflows" in table else None
    return None
