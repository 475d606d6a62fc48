"""Where the load generator runs (bench.load.generator, deploy.run.leftover): pure logic, with a
fixture tree standing for a cgroup's files. The real placement (httperf's /proc/PID/cgroup while
it runs, the cgroup gone after, and after a SIGKILL) is tests/integration/test_loadgen.py."""

from __future__ import annotations

import pytest

from uwsgi_layouts.bench.capacity import RateStep
from uwsgi_layouts.bench.load import httperf
from uwsgi_layouts.bench.load.generator import NICED, OWN_CGROUP, GeneratorPlace, describe, in_own_cgroup, placed
from uwsgi_layouts.bench.readings import judge_plan, met_rates
from uwsgi_layouts.bench.report.plan import check_lines, report_lines, step_lines
from uwsgi_layouts.deploy.model import parse_variant
from uwsgi_layouts.deploy.run import ServerCgroup
from uwsgi_layouts.deploy.run.leftover import lowest_priority


def test_lowest_priority_is_sched_idle_where_the_kernel_has_it(tmp_path):
    (tmp_path / "cpu.shares").write_text("1024\n")
    assert lowest_priority(tmp_path, 1) == ("cpu.shares", "2")  # v1's floor
    assert lowest_priority(tmp_path, 2) == ("cpu.weight", "1")  # v2's floor
    (tmp_path / "cpu.idle").write_text("0\n")
    assert lowest_priority(tmp_path, 1) == ("cpu.idle", "1")
    assert lowest_priority(tmp_path, 2) == ("cpu.idle", "1")


def test_own_cgroup_only_when_the_stack_has_a_cpu_quota():
    limited = parse_variant("1x2-mapped@cpus=0.5", run_dir="/tmp/x")
    memory_only = parse_variant("1x2-mapped@memory=256", run_dir="/tmp/x")
    unlimited = parse_variant("1x2-mapped", run_dir="/tmp/x")
    assert in_own_cgroup(limited) and not in_own_cgroup(memory_only) and not in_own_cgroup(unlimited)
    assert describe(limited, 19).startswith("httperf in a cgroup of its own at the lowest CPU priority")
    assert describe(unlimited, 19).startswith("httperf in this process's cgroup under nice 19 (the stack has no CPU")
    assert describe(unlimited, 0).startswith("httperf in this process's cgroup, not niced")


def test_without_a_quota_nothing_is_made():
    with placed(parse_variant("1x2-mapped", run_dir="/tmp/x"), report=pytest.fail) as place:
        assert place == GeneratorPlace(NICED) and place.join_files == ()


def test_a_place_is_validated_on_creation():
    GeneratorPlace(OWN_CGROUP, ("/sys/fs/cgroup/cpu/ul-loadgen-abc-1/cgroup.procs",), "cpu.idle = 1")
    with pytest.raises(ValueError):
        GeneratorPlace("anywhere")
    with pytest.raises(ValueError):
        GeneratorPlace(NICED, ("/x/cgroup.procs",))
    with pytest.raises(ValueError):
        GeneratorPlace(OWN_CGROUP)


def test_a_cgroup_label_is_letters_only():
    with pytest.raises(ValueError, match="label"):
        ServerCgroup.open(None, None, label="../x")


def test_httperf_cpu_per_step_is_recorded_and_reported():
    text = "CPU time [s]: user 0.53 system 2.24 (user 19.0% system 80.2% total 99.2%)\n"
    assert httperf.RE_CPU.search(text) is not None
    step = RateStep(5, "pass", 300, cpu_share=0.5, client_cpu_pct=37.5)
    assert RateStep.from_dict(step.to_dict()) == step
    assert RateStep.from_dict({"rate": 5, "verdict": "pass", "p99_ms": 1}).client_cpu_pct is None  # older files
    with pytest.raises(ValueError, match="client_cpu_pct"):
        RateStep(5, "pass", 300, client_cpu_pct=-1)
    lines = step_lines([step], met_rates([step], 500))
    assert lines[0].split()[-2:] == ["httperf", "CPU"] and lines[1].split()[-1] == "37.5%"
    check = {"rate": 5, "note": "", "verdict": "CONFIRMED", "runs": [
        {"replicas": 1, "per_replica_rate": 5, "predicted": True, "verdict": "pass", "p99_ms": 300, "meets": True,
         "pss_mb": 20, "throttled_share": 0.5, "client_cpu_pct": 80}]}
    assert check_lines(check)[2].split()[-1] == "80%"


def test_the_report_says_where_the_generator_ran():
    data = {"arguments": {"layout": "1x2-mapped@cpus=0.5", "rate": 5, "p99_ms": 2500}, "load_before": "1",
            "load_after": "1", "error": "none", "load_generator": "httperf in a cgroup of its own ..."}
    lines = report_lines(data, None, [], judge_plan(data))
    assert lines[1] == "load generator: httperf in a cgroup of its own ..."
    del data["load_generator"]  # plans written before it was recorded
    assert report_lines(data, None, [], judge_plan(data))[1] == ""
