"""scripts/overhead.py's pure parts on SYNTHETIC inputs: the arms it builds (and which builds it
leaves out), the per-role CPU deltas, perf's report read back into libraries per role, and the
tables on made-up cells (each option against the baseline, paired; each peer at its best
variant). Nothing is started or timed here (tests/integration/test_overhead.py runs the stacks).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
from pathlib import Path

import pytest

from uwsgi_layouts.bench.analysis import cell_cpu_ms, compare_groups, group_cells
from uwsgi_layouts.bench.load import scenarios as sc
from uwsgi_layouts.bench.results import Cell, Results

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "overhead.py"
_spec = importlib.util.spec_from_file_location("overhead_script", SCRIPT)
overhead = importlib.util.module_from_spec(_spec)
sys.modules["overhead_script"] = overhead  # its dataclasses look their module up
_spec.loader.exec_module(overhead)

OURS = {"binary": "/venv/bin/uwsgi", "cflags": ["-O2"], "routing": True}  # PCRE: required now


def test_arms_one_change_each_and_both_variants_of_each_peer():
    arms = overhead.make_arms("2x4-mapped", "tcp", [{"profile": "o3", "cflags": ["-O2", "-O3"], "routing": False,
                                                     "binary": "/b/o3/bin/uwsgi"}], OURS)
    by = {a.name: a for a in arms}
    assert list(by) == ["baseline", "sampler-off", "http", "http11", "unix", "build-o3", "gunicorn",
                        "gunicorn-keepalive-off", "granian", "granian-keepalive-off"]
    assert by["baseline"].spec == by["sampler-off"].spec == "2x4-mapped"
    assert (by["baseline"].inflight_hz, by["sampler-off"].inflight_hz) == (25.0, 0.0)
    assert by["sampler-off"].label == "2x4-mapped+sampler-off"  # distinct cells, the same stack
    assert by["http11"].spec == "2x4-mapped@protocol=http11" and by["unix"].spec == "2x4-mapped@transport=unix"
    assert by["build-o3"].spec == "2x4-mapped@uwsgi_bin=/b/o3/bin/uwsgi" and "-O3" in by["build-o3"].what
    assert by["gunicorn-keepalive-off"].spec == "2x4-gunicorn@keepalive=off" and by["gunicorn-keepalive-off"].peer
    assert "tcp" in overhead.make_arms("2x4-mapped", "unix", [], OURS)[4].name
    assert [a.name for a in overhead.select_arms(arms, "http,gunicorn")] == ["baseline", "http", "gunicorn"]
    with pytest.raises(overhead.BadArgument, match="arms: unknown arm 'o2'"):
        overhead.select_arms(arms, "o2")


def test_builds_the_same_as_ours_are_left_out_with_a_note(tmp_path):
    for profile, cflags, routing in (("o3", ["-O2", "-O3"], True), ("nopcre", ["-O2"], False),
                                     ("pcre", ["-O2"], True), ("static", ["-O2"], True)):
        (tmp_path / profile / "bin").mkdir(parents=True)
        (tmp_path / profile / "bin" / "uwsgi").write_text("")
        (tmp_path / profile / "BUILD.json").write_text(json.dumps({"profile": profile, "cflags": cflags,
                                                                   "routing": routing}))
    builds, notes = overhead.find_builds(tmp_path, OURS)
    # static has our flags but another libpython (the static one): an arm all the same
    assert [b["profile"] for b in builds] == ["o3", "static"]
    static = overhead.make_arms("2x4-mapped", "unix", builds, OURS)[-5]
    assert static.name == "build-static" and "static libpython" in static.what
    # without PCRE a uWSGI cannot run our uwsgi.ini (its route-if-not lines): never an arm
    assert notes == ["build nopcre: no internal routing (no PCRE), so it cannot run our uwsgi.ini (the route-if-not "
                     "lines are required): left out",
                     "build pcre: the same flags and PCRE as ours, nothing to compare"]
    assert overhead.find_builds(tmp_path / "none", OURS) == ([], [])


def test_role_deltas_count_processes_alive_at_both_ends():
    before = {"nginx": {1: (1.0, 2.0)}, "master": {2: (0.5, 0.5)}, "workers": {3: (1.0, 1.0), 4: (9.0, 9.0)}}
    after = {"nginx": {1: (1.5, 2.25)}, "master": {2: (0.5, 0.75)}, "workers": {3: (3.0, 1.5), 5: (0.25, 0.0)}}
    assert overhead.role_deltas(before, after) == {
        "cpu_nginx_user_s": 0.5, "cpu_nginx_sys_s": 0.25, "cpu_master_user_s": 0.0, "cpu_master_sys_s": 0.25,
        # worker 4 died (its CPU is lost), worker 5 is new (all of its CPU is in the window)
        "cpu_workers_user_s": 2.25, "cpu_workers_sys_s": 0.5}


PERF_REPORT = """# Samples: 1K of event 'cpu-clock'
# Overhead|     Samples|    Pid:Command|Shared Object
 4.05%  | 77         |  101:uwsgi  |[kernel.kallsyms]
 1.95%  | 37         |  101:uwsgi  |libpython3.11.so.1.0
 0.16%  | 3          |  101:uwsgi  |/venv/bin/uwsgi
 0.47%  | 9          |  102:uwsgi  |libc.so.6
 2.00%  | 40         |  200:nginx  |[kernel.kallsyms]
 0.50%  | 10         |  200:nginx  |nginx
 0.10%  | 2          |  999:other  |libz.so.1
"""


def test_perf_report_is_read_into_libraries_per_role(monkeypatch):
    monkeypatch.setattr(overhead, "thread_group", lambda tid: {102: 101}.get(tid, tid))  # 102: a thread of 101
    got = overhead.parse_perf_report(PERF_REPORT, {101: "workers", 200: "nginx"}, "uwsgi")
    assert got == {"workers": {"kernel": 77, "libpython": 37, "uwsgi": 3, "libc": 9},
                   "nginx": {"kernel": 40, "nginx": 10}, "other processes": {"other": 2}}
    assert overhead.dso_group("/usr/lib/python3/_granian.cpython-311.so", "granian") == "granian"
    assert overhead.dso_group("[vdso]", "uwsgi") == "kernel"


# --- the tables on SYNTHETIC cells -----------------------------------------------------------------

# label -> req/s of rounds 1..4, CPU seconds (app, nginx) per 1000 requests
SHAPE = {
    "2x4-mapped": ((100, 110, 120, 130), (0.10, 0.05)),
    "2x4-mapped+sampler-off": ((101, 111, 121, 131), (0.095, 0.05)),  # within 5%: equivalent
    "2x4-mapped@protocol=http11": ((130, 143, 156, 169), (0.06, 0.03)),  # 1.3x, leaner
    "2x4-gunicorn": ((60, 66, 72, 78), (0.30, 0.03)),
    "2x4-gunicorn@keepalive=off": ((50, 55, 60, 65), (0.35, 0.06)),
}


def synthetic_results() -> Results:
    cells = []
    for label, (rates, (app, nginx)) in SHAPE.items():
        for r, rps in enumerate(rates, 1):
            n = rps * 10
            extra = {"cpu_nginx_user_s": nginx * n / 2000, "cpu_nginx_sys_s": nginx * n / 2000,
                     "cpu_master_user_s": 0.0, "cpu_master_sys_s": 0.0, "cpu_workers_user_s": app * n / 2000,
                     "cpu_workers_sys_s": app * n / 2000}
            cells.append(Cell(layout=label, concurrency=4, repeat=r, scenario="hello", duration_s=10.0, requests=n,
                              rps=float(rps), latency_ms={"p50": 1.0, "p90": 2.0, "p99": 3.0, "p999": 4.0, "max": 5.0},
                              errors={}, worker_requests={}, cpu_s={"app": app * n / 1000, "nginx": nginx * n / 1000,
                                                                     "wrk": 1.0},
                              unloaded_latency_ms=1.0, capacity_rps=0.0, closed_loop_rps=0.0, efficiency=0.0,
                              extra=extra, round=r))
    return Results(environment={"nproc": 2}, workload={"hello": sc.SCENARIOS["hello"].to_dict()},
                   arguments={"layouts": list(SHAPE), "concurrency": [4], "repeats": 4, "processes": 2,
                              "threads": 4, "scenarios": ["hello"]}, cells=tuple(cells))


def test_tables_judge_each_option_against_the_baseline_and_each_peer_at_its_best():
    arms = [a for a in overhead.make_arms("2x4-mapped", "tcp", [], OURS) if a.label in SHAPE]
    text = "\n".join(overhead.tables(synthetic_results(), arms, [], markdown=False))
    first = text.strip().split("\n\n")[0]  # each option against the baseline
    rows = {line.split()[0]: line for line in first.splitlines()[3:]}
    assert rows["sampler-off"].endswith("1.01x (1.01–1.01): equivalent  0.97x (0.97–0.97): equivalent")
    http11 = rows["http11"]
    assert "1.30x (1.30–1.30): better" in http11 and "0.60x (0.60–0.60): better" in http11
    # CPU per request by component: the baseline's 0.15 ms split as made up
    components = text.strip().split("\n\n")[1]
    baseline = next(x for x in components.splitlines() if x.split()[0] == "baseline")
    assert baseline.split()[1:] == ["0.025", "0.025", "0.000", "0.050", "0.050", "0.150"]
    # gunicorn's best variant is the keep-alive one here (higher throughput in every round)
    peer = [x for x in text.splitlines() if "CPU per request (baseline)" in x][0]
    assert "2x4-gunicorn (over 2x4-gunicorn@keepalive=off: 1.20x" in peer and "0.45x" in peer and "pass" in peer
    leanest = [x for x in text.splitlines() if "CPU per request (leanest)" in x][0]
    assert leanest.split()[4] == "http11" and "0.27x" in leanest
    md = "\n".join(overhead.tables(synthetic_results(), arms, [], markdown=True))
    assert "### hello at 4 connections: each option against the baseline" in md and "| http11 |" in md


def test_cpu_per_request_is_a_paired_figure_where_lower_is_better():
    r = synthetic_results()
    g = {x.layout: x for x in group_cells(r)}
    cpu = compare_groups(g["2x4-mapped@protocol=http11"], g["2x4-mapped"], "cpu")
    assert cpu.outcome == "better" and cpu.ratio == pytest.approx(0.6) and cpu.method == "t"
    assert compare_groups(g["2x4-mapped"], g["2x4-mapped@protocol=http11"], "cpu").outcome == "worse"
    cell = r.cells[0]  # the serving side only: wrk, the client, is left out
    assert cell_cpu_ms(cell) == pytest.approx(1000 * (cell.cpu_s["app"] + cell.cpu_s["nginx"]) / cell.requests)
    assert cell_cpu_ms(dataclasses.replace(cell, requests=0)) == 0.0
