"""Shared fixtures: free loopback ports, short run directories, layouts, process hygiene.

Integration tests (``@pytest.mark.integration``) start real nginx/uWSGI processes. They
must find nginx and wrk installed (a missing tool is an error, never a skip), and after
each of them no process may still run in, or name, one of the test's run directories.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest

from tests.flaskapp import FlaskApp, build_flask_app
from tests.shared import remove_shared, set_run_id, shared_build
from uwsgi_layouts.deploy.machine import checked
from uwsgi_layouts.deploy.model import STRATEGIES, Layout, parse_layout
from uwsgi_layouts.deploy.run import free_consecutive_ports

REPO_ROOT = Path(__file__).resolve().parent.parent

PORT_LOW, PORT_HIGH = 20000, 39999
# Ports handed out in this session: never hand one out twice, even if it is free again.
_handed_out: set[int] = set()


def find_free_ports(n: int) -> list[int]:
    """``n`` free consecutive TCP ports on 127.0.0.1 within 20000-39999, never handed out twice."""
    assert 1 <= n <= 200, n
    ports = free_consecutive_ports(n, PORT_LOW, PORT_HIGH, exclude=_handed_out)
    _handed_out.update(ports)
    return ports


SPEC = re.compile(r"^\s*\+?(\d+)x(\d+)-([\w-]+)\s*$")


def socket_count(spec: str) -> int:
    """How many uWSGI sockets ``spec`` needs (1 when the spec is invalid: parse_layout will say why)."""
    m = SPEC.match(spec)
    if not m or m[3] not in STRATEGIES or not 1 <= int(m[1]) <= 256 or not 1 <= int(m[2]) <= 256:
        return 1
    return len(STRATEGIES[m[3]].sockets(int(m[1]), int(m[2])))


@pytest.fixture
def free_ports():
    """``free_ports(n)``: n free consecutive loopback TCP ports (see find_free_ports)."""
    return find_free_ports


# --- run directories ----------------------------------------------------------------------


@contextmanager
def run_dir_factory():
    """Factory of short, fresh run directories (/tmp/ul-XXXXXXXX), all removed on the way out.

    ``.dirs`` lists those created, for the process-leak check.
    """
    dirs: list[str] = []

    def new() -> Path:
        d = tempfile.mkdtemp(prefix="ul-", dir="/tmp")
        # Traversable (not listable) by others: started as root, the stack runs as www-data,
        # which must reach run directories below this one.
        os.chmod(d, 0o711)
        dirs.append(d)
        return Path(d)

    new.dirs = dirs
    try:
        yield new
    finally:
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)
            # write_layout stages next to the destination: nothing of ours may stay in /tmp.
            for leftover in Path(d).parent.glob(f".{Path(d).name}.staging-*"):
                shutil.rmtree(leftover, ignore_errors=True)


@pytest.fixture
def run_dirs():
    """A test's run directories (``run_dir_factory``): ``run_dirs()`` makes one."""
    with run_dir_factory() as new:
        yield new


@pytest.fixture(scope="module")
def module_run_dirs():
    """Run directories of a module's shared stack: they outlive each test (whose leak check
    covers its own ``run_dirs`` only), so no process may still name them once the module is done."""
    with run_dir_factory() as new:
        yield new
        left = kill_leftovers(new.dirs)
        assert not left, f"processes still running for {new.dirs} after the module: {left}"


@pytest.fixture
def tmp_run_dir(run_dirs) -> Path:
    """A short (unix socket paths are limited to 107 bytes) empty directory, cleaned up."""
    d = run_dirs()
    assert len(str(d)) < 40
    return d


def layout_maker(run_dirs):
    """``make(spec, **opts)`` -> Layout with distinct free ports and a fresh run_dir from ``run_dirs``.

    Ports: the sockets take base_port.., then the nginx listen port, all consecutive and
    bind-tested; the stats server is the default unix socket. Any option given explicitly wins.
    UL_TEST_UWSGI_BIN=/path/to/bin/uwsgi runs every uWSGI layout with that build (``uwsgi_bin``):
    the tests that start stacks this way check another build (scripts/build-uwsgi.sh) too.
    """

    def make(spec: str, **opts) -> Layout:
        m = SPEC.match(spec)
        if os.environ.get("UL_TEST_UWSGI_BIN") and m and m[3] in STRATEGIES and STRATEGIES[m[3]].server == "uwsgi":
            opts.setdefault("uwsgi_bin", os.environ["UL_TEST_UWSGI_BIN"])
        n = socket_count(spec)
        ports = find_free_ports(n + 1)
        opts.setdefault("base_port", ports[0])
        opts.setdefault("listen", f"127.0.0.1:{ports[n]}")
        if "run_dir" not in opts:
            opts["run_dir"] = str(run_dirs())
        return checked(parse_layout(spec, **opts))

    return make


@pytest.fixture
def make_layout(run_dirs):
    """``make_layout(spec, **opts)``: ``layout_maker`` over the test's run directories."""
    return layout_maker(run_dirs)


@pytest.fixture(scope="module")
def module_make_layout(module_run_dirs):
    """``layout_maker`` over the module's run directories (a stack the module's tests share)."""
    return layout_maker(module_run_dirs)


# --- a real third-party app ------------------------------------------------------------------


@pytest.fixture(scope="session")
def flask_app(pytestconfig) -> FlaskApp:
    """A Flask shop in its own directory and virtualenv (Flask from PyPI), built once per test
    run (shared by the xdist workers: tests/shared.py) under /tmp/ul-shared-RUN/flask
    (world-traversable: the stack runs as www-data under root) and removed when the run ends.
    See tests/flaskapp.py for what it holds. Treat it as read-only: tests that change the code
    copy it first (``flask_app.copy_app_dir``)."""
    return shared_build(pytestconfig, "flask", build_flask_app, "the Flask test app")


def pytest_configure(config):
    set_run_id(config)


def pytest_sessionfinish(session):
    remove_shared(session.config)


# --- integration hygiene ------------------------------------------------------------------


@pytest.fixture(scope="session")
def integration_tools() -> dict[str, str]:
    """The programs integration tests need. Missing ones fail the run loudly (no skip)."""
    found = {
        "nginx": shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None),
        "wrk": shutil.which("wrk"),
        "uwsgi": str(REPO_ROOT / ".venv/bin/uwsgi") if (REPO_ROOT / ".venv/bin/uwsgi").exists()
        else shutil.which("uwsgi"),
    }
    missing = [name for name, path in found.items() if not path]
    if missing:
        pytest.fail(
            f"integration tests need {', '.join(missing)} installed "
            "(run scripts/install-system-deps.sh / make venv); refusing to skip",
            pytrace=False,
        )
    return found


def processes_in(dirs: list[str]) -> list[psutil.Process]:
    """Live processes (not zombies, not us) whose command line names, or whose cwd is, one of ``dirs``."""
    me = os.getpid()
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            if proc.pid == me or proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            cmdline = " ".join(proc.info["cmdline"] or ())
            try:
                cwd = proc.cwd()
            except (psutil.AccessDenied, psutil.ZombieProcess, FileNotFoundError):
                cwd = ""
            for d in dirs:
                if d in cmdline or cwd == d or cwd.startswith(d + "/"):
                    found.append(proc)
                    break
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            continue
    return found


def wait_no_processes(dirs: list[str], timeout: float = 5.0) -> list[psutil.Process]:
    """Poll until no process references ``dirs``; return the survivors at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        left = processes_in(dirs)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def describe(procs: list[psutil.Process]) -> str:
    out = []
    for p in procs:
        try:
            out.append(f"pid {p.pid}: {' '.join(p.cmdline())[:200]}")
        except psutil.Error:
            out.append(f"pid {p.pid}: (gone)")
    return "; ".join(out)


def kill_leftovers(dirs: list[str]) -> str:
    """The processes still naming ``dirs`` after a grace, described ("" for none), then killed: they
    were started by the test or module that owns ``dirs``, and must not leak into the next one."""
    left = wait_no_processes(dirs, timeout=5.0)
    text = describe(left)
    for p in left:
        try:
            p.kill()
        except psutil.Error:
            pass
    return text


@pytest.fixture
def leftover_processes():
    """``leftover_processes(dirs, timeout)``: processes still referencing ``dirs`` after polling."""
    return wait_no_processes


@pytest.fixture(autouse=True)
def _no_leftover_processes(request, run_dirs):
    if request.node.get_closest_marker("integration") is None:
        yield
        return
    request.getfixturevalue("integration_tools")
    yield
    left = kill_leftovers(run_dirs.dirs)
    if left:
        pytest.fail(f"processes still running for {run_dirs.dirs} after the test: {left}", pytrace=False)
