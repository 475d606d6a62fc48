"""A stored summary's readings are checked against their own figures as summary.json is read
(issue 37, ``bench.readings.contradiction``): an outcome its interval does not say is refused
with one line naming the field by its path in the file; ``report`` exits 2, with no traceback and
no report written. Every summary the analysis makes passes the same check.

SYNTHETIC data: the fixtures and the peer, nginx and hosts runs are made up (see their modules)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.test_nginx_scenarios import synthetic_results
from tests.test_peers_bench import peer_results
from tests.test_rendered_unchanged import memory_results, plan_data
from tests.test_summary_views import hosts_results
from uwsgi_layouts.bench.cli import main as bench_main
from uwsgi_layouts.bench.paired import Comparison
from uwsgi_layouts.bench.readings import contradiction, judge_plan
from uwsgi_layouts.bench.report.plan import PLAN_JSON, read_plan
from uwsgi_layouts.bench.results import ResultsError, load
from uwsgi_layouts.bench.summary import SUMMARY_NAME, Summary, summarize, to_data

FIXTURES = Path(__file__).parent / "fixtures"
RESULTS = FIXTURES / "results-tails.json"


@pytest.fixture(scope="module")
def made() -> dict:
    """name -> (results, the summary the analysis makes of them)."""
    runs = {"tails": load(RESULTS), "small": load(FIXTURES / "results-small.json"), "peers": peer_results(),
            "nginx": synthetic_results(), "hosts": hosts_results(), "memory": memory_results()}
    return {name: (results, summarize(results)) for name, results in runs.items()}


@pytest.mark.parametrize("name", ["tails", "small", "peers", "nginx", "hosts", "memory"])
def test_every_summary_the_analysis_makes_agrees_with_itself(made, name):
    assert contradiction(made[name][1]) is None


def _find(data, wanted, where: str = ""):
    """(path, object) of the first object in ``data`` for which ``wanted`` holds, its path written as
    ``contradiction`` writes it."""
    if isinstance(data, dict):
        if wanted(data):
            return where, data
        items = ((f"{where}.{k}" if where else k, v) for k, v in data.items())
    elif isinstance(data, list):
        items = ((f"{where}[{i}]", v) for i, v in enumerate(data))
    else:
        return None
    for path, value in items:
        found = _find(value, wanted, path)
        if found is not None:
            return found
    return None


def _refused(tmp_path: Path, data: dict) -> str:
    path = tmp_path / SUMMARY_NAME
    path.write_text(json.dumps(data))
    with pytest.raises(ResultsError) as err:
        Summary.load(path)
    said = str(err.value)
    assert "\n" not in said and said.startswith(f"{path}: ")
    return said.removeprefix(f"{path}: ")


def _is_comparison(outcome: str, method: str = "t"):
    return lambda d: d.get("outcome") == outcome and d.get("method") == method and "low" in d


# Each: which run, the object to edit, the edit, the field named, and what the refusal says.
TAMPERED = [
    ("tails", _is_comparison("better"), {"outcome": "worse"}, "outcome", "worse, but its interval"),
    ("tails", _is_comparison("better"), {"outcome": "equivalent"}, "outcome", "says better"),
    ("tails", _is_comparison("better"), {"low": 9.0}, "low", "above the interval's high end"),
    ("tails", _is_comparison("undecided"), {"outcome": "better"}, "outcome", "says undecided"),
    # A target against its threshold (the article's claim against the best peer): met, though its
    # interval lies wholly short of it.
    ("peers", lambda d: d.get("state") == "missed", {"state": "met"}, "state", "met, but its interval"),
    ("peers", lambda d: "rps_side" in d and d["rps_side"] == "uWSGI", {"rps_side": "peer"}, "rps_side",
     "peer, but its comparison"),
    ("peers", lambda d: d.get("answer") in ("layout", "server", "neither"), None, "answer", "but the layout's"),
    ("peers", lambda d: d.get("win") == "only", {"win": "better"}, "win", "no runner-up"),
    ("nginx", lambda d: d.get("verdict") == "miss" and "target" in d, {"verdict": "pass"}, "verdict",
     "pass, but its ratios"),
    ("nginx", lambda d: d.get("change") in ("lower", "higher"), None, "change", "but the hot file's ratio"),
]


def _flipped(obj: dict, edit: dict | None) -> dict:
    if edit is not None:
        return edit
    key = "answer" if "answer" in obj else "change"
    other = {"answer": ["layout", "server", "neither"], "change": ["lower", "higher", "the same"]}[key]
    return {key: next(x for x in other if x != obj[key])}


@pytest.mark.parametrize("run, wanted, edit, field, says", TAMPERED)
def test_an_outcome_its_figures_contradict_is_refused_naming_the_field(tmp_path, made, run, wanted, edit, field,
                                                                        says):
    data = json.loads(json.dumps(to_data(made[run][1])))
    found = _find(data, wanted)
    assert found is not None, "the run holds no such reading: the case would prove nothing"
    where, obj = found
    obj.update(_flipped(obj, edit))
    said = _refused(tmp_path, data)
    assert said.startswith(f"{where}.{field}: "), said
    assert says in said, said


def test_an_equivalence_whose_interval_leaves_the_margin_is_refused(tmp_path, made):
    data = json.loads(json.dumps(to_data(made["tails"][1])))
    where, c = _find(data, _is_comparison("better"))
    c.update(outcome="equivalent", low=0.97, high=1.08, ratio=1.02)  # margin ±5%: this straddles 1.05
    said = _refused(tmp_path, data)
    assert said.startswith(f"{where}.outcome: equivalent, but its interval 0.97–1.08") and "says undecided" in said


def test_a_comparison_with_too_few_rounds_decides_nothing():
    one = Comparison("rps", "better", 1.5, 1.5, 1.5, 1, "too few rounds")
    assert contradiction(one) == ("outcome: better, but its interval 1.50–1.50 (1 paired round: too few to judge, "
                                  "equivalent within ±5%) says undecided")
    unpaired = Comparison("rps", "better", 1.5, 1.2, 1.8, 2, "unpaired")  # 2 cells a side: no level
    assert "says undecided" in contradiction(unpaired)
    assert contradiction(Comparison("rps", "better", 1.5, 1.2, 1.8, 3, "unpaired")) is None
    # p99: lower is better; a figure the analysis does not name may go either way.
    assert contradiction(Comparison("p99", "better", 0.7, 0.6, 0.8, 5)) is None
    assert "says better" in contradiction(Comparison("p99", "worse", 0.7, 0.6, 0.8, 5))
    assert contradiction(Comparison("", "worse", 0.7, 0.6, 0.8, 5)) is None


def test_report_refuses_a_tampered_summary_with_exit_2_and_writes_nothing(tmp_path, made, capsys):
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(RESULTS, run / "results.json")
    data = json.loads(json.dumps(to_data(Summary.load(FIXTURES / "summary-tails.json"))))
    where, c = _find(data, _is_comparison("better"))
    c["outcome"] = "worse"
    (run / SUMMARY_NAME).write_text(json.dumps(data))
    assert bench_main(["report", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{where}.outcome: worse, but its interval" in err and "Traceback" not in err
    assert sorted(p.name for p in run.iterdir()) == ["results.json", SUMMARY_NAME]


def test_a_plan_whose_stored_validation_contradicts_its_difference_is_refused(tmp_path, capsys):
    data = plan_data()
    judged = judge_plan(data).to_dict()
    assert judged["validation"] == {"target": 0.1, "difference": 0.125, "replicas": 3, "within": False}
    judged["validation"]["within"] = True
    run = tmp_path / "plan"
    run.mkdir()
    (run / PLAN_JSON).write_text(json.dumps(data | {"judgement": judged}))
    with pytest.raises(ResultsError) as err:
        read_plan(run / PLAN_JSON)
    assert str(err.value) == (f"{run / PLAN_JSON}: a bad judgement (validation.within: true, but the largest "
                              "difference +12.5% is not within 10%)")
    assert bench_main(["report", str(run)]) == 2
    said = capsys.readouterr().err
    assert said.count("\n") == 1 and "validation.within" in said and "Traceback" not in said
    assert sorted(p.name for p in run.iterdir()) == [PLAN_JSON]
