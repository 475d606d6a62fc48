"""Risky input is refused with one line (exit 2) naming the field, what was found and the
``--allow-RISK`` option that accepts it; with that option the same command goes through.
Real directories and modes on this machine, the real command line (`uwsgi-layouts render`, run by
the console's main in this process: tests/test_cli.py runs it as a process of its own).
"""

from __future__ import annotations

import grp
import os
import pwd
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_cli import assert_one_line_error, cli_in_process
from uwsgi_layouts.deploy.machine import writable_by_others
from uwsgi_layouts.deploy.model import RISKS, LayoutError, parse_layout

ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="needs root: chown to other users and groups, --user")
DEMO_APP_DIR = str(Path(__file__).resolve().parent.parent)


def render(out: Path, *args: str) -> subprocess.CompletedProcess:
    return cli_in_process("render", "2x2-mapped", "--out", out, "--no-nginx-test", *args)


def app_copy(parent: Path, mode: int) -> Path:
    """A directory holding a one-file WSGI app, with ``mode``."""
    d = parent / "app"
    d.mkdir()
    (d / "tinyapp.py").write_text("def application(environ, start_response):\n    return []\n")
    d.chmod(mode)
    return d


@pytest.mark.parametrize("mode", [0o777, 0o757])
def test_a_world_writable_app_dir_is_refused_unless_allowed(tmp_run_dir, mode):
    app = app_copy(tmp_run_dir, mode)
    out = tmp_run_dir / "out"
    line = assert_one_line_error(render(out, "--app", "tinyapp:application", "--app-dir", app), "app_dir")
    assert "every user (o+w)" in line and "--allow-world-writable" in line, line
    assert not out.exists()
    ok = render(out, "--app", "tinyapp:application", "--app-dir", app, "--allow-world-writable")
    assert ok.returncode == 0, ok.stderr
    assert '"world-writable"' in (out / "layout.json").read_text()


def test_a_parent_writable_by_others_without_the_sticky_bit_is_refused(tmp_run_dir):
    shared = tmp_run_dir / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    app = app_copy(shared, 0o755)
    line = assert_one_line_error(render(tmp_run_dir / "out", "--app", "tinyapp:application", "--app-dir", app),
                                 "app_dir")
    assert f"its parent {shared} is writable by every user (o+w) without the sticky bit" in line, line
    shared.chmod(0o1777)  # /tmp's mode: others cannot rename or remove what is ours
    ok = render(tmp_run_dir / "out", "--app", "tinyapp:application", "--app-dir", app)
    assert ok.returncode == 0, ok.stderr


@needs_root
def test_group_write_counts_when_the_group_has_other_members(tmp_path):
    d = tmp_path / "g"
    d.mkdir()
    d.chmod(0o775)
    nobody = pwd.getpwnam("nobody")
    os.chown(d, 0, nobody.pw_gid)  # nobody's own group: nobody is a member, root (the owner) is not
    group = grp.getgrgid(nobody.pw_gid).gr_name
    why = writable_by_others(d)
    assert why.startswith(f"{d} is writable by group {group} (g+w: ") and "nobody" in why, why
    os.chown(d, 0, 0)  # root's group, owner root: nobody else (unless this machine added members)
    if not (set(grp.getgrgid(0).gr_mem) | {p.pw_name for p in pwd.getpwall() if p.pw_gid == 0}) - {"root"}:
        assert writable_by_others(d) == ""
    d.chmod(0o755)
    assert writable_by_others(d) == ""


def test_a_world_writable_virtualenv_or_static_dir_is_refused(tmp_run_dir):
    venv = tmp_run_dir / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = next(venv.glob("lib/python*/site-packages"))
    site.chmod(0o777)
    line = assert_one_line_error(render(tmp_run_dir / "o1", "--virtualenv", venv), "virtualenv")
    assert "site-packages" in line and "--allow-world-writable" in line, line
    site.chmod(0o755)
    static = tmp_run_dir / "static"
    static.mkdir()
    static.chmod(0o777)
    line = assert_one_line_error(render(tmp_run_dir / "o2", "--static", f"/s={static}"), "static")
    assert "static directory for /s/" in line, line


@pytest.mark.parametrize("directory,shown", [
    ("/etc", "/etc"), ("/etc/ssl/private", "/etc"), ("/proc/self", "/proc"), ("/sys/class", "/sys"),
    ("/dev/shm", "/dev"), ("/boot", "/boot"), ("/root", "/root"), ("/run", "/run"), ("/var/lib", "/var/lib"),
    ("/var/run", "/run"),  # a symlink to /run on Debian: where it leads counts
])
def test_static_under_system_directories_is_refused_unless_allowed(tmp_run_dir, directory, shown):
    if not Path(directory).is_dir():
        pytest.skip(f"{directory} does not exist here")
    out = tmp_run_dir / "out"
    line = assert_one_line_error(render(out, "--static", f"/s={directory}"), "static")
    assert f"under {shown}" in line and "--allow-system-static" in line, line
    if directory in ("/etc", "/proc/self"):  # accepted by name (nginx -t is skipped: /proc is not served)
        ok = render(out, "--static", f"/s={directory}", "--allow-system-static")
        assert ok.returncode == 0, ok.stderr


@needs_root
def test_user_root_is_refused_unless_allowed(tmp_run_dir):
    line = assert_one_line_error(render(tmp_run_dir / "out", "--user", "root"), "user")
    assert "--allow-root" in line, line
    ok = render(tmp_run_dir / "out", "--user", "root", "--allow-root")
    assert ok.returncode == 0, ok.stderr
    assert "uid = " not in (tmp_run_dir / "out" / "uwsgi.ini").read_text()


@pytest.mark.parametrize("listen", ["0.0.0.0:18080"])
def test_a_listen_address_beyond_loopback_is_refused_unless_allowed(tmp_run_dir, listen):
    out = tmp_run_dir / "out"
    line = assert_one_line_error(render(out, "--listen", listen), "listen")
    assert "every interface" in line and "--allow-public-listen" in line, line
    ok = render(out, "--listen", listen, "--allow-public-listen")
    assert ok.returncode == 0, ok.stderr


def test_tcp_is_accepted_with_a_warning_naming_the_risk(tmp_run_dir):
    proc = render(tmp_run_dir / "out", "--transport", "tcp")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.startswith("warning: transport tcp: any local user can send raw uwsgi packets"), proc.stderr
    assert proc.stderr.count("\n") == 1
    quiet = render(tmp_run_dir / "out2")
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr


def test_the_model_names_the_risks_and_refuses_unknown_ones():
    assert parse_layout("1x1-shared", run_dir="/tmp/x", allow="root+public-listen").allow == ("public-listen", "root")
    assert parse_layout("1x1-shared", run_dir="/tmp/x").transport == "unix"
    assert parse_layout("1x1-mapped", run_dir="/tmp/x", hosts="127.0.0.1", uwsgi_tls="off").transport == "tcp"
    with pytest.raises(LayoutError) as info:
        parse_layout("1x1-shared", run_dir="/tmp/x", allow="everything")
    assert info.value.field == "allow" and all(r in str(info.value) for r in RISKS)
