"""The report layer decides nothing and holds no threshold (issue 37): every judgement, threshold
and comparison lives on the analysis side (``bench.analysis``, ``bench.paired``, ``bench.verdict``,
``bench.decisions``, ``bench.readings``, ``bench.diagnosis``, ``bench.tune``) and reaches the
report as data (``bench.summary.Summary``, tune's outcome and cautions, doctor's findings).

Read from the source of ``uwsgi_layouts/bench/report/`` (nothing is imported or run):

- a call into the judging modules is one of the readings they hand out (``READINGS``): never a
  comparison (``compare_groups``, ``paired``, ``outcome_of`` of ``bench.paired``...) nor a judge;
- no module-level number named like a constant (a threshold) but the presentation's own
  (``PRESENTATION``: widths, sizes);
- no ordering comparison (<, <=, >, >=) against a constant's name, a float, an integer other than
  0 and 1, or a measured figure (``.ratio``, ``.low``, ``.high``, ``.median``, ``.spread``,
  ``.value``): "is it above the threshold?" is a judgement.

Modules not converted yet are listed in ``NOT_YET`` with what they still decide, and the number
formatting in ``FORMATTING`` (digits picked by a number's size: not a verdict); each must still
break a rule (a converted one leaves the list, so the list cannot hide a new judgement).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPORT = Path(__file__).resolve().parent.parent / "uwsgi_layouts" / "bench" / "report"
JUDGING = ("uwsgi_layouts.bench.analysis", "uwsgi_layouts.bench.paired", "uwsgi_layouts.bench.verdict",
           "uwsgi_layouts.bench.decisions", "uwsgi_layouts.bench.readings", "uwsgi_layouts.bench.diagnosis",
           "uwsgi_layouts.bench.tune", "uwsgi_layouts.bench.summary", "uwsgi_layouts.bench.margin",
           "uwsgi_layouts.bench.capacity")
# What the report may call from the judging modules: the readings they hand out (each builds, or
# reads, typed judgements as data) and helpers that judge nothing (grouping, label parsing, words).
READINGS = {
    "summarize", "claim_verdict", "peer_readings", "target_readings", "files_blocks", "mixed_blocks",
    "reuseport_blocks", "tls_costs", "mechanism_of", "findings", "growth_quotable", "tune_cautions", "outcome_of",
    "memory_request_mb", "group_cells", "requests_for_p99", "layout_words", "tune_command", "variant_options",
    "without", "cells_by_repeat", "only_nginx", "percent", "confidence_words", "server_of", "unpaired_note",
    # what the run recorded of its app and requests
    "app_record", "mixes", "is_demo_run",
    # the capacity plan's stored judgement (judged again for a plan.json written before it was stored)
    "plan_judgement",
}
# A reading whose name a comparison shares is allowed from its own module only.
READING_HOMES = {"outcome_of": "uwsgi_layouts.bench.tune.record"}
# Sizes of the presentation: widths, resolutions, how many rows or bars a table or figure shows and
# where a legend takes a second column (plots.py: layout arithmetic, as text.py's digits are).
PRESENTATION = {"WIDTH", "DPI", "MAX_REQUEST_ROWS", "LABELLED_BARS", "LEGEND_COLUMN_ROWS"}
FIGURES = {"ratio", "low", "high", "median", "spread", "value"}
NOT_YET: dict[str, str] = {}  # every module converted (memory, plan, plots and openloop were the last)
FORMATTING = {"text.py": "picks digits by a number's size"}


def _judging_imports(tree: ast.Module) -> dict[str, str]:
    """Local name -> module, for names imported from the judging modules (not whole modules)."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(JUDGING):
            for alias in node.names:
                out[alias.asname or alias.name] = node.module
    return out


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


def violations(source: str) -> list[str]:
    tree = ast.parse(source)
    imported = _judging_imports(tree)
    found = []
    for node in tree.body:
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, (int, float)) and not isinstance(node.value.value, bool)):
            names = [t.id for t in node.targets if isinstance(t, ast.Name) and t.id.isupper()]
            found += [f"line {node.lineno}: threshold {n} = {node.value.value!r}" for n in names
                      if n not in PRESENTATION]
    for node in ast.walk(tree):
        name = node.func.id if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) else ""
        allowed = name in READINGS and READING_HOMES.get(name, imported.get(name)) == imported.get(name)
        if name in imported and not allowed and not name[:1].isupper():
            found.append(f"line {node.lineno}: calls {name} of {imported[name]}")
        if isinstance(node, ast.Compare) and any(isinstance(op, (ast.Lt, ast.LtE, ast.Gt, ast.GtE)) for op in node.ops):
            if any(_is_threshold(x) for x in (node.left, *node.comparators)):
                found.append(f"line {node.lineno}: judges {ast.unparse(node)}")
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
])
def test_the_rules_catch_a_judgement_put_back(source, says):
    assert any(says in v for v in violations(source)), violations(source)


@pytest.mark.parametrize("source", [
    "from uwsgi_layouts.bench.summary import summarize\ns = summarize(results)\n",
    "WIDTH = 100\n",
    "MAX_REQUEST_ROWS = 20\nmore = len(requests) > MAX_REQUEST_ROWS\n",
    "text = 's' if n != 1 else ''\nshow = stat.n > 1\n",
])
def test_the_rules_let_rendering_be(source):
    assert violations(source) == []
