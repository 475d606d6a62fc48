"""Report sections for the nginx scenarios, from stored results only (lines, never printed).

- files: the four tiers (nginx by id through its map, X-Accel-Redirect, app-streamed, static)
  side by side, throughput and p99 per layout and level with each tier's ratios to
  app-streamed; the nginx-map / app-streamed ratio against its target (at least 5x), the
  X-Accel / app-streamed ratio against the first issue's (at least 10x), static / X-Accel;
- files-mixed: the hot file's p99 with ``aio off`` vs ``aio threads`` and with
  ``open_file_cache`` off vs on, and whether the disk was really touched (bytes the block
  device read during the cell, page-cache residency before and after);
- reuseport: p99 and how connections and CPU spread over the nginx workers, reuseport on vs off.

Every ratio, target verdict and "disk touched" is ``bench.readings.nginx``'s (``Summary.nginx``):
ratios paired by repeat (the same repeat of both sides ran back to back, so drift hits both
alike), the median of the per-repeat ratios with their low–high range. The tables' medians are
the measured groups' (from the results). Nothing is judged here.
"""

from __future__ import annotations

import math

from uwsgi_layouts.bench.analysis import Group, Stat, group_cells
from uwsgi_layouts.bench.readings import (
    DISK_TOUCHED_MB,
    NGINX_SCENARIOS,
    ROUTES,
    SHORT,
    FilesBlock,
    FilesTarget,
    MixedBlock,
    ReuseportBlock,
    TargetVerdict,
    Touched,
    cells_by_repeat,
    files_blocks,
    mixed_blocks,
    pairs,
    reuseport_blocks,
    variant_options,
    without,
)
from uwsgi_layouts.bench.report.text import fmt_stat, md_table, num, table, wrap
from uwsgi_layouts.bench.results import Results
from uwsgi_layouts.bench.summary import Summary

# Re-exported: the label helpers and the scenarios, for the report's other sections and older callers.
__all__ = ["NGINX_SCENARIOS", "files_section", "mixed_section", "nginx_lines", "pairs",
           "reuseport_section", "variant_options", "without"]
NAMES = dict(ROUTES)


# --------------------------------------------------------------------------- helpers


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


def target_text(t: FilesTarget) -> str:
    """The words of ``readings.target_verdict``: pass, MISS (short by ...) or undecided (why)."""
    if t.verdict is TargetVerdict.TOO_FEW:
        return f"undecided ({t.rps.n} repeat{'s' if t.rps.n != 1 else ''}: measure at least 3)"
    if t.verdict is TargetVerdict.PASS:
        return "pass"
    if t.verdict is TargetVerdict.MISS:
        return f"MISS (short by {t.short_by:.2f}x)"
    return "undecided (the repeats straddle it: measure more)"


def _target_note(t: FilesTarget) -> str:
    text = f"{t.what} / app-streamed throughput: {_x(t.rps)}; target >= {t.target:g}x: {target_text(t)}. p99 " \
           f"{t.what} / app-streamed: {_x(t.p99)}."
    if t.capacity.n:
        # CPU-seconds per request barely move when other work takes the cores; throughput does.
        text += (f" By CPU cost per request (capacity: cores / CPU-seconds of uWSGI + nginx + wrk per request, "
                 f"what an idle machine would allow): {_x(t.capacity)}.")
    return text


def _vs_app(scenario: str, ratio: Stat | None) -> str:
    return "1x" if scenario == "files-app" else _x(ratio) if ratio is not None else "n/a"


def _files_block(groups: dict, b: FilesBlock) -> tuple:
    rows = []
    for r in b.routes:
        g = groups[r.scenario][(b.layout, b.concurrency)]
        rows.append([NAMES[r.scenario], _s(g.rps), _vs_app(r.scenario, r.rps), _s(g.latency["p99"], "ms"),
                     _vs_app(r.scenario, r.p99), f"{g.errors} of {g.requests}" if g.errors else "0",
                     _s(g.extra.get("disk_read_mb"))])
    notes = [_target_note(t) for t in b.targets]
    notes += [f"{SHORT[c.top]} / {SHORT[c.bottom]} throughput: {_x(c.rps)} ({c.why})." for c in b.chains]
    return (f"{b.layout} at {b.concurrency} connections",
            ["route", "req/s", "vs app", "p99", "p99 vs app", "errors", "disk MB read"], rows, "<>>>>>>", notes)


def files_section(results: Results, markdown: bool = False, summary: Summary | None = None) -> list[str]:
    present = [sc for sc, _ in ROUTES if sc in results.scenarios]
    if not present:
        return []
    groups = {sc: _groups(results, sc) for sc in present}
    found = summary.nginx.files if summary is not None else files_blocks(results)
    blocks = [_files_block(groups, b) for b in found]
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


def disk_text(g: Group, touched: Touched) -> str:
    """"yes (12.3 MB read, residency 2% -> 61%)", "no (...)" or "unknown (...)"."""
    mb = g.extra.get("disk_read_mb")
    before, after = g.extra.get("resident_before"), g.extra.get("resident_after")
    residency = (f", residency {before.median:.0%} -> {after.median:.0%}"
                 if before is not None and after is not None else "")
    if touched is Touched.UNKNOWN:
        return "unknown (not on a block device" + residency + ")"
    return f"{touched} ({num(mb.median)} MB read{residency})"


def mixed_section(results: Results, markdown: bool = False, summary: Summary | None = None) -> list[str]:
    sc = "files-mixed"
    if sc not in results.scenarios:
        return []
    groups = _groups(results, sc)
    found = summary.nginx.mixed if summary is not None else mixed_blocks(results)
    blocks = [_mixed_block(groups, b) for b in found]
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


def _mixed_block(groups: dict, b: MixedBlock) -> tuple:
    """One level of the files-mixed section: a row per layout, the notes of the paired on/off variants."""
    rows = []
    for r in b.rows:
        g = groups[(r.layout, b.concurrency)]
        options = variant_options(r.layout)
        rows.append([r.layout, options.get("aio", "off"), "off" if options.get("open_file_cache", "off") in
                     ("off", "0") else options["open_file_cache"], _s(g.extra.get("hot_p99_ms"), "ms"),
                     _s(g.extra.get("hot_p50_ms"), "ms"), _s(g.extra.get("hot_rps")), _s(g.rps),
                     _s(g.latency["p99"], "ms"), str(g.errors + r.hot_errors), disk_text(g, r.touched)])
    notes = []
    for x in b.pairs:
        where = without(x.on, x.key).partition("@")[2]
        notes.append(f"hot-file p99 with {x.label}{f' ({where})' if where else ''}: {_x(x.hot)} "
                     f"({x.change} with {x.high if x.key == 'aio' else 'the cache'}); cold-file throughput: "
                     f"{_x(x.cold)}.")
    return (f"{b.concurrency} cold-file connections", ["layout", "aio", "open_file_cache", "hot p99", "hot p50",
                                                       "hot req/s", "cold req/s", "cold p99", "errors",
                                                       "disk touched"],
            rows, "<<<>>>>>><", notes)


# --------------------------------------------------------------------------- reuseport


def _ratio_text(x: float | None) -> str:
    return "n/a" if x is None else "∞" if math.isinf(x) else f"{x:.2f}"


def reuseport_section(results: Results, markdown: bool = False, summary: Summary | None = None) -> list[str]:
    sc = "reuseport"
    if sc not in results.scenarios:
        return []
    groups = _groups(results, sc)
    found = summary.nginx.reuseport if summary is not None else reuseport_blocks(results)
    blocks = [_reuseport_block(results, groups, b) for b in found]
    intro = ["One small cached file (nginx static) through many keep-alive connections, so nginx, not the app, is "
             "the work. wrk keeps its connections open, but nginx closes a keep-alive connection after 1000 requests "
             "(keepalive_requests), so wrk reconnects and accepts go on during the whole cell. Connections are "
             "counted per nginx worker while the load runs (the sample with the most; a connection being re-opened "
             "can be missed or counted twice), with each worker's CPU seconds over the cell. max/min: busiest "
             "worker / idlest (1.00 = even; ∞ = one worker held none), median over repeats."]
    return _emit("nginx: reuseport on vs off (accept spread across nginx workers)", intro, blocks, markdown)


def _reuseport_block(results: Results, groups: dict, b: ReuseportBlock) -> tuple:
    """One level of the reuseport section: a row per layout, the note of each on/off pair."""
    rows = []
    for r in b.rows:
        g = groups[(r.layout, b.concurrency)]
        cells = sorted(cells_by_repeat(results, "reuseport", r.layout, b.concurrency).values(), key=lambda c: c.repeat)
        conns = [c.extra.get("nginx_worker_conns") or [] for c in cells]
        rows.append([r.layout, variant_options(r.layout).get("reuseport", "off"), _s(g.rps),
                     _s(g.latency["p99"], "ms"), _s(g.latency["p999"], "ms"), str(g.errors),
                     "; ".join("/".join(str(n) for n in x) for x in conns if x) or "n/a",
                     _ratio_text(r.conns), _ratio_text(r.cpu)])
    notes = [f"reuseport on / off: p99 {_x(x.p99)}, throughput {_x(x.rps)}." for x in b.pairs]
    return (f"{b.concurrency} connections", ["layout", "reuseport", "req/s", "p99", "p99.9", "errors",
                                             "conns per nginx worker (per repeat)", "conn max/min", "CPU max/min"],
            rows, "<<>>>><>>", notes)


def nginx_lines(results: Results, markdown: bool = False, summary: Summary | None = None) -> list[str]:
    """Every nginx section this run has data for (none: an empty list)."""
    return (files_section(results, markdown, summary) + mixed_section(results, markdown, summary)
            + reuseport_section(results, markdown, summary))
