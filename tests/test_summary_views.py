"""The compare report's other sections render the stored summary too (issue 37): the alternatives
(uWSGI against the peers), the nginx scenarios and TLS across app hosts are judged once by
``bench.readings``, stored in summary.json (version 3) and worded by the report, which judges
nothing; a summary of version 1 is refused in one line and the run judged again. And the "run
here" line quotes a lead over the runner-up only where it is decided: an undecided one is said to
be undecided, one too wide to order anything is said not to be measured well enough.

SYNTHETIC data: the peers' and the nginx scenarios' made-up runs of tests/test_peers_bench.py and
tests/test_nginx_scenarios.py, a made-up run across two app hosts here, and the stored fixtures.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.test_nginx_scenarios import _cell, synthetic_results
from tests.test_peers_bench import peer_results
from tests.test_rendered_unchanged import memory_results
from uwsgi_layouts.bench.cli import main as bench_main
from uwsgi_layouts.bench.decisions import Lead, Recommendation
from uwsgi_layouts.bench.paired import Comparison
from uwsgi_layouts.bench.readings import Side, TargetState, TargetVerdict, Touched
from uwsgi_layouts.bench.report import markdown_lines, terminal_lines
from uwsgi_layouts.bench.report.headline import run_here
from uwsgi_layouts.bench.results import Results, ResultsError, load
from uwsgi_layouts.bench.summary import (
    SUMMARY_NAME,
    SUMMARY_VERSION,
    OldSummary,
    Summary,
    from_data,
    summarize,
    to_data,
)

FIXTURES = Path(__file__).parent / "fixtures"
RESULTS = FIXTURES / "results-tails.json"
V1_SUMMARY = FIXTURES / "summary-tails-v1.json"  # the stored summary of results-tails.json, as version 1 wrote it
V2_SUMMARY = FIXTURES / "summary-tails-v2.json"  # ... as version 2 wrote it (before the memory costs were stored)


def _flat(lines: list[str]) -> str:
    return " ".join(" ".join(lines).split())


def _stored_and_back(summary: Summary, tmp_path: Path) -> Summary:
    return Summary.load(summary.save(tmp_path / SUMMARY_NAME))


def _edited(summary: Summary, edit) -> Summary:
    data = json.loads(json.dumps(to_data(summary)))
    edit(data)
    return from_data(Summary, data)


# ------------------------------------------------------------------------------ against the alternatives


def test_the_alternatives_are_stored_and_rendered_from_the_summary(tmp_path):
    results = peer_results()
    summary = summarize(results)
    loaded = _stored_and_back(summary, tmp_path)
    assert loaded == summary and [r.scenario for r in loaded.peers] == ["article", "hello"]
    article = loaded.peers[0]
    assert {m.rps_side for m in article.matchups} >= {Side.UWSGI, Side.EQUIVALENT}
    assert [t.state for t in article.target.target_readings] == [TargetState.MISSED, TargetState.UNSURE]
    assert loaded.peers[1].target is None  # hello: no target (article and io-heavy only)
    # stored = live, in both views
    assert terminal_lines(results, loaded) == terminal_lines(results)
    assert markdown_lines(results, [], loaded) == markdown_lines(results, [])
    # The report words what the summary says, and judges nothing again: a summary saying the
    # throughput target was met renders "pass" where the results alone say MISS.
    assert "MISS (short by 0.02x)" in _flat(terminal_lines(results, loaded))

    def met(data):
        target = data["peers"][0]["target"]["target_readings"][0]
        target.update(state="met", margin=0.02, point_clears=True)

    passed = _flat(terminal_lines(results, _edited(loaded, met)))
    assert "pass (by 0.02x)" in passed and "MISS (short by" not in passed


def test_a_peer_ahead_is_said_from_the_stored_sides(tmp_path):
    results = peer_results()
    loaded = _stored_and_back(summarize(results), tmp_path)
    hello = loaded.peers[1]
    assert hello.peer_wins("gunicorn") == {"throughput": (2, 4), "p99": (2, 4)}
    text = _flat(terminal_lines(results, loaded))
    assert "gunicorn is ahead on throughput at 2 and 4 connections and on p99 at 2 and 4 connections" in text


# ------------------------------------------------------------------------------ nginx


def test_the_nginx_sections_are_stored_and_rendered_from_the_summary(tmp_path):
    results = synthetic_results()
    loaded = _stored_and_back(summarize(results), tmp_path)
    assert {b.concurrency for b in loaded.nginx.files} == {8, 32}
    assert all(t.verdict is TargetVerdict.MISS for b in loaded.nginx.files for t in b.targets)
    assert all(r.touched is Touched.YES for b in loaded.nginx.mixed for r in b.rows)
    assert [r.conns for r in loaded.nginx.reuseport[0].rows] == pytest.approx([52 / 12, 33 / 31])
    assert terminal_lines(results, loaded) == terminal_lines(results)
    assert markdown_lines(results, [], loaded) == markdown_lines(results, [])

    def passed(data):
        for block in data["nginx"]["files"]:
            for target in block["targets"]:
                target["verdict"] = "pass"

    text = _flat(terminal_lines(results, _edited(loaded, passed)))
    assert "target >= 10x: pass" in text and "MISS" not in text


def test_an_unknown_target_verdict_is_refused_in_one_line(tmp_path):
    summary = summarize(synthetic_results())
    data = json.loads(json.dumps(to_data(summary)))
    data["nginx"]["files"][0]["targets"][0]["verdict"] = "probably"
    path = tmp_path / SUMMARY_NAME
    path.write_text(json.dumps(data))
    with pytest.raises(ResultsError) as err:
        Summary.load(path)
    assert "TargetVerdict" not in str(err.value) and "must be one of pass, miss, undecided, too few, got 'probably'" \
        in str(err.value) and "\n" not in str(err.value)


# ------------------------------------------------------------------------------ hosts


def hosts_results() -> Results:
    """Two app hosts, suwsgi against plain uwsgi, 3 repeats at 4 connections (SYNTHETIC)."""
    cells = []
    for r, f in ((1, 0.97), (2, 1.0), (3, 1.03)):
        for layout, rps, p99 in (("2x4-mapped", 400.0, 12.0), ("2x4-mapped@uwsgi_tls=off", 500.0, 9.0)):
            cells.append(_cell("article", layout, 4, r, rps * f, p99, {"host1_share": 0.5, "host2_share": 0.5,
                                                                       "host_share_max": 0.5}))
    return Results(environment={"nproc": 2}, workload={},
                   arguments={"processes": 2, "threads": 4, "hosts": 2, "layouts": ["2x4-mapped",
                                                                                     "2x4-mapped@uwsgi_tls=off"]},
                   cells=tuple(cells))


def test_what_tls_costs_is_stored_and_rendered_from_the_summary(tmp_path):
    results = hosts_results()
    loaded = _stored_and_back(summarize(results), tmp_path)
    (cost,) = loaded.hosts
    assert (cost.layout, cost.plain, cost.tls, cost.concurrency) == ("2x4-mapped", "2x4-mapped@uwsgi_tls=off",
                                                                     "suwsgi", 4)
    assert cost.rps.median == pytest.approx(0.8)
    text = _flat(terminal_lines(results, loaded))
    assert "== Across 2 app hosts ==" in text and "suwsgi vs off" in text and "0.80x" in text
    assert terminal_lines(results, loaded) == terminal_lines(results)


# ------------------------------------------------------------------------------ memory


def test_the_memory_costs_are_stored_and_rendered_from_the_summary(tmp_path):
    results = memory_results()
    loaded = _stored_and_back(summarize(results), tmp_path)
    (cost,) = loaded.memory
    assert cost.server == "uwsgi" and cost.per_process.median == pytest.approx(20, abs=0.05)
    assert cost.per_thread.median == pytest.approx(0.5, abs=0.05) and cost.base.median == pytest.approx(6, abs=0.2)
    assert terminal_lines(results, loaded) == terminal_lines(results)
    assert markdown_lines(results, [], loaded) == markdown_lines(results, [])

    # The report words the stored fit and fits nothing again.
    def dearer(data):
        data["memory"][0]["per_process"].update(median=99.0, low=98.0, high=100.0)

    text = _flat(terminal_lines(results, _edited(loaded, dearer)))
    assert "one more worker process (with its first thread) costs 99" in text
    assert "one more worker process (with its first thread) costs 99" not in _flat(terminal_lines(results))


# ------------------------------------------------------------------------------ the summary's version


@pytest.mark.parametrize("version, stored", [(1, V1_SUMMARY), (2, V2_SUMMARY)])
def test_an_older_summary_is_refused_in_one_line_and_the_run_judged_again(tmp_path, capsys, version, stored):
    with pytest.raises(OldSummary) as err:
        Summary.load(stored)
    said = str(err.value)
    assert f"a summary of version {version}" in said and f"reads version {SUMMARY_VERSION}" in said
    assert "\n" not in said
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(RESULTS, run / "results.json")
    shutil.copy(stored, run / SUMMARY_NAME)
    assert bench_main(["report", str(run)]) == 0
    said = [x for x in capsys.readouterr().err.splitlines() if SUMMARY_NAME in x]
    assert len(said) == 1 and f"version {version}" in said[0] and "judged again from the results" in said[0]
    assert "holds here" in (run / "report.txt").read_text()
    assert (run / SUMMARY_NAME).read_text() == stored.read_text()  # not ours to overwrite


# ------------------------------------------------------------------------------ run here


def _rec(outcome: str, ratio: float, low: float, high: float, rounds: int = 5, method: str = "t") -> Recommendation:
    c = Comparison("rps", outcome, ratio, low, high, rounds, method, 0.95)
    return Recommendation("article", "2x4-mapped", (2, 4, 8), (), "2x4-thunder", (2,), c)


def test_run_here_quotes_a_decided_lead():
    rec = _rec("better", 1.2, 1.1, 1.3)
    assert rec.lead is Lead.AHEAD
    line = run_here(rec)
    assert "over them 1.20x (1.10–1.30) the throughput of 2x4-thunder (beaten at 2): more beyond noise" in line
    assert "equivalent within ±5%" in run_here(_rec("equivalent", 1.01, 0.98, 1.03))


def test_run_here_says_an_undecided_lead_is_undecided_without_claiming_a_ratio():
    rec = _rec("undecided", 1.07, 0.98, 1.17)
    assert rec.lead is Lead.UNDECIDED
    line = run_here(rec)
    assert "against 2x4-thunder (beaten at 2) over them: undecided (throughput interval 0.98–1.17 holds 1)" in line
    assert "1.07x" not in line and "within noise" not in line


@pytest.mark.parametrize("rec", [
    _rec("undecided", 1.35, 1e-70, 2.1e67, rounds=2),  # the "1.35x (<0.01->100)"
    _rec("undecided", 1.2, 0.5, 2.5, rounds=3),  # 5x from end to end: orders nothing
    _rec("undecided", 1.2, 1.2, float("inf"), rounds=1, method="too few rounds"),
])
def test_run_here_says_a_lead_too_wide_to_order_anything_was_not_measured_well_enough(rec):
    assert rec.lead is Lead.UNMEASURED
    line = run_here(rec)
    assert "over them: not measured well enough to order (" in line
    assert "1.35x" not in line and "1.20x" not in line and "within noise" not in line


def test_the_lead_is_stored_as_the_run_said_it(tmp_path):
    summary = summarize(load(RESULTS))
    assert summary.run_here.lead is Lead.of(summary.run_here.overall)
    loaded = _stored_and_back(summary, tmp_path)
    assert loaded.run_here.lead is summary.run_here.lead
    with pytest.raises(ValueError, match="lead: none does not fit"):
        Recommendation("article", "2x4-mapped", (2,), (), "2x4-shared", (), summary.run_here.overall, Lead.NONE)
