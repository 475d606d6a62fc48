"""The one results format (version 2): every kind's records, validation, the prepared Cell
fields, and the migration of the version-1 files written before. Pure logic on stored JSON:
results-small.json is SYNTHETIC (tests/fixtures/make_fixture.py); openloop-v1.json was written
by the version-1 code from REAL captured httperf outputs."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from uwsgi_layouts.bench.results import (
    FORMAT_VERSION,
    KIND_CHECKS,
    KIND_RECORDS,
    Cell,
    Check,
    FaultRecord,
    Results,
    ResultsError,
    Step,
    load,
    register_kind,
)

FIXTURES = Path(__file__).parent / "fixtures"
COMPARE_V1 = FIXTURES / "results-small.json"
OPENLOOP_V1 = FIXTURES / "openloop-v1.json"


def write(tmp_path: Path, data, name: str = "results.json") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


# --- migration of version 1 ------------------------------------------------------------------------


def test_v1_compare_file_loads_as_a_compare_results(tmp_path):
    raw = json.loads(COMPARE_V1.read_text())
    assert raw["format_version"] == 1 and "kind" not in raw
    results = load(COMPARE_V1)
    assert results.kind == "compare" and results.format_version == FORMAT_VERSION == 2
    assert len(results.cells) == len(raw["cells"]) and results.environment == raw["environment"]
    saved = json.loads(results.save(tmp_path / "v2.json").read_text())
    assert saved["format_version"] == 2 and saved["kind"] == "compare"
    assert list(saved)[:6] == ["format_version", "kind", "created", "environment", "arguments", "workload"]
    assert load(tmp_path / "v2.json") == results


def test_v1_openloop_file_is_migrated_and_its_knee_recomputed(tmp_path):
    raw = json.loads(OPENLOOP_V1.read_text())
    assert raw["format_version"] == 1 and raw["kind"] == "openloop"
    results = load(OPENLOOP_V1)
    assert results.kind == "openloop" and not results.cells and len(results.steps) == 2
    assert [s.rate for s in results.steps] == [6, 30] and results.steps[1].status["5xx"] == 51
    assert results.knee == raw["knee"]
    assert results.workload == {"path": raw["arguments"]["path"], "files": ""}
    # A stored knee is never trusted: a tampered one is recomputed from the steps.
    raw["knee"] = {"rate": 30, "status": "not reached"}
    assert load(write(tmp_path, raw)).knee["rate"] == 6
    again = load(results.save(tmp_path / "v2.json"))
    assert again == results and json.loads((tmp_path / "v2.json").read_text())["knee"]["status"] == "found"


@pytest.mark.parametrize("change,message", [
    (lambda d: d.update(format_version=3), "format_version 3 is not supported (this tool reads 1 and 2)"),
    (lambda d: d.pop("format_version"), "format_version None is not supported"),
    (lambda d: d.pop("environment"), "missing environment"),
    (lambda d: d.update(cells={}), "cells must be a list"),
    (lambda d: d.update(kind="bogus", format_version=2), "kind 'bogus' is not one this tool reads"),
    (lambda d: d.update(kind="bogus"), "format_version 1 files of kind 'bogus' were never written"),
    (lambda d: d["cells"][0].pop("rps"), "cell 1x4-shared: "),
    (lambda d: d["cells"][0].update(histogram=[[5, 1], [5, 2]]), "histogram[1]: latencies must be strictly ascending"),
])
def test_bad_files_are_refused_with_one_line(tmp_path, change, message):
    data = json.loads(COMPARE_V1.read_text())
    change(data)
    with pytest.raises(ResultsError) as err:
        load(write(tmp_path, data))
    text = str(err.value)
    assert message in text and "\n" not in text, text


def test_not_json_and_missing_file(tmp_path):
    with pytest.raises(ResultsError, match="cannot read results JSON"):
        load(write(tmp_path, "not json {"))
    with pytest.raises(ResultsError, match="not a results object"):
        load(write(tmp_path, "[1, 2]"))
    with pytest.raises(ResultsError, match="cannot read results JSON"):
        load(tmp_path / "absent.json")


def test_a_kind_holds_only_its_own_records(tmp_path):
    data = json.loads(OPENLOOP_V1.read_text())
    data.update(format_version=2, workload={}, cells=json.loads(COMPARE_V1.read_text())["cells"][:1])
    with pytest.raises(ResultsError, match="cells: the results of kind openloop hold steps, not cells"):
        load(write(tmp_path, data))
    data = json.loads(OPENLOOP_V1.read_text())
    data.update(format_version=2, workload={})
    del data["steps"]
    with pytest.raises(ResultsError, match="missing steps"):
        load(write(tmp_path, data))


def test_register_kind_lets_a_new_kind_save_cells(tmp_path, monkeypatch):
    monkeypatch.setattr("uwsgi_layouts.bench.results.registry.KIND_RECORDS", dict(KIND_RECORDS))  # restored afterwards
    monkeypatch.setattr("uwsgi_layouts.bench.results.registry.KIND_CHECKS", dict(KIND_CHECKS))
    register_kind("sweep2", "cells")
    stored = load(COMPARE_V1)
    other = replace(stored, kind="sweep2")
    assert load(other.save(tmp_path / "t.json")).kind == "sweep2"
    with pytest.raises(ValueError, match="already registered"):
        register_kind("sweep2", "steps")
    with pytest.raises(ValueError, match="records"):
        register_kind("other", "rows")


def test_a_kind_check_runs_on_creation_and_load(tmp_path, monkeypatch):
    monkeypatch.setattr("uwsgi_layouts.bench.results.registry.KIND_RECORDS", dict(KIND_RECORDS))
    monkeypatch.setattr("uwsgi_layouts.bench.results.registry.KIND_CHECKS", dict(KIND_CHECKS))

    def needs_budget(results):
        if "budget" not in results.arguments:
            raise ResultsError("arguments.budget: missing")

    register_kind("budgeted", "cells", needs_budget)
    stored = load(COMPARE_V1)
    path = replace(stored, kind="budgeted", arguments={**stored.arguments, "budget": 1}).save(tmp_path / "b.json")
    assert load(path).kind == "budgeted"
    with pytest.raises(ResultsError, match="arguments.budget: missing"):
        replace(stored, kind="budgeted")


# --- the Cell fields prepared for the next work -------------------------------------------------------

PREPARED = {
    "status": {"2xx": 180, "3xx": 0, "4xx": 1, "5xx": 2},
    "memory": {"app_pss_mb": 41.5, "app_uss_mb": 30.0, "app_rss_mb": 80, "nginx_pss_mb": 3.25,
               "worker_pss_mb": {"1": 15.0, "2": 14.5}},
    "inflight": {"samples": 200, "pileup": 0.31, "interval_ms": 50,
                 "workers": {"1": {"0": 0.2, "1": 0.5, "2": 0.3}, "2": {"0": 0.9, "1": 0.1}}},
    "histogram": [[850, 3], [1200, 40], [2500.5, 7]],
}


@pytest.fixture
def cell() -> Cell:
    return load(COMPARE_V1).cells[0]


def test_prepared_fields_are_left_out_when_empty(cell):
    data = cell.to_dict()
    assert not set(PREPARED) & set(data)
    assert (cell.status, cell.memory, cell.inflight, cell.histogram) == ({}, {}, {}, ())


def test_prepared_fields_round_trip(cell, tmp_path):
    full = Cell.from_dict(cell.to_dict() | PREPARED)
    data = full.to_dict()
    assert {k: data[k] for k in PREPARED} == PREPARED
    assert full.histogram == ((850, 3), (1200, 40), (2500.5, 7))
    results = replace(load(COMPARE_V1), cells=(full,))
    assert load(results.save(tmp_path / "r.json")).cells[0] == full


@pytest.mark.parametrize("name,value,message", [
    ("status", {"2xx": -1}, "status.2xx: must be an integer >= 0"),
    ("status", {"200": 5}, "status: keys must be among 2xx, 3xx, 4xx, 5xx"),
    ("status", [1, 2], "status: must be a mapping"),
    ("memory", {"app_pss_mb": -3}, "memory.app_pss_mb: must be a finite number >= 0"),
    ("memory", {"worker_pss_mb": {"one": 3}}, "memory.worker_pss_mb: keys must be numbers"),
    ("memory", {"app_pss_mb": "big"}, "memory.app_pss_mb"),
    ("inflight", {"samples": 0, "pileup": 0.1, "workers": {}}, "inflight.samples: must be an integer >= 1"),
    ("inflight", {"samples": 5, "pileup": 1.5, "workers": {}}, "inflight.pileup: must be a share in 0..1"),
    ("inflight", {"samples": 5, "pileup": 0.1, "workers": {"1": {"0": 0.5, "1": 0.2}}},
     "inflight.workers.1: shares must sum to 1"),
    ("inflight", {"samples": 5, "pileup": 0.1}, "inflight.workers: must be a mapping"),
    ("inflight", {"samples": 5, "pileup": 0.1, "workers": {}, "hz": -20}, "inflight.hz"),
    ("histogram", [[100, 0]], "histogram[0]: count must be an integer > 0"),
    ("histogram", [[100, 1], [50, 1]], "histogram[1]: latencies must be strictly ascending"),
    ("histogram", [[100, 1, 3]], "histogram[0]: must be a [latency_us, count] pair"),
    ("histogram", {"100": 1}, "histogram: must be a list"),
])
def test_prepared_fields_are_validated(cell, name, value, message):
    with pytest.raises(ResultsError, match=r"^cell 1x4-shared: " + message.replace("[", r"\[").replace("]", r"\]")
                       .replace(".", r"\.")):
        Cell.from_dict(cell.to_dict() | {name: value})


# --- steps and fault records ----------------------------------------------------------------------------


def test_step_validation_names_the_field():
    step = load(OPENLOOP_V1).steps[0].to_dict()
    with pytest.raises(ResultsError, match="step at rate 6: verdict: must be one of pass, fail, invalid"):
        Step.from_dict(step | {"verdict": "maybe"})
    with pytest.raises(ResultsError, match="errors: lacks connreset"):
        Step.from_dict(step | {"errors": {k: v for k, v in step["errors"].items() if k != "connreset"}})
    with pytest.raises(ResultsError, match="replies"):
        Step.from_dict({k: v for k, v in step.items() if k != "replies"})


def test_fault_record_round_trip(tmp_path):
    record = FaultRecord("kill-worker", "2x4-mapped", "wrk -c8 GET 5 s", 1, 1234, 3, 0, ("a note",),
                         (Check("0 failed GETs", True, "none"), Check("respawns", False, "6.1 s")),
                         figures={"per_second": [(1, 2, 3)], "respawn_s": 0.01}, seconds=7.5)
    assert record.figures["per_second"] == [[1, 2, 3]]  # kept as its JSON form
    assert not record.ok and [c.target for c in record.failed_checks] == ["respawns"]
    results = Results(environment={}, arguments={"command": "uwsgi-layouts faults"}, workload={},
                      kind="faults", faults=(record,))
    again = load(results.save(tmp_path / "f.json"))
    assert again == results and again.faults[0].figures == record.figures
    assert "error" not in json.loads((tmp_path / "f.json").read_text())["faults"][0]
    crashed = FaultRecord("nginx-reload", "2x4-mapped", "", 0, 0, 0, 0, error="StackError: nginx not ready")
    assert not crashed.ok and "could not run: StackError" in crashed.explain()
    with pytest.raises(ResultsError, match="check.ok: must be true or false"):
        FaultRecord.from_dict(record.to_dict() | {"checks": [{"target": "x", "ok": "yes", "measured": ""}]})
    with pytest.raises(ResultsError, match="figures: must be JSON data"):
        FaultRecord("x", "y", "", 0, 0, 0, 0, figures={"f": object()})
