"""Replicas on one machine: ``@replicas=R`` runs R copies of the layout's app server, as R pods
of one Deployment behind one Service would run, each with its own sockets, its own run directory
(``run_dir/replicas/N``: its uwsgi.ini, pid file, master FIFO, logs, unix sockets), its own
stats server and, with ``@cpus``/``@memory``, its own cgroup holding the layout's quota and
memory limit (deploy/run/stack.py). One nginx upstream lists every replica's sockets, balanced
as the layout's strategy says (mapped: ``least_conn`` over every worker socket of every replica;
shared: round robin over the replicas' one socket each).

Addresses, so the replicas never share one: replica N (from 1) takes the stats port
``stats_port + N - 1`` and, over TCP, the socket ports from ``base_port + (N - 1) x S`` (S sockets
per replica). Pure: whether the machine can start R of them (CPUs, memory, processes, file
descriptors) is deploy/machine/replicas.py's check.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from uwsgi_layouts.deploy.model.errors import LayoutError
from uwsgi_layouts.deploy.model.fields import int_in

# A sanity bound: the machine check refuses far fewer on a small machine (sum of quotas, memory).
MAX_REPLICAS = 64
REPLICAS_DIR = "replicas"


def parse_replicas(raw) -> int:
    """``@replicas=R``: a whole number of app-server copies, 1..MAX_REPLICAS ("", None: 1)."""
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return 1
    return int_in("replicas", raw, 1, MAX_REPLICAS)


def validate(layout, set_) -> None:
    """Validate and fill ``replicas`` of the Layout being made (``set_(name, value)``)."""
    replicas = parse_replicas(layout.replicas)
    set_("replicas", replicas)
    if replicas == 1:
        return
    if layout.server != "uwsgi":
        raise LayoutError("replicas", f"runs copies of uWSGI only (their stats servers say when each is ready); "
                                      f"{layout.strategy} runs {layout.server}: use e.g. "
                                      f"{layout.processes}x{layout.threads}-mapped")
    if layout.hosts:
        raise LayoutError("replicas", "copies the app server on this machine; with hosts every host already runs "
                                      "one: drop one of them")


def replica_name(number: int) -> str:
    """How a replica is named in the stack, its logs and the cells (``replica-2``)."""
    return f"replica-{number}"


def replica_dir(run_dir: str | Path, number: int) -> Path:
    return Path(run_dir) / REPLICAS_DIR / str(number)


def replica_file(number: int, name: str) -> str:
    """Where a replica's rendered file goes, relative to the run dir (replicas/2/uwsgi.ini)."""
    return f"{REPLICAS_DIR}/{number}/{name}"


def replica_layout(layout, number: int):
    """The layout replica ``number`` (from 1) runs: one copy (replicas=1) with its own run
    directory, stats port and TCP ports; the quota and memory limit are the layout's, each."""
    if not 1 <= number <= layout.replicas:
        raise LayoutError("replicas", f"replica {number} is not one of 1..{layout.replicas}")
    per_replica = len(layout.socket_plans)
    return replace(layout, replicas=1, run_dir=str(replica_dir(layout.run_dir, number)),
                   base_port=layout.base_port + (number - 1) * per_replica,
                   # 0 (a unix stats socket in the replica's own run dir, where a build has that) stays 0.
                   stats_port=layout.stats_port + number - 1 if layout.stats_port else layout.stats_port)


def replica_layouts(layout) -> list:
    """Every replica's layout, in order; [] for a layout of one copy (it runs itself)."""
    if layout.replicas == 1:
        return []
    return [replica_layout(layout, n) for n in range(1, layout.replicas + 1)]


def variant_replicas(spec: str, options: dict) -> int:
    """How many replicas a variant (``PxT-STRATEGY@...,replicas=R``) or its options ask for, to
    count the ports it needs before the layout is built (a bad value counts as 1: building the
    layout then says what is wrong)."""
    _, _, extra = str(spec).partition("@")
    raw = options.get("replicas")
    for item in extra.split(",") if extra else ():
        key, _, value = item.partition("=")
        if key.strip().replace("-", "_") == "replicas":
            raw = value
    try:
        return parse_replicas(raw)
    except LayoutError:
        return 1


def server_layouts(layout) -> list[tuple[str, object]]:
    """(its directory relative to the run dir, the layout it runs) per app server the layout
    starts: each host's (hosts/ADDR), each replica's (replicas/N), or the layout's own ("")."""
    if layout.hosts:
        return [(f"hosts/{h}", layout.host_layout(h)) for h in layout.hosts]
    return [(f"{REPLICAS_DIR}/{n}", copy) for n, copy in enumerate(replica_layouts(layout), 1)] or [("", layout)]


def total_limits(layout) -> tuple[float | None, int | None]:
    """The CPU quota and memory limit of every replica together (None: no limit), what the
    replicas' summed cgroup counters are measured against."""
    cpus = round(layout.cpus * layout.replicas, 2) if layout.cpus is not None else None
    memory = layout.memory * layout.replicas if layout.memory is not None else None
    return cpus, memory
