"""Chain reload: replace uWSGI workers one at a time, without dropping a request.

uWSGI's chain reload (``c`` on the master FIFO, lazy-apps only) stops one worker
gracefully, spawns its replacement, waits until it accepts, then moves to the next.
Under ``need-app`` a replacement whose app fails to load would take the whole instance
down, so the new code first goes through the same pre-flight as ``run`` (deploy.machine:
a fresh interpreter with the virtualenv, paths, env and user recorded in layout.json); if
that fails, the chain is never started, the old workers keep serving, and the command
exits 2 (bad input: the code to deploy) with the app's own exception line.
"""

from __future__ import annotations

import json
import os
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path

from uwsgi_layouts.deploy.machine import PREFLIGHT_TIMEOUT, checked, preflight, read_stats
from uwsgi_layouts.deploy.model import LayoutError, StackError, layout_from_record
from uwsgi_layouts.deploy.run.processes import tail


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
        data = None
    if not isinstance(data, dict) or not {"processes", "threads", "strategy"} <= set(data):
        raise LayoutError("run_dir", f"{run_dir} holds no rendered layout (layout.json); start it with `run`")
    return data


def _workers(stats_address: str) -> dict[int, dict]:
    return {w["id"]: w for w in read_stats(stats_address)["workers"]}


def chain_reload(run_dir: Path, timeout: float = 120.0, progress=None,
                 import_timeout: float = PREFLIGHT_TIMEOUT) -> ReloadResult:
    """Chain-reload the stack running in ``run_dir``. New code that does not import (the
    pre-flight, as at start, bounded by ``import_timeout``) raises LayoutError (bad input, exit 2)
    before anything is touched."""
    layout = checked(layout_from_record(load_run_layout(run_dir)))
    if layout.server != "uwsgi":
        raise LayoutError("layout", f"{layout.name} runs {layout.server}: chain reload is uWSGI's (its master FIFO); "
                                    f"for a graceful reload send SIGHUP to the pid in {run_dir}/control/"
                                    f"{layout.server}.pid")
    if layout.hosts:
        raise LayoutError("hosts", f"{layout.name} runs on {len(layout.hosts)} app hosts: chain-reload each host's "
                                   "uWSGI on that host, one host at a time (write 'c' to its master FIFO, "
                                   "hosts/ADDR/control/master.fifo)")
    if layout.replicas > 1:
        raise LayoutError("replicas", f"{layout.name} runs {layout.replicas} replicas: chain-reload each one's uWSGI "
                                      "in turn (write 'c' to replicas/N/control/master.fifo)")
    fifo = run_dir / "control" / "master.fifo"
    stats = layout.stats_address
    try:
        before = _workers(stats)
    except OSError:
        raise StackError(f"uWSGI of {layout.name} is not running (no stats server on {stats})") from None
    try:
        preflight(layout, timeout=import_timeout)
    except LayoutError as exc:
        raise LayoutError(exc.field, f"{exc.problem}; chain reload not started, the old workers keep "
                                     "serving") from None
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
