"""Tune's and doctor's stored summaries (``bench.tune.summary``, ``bench.doctor_summary``): what a
run concluded is judged once, stored as summary.json beside results.json, loaded back unchanged,
and rendered by every view (report.txt, report.md, tune's plot) without judging again. A summary
that cannot be trusted (tampered, another kind's, an unknown version) is refused with one line,
exit 2, nothing written; a run stored without one is judged again and says so in one line.

The tune run is SYNTHETIC (``tests/tunefakes.py``: a fake measure and clock, nothing timed);
the doctor run is ``fixtures/results-v2-doctor.json`` (real samples, synthetic memory).
``fixtures/summary-tune.json`` and ``fixtures/summary-doctor.json`` are the summaries of
``fixtures/results-tune.json`` and of that doctor run, as the kinds store them.
"""

from __future__ import annotations

import ast
import copy
import json
import shutil
from pathlib import Path

import pytest

from tests.tunefakes import fake_run
from uwsgi_layouts.bench import doctor_summary
from uwsgi_layouts.bench.cli import main
from uwsgi_layouts.bench.doctor_summary import DoctorSummary
from uwsgi_layouts.bench.paired import Direction
from uwsgi_layouts.bench.report import markdown_lines, terminal_lines
from uwsgi_layouts.bench.results import ResultsError, load
from uwsgi_layouts.bench.summary import SUMMARY_NAME, to_data
from uwsgi_layouts.bench.tune import record
from uwsgi_layouts.bench.tune.summary import TuneSummary, summarize

FIXTURES = Path(__file__).parent / "fixtures"
TUNE_RESULTS = FIXTURES / "results-tune.json"
TUNE_SUMMARY = FIXTURES / "summary-tune.json"
DOCTOR_RESULTS = FIXTURES / "results-v2-doctor.json"
DOCTOR_SUMMARY = FIXTURES / "summary-doctor.json"
REPORT = Path(__file__).resolve().parent.parent / "uwsgi_layouts" / "bench" / "report"
# What the tune and doctor reports would call to judge (or to take the search again).
JUDGES = {"outcome_of", "replay", "tune_cautions", "pod_sizing", "decide", "why_lost", "rps_comparison", "judge",
          "findings", "growth_quotable", "tune_command", "demand", "queue_matters"}
FIXTURE_RUN = {"concurrency": "4", "p99_ms": "400", "strategies": "mapped,shared", "max_processes": "3",
               "threads": "1,2,4", "stall_share": "0.05", "cpus": "2"}


def _views(results, summary=None) -> tuple[list[str], list[str]]:
    return terminal_lines(results, summary), markdown_lines(results, ["p"], summary)


def _run_dir(tmp_path: Path, results: Path, summary: Path | None) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(results, run / "results.json")
    if summary is not None:
        shutil.copy(summary, run / SUMMARY_NAME)
    return run


@pytest.fixture
def no_judging(monkeypatch):
    """Taking tune's search again, or doctor's findings, fails the test."""
    def judged(*args, **kwargs):
        raise AssertionError("judged again")

    monkeypatch.setattr(record, "replay", judged)
    monkeypatch.setattr(doctor_summary, "findings", judged)


# ------------------------------------------------------------------------------ judge -> store -> load -> render


def test_a_tune_summary_round_trips_and_renders_byte_for_byte(tmp_path):
    results, outcome, *_ = fake_run(**FIXTURE_RUN)
    judged = summarize(results, outcome)
    assert judged == summarize(results)  # the live search and its replay conclude the same
    loaded = TuneSummary.load(judged.save(tmp_path / SUMMARY_NAME))
    assert loaded == judged and to_data(loaded) == to_data(judged)
    assert loaded.matches(results) and loaded.choice.chosen == outcome.chosen.spec
    assert loaded.choice.against and all(isinstance(a.rps.outcome, Direction) for a in loaded.choice.against)
    assert isinstance(loaded.candidates, tuple) and isinstance(loaded.search.stages[0].candidates, tuple)
    assert loaded.pod is not None and loaded.pod.layout == loaded.choice.chosen
    assert any(c.stall is not None for c in loaded.candidates)
    assert _views(results, loaded) == _views(results, judged) == _views(results)


def test_a_doctor_summary_round_trips_and_renders_byte_for_byte(tmp_path):
    results = load(DOCTOR_RESULTS)
    judged = doctor_summary.summarize(results)
    loaded = DoctorSummary.load(judged.save(tmp_path / SUMMARY_NAME))
    assert loaded == judged and loaded.matches(results)
    (j,) = loaded.diagnoses
    assert [f.name for f in j.findings] == [f["name"] for f in results.diagnoses[0].findings]
    assert j.tune.startswith("uwsgi-layouts tune --concurrency") and j.growth_quoted == ("1", "2")
    assert _views(results, loaded) == _views(results, judged) == _views(results)


def test_the_stored_fixtures_are_what_is_judged_of_their_results():
    assert TuneSummary.load(TUNE_SUMMARY) == summarize(load(TUNE_RESULTS))
    assert DoctorSummary.load(DOCTOR_SUMMARY) == doctor_summary.summarize(load(DOCTOR_RESULTS))
    assert TuneSummary.load(TUNE_SUMMARY).matches(load(TUNE_RESULTS))
    assert json.loads(TUNE_RESULTS.read_text())["environment"]["_comment"].startswith("SYNTHETIC")


# ------------------------------------------------------------------------------ rendered from the stored summary


def test_report_renders_a_tune_run_from_its_summary_without_taking_the_search_again(tmp_path, no_judging, capsys):
    run = _run_dir(tmp_path, TUNE_RESULTS, TUNE_SUMMARY)
    data = json.loads(TUNE_SUMMARY.read_text())
    data["choice"]["why"] = "what the stored summary says"  # the report words the file, not a new judgement
    (run / SUMMARY_NAME).write_text(json.dumps(data))
    assert main(["report", str(run)]) == 0
    assert capsys.readouterr().err == ""
    text, md = (run / "report.txt").read_text(), (run / "report.md").read_text()
    assert "what the stored summary says" in " ".join(text.split()) and "what the stored summary says" in md
    assert (run / "p99-throughput.png").stat().st_size > 0


def test_report_renders_a_doctor_run_from_its_summary_without_judging_again(tmp_path, no_judging, capsys):
    run = _run_dir(tmp_path, DOCTOR_RESULTS, DOCTOR_SUMMARY)
    data = json.loads(DOCTOR_SUMMARY.read_text())
    data["diagnoses"][0]["findings"][0]["text"] = "what the stored summary found"
    data["diagnoses"][0]["growth_quoted"] = ["2"]
    (run / SUMMARY_NAME).write_text(json.dumps(data))
    assert main(["report", str(run)]) == 0
    assert capsys.readouterr().err == ""
    text = (run / "report.txt").read_text()
    assert "1. what the stored summary found" in text
    assert "51.7 (+100/h)" not in text and "52.0 (+0/h)" in text  # growth quoted for worker 2 only, as stored


@pytest.mark.parametrize("results, summary, cls", [(TUNE_RESULTS, TUNE_SUMMARY, TuneSummary),
                                                    (DOCTOR_RESULTS, DOCTOR_SUMMARY, DoctorSummary)])
def test_every_view_renders_the_stored_summary_and_they_agree(results, summary, cls):
    results, summary = load(results), cls.load(summary)
    text, md = _views(results, summary)
    flat, md_text = " ".join(" ".join(text).split()), "\n".join(md)
    if cls is TuneSummary:
        chosen, runner_up = summary.choice.chosen, summary.choice.runner_up
        assert f"RECOMMENDATION: {chosen}: " in flat and f"**Recommendation:** {chosen}: " in md_text
        # the table marks the recommended layout, and only it, as chosen; the runner-up's row says why it lost
        rows = [line for line in md if line.startswith("| ") and line.rstrip().endswith("| chosen |")]
        assert len(rows) == 1 and rows[0].startswith(f"| {chosen} ")
        assert f"{chosen}: chosen" in flat and f"{runner_up}: {' '.join(summary.choice.why.split())}" in flat
        assert f"POD: for a pod of 2 CPU (limits.cpu 2000m), run {chosen}" in flat
    else:
        (j,) = summary.diagnoses
        for i, f in enumerate(j.findings, 1):
            assert f"{i}. {' '.join(f.text.split())}" in flat and f"{i}. {f.text}" in md_text
        assert f"  {j.tune}" in text and f"```sh\n{j.tune}\n```" in md_text


# ------------------------------------------------------------------------------ refused, or judged again and said


def _tune_tampered(data: dict, change: str) -> None:
    if change == "version":
        data["version"] = 99
    elif change == "kind":
        data["kind"] = "compare"
    elif change == "stage":
        data["candidates"][0]["reached"] = 9
    elif change == "chosen":
        data["choice"]["chosen"] = data["choice"]["closest"] = "9x9-nowhere"
    elif change == "outcome":
        data["choice"]["against"][0]["rps"]["outcome"] = "much better"
    elif change == "interval":  # a word its interval does not say
        data["choice"]["against"][0]["rps"]["outcome"] = "better"
    elif change == "rule":
        data["pruned"][0]["rule"] = "whim"


def _doctor_tampered(data: dict, change: str) -> None:
    if change == "version":
        data["version"] = 2
    elif change == "finding":
        data["diagnoses"][0]["findings"][0]["name"] = "bad-luck"
    elif change == "tune":
        data["diagnoses"][0]["tune"] = 42


@pytest.mark.parametrize("kind, change, says", [
    ("tune", "version", "version: this tool reads tune summary version 1, got 99"),
    ("tune", "kind", "kind: a summary of a 'compare' run, beside the results of a tune run"),
    ("tune", "stage", "reached: a measured candidate reached stage 1, 2, 3, got 9"),
    ("tune", "chosen", "choice.chosen: 9x9-nowhere is not a measured candidate"),
    ("tune", "outcome", "outcome: must be one of better, worse, equivalent, undecided, got 'much better'"),
    ("tune", "interval", "against: 2x4-mapped's outcome against the choice is better, but its interval 0.90–1.01 says "
                         "undecided"),
    ("tune", "rule", "pruned: rule must be one of threads, idle-threads, duplicate, memory, got 'whim'"),
    ("tune", "not json", "not a readable summary"),
    ("doctor", "version", "version: this tool reads doctor summary version 1, got 2"),
    ("doctor", "finding", "name: a finding is one of stats-exposed"),
    ("doctor", "tune", "Judgement.tune: expected str, got 42"),
])
def test_a_summary_that_cannot_be_trusted_is_refused_in_one_line(tmp_path, capsys, kind, change, says):
    results, summary = (TUNE_RESULTS, TUNE_SUMMARY) if kind == "tune" else (DOCTOR_RESULTS, DOCTOR_SUMMARY)
    run = _run_dir(tmp_path, results, None)
    if change == "not json":
        (run / SUMMARY_NAME).write_text('{"version": 1, "kind": "tune",')
    else:
        data = copy.deepcopy(json.loads(summary.read_text()))
        (_tune_tampered if kind == "tune" else _doctor_tampered)(data, change)
        (run / SUMMARY_NAME).write_text(json.dumps(data))
    assert main(["report", str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and says in err[0], err
    assert {p.name for p in run.iterdir()} == {"results.json", SUMMARY_NAME}  # nothing written


def test_loading_says_which_file_and_field():
    with pytest.raises(ResultsError, match=r"summary-tune.json: kind: a summary of a 'tune' run, beside the results "
                                           r"of a doctor run"):
        DoctorSummary.load(TUNE_SUMMARY)


@pytest.mark.parametrize("results, summarize_it", [(TUNE_RESULTS, summarize),
                                                   (DOCTOR_RESULTS, doctor_summary.summarize)])
def test_a_run_stored_without_a_summary_is_judged_again_and_says_so(tmp_path, capsys, results, summarize_it):
    run = _run_dir(tmp_path, results, None)
    assert main(["report", str(run)]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no summary.json beside the results" in err[0] and "judged again" in err[0]
    loaded = load(run / "results.json")
    assert (run / "report.txt").read_text() == "\n".join(terminal_lines(loaded, summarize_it(loaded))) + "\n"
    assert not (run / SUMMARY_NAME).exists()  # an older run is read, never rewritten


def test_a_summary_of_other_results_is_not_used_and_said(tmp_path, capsys):
    run = _run_dir(tmp_path, DOCTOR_RESULTS, DOCTOR_SUMMARY)
    data = json.loads(DOCTOR_SUMMARY.read_text())
    data["created"] = "2020-01-01T00:00:00+00:00"
    data["diagnoses"][0]["findings"][0]["text"] = "another run's finding"
    (run / SUMMARY_NAME).write_text(json.dumps(data))
    assert main(["report", str(run)]) == 0
    err = capsys.readouterr().err
    assert "is not this results file's summary (made from 1 diagnoses of 2020-01-01" in err
    assert "another run's finding" not in (run / "report.txt").read_text()


# ------------------------------------------------------------------------------ the report modules judge nothing


@pytest.mark.parametrize("name", ["tune.py", "doctor.py"])
def test_the_tune_and_doctor_reports_call_no_judge(name):
    tree = ast.parse((REPORT / name).read_text())
    imported = {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                for alias in node.names}
    called = {node.func.id for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)}
    assert not (imported | called) & JUDGES, sorted((imported | called) & JUDGES)
