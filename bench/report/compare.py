"""The compare report (closed-loop cells): terminal tables, the article verdict, the layout
choice, a Markdown report; the nginx scenarios' sections come from ``bench.report.nginx``.

Every function here takes a ``Results`` (freshly measured or loaded from JSON) and RETURNS
lines; nothing prints, times or starts processes, so the same code renders a live run and a
replayed one, and tests can check the tables line by line. Printing is the CLI's job; writing
files is ``bench.report.exporters``'s.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.analysis import (
    GOAL_P99_SLACK,
    GOAL_RPS_OF_MAPPED,
    NOISY_SPREAD,
    TARGET_EFFICIENCY,
    TARGET_P99_RATIO,
    TARGET_RPS_RATIO,
    ClaimAtLevel,
    Group,
    Verdict,
    article_verdict,
    best_per_level,
    group_cells,
    layout_choice,
    steady_scenarios,
    warnings,
)
from bench.report import hosts, nginx
from bench.report.text import comment, fmt_stat, md_kv, md_table, num, plot_lines, pm, table, wrap
from bench.results import Results

ARTICLE = "article"
LATENCY_COLUMNS = (("p50", "p50"), ("p90", "p90"), ("p99", "p99"), ("p999", "p99.9"), ("max", "max"))

EFFICIENCY_NOTE = (
    "Efficiency = throughput / min(capacity bound, closed-loop bound), where the capacity bound is "
    "cores / CPU-seconds per request (uWSGI + nginx + wrk together) and the closed-loop bound is "
    "connections / the unloaded latency of a single request. 1.0 means the layout reached the tighter "
    "of the two bounds; well below 1.0 means requests waited on something other than CPU or the client."
)
NOISY_ADVICE = (
    f"spread (high - low) / median above {NOISY_SPREAD:.0%} across repeats: rerun with a longer "
    "--duration, more --repeats, or on a quieter machine before quoting these figures."
)


def _repeats(groups: list[Group]) -> int:
    return max((g.rps.n for g in groups), default=0)


def _level_name(results: Results, level: int) -> str:
    p = results.arguments.get("processes")
    if p and level == p:
        return " (P)"
    if p and level == 2 * p:
        return " (2P)"
    return ""


def _by_scenario(results: Results) -> dict[str, list[Group]]:
    return {sc: group_cells(results, sc) for sc in results.scenarios}


def _best_line(best: Group, groups: list[Group]) -> str:
    """``best at N connections: LAYOUT (...)``, with a caution when the runner-up is within noise."""
    text = (f"best at {best.concurrency} connections: {best.layout} "
            f"({num(best.rps.median)} req/s, p99 {num(best.latency['p99'].median)} ms)")
    others = [g for g in groups if g.concurrency == best.concurrency and g.layout != best.layout]
    if others:
        runner = max(others, key=lambda g: g.rps.median)
        if best.rps.n > 1 and runner.rps.high >= best.rps.low:
            text += f"; {runner.layout} is within noise (throughput ranges overlap)"
    return text


# --------------------------------------------------------------------------- verdict


@dataclass(frozen=True)
class _Check:
    label: str  # the target, as analysis names it, e.g. "throughput >= 1.25x shared"
    ok: bool
    measured: str
    miss: str  # how far a miss missed; "" when passed

    @property
    def result(self) -> str:
        return "pass" if self.ok else f"MISS ({self.miss})" if self.miss else "MISS"


def _by(d: float) -> str:
    return f"{d:.2f}" if abs(d) >= 0.01 else f"{d:.3f}"


def _checks(lv: ClaimAtLevel) -> list[_Check]:
    """The targets of one level with the measured values and, for a miss, by how much."""
    m, s = lv.mapped, lv.shared
    out = []
    for label, ok in lv.targets.items():
        if label.startswith("throughput"):
            measured = f"{lv.rps_ratio:.2f}x ({num(m.rps.median)} vs {num(s.rps.median)} req/s)"
            miss = f"short by {_by(TARGET_RPS_RATIO - lv.rps_ratio)}x"
        elif label.startswith("p99"):
            measured = (f"{lv.p99_ratio:.2f}x ({num(m.latency['p99'].median)} vs "
                        f"{num(s.latency['p99'].median)} ms)")
            miss = f"over by {_by(lv.p99_ratio - TARGET_P99_RATIO)}x"
        elif label.startswith("efficiency"):
            measured = f"{m.efficiency.median:.2f} ({m.layout})"
            miss = f"short by {_by(TARGET_EFFICIENCY - m.efficiency.median)}"
        elif "error" in label:
            measured = f"{m.errors + s.errors} (mapped {m.errors}, shared {s.errors})"
            miss = f"{m.errors + s.errors} failed requests"
        else:  # a target analysis added that this module does not know yet
            measured, miss = "", ""
        out.append(_Check(label, ok, measured, "" if ok else miss))
    return out


def _cautions(lv: ClaimAtLevel) -> list[str]:
    """Why a ratio may not be trusted: noisy figures, or ranges across repeats that overlap."""
    m, s = lv.mapped, lv.shared
    out = []
    for g in (m, s):
        if g.noisy_figures:
            out.append(f"{g.layout} is noisy here ({', '.join(g.noisy_figures)})")
    if m.rps.n > 1 and s.rps.n > 1 and m.rps.low <= s.rps.high and s.rps.low <= m.rps.high:
        out.append(f"throughput ranges overlap ({m.rps.low:.1f}–{m.rps.high:.1f} vs {s.rps.low:.1f}–{s.rps.high:.1f})")
    mp, sp = m.latency["p99"], s.latency["p99"]
    if mp.n > 1 and sp.n > 1 and mp.low <= sp.high and sp.low <= mp.high:
        out.append(f"p99 ranges overlap ({num(mp.low)}–{num(mp.high)} vs {num(sp.low)}–{num(sp.high)} ms)")
    return out


def _claim_text(lv: ClaimAtLevel) -> str:
    if lv.claim_holds:
        return "claim holds"
    why = []
    if lv.rps_ratio <= 1.0:
        why.append(f"throughput {lv.rps_ratio:.2f}x is not above 1")
    if lv.p99_ratio >= 1.0:
        why.append(f"p99 {lv.p99_ratio:.2f}x is not below 1")
    return "claim fails (" + ", ".join(why) + ")"


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _names(results: Results) -> tuple[str, str]:
    p, t = results.arguments.get("processes"), results.arguments.get("threads")
    return f"{p}x{t}-mapped", f"{p}x{t}-shared"


def _verdict(results: Results) -> Verdict:
    if ARTICLE not in results.scenarios:
        have = ", ".join(results.scenarios) or "none"
        return Verdict([], missing=f"this run has no '{ARTICLE}' scenario (scenarios: {have})")
    return article_verdict(results, ARTICLE)


CLAIM = ("The article's claim: one socket per worker with nginx least_conn beats one shared socket on "
         "throughput and p99 at P and 2P connections, P being the number of processes.")


def _outcome(v: Verdict) -> str:
    """"reproduced", "not reproduced" or "cannot be checked"."""
    if not v.levels:
        return "cannot be checked"
    return "reproduced" if v.reproduced else "not reproduced"


def _headline(results: Results, v: Verdict) -> str:
    """The verdict in plain sentences after the outcome word, with the ratios."""
    if not v.levels:
        return f"{v.missing[0].upper()}{v.missing[1:]}. {CLAIM}"
    mapped, shared = _names(results)
    n = _repeats([g for lv in v.levels for g in (lv.mapped, lv.shared)])
    if v.reproduced:
        where = _and([f"{lv.concurrency}{_level_name(results, lv.concurrency)}" for lv in v.levels])
        text = (f"{mapped} (one socket per worker + least_conn) beat {shared} (one shared socket) at {where} "
                f"connections: throughput {_and([f'{lv.rps_ratio:.2f}x' for lv in v.levels])}, p99 "
                f"{_and([f'{lv.p99_ratio:.2f}x' for lv in v.levels])} of {shared} (medians of {n} repeats).")
    else:
        failed = [lv for lv in v.levels if not lv.claim_holds]
        held = [lv for lv in v.levels if lv.claim_holds]
        text = "; ".join(
            f"at {lv.concurrency} connections {mapped} had {lv.rps_ratio:.2f}x the throughput and "
            f"{lv.p99_ratio:.2f}x the p99 of {shared}" for lv in failed)
        if text:
            text = text[0].upper() + text[1:] + f" (medians of {n} repeats)."
        if held:
            text += (" " if text else "") + (
                f"The claim held at {_and([str(lv.concurrency) for lv in held])} connections "
                f"({_and([f'{lv.rps_ratio:.2f}x' for lv in held])} throughput, "
                f"{_and([f'{lv.p99_ratio:.2f}x' for lv in held])} p99), but that is only part of the check.")
        text += f" {CLAIM}"
    if v.missing:
        text += f" Not checked: {v.missing}."
    if any(_cautions(lv) for lv in v.levels):
        text += " Some of these figures are noisy or overlap across repeats: see the cautions."
    return text


def _targets_summary(v: Verdict) -> str:
    checks = [(lv.concurrency, c) for lv in v.levels for c in _checks(lv)]
    missed = [(lvl, c) for lvl, c in checks if not c.ok]
    if not missed:
        return f"Targets: all {len(checks)} met at {_and([str(lv.concurrency) for lv in v.levels])} connections."
    return f"Targets: {len(checks) - len(missed)} of {len(checks)} met; missed: " + "; ".join(
        f"{c.label} at {lvl} connections ({c.measured.split(' (')[0]}, {c.miss})" for lvl, c in missed) + "."


def verdict_lines(results: Results) -> list[str]:
    """Whether the article's claim reproduced here, with the ratios at P and 2P and each target.

    Per level: mapped vs shared, "claim holds" or "claim fails (why)", then one row per target
    (throughput, p99, efficiency, errors) with the measured value and pass or MISS (by how much).
    """
    v = _verdict(results)
    out = wrap(f"Verdict: {_outcome(v)}. {_headline(results, v)}")
    if not v.levels:
        return out
    mapped, shared = _names(results)
    for lv in v.levels:
        out.append("")
        out.append(f"{mapped} vs {shared} at {lv.concurrency} connections"
                   f"{_level_name(results, lv.concurrency)}: {_claim_text(lv)}")
        rows = [[c.label, c.measured, c.result] for c in _checks(lv)]
        out.extend("  " + x for x in table(["target", "measured", "result"], rows, "<<<"))
        for caution in _cautions(lv):
            out.extend(wrap(f"caution: {caution}", indent="  "))
    out.append("")
    out.extend(wrap(_targets_summary(v)))
    return out


# --------------------------------------------------------------------------- terminal


def _terminal_table(groups: list[Group]) -> list[str]:
    headers = ["layout", "req/s", "p50", "p90", "p99", "p99.9", "max", "errors", "eff.",
               "worker\nCV", "CPU ms\n/req", "noisy"]
    rows = []
    for g in groups:
        rows.append([
            g.layout, pm(g.rps), num(g.latency["p50"].median), num(g.latency["p90"].median), pm(g.latency["p99"]),
            num(g.latency["p999"].median), num(g.latency["max"].median), str(g.errors),
            f"{g.efficiency.median:.2f}", f"{g.cv.median:.2f}", num(g.cpu_ms_per_request.median),
            " ".join(g.noisy_figures),
        ])
    out = table(headers, rows, "<>>>>>>>>>><")
    # The nginx scenarios' figures have their own section (bench.report.nginx).
    keys = sorted({k for g in groups if g.scenario not in nginx.NGINX_SCENARIOS for k in g.extra})
    if keys:
        out.append("")
        out.append("scenario figures (medians):")
        extra_rows = [[g.layout] + [pm(g.extra[k]) if k in g.extra else "" for k in keys] for g in groups]
        out.extend("  " + x for x in table(["layout", *keys], extra_rows, "<" + ">" * len(keys)))
    return out


def terminal_lines(results: Results) -> list[str]:
    """The plain-text report: per scenario and level a table, the best layout, then the verdict.

    Medians across repeats; "±" is half the low–high range as a percentage of the median;
    latencies in ms. Lines fit in 100 columns for layout names up to about 14 characters.
    """
    by_sc = _by_scenario(results)
    all_groups = [g for gs in by_sc.values() for g in gs]
    a = results.arguments
    out = [f"uWSGI layouts: {len(results.layouts)} layouts x {len(results.levels)} connection levels x "
           f"{_repeats(all_groups)} repeats"
           + (f", {a['duration']:g} s per cell" if isinstance(a.get("duration"), (int, float)) else "")
           + (f", {results.environment['nproc']} cores" if results.environment.get("nproc") else "")]
    if comment(results):
        out.extend(wrap(f"note: {comment(results)}"))
    if not results.cells:
        return out + ["no cells in this results file: nothing was measured."]
    out.extend(wrap("medians across repeats; ±: half the low–high range, % of the median; latency in ms; "
                     "eff.: throughput / min(capacity, closed-loop bound); worker CV: spread of requests across "
                     f"workers (0 = even); noisy: spread above {NOISY_SPREAD:.0%}", subsequent=""))
    for sc, groups in by_sc.items():
        out += ["", f"== scenario: {sc} =="]
        best = best_per_level(groups)
        for level in sorted({g.concurrency for g in groups}):
            at = [g for g in groups if g.concurrency == level]
            out += ["", f"{level} connections{_level_name(results, level)}"]
            out += _terminal_table(at)
            out += wrap(_best_line(best[level], at))
    out += nginx.nginx_lines(results)
    out += hosts.host_lines(results)
    out += choice_lines(results)
    if not nginx.only_nginx(results):  # the article's verdict needs the article's scenario
        out.append("")
        out.extend(verdict_lines(results))
    warns = warnings(results)
    if warns:
        out += ["", "warnings:"]
        for w in warns:
            out.extend(wrap(w, indent="  - ", subsequent="    "))
    return out


# --------------------------------------------------------------------------- choosing a layout


def choice_lines(results: Results, markdown: bool = False) -> list[str]:
    """Which layout to run across scenarios: each layout's worst healthy p99 relative to the
    best layout (per scenario, over levels), its steady-state throughput relative to the
    mapped layout, the stalled requests' p99, and whether it meets the goal. Only shown when
    the run has more than one scenario or a stall scenario."""
    stall = [sc for sc in results.scenarios if sc not in steady_scenarios(results)]
    if (len(results.scenarios) < 2 and not stall) or nginx.only_nginx(results):
        return []
    choices = layout_choice(results)
    p, t = results.arguments.get("processes"), results.arguments.get("threads")
    headers = (["layout"] + [f"p99/best {sc}" for sc in results.scenarios]
               + ["rps/mapped"] + [f"stalled p99 {sc}" for sc in stall] + ["goal"])
    rows = []
    for c in choices:
        ratios = [f"{c.p99_vs_best[sc]:.2f}x" if sc in c.p99_vs_best else "" for sc in results.scenarios]
        rows.append([c.layout] + ratios
                    + [f"{c.steady_rps_vs_mapped:.2f}x" if c.steady_rps_vs_mapped is not None else "n/a"]
                    + [num(c.stalled_p99_ms[sc]) if sc in c.stalled_p99_ms else "" for sc in stall]
                    + ["meets" if c.meets_goal else "no"])
    goal = (f"rps/mapped: steady-state throughput / {p}x{t}-mapped's; stalled p99 in ms. "
            f"Goal: healthy p99 within {GOAL_P99_SLACK - 1:.0%} of the best layout in every scenario and level, and "
            f"at least {GOAL_RPS_OF_MAPPED:.0%} of the mapped layout's steady-state throughput "
            "(worst level shown; medians of repeats).")
    winners = [c for c in choices if c.meets_goal]
    if winners:
        verdict = "Meets the goal: " + ", ".join(f"{c.layout} (worst p99 {c.worst_p99_ratio:.2f}x of the best, "
                                                 f"at {c.worst_where})" for c in winners) + "."
    elif choices:
        close = min(choices, key=lambda c: (c.worst_p99_ratio, -(c.steady_rps_vs_mapped or 0)))
        verdict = (f"No layout meets the goal here; closest: {close.layout}, whose worst healthy p99 is "
                   f"{close.worst_p99_ratio:.2f}x the best ({close.worst_where}).")
    else:
        verdict = "No layouts to compare."
    per_scenario = []
    for sc in results.scenarios:
        groups = [g for g in group_cells(results, sc)]
        if groups:
            worst_level = max(g.concurrency for g in groups)
            at = [g for g in groups if g.concurrency == worst_level]
            best = min(at, key=lambda g: g.latency["p99"].median)
            per_scenario.append(f"{sc}: lowest healthy p99 at {worst_level} connections is {best.layout} "
                                f"({num(best.latency['p99'].median)} ms, {num(best.rps.median)} req/s)")
    if markdown:
        return (["## Choosing a layout: steady state and stalls", "", goal, ""] + md_table(headers, rows)
                + ["", f"**{verdict}**", ""] + [f"- {x}" for x in per_scenario] + [""])
    out = ["", "choosing a layout (steady state and stalls):"]
    out += wrap(goal, indent="  ", subsequent="  ")
    out += ["  " + x for x in table(headers, rows, "<" + ">" * (len(headers) - 1))]
    out += wrap(verdict, indent="  ", subsequent="  ")
    for x in per_scenario:
        out += wrap(x, indent="  - ", subsequent="    ")
    return out


# --------------------------------------------------------------------------- markdown


def _md_verdict(results: Results) -> list[str]:
    v = _verdict(results)
    out = ["## Verdict", "", f"**{_outcome(v).capitalize()}.** {_headline(results, v)}"]
    if not v.levels:
        return out + [""]
    out += ["", _targets_summary(v), ""]
    mapped, shared = _names(results)
    headers = ["connections", "claim"] + [c.label for c in _checks(v.levels[0])]
    rows = []
    for lv in v.levels:
        rows.append([f"{lv.concurrency}{_level_name(results, lv.concurrency)}", _claim_text(lv)]
                    + [f"{c.measured}: {'pass' if c.ok else '**' + c.result + '**'}" for c in _checks(lv)])
    out += [f"{mapped} vs {shared}, medians across repeats:", ""] + md_table(headers, rows) + [""]
    cautions = [f"at {lv.concurrency} connections: {c}" for lv in v.levels for c in _cautions(lv)]
    if cautions:
        out += ["Cautions:", ""] + [f"- {c}" for c in cautions] + [""]
    return out


def _md_reproduce(results: Results) -> list[str]:
    out = ["## How to reproduce", ""]
    command = results.arguments.get("command")
    if command:
        out += ["The run was made with:", "", "```sh", str(command), "```", ""]
    else:
        out += ["The run did not record its command line.", ""]
    out += ["This report was rendered from the stored results JSON only; re-render it (nothing is re-run) with "
            "`python -m bench report <results.json>`.", ""]
    return out


def _md_level_table(groups: list[Group], best: Group | None) -> list[str]:
    keys = sorted({k for g in groups for k in g.extra})
    headers = ["layout", "req/s", "p50 ms", "p90 ms", "p99 ms", "p99.9 ms", "max ms", "errors", "efficiency",
               "worker CV", "CPU ms/req", *keys, "noisy"]
    rows = []
    for g in groups:
        name = f"**{g.layout}**" if best is not None and g.layout == best.layout else g.layout
        rows.append([
            name, fmt_stat(g.rps), *(fmt_stat(g.latency[p], digits=None) for p, _ in LATENCY_COLUMNS),
            f"{g.errors} of {g.requests}" if g.errors else "0", fmt_stat(g.efficiency, digits=2),
            fmt_stat(g.cv, digits=2, mark_noisy=False), fmt_stat(g.cpu_ms_per_request, digits=None),
            *(fmt_stat(g.extra[k], digits=None) if k in g.extra else "" for k in keys),
            "⚠ " + ", ".join("req/s" if f == "rps" else f for f in g.noisy_figures) if g.noisy_figures else "",
        ])
    return md_table(headers, rows, "<" + ">" * (len(headers) - 2) + "<")


def _md_results(results: Results, by_sc: dict[str, list[Group]]) -> list[str]:
    out = ["## Results", "",
           "Each figure is the median across repeats with the low–high range in parentheses; `~` marks a figure "
           f"whose spread (high − low) / median is above {NOISY_SPREAD:.0%}. Latencies are in ms; errors are "
           "summed over repeats. The best layout per level is in bold.", "", EFFICIENCY_NOTE, ""]
    for sc, groups in by_sc.items():
        out += [f"### Scenario: {sc}", ""]
        best = best_per_level(groups)
        for level in sorted({g.concurrency for g in groups}):
            at = [g for g in groups if g.concurrency == level]
            out += [f"#### {level} connections{_level_name(results, level)}", ""]
            out += _md_level_table(at, best.get(level)) + [""]
            best_text = _best_line(best[level], at)
            out += [best_text[0].upper() + best_text[1:] + ".", ""]
            noisy = [g.layout for g in at if g.noisy_figures]
            if noisy:
                out += [f"> ⚠ Noisy: {', '.join(noisy)}: {NOISY_ADVICE}", ""]
    return out


def _md_shares(results: Results, by_sc: dict[str, list[Group]]) -> list[str]:
    out = ["## Per-worker shares", "",
           "Share of requests each uWSGI worker served (worker 1 / worker 2 / ...), pooled over repeats. An even "
           "split is 1 / workers each; the article's problem is a skewed split on one shared socket, where one "
           "process takes several requests while the others idle. max/min is the busiest worker's count over the "
           "idlest one's (1.00 = even).", ""]
    for sc, groups in by_sc.items():
        levels = sorted({g.concurrency for g in groups})
        rows = []
        for layout in dict.fromkeys(g.layout for g in groups):
            at = {g.concurrency: g for g in groups if g.layout == layout}
            workers = max((len(g.worker_share) for g in at.values()), default=0)
            if not workers:
                continue
            row = [layout, str(workers), f"{1 / workers:.0%}"]
            for level in levels:
                g = at.get(level)
                if g is None or not g.worker_share:
                    row.append("")
                    continue
                shares = list(g.worker_share.values())
                ratio = f"{max(shares) / min(shares):.2f}" if min(shares) else "∞"
                row.append(" / ".join(f"{s:.0%}" for s in shares) + f" (max/min {ratio})")
            rows.append(row)
        if len(by_sc) > 1:
            out += [f"Scenario {sc}:", ""]
        if not rows:
            out += ["No per-worker counts were recorded.", ""]
            continue
        out += md_table(["layout", "workers", "even split", *(f"{x} connections" for x in levels)], rows,
                         "<>>" + "<" * len(levels)) + [""]
    return out


def markdown_lines(results: Results, plot_files: list[str]) -> list[str]:
    """The Markdown report: verdict first, how to reproduce, environment, workload, per-level
    tables (median and low–high for every figure, noisy cells flagged), best layout per level,
    per-worker shares, warnings, and the plots (``plot_files``, relative to the report) embedded.
    """
    by_sc = _by_scenario(results)
    out = ["# nginx + uWSGI layout benchmark", ""]
    meta = [f"Results created {results.created}" if results.created else "Results creation time not recorded",
            f"scenarios: {', '.join(results.scenarios) or 'none'}",
            f"layouts: {', '.join(results.layouts) or 'none'}",
            f"connections: {', '.join(map(str, results.levels)) or 'none'}"]
    out += ["; ".join(meta) + ".", ""]
    if comment(results):
        out += [f"> **Note:** {comment(results)}", ""]
    if not nginx.only_nginx(results):
        out += _md_verdict(results)
    out += nginx.nginx_lines(results, markdown=True)
    out += hosts.host_lines(results, markdown=True)
    out += choice_lines(results, markdown=True)
    out += _md_reproduce(results)
    out += md_kv("Environment", results.environment)
    out += md_kv("Workload", results.workload)
    out += md_kv("Arguments", results.arguments, skip=("command",))
    if results.cells:
        out += _md_results(results, by_sc)
        out += _md_shares(results, by_sc)
    else:
        out += ["## Results", "", "No cells in this results file: nothing was measured.", ""]
    warns = warnings(results)
    out += ["## Warnings", ""] + ([f"- {w}" for w in warns] if warns else ["None."]) + [""]
    return out + plot_lines(plot_files)
