"""What a command run inside the test worker leaves behind: ``with nothing_left(label):`` fails the
test on a thread, a child process (and its descendants), an open file descriptor or a changed
SIGTERM/SIGINT/SIGHUP handler that the block started and did not end. A real process's exit would
clean those up; in the worker they live on and change the tests that follow. Used by
``tests.test_cli.cli_in_process`` and ``tests.refusals.refusal``."""

from __future__ import annotations

import os
import signal
import sysconfig
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import psutil

HANDLED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
LEFTOVER_GRACE_S = 5.0  # for a thread or child the command told to stop and did not wait for
# A library's data file kept open for the life of the process (matplotlib's font, opened by the first
# plot a worker draws) is a cache, not a leak.
LIBRARY_DIRS = tuple({sysconfig.get_paths()[k] + os.sep for k in ("purelib", "platlib")})


@contextmanager
def nothing_left(label: str, grace_s: float = LEFTOVER_GRACE_S) -> Iterator[None]:
    """Fails, naming ``label`` and what is left, if the block leaves anything behind. Not checked
    when the block raises: the exception says more than what it left."""
    before = process_state()
    yield
    assert_nothing_left(before, label, grace_s)


def process_state() -> dict:
    me = psutil.Process()
    # Thread objects, not idents: an ident of a thread that ended may be given to a new one
    return {"threads": set(threading.enumerate()),
            "children": {c.pid for c in me.children()},
            "fds": set(os.listdir("/proc/self/fd")),
            "signals": {s: signal.getsignal(s) for s in HANDLED_SIGNALS}}


def assert_nothing_left(before: dict, label: str, grace_s: float = LEFTOVER_GRACE_S) -> None:
    deadline = time.monotonic() + grace_s
    while True:
        after = process_state()
        fds = {fd: target for fd in after["fds"] - before["fds"] if (target := _fd_target(fd)) is not None}
        left = {k: v for k, v in (("threads", after["threads"] - before["threads"]),
                                  ("children", _tree(after["children"] - before["children"])), ("fds", fds)) if v}
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    changed = [s.name for s in HANDLED_SIGNALS if after["signals"][s] != before["signals"][s]]
    assert not left and not changed, f"{label} left behind {left} {changed}"


def _tree(pids: set[int]) -> set[int]:
    """``pids`` (children this call started) and their descendants. Not the descendants of a child
    started before the call: the background uWSGI builds (tests/integration/prebuild.py) start and end
    compilers all along."""
    tree = set()
    for pid in pids:
        try:
            tree |= {pid} | {p.pid for p in psutil.Process(pid).children(recursive=True)}
        except psutil.NoSuchProcess:
            continue
    return tree


def _fd_target(fd: str) -> str | None:
    """What the fd opens, None for one closed since (listdir's own) or a library's data file."""
    try:
        target = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None
    return None if target.startswith(LIBRARY_DIRS) else target
