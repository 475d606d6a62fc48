"""Uninstall a bundle: ``uwsgi-layouts uninstall NAME [--root PREFIX] [--dry-run] [--purge]``.

It removes exactly what install wrote, as its manifest (deploy/ship/manifest.py) lists it, in
the order that fails no request:

1. Read the manifest; every file it lists must still carry this bundle's header (a file that
   does not is someone else's now: exit 2, nothing changed).
2. Disable the site (its sites-enabled link), ``nginx -t`` (the link comes back if it fails),
   reload nginx and wait for its old workers: nothing sends to the app any more.
3. Stop the app gracefully (the unit's ExecStop: requests in flight finish) and disable it.
4. Remove the files, then the directories install created (when empty), daemon-reload.
5. Logs stay (/var/log/NAME, the site's nginx logs) unless ``--purge``.

Under ``--root PREFIX`` steps 2-3 only test nginx: nothing runs there.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from uwsgi_layouts.deploy.model import LayoutError, RenderError
from uwsgi_layouts.deploy.ship.bundle import under, unit_of
from uwsgi_layouts.deploy.ship.files import generated_for
from uwsgi_layouts.deploy.ship.installer import nginx_test
from uwsgi_layouts.deploy.ship.manifest import manifest_path, read_manifest
from uwsgi_layouts.deploy.ship.server_fields import NAME_RE
from uwsgi_layouts.deploy.ship.services import is_active, reload_nginx, stop_timeout, systemctl, systemd_running

# How long uninstall waits for nginx's old workers when it has no stop grace to go by.
NGINX_WAIT = 30


@dataclass
class UninstallResult:
    name: str
    root: Path
    dry_run: bool
    removed: list[Path] = field(default_factory=list)
    kept: list[Path] = field(default_factory=list)  # logs, without --purge
    ran: list[str] = field(default_factory=list)


def uninstall(name: str, root: Path | str = "/", dry_run: bool = False, purge: bool = False,
              progress: Callable[[str], None] = lambda line: None) -> UninstallResult:
    root = Path(root).absolute()
    if not NAME_RE.match(name):
        raise LayoutError("name", f"{name!r} is not a bundle name (1-40 lowercase letters, digits, _ and -)")
    if not root.is_dir():
        raise LayoutError("root", f"{root} is not a directory")
    manifest = read_manifest(root, name)
    if manifest is None:
        where = under(root, manifest_path(name))
        raise LayoutError("name", f"bundle {name} is not installed under {root} (no {where})")
    result = UninstallResult(name=name, root=root, dry_run=dry_run)
    files = [under(root, t) for t in manifest.files]
    for path in files:  # refuse before changing anything
        if path.is_symlink() or (path.exists() and not path.is_file()):
            raise LayoutError(str(path), f"is not a regular file any more; bundle {name} removes only what it wrote. "
                                         "Nothing was changed")
        if path.is_file() and generated_for(path.read_text(errors="replace")) != name:
            raise LayoutError(str(path), f"no longer carries bundle {name}'s header: someone else's now, not removed. "
                                         "Nothing was changed")
    links = [under(root, link) for link in manifest.links if under(root, link).is_symlink()]
    # The site's logs and what logrotate made of them (NAME.access.log.1, .2.gz...).
    logs = sorted({q for p in manifest.logs for q in under(root, p).parent.glob(under(root, p).name + "*")
                   if q.name == under(root, p).name or q.name.startswith(under(root, p).name + ".")})
    log_dir = under(root, f"/var/log/{name}")
    on_systemd = systemd_running() and root == Path("/")
    unit = unit_of(name, manifest.slot)
    # Every unit the manifest lists (two slots, if a stop failed during an upgrade), serving one last.
    units = sorted((Path(t).name for t in manifest.files if t.endswith(".service")), key=lambda u: u == unit)
    verb = "would " if dry_run else ""

    for link in links:
        progress(f"{verb}disable the site: remove {link}")
    if links:
        progress(f"{verb}run nginx -t" + (", reload nginx and wait for its old workers" if on_systemd else ""))
    if manifest.role != "front":
        progress(f"{verb}stop {unit} gracefully and disable it" if on_systemd
                 else f"{unit}: nothing runs under {root} (not stopped)")
    for path in files + [under(root, manifest_path(name))]:
        progress(f"{verb}remove {path}")
    for d in sorted(manifest.dirs, key=len, reverse=True):
        progress(f"{verb}remove directory {under(root, d)} if empty")
    extra = logs + ([log_dir] if log_dir.exists() else [])
    for path in extra:
        progress(f"{verb}{'remove' if purge else 'keep'} {path}" + ("" if purge else " (--purge removes it)"))
    if dry_run:
        return result

    # 2. The site off first: nginx stops sending to the app before the app stops.
    for link in links:
        target = link.readlink()
        link.unlink()
        ok, output, _ = nginx_test(root)
        if not ok:
            link.symlink_to(target)
            raise RenderError("nginx -t failed without the site: put its link back, nothing else changed",
                              details=output)
        result.removed.append(link)
    if links and on_systemd:
        result.ran.append(reload_nginx(NGINX_WAIT, progress))
        progress(result.ran[-1])
    # 3. Then the app, gracefully.
    for each in units if on_systemd else ():
        if is_active(each):
            systemctl("stop", each, timeout=stop_timeout(manifest.stop_grace))
            result.ran.append(f"systemctl stop {each}")
            progress(result.ran[-1])
        systemctl("disable", each, check=False)
    # 4. Files, then the directories install made.
    for path in files + [under(root, manifest_path(name))]:
        if path.is_file():
            path.unlink()
            result.removed.append(path)
    if on_systemd and manifest.role != "front":
        systemctl("daemon-reload")
    if purge:
        for path in extra:
            shutil.rmtree(path) if path.is_dir() else path.unlink()
            result.removed.append(path)
    else:
        result.kept = extra
    for d in sorted(manifest.dirs, key=len, reverse=True):
        path = under(root, d)
        try:
            path.rmdir()
            result.removed.append(path)
        except OSError:
            pass  # not empty (other bundles' files) or already gone
    run_parent = under(root, f"/run/{name}")
    if run_parent.is_dir() and not any(run_parent.iterdir()):
        run_parent.rmdir()  # systemd's parent of the slots' run directories
    return result
