"""PNG plots of a stored run, made from ``Results`` only (never by re-running anything).

``PLOTS`` maps a results kind to its plots (file stem -> function); a kind may have none
(faults). Each ``plot_*`` function takes a ``Results`` and a target path (and the run's summary,
for those that draw what it concluded: ``DRAWN_FROM_SUMMARY``) and returns the paths it wrote.
Compare's plots write one file when the run has one scenario, else one per scenario with the
scenario as a file-name suffix (``throughput.png`` -> ``throughput-article.png``,
``throughput-stall.png``). ``plot_file_names`` predicts the names without drawing, so the
Markdown report can link them. Files are written atomically (temp file + rename) and every
figure is closed.
"""

from __future__ import annotations

import io
import re
import statistics
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # before pyplot: no display needed, and the same output everywhere

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FixedLocator, NullLocator  # noqa: E402

from uwsgi_layouts.bench.analysis import (  # noqa: E402
    MEMORY_KEY,
    MIN_RATE_OF_TARGET,
    NOISY_SPREAD,
    Group,
    Stat,
    group_cells,
)
from uwsgi_layouts.bench.report import AnySummary, judged  # noqa: E402
from uwsgi_layouts.bench.report.limits import LimitFigures, has_limits, limit_figures  # noqa: E402
from uwsgi_layouts.bench.results import Results  # noqa: E402
from uwsgi_layouts.bench.summary import Summary  # noqa: E402
from uwsgi_layouts.bench.tune.summary import TuneSummary  # noqa: E402
from uwsgi_layouts.files import write_atomic  # noqa: E402

FIGSIZE = (9, 5.5)
DPI = 110
MARKERS = "osD^vP*Xhp<>"
# Layout of a figure, not a verdict: the worker-share plot writes each bar's share above it only up to
# this many bars (more would overlap), and gives its legend a second column past this many workers.
LABELLED_BARS = 32
LEGEND_COLUMN_ROWS = 4


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "scenario"


def scenario_paths(results: Results, path: Path | str) -> list[tuple[str, Path]]:
    """(scenario, output path) pairs: ``path`` itself for one scenario, suffixed paths for several."""
    path = Path(path)
    scenarios = results.scenarios
    if len(scenarios) <= 1:
        return [(sc, path) for sc in scenarios]
    return [(sc, path.with_name(f"{path.stem}-{_slug(sc)}{path.suffix}")) for sc in scenarios]


def _save(fig, path: Path) -> Path:
    """Write the figure as PNG atomically: a crash never leaves half an image under ``path``."""
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=DPI, bbox_inches="tight")
    return write_atomic(path, png.getvalue())


def _processes(results: Results) -> int | None:
    p = results.arguments.get("processes")
    return p if isinstance(p, int) and p > 0 else None


def _repeats(groups: list[Group]) -> int:
    return max((g.rps.n for g in groups), default=0)


def _line_plot(results: Results, path: Path | str, summary: Summary, *, figure: str, value: Callable[[Group], Stat],
               ylabel: str, what: str) -> list[Path]:
    """Median vs concurrency per layout, low–high error bars, the points the summary found noisy
    (``GroupRow.noisy`` holds ``figure``) circled."""
    noisy_at = {(r.scenario, r.layout, r.concurrency) for r in summary.groups if figure in r.noisy}
    written = []
    for sc, out in scenario_paths(results, path):
        groups = group_cells(results, sc)
        layouts = list(dict.fromkeys(g.layout for g in groups))
        levels = sorted({g.concurrency for g in groups})
        fig, ax = plt.subplots(figsize=FIGSIZE)
        try:
            noisy_label = f"noisy (spread > {NOISY_SPREAD:.0%})"
            for i, layout in enumerate(layouts):
                gs = sorted((g for g in groups if g.layout == layout), key=lambda g: g.concurrency)
                # Nudge layouts apart on the log axis so their error bars do not hide each other.
                dodge = 2 ** ((i - (len(layouts) - 1) / 2) * 0.025)
                xs = [g.concurrency * dodge for g in gs]
                stats = [value(g) for g in gs]
                ys = [s.median for s in stats]
                yerr = [[s.median - s.low for s in stats], [s.high - s.median for s in stats]]
                ax.errorbar(xs, ys, yerr=yerr, label=layout, marker=MARKERS[i % len(MARKERS)], markersize=6,
                            capsize=4, linewidth=1.6, linestyle="-" if "mapped" in layout else "--")
                noisy = [(x, s.median) for x, s, g in zip(xs, stats, gs, strict=True)
                         if (g.scenario, g.layout, g.concurrency) in noisy_at]
                if noisy:
                    ax.scatter(*zip(*noisy, strict=True), s=260, facecolors="none", edgecolors="red", linewidths=1.5,
                               label=noisy_label, zorder=5)
                    noisy_label = "_nolegend_"
            p = _processes(results)
            for level, name in ((p, "P"), (2 * p if p else None, "2P")):
                if level in levels:
                    ax.axvline(level, color="grey", linestyle=":", linewidth=1)
                    ax.annotate(f"{name} = {level}", (level, 1), xycoords=("data", "axes fraction"),
                                xytext=(3, -12), textcoords="offset points", color="grey", fontsize=8)
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_locator(FixedLocator(levels))
            ax.xaxis.set_minor_locator(NullLocator())
            ax.set_xticklabels([str(x) for x in levels])
            if levels:
                ax.set_xlim(levels[0] / 1.3, levels[-1] * 1.3)
            ax.set_ylim(bottom=0)
            ax.set_xlabel("concurrent connections (wrk -c)")
            ax.set_ylabel(ylabel)
            ax.set_title(f"{what} vs connections, scenario '{sc}'\n"
                         f"median of {_repeats(groups)} repeats; error bars: lowest to highest repeat",
                         fontsize=11)
            ax.grid(True, alpha=0.3)
            handles, labels = ax.get_legend_handles_labels()
            order = sorted(range(len(labels)), key=lambda k: labels[k].startswith("noisy"))  # noisy marker last
            ax.legend([handles[k] for k in order], [labels[k] for k in order], title="layout", fontsize=9, loc="best")
            written.append(_save(fig, out))
        finally:
            plt.close(fig)
    return written


def plot_throughput(results: Results, path: Path | str, summary: Summary) -> list[Path]:
    """Requests per second vs connections, one line per layout."""
    return _line_plot(results, path, summary, figure="rps", value=lambda g: g.rps, ylabel="throughput (requests/s)",
                      what="Throughput")


def plot_p99(results: Results, path: Path | str, summary: Summary) -> list[Path]:
    """99th-percentile latency vs connections, one line per layout."""
    return _line_plot(results, path, summary, figure="p99", value=lambda g: g.latency["p99"],
                      ylabel="p99 latency (ms)", what="p99 latency")


def share_level(results: Results, groups: list[Group], level: int | None = None) -> int | None:
    """The level the worker-share plot shows: ``level`` if given, else 2P if measured, else the highest."""
    levels = sorted({g.concurrency for g in groups})
    if not levels:
        return None
    if level is not None:
        if level not in levels:
            raise ValueError(f"level {level} was not measured (levels: {levels})")
        return level
    p = _processes(results)
    return 2 * p if p and 2 * p in levels else levels[-1]


def plot_worker_share(results: Results, path: Path | str, level: int | None = None) -> list[Path]:
    """Per layout, the share of requests each worker served at one level (grouped bars): uWSGI's
    stats server counts them, a peer's answers are counted by the app's X-Worker-Pid header.

    The dashed line over each group is the even split (1 / workers), the ideal.
    """
    written = []
    for sc, out in scenario_paths(results, path):
        groups = group_cells(results, sc)
        lvl = share_level(results, groups, level)
        at = [g for g in groups if g.concurrency == lvl and g.worker_share]
        fig, ax = plt.subplots(figsize=FIGSIZE)
        try:
            seen_workers: set[str] = set()
            even_label = "even split (ideal)"
            n_bars = sum(len(g.worker_share) for g in at)
            for i, g in enumerate(at):
                shares = list(g.worker_share.items())
                width = 0.8 / len(shares)
                for j, (worker, share) in enumerate(shares):
                    x = i - 0.4 + (j + 0.5) * width
                    color = f"C{(int(worker) - 1) % 10}" if worker.isdigit() else "grey"
                    label = f"worker {worker}" if worker not in seen_workers else "_nolegend_"
                    seen_workers.add(worker)
                    ax.bar(x, 100 * share, width=width * 0.9, color=color, label=label)
                    if n_bars <= LABELLED_BARS:
                        ax.annotate(f"{share:.0%}", (x, 100 * share), xytext=(0, 2), textcoords="offset points",
                                    ha="center", va="bottom", fontsize=8)
                ax.hlines(100 / len(shares), i - 0.45, i + 0.45, colors="black", linestyles="--", linewidth=1.2,
                          label=even_label, zorder=4)
                even_label = "_nolegend_"
            ax.set_xticks(range(len(at)))
            ax.set_xticklabels([g.layout for g in at])
            ax.set_xlim(-0.6, max(len(at), 1) - 0.4)
            ax.set_ylim(0, 112)
            ax.set_xlabel("layout")
            ax.set_ylabel("share of requests served (%)")
            ax.set_title(f"Requests served per worker at {lvl} connections, scenario '{sc}'\n"
                         f"pooled over {_repeats(at)} repeats; dashed: even split", fontsize=11)
            ax.grid(True, axis="y", alpha=0.3)
            if at:
                ax.legend(fontsize=9, loc="upper right", ncol=2 if len(seen_workers) > LEGEND_COLUMN_ROWS else 1)
            else:
                ax.text(0.5, 0.5, "no per-worker counts recorded", ha="center", va="center", transform=ax.transAxes)
            written.append(_save(fig, out))
        finally:
            plt.close(fig)
    return written


def _inflight_level(results: Results, groups: list[Group]) -> int | None:
    """2P if sampled there, else the highest level with in-flight samples."""
    levels = sorted({g.concurrency for g in groups if g.inflight})
    if not levels:
        return None
    p = _processes(results)
    return 2 * p if p and 2 * p in levels else levels[-1]


def has_inflight(results: Results, scenario: str) -> bool:
    return any(c.inflight for c in results.cells if c.scenario == scenario)


def plot_inflight(results: Results, path: Path | str) -> list[Path]:
    """The mechanism, per scenario with in-flight samples, in three panels: (1) at 2P, each
    worker's share of time at 0, 1, ... requests in flight, one stacked bar per worker and layout;
    (2) the pile-up share vs connections per layout (low–high over repeats); (3) the p99 vs
    connections (pooled with its bootstrap interval when the cells hold histograms, else the
    median with the repeats' range). Layouts that pile up should show the longer tail."""
    written = []
    for sc, out in scenario_paths(results, path):
        if not has_inflight(results, sc):
            continue
        groups = group_cells(results, sc)
        layouts = list(dict.fromkeys(g.layout for g in groups))
        level = _inflight_level(results, groups)
        fig, (ax_dist, ax_pile, ax_p99) = plt.subplots(1, 3, figsize=(16, 5.5),
                                                       gridspec_kw={"width_ratios": [1.3, 1, 1]})
        try:
            at = [g for g in groups if g.concurrency == level and g.inflight]
            threads = max((g.inflight.threads for g in at), default=1)
            cmap = plt.get_cmap("viridis", threads + 1)
            x, ticks, labels = 0.0, [], []
            for g in at:
                for w, shares in g.inflight.shares.items():
                    bottom = 0.0
                    for n in range(threads + 1):
                        share = 100 * shares.get(str(n), 0.0)
                        ax_dist.bar(x, share, bottom=bottom, width=0.8, color=cmap(n),
                                    label=f"{n} in flight" if x == 0 else "_nolegend_")
                        bottom += share
                    ticks.append(x)
                    labels.append(f"w{w}")
                    x += 1
                pile = g.inflight.pileup
                ax_dist.annotate(f"{g.layout}\npile-up {'n/a' if pile is None else f'{pile.median:.0%}'}",
                                 (x - 1 - (len(g.inflight.shares) - 1) / 2, 101), ha="center", va="bottom", fontsize=8,
                                 annotation_clip=False)
                x += 0.6
            ax_dist.set_xticks(ticks)
            ax_dist.set_xticklabels(labels, fontsize=8)
            ax_dist.set_ylim(0, 100)
            ax_dist.set_ylabel("share of time (%)")
            ax_dist.set_title(f"requests in flight per worker at {level} connections\n\n", fontsize=10)
            ax_dist.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.07), ncol=threads + 1)
            for i, layout in enumerate(layouts):
                gs = sorted((g for g in groups if g.layout == layout and g.inflight and g.inflight.pileup),
                            key=lambda g: g.concurrency)
                if gs:
                    stats = [g.inflight.pileup for g in gs]
                    ax_pile.errorbar([g.concurrency for g in gs], [100 * s.median for s in stats],
                                     yerr=[[100 * (s.median - s.low) for s in stats],
                                           [100 * (s.high - s.median) for s in stats]],
                                     marker=MARKERS[i % len(MARKERS)], capsize=4, label=layout, color=f"C{i % 10}",
                                     linestyle="-" if "mapped" in layout else "--")
                gs = sorted((g for g in groups if g.layout == layout), key=lambda g: g.concurrency)
                p99 = [g.tails.p99 for g in gs]
                ax_p99.errorbar([g.concurrency for g in gs], [i.value for i in p99],
                                yerr=[[i.value - i.low for i in p99], [i.high - i.value for i in p99]],
                                marker=MARKERS[i % len(MARKERS)], capsize=4, label=layout, color=f"C{i % 10}",
                                linestyle="-" if "mapped" in layout else "--")
            levels = sorted({g.concurrency for g in groups})
            for ax in (ax_pile, ax_p99):
                ax.set_xscale("log", base=2)
                ax.xaxis.set_major_locator(FixedLocator(levels))
                ax.xaxis.set_minor_locator(NullLocator())
                ax.set_xticklabels([str(v) for v in levels])
                ax.set_xlabel("concurrent connections (wrk -c)")
                ax.set_ylim(bottom=0)
                ax.grid(True, alpha=0.3)
                ax.legend(fontsize=8, loc="best")
            ax_pile.set_ylim(0, 100)
            ax_pile.set_ylabel("pile-up: share of time (%)")
            ax_pile.set_title("a worker held 2+ requests more than another\n(low–high over repeats)", fontsize=10)
            pooled = all(g.tails.pooled for g in groups)
            ax_p99.set_ylabel("p99 latency (ms)")
            ax_p99.set_title("p99, pooled over repeats\n(95% bootstrap interval)" if pooled else
                             "p99, median of repeats (no histograms)\n(low–high over repeats)", fontsize=10)
            fig.suptitle(f"Requests in flight per uWSGI worker, and the tail, scenario '{sc}' "
                         f"(median of {_repeats(groups)} repeats)", fontsize=11)
            fig.tight_layout()
            written.append(_save(fig, out))
        finally:
            plt.close(fig)
    return written


def plot_memory(results: Results, path: Path | str) -> list[Path]:
    """Throughput against the app server tree's PSS after load: one point per layout and level
    (medians of repeats, low–high bars both ways), the levels of a layout joined. Up and to the
    left is better: more requests per second for less memory. Nothing when no cell has memory."""
    if not any(c.memory for c in results.cells):
        return []
    written = []
    for sc, out in scenario_paths(results, path):
        groups = [g for g in group_cells(results, sc) if MEMORY_KEY in g.memory]
        with _figure() as (fig, ax):
            for i, layout in enumerate(dict.fromkeys(g.layout for g in groups)):
                gs = sorted((g for g in groups if g.layout == layout), key=lambda g: g.concurrency)
                mem = [g.memory[MEMORY_KEY] for g in gs]
                xs, ys = [m.median for m in mem], [g.rps.median for g in gs]
                _joined(ax, i, layout, [g.concurrency for g in gs], xs, ys,
                        xerr=[[m.median - m.low for m in mem], [m.high - m.median for m in mem]],
                        yerr=[[g.rps.median - g.rps.low for g in gs], [g.rps.high - g.rps.median for g in gs]])
            if groups:  # room for the labels beside the outermost points
                ax.set_xlim(0, max(g.memory[MEMORY_KEY].high for g in groups) * 1.15)
                ax.set_ylim(0, max(g.rps.high for g in groups) * 1.12)
            written.append(_labelled(fig, ax, out, "app server tree PSS after load (MB: master + workers, shared "
                                     "pages counted once)", "throughput (requests/s)",
                                     f"Throughput vs memory per layout, scenario '{sc}'", _repeats(groups),
                                     bool(groups)))
    return written


@contextmanager
def _figure():
    """A figure of one axes, closed however the block ends (pyplot keeps every open figure)."""
    fig, ax = plt.subplots(figsize=FIGSIZE)
    try:
        yield fig, ax
    finally:
        plt.close(fig)


def _joined(ax, i: int, layout: str, levels: list[int], xs: list, ys: list, xerr: list, yerr: list) -> None:
    """One layout's points, its levels joined, with low–high bars both ways and each point labelled
    with its level (``c=N``)."""
    ax.errorbar(xs, ys, xerr=xerr, yerr=yerr, label=layout, marker=MARKERS[i % len(MARKERS)], markersize=7, capsize=3,
                linewidth=1, linestyle=":")
    for level, x, y in zip(levels, xs, ys, strict=True):
        ax.annotate(f"c={level}", (x, y), xytext=(5, 4), textcoords="offset points", fontsize=8)


def _labelled(fig, ax, out: Path, xlabel: str, ylabel: str, title: str, repeats: int, legend: bool) -> Path:
    """A per-layout scatter of medians, labelled and saved."""
    return _finish(fig, ax, out, xlabel, ylabel,
                   f"{title}\nmedian of {repeats} repeats per point (c = connections); bars: lowest to highest repeat",
                   {"title": "layout", "fontsize": 9, "loc": "best"} if legend else None)


def _finish(fig, ax, out: Path, xlabel: str, ylabel: str, title: str, legend: dict | None) -> Path:
    """What a plot of one axes ends with: its labels, title, grid and legend (``legend``: its
    options; None: no legend), then the PNG written."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=11)
    ax.grid(True, alpha=0.3)
    if legend is not None:
        ax.legend(**legend)
    return _save(fig, out)


def plot_throttling(results: Results, path: Path | str) -> list[Path]:
    """Under a CPU limit: p99 against the share of CFS periods in which the app server was
    throttled, one point per layout and level (medians of repeats, low–high bars both ways), the
    levels of a layout joined. Nothing when no cell had a limit."""
    if not has_limits(results):
        return []
    written = []
    for sc, out in scenario_paths(results, path):
        figures = [f for f in limit_figures(results, sc) if f.throttled_share]
        with _figure() as (fig, ax):
            for i, layout in enumerate(dict.fromkeys(f.layout for f in figures)):
                fs = sorted((f for f in figures if f.layout == layout), key=lambda f: f.concurrency)
                xs = [100 * statistics.median(f.throttled_share) for f in fs]
                ys = [statistics.median(f.p99_ms) for f in fs]
                _joined(ax, i, layout, [f.concurrency for f in fs], xs, ys,
                        xerr=[[x - 100 * min(f.throttled_share) for f, x in zip(fs, xs, strict=True)],
                              [100 * max(f.throttled_share) - x for f, x in zip(fs, xs, strict=True)]],
                        yerr=[[y - min(f.p99_ms) for f, y in zip(fs, ys, strict=True)],
                              [max(f.p99_ms) - y for f, y in zip(fs, ys, strict=True)]])
            ax.set_xlim(0, 105)
            ax.set_ylim(bottom=0)
            written.append(_labelled(fig, ax, out, "throttled share (% of CFS periods in which the app server used "
                                     "up its quota)", "p99 latency (ms)",
                                     f"p99 vs CPU throttling per layout, scenario '{sc}'", _repeats_of(figures),
                                     bool(figures)))
    return written


def _repeats_of(figures: list[LimitFigures]) -> int:
    return max((len(f.rps) for f in figures), default=0)


def plot_reply_rate(results: Results, path: Path | str) -> list[Path]:
    """Open loop: the reply rate httperf saw at each offered rate (min to max of its 5-s samples,
    the steady minimum marked), against the offered rate itself; the knee circled."""
    steps = sorted(results.steps, key=lambda s: s.rate)
    if not steps:
        return []
    fig, ax = plt.subplots(figsize=FIGSIZE)
    try:
        rates = [s.rate for s in steps]
        top = max(rates + [s.reply_rate["max"] for s in steps]) * 1.1
        ax.plot([0, top], [0, top], color="grey", linestyle=":", linewidth=1, label="replies = offered rate")
        ax.plot([0, top], [0, top * MIN_RATE_OF_TARGET], color="grey", linestyle="--", linewidth=1,
                label=f"{MIN_RATE_OF_TARGET:.0%} of the offered rate (pass line)")
        avg = [s.reply_rate["avg"] for s in steps]
        yerr = [[a - s.reply_rate["min"] for a, s in zip(avg, steps, strict=True)],
                [s.reply_rate["max"] - a for a, s in zip(avg, steps, strict=True)]]
        ax.errorbar(rates, avg, yerr=yerr, marker="o", capsize=4, linewidth=1.6, label="reply rate (avg, min–max)")
        for verdict, marker, color in (("pass", "^", "C2"), ("fail", "v", "C3"), ("invalid", "x", "C7")):
            chosen = [s for s in steps if s.verdict == verdict]
            if chosen:
                ax.scatter([s.rate for s in chosen], [s.steady_min for s in chosen], marker=marker,
                           color=color, s=60, zorder=5, label=f"steady min: {verdict}")
        knee = results.knee
        if knee["rate"] is not None:
            ax.axvline(knee["rate"], color="C2", linestyle=":", linewidth=1)
            ax.annotate(f"knee {knee['rate']:g}/s", (knee["rate"], 0), xycoords=("data", "axes fraction"),
                        xytext=(3, 5), textcoords="offset points", color="C2", fontsize=9)
        ax.set_xlim(0, top)
        ax.set_ylim(0, top)
        return [_finish(fig, ax, Path(path), "offered rate (new connections/s, one request each)",
                        "reply rate (replies/s)",
                        f"Open loop: replies vs offered rate, {results.arguments.get('layout', '')}\n"
                        "httperf, one point per step", {"fontsize": 9, "loc": "upper left"})]
    finally:
        plt.close(fig)


def plot_tune(results: Results, path: Path | str, summary: TuneSummary) -> list[Path]:
    """Tune: p99 against throughput for every measured candidate (pooled over its cells, bars: the
    p99's 95% interval and the throughput's low–high range), marker area proportional to the app
    server's memory; the chosen one starred, the p99 limit dashed. Up-left is better. Drawn
    from the run's summary."""
    evals = list(summary.candidates)
    if not evals:
        return []
    fig, ax = plt.subplots(figsize=FIGSIZE)
    try:
        memory = [e.memory_mb or 0.0 for e in evals]
        top = max(memory) or 1.0
        chosen = summary.choice.chosen
        for stage in (1, 2, 3):
            mine = [e for e in evals if e.reached == stage]
            if not mine:
                continue
            p99s = [e.tail.p99 for e in mine]
            xs, ys = [e.rps.value for e in mine], [p.value for p in p99s]
            ax.errorbar(xs, ys,
                        xerr=[[e.rps.value - e.rps.low for e in mine], [e.rps.high - e.rps.value for e in mine]],
                        yerr=[[p.value - p.low for p in p99s], [p.high - p.value for p in p99s]],
                        fmt="none", ecolor=f"C{stage - 1}", alpha=0.35, linewidth=1)
            ax.scatter(xs, ys, s=[40 + 360 * (e.memory_mb or 0.0) / top for e in mine], color=f"C{stage - 1}",
                       alpha=0.6, edgecolors="black", linewidths=0.5,
                       label=f"reached stage {stage} ({'screen narrow final'.split()[stage - 1]})")
            for e, x, y in zip(mine, xs, ys, strict=True):
                ax.annotate(e.spec, (x, y), xytext=(5, 4), textcoords="offset points", fontsize=7)
        if chosen:
            e = summary.candidate(chosen)
            ax.scatter([e.rps.value], [e.tail.p99.value], marker="*", s=420, color="gold", edgecolors="black",
                       zorder=5, label=f"chosen: {chosen}")
        limit = summary.objective.p99_ms
        if limit is not None:
            ax.axhline(limit, color="red", linestyle="--", linewidth=1, label=f"p99 limit {limit:g} ms")
        ax.set_xlim(left=0)
        ax.set_ylim(bottom=0)
        return [_finish(fig, ax, Path(path), "throughput (requests/s, median of the candidate's cells)",
                        "p99 latency (ms, pooled over its cells)",
                        f"Tune: p99 vs throughput at {summary.objective.concurrency} concurrent requests, "
                        f"scenario '{results.arguments.get('scenario')}'\nmarker area: memory (PSS, largest "
                        f"{top:.0f} MB); bars: p99 95% interval, throughput low–high",
                        {"fontsize": 8, "loc": "best"})]
    finally:
        plt.close(fig)


def plot_timeline(results: Results, path: Path | str) -> list[Path]:
    """Doctor's window: requests in flight per worker (stacked, with the thread count each worker
    has as a line) and the requests waiting in the listen queues (all sockets), over time."""
    d = results.diagnoses[0]
    tl = d.timeline
    if not tl.get("t"):
        return []
    fig, (ax_in, ax_q) = plt.subplots(2, 1, figsize=(FIGSIZE[0] * 1.3, FIGSIZE[1]), sharex=True,
                                      gridspec_kw={"height_ratios": [3, 1]})
    try:
        workers = sorted(tl["inflight"], key=int)
        ax_in.stackplot(tl["t"], *[tl["inflight"][w] for w in workers], labels=[f"worker {w}" for w in workers],
                        step="post", alpha=0.8)
        slots = d.layout["processes"] * d.layout["threads"]
        ax_in.axhline(slots, color="red", linestyle="--", linewidth=1, label=f"{slots} threads in all")
        ax_in.set_ylabel("requests in flight")
        pile = d.inflight.get("pileup")
        ax_in.set_title(f"{d.address}: {d.layout['processes']}x{d.layout['threads']} {d.layout['strategy']}, "
                        f"{d.observed_s:.0f} s at {d.hz:g} reads/s; pile-up {'n/a' if pile is None else f'{pile:.0%}'}"
                        f", every thread busy {d.inflight.get('saturated', 0.0):.0%}", fontsize=11)
        ax_in.legend(fontsize=8, loc="upper right", ncol=min(4, len(workers) + 1))
        ax_in.grid(True, alpha=0.3)
        ax_q.step(tl["t"], tl["queue"], where="post", color="black")
        ax_q.set_ylabel("in listen\nqueues")
        ax_q.set_xlabel("seconds into the window")
        ax_q.set_ylim(0, max(1, *tl["queue"]) * 1.1)
        ax_q.grid(True, alpha=0.3)
        return [_save(fig, Path(path))]
    finally:
        plt.close(fig)


# Results kind -> file stem -> plot function; the order is the order of the plots in the Markdown report.
PLOTS: dict[str, dict[str, Callable[..., list[Path]]]] = {
    "compare": {"throughput": plot_throughput, "p99": plot_p99, "worker-share": plot_worker_share,
                "inflight": plot_inflight, "memory": plot_memory, "throttling": plot_throttling},
    "openloop": {"reply-rate": plot_reply_rate},
    "faults": {},
    "tune": {"p99-throughput": plot_tune},
    "doctor": {"timeline": plot_timeline},
}
# Plots that take the run's summary as a third argument (what the run concluded, not judged again:
# tune's candidates, compare's noisy points).
DRAWN_FROM_SUMMARY = frozenset({plot_tune, plot_throughput, plot_p99})


def plot_file_names(results: Results) -> list[str]:
    """The file names ``plot_all`` writes for these results, without drawing anything."""
    stems = PLOTS.get(results.kind, {})
    if results.kind == "openloop":
        return [f"{stem}.png" for stem in stems] if results.steps else []
    if results.kind == "tune":
        return [f"{stem}.png" for stem in stems] if results.cells else []
    if results.kind == "doctor":
        return [f"{stem}.png" for stem in stems] if results.diagnoses and results.diagnoses[0].timeline else []
    stems = [stem for stem in stems if stem != "memory" or any(c.memory for c in results.cells)]
    stems = [stem for stem in stems if stem != "throttling" or has_limits(results)]
    return [p.name for stem in stems for sc, p in scenario_paths(results, Path(f"{stem}.png"))
            if stem != "inflight" or has_inflight(results, sc)]


def plot_all(results: Results, out_dir: Path | str, summary: AnySummary | None = None) -> list[Path]:
    """Every plot of this kind into ``out_dir``; returns the written paths in ``plot_file_names`` order.
    ``summary``: the run's judgements, for the kinds whose plots draw them (``DRAWN_FROM_SUMMARY``;
    given none, made once by ``judged``)."""
    out_dir = Path(out_dir)
    plots = PLOTS.get(results.kind, {})
    given = (judged(results, summary),) if DRAWN_FROM_SUMMARY & set(plots.values()) else ()
    return [p for stem, fn in plots.items()
            for p in fn(results, out_dir / f"{stem}.png", *(given if fn in DRAWN_FROM_SUMMARY else ()))]
