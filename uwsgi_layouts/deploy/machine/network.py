"""This machine's network as the stack meets it: the kernel's listen-queue cap, and whether
nginx can bind its listen address (inside the namespace it will run in)."""

from __future__ import annotations

import socket
from pathlib import Path

from uwsgi_layouts.deploy.machine.netns import run_in
from uwsgi_layouts.deploy.model import LayoutError


def somaxconn() -> int | None:
    """The kernel's cap on listen backlogs; uWSGI refuses to start above it on Linux."""
    try:
        return int(Path("/proc/sys/net/core/somaxconn").read_text().strip())
    except (OSError, ValueError):
        return None


def check_backlog(backlog: int) -> int:
    cap = somaxconn() or 65535
    if backlog > cap:
        raise LayoutError("backlog", f"must be in 1..{cap} (net.core.somaxconn; uWSGI refuses a larger listen queue), "
                                     f"got {backlog}")
    return backlog


def check_listen_address(host: str, namespace: str = "") -> None:
    """nginx (and so `nginx -t`) binds the listen address: it must be one of this machine's
    (of namespace ``namespace``'s, where nginx will run)."""
    if host == "0.0.0.0":
        return

    def bind() -> None:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind((host, 0))
            except OSError as exc:
                raise LayoutError("listen", f"{host} is not an address of this machine ({exc.strerror}); nginx "
                                            "could not bind it") from None

    run_in(namespace, bind)
