"""Where the load generator (httperf) runs, and why there.

httperf busy-polls: it keeps a core at ~100% at any rate (``httperf --rate 5 --num-conns 15``
used 2.3 CPU-s in 2.8 s here). On a machine whose cores a quota-limited stack was sized to share
(three 0.5-CPU replicas, nginx and the generator on 2 cores), that core is taken from the stack,
and a validation measures the generator, not the replicas. So:

- **the stack is held to a CPU quota** (``@cpus``): httperf runs in a cgroup of its own beside
  the app servers' cgroups at the lowest CPU priority the kernel has (``deploy.run.open_leftover``:
  SCHED_IDLE via ``cpu.idle``, or the minimum weight), so it gets only the CPU the replicas'
  quotas, nginx and the machine's other tasks leave idle: what the quotas' sum leaves of the
  cores when the servers are at their limit. nginx, in this process's cgroup at its own
  priority, wins over the generator too. A step's httperf CPU (its own
  ``CPU time`` line, as a share of one core over its run) says how much it got.
- **the stack has no quota**: an unlimited server would take every core and starve an idle-
  priority generator, which would then offer less than its rate; httperf stays where it always
  ran, in this process's cgroup under ``nice`` (``--client-nice``, default 19): it loses to the
  server when both want the CPU without being shut out.

A cgroup is made for each httperf run and removed after it, on every exit path; one left by a run
killed with SIGKILL (httperf dies with it: PR_SET_PDEATHSIG) is removed by the next stack any run
starts or the next generator cgroup made, which says so (``deploy.run.cgroup``'s state files).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from dataclasses import dataclass

from uwsgi_layouts.deploy.model import Layout
from uwsgi_layouts.deploy.run import open_leftover

OWN_CGROUP = "own cgroup"
NICED = "niced"


@dataclass(frozen=True)
class GeneratorPlace:
    """Where one httperf run goes: ``kind`` OWN_CGROUP (with the cgroup's ``cgroup.procs`` files
    and its priority setting) or NICED (this process's cgroup, under ``nice``)."""

    kind: str
    join_files: tuple[str, ...] = ()
    priority: str = ""  # "cpu.idle = 1", "cpu.shares = 2"... (OWN_CGROUP only)

    def __post_init__(self):
        if self.kind not in (OWN_CGROUP, NICED):
            raise ValueError(f"kind: must be {OWN_CGROUP!r} or {NICED!r}, got {self.kind!r}")
        if (self.kind == OWN_CGROUP) != bool(self.join_files) or (self.kind == OWN_CGROUP) != bool(self.priority):
            raise ValueError(f"{self.kind}: join files and priority go with {OWN_CGROUP!r} only")


def in_own_cgroup(layout: Layout) -> bool:
    """The generator goes in a cgroup of its own when the stack's servers are held to a CPU quota."""
    return layout.cpus is not None


def describe(layout: Layout, nice: int) -> str:
    """One line for results and reports: where httperf runs for this stack, and why."""
    if in_own_cgroup(layout):
        return ("httperf in a cgroup of its own at the lowest CPU priority (SCHED_IDLE where the kernel has "
                "cpu.idle, else the minimum weight), beside the servers' cgroups: it gets only the CPU the "
                "stack's quotas and nginx leave idle")
    return (f"httperf in this process's cgroup under nice {nice}" if nice else "httperf in this process's cgroup, "
            "not niced") + " (the stack has no CPU quota: a lowest-priority generator would be starved by it)"


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@contextlib.contextmanager
def placed(layout: Layout, report=say) -> Iterator[GeneratorPlace]:
    """For one httperf run against ``layout``'s stack: its own lowest-priority cgroup (removed on
    every exit path) when the stack has a CPU quota, else where this process runs."""
    if not in_own_cgroup(layout):
        yield GeneratorPlace(NICED)
        return
    cgroup, priority = open_leftover(report)
    try:
        yield GeneratorPlace(OWN_CGROUP, cgroup.join_files, priority)
    finally:
        cgroup.close()
