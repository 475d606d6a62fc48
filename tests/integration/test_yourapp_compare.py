"""`uwsgi-layouts compare` on a user's own app: the Flask shop in its own virtualenv
(tests/flaskapp.py), real nginx, uWSGI and wrk, short cells. Checks that every cell carries memory,
status classes and per-worker counts, that the report names the app and its traffic, and that each
bad input exits 2 with one line and writes nothing. Never asserts a performance figure."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.test_compare import bench_processes
from tests.refusals import refusal
from uwsgi_layouts import console

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

REPO_ROOT = Path(__file__).resolve().parents[2]
SHORT = ["--layouts", "2x4-shared,2x4-mapped", "--concurrency", "2", "--duration", "2", "--repeats", "1",
         "--warmup", "1"]


def bench(*args: str, cwd: Path = REPO_ROOT, timeout: float = 200) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "uwsgi_layouts", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def app_args(flask_app) -> list[str]:
    return ["--app", flask_app.app, "--app-dir", str(flask_app.app_dir), "--virtualenv", str(flask_app.venv)]


def test_compare_measures_the_flask_app_with_memory_and_status(flask_app, tmp_path):
    out = tmp_path / "run"
    proc = bench("compare", *app_args(flask_app), "--request", "GET /", "--request", "2*GET /api/items",
                 *SHORT, "--out", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert not bench_processes(), "compare left processes running"
    assert "pre-flight: 2 distinct requests answered 200 through nginx" in proc.stdout
    data = json.loads((out / "results.json").read_text())
    assert data["arguments"]["app"] == {"app": "shop:app", "app_dir": str(flask_app.app_dir),
                                        "virtualenv": str(flask_app.venv), "demo": False, "env": [], "static": []}
    assert data["arguments"]["scenarios"] == ["traffic"]
    mix = data["workload"]["traffic"]["traffic"]
    assert [(r["method"], r["target"], r["weight"]) for r in mix["requests"]] == [("GET", "/", 1),
                                                                                   ("GET", "/api/items", 2)]
    assert [c["layout"] for c in data["cells"]] == ["2x4-shared", "2x4-mapped"]
    for cell in data["cells"]:
        assert cell["scenario"] == "traffic" and cell["errors"]["total"] == 0 and cell["requests"] > 0
        # every answer counted by class, all 2xx
        assert cell["status"] == {"2xx": cell["requests"], "3xx": 0, "4xx": 0, "5xx": 0}
        workers = cell["worker_requests"]
        assert set(workers) == {"1", "2"} and all(n > 0 for n in workers.values())
        assert abs(sum(workers.values()) - cell["requests"]) <= 2 * cell["concurrency"]
        mem = cell["memory"]
        assert set(mem) == {"app_pss_mb", "app_uss_mb", "app_rss_mb", "nginx_pss_mb", "worker_pss_mb"}
        assert 0 < mem["app_uss_mb"] <= mem["app_pss_mb"] < mem["app_rss_mb"]
        assert set(mem["worker_pss_mb"]) == {"1", "2"}
        # Flask loaded in each worker (lazy-apps): a worker holds megabytes, the master holds the rest
        assert all(5 < w < mem["app_pss_mb"] for w in mem["worker_pss_mb"].values())
        assert sum(mem["worker_pss_mb"].values()) < mem["app_pss_mb"]
        assert 0 < mem["nginx_pss_mb"] < mem["app_pss_mb"]
    report = (out / "report.md").read_text()
    assert "## What was measured" in report and str(flask_app.venv) in report and "## Memory" in report
    assert "Verdict" not in report and "fib" not in report
    # the headline on the terminal (no article claim for another app), the tables in report.txt
    assert "== the answer ==" in proc.stdout and "article's claim" not in proc.stdout
    assert "memory after load" in (out / "report.txt").read_text()
    assert (out / "memory.png").stat().st_size > 0


BAD_INPUT_CASES = ["request-line", "header", "access-log", "body-file"]


def bad_input(case: str, tmp_path: Path) -> tuple[list[str], str]:
    """The options of ``case`` and the start of the one line that refuses them."""
    (tmp_path / "access.log").write_text(
        '127.0.0.1 - - [22/Nov/2026:10:52:32 +0000] "POST /api/items HTTP/1.1" 201 3 "-" "curl/7.88.1"\n'
        '127.0.0.1 - - [22/Nov/2026:10:52:32 +0000] "GET /nope HTTP/1.1" 404 153 "-" "curl/7.88.1"\n'
        "garbage\n")
    return {
        "request-line": (["--request", "GET"], "error: request: 'GET' is not a request line"),
        "header": (["--request", "GET /", "--header", "Authorization"], "error: header: 'Authorization' has no ':'"),
        "access-log": (["--access-log", str(tmp_path / "access.log")],
                       f"error: access_log: no usable line in {tmp_path / 'access.log'} (3 lines: "),
        "preflight-404": (["--request", "GET /", "--request", "GET /nope"],
                          "error: request: 1 of 2 distinct requests failed in the pre-flight through nginx on "
                          "2x4-shared: GET /nope -> 404 NOT FOUND"),
        "body-file": (["--request", "POST /api/items @missing.json"],
                      f"error: request: body file {tmp_path / 'missing.json'} cannot be read"),
    }[case]


@pytest.mark.parametrize("case", BAD_INPUT_CASES)
def test_bad_input_exits_2_with_one_line_and_writes_nothing(case, flask_app, tmp_path, capsys, monkeypatch):
    """Refused while the options are read, before any stack or measurement: compare runs in this
    process (its command line as the console routes it; an interpreter of its own per case paid
    numpy, scipy and matplotlib's imports each time). An exception would fail the test (no traceback
    can pass). The refusal that needs a running stack is the pre-flight's, below, in its own process."""
    extra, expected = bad_input(case, tmp_path)
    monkeypatch.chdir(tmp_path)  # the body file is named relative to the working directory
    out = tmp_path / "run"
    line = refusal(console.main, ["compare", *app_args(flask_app), *extra, *SHORT, "--out", str(out)], capsys)
    assert line.startswith(expected), line
    assert not out.exists(), "a bad input must write nothing"
    assert not bench_processes(), "a stack was left running"


def test_a_request_failing_the_preflight_exits_2_with_one_line_and_writes_nothing(flask_app, tmp_path):
    extra, expected = bad_input("preflight-404", tmp_path)
    out = tmp_path / "run"
    proc = bench("compare", *app_args(flask_app), *extra, *SHORT, "--out", str(out), cwd=tmp_path)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert lines[0].startswith(expected), lines[0]
    assert "Traceback" not in proc.stdout + proc.stderr
    assert not out.exists(), "a bad input must write nothing"
    assert not bench_processes(), "the pre-flight stack was left running"
