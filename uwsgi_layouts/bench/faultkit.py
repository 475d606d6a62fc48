"""What the fault experiments are made of (``bench.localfaults``): the fault-injection app copied
into a directory of its own, wrk loads and single requests through nginx, experiment-only edits of
the rendered nginx.conf (``Patch``), the checks a record carries, and the pacing of a window."""

from __future__ import annotations

import http.client
import re
import shutil
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from uwsgi_layouts.bench.load.traffic import Mix, write_mix_script
from uwsgi_layouts.bench.load.wrk import WrkProcess, WrkRun, write_script
from uwsgi_layouts.bench.observe import error_kinds, nginx_log_lines
from uwsgi_layouts.bench.results import Check
from uwsgi_layouts.bench.stack import Lab
from uwsgi_layouts.deploy.machine import PACKAGE_DIR
from uwsgi_layouts.deploy.model import Layout, StackError
from uwsgi_layouts.deploy.run import Stack

FAULT_APP = PACKAGE_DIR / "app" / "faults.py"

# A request that returns in ~20 ms: 1 round of 20 ms "external API" + fib(10) (~0.03 ms).
FAST_GET = "/?rounds=1&fib=10&io_ms=20"


def check(target: str, ok: bool, measured: str) -> Check:
    """One target of the issue, with what was measured against it."""
    return Check(target, bool(ok), measured)


# --- the fault-injection app (app/faults.py, copied) -----------------------------------------


@dataclass(frozen=True)
class FaultApp:
    """A copy of ``app/faults.py`` as ``faultapp:application`` in its own directory (0755,
    readable by the run user), with a world-writable ``data/`` directory for the handler log."""

    app_dir: Path
    log: Path

    app = "faultapp:application"

    @classmethod
    def create(cls, parent: Path) -> "FaultApp":
        app_dir = parent / "app"
        app_dir.mkdir(mode=0o755)
        app_dir.chmod(0o755)
        data = app_dir / "data"
        data.mkdir()
        data.chmod(0o777)
        module = app_dir / "faultapp.py"
        shutil.copyfile(FAULT_APP, module)
        module.chmod(0o644)
        return cls(app_dir=app_dir, log=data / "handled.log")

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


# --- load: wrk scripts, requests --------------------------------------------------------


def post_script(directory: Path, io_ms: int) -> Path:
    """A wrk script whose every request is a POST with a unique id (wrk thread + counter),
    so the app's handler log shows whether any POST ran twice."""
    return write_script(directory / "post-ids.lua", (
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
        "end\n"))


def get_load(lab: Lab, layout: Layout, path: str, connections: int, duration: float, mix: Mix | None = None,
             close: bool = False) -> WrkProcess:
    """wrk GETting ``path`` of the demo app, or sending the user's ``mix`` (its script written
    once per lab); ``close``: a new connection for every request."""
    if mix is None and not close:
        return WrkProcess(layout.url.rstrip("/") + path, connections, duration)
    if mix is None:
        script = write_script(Path(layout.run_dir) / "connection-close.lua",
                              '-- a new connection for every request\nwrk.headers["Connection"] = "close"\n')
        return WrkProcess(layout.url.rstrip("/") + path, connections, duration, script=script)
    if close:
        mix = Mix(mix.requests, (*mix.headers, ("Connection", "close")), mix.source)
    script = lab.work_dir / "traffic" / f"faults-{'close' if close else 'keep'}.lua"
    if not script.exists():
        write_mix_script(script, mix)
    return WrkProcess(layout.url, connections, duration, script=script, script_args=["1"])


def describe_errors(run: WrkRun) -> str:
    e = run.errors
    parts = [f"{n} {getattr(e, n)}" for n in ("connect", "read", "write", "timeout", "status") if getattr(e, n)]
    return ", ".join(parts) or "none"


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


# --- experiment-only edits of the rendered nginx.conf ------------------------------------------


@dataclass(frozen=True)
class Patch:
    """Edits applied to a rendered nginx.conf *only to measure a proposed template change*
    before anyone makes it: parameters appended to every upstream ``server`` line, and
    directives set in the ``uwsgi_pass`` location (replacing one of the same name). Values
    may use {harakiri}, {harakiri_minus_1}, {harakiri_plus_1} and {connect_timeout}.
    Empty by default: nothing is edited."""

    server_params: str = ""  # e.g. "max_fails=0"
    location: str = ""  # e.g. "uwsgi_read_timeout {harakiri_plus_1}s; uwsgi_next_upstream error"

    def __bool__(self) -> bool:
        return bool(self.server_params.strip() or self.location.strip())

    @property
    def label(self) -> str:
        parts = [self.server_params.strip(), *(d.strip() for d in self.location.split(";"))]
        return " + ".join(p for p in parts if p)

    def apply(self, conf: Path, layout: Layout) -> None:
        values = {"harakiri": layout.harakiri, "harakiri_minus_1": max(1, layout.harakiri - 1),
                  "harakiri_plus_1": layout.harakiri + 1, "connect_timeout": layout.connect_timeout}
        text = conf.read_text()
        params = self.server_params.strip().format(**values)
        if params:
            text, n = re.subn(r"(?m)^(\s*server (?:unix:)?[\w./:-]+)([^;\n]*);", lambda m: f"{m[1]}{m[2]} {params};",
                              text)
            if not n:
                raise StackError(f"patch: no upstream server line in {conf}")
        for directive in (d.strip().format(**values) for d in self.location.split(";") if d.strip()):
            name = directive.split()[0]
            text, n = re.subn(rf"(?m)^(\s*){re.escape(name)}\s[^;\n]*;",
                              lambda m, d=directive: f"{m[1]}{d};  # patched", text)
            if not n:
                text, n = re.subn(r"(?m)^(\s*)uwsgi_pass uwsgi_app;\n",
                                  lambda m, d=directive: f"{m[0]}{m[1]}{d};  # patched\n", text)
            if not n:
                raise StackError(f"patch: no uwsgi_pass location in {conf}")
        conf.write_text(text)


def layout_label(layout: Layout, patch: Patch | None) -> str:
    return layout.name + ("" if layout.transport == "unix" else f" {layout.transport}") + ("*" if patch else "")


def sent_requests(run: WrkRun) -> int:
    """Requests wrk sent: answered ones (any status) plus those lost to socket errors/timeouts."""
    e = run.errors
    return run.requests + e.connect + e.read + e.write + e.timeout


def nginx_errors_note(stack: Stack, since: int = 0) -> str:
    kinds = error_kinds(nginx_log_lines(stack, since))
    if not kinds:
        return "nginx error log: nothing"
    return "nginx error log: " + "; ".join(f"{n} x {k}" for k, n in kinds.most_common(4))


def wait_until(t0: float, seconds: float) -> None:
    """Pace an experiment (a measurement window), never used as a readiness wait."""
    remaining = t0 + seconds - time.monotonic()
    if remaining > 0:
        time.sleep(remaining)


def concurrently(fn, args_list: list) -> list:
    results: list = [None] * len(args_list)
    gate = threading.Barrier(len(args_list))

    def one(i, args):
        gate.wait(timeout=10)
        results[i] = fn(*args)

    threads = [threading.Thread(target=one, args=(i, a), daemon=True) for i, a in enumerate(args_list)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return results
