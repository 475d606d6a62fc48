"""The uWSGI builds a run's tests will ask for (``support.made``), made in the background from the
start of the run, so that the first test needing one finds it made instead of compiling it then.

Why: the first test of a build used to compile it (shared's compile is a minute or two on 2 busy
cores), and that test was often one of the network-namespace group, which runs all its tests on
one worker, one after the other: the whole group waited. Started at the run's first integration
test, the compile overlaps the tests that wait on real processes.

One process per run (the first xdist worker's, or the run's own without xdist), in a session of its
own; the worker ends it (its whole process group, SIGINT first so that pip removes its temporary
files) when its session ends, finished or not. A worker that is killed outright ends it too: the
kernel sends it SIGTERM (PR_SET_PDEATHSIG), and it kills its whole group. A build that fails here
is made again by the test that needs it, which then fails with the script's output.

    python -m tests.integration.prebuild PROFILE...
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress

import pytest

from tests.integration.support import REPO_ROOT, made
from uwsgi_layouts.deploy.run import child_setup

# The fixture test_uwsgi_builds.py parametrizes with the profiles, in the order they are made.
BUILD_FIXTURE = "build"
# pyuwsgi first: make venv's wheel installed, seconds; static after shared, whose objects it links again.
PROFILE_ORDER = ("pyuwsgi", "shared", "static")
STOP_GRACE_SECONDS = 15.0


def wanted(items: Iterable[pytest.Item]) -> tuple[str, ...]:
    """The profiles the collected tests take through the ``build`` fixture, in PROFILE_ORDER."""
    asked = {item.callspec.params[BUILD_FIXTURE] for item in items
             if BUILD_FIXTURE in getattr(item, "fixturenames", ()) and hasattr(item, "callspec")
             and BUILD_FIXTURE in item.callspec.params}
    return tuple(p for p in PROFILE_ORDER if p in asked) + tuple(sorted(asked - set(PROFILE_ORDER)))


@contextmanager
def prebuilding(items: Iterable[pytest.Item]) -> Iterator[None]:
    """Around a session: the builds its tests want, made in a background process on one worker."""
    profiles = wanted(items) if os.environ.get("PYTEST_XDIST_WORKER", "gw0") == "gw0" else ()
    if not profiles:
        yield
        return
    process = subprocess.Popen([sys.executable, "-m", "tests.integration.prebuild", *profiles], cwd=REPO_ROOT,
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               preexec_fn=child_setup())  # a session of its own, SIGTERM if this worker dies
    try:
        yield
    finally:
        stop(process)


def stop(process: subprocess.Popen, grace: float = STOP_GRACE_SECONDS) -> None:
    """The process and everything it started (build-uwsgi.sh, pip, gcc: one process group): SIGINT,
    then SIGKILL to whatever is left once the leader has exited or ``grace`` seconds are over. The
    leader is reaped last, so that the group's id cannot have passed to another process when it is
    signalled."""
    if process.poll() is not None:
        return
    with suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGINT)
    deadline = time.monotonic() + grace
    while (os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None
           and time.monotonic() < deadline):
        time.sleep(0.1)
    with suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def end_the_group(signum, frame) -> None:
    """SIGTERM (the worker that started us died, PR_SET_PDEATHSIG): the builds go with us."""
    os.killpg(0, signal.SIGKILL)


def main(profiles: list[str]) -> int:
    signal.signal(signal.SIGTERM, end_the_group)
    failed = 0
    for profile in profiles:
        try:
            made(profile)
        except pytest.fail.Exception:  # made() fails the test it runs in: here, try the next build
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
