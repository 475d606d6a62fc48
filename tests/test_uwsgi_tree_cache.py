"""scripts/uwsgi-tree-cache.sh, the per-user cache of compiled uWSGI trees scripts/build-uwsgi.sh
builds in: a key that names the compile's inputs and nothing of the clone, a cache used only while
nobody else can write it (nor swap it, by writing a directory above it), trees that start afresh when
their preparation did not end, and pruning by age and size, of trees only, that never runs under a
build. The functions
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
REFUSAL = "error: {variable}: {trees} is refused as the cache of compiled uWSGI trees "


def cache_call(commands: str, trees: Path | None = None, **env: str) -> subprocess.CompletedProcess:
    """COMMANDS run in bash after sourcing the library (strict mode, as build-uwsgi.sh runs it)."""
    environment = {**os.environ, **env}
    if trees is not None:
        environment["UWSGI_TREE_CACHE"] = str(trees)
    return subprocess.run(["bash", "-c", f'set -euo pipefail; shopt -s inherit_errexit; source "$0"; {commands}',
                           str(LIBRARY)],
                          env=environment, capture_output=True, text=True, timeout=60)


def key(python: Path = VENV_PY, version: str = "2.0.31", cflags: str = "", override: str = "", **env: str) -> str:
    done = cache_call('tree_key "$KEY_PYTHON" "$KEY_VERSION" "$KEY_CFLAGS" "$KEY_OVERRIDE"', KEY_PYTHON=str(python),
                      KEY_VERSION=version, KEY_CFLAGS=cflags, KEY_OVERRIDE=override, **env)
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.strip()) == 16, done.stdout
    return done.stdout.strip()


def executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def python_patched(path: Path, patch: str) -> Path:
    """A python that is ours with PATCH run before the code given with -c (how tree_key asks it)."""
    return executable(path, f'#!/bin/sh\nexec "{VENV_PY}" -c "{patch}; exec(sys.argv[1])" "$2"\n')


def test_another_clones_venv_and_output_directories_give_the_same_key(tmp_path):
    # A fresh clone's venv, made from the same interpreter somewhere else: what uWSGI compiles
    # against is the same, so the tree is (the old key held the venv's path, and missed).
    clone_python = tmp_path / "clone" / ".venv" / "bin" / "python"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(clone_python.parents[1])],
                   check=True, timeout=60)
    ours = key()
    assert key(clone_python) == ours
    assert key(UWSGI_BUILDS=str(tmp_path / "builds"), UWSGI_TREE_CACHE=str(tmp_path / "cache")) == ours
    # the wrapper python_patched makes, patching nothing, is the same Python: what differs below is the patch
    assert key(python_patched(tmp_path / "same" / "python", "import sys")) == ours


def test_each_compile_input_gives_another_key(tmp_path):
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
        "Python's build": key(python_patched(tmp_path / "build" / "python", "import sys; sys.version += ' other'")),
        "Python's include directory": key(python_patched(
            tmp_path / "include" / "python",
            "import sys, sysconfig; sysconfig.get_path = lambda name, *a, **k: '/elsewhere/' + name")),
    }
    assert ours not in others.values()
    assert len(set(others.values())) == len(others), others


def stub_dir(tmp_path: Path, name: str, command: str, output: str) -> str:
    """A PATH whose first directory holds COMMAND printing OUTPUT: the same stub's path for every OUTPUT."""
    executable(tmp_path / name / command, f"#!/bin/sh\nprintf '%s\\n' '{output}'\n")
    return f"{tmp_path / name}:{os.environ['PATH']}"


def test_another_version_of_a_header_package_gives_another_key(tmp_path):
    before = key(PATH=stub_dir(tmp_path, "dpkg", "dpkg-query", "libssl-dev=3.0.11-1~deb12u2"))
    after = key(PATH=stub_dir(tmp_path, "dpkg", "dpkg-query", "libssl-dev=3.0.15-1~deb12u1"))
    assert before != after


def test_another_version_of_the_compiler_at_the_same_path_gives_another_key(tmp_path):
    before = key(CC="cc", PATH=stub_dir(tmp_path, "bin", "cc", "cc (Debian 12.2.0-14) 12.2.0"))
    after = key(CC="cc", PATH=stub_dir(tmp_path, "bin", "cc", "cc (Debian 12.2.0-14+deb12u1) 12.2.0"))
    assert before != after


def test_another_tree_format_gives_another_key():
    done = cache_call(f'TREE_FORMAT=$((TREE_FORMAT + 1)); tree_key "{VENV_PY}" 2.0.31 "" ""')
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() != key()


@pytest.mark.parametrize("answer", ["exit 1", "echo 3.11"])
def test_a_python_that_fails_or_answers_otherwise_fails_the_build(tmp_path, answer):
    python = executable(tmp_path / "python", f"#!/bin/sh\n{answer}\n")
    done = cache_call(f'name=$(tree_key "{python}" 2.0.31 "" ""); echo "built in $name"')
    assert done.returncode != 0 and "built in" not in done.stdout, done


def test_a_missing_cache_is_made_for_us_alone_and_accepted_again(tmp_path):
    trees = tmp_path / "cache" / "uwsgi-layouts" / "uwsgi-trees"
    for _ in range(2):
        done = cache_call("enter_tree_cache; pwd -P", trees)
        assert done.returncode == 0 and done.stderr == "", done.stderr
        assert done.stdout == f"{trees.resolve()}\n"
    for made in (trees, trees.parent, trees.parent.parent):
        assert made.stat().st_mode & 0o777 == 0o700, oct(made.stat().st_mode)


def refused(done: subprocess.CompletedProcess, trees: Path | str, variable: str = "UWSGI_TREE_CACHE") -> str:
    assert done.returncode == 2 and done.stdout == "", done
    assert done.stderr.startswith(REFUSAL.format(variable=variable, trees=trees)), done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    return done.stderr


@pytest.mark.parametrize("plant", ["group-writable", "writable by others", "another user's",
                                   "a symlink to a group-writable one", "a group-writable one, with a trailing /"])
def test_a_cache_someone_else_could_have_planted_objects_in_is_refused(tmp_path, plant):
    trees = tmp_path / "trees"
    given = str(trees)
    if plant.startswith("a symlink"):
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        (tmp_path / "elsewhere").chmod(0o770)
        trees.symlink_to(tmp_path / "elsewhere")
    else:
        trees.mkdir(mode=0o700)
        if plant == "another user's":
            if os.geteuid() != 0:
                pytest.skip("giving a directory to another user needs root")
            os.chown(trees, 65534, 65534)
        else:
            trees.chmod(0o703 if plant == "writable by others" else 0o770)
        if plant.endswith("trailing /"):
            given += "/"
    refused(cache_call("enter_tree_cache; echo used", given), given)


def test_a_symlink_to_a_directory_of_ours_alone_is_used_where_it_points(tmp_path):
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    (tmp_path / "trees").symlink_to(tmp_path / "elsewhere")
    done = cache_call("enter_tree_cache; pwd -P", tmp_path / "trees")
    assert done.returncode == 0 and done.stdout == f"{(tmp_path / 'elsewhere').resolve()}\n", done


@pytest.mark.parametrize("parent", ["writable by all, not sticky", "another user's", "another user's, sticky"])
def test_a_cache_under_a_directory_someone_else_can_write_is_refused(tmp_path, parent):
    above = tmp_path / "above"
    trees = above / "trees"
    trees.mkdir(parents=True, mode=0o700)
    if parent == "writable by all, not sticky":
        above.chmod(0o777)
    else:
        if os.geteuid() != 0:
            pytest.skip("giving a directory to another user needs root")
        os.chown(above, 65534, 65534)
        above.chmod(0o1777 if parent.endswith("sticky") else 0o755)
    assert f" {above.resolve()} above it " in refused(cache_call("enter_tree_cache; echo used", trees), trees)


def test_a_cache_in_a_sticky_directory_of_roots_is_ours_to_use(tmp_path):
    # /tmp: only an entry's owner can rename it, so a cache of ours directly in it cannot be swapped
    sticky = tmp_path / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)
    if sticky.stat().st_uid != 0:
        pytest.skip("a sticky directory of root's needs root to make")
    done = cache_call("enter_tree_cache; echo used", sticky / "trees")
    assert done.returncode == 0 and done.stdout == "used\n", done


def without(*names: str) -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in names}


def bash_in(environment: dict[str, str], commands: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", f'set -euo pipefail; source "$0"; {commands}', str(LIBRARY)],
                          env=environment, capture_output=True, text=True, timeout=60)


def test_xdg_cache_home_prepared_by_another_user_is_refused_naming_it(tmp_path):
    # XDG_CACHE_HOME=/tmp/x, where another user made x/uwsgi-layouts writable by all beforehand
    if os.geteuid() != 0:
        pytest.skip("giving a directory to another user needs root")
    planted = tmp_path / "x" / "uwsgi-layouts"
    planted.mkdir(parents=True)
    os.chown(planted, 65534, 65534)
    planted.chmod(0o777)
    done = bash_in({**without("UWSGI_TREE_CACHE"), "XDG_CACHE_HOME": str(tmp_path / "x")},
                   "enter_tree_cache; echo used")
    refused(done, planted / "uwsgi-trees", variable="XDG_CACHE_HOME")


def test_a_cache_whose_owner_and_mode_cannot_be_read_is_refused(tmp_path):
    trees = tmp_path / "trees"
    trees.mkdir(mode=0o700)
    # a stat that fails on the cache itself alone (stat -c FORMAT -- PATH), as on a flaky mount
    failing = executable(tmp_path / "bin" / "stat",
                         f'#!/bin/sh\n[ "$4" = "{trees}" ] && exit 1\nexec /usr/bin/stat "$@"\n')
    done = cache_call("enter_tree_cache; echo used", trees, PATH=f"{failing.parent}:{os.environ['PATH']}")
    refused(done, trees)


def test_where_the_cache_is_comes_from_home_or_the_passwd_database_and_only_when_asked(tmp_path):
    no_cache_variables = without("UWSGI_TREE_CACHE", "XDG_CACHE_HOME", "HOME")
    # sourcing the library asks nothing (a pyuwsgi build never needs the cache)
    assert bash_in(no_cache_variables, "echo sourced").stdout == "sourced\n"
    home = subprocess.run(["getent", "passwd", str(os.getuid())], capture_output=True, text=True).stdout.split(":")[5]
    where = 'tree_cache_path; echo "$TREES_SET_BY $TREES"'
    assert bash_in(no_cache_variables, where).stdout == f"HOME {home}/.cache/uwsgi-layouts/uwsgi-trees\n"
    # a relative XDG_CACHE_HOME is ignored, as the XDG base directory spec says
    done = bash_in({**no_cache_variables, "HOME": str(tmp_path), "XDG_CACHE_HOME": "relative"}, where)
    assert done.stdout == f"HOME {tmp_path}/.cache/uwsgi-layouts/uwsgi-trees\n"
    done = bash_in({**no_cache_variables, "XDG_CACHE_HOME": str(tmp_path)}, where)
    assert done.stdout == f"XDG_CACHE_HOME {tmp_path}/uwsgi-layouts/uwsgi-trees\n"
    # no HOME, and no home in the passwd database: one line, exit 2
    executable(tmp_path / "bin" / "getent", "#!/bin/sh\nexit 2\n")
    done = bash_in({**no_cache_variables, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}, where)
    assert done.returncode == 2 and done.stdout == "", done
    assert done.stderr.startswith("error: HOME: unset") and done.stderr.count("\n") == 1, done.stderr


def test_a_build_works_in_the_directory_it_checked_even_when_that_is_renamed(tmp_path):
    trees = tmp_path / "trees"
    done = cache_call(f'enter_tree_cache; mv "{trees}" "{tmp_path / "moved"}"; mkdir "{trees}"; touch made-here', trees)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "moved" / "made-here").exists() and not (trees / "made-here").exists()


def test_build_uwsgi_refuses_a_group_writable_cache_in_one_line_before_building_anything(tmp_path):
    trees, builds = tmp_path / "trees", tmp_path / "builds"
    trees.mkdir()
    trees.chmod(0o775)
    done = subprocess.run(["bash", str(BUILD_SCRIPT), "shared"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "UWSGI_TREE_CACHE": str(trees), "UWSGI_BUILDS": str(builds)})
    refused(done, trees)
    assert list(trees.iterdir()) == [] and not builds.exists()


def test_build_uwsgi_asks_where_the_cache_is_only_for_a_binary_profile_and_refuses_without_a_home(tmp_path):
    # no HOME, no home in the passwd database: a binary build is refused before anything is built
    executable(tmp_path / "bin" / "getent", "#!/bin/sh\nexit 2\n")
    builds = tmp_path / "builds"
    done = subprocess.run(["bash", str(BUILD_SCRIPT), "pyuwsgi", "shared"], capture_output=True, text=True, timeout=120,
                          env={**without("UWSGI_TREE_CACHE", "XDG_CACHE_HOME", "HOME"), "UWSGI_BUILDS": str(builds),
                               "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"})
    assert done.returncode == 2 and done.stdout == "", done
    assert done.stderr.startswith("error: HOME: unset") and done.stderr.count("\n") == 1, done.stderr
    assert not builds.exists()


@pytest.mark.parametrize("state", ["prepared", "a build of it died", "no build date", "an empty build date", "missing"])
def test_only_a_tree_whose_preparation_ended_and_no_build_died_in_is_built_in_again(tmp_path, state):
    trees = tmp_path / "trees"
    tree = trees / "uwsgi-2.0.31-aaaaaaaaaaaaaaaa"
    if state != "missing":
        tree.mkdir(parents=True)
        if state != "no build date":
            (tree / ".source-date-epoch").write_text("" if state == "an empty build date" else "1764000000\n")
        if state == "a build of it died":
            (trees / f"{tree.name}.building").touch()
    done = cache_call(f'enter_tree_cache; if tree_usable "{tree.name}"; then echo usable; else echo afresh; fi', trees)
    assert done.returncode == 0, done.stderr
    assert done.stdout == ("usable\n" if state == "prepared" else "afresh\n")


def plant_tree(trees: Path, name: str, days_unused: float, kib: int = 4) -> Path:
    """A tree as build_binary leaves one: the directory (with a file of KIB, random so that a
    compressing filesystem stores all of it) and its lock, whose mtime is when a build last used it."""
    tree = trees / name
    tree.mkdir(parents=True)
    (tree / "object.o").write_bytes(os.urandom(kib * 1024))
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
    done = cache_call(f'enter_tree_cache; prune_trees "{wanted.name}"', trees)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in trees.iterdir()) == sorted(
        [recent.name, f"{recent.name}.lock", wanted.name, f"{wanted.name}.lock"])
    assert done.stdout == f"removed the uWSGI tree {stale.resolve()} (last used " \
                          f"{time.strftime('%Y-%m-%d', time.gmtime(time.time() - 8 * DAY))})\n"


def test_what_is_not_a_tree_is_neither_pruned_nor_counted(tmp_path):
    trees = tmp_path / "trees"
    # named like a tree, but not uwsgi-VERSION-<16 hex digits>: not ours to remove, however old
    for name in ("uwsgi-notes", "uwsgi-2.0.31-cccc", "uwsgi-2.0.31-CCCCCCCCCCCCCCCC"):
        plant_tree(trees, name, days_unused=30)
    (trees / "unrelated").write_bytes(os.urandom(2000 * 1024))
    kept = [plant_tree(trees, f"uwsgi-2.0.31-{digit * 16}", days_unused=1, kib=400) for digit in "12"]
    # Room for the two trees: the 2 MB beside them are not theirs, so nothing goes.
    done = cache_call('enter_tree_cache; TREE_CACHE_MAX_KIB=1000; prune_trees uwsgi-2.0.31-none', trees)
    assert done.returncode == 0 and done.stdout == "", done
    assert len(list(trees.iterdir())) == 3 * 2 + 1 + 2 * 2 and all(tree.is_dir() for tree in kept)


def test_over_the_size_the_least_recently_used_trees_go_first(tmp_path):
    trees = tmp_path / "trees"
    oldest = plant_tree(trees, "uwsgi-2.0.31-1111111111111111", days_unused=3, kib=400)
    middle = plant_tree(trees, "uwsgi-2.0.31-2222222222222222", days_unused=2, kib=400)
    newest = plant_tree(trees, "uwsgi-2.0.31-3333333333333333", days_unused=1, kib=400)
    # Room for two trees: the oldest goes, and no more than it.
    done = cache_call('enter_tree_cache; TREE_CACHE_MAX_KIB=1000; prune_trees uwsgi-2.0.31-none', trees)
    assert done.returncode == 0, done.stderr
    assert not oldest.exists() and middle.is_dir() and newest.is_dir(), done.stdout


def test_no_pruning_while_another_build_holds_the_cache(tmp_path):
    trees = tmp_path / "trees"
    stale = plant_tree(trees, "uwsgi-2.0.30-aaaaaaaaaaaaaaaa", days_unused=8)
    with open(trees / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_SH)  # as a build in another clone holds it
        done = cache_call("open_tree_cache uwsgi-2.0.31-none", trees)
        assert done.returncode == 0, done.stderr
        assert stale.is_dir() and (trees / f"{stale.name}.lock").exists()
    done = cache_call("open_tree_cache uwsgi-2.0.31-none", trees)
    assert done.returncode == 0, done.stderr
    assert not stale.exists() and not (trees / f"{stale.name}.lock").exists()


def test_a_cache_removed_between_builds_is_made_again(tmp_path):
    trees = tmp_path / "cache" / "uwsgi-trees"
    assert cache_call("enter_tree_cache", trees).returncode == 0
    subprocess.run(["rm", "-rf", str(tmp_path / "cache")], check=True)
    done = cache_call("open_tree_cache uwsgi-2.0.31-none; pwd -P", trees)
    assert done.returncode == 0 and done.stdout == f"{trees.resolve()}\n", done
    assert trees.stat().st_mode & 0o777 == 0o700
