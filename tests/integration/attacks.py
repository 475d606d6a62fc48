"""What another local user can do to a running stack: helpers that act as that user (a fresh
process that switched uid and gid, as ``nobody`` or ``root``) against real sockets, and a
marker app that leaves a trace whenever anything imports or runs it."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.support import uwsgi_packet

# Acting as another user needs root (the stack then runs as www-data, the attacker as nobody).
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: only root can act as other users")

CHILD_PYTHON = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable

# Sends one uwsgi packet (hex in argv[2]) to argv[1] (HOST:PORT or a unix path) and prints the
# first line of the answer, or the errno of a refused connect.
SEND = r"""
import socket, sys
address, packet = sys.argv[1], bytes.fromhex(sys.argv[2])
if address.startswith("/"):
    conn, target = socket.socket(socket.AF_UNIX), address
else:
    host, _, port = address.rpartition(":")
    conn, target = socket.socket(socket.AF_INET), (host, int(port))
conn.settimeout(20)
try:
    conn.connect(target)
except OSError as e:
    print("errno", e.errno)
    sys.exit(0)
conn.sendall(packet)
data = b""
try:
    while chunk := conn.recv(65536):
        data += chunk
except socket.timeout:
    print("timeout", data[:80])
    sys.exit(0)
print(data.split(b"\r\n", 1)[0].decode("latin-1") or "closed")
"""


def request_env(path: str = "/healthz", **extra: str) -> dict[str, str]:
    """The variables nginx would send for ``GET path``, plus ``extra`` (what an attacker adds)."""
    return {"REQUEST_METHOD": "GET", "REQUEST_URI": path, "PATH_INFO": path, "QUERY_STRING": "",
            "SERVER_PROTOCOL": "HTTP/1.1", "SERVER_NAME": "t", "SERVER_PORT": "80", "REMOTE_ADDR": "127.0.0.1",
            "HTTP_HOST": "t", **extra}


def send_as(user: str, address: str, env: dict[str, str], timeout: float = 40.0) -> str:
    """Send a raw uwsgi packet as ``user``: the answer's status line, "errno N", or "timeout ..."."""
    return run_as(user, SEND, [address, uwsgi_packet(env).hex()], timeout)


def run_as(user: str, script: str, args: list[str], timeout: float) -> str:
    """Run a Python ``script`` as ``user`` (uid, gid and groups switched): what it printed."""
    entry = pwd.getpwnam(user)
    proc = subprocess.run([CHILD_PYTHON, "-c", script, *args], user=entry.pw_uid, group=entry.pw_gid,
                          extra_groups=os.getgrouplist(user, entry.pw_gid), cwd="/", capture_output=True, text=True,
                          timeout=timeout, env={"PATH": "/usr/bin:/bin"})
    return proc.stdout.strip() or proc.stderr.strip()


# Reads what a stats server (argv[1]: HOST:PORT or a unix path) writes and prints it, or the errno
# of a refused connect.
READ = r"""
import socket, sys
address = sys.argv[1]
if address.startswith("/"):
    conn, target = socket.socket(socket.AF_UNIX), address
else:
    host, _, port = address.rpartition(":")
    conn, target = socket.socket(socket.AF_INET), (host, int(port))
conn.settimeout(10)
try:
    conn.connect(target)
except OSError as e:
    print("errno", e.errno)
    sys.exit(0)
data = b""
while chunk := conn.recv(65536):
    data += chunk
print("read", data.decode("utf-8", "replace"))
"""


def read_as(user: str, address: str, timeout: float = 30.0) -> str:
    """Read a stats server as ``user``: "read DOCUMENT", or "errno N" when the connect was refused."""
    return run_as(user, READ, [address], timeout)


def marker_app(directory: Path) -> tuple[Path, Path]:
    """evil.py, which appends to MARKER when imported or called; the directory is 0777 so that
    whoever runs it (the workers' user) can leave the trace. Returns (evil.py, MARKER)."""
    directory.mkdir(mode=0o777)
    directory.chmod(0o777)
    marker = directory / "MARKER"
    evil = directory / "evil.py"
    evil.write_text(f"open({str(marker)!r}, 'a').write('imported\\n')\n"
                    "def application(environ, start_response):\n"
                    f"    open({str(marker)!r}, 'a').write('ran\\n')\n"
                    "    start_response('200 OK', [('Content-Type', 'text/plain')])\n"
                    "    return [b'EVIL']\n")
    evil.chmod(0o644)
    return evil, marker
