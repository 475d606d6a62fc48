"""tests/integration/prebuild.py: which builds a run's tests want, and that ending the background
builder ends everything it started."""

from __future__ import annotations

import subprocess
import time
from types import SimpleNamespace

import psutil

from tests.integration.prebuild import stop, wanted


def item(fixtures: tuple[str, ...], **params) -> SimpleNamespace:
    return SimpleNamespace(fixturenames=fixtures, callspec=SimpleNamespace(params=params))


def test_the_builds_wanted_are_the_build_fixtures_params_cheapest_first():
    items = [item(("build", "lab"), build="static"), item(("build",), build="shared"),
             item(("lab",), spec="2x4-mapped"), SimpleNamespace(fixturenames=("lab",)),
             item(("build",), build="pyuwsgi"), item(("build",), build="static")]
    assert wanted(items) == ("pyuwsgi", "shared", "static")
    assert wanted([item(("build",), build="static")]) == ("static",)
    assert wanted([item(("lab",), spec="1x1-mapped")]) == ()


def test_stop_ends_the_whole_process_group():
    process = subprocess.Popen(["bash", "-c", "sleep 60 & sleep 60 & wait"], start_new_session=True)
    deadline = time.monotonic() + 10
    while len(psutil.Process(process.pid).children()) < 2:
        assert time.monotonic() < deadline, "the two sleeps did not start"
        time.sleep(0.05)
    children = psutil.Process(process.pid).children()
    stop(process)
    assert process.returncode is not None
    gone, alive = psutil.wait_procs(children, timeout=5)
    assert not alive, alive


def test_stop_leaves_a_finished_builder_alone():
    process = subprocess.Popen(["true"], start_new_session=True)
    process.wait()
    stop(process)  # its group id is free for others by now: nothing is signalled
    assert process.returncode == 0
