"""The variants the overhead measurement and the peers comparison try, on real processes: uWSGI
over http-socket and http11-socket behind nginx's proxy_pass, the HTTP peers with nginx's
upstream keep-alive off, and another uWSGI binary (``uwsgi_bin``). Each serves the demo app
under a brief wrk load without an error, and nginx keeps upstream connections exactly where the
layout says so (counted on nginx's worker). Behaviour only: what they cost is the benchmark's
(scripts/overhead.py).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from tests.integration.support import FAST, concurrently, made, via_nginx
from tests.integration.test_peers import variant_options

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

VARIANTS = [
    # (id, variant, options, nginx keeps connections to the server)
    ("uwsgi-http-socket", "2x4-mapped@protocol=http", {}, False),
    ("uwsgi-http-socket-unix", "2x2-mapped@protocol=http", {"transport": "unix"}, False),
    ("uwsgi-http11-socket", "2x4-mapped@protocol=http11", {}, True),
    ("gunicorn-no-keepalive", "2x4-gunicorn@keepalive=off", {}, False),
    ("granian-no-keepalive", "2x4-granian@keepalive=off", {}, False),
    ("gunicorn-keepalive", "2x4-gunicorn", {}, True),  # the contrast: the same counting sees kept ones
]


def kept_upstream_connections(stack) -> int:
    """Established TCP connections nginx's workers hold to the server's ports."""
    ports = {stack.layout.base_port + s.index for s in stack.layout.sockets}
    workers = psutil.Process(stack.nginx.pid).children()
    return sum(1 for w in workers for c in w.net_connections(kind="tcp")
               if c.status == psutil.CONN_ESTABLISHED and c.raddr and c.raddr.port in ports)


@pytest.mark.parametrize("variant,options,kept", [c[1:] for c in VARIANTS], ids=[c[0] for c in VARIANTS])
def test_variant_serves_requests_and_keeps_connections_only_where_it_says(start_stack, integration_tools, variant,
                                                                         options, kept):
    spec, options = variant_options(variant, **options)
    stack = start_stack(spec, **options)
    layout = stack.layout
    status, headers, body = via_nginx(layout, FAST)
    assert (status, body) == (200, b"Hello, world"), (status, body)
    workers = set(stack.worker_pids().values())
    assert int(headers["x-worker-pid"]) in workers

    # Concurrent slow requests (a thread each, not the GIL): all answered, by the workers.
    results = concurrently(via_nginx, [(layout, "/?rounds=1&fib=0&io_ms=200")] * (layout.processes * layout.threads))
    assert [r[0] for r in results] == [200] * len(results), [r[:2] for r in results]
    assert {int(h["x-worker-pid"]) for _, h, _ in results} <= workers

    # wrk, briefly, at P x T connections: no errors, every answer a 2xx.
    proc = subprocess.run([integration_tools["wrk"], "-t1", f"-c{layout.processes * layout.threads}", "-d1s",
                           "--timeout", "5s", layout.url + "?rounds=1&fib=5&io_ms=5"], capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode == 0, proc.stderr
    m = re.search(r"(\d+) requests in", proc.stdout)
    assert m and int(m[1]) > 0, proc.stdout
    assert "Non-2xx" not in proc.stdout and "Socket errors" not in proc.stdout, proc.stdout

    if layout.transport == "tcp":
        for _ in range(6):
            assert via_nginx(layout, FAST)[0] == 200
        time.sleep(0.3)  # a closed connection leaves ESTABLISHED at once; a kept one stays
        held = kept_upstream_connections(stack)
        if kept:
            # Kept, and never more than the threads per socket (http11: a kept connection holds one).
            assert 1 <= held, held
            if layout.server == "uwsgi":
                assert held <= layout.threads * len(layout.sockets), held
        else:
            assert held == 0, f"nginx keeps {held} connections to {variant}"
    stack.check_alive()


def test_http11_spreads_sequential_requests_over_the_mapped_workers(start_stack):
    # least_conn with nothing in flight round-robins: kept connections to both workers' sockets.
    stack = start_stack("2x2-mapped", protocol="http11")
    workers = set(stack.worker_pids().values())
    seen = {int(via_nginx(stack.layout, FAST)[1]["x-worker-pid"]) for _ in range(12)}
    assert seen == workers, (seen, workers)


@pytest.mark.timeout(900)  # the first run may build it (about 40 s on 2 cores, minutes on a busy machine)
def test_a_layouts_uwsgi_bin_is_the_uwsgi_that_runs(start_stack, run_dirs):
    # A copy of another build of our uWSGI (the shared-libpython binary, made by scripts/build-uwsgi.sh
    # when make uwsgi-builds has not made it yet: make venv compiles pyuwsgi only).
    where = run_dirs()
    where.chmod(0o755)
    copy = where / "uwsgi"
    binary = made("shared")
    shutil.copy2(binary, copy)
    copy.chmod(0o755)
    stack = start_stack("2x2-mapped", uwsgi_bin=str(copy))
    assert via_nginx(stack.layout, FAST)[0] == 200
    master = psutil.Process(stack.app.pid)
    assert Path(master.exe()) == copy.resolve()
    assert {Path(w.exe()) for w in master.children()} == {copy.resolve()}
