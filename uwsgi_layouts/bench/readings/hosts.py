"""``bench compare --hosts N`` judged once, as data: what TLS between the front and the app hosts
costs, each TLS layout paired repeat by repeat with the same label at ``@uwsgi_tls=off`` (plain
uwsgi, allowed only in the benchmark's own namespaces), as the nginx readings pair their variants:
the median of the per-repeat ratios with their low–high range. A label without ``uwsgi_tls`` is
the default across hosts, suwsgi. Each host's share of the requests is a measured figure: the
report reads it from the results.
"""

from __future__ import annotations

from dataclasses import dataclass

from uwsgi_layouts.bench.analysis import Stat
from uwsgi_layouts.bench.readings.nginx import cell_rps, cells_by_repeat, paired, variant_options, without, wrk_p99
from uwsgi_layouts.bench.results import Cell, Results

DEFAULT_TLS = "suwsgi"


def tls_of(label: str) -> str:
    return variant_options(label).get("uwsgi_tls", DEFAULT_TLS)


def tls_pairs(layouts: list[str]) -> list[tuple[str, str]]:
    """(layout with TLS, the same at uwsgi_tls=off) for every TLS layout whose plain twin was measured."""
    plain = {without(label, "uwsgi_tls"): label for label in layouts if tls_of(label) == "off"}
    return [(label, plain[without(label, "uwsgi_tls")]) for label in layouts
            if tls_of(label) != "off" and without(label, "uwsgi_tls") in plain]


@dataclass(frozen=True)
class TlsCost:
    """One TLS layout against its plain twin at one level: throughput, p99 and CPU per request,
    TLS / plain, paired by repeat."""

    scenario: str
    layout: str
    plain: str
    tls: str
    concurrency: int
    rps: Stat
    p99: Stat
    cpu: Stat


def _cpu_per_request(c: Cell) -> float | None:
    return sum(c.cpu_s.values()) / c.requests if c.requests else None


def tls_costs(results: Results) -> tuple[TlsCost, ...]:
    if not results.arguments.get("hosts") or not results.cells:
        return ()
    out = []
    for sc in results.scenarios:
        for with_tls, plain in tls_pairs(results.layouts):
            for level in results.levels:
                a = cells_by_repeat(results, sc, with_tls, level)
                b = cells_by_repeat(results, sc, plain, level)
                if not a or not b:
                    continue
                out.append(TlsCost(sc, with_tls, plain, tls_of(with_tls), level, paired(a, b, cell_rps),
                                   paired(a, b, wrk_p99), paired(a, b, _cpu_per_request)))
    return tuple(out)
