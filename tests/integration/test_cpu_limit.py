"""Inside a CPU limit, for real: a layout's @cpus/@memory puts the app server's whole tree (and
nothing else) in a cgroup of its own, removed on every exit path (and after a SIGKILL by the next
stack); its throttling figures are what the kernel's cpu.stat says over the same window; the
tool inside a quota counts the quota's CPUs; a quota the kernel refuses is one line, exit 2,
nothing left. Needs root and a writable cgroup cpu controller (skipped otherwise)."""

from __future__ import annotations

import json
import os
import pwd
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from tests.integration.support import FAST, kill_run
from uwsgi_layouts.bench.load.wrk import WrkProcess
from uwsgi_layouts.bench.observe import Snapshot, limit_record
from uwsgi_layouts.deploy.machine import homes, read_v1, read_v2
from uwsgi_layouts.deploy.model import LayoutError, parse_layout
from uwsgi_layouts.deploy.render import write_layout
from uwsgi_layouts.deploy.run import Stack, existing_cgroups, http_get
from uwsgi_layouts.deploy.run import cgroup as cgroup_module

HOMES, WHY = homes()
pytestmark = [pytest.mark.integration, pytest.mark.timeout(120),
              pytest.mark.skipif(HOMES is None, reason=f"no writable cgroup controller: {WHY}")]
REPO = Path(__file__).resolve().parents[2]
CPU_HEAVY = "/?rounds=2&fib=22&io_ms=0"  # the demo app, CPU-bound


def ours() -> set[str]:
    """This process's cgroups (the name carries the owner pid): parallel workers make their own."""
    return {d for d in existing_cgroups() if d.endswith(f"-{os.getpid()}")}


def procs(directory: Path) -> set[int]:
    return {int(x) for x in (directory / "cgroup.procs").read_text().split()}


def test_server_tree_alone_in_its_cgroup_with_the_limits(start_stack):
    before = ours()
    stack = start_stack("2x2-mapped", cpus="0.5", memory="256")
    (cgroup,) = stack.cgroups.values()
    cpu_dir = cgroup.directories.get("cpu") or cgroup.directories[""]
    if HOMES.version == 1:
        assert (cpu_dir / "cpu.cfs_quota_us").read_text().split() == ["50000"]
        assert (cpu_dir / "cpu.cfs_period_us").read_text().split() == ["100000"]
        memory_dir = cgroup.directories["memory"]
        assert int((memory_dir / "memory.limit_in_bytes").read_text()) == 256 * 1024 * 1024
    else:
        assert (cpu_dir / "cpu.max").read_text().split() == ["50000", "100000"]
        memory_dir = cpu_dir
        assert int((memory_dir / "memory.max").read_text()) == 256 * 1024 * 1024
    tree = {stack.app.pid, *(c.pid for c in psutil.Process(stack.app.pid).children(recursive=True))}
    assert len(tree) >= 3  # master + 2 workers
    for directory in cgroup.directories.values():
        inside = procs(directory)
        assert tree <= inside, (tree, inside)
        assert stack.pids["nginx"] not in inside and os.getpid() not in inside
    status, _, body = http_get("127.0.0.1", stack.layout.listen_port, FAST)
    assert status == 200 and body == b"Hello, world"
    assert cgroup.describe().startswith(f"0.5 CPUs and 256 MB in cgroup ul-{cgroup.run_id}-{os.getpid()} (/sys/fs/")
    dirs = list(cgroup.directories.values())
    stack.stop()
    assert not any(d.exists() for d in dirs) and ours() == before


def test_cell_throttling_equals_cpu_stat_over_the_same_window(start_stack, integration_tools):
    """A 0.1-CPU quota under a CPU-bound load: the cell's record (Snapshot + limit_record) is
    what the kernel's files say, read just outside the same window."""
    stack = start_stack("1x2-mapped", cpus="0.1")
    (cgroup,) = stack.cgroups.values()

    def raw():
        if cgroup.homes.version == 2:
            return read_v2(cgroup.directories[""])
        cpu = cgroup.directories["cpu"]
        return read_v1(cpu, cgroup.directories.get("cpuacct", cpu), None)

    outer_before, t0 = raw(), time.monotonic()
    before = Snapshot.take(stack)
    run = WrkProcess(f"{stack.layout.url.rstrip('/')}{CPU_HEAVY}", 4, 3.0, timeout_s=10).result()
    assert run.requests > 0
    after = Snapshot.take(stack)
    outer_after, t1 = raw(), time.monotonic()
    record = limit_record(0.1, None, before.limit, after.limit, after.t - before.t)
    whole = outer_after.since(outer_before)
    # The snapshots lie inside the raw reads; what differs is what ran in the gaps between them
    # (a snapshot also reads the stats server and the process trees): a period per 100 ms, plus one.
    slack = 1 + int(((before.t - t0) + (t1 - after.t)) / 0.1)
    assert whole.periods - slack <= record["periods"] <= whole.periods
    assert whole.throttled_periods - slack <= record["throttled_periods"] <= whole.throttled_periods
    assert record["throttled_s"] <= whole.throttled_s + 1e-4  # the record rounds to 0.1 ms
    assert record["cpu_s"] <= whole.cpu_s + 1e-4
    # And the quota: the server wanted more than 0.1 CPU (even on a busy machine), got about that,
    # and was throttled.
    seconds = after.t - before.t
    assert record["periods"] >= 0.8 * seconds * 10  # 100 ms periods while it ran
    assert record["throttled_share"] > 0.3, record
    assert record["cpu_s"] <= 0.1 * seconds * 1.1 + 0.05, (record, seconds)
    assert 0.3 < record["quota_share"] <= 1.1, record


def test_a_sigkilled_owner_cgroup_is_removed_by_the_next_stack(make_layout, leftover_processes, tmp_path,
                                                               monkeypatch):
    """The owner and the next stack keep their state files in a directory of this test's own: any
    other run on the machine would rightly clean a dead owner's cgroup first, and say it there."""
    state_dir = tmp_path / "state"
    monkeypatch.setattr(cgroup_module, "STATE_DIR", state_dir)
    layout = make_layout("1x1-mapped", cpus="0.5")
    write_layout(layout, layout.run_dir)
    child = textwrap.dedent("""
        import sys, time
        from pathlib import Path
        from uwsgi_layouts.deploy.machine import checked
        from uwsgi_layouts.deploy.model import layout_from_record
        from uwsgi_layouts.deploy.run import Stack, cgroup
        import json
        cgroup.STATE_DIR = Path(sys.argv[2])
        layout = checked(layout_from_record(json.loads(sys.argv[1])))
        stack = Stack(layout).__enter__()
        print(" ".join(str(d) for d in next(iter(stack.cgroups.values())).directories.values()), flush=True)
        time.sleep(600)
    """)
    proc = subprocess.Popen([sys.executable, "-c", child, json.dumps(layout.to_dict()), str(state_dir)], cwd=REPO,
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        dirs = [Path(d) for d in proc.stdout.readline().split()]
        assert dirs and all(d.is_dir() for d in dirs) and len(list(state_dir.glob("*.json"))) == 1
        kill_run(proc)  # SIGKILL: no cleanup; PDEATHSIG ends the server
        assert all(d.is_dir() for d in dirs)
        deadline = time.monotonic() + 10
        while any(procs(d) for d in dirs) and time.monotonic() < deadline:
            time.sleep(0.05)
        said: list[str] = []
        unlimited = make_layout("1x1-mapped")
        write_layout(unlimited, unlimited.run_dir)
        with Stack(unlimited, report=said.append):
            pass
        assert not any(d.exists() for d in dirs)
        assert any(f"pid {proc.pid}" in line and "removed cgroup" in line for line in said), said
        assert not list(state_dir.glob("*.json"))
    finally:
        kill_run(proc)
        proc.stdout.close()


def test_bad_limits_are_refused():
    with pytest.raises(LayoutError, match="cpus: must be a number of CPUs in 0.01"):
        parse_layout("1x1-mapped", run_dir="/tmp/x", cpus="0")
    with pytest.raises(LayoutError, match="cpus"):
        parse_layout("1x1-mapped", run_dir="/tmp/x", cpus="-1")
    with pytest.raises(LayoutError, match="memory"):
        parse_layout("1x1-mapped", run_dir="/tmp/x", memory="0")


def run_cli(*args: str, cgroup_procs: Path | None = None) -> subprocess.CompletedProcess:
    def enter():
        if cgroup_procs is not None:
            cgroup_procs.write_text(str(os.getpid()))
    return subprocess.run([sys.executable, "-m", "uwsgi_layouts", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=60, preexec_fn=enter)


def test_more_cpus_than_the_host_is_one_line_exit_2(tmp_run_dir):
    n = os.cpu_count()
    res = run_cli("render", f"1x1-mapped@cpus={n + 1}", "--out", str(tmp_run_dir / "out"))
    assert res.returncode == 2, res
    assert res.stderr.strip().count("\n") == 0 and f"this machine's {n} CPUs" in res.stderr, res.stderr


@pytest.fixture
def quota_cgroup():
    """A cgroup of this test's own under our cpu cgroup with a 0.3-CPU quota (v1 here)."""
    if HOMES.version != 1:
        pytest.skip("the kernel refuses a child quota above its parent's on cgroup v1 only")
    parent = HOMES.parent("cpu") / f"ul-test-{os.getpid()}"
    parent.mkdir()
    try:
        (parent / "cpu.cfs_quota_us").write_text("30000")
        yield parent
    finally:
        for pid in procs(parent):
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 5
        while True:
            try:
                parent.rmdir()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)


def test_the_tool_inside_a_quota_counts_the_quota(quota_cgroup):
    code = "from uwsgi_layouts.deploy.machine import cpu_limit; import json; print(json.dumps(cpu_limit().to_dict()))"
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=30,
                         preexec_fn=lambda: (quota_cgroup / "cgroup.procs").write_text(str(os.getpid())))
    limit = json.loads(res.stdout)
    assert limit["quota"] == 0.3 and limit["usable"] == 0.3 and limit["host"] == os.cpu_count(), limit
    assert limit["quota_source"].endswith(f"{quota_cgroup.name}/cpu.cfs_quota_us")
    inside = run_cli("tune", "--help", cgroup_procs=quota_cgroup / "cgroup.procs")
    outside = run_cli("tune", "--help")
    assert "usable CPUs = 2;" in " ".join(inside.stdout.split()), inside.stdout  # 2 x 1 CPU
    assert f"usable CPUs = {2 * len(os.sched_getaffinity(0))};" in " ".join(outside.stdout.split())


def test_a_quota_the_kernel_refuses_is_one_line_exit_2(quota_cgroup, tmp_run_dir, free_ports, leftover_processes):
    base, listen = free_ports(2)
    res = run_cli("run", "1x1-mapped@cpus=1", "--run-dir", str(tmp_run_dir), "--listen", f"127.0.0.1:{listen}",
                  "--base-port", str(base), "--for", "1",
                  cgroup_procs=quota_cgroup / "cgroup.procs")
    assert res.returncode == 2, res
    line = res.stderr.strip()
    assert "\n" not in line and "cpus: the kernel refused cpu.cfs_quota_us = 100000" in line, line
    assert "parent cgroup's quota is smaller" in line
    assert [p.name for p in quota_cgroup.iterdir() if p.is_dir()] == []  # no cgroup left behind
    assert leftover_processes([str(tmp_run_dir)], timeout=5) == []


def test_tune_for_a_pod_sizes_the_search_from_its_cpus(tmp_run_dir, leftover_processes):
    """tune --cpus 0.5: concurrency 2 x 1, P up to 2, every candidate under a 0.5-CPU quota, and
    the recommendation says the pod's layout, its throttling and its memory request.

    The demo app's mostly-waiting mix (io-heavy): what is checked is how the pod sizes the search
    and what the recommendation says, none of which depends on the app's CPU; the article's mix
    kept the quota full through the whole budget (about 20 CPU-s). That the throttling figures are
    the kernel's is test_cell_throttling_equals_cpu_stat_over_the_same_window's."""
    out = tmp_run_dir / "tune-pod"
    proc = subprocess.run([sys.executable, "-m", "uwsgi_layouts", "tune", "--cpus", "0.5", "--memory", "512",
                           "--budget", "1", "--strategies", "mapped", "--threads", "2", "--scenario", "io-heavy",
                           "--out", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads((out / "results.json").read_text())
    a = data["arguments"]
    assert (a["cpus"], a["memory"], a["concurrency"], a["max_processes"], a["nproc"]) == (0.5, 512, 2, 2, 1)
    assert data["cells"] and all(c["limit"]["cpus"] == 0.5 and c["limit"]["memory_mb"] == 512 for c in data["cells"])
    assert all(c["limit"]["periods"] > 0 for c in data["cells"])
    chosen = a["tune"]["decision"]["chosen"]
    text = " ".join(proc.stdout.split())  # the terminal wraps sentences
    assert f"POD: for a pod of 0.5 CPU (limits.cpu 500m) and 512 MB of memory, run {chosen}" in text, proc.stdout
    assert "throttled in" in text and "memory request" in text
    recorded = json.loads((out / "recommended" / "layout.json").read_text())
    assert recorded["cpus"] is None and recorded["memory"] is None  # the pod's runtime sets the limit
    assert ours() == set() and leftover_processes([str(out)], timeout=5) == []


def test_memory_below_one_worker_is_refused_with_the_figure(tmp_run_dir, free_ports, leftover_processes):
    base, listen = free_ports(2)
    res = run_cli("run", "1x1-mapped@memory=5", "--run-dir", str(tmp_run_dir), "--listen", f"127.0.0.1:{listen}",
                  "--base-port", str(base), "--for", "1")
    assert res.returncode == 2, res
    line = res.stderr.strip()
    assert "\n" not in line and re.search(r"memory: 5 MB is below one worker's memory: .* held \d+ MB", line), line
    assert ours() == set() and leftover_processes([str(tmp_run_dir)], timeout=5) == []


HOG = """
def app(environ, start_response):
    if environ.get("PATH_INFO") == "/hog":
        hog = bytearray(400 * 1024 * 1024)  # touched page by page: charged to the cgroup at once
        for i in range(0, len(hog), 4096):
            hog[i] = 1
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"ok"]
"""


@pytest.mark.skipif(HOMES is not None and not HOMES.memory, reason="no writable memory controller")
def test_an_oom_kill_is_counted_and_is_an_error(start_stack, run_dirs):
    """A worker that outgrows @memory is OOM-killed by the kernel: the cgroup's counter says so,
    and a cell's record holds it."""
    app_dir = run_dirs()
    app_dir.chmod(0o755)
    (app_dir / "hog.py").write_text(HOG)
    (app_dir / "hog.py").chmod(0o644)
    stack = start_stack("1x1-mapped", app="hog:app", app_dir=str(app_dir), memory="128")
    before = Snapshot.take(stack)
    status, _, _ = http_get("127.0.0.1", stack.layout.listen_port, "/hog", timeout=30)
    assert status >= 500  # the worker died under the request
    deadline = time.monotonic() + 10
    while stack.cgroup_reading().oom_kills == before.limit.oom_kills and time.monotonic() < deadline:
        time.sleep(0.05)
    after = Snapshot.take(stack)
    record = limit_record(None, 128, before.limit, after.limit, after.t - before.t)
    assert record["oom_kills"] >= 1 and record["memory_mb"] == 128, record
    # A cell's errors count it (bench.kinds.closedloop.make_cell: tests/test_cpus.py checks the sum).


def test_without_a_writable_controller_it_says_what_is_needed(run_dirs):
    """As another user (nobody: no cgroup is writable), @cpus is one line, exit 2, nothing written."""
    home = run_dirs()
    nobody = pwd.getpwnam("nobody")
    os.chown(home, nobody.pw_uid, nobody.pw_gid)
    out = home / "out"
    res = subprocess.run(["runuser", "-u", "nobody", "--", sys.executable, "-m", "uwsgi_layouts", "render",
                          "1x1-mapped@cpus=1", "--out", str(out)], cwd=REPO, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 2, res
    line = res.stderr.strip()
    assert "\n" not in line and line.startswith("error: cpus: a CPU limit needs root: the cgroup cpu controller"), line
    assert not out.exists()
