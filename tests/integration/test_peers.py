"""Peers behind the same nginx, on real processes: gunicorn (gthread, sync, reuse_port, the uwsgi
protocol) and granian serve the demo app and a Flask app from its own virtualenv, spread
requests over their workers (the app's X-Worker-Pid header), drop privileges under root,
listen on loopback or 0660 unix sockets only, respawn a killed worker, and stop with nothing
left running (conftest's leak check runs after every test here).
"""

from __future__ import annotations

import errno
import json
import os
import pwd
import re
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.integration.support import (
    FAST,
    concurrently,
    kill_run,
    port_closed,
    start_deploy_run,
    uwsgi_packet,
    via_nginx,
)
from tests.integration.test_security import bound_inet_sockets, cap_eff, connect_as, tree
from uwsgi_layouts.deploy.model import StackError
from uwsgi_layouts.deploy.render import write_layout
from uwsgi_layouts.deploy.run import Stack, http_get

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="needs root: only root can start the stack as another user")
PEERS = [
    ("gunicorn-gthread", "2x4-gunicorn"),
    ("gunicorn-sync", "2x1-gunicorn"),
    ("gunicorn-reuse-port", "2x4-gunicorn@reuse_port=on"),
    ("gunicorn-uwsgi-protocol", "2x4-gunicorn@protocol=uwsgi"),
    ("granian", "2x4-granian"),
]
SLOW = "/?rounds=1&fib=0&io_ms=300"  # holds a thread, not the GIL


def variant_options(variant: str, **options) -> tuple[str, dict]:
    spec, _, extra = variant.partition("@")
    for item in filter(None, extra.split(",")):
        key, _, value = item.partition("=")
        options[key] = value
    return spec, options


@pytest.fixture
def start_peer(start_stack):
    """start_peer("2x4-gunicorn@reuse_port=on", **opts) -> a running Stack (stopped afterwards)."""
    def start(variant: str, **opts) -> Stack:
        spec, options = variant_options(variant, **opts)
        return start_stack(spec, **options)

    return start


def spread(layout, path: str, workers: set[int], n: int = 16, rounds: int = 3) -> list[dict[int, int]]:
    """Send n requests at once (then 2n, 3n: nginx keeps the connections of a round open, so
    only more of them make the server accept new ones), until every worker has served one.
    Returns the per-worker counts of each round (by the X-Worker-Pid header)."""
    seen: list[dict[int, int]] = []
    for size in range(n, n * rounds + 1, n):
        results = concurrently(via_nginx, [(layout, path)] * size)
        assert [r[0] for r in results] == [200] * size, [r[:2] for r in results]
        counts: dict[int, int] = {}
        for _, headers, _ in results:
            pid = int(headers["x-worker-pid"])
            counts[pid] = counts.get(pid, 0) + 1
        seen.append(counts)
        assert set(counts) <= workers, f"served by a pid that is not a worker: {counts} vs {workers}"
        if set().union(*seen) == workers:
            return seen
    pytest.fail(f"{rounds} rounds of {n}, {2 * n}... concurrent requests never reached every worker {workers}: "
                f"{seen}")


def listeners(pid: int, port: int) -> list:
    return [c for c in psutil.Process(pid).net_connections(kind="tcp")
            if c.status == psutil.CONN_LISTEN and c.laddr.port == port]


# --- serve, spread, stop ------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", [v for _, v in PEERS], ids=[i for i, _ in PEERS])
def test_peer_serves_the_demo_app_spreads_requests_and_stops(start_peer, integration_tools, variant):
    stack = start_peer(variant, transport="tcp")  # the listeners below are TCP ones
    layout = stack.layout
    master = stack.app.pid
    workers = stack.worker_pids()
    assert sorted(workers) == list(range(1, layout.processes + 1))
    assert tree(master) == {master, *workers.values()}, "the master and exactly P workers"

    status, headers, body = via_nginx(layout, FAST)
    assert (status, body, headers["content-type"]) == (200, b"Hello, world", "text/plain")
    assert int(headers["x-worker-pid"]) in workers.values()
    assert via_nginx(layout, "/healthz")[0] == 200
    assert via_nginx(layout, "/nowhere")[0] == 404
    status, _, body = via_nginx(layout, "/?rounds=abc")
    assert status == 400 and b"rounds" in body

    # Concurrent slow requests reach every worker.
    rounds = spread(layout, SLOW, set(workers.values()))
    print(f"\n{variant}: per-worker requests of {len(rounds)} round(s) of 16, 32...: {rounds}")

    # Where the workers accept: one shared socket (gunicorn), or one SO_REUSEPORT listener each.
    port = layout.base_port
    per_worker = layout.server == "granian" or layout.reuse_port
    for pid in workers.values():
        assert len(listeners(pid, port)) == 1, pid
    assert len(listeners(master, port)) == (0 if per_worker else 1)
    bound = bound_inet_sockets(tree(master))
    assert {(c.laddr.ip, c.laddr.port) for c in bound} == {("127.0.0.1", port)}, bound

    # wrk, briefly: no errors, every answer a 2xx.
    proc = subprocess.run([integration_tools["wrk"], "-t1", "-c8", "-d1s", "--timeout", "5s",
                           layout.url + "?rounds=1&fib=5&io_ms=5"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    m = re.search(r"(\d+) requests in", proc.stdout)
    assert m and int(m[1]) > 0, proc.stdout
    assert "Non-2xx" not in proc.stdout and "Socket errors" not in proc.stdout, proc.stdout
    stack.check_alive()

    everything = tree(master) | tree(stack.nginx.pid)
    stack.stop()
    assert not [p for p in everything if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert port_closed(port) and port_closed(layout.listen_port)
    control = Path(layout.run_dir) / "control"
    assert not (control / f"{layout.server}.pid").exists(), "the pid file is removed"
    assert list(control.glob("gunicorn-worker-*.ready")) == [], "gunicorn's master removes its workers' ready files"


@pytest.mark.parametrize("peer", ["gunicorn", "granian"])
def test_a_killed_worker_is_replaced(start_peer, peer):
    stack = start_peer(f"2x2-{peer}")
    old = stack.worker_pids()
    os.kill(old[1], signal.SIGKILL)
    deadline = time.monotonic() + 20  # granian waits 3.5 s (respawn_interval) before respawning
    while True:
        now = stack.worker_pids()
        if len(now) == 2 and old[1] not in now.values():
            break
        assert time.monotonic() < deadline, f"worker {old[1]} not replaced: {now}"
        time.sleep(0.1)  # polling interval
    assert old[2] in now.values()
    if peer == "gunicorn":  # the master removed the dead worker's ready file (its child_exit hook)
        assert not (Path(stack.layout.run_dir) / "control" / f"gunicorn-worker-{old[1]}.ready").exists()
    results = concurrently(via_nginx, [(stack.layout, FAST)] * 8)
    assert [r[0] for r in results] == [200] * 8
    stack.check_alive()


def test_peer_stack_with_a_broken_app_fails_fast_with_its_log(make_layout):
    for spec in ("2x4-gunicorn", "2x4-granian"):
        layout = make_layout(spec, app="nosuchmodule:application")
        write_layout(layout, layout.run_dir)
        t0 = time.monotonic()
        with pytest.raises(StackError) as info:
            with Stack(layout, start_timeout=20, stop_timeout=10):
                pass
        assert time.monotonic() - t0 < 15, spec
        assert "while starting" in str(info.value), info.value
        assert "nosuchmodule" in info.value.log_tail, info.value.log_tail


# --- privileges and sockets -------------------------------------------------------------------------------


def groups_of(pid: int) -> set[int]:
    line = next(li for li in Path(f"/proc/{pid}/status").read_text().splitlines() if li.startswith("Groups:"))
    return {int(g) for g in line.split()[1:]}


@needs_root
@pytest.mark.parametrize("transport", ["tcp", "unix"])
@pytest.mark.parametrize("variant", ["2x4-gunicorn", "2x1-gunicorn", "2x4-granian"])
def test_started_as_root_every_peer_process_runs_as_the_run_user(start_peer, variant, transport):
    stack = start_peer(variant, transport=transport, nginx_workers=2)
    layout = stack.layout
    assert layout.drops_privileges and layout.user != "root"
    user = pwd.getpwnam(layout.user)
    own_groups = set(os.getgrouplist(layout.user, user.pw_gid))
    processes = tree(stack.app.pid)
    assert len(processes) == 1 + layout.processes
    for pid in processes:  # the master too: it was started as the run user
        proc = psutil.Process(pid)
        assert set(proc.uids()) == {user.pw_uid}, (pid, proc.uids())
        assert set(proc.gids()) == {user.pw_gid}, (pid, proc.gids())
        assert groups_of(pid) == own_groups, f"pid {pid} kept groups {groups_of(pid)} (root's?)"
        assert cap_eff(pid) == 0, f"pid {pid} kept capabilities"
    deadline = time.monotonic() + 5  # a worker nginx has just forked switches user a moment later
    while True:
        nginx_workers = psutil.Process(stack.nginx.pid).children()
        if all(set(p.uids()) == {user.pw_uid} for p in nginx_workers):
            break
        assert time.monotonic() < deadline, [(p.pid, p.uids()) for p in nginx_workers]
        time.sleep(0.05)  # polling interval
    assert len(nginx_workers) == 2
    seen = {int(h["x-worker-pid"]) for _, h, _ in concurrently(via_nginx, [(layout, SLOW)] * 12)}
    assert seen <= set(stack.worker_pids().values()) and seen, seen


@pytest.mark.parametrize("variant", ["2x4-gunicorn", "2x4-gunicorn@protocol=uwsgi", "2x4-granian"])
def test_unix_socket_is_0660_and_served(start_peer, variant):
    stack = start_peer(variant, transport="unix")
    layout = stack.layout
    path = layout.sockets[0].address
    st = os.stat(path)
    assert stat.S_ISSOCK(st.st_mode)
    mode = stat.S_IMODE(st.st_mode)
    assert mode == 0o660, f"{path} has mode {mode:o}"
    assert pwd.getpwuid(st.st_uid).pw_name == layout.user
    assert bound_inet_sockets(tree(stack.app.pid)) == [], "no TCP socket with unix transport"
    spread(layout, SLOW, set(stack.worker_pids().values()))
    if ROOT:
        # The run user (nginx's workers) gets in; nobody else does, even with the directories opened.
        assert connect_as(layout.user, path) == "connected"
        run_dir, sockets_dir = Path(layout.run_dir), Path(layout.run_dir) / "sockets"
        modes = {d: d.stat().st_mode & 0o7777 for d in (run_dir, sockets_dir)}
        try:
            for d, m in modes.items():
                d.chmod(m | 0o001)
            assert connect_as("nobody", path) == str(errno.EACCES)
        finally:
            for d, m in modes.items():
                d.chmod(m)
    stack.stop()
    if layout.server == "gunicorn":
        assert not os.path.exists(path), "gunicorn removes its unix socket on exit"


def test_gunicorn_trusts_only_the_scheme_header_nginx_sets(start_peer):
    stack = start_peer("1x2-gunicorn")
    import http.client

    conn = http.client.HTTPConnection(stack.layout.listen_host, stack.layout.listen_port, timeout=10)
    try:
        # gunicorn's default would read X-Forwarded-Ssl as https, contradict nginx's
        # X-Forwarded-Proto: http, and answer 400.
        conn.request("GET", FAST, headers={"X-Forwarded-Ssl": "on", "X-Forwarded-Protocol": "ssl",
                                           "X-Forwarded-Proto": "https"})
        resp = conn.getresponse()
        assert (resp.status, resp.read()) == (200, b"Hello, world")
    finally:
        conn.close()


# --- a user's app: the Flask shop in its own virtualenv ---------------------------------------------------


@pytest.mark.parametrize("variant", ["2x4-gunicorn", "2x4-granian"])
def test_flask_app_from_its_own_virtualenv(flask_app, start_peer, variant):
    greeting = "50% off, p%40ss%"
    stack = start_peer(variant, **flask_app.layout_options(env=[f"{flask_app.greeting_var}={greeting}"]))
    layout = stack.layout
    assert via_nginx(layout, "/")[::2] == (200, b"Hello from shop")
    status, _, body = via_nginx(layout, "/greeting")
    assert (status, json.loads(body)) == (200, {"greeting": greeting})
    assert via_nginx(layout, "/assets/hello.txt")[::2] == (200, flask_app.files["hello.txt"])

    # The app's interpreter and packages are its venv's; only the server comes from ours.
    status, _, body = via_nginx(layout, "/where")
    where = json.loads(body)
    assert Path(where["prefix"]) == flask_app.venv, where
    assert Path(where["flask"]).is_relative_to(flask_app.venv), where
    ours = Path(sys.prefix)
    server_module = Path(where["modules"][layout.server])
    assert server_module.is_relative_to(ours) and not server_module.is_relative_to(flask_app.venv), where
    if "click" in where["modules"]:  # Flask's own click wins over granian's requirement from our venv
        assert Path(where["modules"]["click"]).is_relative_to(flask_app.venv), where
    spread(layout, "/slow?ms=300", set(stack.worker_pids().values()))
    stack.check_alive()


# --- `uwsgi-layouts run` as a user runs it --------------------------------------------------------------


def wait_serving(proc, port: int, log_dir: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            pytest.fail(f"run exited with {proc.returncode} before serving:\n{(log_dir / 'run.err').read_text()}")
        try:
            if http_get("127.0.0.1", port, FAST, timeout=5)[0] == 200:
                return
        except OSError:
            pass
        assert time.monotonic() < deadline, (log_dir / "run.err").read_text()
        time.sleep(0.1)  # polling interval


@pytest.mark.parametrize("variant", ["2x4-gunicorn@reuse_port=on", "2x4-granian"])
def test_deploy_run_serves_a_peer_until_sigterm(tmp_run_dir, tmp_path, free_ports, leftover_processes, variant):
    base, listen = free_ports(2)
    run_dir = tmp_run_dir / "run"
    proc = start_deploy_run(variant, "--run-dir", str(run_dir), "--base-port", str(base), "--listen",
                            f"127.0.0.1:{listen}", log_dir=tmp_path)
    try:
        wait_serving(proc, listen, tmp_path)
        server = re.match(r"\d+x\d+-(\w+)", variant)[1]
        deadline = time.monotonic() + 10  # nginx answers a moment before run prints its line
        while "serving" not in (out := (tmp_path / "run.out").read_text()):
            assert time.monotonic() < deadline, out
            time.sleep(0.05)
        assert f"serving {variant.partition('@')[0]} on http://127.0.0.1:{listen}/" in out, out
        assert f"{server}, no stats server" in out, out
        running = leftover_processes([str(run_dir)], timeout=0)
        names = " ".join(" ".join(p.cmdline()) for p in running)
        assert str(run_dir / ("gunicorn.conf.py" if server == "gunicorn" else "granian.env")) in names, names
        assert len(running) >= 5, names  # run + master + 2 workers + nginx master (+ worker)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0, (tmp_path / "run.err").read_text()
        err = (tmp_path / "run.err").read_text()
        assert "Traceback" not in err, err
        assert f"stopped nginx and {server}" in (tmp_path / "run.out").read_text()
        assert leftover_processes([str(run_dir)], timeout=5) == []
        assert port_closed(listen) and port_closed(base)
    finally:
        kill_run(proc)


def test_reload_of_a_peer_is_refused_with_one_line(start_peer):
    stack = start_peer("1x2-gunicorn")
    proc = subprocess.run([sys.executable, "-m", "uwsgi_layouts", "reload", stack.layout.name, "--run-dir",
                           stack.layout.run_dir], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: layout: 1x2-gunicorn runs gunicorn"), proc.stderr
    assert "SIGHUP" in lines[0]
    stack.check_alive()


def test_uwsgi_socket_of_gunicorn_speaks_uwsgi(start_peer):
    # A uwsgi packet as nginx sends it, straight to gunicorn's socket: gunicorn answers it...
    stack = start_peer("1x2-gunicorn@protocol=uwsgi", transport="tcp")
    env = {"REQUEST_METHOD": "GET", "REQUEST_URI": FAST, "PATH_INFO": "/", "QUERY_STRING": FAST.partition("?")[2],
           "SERVER_PROTOCOL": "HTTP/1.1", "SERVER_NAME": "t", "SERVER_PORT": "80", "REMOTE_ADDR": "127.0.0.1",
           "REMOTE_PORT": "1", "HTTP_HOST": "t"}
    with socket.create_connection(("127.0.0.1", stack.layout.base_port), timeout=10) as conn:
        conn.sendall(uwsgi_packet(env))
        reply = b""
        while b"Hello, world" not in reply:  # gunicorn keeps the connection: read up to the body
            chunk = conn.recv(65536)
            assert chunk, reply
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 200 OK\r\n"), reply
    # ...and no plain HTTP request.
    with socket.create_connection(("127.0.0.1", stack.layout.base_port), timeout=10) as conn:
        conn.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        conn.settimeout(10)
        reply = b""
        try:
            while chunk := conn.recv(65536):
                reply += chunk
        except OSError:
            pass
    assert not reply.startswith(b"HTTP/1.1 200"), "plain HTTP must not be served on the uwsgi socket"
