"""A Django project from PyPI in its own virtualenv (tests/djangoapp.py) behind real nginx and
uWSGI, gunicorn or granian: the admin's static files answer with their MIME types, app
factories (Django's wrapped in one, and Flask's) run on every server, a factory given without
its parentheses is refused by the pre-flight, and `run` from inside the project's directory
finds the project and its ./.venv by itself.

Every stack started here is stopped here (start_stack, or kill_run in a finally); conftest
checks that no process survives a test.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests import djangoapp
from tests.integration.support import kill_run, via_nginx
from uwsgi_layouts.deploy.machine import preflight
from uwsgi_layouts.deploy.model import LayoutError
from uwsgi_layouts.deploy.run import http_get

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

SERVERS = ["2x2-mapped", "2x2-gunicorn", "2x2-granian"]  # uWSGI and its peers
django_app = djangoapp.django_app  # the session fixture (built once: only this module uses it)

FLASK_FACTORY_PY = '''\
from flask import Flask


def create_app(greeting="hi", debug=False):
    app = Flask(__name__)
    app.debug = debug

    @app.get("/")
    def index():
        return f"Hello from a Flask factory: {greeting}", 200, {"Content-Type": "text/plain"}

    return app
'''


def content_type(layout, path: str) -> tuple[int, str, bytes]:
    status, headers, body = via_nginx(layout, path)
    return status, headers.get("content-type", ""), body


# --- nginx serves the admin's static files with their types -------------------------------------


def settled_count(stack, quiet_s: float = 0.5, timeout: float = 10.0) -> int:
    """The workers' request count once it stopped moving for ``quiet_s``: uWSGI counts a request
    when it closes it, a moment after nginx answered (the readiness probe's included)."""
    deadline = time.monotonic() + timeout
    last, since = None, time.monotonic()
    while True:
        counted = sum(w["requests"] for w in stack.stats()["workers"])
        now = time.monotonic()
        if counted != last:
            last, since = counted, now
        elif now - since >= quiet_s or now > deadline:
            return counted
        time.sleep(0.05)


def test_the_admin_renders_with_its_stylesheet_served_as_text_css(django_app, start_stack):
    stack = start_stack("2x2-mapped", transport="unix", **django_app.layout_options())
    layout = stack.layout
    status, headers, page = via_nginx(layout, "/admin/login/")
    assert status == 200 and b'href="/static/admin/css/base.css"' in page, (status, page[:300])
    assert headers["content-type"].startswith("text/html")
    served = settled_count(stack)
    status, ctype, css = content_type(layout, "/static/admin/css/base.css")
    assert status == 200 and ctype == "text/css", (status, ctype)
    assert css == (django_app.collected / "admin/css/base.css").read_bytes()
    assert content_type(layout, "/static/admin/js/core.js")[:2] == (200, "application/javascript")
    assert content_type(layout, "/static/admin/img/icon-yes.svg")[:2] == (200, "image/svg+xml")
    # served by nginx itself: uWSGI's workers saw none of them
    assert settled_count(stack) == served


# --- app factories on every server ---------------------------------------------------------------


@pytest.mark.parametrize("spec", SERVERS)
@pytest.mark.parametrize("call,greeting", [
    ("()", "from the factory's default"),
    ("('site_dj.settings', greeting='50% off, from the factory')", "50% off, from the factory"),
])
def test_a_django_factory_runs_on_every_server(django_app, start_stack, spec, call, greeting):
    options = django_app.layout_options(app=django_app.factory + call)
    stack = start_stack(spec, transport="unix", **options)
    layout = stack.layout
    preflight(layout)  # as `run` does first: the factory is called once, the app answers a test GET
    for _ in range(2 * layout.processes):  # every worker built its app with the factory's arguments
        status, _, body = via_nginx(layout, "/")
        assert (status, body) == (200, f"Hello from Django: {greeting}".encode()), (status, body[:200])
    assert content_type(layout, "/static/admin/css/base.css")[:2] == (200, "text/css")


@pytest.mark.parametrize("spec", SERVERS)
def test_a_flask_factory_with_literal_arguments(flask_app, start_stack, run_dirs, spec):
    app_dir = flask_app.copy_app_dir(run_dirs())
    (app_dir / "factory.py").write_text(FLASK_FACTORY_PY)
    (app_dir / "factory.py").chmod(0o644)
    layout = start_stack(spec, transport="unix", **flask_app.layout_options(
        app="factory:create_app('bonjour', debug=False)", app_dir=str(app_dir))).layout
    assert via_nginx(layout, "/")[::2] == (200, b"Hello from a Flask factory: bonjour")


def test_a_factory_without_its_parentheses_is_refused_naming_the_fix(django_app, flask_app, run_dirs,
                                                                     make_layout):
    with pytest.raises(LayoutError) as info:  # Django's: its defaults get the environ
        preflight(make_layout("1x1-shared", **django_app.layout_options(app=django_app.factory)))
    assert "its parameters have defaults, as an app factory's do" in str(info.value)
    assert f"--app '{django_app.factory}()'" in str(info.value)
    app_dir = flask_app.copy_app_dir(run_dirs())
    (app_dir / "factory.py").write_text(FLASK_FACTORY_PY)
    (app_dir / "factory.py").chmod(0o644)
    with pytest.raises(LayoutError) as info:  # Flask's: it returns the app instead of an answer
        preflight(make_layout("1x1-shared", **flask_app.layout_options(app="factory:create_app",
                                                                        app_dir=str(app_dir))))
    assert "returned a callable (Flask) instead of an answer" in str(info.value)
    assert "--app 'factory:create_app()'" in str(info.value)


# --- from inside the project's directory ---------------------------------------------------------


def test_run_from_the_project_directory_finds_it_and_its_venv(django_app, tmp_run_dir, free_ports,
                                                              tmp_path):
    """No --app-dir, no --virtualenv: the current directory and its ./.venv (said in one line)."""
    (listen,) = free_ports(1)
    run_dir = tmp_run_dir / "run"
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    args = [sys.executable, "-m", "uwsgi_layouts",
            "run", "1x2-shared", "--transport", "unix", "--run-dir", str(run_dir),
            "--listen", f"127.0.0.1:{listen}", "--app", django_app.factory + "()",
            "--static", f"/static={django_app.collected}", "--for", "120"]
    with open(tmp_path / "run.out", "w") as out, open(tmp_path / "run.err", "w") as err:
        proc = subprocess.Popen(args, cwd=django_app.app_dir, env=env, stdout=out, stderr=err,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while "serving" not in (tmp_path / "run.out").read_text():
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "run.err").read_text()
            time.sleep(0.1)  # polling interval
        lines = (tmp_path / "run.out").read_text().splitlines()
        assert lines[0] == (f"--app {django_app.factory}(): app dir {django_app.app_dir} (the current directory), "
                            f"virtualenv {django_app.venv} (.venv in the app's directory)")
        assert http_get("127.0.0.1", listen, "/")[::2] == (200, b"Hello from Django: from the factory's default")
        assert http_get("127.0.0.1", listen, "/static/admin/css/base.css")[1]["content-type"] == "text/css"
        recorded = json.loads((run_dir / "layout.json").read_text())
        assert (recorded["app_dir"], recorded["virtualenv"]) == (str(django_app.app_dir), str(django_app.venv))
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, (tmp_path / "run.err").read_text()
    finally:
        kill_run(proc)
