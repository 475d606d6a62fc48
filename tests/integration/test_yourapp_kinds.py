"""`openloop` and `faults` on a user's own app: the Flask shop in its own virtualenv
(tests/flaskapp.py) under its own requests, real nginx, uWSGI, httperf and wrk, bounded loads.
A replayed access log with a path the app no longer serves: the pre-flight names it, and
--skip-failing leaves it out, counted in the results. Never asserts a performance figure."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.integration.test_compare import bench_processes
from tests.integration.test_yourapp_compare import REPO_ROOT, app_args
from tests.test_cli import cli_in_process
from uwsgi_layouts.bench.load.traffic import Request, build_mix
from uwsgi_layouts.bench.localfaults import kill_worker, nginx_reloads
from uwsgi_layouts.bench.stack import Lab

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

# nginx's combined format; /gone was served when the log was written, the app answers 404 now.
LOG = "".join(f'127.0.0.1 - - [22/Nov/2026:10:52:{i:02d} +0000] "GET {path} HTTP/1.1" 200 5 "-" "curl/7.88"\n'
              for i, path in enumerate(["/api/items", "/api/items", "/", "/gone"]))


def bench(*args: str, timeout: float = 200) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "uwsgi_layouts", *args], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture
def lab(run_dirs, free_ports):
    with Lab(new_dir=run_dirs, free_ports=free_ports) as lab:
        yield lab


def test_openloop_replays_an_access_log_of_the_flask_app_skipping_what_fails(flask_app, tmp_path):
    log = tmp_path / "access.log"
    log.write_text(LOG)
    out = tmp_path / "run"
    common = ["openloop", *app_args(flask_app), "--layout", "2x2-mapped", "--transport", "unix", "--access-log",
              str(log), "--rates", "10", "--step", "15", "--warmup", "1"]
    # The refusal through the console's main in this process (an interpreter of its own costs 2-3 s of
    # CPU); the run below is openloop as a user runs it.
    refused = cli_in_process(*common, "--out", str(tmp_path / "refused"))
    assert refused.returncode == 2, refused.stdout[-2000:] + refused.stderr[-2000:]
    err = refused.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: request: 1 of 3 distinct requests failed in the pre-flight "
                                               "through nginx on 2x2-mapped: GET /gone -> 404 NOT FOUND"), err
    assert "or leave them out with --skip-failing" in err[0]
    assert not (tmp_path / "refused" / "results.json").exists()

    proc = bench(*common, "--skip-failing", "--out", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert not bench_processes(), "openloop left processes running"
    assert "--skip-failing: left out 1 of 3 distinct requests failed in the pre-flight" in proc.stdout
    data = json.loads((out / "results.json").read_text())
    mix = data["workload"]["traffic"]["traffic"]
    assert [r["target"] for r in mix["requests"]] == ["/api/items", "/"]
    assert "dropped 1 requests (25.0% of the weight) that failed in the pre-flight (--skip-failing)" in mix["source"]
    assert data["arguments"]["app"]["app"] == "shop:app" and data["arguments"]["path"] == ""
    step = data["steps"][0]
    assert step["replies"] > 0 and step["status"]["4xx"] == 0  # httperf sent the log's requests, not /gone
    report = (out / "report.txt").read_text()
    assert "your requests (below)" in report and "app: shop:app" in report and "--skip-failing" in report


def test_faults_run_the_flask_app_under_its_own_requests(flask_app, lab):
    mix = build_mix([Request("GET", "/api/items", 3), Request("GET", "/slow?ms=20")])
    options = flask_app.layout_options(transport="unix")
    killed = kill_worker(lab, "2x4-mapped", duration=5.0, mix=mix, **options)
    print("\n" + killed.explain())
    assert killed.load.startswith("wrk -c8 your requests") and not killed.error
    assert all(c.ok for c in killed.checks), killed.explain()  # GETs in flight are retried; it respawns
    assert killed.requests_sent > 0 and killed.requests_failed == 0
    reloaded = nginx_reloads(lab, "2x2-mapped", duration=5.0, mix=mix, **options)
    assert reloaded.faults_injected > 0 and "your requests" in reloaded.load, reloaded.explain()
    assert [c.ok for c in reloaded.checks][:2] == [True, True], reloaded.explain()


def test_faults_cli_with_the_flask_app_records_it_and_refuses_what_needs_the_demo(flask_app, tmp_path):
    out = tmp_path / "faults"
    proc = bench("faults", *app_args(flask_app), "--request", "GET /api/items", "--layouts", "2x4-mapped",
                 "--only", "chain-reload", "--out", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert not bench_processes(), "faults left processes running"
    data = json.loads((out / "results.json").read_text())
    assert data["arguments"]["app"]["app"] == "shop:app"
    assert data["workload"]["traffic"]["traffic"]["requests"][0]["target"] == "/api/items"
    (record,) = data["faults"]
    assert record["name"] == "chain-reload" and not record.get("error"), record
    assert "app: shop:app" in (out / "report.txt").read_text()
