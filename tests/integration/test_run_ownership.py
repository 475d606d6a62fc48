"""`deploy run` owns what it writes and what it reports, on real processes:

* a second run (or a render) into a live stack's run directory is refused, naming the
  holder's pid, and changes none of its files; the first keeps serving;
* a listen or stats port someone else holds fails at once with one line naming the port, and
  "serving" is never printed; readiness only counts answers from the stack's own processes;
* the workers (and the pre-flight) get a clean environment: PATH, LANG/LC_*, TZ, the run
  user's HOME and --env, nothing else of the caller's.
"""

from __future__ import annotations

import http.client
import http.server
import json
import os
import pwd
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.integration.support import REPO_ROOT, kill_run, port_closed
from tests.integration.test_stack import start_run, wait_for_hello
from uwsgi_layouts.deploy.run import Stack, process_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def files_of(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in directory.iterdir() if p.is_file() and p.name != "stack.json"}


def test_a_second_run_or_render_into_a_live_run_dir_is_refused_naming_the_holder(tmp_run_dir, tmp_path, free_ports):
    base, _, listen, stats = free_ports(4)
    other = free_ports(4)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = start_run(tmp_run_dir, tmp_path / "a", ports=(base, listen, stats))
    try:
        wait_for_hello(first, listen, tmp_path / "a")
        before = files_of(tmp_run_dir)
        second = start_run(tmp_run_dir, tmp_path / "b", spec="3x1-shared", ports=(other[0], other[2], other[3]))
        try:
            assert second.wait(timeout=60) == 2
        finally:
            kill_run(second)
        err = (tmp_path / "b" / "run.err").read_text()
        assert err.count("\n") == 1 and err.startswith("error: run_dir: ") and f"(pid {first.pid})" in err, err
        render = subprocess.run([sys.executable, "-m", "uwsgi_layouts",
                                 "render", "1x1-shared", "--out", str(tmp_run_dir)],
                                cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
        assert render.returncode == 2 and f"(pid {first.pid})" in render.stderr, render.stderr
        assert files_of(tmp_run_dir) == before, "a refused command changed the live stack's files"
        assert first.poll() is None
        wait_for_hello(first, listen, tmp_path / "a")
        assert port_closed(other[2])
    finally:
        kill_run(first)


class Squatter:
    """Someone else's HTTP server on a port: answers everything with 200, as a stack would."""

    def __init__(self, port: int):
        class Answer(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200)
                self.send_header("Content-Length", "12")
                self.end_headers()
                self.wfile.write(b"Hello, world")

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Answer)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("busy", ["listen", "stats"])
def test_a_busy_port_fails_at_once_naming_it_and_never_says_serving(tmp_run_dir, tmp_path, free_ports, busy):
    base, _, listen, stats = free_ports(4)
    squatter = Squatter(listen if busy == "listen" else stats)
    try:
        start = time.monotonic()
        proc = start_run(tmp_run_dir, tmp_path, ports=(base, listen, stats), tcp_stats=busy == "stats")
        try:
            rc = proc.wait(timeout=60)
        finally:
            kill_run(proc)
        took = time.monotonic() - start
        err = (tmp_path / "run.err").read_text()
        out = (tmp_path / "run.out").read_text()
        port = listen if busy == "listen" else stats
        assert rc == 1, (rc, out, err)
        assert "serving" not in out, out
        assert err.count("\n") == 1 and f"port {port} on 127.0.0.1 is already in use" in err, err
        assert f"--{busy.replace('stats', 'stats-port')}" in err, err
        assert took < 20, f"{took:.1f} s: the busy port is found before anything waits on it"
    finally:
        squatter.close()


def test_readiness_counts_only_the_stacks_own_stats_server(start_stack):
    """Another uWSGI's stats server on the port (here: our running one) is not readiness for a
    stack whose master is some other process."""
    stack = start_stack("2x1-mapped")
    server = process_for(stack.layout)
    assert server.member_ready(stack.members[0])
    imposter = Stack(stack.layout)
    imposter.members[0].proc = subprocess.Popen(["sleep", "30"])
    try:
        assert not server.member_ready(imposter.members[0])
    finally:
        imposter.members[0].proc.kill()
        imposter.members[0].proc.wait()


ENV_APP = '''import json, os
if "CALLER_SECRET" in os.environ:  # the pre-flight imports this too
    raise RuntimeError("the caller's environment leaked into the app")


def application(environ, start_response):
    start_response("200 OK", [("Content-Type", "application/json")])
    return [json.dumps(dict(os.environ)).encode()]
'''


def test_workers_and_the_preflight_get_a_clean_environment(run_dirs, tmp_path, free_ports, monkeypatch):
    app_dir = run_dirs() / "envapp"
    app_dir.mkdir(mode=0o755)
    app_dir.chmod(0o755)
    (app_dir / "envapp.py").write_text(ENV_APP)
    (app_dir / "envapp.py").chmod(0o644)
    run_dir = run_dirs()
    base, _, listen, stats = free_ports(4)
    monkeypatch.setenv("CALLER_SECRET", "s3cr3t")
    monkeypatch.setenv("PYTHONPATH", "/nonexistent")
    monkeypatch.setenv("UWSGI_PROCESSES", "7")  # uWSGI would read it as an option
    monkeypatch.setenv("LC_TIME", "C.UTF-8")
    monkeypatch.setenv("TZ", "UTC")
    monkeypatch.setenv("PATH", "relative/bin::" + os.environ["PATH"])
    proc = start_run(run_dir, tmp_path, "--app", "envapp:application", "--app-dir", str(app_dir),
                     "--env", "SHOP_MODE=test", ports=(base, listen, stats))
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                pytest.fail(f"run exited {proc.returncode}: {(tmp_path / 'run.err').read_text()}")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", listen, timeout=5)
                conn.request("GET", "/")
                resp = conn.getresponse()
                if resp.status == 200:
                    env = json.loads(resp.read())
                    break
            except (OSError, ValueError):
                pass
            assert time.monotonic() < deadline, (tmp_path / "run.err").read_text()
            time.sleep(0.2)
    finally:
        kill_run(proc)
    user = json.loads((run_dir / "layout.json").read_text())["user"]
    assert env["HOME"] == pwd.getpwnam(user).pw_dir
    assert env["SHOP_MODE"] == "test" and env["LC_TIME"] == "C.UTF-8" and env["TZ"] == "UTC"
    assert all(d.startswith("/") for d in env["PATH"].split(":")), env["PATH"]
    callers = set(env) - {"PATH", "HOME", "TZ", "SHOP_MODE"} - {k for k in env if k == "LANG" or k.startswith("LC_")}
    # uWSGI adds its own bookkeeping variables (UWSGI_RELOADS...) and Python the venv's: the caller's are gone.
    assert not {k for k in callers if not k.startswith("UWSGI_") and k != "VIRTUAL_ENV"}, sorted(callers)
    assert "CALLER_SECRET" not in env and env.get("PYTHONPATH") is None and "UWSGI_PROCESSES" not in env
