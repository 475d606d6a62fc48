"""render owns what it writes: a directory someone else filled is refused (nothing changes in
it), a symlinked --out is never followed, a file render did not write is never replaced, a
directory that existed keeps its mode and group, and the run directory of a live stack (its
lock held by another process) is refused naming that process."""

from __future__ import annotations

import grp
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.test_cli import assert_one_line_error, cli, cli_in_process, snapshot

ROOT = os.geteuid() == 0


def render(out: Path, *args: str) -> subprocess.CompletedProcess:
    return cli_in_process("render", "2x2-mapped", "--out", out, "--no-nginx-test", *args)


def test_a_directory_someone_else_filled_is_refused_and_left_as_it_was(tmp_run_dir):
    out = tmp_run_dir / "site"
    out.mkdir()
    (out / "nginx.conf").write_text("# my own nginx.conf\nevents {}\n")
    (out / "notes.txt").write_text("mine")
    before = snapshot(out)
    line = assert_one_line_error(render(out), "out")
    assert "was not written by render" in line, line
    assert snapshot(out) == before


def test_a_directory_render_wrote_is_rendered_again_but_a_foreign_file_in_it_is_not_replaced(tmp_run_dir):
    out = tmp_run_dir / "out"
    assert render(out).returncode == 0
    (out / "notes.txt").write_text("kept")  # not render's, and never touched
    again = render(out, "--harakiri", "12")
    assert again.returncode == 0, again.stderr
    assert "harakiri = 12" in (out / "uwsgi.ini").read_text() and (out / "notes.txt").read_text() == "kept"
    (out / "uwsgi.ini").write_text("[uwsgi]\n; hand-written\n")
    before = snapshot(out)
    line = assert_one_line_error(render(out), "out")
    assert f"{out}/uwsgi.ini was not written by render" in line, line
    assert snapshot(out) == before


def test_a_symlinked_out_is_never_followed(tmp_run_dir):
    target = tmp_run_dir / "target"
    target.mkdir()
    link = tmp_run_dir / "link"
    link.symlink_to(target)
    line = assert_one_line_error(render(link), "out")
    assert "is a symbolic link" in line, line
    assert list(target.iterdir()) == [] and link.is_symlink()
    dangling = tmp_run_dir / "dangling"
    dangling.symlink_to(tmp_run_dir / "nowhere")
    assert_one_line_error(render(dangling), "out")
    assert not (tmp_run_dir / "nowhere").exists()
    run = cli("run", "2x2-mapped", "--run-dir", link, "--for", "1")
    assert_one_line_error(run, "run_dir")
    bundle = cli("bundle", "2x2-mapped", "--out", link, "--app-dir", "/srv/shop", "--virtualenv", "/srv/shop/venv",
                 "--server-name", "shop.example.com")
    assert "is a symbolic link" in assert_one_line_error(bundle, "out")
    assert list(target.iterdir()) == []


@pytest.mark.skipif(not ROOT, reason="needs root: chgrp to a group we are not in")
def test_a_directory_that_existed_keeps_its_mode_and_group(tmp_run_dir):
    out = tmp_run_dir / "mine"
    out.mkdir()
    other_group = grp.getgrnam("nogroup").gr_gid
    os.chown(out, 0, other_group)
    out.chmod(0o751)
    proc = render(out)
    assert proc.returncode == 0, proc.stderr
    st = out.stat()
    assert (st.st_mode & 0o7777, st.st_gid) == (0o751, other_group)
    again = render(out)
    assert again.returncode == 0 and (out.stat().st_mode & 0o7777, out.stat().st_gid) == (0o751, other_group)
    fresh = tmp_run_dir / "fresh"  # one render creates: its own mode, the run user's group under root
    assert render(fresh).returncode == 0
    assert fresh.stat().st_mode & 0o7777 == 0o750


@pytest.mark.skipif(not ROOT, reason="needs root: the run user must be kept out")
def test_an_existing_directory_the_run_user_cannot_enter_is_refused_not_changed(tmp_run_dir):
    out = tmp_run_dir / "closed"
    out.mkdir()
    out.chmod(0o700)
    line = assert_one_line_error(render(out), "run_dir")
    assert "cannot reach" in line, line
    assert out.stat().st_mode & 0o7777 == 0o700 and list(out.iterdir()) == []


HOLD = """
import sys, time
from uwsgi_layouts.deploy.run import DirLock
lock = DirLock(sys.argv[1]).acquire()
print("held", flush=True)
time.sleep(60)
"""


def test_the_run_directory_of_a_live_stack_is_refused_naming_its_holder(tmp_run_dir):
    out = tmp_run_dir / "live"
    assert render(out).returncode == 0
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdout=subprocess.PIPE, text=True,
                              cwd=Path(__file__).resolve().parent.parent)
    try:
        assert holder.stdout.readline().strip() == "held"
        before = snapshot(out)
        line = assert_one_line_error(render(out), "out")
        assert f"live stack (pid {holder.pid})" in line, line
        assert snapshot(out) == before
    finally:
        holder.kill()
        holder.wait()
    deadline = time.monotonic() + 5
    while render(out).returncode != 0:  # the lock went with its holder
        assert time.monotonic() < deadline
