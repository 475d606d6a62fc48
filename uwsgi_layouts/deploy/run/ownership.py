"""Who owns a run directory: the lock a live stack holds on it, the record of the processes it
started, and the orphans a killed run left behind.

* A stack holds an exclusive ``flock`` on ``RUN_DIR/stack.lock`` for as long as it lives, with
  its pid written in the file. The kernel drops the lock when the holder dies, however it
  dies, so a held lock always means a live owner: a second stack (``run``, or ``render``) in
  that directory is refused with one line naming the holder's pid.
* ``RUN_DIR/stack.json`` records each process group the stack started (its leader's pid and
  start time: a pid alone may have been reused since).
* Children die with the stack (PR_SET_PDEATHSIG, deploy/run/processes.py), but a process that
  cannot act on that signal (stopped, stuck in the kernel, blocking it) outlives it. The next
  stack to take the lock finds the record, stops every recorded group that still runs with its
  recorded start time (SIGKILL to the group), and says so in one line.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import time
from pathlib import Path

import psutil

from uwsgi_layouts.deploy.model import LayoutError
from uwsgi_layouts.files import write_atomic

LOCK_NAME = "stack.lock"
RECORD_NAME = "stack.json"
# A recorded start time matches a live process within this many seconds (psutil's clock ticks).
START_TOLERANCE_S = 0.5
GONE_TIMEOUT_S = 5.0


def _read_pid(fd: int) -> str:
    try:
        text = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
    except OSError:
        return "?"
    return text if text.isdigit() else "?"


def _open_lock(path: Path, create: bool) -> int:
    """The lock file, opened to take the lock (``create``) or only to test it (read-only: a
    user who may not write it can still see who holds it)."""
    flags = os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_RDWR | os.O_CREAT if create else os.O_RDONLY)
    try:
        return os.open(path, flags, 0o600)
    except OSError as exc:
        raise LayoutError("run_dir", f"cannot use the lock {path}: {exc.strerror}") from None


def holder(directory: Path, name: str = LOCK_NAME) -> str | None:
    """The pid (as written) of the live process holding ``directory``'s lock, or None."""
    path = directory / name
    if not path.is_file() or path.is_symlink():
        return None
    fd = _open_lock(path, create=False)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _read_pid(fd)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


class DirLock:
    """An exclusive lock on ``directory/name``, held by this process until ``release``."""

    def __init__(self, directory: Path | str, name: str = LOCK_NAME, what: str = "a running stack"):
        self.directory = Path(directory)
        self.path = self.directory / name
        self.what = what
        self.fd: int | None = None
        self.reaped = ""  # the one line saying which orphans ``claim`` stopped ("" for none)

    def acquire(self) -> "DirLock":
        fd = _open_lock(self.path, create=True)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _read_pid(fd)
            os.close(fd)
            raise LayoutError("run_dir", f"{self.directory} is in use by {self.what} (pid {pid}): stop it first "
                                         f"(Ctrl-C, or kill {pid}), or give another directory") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self.fd = fd
        return self

    @property
    def held(self) -> bool:
        return self.fd is not None

    def release(self) -> None:
        # The file stays: removing it would let a waiting process lock a file nobody else sees.
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> "DirLock":
        return self.acquire() if self.fd is None else self

    def __exit__(self, *exc) -> None:
        self.release()


def claim(run_dir: Path | str) -> DirLock:
    """Lock ``run_dir`` for a stack (it must exist) and stop what a dead owner left running there
    (``lock.reaped`` says what, in one line)."""
    lock = DirLock(run_dir).acquire()
    try:
        lock.reaped = reap_orphans(Path(run_dir))
    except BaseException:
        lock.release()
        raise
    return lock


# --- the record of a stack's processes ------------------------------------------------------------


def record(run_dir: Path, processes: list[tuple[str, int]]) -> None:
    """Write which process groups (name, leader pid) the stack in ``run_dir`` started, with their
    start times; replaced atomically, so a reader never sees half of it."""
    entries = []
    for name, pid in processes:
        try:
            started = psutil.Process(pid).create_time()
        except psutil.Error:
            continue
        entries.append({"name": name, "pid": pid, "started": started})
    path = run_dir / RECORD_NAME
    write_atomic(path, json.dumps({"owner": os.getpid(), "processes": entries}, indent=1) + "\n")


def forget(run_dir: Path) -> None:
    """The stack stopped every process it recorded."""
    with contextlib.suppress(FileNotFoundError):
        (run_dir / RECORD_NAME).unlink()


def group_members(pgid: int) -> list[int]:
    """Live processes of process group ``pgid`` (zombies have released their ports: not counted)."""
    out = []
    for proc in psutil.process_iter(["status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(proc.pid) == pgid:
                out.append(proc.pid)
        except (OSError, psutil.Error):
            continue
    return out


def reap_orphans(run_dir: Path) -> str:
    """Stop the recorded process groups of a dead owner's stack in ``run_dir`` (call it holding
    the lock). Returns one line naming what was stopped, or ""."""
    path = run_dir / RECORD_NAME
    try:
        data = json.loads(path.read_text())
        entries = [(str(e["name"]), int(e["pid"]), float(e["started"])) for e in data["processes"]]
        owner = data.get("owner", "?")
    except FileNotFoundError:
        return ""
    except (OSError, ValueError, KeyError, TypeError):
        path.unlink(missing_ok=True)  # unreadable: nothing can be matched against it
        return ""
    stopped = []
    for name, pid, started in entries:
        try:
            same = abs(psutil.Process(pid).create_time() - started) < START_TOLERANCE_S
        except psutil.NoSuchProcess:
            same = True  # the leader is gone, its group may not be (the pid of a live group is never reused)
        except psutil.Error:
            same = False
        if not same:
            continue  # the pid belongs to another process now
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
        except PermissionError:
            continue  # not ours to stop
        stopped.append((name, pid))
    deadline = time.monotonic() + GONE_TIMEOUT_S
    while any(group_members(pid) for _, pid in stopped) and time.monotonic() < deadline:
        time.sleep(0.05)  # until the groups are gone and their ports free
    path.unlink(missing_ok=True)
    if not stopped:
        return ""
    names = ", ".join(f"{name} {pid}" for name, pid in stopped)
    return f"stopped an orphaned stack in {run_dir}, left running by pid {owner} (gone): process groups {names}"
