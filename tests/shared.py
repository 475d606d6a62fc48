"""Expensive test subjects (the Flask and Django apps, each a virtualenv from PyPI) built once per
test run and shared by every pytest-xdist worker.

The first worker that asks builds the subject under /tmp/ul-shared-RUN/NAME while holding a lock;
the others wait on the lock and load what it stored. RUN is the run's id (xdist's testrunuid, set
by the controller in ``pytest_configure`` so that it is known on both sides), and the controller
removes the directory when the whole run ends (``remove_shared``): a worker cannot, since others
may still use it. Without xdist the one process plays both parts.
"""

from __future__ import annotations

import fcntl
import os
import pickle
import shutil
import subprocess
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

T = TypeVar("T")
SHARED_PREFIX = "/tmp/ul-shared-"


def set_run_id(config: pytest.Config) -> None:
    """In the controller (or a run without xdist): give the run an id the workers will receive."""
    if hasattr(config, "workerinput"):
        return
    if getattr(config.option, "testrunuid", None) is None:
        config.option.testrunuid = uuid.uuid4().hex


def run_id(config: pytest.Config) -> str:
    workerinput = getattr(config, "workerinput", None)
    return workerinput["testrunuid"] if workerinput else config.option.testrunuid


def shared_dir(config: pytest.Config) -> Path:
    return Path(f"{SHARED_PREFIX}{run_id(config)[:16]}")


def shared_build(config: pytest.Config, name: str, build: Callable[[Path], T], what: str) -> T:
    """``build(root)`` once per run; every caller gets the same (pickled) result. A build that
    fails (no PyPI, no venv module) fails the test naming what it needs, and the next caller
    tries again."""
    top = shared_dir(config)
    top.mkdir(mode=0o711, exist_ok=True)
    os.chmod(top, 0o711)  # under root the stack runs as www-data, which must reach the apps
    stored = top / f"{name}.pickle"
    with open(top / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if stored.exists():
            return pickle.loads(stored.read_bytes())
        root = top / name
        shutil.rmtree(root, ignore_errors=True)  # a half-built one from a failed attempt
        root.mkdir()
        try:
            built = build(root)
        except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
            pytest.fail(f"cannot build {what} (needs /usr/bin/python3 -m venv and pip access to PyPI): {exc}",
                        pytrace=False)
        stored.write_bytes(pickle.dumps(built))
        return built


def remove_shared(config: pytest.Config) -> None:
    """At the end of the whole run (the controller, or a run without xdist)."""
    if not hasattr(config, "workerinput"):
        shutil.rmtree(shared_dir(config), ignore_errors=True)
