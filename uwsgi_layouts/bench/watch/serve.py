"""The Prometheus endpoint: prometheus_client's exposition on a TCP address or a unix socket.

    listen_address(text)     -> ("tcp", host, port) or ("unix", path, 0), ValueError naming what is allowed
    is_loopback(host)        may other machines reach it?
    MetricsServer(...)       bound at creation (OSError: in use, no permission), served in a thread

A unix socket is created by us (mode 0660: the service's user and group read it) and removed
when the server closes; an existing path is never replaced (it may be someone else's).
"""

from __future__ import annotations

import ipaddress
import os
import socket
import socketserver
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import MetricsHandler

from uwsgi_layouts.deploy.machine import is_unix_address

UNIX_MODE = 0o660


def listen_address(text: str) -> tuple[str, str, int]:
    text = text.strip()
    if is_unix_address(text):
        path = text.removeprefix("unix:")
        if not path.startswith("/") or len(path.encode()) > 107:
            raise ValueError(f"a unix socket path must be absolute and at most 107 bytes, got {text!r}")
        return "unix", path, 0
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"must be HOST:PORT (e.g. 127.0.0.1:9717) or a unix socket path, got {text!r}")
    return "tcp", host, int(port)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name: it may resolve to anything


class _UnixHTTPServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


class _TCPHTTPServer(ThreadingHTTPServer):
    daemon_threads = True


class _Handler(MetricsHandler):
    def address_string(self) -> str:  # a unix peer has no address
        return str(self.client_address[0]) if self.client_address else "unix"


class MetricsServer:
    """The registry's metrics over HTTP (any path, as prometheus_client serves them)."""

    def __init__(self, kind: str, host_or_path: str, port: int, registry: CollectorRegistry):
        handler = _Handler.factory(registry)
        self.path: Path | None = None
        if kind == "unix":
            if os.path.lexists(host_or_path):
                raise FileExistsError(0, "exists (remove it if it is a stale socket of a stopped watch)", host_or_path)
            old = os.umask(0o117)  # created 0660 from the start: never readable by others, even briefly
            try:
                self.server: socketserver.BaseServer = _UnixHTTPServer(host_or_path, handler)
            finally:
                os.umask(old)
            self.path = Path(host_or_path)
            self.url = f"unix:{host_or_path}"
        else:
            family = socket.AF_INET6 if ":" in host_or_path else socket.AF_INET
            server_class = type("_Server", (_TCPHTTPServer,), {"address_family": family})
            self.server = server_class((host_or_path, port), handler)
            shown = f"[{host_or_path}]" if family == socket.AF_INET6 else host_or_path
            self.url = f"http://{shown}:{self.server.server_address[1]}/metrics"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True, name="watch-http")

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        if self._thread.is_alive():
            self.server.shutdown()
        self.server.server_close()
        if self.path is not None:
            try:
                self.path.unlink()
            except FileNotFoundError:
                pass
