"""The specs tune's and doctor's reports are built into (``bench.report.tune.TuneSpec`` and
``RecommendedFiles``, ``bench.report.doctor.DiagnosisSpec`` and ``Figures``) refuse on creation
what a writer would otherwise write wrong: a string where a tuple of lines is expected (written
letter by letter), a row longer or shorter than its headers, an alignment for another number of
columns. A results.json whose recommended files are of the wrong shape is refused in one line.
Specs built from the stored fixtures pass (they are the ones every report renders)."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from uwsgi_layouts.bench.cli import main
from uwsgi_layouts.bench.diagnosis import Finding
from uwsgi_layouts.bench.doctor_summary import DoctorSummary
from uwsgi_layouts.bench.report.doctor import DiagnosisSpec, Figures, specs
from uwsgi_layouts.bench.report.tune import RecommendedFiles, TuneSpec, tune_spec
from uwsgi_layouts.bench.results import ResultsError, load
from uwsgi_layouts.bench.tune.summary import TuneSummary

FIXTURES = Path(__file__).parent / "fixtures"
TUNE = load(FIXTURES / "results-tune.json")
DOCTOR = load(FIXTURES / "results-v2-doctor.json")
RECOMMENDED = {"dir": "recommended", "files": ["uwsgi.ini", "nginx.conf"], "bundle": "", "serve": "make serve",
               "note": "copy them", "install": ""}


def _figures(**changes) -> Figures:
    fields = {"text_title": "Workers", "title": "Workers", "headers": ("worker", "requests"),
              "rows": (("1", "10"), ("2", "12")), "align": "<>", "note": ""}
    return Figures(**{**fields, **changes})


def _tune() -> TuneSpec:
    return tune_spec(TUNE, TuneSummary.load(FIXTURES / "summary-tune.json"))


def test_the_stored_runs_build_valid_specs():
    spec = _tune()
    assert spec.rows and all(len(r) == len(spec.headers) for r in spec.rows)
    built = specs(DOCTOR, DoctorSummary.load(FIXTURES / "summary-doctor.json"))
    assert built and all(len(s.workers.align) == len(s.workers.headers) for s in built)
    assert _figures().rows == (("1", "10"), ("2", "12"))


@pytest.mark.parametrize("changes, says", [
    ({"rows": (("1", "10"), ("2",))}, "figures.rows[1]: 1 cells, the headers name 2"),
    ({"align": "<>>"}, "figures.align: 2 of '<' or '>'"),
    ({"align": "<|"}, "figures.align"),
    ({"headers": "worker"}, "figures.headers: a tuple of strings"),
    ({"rows": [("1", "10")]}, "figures.rows: a tuple of rows"),
    ({"rows": (("1", 10),)}, "figures.rows[0]: a tuple of strings"),
    ({"text_title": ["Workers"]}, "text_title: a string"),
    ({"note": None}, "note: a string"),
])
def test_a_table_of_the_wrong_shape_is_refused(changes, says):
    with pytest.raises(ValueError, match=_escaped(says)):
        _figures(**changes)


def _escaped(text: str) -> str:
    return "".join("\\" + c if c in "[]().*+?|^$" else c for c in text)


@pytest.mark.parametrize("changes, says", [
    ({"facts": "uWSGI 2.0"}, "facts: a tuple of strings"),
    ({"findings": ("none",)}, "findings: a tuple of Finding"),
    ({"access_tables": [_figures()]}, "access_tables"),
    ({"tune": None}, "tune: a string"),
])
def test_a_diagnosis_spec_of_the_wrong_shape_is_refused(changes, says):
    fields = {"facts": ("uWSGI 2.0",), "findings": (Finding("queue", "seen", "do"),), "tune": "", "workers": _figures(),
              "queues": _figures(), "access": "", "access_tables": ()}
    DiagnosisSpec(**fields)
    with pytest.raises(ValueError, match=_escaped(says)):
        DiagnosisSpec(**{**fields, **changes})


@pytest.mark.parametrize("changes, says", [
    ({"answer": "pick 2x4"}, "answer: a tuple of strings"),
    ({"rows": (("a",),)}, "candidates.rows[0]: 1 cells"),
    ({"head": None}, "head: a string"),
    ({"space": -1}, "space, pruned_count: 0 or more"),
    ({"files": {"dir": "x"}}, "files: RecommendedFiles or None"),
])
def test_a_tune_spec_of_the_wrong_shape_is_refused(changes, says):
    with pytest.raises(ValueError, match=_escaped(says)):
        replace(_tune(), **changes)


def _with_recommended(recommended) -> object:
    return replace(TUNE, arguments={**TUNE.arguments, "tune": {**TUNE.arguments["tune"], "recommended": recommended}})


def test_recommended_files_are_read_and_checked():
    files = RecommendedFiles.of(_with_recommended(RECOMMENDED))
    assert files.files == ("uwsgi.ini", "nginx.conf") and files.dir == "recommended"
    assert RecommendedFiles.of(TUNE) is None  # the fixture recommended none
    with pytest.raises(ValueError, match="files: a tuple of strings"):
        RecommendedFiles("d", "uwsgi.ini", "", "serve", "note", "")


@pytest.mark.parametrize("recommended", [
    {**RECOMMENDED, "files": "uwsgi.ini"},  # a string: it would be listed letter by letter
    {**RECOMMENDED, "files": [1, 2]},
    {k: v for k, v in RECOMMENDED.items() if k != "serve"},
    {**RECOMMENDED, "dir": ""},
    ["uwsgi.ini"],
])
def test_stored_recommended_files_of_the_wrong_shape_are_refused_in_one_line(recommended):
    with pytest.raises(ResultsError, match=r"^arguments\.tune\.recommended: [^\n]+$"):
        RecommendedFiles.of(_with_recommended(recommended))


def test_report_refuses_a_stored_run_whose_files_are_of_the_wrong_shape_and_writes_nothing(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    data = json.loads((FIXTURES / "results-tune.json").read_text())
    data["arguments"]["tune"]["recommended"] = {**RECOMMENDED, "files": "uwsgi.ini"}
    (run / "results.json").write_text(json.dumps(data))
    shutil.copy(FIXTURES / "summary-tune.json", run / "summary.json")
    assert main(["report", str(run)]) == 2
    err = capsys.readouterr().err
    assert err == "error: arguments.tune.recommended: a mapping whose files are a list\n"
    assert sorted(p.name for p in run.iterdir()) == ["results.json", "summary.json"]  # no plot, no report
