"""The CPUs this process may use (deploy/machine/cpus.py), read from fixture cgroup trees: v1,
v2, hybrid, nested quotas, no quota, a container's mount rooted at its own cgroup."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from uwsgi_layouts.deploy.machine.cpus import CpuLimit, cgroup_quota, cpu_limit, v1_quota, v2_quota


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
