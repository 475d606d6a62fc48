"""Issue 31: uWSGI's stats server shows the variables of every request in flight (HTTP_COOKIE,
HTTP_AUTHORIZATION), so whoever can open it can take over the app's users' sessions. Tried for
real as ``nobody`` while a request carrying a session cookie and a bearer token is being served:

* ``run`` (the default): the stats server is a unix socket only the run user's group opens;
  ``nobody`` gets EACCES, and uWSGI listens on no TCP port at all. The control, the "before":
  with ``--stats-port P --allow-tcp-stats`` the same read as ``nobody`` returns the cookie.
* ``--stats-port`` without ``--allow-tcp-stats``: one line naming the option, exit 2, nothing
  started or written.
* a ``compare`` stack mid-run: the same (EACCES, no TCP), and after the run no file compare
  wrote holds the cookie, though one such request was served during its cells.
* our own reader (``read_stats``, used by the samplers, doctor and every record) drops the
  request variables: the raw document holds the cookie, what the reader returns does not.

The installed bundle: test_bundle_install.py (the same attack on its /run/NAME/SLOT/stats.sock).
"""

from __future__ import annotations

import errno
import http.client
import json
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest

from tests.integration.attacks import ROOT_ONLY, read_as
from tests.integration.support import REPO_ROOT, SLOW, kill_run, port_closed
from tests.integration.test_stack import start_run, wait_for_hello
from uwsgi_layouts.deploy.run import read_stats

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240), ROOT_ONLY]

COOKIE = "session=SECRET-SESSION-123"
TOKEN = "Bearer TOKEN-XYZ"
SECRETS = ("SECRET-SESSION-123", "TOKEN-XYZ")


@contextmanager
def request_in_flight(port: int, path: str = SLOW.format(ms=4000), host: str = "localhost"):
    """A GET ``path`` (a slow one) through nginx on 127.0.0.1:``port`` carrying a session cookie and
    a bearer token, in flight while the block runs; its status in the yielded list (0: it failed)."""
    status: list[int] = []

    def send():
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        try:
            conn.request("GET", path, headers={"Host": host, "Cookie": COOKIE, "Authorization": TOKEN})
            status.append(conn.getresponse().status)
        except OSError:  # the stack went away under it (compare restarts its stacks)
            status.append(0)
        finally:
            conn.close()

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    try:
        yield status
    finally:
        thread.join(timeout=60)


def raw_stats(address: str) -> str:
    """The stats server's document as it is sent (as root), request variables and all."""
    return read_as("root", address).removeprefix("read ")


def wait_for_secret(address: str, status: list[int], timeout: float = 10.0) -> str:
    """Poll the raw document until it shows the request in flight with its cookie: the control that
    the request being looked for is there to be stolen."""
    deadline = time.monotonic() + timeout
    while True:
        raw = raw_stats(address)
        if COOKIE in raw and TOKEN in raw:
            return raw
        assert time.monotonic() < deadline, f"no request with the cookie in flight at {address} (its answer: " \
                                            f"{status or 'none yet'}): {raw[:300]}"
        time.sleep(0.1)  # polling: the request reaches a worker after nginx accepted it


def serving_line(log_dir: Path, timeout: float = 20.0) -> str:
    """run's "serving ..." line (nginx answers a moment before run prints it, and its warnings)."""
    deadline = time.monotonic() + timeout
    while True:
        line = next((x for x in (log_dir / "run.out").read_text().splitlines() if x.startswith("serving")), "")
        if line:
            return line
        assert time.monotonic() < deadline, (log_dir / "run.err").read_text()
        time.sleep(0.1)  # polling: run prints it once its stack is ready


def uwsgi_command(p: psutil.Process) -> list[str]:
    """A uWSGI process's command line; [] for another process, or one that has ended meanwhile (the
    compare's tree changes while it is read: a child that exited is a zombie until it is reaped)."""
    try:
        return p.cmdline() if p.name() == "uwsgi" else []
    except psutil.Error:
        return []


def uwsgi_tcp_listeners(root_pid: int) -> set[tuple[str, int]]:
    """The TCP addresses a uWSGI process tree listens on."""
    root = psutil.Process(root_pid)
    pids = {root.pid, *(c.pid for c in root.children(recursive=True))}
    return {(c.laddr.ip, c.laddr.port) for c in psutil.net_connections(kind="tcp")
            if c.pid in pids and c.status == psutil.CONN_LISTEN}


# --- run ----------------------------------------------------------------------------------------


def test_run_stats_is_a_unix_socket_nobody_can_open(tmp_run_dir, tmp_path, free_ports):
    base, listen, _ = free_ports(3)
    proc = start_run(tmp_run_dir, tmp_path, "--for", "120", ports=(base, listen, 0))
    try:
        wait_for_hello(proc, listen, tmp_path)
        address = f"{tmp_run_dir}/control/stats.sock"
        assert f"uWSGI stats: {address}" in serving_line(tmp_path)
        with request_in_flight(listen) as status:
            wait_for_secret(address, status)
            assert read_as("nobody", address) == f"errno {errno.EACCES}"
            ours = json.dumps(read_stats(address))
            assert not any(s in ours for s in SECRETS), "the reader kept a request's variables"
            assert '"in_request": 1' in ours  # the request is still there, without its variables
            uwsgi = [p for p in psutil.Process(proc.pid).children(recursive=True) if p.name() == "uwsgi"]
            assert uwsgi and all(uwsgi_tcp_listeners(p.pid) == set() for p in uwsgi), "uWSGI listens on TCP"
        assert status == [200]
    finally:
        kill_run(proc)


def test_with_allow_tcp_stats_nobody_reads_the_cookie(tmp_run_dir, tmp_path, free_ports):
    """The "before": what the risk option accepts, the attack of the issue, word for word."""
    base, listen, stats = free_ports(3)
    proc = start_run(tmp_run_dir, tmp_path, "--for", "120", ports=(base, listen, stats), tcp_stats=True)
    try:
        wait_for_hello(proc, listen, tmp_path)
        serving_line(tmp_path)
        assert "--allow-tcp-stats" in (tmp_path / "run.err").read_text()  # the warning says what it exposes
        with request_in_flight(listen) as status:
            wait_for_secret(f"127.0.0.1:{stats}", status)
            stolen = read_as("nobody", f"127.0.0.1:{stats}")
        assert stolen.startswith("read ") and f"HTTP_COOKIE={COOKIE}" in stolen
        assert f"HTTP_AUTHORIZATION={TOKEN}" in stolen
    finally:
        kill_run(proc)


def test_stats_port_without_the_risk_option_starts_nothing(tmp_run_dir, tmp_path, free_ports):
    base, listen, stats = free_ports(3)
    run_dir = tmp_run_dir / "run"
    proc = subprocess.run([sys.executable, "-m", "uwsgi_layouts", "run", "2x2-mapped", "--run-dir", str(run_dir),
                           "--listen", f"127.0.0.1:{listen}", "--base-port", str(base), "--stats-port", str(stats),
                           "--for", "5"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: stats_port: ") and "--allow-tcp-stats" in lines[0], lines
    assert proc.stdout == "" and not run_dir.exists()
    assert port_closed(listen) and port_closed(stats)


# --- compare ------------------------------------------------------------------------------------


def test_a_compare_stack_mid_run_is_closed_to_nobody_and_stores_no_cookie(tmp_path):
    """The run's one stack (one layout, level and round) lives for the warm-up and an 8-s cell; the
    attack starts once nginx accepts (so no try is spent on a stack still starting) and takes about
    3 s (the slow request in flight, read as root and as nobody)."""
    out = tmp_path / "cmp"
    with open(tmp_path / "compare.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "uwsgi_layouts", "compare", "--out", str(out), "--layouts",
                                 "2x2-mapped", "--concurrency", "2", "--duration", "8", "--warmup", "1",
                                 "--repeats", "1"], cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while True:  # the stack's uWSGI master, once its stats socket is there and its nginx accepts
            assert proc.poll() is None, (tmp_path / "compare.log").read_text()[-3000:]
            commands = [uwsgi_command(p) for p in psutil.Process(proc.pid).children(recursive=True)]
            masters = [c for c in commands if "--ini" in c]
            run_dir = Path(masters[0][masters[0].index("--ini") + 1]).parent if masters else None
            if run_dir is not None and (run_dir / "control" / "stats.sock").is_socket():
                listen = json.loads((run_dir / "layout.json").read_text())["listen"].rpartition(":")[2]
                if not port_closed(int(listen)):
                    break
            assert time.monotonic() < deadline, "compare started no uWSGI with a stats socket behind nginx"
            time.sleep(0.2)  # polling: compare renders and starts its stack
        address = str(run_dir / "control" / "stats.sock")
        for attempt in range(1, 6):  # compare restarts the stack between its phases: a request may miss it
            with request_in_flight(int(listen), SLOW.format(ms=3000)) as status:
                try:
                    wait_for_secret(address, status, timeout=6)
                except AssertionError:
                    if attempt == 5:
                        raise
                    continue
                assert read_as("nobody", address) == f"errno {errno.EACCES}"
                masters = [p for p in psutil.Process(proc.pid).children(recursive=True) if uwsgi_command(p)]
                assert masters and all(uwsgi_tcp_listeners(p.pid) == set() for p in masters), "uWSGI on TCP"
            break
        rc = proc.wait(timeout=150)
        assert rc == 0, (tmp_path / "compare.log").read_text()[-3000:]
    finally:
        if proc.poll() is None:
            kill_run(proc)
    stored = [p for p in out.rglob("*") if p.is_file()]
    assert any(p.name == "results.json" for p in stored)
    leaked = [str(p) for p in stored if any(s.encode() in p.read_bytes() for s in SECRETS)]
    assert leaked == []
