"""nginx's access log as syslog datagrams on a unix socket watch creates (``--access-log-socket``):
what a pod's exporter sidecar reads, where a log file on a shared volume would grow until the
volume's size limit evicts the pod (nothing in a pod rotates it).

nginx sends each line as one datagram (``access_log syslog:server=unix:PATH,nohostname FORMAT``):
``<190>Nov 27 09:31:02 nginx: LINE``. ``DatagramLog`` receives them in a thread of its own (the
kernel queues at most net.unix.max_dgram_qlen datagrams, 512 by default: a reader polling twice a
second would make nginx drop lines above about 1000 requests a second) and hands the lines over
in ``read()``, as ``bench.observe.LogTail`` does for a file, so ``LogWatch`` reads either.

The socket is created with mode 0660 (the service's group: nginx sends, nothing else may) and
removed on close. An existing path is replaced only when it is a socket nobody receives on (ours,
left by a watch that was killed: a restarted container finds it in its volume); anything else
there is never touched.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import socket
import stat
import threading

from uwsgi_layouts.bench.observe import LOG_LIMIT_BYTES

SOCKET_MODE = 0o660
RECEIVE_BUFFER = 4 * 2**20  # asked for; the kernel caps it at net.core.rmem_max
MAX_DATAGRAM = 64 * 1024  # nginx's syslog lines are at most its log buffer (a few kB)
RECEIVE_TIMEOUT_S = 0.25  # how soon the receiver notices close()
# RFC 3164's header as nginx writes it: <PRI>Mmm dd hh:mm:ss [HOST ]TAG: (nohostname drops HOST).
SYSLOG_HEADER = re.compile(rb"^<\d{1,3}>[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d (?:\S+ )?\w+: ")


def strip_header(datagram: bytes) -> bytes:
    """The log line of one datagram: its syslog header and trailing newline removed (a datagram
    without the header is taken whole)."""
    return SYSLOG_HEADER.sub(b"", datagram, count=1).rstrip(b"\r\n")


def _stale_socket(path: str) -> bool:
    """A socket file nobody is bound to (connecting is refused): a killed watch's own."""
    try:
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            return False
    except FileNotFoundError:
        return False
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        probe.connect(path)
    except OSError as exc:
        return exc.errno == errno.ECONNREFUSED
    finally:
        probe.close()
    return False


class DatagramLog:
    """A unix datagram socket at ``path`` receiving nginx's log lines; ``read()`` returns the lines
    received since the last read (at most ``limit`` bytes: ``cut`` says lines were dropped).
    Raises OSError when the path cannot be bound (FileExistsError: something else is there)."""

    def __init__(self, path: str, limit: int = LOG_LIMIT_BYTES):
        self.path = path
        self.limit = limit
        self.cut = False
        if os.path.lexists(path):
            if not _stale_socket(path):
                raise FileExistsError(errno.EEXIST, "exists and is not a socket left by watch", path)
            os.unlink(path)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
            self._sock.bind(path)
            os.chmod(path, SOCKET_MODE)
            self._sock.settimeout(RECEIVE_TIMEOUT_S)
        except OSError:
            self._sock.close()
            with contextlib.suppress(FileNotFoundError):  # bound, then chmod failed: ours to remove
                os.unlink(path)
            raise
        self._lock = threading.Lock()
        self._lines: list[bytes] = []
        self._size = 0
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._receive, daemon=True, name="watch-log-socket")
        self._thread.start()

    def _receive(self) -> None:
        while not self._closed.is_set():
            try:
                datagram = self._sock.recv(MAX_DATAGRAM)
            except TimeoutError:
                continue
            except OSError:
                if self._closed.is_set():
                    return
                continue
            line = strip_header(datagram)
            with self._lock:
                if self._size + len(line) > self.limit:
                    self.cut = True
                    continue
                self._lines.append(line)
                self._size += len(line)

    def read(self) -> list[str]:
        with self._lock:
            lines, self._lines, self._size = self._lines, [], 0
        return [line.decode("utf-8", "replace") for line in lines]

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        self._thread.join(timeout=2)
        self._sock.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
