"""The run user: who the stack runs as on this machine, and what that user can read.

Started as root, the app server (uWSGI or a peer) is started as the run user (with TLS,
uWSGI's master stays root and its workers drop to it), and nginx's workers run as it: each
must be able to reach the app, its virtualenv, the standard library and the static
directories, or it dies at start.
"""

from __future__ import annotations

import grp
import os
import pwd
import sysconfig
from pathlib import Path
from typing import TYPE_CHECKING

from uwsgi_layouts.deploy.machine.python import server_package_dir, venv_base_stdlib
from uwsgi_layouts.deploy.model import LayoutError

if TYPE_CHECKING:
    from uwsgi_layouts.deploy.model import Layout

def blocked_at(path: Path, uid: int, gids: set[int], need_read: bool) -> Path | None:
    """The first directory on the way to ``path`` that user ``uid`` cannot pass (or read)."""
    for step in [*reversed(path.parents), path]:
        if not step.exists():
            return None
        st = step.stat()
        bits = 6 if st.st_uid == uid else 3 if st.st_gid in gids else 0
        perm = (st.st_mode >> bits) & 0o7
        wanted = 0o5 if (need_read and step == path) else 0o1
        if perm & wanted != wanted:
            return step
    return None


def run_user_ids(user: str) -> tuple[int, int, set[int]]:
    """uid, primary gid and every group id of ``user`` (uWSGI calls initgroups when it drops)."""
    entry = pwd.getpwnam(user)
    gids = {entry.pw_gid, *(g.gr_gid for g in grp.getgrall() if user in g.gr_mem)}
    return entry.pw_uid, entry.pw_gid, gids


def check_readable(layout: Layout) -> None:
    """Under root, the run user must read the app, its virtualenv (and the Python that venv was
    made from), Python's standard library, every static directory and a peer's package, or the
    server dies right after dropping privileges (and nginx answers 403 for static files)."""
    if not layout.drops_privileges:
        return
    uid, _, gids = run_user_ids(layout.user)
    needed: list[tuple[str, str, Path]] = [
        ("app_dir", "app dir", Path(layout.app_dir)),
        ("user", "Python standard library", Path(sysconfig.get_paths()["stdlib"])),
    ]
    if layout.data_dir:
        needed.append(("data_dir", "data set", Path(layout.data_dir) / "files"))
    if layout.virtualenv:
        venv = Path(layout.virtualenv)
        needed.append(("virtualenv", "virtualenv", venv))
        base = venv_base_stdlib(venv)
        if base is not None:
            needed.append(("virtualenv", "standard library of the virtualenv's base Python", base))
    needed += [("static", f"static directory for {prefix}/", Path(d)) for prefix, d in layout.static]
    if layout.server != "uwsgi":  # a peer imports its own package from our venv (deploy/run/peer_launch.py)
        package = server_package_dir(layout.server)
        if package is not None:
            needed.append(("user", f"{layout.server} package of our venv", package))
    for field_name, what, path in needed:
        blocked = blocked_at(path.resolve(), uid, gids, need_read=True)
        if blocked is None:
            continue
        mode = f"{blocked} is mode {blocked.stat().st_mode & 0o777:o}"
        if field_name == "user":
            fix = "build the venv from a system Python (make venv PYTHON=/usr/bin/python3) or pass --user"
        elif field_name == "virtualenv":
            fix = f"make it readable (chmod o+rx {blocked}), build it from a system Python such as /usr/bin/python3, " \
                  "or pass --user"
        else:
            fix = f"move it where {layout.user} can read it (e.g. under /srv), make it readable (chmod o+rx " \
                  f"{blocked}), or pass --user with a user who can"
        server = "uWSGI" if layout.server == "uwsgi" else layout.server
        raise LayoutError(field_name, f"{server} and nginx would run as {layout.user}, who cannot read the {what} at "
                                      f"{path} ({mode}): {fix}")


def default_unprivileged_user() -> str:
    for name in ("www-data", "nobody"):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            continue
    raise LayoutError("user", "running as root but neither www-data nor nobody exists: pass --user NAME")


def resolve_user(raw) -> str:
    """The user uWSGI and nginx workers run as. Only root can switch users."""
    current = pwd.getpwuid(os.getuid()).pw_name
    name = str(raw or "").strip()
    if os.geteuid() != 0:
        if name and name != current:
            raise LayoutError("user", f"only root can run the stack as another user; you are {current!r}")
        return current
    name = name or default_unprivileged_user()
    try:
        pwd.getpwnam(name)
    except KeyError:
        raise LayoutError("user", f"no such user {name!r}") from None
    return name


def group_of(user: str) -> str:
    """The primary group of ``user``."""
    return grp.getgrgid(pwd.getpwnam(user).pw_gid).gr_name


def check_reachable(layout: Layout, out: Path) -> None:
    """Under root, the unprivileged run user must reach the run dir and read the app, its
    virtualenv, Python's standard library and the static dirs, or uWSGI dies right after
    dropping privileges."""
    if not layout.drops_privileges:
        return
    uid, _, gids = run_user_ids(layout.user)
    # A directory that exists keeps its mode (render sets modes only on one it creates).
    blocked = blocked_at(out if out.is_dir() else out.parent, uid, gids, need_read=False)
    if blocked is not None:
        raise LayoutError(
            "run_dir",
            f"user {layout.user} cannot reach {out}: {blocked} is mode {blocked.stat().st_mode & 0o777:o}; "
            f"use another --out/--run-dir (or chmod o+x {blocked})",
        )
    check_readable(layout)
