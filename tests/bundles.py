"""Helpers for the bundle tests: certificates made with openssl, a trial root holding a copy
of the distribution's /etc/nginx, and a snapshot of a directory tree to prove nothing changed."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path


def make_cert(directory: Path, name: str = "shop.example.com", encrypt: bool = False) -> tuple[Path, Path]:
    """A self-signed certificate for ``name`` and 127.0.0.1, and its key, made by openssl."""
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    cmd = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-keyout", str(key), "-out", str(cert), "-days", "2",
           "-subj", f"/CN={name}", "-addext", f"subjectAltName=DNS:{name},IP:127.0.0.1"]
    cmd += ["-passout", "pass:secret"] if encrypt else ["-noenc"]
    subprocess.run(cmd, check=True, capture_output=True, timeout=60)
    return cert, key


def make_trial_root(root: Path) -> Path:
    """``root`` holding a copy of this machine's /etc/nginx whose nginx.conf points inside
    ``root`` (includes, pid file, logs), so `nginx -t -c ROOT/etc/nginx/nginx.conf` and a real
    nginx started from it touch nothing outside ``root``."""
    shutil.copytree("/etc/nginx", root / "etc/nginx", symlinks=True)
    conf = root / "etc/nginx/nginx.conf"
    text = conf.read_text()
    for system in ("/etc/nginx/", "/var/log/nginx/", "/run/nginx.pid"):
        assert system in text, f"{system} not in the distribution's nginx.conf: is this Debian's nginx?"
        text = text.replace(system, f"{root}{system}")
    conf.write_text(text)
    (root / "var/log/nginx").mkdir(parents=True)
    (root / "run").mkdir()
    (root / "run").chmod(0o755)
    return root


def tree_state(root: Path) -> dict[str, tuple]:
    """Every path under ``root`` with its type, mode, owner and content (or link target)."""
    state = {}
    for path in sorted([root, *root.rglob("*")]):
        st = path.lstat()
        if path.is_symlink():
            what = ("link", os.readlink(path))
        elif path.is_file():
            what = ("file", hashlib.sha256(path.read_bytes()).hexdigest())
        else:
            what = ("dir" if path.is_dir() else "other",)
        state[str(path.relative_to(root))] = (*what, st.st_mode, st.st_uid, st.st_gid)
    return state


# `systemd-analyze verify` runs a test manager that touches this marker on the host.
UNITS_LOAD_MARKER = Path("/run/systemd/systemd-units-load")


def systemd_analyze_verify(analyze: str, unit: Path) -> subprocess.CompletedProcess:
    """``systemd-analyze verify UNIT``, leaving no marker behind that was not there before."""
    existed = UNITS_LOAD_MARKER.exists()
    try:
        return subprocess.run([analyze, "verify", "--man=no", str(unit)], capture_output=True, text=True, timeout=60)
    finally:
        if not existed:
            UNITS_LOAD_MARKER.unlink(missing_ok=True)
