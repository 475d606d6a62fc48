"""No import cycles in bench/ (static import graph, function-level imports included), no kind
imports the CLI, and every bench module imports on its own in a fresh interpreter."""

from __future__ import annotations

import ast
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "bench"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def resolve(name: str) -> str | None:
    """The bench module ``name`` stands for (a package's names resolve to the package)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports(module: str) -> set[str]:
    """bench modules ``module`` imports anywhere in its source (top level or inside functions)."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from . import x / from .y import z
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # ``from bench.report import plots`` imports the submodule bench.report.plots
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]
        else:
            continue
        out.update(t for t in (resolve(x) for x in targets if x.startswith("bench")) if t and t != module)
    return out


GRAPH = {m: imports(m) for m in MODULES}


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


def test_no_import_cycles_in_bench():
    cycle = find_cycle(GRAPH)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_only_the_entry_points_import_the_cli():
    importers = sorted(m for m, targets in GRAPH.items() if "bench.cli" in targets)
    assert importers == ["bench.__main__", "bench.faults"]


def test_layers_point_one_way():
    """results is the bottom layer; reports never import kinds; kinds never import each other
    except through the registry (kinds/__init__) and the closed-loop machinery they share."""
    assert not {m for m in GRAPH["bench.results"] if m.startswith("bench")}
    # doctor's judgement sits beside analysis: it reads observations and records, never loads or runs stacks.
    assert GRAPH["bench.diagnosis"] <= {"bench.observe", "bench.results"}
    for module, targets in GRAPH.items():
        if module.startswith(("bench.report", "bench.load", "bench.analysis", "bench.stack", "bench.observe",
                              "bench.diagnosis")):
            assert not {t for t in targets if t.startswith(("bench.kinds", "bench.cli"))}, module
    shared = {"bench.kinds", "bench.kinds.base", "bench.kinds.closedloop"}
    for kind in ("compare", "openloop", "faults", "doctor"):
        others = {t for t in GRAPH[f"bench.kinds.{kind}"] if t.startswith("bench.kinds")} - shared
        assert not others, (kind, others)


@pytest.mark.timeout(240)
def test_every_module_imports_alone_in_a_fresh_interpreter():
    def fresh(module: str) -> tuple[str, int, str]:
        proc = subprocess.run([sys.executable, "-c", f"import {module}"], cwd=ROOT, capture_output=True, text=True,
                              timeout=120)
        return module, proc.returncode, proc.stderr[-800:]

    with ThreadPoolExecutor(max_workers=4) as pool:
        failed = [r for r in pool.map(fresh, sorted(MODULES)) if r[1] != 0]
    assert not failed, failed
