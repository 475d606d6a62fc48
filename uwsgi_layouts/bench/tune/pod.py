"""The pod tune recommends under ``--cpus``/``--memory``, as data: its limits, the layout and the
memory request it needs (the recommended layout's PSS after load plus a margin). ``PodSizing`` is
the judgement tune's summary stores and the report's POD line words; ``bundle --target kubernetes
--from-tune DIR`` reads ``pod_record`` from results.json.
"""

from __future__ import annotations

from dataclasses import dataclass

from uwsgi_layouts.bench.results import Results

# A memory request is the recommended layout's PSS after load plus this share: PSS grows with the
# app's caches and fragmentation over hours, which a run of minutes does not see.
MEMORY_REQUEST_MARGIN = 0.25


def memory_request_mb(pss_mb: float) -> float:
    return pss_mb * (1 + MEMORY_REQUEST_MARGIN)


def pod_record(arguments: dict, spec: str, pss_mb: float | None) -> dict | None:
    """What the POD line says, for a reader of results.json: the pod's limits tune ran under, the
    layout it recommends and its memory request. None when tune ran without a limit."""
    cpus, memory = arguments.get("cpus"), arguments.get("memory")
    if cpus is None and memory is None:
        return None
    request = round(memory_request_mb(pss_mb), 1) if pss_mb is not None else None
    return {"layout": spec, "cpus": cpus, "memory_mb": memory, "pss_mb": None if pss_mb is None else round(pss_mb, 1),
            "memory_request_mb": request, "memory_margin": MEMORY_REQUEST_MARGIN}


@dataclass(frozen=True)
class PodSizing:
    """The pod tune recommends (its POD line), judged once: the limits it ran under, the layout,
    the throttling and OOM kills measured in that layout's cells, and the memory request (its
    PSS after load plus ``margin``)."""

    layout: str
    cpus: float | None
    memory_mb: int | None  # the pod's memory limit
    throttled_share: tuple[float, ...]  # per cell that read cpu.stat: periods the quota ran out
    quota_share: tuple[float, ...]  # per cell: the CPU used over the quota's CPU time
    oom_kills: int
    pss_mb: float | None
    memory_request_mb: float | None
    margin: float = MEMORY_REQUEST_MARGIN

    def __post_init__(self):
        if self.cpus is None and self.memory_mb is None:
            raise ValueError("cpus: a pod has a CPU or a memory limit (tune ran without one: no pod)")
        if self.oom_kills < 0:
            raise ValueError(f"oom_kills: must be 0 or more, got {self.oom_kills}")
        if (self.pss_mb is None) != (self.memory_request_mb is None):
            raise ValueError("memory_request_mb: given exactly when the PSS it comes from is")


def pod_sizing(results: Results, spec: str, pss_mb: float | None) -> PodSizing | None:
    """The pod for ``spec`` from the run's limits and its cells in the steady scenario (None
    without a limit)."""
    cpus, memory = results.arguments.get("cpus"), results.arguments.get("memory")
    if cpus is None and memory is None:
        return None
    scenario = results.arguments.get("scenario", "")
    cells = [c for c in results.cells if c.scenario == scenario and c.layout == spec and c.limit]

    def present(key: str) -> tuple[float, ...]:
        return tuple(c.limit[key] for c in cells if c.limit.get(key) is not None)

    return PodSizing(spec, cpus, memory, present("throttled_share"), present("quota_share"),
                     sum(c.limit.get("oom_kills", 0) for c in cells), pss_mb,
                     None if pss_mb is None else memory_request_mb(pss_mb))
