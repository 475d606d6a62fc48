"""A real, short `uwsgi-layouts compare`: real nginx, uWSGI and wrk, a few seconds.

Checks that every recorded field is present and that no request failed, never the ratios
(performance is measured by `make compare`, not asserted by a timed test).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.test_cli import cli_in_process
from uwsgi_layouts.bench.kinds.closedloop import TAILS_KEPT, LiveRunner
from uwsgi_layouts.bench.kinds.closedloop import runners as closedloop_runners
from uwsgi_layouts.bench.load.scenarios import SCENARIOS
from uwsgi_layouts.bench.load.wrk import WrkProcess
from uwsgi_layouts.bench.results import load
from uwsgi_layouts.bench.stack import Lab
from uwsgi_layouts.bench.summary import Summary

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

REPO_ROOT = Path(__file__).resolve().parents[2]
CELL_FIELDS = {"layout", "concurrency", "repeat", "scenario", "rps", "requests", "duration_s", "latency_ms",
               "errors", "worker_requests", "balance", "cpu_s", "unloaded_latency_ms", "capacity_rps",
               "closed_loop_rps", "efficiency", "raw_output", "extra"}


def bench_processes() -> list[psutil.Process]:
    """Processes still naming a bench lab directory (/tmp/ul-bench-*) that is gone. A lab stops
    its stacks before it removes its directory, so these were left behind; other runs on this
    shared machine (other engineers' labs) still have their directories and are not counted."""
    found = []
    for p in psutil.process_iter(["cmdline", "cwd"]):
        text = " ".join(p.info["cmdline"] or []) + " " + (p.info["cwd"] or "")
        if any(not Path(lab).exists() for lab in re.findall(r"/tmp/ul-bench-[A-Za-z0-9_]+", text)):
            found.append(p)
    return found


def compare(out: Path, *args: str, timeout: float = 150, in_process: bool = True) -> subprocess.CompletedProcess:
    """compare through the console's main in this process (an interpreter of its own costs 2-3 s of
    CPU: numpy, scipy, matplotlib), or, ``in_process=False``, as a user runs it: the smoke test's run."""
    argv = ["compare", "--out", str(out), "--warmup", "1", "--repeats", "1", *args]
    if in_process:
        proc = cli_in_process(*argv)
    else:
        proc = subprocess.run([sys.executable, "-m", "uwsgi_layouts", *argv], cwd=REPO_ROOT, capture_output=True,
                              text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert not bench_processes(), "compare left processes running"
    return proc


def test_smoke_compare_records_every_field(tmp_path):
    out = tmp_path / "run"
    # 2-s cells of the article's own request (its query is asserted below): at load 14 on 2 cores a
    # 1-s cell of it held no answer at all.
    proc = compare(out, "--layouts", "2x2-shared,2x2-mapped", "--concurrency", "2", "--duration", "2",
                   in_process=False)
    data = json.loads((out / "results.json").read_text())
    assert data["format_version"] == 2 and data["kind"] == "compare" and data["arguments"]["complete"] is True
    for key in ("nproc", "nginx", "uwsgi", "wrk", "python", "git_commit", "kernel"):
        assert data["environment"][key], key
    assert data["workload"]["article"]["query"] == "rounds=5&fib=25&io_ms=10"
    cells = data["cells"]
    assert [(c["layout"], c["concurrency"]) for c in cells] == [("2x2-shared", 2), ("2x2-mapped", 2)]
    for cell in cells:
        assert CELL_FIELDS <= set(cell), CELL_FIELDS - set(cell)
        assert set(cell["latency_ms"]) >= {"p50", "p90", "p99", "p999", "max"}
        assert set(cell["errors"]) >= {"connect", "read", "write", "timeout", "status"}
        assert cell["errors"]["total"] == 0, cell["errors"]
        assert cell["requests"] > 0 and cell["rps"] > 0
        assert set(cell["worker_requests"]) == {"1", "2"}
        assert cell["cpu_s"]["app"] > 0
        assert 0 < cell["efficiency"] and cell["unloaded_latency_ms"] > 0
        assert (out / cell["raw_output"]).read_text().count("WRK_JSON") == 1
    for name in ("report.md", "report.txt", "throughput.png", "p99.png", "worker-share.png"):
        assert (out / name).stat().st_size > 0, name
    # the terminal shows the headline; the tables, the verdict's target table and the decisions are in report.txt
    assert "== the answer ==" in proc.stdout and "The article's claim" in proc.stdout
    assert "Verdict: the article's claim" in (out / "report.txt").read_text()
    assert "Verdict: the article's claim" not in proc.stdout
    # The judgement is stored beside the results, and the headline and report.txt say what it decided.
    summary = Summary.load(out / "summary.json")
    assert summary.matches(load(out / "results.json"))
    assert f"wrote {out / 'results.json'} and summary.json" in proc.stdout
    said = f"{summary.verdict.outcome.value}{' here' if summary.verdict.levels else ''}."
    assert said in " ".join(proc.stdout.split()) and said in " ".join((out / "report.txt").read_text().split())


def test_smoke_stall_scenario_separates_stalled_clients(tmp_path):
    out = tmp_path / "stall"
    compare(out, "--layouts", "2x2-overflow", "--concurrency", "2", "--duration", "3",
            "--scenario", "stall", "--stall-ms", "1000", "--stall-clients", "2")
    cell = json.loads((out / "results.json").read_text())["cells"][0]
    assert cell["scenario"] == "stall" and cell["errors"]["total"] == 0
    extra = cell["extra"]
    assert extra["stall_clients"] == 2 and extra["stalled_errors"] == 0
    assert extra["stalled_requests"] >= 2
    # Stalled requests wait ~1 s; healthy ones are measured separately and are far shorter.
    assert extra["stalled_p50_ms"] >= 1000 > cell["latency_ms"]["p50"]


def test_cells_carry_histograms_and_in_flight_samples(tmp_path):
    """Pooled tails and the mechanism from a real run: each cell's histogram holds exactly wrk's
    requests (its phantom coordinated-omission samples removed), the in-flight sampler kept its
    40-Hz schedule over the whole load (every tick between its first and last sample a sample, or
    counted as missed: a late answer skips ticks; a failed read's own tick is neither) and its
    samples span the load, and the report shows the new figures. The article's request with
    fib(15) for fib(25): each assertion is on what a cell records, none on a figure (the fib(25)
    request kept both cores busy for the cells' whole time); pile-up is recorded here, not
    provoked. 2-s cells. How many ticks the stats server answers in time is the machine's: at
    load 10-20 on 2 cores (8 test workers) it answered 39 of 80 (47.7 ms apart), at load 15 with
    6 CPU hogs 18 (117 ms apart)."""
    out = tmp_path / "tails"
    proc = compare(out, "--layouts", "2x4-shared,2x4-mapped", "--concurrency", "4", "--duration", "2",
                   "--key-duration", "2", "--scenario", "article", "--fib", "15", "--inflight-hz", "40", "--full")
    data = json.loads((out / "results.json").read_text())
    assert data["arguments"]["inflight_hz"] == 40.0
    for cell in data["cells"]:
        hist = cell["histogram"]
        latencies = [v for v, _ in hist]
        assert latencies == sorted(set(latencies)) and all(c > 0 for _, c in hist)
        assert sum(c for _, c in hist) == cell["requests"] > 0, cell["layout"]
        top_ms = cell["latency_ms"]["max"]
        assert abs(latencies[-1] / 1000 - top_ms) <= 0.005 * top_ms + 0.001  # the walk saw wrk's slowest request
        inflight = cell["inflight"]
        # The schedule kept: samples and missed ticks are, by the sampler's own count, every tick
        # between the first and the last read; the samples' times, an independent clock, say how
        # many 25-ms ticks that was (span / 25 ms + 1). A sampler that drifted instead of skipping,
        # ran at another rate or undercounted what it skipped, falls short by many ticks. Within 2
        # ticks, plus one mean spacing of the samples: a sample's time is when its answer came, and
        # the first and the last answer can be late by different amounts (a failed read's own tick
        # is counted by neither): at six test workers on 2 cores the count was 2.1 ticks off.
        span_ms = inflight["interval_ms"] * (inflight["samples"] - 1)
        ticks_by_clock = span_ms / 25 + 1
        slack = 2 + inflight["interval_ms"] / 25
        assert abs(inflight["samples"] + inflight["missed"] - ticks_by_clock) <= slack, inflight
        # Spread over the whole load (the first and last sample at most a few ticks from its ends),
        # and enough of them for a share to the nearest tenth. How many of the 80 ticks the stats
        # server answers in time is the machine's: 80 on a quiet one, 39 at load 10-20, 18 at load 15.
        assert span_ms >= 750 * cell["duration_s"], inflight
        assert inflight["samples"] >= 10, inflight
        assert inflight["threads"] == 4 and set(inflight["workers"]) == {"1", "2"}
        assert 0 <= inflight["pileup"] <= 1
        for shares in inflight["workers"].values():
            assert abs(sum(shares.values()) - 1) < 0.01 and max(int(n) for n in shares) <= 4
        assert "WRK_HISTOGRAM" in (out / cell["raw_output"]).read_text()
    text = (out / "report.txt").read_text()
    assert "p99 pooled" in text and "pile-up" in text and "requests in flight per worker (the mechanism)" in text
    assert "article, 4 connections (2P): 2x4-" in text
    assert "## Requests in flight per worker (the mechanism)" in (out / "report.md").read_text()
    assert (out / "inflight.png").stat().st_size > 0
    assert "pile-up" in proc.stdout


def test_a_cells_wrk_is_stopped_when_the_next_one_cannot_start(tmp_path, monkeypatch, run_dirs, free_ports):
    """A stall cell starts the healthy clients' wrk, then the stalled clients' own: when that second
    one cannot start (a missing binary, forced here in front of a real wrk on a real stack), the
    first is killed and reaped before the error leaves the cell, not left loading the stack for
    its 5 s."""
    first: list[WrkProcess] = []

    def the_second_cannot_start(*args, **kwargs) -> WrkProcess:
        if first:
            raise FileNotFoundError(2, "No such file or directory", "wrk")
        first.append(WrkProcess(*args, **kwargs))
        return first[0]

    monkeypatch.setattr(closedloop_runners, "WrkProcess", the_second_cannot_start)
    scenario = SCENARIOS["stall"].resolved(2)
    assert scenario.stall.clients  # the stalled clients get a wrk of their own
    with Lab(new_dir=run_dirs, free_ports=free_ports) as lab, lab.stack("1x2-mapped") as stack:
        runner = LiveRunner(lab, tmp_path, {"stall": scenario}, duration=5, warmup=1, timeout=5, inflight_hz=0)
        with pytest.raises(FileNotFoundError):
            runner.measure(stack, stack.layout, scenario, 2, 1, 10.0)
        assert first and first[0].proc.returncode is not None, "the first wrk is still running"


def test_peers_in_the_same_cells_as_uwsgi(tmp_path):
    """2x2-mapped (uWSGI), 2x2-gunicorn and 2x2-granian in one short run: every cell complete; a
    peer's per-worker counts come from the app's X-Worker-Pid header (they add up to wrk's
    requests, and name only worker numbers the stack has), its tree's CPU and memory are measured, it records no
    in-flight samples (no stats server); the report has the alternatives section.
    1-s cells, and the article's request with fib(15) for fib(25): every assertion is on what each
    cell records, none on a figure; at load 8-10 on 2 cores a 1-s cell of the CPU-bound request
    held 1-10 answers, of this one 34-68 (its 5 x 10 ms of sleep dominate it)."""
    out = tmp_path / "peers"
    proc = compare(out, "--layouts", "2x2-mapped,2x2-gunicorn,2x2-granian", "--concurrency", "2,4",
                   "--duration", "1", "--fib", "15", "--processes", "2", "--threads", "2",
                   "--scenario", "article,hello")
    data = json.loads((out / "results.json").read_text())
    cells = data["cells"]
    assert sorted((c["scenario"], c["layout"], c["concurrency"]) for c in cells) == sorted(
        (sc, x, lv) for sc in ("article", "hello") for x in ("2x2-mapped", "2x2-gunicorn", "2x2-granian")
        for lv in (2, 4))
    for cell in cells:
        where = (cell["scenario"], cell["layout"], cell["concurrency"])
        assert CELL_FIELDS <= set(cell), (where, CELL_FIELDS - set(cell))
        assert cell["errors"]["total"] == 0 and cell["status"]["2xx"] == cell["requests"] > 0, where
        # Both workers' numbers, or one: gthread keeps accepting while busy, so nginx's 2-4 kept-alive
        # connections may all sit on one gunicorn worker (README, "The peers").
        assert cell["worker_requests"] and set(cell["worker_requests"]) <= {"1", "2"}, where
        assert cell["cpu_s"]["app"] > 0 and "uwsgi" not in cell["cpu_s"], where
        mem = cell["memory"]
        assert 0 < mem["app_uss_mb"] <= mem["app_pss_mb"] < mem["app_rss_mb"], where
        assert set(mem["worker_pss_mb"]) == {"1", "2"} and all(w > 0 for w in mem["worker_pss_mb"].values()), where
        assert sum(mem["worker_pss_mb"].values()) < mem["app_pss_mb"], where  # the master counts too
        assert cell["histogram"] and cell["unloaded_latency_ms"] > 0, where
        if cell["layout"] == "2x2-mapped":
            assert cell["inflight"]["samples"] > 0, where
        else:
            # Counted by the header: exactly one count per answer wrk received, from the workers we saw.
            assert sum(cell["worker_requests"].values()) == cell["requests"], where
            assert "inflight" not in cell and "worker_pid_unmatched" not in cell["extra"], where
    text = (out / "report.txt").read_text()
    assert "against the alternatives (best uWSGI layout / each peer):" in text
    assert "scenario article:" in text and "scenario hello:" in text
    assert "Target at 4 connections (2P)" in text
    md = (out / "report.md").read_text()
    assert "## Against the alternatives" in md and "| 4 (2P) | 2x2-granian |" in md
    assert "against the alternatives" not in proc.stdout  # the headline only, without --full


def test_compare_with_a_budget_adds_rounds_of_undecided_key_comparisons_only(tmp_path):
    """--budget: the planned rounds, then rounds of the layouts in key comparisons still
    undecided (the best at each level against the runner-up), within the budget. Checks the
    record and the bounds, never which layout won.

    Two planned rounds: the first look then has one degree of freedom, so no key comparison can be
    decided or equivalent there, and a round is added whenever the budget holds one. A budget of
    0.9 min holds one or two past the planned rounds and the reserve for the reports (at load 10-16
    on 2 cores: the six planned cells took 21 s, each round added 11 s; 1.2 min held two or three
    and only made the test wait longer). The article's request with fib(15) for fib(25): the mechanism needs
    rounds, not a CPU-bound request; at load 8-10 a 1-s cell of it held 36-38 answers, of the
    CPU-bound one 1-10."""
    budget_min = 0.9
    out = tmp_path / "run"
    start = time.monotonic()
    proc = compare(out, "--layouts", "2x2-shared,2x2-mapped,1x2-shared", "--concurrency", "2", "--duration", "1",
                   "--repeats", "2", "--budget", str(budget_min), "--fib", "15", "--inflight-hz", "0")
    wall = time.monotonic() - start
    data = json.loads((out / "results.json").read_text())
    a, cells = data["arguments"], data["cells"]
    state = a["until_decided"]
    assert a["budget_min"] == budget_min and a["margin"] == 0.05 and 2 <= a["max_rounds"] <= 16
    assert state["stop"] in ("every key comparison settled", "the budget ended", "the budget ended with the planned "
                             "rounds", f"the fixed maximum of {a['max_rounds']} rounds", TAILS_KEPT)
    assert all(c["round"] == c["repeat"] for c in cells) and {c["round"] for c in cells if c["round"] <= 2} == {1, 2}
    planned = [c for c in cells if c["round"] <= 2]
    assert len(planned) == 6  # every layout in every planned round
    # Nothing can be settled on two planned rounds: no round added is only the budget's doing.
    assert state["rounds"] or state["stop"] == "the budget ended with the planned rounds", state
    for added in state["rounds"]:  # only the layouts of undecided key comparisons, and never all three
        here = {c["layout"] for c in cells if c["round"] == added["round"]}
        assert here == set(added["layouts"]) and len(here) == 2
    assert wall <= budget_min * 60 * 1.1 + 20  # the budget, kept (and the report written)
    samples = data["environment"]["machine"]["samples"]
    assert len(samples) == 6 + 2 * len(state["rounds"]) and all("loadavg_1m" in s for s in samples)
    text = " ".join((out / "report.txt").read_text().split())  # wrapped lines joined
    assert "decisions:" in text and f"Measured until decided within {budget_min:g} min" in text
    shown = " ".join(proc.stdout.split())
    assert "added until decided" in shown or "no round added" in shown  # the headline says it too


@pytest.mark.timeout(300)
def test_the_verdicts_tails_get_rounds_sized_from_their_rates_once_the_claim_is_judged(tmp_path):
    """The verdict's pair at P and 2P with 1-s cells of a 16-ms request: the rounds that judge the
    claim pool a few hundred requests per cell, then rounds for the tails run each thin cell for the
    seconds its rate says, within the budget; the claim stays judged on its own rounds. Checks the
    record and the bounds, never which layout won.

    The request's length sets the test's wall: a cell's tails need 1,200 requests whatever their
    length. It is no shorter than 16 ms, so that at 1 connection (under 62.5 requests a second) the
    claim's own rounds, at most 16 of 1 s, can never pool the 1,000 requests a p99 needs and leave
    the tails nothing to do. Under load the claim took up to 13 rounds here (load 18 on 2 cores):
    at 10 ms one cell at 1 connection had pooled 1,131 by then, and the other fell 2 s short."""
    out = tmp_path / "run"
    start = time.monotonic()
    proc = compare(out, "--processes", "1", "--threads", "2", "--layouts", "1x2-shared,1x2-mapped",
                   "--concurrency", "1,2", "--duration", "1", "--key-duration", "1", "--repeats", "2",
                   "--rounds", "1", "--fib", "0", "--io-ms", "16", "--budget", "2.5", "--inflight-hz", "0",
                   timeout=240)
    wall = time.monotonic() - start
    data = json.loads((out / "results.json").read_text())
    a, cells = data["arguments"], data["cells"]
    state = a["until_decided"]
    assert wall <= 2.5 * 60 * 1.1 + 20
    through = {int(lv): r for lv, r in state["judged_through"].items()}
    assert set(through) == {1, 2}
    assert state["tails"], f"no round for the tails: {state}"
    for record in state["tails"]:
        assert record["round"] > max(through.values())
        here = [c for c in cells if c["round"] == record["round"]]
        assert {c["layout"] for c in here} <= {"1x2-shared", "1x2-mapped"}
        for c in here:  # each as long as its rate said (whole seconds, at least the plan's second)
            asked = record["seconds"].get(c["layout"], {}).get("article", {}).get(str(c["concurrency"]), 1.0)
            assert c["duration_s"] == pytest.approx(asked, abs=0.5) and asked >= 1
    pooled = {}
    for c in cells:
        key = (c["layout"], c["concurrency"])
        pooled[key] = pooled.get(key, 0) + c["requests"]
    shown = " ".join(proc.stdout.split())
    if state["tails_stop"] == "every verdict cell's p99 quotable":
        assert all(n >= 1000 for n in pooled.values()), pooled
        assert "every verdict cell's pooled p99 quotable" in shown
    else:
        # ties at a p99 do not stop the rounds: they size the next one from the share above it
        assert state["tails_stop"] in ("the budget ended", "3 rounds for the tails")
        assert "Tails: p99 not quotable (need 1,000 requests):" in shown
    # the claim is judged on its own rounds: every comparison of the verdict rests on those only
    report = (out / "report.txt").read_text()
    assert "t over" in report
    rounds_shown = {int(n) for n in re.findall(r"paired over (\d+)", shown)} | {
        int(n) for n in re.findall(r"paired over \d+ and (\d+)", shown)}
    assert rounds_shown and max(rounds_shown) <= max(through.values())
