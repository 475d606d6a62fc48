"""Real nginx + uWSGI on loopback: socket ownership, balancing, errors, start/stop hygiene.

Every wait is a poll with a deadline; every test has a timeout; every process started
here is stopped here (and conftest checks that none survives).
"""

from __future__ import annotations

import os
import re
import signal
import stat
import subprocess
import time
from pathlib import Path

import pytest

from tests.integration.support import (
    FAST,
    SLOW,
    concurrently,
    kill_run,
    port_closed,
    settled_requests,
    start_deploy_run,
    uwsgi_get,
    via_nginx,
)
from uwsgi_layouts.deploy.machine import PACKAGE_DIR
from uwsgi_layouts.deploy.model import StackError
from uwsgi_layouts.deploy.render import write_layout
from uwsgi_layouts.deploy.run import Stack, http_get, read_stats

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]



TRANSPORTS = pytest.mark.parametrize("transport", ["tcp", "unix"])


# --- (a) every uWSGI socket is served by exactly one worker -------------------------------------


@TRANSPORTS
def test_mapped_each_socket_has_exactly_one_worker(start_stack, transport):
    stack = start_stack("2x4-mapped", transport=transport)
    layout = stack.layout
    pids = stack.worker_pids()
    assert sorted(pids) == [1, 2]
    before = settled_requests(layout, at_least=1)  # the readiness /healthz has been counted

    per_socket = 6  # more than one worker's 4 threads: a shared socket would spill to the other worker
    seen: dict[int, set[tuple[str, str]]] = {}
    for sock in layout.sockets:
        results = concurrently(uwsgi_get, [(sock.address, SLOW.format(ms=200))] * per_socket)
        assert all(status == 200 and body == b"Hello, world" for status, _, body in results), results
        seen[sock.index] = {(h["x-worker-id"], h["x-worker-pid"]) for _, h, _ in results}

    for index, ids in seen.items():
        assert len(ids) == 1, f"socket {index} was served by several workers: {ids}"
        (worker_id, worker_pid), = ids
        assert worker_id == str(index + 1), "map-socket = i:i+1"
        assert int(worker_pid) == pids[index + 1]
    assert seen[0] != seen[1]

    after = settled_requests(layout, at_least=sum(before.values()) + 2 * per_socket)
    deltas = {w: after[w] - before[w] for w in after}
    assert deltas == {1: per_socket, 2: per_socket}, deltas


# --- (b) least_conn spreads concurrent slow requests over the workers ----------------------------


@TRANSPORTS
def test_mapped_concurrent_slow_requests_land_on_different_workers(start_stack, transport):
    stack = start_stack("2x4-mapped", transport=transport)
    t0 = time.monotonic()
    results = concurrently(via_nginx, [(stack.layout, SLOW.format(ms=1500))] * 2)
    elapsed = time.monotonic() - t0
    assert [r[0] for r in results] == [200, 200], results
    ids = sorted(h["x-worker-id"] for _, h, _ in results)
    assert ids == ["1", "2"], f"least_conn should give each worker one of 2 slow requests, got {ids}"
    assert elapsed >= 1.5


# --- (c) bad input through nginx ----------------------------------------------------------------


@TRANSPORTS
def test_requests_through_nginx(start_stack, transport):
    stack = start_stack("2x4-mapped", transport=transport)
    layout = stack.layout
    status, headers, body = via_nginx(layout, FAST)
    assert (status, body) == (200, b"Hello, world")
    assert headers["content-type"] == "text/plain"
    assert headers["x-worker-id"] in {"1", "2"}
    assert via_nginx(layout, "/healthz")[0] == 200
    assert via_nginx(layout, "/nowhere")[0] == 404
    for query, names in [
        ("rounds=abc", b"rounds"),
        ("fib=31", b"fib"),
        ("io_ms=-1", b"io_ms"),
        ("rounds=1&rounds=2", b"rounds"),
        ("bogus=1", b"bogus"),
        ("rounds=%ff", b"query string"),
        ("rounds=20&io_ms=10000", b"rounds*io_ms"),
    ]:
        status, headers, body = via_nginx(layout, "/?" + query)
        assert status == 400, (query, status, body)
        assert headers["content-type"] == "text/plain"
        assert names in body, (query, body)
    stack.check_alive()


# --- (d) unix socket permissions ----------------------------------------------------------------


def test_unix_sockets_are_0660_or_tighter_and_vacuumed(start_stack):
    stack = start_stack("2x4-mapped", transport="unix")
    paths = [Path(s.address) for s in stack.layout.sockets]
    assert len(paths) == 2
    for path in paths:
        st = os.stat(path)
        assert stat.S_ISSOCK(st.st_mode), path
        mode = stat.S_IMODE(st.st_mode)
        assert mode & ~0o660 == 0, f"{path} has mode {mode:o}: others (or exec bits) may connect"
        assert mode & 0o600 == 0o600, f"{path} has mode {mode:o}: the owner must read and write"
    stack.stop()
    assert not any(p.exists() for p in paths), "vacuum = true: uWSGI removes its sockets on exit"


# --- (e) `uwsgi-layouts run` stops cleanly on signals -----------------------------------------


def start_run(run_dir: Path, log_dir: Path, *extra: str, spec: str = "2x4-mapped", ports=None,
              tcp_stats: bool = False):
    """``run`` on ports (base, listen, stats); the stats port is used only with ``tcp_stats`` (the
    risk accepted), else the stats server is its unix socket."""
    base, listen, stats = ports
    stats_args = ("--stats-port", str(stats), "--allow-tcp-stats") if tcp_stats else ()
    return start_deploy_run(spec, "--run-dir", str(run_dir), "--listen", f"127.0.0.1:{listen}",
                            "--base-port", str(base), *stats_args, *extra, log_dir=log_dir)


def wait_for_hello(proc, listen: int, log_dir: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            pytest.fail(f"run exited with {proc.returncode} before serving:\n{(log_dir / 'run.err').read_text()}")
        try:
            status, _, body = http_get("127.0.0.1", listen, FAST, timeout=5)
            if status == 200 and body == b"Hello, world":
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            pytest.fail(f"run did not serve within {timeout} s:\n{(log_dir / 'run.err').read_text()}")
        time.sleep(0.1)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_run_stops_cleanly_on_signal(tmp_run_dir, tmp_path, free_ports, leftover_processes, signum):
    base, _, listen, stats = free_ports(4)
    proc = start_run(tmp_run_dir, tmp_path, ports=(base, listen, stats))
    try:
        wait_for_hello(proc, listen, tmp_path)
        # The leak check below must be able to see the stack: it does while it runs.
        running = leftover_processes([str(tmp_run_dir)], timeout=0)
        names = " ".join(" ".join(p.cmdline()) for p in running)
        assert f"--ini {tmp_run_dir}/uwsgi.ini" in names and "nginx" in names and "-m uwsgi_layouts run" in names, names
        # pyuwsgi's master and workers are python3 processes named uwsgi, as a uWSGI binary's are
        assert sum(p.name() == "uwsgi" for p in running) >= 3, [(p.name(), p.cmdline()) for p in running]
        assert len(running) >= 5, names  # run + uWSGI master + 2 workers + nginx master (+ worker)

        proc.send_signal(signum)
        try:
            rc = proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            pytest.fail(f"run did not exit within 15 s of {signum.name}")
        err = (tmp_path / "run.err").read_text()
        assert rc == 0, err
        assert "Traceback" not in err, err
        assert "stopped nginx and uWSGI" in (tmp_path / "run.out").read_text()
        left = leftover_processes([str(tmp_run_dir)], timeout=5)
        assert left == [], [" ".join(p.cmdline()) for p in left]
        assert port_closed(listen) and port_closed(base) and port_closed(stats)
    finally:
        kill_run(proc)


def test_run_for_duration_exits_by_itself(tmp_run_dir, tmp_path, free_ports, leftover_processes):
    base, _, listen, stats = free_ports(4)
    proc = start_run(tmp_run_dir, tmp_path, "--for", "2", ports=(base, listen, stats))
    try:
        wait_for_hello(proc, listen, tmp_path)
        assert proc.wait(timeout=20) == 0, (tmp_path / "run.err").read_text()
        assert leftover_processes([str(tmp_run_dir)], timeout=5) == []
    finally:
        kill_run(proc)


# --- (f) a broken app: refused by the pre-flight, or (past it) fails fast with the uWSGI log ------


@pytest.mark.parametrize("app,needle", [
    ("nosuchmodule:application", "ModuleNotFoundError: No module named 'nosuchmodule'"),
    ("app.wsgi:no_such_callable", "has no attribute 'no_such_callable'"),
])
def test_run_with_broken_app_is_refused_before_anything_starts(tmp_run_dir, tmp_path, free_ports, leftover_processes,
                                                               app, needle):
    base, _, listen, stats = free_ports(4)
    run_dir = tmp_run_dir / "run"
    # the demo app's package lives in the tool's own directory, not in the current one
    proc = start_run(run_dir, tmp_path, "--app", app, "--app-dir", str(PACKAGE_DIR), ports=(base, listen, stats))
    try:
        try:
            rc = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail("run with a broken app did not exit within 30 s")
        err = (tmp_path / "run.err").read_text()
        assert rc == 2, err
        assert len(err.splitlines()) == 1 and err.startswith("error: app: "), err
        assert needle in err and "callable not found" not in err, err
        assert not run_dir.exists(), "nothing is written for bad input"
        assert leftover_processes([str(tmp_run_dir)], timeout=5) == []
        assert port_closed(listen) and port_closed(base)
    finally:
        kill_run(proc)


def test_stack_without_preflight_fails_fast_with_the_uwsgi_log(make_layout):
    # The Stack API does not import the app first: a broken one still fails fast, with the log.
    layout = make_layout("2x4-mapped", app="nosuchmodule:application")
    write_layout(layout, layout.run_dir)
    t0 = time.monotonic()
    with pytest.raises(StackError) as info:
        with Stack(layout, start_timeout=20, stop_timeout=10):
            pass
    assert time.monotonic() - t0 < 20
    assert "uWSGI" in str(info.value)
    assert "No module named 'nosuchmodule'" in info.value.log_tail, info.value.log_tail


# --- (g) a shared socket is served by every worker ----------------------------------------------


@pytest.mark.parametrize("strategy", ["shared", "thunder"])
def test_shared_socket_is_served_by_both_workers(start_stack, strategy):
    stack = start_stack(f"2x4-{strategy}", transport="tcp")
    layout = stack.layout
    stats = read_stats(layout.stats_address)
    assert len(stats["sockets"]) == 1, stats["sockets"]
    assert stats["sockets"][0]["name"] == f"127.0.0.1:{layout.base_port}"
    assert sorted(w["id"] for w in stats["workers"]) == [1, 2]
    before = settled_requests(layout, at_least=1)

    n = 20  # more than one worker's 4 threads can hold: the other worker must accept some
    results = concurrently(via_nginx, [(layout, SLOW.format(ms=300))] * n)
    assert [r[0] for r in results] == [200] * n
    ids = {h["x-worker-id"] for _, h, _ in results}
    assert ids == {"1", "2"}, ids

    after = settled_requests(layout, at_least=sum(before.values()) + n)
    deltas = {w: after[w] - before[w] for w in after}
    assert sum(deltas.values()) == n, deltas
    assert all(d >= 1 for d in deltas.values()), deltas


# --- wrk against a running stack (bounded: 1 s) ---------------------------------------------


def test_wrk_short_load_on_mapped(start_stack, integration_tools):
    stack = start_stack("2x4-mapped")
    layout = stack.layout
    before = settled_requests(layout, at_least=1)
    proc = subprocess.run(
        [integration_tools["wrk"], "-t1", "-c4", "-d1s", "--timeout", "5s", layout.url + "?rounds=1&fib=5&io_ms=5"],
        capture_output=True, text=True, timeout=30,
    )
    assert proc.returncode == 0, proc.stderr
    m = re.search(r"(\d+) requests in", proc.stdout)
    assert m and int(m[1]) > 0, proc.stdout
    assert "Non-2xx" not in proc.stdout and "Socket errors" not in proc.stdout, proc.stdout
    after = settled_requests(layout, at_least=sum(before.values()) + int(m[1]))
    deltas = {w: after[w] - before[w] for w in after}
    assert sum(deltas.values()) >= int(m[1]), (deltas, proc.stdout)
    assert all(d >= 1 for d in deltas.values()), f"least_conn with 4 connections left a worker idle: {deltas}"
    stack.check_alive()
