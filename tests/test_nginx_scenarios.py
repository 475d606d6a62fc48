"""The nginx scenarios' pure logic: resolution, defaults, layout lists, weighted path lists,
per-worker spread, and the report sections, from a SYNTHETIC results set (made up below,
never measured)."""

from __future__ import annotations

import json

import pytest

from tests.refusals import names, refusal
from uwsgi_layouts.bench import cli as bench_cli
from uwsgi_layouts.bench import options
from uwsgi_layouts.bench.dataset import make_dataset
from uwsgi_layouts.bench.kinds import compare
from uwsgi_layouts.bench.load import scenarios as sc
from uwsgi_layouts.bench.load.files import request_paths, weighted_paths
from uwsgi_layouts.bench.observe import spread_extra
from uwsgi_layouts.bench.report import markdown_lines, terminal_lines
from uwsgi_layouts.bench.report import nginx as nr
from uwsgi_layouts.bench.results import Cell, Errors, Latency, Results, load

# --- scenarios and the CLI plan ------------------------------------------------------------------


def test_files_alias_expands_to_four_routes():
    assert sc.expand(["files"]) == ("files-accel", "files-app", "files-static", "files-nginx")
    assert sc.expand(["files-app", "files", "article"]) == ("files-app", "files-accel", "files-static",
                                                            "files-nginx", "article")
    assert sc.family_of("files-nginx") == "files" and sc.SCENARIOS["files-nginx"].files.mode == "nginx"
    assert sc.needs_dataset(["files-mixed"]) and sc.needs_dataset(["reuseport"])
    assert not sc.needs_dataset(["article", "stall"])


def test_family_defaults():
    layouts, levels = sc.family_defaults(sc.expand(["files"]), 2, 4)
    assert layouts == ("2x4-mapped",) and levels == (8, 32)
    layouts, levels = sc.family_defaults(["files-mixed", "reuseport"], 3, 2)
    assert layouts == ("3x2-mapped@aio=off", "3x2-mapped@aio=threads", "3x2-mapped@aio=off,open_file_cache=on",
                       "3x2-mapped@aio=threads,open_file_cache=on",
                       "3x2-mapped@nginx_workers=2,reuseport=off", "3x2-mapped@nginx_workers=2,reuseport=on")
    assert levels == (32, 64)
    assert sc.family_defaults(["article", "files-app"], 2, 4) is None


def test_file_overrides_apply_only_where_they_mean_something():
    mixed = sc.SCENARIOS["files-mixed"].resolved(4, hot_clients=9, cold_cache=False, large_share=0.1)
    assert (mixed.files.hot_clients, mixed.files.cold_cache, mixed.files.large_share) == (9, False, 0.1)
    accel = sc.SCENARIOS["files-accel"].resolved(4, hot_clients=9, cold_cache=True, large_share=0.1)
    assert (accel.files.hot_clients, accel.files.cold_cache, accel.files.large_share) == (0, True, 0.0)
    reuse = sc.SCENARIOS["reuseport"].resolved(4, cold_cache=True)
    assert reuse.files.mode == "hot" and not reuse.files.cold_cache and reuse.nginx_spread
    data = mixed.to_dict()
    assert data["files"]["mode"] == "static" and "query" not in data


def test_bad_file_load_says_what_is_allowed():
    with pytest.raises(ValueError, match="mode: must be one of"):
        sc.FileLoad("ftp")
    with pytest.raises(ValueError, match="large_share"):
        sc.FileLoad("static", which="all", large_share=1.5)


@pytest.mark.parametrize("text,want", [
    ("2x4-mapped", ("2x4-mapped",)),
    ("2x4-mapped@aio=off,sendfile=on,2x4-mapped@aio=threads",
     ("2x4-mapped@aio=off,sendfile=on", "2x4-mapped@aio=threads")),
    ("2x4-mapped@nginx_workers=2,reuseport=off, 2x4-mapped@nginx_workers=2,reuseport=on",
     ("2x4-mapped@nginx_workers=2,reuseport=off", "2x4-mapped@nginx_workers=2,reuseport=on")),
    ("2x4-shared,2x4-mapped,2x4-shared", ("2x4-shared", "2x4-mapped")),
])
def test_layout_lists_keep_variant_options_together(text, want):
    assert options.split_specs(text) == want


def _plan(argv):
    args = bench_cli.build_parser().parse_args(["compare", *argv])
    return compare.plan_from_args(args)


def test_files_plan_adds_the_data_set_and_sendfile(tmp_path):
    plan, scenarios = _plan(["--scenario", "files", "--processes", "2", "--threads", "4",
                             "--data-dir", str(tmp_path / "ds")])
    assert plan.scenarios == ("files-accel", "files-app", "files-static", "files-nginx")
    assert plan.layouts == ("2x4-mapped",) and plan.concurrency == (8, 32)
    assert plan.options == {"transport": "unix", "data_dir": str(tmp_path / "ds"), "sendfile": "on"}
    assert set(plan.workload) == set(scenarios)


def test_article_plan_is_unchanged():
    plan, _ = _plan(["--processes", "2", "--threads", "4"])
    assert plan.options == {"transport": "unix"} and plan.scenarios == ("article",)
    assert "2x4-mapped" in plan.layouts and plan.concurrency == (2, 4, 8)


@pytest.mark.parametrize("argv,field", [
    (["--scenario", "files", "--cold-cache", "maybe"], "--cold-cache"),
    (["--scenario", "files-mixed", "--hot-clients", "0"], "--hot-clients"),
    (["--scenario", "files-mixed", "--large-share", "0.9"], "--large-share"),
    (["--scenario", "article", "--data-dir", "/tmp/x"], "data_dir"),
    (["--scenario", "files-mixed", "--layouts", "2x4-mapped@aio=sometimes"], "aio"),
    (["--scenario", "reuseport", "--layouts", "2x4-mapped@nginx_workers=0"], "nginx_workers"),
    (["--scenario", "reuseport", "--layouts", "2x4-mapped@listen=0.0.0.0:80"], "listen"),
    (["--scenario", "filez"], "--scenario"),
])
def test_bad_nginx_arguments_exit_2_with_one_line(tmp_path, capsys, argv, field):
    out = tmp_path / "out"
    line = refusal(bench_cli.main, ["compare", "--out", str(out), *argv], capsys)
    assert names(line, field, "compare"), line
    assert not out.exists()


def test_unreachable_data_dir_is_named(tmp_path, monkeypatch):
    private = tmp_path / "private"
    inner = private / "ds"
    inner.mkdir(parents=True)
    private.chmod(0o700)
    monkeypatch.setattr(options.os, "geteuid", lambda: 0)
    assert options.unreachable_parent(inner) == private
    private.chmod(0o711)
    tmp_path.chmod(0o711)
    blocked = options.unreachable_parent(inner)
    assert blocked is None or blocked not in (inner, private)


# --- path lists and the per-worker spread --------------------------------------------------------


def test_weighted_paths_give_large_files_their_share(tmp_path):
    index = make_dataset(tmp_path / "ds", small_count=101, small_size=10, large_count=2, large_size=20)
    plain = request_paths(index, "static", "all")
    assert weighted_paths(index, "static", "all", 0.0) == plain
    weighted = weighted_paths(index, "static", "all", 0.2)
    large = [p for p in weighted if "/large/" in p]
    assert len(large) / len(weighted) == pytest.approx(0.2, abs=0.02)
    assert set(weighted) == set(plain)  # only repeats, nothing new
    assert weighted_paths(index, "accel", "small", 0.2) == request_paths(index, "accel", "small")


def test_spread_extra_sorts_and_shares():
    extra = spread_extra([17, 52], [0.4, 1.2])
    assert extra["nginx_worker_conns"] == [52, 17] and extra["nginx_workers"] == 2
    assert extra["nginx_conn_max_share"] == pytest.approx(52 / 69)
    assert extra["nginx_cpu_max_share"] == pytest.approx(0.75)
    assert spread_extra([0, 0], [0.0, 0.0])["nginx_conn_max_share"] == 0.0


def test_variant_options_and_pairs():
    assert nr.variant_options("2x4-mapped@aio=threads,sendfile=on") == {"aio": "threads", "sendfile": "on"}
    assert nr.variant_options("2x4-mapped@reuseport=true") == {"reuseport": "on"}
    assert nr.without("2x4-mapped@nginx_workers=2,reuseport=on", "reuseport") == "2x4-mapped@nginx_workers=2"
    layouts = ["2x4-mapped@aio=off", "2x4-mapped@aio=threads", "3x4-mapped", "3x4-mapped@aio=threads"]
    assert nr.pairs(layouts, "aio", "off", "threads") == [("2x4-mapped@aio=off", "2x4-mapped@aio=threads"),
                                                          ("3x4-mapped", "3x4-mapped@aio=threads")]


# --- report sections from a SYNTHETIC run ----------------------------------------------------------

SYNTHETIC = "SYNTHETIC fixture for the nginx report tests: made-up numbers, nothing here was measured"


def _cell(scenario, layout, level, repeat, rps, p99, extra=None, status_errors=0):
    p50 = p99 / 3
    return Cell(layout=layout, concurrency=level, repeat=repeat, scenario=scenario, duration_s=8.0,
                requests=int(rps * 8), rps=rps, latency_ms=Latency(p50, p50 * 2, p99, p99 * 1.5, p99 * 2),
                errors=Errors(status=status_errors), worker_requests={"1": 10, "2": 10},
                cpu_s={"uwsgi": 1.0, "nginx": 1.0, "wrk": 0.5}, unloaded_latency_ms=0.5, capacity_rps=rps * 1.2,
                closed_loop_rps=rps * 2, efficiency=0.8, extra=extra or {})


def synthetic_results() -> Results:
    cells = []
    for r in (1, 2, 3):
        f = 1 + (r - 2) * 0.03
        for level, scale in ((8, 1.0), (32, 1.2)):
            cells.append(_cell("files-accel", "2x4-mapped", level, r, 7000 * scale * f, 1.0, {"disk_read_mb": 0.0}))
            cells.append(_cell("files-app", "2x4-mapped", level, r, 3500 * scale / f, 3.0, {"disk_read_mb": 0.0}))
            cells.append(_cell("files-static", "2x4-mapped", level, r, 35000 * scale, 0.3, {"disk_read_mb": 0.0}))
        for layout, hot_p99 in (("2x4-mapped@aio=off", 30.0), ("2x4-mapped@aio=threads", 6.0)):
            cells.append(_cell("files-mixed", layout, 32, r, 5000 * f, 25.0, {
                "hot_p50_ms": hot_p99 / 10, "hot_p99_ms": hot_p99 * f, "hot_rps": 4000.0, "hot_requests": 32000,
                "hot_errors": 0, "hot_clients": 4, "disk_read_mb": 520.0, "evicted_mb": 522.0,
                "resident_before": 0.0, "resident_after": 0.9}))
        for layout, conns in (("2x4-mapped@nginx_workers=2,reuseport=off", [52, 12]),
                              ("2x4-mapped@nginx_workers=2,reuseport=on", [33, 31])):
            cells.append(_cell("reuseport", layout, 64, r, 25000 * f, 7.5 if "off" in layout else 7.0,
                               spread_extra(conns, [2.0, 1.0])))
    return Results(environment={"nproc": 2, "_comment": SYNTHETIC,
                                "dataset": {"small_count": 10000, "small_size": 5120, "large_count": 3,
                                            "large_size": 4194304, "fs_type": "ext4"}},
                   arguments={"processes": 2, "threads": 4, "duration": 8.0,
                              "layouts": ["2x4-mapped", "2x4-mapped@aio=off", "2x4-mapped@aio=threads",
                                          "2x4-mapped@nginx_workers=2,reuseport=off",
                                          "2x4-mapped@nginx_workers=2,reuseport=on"]},
                   workload={"files-mixed": sc.SCENARIOS["files-mixed"].to_dict()}, cells=tuple(cells))


def test_files_section_reports_ratios_and_the_10x_target():
    text = "\n".join(nr.files_section(synthetic_results(), markdown=True))
    assert "X-Accel-Redirect / app-streamed throughput: 2.00x (1.88–2.12); target >= 10x: MISS (short by 8.00x)" \
        in text
    assert "static / X-Accel-Redirect throughput: 5.00x" in text
    assert "2x4-mapped at 8 connections" in text and "2x4-mapped at 32 connections" in text
    assert "10000 small files of 5120 bytes" in text


def files_text_scaled(res: Results, scenario: str, factor: float) -> str:
    """The files section of ``res`` with ``scenario``'s throughput multiplied by ``factor``."""
    cells = tuple(c if c.scenario != scenario else Cell.from_dict(c.to_dict() | {"rps": c.rps * factor})
                  for c in res.cells)
    return "\n".join(nr.files_section(Results(res.environment, res.arguments, res.workload, cells)))


def test_files_target_passes_when_met():
    assert "target >= 10x: pass" in files_text_scaled(synthetic_results(), "files-app", 1 / 6)


def test_mixed_section_says_whether_the_disk_was_touched():
    lines = nr.mixed_section(synthetic_results(), markdown=True)
    text = "\n".join(lines)
    assert "hot-file p99 with aio threads / aio off: 0.20x (0.20–0.20) (lower with threads)" in text
    assert "yes (520 MB read, residency 0% -> 90%)" in text
    assert "evicted from the page cache before every cell" in text


def test_reuseport_section_shows_the_spread():
    text = "\n".join(nr.reuseport_section(synthetic_results(), markdown=True))
    assert "52/12; 52/12; 52/12" in text and "4.33" in text and "1.06" in text
    assert "reuseport on / off: p99 0.93x" in text


def test_full_reports_include_the_sections_and_skip_the_article_verdict():
    res = synthetic_results()
    term = terminal_lines(res)
    assert any("nginx: sending files" in x for x in term)
    assert not any(x.startswith("Verdict") for x in term)
    assert not any("choosing a layout" in x for x in term)
    assert not any("hot_p99_ms" in x for x in term)  # figures live in the nginx section, not a generic table
    md = markdown_lines(res, [])
    assert "## nginx: cold files + one hot file (aio off vs threads, open_file_cache off vs on)" in md
    assert "## nginx: reuseport on vs off (accept spread across nginx workers)" in md
    assert not any(x.startswith("## Verdict") for x in md)


def test_sections_survive_a_json_round_trip(tmp_path):
    path = synthetic_results().save(tmp_path / "results.json")
    assert json.loads(path.read_text())["cells"][0]["extra"]["disk_read_mb"] == 0.0
    again = load(path)
    assert nr.nginx_lines(again) == nr.nginx_lines(synthetic_results())


def test_no_sections_without_nginx_scenarios():
    res = synthetic_results()
    article = tuple(Cell.from_dict(c.to_dict() | {"scenario": "article"}) for c in res.cells
                    if c.scenario == "files-accel")
    assert nr.nginx_lines(Results(res.environment, res.arguments, {}, article)) == []


# --- the nginx-map tier and open_file_cache, from a SYNTHETIC run ------------------------------------


def synthetic_with_nginx_tier() -> Results:
    """SYNTHETIC: the run above plus made-up files-nginx cells (6x app-streamed's throughput and 8x
    its CPU capacity, repeat by repeat) and files-mixed cells with open_file_cache on."""
    res = synthetic_results()
    extra = []
    for c in res.cells:
        if c.scenario == "files-app":
            extra.append(Cell.from_dict(c.to_dict() | {"scenario": "files-nginx", "rps": c.rps * 6,
                                                         "capacity_rps": c.capacity_rps * 8}))
        if c.scenario == "files-mixed":
            layout = c.layout + ",open_file_cache=on"
            extra.append(Cell.from_dict(c.to_dict() | {"layout": layout, "extra": c.extra | {
                "hot_p99_ms": c.extra["hot_p99_ms"] * 0.5}}))
    layouts = res.arguments["layouts"] + ["2x4-mapped@aio=off,open_file_cache=on",
                                          "2x4-mapped@aio=threads,open_file_cache=on"]
    return Results(res.environment, res.arguments | {"layouts": layouts}, res.workload, res.cells + tuple(extra))


def test_files_section_shows_four_tiers_with_ratios_to_app_streamed():
    lines = nr.files_section(synthetic_with_nginx_tier(), markdown=True)
    text = "\n".join(lines)
    assert "nginx map / app-streamed throughput: 6.00x (6.00–6.00); target >= 5x: pass" in text
    assert "X-Accel-Redirect / app-streamed throughput: 2.00x (1.88–2.12); target >= 10x: MISS" in text
    assert "static / nginx map throughput:" in text and "nginx map / X-Accel-Redirect throughput:" in text
    table = [x for x in lines if x.startswith("| ")]
    assert table[0].split("|")[1:6] == [" route ", " req/s ", " vs app ", " p99 ", " p99 vs app "]
    routes = [row.split("|")[1].strip() for row in table if not row.startswith("| route") and "---" not in row]
    assert routes[:4] == ["nginx map (no app)", "X-Accel-Redirect", "app-streamed", "static (nginx alone)"]
    nginx_row = next(row for row in table if row.startswith("| nginx map"))
    assert "6.00x" in nginx_row and "1.00x" in nginx_row  # throughput and p99 vs app-streamed


def test_nginx_tier_target_misses_when_short():
    text = files_text_scaled(synthetic_with_nginx_tier(), "files-nginx", 1 / 2)
    assert "nginx map / app-streamed throughput: 3.00x (3.00–3.00); target >= 5x: MISS (short by 2.00x)" in text


def test_mixed_section_pairs_open_file_cache_off_and_on():
    text = "\n".join(nr.mixed_section(synthetic_with_nginx_tier(), markdown=True))
    assert "hot-file p99 with open_file_cache on / off (aio=off): 0.50x (0.50–0.50) (lower with the cache)" in text
    assert "hot-file p99 with open_file_cache on / off (aio=threads): 0.50x" in text
    assert "hot-file p99 with aio threads / aio off (open_file_cache=on): 0.20x" in text
    assert "| 2x4-mapped@aio=threads,open_file_cache=on | threads | on |" in text


def test_target_notes_carry_the_cpu_capacity_ratio():
    text = "\n".join(nr.files_section(synthetic_with_nginx_tier(), markdown=True))
    assert "By CPU cost per request (capacity: cores / CPU-seconds of uWSGI + nginx + wrk per request, what an" \
           " idle machine would allow): 8.00x (8.00–8.00)." in text
