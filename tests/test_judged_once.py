"""A run stored without its summary.json is judged again once per ``report``, not once per view
(issue 37): the one summary made from its results is handed to report.txt, report.md, the plots
and the terminal, as a run's own summary is.

Observed through a real ``uwsgi-layouts report`` of a stored fixture: each kind's judging step is
counted where its ``summarize`` looks it up (tune: taking the search again on the stored cells;
doctor: judging each diagnosis; compare: the key comparisons), so it counts however the report
reaches ``summarize``. The fixtures are SYNTHETIC (tests/fixtures: made-up cells, real doctor
samples with synthetic memory); nothing here is measured.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from uwsgi_layouts.bench import doctor_summary
from uwsgi_layouts.bench import summary as compare_summary
from uwsgi_layouts.bench.cli import main
from uwsgi_layouts.bench.results import load
from uwsgi_layouts.bench.summary import SUMMARY_NAME
from uwsgi_layouts.bench.tune import summary as tune_summary

FIXTURES = Path(__file__).parent / "fixtures"


def counting(monkeypatch, module, name: str) -> list:
    """Replace ``module.name`` by a wrapper that records each call; returns the record."""
    calls = []
    original = getattr(module, name)

    def counted(*args, **kwargs):
        calls.append(args)
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


@pytest.mark.parametrize("fixture, module, step, per_run", [
    ("results-tune.json", tune_summary, "outcome_of", lambda r: 1),
    ("results-v2-doctor.json", doctor_summary, "judge", lambda r: len(r.diagnoses)),
    ("results-tails.json", compare_summary, "key_comparisons", lambda r: 1),
], ids=["tune", "doctor", "compare"])
def test_a_run_without_its_summary_is_judged_once_for_every_view(tmp_path, monkeypatch, capsys, fixture, module,
                                                                  step, per_run):
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(FIXTURES / fixture, run / "results.json")
    calls = counting(monkeypatch, module, step)
    assert main(["report", str(run)]) == 0
    assert "judged again" in capsys.readouterr().err
    written = {p.name for p in run.iterdir()}
    assert {"report.txt", "report.md"} <= written and any(n.endswith(".png") for n in written)
    assert not (run / SUMMARY_NAME).exists()
    # One judgement for the whole report (text, Markdown, plots and the terminal rendered it), not one per view.
    assert len(calls) == per_run(load(run / "results.json")), f"{step} called {len(calls)} times"
