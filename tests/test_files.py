"""The one atomic writer (uwsgi_layouts.files): whole or nothing, no temp file left on error,
the mode a new file would get unless told, durable and owned when asked."""

from __future__ import annotations

import os
import stat

import pytest

from uwsgi_layouts.files import write_atomic


def test_a_new_file_gets_the_umask_mode_and_replaces_the_old_one_whole(tmp_path):
    target = tmp_path / "results.json"
    target.write_text("old")
    old_mask = os.umask(0o027)
    try:
        assert write_atomic(target, "new\n") == target
    finally:
        os.umask(old_mask)
    assert target.read_text() == "new\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert os.listdir(tmp_path) == ["results.json"]


def test_bytes_mode_owner_and_durable(tmp_path):
    target = tmp_path / "site.conf"
    write_atomic(target, b"\x00raw", mode=0o600, owner=(os.getuid(), os.getgid()), durable=True)
    assert target.read_bytes() == b"\x00raw" and stat.S_IMODE(target.stat().st_mode) == 0o600


def test_an_error_leaves_the_old_file_and_no_temp_file(tmp_path):
    target = tmp_path / "map"
    target.write_text("kept")
    with pytest.raises(OverflowError):  # raised after the temp file is written, before the rename
        write_atomic(target, "lost", owner=(os.getuid(), 2**32))
    assert target.read_text() == "kept"
    assert os.listdir(tmp_path) == ["map"]
