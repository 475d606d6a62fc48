"""The pod tune recommends under ``--cpus``/``--memory``, as data: its limits, the layout and the
memory request it needs (the recommended layout's PSS after load plus a margin). The tune report's
POD line words it; ``bundle --target kubernetes --from-tune DIR`` reads it from results.json.
"""

from __future__ import annotations

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
