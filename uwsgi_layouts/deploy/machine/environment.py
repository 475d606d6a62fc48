"""The environment a stack's processes start with: a clean one, never the caller's.

Whoever starts the stack (often root, from a shell full of tokens and credentials) passes on
only what programs need to behave: PATH (without relative entries), LANG and LC_*, TZ, and
HOME of the user the processes run as. The app's own variables are the layout's ``--env``
(written into the server's config: uwsgi.ini ``env``, gunicorn's ``raw_env``, granian.env);
anything else the app needs is passed the same way.
"""

from __future__ import annotations

import os
import pwd
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from uwsgi_layouts.deploy.model import Layout

DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
KEPT = ("LANG", "TZ")  # and every LC_*


def clean_path(raw: str) -> str:
    """PATH without empty or relative entries, which would make the current directory (the app
    dir, the run dir) a place to find programs in."""
    kept = [d for d in raw.split(":") if d.startswith("/")]
    return ":".join(dict.fromkeys(kept)) or DEFAULT_PATH


def stack_environment(layout: Layout) -> dict[str, str]:
    """What every process of the stack (the app server, nginx) starts with."""
    env = {k: v for k, v in os.environ.items() if k in KEPT or k.startswith("LC_")}
    env["PATH"] = clean_path(os.environ.get("PATH", DEFAULT_PATH))
    try:
        env["HOME"] = pwd.getpwnam(layout.user).pw_dir
    except KeyError:
        env["HOME"] = "/"
    return env


def worker_environment(layout: Layout) -> dict[str, str]:
    """What the app sees in its workers: the stack's environment and the layout's ``--env``."""
    return stack_environment(layout) | dict(layout.env)
