"""Faults under load, with figures: ``python -m bench.faults`` (what ``make faults`` runs).

Every experiment here starts its own nginx + uWSGI stack on loopback, drives it with real
``wrk`` for a bounded time, injects one kind of fault at a measured moment (once the
uWSGI stats server shows requests flowing), and returns a ``FaultResult``: the load held,
the faults injected, the requests sent and failed (wrk's error classes, non-2xx
included), the data lost (POST handlers that ran twice), notes, and the checks of the
issue's targets. The integration tests (tests/integration/test_faults.py) call these
same functions and assert the checks, so the figures and the tests cannot disagree.

Experiments: kill -9 of a worker (GET and POST loads), a request stuck beyond harakiri,
a full listen backlog (tcp and unix), a uWSGI chain reload under 50 connections, a chain
reload of broken code, and nginx reloads (SIGHUP) under load.
"""

from __future__ import annotations

import argparse
import http.client
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from bench.wrk import LUA_REPORT, WrkProcess, WrkRun
from deploy.errors import LayoutError, StackError
from deploy.layout import Layout, parse_layout
from deploy.reload import chain_reload
from deploy.render import write_layout
from deploy.stack import Stack, read_stats

DEFAULT_LAYOUTS = ("2x4-mapped", "2x4-shared")
EXIT_BAD_INPUT = 2

# A request that returns in ~20 ms: 1 round of 20 ms "external API" + fib(10) (~0.03 ms).
FAST_GET = "/?rounds=1&fib=10&io_ms=20"


# --- results ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    """One target of the issue, with what was measured against it."""

    target: str
    ok: bool
    measured: str


@dataclass(frozen=True)
class FaultResult:
    name: str
    layout: str
    load: str  # e.g. "wrk -c8 6 s GET"
    faults_injected: int
    requests_sent: int
    requests_failed: int  # wrk's error classes (connect, read, write, timeout, non-2xx)
    data_lost: int  # e.g. POST handlers that ran twice; 0 when nothing can be lost
    notes: tuple[str, ...] = ()
    checks: tuple[Check, ...] = ()
    figures: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def failed_checks(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    def explain(self) -> str:
        lines = [f"{self.name} on {self.layout} ({self.load}):"]
        lines += [f"  [{'ok' if c.ok else 'FAILED'}] {c.target}: {c.measured}" for c in self.checks]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def check(target: str, ok: bool, measured: str) -> Check:
    return Check(target, bool(ok), measured)


# --- the lab: run directories, ports, stacks ---------------------------------------------------


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def find_free_ports(n: int) -> list[int]:
    """``n`` free consecutive loopback ports below the kernel's ephemeral range."""
    try:
        ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral = 32768
    low, high = 40000, 59999
    if ephemeral > 20000 + 4 * n:
        low, high = 20000, ephemeral - 1
    rng = random.Random(os.getpid() ^ time.monotonic_ns())
    for _ in range(400):
        start = rng.randint(low, high - n + 1)
        ports = list(range(start, start + n))
        if all(_port_free(p) for p in ports):
            return ports
    raise RuntimeError(f"no {n} free consecutive ports on 127.0.0.1 in {low}..{high}")


class Lab:
    """Where experiments run: short run directories (0711, so the unprivileged run user can
    traverse them) and free loopback ports. The tests hand in their own factories (so the
    conftest leak check sees the directories); by default they are made and removed here."""

    def __init__(self, new_dir: Callable[[], Path] | None = None, free_ports: Callable[[int], list[int]] | None = None):
        self._own_dirs: list[Path] = []
        self._new_dir = new_dir or self._make_dir
        self.free_ports = free_ports or find_free_ports

    def _make_dir(self) -> Path:
        d = Path(tempfile.mkdtemp(prefix="ul-", dir="/tmp"))
        os.chmod(d, 0o711)
        self._own_dirs.append(d)
        return d

    def new_dir(self) -> Path:
        return self._new_dir()

    def close(self) -> None:
        for d in self._own_dirs:
            shutil.rmtree(d, ignore_errors=True)
            for leftover in d.parent.glob(f".{d.name}.staging-*"):
                shutil.rmtree(leftover, ignore_errors=True)
        self._own_dirs.clear()

    def __enter__(self) -> "Lab":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def layout(self, spec: str, **options) -> Layout:
        n = len(parse_layout(spec, run_dir="/tmp/x").sockets)  # only to count the sockets
        ports = self.free_ports(n + 2)
        options.setdefault("base_port", ports[0])
        options.setdefault("listen", f"127.0.0.1:{ports[n]}")
        options.setdefault("stats_port", ports[n + 1])
        options.setdefault("run_dir", str(self.new_dir()))
        return parse_layout(spec, **options)

    @contextmanager
    def stack(self, spec: str, **options) -> Iterator[Stack]:
        layout = self.layout(spec, **options)
        write_layout(layout, layout.run_dir)
        with Stack(layout, start_timeout=30, stop_timeout=10) as stack:
            yield stack

    def fault_app(self, log_name: str = "handled.log") -> "FaultApp":
        return FaultApp.create(self.new_dir(), log_name)


# --- a tiny app for the experiments that need side effects -------------------------------------

FAULT_APP = '''\
"""Test app for bench.faults: GET sleeps ?io_ms=, POST records ?id= (one line per handler
run, written before the work) and then sleeps. Nothing else."""
import os
import time
from urllib.parse import parse_qs

HERE = os.path.dirname(os.path.abspath(__file__))
LOG = os.path.join(HERE, "data", {log_name!r})


def application(environ, start_response):
    query = parse_qs(environ.get("QUERY_STRING", ""))
    io_ms = int(query.get("io_ms", ["0"])[0] or 0)
    if environ.get("REQUEST_METHOD") == "POST":
        line = "%s %d\\n" % (query.get("id", ["-"])[0], os.getpid())
        fd = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
        length = int(environ.get("CONTENT_LENGTH") or 0)
        if length:
            environ["wsgi.input"].read(min(length, 1 << 20))
    if io_ms:
        time.sleep(min(io_ms, 30000) / 1000)
    body = b"ok"
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body))),
                              ("X-Worker-Pid", str(os.getpid()))])
    return [body]
'''


@dataclass(frozen=True)
class FaultApp:
    """``faultapp:application`` in its own directory (0755, readable by the run user), with a
    world-writable ``data/`` directory for the handler log."""

    app_dir: Path
    log: Path

    app = "faultapp:application"

    @classmethod
    def create(cls, parent: Path, log_name: str = "handled.log") -> "FaultApp":
        app_dir = parent / "app"
        app_dir.mkdir(mode=0o755)
        app_dir.chmod(0o755)
        data = app_dir / "data"
        data.mkdir()
        data.chmod(0o777)
        module = app_dir / "faultapp.py"
        module.write_text(FAULT_APP.format(log_name=log_name))
        module.chmod(0o644)
        return cls(app_dir=app_dir, log=data / log_name)

    @property
    def module(self) -> Path:
        return self.app_dir / "faultapp.py"

    def handled(self) -> Counter:
        """How many times the handler ran for each POST id."""
        try:
            text = self.log.read_text()
        except FileNotFoundError:
            return Counter()
        return Counter(line.split()[0] for line in text.splitlines() if line.strip())

    def options(self) -> dict:
        return {"app": self.app, "app_dir": str(self.app_dir)}


# --- load: wrk scripts, a stats sampler --------------------------------------------------------


def post_script(directory: Path, io_ms: int) -> Path:
    """A wrk script whose every request is a POST with a unique id (thread-connection-counter),
    so the app's handler log shows whether any POST ran twice."""
    path = directory / "post-ids.lua"
    path.write_text(
        "-- every request is a POST with a unique ?id=, plus the JSON done() hook\n"
        "local threads = 0\n"
        "function setup(thread)\n"
        "  threads = threads + 1\n"
        "  thread:set(\"thread_no\", threads)\n"
        "end\n"
        "local n = 0\n"
        "request = function()\n"
        "  n = n + 1\n"
        f"  return wrk.format(\"POST\", \"/post?io_ms={io_ms}&id=t\" .. (thread_no or 0) .. \"-\" .. n, nil, \"x\")\n"
        "end\n" + LUA_REPORT.read_text()
    )
    path.chmod(0o644)
    return path


def errors_of(run: WrkRun) -> int:
    return run.errors.total


def describe_errors(run: WrkRun) -> str:
    e = run.errors
    parts = [f"{n} {getattr(e, n)}" for n in ("connect", "read", "write", "timeout", "status") if getattr(e, n)]
    return ", ".join(parts) or "none"


@dataclass
class Sample:
    t: float  # seconds since the sampler started
    workers: dict[int, tuple[int, int, int]]  # id -> (pid, requests, accepting)


class Sampler:
    """Polls the uWSGI stats server in the background (every ``interval`` s): worker pids,
    request counters and accepting flags over time."""

    def __init__(self, stats_address: str, interval: float = 0.1):
        self.address = stats_address
        self.interval = interval
        self.samples: list[Sample] = []
        self.t0 = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                stats = read_stats(self.address, timeout=1.0)
                workers = {w["id"]: (w["pid"], w["requests"], w.get("accepting", 0)) for w in stats["workers"]}
                self.samples.append(Sample(time.monotonic() - self.t0, workers))
            except (OSError, ValueError, KeyError):
                pass
            self._stop.wait(self.interval)

    def __enter__(self) -> "Sampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def now(self) -> float:
        return time.monotonic() - self.t0

    def total_requests(self) -> int:
        return sum(r for _, r, _ in self.samples[-1].workers.values()) if self.samples else 0

    def wait_for(self, predicate, timeout: float, what: str) -> float:
        """Poll until ``predicate(latest sample)`` holds; return the time. StackError on timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.samples and predicate(self.samples[-1]):
                return self.samples[-1].t
            time.sleep(self.interval / 2)
        raise StackError(f"{what}: not seen within {timeout:.0f} s")

    def wait_flowing(self, at_least: int, timeout: float = 10.0) -> float:
        base = None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.samples:
                total = sum(r for _, r, _ in self.samples[-1].workers.values())
                base = total if base is None else base
                if total - base >= at_least:
                    return self.samples[-1].t
            time.sleep(self.interval / 2)
        raise StackError(f"requests are not flowing: fewer than {at_least} served in {timeout:.0f} s")

    def served_per_worker(self, t_from: float, t_to: float) -> dict[int, int]:
        """Requests each worker id served between two times (a respawned worker's counter
        restarts from 0: counted from there)."""
        window = [s for s in self.samples if t_from <= s.t <= t_to]
        out: dict[int, int] = {}
        for a, b in zip(window, window[1:]):
            for wid, (pid, req, _) in b.workers.items():
                prev = a.workers.get(wid)
                if prev is None:
                    continue
                delta = req - prev[1] if prev[0] == pid and req >= prev[1] else req
                out[wid] = out.get(wid, 0) + max(0, delta)
        return out


def nginx_log_lines(stack: Stack, since: int = 0) -> list[str]:
    try:
        data = stack.nginx_log.read_bytes()[since:]
    except OSError:
        return []
    return data.decode("utf-8", "replace").splitlines()


def log_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def error_kinds(lines: list[str]) -> Counter:
    """nginx error log lines grouped by their message (pids, times and addresses removed)."""
    kinds = Counter()
    for line in lines:
        m = re.search(r"\[(error|warn|crit|alert|emerg)\] \d+#\d+: \*?\d* ?(.*?)(, client:|$)", line)
        if m:
            text = re.sub(r"unix:/\S+|127\.0\.0\.1:\d+", "ADDR", m[2])
            kinds[f"[{m[1]}] {text}"] += 1
    return kinds


def http_request(layout: Layout, method: str, path: str, timeout: float = 30.0, body: bytes | None = None,
                 headers: dict | None = None) -> tuple[int, float, bytes]:
    """(status, seconds, body) of one request through nginx; status 0 = no answer."""
    t0 = time.monotonic()
    conn = http.client.HTTPConnection(layout.listen_host, layout.listen_port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        data = resp.read()
        return resp.status, time.monotonic() - t0, data
    except (OSError, http.client.HTTPException):
        return 0, time.monotonic() - t0, b""
    finally:
        conn.close()


def worker_pids(stack: Stack) -> dict[int, int]:
    return stack.worker_pids()


def wait_respawned(stack: Stack, old: dict[int, int], wid: int, timeout: float = 10.0) -> float:
    """Seconds until worker ``wid`` has a new pid and accepts again."""
    t0 = time.monotonic()
    deadline = t0 + timeout
    while time.monotonic() < deadline:
        try:
            for w in stack.stats()["workers"]:
                if w["id"] == wid and w["pid"] not in (0, old[wid]) and w.get("accepting") == 1:
                    return time.monotonic() - t0
        except (OSError, ValueError):
            pass
        time.sleep(0.02)
    raise StackError(f"worker {wid} was not respawned within {timeout:.0f} s", stack_tail(stack))


def stack_tail(stack: Stack) -> str:
    from deploy.stack import tail

    return tail(stack.uwsgi_log, 15)
