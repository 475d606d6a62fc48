"""Where this machine's nginx is: the one locator every room uses (the lab's stack, ``nginx -t``
on rendered files, the bundle's installer). Each caller says in its own error what is missing."""

from __future__ import annotations

import shutil
from pathlib import Path

DEBIAN_NGINX = Path("/usr/sbin/nginx")  # not on a non-root user's PATH on Debian


def find_nginx() -> str | None:
    """nginx's path: the one on PATH, else Debian's /usr/sbin/nginx; None when neither exists."""
    return shutil.which("nginx") or (str(DEBIAN_NGINX) if DEBIAN_NGINX.exists() else None)
