"""What the run room's machine-wide resources (network namespaces, cgroups) share: a state
directory locked while one run picks names or cleans up after dead ones, and whether the owner a
state file records (pid and start time, so a reused pid is not mistaken for it) still lives."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path

import psutil

from uwsgi_layouts.files import write_atomic


def owner_alive(pid: int, started: float) -> bool:
    try:
        return abs(psutil.Process(pid).create_time() - started) < 1.0
    except Exception:  # noqa: BLE001  (gone, or no such pid: not alive either way)
        return False


@contextlib.contextmanager
def state_lock(directory: Path):
    """``directory`` (made 0700) locked for this process until the block ends."""
    directory.mkdir(mode=0o700, exist_ok=True)
    with open(directory / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def write_state(directory: Path, run_id: str, **record) -> Path:
    """``directory/RUN_ID.json``: this process as the owner (pid, start time) and ``record``,
    written whole (a rename) before anything it names is made."""
    path = directory / f"{run_id}.json"
    state = {"id": run_id, "pid": os.getpid(), "started": psutil.Process().create_time(), **record}
    return write_atomic(path, json.dumps(state))


def dead_owners(directory: Path) -> Iterator[tuple[Path, dict]]:
    """(state file, its record) of every run in ``directory`` whose owner is gone."""
    for path in sorted(directory.glob("*.json")):
        try:
            state = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not owner_alive(state.get("pid", -1), state.get("started", 0.0)):
            yield path, state
