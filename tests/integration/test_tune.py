"""A real, short `uwsgi-layouts tune`: the demo app, real nginx, uWSGI and wrk, a one-minute
budget; then `uwsgi-layouts run` serves the recommended layout and real HTTP goes through
nginx. And the lab-only stall middleware around a real third-party app (the Flask shop).

Checks behaviour (stages, files, the budget kept, the recommended files served), never which
layout wins or a throughput figure: those are measured by `make tune-accuracy`.
"""

from __future__ import annotations

import http.client
import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.support import kill_run, start_deploy_run
from tests.integration.test_compare import bench_processes
from tests.integration.test_yourapp import wait_serving
from tests.tunefakes import tune_args
from uwsgi_layouts.bench.kinds import tune as kind
from uwsgi_layouts.bench.stack import Lab

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

REPO_ROOT = Path(__file__).resolve().parents[2]
BUDGET_MIN = 1.0  # the least tune takes (a search fills its budget: this is the test's wall time)
# Both searches run the demo app's mostly-waiting mix (5 x sleep 40 ms + fib(15)): they check the
# stages, the cells, the budget and the recommendation, never a figure. The article's mix kept one to
# two cores busy through the whole budget, on a machine the rest of the suite shares.
SCENARIO = "io-heavy"


def test_tune_end_to_end_then_deploy_run_serves_the_recommendation(tmp_run_dir, tmp_path, free_ports,
                                                                     leftover_processes):
    out = tmp_run_dir / "tune"  # the run user (www-data under root) must reach out/recommended
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "uwsgi_layouts",
                           "tune", "--concurrency", "2", "--budget", str(BUDGET_MIN), "--scenario", SCENARIO,
                           "--strategies", "mapped,shared", "--max-processes", "2", "--threads", "1,2,4",
                           "--out", str(out)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=200)
    took = time.monotonic() - start
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert not bench_processes(), "tune left processes running"
    # the progress line: stage, best so far, ETAs
    assert re.search(r"\[stage 1 screen 1/\d+\] \S+ r1 \d+ s: [\d.]+ req/s p99 \d+ ms \| best so far \S+ ",
                     proc.stderr), proc.stderr[-2000:]
    data = json.loads((out / "results.json").read_text())
    assert data["kind"] == "tune" and data["format_version"] == 2 and data["arguments"]["complete"] is True
    rec = data["arguments"]["tune"]
    blocks = rec["blocks"]
    assert {b["stage"] for b in blocks} >= {1, 2} and blocks[0]["stage"] == 1, (blocks, rec["decision"])
    assert len({b["spec"] for b in blocks if b["stage"] == 1}) == 5  # 12 in the space, 7 pruned
    for cell in data["cells"]:
        assert cell["concurrency"] == 2 and cell["errors"]["total"] == 0 and cell["requests"] > 0
        assert cell["memory"]["app_pss_mb"] > 0 and cell["histogram"]
    # the budget, kept within 10% (pre-flights to the last save; the report and plots follow)
    assert rec["wall_s"] <= 1.1 * BUDGET_MIN * 60, rec["wall_s"]
    assert took <= 1.1 * BUDGET_MIN * 60 + 20, took  # + interpreter start and the report's plots
    chosen = rec["decision"]["chosen"]
    assert chosen and f"RECOMMENDATION: {chosen}: " in proc.stdout
    for name in ("report.md", "report.txt", "p99-throughput.png"):
        assert (out / name).stat().st_size > 0, name
    recommended = out / "recommended"
    for name in ("nginx.conf", "uwsgi.ini", "layout.json", "RUN.md", "bundle/INSTALL.md", "bundle/bundle.json"):
        assert (recommended / name).is_file(), name
    assert rec["recommended"]["layout"] == chosen
    assert json.loads((recommended / "layout.json").read_text())["name"] == chosen
    assert "uwsgi-layouts install" in proc.stdout and "--dry-run" in proc.stdout
    # the same report from the stored JSON alone
    again = subprocess.run([sys.executable, "-m", "uwsgi_layouts", "report", str(out / "results.json"), "--out",
                            str(tmp_path / "again")], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0, again.stderr
    assert (tmp_path / "again" / "report.txt").read_text() == (out / "report.txt").read_text()

    # `uwsgi-layouts run` serves the recommendation: the run command of RUN.md, on free ports (the
    # recommended files use render's defaults, 8000/5000/9191, which others may hold on a shared
    # machine), from its own run directory beside recommended/, which stays exactly as tune wrote it.
    before = {p.relative_to(recommended): p.read_bytes() for p in recommended.rglob("*") if p.is_file()}
    run_dir = (out / "run").resolve()
    serve = re.search(r"uwsgi-layouts run (.+)", (recommended / "RUN.md").read_text())[1].split()
    assert serve[0] == chosen and serve[-2:] == ["--run-dir", str(run_dir)]
    n_sockets = len(json.loads((recommended / "layout.json").read_text())["sockets"])
    ports = free_ports(n_sockets + 1)
    listen = ports[n_sockets]
    run = start_deploy_run(*serve, "--listen", f"127.0.0.1:{listen}", "--base-port", str(ports[0]),
                           "--for", "120", log_dir=tmp_path)
    try:
        wait_serving(run, listen, tmp_path)
        conn = http.client.HTTPConnection("127.0.0.1", listen, timeout=20)
        conn.request("GET", "/?rounds=1&fib=5&io_ms=1")
        resp = conn.getresponse()
        body = resp.read()
        assert resp.status == 200 and body.startswith(b"Hello, world"), (resp.status, body[:100])
        assert resp.getheader("X-Worker-Id")
        conn.close()
        run.send_signal(signal.SIGTERM)
        assert run.wait(timeout=30) == 0, (tmp_path / "run.err").read_text()
    finally:
        kill_run(run)
    assert leftover_processes([str(run_dir)], timeout=5) == []
    after = {p.relative_to(recommended): p.read_bytes() for p in recommended.rglob("*") if p.is_file()}
    assert after == before, "recommended/ changed"
    served = json.loads((run_dir / "layout.json").read_text())
    recorded = json.loads((recommended / "layout.json").read_text())
    for key in ("processes", "threads", "strategy", "app", "app_dir", "virtualenv", "transport"):
        assert served[key] == recorded[key], key


def test_the_lab_stall_middleware_wraps_a_real_app(flask_app, run_dirs):
    """The Flask shop behind the lab-only middleware: its own requests answered by Flask, the
    stall request held and answered by the middleware, through real nginx and uWSGI."""
    config = kind.config_from_args(tune_args(app=flask_app.app, app_dir=str(flask_app.app_dir),
                                             virtualenv=str(flask_app.venv), request=["GET /api/items"],
                                             stall_share="0.05", stall_ms="500"))
    assert config.middleware and config.options["app"] == flask_app.app  # the recommended files get the app itself
    with Lab(new_dir=run_dirs) as lab:
        options = kind.lab_options(lab, config.options)
        assert options["app"] == "ul_tune_stall:application"
        assert f"UL_TUNE_APP={flask_app.app}" in options["env"]
        subject, lines = kind.preflight_lab(lab, "1x2-shared", options, config)
        assert subject == config.subject  # every request answered: nothing left out
        assert lines[0] == "pre-flight: 1 distinct requests answered 200 through nginx on 1x2-shared"
        assert "lab-only middleware" in lines[1]
        with lab.stack("1x2-shared", **options) as stack:
            layout = stack.layout
            conn = http.client.HTTPConnection(layout.listen_host, layout.listen_port, timeout=20)
            start = time.monotonic()
            conn.request("GET", "/?ul_tune_stall_ms=300")
            resp = conn.getresponse()
            assert resp.status == 200 and resp.read() == b"stalled\n" and time.monotonic() - start >= 0.3
            conn.request("GET", "/api/items")
            resp = conn.getresponse()
            assert resp.status == 200 and [i["name"] for i in json.loads(resp.read())] == ["teapot", "cup"]
            conn.close()


def test_tune_searches_a_peer_and_recommends_it_without_a_bundle(tmp_run_dir, leftover_processes):
    """gunicorn alone in the space, with and without nginx's keep-alive: its cells are measured
    (memory of gunicorn's tree, requests per worker from the X-Worker-Pid answers), and the
    recommendation is rendered for `deploy run` with no production bundle (bundles ship uWSGI)."""
    out = tmp_run_dir / "tune-peer"
    proc = subprocess.run([sys.executable, "-m", "uwsgi_layouts",
                           "tune", "--concurrency", "2", "--budget", str(BUDGET_MIN), "--scenario", SCENARIO,
                           "--strategies", "gunicorn", "--max-processes", "2", "--threads", "2",
                           "--out", str(out)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert not bench_processes(), "tune left processes running"
    data = json.loads((out / "results.json").read_text())
    assert {c["layout"] for c in data["cells"]} == {"1x2-gunicorn", "2x2-gunicorn", "1x2-gunicorn@keepalive=off",
                                                   "2x2-gunicorn@keepalive=off"}
    for cell in data["cells"]:
        assert cell["errors"]["total"] == 0
        assert cell["memory"]["app_pss_mb"] > 0 and cell["cpu_s"]["app"] >= 0
        assert sum(cell["worker_requests"].values()) > 0
    # gunicorn's tree measured for every layout: a cell of io-heavy's sleeping requests can use less
    # than one of the kernel's 10-ms CPU ticks per process (one read 0.0 at six test workers on 2
    # cores), so the CPU is summed over each layout's cells
    for layout in {c["layout"] for c in data["cells"]}:
        assert sum(c["cpu_s"]["app"] for c in data["cells"] if c["layout"] == layout) > 0, layout
    chosen = data["arguments"]["tune"]["decision"]["chosen"]
    assert "-gunicorn" in chosen and f"RECOMMENDATION: {chosen}: " in proc.stdout
    recommended = out / "recommended"
    assert (recommended / "gunicorn.conf.py").is_file() and (recommended / "RUN.md").is_file()
    assert not (recommended / "bundle").exists() and not (recommended / "uwsgi.ini").exists()
    assert leftover_processes([str(out)], timeout=5) == []
