"""The CPU-limit section of the compare report: for layouts run under ``@cpus``/``@memory``, how
often the app server hit its quota (throttled share), the CPU it used against that quota, the
time it was held back and the OOM kills, beside its throughput and p99 (medians over repeats,
lowest to highest). Lines only; nothing prints. Nothing is shown when no cell had a limit.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from uwsgi_layouts.bench.report.text import md_table, table, wrap
from uwsgi_layouts.bench.results import Cell, Results
from uwsgi_layouts.bench.tune.pod import MEMORY_REQUEST_MARGIN, PodSizing, pod_record

__all__ = ["MEMORY_REQUEST_MARGIN", "pod_record"]  # where tune's pod record was first defined

EXPLAIN = ("The app server ran in a cgroup of its own with the layout's CPU quota (CFS: the quota's CPU time per "
           "100 ms period) and memory limit, as a container runtime sets them; nginx and wrk ran outside it. "
           "Throttled share: the share of periods in which the server used up its quota and waited for the next "
           "period (cpu.stat). CPU/quota: the CPU it used over the quota's CPU time for the cell. Held back: the "
           "seconds its threads waited throttled. OOM kills count as errors.")
HEADERS = ["layout", "connections", "cpus", "req/s", "p99 ms", "throttled share", "CPU/quota", "held back s",
           "OOM kills"]


@dataclass(frozen=True)
class LimitFigures:
    """One (scenario, layout, level) under a limit, over its repeats."""

    layout: str
    concurrency: int
    cpus: float | None
    memory_mb: int | None
    rps: tuple[float, ...]
    p99_ms: tuple[float, ...]
    throttled_share: tuple[float, ...]
    quota_share: tuple[float, ...]
    throttled_s: tuple[float, ...]
    oom_kills: int

    def __post_init__(self):
        if not self.rps or len(self.rps) != len(self.p99_ms):
            raise ValueError(f"{self.layout} c{self.concurrency}: one rps and p99 per repeat")

    @property
    def median_share(self) -> float | None:
        return statistics.median(self.throttled_share) if self.throttled_share else None


def has_limits(results: Results) -> bool:
    return any(c.limit for c in results.cells)


def limit_figures(results: Results, scenario: str) -> list[LimitFigures]:
    """Every (layout, level) of ``scenario`` whose cells had a limit, in the cells' order."""
    groups: dict[tuple[str, int], list[Cell]] = {}
    for cell in results.cells:
        if cell.scenario == scenario and cell.limit:
            groups.setdefault((cell.layout, cell.concurrency), []).append(cell)
    out = []
    for (layout, level), cells in groups.items():
        limit = cells[0].limit

        def present(key: str, cells=cells) -> tuple[float, ...]:
            return tuple(c.limit[key] for c in cells if c.limit.get(key) is not None)

        out.append(LimitFigures(layout, level, limit.get("cpus"), limit.get("memory_mb"),
                                tuple(c.rps for c in cells), tuple(c.latency_ms.p99 for c in cells),
                                present("throttled_share"), present("quota_share"), present("throttled_s"),
                                sum(c.limit.get("oom_kills", 0) for c in cells)))
    return out


def spread(values: tuple[float, ...], digits: int, percent: bool = False) -> str:
    """Median (lowest–highest) of the repeats; "" when none."""
    if not values:
        return ""
    scale, unit = (100, "%") if percent else (1, "")
    low, high = f"{min(values) * scale:.{digits}f}", f"{max(values) * scale:.{digits}f}"
    text = f"{statistics.median(values) * scale:.{digits}f}{unit}"
    return text + (f" ({low}–{high})" if low != high else "")


def _row(f: LimitFigures) -> list[str]:
    return [f.layout, str(f.concurrency), "" if f.cpus is None else f"{f.cpus:g}", spread(f.rps, 1),
            spread(f.p99_ms, 0), spread(f.throttled_share, 0, percent=True), spread(f.quota_share, 0, percent=True),
            spread(f.throttled_s, 2), str(f.oom_kills)]


def limit_lines(results: Results) -> list[str]:
    """Terminal: per scenario, every limited layout and level."""
    if not has_limits(results):
        return []
    out = ["", "inside the CPU limit (medians over repeats, lowest–highest):"]
    for sc in results.scenarios:
        figures = limit_figures(results, sc)
        if not figures:
            continue
        if len(results.scenarios) > 1:
            out.append(f"  scenario {sc}:")
        out += ["  " + x for x in table(HEADERS, [_row(f) for f in figures], "<>>>>>>>>")]
    out += wrap("throttled share: periods in which the server used up its quota; CPU/quota: CPU used over the "
                "quota's CPU time", indent="  ")
    return out


def limit_markdown(results: Results) -> list[str]:
    """Markdown: an "Inside the CPU limit" section."""
    if not has_limits(results):
        return []
    out = ["## Inside the CPU limit", "", EXPLAIN, ""]
    for sc in results.scenarios:
        figures = limit_figures(results, sc)
        if not figures:
            continue
        if len(results.scenarios) > 1:
            out += [f"### Scenario: {sc}", ""]
        out += md_table(HEADERS, [_row(f) for f in figures], "<>>>>>>>>") + [""]
    out += ["The plot `throttling.png` shows p99 against the throttled share, one point per layout and level.", ""]
    return out


def pod_sentence(pod: PodSizing | None) -> str:
    """tune --cpus: the recommendation for a pod of that size, its measured throttling and the
    memory request it needs ("" when tune ran without a limit)."""
    if pod is None:
        return ""
    size = " and ".join(x for x in (f"{pod.cpus:g} CPU (limits.cpu {round(pod.cpus * 1000)}m)" if pod.cpus else "",
                                    f"{pod.memory_mb} MB of memory" if pod.memory_mb else "") if x)
    text = f"POD: for a pod of {size}, run {pod.layout}"
    if pod.throttled_share:
        cells = len(pod.throttled_share)
        text += (f"; throttled in {spread(pod.throttled_share, 0, percent=True)} of CFS periods (median over "
                 f"{cells} cell{'s' if cells > 1 else ''}), CPU used {spread(pod.quota_share, 0, percent=True)} "
                 "of the quota")
    if pod.oom_kills:
        text += f"; {pod.oom_kills} OOM kills"
    if pod.pss_mb is not None:
        text += (f"; memory request {pod.memory_request_mb:.0f} MB (its PSS after load, "
                 f"{pod.pss_mb:.0f} MB, + {pod.margin:.0%})")
    return text + "."
