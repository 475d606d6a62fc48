"""The import graph holds the architecture: no import cycles in bench/ or deploy/ (function-level
imports included, so none can hide a cycle), bench's layers point one way, deploy's rooms import
only the rooms before them and only through a room's public names, bench reaches deploy through
those names only, and every module of both imports alone in a fresh interpreter."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from uwsgi_layouts import console

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "uwsgi_layouts"
PACKAGE_DIR = ROOT / PACKAGE


def module_name(path: Path) -> str:
    """A module's name inside the package, without its ``uwsgi_layouts.`` prefix (bench.cli)."""
    parts = path.relative_to(PACKAGE_DIR).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for package in ("bench", "deploy") for p in sorted((PACKAGE_DIR / package).rglob("*.py"))}
MODULES["console"] = PACKAGE_DIR / "console.py"
MODULES["files"] = PACKAGE_DIR / "files.py"  # the one atomic writer, under every room
MODULES["arguments"] = PACKAGE_DIR / "arguments.py"  # the parser and the validators, under every room


def resolve(name: str) -> str | None:
    """The project module ``name`` stands for (a package's names resolve to the package)."""
    name = name.removeprefix(PACKAGE + ".")
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def import_targets(module: str) -> list[tuple[str, bool]]:
    """(project module, at top level?) for every import in ``module``'s source, anywhere in it."""
    path = MODULES[module]
    package = PACKAGE + "." + (module if path.name == "__init__.py" else module.rpartition(".")[0])
    tree = ast.parse(path.read_text(), str(path))
    top_level = {id(node) for node in tree.body}
    # `if TYPE_CHECKING:` blocks at the top are annotations only: not run, not an edge.
    typing_only = {id(n) for node in tree.body if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
                   for n in ast.walk(node)}
    out = []
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from . import x / from .y import z
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # ``from bench.report import plots`` imports the submodule bench.report.plots
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}".removeprefix(PACKAGE + ".") in MODULES else base
                       for alias in node.names]
        else:
            continue
        for target in targets:
            found = resolve(target) if target.startswith(PACKAGE + ".") else None
            if found and found != module:
                out.append((found, id(node) in top_level))
    return out


GRAPH = {m: {t for t, _ in import_targets(m)} for m in MODULES}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as [a, b, ..., a], or None. (The implicit import of a module's parent
    package by Python is not an edge: only what the source imports.)"""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def test_the_checker_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    assert resolve("bench.report.terminal_lines") == "bench.report"
    assert "bench.report.plots" in GRAPH["bench.report.exporters"]  # ``from bench.report import plots``
    assert "deploy.model" in GRAPH["deploy.machine.resolve"]  # ``from deploy.model import Layout``


def test_no_import_cycles():
    cycle = find_cycle(GRAPH)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


# --- bench ------------------------------------------------------------------------------------


def test_only_the_entry_points_import_the_cli():
    """No module imports bench's CLI: the console routes to it by name (console.COMMANDS)."""
    importers = sorted(m for m, targets in GRAPH.items() if "bench.cli" in targets)
    assert importers == []
    assert f"{PACKAGE}.bench.cli" in {module for module, _ in console.COMMANDS.values()}


# Packages split by concern: each module imports only the modules before it in its package's list,
# and every module outside the package imports the package's names, never its modules.
PACKAGE_ORDER = {
    "bench.results": ("checks", "frozen", "cells", "steps", "faults", "diagnoses", "registry", "versions", "record",
                      "loading"),
    "bench.kinds.closedloop": ("plan", "runners", "until", "sweep"),
}


@pytest.mark.parametrize("package", sorted(PACKAGE_ORDER))
def test_a_split_package_points_one_way_and_is_reached_through_its_names(package):
    room = {m for m in GRAPH if m == package or m.startswith(package + ".")}
    order = [f"{package}.{name}" for name in PACKAGE_ORDER[package]]
    assert set(order) == room - {package}, f"a new module of {package}: add it to PACKAGE_ORDER"
    for i, module in enumerate(order):
        inside = {t for t in GRAPH[module] if t in room}
        assert inside <= set(order[:i]), (module, sorted(inside - set(order[:i])))
    reaching_in = sorted(f"{m} -> {t}" for m in GRAPH if m not in room for t in GRAPH[m] if t in order)
    assert not reaching_in, reaching_in


def test_results_is_the_bottom_layer():
    """results imports nothing of bench or deploy but its own modules (and the atomic writer)."""
    room = {m for m in GRAPH if m == "bench.results" or m.startswith("bench.results.")}
    assert not {t for m in room for t in GRAPH[m] if t.startswith(("bench", "deploy"))} - room


def test_bench_layers_point_one_way():
    """results is the bottom layer; reports never import kinds; kinds never import each other
    except through the registry (kinds/__init__) and the closed-loop machinery they share."""
    # doctor's judgement sits beside analysis: it reads observations and records, never loads or runs stacks.
    assert GRAPH["bench.diagnosis"] <= {"bench.observe", "bench.results"}
    # watch's room sits beside doctor's judgement: observations and diagnosis in, metrics out
    # (deploy.machine: the one stats reader and the address syntax, as every bench module may).
    room = {m for m in GRAPH if m == "bench.watch" or m.startswith("bench.watch.")}
    assert {t for m in room for t in GRAPH[m]} - room <= {"bench.observe", "bench.diagnosis", "bench.results",
                                                          "deploy.machine"}
    for module, targets in GRAPH.items():
        if module.startswith(("bench.report", "bench.load", "bench.analysis", "bench.stack", "bench.observe",
                              "bench.diagnosis", "bench.watch")):
            assert not {t for t in targets if t.startswith(("bench.kinds", "bench.cli"))}, module
    shared = {"bench.kinds", "bench.kinds.base", "bench.kinds.closedloop"}
    for kind in ("compare", "openloop", "faults", "doctor"):
        others = {t for t in GRAPH[f"bench.kinds.{kind}"] if t.startswith("bench.kinds")} - shared
        assert not others, (kind, others)


# --- deploy's rooms ------------------------------------------------------------------------------

# Each room and the rooms it may import (besides itself). cli is on top of all of them.
ROOMS = {
    "deploy.model": set(),
    "deploy.machine": {"deploy.model"},
    "deploy.render": {"deploy.model", "deploy.machine"},
    "deploy.run": {"deploy.model", "deploy.machine", "deploy.render"},
    "deploy.ship": {"deploy.model", "deploy.machine", "deploy.render"},
    "deploy.cli": {"deploy.model", "deploy.machine", "deploy.render", "deploy.run", "deploy.ship"},
}
FACE = {"deploy"}  # the package's face


def room_of(module: str) -> str | None:
    return next((room for room in ROOMS if module == room or module.startswith(room + ".")), None)


def test_every_deploy_module_lives_in_a_room():
    homeless = sorted(m for m in MODULES if m.startswith("deploy") and m not in FACE and room_of(m) is None)
    assert not homeless, f"modules outside the rooms {sorted(ROOMS)}: {homeless}"


def test_rooms_import_only_the_rooms_before_them_through_their_public_names():
    wrong = []
    for module in (m for m in MODULES if room_of(m)):
        room = room_of(module)
        for target in GRAPH[module]:
            other = room_of(target)
            if other is None or other == room:
                continue
            if other not in ROOMS[room]:
                wrong.append(f"{module} imports {target}: {room} may import only {sorted(ROOMS[room]) or 'nothing'}")
            elif target != other:
                wrong.append(f"{module} imports {target}: import {other}'s public names, not its modules")
    assert not wrong, "\n".join(wrong)


def test_no_deploy_import_hides_inside_a_function():
    """A function-level import of our own modules is how cycles were dodged: none is left."""
    hidden = sorted(f"{m} -> {t}" for m in MODULES if m.startswith("deploy")
                    for t, top in import_targets(m) if not top)
    assert not hidden, hidden


# Modules that would let the model touch the disk, the network or other processes.
IO_MODULES = {"subprocess", "socket", "shutil", "tempfile", "pwd", "grp", "ctypes", "psutil", "http", "urllib",
              "sysconfig", "fcntl", "signal", "threading", "jinja2", "crossplane", "cryptography"}


def test_the_model_touches_no_disk():
    for module in (m for m in MODULES if room_of(m) == "deploy.model"):
        tree = ast.parse(MODULES[module].read_text())
        names = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                 for alias in node.names}
        names |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                  and node.module and not node.level}
        assert not names & IO_MODULES, (module, sorted(names & IO_MODULES))
        # os is imported for os.path's string functions only (normpath), never for the file system.
        calls = {ast.unparse(node.func) for node in ast.walk(tree) if isinstance(node, ast.Call)}
        io_calls = {c for c in calls if c.startswith("os.") and not c.startswith("os.path.normpath")}
        io_calls |= {c for c in calls if c.endswith((".resolve", ".exists", ".is_dir", ".is_file", ".read_text",
                                                      ".read_bytes", ".stat", ".open", ".write_text"))}
        assert not io_calls, (module, sorted(io_calls))


# Which bench modules may use which rooms: the machine to check the user's app options up front,
# ship for tune's bundle and the certificates of the hosts lab, deploy's CLI for its shared options.
BENCH_MAY_IMPORT = {"deploy.model", "deploy.machine", "deploy.render", "deploy.run"}
BENCH_EXTRA = {
    "deploy.ship": {"bench.kinds.tune", "bench.kinds.compare", "bench.stack"},
    "deploy.cli": {"bench.cli", "bench.subject", "console"},
}


def test_watch_loads_no_experiment_machinery():
    """watch runs for months: it imports neither the kinds nor the plotting reports (matplotlib)."""
    for tool in ("bench.watchcli", "bench.watchrulescli"):
        seen, todo = set(), [tool]
        while todo:
            module = todo.pop()
            if module not in seen:
                seen.add(module)
                todo += GRAPH[module]
        assert not {m for m in seen if m.startswith(("bench.kinds", "bench.cli", "bench.report"))}, tool


def test_bench_reaches_deploy_through_the_rooms_public_names():
    wrong = []
    for module in (m for m in MODULES if m.startswith("bench")):
        for target in (t for t in GRAPH[module] if t.startswith("deploy")):
            allowed = target in BENCH_MAY_IMPORT or module in BENCH_EXTRA.get(target, set())
            if not allowed:
                wrong.append(f"{module} imports {target}")
    assert not wrong, wrong


# One interpreter loads the third-party libraries once, then forks a child per module of ours; the child
# imports that module alone. What is tested (a module of ours importing without another of ours having
# been imported first) is the same as with a new interpreter per module, at a fraction of the CPU: most
# of an interpreter's start here is matplotlib and numpy.
#
# The children form a tree along the packages: importing a.b.c alone first imports a.b alone (Python
# imports a module's parent package before the module, and nothing else before it), so the child for
# a.b.c is forked from the child that imported a.b and holds exactly what importing a.b alone left.
# A package's __init__ is executed once, not once per module below it (kinds/__init__, results/__init__
# and deploy/__init__ import much of the project). Siblings never see each other: each is forked from
# its package's state, and a sibling's imports die with its child.
FORK_EACH = """
import importlib, os, sys, traceback
import cryptography.x509, crossplane, jinja2, matplotlib.pyplot, numpy, psutil, scipy.stats
assert not any(name.startswith("uwsgi_layouts") for name in sys.modules)
below = {}  # package -> the nodes right under it ("" is the interpreter before any import of ours)
for module in sys.argv[1:]:
    parts = module.split(".")
    for i in range(len(parts)):
        node = ".".join(parts[: i + 1])
        siblings = below.setdefault(".".join(parts[:i]), [])
        if node not in siblings:
            siblings.append(node)

def say(text):  # unbuffered: the children leave through os._exit, which flushes nothing
    os.write(1, text.encode())

def check(node):  # in a child forked from node's package: import node, then each node below it the same way
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            importlib.import_module(node)
        except BaseException:
            os.write(write, traceback.format_exc()[-800:].encode())
            os._exit(1)
        os.close(write)  # the nodes below report through their own pipes
        for child in below.get(node, []):
            check(child)
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        error = pipe.read().decode()  # the end: the import failed, or it worked and closed the pipe
    _, status = os.waitpid(pid, 0)
    if status != 0:
        unchecked = " (so the modules below it were not checked)" if below.get(node) else ""
        say(f"{node}: exit status {status}{unchecked}: {error}\\n")

for top in below[""]:
    check(top)
"""


@pytest.mark.timeout(300)
def test_every_module_imports_alone_in_a_fresh_interpreter():
    # deploy/run/peer_launch.py runs in the app's interpreter, where our packages are not importable.
    modules = sorted(f"{PACKAGE}.{m}" for m in MODULES if m != "deploy.run.peer_launch")
    proc = subprocess.run([sys.executable, "-c", FORK_EACH, *modules], cwd=ROOT, capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0 and not proc.stdout, proc.stdout + proc.stderr[-2000:]


ORDER_PACKAGE = {  # a package whose modules work only after a sibling (or a module elsewhere) ran
    "__init__.py": "",
    "first.py": "import sys\nsys.modules['orderpkg'].READY = True\n",
    "second.py": "import orderpkg\nassert orderpkg.READY\n",  # needs first imported before it
    "third.py": "import orderpkg.first\nimport orderpkg\nassert orderpkg.READY\n",  # imports what it needs
    "sub/__init__.py": "",
    "sub/a.py": "import sys\nsys.modules['orderpkg.sub'].A = True\n",
    "sub/b.py": "import orderpkg.sub\nassert orderpkg.sub.A\n",  # needs its sibling a imported before it
    "sub/c.py": "import orderpkg\nassert orderpkg.READY\n",  # needs orderpkg.first, outside its package
}


def test_the_fresh_imports_catch_a_module_that_needs_another_imported_first(tmp_path):
    """The check above must be able to fail: modules that work only after a sibling ran, or a module
    of another package, each listed after the module it needs (and a package below the root, so the
    tree of children is crossed)."""
    for name, text in ORDER_PACKAGE.items():
        (tmp_path / "orderpkg" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "orderpkg" / name).write_text(text)
    listed = ["orderpkg.first", "orderpkg.sub.a", "orderpkg.second", "orderpkg.sub", "orderpkg.sub.b",
              "orderpkg.sub.c", "orderpkg.third"]
    proc = subprocess.run([sys.executable, "-c", FORK_EACH, *listed], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    failed = [line.split(":")[0] for line in proc.stdout.splitlines() if ": exit status " in line]
    assert sorted(failed) == ["orderpkg.second", "orderpkg.sub.b", "orderpkg.sub.c"], proc.stdout + proc.stderr
    assert "AttributeError" in proc.stdout, proc.stdout


def test_the_peer_launcher_imports_nothing_of_ours():
    """It runs in the app's own interpreter, which has none of our packages."""
    assert not GRAPH["deploy.run.peer_launch"]


def test_the_atomic_writer_is_under_every_room():
    """deploy's rooms and bench's layers all write through ``files``: it imports none of them."""
    assert GRAPH["files"] == set()


def test_the_command_line_parts_are_under_every_room():
    """deploy's CLI, bench's kinds and the tools parse with ``arguments``: it imports none of them."""
    assert GRAPH["arguments"] == set()
    assert "arguments" in GRAPH["deploy.cli"] and "arguments" in GRAPH["bench.options"]
