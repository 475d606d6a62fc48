"""Security of the running stack, checked on real processes (not only on rendered files).

* No uWSGI socket and no stats server listens on a non-loopback address, for every strategy
  and transport (the listening sockets of the live processes, via psutil).
* Unix sockets are 0660 or tighter, and another unprivileged user is refused, even when the
  directories on the way are opened to it.
* Magic variables (UWSGI_FILE, UWSGI_SCRIPT, UWSGI_MODULE, UWSGI_APPID, UWSGI_SETENV) sent
  through nginx as headers, query strings or cookies load and run nothing; the same packet sent
  straight to the uwsgi socket gets uWSGI's 403 from the route-if-not lines (without them it
  loads the file: tests/integration/test_local_users.py, the control that proves the marker works).
* Started as root, uWSGI's master and workers and nginx's workers run unprivileged.
* Hostile app input through nginx gets a 4xx with a reason, never a 5xx, and the workers
  stay up.
"""

from __future__ import annotations

import errno
import os
import pwd
import re
import socket
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import psutil
import pytest

from tests.integration.attacks import marker_app
from tests.integration.support import FAST, uwsgi_packet, via_nginx
from uwsgi_layouts.deploy.model import STRATEGIES
from uwsgi_layouts.deploy.render import crosscheck, nginx_summary, write_layout

UWSGI_STRATEGIES = [name for name, s in STRATEGIES.items() if s.server == "uwsgi"]  # peers: test_peers.py

ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="needs root: only root can switch to other users and drop privileges")
MAGIC = ("UWSGI_FILE", "UWSGI_SCRIPT", "UWSGI_MODULE", "UWSGI_APPID", "UWSGI_SETENV")
CHILD_PYTHON = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable


def integration(test):
    return pytest.mark.integration(pytest.mark.timeout(120)(test))


def tree(pid: int) -> set[int]:
    proc = psutil.Process(pid)
    return {pid, *(c.pid for c in proc.children(recursive=True))}


def bound_inet_sockets(pids: set[int]) -> list:
    """TCP sockets in LISTEN and bound UDP sockets of these processes (IPv4 and IPv6)."""
    out = []
    for conn in psutil.net_connections(kind="inet"):
        if conn.pid not in pids or not conn.laddr:
            continue
        if conn.type == socket.SOCK_DGRAM or conn.status == psutil.CONN_LISTEN:
            out.append(conn)
    return out


# --- listening sockets ----------------------------------------------------------------------------


@pytest.mark.parametrize("transport", ["tcp", "unix"])
@pytest.mark.parametrize("strategy", UWSGI_STRATEGIES)
@integration
def test_uwsgi_and_stats_listen_on_loopback_only(start_stack, strategy, transport):
    stack = start_stack(f"2x2-{strategy}", transport=transport, nginx_workers=2, reuseport=(strategy == "mapped"))
    layout = stack.layout
    uwsgi, nginx = tree(stack.uwsgi.pid), tree(stack.nginx.pid)
    assert len(uwsgi) >= 1 + layout.processes and len(nginx) >= 1 + 2

    uwsgi_bound = bound_inet_sockets(uwsgi)
    addresses = {(c.laddr.ip, c.laddr.port) for c in uwsgi_bound}
    assert all(c.type == socket.SOCK_STREAM for c in uwsgi_bound), uwsgi_bound
    assert all(ip == "127.0.0.1" for ip, _ in addresses), f"uWSGI listens beyond loopback: {addresses}"
    expected = set()  # the stats server is a unix socket
    if transport == "tcp":
        expected |= {("127.0.0.1", int(s.address.rpartition(":")[2])) for s in layout.sockets}
    assert addresses == expected

    unix_paths = {c.laddr for c in psutil.net_connections(kind="unix")
                  if c.pid in uwsgi and c.laddr}  # bound (psutil reports no LISTEN state for unix)
    if transport == "unix":
        assert unix_paths == {s.address for s in layout.sockets} | {layout.stats_address}
    else:
        assert unix_paths == {layout.stats_address}

    nginx_bound = {(c.laddr.ip, c.laddr.port, c.type) for c in bound_inet_sockets(nginx)}
    assert nginx_bound == {(layout.listen_host, layout.listen_port, socket.SOCK_STREAM)}, nginx_bound


# --- unix socket permissions ------------------------------------------------------------------------


def connect_as(user: str, path: str) -> str:
    """Try an AF_UNIX connect as ``user`` (a fresh process that switched uid/gid): 'connected' or the errno."""
    code = ("import socket, sys\ns = socket.socket(socket.AF_UNIX)\ntry:\n    s.connect(sys.argv[1])\n"
            "    print('connected')\nexcept OSError as e:\n    print(e.errno)\n")
    entry = pwd.getpwnam(user)
    proc = subprocess.run([CHILD_PYTHON, "-c", code, path], user=entry.pw_uid, group=entry.pw_gid,
                          extra_groups=os.getgrouplist(user, entry.pw_gid), cwd="/", capture_output=True,
                          text=True, timeout=30)
    return proc.stdout.strip() or proc.stderr.strip()


@needs_root
@integration
def test_unix_sockets_refuse_another_unprivileged_user(start_stack):
    stack = start_stack("2x4-mapped", transport="unix")
    layout = stack.layout
    assert layout.user != "nobody", "the test needs the stack to run as someone other than nobody"
    run_dir, sockets_dir = Path(layout.run_dir), Path(layout.run_dir) / "sockets"
    for s in layout.sockets:
        mode = os.stat(s.address).st_mode & 0o777
        assert mode & ~0o660 == 0, f"{s.address} has mode {mode:o}"
        # The user uWSGI runs as (and nginx's workers) gets in; nobody else does.
        assert connect_as(layout.user, s.address) == "connected"
        assert connect_as("nobody", s.address) == str(errno.EACCES)
    # Even with every directory on the way opened to others, the socket's own mode refuses.
    modes = {d: d.stat().st_mode & 0o7777 for d in (run_dir, sockets_dir)}
    try:
        for d, mode in modes.items():
            d.chmod(mode | 0o001)
        for s in layout.sockets:
            assert connect_as("nobody", s.address) == str(errno.EACCES), "the socket mode alone must refuse"
    finally:
        for d, mode in modes.items():
            d.chmod(mode)
    assert via_nginx(layout, FAST)[0] == 200


# --- magic variables ----------------------------------------------------------------------------------


def http_status(layout, path: str, headers: dict[str, str]) -> tuple[int, bytes]:
    import http.client

    conn = http.client.HTTPConnection(layout.listen_host, layout.listen_port, timeout=20)
    try:
        conn.request("GET", path, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


@integration
def test_magic_variables_through_nginx_load_nothing(start_stack, run_dirs):
    evil, marker = marker_app(run_dirs() / "magic")
    values = {"UWSGI_FILE": str(evil), "UWSGI_SCRIPT": "evil", "UWSGI_MODULE": "evil", "UWSGI_APPID": "evil",
              "UWSGI_SETENV": "PYTHONPATH=" + str(evil.parent)}
    extra = {"UWSGI_CHDIR": str(evil.parent), "UWSGI_PYHOME": str(evil.parent)}
    stack = start_stack("2x4-mapped", transport="tcp")
    layout = stack.layout
    pids = stack.worker_pids()

    attempts = []
    for name in MAGIC:
        value = values[name]
        attempts += [
            (f"header {name}", FAST, {name: value}),
            (f"header {name.replace('_', '-')}", FAST, {name.replace("_", "-"): value}),
            (f"query {name}", f"/?{name}={quote(value)}", {}),
            (f"cookie {name}", FAST, {"Cookie": f"{name}={value}"}),
        ]
    everything = {**values, **extra}
    attempts += [
        ("all headers", FAST, {**everything, **{k.replace("_", "-"): v for k, v in everything.items()}}),
        ("all in the query", "/?" + "&".join(f"{k}={quote(v)}" for k, v in everything.items()), {}),
        ("all as cookies", FAST, {"Cookie": "; ".join(f"{k}={v}" for k, v in everything.items())}),
        ("SCRIPT_NAME too", FAST, {"SCRIPT_NAME": "/evil", "SCRIPT-NAME": "/evil", **everything}),
    ]
    for what, path, headers in attempts:
        status, body = http_status(layout, path, headers)
        assert status < 500, (what, status, body)
        assert body != b"EVIL", f"{what}: the marker app answered"
    assert not marker.exists(), f"a magic variable through nginx loaded code: {marker.read_text()!r}"
    log = stack.uwsgi_log.read_text(errors="replace")
    assert not re.search(r"WSGI app [1-9]", log), "uWSGI loaded a second app"
    assert stack.worker_pids() == pids
    assert via_nginx(layout, FAST)[0] == 200

    # Straight to the uwsgi socket, the same variables reach uWSGI: its route-if-not lines answer
    # 403 before any app is chosen (without them the file loads: test_local_users.py).
    status, body = raw_uwsgi(layout.sockets[0].address, {"UWSGI_FILE": str(evil), "UWSGI_APPID": "evil"})
    assert status == "HTTP/1.1 403 Forbidden" and not marker.exists(), (status, body)


def raw_uwsgi(address: str, extra: dict[str, str]) -> tuple[str, bytes]:
    env = {"REQUEST_METHOD": "GET", "REQUEST_URI": "/healthz", "PATH_INFO": "/healthz", "QUERY_STRING": "",
           "SERVER_PROTOCOL": "HTTP/1.1", "SERVER_NAME": "t", "SERVER_PORT": "80", "REMOTE_ADDR": "127.0.0.1",
           "HTTP_HOST": "t", **extra}
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=20) as conn:
        conn.sendall(uwsgi_packet(env))
        data = b""
        while chunk := conn.recv(65536):
            data += chunk
    return data.split(b"\r\n", 1)[0].decode("latin-1"), data


# --- the generated files: no UWSGI_* parameter takes a client's value ----------------------------


@pytest.mark.parametrize("transport", ["tcp", "unix"])
@pytest.mark.parametrize("strategy", UWSGI_STRATEGIES)
def test_no_generated_uwsgi_param_takes_a_client_value(make_layout, strategy, transport):
    layout = make_layout(f"2x2-{strategy}", transport=transport, nginx_workers=2)
    write_layout(layout, layout.run_dir, check_nginx=False)
    out = Path(layout.run_dir)
    params = nginx_summary(out / "nginx.conf")["uwsgi_params"]
    assert params, "uwsgi_params is included"
    client = re.compile(r"\$(arg_|args|query_string|request_uri|http_|cookie_|request_body|uri|document_uri)")
    for args in params:
        if args[0].upper().startswith("UWSGI_"):
            assert not client.search(" ".join(args[1:])), args
    assert not [a for a in params if a[0].upper().startswith("UWSGI_")], "no UWSGI_* parameter is generated at all"
    assert crosscheck(layout, out) == []


@pytest.mark.parametrize("line", [
    "uwsgi_param UWSGI_FILE $arg_f;",
    "uwsgi_param UWSGI_SCRIPT $http_x_script;",
    "uwsgi_param UWSGI_MODULE $cookie_m;",
    "uwsgi_param UWSGI_APPID $args;",
    "uwsgi_param uwsgi_setenv $request_uri;",
])
def test_crosscheck_flags_a_tampered_uwsgi_params(make_layout, line):
    layout = make_layout("2x4-mapped")
    write_layout(layout, layout.run_dir, check_nginx=False)
    out = Path(layout.run_dir)
    with open(out / "uwsgi_params", "a") as f:
        f.write(line + "\n")
    problems = crosscheck(layout, out)
    name = line.split()[1]
    assert any(name in p and "client-controlled" in p for p in problems), problems


# --- privileges ------------------------------------------------------------------------------------------


@needs_root
@pytest.mark.parametrize("transport", ["tcp", "unix"])
@integration
def test_started_as_root_nothing_serves_as_root(start_stack, transport):
    stack = start_stack("2x4-mapped", transport=transport, nginx_workers=2)
    layout = stack.layout
    assert layout.drops_privileges
    user = pwd.getpwnam(layout.user)
    assert user.pw_uid != 0
    uwsgi = [psutil.Process(pid) for pid in tree(stack.uwsgi.pid)]
    assert len(uwsgi) == 1 + layout.processes
    for proc in uwsgi:  # master included: uWSGI drops privileges right after binding
        assert set(proc.uids()) == {user.pw_uid}, (proc.pid, proc.uids())
        assert set(proc.gids()) == {user.pw_gid}, (proc.pid, proc.gids())
        assert cap_eff(proc.pid) == 0, f"uWSGI pid {proc.pid} kept capabilities"
    assert set(stack.worker_pids().values()) <= {p.pid for p in uwsgi}
    master = psutil.Process(stack.nginx.pid)
    workers = master.children()
    assert len(workers) == 2
    for proc in workers:
        assert set(proc.uids()) == {user.pw_uid}, (proc.pid, proc.uids())
        assert cap_eff(proc.pid) == 0
    assert via_nginx(layout, FAST)[0] == 200


def cap_eff(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    raise AssertionError(f"no CapEff for {pid}")


# --- hostile input to the app through nginx -----------------------------------------------------------------

HOSTILE = [
    ("percent-encoded non-UTF-8 value", b"/?rounds=%ff%fe"),
    ("percent-encoded non-UTF-8 name", b"/?%ff%fe=1"),
    ("raw non-UTF-8 bytes in the query", b"/?rounds=\xff\xfe"),
    ("raw non-UTF-8 bytes in the path", b"/\xff\xfe"),
    ("NUL in a value", b"/?rounds=%00"),
    ("name without a value", b"/?rounds"),
    ("only separators and equals", b"/?=&=&=="),
    ("semicolon separator", b"/?rounds=1;fib=2"),
    ("huge integer", b"/?fib=999999999999"),
    ("huger integer", b"/?io_ms=" + b"9" * 400),
    ("negative zero", b"/?rounds=-0"),
    ("full-width digit", b"/?rounds=%EF%BC%91"),
    ("too many fields", b"/?" + b"&".join(b"a%d=1" % i for i in range(60))),
    ("6 KB value", b"/?rounds=" + b"1" * 6000),
    ("6 KB of %ff", b"/?rounds=" + b"%ff" * 2000),
    ("6 KB path", b"/" + b"a" * 6000),
    ("10 KB URL", b"/?rounds=" + b"1" * 10000),
    ("dot-dot path", b"/%2e%2e/%2e%2e/etc/passwd"),
    ("encoded slash path", b"/..%2f..%2fetc%2fpasswd"),
]


def raw_http(layout, request: bytes, timeout: float = 20.0) -> tuple[int, bytes]:
    """Send bytes as they are (no client-side validation) and read until nginx closes."""
    with socket.create_connection((layout.listen_host, layout.listen_port), timeout=timeout) as conn:
        conn.sendall(request)
        data = b""
        while chunk := conn.recv(65536):
            data += chunk
    m = re.match(rb"HTTP/1\.[01] (\d{3})", data)
    assert m, f"no HTTP status line in {data[:200]!r}"
    return int(m[1]), data.partition(b"\r\n\r\n")[2]


def get(target: bytes) -> bytes:
    return b"GET " + target + b" HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"


@integration
def test_hostile_app_input_gets_a_4xx_with_a_reason_and_workers_stay_healthy(start_stack):
    stack = start_stack("2x4-mapped")
    layout = stack.layout
    pids = stack.worker_pids()
    requests = [(what, get(target)) for what, target in HOSTILE] + [
        ("unknown method", b"FROB / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"),
        ("PUT", b"PUT / HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"),
        ("12 KB cookie", b"GET / HTTP/1.1\r\nHost: localhost\r\nCookie: c=" + b"x" * 12000
         + b"\r\nConnection: close\r\n\r\n"),
        ("negative content length", b"POST / HTTP/1.1\r\nHost: localhost\r\nContent-Length: -1\r\n"
         b"Connection: close\r\n\r\n"),
        ("8 KB URL + 3 headers of 7.9 KB", b"GET /?rounds=" + b"1" * 8000 + b" HTTP/1.1\r\nHost: localhost\r\n"
         + b"".join(b"X-Big-%d: " % i + b"y" * 7900 + b"\r\n" for i in range(3)) + b"Connection: close\r\n\r\n"),
        ("2 MB body announced", b"POST /?rounds=1&fib=0&io_ms=0 HTTP/1.1\r\nHost: localhost\r\n"
         b"Content-Length: 2000000\r\nConnection: close\r\n\r\n"),
    ]
    seen = []
    for what, request in requests:
        status, body = raw_http(layout, request)
        seen.append((what, status))
        assert 400 <= status < 500, f"{what}: HTTP {status}: {body[:300]!r}"
        assert body.strip(), f"{what}: a {status} without a reason"
    print("\n" + "\n".join(f"  {status}  {what}" for what, status in seen))
    assert sum(1 for _, s in seen if s == 400) >= 10  # most are the app's 400 with the field named

    # The workers are the same processes, idle, and still serve.
    assert stack.worker_pids() == pids
    stack.check_alive()
    assert via_nginx(layout, FAST)[0] == 200
    log = stack.uwsgi_log.read_text(errors="replace")
    assert "Traceback" not in log, log[-2000:]
