"""A noisy neighbour of our own: a process that burns a share of one core in short duty cycles.

    with BackgroundLoad(0.5) as load:      # half of one core, for as long as the block runs
        ...
    load.record()                          # what was asked, what it really took (CPU / wall)

The child (``python -m uwsgi_layouts.bench.load.background FRACTION PERIOD_MS FD PARENT_PID``) spins for
FRACTION x period, sleeps the rest, period after period (10 ms by default: a scheduler sees a
neighbour that comes and goes, as a busy VM host's does). It is ours, so it is stopped on every
exit path:

* leaving the ``with`` (normally, or by an exception, Ctrl-C or SIGTERM turned into one): SIGTERM,
  then SIGKILL after a second;
* our process killed outright (SIGKILL, a crash): the child asked the kernel to send it SIGKILL
  when its parent dies (``prctl(PR_SET_PDEATHSIG)``, set first thing, then checked against a
  parent that may already be gone); and its sleeps are waits on a pipe whose write end only the
  parent holds, so the parent's death reads as end of file and the child exits within one period
  even where prctl is missing.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import subprocess
import sys
import time

PR_SET_PDEATHSIG = 1
DEFAULT_PERIOD_MS = 10.0
STOP_GRACE_S = 1.0


def fraction_arg(raw) -> float:
    """A share of one core in (0, 1]; ValueError with one line otherwise."""
    try:
        value = float(str(raw).strip())
    except ValueError:
        raise ValueError(f"background_load: must be a share of one core in (0, 1], got {raw!r}") from None
    if not 0 < value <= 1:
        raise ValueError(f"background_load: must be a share of one core in (0, 1], got {value:g}")
    return value


def die_with_parent(parent_pid: int) -> None:
    """Ask the kernel for SIGKILL when the parent dies; exit at once if it already has."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: the pipe still tells us
    if os.getppid() != parent_pid:
        os._exit(0)


def burn(fraction: float, period_s: float, watch_fd: int, parent_pid: int) -> None:
    """Spin ``fraction`` of every period, wait on ``watch_fd`` for the rest; return when it reads
    end of file (the parent closed it or died) or the parent is no longer ours."""
    busy = fraction * period_s
    while True:
        start = time.monotonic()
        while time.monotonic() - start < busy:
            pass
        rest = max(0.0, period_s - (time.monotonic() - start))
        readable, _, _ = select.select([watch_fd], [], [], rest)
        if readable or os.getppid() != parent_pid:
            return


class BackgroundLoad:
    """The child process burning ``fraction`` of one core (see the module docstring)."""

    def __init__(self, fraction: float, period_ms: float = DEFAULT_PERIOD_MS, deathsig: bool = True):
        self.fraction = fraction_arg(fraction)
        self.period_ms = period_ms
        self.deathsig = deathsig  # False only to test the pipe on its own
        self.proc: subprocess.Popen | None = None
        self._write_fd: int | None = None
        self._started = 0.0
        self.cpu_s = 0.0
        self.wall_s = 0.0

    def __enter__(self) -> "BackgroundLoad":
        read_fd, self._write_fd = os.pipe()  # not inheritable: no other child of ours holds the write end
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "uwsgi_layouts.bench.load.background", str(self.fraction), str(self.period_ms),
                 str(read_fd), str(os.getpid()), "1" if self.deathsig else "0"],
                pass_fds=(read_fd,), stdin=subprocess.DEVNULL)
        except BaseException:
            os.close(self._write_fd)
            self._write_fd = None
            raise
        finally:
            os.close(read_fd)
        self._started = time.monotonic()
        return self

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def _cpu_seconds(self) -> float:
        try:
            with open(f"/proc/{self.proc.pid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            return self.cpu_s

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.cpu_s = self._cpu_seconds()
            self.wall_s = time.monotonic() - self._started
            self.proc.terminate()
            try:
                self.proc.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._write_fd is not None:
            os.close(self._write_fd)
            self._write_fd = None

    def __exit__(self, *exc) -> None:
        self.stop()

    def record(self) -> dict:
        """What results record: the share asked for, the period, and the share of one core it took."""
        taken = self.cpu_s / self.wall_s if self.wall_s else None
        return {"fraction": self.fraction, "period_ms": self.period_ms,
                "cpu_share_taken": None if taken is None else round(taken, 3)}


def main(argv: list[str]) -> int:
    fraction, period_ms, fd, parent, deathsig = argv
    if deathsig == "1":
        die_with_parent(int(parent))
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    try:
        burn(float(fraction), float(period_ms) / 1000, int(fd), int(parent))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
