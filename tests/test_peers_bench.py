"""Peers in compare, as pure logic: nothing is started, nothing is timed.

SYNTHETIC data, labelled: ``peer_results`` builds a compare run of made-up cells (uWSGI layouts
2x4-shared and 2x4-mapped against 2x4-gunicorn and 2x4-granian, scenarios article and hello,
latencies drawn from lognormal distributions of known scale), shaped so each outcome the
"against the alternatives" section can state occurs once: uWSGI ahead beyond noise, within
noise, a peer ahead (by a known margin), the target passed and missed. wrk's JSON lines are
written here as report.lua prints them; the pid maps are invented. The one stored input is the
version-1 fixture ``results-small.json`` (SYNTHETIC too, written before the peers), which must
still load and render with the server-neutral names.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from tests.tunefakes import FIXTURE_DIGITS
from uwsgi_layouts.bench.analysis import alternatives, group_cells, memory_cost, server_of
from uwsgi_layouts.bench.kinds.closedloop import LiveRunner
from uwsgi_layouts.bench.load import scenarios as sc
from uwsgi_layouts.bench.load.wrk import compress, to_run, worker_pid_counts
from uwsgi_layouts.bench.observe import Snapshot, requests_by_worker
from uwsgi_layouts.bench.report import markdown_lines, terminal_lines
from uwsgi_layouts.bench.report.peers import alternatives_lines, target_rows
from uwsgi_layouts.bench.results import Cell, Results, load, server_neutral

FIXTURES = Path(__file__).parent / "fixtures"
V1 = FIXTURES / "results-small.json"

# ------------------------------------------------------------------------------ synthetic run

# scenario -> layout -> (req/s of the 3 repeats, latency scale); the same at 2 and 4 connections.
SHAPE = {
    "article": {  # ~200 ms requests: uWSGI's mapped layout ahead of gunicorn, level with granian
        "2x4-shared": ((13.0, 14.0, 15.0), 1.5),
        "2x4-mapped": ((19.0, 20.0, 21.0), 1.0),
        "2x4-gunicorn": ((15.0, 16.0, 17.0), 1.6),
        "2x4-granian": ((18.6, 19.5, 20.4), 1.02),
        # gunicorn without nginx's keep-alive: a new accept per request spreads them (peer_results'
        # default leaves it out; the variant tests add it)
        "2x4-gunicorn@keepalive=off": ((19.6, 20.5, 21.4), 1.05),
    },
    "hello": {  # ~2 ms answers: gunicorn ahead of every uWSGI layout
        "2x4-shared": ((1900.0, 2000.0, 2100.0), 1.0),
        "2x4-mapped": ((1950.0, 2050.0, 2150.0), 1.0),
        "2x4-gunicorn": ((2900.0, 3000.0, 3100.0), 0.6),
        "2x4-granian": ((2000.0, 2100.0, 2200.0), 0.95),
        "2x4-gunicorn@keepalive=off": ((1300.0, 1400.0, 1500.0), 1.5),  # a connect per tiny request
    },
}
MEDIAN_US = {"article": 200_000, "hello": 2_000}


def synthetic_cell(rng, scenario: str, layout: str, level: int, repeat: int) -> Cell:
    rates, scale = SHAPE[scenario][layout]
    rps = rates[repeat - 1]
    n = int(rps * 10) if scenario == "article" else 2000
    values = np.round(rng.lognormal(np.log(MEDIAN_US[scenario] * scale), 0.3, n)).astype(int)
    hist = compress(zip(*np.unique(values, return_counts=True), strict=True), digits=FIXTURE_DIGITS)
    hist = tuple((int(v), int(c)) for v, c in hist)
    ms = sorted(values / 1000)
    pick = lambda q: float(ms[min(len(ms) - 1, int(q * len(ms)))])  # noqa: E731
    peer = server_of(layout) != "uwsgi"
    return Cell(layout=layout, concurrency=level, repeat=repeat, scenario=scenario, duration_s=n / rps, requests=n,
                rps=rps, latency_ms={"p50": pick(0.5), "p90": pick(0.9), "p99": pick(0.99), "p999": pick(0.999),
                                     "max": float(ms[-1])},
                errors={}, worker_requests={"1": n // 2, "2": n - n // 2}, cpu_s={"app": 1.0, "nginx": 0.1},
                unloaded_latency_ms=MEDIAN_US[scenario] / 1000, capacity_rps=2 * rps, closed_loop_rps=2 * rps,
                efficiency=0.5, histogram=hist, round=repeat,
                memory={"app_pss_mb": 30.0 if peer else 22.0, "nginx_pss_mb": 2.5},
                inflight={} if peer else {"samples": 50, "pileup": 0.1, "threads": 4,
                                          "workers": {"1": {"0": 0.5, "1": 0.5}, "2": {"0": 0.5, "1": 0.5}}})


def peer_results(layouts=None, scenarios=("article", "hello"), demo=True) -> Results:
    rng = np.random.default_rng(5)
    layouts = layouts or [x for x in SHAPE["article"] if "@" not in x]
    cells = [synthetic_cell(rng, s, x, lv, r) for r in (1, 2, 3) for s in scenarios for x in layouts for lv in (2, 4)]
    return Results(environment={"nproc": 2}, workload={s: sc.SCENARIOS[s].to_dict() for s in scenarios},
                   arguments={"layouts": layouts, "concurrency": [2, 4], "repeats": 3, "duration": 10,
                              "processes": 2, "threads": 4, "scenarios": list(scenarios),
                              "app": {"app": "app.wsgi:application", "demo": demo}},
                   cells=tuple(cells))


@pytest.fixture(scope="module")
def results() -> Results:
    return peer_results()


def text_of(lines: list[str]) -> str:
    return " ".join(" ".join(lines).split())  # wrapped lines joined


# ------------------------------------------------------------------------------ the section


def test_servers_are_read_from_layout_names():
    assert [server_of(x) for x in ("2x4-mapped", "2x4-thunder@lock_engine=ipcsem", "2x4-gunicorn@reuse_port=on",
                                   "1x1-granian", "junk", "2x4-nosuch")] == \
        ["uwsgi", "uwsgi", "gunicorn", "granian", "", ""]


def test_best_uwsgi_layout_against_each_peer_at_p_and_2p(results):
    alt = alternatives(results, "article")
    assert alt.levels == (2, 4) and alt.peers == ["gunicorn", "granian"] and not alt.missing
    assert {m.uwsgi.layout for m in alt.matchups} == {"2x4-mapped"}
    by = {(m.concurrency, m.peer.layout): m for m in alt.matchups}
    gunicorn, granian = by[(4, "2x4-gunicorn")], by[(4, "2x4-granian")]
    # the geometric mean of the per-round ratios 19/15, 20/16, 21/17
    assert gunicorn.rps.outcome == "better"
    # the geometric mean of the per-round ratios, each round weighted by its requests (nearly equal here)
    assert gunicorn.rps.ratio == pytest.approx((19 * 20 * 21 / 15 / 16 / 17) ** (1 / 3), rel=1e-3)
    assert gunicorn.p99.outcome == "better" and gunicorn.p99.ratio < 0.8
    assert granian.rps.outcome == "equivalent" and granian.p99.outcome == "undecided"
    # The target pits the best uWSGI layout against the best peer (highest throughput): granian.
    assert alt.target.peer.layout == "2x4-granian" and alt.target.concurrency == 4
    assert alt.layout_spread.ratio == pytest.approx((19 * 20 * 21 / 13 / 14 / 15) ** (1 / 3), rel=1e-3)
    assert alt.worst_uwsgi.layout == "2x4-shared"
    hello = alternatives(results, "hello")
    assert hello.target.peer.layout == "2x4-gunicorn" and hello.target.rps.outcome == "worse"


def test_section_says_who_is_ahead_and_by_how_much(results):
    text = text_of(alternatives_lines(results))
    assert "against the alternatives (best uWSGI layout / each peer):" in text
    # uWSGI ahead beyond noise, with the margin:
    assert ("gunicorn: at 2 connections (P) the best uWSGI layout, 2x4-mapped, against gunicorn's best variant, "
            "2x4-gunicorn, had 1.25x (1.21–1.29) its throughput (uWSGI ahead by 25%)") in text
    # equivalent, and undecided: no winner named
    assert "granian: at 2 connections (P)" in text and "its throughput (equivalent within ±5%)" in text
    assert "its p99 (undecided)" in text
    # a peer ahead: the sentence starts with it and says by how much
    assert "gunicorn is ahead on throughput at 2 and 4 connections and on p99 at 2 and 4 connections" in text
    assert "(gunicorn ahead by 46%)" in text
    # one sentence per peer and scenario, and one saying that a single variant stands for the peer
    sentences = lambda peer: text.count(f"- {peer}: at") + text.count(f"- {peer} is ahead")  # noqa: E731
    assert sentences("gunicorn") == 2 and sentences("granian") == 2
    assert ("gunicorn: one variant measured (2x4-gunicorn), so it stands for gunicorn: measure "
            "2x4-gunicorn@keepalive=off too, so that gunicorn is compared at its best.") in text


def test_each_peer_is_compared_at_its_best_measured_variant():
    # Without keep-alive gunicorn wins the article mix (its connections no longer stick to one
    # worker), with it the tiny hello: the best variant depends on the workload, and is said.
    both = peer_results([*(x for x in SHAPE["article"] if "@" not in x), "2x4-gunicorn@keepalive=off"])
    article, hello = alternatives(both, "article"), alternatives(both, "hello")
    assert article.peers == ["gunicorn", "granian"]
    best = {(a.scenario, c.concurrency, c.server): c for a in (article, hello) for c in a.choices}
    off = best[("article", 4, "gunicorn")]
    assert off.best.layout == "2x4-gunicorn@keepalive=off" and off.runner_up.layout == "2x4-gunicorn"
    assert off.rps.outcome == "better"
    assert off.rps.ratio == pytest.approx((19.6 * 20.5 * 21.4 / 15 / 16 / 17) ** (1 / 3), rel=1e-3)
    assert best[("hello", 4, "gunicorn")].best.layout == "2x4-gunicorn"
    assert best[("article", 4, "granian")].runner_up is None
    # The matchups and the target take the best variant: in the article mix no longer the one
    # uWSGI beat by 25%, but one it cannot be told from.
    by = {(m.concurrency, server_of(m.peer.layout)): m for m in article.matchups}
    assert by[(4, "gunicorn")].peer.layout == "2x4-gunicorn@keepalive=off"
    assert by[(4, "gunicorn")].rps.outcome in ("equivalent", "undecided")
    assert len(article.matchups) == 4  # two levels x two peers: never a matchup per variant
    assert article.target.peer.layout in ("2x4-gunicorn@keepalive=off", "2x4-granian")
    text = text_of(alternatives_lines(both))
    assert ("gunicorn's variants (2x4-gunicorn@keepalive=off, 2x4-gunicorn): at 2 connections (P) "
            "2x4-gunicorn@keepalive=off, 1.28x (1.22–1.34) the throughput of 2x4-gunicorn (better beyond "
            "noise)") in text
    assert "gunicorn's variants (2x4-gunicorn, 2x4-gunicorn@keepalive=off): at 2 connections (P) 2x4-gunicorn" in text
    assert "against gunicorn's best variant, 2x4-gunicorn@keepalive=off, had" in text


def test_what_matters_reads_layout_and_server_ratios(results):
    text = text_of(alternatives_lines(results))
    assert ("article, 4 connections (2P): the choice of uWSGI layout moved throughput 1.43x (1.35–1.51) (best "
            "2x4-mapped / worst 2x4-shared: beyond noise)") in text
    assert "here the layout matters more than the server." in text
    assert "hello, 4 connections (2P)" in text and "here the server matters more than the layout." in text


def test_target_pass_and_miss_with_the_margin(results):
    alt = alternatives(results, "article")
    rows = {r[0]: r for r in target_rows(alt.target)}
    rps = rows["throughput >= 1.05x the best peer's"]
    assert rps[2] == "MISS (short by 0.02x)" and rps[1].endswith("equivalent")
    # 95% t over 3 rounds: the p99 interval (0.81–1.33) straddles 0.85x (the 75% range missed it), and
    # says by how much: its low end 4% past 0.85x, its high end 57% short of it
    assert rows["p99 <= 0.85x the best peer's"][2] == "undecided: 4% past, 57% short"
    # Without granian the best peer is gunicorn: both targets pass, with their margins.
    no_granian = peer_results(["2x4-shared", "2x4-mapped", "2x4-gunicorn"], scenarios=("article",))
    rows = {r[0]: r for r in target_rows(alternatives(no_granian, "article").target)}
    assert rows["throughput >= 1.05x the best peer's"][2] == "pass (by 0.20x)"
    assert rows["throughput >= 1.05x the best peer's"][1].endswith("uWSGI ahead")
    # each round's p99 rests on ~200 requests: at 95% over 3 rounds its interval straddles 0.85x
    assert rows["p99 <= 0.85x the best peer's"][2].startswith("undecided: ")
    text = text_of(alternatives_lines(no_granian))
    assert "Target at 4 connections (2P), the best uWSGI layout 2x4-mapped" in text and "MISS" not in text


def test_target_only_for_the_demo_apps_article_request(results):
    text = text_of(alternatives_lines(results))
    assert text.count("Target at") == 1  # article only; hello shows ratios, no target
    other_app = peer_results(demo=False)
    assert "Target at" not in text_of(alternatives_lines(other_app))


def test_markdown_section_has_spreads_and_sits_after_the_verdict(results):
    md = "\n".join(markdown_lines(results, []))
    assert md.index("## Verdict") < md.index("## Against the alternatives") < md.index("## How to reproduce")
    section = md[md.index("## Against the alternatives"):md.index("## How to reproduce")]
    assert "### Scenario: article" in section and "### Scenario: hello" in section
    assert "| 4 (2P) | 2x4-gunicorn | 16.0 (15.0–17.0) ~ |" in section  # the peer's median and range
    assert "1.25x (1.21–1.29): uWSGI" in section and "equivalent" in section and "undecided" in section
    assert "| throughput >= 1.05x the best peer's |" in section


def test_no_section_without_peers_or_without_uwsgi():
    only_uwsgi = peer_results(["2x4-shared", "2x4-mapped"], scenarios=("article",))
    only_peers = peer_results(["2x4-gunicorn", "2x4-granian"], scenarios=("article",))
    for r in (only_uwsgi, only_peers):
        assert alternatives_lines(r) == [] and alternatives(r, "article") is None
        assert "alternatives" not in "\n".join(terminal_lines(r)).lower()


def test_too_few_rounds_name_no_winner():
    one = peer_results(scenarios=("article",))
    one = dataclasses.replace(one, cells=tuple(c for c in one.cells if c.repeat <= 1))
    text = text_of(alternatives_lines(one))
    assert "too few rounds: no interval, no winner" in text and "uWSGI ahead by" not in text
    # Two rounds give a t interval with 1 degree of freedom: wide, deciding only what the two agree on.
    two = peer_results(scenarios=("article",))
    two = dataclasses.replace(two, cells=tuple(c for c in two.cells if c.repeat <= 2))
    text = text_of(alternatives_lines(two))
    assert "too few rounds" not in text and "0.98x (0.12–8.15) undecided" in text


def test_terminal_report_of_a_run_with_peers(results):
    lines = terminal_lines(results)
    text = text_of(lines)
    assert "against the alternatives" in text and "Verdict:" in text
    assert max(len(line) for line in lines) <= 110
    # the memory fit never mixes servers: uWSGI's two layouts cannot be fitted, peers are not added in
    assert memory_cost(results, "article") is None


# ------------------------------------------------------------------------------ per-worker counts


def wrk_line(worker_pids: dict | None, requests: int = 10) -> str:
    """A WRK_JSON line as report.lua prints it (SYNTHETIC figures)."""
    data = {"duration_us": 2_000_000, "requests": requests, "bytes": 1000,
            "errors": {"connect": 0, "read": 0, "write": 0, "status": 0, "timeout": 0},
            "latency_us": {"min": 1000, "max": 9000, "mean": 2000.0, "stdev": 10.0, "p50": 2000, "p90": 3000,
                           "p99": 8000, "p999": 9000},
            "status": {"2xx": requests, "3xx": 0, "4xx": 0, "5xx": 0}}
    if worker_pids is not None:
        data["worker_pids"] = worker_pids
    return "WRK_JSON " + json.dumps(data)


def test_header_counts_are_parsed_from_wrks_json_line():
    run = to_run(json.loads(wrk_line({"4242": 6, "4243": 4})[len("WRK_JSON "):]), "raw")
    assert run.worker_pids == {4242: 6, 4243: 4}
    assert worker_pid_counts({"worker_pids": {}}) == {}
    assert worker_pid_counts({}) == {}  # an older script without the count
    assert worker_pid_counts({"worker_pids": {"12": 3, "x1": 5, "13": 0, "14": True, "15": 2}}) == {12: 3, 15: 2}


def test_pids_map_to_worker_numbers_across_a_respawn():
    before, after = {1: 100, 2: 200}, {1: 100, 2: 300}  # worker 2 respawned during the cell: 200 -> 300
    counts, unmatched = requests_by_worker({100: 5, 200: 3, 300: 4, 999: 2}, before, after)
    assert counts == {"1": 5, "2": 7} and unmatched == 2
    assert requests_by_worker({}, before) == ({}, 0)  # an app without the header: absent, not zeros
    assert list(requests_by_worker({300: 1, 100: 1}, after)[0]) == ["1", "2"]  # in worker order


def test_a_peer_cell_counts_workers_from_the_header(tmp_path):
    """make_cell with stand-in snapshots (no process): a peer (no stats counters, pids known)
    counts from wrk's header count; uWSGI (stats counters) from the stats server's deltas."""
    runner = LiveRunner(None, tmp_path, {}, duration=2, warmup=1, timeout=5)
    run = to_run(json.loads(wrk_line({"100": 6, "200": 3, "555": 1})[len("WRK_JSON "):]), "raw")
    peer = runner.make_cell("2x2-gunicorn", 2, 1, "article", run, 0.01, Snapshot({}, 1.0, 0.5, {1: 100, 2: 200}),
                            Snapshot({}, 2.5, 0.7, {1: 100, 2: 200}), 100.0, "raw/x.txt")
    assert peer.worker_requests == {"1": 6, "2": 3} and peer.extra == {"worker_pid_unmatched": 1}
    assert peer.cpu_s == pytest.approx({"app": 1.5, "nginx": 0.2, "wrk": 0.01})
    uwsgi = runner.make_cell("2x2-mapped", 2, 1, "article", run, 0.01, Snapshot({"1": 10, "2": 10}, 1.0, 0.5),
                             Snapshot({"1": 15, "2": 14}, 2.0, 0.6), 100.0, "raw/x.txt")
    assert uwsgi.worker_requests == {"1": 5, "2": 4} and uwsgi.extra == {}
    no_header = to_run(json.loads(wrk_line({})[len("WRK_JSON "):]), "raw")
    mute = runner.make_cell("2x2-granian", 2, 1, "article", no_header, 0.01, Snapshot({}, 1.0, 0.5, {1: 100}),
                            Snapshot({}, 2.0, 0.6, {1: 100}), 100.0, "raw/x.txt")
    assert mute.worker_requests == {}
    g = group_cells(Results({}, {}, {}, cells=(mute,)))[0]
    assert g.cv.n == 0 and g.worker_share == {}  # n/a, not a perfect 0
    assert "n/a" in "\n".join(terminal_lines(Results({}, {}, {}, cells=(mute,))))


def test_snapshot_of_a_peer_reads_pids_not_the_stats_server():
    calls = []

    class PeerStack:  # a stand-in: no process behind it
        layout = SimpleNamespace(has_stats=False)
        pids = {"app": 1, "nginx": 1}  # pid 1 exists: tree_cpu_seconds reads it (or 0.0 if not allowed)
        app_pids = [1]

        def stats(self):
            calls.append("stats")
            raise AssertionError("a peer has no stats server")

        def worker_pids(self):
            return {1: 11, 2: 12}

        def cgroup_reading(self):  # no @cpus/@memory limit
            return None

    snap = Snapshot.take(PeerStack())
    assert snap.workers == {} and snap.pids == {1: 11, 2: 12} and calls == []


# ------------------------------------------------------------------------------ naming migration


def test_legacy_uwsgi_keys_are_renamed_when_a_cell_is_built():
    assert server_neutral("cpu_s", {"uwsgi": 2.0, "nginx": 1.0}) == {"nginx": 1.0, "app": 2.0}
    assert server_neutral("memory", {"uwsgi_pss_mb": 40.0, "uwsgi_rss_mb": 80.0, "worker_pss_mb": {"1": 9.0}}) == \
        {"worker_pss_mb": {"1": 9.0}, "app_pss_mb": 40.0, "app_rss_mb": 80.0}
    # a record holding both names keeps the new one
    assert server_neutral("cpu_s", {"uwsgi": 2.0, "app": 3.0}) == {"app": 3.0}
    assert server_neutral("cpu_s", {"app": 3.0}) == {"app": 3.0}


def test_old_files_load_and_render_with_the_new_names(tmp_path):
    v1 = load(V1)  # format version 1, cpu_s["uwsgi"] in the file
    assert json.loads(V1.read_text())["cells"][0]["cpu_s"].get("uwsgi") is not None
    assert all("app" in c.cpu_s and "uwsgi" not in c.cpu_s for c in v1.cells)
    # a version-2 file written before the peers: memory under uwsgi_* keys
    data = json.loads(V1.read_text())
    data["format_version"], data["kind"] = 2, "compare"
    for cell in data["cells"]:
        cell["memory"] = {"uwsgi_pss_mb": 52.0, "uwsgi_uss_mb": 42.0, "uwsgi_rss_mb": 101.0, "nginx_pss_mb": 3.0,
                          "worker_pss_mb": {"1": 22.5}}
    path = tmp_path / "old.json"
    path.write_text(json.dumps(data))
    old = load(path)
    assert old.cells[0].memory["app_pss_mb"] == 52.0 and "uwsgi_pss_mb" not in old.cells[0].memory
    text = "\n".join(terminal_lines(old))
    assert "memory after load" in text and "52.0" in text and "Verdict:" in text
    assert "server PSS MB" in "\n".join(markdown_lines(old, []))
    saved = json.loads(old.save(tmp_path / "again.json").read_text())  # written back with the new names
    assert "app_pss_mb" in saved["cells"][0]["memory"] and "app" in saved["cells"][0]["cpu_s"]


def test_hello_is_the_trivial_request():
    hello = sc.SCENARIOS["hello"]
    assert hello.workload.query == "rounds=0&fib=0&io_ms=0" and hello.stall is None and hello.files is None
