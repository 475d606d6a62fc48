"""Helpers shared by the integration tests: talk uwsgi to a socket, fire requests together,
read per-worker counts, start `uwsgi-layouts run` as a user would (the caller stops it
with ``kill_run`` in a ``finally``; stacks started through the API: conftest.start_stack)."""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

import pytest

from uwsgi_layouts.deploy.machine import pyuwsgi_site
from uwsgi_layouts.deploy.run import http_get, read_stats

REPO_ROOT = Path(__file__).resolve().parents[2]
SLOW = "/?rounds=1&fib=0&io_ms={ms}"
FAST = "/?rounds=1&fib=1&io_ms=0"
UWSGI_BUILDS = REPO_ROOT / "build" / "uwsgi"  # scripts/build-uwsgi.sh's (make uwsgi-builds)
VENV_UWSGI = REPO_ROOT / ".venv" / "bin" / "uwsgi"  # make venv's: pyuwsgi
# Where make venv keeps the pyuwsgi wheel it compiled (scripts/install-pyuwsgi.sh KEEP_DIR), which
# scripts/build-uwsgi.sh pyuwsgi installs instead of compiling the same build again.
KEPT_PYUWSGI_WHEELS = REPO_ROOT / ".venv" / "pyuwsgi-wheel"


def pyuwsgi_digest(binary: Path) -> str | None:
    """sha256 of the pyuwsgi extension module a launcher runs; None for a uWSGI binary or a site without one."""
    site = pyuwsgi_site(binary)
    if site is None:
        return None
    module = next((m for suffix in EXTENSION_SUFFIXES for m in sorted(site.glob(f"pyuwsgi{suffix}"))), None)
    return None if module is None else hashlib.sha256(module.read_bytes()).hexdigest()


def kept_pyuwsgi_wheel() -> tuple[Path, str] | None:
    """make venv's kept pyuwsgi wheel and the sha256 of the module in it, if there is one."""
    wheels = sorted(KEPT_PYUWSGI_WHEELS.glob("pyuwsgi-*.whl"))
    if len(wheels) != 1:
        return None
    with zipfile.ZipFile(wheels[0]) as wheel:
        modules = [name for name in wheel.namelist() if name.startswith("pyuwsgi.") and name.endswith(".so")]
        return (wheels[0], hashlib.sha256(wheel.read(modules[0])).hexdigest()) if len(modules) == 1 else None


def stale_pyuwsgi(binary: Path) -> bool:
    """A pyuwsgi build older than make venv's: the kept wheel holds the module .venv runs, which
    scripts/build-uwsgi.sh would now install, and the build runs another (a compile of its own, or
    an earlier venv's)."""
    kept = kept_pyuwsgi_wheel()
    return kept is not None and kept[1] == pyuwsgi_digest(VENV_UWSGI) and pyuwsgi_digest(binary) != kept[1]


def made(profile: str) -> Path:
    """build/uwsgi/PROFILE/bin/uwsgi, made by scripts/build-uwsgi.sh when absent (or, for pyuwsgi,
    without its module or not make venv's build); a lock keeps the xdist workers from building it twice."""
    binary = UWSGI_BUILDS / profile / "bin" / "uwsgi"
    UWSGI_BUILDS.mkdir(parents=True, exist_ok=True)
    with open(UWSGI_BUILDS / f".{profile}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if binary.is_file() and (profile != "pyuwsgi" or (pyuwsgi_site(binary) is not None
                                                          and not stale_pyuwsgi(binary))):
            return binary
        shutil.rmtree(UWSGI_BUILDS / profile, ignore_errors=True)
        proc = subprocess.run(["bash", str(REPO_ROOT / "scripts" / "build-uwsgi.sh"), profile], cwd=REPO_ROOT,
                              capture_output=True, text=True, timeout=900)
        if proc.returncode or not binary.is_file():
            pytest.fail(f"scripts/build-uwsgi.sh {profile} failed: {(proc.stdout + proc.stderr)[-3000:]}",
                        pytrace=False)
    return binary


def uwsgi_packet(env: dict[str, str]) -> bytes:
    """A uwsgi protocol request: modifier1=0, 16-bit LE datasize, modifier2=0, then the vars."""
    body = b""
    for key, value in env.items():
        k, v = key.encode(), value.encode()
        body += struct.pack("<H", len(k)) + k + struct.pack("<H", len(v)) + v
    assert len(body) < 65536
    return struct.pack("<BHB", 0, len(body), 0) + body


def uwsgi_get(address: str, path_qs: str, timeout: float = 10.0) -> tuple[int, dict[str, str], bytes]:
    """GET straight to a uWSGI socket (tcp HOST:PORT or a unix path); uWSGI closes after the response."""
    path, _, query = path_qs.partition("?")
    env = {
        "REQUEST_METHOD": "GET", "REQUEST_URI": path_qs, "PATH_INFO": path, "QUERY_STRING": query,
        "SERVER_PROTOCOL": "HTTP/1.1", "SERVER_NAME": "test", "SERVER_PORT": "80",
        "REMOTE_ADDR": "127.0.0.1", "REMOTE_PORT": "1", "HTTP_HOST": "test",
    }
    if address.startswith("/"):
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        target: object = address
    else:
        host, _, port = address.rpartition(":")
        conn = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        target = (host, int(port))
    with conn:
        conn.settimeout(timeout)
        conn.connect(target)
        conn.sendall(uwsgi_packet(env))
        data = b""
        deadline = time.monotonic() + timeout
        while chunk := conn.recv(65536):
            data += chunk
            assert time.monotonic() < deadline, "response not finished in time"
    head, sep, body = data.partition(b"\r\n\r\n")
    assert sep, f"no HTTP header block in {data[:200]!r}"
    lines = head.decode("latin-1").split("\r\n")
    m = re.match(r"HTTP/1\.[01] (\d{3}) ", lines[0])
    assert m, lines[0]
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    return int(m[1]), headers, body


def concurrently(fn, args_list: list, barrier: bool = True) -> list:
    """Run fn(*args) for each args at the same time (released together by a barrier)."""
    gate = threading.Barrier(len(args_list)) if barrier else None

    def one(args):
        if gate:
            gate.wait(timeout=10)
        return fn(*args)

    with ThreadPoolExecutor(max_workers=len(args_list)) as pool:
        return list(pool.map(one, args_list, timeout=60))


def worker_requests(layout) -> dict[int, int]:
    return {w["id"]: w["requests"] for w in read_stats(layout.stats_address)["workers"]}


def read_until(read, enough, timeout: float = 5.0):
    """``read()`` every 50 ms until ``enough(value)`` or ``timeout`` seconds; the last value. A uWSGI
    worker counts a request when it closes it, a moment after the client has the answer."""
    deadline = time.monotonic() + timeout
    value = read()
    while not enough(value) and time.monotonic() < deadline:
        time.sleep(0.05)
        value = read()
    return value


def settled(read, quiet_s: float = 0.3, timeout: float = 5.0):
    """``read()`` every 50 ms until its value stayed the same for ``quiet_s`` seconds, or
    ``timeout``; the last value: counts that stopped moving (the readiness probe's included)."""
    deadline = time.monotonic() + timeout
    value, since = read(), time.monotonic()
    while time.monotonic() - since < quiet_s and time.monotonic() < deadline:
        time.sleep(0.05)
        now = read()
        if now != value:
            value, since = now, time.monotonic()
    return value


def settled_requests(layout, at_least: int = 0, timeout: float = 5.0) -> dict[int, int]:
    """Per-worker request counts once they stop moving (and total >= at_least)."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        now = worker_requests(layout)
        if now == last and sum(now.values()) >= at_least:
            return now
        if time.monotonic() > deadline:
            return now
        last = now
        time.sleep(0.05)


def via_nginx(layout, path: str, timeout: float = 20.0):
    return http_get(layout.listen_host, layout.listen_port, path, timeout=timeout)


# --- `uwsgi-layouts run` as a subprocess ------------------------------------------------------


def reset_signals():  # runs in the child: a clean slate even if pytest runs with SIGINT ignored (a background job)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def start_deploy_run(*args: str, log_dir: Path) -> subprocess.Popen:
    """``uwsgi-layouts run ARGS`` in its own session; output in log_dir/run.out and run.err."""
    out = open(log_dir / "run.out", "w")
    err = open(log_dir / "run.err", "w")
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "uwsgi_layouts", "run", *args],
            cwd=REPO_ROOT, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
            start_new_session=True, preexec_fn=reset_signals,
        )
    finally:
        out.close()
        err.close()


def kill_run(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)


def port_closed(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except OSError:
        return True
    return False
