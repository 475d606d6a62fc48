"""watch --access-log-socket: nginx's timed lines as syslog datagrams on a unix socket watch creates
(bench/watch/datagrams.py). Real sockets; nginx sending to it runs in
tests/integration/test_bundle_kubernetes.py (the pod's exporter sidecar)."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.conftest import find_free_ports
from uwsgi_layouts.bench.watch import DatagramLog, LogWatch
from uwsgi_layouts.bench.watch.datagrams import strip_header
from uwsgi_layouts.bench.watchcli import DEFAULT_BUCKETS

LINE = ('10.0.0.7 - - [27/Nov/2026:09:31:02 +0000] "GET /slow HTTP/1.1" 200 12 "-" "curl/8" rt=0.031 '
        'urt="0.030" ua="unix:/run/shop/uwsgi-0.sock"')


def send(path: str, *datagrams: bytes) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sender:
        for datagram in datagrams:
            sender.sendto(datagram, path)


def read_until(log: DatagramLog, count: int, timeout: float = 5.0) -> list[str]:
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while len(lines) < count and time.monotonic() < deadline:
        lines += log.read()
        time.sleep(0.05)
    return lines


def test_strip_header_takes_nginx_syslog_forms():
    body = LINE.encode()
    assert strip_header(b"<190>Nov 27 09:31:02 nginx: " + body) == body
    assert strip_header(b"<190>Nov  7 09:31:02 shop-pod-0 nginx: " + body + b"\n") == body  # with a hostname
    assert strip_header(body) == body  # no header: taken whole


def test_lines_arrive_and_the_socket_is_ours(tmp_path):
    path = str(tmp_path / "access.sock")
    log = DatagramLog(path)
    try:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o660 and stat.S_ISSOCK(os.stat(path).st_mode)
        send(path, *[f"<190>Nov 27 09:31:0{i} nginx: {LINE}".encode() for i in range(3)])
        assert read_until(log, 3) == [LINE] * 3
        assert log.read() == []
    finally:
        log.close()
    assert not os.path.exists(path)  # removed on close


def test_log_watch_reads_the_datagrams_into_histograms(tmp_path):
    path = str(tmp_path / "access.sock")
    watch = LogWatch(path, DEFAULT_BUCKETS, 60, tell=lambda _: None, tail=DatagramLog(path))
    watch.start()
    try:
        send(path, *[f"<190>Nov 27 09:31:02 nginx: {LINE}".encode()] * 4)
        deadline = time.monotonic() + 5
        while watch.snapshot()[1]["timed"] < 4 and time.monotonic() < deadline:
            time.sleep(0.1)
        _, lines = watch.snapshot()
        assert lines == {"timed": 4, "untimed": 0}
    finally:
        watch.stop()
    assert not os.path.exists(path)


def test_a_socket_left_by_a_killed_watch_is_replaced_anything_else_never(tmp_path):
    path = str(tmp_path / "access.sock")
    child = subprocess.Popen([sys.executable, "-c", "import time; from uwsgi_layouts.bench.watch import DatagramLog; "
                              f"DatagramLog({path!r}); print('bound', flush=True); time.sleep(60)"],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "bound"
        try:  # while it runs, the path is its: refused
            DatagramLog(path)
            raise AssertionError("a live watch's socket was replaced")
        except FileExistsError:
            pass
    finally:
        child.kill()
        child.wait()
    log = DatagramLog(path)  # SIGKILL left the file: nobody receives on it, so it is replaced
    log.close()
    regular = tmp_path / "not-a-socket"
    regular.write_text("keep me\n")
    try:
        DatagramLog(str(regular))
        raise AssertionError("a regular file was replaced")
    except FileExistsError:
        pass
    assert regular.read_text() == "keep me\n"


def run_watch(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "uwsgi_layouts", "watch", *args], capture_output=True, text=True,
                          timeout=60)


def test_bad_log_socket_arguments_exit_2_with_one_line(tmp_path):
    both = run_watch("--access-log", str(tmp_path / "a.log"), "--access-log-socket", str(tmp_path / "a.sock"))
    relative = run_watch("--access-log-socket", "a.sock")
    (tmp_path / "taken").write_text("")
    taken = run_watch("--access-log-socket", str(tmp_path / "taken"), "--listen", str(tmp_path / "m.sock"))
    for proc, words in ((both, "not both"), (relative, "must be absolute"), (taken, "cannot create")):
        assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, proc.stderr
        assert proc.stderr.startswith("uwsgi-layouts watch: error: access_log_socket: ") or \
            "access_log_socket:" in proc.stderr, proc.stderr
        assert words in proc.stderr, proc.stderr
    assert not (tmp_path / "m.sock").exists()  # nothing left behind


@pytest.mark.integration
def test_real_nginx_sends_its_lines_and_reconnects_after_an_exporter_restart(tmp_path):
    """nginx's `access_log syslog:server=unix:PATH,nohostname`: before the socket exists each line
    is lost (nginx says so in its error log), once it exists every line arrives without its syslog
    header, and after the exporter's socket is made anew (a restarted sidecar) nginx reconnects."""
    port = find_free_ports(1)[0]
    path = tmp_path / "access.sock"
    (tmp_path / "nginx.conf").write_text(
        # Workers as root: they reach the socket (0660, root's) in pytest's 0700 directories; in the pod
        # nginx's user shares the socket's group.
        f"daemon off; user root; pid {tmp_path}/nginx.pid; error_log {tmp_path}/error.log warn;\n"
        "events {}\n"
        f"http {{ access_log syslog:server=unix:{path},nohostname; client_body_temp_path {tmp_path}; "
        f"proxy_temp_path {tmp_path}; fastcgi_temp_path {tmp_path}; uwsgi_temp_path {tmp_path}; "
        f"scgi_temp_path {tmp_path};\n"
        f"  server {{ listen 127.0.0.1:{port}; location / {{ return 200 \"ok\\n\"; }} }} }}\n")
    nginx = subprocess.Popen(["nginx", "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf")])

    def get(n: int) -> None:
        for _ in range(n):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as r:
                assert r.status == 200

    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                get(1)  # no socket yet: the line is lost, the answer is not
                break
            except OSError:
                assert time.monotonic() < deadline, "nginx did not start"
                time.sleep(0.2)
        while "send() to syslog failed" not in (tmp_path / "error.log").read_text():  # logged after the answer
            assert time.monotonic() < deadline, (tmp_path / "error.log").read_text()
            time.sleep(0.1)
        for restart in range(2):
            log = DatagramLog(str(path))
            try:
                get(3)
                lines = read_until(log, 3 - restart)  # a restart loses the first line: its send is refused
                assert len(lines) == 3 - restart and all(x.startswith('127.0.0.1 - - [') for x in lines), lines
            finally:
                log.close()
    finally:
        nginx.terminate()
        nginx.wait(30)
