"""Report sections for the nginx scenarios, from stored results only (lines, never printed).

- files: the four tiers (nginx by id through its map, X-Accel-Redirect, app-streamed, static)
  side by side, throughput and p99 per layout and level with each tier's ratios to
  app-streamed; the nginx-map / app-streamed ratio against its target (at least 5x), the
  X-Accel / app-streamed ratio against the first issue's (at least 10x), static / X-Accel;
- files-mixed: the hot file's p99 with ``aio off`` vs ``aio threads`` and with
  ``open_file_cache`` off vs on, and whether the disk was really touched (bytes the block
  device read during the cell, page-cache residency before and after);
- reuseport: p99 and how connections and CPU spread over the nginx workers, reuseport on vs off.

Ratios are paired by repeat (the same repeat of both sides ran back to back, so drift hits
both alike): the median of the per-repeat ratios, with their low–high range.
"""

from __future__ import annotations

import math
import statistics

from uwsgi_layouts.bench.analysis import Group, Stat, group_cells
from uwsgi_layouts.bench.report.text import fmt_stat, md_table, num, table, wrap
from uwsgi_layouts.bench.results import Cell, Results

TARGET_ACCEL_OVER_APP = 10.0  # the issue: X-Accel-Redirect >= 10x app-streamed (5 KB files, same concurrency)
TARGET_NGINX_OVER_APP = 5.0  # issue 15: nginx's own id lookup >= 5x app-streamed at 8 connections (article: ~10x)
DISK_TOUCHED_MB = 1.0  # more than this read from the block device during a cell = the disk was touched
ROUTES = (("files-nginx", "nginx map (no app)"), ("files-accel", "X-Accel-Redirect"), ("files-app", "app-streamed"),
          ("files-static", "static (nginx alone)"))
SHORT = {"files-nginx": "nginx map", "files-accel": "X-Accel-Redirect", "files-app": "app-streamed",
         "files-static": "static"}
NGINX_SCENARIOS = ("files-accel", "files-app", "files-static", "files-nginx", "files-mixed", "reuseport")


# --------------------------------------------------------------------------- helpers


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


def _x(stat: Stat) -> str:
    """A ratio: ``1.25x (1.10–1.31)``."""
    if stat.n == 0:
        return "n/a"
    text = f"{num(stat.median)}x"
    if stat.n > 1:
        text += f" ({num(stat.low)}–{num(stat.high)})"
    return text


def _s(stat: Stat | None, unit: str = "") -> str:
    return fmt_stat(stat, unit=unit, digits=None) if stat is not None else "n/a"


def _groups(results: Results, scenario: str) -> dict[tuple[str, int], Group]:
    return {(g.layout, g.concurrency): g for g in group_cells(results, scenario)} if scenario in results.scenarios \
        else {}


def _dataset_text(results: Results) -> str:
    d = results.environment.get("dataset")
    if not isinstance(d, dict):
        return ""
    text = f"{d.get('small_count')} small files of {d.get('small_size')} bytes"
    if d.get("large_count"):
        text += f" and {d.get('large_count')} large ones of {d.get('large_size', 0) / 1e6:.1f} MB"
    if d.get("fs_type"):
        text += f" on {d['fs_type']}"
    return text


def _emit(title: str, intro: list[str], blocks: list[tuple[str, list[str], list[list[str]], str, list[str]]],
          markdown: bool) -> list[str]:
    """A section: title, intro sentences, then per block a heading, a table and its notes."""
    if markdown:
        out = [f"## {title}", ""]
        for sentence in intro:
            out += [sentence, ""]
        for heading, headers, rows, align, notes in blocks:
            out += [f"### {heading}", ""] + md_table(headers, rows, align) + [""]
            out += [f"- {n}" for n in notes] + ([""] if notes else [])
        return out
    out = ["", f"== {title} =="]
    for sentence in intro:
        out += wrap(sentence)
    for heading, headers, rows, align, notes in blocks:
        out += ["", heading]
        out += ["  " + x for x in table(headers, rows, align)]
        for n in notes:
            out += wrap(n, indent="  ", subsequent="    ")
    return out


# --------------------------------------------------------------------------- files


def target_verdict(ratio: Stat, target: float) -> str:
    """A paired ratio against ``target``, judged on the range of its per-repeat ratios (as
    ``bench.paired`` judges 3 rounds): pass when every repeat clears it, MISS when none does,
    else undecided; fewer than 3 repeats decide nothing."""
    if ratio.n < 3:
        return f"undecided ({ratio.n} repeat{'s' if ratio.n != 1 else ''}: measure at least 3)"
    if ratio.low >= target:
        return "pass"
    if ratio.high < target:
        return f"MISS (short by {target - ratio.median:.2f}x)"
    return "undecided (the repeats straddle it: measure more)"


def _target_note(ratio: Stat, p99: Stat, capacity: Stat, what: str, target: float) -> str:
    verdict = target_verdict(ratio, target)
    text = f"{what} / app-streamed throughput: {_x(ratio)}; target >= {target:g}x: {verdict}. p99 {what} / " \
           f"app-streamed: {_x(p99)}."
    if capacity.n:
        # CPU-seconds per request barely move when other work takes the cores; throughput does.
        text += (f" By CPU cost per request (capacity: cores / CPU-seconds of uWSGI + nginx + wrk per request, "
                 f"what an idle machine would allow): {_x(capacity)}.")
    return text


def files_section(results: Results, markdown: bool = False) -> list[str]:
    present = [(sc, name) for sc, name in ROUTES if sc in results.scenarios]
    if not present:
        return []
    groups = {sc: _groups(results, sc) for sc, _ in present}
    blocks = []
    for layout in results.layouts:
        for level in results.levels:
            at = {sc: groups[sc].get((layout, level)) for sc, _ in present}
            if not any(at.values()):
                continue
            cells = {sc: cells_by_repeat(results, sc, layout, level) for sc, _ in present}
            app = cells.get("files-app")
            rows = []
            for sc, name in present:
                g = at[sc]
                if g is None:
                    continue
                vs_app = ["1x" if sc == "files-app" else _x(paired(cells[sc], app, value)) if app else "n/a"
                          for value in (lambda c: c.rps, lambda c: c.latency_ms.p99)]
                rows.append([name, _s(g.rps), vs_app[0], _s(g.latency["p99"], "ms"), vs_app[1],
                             f"{g.errors} of {g.requests}" if g.errors else "0", _s(g.extra.get("disk_read_mb"))])
            notes = []
            rps = lambda c: c.rps  # noqa: E731
            p99 = lambda c: c.latency_ms.p99  # noqa: E731
            for sc, what, target in (("files-nginx", "nginx map", TARGET_NGINX_OVER_APP),
                                     ("files-accel", "X-Accel-Redirect", TARGET_ACCEL_OVER_APP)):
                if sc in cells and app:
                    ratio = paired(cells[sc], app, rps)
                    if ratio.n:
                        capacity = paired(cells[sc], app, lambda c: c.capacity_rps or None)
                        notes.append(_target_note(ratio, paired(cells[sc], app, p99), capacity, what, target))
            for top, bottom, why in (("files-nginx", "files-accel", "what the app's id lookup costs per request, "
                                      "by id"),
                                     ("files-static", "files-nginx", "what nginx's own id lookup costs"),
                                     ("files-static", "files-accel", "what the app's id lookup costs per request")):
                if top in cells and bottom in cells:
                    ratio = paired(cells[top], cells[bottom], rps)
                    if ratio.n:
                        notes.append(f"{SHORT[top]} / {SHORT[bottom]} throughput: {_x(ratio)} ({why}).")
            blocks.append((f"{layout} at {level} connections",
                           ["route", "req/s", "vs app", "p99", "p99 vs app", "errors", "disk MB read"],
                           rows, "<>>>>>>", notes))
    dataset = _dataset_text(results)
    intro = [("Random files of the data set" + (f" ({dataset})" if dataset else "") + " through up to four routes: "
              "nginx looks the id up itself in a map of the index and sends the bytes (/nfiles/<id>), the app looks "
              "the id up and nginx sends the bytes (X-Accel-Redirect to an internal location), the app streams them "
              "itself (?via=app), or nginx serves them by path (/static/). Medians with the low–high range over "
              "repeats; ratios are per repeat (paired: both ran in the same stack, one after the other), then their "
              "median and range.")]
    return _emit("nginx: sending files (nginx map vs X-Accel-Redirect vs app-streamed vs static)", intro, blocks,
                 markdown)


# --------------------------------------------------------------------------- files-mixed


def disk_text(g: Group) -> str:
    """"yes (12.3 MB read, residency 2% -> 61%)", "no (...)" or "unknown (...)"."""
    mb = g.extra.get("disk_read_mb")
    before, after = g.extra.get("resident_before"), g.extra.get("resident_after")
    residency = (f", residency {before.median:.0%} -> {after.median:.0%}"
                 if before is not None and after is not None else "")
    if mb is None:
        return "unknown (not on a block device" + residency + ")"
    touched = mb.median >= DISK_TOUCHED_MB
    return f"{'yes' if touched else 'no'} ({num(mb.median)} MB read{residency})"


def _levels(results: Results, sc: str):
    """(level, [(layout, group), ...]) for every level where ``sc`` measured some layout."""
    groups = _groups(results, sc)
    for level in results.levels:
        at = [(layout, groups[(layout, level)]) for layout in results.layouts if (layout, level) in groups]
        if at:
            yield level, at


def _level_blocks(results: Results, sc: str, block) -> list | None:
    """A section's blocks: ``block(results, sc, level, at)`` for every level where ``sc`` measured
    some layout (``_levels``); None when the run has no ``sc`` at all (no section)."""
    if sc not in results.scenarios:
        return None
    return [block(results, sc, level, at) for level, at in _levels(results, sc)]


def mixed_section(results: Results, markdown: bool = False) -> list[str]:
    sc = "files-mixed"
    blocks = _level_blocks(results, sc, _mixed_block)
    if blocks is None:
        return []
    mix = results.workload.get(sc, {}).get("files", {}) if isinstance(results.workload.get(sc), dict) else {}
    dataset = _dataset_text(results)
    intro = [f"Random files ({mix.get('which', 'all')}, {mix.get('large_share', 0):.0%} of requests for a large "
             f"one; nginx static) while {mix.get('hot_clients', '?')} other connections ask for one hot file, "
             "as in the thread-pool article" + (f"; data set: {dataset}" if dataset else "") + ". "
             + ("The data set's pages were evicted from the page cache before every cell "
                "(posix_fadvise DONTNEED); 'disk touched' says whether its block device really read during the cell "
                f"(more than {DISK_TOUCHED_MB:g} MB) and the share of its pages cached before -> after."
                if mix.get("cold_cache") else "The page cache was NOT evicted (cold cache off).")]
    return _emit("nginx: cold files + one hot file (aio off vs threads, open_file_cache off vs on)", intro, blocks,
                 markdown)


def _mixed_block(results: Results, sc: str, level: int, at: list) -> tuple:
    """One level of the files-mixed section: a row per layout, the notes of the paired on/off variants."""
    rows = []
    for layout, g in at:
        errors = g.errors + int(sum(c.extra.get("hot_errors", 0) for c in results.cells
                                    if c.scenario == sc and c.layout == layout and c.concurrency == level))
        options = variant_options(layout)
        rows.append([layout, options.get("aio", "off"), "off" if options.get("open_file_cache", "off") in
                     ("off", "0") else options["open_file_cache"], _s(g.extra.get("hot_p99_ms"), "ms"),
                     _s(g.extra.get("hot_p50_ms"), "ms"), _s(g.extra.get("hot_rps")), _s(g.rps),
                     _s(g.latency["p99"], "ms"), str(errors), disk_text(g)])
    notes = []
    layouts = [x for x, _ in at]
    for key, low, high, label in (("aio", "off", "threads", "aio threads / aio off"),
                                  ("open_file_cache", "off", "on", "open_file_cache on / off")):
        for off, on in pairs(layouts, key, low, high):
            a = cells_by_repeat(results, sc, on, level)
            b = cells_by_repeat(results, sc, off, level)
            hot = paired(a, b, lambda c: c.extra.get("hot_p99_ms"))
            cold = paired(a, b, lambda c: c.rps)
            if hot.n:
                better = "lower" if hot.median < 1 else "higher" if hot.median > 1 else "the same"
                where = without(on, key).partition("@")[2]
                notes.append(f"hot-file p99 with {label}{f' ({where})' if where else ''}: {_x(hot)} "
                             f"({better} with {high if key == 'aio' else 'the cache'}); cold-file throughput: "
                             f"{_x(cold)}.")
    return (f"{level} cold-file connections", ["layout", "aio", "open_file_cache", "hot p99", "hot p50",
                                               "hot req/s", "cold req/s", "cold p99", "errors", "disk touched"],
            rows, "<<<>>>>>><", notes)


# --------------------------------------------------------------------------- reuseport


def _max_min(values: list) -> float:
    if not values or max(values) == 0:
        return 0.0
    return max(values) / min(values) if min(values) else math.inf


def _ratio_text(x: float) -> str:
    return "∞" if math.isinf(x) else f"{x:.2f}"


def reuseport_section(results: Results, markdown: bool = False) -> list[str]:
    blocks = _level_blocks(results, "reuseport", _reuseport_block)
    if blocks is None:
        return []
    intro = ["One small cached file (nginx static) through many keep-alive connections, so nginx, not the app, is "
             "the work. wrk keeps its connections open, but nginx closes a keep-alive connection after 1000 requests "
             "(keepalive_requests), so wrk reconnects and accepts go on during the whole cell. Connections are "
             "counted per nginx worker while the load runs (the sample with the most; a connection being re-opened "
             "can be missed or counted twice), with each worker's CPU seconds over the cell. max/min: busiest "
             "worker / idlest (1.00 = even; ∞ = one worker held none), median over repeats."]
    return _emit("nginx: reuseport on vs off (accept spread across nginx workers)", intro, blocks, markdown)


def _reuseport_block(results: Results, sc: str, level: int, at: list) -> tuple:
    """One level of the reuseport section: a row per layout, the note of each on/off pair."""
    rows = []
    for layout, g in at:
        cells = sorted(cells_by_repeat(results, sc, layout, level).values(), key=lambda c: c.repeat)
        conns = [c.extra.get("nginx_worker_conns") or [] for c in cells]
        cpu = [c.extra.get("nginx_worker_cpu_s") or [] for c in cells]
        spread = [_max_min(x) for x in conns if x]
        cpu_spread = [_max_min(x) for x in cpu if x]
        rows.append([
            layout, variant_options(layout).get("reuseport", "off"), _s(g.rps), _s(g.latency["p99"], "ms"),
            _s(g.latency["p999"], "ms"), str(g.errors),
            "; ".join("/".join(str(n) for n in x) for x in conns if x) or "n/a",
            _ratio_text(statistics.median(spread)) if spread else "n/a",
            _ratio_text(statistics.median(cpu_spread)) if cpu_spread else "n/a",
        ])
    notes = []
    for off, on in pairs([x for x, _ in at], "reuseport", "off", "on"):
        a = cells_by_repeat(results, sc, on, level)
        b = cells_by_repeat(results, sc, off, level)
        p99 = paired(a, b, lambda c: c.latency_ms.p99)
        rps = paired(a, b, lambda c: c.rps)
        if p99.n:
            notes.append(f"reuseport on / off: p99 {_x(p99)}, throughput {_x(rps)}.")
    return (f"{level} connections", ["layout", "reuseport", "req/s", "p99", "p99.9", "errors",
                                     "conns per nginx worker (per repeat)", "conn max/min", "CPU max/min"],
            rows, "<<>>>><>>", notes)


def nginx_lines(results: Results, markdown: bool = False) -> list[str]:
    """Every nginx section this run has data for (none: an empty list)."""
    return files_section(results, markdown) + mixed_section(results, markdown) + reuseport_section(results, markdown)


def only_nginx(results: Results) -> bool:
    return bool(results.scenarios) and all(sc in NGINX_SCENARIOS for sc in results.scenarios)
