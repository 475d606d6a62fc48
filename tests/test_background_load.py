"""The accuracy benchmark's noisy neighbour (``bench.load.background``): a REAL child process,
stopped on every exit path, including SIGKILL of the process that started it. Nothing here
asserts a duration or a CPU share (the machine is shared): only that the child runs, burns some
CPU, and is gone when it should be."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from uwsgi_layouts.bench.load.background import BackgroundLoad, fraction_arg

ROOT = Path(__file__).resolve().parents[1]


def gone(pid: int, timeout: float = 10.0) -> bool:
    """The process has exited (a zombie not yet reaped counts as exited)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def cpu_of(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def test_it_burns_cpu_and_stops_when_the_block_ends():
    with BackgroundLoad(0.5) as load:
        pid = load.pid
        deadline = time.monotonic() + 10
        while cpu_of(pid) == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert cpu_of(pid) > 0
    assert gone(pid)
    record = load.record()
    assert record["fraction"] == 0.5 and record["period_ms"] == 10.0 and record["cpu_share_taken"] is not None


def test_it_stops_when_the_block_raises():
    with pytest.raises(RuntimeError), BackgroundLoad(0.2) as load:
        pid = load.pid
        raise RuntimeError("the run failed")
    assert gone(pid)


HOLDER = """
import sys, time
sys.path.insert(0, {root!r})
from uwsgi_layouts.bench.load.background import BackgroundLoad
with BackgroundLoad(0.3, deathsig={deathsig}) as load:
    print(load.pid, flush=True)
    time.sleep(600)
"""


@pytest.mark.parametrize("deathsig", [True, False], ids=["prctl-and-pipe", "pipe-alone"])
def test_it_dies_with_its_parent_when_the_parent_is_sigkilled(deathsig):
    """The parent is SIGKILLed (no finally runs): the kernel's parent-death signal, or on its own
    the pipe's end of file, ends the child."""
    holder = subprocess.Popen([sys.executable, "-c", HOLDER.format(root=str(ROOT), deathsig=deathsig)],
                              stdout=subprocess.PIPE, text=True)
    try:
        child = int(holder.stdout.readline())
        assert psutil.Process(child).ppid() == holder.pid
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(10)
        assert gone(child), "the background load outlived its parent"
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()


@pytest.mark.parametrize("raw", ["0", "-0.5", "1.5", "half"])
def test_a_share_outside_one_core_is_refused(raw):
    with pytest.raises(ValueError, match=r"background_load: must be a share of one core in \(0, 1\]"):
        fraction_arg(raw)
    assert fraction_arg("1") == 1.0 and fraction_arg(" 0.5 ") == 0.5
