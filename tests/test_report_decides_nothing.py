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
  ``from uwsgi_layouts.bench import analysis``, relative imports included), or a method of one of
  their classes (``TargetReading.of``, ``readings.Matters.of``), called or handed on
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
# What the report may call from the judging modules, as (the module it is taken from, its name
# there; a class's method as "Class.method"): the readings they hand out (each builds, or reads,
# typed judgements as data), loaders of what a run stored, and helpers that judge nothing (grouping,
# label parsing, words). A name is allowed from its module only: the same name from another
# judging module is another function.
ANALYSIS, READING = "uwsgi_layouts.bench.analysis", "uwsgi_layouts.bench.readings"
VERDICT = "uwsgi_layouts.bench.verdict"
READINGS = {
    # each kind's summary (made once per report when a run stored none: bench.report.judged)
    ("uwsgi_layouts.bench.summary", "summarize"), ("uwsgi_layouts.bench.summary", "claim_verdict"),
    ("uwsgi_layouts.bench.tune.summary", "summarize"), ("uwsgi_layouts.bench.doctor_summary", "summarize"),
    # the readings compare's sections render
    (READING, "peer_readings"), (READING, "target_readings"), (READING, "files_blocks"), (READING, "mixed_blocks"),
    (READING, "reuseport_blocks"), (READING, "tls_costs"), (READING, "plan_judgement"),
    (ANALYSIS, "mechanism_of"), (ANALYSIS, "unpaired_note"),
    # grouping, label parsing and words: no judgement
    (ANALYSIS, "group_cells"), (ANALYSIS, "requests_for_p99"), (ANALYSIS, "Stat.of"),
    (READING, "cells_by_repeat"), (READING, "without"), (READING, "variant_options"),
    ("uwsgi_layouts.bench.paired", "percent"), (VERDICT, "confidence_words"),
    ("uwsgi_layouts.bench.diagnosis", "layout_words"),
    # what the run recorded of its app and requests
    (VERDICT, "app_record"), (VERDICT, "mixes"), (VERDICT, "is_demo_run"),
    # a capacity plan's stored steps and plan, read back (its judgement is plan_judgement's)
    ("uwsgi_layouts.bench.capacity", "RateStep.from_dict"), ("uwsgi_layouts.bench.capacity", "Plan.from_dict"),
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


def _judging_imports(tree: ast.Module) -> tuple[dict[str, tuple[str, str]], dict[str, str]]:
    """(names, modules): local name -> (judging module, its name there) for the names imported
    from one (``from bench.analysis import compare_groups``; ``... import outcome_of as percent``
    is ``outcome_of``), and local name -> module for the judging modules imported whole
    (``from uwsgi_layouts.bench import analysis``, ``import uwsgi_layouts.bench.paired as paired``,
    ``from bench.analysis import groups``)."""
    names, modules = {}, {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = _absolute(node)
            for alias in node.names:
                full, local = f"{base}.{alias.name}", alias.asname or alias.name
                if _judging(full) and _is_module(full):
                    modules[local] = full
                elif _judging(base):
                    names[local] = (base, alias.name)
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


def _class_name(name: str) -> bool:
    """``TargetReading``, ``Stat``: a class's name (a constant's, ``ARTICLE``, is all upper case)."""
    return name[:1].isupper() and not name.isupper()


def _owner(node: ast.expr, names: dict[str, tuple[str, str]], modules: dict[str, str]) -> tuple[str, str] | None:
    """(judging module, prefix) when ``node`` names a judging module (prefix "") or a class of one
    (``TargetReading``, ``readings.Matters``: prefix "TargetReading."), whose attributes a use reaches."""
    if isinstance(node, ast.Name) and node.id in names and _class_name(names[node.id][1]):
        module, cls = names[node.id]
        return module, f"{cls}."
    if isinstance(node, ast.Attribute) and _class_name(node.attr):
        module = _module_of(node.value, modules)
        return None if module is None else (module, f"{node.attr}.")
    module = _module_of(node, modules)
    return None if module is None else (module, "")


def _allowed(module: str, name: str) -> bool:
    """A reading the report may use: this name from this module (``READINGS``)."""
    return (module, name) in READINGS


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
        # A class, an enum or a constant by its name is no call (a constant's use is the threshold rule's).
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in imported:
            module, name = imported[node.id]
            if not _allowed(module, name) and not name[:1].isupper():
                found.append(f"line {node.lineno}: {'calls' if id(node) in called else 'uses'} {name} of {module}")
        # ... or as an attribute of its module (``analysis.compare_groups(...)``), or a method of one of
        # its classes (``TargetReading.of(...)``, ``map(readings.Matters.of, ...)``); an enum member or
        # a class constant (upper case) is none.
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load) and not node.attr[:1].isupper():
            owner = _owner(node.value, imported, modules)
            if owner is not None:
                module, name = owner[0], owner[1] + node.attr
                if not _allowed(module, name) and not _is_module(f"{module}.{name}"):
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
] + HOLES)
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
    # An enum member or a class's constant is no method; a reading from its own module under another name.
    "from uwsgi_layouts.bench.readings import Side\nahead = t.side is Side.UWSGI\nname = Side.PEER.value\n",
    "from uwsgi_layouts.bench.summary import summarize as judged_once\ns = judged_once(results)\n",
    "from uwsgi_layouts.bench.verdict import ARTICLE\ntitle = ARTICLE.title()\n",
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
    assert names == {"Direction": ("uwsgi_layouts.bench.paired", "Direction"),
                     "group_cells": ("uwsgi_layouts.bench.analysis", "group_cells")}
