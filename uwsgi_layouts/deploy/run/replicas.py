"""What a stack of replicas (``@replicas=R``, deploy/model/replicas.py) adds to running one: its
replicas' cgroup counters read as one pod set's. Starting, polling and stopping each replica
is the stack's, one member per replica, each in a cgroup of its own (deploy/run/cgroup.py):
a SIGKILLed run leaves one state file per replica's cgroup, and the next run removes each."""

from __future__ import annotations

from uwsgi_layouts.deploy.machine import CgroupReading


def summed_readings(readings: list[CgroupReading]) -> CgroupReading:
    """Every replica's counters added up: CPU used, periods (a period counts once per replica
    that ran in it, as a cluster's metrics add pods up), throttled periods and time, OOM kills."""
    if not readings:
        raise ValueError("no cgroup readings to add up")
    return CgroupReading(sum(r.periods for r in readings), sum(r.throttled_periods for r in readings),
                         round(sum(r.throttled_s for r in readings), 6), round(sum(r.cpu_s for r in readings), 6),
                         sum(r.oom_kills for r in readings))
