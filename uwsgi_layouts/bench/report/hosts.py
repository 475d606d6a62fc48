"""Report section for ``bench compare --hosts N``: each app host's share of the requests, and what
TLS between the front and the hosts costs, from stored results only (lines, never printed).

TLS cost pairs each layout with the same label at ``@uwsgi_tls=off`` (plain uwsgi, allowed only in the
benchmark's own namespaces), repeat by repeat as ``bench.report.nginx`` pairs its variants: the
median of the per-repeat ratios with their low-high range. A label without ``tls`` is the
default across hosts, suwsgi.
"""

from __future__ import annotations

from uwsgi_layouts.bench.analysis import Stat, group_cells
from uwsgi_layouts.bench.report.nginx import _emit, _x, cells_by_repeat, paired, variant_options, without
from uwsgi_layouts.bench.report.text import num
from uwsgi_layouts.bench.results import Results

DEFAULT_TLS = "suwsgi"


def tls_of(label: str) -> str:
    return variant_options(label).get("uwsgi_tls", DEFAULT_TLS)


def tls_pairs(layouts: list[str]) -> list[tuple[str, str]]:
    """(layout with TLS, the same at uwsgi_tls=off) for every TLS layout whose plain twin was measured."""
    plain = {without(label, "uwsgi_tls"): label for label in layouts if tls_of(label) == "off"}
    return [(label, plain[without(label, "uwsgi_tls")]) for label in layouts
            if tls_of(label) != "off" and without(label, "uwsgi_tls") in plain]


def _share_text(group_extra: dict, hosts: int) -> str:
    shares = [group_extra.get(f"host{i}_share") for i in range(1, hosts + 1)]
    if any(s is None for s in shares):
        return "n/a"
    return " / ".join(f"{s.median:.0%}" for s in shares)


def host_lines(results: Results, markdown: bool = False) -> list[str]:
    hosts = results.arguments.get("hosts") or 0
    if not hosts or not results.cells:
        return []
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
        tls_rows = []
        for with_tls, plain in tls_pairs(results.layouts):
            for level in results.levels:
                a = cells_by_repeat(results, sc, with_tls, level)
                b = cells_by_repeat(results, sc, plain, level)
                if not a or not b:
                    continue
                rps = paired(a, b, lambda c: c.rps)
                p99 = paired(a, b, lambda c: c.latency_ms.p99)
                cpu = paired(a, b, lambda c: sum(c.cpu_s.values()) / c.requests if c.requests else None)
                tls_rows.append([f"{tls_of(with_tls)} vs off", with_tls.partition("@")[0], str(level), _x(rps),
                                 _x(p99), _x(cpu)])
        if tls_rows:
            blocks.append((f"{sc}: what TLS costs (ratio to plain uwsgi, paired by repeat: median (low-high))",
                           ["TLS", "layout", "conns", "throughput", "p99", "CPU per request"], tls_rows, "<<>>>>",
                           ["suwsgi: uwsgi over TLS, a handshake per request (nginx keeps no uwsgi connection "
                            "alive); https: uWSGI's https-socket with nginx keep-alive, which uWSGI 2.0 closes "
                            "after every response anyway."]))
    return _emit(f"Across {hosts} app hosts", intro, blocks, markdown)
