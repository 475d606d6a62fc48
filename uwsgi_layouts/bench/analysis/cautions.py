"""What the machine did while it measured (load, other processes, steal) and the warnings a report
prints with its tables."""

from __future__ import annotations

import statistics

from uwsgi_layouts.bench.analysis.groups import group_cells, tail_advice
from uwsgi_layouts.bench.analysis.tails import MIN_REQUESTS_FOR_P99, MIN_SLOWER_REQUESTS, NOISY_SPREAD
from uwsgi_layouts.bench.results import Results

LOAD_CAUTION_SHARE = 0.5  # older files: a load average above half the cores: other work shared them
OTHERS_CAUTION = 0.10  # other processes used more than 10% of the machine's CPU time while it measured
STEAL_CAUTION = 0.05  # more than 5% of CPU time stolen by the hypervisor


def _numbers(values) -> list[float]:
    return [float(x) for x in values if isinstance(x, (int, float)) and not isinstance(x, bool)]


def machine_cautions(environment: dict) -> list[str]:
    """Cautions from how busy the machine was (``bench.environment``): other processes' CPU above
    10% of the machine just before the run started or while it measured, CPU steal above 5%. []
    when the run recorded none of them. The load average is recorded, not judged: during the run it
    is mostly the run's own wrk and servers, and at the start a one-minute average still holds a run
    that has just ended. Files written before "others" was sampled are judged on their load average
    (above half the cores), as they were."""
    nproc = environment.get("nproc")
    samples = (environment.get("machine") or {}).get("samples") or []
    others = _numbers([environment.get("others_at_start"), *(s.get("others") for s in samples)])
    steals = _numbers([environment.get("steal_at_start"), *(s.get("steal") for s in samples)])
    out = []
    if not others:  # an older file: the load average was its only evidence
        start = environment.get("loadavg_at_start") or [None]
        loads = _numbers([start[0], *(s.get("loadavg_1m") for s in samples)])
        if isinstance(nproc, int) and nproc and loads and max(loads) > LOAD_CAUTION_SHARE * nproc:
            out.append(f"the machine was busy: load average up to {max(loads):.1f} on {nproc} cores (median "
                       f"{statistics.median(loads):.1f}; above {LOAD_CAUTION_SHARE * nproc:g}, half the cores, other "
                       "work shared them): paired rounds cancel slow drift, not bursts within a round; rerun on a "
                       "quieter machine before deciding on a few percent.")
    elif max(others) > OTHERS_CAUTION:
        out.append(f"other processes used up to {max(others):.0%} of the machine's CPU time at the start or while it "
                   f"measured (median {statistics.median(others):.0%}, above {OTHERS_CAUTION:.0%}): a neighbour "
                   "shared the cores; paired rounds cancel slow drift, not bursts within a round; rerun on a quieter "
                   "machine before deciding on a few percent.")
    if steals and max(steals) > STEAL_CAUTION:
        out.append(f"the hypervisor stole up to {max(steals):.0%} of the CPU time during the run (above "
                   f"{STEAL_CAUTION:.0%}): a neighbour on the host took cores this VM was given; figures may move "
                   "with it.")
    return out


def unpaired_note(results: Results) -> str:
    """One line when the cells record no round (written before rounds were), else ""."""
    if results.cells and not any(c.round for c in results.cells):
        return ("this file records no rounds (written before they were): comparisons are unpaired, with "
                "conservative intervals (every cross ratio of the repeats)")
    return ""


def sparse_inflight_note(results: Results) -> str:
    """One line when some cell's in-flight sampler missed more ticks than it sampled (``inflight``'s
    ``missed`` above its ``samples``: the stats server answered fewer than half the reads asked, a
    busy machine or a late uWSGI master), else "". Its pile-up and in-flight shares still stand for
    the whole load (the samples stay evenly spread), on fewer samples than asked."""
    sparse = [c for c in results.cells if c.inflight.get("missed", 0) > c.inflight.get("samples", 0)]
    if not sparse:
        return ""
    worst = max(sparse, key=lambda c: c.inflight["missed"] / c.inflight["samples"])
    sampled, missed = worst.inflight["samples"], worst.inflight["missed"]
    return (f"{len(sparse)} of {len(results.cells)} cells' in-flight samples are sparse (the stats server "
            f"answered fewer than half the reads asked; worst: {worst.layout} at {worst.concurrency} connections, "
            f"{sampled} of {sampled + missed}): their pile-up and in-flight shares rest on fewer samples than asked; "
            "rerun on a quieter machine or with a lower --inflight-hz.")


def warnings(results: Results) -> list[str]:
    """Advice the reader should act on, pyperf style: what is wrong and what to do."""
    out = machine_cautions(results.environment)
    groups = group_cells(results)
    noisy = [g for g in groups if g.noisy_figures]
    if noisy:
        worst = max(noisy, key=lambda g: max(g.rps.spread, g.latency["p99"].spread))
        out.append(
            f"{len(noisy)} of {len(groups)} cells are noisy (spread > {NOISY_SPREAD:.0%} across repeats; worst: "
            f"{worst.layout} at {worst.concurrency} connections, throughput spread {worst.rps.spread:.0%}, "
            f"p99 spread {worst.latency['p99'].spread:.0%}): rerun with a longer --duration, more --repeats, "
            f"or on a quieter machine."
        )
    thin = [g for g in groups if g.min_cell_requests < MIN_REQUESTS_FOR_P99]
    if thin:
        duration = results.arguments.get("duration", 0) or 0
        slowest = min(thin, key=lambda g: g.rps.median or 1e9)
        need = MIN_REQUESTS_FOR_P99 / slowest.rps.median if slowest.rps.median else 0
        out.append(
            f"{len(thin)} cells completed fewer than {MIN_REQUESTS_FOR_P99} requests, so their p99 is close to "
            f"their max: use --duration {max(need, duration):.0f} or more for tail figures you can quote."
        )
    thin_tails = [g for g in groups if g.tails.thin]
    if thin_tails:
        duration = results.arguments.get("duration")
        slowest = min(thin_tails, key=lambda g: g.rps.median)
        out.append(
            f"{len(thin_tails)} of {len(groups)} pooled p99 figures rest on fewer than {MIN_SLOWER_REQUESTS} slower "
            f"requests; for the slowest of them, {slowest.layout} at {slowest.concurrency} connections"
            + (f" ({slowest.scenario})" if len(results.scenarios) > 1 else "") + ": "
            + f"{tail_advice(slowest, duration if isinstance(duration, (int, float)) else None)}."
        )
    sparse = sparse_inflight_note(results)
    if sparse:
        out.append(sparse)
    errors = sum(g.errors for g in groups)
    if errors:
        out.append(f"{errors} requests failed (see the errors column): figures of cells with errors are suspect.")
    return out
