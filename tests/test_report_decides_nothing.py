"""The report layer decides nothing and holds no threshold (issue 37): every judgement, threshold
and comparison lives on the analysis side (``bench.analysis``, ``bench.paired``, ``bench.verdict``,
``bench.decisions``, ``bench.readings``, ``bench.diagnosis``, ``bench.tune``) and reaches the
report as data (``bench.summary.Summary``, tune's outcome and cautions, doctor's findings).

Read from the source of ``uwsgi_layouts/bench/report/`` (its modules are read, never imported or run):

- a use of the judging modules' functions is one of the readings they hand out (``READINGS``):
  never a comparison (``compare_groups``, ``paired``, ``outcome_of`` of ``bench.paired``...) nor a
  judge, whether imported by name or reached as an attribute of the module (``analysis.memory_cost``
  after ``from uwsgi_layouts.bench import analysis``, relative imports included), called or handed on
  (``key=steady_min``);
- no module-level number named like a constant (a threshold) but the presentation's own
  (``PRESENTATION``: widths, sizes);
- no ordering comparison (<, <=, >, >=) against a constant's name, a float, an integer other than
  0 and 1, or a measured figure (``.ratio``, ``.low``, ``.high``, ``.median``, ``.spread``,
  ``.value``): "is it above the threshold?" is a judgement;
- no outcome (``OUTCOMES``: ``c.outcome``, ``lv.direction``, ``t.state``...) tested with ``==`` /
  ``!=`` against a word or an enum member, nor ``in`` a tuple of bare words: the report picks its
  words with ``is`` against one member (or ``in`` members).

Each rule is proved by a violation planted in a string that the rules must catch
(``test_the_rules_catch_a_judgement_put_back``), and rendering they must let be.

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
# What the report may call from the judging modules: the readings they hand out (each builds, or
# reads, typed judgements as data) and helpers that judge nothing (grouping, label parsing, words).
READINGS = {
    "summarize", "claim_verdict", "peer_readings", "target_readings", "files_blocks", "mixed_blocks",
    "reuseport_blocks", "tls_costs", "mechanism_of", "group_cells", "requests_for_p99", "layout_words",
    "variant_options",
    "without", "cells_by_repeat", "only_nginx", "percent", "confidence_words", "server_of", "unpaired_note",
    # what the run recorded of its app and requests
    "app_record", "mixes", "is_demo_run",
    # the capacity plan's stored judgement (judged again for a plan.json written before it was stored)
    "plan_judgement",
}
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


def _is_module(dotted: str) -> bool:
    """Whether ``dotted`` names a module or package of the project (read from the tree, not imported)."""
    path = PACKAGE_ROOT.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _absolute(node: ast.ImportFrom) -> str:
    """The module an ImportFrom reads from; a relative one as seen from a module of the report."""
    if not node.level:
        return node.module or ""
    anchor = REPORT_PACKAGE.split(".")[: len(REPORT_PACKAGE.split(".")) - node.level + 1]
    return ".".join([*anchor, node.module] if node.module else anchor)


def _judging_imports(tree: ast.Module) -> tuple[dict[str, str], dict[str, str]]:
    """(names, modules): local name -> judging module for the names imported from one
    (``from bench.analysis import compare_groups``), and local name -> module for the judging
    modules imported whole (``from uwsgi_layouts.bench import analysis``,
    ``import uwsgi_layouts.bench.paired as paired``, ``from bench.analysis import groups``)."""
    names, modules = {}, {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = _absolute(node)
            for alias in node.names:
                full, local = f"{base}.{alias.name}", alias.asname or alias.name
                if _judging(full) and _is_module(full):
                    modules[local] = full
                elif _judging(base):
                    names[local] = base
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname and _judging(alias.name):
                    modules[alias.asname] = alias.name
    return names, modules


def _module_of(node: ast.expr, modules: dict[str, str]) -> str | None:
    """The judging module an expression such as ``analysis`` or ``uwsgi_layouts.bench.analysis.groups`` names."""
    dotted = ast.unparse(node)
    if not all(part.isidentifier() for part in dotted.split(".")):
        return None
    head, _, rest = dotted.partition(".")
    if head in modules:
        full = modules[head] + (f".{rest}" if rest else "")
    else:  # ``import uwsgi_layouts.bench.analysis``, then the whole dotted name
        full = dotted
    return full if _judging(full) and _is_module(full) else None


def _allowed(name: str, module: str) -> bool:
    """A reading the report may use (by name: no comparison shares a reading's name)."""
    return name in READINGS


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


def violations(source: str) -> list[str]:
    tree = ast.parse(source)
    imported, modules = _judging_imports(tree)
    found = []
    for node in tree.body:
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, (int, float)) and not isinstance(node.value.value, bool)):
            names = [t.id for t in node.targets if isinstance(t, ast.Name) and t.id.isupper()]
            found += [f"line {node.lineno}: threshold {n} = {node.value.value!r}" for n in names
                      if n not in PRESENTATION]
    called = {id(node.func) for node in ast.walk(tree) if isinstance(node, ast.Call)}
    for node in ast.walk(tree):
        # A judging function by its imported name: called, or handed on (``key=compare_groups``).
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in imported:
            name, module = node.id, imported[node.id]
            if not _allowed(name, module) and not name[:1].isupper():
                found.append(f"line {node.lineno}: {'calls' if id(node) in called else 'uses'} {name} of {module}")
        # ... or as an attribute of its module (``analysis.compare_groups(...)``).
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            module = _module_of(node.value, modules)
            name = node.attr
            if (module is not None and not _allowed(name, module) and not name[:1].isupper()
                    and not _is_module(f"{module}.{name}")):
                found.append(f"line {node.lineno}: {'calls' if id(node) in called else 'uses'} {name} of {module}")
        if isinstance(node, ast.Compare) and any(isinstance(op, (ast.Lt, ast.LtE, ast.Gt, ast.GtE)) for op in node.ops):
            if any(_is_threshold(x) for x in (node.left, *node.comparators)):
                found.append(f"line {node.lineno}: judges {ast.unparse(node)}")
        if isinstance(node, ast.Compare) and _judges_an_outcome(node):
            found.append(f"line {node.lineno}: judges an outcome: {ast.unparse(node)}")
    return found


MODULES = sorted(p.name for p in REPORT.glob("*.py"))


@pytest.mark.parametrize("name", [m for m in MODULES if m not in NOT_YET and m not in FORMATTING])
def test_the_report_holds_no_threshold_and_calls_no_comparison(name):
    found = violations((REPORT / name).read_text())
    assert not found, f"{name} judges; move it to the analysis side and render its reading:\n" + "\n".join(found)


@pytest.mark.parametrize("name", sorted({**NOT_YET, **FORMATTING}))
def test_a_module_left_out_still_needs_its_place_on_the_list(name):
    assert (REPORT / name).is_file(), f"{name} is gone: take it off its list"
    assert violations((REPORT / name).read_text()), f"{name} decides nothing now: take it off its list"


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
])
def test_the_rules_catch_a_judgement_put_back(source, says):
    assert any(says in v for v in violations(source)), violations(source)


@pytest.mark.parametrize("source", [
    "from uwsgi_layouts.bench.summary import summarize\ns = summarize(results)\n",
    "WIDTH = 100\n",
    "MAX_REQUEST_ROWS = 20\nmore = len(requests) > MAX_REQUEST_ROWS\n",
    "text = 's' if n != 1 else ''\nshow = stat.n > 1\n",
    # Wording an outcome: ``is`` one member, ``in`` members; a reading from its own module.
    "from uwsgi_layouts.bench.paired import Direction\nif c.outcome is Direction.BETTER:\n    word = 'ahead'\n",
    "ahead = f'{t.side} ahead' if t.side in (Side.UWSGI, Side.PEER) else str(t.side)\n",
    "from uwsgi_layouts.bench.doctor_summary import summarize\nfound = summarize(results).diagnoses[0].findings\n",
    "from uwsgi_layouts.bench import analysis\nrows = analysis.group_cells(results, sc)\nkey = analysis.MEMORY_KEY\n",
    "from uwsgi_layouts.bench import analysis\ng: analysis.Group = analysis.Stat.of([1.0])\n",
    # Equality on what is no outcome: a format, a figure's name, the run's kind.
    "if fmt == 'png':\n    pass\nname = 'throughput' if c.figure == 'rps' else c.figure\nok = results.kind == 'tune'\n",
    "chosen = [s for s in steps if s.verdict == verdict]\n",
])
def test_the_rules_let_rendering_be(source):
    assert violations(source) == []


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
    """The module resolution the rules rest on: whole modules, relative imports, names."""
    names, modules = _judging_imports(ast.parse(
        "from uwsgi_layouts.bench import analysis\nfrom ..paired import Direction\n"
        "from uwsgi_layouts.bench.analysis import groups, group_cells\nimport uwsgi_layouts.bench.verdict as v\n"))
    assert modules == {"analysis": "uwsgi_layouts.bench.analysis", "groups": "uwsgi_layouts.bench.analysis.groups",
                       "v": "uwsgi_layouts.bench.verdict"}
    assert names == {"Direction": "uwsgi_layouts.bench.paired", "group_cells": "uwsgi_layouts.bench.analysis"}
