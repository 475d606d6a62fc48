"""Chain reload: replace uWSGI workers one at a time, without dropping a request.

uWSGI's chain reload (``c`` on the master FIFO, lazy-apps only) stops one worker
gracefully, spawns its replacement, waits until it accepts, then moves to the next.
Under ``need-app`` a replacement whose app fails to load would take the whole instance
down, so the new code is first imported in a fresh interpreter with the same paths; if
that fails, the chain is never started and the old workers keep serving.
"""

from __future__ import annotations

import json
import os
import pwd
import stat
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from deploy.errors import LayoutError, StackError
from deploy.stack import read_stats, tail

PREFLIGHT = """
import importlib, sys
module, _, name = sys.argv[1].partition(":")
app = getattr(importlib.import_module(module), name)
if not callable(app):
    raise TypeError(f"{sys.argv[1]} is not callable")
"""


@dataclass
class ReloadResult:
    seconds: float
    old_pids: dict[int, int]
    new_pids: dict[int, int]
    log: list[str] = field(default_factory=list)

    def summary(self) -> str:
        pairs = ", ".join(f"worker {w}: {self.old_pids[w]} -> {self.new_pids[w]}" for w in sorted(self.new_pids))
        return f"chain reload done in {self.seconds:.1f} s ({pairs})"


def load_run_layout(run_dir: Path) -> dict:
    try:
        data = json.loads((run_dir / "layout.json").read_text())
    except (OSError, ValueError):
        raise LayoutError("run_dir", f"{run_dir} holds no rendered layout (layout.json); start it with `run`") from None
    return data


def preflight(layout: dict, timeout: float = 30.0) -> None:
    """Import the app the way uWSGI will, in a fresh interpreter; raise StackError with the reason."""
    venv = layout.get("virtualenv") or ""
    python = str(Path(venv) / "bin" / "python") if venv else "python3"
    env = dict(os.environ, PYTHONPATH=layout["app_dir"])
    # As the user uWSGI's workers run as: code root can read but that user cannot would
    # pass a root import, then take the whole instance down (need-app) mid-chain.
    user = layout.get("user") or ""
    as_user = {}
    if os.geteuid() == 0 and user and user != "root":
        entry = pwd.getpwnam(user)
        as_user = {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": os.getgrouplist(user, entry.pw_gid)}
        env["HOME"] = entry.pw_dir
    try:
        proc = subprocess.run([python, "-c", PREFLIGHT, layout["app"]], cwd=layout["app_dir"], env=env,
                              capture_output=True, text=True, timeout=timeout, **as_user)
    except subprocess.TimeoutExpired:
        raise StackError(f"the new code of {layout['app']} did not finish importing within {timeout:.0f} s; "
                         "chain reload not started, the old workers keep serving") from None
    except OSError as exc:  # e.g. the app dir is no longer reachable for that user
        raise StackError(f"cannot import the new code of {layout['app']} as {user or 'you'}: {exc}; "
                         "chain reload not started, the old workers keep serving") from None
    if proc.returncode != 0:
        lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
        reason = lines[-1] if lines else f"exit code {proc.returncode}"
        raise StackError(f"the new code of {layout['app']} does not load: {reason}; "
                         "chain reload not started, the old workers keep serving", "\n".join(lines[-15:]))


def _workers(stats_address: str) -> dict[int, dict]:
    return {w["id"]: w for w in read_stats(stats_address)["workers"]}


def chain_reload(run_dir: Path, timeout: float = 120.0, progress=None) -> ReloadResult:
    layout = load_run_layout(run_dir)
    fifo = run_dir / "control" / "master.fifo"
    stats = layout["stats"]
    try:
        before = _workers(stats)
    except OSError:
        raise StackError(f"uWSGI of {layout['name']} is not running (no stats server on {stats})") from None
    preflight(layout)
    if not fifo.exists() or not stat.S_ISFIFO(fifo.stat().st_mode):
        raise StackError(f"{fifo} is not uWSGI's master FIFO; was the stack started by this version of `run`?")
    started = time.monotonic()
    try:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # ENXIO if no master reads it
    except OSError as exc:
        raise StackError(f"uWSGI's master is not reading {fifo}: {exc.strerror}") from None
    try:
        os.write(fd, b"c")
    finally:
        os.close(fd)
    old = {w: info["pid"] for w, info in before.items()}
    seen: dict[int, int] = {}
    deadline = started + timeout
    while True:
        try:
            now = _workers(stats)
        except OSError:
            raise StackError("uWSGI stopped during the chain reload (see logs/uwsgi.log)",
                             tail(run_dir / "logs" / "uwsgi.log")) from None
        for w, info in now.items():
            if info["pid"] and info["pid"] != old.get(w) and info.get("accepting") == 1 and w not in seen:
                seen[w] = info["pid"]
                if progress:
                    progress(f"worker {w} replaced: pid {old.get(w)} -> {info['pid']} "
                             f"after {time.monotonic() - started:.1f} s")
        if len(seen) == len(old):
            return ReloadResult(time.monotonic() - started, old, seen)
        if time.monotonic() > deadline:
            raise StackError(f"chain reload incomplete after {timeout:.0f} s: replaced workers "
                             f"{sorted(seen) or 'none'} of {sorted(old)}")
        time.sleep(0.05)  # polling interval
