"""The compare report (closed-loop cells): terminal tables, pooled tails and requests in flight
(the mechanism, one sentence per scenario), the article verdict, the decisions, a Markdown
report; the layout choice's section comes from ``bench.report.choice``, the alternatives' from
``bench.report.peers``, the nginx scenarios' from ``bench.report.nginx`` and the app hosts' from
``bench.report.hosts``, each wording the summary's readings (``bench.readings``).

Every function here takes a ``Results`` (freshly measured or loaded from JSON) and its
``Summary`` (what the analysis decided, always given: ``bench.report.judged`` makes one for a
run stored without it) and RETURNS lines; nothing prints, times, starts processes or judges: the
verdict, decisions, best layouts, mechanism and warnings are the summary's, and sections built
once (``bench.report.views``) are written by the text and the Markdown view alike. Printing is
the CLI's job; writing files is ``bench.report.exporters``'s.
"""

from __future__ import annotations

from uwsgi_layouts.bench.analysis import (
    CONFIDENCE,
    MIN_SLOWER_REQUESTS,
    NOISY_SPREAD,
    SATURATED,
    EvenTotals,
    Group,
    Mechanism,
    group_cells,
    mechanism_of,
    unpaired_note,
)
from uwsgi_layouts.bench.paired import Direction
from uwsgi_layouts.bench.readings import only_nginx
from uwsgi_layouts.bench.report import hosts, nginx, peers
from uwsgi_layouts.bench.report.choice import choice_section
from uwsgi_layouts.bench.report.headline import claim_sentence, headline_markdown, level_sentence
from uwsgi_layouts.bench.report.levels import md_level_table, pileup, text_level_table
from uwsgi_layouts.bench.report.limits import limit_lines, limit_markdown
from uwsgi_layouts.bench.report.memory import memory_lines, memory_markdown
from uwsgi_layouts.bench.report.subject import (
    short_workload,
    status_text,
    subject_lines,
    subject_markdown,
)
from uwsgi_layouts.bench.report.text import (
    comment,
    fmt_interval,
    md_kv,
    md_table,
    num,
    pct,
    plot_lines,
    pm,
    quoted_p99,
    table,
    wrap,
)
from uwsgi_layouts.bench.report.views import (
    Gap,
    Grid,
    Items,
    Lead,
    MarkdownView,
    Note,
    Section,
    Sentences,
    TextView,
    written,
)
from uwsgi_layouts.bench.results import Results
from uwsgi_layouts.bench.summary import Best, Summary
from uwsgi_layouts.bench.verdict import Verdict, confidence_words

EFFICIENCY_NOTE = (
    "Efficiency = throughput / min(capacity bound, closed-loop bound), where the capacity bound is "
    "cores / CPU-seconds per request (the app server + nginx + wrk together) and the closed-loop bound is "
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


def _best_line(best: Best, groups: list[Group]) -> str:
    """``best at N connections: LAYOUT (...); against the runner-up ...``: the paired comparison
    with the next layout (``Summary.bests``)."""
    g = next(x for x in groups if x.layout == best.layout)
    text = (f"best at {best.concurrency} connections: {best.layout} "
            f"({num(g.rps.median)} req/s, p99 {quoted_p99(g, unit=' ms')})")
    if best.rps is not None:
        text += f"; against {best.runner_up}, throughput {best.rps.describe()}"
    return text


# --------------------------------------------------------------------------- verdict


def _target_rows(v: Verdict) -> tuple[tuple[str, ...], ...]:
    """One row per judgement (``Verdict.targets``): the table the verdict above is read from."""
    return tuple((f"{t.concurrency}" + (f" ({v.level_name(t.concurrency)})" if v.level_name(t.concurrency) else ""),
                  t.label + ("" if t.claim else " (check)"), t.measured, t.judged())
                 for t in v.targets)


TARGET_HEADERS = ("connections", "target", "measured", "judged")


def verdict_section(v: Verdict) -> Section:
    """The article's claim, judged target by target (``bench.verdict``): the outcome over both
    levels, each level's targets in words, the target table the words are read from, both paired
    comparisons per level and the cautions."""
    blocks: list = [Lead(claim_sentence(v), f" ({confidence_words(v)}.)" if v.levels else "")]
    if v.missing:
        blocks.append(Note(f"Not checked: {v.missing}."))
    if v.levels:
        blocks += [Items(tuple(level_sentence(v, lv) for lv in v.levels)), Gap(),
                   Grid(TARGET_HEADERS, _target_rows(v), "<<<<"),
                   Sentences(tuple(f"at {lv.concurrency} connections, paired by round: throughput "
                                   f"{lv.rps.describe()}; p99 {lv.p99.describe()}" for lv in v.levels))]
        cautions = tuple(f"at {lv.concurrency} connections: {c}" for lv in v.levels for c in lv.cautions)
        if cautions:
            blocks.append(Items(cautions, label="caution"))
    return Section("Verdict", tuple(blocks))


def verdict_lines(summary: Summary) -> list[str]:
    """The verdict section of ``summary``, text form (none for a run the verdict is not about:
    ``Summary.verdict`` is None)."""
    return [] if summary.verdict is None else TextView().lines(verdict_section(summary.verdict))


# --------------------------------------------------------------------------- the key comparisons


def decision_section(summary: Summary) -> Section | None:
    """The key comparisons (``Summary.decisions``): each with its paired outcomes, the rounds it
    took to settle (or that it stayed undecided), and, for a run measured until decided, how many
    rounds were added and why it stopped."""
    keys = summary.decisions
    if not keys:
        return None
    items = []
    for k in keys:
        figures = "; ".join(f"{'throughput' if c.figure == 'rps' else c.figure} {c.describe()}"
                            for c in k.comparisons)
        if k.settled:
            when = k.settled_after
            end = f"settled after {when} round{'s' if when != 1 else ''}"
            end += f", {k.rounds} measured" if k.rounds != when else ""
        else:
            end = f"still undecided after {k.rounds} round{'s' if k.rounds != 1 else ''}"
        thin = f"; its pooled p99s n/q (fewer than {MIN_SLOWER_REQUESTS} requests above)" if k.thin else ""
        items.append(f"{k.kind.label}: {k.name}: {figures} [{end}{thin}]")
    head = f"Decisions, paired by round ({summary.rule.words()})."
    ext = summary.extension
    if ext is not None and ext.budgeted:
        added = ext.added
        cells = f", cells of {ext.cell_s:g} s" if ext.cell_s else ""
        head += (f" Measured until decided within {ext.budget_min:g} min: "
                 + (f"{len(added)} round{'s' if len(added) != 1 else ''} added (rounds {added[0]}–{added[-1]}{cells})"
                    if added else "no round added") + f"; stopped: {ext.stop or 'interrupted'}.")
        if ext.tails or ext.tails_stop:  # the rounds for the verdict's tails, after the claim's looks
            head += (f" Then {len(ext.tails)} round{'s' if len(ext.tails) != 1 else ''} for the verdict's tails"
                     + (f" (rounds {ext.tails[0]}–{ext.tails[-1]})" if ext.tails else "")
                     + f": {ext.tails_stop or 'interrupted'}.")
    undecided = [k.name for k in keys if not k.settled]
    if undecided:
        head += f" Undecided: {len(undecided)} of {len(keys)}: measure more (a larger --budget or more --repeats)."
    return Section("Decisions", (Note(head), Items(tuple(items))))


# --------------------------------------------------------------------------- terminal


def _terminal_table(groups: list[Group]) -> list[str]:
    out = text_level_table(groups)
    detail = [f"{g.layout} {status_text(g.status)}" for g in groups if g.non_2xx]
    if detail:
        out += wrap("non-2xx answers (summed over repeats): " + "; ".join(detail))
    # The nginx scenarios' figures have their own section (bench.report.nginx).
    keys = sorted({k for g in groups if g.scenario not in nginx.NGINX_SCENARIOS for k in g.extra})
    if keys:
        out.append("")
        out.append("scenario figures (medians):")
        extra_rows = [[g.layout] + [pm(g.extra[k]) if k in g.extra else "" for k in keys] for g in groups]
        out.extend("  " + x for x in table(["layout", *keys], extra_rows, "<" + ">" * len(keys)))
    return out


# --------------------------------------------------------------------------- tails and in flight

TAILS_NOTE = (f"pooled: p50/p99 of the repeats' requests together ({CONFIDENCE:.0%} bootstrap interval: repeats, "
              "then requests, resampled); >p99: pooled requests slower than that p99 (! = fewer than "
              f"{MIN_SLOWER_REQUESTS}: the p99 would be the slowest few requests, so it is not quoted: n/q); "
              "pile-up: share of time some uWSGI worker held 2 or more requests in flight while another held at "
              "least 2 fewer (n/a: one worker or one thread each; blank: no stats server to sample, as for "
              "gunicorn and granian); full: share of time some worker had every thread busy")
PER_CELL_NOTE = ("tails are per-cell here: these cells carry no latency histograms (written before them, or "
                 "wrk's histogram walk was skipped), so p99 is the median of the repeats' own p99, each close "
                 "to its cell's slowest request")


def _has_tails_or_inflight(groups: list[Group]) -> bool:
    return any(g.tails.pooled or g.inflight for g in groups)


def _tails_rows(groups: list[Group]) -> list[list[str]]:
    rows = []
    for g in groups:
        t = g.tails
        rows.append([g.layout, num(t.p50.value) if t.pooled else "",
                     (fmt_interval(t.p99) if g.p99_quotable else "n/q") if t.pooled else "",
                     (f"{t.slower}" + ("!" if t.thin else "")) if t.pooled else "", pileup(g),
                     pct(g.inflight.full.median) if g.inflight else ""])
    return rows


TAILS_HEADERS = ["layout", "p50\npooled", f"p99 pooled\n({CONFIDENCE:.0%} interval)", ">p99", "pile-up", "full"]


def mechanism_words(m: Mechanism, level_name: str = "") -> str:
    """The sentence of one scenario's in-flight reading (``analysis.mechanism_of``): at the level
    where pile-up differs most, the layouts with the most and the least of it and whether the one
    with less also had the shorter pooled tail (beyond noise); how often their workers were full;
    and from which level every layout's workers were full (no idle thread left to pile onto)."""
    text = f"{m.scenario}, {m.level} connections{level_name}: "
    if m.p99 is None:
        text += (f"{m.piled} piled requests up {pct(m.piled_share)} of the time (a worker held 2+ more in flight than "
                 f"another). Some worker had all its threads busy {pct(m.piled_full)} of the time.")
    else:
        if m.alike:
            text += f"pile-up was about the same in every layout ({pct(m.calm_share)}–{pct(m.piled_share)} of the time)"
        else:
            text += (f"{m.piled} piled requests up {pct(m.piled_share)} of the time (a worker held 2+ more in flight "
                     f"than another while it had idle threads), {m.calm} {pct(m.calm_share)}")
        p99, kind = m.p99, "p99" if m.p99.paired else "p99 (unpaired)"
        if p99.outcome is Direction.BETTER:
            text += (f"; {m.calm}'s {kind} was {p99.text()} of {m.piled}'s and its throughput "
                     f"{m.rps.ratio:.2f}x" + ("." if m.alike else ": less pile-up, shorter tail."))
        elif p99.outcome is Direction.WORSE:
            text += (f"; yet {m.calm}'s {kind} was {p99.text()} of {m.piled}'s (worse beyond noise)"
                     + ("." if m.alike else ": the pile-up does not explain the tail here."))
        elif p99.outcome is Direction.EQUIVALENT:
            text += f"; the {kind}s of {m.calm} and {m.piled} are equivalent: {p99.text()}."
        else:
            text += f"; {m.calm}'s {kind} against {m.piled}'s is undecided: {p99.text()}."
        text += (f" Some worker had all its threads busy {pct(m.piled_full)} of the time in "
                 f"{m.piled}, {pct(m.calm_full)} in {m.calm}.")
    if m.saturated_from:
        text += (f" From {m.saturated_from} connections every layout had a worker with all its threads busy at least "
                 f"{SATURATED:.0%} of the time"
                 + (f" and pile-up was at most {pct(m.pileup_after)}" if m.pileup_after is not None else "")
                 + ": no idle thread left to pile onto.")
    return text


def mechanism_sentence(results: Results, scenario: str, groups: list[Group]) -> str:
    """``mechanism_words`` of the reading ``groups`` give ("" when none has a pile-up figure)."""
    m = mechanism_of(scenario, groups, results.arguments.get("processes"))
    return mechanism_words(m, _level_name(results, m.level)) if m is not None else ""


def even_totals_words(e: EvenTotals) -> str:
    return (f"{e.layout} at {e.concurrency} connections{'' if e.scenario == 'article' else f' ({e.scenario})'} "
            "served " + " / ".join(f"{x:.0%}" for x in e.shares)
            + f" of the requests, yet a worker was piled up {pct(e.pileup)} of the time")


def mechanism_lines(results: Results, summary: Summary) -> list[str]:
    """One sentence per scenario read from the in-flight figures, and where per-worker totals
    look balanced while requests piled up (terminal form; Markdown wraps the same text)."""
    out = [mechanism_words(m, _level_name(results, m.level)) for m in summary.mechanisms]
    notes = [even_totals_words(e) for e in summary.even_totals]
    if notes:
        out.append("Per-worker totals count requests, not when they arrive together: " + "; ".join(notes) + ".")
    return out


def warnings_section(summary: Summary) -> Section:
    """What is wrong and what to do (``Summary.cautions``)."""
    return Section("Warnings", (Items(summary.cautions),) if summary.cautions else (Note("None."),))


def terminal_lines(results: Results, summary: Summary) -> list[str]:
    """The plain-text report: per scenario and level a table, the best layout, then the verdict
    and the warnings, as ``summary`` decided them.

    Medians across repeats; "±" is half the low–high range as a percentage of the median;
    latencies in ms. Lines fit in 100 columns for layout names up to about 14 characters.
    """
    by_sc = _by_scenario(results)
    all_groups = [g for gs in by_sc.values() for g in gs]
    a = results.arguments
    out = [f"uWSGI layouts: {len(results.layouts)} layouts x {len(results.levels)} connection levels x "
           f"{_repeats(all_groups)} repeats"
           + (f", {a['duration']:g} s per cell" if isinstance(a.get("duration"), (int, float)) else "")
           + (f" ({a['key_duration']:g} s for the verdict's)" if a.get("key_cells") and a.get("key_duration") else "")
           + (f", {results.environment['nproc']} cores" if results.environment.get("nproc") else "")]
    if comment(results):
        out.extend(wrap(f"note: {comment(results)}"))
    out += subject_lines(results)
    if not results.cells:
        return out + ["no cells in this results file: nothing was measured."]
    out.extend(wrap("medians across repeats; ±: half the low–high range, % of the median; latency in ms; p99: "
                     f"pooled over the repeats, n/q (not quoted) when fewer than {MIN_SLOWER_REQUESTS} requests lie "
                     "above it; eff.: throughput / min(capacity, closed-loop bound); worker CV: spread of requests "
                     f"across workers (0 = even); noisy: spread above {NOISY_SPREAD:.0%}", subsequent=""))
    note = unpaired_note(results)
    if note:
        out.extend(wrap(f"note: {note}."))
    if _has_tails_or_inflight(all_groups):
        out.extend(wrap(TAILS_NOTE, subsequent=""))
    if any(not g.tails.pooled for g in all_groups):
        out.extend(wrap(f"note: {PER_CELL_NOTE}."))
    for sc, groups in by_sc.items():
        out += ["", f"== scenario: {sc} =="]
        for level in sorted({g.concurrency for g in groups}):
            at = [g for g in groups if g.concurrency == level]
            out += ["", f"{level} connections{_level_name(results, level)}"]
            out += _terminal_table(at)
            if _has_tails_or_inflight(at):
                out += [""] + table(TAILS_HEADERS, _tails_rows(at), "<>>>><")
            out += wrap(_best_line(summary.best_at(sc, level), at))
    mechanism = mechanism_lines(results, summary)
    if mechanism:
        out += ["", "requests in flight per worker (the mechanism):"]
        for line in mechanism:
            out += wrap(line, indent="  - ", subsequent="    ")
    out += memory_lines(results, summary)
    out += limit_lines(results)
    out += nginx.nginx_lines(results, summary=summary)
    out += hosts.host_lines(results, summary=summary)
    text = TextView()
    out += written(text, decision_section(summary)) if not only_nginx(results) else []
    out += written(text, choice_section(results, summary))
    out += peers.alternatives_lines(results, summary=summary)
    # The article's verdict is about the demo app's own request (``Summary.verdict``: None otherwise).
    if not only_nginx(results) and summary.verdict is not None:
        out.append("")
        out.extend(text.lines(verdict_section(summary.verdict)))
    if summary.cautions:
        out += text.lines(warnings_section(summary))
    return out


# --------------------------------------------------------------------------- markdown


def _md_reproduce(results: Results) -> list[str]:
    out = ["## How to reproduce", ""]
    command = results.arguments.get("command")
    if command:
        out += ["The run was made with:", "", "```sh", str(command), "```", ""]
    else:
        out += ["The run did not record its command line.", ""]
    out += ["This report was rendered from the stored results JSON only; re-render it (nothing is re-run) with "
            "`uwsgi-layouts report <results.json>`.", ""]
    return out


def _md_results(results: Results, by_sc: dict[str, list[Group]], summary: Summary) -> list[str]:
    out = ["## Results", "",
           "Each figure is the median across repeats with the low–high range in parentheses; `~` marks a figure "
           f"whose spread (high − low) / median is above {NOISY_SPREAD:.0%}. Latencies are in ms; errors are "
           "summed over repeats. The best layout per level is in bold.", "", EFFICIENCY_NOTE, ""]
    groups = [g for gs in by_sc.values() for g in gs]
    if _has_tails_or_inflight(groups):
        out += [TAILS_NOTE[0].upper() + TAILS_NOTE[1:].replace("(! = ", "(⚠ = ") + ".", ""]
    if any(not g.tails.pooled for g in groups):
        out += [f"> Note: {PER_CELL_NOTE[0].upper()}{PER_CELL_NOTE[1:]}.", ""]
    for sc, groups in by_sc.items():
        out += [f"### Scenario: {sc}", ""]
        for level in sorted({g.concurrency for g in groups}):
            at = [g for g in groups if g.concurrency == level]
            best = summary.best_at(sc, level)
            out += [f"#### {level} connections{_level_name(results, level)}", ""]
            out += md_level_table(at, best.layout) + [""]
            best_text = _best_line(best, at)
            out += [best_text[0].upper() + best_text[1:] + ".", ""]
            noisy = [g.layout for g in at if g.noisy_figures]
            if noisy:
                out += [f"> ⚠ Noisy: {', '.join(noisy)}: {NOISY_ADVICE}", ""]
    return out


def _md_shares(results: Results, by_sc: dict[str, list[Group]], summary: Summary) -> list[str]:
    out = ["## Per-worker shares", "",
           "Share of requests each worker served (worker 1 / worker 2 / ...), pooled over repeats: uWSGI's "
           "stats server counts them; gunicorn and granian have none, so there the answers are counted by the "
           "demo app's X-Worker-Pid header (absent for an app without it). An even "
           "split is 1 / workers each; the article's problem is a skewed split on one shared socket, where one "
           "process takes several requests while the others idle. max/min is the busiest worker's count over the "
           "idlest one's (1.00 = even).", ""]
    notes = [even_totals_words(e) for e in summary.even_totals]
    if notes:
        out += ["> Totals can look balanced while requests pile up at the same moment: " + "; ".join(notes)
                + " (see *Requests in flight per worker*).", ""]
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


def _md_inflight(results: Results, by_sc: dict[str, list[Group]], summary: Summary) -> list[str]:
    """The mechanism: pile-up per layout and level, one sentence per scenario read from the
    figures, the per-worker in-flight distribution at the level the sentence reads."""
    groups = [g for gs in by_sc.values() for g in gs]
    if not any(g.inflight for g in groups):
        return []
    out = ["## Requests in flight per worker (the mechanism)", "",
           "Sampled from the uWSGI stats server during every cell (a thread counts from reading a request until "
           "uWSGI closes it). **Pile-up**: the share of time some worker held 2 or more requests in flight while "
           "another held at least 2 fewer, i.e. a request shared one worker's GIL while another worker had idle "
           "threads (3 requests on 2 workers must put 2 in one: 2 / 1 is not a pile-up; n/a with one worker or one "
           "thread each). **Full**: the share of time some worker had every thread busy. Per-worker request totals "
           "(next section) can look even while requests pile up at the same moment.", ""]
    for line in mechanism_lines(results, summary):
        out += [f"- {line}"]
    out += [""]
    for sc, gs in by_sc.items():
        levels = sorted({g.concurrency for g in gs})
        rows = []
        for layout in dict.fromkeys(g.layout for g in gs):
            at = {g.concurrency: g for g in gs if g.layout == layout}
            rows.append([layout] + [(pileup(at[lv]) + f" (full {pct(at[lv].inflight.full.median)})")
                                    if lv in at and at[lv].inflight else "" for lv in levels])
        if len(by_sc) > 1:
            out += [f"Scenario {sc}, pile-up (full):", ""]
        out += md_table(["layout", *(f"{x} connections" for x in levels)], rows, "<" + ">" * len(levels)) + [""]
        level = next((m.level for m in summary.mechanisms if m.scenario == sc), None)
        dist = [g for g in gs if g.concurrency == level and g.inflight]
        if dist:
            threads = max(g.inflight.threads for g in dist)
            counts = [str(n) for n in range(threads + 1)]
            rows = [[g.layout, w] + [pct(shares.get(n, 0.0)) for n in counts]
                    for g in dist for w, shares in g.inflight.shares.items()]
            out += [f"Share of time each worker had 0, 1, ... requests in flight at {level} connections ({sc}):", ""]
            out += md_table(["layout", "worker", *(f"{n} in flight" for n in counts)], rows,
                            "<<" + ">" * len(counts)) + [""]
    return out


def markdown_lines(results: Results, plot_files: list[str], summary: Summary) -> list[str]:
    """The Markdown report: verdict first, how to reproduce, environment, workload, per-level
    tables (median and low–high for every figure, noisy cells flagged), best layout per level,
    per-worker shares, warnings, and the plots (``plot_files``, relative to the report) embedded;
    the judgements are ``summary``'s.
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
    out += headline_markdown(results, summary)
    out += subject_markdown(results)
    md = MarkdownView()
    if not only_nginx(results) and summary.verdict is not None:
        out += md.lines(verdict_section(summary.verdict))
    if not only_nginx(results):
        out += written(md, decision_section(summary))
    note = unpaired_note(results)
    if note:
        out += [f"> Note: {note[0].upper()}{note[1:]}.", ""]
    out += peers.alternatives_lines(results, markdown=True, summary=summary)
    out += nginx.nginx_lines(results, markdown=True, summary=summary)
    out += hosts.host_lines(results, markdown=True, summary=summary)
    out += written(md, choice_section(results, summary))
    out += _md_reproduce(results)
    out += md_kv("Environment", results.environment)
    out += md_kv("Workload", short_workload(results))
    out += md_kv("Arguments", results.arguments, skip=("command",))
    if results.cells:
        out += _md_results(results, by_sc, summary)
        out += _md_inflight(results, by_sc, summary)
        out += _md_shares(results, by_sc, summary)
        out += memory_markdown(results, summary)
        out += limit_markdown(results)
    else:
        out += ["## Results", "", "No cells in this results file: nothing was measured.", ""]
    out += md.lines(warnings_section(summary))
    return out + plot_lines(plot_files)
