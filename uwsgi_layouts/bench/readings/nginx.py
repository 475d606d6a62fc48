"""The nginx scenarios judged once, as data: what the compare report's nginx sections say.

- files: per layout and level, each route's throughput and p99 paired against app-streamed, the
  nginx-map / app-streamed ratio against its target (at least 5x) and X-Accel / app-streamed
  against the first issue's (at least 10x), judged on the range of the per-repeat ratios, and
  the ratios between the other routes (``FilesBlock``);
- files-mixed: whether each cell touched the disk, and aio off vs threads, open_file_cache off
  vs on, paired (``MixedBlock``);
- reuseport: how connections and CPU spread over the nginx workers, reuseport on vs off
  (``ReuseportBlock``).

Ratios are paired by repeat (the same repeat of both sides ran back to back, so drift hits both
alike): the median of the per-repeat ratios, with their low–high range (``analysis.Stat``).
The label helpers (``variant_options``, ``without``, ``pairs``) read the ``@key=value`` options
of a layout label.
"""

from __future__ import annotations

import enum
import math
import statistics
from dataclasses import dataclass

from uwsgi_layouts.bench.analysis import Stat, group_cells
from uwsgi_layouts.bench.results import Cell, Results

TARGET_ACCEL_OVER_APP = 10.0  # the issue: X-Accel-Redirect >= 10x app-streamed (5 KB files, same concurrency)
TARGET_NGINX_OVER_APP = 5.0  # issue 15: nginx's own id lookup >= 5x app-streamed at 8 connections (article: ~10x)
MIN_TARGET_REPEATS = 3  # fewer paired repeats decide no target
DISK_TOUCHED_MB = 1.0  # more than this read from the block device during a cell = the disk was touched
ROUTES = (("files-nginx", "nginx map (no app)"), ("files-accel", "X-Accel-Redirect"), ("files-app", "app-streamed"),
          ("files-static", "static (nginx alone)"))
SHORT = {"files-nginx": "nginx map", "files-accel": "X-Accel-Redirect", "files-app": "app-streamed",
         "files-static": "static"}
NGINX_SCENARIOS = ("files-accel", "files-app", "files-static", "files-nginx", "files-mixed", "reuseport")
# The routes with a target against app-streamed, and the chains between routes that are reported.
TARGETS = (("files-nginx", "nginx map", TARGET_NGINX_OVER_APP), ("files-accel", "X-Accel-Redirect",
                                                                  TARGET_ACCEL_OVER_APP))
CHAINS = (("files-nginx", "files-accel", "what the app's id lookup costs per request, by id"),
          ("files-static", "files-nginx", "what nginx's own id lookup costs"),
          ("files-static", "files-accel", "what the app's id lookup costs per request"))
# The files-mixed pairs: option, its value off, its value on, the words for on / off.
MIXED_PAIRS = (("aio", "off", "threads", "aio threads / aio off"),
               ("open_file_cache", "off", "on", "open_file_cache on / off"))


# --------------------------------------------------------------------------- label helpers


def variant_options(label: str) -> dict[str, str]:
    """``2x4-mapped@aio=threads,sendfile=on`` -> {"aio": "threads", "sendfile": "on"} (normalised)."""
    _, _, extra = label.partition("@")
    out = {}
    for item in filter(None, (x.strip() for x in extra.split(","))):
        key, _, value = item.partition("=")
        value = value.strip().lower()
        value = {"true": "on", "1": "on", "yes": "on", "false": "off", "0": "off", "no": "off"}.get(value, value)
        out[key.strip().replace("-", "_")] = value
    return out


def without(label: str, key: str) -> str:
    """The label with option ``key`` removed: what two variants that differ only in it share."""
    spec, _, _ = label.partition("@")
    rest = {k: v for k, v in variant_options(label).items() if k != key}
    return spec + ("@" + ",".join(f"{k}={v}" for k, v in sorted(rest.items())) if rest else "")


def pairs(layouts: list[str], key: str, low: str, high: str) -> list[tuple[str, str]]:
    """(layout with key=low, layout with key=high) for layouts that differ only in ``key``
    (a missing key counts as ``low``, nginx's default)."""
    by_base: dict[str, dict[str, str]] = {}
    for layout in layouts:
        value = variant_options(layout).get(key, low)
        by_base.setdefault(without(layout, key), {})[value] = layout
    return [(v[low], v[high]) for v in by_base.values() if low in v and high in v]


def cells_by_repeat(results: Results, scenario: str, layout: str, level: int) -> dict[int, Cell]:
    return {c.repeat: c for c in results.cells
            if c.scenario == scenario and c.layout == layout and c.concurrency == level}


def paired(a: dict[int, Cell], b: dict[int, Cell], value) -> Stat:
    """Per repeat value(a) / value(b), over repeats both have; zero denominators skipped."""
    ratios = []
    for r in sorted(set(a) & set(b)):
        num, den = value(a[r]), value(b[r])
        if num is not None and den:
            ratios.append(num / den)
    return Stat.of(ratios)


def cell_rps(c: Cell) -> float:
    return c.rps


def wrk_p99(c: Cell) -> float:
    return c.latency_ms.p99


def _capacity(c: Cell) -> float | None:
    return c.capacity_rps or None


def _levels(results: Results, sc: str):
    """(level, [layout, ...]) for every level where ``sc`` measured some layout."""
    measured = {(g.layout, g.concurrency) for g in group_cells(results, sc)}
    for level in results.levels:
        at = [layout for layout in results.layouts if (layout, level) in measured]
        if at:
            yield level, at


# --------------------------------------------------------------------------- files


class TargetVerdict(enum.StrEnum):
    PASS = "pass"
    MISS = "miss"
    UNDECIDED = "undecided"  # the repeats straddle it
    TOO_FEW = "too few"  # fewer than MIN_TARGET_REPEATS paired repeats


def target_verdict(ratio: Stat, target: float) -> TargetVerdict:
    """A paired ratio against ``target``, judged on the range of its per-repeat ratios (as
    ``bench.paired`` judges 3 rounds): pass when every repeat clears it, miss when none does,
    else undecided; fewer than 3 repeats decide nothing."""
    if ratio.n < MIN_TARGET_REPEATS:
        return TargetVerdict.TOO_FEW
    if ratio.low >= target:
        return TargetVerdict.PASS
    if ratio.high < target:
        return TargetVerdict.MISS
    return TargetVerdict.UNDECIDED


@dataclass(frozen=True)
class RouteRatio:
    """One route at one layout and level: its throughput and p99 over app-streamed's (None: no
    app-streamed to pair with; the app-streamed route itself is 1x)."""

    scenario: str
    rps: Stat | None
    p99: Stat | None


@dataclass(frozen=True)
class FilesTarget:
    """A route's throughput over app-streamed against its target, with its p99 and CPU-cost ratios."""

    scenario: str
    what: str
    target: float
    rps: Stat
    p99: Stat
    capacity: Stat
    verdict: TargetVerdict
    short_by: float  # the target less the median ratio (shown when missed)


@dataclass(frozen=True)
class Chain:
    """The throughput of one route over another's, and what the ratio measures."""

    top: str
    bottom: str
    why: str
    rps: Stat


@dataclass(frozen=True)
class FilesBlock:
    layout: str
    concurrency: int
    routes: tuple[RouteRatio, ...]
    targets: tuple[FilesTarget, ...]
    chains: tuple[Chain, ...]


def files_blocks(results: Results) -> tuple[FilesBlock, ...]:
    present = [sc for sc, _ in ROUTES if sc in results.scenarios]
    if not present:
        return ()
    measured = {sc: {(g.layout, g.concurrency) for g in group_cells(results, sc)} for sc in present}
    blocks = []
    for layout in results.layouts:
        for level in results.levels:
            at = [sc for sc in present if (layout, level) in measured[sc]]
            if not at:
                continue
            cells = {sc: cells_by_repeat(results, sc, layout, level) for sc in present}
            app = cells.get("files-app")
            routes = tuple(RouteRatio(sc, *((None, None) if sc == "files-app" or not app else
                                            (paired(cells[sc], app, cell_rps), paired(cells[sc], app, wrk_p99))))
                           for sc in at)
            targets = []
            for sc, what, target in TARGETS:
                if sc in cells and app:
                    ratio = paired(cells[sc], app, cell_rps)
                    if ratio.n:
                        targets.append(FilesTarget(sc, what, target, ratio, paired(cells[sc], app, wrk_p99),
                                                   paired(cells[sc], app, _capacity), target_verdict(ratio, target),
                                                   target - ratio.median))
            chains = []
            for top, bottom, why in CHAINS:
                if top in cells and bottom in cells:
                    ratio = paired(cells[top], cells[bottom], cell_rps)
                    if ratio.n:
                        chains.append(Chain(top, bottom, why, ratio))
            blocks.append(FilesBlock(layout, level, routes, tuple(targets), tuple(chains)))
    return tuple(blocks)


# --------------------------------------------------------------------------- files-mixed


class Touched(enum.StrEnum):
    YES = "yes"
    NO = "no"
    UNKNOWN = "unknown"  # not on a block device


def disk_touched(g) -> Touched:
    mb = g.extra.get("disk_read_mb")
    if mb is None:
        return Touched.UNKNOWN
    return Touched.YES if mb.median >= DISK_TOUCHED_MB else Touched.NO


class Change(enum.StrEnum):
    """Which way a paired ratio (on / off) moved its figure."""

    LOWER = "lower"
    HIGHER = "higher"
    SAME = "the same"


@dataclass(frozen=True)
class MixedPair:
    """One option off vs on at one level: the hot file's p99 and the cold files' throughput, on / off."""

    key: str
    label: str
    on: str
    off: str
    high: str  # the option's value when on
    hot: Stat
    cold: Stat
    change: Change


@dataclass(frozen=True)
class MixedRow:
    """One layout at one level: whether its cells touched the disk, and its hot-file clients' errors."""

    layout: str
    touched: Touched
    hot_errors: int


@dataclass(frozen=True)
class MixedBlock:
    concurrency: int
    rows: tuple[MixedRow, ...]
    pairs: tuple[MixedPair, ...]


def change_of(ratio: Stat) -> Change:
    """Which way a paired ratio (on / off) moved its figure: its median below, above or at 1."""
    return Change.LOWER if ratio.median < 1 else Change.HIGHER if ratio.median > 1 else Change.SAME


def mixed_blocks(results: Results) -> tuple[MixedBlock, ...]:
    sc = "files-mixed"
    if sc not in results.scenarios:
        return ()
    groups = {(g.layout, g.concurrency): g for g in group_cells(results, sc)}
    blocks = []
    for level, layouts in _levels(results, sc):
        rows = tuple(MixedRow(layout, disk_touched(groups[(layout, level)]),
                              int(sum(c.extra.get("hot_errors", 0) for c in results.cells
                                      if c.scenario == sc and c.layout == layout and c.concurrency == level)))
                     for layout in layouts)
        found = []
        for key, low, high, label in MIXED_PAIRS:
            for off, on in pairs(layouts, key, low, high):
                a = cells_by_repeat(results, sc, on, level)
                b = cells_by_repeat(results, sc, off, level)
                hot = paired(a, b, lambda c: c.extra.get("hot_p99_ms"))
                if hot.n:
                    found.append(MixedPair(key, label, on, off, high, hot, paired(a, b, cell_rps), change_of(hot)))
        blocks.append(MixedBlock(level, rows, tuple(found)))
    return tuple(blocks)


# --------------------------------------------------------------------------- reuseport


def max_min(values: list) -> float:
    """The busiest over the idlest (0: nothing; inf: one held none)."""
    if not values or max(values) == 0:
        return 0.0
    return max(values) / min(values) if min(values) else math.inf


@dataclass(frozen=True)
class ReuseportRow:
    """One layout's spread over the nginx workers: the median over repeats of busiest / idlest,
    for connections and for CPU (None: not recorded)."""

    layout: str
    conns: float | None
    cpu: float | None


@dataclass(frozen=True)
class ReuseportPair:
    on: str
    off: str
    p99: Stat
    rps: Stat


@dataclass(frozen=True)
class ReuseportBlock:
    concurrency: int
    rows: tuple[ReuseportRow, ...]
    pairs: tuple[ReuseportPair, ...]


def _median_spread(per_repeat: list[list]) -> float | None:
    spread = [max_min(x) for x in per_repeat if x]
    return statistics.median(spread) if spread else None


def reuseport_blocks(results: Results) -> tuple[ReuseportBlock, ...]:
    sc = "reuseport"
    if sc not in results.scenarios:
        return ()
    blocks = []
    for level, layouts in _levels(results, sc):
        rows = []
        for layout in layouts:
            cells = sorted(cells_by_repeat(results, sc, layout, level).values(), key=lambda c: c.repeat)
            rows.append(ReuseportRow(layout, _median_spread([c.extra.get("nginx_worker_conns") or [] for c in cells]),
                                     _median_spread([c.extra.get("nginx_worker_cpu_s") or [] for c in cells])))
        found = []
        for off, on in pairs(layouts, "reuseport", "off", "on"):
            a = cells_by_repeat(results, sc, on, level)
            b = cells_by_repeat(results, sc, off, level)
            p99 = paired(a, b, wrk_p99)
            if p99.n:
                found.append(ReuseportPair(on, off, p99, paired(a, b, cell_rps)))
        blocks.append(ReuseportBlock(level, tuple(rows), tuple(found)))
    return tuple(blocks)


@dataclass(frozen=True)
class NginxReading:
    """Every nginx section's judgements (empty tuples: the run has no such scenario)."""

    files: tuple[FilesBlock, ...] = ()
    mixed: tuple[MixedBlock, ...] = ()
    reuseport: tuple[ReuseportBlock, ...] = ()


def nginx_reading(results: Results) -> NginxReading:
    return NginxReading(files_blocks(results), mixed_blocks(results), reuseport_blocks(results))


def only_nginx(results: Results) -> bool:
    return bool(results.scenarios) and all(sc in NGINX_SCENARIOS for sc in results.scenarios)
