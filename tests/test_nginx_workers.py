"""nginx_workers=auto renders the CPUs this process may use, never nginx's own auto (which counts
the host's CPUs and ignores a cgroup quota): a 1-CPU pod on a 64-core node gets one worker."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from uwsgi_layouts.deploy.machine import CpuLimit
from uwsgi_layouts.deploy.render.nginx_workers import auto_comment, nginx_worker_processes

AUTO = SimpleNamespace(nginx_workers="auto")


@pytest.mark.parametrize(("limit", "workers"), [
    (CpuLimit(host=64, affinity=64, quota=1.0, quota_source="cpu.max"), 1),
    (CpuLimit(host=64, affinity=64, quota=1.5, quota_source="cpu.max"), 2),
    (CpuLimit(host=64, affinity=64, quota=0.3, quota_source="cpu.cfs_quota_us"), 1),
    (CpuLimit(host=8, affinity=3), 3),  # taskset: the affinity bounds it
    (CpuLimit(host=8, affinity=2, quota=4.0, quota_source="cpu.max"), 2),  # the tighter of the two
    (CpuLimit(host=4, affinity=4), 4),
])
def test_auto_is_the_usable_cpus(limit, workers):
    assert nginx_worker_processes(AUTO, limit) == workers


def test_a_given_count_is_kept_whatever_the_limit():
    assert nginx_worker_processes(SimpleNamespace(nginx_workers=3), CpuLimit(host=64, affinity=64, quota=1.0)) == 3


def test_the_comment_names_what_bounds_it():
    assert "a CPU quota of 1.5 on a 64-CPU host" in auto_comment(CpuLimit(host=64, affinity=64, quota=1.5))
    assert "an affinity of 3 CPUs on a 8-CPU host" in auto_comment(CpuLimit(host=8, affinity=3))
