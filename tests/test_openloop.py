"""Open loop: httperf's output parsed (REAL captured outputs in tests/fixtures/httperf-*.txt),
the step rule, the knee, the report lines, the results file (v2, and v1 openloop.json) and the
CLI's bad arguments."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from tests.refusals import names, refusal
from uwsgi_layouts.bench import cli as bench_cli
from uwsgi_layouts.bench import options
from uwsgi_layouts.bench.analysis import judge_step
from uwsgi_layouts.bench.kinds.openloop import DEFAULT_PATH
from uwsgi_layouts.bench.load import httperf
from uwsgi_layouts.bench.report import openloop as report
from uwsgi_layouts.bench.results import ResultsError, Step, find_knee, from_dict, load

FIXTURES = Path(__file__).resolve().parent / "fixtures"
PASSING = FIXTURES / "httperf-2x4-mapped-rate6.txt"  # real: 6 req/s, replies kept up
FAILING = FIXTURES / "httperf-2x4-mapped-rate30.txt"  # real: 30 req/s, timeouts and 502s


def test_parse_real_passing_output():
    p = httperf.parse(PASSING.read_text())
    assert (p["connections"], p["requests"], p["replies"]) == (90, 90, 90)
    assert p["reply_rate"]["samples"] == 3 and p["reply_rate"]["each"] == [5.8, 6.2, 5.8]
    assert p["status"]["2xx"] == 90 and p["errors"]["total"] == 0
    assert p["connection_ms"]["median"] == 194.5 and "client_cpu_pct" in p
    assert judge_step(6, p) == ("pass", [])


def test_parse_real_failing_output():
    p = httperf.parse(FAILING.read_text())
    assert (p["requests"], p["replies"], p["test_duration_s"]) == (450, 189, 19.204)
    assert p["reply_rate"] == {"min": 7.2, "avg": 11.4, "max": 13.7, "stddev": 3.7, "samples": 3,
                               "each": [13.7, 13.4, 7.2]}
    assert p["status"]["5xx"] == 51 and p["errors"]["client_timo"] == 261
    verdict, reasons = judge_step(30, p)
    assert verdict == "fail"
    assert any("replies 189" in r for r in reasons) and any("min reply rate 7.2" in r for r in reasons)
    assert any("5xx=51" in r and "client_timo=261" in r for r in reasons)


def test_missing_line_is_named():
    text = PASSING.read_text().replace("Reply status:", "Reply state:")
    with pytest.raises(httperf.HttperfError, match="Reply status"):
        httperf.parse(text)


def _parsed(**changes):
    p = httperf.parse(PASSING.read_text())
    for key, value in changes.items():
        section, _, field = key.partition("__")
        if field:
            p[section][field] = value
        else:
            p[section] = value
    return p


def test_first_sample_is_left_out_as_ramp_up():
    # The first 5-s window holds the ramp-up: 5.6 alone would fail 95% of 6/s.
    assert judge_step(6, _parsed(reply_rate__each=[5.0, 5.8, 6.0]))[0] == "pass"
    assert judge_step(6, _parsed(reply_rate__each=[6.0, 5.6, 6.0]))[0] == "fail"
    # Without per-sample figures httperf's own min decides.
    p = _parsed(reply_rate__each=[])
    p["reply_rate"]["min"] = 5.0
    assert judge_step(6, p)[0] == "fail"


def test_client_side_errors_invalidate_the_step():
    verdict, reasons = judge_step(6, _parsed(errors__fd_unavail=3))
    assert verdict == "invalid" and "fd_unavail=3" in reasons[0]
    assert judge_step(6, _parsed(reply_rate__samples=0))[0] == "invalid"


@pytest.mark.parametrize("change", [{"errors__connreset": 1}, {"errors__client_timo": 2}, {"status__4xx": 1},
                                    {"replies": 88}])
def test_server_side_trouble_fails_the_step(change):
    assert judge_step(6, _parsed(**change))[0] == "fail"


def _step(rate, verdict):
    """A real step (the passing fixture's figures) with the given rate and verdict."""
    parsed = httperf.parse(PASSING.read_text())
    return Step(rate=rate, num_conns=rate * 15, **parsed, server_cpu_cores=0.5, verdict=verdict,
                reasons=() if verdict == "pass" else ("x",))


@pytest.mark.parametrize("steps,rate,status", [
    ([_step(5, "pass"), _step(10, "pass"), _step(20, "fail")], 10, "found"),
    ([_step(5, "pass"), _step(10, "pass")], 10, "not reached"),
    ([_step(5, "fail")], None, "below the first rate"),
    ([_step(5, "pass"), _step(10, "invalid")], 5, "client-limited"),
    ([_step(5, "pass"), _step(10, "fail"), _step(20, "pass")], 5, "found"),  # the first failure ends it
    ([], None, "no steps"),
])
def test_knee(steps, rate, status):
    knee = find_knee(steps)
    assert (knee["rate"], knee["status"]) == (rate, status)


def _results() -> dict:
    """An open-loop results file as version 1 wrote it (openloop.json)."""
    steps = []
    for path, rate in ((PASSING, 6), (FAILING, 30)):
        parsed = httperf.parse(path.read_text())
        verdict, reasons = judge_step(rate, parsed)
        steps.append({"rate": rate, "num_conns": rate * 15, **parsed, "server_cpu_cores": 0.5, "verdict": verdict,
                      "reasons": reasons, "raw_output": f"raw/step-{rate}.txt"})
    return {"format_version": 1, "kind": "openloop", "created": "2026-11-22T00:00:00+00:00",
            "environment": {"nproc": 2, "httperf": "0.9.0"},
            "arguments": {"layout": "2x4-mapped", "rates": [6, 30], "step_s": 15, "path": DEFAULT_PATH,
                          "files": "", "client_nice": 19, "command": "uwsgi-layouts openloop --rates 6,30"},
            "steps": steps, "knee": {"rate": 6, "status": "found"}}


def test_report_lines_name_the_knee_and_the_rule():
    data = from_dict(_results())
    term = "\n".join(report.terminal_lines(data))
    assert "knee: 6 req/s" in term and "at 30 req/s they fell behind" in term
    assert "5.8 6.2 5.8" in term and "5xx=51, client-timo=261" in term
    md = report.markdown_lines(data, [])
    assert md[0] == "# Open-loop benchmark (httperf)"
    assert any(x.startswith("**knee: 6 req/s") for x in md)
    assert "uwsgi-layouts openloop --rates 6,30" in md


def test_report_says_where_httperf_ran_when_recorded():
    data = _results()
    assert not any(line.startswith("load generator:") for line in report.terminal_lines(from_dict(data)))
    data["environment"]["load_generator"] = "httperf in a cgroup of its own at the lowest CPU priority"
    term = report.terminal_lines(from_dict(data))
    assert "load generator: httperf in a cgroup of its own at the lowest CPU priority" in term
    assert "load generator: httperf in a cgroup of its own at the lowest CPU priority." in \
        report.markdown_lines(from_dict(data), [])


def test_results_file_round_trip_and_report_command(tmp_path, capsys):
    v1 = tmp_path / "openloop.json"
    v1.write_text(json.dumps(_results()))
    data = load(v1)
    assert data.kind == "openloop" and data.knee["rate"] == 6
    assert load(data.save(tmp_path / "results.json")) == data
    for path in (v1, tmp_path / "results.json"):
        assert bench_cli.main(["report", str(path)]) == 0
        assert "knee: 6 req/s" in capsys.readouterr().out
    assert (tmp_path / "report.md").stat().st_size > 0 and (tmp_path / "report.txt").stat().st_size > 0
    assert (tmp_path / "reply-rate.png").read_bytes()[:4] == b"\x89PNG"
    assert "![reply-rate](reply-rate.png)" in (tmp_path / "report.md").read_text()


def test_load_refuses_bad_files(tmp_path):
    bad = copy.deepcopy(_results())
    bad["format_version"] = 9
    (tmp_path / "a.json").write_text(json.dumps(bad))
    with pytest.raises(ResultsError, match="format_version"):
        load(tmp_path / "a.json")
    bad = copy.deepcopy(_results())
    del bad["steps"][0]["replies"]
    (tmp_path / "b.json").write_text(json.dumps(bad))
    with pytest.raises(ResultsError, match="replies"):
        load(tmp_path / "b.json")


def test_httperf_command_offers_rate_times_step_connections():
    cmd = httperf.command(8000, "/healthz", 20, 15, 5)
    assert cmd[:3] == ["nice", "-n", "19"]
    assert cmd[cmd.index("--num-conns") + 1] == "300" and cmd[cmd.index("--rate") + 1] == "20"
    assert "--verbose" in cmd and cmd[-2:] == ["--uri", "/healthz"]
    cmd = httperf.command(8000, "/", 2.5, 15, 5, nice=0, wlog=Path("/tmp/w"))
    assert cmd[0].endswith("httperf") and cmd[-1] == "--wlog=y,/tmp/w" and "--num-conns" in cmd


@pytest.mark.parametrize("argv,field", [
    (["--rates", "10,5"], "rates"),
    (["--rates", "10,x"], "--rates"),
    (["--rates", "0"], "--rates"),
    (["--step", "5"], "--step"),
    (["--layout", "2x4-nope"], "strategy"),
    (["--path", "healthz"], "--path"),
    (["--files", "ftp"], "--files"),
    (["--client-nice", "30"], "--client-nice"),
    (["--transport", "udp"], "--transport"),
    # the app and traffic options (bench.subject), as compare takes them
    (["--app", "nope"], "app"),
    (["--import-timeout", "0"], "--import-timeout"),
    (["--request", "POST /api/items"], "request"),  # httperf replays a list of paths, GET only
    (["--request", "GET /", "--header", "Cookie: s=1"], "header"),  # httperf's argv is readable by others
    (["--request", "GET /", "--path", "/x"], "path"),
    (["--request", "GET /", "--skip-failing"], "skip_failing"),  # an access log's option
])
def test_bad_openloop_arguments_exit_2_with_one_line(tmp_path, capsys, argv, field):
    out = tmp_path / "out"
    line = refusal(bench_cli.main, ["openloop", "--out", str(out), *argv], capsys)
    assert names(line, field, "openloop"), line
    assert not out.exists()


def test_httperf_replays_a_mix_by_weight_with_its_headers(tmp_path):
    from uwsgi_layouts.bench.load.traffic import Request, build_mix
    mix = build_mix([Request("GET", "/a", 3), Request("GET", "/b?x=1", 1)], [("Host", "shop.example"),
                                                                              ("X-Path", "a\\b")])
    wlog = httperf.write_mix_wlog(tmp_path / "mix.wlog", mix, seed=1, size=400)
    targets = wlog.read_bytes().split(b"\0")[:-1]
    assert len(targets) == 400 and targets.count(b"/a") == 300 and targets.count(b"/b?x=1") == 100
    assert targets != sorted(targets)  # shuffled: httperf opens them in this order, wrapping around
    cmd = httperf.command(8000, "/", 10, 15, 5, wlog=wlog, headers=mix.headers)
    assert cmd[cmd.index("--add-header") + 1] == "Host: shop.example\\nX-Path: a\\\\b\\n"
    assert "--no-host-hdr" in cmd and "--uri" not in cmd  # the mix's Host replaces httperf's own


def test_missing_httperf_says_how_to_install(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(options.shutil, "which", lambda name: None)
    assert bench_cli.main(["openloop", "--out", str(tmp_path / "o")]) == 1
    assert "apt-get install httperf" in capsys.readouterr().err
