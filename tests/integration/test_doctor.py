"""`uwsgi-layouts doctor` against real nginx + uWSGI stacks under real wrk load.

Each stack comes from ``bench.stack.Lab`` (in this test's run directories: the leak check covers
them) and is loaded by wrk through nginx for a few seconds; doctor runs as a user runs it (the
CLI, in its own process) for 2-3 s of that load, and its results.json is read back (a window
with no load of this test's to overlap, through the console's main in this process). The
figures that decide (pile-up share, queue length) are the sampler's, so each test can fail
both ways: 2x4-shared at 2P must pile up, 2x4-mapped must not, an idle stack must show no
traffic, a small backlog under saturation must fill. The bundle under systemd (unix stats
socket): test_bundle_systemd.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.integration.attacks import ROOT_ONLY
from tests.integration.support import REPO_ROOT, SLOW
from tests.integration.test_stats_server import SECRETS, request_in_flight, wait_for_secret
from tests.refusals import refusal
from tests.test_cli import cli_in_process
from uwsgi_layouts import console
from uwsgi_layouts.bench.load.wrk import WrkProcess
from uwsgi_layouts.bench.stack import Lab

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

ARTICLE = "/?rounds=5&fib=25&io_ms=10"  # the article's request: ~100 ms, half of it holding the GIL


@pytest.fixture
def lab(run_dirs, free_ports):
    with Lab(new_dir=run_dirs, free_ports=free_ports) as lab:
        yield lab


def doctor(*args: str) -> subprocess.CompletedProcess:
    """doctor for its whole window through the console's main in this process: an interpreter of its
    own costs 2-3 s of CPU (numpy, scipy, matplotlib). The tests that watch while a load runs, or
    signal doctor, run it in its own process (``watching``), as a user does."""
    return cli_in_process("doctor", *args)


def record(out: Path) -> dict:
    return json.loads((out / "results.json").read_text())["diagnoses"][0]


def names(diagnosis: dict) -> list[str]:
    return [f["name"] for f in diagnosis["findings"]]


def watch_under_load(stack, out: Path, connections: int, path: str = ARTICLE, for_s: int = 3,
                     *extra: str) -> subprocess.CompletedProcess:
    # The load starts once doctor says it watches, not before: its start-up (imports, the first reads)
    # takes seconds on a loaded machine, and a load begun earlier spent them burning both cores unseen.
    # wrk then runs until doctor is done (stopped below): the window is loaded to its end, whatever
    # doctor's own pace. No wait for the requests to flow here: a sampler of this test's own would only
    # compete with doctor's for the CPU in its window, and each test asserts the requests doctor saw.
    with watching(stack, out, "--for", str(for_s), *extra) as (proc, first):
        load = WrkProcess(stack.layout.url.rstrip("/") + path, connections, for_s + 60, timeout_s=10)
        try:
            stdout, stderr = proc.communicate(timeout=60)
        finally:
            load.stop()
    print(first + stdout, stderr)
    return subprocess.CompletedProcess(proc.args, proc.returncode, first + stdout, stderr)


def test_shared_socket_at_2p_piles_up(lab, tmp_path):
    with lab.stack("2x4-shared") as stack:
        proc = watch_under_load(stack, tmp_path / "doc", connections=4)
    assert proc.returncode == 0, proc.stderr
    d = record(tmp_path / "doc")
    assert (d["layout"]["processes"], d["layout"]["threads"], d["layout"]["strategy"]) == (2, 4, "shared")
    assert d["layout"]["evidence"].startswith("the workers' open sockets")
    assert d["requests"] > 0 and d["inflight"]["samples"] >= 50
    assert d["inflight"]["pileup"] >= 0.10, d["inflight"]
    assert names(d)[0] == "pileup", d["findings"]
    assert "share one socket (shared)" in proc.stdout
    assert "uwsgi-layouts tune --concurrency" in proc.stdout and "--app app.wsgi:application" in proc.stdout
    assert {w: f["requests"] > 0 for w, f in d["workers"].items()} == {"1": True, "2": True}
    assert all(f.get("mean_ms", 0) > 50 for f in d["workers"].values()), d["workers"]  # ~100 ms requests
    assert d["memory"]["kind"] == "pss" and set(d["memory"]["workers"]) == {"1", "2"}
    assert {p.name for p in (tmp_path / "doc").iterdir()} == {"results.json", "summary.json", "report.txt",
                                                             "report.md", "timeline.png"}


def test_mapped_sockets_at_2p_do_not_pile_up(lab, tmp_path):
    with lab.stack("2x4-mapped") as stack:
        proc = watch_under_load(stack, tmp_path / "doc", connections=4)
    assert proc.returncode == 0, proc.stderr
    d = record(tmp_path / "doc")
    assert d["layout"]["strategy"] == "mapped"
    assert [s["workers"] for s in d["layout"]["sockets"]] == [[1], [2]], "read from each worker's descriptors"
    assert d["requests"] > 0 and d["inflight"]["peak"] >= 2
    # The window was loaded, not idle samples diluting the pile-up share: each worker held a request
    # in most of them (4 connections, 2 per worker's socket).
    assert all(share.get("0", 0) < 0.5 for share in d["inflight"]["workers"].values()), d["inflight"]
    assert d["inflight"]["pileup"] < 0.10, d["inflight"]
    assert "pileup" not in names(d), d["findings"]


def test_idle_stack_says_no_traffic(lab, tmp_path):
    with lab.stack("2x4-mapped") as stack:
        proc = doctor("--stats", stack.layout.stats_address, "--for", "2", "--out", str(tmp_path / "doc"))
    assert proc.returncode == 0, proc.stderr
    assert "no traffic in the window" in proc.stdout
    d = record(tmp_path / "doc")
    assert names(d) == ["idle"] and d["requests"] == 0
    assert 1.5 <= d["observed_s"] <= 3.0 and d["inflight"]["samples"] >= 30  # 25 reads/s for 2 s


@pytest.mark.parametrize("transport", ["tcp", "unix"])
def test_saturation_with_a_small_backlog_fills_the_queue(lab, tmp_path, transport):
    """2 workers x 2 threads, backlog 4, 24 connections of 200 ms: every thread busy and the
    queue full. TCP: uWSGI's master reports the queue; unix: the kernel (sock_diag) does."""
    with lab.stack("2x2-shared", backlog=4, transport=transport, access_log=True) as stack:
        log = Path(stack.layout.run_dir) / "logs" / "access.log"
        proc = watch_under_load(stack, tmp_path / "doc", 24, SLOW.format(ms=200), 3, "--access-log", str(log))
    assert proc.returncode == 0, proc.stderr
    d = record(tmp_path / "doc")
    (name, queue), = d["queue"]["sockets"].items()
    assert queue["backlog"] == 4 and queue["max"] >= 4, d["queue"]
    assert d["inflight"]["saturated"] >= 0.25
    assert names(d)[0] == "queue", d["findings"]
    assert "under-provisioned for the observed peak of at least" in d["findings"][0]["text"]
    access = d["access"]
    assert access["used"] > 0 and access["formats"] == {"upstreams": access["used"]}
    assert access["timing"] == "upstream" and access["status"]["2xx"]["requests"] > 0
    assert set(access["upstreams"]) <= {name, f"unix:{name}"}, (access["upstreams"], name)
    if transport == "unix":
        assert d["queue"]["source"].startswith("unix sockets: the kernel")
        assert access["status"].get("5xx", {}).get("requests", 0) > 0, "a full unix queue answers 502 at once"


@contextmanager
def watching(stack, out: Path, *args: str):
    """doctor on ``stack`` (by default for a 30-s window) in its own process, entered once it
    watches, with that first line; killed on the way out if it is still running."""
    proc = subprocess.Popen([sys.executable, "-m", "uwsgi_layouts", "doctor", "--stats", stack.layout.stats_address,
                             *(args or ("--for", "30")), "--out", str(out)], cwd=REPO_ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        first = proc.stdout.readline()
        assert first.startswith("doctor: watching"), first + proc.stderr.read()
        yield proc, first
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_a_service_that_stops_mid_window_ends_it_with_the_figures_so_far(lab, tmp_path):
    out = tmp_path / "doc"
    with lab.stack("2x4-mapped") as stack, watching(stack, out) as (proc, _):
        time.sleep(1.5)
        stack.stop()
        stdout, stderr = proc.communicate(timeout=30)
    print(stdout, stderr)
    assert proc.returncode == 1, stderr
    assert "STOPPED EARLY: the stats server stopped answering at" in stdout
    d = record(out)
    assert d["ended"] == "stopped" and 1.0 <= d["observed_s"] < 10, d["observed_s"]
    # uWSGI removes its stats socket as it stops (vacuum): why the reads failed, in the note
    assert "no such file or directory" in d["end_note"].lower()


def test_bad_input_is_one_line_and_writes_nothing(lab, tmp_path, capsys):
    """What listens but is no stats server (nginx, uWSGI's own socket), and an access log doctor
    cannot read beside a real one, are refused in one line before anything starts. doctor runs in
    this process (its command line as the console routes it): an interpreter of its own per case
    (numpy and matplotlib imported each time) made this one of the slowest tests of the suite. The
    refusals that need no server (nothing listening, an option out of range) are tests/test_doctor.py's."""
    out = tmp_path / "doc"
    with lab.stack("1x1-mapped") as stack:
        capsys.readouterr()  # what starting the stack said (a note on a cgroup a dead run left) is not doctor's
        layout = stack.layout
        cases = {
            # nginx speaks HTTP and waits for a request: no document comes
            layout.listen: "is not a uWSGI stats server (no document within 2 s)",
            # uWSGI's own socket waits for a uwsgi packet: the same
            layout.sockets[0].address: "is not a uWSGI stats server",
        }
        for address, expected in cases.items():
            line = refusal(console.main, ["doctor", "--stats", address, "--for", "2", "--out", str(out)], capsys,
                           silent=True)
            assert line.startswith("error: stats: ") and expected in line, (address, line)
        line = refusal(console.main, ["doctor", "--stats", layout.stats_address, "--access-log",
                                      str(tmp_path / "none.log"), "--out", str(out)], capsys, silent=True)
        assert "access_log: cannot read" in line, line
    assert not out.exists()


def test_sigterm_ends_the_window_early_and_keeps_the_figures(lab, tmp_path):
    out = tmp_path / "doc"
    with lab.stack("2x4-mapped") as stack, watching(stack, out) as (proc, _):
        time.sleep(1.0)
        proc.terminate()
        stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 130, stderr
    assert "INTERRUPTED: interrupted at" in stdout and "no traffic in the window" in stdout
    d = record(out)
    assert d["ended"] == "interrupted" and 0.5 <= d["observed_s"] < 10


@ROOT_ONLY
@pytest.mark.parametrize("tcp", [True, False], ids=["tcp-stats", "unix-stats"])
def test_doctor_names_a_stats_server_others_can_read_first_and_stores_no_cookie(lab, tmp_path, free_ports, tcp):
    """Issue 31: a request carrying a session cookie is in flight while doctor watches; what doctor
    writes never holds it. A TCP stats server (any local user connects) is its first finding, in
    words, with what to change; the lab's default unix socket is not."""
    out = tmp_path / "doc"
    options = {"stats_port": free_ports(1)[0], "allow": "tcp-stats"} if tcp else {}
    with lab.stack("2x2-mapped", **options) as stack:
        # Long enough to outlast doctor's start on a busy machine: it must be in flight while doctor samples.
        with request_in_flight(stack.layout.listen_port, "/?rounds=3&fib=0&io_ms=5000") as status:
            wait_for_secret(stack.layout.stats_address, status)
            proc = doctor("--stats", stack.layout.stats_address, "--for", "2", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert status == [200]
    d = record(out)
    if tcp:
        assert names(d)[0] == "stats-exposed", d["findings"]
        assert "1. every local user can read the stats server 127.0.0.1:" in proc.stdout
        assert "replace `stats = 127.0.0.1:" in d["findings"][0]["action"]
    else:
        assert "stats-exposed" not in names(d) and d["exposure"] == {}
    assert d["inflight"]["peak"] >= 1, "the request with the cookie was seen in flight"
    leaked = [p.name for p in out.iterdir() if any(s.encode() in p.read_bytes() for s in SECRETS)]
    assert leaked == [] and not any(s in proc.stdout + proc.stderr for s in SECRETS)
