"""The other uWSGI builds (scripts/build-uwsgi.sh static and pyuwsgi: the app's Python at the
python3 executable's speed) keep everything the project relies on, checked on real stacks run
with the layout's ``uwsgi_bin``: internal routing (the route-if-not lines answer a code-loading
packet 403), SSL (uwsgi over mutual TLS between nginx and an app host), the stats server,
map-socket and threads (2 workers x 2 threads all serving; test_stack.py, run with
UL_TEST_UWSGI_BIN, checks that each worker serves only its socket), the master FIFO's chain
reload under load, harakiri. A build ``make uwsgi-builds`` has not made yet is made here first
(scripts/build-uwsgi.sh; one xdist worker at a time per build), never skipped: shared is compiled
(about 40 s on 2 idle cores), static links the same objects again (the script keeps a source tree
per set of compile inputs), and pyuwsgi is make venv's own build, its kept wheel installed into a
venv of its own (.venv runs that very module, so compiling it again would prove nothing more).

The rest of the integration suite runs against a build with UL_TEST_UWSGI_BIN=/path/to/bin/uwsgi
(tests/conftest.py's make_layout gives every uWSGI layout that uwsgi_bin), e.g.
``UL_TEST_UWSGI_BIN=$PWD/build/uwsgi/static/bin/uwsgi .venv/bin/python -m pytest tests/integration/test_stack.py``.
"""

from __future__ import annotations

import json
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
    stats = stack.stats()
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
