"""Free loopback ports for stacks started by the benchmark, the fault lab and the tests."""

from __future__ import annotations

import os
import random
import socket
import time
from pathlib import Path


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def ephemeral_low(default: int = 32768) -> int:
    """Start of the kernel's ephemeral range: client sockets may grab ports from it at any time."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return default


def free_consecutive_ports(n: int, low: int, high: int, exclude: set[int] | frozenset[int] = frozenset()) -> list[int]:
    """``n`` free consecutive ports on 127.0.0.1 in ``low..high`` from a random start.

    Prefers the part of the range below the kernel's ephemeral ports, so an outgoing
    connection cannot take a port between this check and the server's bind(); ports in
    ``exclude`` are never returned.
    """
    top = min(high, ephemeral_low(high + 1) - 1)
    if top - low + 1 < 4 * n:  # the ephemeral range covers most of ours: use all of it
        top = high
    rng = random.Random(os.getpid() ^ time.monotonic_ns())
    for _ in range(400):
        start = rng.randint(low, top - n + 1)
        ports = list(range(start, start + n))
        if not exclude.intersection(ports) and all(port_is_free(p) for p in ports):
            return ports
    raise RuntimeError(f"no {n} free consecutive ports on 127.0.0.1 in {low}..{top}")
