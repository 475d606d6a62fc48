"""The CPUs this process may use (deploy/machine/cpus.py), read from fixture cgroup trees: v1,
v2, hybrid, nested quotas, no quota, a container's mount rooted at its own cgroup."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.test_peers_bench import wrk_line
from uwsgi_layouts.bench.kinds.closedloop import LiveRunner
from uwsgi_layouts.bench.load.wrk import to_run
from uwsgi_layouts.bench.observe import Snapshot, limit_record
from uwsgi_layouts.bench.report import plots
from uwsgi_layouts.bench.report.limits import limit_lines, limit_markdown
from uwsgi_layouts.bench.results import Cell, Results, ResultsError
from uwsgi_layouts.deploy.machine.cgroups import CgroupReading, check_limits, homes, read_v1, read_v2
from uwsgi_layouts.deploy.machine.cpus import CpuLimit, cgroup_quota, cpu_limit, v1_quota, v2_quota
from uwsgi_layouts.deploy.model import LayoutError, layout_from_record, parse_layout, parse_variant


def write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def v1_tree(root: Path, own: str, quotas: dict[str, tuple[int, int]], mount: str = "cpu") -> None:
    write(root, "proc/self/cgroup", f"4:memory:/\n3:{'cpu,cpuacct' if mount == 'cpu,cpuacct' else 'cpu'}:{own}\n"
                                    "1:name=systemd:/\n")
    for directory, (quota, period) in quotas.items():
        base = f"sys/fs/cgroup/{mount}{directory}".rstrip("/")
        write(root, f"{base}/cpu.cfs_quota_us", f"{quota}\n")
        write(root, f"{base}/cpu.cfs_period_us", f"{period}\n")


def v2_tree(root: Path, own: str, maxes: dict[str, str], base: str = "sys/fs/cgroup") -> None:
    write(root, "proc/self/cgroup", f"0::{own}\n")
    write(root, f"{base}/cgroup.controllers", "cpuset cpu io memory pids\n")
    for directory, text in maxes.items():
        write(root, f"{base}{directory}".rstrip("/") + "/cpu.max", text + "\n")


def test_quota_texts():
    assert v2_quota("150000 100000") == 1.5
    assert v2_quota("max 100000") is None
    assert v2_quota("") is None and v2_quota(None) is None and v2_quota("x 1") is None
    assert v1_quota("50000", "100000") == 0.5
    assert v1_quota("-1", "100000") is None
    assert v1_quota(None, "100000") is None


def test_v1_tightest_of_the_path(tmp_path):
    v1_tree(tmp_path, "/kubepods/pod1/c1", {"": (-1, 100000), "/kubepods": (400000, 100000),
                                           "/kubepods/pod1": (75000, 100000), "/kubepods/pod1/c1": (-1, 100000)})
    quota, source = cgroup_quota(tmp_path)
    assert quota == 0.75 and source == "sys/fs/cgroup/cpu/kubepods/pod1/cpu.cfs_quota_us"


def test_v1_child_tighter_than_parent(tmp_path):
    v1_tree(tmp_path, "/a/b", {"/a": (200000, 100000), "/a/b": (25000, 50000)}, mount="cpu,cpuacct")
    assert cgroup_quota(tmp_path) == (0.5, "sys/fs/cgroup/cpu,cpuacct/a/b/cpu.cfs_quota_us")


def test_v2_nested_and_unlimited(tmp_path):
    v2_tree(tmp_path, "/system.slice/app.service", {"": "max 100000", "/system.slice": "max 100000",
                                                    "/system.slice/app.service": "max 100000"})
    assert cgroup_quota(tmp_path) == (None, "")
    write(tmp_path, "sys/fs/cgroup/system.slice/cpu.max", "250000 100000\n")
    write(tmp_path, "sys/fs/cgroup/system.slice/app.service/cpu.max", "300000 100000\n")
    assert cgroup_quota(tmp_path) == (2.5, "sys/fs/cgroup/system.slice/cpu.max")


def test_hybrid_reads_both_hierarchies(tmp_path):
    """v1 cpu beside a v2 "unified" mount: the tighter quota wins, wherever it is."""
    v1_tree(tmp_path, "/job", {"/job": (200000, 100000)})
    write(tmp_path, "sys/fs/cgroup/unified/cgroup.controllers", "\n")
    write(tmp_path, "proc/self/cgroup", "3:cpu:/job\n0::/job\n")
    assert cgroup_quota(tmp_path)[0] == 2.0
    write(tmp_path, "sys/fs/cgroup/unified/job/cpu.max", "120000 100000\n")
    assert cgroup_quota(tmp_path) == (1.2, "sys/fs/cgroup/unified/job/cpu.max")


def test_container_mount_rooted_at_its_cgroup(tmp_path):
    """/proc/self/cgroup names the host's path; the mount holds only the container's cgroup."""
    v2_tree(tmp_path, "/kubepods.slice/pod9.slice/cri-abc.scope", {"": "50000 100000"})
    assert cgroup_quota(tmp_path) == (0.5, "sys/fs/cgroup/cpu.max")


def test_no_cgroups_at_all(tmp_path):
    assert cgroup_quota(tmp_path) == (None, "")
    limit = cpu_limit(tmp_path, affinity={0, 1, 2}, host=8)
    assert limit.usable == 3.0 and limit.whole == 3 and limit.quota is None


def test_limit_is_the_smaller_of_affinity_and_quota(tmp_path):
    v2_tree(tmp_path, "/pod", {"/pod": "150000 100000"})
    limit = cpu_limit(tmp_path, affinity={0, 1, 2, 3}, host=64)
    assert (limit.host, limit.affinity, limit.quota, limit.usable, limit.whole) == (64, 4, 1.5, 1.5, 2)
    assert cpu_limit(tmp_path, affinity={5}, host=64).usable == 1.0
    v2_tree(tmp_path, "/pod", {"/pod": "20000 100000"})
    assert cpu_limit(tmp_path, affinity={0, 1}, host=2).whole == 1  # 0.2 CPU still runs one process
    assert cpu_limit(tmp_path, affinity={0, 1}, host=2).to_dict()["usable"] == 0.2


def test_record_is_validated():
    with pytest.raises(ValueError):
        CpuLimit(host=2, affinity=0)
    with pytest.raises(ValueError):
        CpuLimit(host=2, affinity=2, quota=0.0)


def test_this_machine():
    """Here: the affinity bounds it (and a quota if this process has one)."""
    limit = cpu_limit()
    assert limit.host == os.cpu_count() and limit.affinity == len(os.sched_getaffinity(0))
    assert limit.usable <= limit.affinity


# --- a layout's limit, the cgroup's counters, a cell's record, the report ------------------------


def test_layout_takes_cpus_and_memory():
    layout = parse_variant("2x4-mapped@cpus=1.5,memory=512", run_dir="/tmp/x")
    assert (layout.cpus, layout.memory) == (1.5, 512)
    assert parse_variant("2x4-mapped@cpus=.5", run_dir="/tmp/x").cpus == 0.5
    assert parse_layout("1x1-mapped", run_dir="/tmp/x").cpus is None
    assert layout_from_record(layout.to_dict()) == layout


@pytest.mark.parametrize("field,value", [("cpus", "0"), ("cpus", "-1"), ("cpus", "0.001"), ("cpus", "abc"),
                                         ("cpus", "5000"), ("memory", "0"), ("memory", "-5"), ("memory", "1.5")])
def test_bad_limits_name_their_field(field, value):
    with pytest.raises(LayoutError) as err:
        parse_variant(f"1x1-mapped@{field}={value}", run_dir="/tmp/x")
    assert err.value.field == field and "\n" not in str(err.value)


def test_more_cpus_than_the_host_say_the_host_count(tmp_path):
    v2_tree(tmp_path, "/", {})
    with pytest.raises(LayoutError, match=f"more than this machine's {os.cpu_count()} CPUs"):
        check_limits(parse_variant(f"1x1-mapped@cpus={os.cpu_count() + 0.5}", run_dir="/tmp/x"), tmp_path)


def test_v2_home_needs_cpu_delegated(tmp_path):
    v2_tree(tmp_path, "/user.slice/session-1.scope", {})
    write(tmp_path, "sys/fs/cgroup/cgroup.subtree_control", "memory pids\n")
    found, why = homes(tmp_path)
    assert found is None and "does not enable cpu" in why and "\n" not in why
    write(tmp_path, "sys/fs/cgroup/cgroup.subtree_control", "cpu memory pids\n")
    found, _ = homes(tmp_path)
    assert found.version == 2 and found.parent("") == tmp_path / "sys/fs/cgroup"


def test_v1_homes_are_our_own_cgroups(tmp_path):
    write(tmp_path, "proc/self/cgroup", "5:memory:/job\n4:cpuacct:/\n3:cpu:/\n")
    for d in ("cpu", "cpuacct", "memory/job"):
        (tmp_path / "sys/fs/cgroup" / d).mkdir(parents=True)
    found, _ = homes(tmp_path)
    assert found.version == 1
    assert found.parent("memory") == tmp_path / "sys/fs/cgroup/memory/job"
    assert found.parent("cpu") == tmp_path / "sys/fs/cgroup/cpu"


def test_no_controller_is_one_line(tmp_path):
    write(tmp_path, "proc/self/cgroup", "0::/\n")
    found, why = homes(tmp_path)
    assert found is None and "no cgroup cpu controller" in why


def test_readings_of_both_versions(tmp_path):
    write(tmp_path, "v2/cpu.stat", "usage_usec 2500000\nuser_usec 2000000\nnr_periods 40\nnr_throttled 10\n"
                                   "throttled_usec 300000\n")
    write(tmp_path, "v2/memory.events", "low 0\nhigh 0\nmax 4\noom 1\noom_kill 1\n")
    assert read_v2(tmp_path / "v2") == CgroupReading(40, 10, 0.3, 2.5, 1)
    write(tmp_path, "cpu/cpu.stat", "nr_periods 50\nnr_throttled 20\nthrottled_time 1500000000\nnr_bursts 0\n")
    write(tmp_path, "cpuacct/cpuacct.usage", "4000000000\n")
    write(tmp_path, "memory/memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    reading = read_v1(tmp_path / "cpu", tmp_path / "cpuacct", tmp_path / "memory")
    assert reading == CgroupReading(50, 20, 1.5, 4.0, 2)
    assert reading.since(CgroupReading(10, 5, 0.5, 1.0, 0)) == CgroupReading(40, 15, 1.0, 3.0, 2)


def test_limit_record_and_cell():
    before, after = CgroupReading(10, 2, 0.1, 1.0, 0), CgroupReading(40, 26, 0.9, 1.9, 1)
    record = limit_record(0.5, 256, before, after, 3.0)
    assert record["throttled_share"] == 0.8 and record["quota_share"] == 0.6 and record["oom_kills"] == 1
    assert limit_record(None, None, None, None, 3.0) == {}
    cell = make_cell(record)
    assert cell.limit == record and Cell.from_dict(cell.to_dict()) == cell
    with pytest.raises(ResultsError, match="throttled_periods"):
        make_cell({**record, "throttled_periods": 99})
    with pytest.raises(ResultsError, match="unknown"):
        make_cell({**record, "stolen": 1})
    assert "oom" not in make_cell({}).to_dict()["errors"]  # files of runs without a limit stay as they were


def make_cell(limit: dict, layout: str = "2x4-mapped@cpus=1", repeat: int = 1, p99: float = 100.0) -> Cell:
    return Cell(layout=layout, concurrency=4, repeat=repeat, duration_s=3.0, requests=30, rps=10.0,
                latency_ms={"p50": p99 / 2, "p90": p99, "p99": p99, "p999": p99, "max": p99}, errors={},
                worker_requests={}, cpu_s={"app": 1.0}, unloaded_latency_ms=50.0, capacity_rps=20.0,
                closed_loop_rps=20.0, efficiency=0.5, limit=limit)


def test_report_section_and_plot(tmp_path):
    limits = [limit_record(1.0, None, CgroupReading(0, 0, 0, 0, 0), CgroupReading(30, t, t / 100, 2.5, 0), 3.0)
              for t in (6, 9)]
    cells = (make_cell(limits[0], repeat=1, p99=120.0), make_cell(limits[1], repeat=2, p99=180.0))
    results = Results(environment={"nproc": 2}, arguments={"layouts": ["2x4-mapped@cpus=1"]}, workload={},
                      cells=cells)
    md = "\n".join(limit_markdown(results))
    assert "## Inside the CPU limit" in md and "| 2x4-mapped@cpus=1 | 4 | 1 |" in md
    assert "25% (20–30)" in md  # throttled share: median of 6/30 and 9/30, lowest–highest
    assert "83%" in md  # CPU/quota: 2.5 s of 3 s
    assert limit_lines(results)[1].startswith("inside the CPU limit")
    written = plots.plot_throttling(results, tmp_path / "throttling.png")
    assert [p.name for p in written] == ["throttling.png"] and written[0].stat().st_size > 1000
    assert "throttling.png" in plots.plot_file_names(results)
    plain = Results(environment={"nproc": 2}, arguments={}, workload={}, cells=(make_cell({}),))
    assert limit_markdown(plain) == [] and "throttling.png" not in plots.plot_file_names(plain)


def test_memory_needs_its_controller(tmp_path):
    v2_tree(tmp_path, "/", {})
    write(tmp_path, "sys/fs/cgroup/cgroup.subtree_control", "cpu pids\n")
    found, _ = homes(tmp_path)
    assert found.version == 2 and not found.memory
    with pytest.raises(LayoutError, match="memory: needs the cgroup memory controller"):
        check_limits(parse_variant("1x1-mapped@cpus=1,memory=256", run_dir="/tmp/x"), tmp_path)
    check_limits(parse_variant("1x1-mapped@cpus=1", run_dir="/tmp/x"), tmp_path)  # the CPU quota alone is fine


def test_a_quota_bounds_the_cells_capacity(tmp_path):
    """The capacity bound: the tool's usable CPUs over all CPU per request, and under a layout's
    quota also the quota over the server's own CPU per request, whichever is smaller."""
    runner = LiveRunner(None, tmp_path, {}, duration=2, warmup=1, timeout=5)
    runner.cores = 2.0
    run = to_run(json.loads(wrk_line({})[len("WRK_JSON "):]), "raw")
    snaps = Snapshot({"1": 0}, 1.0, 0.5), Snapshot({"1": run.requests}, 1.0 + 0.01 * run.requests, 0.5)
    free = runner.make_cell("1x2-mapped", 2, 1, "article", run, 0.0, *snaps, 100.0, "raw/x.txt")
    assert free.capacity_rps == pytest.approx(2.0 / 0.01)
    limit = {"cpus": 0.5, "memory_mb": None, "periods": 10, "throttled_periods": 5, "throttled_s": 0.1, "cpu_s": 1.0,
             "oom_kills": 0, "throttled_share": 0.5, "quota_share": 1.0}
    held = runner.make_cell("1x2-mapped", 2, 1, "article", run, 0.0, *snaps, 100.0, "raw/x.txt", limit=limit)
    assert held.capacity_rps == pytest.approx(0.5 / 0.01) and held.limit == limit
    assert held.errors.oom == 0 and "oom" not in held.to_dict()["errors"]
    killed = runner.make_cell("1x2-mapped", 2, 1, "article", run, 0.0, *snaps, 100.0, "raw/x.txt",
                              limit={**limit, "oom_kills": 2})
    assert killed.errors.oom == 2 and killed.errors.total == run.errors.total + 2  # an OOM kill is an error
    assert killed.to_dict()["errors"]["oom"] == 2 and Cell.from_dict(killed.to_dict()) == killed
