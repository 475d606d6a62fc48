"""The `overflow` strategy routes as designed, checked in nginx's own log ($upstream_addr).

With least_conn + max_conns=T, nginx never has more than T requests in flight on a
worker's own socket; the excess goes to the backup server, the socket every worker
accepts on. With `mapped` (no max_conns) the excess queues behind busy workers instead.
"""

from __future__ import annotations

import re
import time
from collections import Counter

import pytest

from tests.integration.support import SLOW, concurrently, via_nginx

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


def upstreams_in_log(layout, expected: int, timeout: float = 10.0) -> Counter:
    log = f"{layout.run_dir}/logs/access.log"
    deadline = time.monotonic() + timeout
    while True:
        try:
            text = open(log).read()
        except FileNotFoundError:
            text = ""
        slow = [m[1] for line in text.splitlines() if "io_ms=1500" in line
                for m in [re.search(r" upstream=(\S+) ", line)] if m]
        if len(slow) >= expected or time.monotonic() > deadline:
            return Counter(slow)
        time.sleep(0.05)


def fire(layout, n: int) -> list[int]:
    results = concurrently(lambda: via_nginx(layout, SLOW.format(ms=1500), timeout=30), [()] * n)
    return [status for status, _, _ in results]


def test_overflow_sends_the_excess_to_the_shared_backup_socket(start_stack):
    stack = start_stack("2x2-overflow", access_log=True)
    layout = stack.layout
    own0, own1, shared = (s.nginx_address for s in layout.sockets)
    assert [s.role for s in layout.sockets] == ["worker", "worker", "overflow"]
    statuses = fire(layout, 6)  # 2 workers x 2 threads = 4 in flight on own sockets, 2 in excess
    assert statuses == [200] * 6
    counts = upstreams_in_log(layout, 6)
    assert counts == {own0: 2, own1: 2, shared: 2}, counts


def test_mapped_queues_the_excess_behind_busy_workers(start_stack):
    stack = start_stack("2x2-mapped", access_log=True)
    layout = stack.layout
    own0, own1 = (s.nginx_address for s in layout.sockets)
    assert fire(layout, 6) == [200] * 6
    counts = upstreams_in_log(layout, 6)
    # least_conn spreads 3 and 3: each worker's third request waits for one of its 2 threads.
    assert counts == {own0: 3, own1: 3}, counts
