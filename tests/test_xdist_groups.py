"""make test runs the suite with pytest-xdist's ``--dist loadgroup``: the tests of one ``xdist_group``
run on one worker, one after another. The suite relies on that twice over:

- for correctness: the tests of a group must not run at once (the ``netns`` group makes the
  machine's network namespaces and bridges, and tests the sweep of stale ones; the ``systemd``
  group's containers each boot a whole systemd with its nginx);
- for time: a module-scoped fixture is set up again on every worker that runs one of the module's
  tests, and test_bundle_kubernetes.py's (podman image builds that compile uWSGI, about 4 min on
  2 cores) was built four times in every run while the groups were ignored.

pytest-xdist 3.8 tells its scheduler a test's group by appending ``@GROUP`` to the test's id through
an attribute that pytest 9.2 no longer reads (pytest-xdist issue #1386): the marks are then ignored
without a word, every test is scheduled alone. pyproject.toml keeps pytest below 9.2 for that; this
test runs a small suite the way make test does and fails if the pair installed stops grouping.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# Two modules of one group (as netns spans test_multihost.py and one test of test_uwsgi_builds.py),
# first in collection order, so that a scheduler that ignores the group hands them to both workers;
# ungrouped tests after them keep the other worker busy.
GROUPED = """
import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.xdist_group("together")


@pytest.mark.parametrize("i", range(4))
def test_grouped(i):
    Path(os.environ["WHERE"], f"{__name__}-{i}").write_text(os.environ["PYTEST_XDIST_WORKER"])
"""
UNGROUPED = """
import os
from pathlib import Path

import pytest


@pytest.mark.parametrize("i", range(8))
def test_alone(i):
    Path(os.environ["WHERE"], f"alone-{i}").write_text(os.environ["PYTEST_XDIST_WORKER"])
"""


@pytest.mark.timeout(120)
def test_loadgroup_runs_a_group_on_one_worker(tmp_path):
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "pytest.ini").write_text("[pytest]\n")  # its own rootdir: none of this project's conftest or options
    (suite / "test_a_grouped.py").write_text(GROUPED)
    (suite / "test_b_grouped.py").write_text(GROUPED)
    (suite / "test_c_alone.py").write_text(UNGROUPED)
    where = tmp_path / "where"
    where.mkdir()
    # Not the outer run's xdist or pytest variables: this is a run of its own.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PYTHONPATH"))}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-p", "no:cacheprovider",
                           "-q", str(suite)], cwd=suite, env={**env, "WHERE": str(where)}, capture_output=True,
                          text=True, timeout=100)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ran = {path.name: path.read_text() for path in where.iterdir()}
    assert len(ran) == 16, sorted(ran)
    grouped = {name: worker for name, worker in ran.items() if name.startswith("test_")}
    assert len(grouped) == 8 and len(set(grouped.values())) == 1, (
        f"--dist loadgroup spread one xdist_group over several workers: {grouped} (pytest-xdist issue #1386: "
        "pytest 9.2 with pytest-xdist 3.8; pyproject.toml keeps pytest below 9.2)")
    assert set(ran.values()) == {"gw0", "gw1"}, ran  # both workers ran: the check could have seen a spread

