"""Where httperf runs, for real (bench.load.generator): against a stack with a CPU quota it runs
in a cgroup of its own (read from /proc/PID/cgroup while it runs), beside the app server's, at the
lowest CPU priority (cpu.idle 1, or the minimum weight), and the cgroup is gone after the run;
without a quota it runs where the command does. After a SIGKILL of its owner, the generator's
cgroup is removed by the next run, which says so. Needs root and a writable cgroup cpu controller
(skipped otherwise)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from tests.integration.support import FAST, kill_run
from uwsgi_layouts.bench.load import httperf
from uwsgi_layouts.bench.load.generator import placed
from uwsgi_layouts.deploy.machine import homes
from uwsgi_layouts.deploy.model import parse_variant
from uwsgi_layouts.deploy.run import cgroup as cgroup_module
from uwsgi_layouts.deploy.run import existing_cgroups

HOMES, WHY = homes()
pytestmark = [pytest.mark.integration, pytest.mark.timeout(180),
              pytest.mark.skipif(HOMES is None, reason=f"no writable cgroup controller: {WHY}")]
REPO = Path(__file__).resolve().parents[2]
CPU_CONTROLLER = "cpu" if HOMES is not None and HOMES.version == 1 else ""


def cpu_cgroup(pid: int) -> str:
    """The cgroup (path under the hierarchy) of ``pid`` for the cpu controller (v1) or v2's."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if (CPU_CONTROLLER in controllers.split(",")) if CPU_CONTROLLER else controllers == "":
            return path
    raise AssertionError(f"no cpu cgroup line for pid {pid}")


def mount() -> str:
    """The cpu controller's mount point (v1) or v2's."""
    for line in Path("/proc/self/mounts").read_text().splitlines():
        _, where, fstype, options = line.split()[:4]
        if HOMES.version == 2 and fstype == "cgroup2":
            return where
        if HOMES.version == 1 and fstype == "cgroup" and "cpu" in options.split(","):
            return where
    raise AssertionError("no cpu cgroup mount")


def httperf_of(proc: subprocess.Popen, timeout_s: float = 90) -> psutil.Process:
    """The httperf process ``proc`` started for its first step, once it runs."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        for child in psutil.Process(proc.pid).children(recursive=True):
            try:
                if child.name() == "httperf" and "--rate" in child.cmdline():  # not `httperf --version`
                    return child
            except psutil.NoSuchProcess:
                continue
        time.sleep(0.05)  # polling interval while the stack starts
    raise AssertionError("httperf did not start")


def descriptors(httperf_output: str) -> int:
    """The open-descriptor limit httperf said it runs with."""
    m = re.search(r"maximum number of open descriptors = (\d+)", httperf_output)
    assert m, httperf_output[-2000:]
    return int(m[1])


def plain_httperf(port: int) -> str:
    """httperf's output run from here, in this process's cgroup (one connection to ``port``, where
    nobody listens)."""
    done = subprocess.run(httperf.command(port, "/", 1, 1, 1), capture_output=True, text=True, timeout=60)
    return done.stdout + done.stderr


def openloop(out: Path, layout: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "uwsgi_layouts", "openloop", "--layout", layout, "--rates", "5",
                             "--step", "15", "--warmup", "1", "--path", FAST, "--out", str(out)],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_against_a_quota_httperf_runs_alone_in_its_lowest_priority_cgroup(tmp_run_dir, leftover_processes,
                                                                          free_ports):
    out = tmp_run_dir / "openloop"
    proc = openloop(out, "1x1-mapped@cpus=0.5")
    try:
        generator = httperf_of(proc)
        where = cpu_cgroup(generator.pid)
        directory = Path(mount()) / where.lstrip("/")
        assert Path(where).name.startswith("ul-loadgen-") and Path(where).name.endswith(f"-{proc.pid}"), where
        assert directory.is_dir()
        idle = directory / "cpu.idle"
        if idle.exists():  # SCHED_IDLE: the kernel shows its minimum weight (3) for it
            assert idle.read_text().strip() == "1"
        elif HOMES.version == 1:
            assert (directory / "cpu.shares").read_text().strip() == "2"
        else:
            assert (directory / "cpu.weight").read_text().strip() == "1"
        assert {int(x) for x in (directory / "cgroup.procs").read_text().split()} == {generator.pid}  # alone
        assert not (directory / "pids.max").exists()  # no pid limit (nor memory): CPU priority only
        # beside the app server's cgroup (the same parent), so their weights compete at one level
        servers = [Path(d) for d in existing_cgroups() if d.endswith(f"-{proc.pid}") and "loadgen" not in d]
        assert any(d.parent == directory.parent for d in servers), (servers, directory)
        assert cpu_cgroup(proc.pid) != where
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        kill_run(proc)
    assert proc.returncode == 0, stdout[-2000:] + stderr[-2000:]
    assert not directory.exists()
    assert not [d for d in existing_cgroups() if d.endswith(f"-{proc.pid}")]
    data = json.loads((out / "results.json").read_text())
    assert data["environment"]["load_generator"].startswith("httperf in a cgroup of its own")
    assert data["steps"][0]["client_cpu_pct"] >= 0
    assert "load generator: httperf in a cgroup of its own" in (out / "report.txt").read_text()
    # its descriptors as where it ran before (httperf raises its limit itself, up to select()'s)
    assert descriptors((out / "raw" / "step-5.txt").read_text()) == descriptors(plain_httperf(free_ports(1)[0]))
    assert leftover_processes([str(out)], timeout=5) == []


def test_without_a_quota_httperf_runs_where_the_command_does(tmp_run_dir, leftover_processes):
    out = tmp_run_dir / "openloop"
    proc = openloop(out, "1x1-mapped")
    try:
        generator = httperf_of(proc)
        assert cpu_cgroup(generator.pid) == cpu_cgroup(proc.pid)
        assert generator.nice() == 19
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        kill_run(proc)
    assert proc.returncode == 0, stdout[-2000:] + stderr[-2000:]
    data = json.loads((out / "results.json").read_text())
    assert data["environment"]["load_generator"].startswith("httperf in this process's cgroup under nice 19")


def test_a_sigkilled_owner_generator_cgroup_is_removed_by_the_next_run(tmp_path, monkeypatch, free_ports):
    """httperf at 1 connection a second for 10 minutes to a port nobody listens on (refused, and it
    goes on), in its cgroup; the owner SIGKILLed. The owner and the next run keep their state files
    in a directory of this test's own: any other run on the machine would rightly clean a dead
    owner's cgroup first, and say it there."""
    state_dir = tmp_path / "state"
    monkeypatch.setattr(cgroup_module, "STATE_DIR", state_dir)
    (port,) = free_ports(1)
    child = textwrap.dedent("""
        import sys
        from pathlib import Path
        from uwsgi_layouts.bench.load import httperf
        from uwsgi_layouts.bench.load.generator import placed
        from uwsgi_layouts.deploy.model import parse_variant
        from uwsgi_layouts.deploy.run import cgroup
        cgroup.STATE_DIR = Path(sys.argv[1])
        with placed(parse_variant("1x1-mapped@cpus=0.5", run_dir="/tmp/x")) as place:
            print(" ".join(place.join_files), flush=True)
            httperf.run(httperf.command(int(sys.argv[2]), "/", 1, 600, 5), 700, place.join_files)
    """)
    proc = subprocess.Popen([sys.executable, "-c", child, str(state_dir), str(port)], cwd=REPO,
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        dirs = [Path(f).parent for f in proc.stdout.readline().split()]
        assert dirs and all(d.is_dir() and d.name.startswith("ul-loadgen-") for d in dirs)
        assert len(list(state_dir.glob("loadgen-*.json"))) == 1
        generator = httperf_of(proc, timeout_s=20)
        assert Path(cpu_cgroup(generator.pid)).name == dirs[0].name
        kill_run(proc)  # SIGKILL: no cleanup; PDEATHSIG ends httperf
        generator.wait(timeout=10)
        assert all(d.is_dir() for d in dirs)
        said: list[str] = []
        with placed(parse_variant("1x1-mapped@cpus=0.5", run_dir="/tmp/x"), report=said.append) as place:
            assert Path(place.join_files[0]).parent.name != dirs[0].name
        assert not any(d.exists() for d in dirs)
        assert any(f"pid {proc.pid}" in line and f"removed cgroup {dirs[0].name}" in line for line in said), said
        assert not list(state_dir.glob("*.json"))
    finally:
        kill_run(proc)
        proc.stdout.close()
