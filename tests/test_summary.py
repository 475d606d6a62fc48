"""The typed summary (``bench.summary``): stored and loaded back unchanged, refused with one line
when it cannot be trusted, and rendered by every compare view so that the verdict and the target
table say the same, including where the direction (mapped better than shared at all) and the
claim (1.25x, 0.70x) part ways."""

from __future__ import annotations

import copy
import json
import math
import re
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from uwsgi_layouts.bench.cli import main as bench_main
from uwsgi_layouts.bench.kinds.base import publish
from uwsgi_layouts.bench.paired import Comparison, Direction
from uwsgi_layouts.bench.report import markdown_lines, plots, terminal_lines
from uwsgi_layouts.bench.report.headline import headline_lines
from uwsgi_layouts.bench.results import ResultsError, load
from uwsgi_layouts.bench.summary import SUMMARY_NAME, SUMMARY_VERSION, Summary, from_data, summarize, to_data
from uwsgi_layouts.bench.verdict import Outcome, PairDirection, Standing, combine, combine_levels

FIXTURES = Path(__file__).parent / "fixtures"
RESULTS = FIXTURES / "results-tails.json"
STORED = FIXTURES / "summary-tails.json"  # summarize(load(RESULTS)).save(STORED): a stored summary.json
OUTCOMES = "|".join(re.escape(o.value) for o in sorted(Outcome, key=lambda o: -len(o.value)))
STANDINGS = "|".join(s.value for s in Standing)


@pytest.mark.parametrize("name", ["results-small.json", "results-tails.json"])
def test_a_summary_round_trips(tmp_path, name):
    summary = summarize(load(FIXTURES / name))
    loaded = Summary.load(summary.save(tmp_path / SUMMARY_NAME))
    assert loaded == summary and to_data(loaded) == to_data(summary)
    data = json.loads((tmp_path / SUMMARY_NAME).read_text(), parse_constant=pytest.fail)  # strict JSON: no Infinity
    assert data["version"] == SUMMARY_VERSION and data["kind"] == "compare"
    # Tuples, not lists, and enums, not words, once loaded; the groups behind a live verdict stay in memory.
    assert isinstance(loaded.decisions, tuple) and isinstance(loaded.groups[0].noisy, tuple)
    assert all(isinstance(c.outcome, Direction) for d in loaded.decisions for c in d.comparisons)
    assert all(lv.pair is None for lv in loaded.verdict.levels) and summary.verdict.levels[0].pair is not None
    assert all(isinstance(lv.direction, PairDirection) for lv in loaded.verdict.levels)


def test_an_open_interval_is_stored_as_strict_json():
    """Too few rounds to judge: the comparison's high end is infinite; JSON has no infinity, so
    it is stored as "inf" and read back as one."""
    opened = Comparison("rps", "undecided", 0.0, 0.0, float("inf"), 0, "too few rounds", 0.0)
    text = json.dumps(to_data(opened), allow_nan=False)
    assert '"high": "inf"' in text and from_data(Comparison, json.loads(text)) == opened
    assert math.isinf(from_data(Comparison, json.loads(text)).high)


def test_the_stored_fixture_is_what_the_analysis_decides_of_its_results():
    assert Summary.load(STORED) == summarize(load(RESULTS))
    assert Summary.load(STORED).matches(load(RESULTS)) and not Summary.load(STORED).matches(load(FIXTURES /
                                                                                            "results-small.json"))


def _stored() -> dict:
    return json.loads(STORED.read_text())


@pytest.mark.parametrize("edit, says", [
    (lambda d: d.update(version=99), f"version: this tool reads summary version {SUMMARY_VERSION}, got 99"),
    (lambda d: d.pop("rule"), "Summary.rule: missing"),
    (lambda d: d["groups"][0].update(requests="many"), "GroupRow.requests: expected int, got 'many'"),
    (lambda d: d["decisions"][0]["comparisons"][0].update(outcome="maybe"),
     "Comparison.outcome: must be one of better, worse, equivalent, undecided, got 'maybe'"),
    # A target whose standing is not its interval's, a level whose direction is not its comparisons'.
    (lambda d: d["verdict"]["levels"][0]["targets"][0].update(standing="misses"), "is not misses"),
    (lambda d: d["verdict"]["levels"][0].update(direction="fails"), "the comparisons say holds, not fails"),
    # The verdict's pair is also a key comparison: the two copies must agree.
    (lambda d: d["decisions"][0].update(settled=False), "differs from the verdict at 2 connections"),
    # Another kind's file is named as such (tune's and doctor's are version 1, an old compare version),
    # and a version that is not a number is a bad field, not a traceback.
    (lambda d: d.update(kind="tune", version=1),
     "kind: a summary of a 'tune' run, beside the results of a compare run"),
    (lambda d: d.update(version=[1]), "Summary.version: expected int, got [1]"),
])
def test_a_summary_that_cannot_be_trusted_is_refused_in_one_line(tmp_path, edit, says):
    data = _stored()
    edit(data)
    path = tmp_path / SUMMARY_NAME
    path.write_text(json.dumps(data))
    with pytest.raises(ResultsError) as err:
        Summary.load(path)
    assert says in str(err.value) and "\n" not in str(err.value)


def _with_level(data: dict, concurrency: int, rps: dict, standing: str, direction: str) -> Summary:
    """The stored summary with the throughput comparison at one level replaced (target, decision and
    direction edited alike, as the analysis would have written them)."""
    data = copy.deepcopy(data)
    for lv in data["verdict"]["levels"]:
        if lv["concurrency"] != concurrency:
            continue
        lv["rps"].update(rps)
        lv["direction"] = direction
        target = lv["targets"][0]
        target.update(value=rps["ratio"], low=rps["low"], high=rps["high"], standing=standing, comparison=lv["rps"])
        settled = combine(Standing(t["standing"]) for t in lv["targets"][:2]) in (Outcome.HOLDS, Outcome.DOES_NOT_HOLD)
        for d in data["decisions"]:
            if d["kind"] == "verdict" and d["level"] == concurrency:
                d.update(comparisons=[lv["rps"], lv["p99"]], settled=settled,
                         settled_after=d["rounds"] if settled else 0)
    return from_data(Summary, data)


def _text_table(lines: list[str]) -> dict[int, list[Standing]]:
    """connections -> the claim targets' standings, from the text report's target table."""
    out: dict[int, list[Standing]] = {}
    for line in lines:
        m = re.match(rf"^\s+(\d+)(?: \(2?P\))?\s+(?:throughput|p99) [<>]= [\d.]+x shared\s.*?\s({STANDINGS})\b", line)
        if m:
            out.setdefault(int(m[1]), []).append(Standing(m[2]))
    return out


def _md_table(lines: list[str]) -> dict[int, list[Standing]]:
    out: dict[int, list[Standing]] = {}
    for line in lines:
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 4 and re.fullmatch(r"\d+(?: \(2?P\))?", cells[0]) and cells[1].endswith("x shared"):
            out.setdefault(int(cells[0].split()[0]), []).append(Standing(cells[3].split(":")[0]))
    return out


def _said(pattern: str, lines: list[str]) -> str:
    """What the one place matching ``pattern`` says, in ``lines`` with their wrapping undone."""
    found = re.findall(pattern, " ".join(" ".join(lines).split()))
    assert len(found) == 1, (pattern, found)
    return found[0]


def _check_every_view(results, summary: Summary) -> Outcome:
    """Render the headline, report.txt and report.md from ``summary``; in each, the verdict's outcome
    and its level lines must be what the target table's standings combine to. Returns that outcome."""
    text, md = terminal_lines(results, summary), markdown_lines(results, [], summary)
    head = headline_lines(results, summary, "run")
    levels = {lv.concurrency for lv in summary.verdict.levels}
    claim = r"the article's claim \([^)]*\)"
    for table in (_text_table(text), _md_table(md)):
        assert set(table) == levels and all(len(s) == 2 for s in table.values())
        per_level = {c: combine(s) for c, s in table.items()}
        expected = combine_levels(per_level.values())
        assert Outcome(_said(rf"Verdict: {claim}: ({OUTCOMES}) here\.", text)) is expected
        assert Outcome(_said(rf"\*\*T{claim[1:]}: ({OUTCOMES}) here\.\*\*", md)) is expected
        assert Outcome(_said(rf"against {claim}: ({OUTCOMES}) here\.", head)) is expected
        for c, outcome in per_level.items():
            name = summary.verdict.level_name(c)
            assert Outcome(_said(rf"- at {c} connections \({name}\): ({OUTCOMES}): ", text)) is outcome
            assert Outcome(_said(rf"- at {c} connections \({name}\): ({OUTCOMES}): ", md)) is outcome
            assert Outcome(_said(rf"- {name}: ({OUTCOMES}): ", head)) is outcome
    assert summary.verdict.outcome is expected
    return expected


def test_every_view_renders_the_stored_summary_and_the_verdict_agrees_with_its_table():
    results, summary = load(RESULTS), Summary.load(STORED)
    assert _check_every_view(results, summary) is Outcome.HOLDS
    assert "\n".join(terminal_lines(results, summary)) == "\n".join(terminal_lines(results))  # stored = live


def test_direction_undecided_while_the_claim_is_missed():
    """1.03x (0.99–1.07): whether mapped is better at all is undecided (the interval holds 1), but
    the 1.25x claimed is missed beyond doubt. The verdict says "holds in part", the table "misses",
    the decisions "undecided": three answers to two questions, none contradicting another."""
    results = load(RESULTS)
    summary = _with_level(_stored(), 2, {"ratio": 1.03, "low": 0.99, "high": 1.07, "outcome": "undecided"},
                          "misses", "undecided")
    assert summary.verdict.levels[0].direction is PairDirection.UNDECIDED
    assert _check_every_view(results, summary) is Outcome.PARTLY
    text = terminal_lines(results, summary)
    assert any("misses: far below by 0.18" in line for line in text)
    decided = " ".join(" ".join(text).split())
    assert "verdict: 2x4-mapped vs 2x4-shared at 2 connections (article): throughput 1.03x (0.99–1.07" in decided
    assert "(0.99–1.07; t over 3 rounds, 95%): undecided" in decided


def test_direction_decided_while_the_claim_is_undecided():
    """The reverse: 1.20x (1.10–1.30) is better beyond noise (and the p99 too: the direction holds),
    yet it straddles the 1.25x claimed: the claim is undecided, not held."""
    results = load(RESULTS)
    summary = _with_level(_stored(), 2, {"ratio": 1.2, "low": 1.1, "high": 1.3, "outcome": "better"},
                          "straddles", "holds")
    assert summary.verdict.levels[0].direction is PairDirection.HOLDS
    assert _check_every_view(results, summary) is Outcome.UNDECIDED
    assert any("straddles: 4% past, 12% short" in line for line in terminal_lines(results, summary))


def test_report_renders_a_run_from_its_summary_json(tmp_path, capsys, monkeypatch):
    """``report RUN_DIR`` renders what summary.json decided (here: a summary edited to say the claim
    is undecided), falls back to results.json without one, and says so when the summary is another
    file's."""
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(RESULTS, run / "results.json")
    assert bench_main(["report", str(run)]) == 0
    assert "holds here" in (run / "report.txt").read_text() and not (run / SUMMARY_NAME).exists()
    # The plots are drawn from results.json alone, the same each time (above, for real; test_report's
    # export tests check them): the two reports below skip them, which was two thirds of this test's CPU.
    monkeypatch.setattr(plots, "plot_all", lambda results, out_dir, summary=None: [])
    _with_level(_stored(), 2, {"ratio": 1.2, "low": 1.1, "high": 1.3, "outcome": "better"}, "straddles",
                "holds").save(run / SUMMARY_NAME)
    assert bench_main(["report", str(run)]) == 0
    flat = " ".join((run / "report.txt").read_text().split())
    assert ": undecided here." in flat and "**The article's claim" in (run / "report.md").read_text()
    other = summarize(load(FIXTURES / "results-small.json"))
    other.save(run / SUMMARY_NAME)
    capsys.readouterr()
    assert bench_main(["report", str(run)]) == 0
    assert "is not this results file's summary" in capsys.readouterr().err
    assert "holds here" in (run / "report.txt").read_text()


def test_publish_stores_only_the_summary_the_run_made(tmp_path, monkeypatch, capsys):
    """summary.json holds what a run concluded: ``publish`` stores the summary it is handed; one it
    makes itself, for a run handed none (every view needs one), is rendered and not stored."""
    monkeypatch.setattr(plots, "plot_all", lambda results, out_dir, summary=None: [])  # drawn elsewhere
    results, saved = load(RESULTS), tmp_path / "results.json"
    publish(results, tmp_path / "made", saved=saved)
    assert "holds here" in (tmp_path / "made" / "report.txt").read_text()
    assert not (tmp_path / SUMMARY_NAME).exists()
    summary = summarize(results)
    written = publish(results, tmp_path / "given", saved=saved, summary=summary)
    assert written[0] == tmp_path / SUMMARY_NAME and Summary.load(tmp_path / SUMMARY_NAME) == summary
    assert f"wrote {saved} and {SUMMARY_NAME}" in capsys.readouterr().out


def test_the_line_plots_circle_the_points_the_summary_found_noisy(tmp_path):
    """The throughput and p99 plots circle what ``GroupRow.noisy`` holds (the plot judges no spread):
    the same run with a summary that found nothing noisy draws other images."""
    results = load(RESULTS)
    summary = summarize(results)
    assert any("p99" in r.noisy for r in summary.groups)  # the fixture has noisy p99s to circle
    quiet = replace(summary, groups=tuple(replace(r, noisy=()) for r in summary.groups))
    noisy = [p.read_bytes() for p in plots.plot_p99(results, tmp_path / "noisy.png", summary)]
    calm = [p.read_bytes() for p in plots.plot_p99(results, tmp_path / "quiet.png", quiet)]
    assert len(noisy) == len(calm) == len(results.scenarios) and noisy != calm
