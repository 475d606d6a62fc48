"""The README's two commands work on a bare machine: the system packages come before the venv.

uWSGI is compiled when the venv is built, and it needs Debian's python3 headers, libpcre2-dev (its
internal routing, which the route-if-not lines every uwsgi.ini holds depend on) and libssl-dev at that
moment. A venv built first has a uWSGI that `make` must then refuse. These tests read the Makefile as
make does (``make -n`` on a copy without ``.venv``), and run the installer and ``make venv`` on a PATH
without apt-get, as on a machine where the installer cannot help.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
INSTALLER = "install-system-deps.sh"
# What make runs to build the venv: the interpreter's venv module, then pip (pyuwsgi's compile first).
VENV_STEPS = (re.compile(r" -m venv "), re.compile(r" -m pip install "))


def bare_copy(tmp_path: Path) -> Path:
    """The files the Makefile reads, in a tree with no .venv (as a fresh clone has)."""
    (tmp_path / "scripts").mkdir(parents=True)
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(ROOT / name, tmp_path / name)
    # The installer, and the scripts the venv is built from (a change to them rebuilds it).
    for script in (INSTALLER, "install-pyuwsgi.sh", "venv-requirements.py"):
        shutil.copy(ROOT / "scripts" / script, tmp_path / "scripts" / script)
    return tmp_path


def targets_building_the_venv() -> list[str]:
    """Every rule of the Makefile whose prerequisites include ``venv``."""
    text = (ROOT / "Makefile").read_text()
    return sorted(set(re.findall(r"^([\w-]+):[^=\n]*\bvenv\b", text, re.M)) - {"venv"})


def dry_run(tree: Path, target: str) -> list[str]:
    out = subprocess.run(["make", "-n", target], cwd=tree, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def first_line(lines: list[str], pattern: re.Pattern[str] | str) -> int:
    for i, line in enumerate(lines):
        if (pattern.search(line) if isinstance(pattern, re.Pattern) else pattern in line):
            return i
    raise AssertionError(f"{pattern!r} not in:\n" + "\n".join(lines))


def test_the_rules_that_build_the_venv_are_found():
    # The README's two commands at least; an empty list would make the next test pass vacuously.
    assert {"compare", "test"} <= set(targets_building_the_venv())


@pytest.mark.parametrize("target", ["venv", *targets_building_the_venv()])
def test_system_packages_come_before_the_venv(tmp_path, target):
    lines = dry_run(bare_copy(tmp_path), target)
    installer = first_line(lines, INSTALLER)
    for step in VENV_STEPS:
        assert installer < first_line(lines, step), f"make {target}: the venv is built before {INSTALLER}"


def test_a_built_venv_still_checks_the_system_packages(tmp_path):
    # nginx and wrk are needed at run time too: an up-to-date venv must not skip the check.
    tree = bare_copy(tmp_path)
    installed = tree / ".venv" / "bin" / ".installed"
    installed.parent.mkdir(parents=True)
    installed.touch()
    os.utime(tree / "pyproject.toml", (1, 1))
    lines = dry_run(tree, "compare")
    assert any(INSTALLER in line for line in lines)
    assert not any(step.search(line) for step in VENV_STEPS for line in lines)


def test_without_apt_get_the_installer_names_the_packages_and_nothing_is_built(tmp_path):
    """A machine without apt-get and without wrk: make stops at the installer, before the venv."""
    tree = bare_copy(tmp_path / "tree")
    tools = tmp_path / "bin"
    tools.mkdir()
    # Just what make and the installer's shell need; no apt-get, no wrk, no dpkg-query.
    for tool in ("make", "bash", "sh", "sed", "test", "id"):
        found = shutil.which(tool)
        assert found, tool
        (tools / tool).symlink_to(found)
    out = subprocess.run(["make", "venv"], cwd=tree, capture_output=True, text=True, timeout=120,
                         env={"PATH": str(tools), "HOME": str(tmp_path)})
    assert out.returncode != 0
    assert "wrk" in out.stderr and "apt-get is not available" in out.stderr, out.stderr
    assert not (tree / ".venv").exists(), "the venv was built before the system packages"


def test_a_venv_older_than_its_build_scripts_is_built_again(tmp_path):
    """A checkout that pulls a new way of building uWSGI (pyuwsgi) gets it from make venv."""
    tree = bare_copy(tmp_path)
    installed = tree / ".venv" / "bin" / ".installed"
    installed.parent.mkdir(parents=True)
    installed.touch()
    for path in (tree / "pyproject.toml", tree / "scripts" / "venv-requirements.py", installed):
        os.utime(path, (1000, 1000))
    os.utime(tree / "scripts" / "install-pyuwsgi.sh", (2000, 2000))
    lines = dry_run(tree, "venv")
    assert any("install-pyuwsgi.sh" in line for line in lines), lines


def test_make_venv_compiles_uwsgi_once(tmp_path):
    """The main job's venv compiles pyuwsgi only: pip's uwsgi binary (a second compile of the same
    uWSGI) is left out of what pip installs, and the project goes in without resolving it."""
    lines = dry_run(bare_copy(tmp_path), "venv")
    compiles = [line for line in lines if "--no-binary uwsgi" in line or "install-pyuwsgi.sh" in line]
    assert len(compiles) == 1 and "install-pyuwsgi.sh" in compiles[0], compiles
    project = [line for line in lines if re.search(r"pip install .*-e \.", line)]
    assert project and all("--no-deps" in line for line in project), project


def test_the_venv_requirements_leave_out_only_the_uwsgi_binary():
    out = subprocess.run([str(ROOT / ".venv" / "bin" / "python"), str(ROOT / "scripts" / "venv-requirements.py"),
                          str(ROOT / "pyproject.toml"), "test"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    names = {re.match(r"[A-Za-z0-9._-]+", line).group(0).lower() for line in out.stdout.splitlines()}
    assert "uwsgi" not in names
    assert {"jinja2", "scipy", "gunicorn", "granian", "pytest", "ruff"} <= names, names


def test_the_venv_requirements_refuse_an_unknown_extra():
    out = subprocess.run([str(ROOT / ".venv" / "bin" / "python"), str(ROOT / "scripts" / "venv-requirements.py"),
                          str(ROOT / "pyproject.toml"), "nosuch"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "extra: 'nosuch'" in out.stderr, out.stderr
