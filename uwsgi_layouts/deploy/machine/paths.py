"""Directories on this machine: where this project is (the demo app), and the app's
directories given as options, resolved (``~``, symlinks) and checked to exist."""

from __future__ import annotations

import os
from pathlib import Path

from uwsgi_layouts.deploy.model import LayoutError, check_static_dir, config_path

# This checkout: the demo app (app.wsgi) and the templates live here.
PACKAGE_DIR = Path(__file__).resolve().parent.parent.parent


def within(path: str, roots: tuple[str, ...]) -> str:
    """The root of ``roots`` that holds ``path`` (itself or below it, as text), else ""."""
    return next((r for r in roots if path == r or path.startswith(r + "/")), "")


def is_kind(path: Path, kind: str) -> bool:
    """path.is_dir()/is_file(), False instead of OSError (e.g. a name over 255 bytes)."""
    try:
        return path.is_dir() if kind == "dir" else path.is_file()
    except OSError:
        return False


def resolved(raw: str) -> Path:
    return Path(os.path.expanduser(str(raw))).resolve()


def output_dir(field_name: str, raw) -> Path:
    """A directory we are to write into, as an absolute path: its parents resolved, itself never
    followed. A symlink there is refused: whoever made it chooses where our files would land
    (someone else's directory, /etc...), so we never write through one."""
    path = Path(os.path.abspath(os.path.expanduser(str(raw))))
    try:
        path = path.parent.resolve() / path.name if path.name else path
        is_link = path.is_symlink()
        exists_as_file = path.exists() and not path.is_dir()
    except OSError as exc:  # e.g. a name over 255 bytes
        raise LayoutError(field_name, f"unusable directory {str(raw)!r}: {exc.strerror}") from None
    if is_link:
        raise LayoutError(field_name, f"{path} is a symbolic link (to {os.readlink(path)}): give the directory itself; "
                                      "files are never written through a link")
    if exists_as_file:
        raise LayoutError(field_name, f"{path} exists and is not a directory")
    return path


def existing_dir(field_name: str, raw: str, nginx: bool = False) -> str:
    """``raw`` resolved, if it is a directory here; LayoutError(field_name, ...) otherwise."""
    path = resolved(raw)
    if not is_kind(path, "dir"):
        raise LayoutError(field_name, f"must be an existing directory, got {str(raw)!r}")
    return config_path(field_name, str(path), nginx=nginx)


def static_dirs(static: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    """The layout's ``--static PREFIX=DIR`` directories resolved, each an existing directory."""
    out = []
    for prefix, directory in static:
        path = resolved(directory)
        if not is_kind(path, "dir"):
            raise LayoutError("static", f"{directory!r} (for {prefix}/) must be an existing directory")
        out.append((prefix, check_static_dir(prefix, str(path))))
    return tuple(out)
