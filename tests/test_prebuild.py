"""tests/integration/prebuild.py: which builds a run's tests want, and that ending the background
builder ends everything it started."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
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
    # Under xdist the leader (bash in `wait`) may outlive SIGINT: the grace then runs out in full
    # (17 s in a whole run); 2 s of it is as good a test of the SIGKILL after it.
    stop(process, grace=2.0)
    assert process.returncode is not None
    gone, alive = psutil.wait_procs(children, timeout=5)
    assert not alive, alive


def test_stop_leaves_a_finished_builder_alone():
    process = subprocess.Popen(["true"], start_new_session=True)
    process.wait()
    stop(process)  # its group id is free for others by now: nothing is signalled
    assert process.returncode == 0


# A stand-in for the pytest worker: it starts a builder the way prebuilding() does (child_setup),
# whose "build" is two sleeps in its group, prints the sleeps' pids, and is then SIGKILLed.
WORKER = """
import subprocess, sys, time
from uwsgi_layouts.deploy.run import child_setup
builder = subprocess.Popen([sys.executable, "-c", '''
import signal, subprocess, sys
from tests.integration.prebuild import end_the_group
signal.signal(signal.SIGTERM, end_the_group)
sleeps = [subprocess.Popen(["sleep", "60"]) for _ in range(2)]
print(*(s.pid for s in sleeps), flush=True)
sleeps[0].wait()
'''], preexec_fn=child_setup(), stdout=sys.stdout)
time.sleep(60)
"""


def test_a_killed_worker_takes_the_builders_group_with_it():
    worker = subprocess.Popen([sys.executable, "-c", WORKER], stdout=subprocess.PIPE, text=True,
                              cwd=Path(__file__).resolve().parent.parent)
    sleeps = [psutil.Process(int(pid)) for pid in worker.stdout.readline().split()]
    assert len(sleeps) == 2 and all(s.is_running() for s in sleeps)
    worker.kill()  # SIGKILL: no finally, no stop(); only the kernel's PR_SET_PDEATHSIG is left
    worker.wait()
    gone, alive = psutil.wait_procs(sleeps, timeout=10)
    assert not alive, f"the builder's processes outlived a killed worker: {alive}"
