"""Report section for ``bench compare --hosts N``: each app host's share of the requests, and what
TLS between the front and the hosts costs, from stored results only (lines, never printed).

The shares are the measured groups' medians; what TLS costs is ``bench.readings.hosts``'s
(``Summary.hosts``): each TLS layout paired repeat by repeat with the same label at
``@uwsgi_tls=off``, the median of the per-repeat ratios with their low–high range. Nothing is
judged here.
"""

from __future__ import annotations

from uwsgi_layouts.bench.analysis import Stat, group_cells
from uwsgi_layouts.bench.readings import TlsCost, tls_costs
from uwsgi_layouts.bench.report.nginx import _emit, _x
from uwsgi_layouts.bench.report.text import num
from uwsgi_layouts.bench.results import Results
from uwsgi_layouts.bench.summary import Summary


def _share_text(group_extra: dict, hosts: int) -> str:
    shares = [group_extra.get(f"host{i}_share") for i in range(1, hosts + 1)]
    if any(s is None for s in shares):
        return "n/a"
    return " / ".join(f"{s.median:.0%}" for s in shares)


def host_lines(results: Results, markdown: bool = False, summary: Summary | None = None) -> list[str]:
    hosts = results.arguments.get("hosts") or 0
    if not hosts or not results.cells:
        return []
    costs: tuple[TlsCost, ...] = summary.hosts if summary is not None else tls_costs(results)
    cores = results.environment.get("nproc")
    intro = [f"{hosts} app hosts and a front, each in its own network namespace on one machine"
             + (f" ({cores} cores)" if cores else "") + ": every host shares the same cores, so this measures "
             "correctness and overheads (balance, what TLS costs per request), not scale."]
    blocks = []
    for sc in results.scenarios:
        rows = []
        for g in group_cells(results, sc):
            busiest = g.extra.get("host_share_max")
            rows.append([g.layout, str(g.concurrency), _share_text(g.extra, hosts),
                         f"{busiest.median:.0%}" if isinstance(busiest, Stat) and busiest.n else "n/a",
                         f"{num(g.cv.median, 2)}" if g.cv.n else "n/a"])
        if rows:
            blocks.append((f"{sc}: each host's share of the requests (median of repeats; even = {1 / hosts:.0%})",
                           ["layout", "conns", " / ".join(f"h{i}" for i in range(1, hosts + 1)), "busiest",
                            "worker CV"], rows, "<>>>>", []))
        tls_rows = [[f"{c.tls} vs off", c.layout.partition("@")[0], str(c.concurrency), _x(c.rps), _x(c.p99),
                     _x(c.cpu)] for c in costs if c.scenario == sc]
        if tls_rows:
            blocks.append((f"{sc}: what TLS costs (ratio to plain uwsgi, paired by repeat: median (low-high))",
                           ["TLS", "layout", "conns", "throughput", "p99", "CPU per request"], tls_rows, "<<>>>>",
                           ["suwsgi: uwsgi over TLS, a handshake per request (nginx keeps no uwsgi connection "
                            "alive); https: uWSGI's https-socket with nginx keep-alive, which uWSGI 2.0 closes "
                            "after every response anyway."]))
    return _emit(f"Across {hosts} app hosts", intro, blocks, markdown)
