"""The other uWSGI builds (scripts/build-uwsgi.sh static and pyuwsgi: the app's Python at the
python3 executable's speed) keep everything the project relies on, checked on real stacks run
with the layout's ``uwsgi_bin``: internal routing (the route-if-not lines answer a code-loading
packet 403), SSL (uwsgi over mutual TLS between nginx and an app host), the stats server,
map-socket and threads (2 workers x 2 threads all serving; test_stack.py, run with
UL_TEST_UWSGI_BIN, checks that each worker serves only its socket), the master FIFO's chain
reload under load, harakiri. A build ``make uwsgi-builds`` has not made yet is made here first
(scripts/build-uwsgi.sh; one xdist worker at a time per build), never skipped: shared is compiled
(about 40 s on 2 idle cores) unless an earlier build of this user's compiled the same inputs (the
script keeps a source tree per set of compile inputs in a per-user cache, which a second clone
builds in: checked below), static links the same objects again, and pyuwsgi is make venv's own
build, its kept wheel installed into a venv of its own (.venv runs that very module, so compiling
it again would prove nothing more).

The rest of the integration suite runs against a build with UL_TEST_UWSGI_BIN=/path/to/bin/uwsgi
(tests/conftest.py's make_layout gives every uWSGI layout that uwsgi_bin), e.g.
``UL_TEST_UWSGI_BIN=$PWD/build/uwsgi/static/bin/uwsgi .venv/bin/python -m pytest tests/integration/test_stack.py``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import psutil
import pytest

from tests.integration.support import (
    FAST,
    KEPT_PYUWSGI_WHEELS,
    SLOW,
    VENV_UWSGI,
    concurrently,
    kept_pyuwsgi_wheel,
    made,
    pyuwsgi_digest,
    read_until,
    via_nginx,
)
from tests.integration.test_security import raw_uwsgi
from uwsgi_layouts.bench.localfaults import chain_reload_under_load, stuck_request
from uwsgi_layouts.bench.stack import Lab
from uwsgi_layouts.deploy.machine import uwsgi_has_routing, uwsgi_has_ssl
from uwsgi_layouts.deploy.run import http_get, netns

ROOT = Path(__file__).resolve().parents[2]
# make venv's own uWSGI is pyuwsgi (every stack test runs it); these are the builds uwsgi_bin selects,
# pyuwsgi's among them (its own venv: the app's virtualenv's python starts it all the same).
PROFILES = ("shared", "static", "pyuwsgi")
# What a clone needs to run scripts/build-uwsgi.sh (its venv is linked to ours, under another path).
BUILD_SCRIPTS = ("build-uwsgi.sh", "uwsgi-tree-cache.sh", "static-libpython-ldflags.sh", "install-pyuwsgi.sh")
# uwsgiconfig.py writes these two sources again at every build, so they are compiled every time.
COMPILED_AT_EVERY_BUILD = {"core/dot_h.o", "core/config_py.o"}


def integration(test):
    # 600 s: the first test of a build may wait for it to be made (scripts/build-uwsgi.sh)
    return pytest.mark.integration(pytest.mark.timeout(600)(test))


@pytest.fixture(scope="session", params=PROFILES)
def build(request) -> str:
    return str(made(request.param))


@pytest.fixture
def lab(run_dirs, free_ports):
    with Lab(new_dir=run_dirs, free_ports=free_ports) as lab:
        yield lab


@integration  # it needs the build made (a compile): `make test-unit` ran it, and timed out compiling at load 10
def test_build_has_internal_routing_and_ssl(build):
    assert uwsgi_has_routing(build), f"{build}: no --route-if-not (built without PCRE)"
    assert uwsgi_has_ssl(build), f"{build}: no --ssl-socket (built without SSL)"


@integration
def test_build_serves_mapped_threads_stats_and_refuses_code_loading(start_stack, build):
    stack = start_stack("2x2-mapped", uwsgi_bin=build, transport="tcp")  # raw_uwsgi speaks TCP
    layout = stack.layout
    assert via_nginx(layout, FAST)[0] == 200
    # Threads and map-socket: 4 slow requests at once need both threads of both workers (nginx
    # spreads them over the two mapped sockets); the stats server shows 2 workers x 2 cores, each
    # of which served (test_stack.py's mapped tests, run with UL_TEST_UWSGI_BIN, check more).
    answers = concurrently(lambda: via_nginx(layout, SLOW.format(ms=300)), [()] * 4)
    assert [a[0] for a in answers] == [200] * 4
    # A worker counts a request when it closes it, a moment after the answer.
    stats = read_until(stack.stats, lambda s: all(w["requests"] >= 1 for w in s["workers"]))
    assert len(stats["workers"]) == 2 and all(len(w["cores"]) == 2 for w in stats["workers"]), stats["workers"]
    assert all(w["requests"] >= 1 for w in stats["workers"]), stats["workers"]
    ini = (Path(layout.run_dir) / "uwsgi.ini").read_text()
    assert ini.count("map-socket") == 2, ini
    # Internal routing: straight to the socket, a code-loading packet gets the route-if-not 403.
    status, body = raw_uwsgi(layout.sockets[0].address, {"UWSGI_FILE": "/etc/passwd", "UWSGI_APPID": "evil"})
    assert status == "HTTP/1.1 403 Forbidden", (status, body)
    assert via_nginx(layout, FAST)[0] == 200


@pytest.mark.parametrize("spec", ["2x4-mapped", "2x4-shared"])
@integration
def test_build_chain_reloads_under_load(lab, build, spec):
    result = chain_reload_under_load(lab, spec, connections=50, duration=6.0, uwsgi_bin=build)
    print("\n" + result.explain())
    assert all(c.ok for c in result.checks), result.explain()
    assert result.requests_failed == 0
    assert result.figures["changed"] == [1, 2]


@integration
def test_build_harakiri_kills_a_stuck_request(lab, build):
    result = stuck_request(lab, "2x1-mapped", harakiri=2, duration=4.0, uwsgi_bin=build)
    print("\n" + result.explain())
    assert all(c.ok for c in result.checks), result.explain()
    assert result.figures["status"] in (502, 504) and result.figures["seconds"] < 4.0


@pytest.mark.skipif(netns.unavailable() is not None, reason=netns.unavailable() or "")
@pytest.mark.xdist_group("netns")
@integration
def test_build_serves_uwsgi_over_mutual_tls(run_dirs, free_ports, build):
    with Lab(new_dir=run_dirs, free_ports=free_ports, hosts=1) as lab:
        with lab.stack("1x2-mapped", uwsgi_bin=build) as stack:
            layout = stack.layout
            assert layout.uwsgi_tls == "suwsgi"
            assert any("ssl-socket" in p.read_text() for p in Path(layout.run_dir).rglob("*.ini"))
            status, _, _ = http_get(layout.listen_host, layout.listen_port, FAST, timeout=30)
            assert status == 200


@integration
def test_a_pyuwsgi_build_runs_the_app_in_its_own_virtualenv_with_its_env(flask_app, start_stack):
    """pyuwsgi's build venv has no Flask: the app's virtualenv's python starts uWSGI, so the app
    imports the virtualenv's packages (`virtualenv =` inherent), and the --env lines reach the
    app's os.environ (reload-os-env) though python3 started before uWSGI applied them."""
    build = str(made("pyuwsgi"))
    stack = start_stack("1x2-mapped", uwsgi_bin=build, env=((flask_app.greeting_var, "from pyuwsgi"),),
                        **flask_app.layout_options())
    status, _, body = via_nginx(stack.layout, "/greeting")
    assert status == 200 and json.loads(body) == {"greeting": "from pyuwsgi"}, (status, body)
    master = psutil.Process(stack.stats()["pid"])
    assert master.cmdline()[0] == str(flask_app.venv / "bin" / "python"), master.cmdline()
    assert master.name() == "uwsgi" and all(w.name() == "uwsgi" for w in master.children())


@integration
def test_the_pyuwsgi_build_is_make_venvs_own_not_a_second_compile():
    """scripts/build-uwsgi.sh pyuwsgi installs the wheel make venv compiled and kept: the build runs
    the very module .venv runs (a second compile would differ at least in its build date), and its
    BUILD.json names the wheel."""
    kept = kept_pyuwsgi_wheel()
    assert kept is not None, f"no pyuwsgi wheel kept in {KEPT_PYUWSGI_WHEELS}: make venv (its build scripts changed)"
    wheel, module = kept
    assert pyuwsgi_digest(VENV_UWSGI) == module, f"{VENV_UWSGI} runs another module than {wheel}"
    build = made("pyuwsgi")
    assert pyuwsgi_digest(build) == module, f"{build} runs another module than make venv's"
    record = json.loads((build.parents[1] / "BUILD.json").read_text())
    assert record["from_wheel"] == str(wheel), record


def clone_like(root: Path) -> Path:
    """A checkout as scripts/build-uwsgi.sh sees one: its scripts, and a .venv at another path."""
    (root / "scripts").mkdir(parents=True)
    for script in BUILD_SCRIPTS:
        shutil.copy(ROOT / "scripts" / script, root / "scripts" / script)
    (root / ".venv").symlink_to(ROOT / ".venv")
    return root


def build_shared_in(root: Path) -> tuple[Path, bool]:
    """scripts/build-uwsgi.sh shared run in ROOT, in the user's tree cache as every clone's build is:
    the tree it compiled in, and whether that tree was new."""
    done = subprocess.run(["bash", str(root / "scripts" / "build-uwsgi.sh"), "shared"], cwd=root,
                          env={k: v for k, v in os.environ.items() if k != "UWSGI_BUILDS"},
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert (root / "build" / "uwsgi" / "shared" / "bin" / "uwsgi").is_file()
    found = re.search(r"^compiling in (a new tree: )?(\S+)", done.stdout, re.M)
    assert found, done.stdout
    return Path(found[2]), bool(found[1])


def object_mtimes(tree: Path) -> dict[str, int]:
    return {str(o.relative_to(tree)): o.stat().st_mtime_ns for o in tree.rglob("*.o")}


@integration
def test_a_second_clone_links_the_objects_the_first_compiled(tmp_path):
    """Two clones of the same user's build the same profile: the second builds in the tree the first
    compiled (in the user's cache, not in the clone) and compiles nothing but the two sources
    uwsgiconfig.py writes at every build. Run in the suite, the first build is a link too, on the
    tree the run's prebuild compiled."""
    first_tree, _ = build_shared_in(clone_like(tmp_path / "first"))
    compiled = object_mtimes(first_tree)
    assert len(compiled) > 100, sorted(compiled)  # uWSGI's core and its embedded plugins
    second_tree, new = build_shared_in(clone_like(tmp_path / "second"))
    assert second_tree == first_tree and not new, (first_tree, second_tree)
    assert not first_tree.is_relative_to(tmp_path), first_tree
    after = object_mtimes(second_tree)
    assert after.keys() == compiled.keys()
    recompiled = {name for name, mtime in after.items() if mtime != compiled[name]}
    assert recompiled <= COMPILED_AT_EVERY_BUILD, sorted(recompiled)
