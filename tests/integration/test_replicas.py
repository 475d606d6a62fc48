"""Replicas for real: ``@replicas=2`` starts two uWSGI masters, each with its own sockets, stats
server and cgroup (the layout's quota each) holding its own process tree and nothing else; one
nginx spreads requests over both; everything (processes, cgroups) is gone after a stop, and after
a SIGKILL of the owner the next stack removes each replica's cgroup. Too many replicas for this
machine, or none, is one line, exit 2, nothing left. Needs root and a writable cgroup cpu
controller for the cgroup parts (skipped otherwise)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from tests.integration.support import FAST, kill_run, read_until
from uwsgi_layouts.bench.observe import Snapshot, limit_record, stack_memory
from uwsgi_layouts.deploy.machine import checked, homes
from uwsgi_layouts.deploy.model import parse_layout, total_limits
from uwsgi_layouts.deploy.render import write_layout
from uwsgi_layouts.deploy.run import Stack, existing_cgroups, http_get
from uwsgi_layouts.deploy.run import cgroup as cgroup_module

HOMES, WHY = homes()
needs_cgroups = pytest.mark.skipif(HOMES is None, reason=f"no writable cgroup controller: {WHY}")
pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
REPO = Path(__file__).resolve().parents[2]


def ours() -> set[str]:
    return {d for d in existing_cgroups() if d.endswith(f"-{os.getpid()}")}


def procs(directory: Path) -> set[int]:
    try:
        return {int(x) for x in (directory / "cgroup.procs").read_text().split()}
    except FileNotFoundError:  # removed already (by any stack on this machine: the owner is dead)
        return set()


def tree(pid: int) -> set[int]:
    return {pid, *(c.pid for c in psutil.Process(pid).children(recursive=True))}


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def replicas_layout(run_dirs, free_ports, spec: str, replicas: int, **opts):
    """Ports for every replica: S sockets each and the listen port; each replica's stats server is the
    default unix socket in its own run directory."""
    sockets = len(parse_layout(spec, run_dir="/tmp/x").sockets)
    ports = free_ports(sockets * replicas + 1)
    return checked(parse_layout(spec, run_dir=str(run_dirs()), base_port=ports[0],
                                listen=f"127.0.0.1:{ports[sockets * replicas]}", replicas=replicas, **opts))


@needs_cgroups
def test_two_replicas_each_in_its_own_cgroup_both_serving(run_dirs, free_ports):
    before = ours()
    layout = replicas_layout(run_dirs, free_ports, "2x1-mapped", 2, cpus="0.5", memory="256")
    write_layout(layout, layout.run_dir)
    stack = Stack(layout, start_timeout=60)
    with stack:
        assert [m.host for m in stack.members] == ["replica-1", "replica-2"]
        assert len(stack.cgroups) == 2
        masters = [m.proc.pid for m in stack.members]
        assert len(set(masters)) == 2
        # Each replica's cgroup holds that replica's whole tree, nothing of the other's nor nginx.
        for member in stack.members:
            cgroup = stack.cgroups[member.host]
            own = tree(member.proc.pid)
            assert len(own) == 3  # master + 2 workers
            for directory in cgroup.directories.values():
                inside = procs(directory)
                assert own <= inside, (member.host, own, inside)
                others = set().union(*(tree(m.proc.pid) for m in stack.members if m is not member))
                assert not inside & others and stack.pids["nginx"] not in inside
            quota = cgroup.directories.get("cpu") or cgroup.directories[""]
            want = ["50000"] if HOMES.version == 1 else ["50000", "100000"]
            assert (quota / ("cpu.cfs_quota_us" if HOMES.version == 1 else "cpu.max")).read_text().split() == want
            weight = ("cpu.shares", "512") if HOMES.version == 1 else ("cpu.weight", "50")
            assert (quota / weight[0]).read_text().strip() == weight[1]  # two replicas weigh one server
        start = Snapshot.take(stack)
        for _ in range(40):
            status, _, body = http_get("127.0.0.1", layout.listen_port, FAST)
            assert status == 200 and body == b"Hello, world"
        # One run read 39 of the 40 right after the last answer.
        after = read_until(lambda: Snapshot.take(stack),
                           lambda now: sum(now.hosts.values()) - sum(start.hosts.values()) >= 40)
        # Requests reached both replicas (each one's own stats server counts its own).
        served = {m.host: sum(w["requests"] for w in stack.stats(m.host)["workers"]) for m in stack.members}
        assert all(n > 0 for n in served.values()), served
        assert sum(after.hosts.values()) - sum(start.hosts.values()) >= 40
        # The cell's limit record is both cgroups summed, against both quotas.
        record = limit_record(*total_limits(layout), start.limit, after.limit, after.t - start.t)
        assert record["cpus"] == 1.0 and record["memory_mb"] == 512 and record["cpu_s"] > 0
        memory = stack_memory(stack)
        assert len(memory["worker_pss_mb"]) == 4 and memory["app_pss_mb"] > 0
        dirs = [d for c in stack.cgroups.values() for d in c.directories.values()]
        every = set().union(*(tree(pid) for pid in masters))
    assert not any(d.exists() for d in dirs) and ours() == before
    assert not [p for p in every if running(p)]


def test_shared_replicas_put_one_socket_each_in_the_upstream(run_dirs, free_ports):
    layout = replicas_layout(run_dirs, free_ports, "1x2-shared", 3)
    write_layout(layout, layout.run_dir)
    conf = (Path(layout.run_dir) / "nginx.conf").read_text()
    for n in (1, 2, 3):
        assert f"server unix:{layout.run_dir}/replicas/{n}/sockets/uwsgi-0.sock" in conf
    with Stack(layout, start_timeout=60) as stack:
        assert len(stack.members) == 3
        for _ in range(30):
            assert http_get("127.0.0.1", layout.listen_port, FAST)[0] == 200
        served = [sum(w["requests"] for w in stack.stats(m.host)["workers"]) for m in stack.members]
        assert all(n > 0 for n in served), served  # round robin over the three replicas


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "uwsgi_layouts", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=60)


def test_zero_replicas_is_one_line_exit_2(tmp_run_dir):
    res = run_cli("render", "1x1-mapped@replicas=0", "--out", str(tmp_run_dir / "out"))
    assert res.returncode == 2, res
    assert res.stderr.strip().count("\n") == 0 and "replicas: must be an integer in 1..64" in res.stderr, res.stderr
    assert not (tmp_run_dir / "out").exists()


@needs_cgroups
def test_more_quota_than_the_machine_is_one_line_exit_2_nothing_left(tmp_run_dir, free_ports, leftover_processes):
    n = os.cpu_count()
    before = ours()
    base, listen = free_ports(2)
    res = run_cli("run", f"1x1-mapped@cpus=1,replicas={n + 1}", "--run-dir", str(tmp_run_dir / "run"),
                  "--listen", f"127.0.0.1:{listen}", "--base-port", str(base), "--for", "1")
    assert res.returncode == 2, res
    line = res.stderr.strip()
    assert "\n" not in line and f"{n + 1} replicas x 1 CPUs = {n + 1} CPUs of quota" in line, line
    assert f"this machine's {n} CPUs; at most {n} replica(s)" in line, line
    assert ours() == before and leftover_processes([str(tmp_run_dir)], timeout=5) == []


@needs_cgroups
def test_a_sigkilled_owner_leaves_every_replica_cgroup_to_the_next_stack(run_dirs, free_ports, make_layout, tmp_path,
                                                                         monkeypatch):
    # The owner and the next stack keep their state files in a directory of this test's own: any
    # other run on the machine (another test's, at the same time) would rightly clean a dead
    # owner's cgroups first, and say so in its own output.
    state_dir = tmp_path / "state"
    monkeypatch.setattr(cgroup_module, "STATE_DIR", state_dir)
    layout = replicas_layout(run_dirs, free_ports, "1x1-mapped", 2, cpus="0.25")
    write_layout(layout, layout.run_dir)
    child = textwrap.dedent("""
        import json, sys, time
        from pathlib import Path
        from uwsgi_layouts.deploy.machine import checked
        from uwsgi_layouts.deploy.model import layout_from_record
        from uwsgi_layouts.deploy.run import Stack, cgroup
        cgroup.STATE_DIR = Path(sys.argv[2])
        stack = Stack(checked(layout_from_record(json.loads(sys.argv[1]))), start_timeout=60).__enter__()
        print(" ".join(str(d) for c in stack.cgroups.values() for d in c.directories.values()), flush=True)
        time.sleep(600)
    """)
    proc = subprocess.Popen([sys.executable, "-c", child, json.dumps(layout.to_dict()), str(state_dir)], cwd=REPO,
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        dirs = [Path(d) for d in proc.stdout.readline().split()]
        assert len({d.name for d in dirs}) == 2 and all(d.is_dir() for d in dirs)
        kill_run(proc)  # SIGKILL: no cleanup of its own; PDEATHSIG ends both servers
        deadline = time.monotonic() + 10
        while any(procs(d) for d in dirs) and time.monotonic() < deadline:
            time.sleep(0.05)
        said: list[str] = []
        other = make_layout("1x1-mapped")
        write_layout(other, other.run_dir)
        assert all(d.is_dir() for d in dirs)
        with Stack(other, report=said.append):
            pass
        assert not any(d.exists() for d in dirs)
        mine = [line for line in said if f"pid {proc.pid}" in line and "removed cgroup" in line]
        assert len(mine) == 2, said
        assert not list(state_dir.glob("*.json"))
    finally:
        kill_run(proc)
        proc.stdout.close()
