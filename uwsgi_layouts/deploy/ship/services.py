"""systemd and nginx on the server, as install and uninstall drive them: units started, stopped
(gracefully: the unit's ExecStop), chain-reloaded and waited for; nginx reloaded and waited for
until its old workers are gone, so that nothing sends to a slot about to stop.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from uwsgi_layouts.deploy.machine import read_stats
from uwsgi_layouts.deploy.model import StackError

SYSTEMCTL_TIMEOUT = 120
POLL = 0.1  # seconds between looks at nginx's workers or uWSGI's stats


def systemd_running() -> bool:
    """sd_booted(): systemd is PID 1 when /run/systemd/system exists."""
    return Path("/run/systemd/system").is_dir()


def pid1_name() -> str:
    try:
        return Path("/proc/1/comm").read_text().strip()
    except OSError:
        return "unknown"


def systemctl(*args: str, check: bool = True, timeout: float = SYSTEMCTL_TIMEOUT) -> subprocess.CompletedProcess:
    proc = subprocess.run(["systemctl", *args], capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        unit = args[-1]
        status = subprocess.run(["systemctl", "status", "--no-pager", "-n", "20", unit], capture_output=True,
                                text=True, timeout=SYSTEMCTL_TIMEOUT)
        raise StackError(f"systemctl {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}",
                         log_tail=status.stdout + status.stderr)
    return proc


def is_active(unit: str) -> bool:
    return systemctl("is-active", "--quiet", unit, check=False).returncode == 0


def stop_timeout(grace: int) -> float:
    """How long `systemctl stop` may take: the unit's TimeoutStopSec (grace + 15) twice (ExecStop,
    then the wait after KillSignal), and a margin."""
    return 2 * (grace + 15) + 30


# --- nginx ---------------------------------------------------------------------------------------


def nginx_workers() -> set[int]:
    """The worker pids of the nginx that systemd runs (empty when it does not run)."""
    pid = systemctl("show", "-p", "MainPID", "--value", "nginx", check=False).stdout.strip()
    try:
        return {c.pid for c in psutil.Process(int(pid)).children()} if pid not in ("", "0") else set()
    except (ValueError, psutil.Error):
        return set()


def reload_nginx(wait: float, progress: Callable[[str], None]) -> str:
    """``systemctl reload nginx`` when it runs, then wait (up to ``wait`` s) until every worker of
    the old configuration has exited: they finish their requests in flight, so once they are gone
    nothing sends to what the old configuration named. Returns what happened."""
    if not is_active("nginx"):
        return "nginx is not running: start it with systemctl start nginx"
    old = nginx_workers()
    started = time.monotonic()
    systemctl("reload", "nginx")
    deadline = started + wait
    while old & nginx_workers():
        if time.monotonic() > deadline:
            progress(f"note: nginx's old workers {sorted(old & nginx_workers())} still run after {wait:g} s "
                     "(long requests or open connections)")
            break
        time.sleep(POLL)  # polling: nginx's old workers exit once their connections are done
    return f"systemctl reload nginx (old workers gone in {time.monotonic() - started:.1f} s)"


# --- uWSGI -----------------------------------------------------------------------------------------


def worker_pids(stats_socket: str) -> list[int]:
    """The worker pids uWSGI's stats server reports (its unix socket)."""
    return [w["pid"] for w in read_stats(stats_socket, timeout=5)["workers"]]


def chain_reload(unit: str, stats_socket: str, timeout: float) -> str:
    """``systemctl reload UNIT`` (ExecReload writes "c" on the master FIFO: one worker at a time
    is replaced, lazy-apps loads the code again), then wait until every worker is new."""
    before = set(worker_pids(stats_socket))
    started = time.monotonic()
    systemctl("reload", unit)
    deadline = started + timeout
    while True:
        try:
            now = worker_pids(stats_socket)
        except (OSError, ValueError):
            now = list(before)  # the master is busy respawning: look again
        if now and 0 not in now and not set(now) & before:
            return f"systemctl reload {unit} (chain reload: {len(now)} workers replaced in " \
                   f"{time.monotonic() - started:.1f} s)"
        if time.monotonic() > deadline:
            raise StackError(f"the chain reload of {unit} did not replace every worker in {timeout:g} s "
                             f"(workers {now}, before {sorted(before)})")
        time.sleep(POLL)  # polling uWSGI's stats while it replaces workers one at a time


def missing_sockets(paths: list[str]) -> list[str]:
    """The unix sockets of ``paths`` that do not exist (uWSGI binds them before it tells systemd it
    is ready, so after a start none should be missing). TCP addresses are not looked at."""
    return [p for p in paths if p.startswith("/") and not Path(p).is_socket()]
