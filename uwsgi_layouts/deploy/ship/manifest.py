"""What ``deploy install`` wrote for a bundle, kept on the server in
/var/lib/uwsgi-layouts/NAME.json: every file (with its hash), link and directory it created,
the site logs it created, the slot that serves, and a fingerprint of the app's code. Uninstall
removes exactly these; a re-install compares against them ("nothing changed", or new code ->
chain reload).

Paths are the server's (under ``--root`` they are read and written below the root).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from uwsgi_layouts.deploy.model import LayoutError
from uwsgi_layouts.deploy.ship.bundle import STATE_DIR
from uwsgi_layouts.files import write_atomic

MANIFEST_VERSION = 1
# Fingerprinting stats files; past this many the code is not fingerprinted (a reload is then the admin's).
MAX_FINGERPRINT_FILES = 200_000
# Not code: caches and version-control metadata change without the app changing.
SKIPPED_DIRS = {"__pycache__", ".git", ".hg", ".svn", ".mypy_cache", ".pytest_cache", "node_modules"}


def manifest_path(name: str) -> str:
    return f"{STATE_DIR}/{name}.json"


@dataclass
class Manifest:
    name: str
    role: str = ""
    slot: str = ""  # the slot that serves ("" for an app host: no slots)
    layout: str = ""
    files: dict[str, str] = field(default_factory=dict)  # server path -> sha256 of what install wrote
    links: list[str] = field(default_factory=list)
    dirs: list[str] = field(default_factory=list)  # created by install: removed by uninstall when empty
    logs: list[str] = field(default_factory=list)  # site logs install created: removed by uninstall --purge
    app_fingerprint: str = ""  # "" = not taken (--no-app-check, or too many files)
    stop_grace: int = 30  # the units' grace: how long a graceful stop may take
    format_version: int = MANIFEST_VERSION

    @property
    def unit(self) -> str:
        return f"{self.name}@{self.slot}.service" if self.slot else f"{self.name}.service"

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"


def read_manifest(root: Path, name: str) -> Manifest | None:
    """The manifest of bundle ``name`` under ``root``, None if it was never installed there."""
    path = root / manifest_path(name).lstrip("/")
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise LayoutError("manifest", f"{path} is unreadable ({getattr(exc, 'strerror', None) or exc}): it records "
                                      "what install wrote; restore it or remove the bundle by hand (its INSTALL.md)") \
            from None
    if not isinstance(record, dict) or record.get("format_version") != MANIFEST_VERSION or record.get("name") != name:
        raise LayoutError("manifest", f"{path} is not a format {MANIFEST_VERSION} manifest of bundle {name}")
    known = Manifest.__dataclass_fields__
    return Manifest(**{k: v for k, v in record.items() if k in known})


def write_manifest(root: Path, manifest: Manifest) -> Path:
    """Written beside its target, then renamed over it (root:root 0644: paths and hashes only)."""
    path = root / manifest_path(manifest.name).lstrip("/")
    return write_atomic(path, manifest.to_json(), mode=0o644, durable=True)  # as durable as the files it lists


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def app_fingerprint(app_dir: str, virtualenv: str, skip: list[str]) -> str:
    """A hash of every file's path, size and modification time under the app's directory and its
    virtualenv (new code, or a package upgraded with pip), without ``skip`` (static and writable
    directories: nginx serves the first, the app writes the second) and caches. Only stats: no
    file is read. "" when there are more than MAX_FINGERPRINT_FILES."""
    digest = hashlib.sha256()
    count = 0
    skipped = {os.path.normpath(p) for p in skip}
    for top in dict.fromkeys((app_dir, virtualenv)):
        for current, dirs, names in os.walk(top):
            dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS and os.path.join(current, d) not in skipped
                             and not (current == app_dir and os.path.join(current, d) == virtualenv))
            for fname in sorted(names):
                if fname.endswith((".pyc", ".pyo")):
                    continue
                path = os.path.join(current, fname)
                try:
                    st = os.lstat(path)
                except OSError:
                    continue
                count += 1
                if count > MAX_FINGERPRINT_FILES:
                    return ""
                digest.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()
