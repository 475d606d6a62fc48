"""A user's own app: the Flask shop in its own virtualenv (tests/flaskapp.py), served by real
nginx + uWSGI with --virtualenv, --env and --static; its bad inputs refused by the pre-flight.

Every stack started here is stopped here (start_stack, or kill_run in a finally), and
conftest checks that no process survives a test.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import flaskapp
from tests.integration.support import (
    REPO_ROOT,
    concurrently,
    kill_run,
    port_closed,
    settled_requests,
    start_deploy_run,
    uwsgi_get,
    via_nginx,
)
from uwsgi_layouts.deploy.machine import uwsgi_python

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

GREETING = "50% off, p%40ss%"  # "%" reaches the app verbatim (uwsgi.ini writes it "%%")


def raw_get(layout, path: str, timeout: float = 10.0) -> tuple[int, bytes]:
    """GET with the path sent exactly as given (no client-side normalisation)."""
    conn = http.client.HTTPConnection(layout.listen_host, layout.listen_port, timeout=timeout)
    try:
        conn.putrequest("GET", path, skip_accept_encoding=True)
        conn.endheaders()
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    # No active virtualenv: with --app and without --virtualenv, `run` would take it for the app's.
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    return subprocess.run([sys.executable, "-m", "uwsgi_layouts", *args], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=timeout, env=env)


def wait_serving(proc, port: int, log_dir: Path, path: str = "/", timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            pytest.fail(f"run exited with {proc.returncode} before serving:\n{(log_dir / 'run.err').read_text()}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", path)
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        finally:
            conn.close()
        if time.monotonic() > deadline:
            pytest.fail(f"run did not serve within {timeout} s:\n{(log_dir / 'run.err').read_text()}")
        time.sleep(0.1)  # polling interval


# --- `uwsgi-layouts run` serves the user's app ---------------------------------------------------


def test_run_serves_the_flask_app_from_its_own_virtualenv(flask_app, tmp_run_dir, tmp_path, free_ports,
                                                          leftover_processes):
    base, _, listen = free_ports(3)
    run_dir = tmp_run_dir / "run"
    proc = start_deploy_run(
        "2x4-mapped", "--run-dir", str(run_dir), "--listen", f"127.0.0.1:{listen}", "--base-port", str(base),
        *flask_app.cli_args("--env", f"{flask_app.greeting_var}={GREETING}"),
        "--for", "120", log_dir=tmp_path)
    try:
        wait_serving(proc, listen, tmp_path)
        conn = http.client.HTTPConnection("127.0.0.1", listen, timeout=10)
        for path, check in [
            ("/", lambda body: body == b"Hello from shop"),
            ("/api/items", lambda body: [i["name"] for i in json.loads(body)] == ["teapot", "cup"]),
            ("/greeting", lambda body: json.loads(body) == {"greeting": GREETING}),
            ("/assets/hello.txt", lambda body: body == flaskapp.HELLO_TXT),
        ]:
            conn.request("GET", path)
            resp = conn.getresponse()
            body = resp.read()
            assert resp.status == 200 and check(body), (path, resp.status, body[:200])
        conn.close()
        layout = json.loads((run_dir / "layout.json").read_text())
        assert layout["virtualenv"] == str(flask_app.venv)
        assert layout["env"] == [[flask_app.greeting_var, GREETING]]
        assert layout["static"] == [["/assets", str(flask_app.static)]]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0, (tmp_path / "run.err").read_text()
        assert "stopped nginx and uWSGI" in (tmp_path / "run.out").read_text()
        assert leftover_processes([str(tmp_run_dir)], timeout=5) == []
        assert port_closed(listen)
    finally:
        kill_run(proc)


# --- sockets map to workers as for the demo ----------------------------------------------------------


@pytest.mark.parametrize("transport", ["tcp", "unix"])
def test_flask_app_each_socket_has_exactly_one_worker(flask_app, start_stack, transport):
    stack = start_stack("2x4-mapped", transport=transport, **flask_app.layout_options())
    layout = stack.layout
    pids = stack.worker_pids()
    before = settled_requests(layout, at_least=1)
    per_socket = 6  # more than one worker's 4 threads: a shared socket would spill to the other worker
    for sock in layout.sockets:
        results = concurrently(uwsgi_get, [(sock.address, "/slow?ms=200")] * per_socket)
        assert all(status == 200 and json.loads(body) == {"slept_ms": 200} for status, _, body in results), results
        ids = {(h["x-worker-id"], h["x-worker-pid"]) for _, h, _ in results}
        assert ids == {(str(sock.index + 1), str(pids[sock.index + 1]))}, (sock.index, ids)
    after = settled_requests(layout, at_least=sum(before.values()) + 2 * per_socket)
    assert {w: after[w] - before[w] for w in after} == {1: per_socket, 2: per_socket}

    # least_conn through nginx: two slow requests at once land on the two workers.
    results = concurrently(via_nginx, [(layout, "/slow?ms=1500")] * 2)
    assert [r[0] for r in results] == [200, 200], results
    assert sorted(h["x-worker-id"] for _, h, _ in results) == ["1", "2"]
    stack.check_alive()


# --- --env reaches the app; --static is nginx's, and nothing above it is reachable ---------------------

TRAVERSALS = [
    "/assets../secret.txt",  # the classic alias traversal (location without the trailing slash)
    "/assets/../secret.txt",
    "/assets/css/../../secret.txt",
    "/assets/%2e%2e/secret.txt",
    "/assets/%2e%2e%2fsecret.txt",
    "/assets/..%2fsecret.txt",
    "/assets%2f..%2fsecret.txt",
    "/assets/%252e%252e/secret.txt",
    "/assets/..;/secret.txt",
    "/assets/leak.txt",  # a symlink inside the static dir pointing at ../secret.txt
]


def test_flask_env_and_static_files(flask_app, start_stack):
    stack = start_stack("2x4-mapped", **flask_app.layout_options(env=[f"{flask_app.greeting_var}={GREETING}"]))
    layout = stack.layout
    status, _, body = via_nginx(layout, "/greeting")
    assert (status, json.loads(body)) == (200, {"greeting": GREETING})

    # Static files come from nginx: the uWSGI workers count no request for them.
    before = settled_requests(layout, at_least=1)
    for name, content in flask_app.files.items():
        for _ in range(3):
            assert raw_get(layout, f"/assets/{name}") == (200, content), name
    assert raw_get(layout, "/assets/")[0] == 403, "no directory listing"
    assert raw_get(layout, "/assets/css/")[0] == 403, "no directory listing"
    assert settled_requests(layout) == before, "a static request reached uWSGI"

    answers = {path: raw_get(layout, path) for path in TRAVERSALS}
    leaked = [path for path, (_, body) in answers.items() if flask_app.secret_token.encode() in body]
    assert leaked == [], f"{leaked} returned the secret above the static dir: {answers}"
    assert all(status in (400, 403, 404) for status, _ in answers.values()), answers
    stack.check_alive()

    # The probe above can fail: the same nginx with the classic mistake (no trailing slash on
    # the location) serves the secret to "/assets../secret.txt".
    conf = Path(layout.run_dir) / "nginx.conf"
    text = conf.read_text()
    assert text.count("location ^~ /assets/ {") == 1
    conf.write_text(text.replace("location ^~ /assets/ {", "location /assets {"))
    stack.nginx.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 15
    while flask_app.secret_token.encode() not in raw_get(layout, "/assets../secret.txt")[1]:
        assert time.monotonic() < deadline, "the vulnerable config did not leak: the traversal probe proves nothing"
        time.sleep(0.1)  # polling until nginx's new workers took over


# --- reload: the pre-flight uses the app's virtualenv and env -------------------------------------------


def reload_cli(layout) -> subprocess.CompletedProcess:
    return run_cli("reload", layout.name, "--run-dir", layout.run_dir, "--timeout", "60", timeout=120)


def test_reload_preflight_uses_the_virtualenv_and_env(flask_app, start_stack, run_dirs):
    app_dir = flask_app.copy_app_dir(run_dirs() / "shop")
    good = (app_dir / "shop.py").read_text()
    # Imports Flask (only in the app's venv) and needs the env at import time.
    (app_dir / "shop.py").write_text(good + "\nGREETING_AT_IMPORT = os.environ['SHOP_GREETING']\n")
    stack = start_stack("2x4-mapped", **flask_app.layout_options(
        app_dir=str(app_dir), env=[f"SHOP_GREETING={GREETING}"], static=()))
    layout = stack.layout
    old = stack.worker_pids()

    proc = reload_cli(layout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "chain reload done" in proc.stdout
    new = stack.worker_pids()
    assert all(new[w] != old[w] for w in old), (old, new)

    (app_dir / "shop.py").write_text("import flask_missing_plugin\n" + good)
    proc = reload_cli(layout)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: app: "), proc.stderr
    assert "ModuleNotFoundError: No module named 'flask_missing_plugin'" in lines[0]
    assert "shop.py:1 in <module>" in lines[0] and "chain reload not started" in lines[0]
    assert f"{flask_app.venv}/bin/python" in lines[0]
    assert stack.worker_pids() == new, "the old workers keep serving"
    assert via_nginx(layout, "/")[:1] == (200,)
    stack.check_alive()


# --- bad input: exit 2, one line, nothing written, nothing started ----------------------------------


def bad_cases(flask_app: flaskapp.FlaskApp, scratch: Path) -> dict[str, tuple[list[str], str, str]]:
    """name -> (run options, field, words the line must hold)."""

    ours = uwsgi_python()[0]
    venv, how, theirs = flaskapp.other_version_venv(scratch / "venv-other", ours)
    stdlib_dir = scratch / "stdlib-app"
    stdlib_dir.mkdir()
    stdlib_dir.chmod(0o755)
    (stdlib_dir / "site.py").write_text("from flask import Flask\napp = Flask(__name__)\n")
    (stdlib_dir / "site.py").chmod(0o644)
    app = ["--app-dir", str(flask_app.app_dir)]
    venv_opt = ["--virtualenv", str(flask_app.venv)]
    return {
        f"other-python ({how})": (["--app", "shop:app", *app, "--virtualenv", str(venv)], "virtualenv",
                                  f"is Python {theirs[0]}.{theirs[1]} but our uWSGI runs Python {ours[0]}.{ours[1]}"),
        "missing-virtualenv": (["--app", "shop:app", *app, "--virtualenv", str(scratch / "nowhere")], "virtualenv",
                               "does not exist"),
        "shadows-stdlib": (["--app", "site:app", "--app-dir", str(stdlib_dir), *venv_opt], "app",
                           "module 'site' resolves to the standard library"),
        "not-callable": (["--app", "shop:VERSION", *app, *venv_opt], "app", "is a str ('1.0'), not a callable"),
        "no-attribute": (["--app", "shop:application", *app, *venv_opt], "app", "has no attribute 'application'"),
        # The first report: the app's venv neither named nor found (none in the app dir,
        # none active), so Flask is missing.
        "does-not-import": (["--app", "shop:app", "--app-dir", str(flask_app.copy_app_dir(scratch / "no-venv"))],
                            "app", "ModuleNotFoundError: No module named 'flask'"),
        "bad-env": (["--app", "shop:app", *app, *venv_opt, "--env", "SHOP_GREETING=$(id)"], "env", "'$('"),
        "bad-static-dir": (["--app", "shop:app", *app, *venv_opt, "--static", f"/assets={scratch}/nowhere"],
                           "static", "existing directory"),
        "bad-static-prefix": (["--app", "shop:app", *app, *venv_opt, "--static", f"/assets/..={flask_app.static}"],
                              "static", "clean URL path"),
    }


def test_bad_app_input_exits_2_with_one_line_and_writes_nothing(flask_app, run_dirs, free_ports, record_property,
                                                                 leftover_processes):
    scratch = run_dirs()
    scratch.chmod(0o755)
    cases = bad_cases(flask_app, scratch)
    record_property("cases", list(cases))
    for name, (options, field, words) in cases.items():
        run_dir = run_dirs() / "run"
        base, _, listen = free_ports(3)
        proc = run_cli("run", "2x4-mapped", "--run-dir", str(run_dir), "--listen", f"127.0.0.1:{listen}",
                       "--base-port", str(base), "--for", "5", *options)
        lines = proc.stderr.splitlines()
        assert proc.returncode == 2, (name, proc.returncode, proc.stderr)
        assert len(lines) == 1 and "Traceback" not in proc.stderr, (name, proc.stderr)
        assert lines[0].startswith(f"error: {field}: "), (name, lines[0])
        assert words in lines[0], (name, lines[0])
        assert "callable not found" not in lines[0]
        assert not run_dir.exists() and not list(run_dir.parent.iterdir()), (name, "wrote something")
        assert port_closed(listen), name
    assert leftover_processes(run_dirs.dirs, timeout=5) == []
