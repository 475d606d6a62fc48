"""Render a layout into its run directory, safely: nginx.conf + the app server's config
(uwsgi.ini + uwsgi_params, gunicorn.conf.py or granian.env) + layout.json.

Files are rendered into a staging directory next to the destination, cross-checked
(nginx upstream == the server's sockets, worker/socket mapping, no reused address, loopback
only), tested with ``nginx -t``, and only then moved into place. A failure at any step
leaves the destination untouched.

The destination is new, empty, or one render wrote before (its nginx.conf carries the generated
header): any other directory is refused, and so is replacing a file render did not write. A
directory that existed keeps its own mode and group (render sets them only on one it creates);
a symlink is never followed (deploy.machine.output_dir).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from uwsgi_layouts.deploy.machine import (
    check_listen_address,
    check_reachable,
    enter,
    find_nginx,
    find_uwsgi,
    output_dir,
    run_user_ids,
    uwsgi_has_routing,
    uwsgi_has_ssl,
)
from uwsgi_layouts.deploy.model import REPLICAS_DIR, Layout, LayoutError, RenderError, server_layouts
from uwsgi_layouts.deploy.render.checks import crosscheck
from uwsgi_layouts.deploy.render.servers import CONFIG_FILES, ENTRY_FILE
from uwsgi_layouts.deploy.render.templates import GENERATED, TEMPLATES_DIR
from uwsgi_layouts.deploy.render.texts import render_texts

# Directories nginx and the app server write into at run time, created with the files.
RUN_SUBDIRS = ("logs", "tmp", "sockets", "control")
# Directories the unprivileged run user must own (uWSGI's vacuum, pid file, master FIFO;
# the peers' sockets and pid files).
USER_OWNED_SUBDIRS = ("sockets", "control")
# What else a run directory holds that is ours: the hosts' directories, nginx's pid file, and
# what deploy.run keeps while a stack lives (its lock, the pids of its processes).
OWN_ENTRIES = {*RUN_SUBDIRS, "hosts", REPLICAS_DIR, "nginx.pid", "stack.lock", "stack.json"}


@dataclass
class RenderResult:
    out_dir: Path
    files: list[str]
    nginx_test: str = ""  # nginx -t output ("" when nginx is not installed)
    notes: list[str] = field(default_factory=list)


def nginx_test(conf_dir: Path, namespace: str = "") -> tuple[bool, str]:
    """Run ``nginx -t`` on a rendered directory (inside network namespace ``namespace``, where
    nginx will run: it binds the listen address). Returns (ok, output); ("", True) without nginx."""
    binary = find_nginx()
    if binary is None:
        return True, ""
    # -p: relative paths resolve inside conf_dir; -e: don't touch the compiled-in /var/log path.
    cmd = [binary, "-t", "-p", f"{conf_dir}/", "-c", str(conf_dir / "nginx.conf"), "-e", "stderr"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30,
                          preexec_fn=(lambda: enter(namespace)) if namespace else None)
    return proc.returncode == 0, (proc.stdout + proc.stderr).strip()


def make_staging(out: Path) -> Path:
    """A fresh private directory to render ``out`` into, inside its nearest existing ancestor:
    same filesystem (so the final rename is atomic), and missing parent directories are only
    created once everything passed. LayoutError("out", ...) when there is none."""
    try:
        ancestor = next((a for a in [out, *out.parents] if a.exists()), Path("/"))
    except OSError as exc:  # e.g. a name over 255 bytes
        raise LayoutError("out", f"unusable directory {str(out)!r}: {exc.strerror}") from None
    if not ancestor.is_dir():
        raise LayoutError("out", f"{ancestor} exists and is not a directory")
    if not os.access(ancestor, os.W_OK):
        raise LayoutError("out", f"{ancestor} is not writable")
    stage_in = ancestor if ancestor != out else out.parent
    try:
        return Path(tempfile.mkdtemp(prefix=f".{out.name}.staging-", dir=stage_in))
    except OSError as exc:
        raise LayoutError("out", f"cannot write in {stage_in}: {exc.strerror or exc}") from None


def write_layout(layout: Layout, out_dir: Path | str, check_nginx: bool = True, front_netns: str = "") -> RenderResult:
    """Render, check and install the files for ``layout`` into ``out_dir`` (its run_dir).
    ``front_netns``: the network namespace nginx will run in (its listen address is checked there)."""
    out = output_dir("out", out_dir)  # a symlink is refused, never followed
    if str(out) != layout.run_dir:
        raise RenderError(f"layout run_dir {layout.run_dir} differs from output directory {out}")
    _check_uwsgi_ssl(layout)
    _check_uwsgi_routing(layout)
    texts = render_texts(layout)  # pure: fails before anything is written
    check_ours(out, list(texts))
    staging = make_staging(out)
    try:
        for directory in run_dirs(layout, staging):
            for sub in RUN_SUBDIRS:
                (directory / sub).mkdir(mode=0o750, parents=True)
        for name, text in texts.items():
            (staging / name).parent.mkdir(mode=0o750, parents=True, exist_ok=True)  # entry/, hosts/ADDR/
            (staging / name).write_text(text)
        _protect_entry(layout, staging)
        check_reachable(layout, out)
        check_listen_address(layout.listen_host, front_netns)
        problems = crosscheck(layout, staging)
        if problems:
            raise RenderError("cross-check failed: " + "; ".join(problems))
        ok, output = nginx_test(staging, front_netns) if check_nginx else (True, "")
        if not ok:
            raise RenderError("nginx -t rejected the rendered nginx.conf", details=output)
        if "could not build optimal map_hash" in output:  # the sizes were made for another map
            raise RenderError(f"nginx -t: the map hash sizes do not fit the data set's map; rewrite them with "
                              f"`uwsgi-layouts dataset --root {layout.data_dir} --map-only`", details=output)
        # Drop what nginx -t created in staging (pid file, empty logs, temp dirs).
        top = {name.split("/")[0] for name in texts}
        for entry in staging.iterdir():
            if entry.name not in top and entry.name not in RUN_SUBDIRS:
                entry.unlink() if entry.is_file() else shutil.rmtree(entry)
        for sub in ("logs", "tmp"):
            shutil.rmtree(staging / sub)
            (staging / sub).mkdir(mode=0o750)
        for directory in run_dirs(layout, staging):
            directory.chmod(0o750)
        _apply_ownership(layout, staging)
        _install(layout, staging, out, list(texts))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return RenderResult(out_dir=out, files=list(texts), nginx_test=output)


def new_run_dir(layout: Layout) -> Path:
    """Create the layout's run directory (it must not exist yet) as render would: mode 0750,
    and under root group-owned by the run user's group, with its subdirectories. For a caller
    that must lock the directory before anything is written into it (``deploy run``)."""
    out = Path(layout.run_dir)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.mkdir(mode=0o750)
    except OSError as exc:
        raise LayoutError("run_dir", f"cannot create {out}: {exc.strerror or exc}") from None
    for directory in run_dirs(layout, out):
        directory.mkdir(mode=0o750, parents=True, exist_ok=True)
        directory.chmod(0o750)  # whatever the umask
    _apply_ownership(layout, out)
    return out


def run_dirs(layout: Layout, root: Path) -> list[Path]:
    """The run directory and each app server's of its own (hosts/ADDR, replicas/N), under ``root``."""
    return [root, *(root / directory for directory, _ in server_layouts(layout) if directory)]


def check_ours(out: Path, names: list[str]) -> None:
    """``out`` is new, empty, or a directory render wrote (its nginx.conf has the generated
    header), and every file about to be replaced there is render's own: LayoutError("out", ...)
    otherwise. Nothing else of a directory render wrote is touched."""
    try:
        entries = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    except OSError as exc:
        raise LayoutError("out", f"cannot read {out}: {exc.strerror}") from None
    if set(entries) <= OWN_ENTRIES and not any((out / e).is_file() and e not in ("stack.lock", "stack.json",
                                                                                 "nginx.pid") for e in entries):
        return  # new, empty, or only what a run left (its lock, the run subdirectories)
    if not _written_by_render(out / "nginx.conf"):
        shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
        raise LayoutError("out", f"{out} is not empty ({shown}) and was not written by render (no nginx.conf with "
                                 "its generated header): give a new or empty directory; render replaces only "
                                 "files it wrote")
    for name in [*names, *CONFIG_FILES]:
        path = out / name
        if (path.exists() or path.is_symlink()) and not (_written_by_render(path) or _older_uwsgi_params(path)):
            raise LayoutError("out", f"{path} was not written by render (no generated header): move it away or "
                                     "give another directory; render never replaces a file it did not write")


def _check_uwsgi_routing(layout: Layout) -> None:
    if layout.server != "uwsgi" or layout.uwsgi_bin:  # a uwsgi_bin: checked with the layout (check_uwsgi_bin)
        return
    binary = find_uwsgi()
    if binary and not uwsgi_has_routing(binary):
        raise RenderError(f"uwsgi: {binary} was built without PCRE (no internal routing, so no route-if-not to "
                          "refuse code-loading packets): install libpcre2-dev (scripts/install-system-deps.sh), "
                          "then rebuild it without pip's cache: rm -rf .venv && make venv")


def _check_uwsgi_ssl(layout: Layout) -> None:
    if layout.uwsgi_tls == "off" or layout.server != "uwsgi" or layout.uwsgi_bin:
        return
    binary = find_uwsgi()
    if binary and not uwsgi_has_ssl(binary):
        raise RenderError(f"tls: {binary} was built without SSL (no ssl-socket): install libssl-dev "
                          "(scripts/install-system-deps.sh), then rebuild it: rm -rf .venv && make venv")


def _apply_ownership(layout: Layout, run_dir: Path, keep_top: bool = False) -> None:
    """Under root: the run dir and its subdirs are group-owned by the run user's group (so
    nginx workers can reach sockets and temp files); sockets/ and control/ are owned by the
    run user (uWSGI runs as that user). Nothing is world-readable. ``keep_top``: the run dir
    existed before render, and keeps its own mode and group (only what render made inside changes)."""
    if not layout.drops_privileges or not run_dir.exists():
        return
    uid, gid, _ = run_user_ids(layout.user)
    for directory in run_dirs(layout, run_dir):
        if directory != run_dir:
            os.chown(directory.parent, 0, gid)
            directory.parent.chmod(0o750)
        if directory != run_dir or not keep_top:
            os.chown(directory, 0, gid)
            directory.chmod(0o750)
        for sub in RUN_SUBDIRS:
            path = directory / sub
            path.mkdir(mode=0o750, exist_ok=True)
            os.chown(path, uid if sub in USER_OWNED_SUBDIRS else 0, gid)
            path.chmod(0o750)


def _protect_entry(layout: Layout, run_dir: Path) -> None:
    """The entry module of an app factory (its arguments may be secrets, as --env values are):
    readable by the run user's group only; under root, root owns it and that group reads it."""
    for directory in run_dirs(layout, run_dir):
        entry = directory / ENTRY_FILE
        if not entry.exists():
            continue
        entry.parent.chmod(0o750)
        entry.chmod(0o640)
        if layout.drops_privileges:
            _, gid, _ = run_user_ids(layout.user)
            os.chown(entry.parent, 0, gid)
            os.chown(entry, 0, gid)


def _install(layout: Layout, staging: Path, out: Path, names: list[str]) -> None:
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        os.rename(staging, out)  # atomic: the directory appears complete or not at all
        return
    for directory in run_dirs(layout, out):
        for sub in RUN_SUBDIRS:
            (directory / sub).mkdir(mode=0o750, parents=True, exist_ok=True)
    for name in names:  # each replace is atomic; all were validated before the first one
        (out / name).parent.mkdir(mode=0o750, parents=True, exist_ok=True)
        os.replace(staging / name, out / name)
    for stale in set(CONFIG_FILES) - set(names):  # another server's config, from an earlier render
        if _written_by_render(out / stale):
            (out / stale).unlink()
            if stale == ENTRY_FILE and not any((out / stale).parent.iterdir()):
                (out / stale).parent.rmdir()
    _apply_ownership(layout, out, keep_top=True)  # the directory itself keeps its mode and group
    _protect_entry(layout, out)


def _older_uwsgi_params(path: Path) -> bool:
    """uwsgi_params as an earlier version of render copied it: uwsgi_param lines only."""
    if path.name != "uwsgi_params" or path.is_symlink() or not path.is_file():
        return False
    lines = [line.strip() for line in path.read_text(errors="replace").splitlines()]
    return all(not line or line.startswith("#") or line.startswith("uwsgi_param ") for line in lines)


# Files render copies from templates/ as they are (nginx's own formats, no room for a header).
COPIED_TEMPLATES = ("uwsgi_params", "mime.types")


def _written_by_render(path: Path) -> bool:
    """True for a file render wrote (its generated header), never for anyone else's."""
    if path.is_symlink() or not path.is_file():
        return False
    if path.name in COPIED_TEMPLATES:  # a copy of a file of templates/, which has no header
        return path.read_bytes() == (TEMPLATES_DIR / path.name).read_bytes()
    if path.name == "layout.json":  # JSON has no comments: its format version and layout name
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return False
        return isinstance(data, dict) and "format_version" in data and "name" in data
    try:
        with open(path, errors="replace") as f:
            return f.readline()[2:].startswith(GENERATED)
    except OSError:
        return False
