"""@replicas=R as data: each replica's own sockets, run directory and stats port, one upstream
with every replica's sockets, the fields refused, the machine's limits (a fixture /proc), the
replicas' cgroup counters summed. Pure: the stacks themselves are tests/integration/test_replicas.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from uwsgi_layouts.deploy.machine import CgroupReading, check_replicas
from uwsgi_layouts.deploy.model import (
    LayoutError,
    parse_layout,
    parse_replicas,
    parse_variant,
    server_layouts,
    total_limits,
    variant_replicas,
)
from uwsgi_layouts.deploy.run.replicas import summed_readings
from uwsgi_layouts.deploy.run.weight import replica_shares, replica_weight


def test_replicas_parse_and_bounds():
    assert parse_replicas(None) == 1 and parse_replicas("") == 1 and parse_replicas("3") == 3
    for bad in ("0", "-1", "65", "two", "1.5"):
        with pytest.raises(LayoutError, match="replicas: must be an integer in 1..64"):
            parse_replicas(bad)


def test_each_replica_has_its_own_sockets_dir_and_stats_port():
    layout = parse_variant("2x2-mapped@cpus=1,replicas=2", run_dir="/tmp/r", stats_port=9000)
    assert layout.replicas == 2 and layout.cpus == 1.0
    assert [s.address for s in layout.sockets] == [
        "/tmp/r/replicas/1/sockets/uwsgi-0.sock", "/tmp/r/replicas/1/sockets/uwsgi-1.sock",
        "/tmp/r/replicas/2/sockets/uwsgi-0.sock", "/tmp/r/replicas/2/sockets/uwsgi-1.sock"]
    own = server_layouts(layout)
    assert [d for d, _ in own] == ["replicas/1", "replicas/2"]
    assert [(c.run_dir, c.stats_port, c.replicas, c.cpus) for _, c in own] == [
        ("/tmp/r/replicas/1", 9000, 1, 1.0), ("/tmp/r/replicas/2", 9001, 1, 1.0)]
    # mapped: least_conn over every worker socket of every replica
    assert [s.address for s, _ in layout.upstream_servers] == [s.address for s in layout.sockets]
    assert layout.strategy_obj.balancer == "least_conn"
    assert layout.to_dict()["replicas"] == 2


def test_shared_replicas_one_socket_each_and_tcp_ports_in_turn():
    layout = parse_variant("1x4-shared@replicas=3,transport=tcp", run_dir="/tmp/r", base_port=7000,
                           stats_port=7100, listen="127.0.0.1:7200")
    assert [s.address for s, _ in layout.upstream_servers] == ["127.0.0.1:7000", "127.0.0.1:7001", "127.0.0.1:7002"]
    two = parse_variant("2x1-mapped@replicas=2,transport=tcp", run_dir="/tmp/r", base_port=7000, stats_port=7100)
    assert [s.address for s in two.sockets] == [f"127.0.0.1:{p}" for p in (7000, 7001, 7002, 7003)]


def test_one_replica_is_the_layout_as_before():
    one = parse_layout("2x2-mapped", run_dir="/tmp/r")
    assert one.replicas == 1 and server_layouts(one) == [("", one)]
    assert [s.address for s in one.sockets] == ["/tmp/r/sockets/uwsgi-0.sock", "/tmp/r/sockets/uwsgi-1.sock"]


def test_replica_ports_never_collide():
    with pytest.raises(LayoutError, match="stats_port: port 9101 is already the nginx listen port.*9100..9102"):
        parse_variant("1x1-mapped@replicas=3", run_dir="/tmp/r", stats_port=9100, listen="127.0.0.1:9101")
    with pytest.raises(LayoutError, match="base_port: uwsgi socket 2 would use port 7002, already taken by stats"):
        parse_variant("1x1-mapped@replicas=3,transport=tcp", run_dir="/tmp/r", base_port=7000, stats_port=7002)
    with pytest.raises(LayoutError, match="stats_port: 3 replicas need stats ports 65534..65536"):
        parse_variant("1x1-mapped@replicas=3", run_dir="/tmp/r", stats_port=65534)


def test_replicas_refused_with_peers_and_hosts():
    with pytest.raises(LayoutError, match="replicas: runs copies of uWSGI only"):
        parse_variant("2x2-gunicorn@replicas=2", run_dir="/tmp/r")
    with pytest.raises(LayoutError, match="replicas: copies the app server on this machine"):
        parse_layout("1x1-mapped", run_dir="/tmp/r", transport="tcp", hosts="10.0.0.2,10.0.0.3", uwsgi_tls="off",
                     replicas=2)


def test_variant_replicas_counts_ports_before_the_layout_is_built():
    assert variant_replicas("2x2-mapped@cpus=1,replicas=4", {}) == 4
    assert variant_replicas("2x2-mapped", {"replicas": "3"}) == 3
    assert variant_replicas("2x2-mapped@replicas=3", {"replicas": "2"}) == 3  # the variant's own wins
    assert variant_replicas("2x2-mapped@replicas=zero", {}) == 1  # the layout says what is wrong


def test_total_limits_and_summed_readings():
    layout = parse_variant("1x4-shared@cpus=0.5,memory=128,replicas=4", run_dir="/tmp/r")
    assert total_limits(layout) == (2.0, 512)
    assert total_limits(parse_layout("1x1-mapped", run_dir="/tmp/r")) == (None, None)
    total = summed_readings([CgroupReading(10, 2, 0.1, 0.5, 0), CgroupReading(12, 3, 0.2, 0.25, 1)])
    assert total == CgroupReading(22, 5, 0.3, 0.75, 1)
    with pytest.raises(ValueError):
        summed_readings([])


@pytest.fixture
def proc_root(tmp_path: Path) -> Path:
    (tmp_path / "proc" / "sys" / "kernel").mkdir(parents=True)
    (tmp_path / "proc" / "meminfo").write_text("MemTotal:        2048000 kB\nMemFree: 1 kB\n")
    (tmp_path / "proc" / "sys" / "kernel" / "threads-max").write_text("100\n")
    return tmp_path


def test_machine_limits_for_replicas(proc_root):
    ok = parse_variant("1x4-shared@cpus=0.5,replicas=4", run_dir="/tmp/r")
    check_replicas(ok, proc_root, host_cpus=2)  # 4 x 0.5 = 2 CPUs: fits exactly
    with pytest.raises(LayoutError, match=r"replicas: 3 replicas x 1 CPUs = 3 CPUs of quota, more than this "
                                          r"machine's 2 CPUs; at most 2 replica\(s\) of 1 CPUs fit"):
        check_replicas(parse_variant("1x1-mapped@cpus=1,replicas=3", run_dir="/tmp/r"), proc_root, host_cpus=2)
    with pytest.raises(LayoutError, match=r"replicas: 3 replicas x 1000 MB = 3000 MB of memory limits, more than "
                                          r"this machine's 2000 MB; at most 2 replica"):
        check_replicas(parse_variant("1x1-mapped@memory=1000,replicas=3", run_dir="/tmp/r"), proc_root, host_cpus=2)
    with pytest.raises(LayoutError, match=r"replicas: 3 replicas x 49 threads = 147 threads, more than the "
                                          r"kernel's threads-max \(100\)"):
        check_replicas(parse_variant("4x12-mapped@replicas=3", run_dir="/tmp/r"), proc_root, host_cpus=2)
    check_replicas(parse_variant("4x12-mapped", run_dir="/tmp/r"), proc_root, host_cpus=2)  # one copy: no check


def test_replicas_together_weigh_one_server():
    assert [replica_shares(r) for r in (1, 2, 4, 3, 64)] == [1024, 512, 256, 341, 16]
    assert [replica_weight(r) for r in (1, 2, 4, 64)] == [100, 50, 25, 2]


def test_faults_refuses_replicas_in_one_line():
    """faults watches one uWSGI (its stats server and workers): a replicated layout is refused, not
    run with a stats socket nobody serves."""
    proc = subprocess.run([sys.executable, "-m", "uwsgi_layouts", "faults", "--layouts", "1x1-mapped@replicas=2",
                           "--only", "kill-worker"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip() == ("error: layouts: 1x1-mapped@replicas=2 has 2 replicas; faults runs one app server: "
                                   "measure a replica alone (drop replicas=)")
