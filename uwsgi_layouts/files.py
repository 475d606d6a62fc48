"""The one atomic file writer, under every room (deploy's and bench's): a file appears whole or
not at all, and no temp file is left behind on any error. It imports nothing of the project."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def _umask() -> int:
    """This process's umask, read without changing it (Linux 4.7+: /proc/self/status): setting it
    to read it back would race with the other threads (watch's, the samplers') creating files."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)  # an older kernel: the only way left
    os.umask(mask)
    return mask


def _default_mode() -> int:
    """What open() would give a new file: 0666 less the umask (mkstemp makes 0600, which would
    hide results and configs from the team and from nginx)."""
    return 0o666 & ~_umask()


def write_atomic(path: Path | str, data: str | bytes, *, mode: int | None = None,
                 owner: tuple[int, int] | None = None, durable: bool = False) -> Path:
    """Write ``data`` (str as UTF-8) to ``path`` via a temp file in the same directory and
    ``os.replace``: a reader, or a crash, never sees half a file. ``mode`` defaults to what a new
    file would get; ``owner`` (uid, gid) is set before the rename (root only); ``durable`` fsyncs
    the data first (installed files: a power cut leaves the old file or the new one)."""
    path = Path(path)
    raw = data.encode() if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(raw)
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        if owner is not None:
            os.chown(tmp, *owner)
        os.chmod(tmp, _default_mode() if mode is None else mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
