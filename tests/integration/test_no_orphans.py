"""No orphans: SIGKILL `uwsgi-layouts run`, `bench compare` or `bench tune` (the OOM killer,
a cancelled CI job) and, within 5 s, no process of their stacks remains and every port is free.
The backstop for a process that cannot act on its parent-death signal (here: a uWSGI master
that is stopped): the next run in that directory, or the next lab, stops it and says so in one
line.

Every kill is a real SIGKILL of the real command, sent to that process alone.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.integration.support import REPO_ROOT, kill_run, port_closed
from tests.integration.test_stack import start_run, wait_for_hello
from uwsgi_layouts.bench.stack import Lab

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

GONE_WITHIN_S = 5.0


def command(p: psutil.Process) -> str:
    """Its command line, "" once it is gone or a zombie (processes come and go while we look)."""
    try:
        return " ".join(p.cmdline())
    except psutil.Error:
        return ""


def descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def alive(procs: list[psutil.Process]) -> list[str]:
    """Those of ``procs`` still running (the same process: pid and start time), not zombies."""
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(f"{p.pid} {command(p)[:120]}")
        except psutil.Error:
            continue
    return out


def listening_ports(procs: list[psutil.Process]) -> set[int]:
    ports = set()
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.pid in {p.pid for p in procs}:
            ports.add(conn.laddr.port)
    return ports


def wait_until(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"{what} not within {timeout:g} s")
        time.sleep(0.1)


def stack_of(pid: int, server: str) -> list[psutil.Process]:
    """The stack processes under ``pid`` once its app server and nginx (with workers) are up."""
    def found():
        procs = descendants(pid)
        names = " ".join(command(p) for p in procs)
        return procs if server in names and "nginx: worker" in names else None
    return wait_until(found, 60, f"a {server} stack under pid {pid}")


def assert_gone_after_sigkill(proc: subprocess.Popen, stack: list[psutil.Process], ports: set[int]) -> float:
    assert alive(stack), "nothing to check: the stack is not running"
    os.kill(proc.pid, signal.SIGKILL)  # the command alone, as the OOM killer would
    proc.wait(timeout=10)
    killed_at = time.monotonic()
    deadline = killed_at + GONE_WITHIN_S
    while (alive(stack) or not all(port_closed(p) for p in ports)) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = alive(stack)
    assert not left, f"still running {GONE_WITHIN_S:g} s after the SIGKILL: {left}"
    busy = sorted(p for p in ports if not port_closed(p))
    assert not busy, f"ports still open {GONE_WITHIN_S:g} s after the SIGKILL: {busy}"
    return time.monotonic() - killed_at


@pytest.mark.parametrize("spec,extra", [
    ("2x2-mapped", ()),  # unix sockets, the default
    ("2x2-mapped", ("--transport", "tcp")),
    ("2x2-gunicorn", ()),
    ("2x2-granian", ("--transport", "tcp")),
], ids=["uwsgi-unix", "uwsgi-tcp", "gunicorn", "granian-tcp"])
def test_sigkill_of_deploy_run_leaves_no_process_and_no_port(tmp_run_dir, tmp_path, free_ports, spec, extra):
    base, _, _, listen, stats = free_ports(5)
    proc = start_run(tmp_run_dir, tmp_path, *extra, spec=spec, ports=(base, listen, stats))
    try:
        wait_for_hello(proc, listen, tmp_path)
        server = spec.rpartition("-")[2].replace("mapped", "uwsgi")
        stack = stack_of(proc.pid, server)
        ports = listening_ports(stack)
        assert listen in ports
        took = assert_gone_after_sigkill(proc, stack, ports)
        print(f"\n{spec} {' '.join(extra)}: gone {took:.2f} s after the SIGKILL")
    finally:
        kill_run(proc)


def bench(out: Path, kind: str, *args: str, log: Path) -> subprocess.Popen:
    with open(log, "w") as sink:
        return subprocess.Popen([sys.executable, "-m", "uwsgi_layouts", kind, "--out", str(out), *args], cwd=REPO_ROOT,
                                stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)


@pytest.mark.parametrize("kind,args", [
    ("compare", ("--layouts", "2x2-mapped", "--concurrency", "2", "--duration", "60", "--repeats", "1",
                 "--warmup", "1")),
    ("tune", ("--concurrency", "2", "--budget", "5", "--strategies", "mapped", "--max-processes", "2",
              "--threads", "1,2")),
])
def test_sigkill_of_a_benchmark_under_load_leaves_no_process_and_no_port(tmp_run_dir, tmp_path, kind, args):
    # tune writes its recommended files under --out: the run user must reach it (tmp_run_dir is 0711)
    proc = bench(tmp_run_dir / "out", kind, *args, log=tmp_path / "bench.log")
    try:
        stack = stack_of(proc.pid, "uwsgi")
        # Under load: wrk is running against the stack.
        wait_until(lambda: any("wrk" in command(p) for p in descendants(proc.pid)), 60, "wrk under the benchmark")
        stack = [p for p in descendants(proc.pid) if p.is_running()]  # the stack, wrk and the sampler's children
        ports = listening_ports(stack)
        assert ports, "the stack listens on loopback ports"
        took = assert_gone_after_sigkill(proc, stack, ports)
        print(f"\nbench {kind}: gone {took:.2f} s after the SIGKILL")
    finally:
        kill_run(proc)


# --- the backstop: what cannot act on the signal is stopped by the next run ----------------------


def is_uwsgi(p: psutil.Process) -> bool:
    """A uWSGI process (named uwsgi: a binary, or pyuwsgi's python3 naming itself so), not our own
    ``python -m uwsgi_layouts``."""
    try:
        return p.name() == "uwsgi"
    except psutil.Error:
        return False


def uwsgi_master(procs: list[psutil.Process]) -> psutil.Process:
    masters = [p for p in procs if is_uwsgi(p) and p.parent() and not is_uwsgi(p.parent())]
    assert len(masters) == 1, masters
    return masters[0]


def test_a_stopped_master_outlives_deploy_run_and_the_next_run_stops_it(tmp_run_dir, tmp_path, free_ports):
    base, _, listen, stats = free_ports(4)
    for name in ("first", "second"):
        (tmp_path / name).mkdir()
    first = start_run(tmp_run_dir, tmp_path / "first", ports=(base, listen, stats))
    second = None
    master = None
    try:
        wait_for_hello(first, listen, tmp_path / "first")
        master = uwsgi_master(stack_of(first.pid, "uwsgi"))
        group = os.getpgid(master.pid)
        master.suspend()  # SIGSTOP: the parent-death signal stays pending, as for a hung master
        os.kill(first.pid, signal.SIGKILL)
        first.wait(timeout=10)
        time.sleep(1.0)
        assert master.is_running() and master.status() == psutil.STATUS_STOPPED, "the orphan to stop is not there"
        recorded = json.loads((tmp_run_dir / "stack.json").read_text())
        assert master.pid in {e["pid"] for e in recorded["processes"]}

        second = start_run(tmp_run_dir, tmp_path / "second", ports=(base, listen, stats))
        wait_for_hello(second, listen, tmp_path / "second")
        err = (tmp_path / "second" / "run.err").read_text()
        lines = [line for line in err.splitlines() if "orphaned" in line]
        assert len(lines) == 1 and f"uWSGI {master.pid}" in lines[0] and str(first.pid) in lines[0], err
        assert not master.is_running() or master.status() == psutil.STATUS_ZOMBIE
        assert not [p for p in psutil.process_iter() if _pgid(p) == group and p.status() != psutil.STATUS_ZOMBIE]
    finally:
        if master is not None and master.is_running():
            master.resume()
        for proc in (first, second):
            if proc is not None:
                kill_run(proc)


def _pgid(p: psutil.Process) -> int | None:
    try:
        return os.getpgid(p.pid)
    except OSError:
        return None


def test_a_stopped_master_outlives_a_benchmark_and_the_next_lab_stops_it(tmp_path, capfd):
    proc = bench(tmp_path / "out", "compare", "--layouts", "2x2-mapped", "--concurrency", "2", "--duration", "60",
                 "--repeats", "1", "--warmup", "1", log=tmp_path / "bench.log")
    master = None
    try:
        master = uwsgi_master(stack_of(proc.pid, "uwsgi"))
        ini = next((Path(a) for a in master.cmdline() if a.startswith("/tmp/ul-bench-")), None)
        assert ini is not None, master.cmdline()
        work = ini.parents[1]  # /tmp/ul-bench-XXXX/<layout>/uwsgi.ini
        assert (work / "lab.lock").is_file(), sorted(work.iterdir())
        master.suspend()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        time.sleep(1.0)
        # Tests run in parallel: any lab another test starts now looks for dead labs too and may stop
        # this master first. Then the work directory goes with it; a master that died with the
        # benchmark (what this test guards against) would leave its directory behind.
        gone = not master.is_running() or master.status() == psutil.STATUS_ZOMBIE
        if gone:
            deadline = time.monotonic() + 10
            while work.exists() and time.monotonic() < deadline:
                time.sleep(0.2)
            assert not work.exists(), "the master died with the benchmark and nobody stopped its lab"
            return
        assert master.status() == psutil.STATUS_STOPPED

        with Lab() as lab:
            assert lab.work_dir.exists()  # a new lab: it looks for dead ones first
        err = capfd.readouterr().err
        lines = [line for line in err.splitlines() if str(work) in line]
        assert not work.exists()
        assert not master.is_running() or master.status() == psutil.STATUS_ZOMBIE
        # Said once, naming the master; with parallel workers another test's lab may have said it.
        assert all(f"uWSGI {master.pid}" in line for line in lines) and len(lines) <= 1, err
        assert lines or os.environ.get("PYTEST_XDIST_WORKER"), err
    finally:
        if master is not None and master.is_running():
            master.resume()
        kill_run(proc)


def test_a_record_of_processes_long_gone_stops_nothing(tmp_run_dir, tmp_path, free_ports):
    """A record whose pids now belong to other processes (or to none): nothing is stopped or said."""
    base, _, listen, stats = free_ports(4)
    bystander = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        (tmp_run_dir / "stack.json").write_text(json.dumps({"owner": 1, "processes": [
            {"name": "uWSGI", "pid": bystander.pid, "started": psutil.Process(bystander.pid).create_time() - 100},
            {"name": "nginx", "pid": 2 ** 22 - 3, "started": 1.0}]}))
        proc = start_run(tmp_run_dir, tmp_path, ports=(base, listen, stats))
        try:
            wait_for_hello(proc, listen, tmp_path)
            assert "orphaned" not in (tmp_path / "run.err").read_text()
            assert bystander.poll() is None, "a process whose pid was reused was stopped"
        finally:
            kill_run(proc)
    finally:
        bystander.kill()
        bystander.wait()
