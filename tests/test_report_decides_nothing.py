"""The report layer decides nothing and holds no threshold (issue 37): every judgement, threshold
and comparison lives on the analysis side (``bench.analysis``, ``bench.paired``, ``bench.verdict``,
``bench.decisions``, ``bench.readings``, ``bench.diagnosis``, ``bench.tune``) and reaches the
report as data (``bench.summary.Summary``, tune's outcome and cautions, doctor's findings).

Read from the source of ``uwsgi_layouts/bench/report/`` (its modules are read, never imported or run):

- a use of the judging modules' functions is one of the readings they hand out (``READINGS``,
  keyed by the module it is taken from and its name there: a judge of another module named like a
  reading, or imported under a reading's name, is no reading): never a comparison
  (``compare_groups``, ``paired``, ``outcome_of`` of ``bench.paired``...) nor a judge, whether
  imported by name or reached as an attribute of the module (``analysis.memory_cost`` after
  ``from uwsgi_layouts.bench import analysis``, relative imports and packages included:
  ``bench.analysis.compare_groups`` after ``from uwsgi_layouts import bench``), or a method of one of
  their classes or of a constant they make by a call (``TargetReading.of``, ``readings.Matters.of``,
  ``DEFAULT_RULE.alpha_at``), called or handed on (``key=steady_min``). What a name is (a module, a
  class, a function, a written-out constant or one made by a call) is read from the source of the
  module that defines it, following re-exports (never from its letter case: ``TLS`` may be a
  class); a judge re-exported by another module of the report is still a judge;
- each kind's summary is made in one place only (``JUDGES_ONCE``: ``bench.report.judged``); every
  other module is handed it;
- a judging module, class, or constant made by a call is only read from (``analysis.X``,
  ``Stat(...)``, ``isinstance(x, Stat)``, annotations), never handed on where the guard would lose
  it: bound to another name (``an = analysis``, ``TR = TargetReading``, a default ``m=paired``),
  passed to a call (``getattr(analysis, name)``), stored or returned; star imports of the project
  are refused (their names cannot be read);
- no module-level number named like a constant (a threshold) but the presentation's own
  (``PRESENTATION``: widths, sizes);
- no ordering comparison (<, <=, >, >=) against a constant's name, a float, an integer other than
  0 and 1, or a measured figure (``.ratio``, ``.low``, ``.high``, ``.median``, ``.spread``,
  ``.value``): "is it above the threshold?" is a judgement;
- no outcome (``OUTCOMES``: ``c.outcome``, ``lv.direction``, ``t.state``...) tested with ``==`` /
  ``!=`` against a word or an enum member, nor ``in`` a tuple of bare words: the report picks its
  words with ``is`` against one member (or ``in`` members).

Each rule is proved by a violation planted in a string that the rules must catch
(``test_the_rules_catch_a_judgement_put_back``), and rendering they must let be. Every allowance is
used by some report module (``test_every_reading_is_used_by_some_report_module``).

Out of its reach: what an instance does (``stat.noisy``, ``summary.rule.words()``). A report renders
the summary's records, so it calls their methods and properties everywhere; the guard cannot tell
which object a local name holds (a record, or a judging class's instance), nor follow a judging
value through the report's own helpers. Such uses are kept to wording and formatting by review, and
the summary holds every flag a view needs (the plots' noisy points are ``GroupRow.noisy``).

Modules not converted yet are listed in ``NOT_YET`` with what they still decide, and the number
formatting in ``FORMATTING`` (digits picked by a number's size: not a verdict); each must still
break a rule (a converted one leaves the list, so the list cannot hide a new judgement).
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import typing
from pathlib import Path

import pytest

from uwsgi_layouts.bench.readings import PlanJudgement
from uwsgi_layouts.bench.summary import Summary

REPORT = Path(__file__).resolve().parent.parent / "uwsgi_layouts" / "bench" / "report"
PACKAGE_ROOT = REPORT.parent.parent.parent  # the checkout: uwsgi_layouts/ lies in it
REPORT_PACKAGE = "uwsgi_layouts.bench.report"
JUDGING = ("uwsgi_layouts.bench.analysis", "uwsgi_layouts.bench.paired", "uwsgi_layouts.bench.verdict",
           "uwsgi_layouts.bench.decisions", "uwsgi_layouts.bench.readings", "uwsgi_layouts.bench.diagnosis",
           "uwsgi_layouts.bench.tune", "uwsgi_layouts.bench.summary", "uwsgi_layouts.bench.margin",
           "uwsgi_layouts.bench.capacity", "uwsgi_layouts.bench.doctor_summary")
# What the report may call from the judging modules, as (the module it is taken from, its name
# there; a class's method as "Class.method"): the readings they hand out (each builds, or reads,
# typed judgements as data), loaders of what a run stored, and helpers that judge nothing (grouping,
# label parsing, words). A name is allowed from its module only: the same name from another
# judging module is another function.
ANALYSIS, READING = "uwsgi_layouts.bench.analysis", "uwsgi_layouts.bench.readings"
VERDICT = "uwsgi_layouts.bench.verdict"
READINGS = frozenset({
    # the readings compare's sections render
    (READING, "peer_readings"), (READING, "target_readings"), (READING, "files_blocks"), (READING, "mixed_blocks"),
    (READING, "reuseport_blocks"), (READING, "tls_costs"), (READING, "plan_judgement"),
    (ANALYSIS, "mechanism_of"), (ANALYSIS, "unpaired_note"),
    # grouping, label parsing and words: no judgement
    (ANALYSIS, "group_cells"), (ANALYSIS, "requests_for_p99"),
    (READING, "cells_by_repeat"), (READING, "without"), (READING, "variant_options"), (READING, "only_nginx"),
    ("uwsgi_layouts.bench.paired", "percent"), (VERDICT, "confidence_words"),
    ("uwsgi_layouts.bench.diagnosis", "layout_words"),
    # what the run recorded of its app and requests
    (VERDICT, "app_record"), (VERDICT, "mixes"), (VERDICT, "is_demo_run"),
    # a capacity plan's stored steps and plan, read back (its judgement is plan_judgement's)
    ("uwsgi_layouts.bench.capacity", "RateStep.from_dict"), ("uwsgi_layouts.bench.capacity", "Plan.from_dict"),
})
# Each kind's summary is made in one place only, once per report, for a run stored without one
# (``bench.report.judged``, through ``Renderer.judge``): every other module is handed it. The same
# registry names each kind's summary class, which loads a stored summary.json (``Renderer.summary``).
JUDGES_ONCE = {"__init__.py": frozenset({
    ("uwsgi_layouts.bench.summary", "summarize"), ("uwsgi_layouts.bench.tune.summary", "summarize"),
    ("uwsgi_layouts.bench.doctor_summary", "summarize"),
    ("uwsgi_layouts.bench.summary", "Summary"), ("uwsgi_layouts.bench.tune.summary", "TuneSummary"),
    ("uwsgi_layouts.bench.doctor_summary", "DoctorSummary")})}


def _allowed_in(name: str) -> frozenset:
    return READINGS | JUDGES_ONCE.get(name, frozenset())
# Sizes of the presentation: widths, resolutions, how many rows or bars a table or figure shows and
# where a legend takes a second column (plots.py: layout arithmetic, as text.py's digits are).
PRESENTATION = {"WIDTH", "DPI", "MAX_REQUEST_ROWS", "LABELLED_BARS", "LEGEND_COLUMN_ROWS"}
FIGURES = {"ratio", "low", "high", "median", "spread", "value"}
NOT_YET: dict[str, str] = {}  # every module converted (memory, plan, plots and openloop were the last)
FORMATTING = {"text.py": "picks digits by a number's size"}
# The fields a judgement's outcome is held in (each an enum of the analysis side, or a word it
# stores: the steps' verdicts). The report tests one only with ``is`` against one member, or ``in``
# a tuple of members, to pick its words; ``==``/``!=``, or a test against bare words
# (``c.outcome in ("better", "worse")`` is ``Comparison.decided`` written again), re-derives a
# judgement from it, and a bare word slips past the enum the summary checks on load.
# ``test_every_outcome_of_the_summary_is_named`` keeps the list complete.
OUTCOMES = {"outcome", "direction", "standing", "side", "rps_side", "p99_side", "lead", "state", "answer", "touched",
            "change", "win", "verdict", "within"}
# Enum fields of the summary that are no outcome: what a key comparison is about (a category).
NOT_OUTCOMES = {"kind"}


def _judging(dotted: str) -> bool:
    return any(dotted == m or dotted.startswith(m + ".") for m in JUDGING)


def _holds_judging(dotted: str) -> bool:
    """A judging module, or a package one lies in (``uwsgi_layouts.bench``): what reaches a judge."""
    return _judging(dotted) or any(m.startswith(dotted + ".") for m in JUDGING)


def _is_module(dotted: str) -> bool:
    """Whether ``dotted`` names a module or package of the project (read from the tree, not imported)."""
    path = PACKAGE_ROOT.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _absolute(node: ast.ImportFrom, package: str = REPORT_PACKAGE) -> str:
    """The module an ImportFrom reads from; a relative one as seen from a module of ``package``."""
    if not node.level:
        return node.module or ""
    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
    return ".".join([*anchor, node.module] if node.module else anchor)


@dataclasses.dataclass(frozen=True)
class Entity:
    """What a name of the project is, read from the source of the module that defines it:
    ``module`` (``dotted`` names it), ``class`` (a ClassDef: whatever its letter case), ``function``,
    ``literal`` (a constant whose value is written out: ``ARTICLE = "article"``), ``instance`` (a
    constant made by a call: ``DEFAULT_RULE = Rule(...)``) or ``unknown`` (not found: judged as a
    function would be). ``home`` is where it is defined, ``node`` its ClassDef, or for an instance
    the ClassDef of its class when that is found."""

    kind: str
    home: str
    name: str = ""
    node: ast.ClassDef | None = None

    def member(self, attr: str) -> str:
        """An attribute of a class or an instance: ``method`` (a def in the class body: a judgement
        may hide in it), ``data`` (assigned in the class body: an enum member, a class constant, a
        field) or ``unknown`` (inherited, or the class not found: checked as a method is)."""
        for node in self.node.body if self.node is not None else ():
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == attr:
                return "method"
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, ast.AnnAssign) else []
            if any(isinstance(t, ast.Name) and t.id == attr for t in targets):
                return "data"
        return "unknown"


class Sources:
    """The project's modules as read from the tree (``planted`` stands in for some: the planted
    violations' own judging modules), each parsed once for every check (the tree's, and what its
    names are, are shared between Sources without planted modules)."""

    _read: dict[str, ast.Module | None] = {}
    _entities: dict[tuple[str, str], Entity] = {}

    def __init__(self, planted: dict[str, str] | None = None):
        self.planted = planted or {}
        self.trees = {} if self.planted else Sources._read
        self.entities = {} if self.planted else Sources._entities

    def tree(self, module: str) -> ast.Module | None:
        if module not in self.trees:
            path = PACKAGE_ROOT.joinpath(*module.split("."))
            for file in (path.with_suffix(".py"), path / "__init__.py"):
                if module in self.planted or file.is_file():
                    self.trees[module] = ast.parse(self.planted.get(module) or file.read_text())
                    break
            else:
                self.trees[module] = None
        return self.trees[module]

    def package(self, module: str) -> str:
        """The package a module's relative imports start from."""
        path = PACKAGE_ROOT.joinpath(*module.split("."))
        return module if (path / "__init__.py").is_file() else module.rpartition(".")[0]

    def entity(self, module: str, name: str, depth: int = 0) -> Entity:
        """What ``name`` of ``module`` is, following its imports (``bench.analysis`` re-exports
        ``Stat`` of ``bench.analysis.tails``)."""
        key = (module, name)
        if key not in self.entities:
            self.entities[key] = self._entity(module, name, depth)
        return self.entities[key]

    def _entity(self, module: str, name: str, depth: int) -> Entity:
        if _is_module(f"{module}.{name}") or f"{module}.{name}" in self.planted:
            return Entity("module", f"{module}.{name}")
        tree = self.tree(module)
        for node in tree.body if tree is not None and depth < 20 else ():
            if isinstance(node, ast.ClassDef) and node.name == name:
                return Entity("class", module, name, node)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
                return Entity("function", module, name)
            targets = (node.targets if isinstance(node, ast.Assign) else [node.target]
                       if isinstance(node, ast.AnnAssign) and node.value is not None else [])
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return self._constant(module, name, node.value, depth)
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if (alias.asname or alias.name) == name:
                        return self.entity(_absolute(node, self.package(module)), alias.name, depth + 1)
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname == name:
                        return Entity("module", alias.name)
        return Entity("unknown", module, name)

    def _constant(self, module: str, name: str, value: ast.expr, depth: int) -> Entity:
        if _literal(value):
            return Entity("literal", module, name)
        if isinstance(value, ast.Name):  # ``TR = TargetReading`` in the judging module itself
            return self.entity(module, value.id, depth + 1)
        cls = None
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name):
            made_by = self.entity(module, value.func.id, depth + 1)
            cls = made_by.node if made_by.kind == "class" else None
        return Entity("instance", module, name, cls)


def _literal(node: ast.expr) -> bool:
    """A value written out: a number, a word, or a tuple, list, set or dict of them."""
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return all(_literal(x) for x in node.elts)
    if isinstance(node, ast.Dict):
        return all(k is not None and _literal(k) for k in node.keys) and all(_literal(v) for v in node.values)
    if isinstance(node, ast.UnaryOp):
        return _literal(node.operand)
    return False


@dataclasses.dataclass(frozen=True)
class Reached:
    """What an expression of a report module names: the entity, and the reading's key it is used
    under (the module it is taken from, its name there: ``("...readings", "TargetReading.of")``)."""

    entity: Entity
    module: str
    name: str


def _imports(tree: ast.Module, sources: Sources) -> tuple[dict[str, Reached], list[str]]:
    """Local name -> what it names, for every name imported from the project (modules whole,
    packages included: ``from uwsgi_layouts import bench``, ``import uwsgi_layouts.bench as b``);
    and the star imports of the project (``from ..analysis import *``: names no one can read)."""
    local, stars = {}, []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = _absolute(node)
            if not base.startswith("uwsgi_layouts"):
                continue
            for alias in node.names:
                if alias.name == "*":
                    stars.append(f"line {node.lineno}: imports * from {base}: which names it uses cannot be read")
                    continue
                local[alias.asname or alias.name] = Reached(sources.entity(base, alias.name), base, alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if not alias.name.startswith("uwsgi_layouts"):
                    continue
                dotted = alias.name if alias.asname else alias.name.partition(".")[0]
                local[alias.asname or dotted] = Reached(Entity("module", dotted), dotted, "")
    return local, stars


def _reach(node: ast.expr, local: dict[str, Reached], sources: Sources) -> Reached | None:
    """What ``node`` (a name, or attributes of one) names in the project, or None."""
    if isinstance(node, ast.Name):
        return local.get(node.id)
    if not isinstance(node, ast.Attribute):
        return None
    owner = _reach(node.value, local, sources)
    if owner is None:
        return None
    e = owner.entity
    if e.kind == "module":
        return Reached(sources.entity(e.home, node.attr), e.home, node.attr)
    if e.kind in ("class", "instance", "unknown") and _judging(e.home):
        kind = {"method": "function", "data": "literal"}.get(e.member(node.attr), "unknown")
        return Reached(Entity(kind, e.home, f"{e.name}.{node.attr}"), owner.module, f"{owner.name}.{node.attr}")
    return None


def _annotations(tree: ast.Module) -> set[int]:
    """The ids of every node inside an annotation (a type named is no use)."""
    roots = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            roots += [a.annotation for a in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg)
                      if a is not None and a.annotation is not None]
            roots += [node.returns] if node.returns is not None else []
        elif isinstance(node, ast.AnnAssign):
            roots.append(node.annotation)
    return {id(x) for root in roots for x in ast.walk(root)}


def _handed_on(node: ast.expr, parents: dict[int, ast.AST], entity: Entity) -> bool:
    """Whether a judging module, class or constant made by a call leaves the expression it is read
    in: bound to another name (``an = analysis``, ``TR = TargetReading``, a default ``m=paired``),
    handed to a call (``getattr(analysis, name)``), put in a container or returned. Only reading an
    attribute of it, calling a class (a record made), or testing ``isinstance`` against a class
    stay in the guard's sight."""
    parent = parents.get(id(node))
    if isinstance(parent, ast.Attribute) and parent.value is node:
        return False
    if entity.kind == "class" and isinstance(parent, ast.Call) and parent.func is node:
        return False
    if entity.kind == "class" and isinstance(parent, ast.BinOp) and isinstance(parent.op, ast.BitOr):
        return False  # a type union (``Summary | TuneSummary``): no method is reached through it
    if (entity.kind == "class" and isinstance(parent, (ast.Tuple, ast.Call))
            and _isinstance_test(parent if isinstance(parent, ast.Call) else parents.get(id(parent)))):
        return False
    return True


def _isinstance_test(node: ast.AST | None) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id in ("isinstance", "issubclass") and len(node.args) == 2)


def uses(source: str, planted: dict[str, str] | None = None) -> tuple[list[tuple[int, str, Reached]], list[str]]:
    """Every use of the judging side in ``source``: (line, how, what) with how ``calls`` or
    ``uses`` (a function or method, called or handed on) or ``hands on`` (a module, class or
    constant the guard would lose sight of); and the star imports."""
    sources = Sources(planted)
    tree = ast.parse(source)
    local, stars = _imports(tree, sources)
    parents = {id(child): node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    typed = _annotations(tree)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Name, ast.Attribute)) or not isinstance(node.ctx, ast.Load) or id(node) in typed:
            continue
        reached = _reach(node, local, sources)
        if reached is None:
            continue
        e = reached.entity
        parent = parents.get(id(node))
        # Judging when defined on the judging side, or taken from it (a name it re-exports is its reading).
        judging = _judging(e.home) or _judging(reached.module)
        if e.kind in ("function", "unknown") and judging:
            called = isinstance(parent, ast.Call) and parent.func is node
            found.append((node.lineno, "calls" if called else "uses", reached))
        elif e.kind == "module" and _holds_judging(e.home) and _handed_on(node, parents, e):
            found.append((node.lineno, "hands on", reached))
        elif e.kind in ("class", "instance") and judging and _handed_on(node, parents, e):
            found.append((node.lineno, "hands on", reached))
    return found, stars


def _allowed(reached: Reached, allowed: frozenset) -> bool:
    """A reading the report may use: this name from this module (``READINGS``)."""
    return (reached.module, reached.name) in allowed


def _constant(name: str) -> bool:
    return name.isupper() and len(name) > 1 and name not in PRESENTATION


def _is_threshold(node: ast.expr) -> bool:
    if isinstance(node, ast.Name) and _constant(node.id):
        return True
    if isinstance(node, ast.Attribute) and (node.attr in FIGURES or _constant(node.attr)):
        return True
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return isinstance(node.value, float) or node.value not in (0, 1)
    return False


def _is_outcome(node: ast.expr) -> bool:
    """An outcome read from a judgement: ``c.outcome``, ``level["direction"]``, a local ``side``."""
    if isinstance(node, ast.Attribute):
        return node.attr in OUTCOMES
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Constant) and node.slice.value in OUTCOMES
    return isinstance(node, ast.Name) and node.id in OUTCOMES


def _is_word(node: ast.expr) -> bool:
    """A bare word (``"better"``) or a tuple, list or set of them."""
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return bool(node.elts) and all(_is_word(x) for x in node.elts)
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def _is_member(node: ast.expr) -> bool:
    """An enum member: ``Direction.BETTER``."""
    return (isinstance(node, ast.Attribute) and node.attr.isupper() and isinstance(node.value, ast.Name)
            and node.value.id[:1].isupper())


def _judges_an_outcome(node: ast.Compare) -> bool:
    """``c.outcome == Direction.BETTER``, ``side != "peer"``, ``c.outcome in ("better", "worse")``:
    an outcome tested by equality, or against bare words (see OUTCOMES)."""
    sides = (node.left, *node.comparators)
    for op, left, right in zip(node.ops, sides[:-1], sides[1:], strict=True):
        for outcome, other in ((left, right), (right, left)):
            if not _is_outcome(outcome):
                continue
            if isinstance(op, (ast.Eq, ast.NotEq)) and (_is_word(other) or _is_member(other)):
                return True
            if isinstance(op, (ast.In, ast.NotIn)) and outcome is left and _is_word(other):
                return True
    return False


def violations(source: str, allowed: frozenset = READINGS, planted: dict[str, str] | None = None) -> list[str]:
    tree = ast.parse(source)
    found = []
    for node in tree.body:
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, (int, float)) and not isinstance(node.value.value, bool)):
            names = [t.id for t in node.targets if isinstance(t, ast.Name) and t.id.isupper()]
            found += [f"line {node.lineno}: threshold {n} = {node.value.value!r}" for n in names
                      if n not in PRESENTATION]
    # A judging function or method, by its imported name or reached through its module or class
    # (``analysis.compare_groups``, ``TargetReading.of``, ``bench.analysis.memory_cost``), called or
    # handed on (``key=steady_min``); a judging module, class or constant handed on, which the guard
    # could no longer follow (``an = analysis``, ``getattr(analysis, name)``, ``m=paired``).
    reached, stars = uses(source, planted)
    found += stars
    for line, how, r in reached:
        if how == "hands on" and not _allowed(r, allowed):
            what = r.entity.home if r.entity.kind == "module" else f"{r.name} of {r.module}"
            found.append(f"line {line}: hands on {r.entity.kind} {what}: read one of its readings instead")
        elif how != "hands on" and not _allowed(r, allowed):
            found.append(f"line {line}: {how} {r.name} of {r.module}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and any(isinstance(op, (ast.Lt, ast.LtE, ast.Gt, ast.GtE)) for op in node.ops):
            if any(_is_threshold(x) for x in (node.left, *node.comparators)):
                found.append(f"line {node.lineno}: judges {ast.unparse(node)}")
        if isinstance(node, ast.Compare) and _judges_an_outcome(node):
            found.append(f"line {node.lineno}: judges an outcome: {ast.unparse(node)}")
    return found


MODULES = sorted(p.name for p in REPORT.glob("*.py"))


@pytest.mark.parametrize("name", [m for m in MODULES if m not in NOT_YET and m not in FORMATTING])
def test_the_report_holds_no_threshold_and_calls_no_comparison(name):
    found = violations((REPORT / name).read_text(), _allowed_in(name))
    assert not found, f"{name} judges; move it to the analysis side and render its reading:\n" + "\n".join(found)


@pytest.mark.parametrize("name", sorted({**NOT_YET, **FORMATTING}))
def test_a_module_left_out_still_needs_its_place_on_the_list(name):
    assert (REPORT / name).is_file(), f"{name} is gone: take it off its list"
    assert violations((REPORT / name).read_text()), f"{name} decides nothing now: take it off its list"


# The guard's two holes until issue 37's last stop: READINGS held bare names, so any function named
# like a reading passed, from whichever judging module (or imported under a reading's name); and a
# class's method (``TargetReading.of``) passed whatever it judged, its class's name being upper case.
HOLES = [
    # a judge of another module named like a reading (``summarize`` is a reading of bench.summary only)
    ("from uwsgi_layouts.bench.decisions import summarize\nx = summarize(results)\n",
     "calls summarize of uwsgi_layouts.bench.decisions"),
    ("from uwsgi_layouts.bench import verdict\nrows = verdict.group_cells(results)\n",
     "calls group_cells of uwsgi_layouts.bench.verdict"),
    ("from ..tune import record\ns = record.summarize(results)\n",
     "calls summarize of uwsgi_layouts.bench.tune.record"),
    # a comparison imported under a reading's name
    ("from uwsgi_layouts.bench.paired import outcome_of as percent\nx = percent(1, 2, True, 0.05)\n",
     "calls outcome_of of uwsgi_layouts.bench.paired"),
    # a class's method: by the class's name, through its module, or handed on
    ("from uwsgi_layouts.bench.readings import TargetReading\nt = TargetReading.of('throughput', 'rps', c, 1.25, "
     "False)\n", "calls TargetReading.of of uwsgi_layouts.bench.readings"),
    ("from uwsgi_layouts.bench import readings\nm = readings.Matters.of(layout, server)\n",
     "calls Matters.of of uwsgi_layouts.bench.readings"),
    ("from uwsgi_layouts.bench.readings import Side as S\nsides = list(map(S.of, comparisons))\n",
     "uses Side.of of uwsgi_layouts.bench.readings"),
    ("import uwsgi_layouts.bench.analysis\nshaky = filter(uwsgi_layouts.bench.analysis.Stat.noisy.fget, stats)\n",
     "uses Stat.noisy of uwsgi_layouts.bench.analysis"),
]


PAIRED = "uwsgi_layouts.bench.paired"
# Judging modules as the planted violations need them: the real paired module, plus a class whose
# name is all capitals and a constant made by a call (real modules hold neither today).
PLANTED = {PAIRED: (PACKAGE_ROOT / "uwsgi_layouts" / "bench" / "paired.py").read_text()
           + "\n\nclass TLS:\n    @classmethod\n    def of(cls, x):\n        return x > 1.25\n"
           + "\n\nDEFAULT_RULE = Rule(0.05)\n"}
# The guard's holes until c4dc2c7 (its guard let each of these through; shown once by running it on
# them): the summary made by any report module, a judging module or class handed on (getattr, an
# alias, a default), a class told by its letter case, a constant made by a call, packages, star
# imports, a judge re-exported by a module of the report.
GUARD2_HOLES = [
    ("from uwsgi_layouts.bench.summary import summarize\ns = summarize(results)\n",
     "calls summarize of uwsgi_layouts.bench.summary", None),
    ("from uwsgi_layouts.bench.doctor_summary import summarize\nfound = summarize(results).diagnoses[0].findings\n",
     "calls summarize of uwsgi_layouts.bench.doctor_summary", None),
    ("from uwsgi_layouts.bench import analysis\njudge = getattr(analysis, 'compare_groups')\n",
     "hands on module uwsgi_layouts.bench.analysis", None),
    ("from uwsgi_layouts.bench import analysis\nan = analysis\nx = an.compare_groups(a, b, 'rps')\n",
     "hands on module uwsgi_layouts.bench.analysis", None),
    ("from uwsgi_layouts.bench.readings import TargetReading\nTR = TargetReading\n"
     "t = TR.of('throughput', 'rps', c, 1.25, False)\n", "hands on class TargetReading of uwsgi_layouts.bench.readings",
     None),
    ("from uwsgi_layouts.bench import paired\nf = lambda a, b, m=paired: m.outcome_of(a, b, True, 0.05)\n",
     "hands on module uwsgi_layouts.bench.paired", None),
    ("from uwsgi_layouts.bench.paired import TLS\nt = TLS.of(x)\n", "calls TLS.of of uwsgi_layouts.bench.paired",
     PLANTED),
    ("from uwsgi_layouts.bench import paired\nt = paired.TLS.of(x)\n", "calls TLS.of of uwsgi_layouts.bench.paired",
     PLANTED),
    ("from uwsgi_layouts.bench.paired import DEFAULT_RULE\nalpha = DEFAULT_RULE.alpha_at(rounds)\n",
     "calls DEFAULT_RULE.alpha_at of uwsgi_layouts.bench.paired", PLANTED),
    ("from uwsgi_layouts import bench\nx = bench.analysis.compare_groups(a, b, 'rps')\n",
     "calls compare_groups of uwsgi_layouts.bench.analysis", None),
    ("import uwsgi_layouts.bench as b\nx = b.paired.outcome_of(1, 2, True, 0.05)\n",
     "calls outcome_of of uwsgi_layouts.bench.paired", None),
    ("from uwsgi_layouts import bench\nb = bench\n", "hands on module uwsgi_layouts.bench", None),
    ("from ..analysis import *\nx = compare_groups(a, b, 'rps')\n", "imports * from uwsgi_layouts.bench.analysis",
     None),
    ("from uwsgi_layouts.bench.report import hosts\ncosts = hosts.tls_costs(results)\n",
     "calls tls_costs of uwsgi_layouts.bench.report.hosts", None),
]


@pytest.mark.parametrize("source, says", [
    ("from uwsgi_layouts.bench.analysis import compare_groups\nx = compare_groups(a, b, 'rps')\n",
     "calls compare_groups"),
    ("from uwsgi_layouts.bench.readings import paired\nx = paired(a, b, f)\n", "calls paired"),
    ("from uwsgi_layouts.bench.paired import outcome_of\nx = outcome_of(1, 2, True, 0.05)\n", "calls outcome_of"),
    ("SATURATED = 0.9\n", "threshold SATURATED"),
    ("from uwsgi_layouts.bench.analysis import SATURATED\nok = share >= SATURATED\n", "judges share >= SATURATED"),
    ("ok = c.ratio > 1\n", "judges c.ratio > 1"),
    ("ok = stat.n < 3\n", "judges stat.n < 3"),
    ("ok = touched >= 1.0\n", "judges touched >= 1.0"),
    # A judging module imported whole, its function called (or handed on) as an attribute.
    ("from uwsgi_layouts.bench import analysis\nx = analysis.compare_groups(a, b, 'rps')\n",
     "calls compare_groups of uwsgi_layouts.bench.analysis"),
    ("import uwsgi_layouts.bench.paired as p\nx = p.outcome_of(1, 2, True, 0.05)\n",
     "calls outcome_of of uwsgi_layouts.bench.paired"),
    ("import uwsgi_layouts.bench.analysis\nx = uwsgi_layouts.bench.analysis.memory_cost(r, 'article')\n",
     "calls memory_cost of uwsgi_layouts.bench.analysis"),
    ("from uwsgi_layouts.bench.analysis import groups\nx = groups.compare_groups(a, b)\n",
     "calls compare_groups of uwsgi_layouts.bench.analysis.groups"),
    ("from ..analysis import memory\nx = memory.memory_cost(r, 'article')\n",
     "calls memory_cost of uwsgi_layouts.bench.analysis.memory"),
    ("from uwsgi_layouts.bench import analysis\nbest = max(groups, key=analysis.steady_min)\n",
     "uses steady_min of uwsgi_layouts.bench.analysis"),
    ("from uwsgi_layouts.bench.analysis import memory_cost\nfits = map(memory_cost, scenarios)\n",
     "uses memory_cost of uwsgi_layouts.bench.analysis"),
    ("from uwsgi_layouts.bench import paired\nx = paired.outcome_of(1, 2, True, 0.05)\n", "calls outcome_of"),
    # Tune's search and doctor's judge: the report renders their stored summaries instead.
    ("from uwsgi_layouts.bench.tune import record\noutcome = record.outcome_of(results)\n",
     "calls outcome_of of uwsgi_layouts.bench.tune.record"),
    ("from uwsgi_layouts.bench.doctor_summary import judge\nj = judge(diagnosis)\n",
     "calls judge of uwsgi_layouts.bench.doctor_summary"),
    ("from uwsgi_layouts.bench.diagnosis import findings\nfound = findings(d)\n", "calls findings"),
    # An outcome tested by equality, or against bare words.
    ("decided = c.outcome == 'better'\n", "judges an outcome: c.outcome == 'better'"),
    ("if 'worse' != c.outcome:\n    pass\n", "judges an outcome: 'worse' != c.outcome"),
    ("from uwsgi_layouts.bench.paired import Direction\nok = c.outcome == Direction.BETTER\n",
     "judges an outcome: c.outcome == Direction.BETTER"),
    ("ok = lv.direction != PairDirection.FAILS\n", "judges an outcome"),
    ("ok = run['verdict'] == 'pass'\n", "judges an outcome: run['verdict'] == 'pass'"),
    ("decided = c.outcome in ('better', 'worse')\n", "judges an outcome"),
    ("met = [t for t in targets if t.state == TargetState.MET]\n", "judges an outcome"),
] + HOLES + [(source, says) for source, says, _ in GUARD2_HOLES])
def test_the_rules_catch_a_judgement_put_back(source, says):
    assert any(says in v for v in violations(source)), violations(source)


@pytest.mark.parametrize("source, says, planted", [x for x in GUARD2_HOLES if x[2] is not None])
def test_the_rules_read_what_a_judging_module_defines(source, says, planted):
    """A class is told by its module's ClassDef (not by its name's letter case), a constant made by
    a call by its assignment: their methods are checked, read from the judging module's source."""
    found = violations(source, planted=planted)
    assert any(says in v for v in found), found


def test_the_summary_is_made_in_one_place_only():
    """``summarize`` is allowed to ``bench.report.__init__``'s ``judged`` and to no other module."""
    source = "from uwsgi_layouts.bench.summary import summarize\ns = summarize(results)\n"
    assert violations(source, _allowed_in("__init__.py")) == []
    assert violations(source, _allowed_in("compare.py"))


@pytest.mark.parametrize("source", [
    "WIDTH = 100\n",
    "MAX_REQUEST_ROWS = 20\nmore = len(requests) > MAX_REQUEST_ROWS\n",
    "text = 's' if n != 1 else ''\nshow = stat.n > 1\n",
    # Wording an outcome: ``is`` one member, ``in`` members; a reading from its own module.
    "from uwsgi_layouts.bench.paired import Direction\nif c.outcome is Direction.BETTER:\n    word = 'ahead'\n",
    "ahead = f'{t.side} ahead' if t.side in (Side.UWSGI, Side.PEER) else str(t.side)\n",
    "from uwsgi_layouts.bench import analysis\nrows = analysis.group_cells(results, sc)\nkey = analysis.MEMORY_KEY\n",
    "from uwsgi_layouts.bench import analysis\ng: analysis.Group = analysis.group_cells(results)[0]\n",
    # Equality on what is no outcome: a format, a figure's name, the run's kind.
    "if fmt == 'png':\n    pass\nname = 'throughput' if c.figure == 'rps' else c.figure\nok = results.kind == 'tune'\n",
    "chosen = [s for s in steps if s.verdict == verdict]\n",
    # An enum member or a class's constant is no method; a reading from its own module under another name.
    "from uwsgi_layouts.bench.readings import Side\nahead = t.side is Side.UWSGI\nname = Side.PEER.value\n",
    "from uwsgi_layouts.bench.verdict import ARTICLE\ntitle = ARTICLE.title()\n",
    # A class in an isinstance test or made as a record, a written-out constant read, an annotation.
    "from uwsgi_layouts.bench.readings import TargetMatchup\nok = isinstance(m, TargetMatchup)\n",
    "from uwsgi_layouts.bench.readings import TargetMatchup\nok = isinstance(m, (TargetMatchup, str))\n",
    "from uwsgi_layouts.bench.readings.hosts import DEFAULT_TLS\nname = DEFAULT_TLS.upper()\n",
    "from uwsgi_layouts.bench import summary\ndef f(s: summary.Summary) -> summary.Best:\n    return s.bests[0]\n",
])
def test_the_rules_let_rendering_be(source):
    assert violations(source) == []


@pytest.mark.parametrize("source", [
    # a constant made by a call: its fields are data, only its methods are checked
    "from uwsgi_layouts.bench.paired import DEFAULT_RULE\nmargin = DEFAULT_RULE.margin\n",
    "from uwsgi_layouts.bench.paired import TLS\nok = isinstance(x, TLS)\n",
])
def test_the_rules_let_data_of_a_judging_module_be(source):
    assert violations(source, planted=PLANTED) == []


def _enum_fields(cls, seen: set) -> set[str]:
    """The names of every enum-typed field reachable from the dataclass ``cls``."""
    if cls in seen or not dataclasses.is_dataclass(cls):
        return set()
    seen.add(cls)
    out = set()
    for name, hint in typing.get_type_hints(cls).items():
        for inner in (hint, *_inner_types(hint)):
            if isinstance(inner, type) and issubclass(inner, enum.Enum):
                out.add(name)
            out |= _enum_fields(inner, seen)
    return out


def _inner_types(hint) -> list:
    args = typing.get_args(hint)
    return [x for a in args for x in (a, *_inner_types(a))]


def test_every_outcome_of_the_summary_is_named():
    """Every enum a stored judgement holds (summary.json's, plan.json's) is in OUTCOMES, or said
    to be no outcome: a new outcome cannot be tested with ``==`` unseen."""
    found = _enum_fields(Summary, set()) | _enum_fields(PlanJudgement, set())
    assert found - NOT_OUTCOMES <= OUTCOMES, sorted(found - NOT_OUTCOMES - OUTCOMES)
    assert NOT_OUTCOMES <= found  # an exception for a field that is gone is taken off


def test_the_guard_reads_the_imports_it_must():
    """The module resolution the rules rest on: whole modules, packages, relative imports, names
    followed to where they are defined (``Stat`` of ``bench.analysis`` is ``bench.analysis.tails``'s)."""
    local, stars = _imports(ast.parse(
        "from uwsgi_layouts.bench import analysis\nfrom ..paired import Direction\n"
        "from uwsgi_layouts.bench.analysis import groups, group_cells, Stat, MEMORY_KEY\n"
        "import uwsgi_layouts.bench.verdict as v\nimport uwsgi_layouts.bench\nfrom uwsgi_layouts import bench\n"),
        Sources())
    kinds = {name: (r.entity.kind, r.entity.home, r.module) for name, r in local.items()}
    assert kinds == {
        "analysis": ("module", "uwsgi_layouts.bench.analysis", "uwsgi_layouts.bench"),
        "Direction": ("class", "uwsgi_layouts.bench.paired", "uwsgi_layouts.bench.paired"),
        "groups": ("module", "uwsgi_layouts.bench.analysis.groups", "uwsgi_layouts.bench.analysis"),
        "group_cells": ("function", "uwsgi_layouts.bench.analysis.groups", "uwsgi_layouts.bench.analysis"),
        "Stat": ("class", "uwsgi_layouts.bench.analysis.tails", "uwsgi_layouts.bench.analysis"),
        "MEMORY_KEY": ("literal", kinds["MEMORY_KEY"][1], "uwsgi_layouts.bench.analysis"),
        "v": ("module", "uwsgi_layouts.bench.verdict", "uwsgi_layouts.bench.verdict"),
        "uwsgi_layouts": ("module", "uwsgi_layouts", "uwsgi_layouts"),
        "bench": ("module", "uwsgi_layouts.bench", "uwsgi_layouts"),
    }
    assert stars == []


def test_every_reading_is_used_by_some_report_module():
    """An allowance no report module uses is taken off (it would let a judgement back unseen)."""
    used = {(m, (r.module, r.name)) for m in MODULES for _, how, r in uses((REPORT / m).read_text())[0]}
    everywhere = {reading for _, reading in used}
    assert sorted(READINGS - everywhere) == []
    for module, allowed in JUDGES_ONCE.items():
        assert sorted(r for r in allowed if (module, r) not in used) == [], module
