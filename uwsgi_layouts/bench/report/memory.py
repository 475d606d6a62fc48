"""Memory sections of the compare report: each layout's memory after load, and what one more
process and one more thread cost, as the run's summary holds them (``Summary.memory``, fitted by
``bench.analysis.memory_costs``). Lines only; nothing prints.
Nothing is shown for runs whose cells recorded no memory (files written before it was measured).
"""

from __future__ import annotations

from uwsgi_layouts.bench.analysis import MEMORY_KEY, Group, MemoryCost, Stat, group_cells
from uwsgi_layouts.bench.report.text import fmt_stat, md_table, num, pm, table, wrap
from uwsgi_layouts.bench.results import Results
from uwsgi_layouts.bench.summary import Summary

COLUMNS = (("app_pss_mb", "server PSS"), ("worker_pss_mb", "per worker PSS"), ("app_uss_mb", "server USS"),
           ("app_rss_mb", "server RSS"), ("nginx_pss_mb", "nginx PSS"))
SERVER_LABELS = {"uwsgi": "uWSGI", "gunicorn": "gunicorn", "granian": "granian"}
EXPLAIN = ("Memory is read right after each cell's load (psutil, /proc/PID/smaps_rollup), in MB of 10^6 bytes. "
           "PSS (proportional set size) splits each page shared by N processes into N parts, so the app server "
           "tree's PSS (master and workers: uWSGI, gunicorn or granian, as the layout says) is what the layout costs "
           "in RAM; USS is what the processes hold alone (freed "
           "if they exit); RSS counts every shared page in every process (an overstatement). Per worker: the mean "
           "PSS of one worker.")


def has_memory(results: Results) -> bool:
    return any(c.memory for c in results.cells)


def _highest(groups: list[Group]) -> list[Group]:
    """Each layout's group at the highest level it was measured at (where the most threads ran)."""
    top: dict[str, Group] = {}
    for g in groups:
        if g.memory and (g.layout not in top or g.concurrency > top[g.layout].concurrency):
            top[g.layout] = g
    return list(top.values())


def cost_text(cost: MemoryCost) -> str:
    def fig(stat: Stat) -> str:
        return fmt_stat(stat, unit="MB", digits=1, mark_noisy=False)

    return (f"one more worker process (with its first thread) costs {fig(cost.per_process)} of PSS, one more "
            f"thread {fig(cost.per_thread)}; the rest (master) {fig(cost.base)}: least-squares fit of the "
            f"{SERVER_LABELS.get(cost.server, cost.server)} tree's PSS = base + a x P + b x P x (T - 1) over "
            f"{', '.join(cost.layouts)} at {cost.level} "
            f"connections, one fit per repeat (median and low–high over {cost.per_process.n}); worst residual "
            f"{num(cost.worst_residual_mb)} MB")


def memory_lines(results: Results, summary: Summary) -> list[str]:
    """Terminal: per scenario, each layout's memory at its highest level, and the fitted costs."""
    if not has_memory(results):
        return []
    out = ["", "memory after load (MB, medians over repeats; ±: half the low–high range):"]
    for sc in results.scenarios:
        groups = _highest(group_cells(results, sc))
        if not groups:
            continue
        if len(results.scenarios) > 1:
            out.append(f"  scenario {sc}:")
        rows = [[g.layout, str(g.concurrency)] + [pm(g.memory[k], 1) if k in g.memory else "" for k, _ in COLUMNS]
                for g in groups]
        headers = ["layout", "conns", *(label.replace(" ", "\n", 1) if " " in label else label for _, label in COLUMNS)]
        out += ["  " + x for x in table(headers, rows, "<" + ">" * (len(headers) - 1))]
        for cost in _costs(summary, sc):
            out += wrap(cost_text(cost), indent="  ", subsequent="  ")
    return out


def memory_markdown(results: Results, summary: Summary) -> list[str]:
    """Markdown: a "Memory" section."""
    if not has_memory(results):
        return []
    out = ["## Memory", "", EXPLAIN, ""]
    for sc in results.scenarios:
        groups = _highest(group_cells(results, sc))
        if not groups:
            continue
        if len(results.scenarios) > 1:
            out += [f"### Scenario: {sc}", ""]
        rows = [[g.layout, str(g.concurrency)] + [fmt_stat(g.memory[k], digits=1, mark_noisy=False)
                                                  if k in g.memory else "" for k, _ in COLUMNS] for g in groups]
        out += md_table(["layout", "connections", *(f"{label} MB" for _, label in COLUMNS)], rows,
                        "<>" + ">" * len(COLUMNS)) + [""]
        for cost in _costs(summary, sc):
            text = cost_text(cost)
            out += [text[0].upper() + text[1:] + ".", ""]
    out += ["The plot `memory.png` shows throughput against the app server tree's PSS, one point per layout and "
            "level.", ""]
    return out


def _costs(summary: Summary, scenario: str) -> list[MemoryCost]:
    """The process/thread cost fits of ``scenario`` (one per app server with enough layouts)."""
    return [c for c in summary.memory if c.scenario == scenario]


def pss_column(group: Group) -> tuple[str, str]:
    """(terminal, markdown) text of a group's app server PSS ("" when not recorded)."""
    stat = group.memory.get(MEMORY_KEY)
    if stat is None:
        return "", ""
    return num(stat.median, 1), fmt_stat(stat, digits=1, mark_noisy=False)
