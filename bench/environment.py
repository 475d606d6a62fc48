"""What the results were measured on: recorded in every results.json."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
from pathlib import Path

from deploy.machine import PROJECT_ROOT
from deploy.run import nginx_binary, uwsgi_binary


def _first_line(cmd: list[str]) -> str:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "not found"
    text = (proc.stdout + proc.stderr).strip()
    return text.splitlines()[0] if text else "unknown"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _git_commit() -> str:
    commit = _first_line(["git", "-C", str(PROJECT_ROOT), "rev-parse", "--short=12", "HEAD"])
    if commit in ("not found", "unknown") or "fatal" in commit:
        return "unknown"
    dirty = subprocess.run(["git", "-C", str(PROJECT_ROOT), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    return commit + ("-dirty" if dirty else "")


def capture() -> dict:
    return {
        "nproc": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "loadavg_at_start": list(os.getloadavg()),
        "kernel": platform.release(),
        "python": sys.version.split()[0],
        "uwsgi": _first_line([uwsgi_binary(), "--version"]),
        "nginx": _first_line([nginx_binary(), "-v"]).replace("nginx version: ", ""),
        "wrk": _first_line(["wrk", "-v"]).split("[")[0].strip(),
        "git_commit": _git_commit(),
        "hostname": socket.gethostname(),
    }
