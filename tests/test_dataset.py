"""The file data set: deterministic, idempotent, atomic; eviction and page-cache residency."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path

import pytest

from uwsgi_layouts.app.files import ID_RE, REL_PATH_RE
from uwsgi_layouts.bench import dataset
from uwsgi_layouts.bench.dataset import (
    DatasetError,
    MincoreUnavailable,
    ensure_dataset,
    evict,
    file_bytes,
    fs_type,
    make_dataset,
    read_index,
    residency,
    resident_fraction,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
SMALL = dict(small_count=250, small_size=3000, large_count=2, large_size=300_000)
# Filesystems whose pages are the storage: eviction cannot work there.
NO_EVICT_FS = {"tmpfs", "ramfs"}


@pytest.fixture
def base(tmp_path) -> Path:
    """A directory on a real disk: tmp_path, unless that is tmpfs (then under build/)."""
    if fs_type(tmp_path) not in NO_EVICT_FS:
        yield tmp_path
        return
    d = REPO_ROOT / "build" / f"test-dataset-{uuid.uuid4().hex[:8]}"
    d.mkdir(parents=True)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# --- content and index ---------------------------------------------------------------------------


def test_index_lists_every_file_with_its_size(base):
    index = make_dataset(base / "ds", **SMALL, seed=1)
    data = json.loads((base / "ds" / "index.json").read_text())
    assert data["format_version"] == 1
    assert data["files"] == index.files
    assert data["hot_id"] == index.hot_id == "s00000"
    assert {k: data[k] for k in SMALL} == SMALL
    assert data["seed"] == 1
    assert data["total_bytes"] == 250 * 3000 + 2 * 300_000
    assert len(index.files) == 252
    assert index.small_ids[:2] == ["s00000", "s00001"] and index.large_ids == ["l0000", "l0001"]
    for file_id, rel in index.files.items():
        assert ID_RE.fullmatch(file_id) and REL_PATH_RE.fullmatch(rel), (file_id, rel)
        path = base / "ds" / "files" / rel
        assert path.stat().st_size == (3000 if file_id.startswith("s") else 300_000)
    on_disk = {p for p in (base / "ds" / "files").rglob("*") if p.is_file()}
    assert on_disk == set(index.paths())


def test_small_files_fan_out_over_two_levels(base):
    index = make_dataset(base / "ds", small_count=1234, small_size=10, large_count=0)
    per_dir = Counter(Path(rel).parent for rel in index.files.values())
    assert max(per_dir.values()) <= 100
    assert all(len(d.parts) == 3 for d in per_dir)  # small/<top>/<leaf>
    assert len(per_dir) == 13
    assert index.files["s01233"] == "small/00/12/s01233.bin"


def test_ids_widen_for_large_counts():
    index = dataset.build_index(Path("/x"), small_count=100_001, small_size=1, large_count=1, large_size=1, seed=0)
    assert "s100000" in index.files and index.hot_id == "s000000"
    assert all(ID_RE.fullmatch(i) for i in index.files)


def test_content_is_deterministic_and_depends_on_the_seed(base):
    a = make_dataset(base / "a", **SMALL, seed=5)
    b = make_dataset(base / "b", **SMALL, seed=5)
    c = make_dataset(base / "c", **SMALL, seed=6)
    assert tree_bytes(a.root) == tree_bytes(b.root)
    ta, tc = tree_bytes(a.files_dir), tree_bytes(c.files_dir)
    assert ta.keys() == tc.keys()
    assert all(ta[k] != tc[k] for k in ta)
    assert a.path("l0001").read_bytes() == file_bytes(5, "l0001", 300_000)
    # Files differ from each other (no repeated block).
    assert len({v for v in ta.values()}) == len(ta)


def test_large_files_span_several_write_blocks(base):
    size = 2 * dataset.WRITE_BLOCK + 12345
    index = make_dataset(base / "ds", small_count=1, small_size=1, large_count=1, large_size=size, seed=3)
    data = index.path("l0000").read_bytes()
    assert len(data) == size and data == file_bytes(3, "l0000", size)
    assert data[:dataset.WRITE_BLOCK] != data[dataset.WRITE_BLOCK:2 * dataset.WRITE_BLOCK]


# --- idempotence and atomicity -----------------------------------------------------------------


def test_same_parameters_again_is_a_no_op(base):
    root = base / "ds"
    first, wrote = ensure_dataset(root, **SMALL)
    assert wrote
    before = {p: p.stat().st_mtime_ns for p in root.rglob("*")}
    index_inode = (root / "index.json").stat().st_ino
    again, wrote = ensure_dataset(root, **SMALL)
    assert not wrote
    assert again == first
    assert {p: p.stat().st_mtime_ns for p in root.rglob("*")} == before
    assert (root / "index.json").stat().st_ino == index_inode


def test_other_parameters_or_a_missing_file_rebuild(base):
    root = base / "ds"
    make_dataset(root, **SMALL)
    index, wrote = ensure_dataset(root, **{**SMALL, "small_count": 10})
    assert wrote and len(index.small_ids) == 10
    assert not (root / "files" / "small" / "00" / "02").exists()  # old files are gone
    index.path("s00003").unlink()
    _, wrote = ensure_dataset(root, **{**SMALL, "small_count": 10})
    assert wrote and index.path("s00003").exists()
    index.path("s00004").write_bytes(b"short")
    _, wrote = ensure_dataset(root, **{**SMALL, "small_count": 10})
    assert wrote and index.path("s00004").stat().st_size == 3000


def test_nothing_half_written_stays_behind_after_a_failure(base, monkeypatch):
    root = base / "ds"
    calls = {"n": 0}
    real = dataset._write_file

    def failing(path, seed, file_id, size):
        calls["n"] += 1
        if calls["n"] == 100:
            raise OSError(28, "No space left on device")
        real(path, seed, file_id, size)

    monkeypatch.setattr(dataset, "_write_file", failing)
    with pytest.raises(OSError):
        make_dataset(root, **SMALL)
    assert not root.exists()
    assert list(base.iterdir()) == []  # no staging directory left
    # An existing data set survives a failed rebuild untouched.
    monkeypatch.setattr(dataset, "_write_file", real)
    good = make_dataset(root, **SMALL)
    calls["n"] = 0
    monkeypatch.setattr(dataset, "_write_file", failing)
    with pytest.raises(OSError):
        make_dataset(root, **{**SMALL, "seed": 9})
    assert read_index(root) == good
    assert sorted(p.name for p in base.iterdir()) == ["ds"]


def test_data_set_is_readable_by_other_users(base):
    index = make_dataset(base / "ds", **SMALL)
    for p in [index.root, *index.root.rglob("*")]:
        mode = p.stat().st_mode & 0o777
        assert mode == (0o755 if p.is_dir() else 0o644), (p, oct(mode))


def test_refuses_to_replace_a_directory_that_is_not_a_data_set(base):
    victim = base / "important"
    victim.mkdir()
    (victim / "thesis.tex").write_text("do not delete")
    with pytest.raises(DatasetError, match="root: .*refusing"):
        make_dataset(victim, **SMALL)
    assert (victim / "thesis.tex").read_text() == "do not delete"


@pytest.mark.parametrize("field, value", [
    ("small_count", 0), ("small_count", 1_000_001), ("small_count", -5), ("small_count", True),
    ("small_size", 0), ("large_count", -1), ("large_size", 0), ("seed", -1), ("small_count", 2.5),
    ("small_count", "1e3"),
])
def test_bad_parameters_name_the_field(base, field, value):
    params = {**SMALL, field: value}
    with pytest.raises(DatasetError) as err:
        make_dataset(base / "ds", **params)
    assert str(err.value).startswith(field.replace("_", "-") + ": must be an integer in")
    assert not (base / "ds").exists()


# --- page cache ------------------------------------------------------------------------------


def test_evict_returns_the_bytes_it_asked_to_drop(base):
    index = make_dataset(base / "ds", **SMALL)
    assert evict(index.root) == index.total_bytes == sum(p.stat().st_size for p in index.paths())


def test_evict_needs_a_data_set(base):
    with pytest.raises(DatasetError, match="no valid data set"):
        evict(base)


def _residency_or_skip(paths):
    try:
        return residency(paths)
    except MincoreUnavailable as exc:
        pytest.skip(f"mincore unavailable here: {exc}")


def test_resident_fraction_is_a_fraction_and_counts_pages(base):
    index = make_dataset(base / "ds", **SMALL)
    r = _residency_or_skip(index.paths())
    page = os.sysconf("SC_PAGE_SIZE")
    per_small = -(-3000 // page)
    assert r.total_pages == 250 * per_small + 2 * -(-300_000 // page)
    assert 0.0 <= r.fraction <= 1.0
    assert 0.0 <= resident_fraction(index.paths()) <= 1.0
    assert residency([]).fraction == 0.0


def test_eviction_empties_the_cache_and_reading_fills_it(base):
    index = make_dataset(base / "ds", **SMALL)
    kind = fs_type(index.root)
    if kind in NO_EVICT_FS:
        pytest.skip(f"{kind}: pages are the storage, nothing to evict")
    _residency_or_skip(index.paths())
    for p in index.paths():
        p.read_bytes()
    assert resident_fraction(index.paths()) > 0.9
    evict(index.root)
    after = resident_fraction(index.paths())
    assert after < 0.5, f"{after:.0%} still resident after evict on {kind}"
    for p in index.paths():
        p.read_bytes()
    assert resident_fraction(index.paths()) > 0.9


def test_mincore_unavailable_is_said_not_guessed(base, monkeypatch):
    monkeypatch.setattr(dataset.sys, "platform", "darwin")
    monkeypatch.setattr(dataset, "_libc", None)
    with pytest.raises(MincoreUnavailable, match="only implemented for Linux"):
        resident_fraction([base])
    assert "Linux" in dataset.mincore_problem(base)


def test_disk_read_bytes_is_a_counter_or_none(base):
    value = dataset.disk_read_bytes(base)
    assert value is None or value >= 0


# --- CLI ---------------------------------------------------------------------------------------


def test_cli_makes_then_keeps_the_data_set(base, capsys):
    args = ["--root", str(base / "ds"), "--small-count", "20", "--small-size", "100", "--large-count", "1",
            "--large-size", "5000"]
    assert dataset.main(args) == 0
    out = capsys.readouterr().out
    assert "20 x 100 B + 1 x 5000 B" in out and "written in" in out
    assert dataset.main(args + ["--evict"]) == 0
    out = capsys.readouterr().out
    assert "already up to date" in out and "evicted: asked the kernel to drop" in out
    assert "page cache:" in out


@pytest.mark.parametrize("args, field", [
    (["--small-count", "0"], "small-count"),
    (["--small-size", "abc"], "small-size"),
    (["--large-count", "-1"], "large-count"),
    (["--large-size", "99999999999999"], "large-size"),
    (["--seed", "x"], "seed"),
])
def test_cli_bad_values_exit_2_with_one_line(base, capsys, args, field):
    with pytest.raises(SystemExit) as exit_:  # refused while parsing, before anything is written
        dataset.main(["--root", str(base / "ds"), *args])
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert err.count("\n") == 1 and err.startswith(f"uwsgi-layouts dataset: error: argument --{field}: must be an "
                                                   "integer in ")
    assert not (base / "ds").exists()


def test_cli_as_a_module_exits_2_on_an_unknown_option(base):
    proc = subprocess.run([sys.executable, "-m", "uwsgi_layouts", "dataset", "--root", str(base / "ds"), "--bogus"],
                          capture_output=True, text=True, cwd=REPO_ROOT, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "unrecognized arguments" in proc.stderr
    assert not (base / "ds").exists()
