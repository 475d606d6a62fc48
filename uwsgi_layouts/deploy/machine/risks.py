"""Risky input, refused unless the user accepted the risk by name (``--allow-RISK``, the
layout's ``allow``; deploy.model's RISKS says what each means).

* world-writable: the app dir, the virtualenv (and its site-packages) or a static directory is
  writable by users other than its owner, or one of their parents is without the sticky bit
  (whoever can write there can rename the directory and put another in its place). Any such
  user could plant a module the workers import, or a file (or symlink) nginx serves.
* root: the app would run as root.
* system-static: nginx would serve a directory under /etc, /proc, /sys, /dev, /boot, /root,
  /run or /var/lib (checked as given and where symlinks lead: /s=/proc/self is /proc/PID).
* public-listen: the lab's nginx would listen beyond loopback (an isolated network this
  process made for its hosts is not "public").
* tcp-stats: uWSGI's stats server would listen on loopback TCP (a stats_port) instead of its
  unix socket. A TCP port has no owner: every local user could connect, and the stats JSON holds
  the variables of every request in flight (Cookie, Authorization headers), so any of them could
  take over the app's users' sessions.

Each refusal is one LayoutError naming the field, what was found and the option that accepts it.
"""

from __future__ import annotations

import grp
import ipaddress
import os
import pwd
import stat
from pathlib import Path
from typing import TYPE_CHECKING

from uwsgi_layouts.deploy.machine.netns import is_isolated
from uwsgi_layouts.deploy.machine.paths import within
from uwsgi_layouts.deploy.model import LayoutError

if TYPE_CHECKING:
    from uwsgi_layouts.deploy.model import Layout

SYSTEM_STATIC_ROOTS = ("/etc", "/proc", "/sys", "/dev", "/boot", "/root", "/run", "/var/lib")


def accept(risk: str) -> str:
    """How the user accepts ``risk``: the command-line option named for it."""
    return f"--allow-{risk}"


def group_members(gid: int) -> set[str]:
    """Every user in group ``gid``: its listed members and the users whose primary group it is."""
    try:
        members = set(grp.getgrgid(gid).gr_mem)
    except KeyError:
        members = set()
    return members | {p.pw_name for p in pwd.getpwall() if p.pw_gid == gid}


def other_writers(st: os.stat_result) -> str:
    """Who besides the owner may write to a directory with this stat: "" when nobody."""
    if st.st_mode & stat.S_IWOTH:
        return "every user (o+w)"
    if st.st_mode & stat.S_IWGRP:
        try:
            owner = pwd.getpwuid(st.st_uid).pw_name
        except KeyError:
            owner = str(st.st_uid)
        others = sorted(group_members(st.st_gid) - {owner})
        if others:
            try:
                group = grp.getgrgid(st.st_gid).gr_name
            except KeyError:
                group = str(st.st_gid)
            shown = ", ".join(others[:3]) + (", ..." if len(others) > 3 else "")
            return f"group {group} (g+w: {shown})"
    return ""


def writable_by_others(path: Path) -> str:
    """Why users other than the owner can change what ``path`` (a resolved directory) holds:
    the directory itself, or a parent without the sticky bit. "" when they cannot."""
    for step in [path, *path.parents]:
        try:
            st = step.stat()
        except OSError:
            continue
        who = other_writers(st)
        if not who:
            continue
        if step == path:
            return f"{path} is writable by {who}"
        if not st.st_mode & stat.S_ISVTX:  # sticky: others cannot rename or remove our entries
            return f"its parent {step} is writable by {who} without the sticky bit"
    return ""


def code_dirs_of(app_dir: str, virtualenv: str, static) -> list[tuple[str, str, Path]]:
    """(field, what, directory) of every directory whose content the workers run or nginx serves:
    the app dir, the virtualenv and its site-packages, each static directory ((prefix, dir) pairs)."""
    dirs = [("app_dir", "app dir", Path(app_dir))]
    if virtualenv:
        venv = Path(virtualenv)
        dirs.append(("virtualenv", "virtualenv", venv))
        dirs += [("virtualenv", "virtualenv's site-packages", p)
                 for p in sorted(venv.glob("lib*/python*/site-packages")) if p.is_dir()]
    dirs += [("static", f"static directory for {prefix}/", Path(d)) for prefix, d in static]
    return dirs


def code_dirs(layout: Layout) -> list[tuple[str, str, Path]]:
    return code_dirs_of(layout.app_dir, layout.virtualenv, layout.static)


def check_code_dirs(layout: Layout) -> None:
    if layout.allows("world-writable"):
        return
    check_dirs_not_writable(code_dirs(layout))


def check_dirs_not_writable(dirs: list[tuple[str, str, Path]]) -> None:
    """LayoutError for the first directory that users other than its owner can change."""
    for field_name, what, directory in dirs:
        why = writable_by_others(directory.resolve())
        if why:
            raise LayoutError(field_name, f"the {what} {directory}: {why}, who could plant code the workers run or "
                                          f"files nginx serves; fix the mode (chmod o-w,g-w) or pass "
                                          f"{accept('world-writable')}")


def check_run_user(layout: Layout) -> None:
    if layout.allows("root"):
        return
    try:
        uid = pwd.getpwnam(layout.user).pw_uid
    except KeyError:
        return  # resolve_user names a missing user
    if uid == 0:
        raise LayoutError("user", f"{layout.user} is root: the app (and anything it runs) would have every privilege "
                                  f"of this machine; use an unprivileged user (the default, www-data) or pass "
                                  f"{accept('root')}")


def check_static_locations(static: tuple[tuple[str, str], ...], allow: tuple[str, ...]) -> None:
    """``static``: (prefix, directory as given); each is checked as given and where it leads."""
    if "system-static" in allow:
        return
    for prefix, directory in static:
        given = os.path.normpath(os.path.expanduser(directory))
        real = str(Path(given).resolve())
        root = within(given, SYSTEM_STATIC_ROOTS) or within(real, SYSTEM_STATIC_ROOTS)
        if root:
            shown = given if given == real else f"{given} (-> {real})"
            raise LayoutError("static", f"{prefix}/ would serve {shown}, under {root}, where the system keeps "
                                        "configuration, secrets or live state: serve a directory of the app's "
                                        f"(e.g. under /srv) or pass {accept('system-static')}")


def check_listen(layout: Layout) -> None:
    host = layout.listen_host
    if layout.allows("public-listen") or ipaddress.IPv4Address(host).is_loopback or is_isolated(host):
        return
    shown = "every interface" if host == "0.0.0.0" else host
    raise LayoutError("listen", f"{layout.listen} would serve the lab's stack on {shown}, reachable by other "
                                "machines; listen on 127.0.0.1 (a production site is `uwsgi-layouts bundle`) "
                                f"or pass {accept('public-listen')}")


def check_stats(layout: Layout) -> None:
    if not layout.has_stats or not layout.stats_port or layout.allows("tcp-stats"):
        return
    raise LayoutError("stats_port", f"--stats-port {layout.stats_port} would put uWSGI's stats server on "
                                    f"{layout.stats_address}, where every local user reads the variables of requests "
                                    "in flight (cookies, Authorization headers): drop it (the default is a unix "
                                    f"socket only the stack's users can open) or pass {accept('tcp-stats')}")
