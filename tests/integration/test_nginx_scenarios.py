"""Short real runs of the nginx scenario families (files: four routes, files-mixed, reuseport) and of the
open-loop command: real nginx, uWSGI, wrk and httperf, a few seconds each.

Checks that every recorded field is present and that no request failed, never the ratios
(performance is measured by `uwsgi-layouts compare`, not asserted by a timed test).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.test_compare import bench_processes
from tests.test_cli import cli_in_process
from uwsgi_layouts.bench.dataset import make_dataset
from uwsgi_layouts.bench.load.sending import starved

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def data_dir(run_dirs) -> Path:
    root = run_dirs() / "ds"  # under a 0711 dir: www-data can traverse it
    make_dataset(root, small_count=200, small_size=5 * 1024, large_count=2, large_size=256 * 1024)
    os.chmod(root, 0o755)
    return root


def bench(out: Path, *args: str, timeout: float = 200, in_process: bool = False) -> subprocess.CompletedProcess:
    """The command as a user runs it, in a process of its own; ``in_process``: through the console's
    main in this process (an interpreter of its own costs 2-3 s of CPU: numpy, scipy, matplotlib),
    for the runs whose command another test of this module already runs as a process."""
    argv = [*args, "--out", str(out)]
    if in_process:
        proc = cli_in_process(*argv)
    else:
        proc = subprocess.run([sys.executable, "-m", "uwsgi_layouts", *argv], cwd=REPO_ROOT, capture_output=True,
                              text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert not bench_processes(), "the benchmark left processes running"
    return proc


def compare(out: Path, data_dir: Path, *args: str, in_process: bool = False) -> tuple[dict, str]:
    """The results and the full text report (the terminal shows the headline only). 1-s cells: every
    assertion is on what a cell records (fields, routes, errors), none on a figure."""
    bench(out, "compare", "--warmup", "1", "--repeats", "1", "--duration", "1", "--data-dir", str(data_dir), *args,
          in_process=in_process)
    return json.loads((out / "results.json").read_text()), (out / "report.txt").read_text()


def test_smoke_files_four_routes(tmp_path, data_dir):
    data, stdout = compare(tmp_path / "files", data_dir, "--scenario", "files", "--layouts", "2x2-mapped",
                           "--concurrency", "2")
    assert data["arguments"]["options"]["sendfile"] == "on"
    assert data["environment"]["dataset"]["small_count"] == 200
    cells = {c["scenario"]: c for c in data["cells"]}
    assert set(cells) == {"files-accel", "files-app", "files-static", "files-nginx"}
    for name, cell in cells.items():
        assert cell["errors"]["total"] == 0, (name, cell["errors"])
        assert cell["requests"] > 0 and "disk_read_mb" in cell["extra"], name
    # The app looked ids up for accel and app; /static/ never reached it.
    assert sum(cells["files-accel"]["worker_requests"].values()) > 0
    assert sum(cells["files-static"]["worker_requests"].values()) == 0
    assert sum(cells["files-nginx"]["worker_requests"].values()) == 0  # nginx looked the ids up itself
    assert "X-Accel-Redirect / app-streamed throughput" in stdout.replace("\n  ", " ")
    assert "nginx map / app-streamed throughput" in stdout.replace("\n  ", " ")
    assert "== nginx: sending files" in (tmp_path / "files" / "report.txt").read_text()


def test_smoke_files_mixed_cold_cache(tmp_path, data_dir):
    data, stdout = compare(tmp_path / "mixed", data_dir, "--scenario", "files-mixed", "--concurrency", "2",
                           "--hot-clients", "1", "--layouts", "2x2-mapped@aio=off,2x2-mapped@aio=threads",
                           in_process=True)
    assert [c["layout"] for c in data["cells"]] == ["2x2-mapped@aio=off", "2x2-mapped@aio=threads"]
    for cell in data["cells"]:
        extra = cell["extra"]
        assert cell["errors"]["total"] == 0 and extra["hot_errors"] == 0, cell
        assert extra["hot_requests"] > 0 and extra["hot_p99_ms"] >= extra["hot_p50_ms"] > 0
        assert extra["evicted_mb"] > 0
        assert "disk_read_mb" in extra  # the checkout's disk is a block device here
        assert 0 <= extra["resident_before"] <= 1 and 0 <= extra["resident_after"] <= 1
    assert "disk touched" in (tmp_path / "mixed" / "report.md").read_text()
    assert "hot-file p99 with aio threads / aio off" in stdout.replace("\n  ", " ").replace("\n    ", " ")


def test_smoke_reuseport_records_each_nginx_worker(tmp_path, data_dir):
    data, _ = compare(tmp_path / "reuse", data_dir, "--scenario", "reuseport", "--concurrency", "8",
                      "--layouts", "1x2-mapped@nginx_workers=2,reuseport=off,1x2-mapped@nginx_workers=2,"
                                   "reuseport=on", in_process=True)
    assert len(data["cells"]) == 2
    for cell in data["cells"]:
        extra = cell["extra"]
        assert cell["errors"]["total"] == 0
        assert extra["nginx_workers"] == 2 and len(extra["nginx_worker_conns"]) == 2
        # A sample: connections being re-opened (nginx's keepalive_requests) may be missed.
        assert 0 < sum(extra["nginx_worker_conns"]) <= 16
        assert len(extra["nginx_worker_cpu_s"]) == 2 and sum(extra["nginx_worker_cpu_s"]) > 0
        assert sum(cell["worker_requests"].values()) == 0  # static: nginx alone
    assert "reuseport on / off" in (tmp_path / "reuse" / "report.md").read_text()


def test_smoke_openloop_one_step(tmp_path):
    out = tmp_path / "open"
    proc = bench(out, "openloop", "--layout", "1x2-mapped", "--rates", "20", "--step", "15", "--warmup", "1",
                 "--path", "/healthz")
    data = json.loads((out / "results.json").read_text())
    assert data["format_version"] == 2 and data["kind"] == "openloop" and data["arguments"]["complete"] is True
    (step,) = data["steps"]
    assert step["rate"] == 20 and step["requests"] == 300
    # the server's verdict, or none when httperf (niced) sent late on a busy machine, which is said
    assert step["verdict"] in ("pass", "fail") or starved(step["reasons"]), step
    assert step["reply_rate"]["samples"] >= 2 and len(step["reply_rate"]["each"]) >= 2
    assert step["errors"]["fd_unavail"] == 0 and step["status"]["4xx"] == 0
    assert (out / step["raw_output"]).read_text().count("Total: connections") == 1
    assert "knee" in proc.stdout and (out / "report.md").stat().st_size > 0
    assert (out / "reply-rate.png").stat().st_size > 0
