"""Reports rendered from stored runs stay byte for byte what they were (issue 37): moving a
judgement out of the report (memory's cost fit, the plan's steps and validation, the open loop's
steady minimum, the plots' sizes) changes where it is decided, never what is written.

``tests/fixtures/rendered/`` holds what the code before the move (commit 9114b9c) rendered of
the stored fixtures: the compare report (terminal and Markdown) of results-tails.json and of
results-small.json with memory, the open-loop reports of both stored openloop versions, a plan's
report.txt and report.md, and the SHA-256 of every plot. The tune and doctor reports (of
results-tune.json and results-v2-doctor.json, and variants of each that reach the branches the
fixtures do not: recommended files and every warning, no layout met, an interrupted search; a run stopped early, two
diagnoses, no findings, no access log) are what the code rendered before their text and Markdown
were written from one section spec (commit 1cc8396). Regenerate them only for a change meant
to alter a report (and say so in its commit):

    .venv/bin/python tests/test_rendered_unchanged.py tests/fixtures/rendered

SYNTHETIC data: the fixtures are made up (tests/fixtures/make_fixture.py), the memory figures and
the plan's steps below invented; nothing here is measured.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
import tempfile
from pathlib import Path

import matplotlib
import pytest

from uwsgi_layouts.bench import doctor_summary
from uwsgi_layouts.bench.capacity import RateStep, make_plan
from uwsgi_layouts.bench.readings import judge_plan
from uwsgi_layouts.bench.report import AnySummary, judged, markdown_lines, plots, terminal_lines
from uwsgi_layouts.bench.report.plan import read_plan, write_plan_reports
from uwsgi_layouts.bench.results import Results, ResultsError, load
from uwsgi_layouts.bench.tune import summary as tune_summary
from uwsgi_layouts.bench.tune.cautions import Noisy, ThinTail, TuneCautions, Unsteady

FIXTURES = Path(__file__).parent / "fixtures"
RENDERED = FIXTURES / "rendered"


def memory_results() -> Results:
    """results-small.json with invented memory: 6 MB master + 20 MB per process + 0.5 MB per further
    thread, repeat 2 a little higher (the fit then has a spread and a residual)."""
    base = load(FIXTURES / "results-small.json")
    cells = []
    for c in base.cells:
        p, t = (int(x) for x in c.layout.split("-")[0].split("x"))
        total = 6 + 20 * p + 0.5 * p * (t - 1) + (0.3 if c.repeat == 2 else 0.0)
        memory = {"app_pss_mb": total, "app_uss_mb": total - 4, "app_rss_mb": total * 1.8, "nginx_pss_mb": 3.0,
                  "worker_pss_mb": {str(w): (total - 6) / p for w in range(1, p + 1)}}
        cells.append(dataclasses.replace(c, memory=memory))
    return dataclasses.replace(base, cells=tuple(cells))


def plan_data() -> dict:
    """plan.json as a plan with --check and --validate writes it (before the judgement was stored)."""
    steps = [RateStep(4, "pass", 180, cpu_share=0.4, busy_ratio=0.2, requests_logged=200, step_s=50),
             RateStep(6, "pass", 240, cpu_share=0.6, busy_ratio=0.4, requests_logged=200, step_s=35),
             RateStep(9, "pass", 420, cpu_share=0.9, busy_ratio=0.8, requests_logged=200, step_s=25),
             RateStep(7.5, "pass", 260, cpu_share=0.7, busy_ratio=0.5, requests_logged=200, step_s=30),
             RateStep(13.5, "fail", None, cpu_share=1.0, reasons=("replies fell behind",), step_s=15)]
    plan = make_plan("2x2-mapped@cpus=1", 1.0, steps, target_rate=30, target_p99_ms=250, pss_mb=40)
    rows = [{"replicas": 1, "rate": 6, "per_replica_rate": 6, "plan_per_replica_rate": plan.per_replica_rate,
             "difference": 0.0, "resolution": 0.04, "steps": [s.to_dict() for s in steps[:2]]},
            {"replicas": 2, "rate": None, "per_replica_rate": None, "plan_per_replica_rate": plan.per_replica_rate,
             "difference": None, "resolution": None, "steps": []},
            {"replicas": 3, "rate": 16, "per_replica_rate": 5.333, "plan_per_replica_rate": plan.per_replica_rate,
             "difference": 0.125, "resolution": None, "steps": []}]
    check = {"rate": 30, "note": "", "verdict": "CONFIRMED: 7 replicas met p99 250 ms at 30 req/s and 6 did not",
             "runs": [{"replicas": 7, "per_replica_rate": 4.286, "predicted": True, "verdict": "pass", "p99_ms": 230,
                       "meets": True, "pss_mb": 41, "throttled_share": 0.1, "client_cpu_pct": 60}]}
    return {"format_version": 2, "kind": "plan",
            "arguments": {"layout": "2x2-mapped@cpus=1", "rate": 30, "p99_ms": 250, "min_requests": 200,
                          "resolution": 0.05},
            "load_before": "0.10 0.20 0.30", "load_after": "1.10 0.90 0.50", "plan": plan.to_dict(),
            "steps": [s.to_dict() for s in steps], "check": check, "validation": rows}


def edited(fixture: str, edit) -> Results:
    """The fixture ``fixture`` as loaded after ``edit`` changed its JSON data in place."""
    data = json.loads((FIXTURES / fixture).read_text())
    edit(data)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / fixture
        path.write_text(json.dumps(data))
        return load(path)


def _recommended(data: dict) -> None:
    data["arguments"]["tune"]["recommended"] = {
        "dir": "results/tune-x/recommended", "files": ["uwsgi.ini", "nginx.conf"], "bundle": "bundle",
        "serve": "uwsgi-layouts serve results/tune-x/recommended", "note": "install the bundle as root",
        "install": "sudo results/tune-x/recommended/bundle/install.sh"}
    data["environment"]["loadavg_at_start"] = [1.25, 1.0, 0.5]
    data["environment"]["loadavg_at_end"] = [2.5, 1.5, 0.75]


def _stopped(data: dict) -> None:
    d = data["diagnoses"][0]
    d.update(ended="stopped", end_note="the stats server stopped answering")
    d.pop("access", None)
    d["layout"].pop("config", None)


def _two(data: dict) -> None:
    data["diagnoses"].append(json.loads(json.dumps(data["diagnoses"][0])) | {"address": "127.0.0.1:9192"})


def tune_and_doctor() -> list[tuple[str, Results, AnySummary]]:
    """Tune and doctor runs with the summary each is rendered from: the fixtures, and variants that
    reach the branches the fixtures do not (edited summaries: made up, as the fixtures are)."""
    tune = load(FIXTURES / "results-tune.json")
    judged = tune_summary.summarize(tune)
    none = dataclasses.replace(judged, pod=None, choice=dataclasses.replace(
        judged.choice, chosen="", runner_up="", closest=judged.candidates[1].spec, why="none met the objective",
        against=()))
    interrupted = dataclasses.replace(judged, search=dataclasses.replace(judged.search, interrupted=True))
    doctor = load(FIXTURES / "results-v2-doctor.json")
    stopped = edited("results-v2-doctor.json", _stopped)
    two = edited("results-v2-doctor.json", _two)
    empty = doctor_summary.summarize(stopped)
    empty = dataclasses.replace(empty, diagnoses=tuple(dataclasses.replace(j, findings=(), tune="")
                                                       for j in empty.diagnoses))
    files = edited("results-tune.json", _recommended)
    spec = judged.choice.chosen
    cautions = TuneCautions(("the machine was busy",), (Unsteady("2x4-shared", 0.4, 3, 12.0, 18.0, 0.05, False),
                                                         Unsteady(spec, 0.3, 7, 15.0, 21.0, 0.04, True)),
                            Noisy(spec, 0.3, 7), spec, ThinTail(spec, 4), True)
    warned = dataclasses.replace(tune_summary.summarize(files), cautions=cautions)
    return [("tune", tune, judged), ("tune-files", files, warned),
            ("tune-none", tune, none), ("tune-interrupted", tune, interrupted),
            ("doctor", doctor, doctor_summary.summarize(doctor)), ("doctor-stopped", stopped, empty),
            ("doctor-two", two, doctor_summary.summarize(two))]


def renders() -> dict[str, bytes]:
    """Every rendering of the fixtures, by file name (plots as their SHA-256)."""
    out: dict[str, bytes] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, results in (("tails", load(FIXTURES / "results-tails.json")), ("memory", memory_results()),
                              ("openloop-v2", load(FIXTURES / "results-v2-openloop.json")),
                              ("openloop-v1", load(FIXTURES / "openloop-v1.json"))):
            summary = judged(results)  # once for the three views, as a report does (None: openloop)
            out[f"{name}.txt"] = ("\n".join(terminal_lines(results, summary)) + "\n").encode()
            names = plots.plot_file_names(results)
            out[f"{name}.md"] = ("\n".join(markdown_lines(results, names, summary)) + "\n").encode()
            (Path(tmp) / name).mkdir()
            drawn = plots.plot_all(results, Path(tmp) / name, summary)
            # The PNG's bytes are matplotlib's (its version is in each file's metadata): the version is
            # stored with them, and compared against another only by the files' names.
            out[f"{name}-plots.sha256"] = (f"# matplotlib {matplotlib.__version__}\n" + "".join(
                f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.name}\n" for p in drawn)).encode()
    for name, results, summary in tune_and_doctor():
        out[f"{name}.txt"] = ("\n".join(terminal_lines(results, summary)) + "\n").encode()
        md = markdown_lines(results, plots.plot_file_names(results), summary)
        out[f"{name}.md"] = ("\n".join(md) + "\n").encode()
    return out | plan_renders(plan_data())


def plan_renders(data: dict) -> dict[str, bytes]:
    """The plan's report.txt and report.md, rendered from ``data`` stored as plan.json and read back."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "plan.json"
        path.write_text(json.dumps(data))
        write_plan_reports(Path(tmp) / "plan", read_plan(path))
        return {f"plan-{name}": (Path(tmp) / "plan" / name).read_bytes() for name in ("report.txt", "report.md")}


def test_every_report_renders_as_before_the_judgements_moved():
    expected = {p.name: p.read_bytes() for p in RENDERED.iterdir()}
    got = renders()
    assert sorted(got) == sorted(expected)
    changed = [name for name in got if not same_rendering(name, got[name], expected[name])]
    assert not changed, f"rendered differently from tests/fixtures/rendered: {changed}"


def same_rendering(name: str, got: bytes, expected: bytes) -> bool:
    """Byte for byte; but plot lists drawn by two matplotlib versions by the files' names alone
    (another version writes other bytes, its own name among them, for the same figure)."""
    if not name.endswith("-plots.sha256"):
        return got == expected
    (got_version, *got_lines), (expected_version, *expected_lines) = (b.decode().splitlines() for b in (got, expected))
    if got_version == expected_version:
        return got == expected
    return [line.split("  ", 1)[1] for line in got_lines] == [line.split("  ", 1)[1] for line in expected_lines]


def test_a_plan_with_its_stored_judgement_renders_as_one_judged_again():
    """A plan.json the plan now writes (its judgement stored) and one written before (judged again
    from its steps and rows) render the same."""
    data = plan_data()
    judged = judge_plan(data).to_dict()
    assert plan_renders(data | {"judgement": judged}) == plan_renders(data)
    assert judged["next_miss"] == 7.5 and judged["validation"]["within"] is False


@pytest.mark.parametrize("edit, says", [
    (lambda j: j["validation"].update(target=0.2, within=True), "judgement.validation: "),
    (lambda j: j.update(met=[*j["met"], 7.5]),
     "judgement.met: (4.0, 6.0, 7.5), but the plan's own steps and rows say (4, 6)"),
    (lambda j: j.update(met="12"), "judgement.met: must be a list of rates, got '12'"),
    (lambda j: j.update(next_miss=None), "judgement.next_miss: None, but the plan's own steps and rows say 7.5"),
])
def test_a_stored_judgement_its_own_steps_contradict_is_refused_in_one_line(tmp_path, edit, says):
    """The report words the stored judgement (tests/test_report_decides_nothing.py: it calls no
    judge); one edited, even consistently with itself, is refused when the plan is read."""
    data = plan_data()
    judged = judge_plan(data).to_dict()
    edit(judged)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(data | {"judgement": judged}))
    with pytest.raises(ResultsError) as err:
        read_plan(path)
    assert says in str(err.value) and "\n" not in str(err.value), err.value


@pytest.mark.parametrize("name", ["memory.txt", "memory.md"])
def test_the_memory_fixture_shows_the_fit(name):
    """The memory rendering holds the fitted costs (a fixture that fitted nothing would prove nothing)."""
    assert b"one more worker process" in (RENDERED / name).read_bytes().lower()


@pytest.mark.parametrize("name, says", [
    ("tune.txt", "RECOMMENDATION: "), ("tune.md", "## Pruned before measuring"),
    ("tune-files.txt", "recommended files: "), ("tune-files.md", "## Recommended files"),
    ("tune-files.txt", "load average 1.2 at the start"), ("tune-files.md", "## Warnings"),
    ("tune-files.txt", "chosen anyway"), ("tune-files.txt", "the budget ended before the final stage"),
    ("tune-none.txt", "NO LAYOUT MEETS THE OBJECTIVE."), ("tune-none.md", "**Closest:**"),
    ("tune-interrupted.txt", "INTERRUPTED after "),
    ("doctor.txt", "-> "), ("doctor.md", "## Access log"), ("doctor-stopped.txt", "STOPPED EARLY: "),
    ("doctor-stopped.txt", "none: no sample was read"), ("doctor-two.md", "127.0.0.1:9192"),
])
def test_the_tune_and_doctor_fixtures_reach_their_branches(name, says):
    """Each variant shows the branch it was made for (a variant rendering what another does proves nothing)."""
    assert says in (RENDERED / name).read_text()


def test_the_plan_fixture_shows_the_judgements_that_moved():
    text = (RENDERED / "plan-report.txt").read_text()
    assert "7.5 req/s did not" in text and "NOT within 10%" in text and " yes " in text and " no " in text


if __name__ == "__main__":  # regenerate: python tests/test_rendered_unchanged.py DIR
    target = Path(sys.argv[1])
    target.mkdir(parents=True, exist_ok=True)
    rendered = renders()
    for file_name, body in rendered.items():
        (target / file_name).write_bytes(body)
    print(f"wrote {len(rendered)} files to {target}")
