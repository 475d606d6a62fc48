"""scripts/uwsgi-tree-cache.sh, the per-user cache of compiled uWSGI trees scripts/build-uwsgi.sh
builds in: a key that names the compile's inputs and nothing of the clone, a cache used only while
nobody else can write it, and pruning by age and size that never runs under a build. The functions
run in bash on real directories; tests/integration/test_uwsgi_builds.py builds from two clones."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LIBRARY = ROOT / "scripts" / "uwsgi-tree-cache.sh"
BUILD_SCRIPT = ROOT / "scripts" / "build-uwsgi.sh"
VENV_PY = ROOT / ".venv" / "bin" / "python"
DAY = 86400
REFUSAL = "error: UWSGI_TREE_CACHE: {trees} is not a directory of uid {uid} that only it can write: "


def cache_call(commands: str, trees: Path | None = None, **env: str) -> subprocess.CompletedProcess:
    """COMMANDS run in bash after sourcing the library (strict mode, as build-uwsgi.sh runs it)."""
    environment = {**os.environ, **env}
    if trees is not None:
        environment["UWSGI_TREE_CACHE"] = str(trees)
    return subprocess.run(["bash", "-c", f'set -euo pipefail; source "$0"; {commands}', str(LIBRARY)],
                          env=environment, capture_output=True, text=True, timeout=60)


def key(python: Path = VENV_PY, version: str = "2.0.31", cflags: str = "", override: str = "", **env: str) -> str:
    done = cache_call('tree_key "$KEY_PYTHON" "$KEY_VERSION" "$KEY_CFLAGS" "$KEY_OVERRIDE"', KEY_PYTHON=str(python),
                      KEY_VERSION=version, KEY_CFLAGS=cflags, KEY_OVERRIDE=override, **env)
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.strip()) == 16, done.stdout
    return done.stdout.strip()


def test_another_clones_venv_and_output_directories_give_the_same_key(tmp_path):
    # A fresh clone's venv, made from the same interpreter somewhere else: what uWSGI compiles
    # against is the same, so the tree is (the old key held the venv's path, and missed).
    clone_python = tmp_path / "clone" / ".venv" / "bin" / "python"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(clone_python.parents[1])],
                   check=True, timeout=60)
    ours = key()
    assert key(clone_python) == ours
    assert key(UWSGI_BUILDS=str(tmp_path / "builds"), UWSGI_TREE_CACHE=str(tmp_path / "cache")) == ours


def test_each_compile_input_gives_another_key():
    ours = key()
    others = {
        "version": key(version="2.0.30"),
        "CFLAGS": key(cflags="-O3"),
        "override": key(override="pcre=false;routing=false"),
        "APPEND_CFLAGS": key(APPEND_CFLAGS="-DNDEBUG"),
        "UWSGI_PROFILE": key(UWSGI_PROFILE="core"),
        "UWSGI_EMBED_PLUGINS": key(UWSGI_EMBED_PLUGINS="stats_pusher_statsd"),
        "CC": key(CC="gcc -m64"),
        "CPATH": key(CPATH="/usr/local/include"),
    }
    assert ours not in others.values()
    assert len(set(others.values())) == len(others), others


def test_a_missing_cache_is_made_for_us_alone_and_accepted_again(tmp_path):
    trees = tmp_path / "cache" / "uwsgi-layouts" / "uwsgi-trees"
    for _ in range(2):
        done = cache_call("trusted_tree_cache", trees)
        assert done.returncode == 0 and done.stderr == "", done.stderr
    for made in (trees, trees.parent, trees.parent.parent):
        assert made.stat().st_mode & 0o777 == 0o700, oct(made.stat().st_mode)


@pytest.mark.parametrize("plant", ["group-writable", "writable by others", "a symlink", "another user's"])
def test_a_cache_someone_else_could_have_planted_objects_in_is_refused(tmp_path, plant):
    trees = tmp_path / "trees"
    if plant == "a symlink":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        trees.symlink_to(tmp_path / "elsewhere")
    else:
        trees.mkdir(mode=0o700)
        if plant == "another user's":
            if os.geteuid() != 0:
                pytest.skip("giving a directory to another user needs root")
            os.chown(trees, 65534, 65534)
        else:
            trees.chmod(0o770 if plant == "group-writable" else 0o703)
    done = cache_call("trusted_tree_cache; echo used", trees)
    assert done.returncode == 2 and done.stdout == "", done
    assert done.stderr.startswith(REFUSAL.format(trees=trees, uid=os.geteuid())), done.stderr
    assert done.stderr.count("\n") == 1, done.stderr


def test_build_uwsgi_refuses_a_group_writable_cache_in_one_line_before_building_anything(tmp_path):
    trees, builds = tmp_path / "trees", tmp_path / "builds"
    trees.mkdir()
    trees.chmod(0o775)
    done = subprocess.run(["bash", str(BUILD_SCRIPT), "shared"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "UWSGI_TREE_CACHE": str(trees), "UWSGI_BUILDS": str(builds)})
    assert done.returncode == 2, done
    assert done.stderr.startswith(REFUSAL.format(trees=trees, uid=os.geteuid())), done.stderr
    assert done.stderr.count("\n") == 1 and done.stdout == "", done
    assert list(trees.iterdir()) == [] and not builds.exists()


def plant_tree(trees: Path, name: str, days_unused: float, kib: int = 4) -> Path:
    """A tree as build_binary leaves one: the directory (with a file of KIB) and its lock, whose
    mtime is when a build last used it."""
    tree = trees / name
    tree.mkdir(parents=True)
    (tree / "object.o").write_bytes(b"\0" * kib * 1024)
    lock = trees / f"{name}.lock"
    lock.touch()
    used = time.time() - days_unused * DAY
    os.utime(lock, (used, used))
    return tree


def test_trees_unused_for_a_week_are_pruned_but_not_the_one_about_to_be_used(tmp_path):
    trees = tmp_path / "trees"
    stale = plant_tree(trees, "uwsgi-2.0.30-aaaaaaaaaaaaaaaa", days_unused=8)
    recent = plant_tree(trees, "uwsgi-2.0.31-bbbbbbbbbbbbbbbb", days_unused=6)
    wanted = plant_tree(trees, "uwsgi-2.0.31-cccccccccccccccc", days_unused=30)
    (trees / f"{stale.name}.building").touch()  # a build of it died once
    done = cache_call(f'prune_trees "{wanted}"', trees)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in trees.iterdir()) == sorted(
        [recent.name, f"{recent.name}.lock", wanted.name, f"{wanted.name}.lock"])
    assert done.stdout == f"removed the uWSGI tree {stale} (last used " \
                          f"{time.strftime('%Y-%m-%d', time.gmtime(time.time() - 8 * DAY))})\n"


def test_over_the_size_the_least_recently_used_trees_go_first(tmp_path):
    trees = tmp_path / "trees"
    oldest = plant_tree(trees, "uwsgi-2.0.31-1111111111111111", days_unused=3, kib=400)
    middle = plant_tree(trees, "uwsgi-2.0.31-2222222222222222", days_unused=2, kib=400)
    newest = plant_tree(trees, "uwsgi-2.0.31-3333333333333333", days_unused=1, kib=400)
    # Room for two trees: the oldest goes, and no more than it.
    done = cache_call(f'TREE_CACHE_MAX_KIB=1000; prune_trees "{trees / "uwsgi-2.0.31-none"}"', trees)
    assert done.returncode == 0, done.stderr
    assert not oldest.exists() and middle.is_dir() and newest.is_dir(), done.stdout


def test_no_pruning_while_another_build_holds_the_cache(tmp_path):
    trees = tmp_path / "trees"
    stale = plant_tree(trees, "uwsgi-2.0.30-aaaaaaaaaaaaaaaa", days_unused=8)
    keep = trees / "uwsgi-2.0.31-none"
    with open(trees / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_SH)  # as a build in another clone holds it
        done = cache_call(f'open_tree_cache "{keep}"', trees)
        assert done.returncode == 0, done.stderr
        assert stale.is_dir() and (trees / f"{stale.name}.lock").exists()
    done = cache_call(f'open_tree_cache "{keep}"', trees)
    assert done.returncode == 0, done.stderr
    assert not stale.exists() and not (trees / f"{stale.name}.lock").exists()
