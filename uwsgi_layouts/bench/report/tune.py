"""The tune report: the recommendation in one sentence with its figures and spread, the runner-up
and why it lost, every candidate (measured or pruned) with the stage it reached and why it
stopped, how the budget was spent, and warnings.

Everything is recomputed from the stored run: the search is taken again on the stored cells and
clock (``bench.tune.record.outcome_of``), so a live run and ``bench report results.json`` render
the same lines. Functions return lines; nothing prints.
"""

from __future__ import annotations

from uwsgi_layouts.bench.report.limits import pod_sentence
from uwsgi_layouts.bench.report.subject import subject_lines, subject_markdown
from uwsgi_layouts.bench.report.text import fmt_interval, md_table, num, plot_lines, table, wrap
from uwsgi_layouts.bench.results import Results
from uwsgi_layouts.bench.tune.cautions import tune_cautions
from uwsgi_layouts.bench.tune.objective import Evaluation
from uwsgi_layouts.bench.tune.outcome import STAGES, Outcome
from uwsgi_layouts.bench.tune.record import outcome_of

RULES = {
    "threads": ("too few threads", "P x T below the requests in flight: the rest would queue"),
    "idle-threads": ("idle threads", "more threads per process than requests are ever in flight: they stay idle and "
                                     "only cost memory (in parentheses: the candidate measured instead)"),
    "duplicate": ("duplicates", "with one process, the same stack as the one in parentheses"),
    "memory": ("memory", "predicted over the limit from the fitted cost of a process and a thread"),
}
POINT_NOTE = ("Candidates are compared on paired rounds (every stage measures them in lockstep rounds): the "
              "per-round ratios of their throughput, judged better, worse, equivalent (within the margin) or "
              "undecided. A candidate another one beat is never recommended; the tie rule applies only among "
              "equivalent ones; a candidate whose throughput swings across rounds far more than the others' is "
              "flagged and does not lead on its median alone. The objective uses each candidate's pooled p99 (its "
              "repeats' latency histograms pooled); the 95% interval is shown beside it, and a p99 whose interval "
              "straddles the limit is marked borderline. Screening drops a candidate only when its whole interval "
              "is above the limit.")


def _mmss(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    return f"{seconds // 60}m{seconds % 60:02d}s"


def _memory(e: Evaluation) -> str:
    return "n/a" if e.memory_mb is None else f"{e.memory_mb:.1f} MB"


def p99_text(tails, p99) -> str:
    """``p99 240 ms (95%: 220–260)``; a p99 with fewer than MIN_SLOWER_REQUESTS requests above it
    is not quoted as a figure (the objective still weighs it: the value is shown as what it judged)."""
    if tails.thin:
        return f"p99 n/q (judged at {num(p99.value)} ms, resting on {tails.slower} requests above it)"
    return f"p99 {num(p99.value)} ms (95%: {num(p99.low)}–{num(p99.high)})"


def p99_cell(tails, p99) -> str:
    return f"n/q ({num(p99.value)}, {tails.slower} above)" if tails.thin else fmt_interval(p99)


def figures(e: Evaluation, memory_label: str = "PSS") -> str:
    """``21.3 req/s (20.1–22.5 over 7 cells), p50 180 ms, p99 240 ms (95%: 220–260), 24.1 MB PSS, 0 failed``."""
    rps = e.rps
    spread = f" ({num(rps.low)}–{num(rps.high)} over {e.repeats} cells)" if e.repeats > 1 else " (one cell)"
    text = (f"{num(rps.value)} req/s{spread}, p50 {num(e.steady.tails.p50.value)} ms, "
            f"{p99_text(e.steady.tails, e.p99)}, {_memory(e)} {memory_label}, {e.errors} failed or non-2xx")
    return text + (" [p99 borderline]" if e.borderline else "")


def stall_figures(e: Evaluation) -> str:
    s = e.stall
    if s is None:
        return ""
    stalled = s.extra.get("stalled_p50_ms")
    text = f"under the stall {num(s.throughput.value)} req/s, healthy {p99_text(s.tails, s.tails.p99)}"
    return text + (f", stalled requests p50 {num(stalled.median)} ms" if stalled is not None else "")


def memory_label(results: Results) -> str:
    servers = results.arguments.get("strategies") or []
    return "uWSGI PSS" if all(s in ("shared", "thunder", "mapped", "overflow") for s in servers) else "app-server PSS"


def _subject_head(results: Results, outcome: Outcome) -> str:
    a = results.arguments
    app = (a.get("app") or {}).get("app", "app.wsgi:application")
    replayed = results.environment.get("replayed_from")
    return (f"tune: {app}, scenario {a.get('scenario')}, {a.get('concurrency')} concurrent requests, budget "
            f"{a.get('budget_min'):g} min" + (f" (replayed from {replayed})" if replayed else ""))


def recommendation(results: Results, outcome: Outcome) -> list[str]:
    """The recommendation (or why there is none), the runner-up: one sentence each, unwrapped."""
    d = outcome.decision
    label = memory_label(results)
    if outcome.interrupted:
        return [f"INTERRUPTED after {len(outcome.blocks)} blocks: no recommendation (rerun to finish)."]
    if d is not None and d.chosen is not None:
        out = [f"RECOMMENDATION: {d.chosen.spec}: {figures(d.chosen, label)}"
               + (f"; {stall_figures(d.chosen)}." if d.chosen.stall is not None else ".")]
        pod = pod_sentence(results, d.chosen.spec, results.arguments.get("scenario", ""), d.chosen.memory_mb)
        out += [pod] if pod else []
        if d.runner_up is not None:
            out.append(f"runner-up: {d.runner_up.spec} ({figures(d.runner_up, label)}): {d.why}.")
        else:
            out.append(f"runner-up: none ({d.why}).")
        return out
    out = ["NO LAYOUT MEETS THE OBJECTIVE."]
    if d is not None and d.closest is not None:
        why = "; ".join(d.closest.misses) or outcome.states[d.closest.spec].reason
        out.append(f"closest: {d.closest.spec}: {figures(d.closest, label)}; "
                   + (f"misses: {why}." if d.closest.misses else f"{why}."))
    return out + [f"(the search stopped: {outcome.stop})"]


def _outcome_text(outcome: Outcome, spec: str) -> str:
    if outcome.chosen is not None and outcome.chosen.spec == spec:
        return "chosen"
    state = outcome.states[spec]
    return state.reason or "(still in)"


def _reached(outcome: Outcome, spec: str) -> str:
    state = outcome.states[spec]
    return f"{state.reached} {STAGES[state.reached]}" if state.reached else "-"


def _figures_align(columns: int) -> str:
    """The layout and stage columns to the left, every figure after them to the right."""
    return "<<" + ">" * (columns - 2)


def measured_rows(outcome: Outcome, markdown: bool = False) -> tuple[list[str], list[list[str]]]:
    chosen = outcome.chosen.spec if outcome.chosen else None
    evals = sorted(outcome.evaluations.values(),
                   key=lambda e: (e.spec != chosen, -outcome.states[e.spec].reached, -e.rps.value, e.spec))
    headers = ["layout", "stage", "cells", "req/s", "p50 ms", "p99 ms (95%)", "PSS MB", "failed", "outcome"]
    stall = any(e.stall is not None for e in evals)
    if stall:
        headers.insert(7, "stall p99 ms")
    rows = []
    for e in evals:
        rps = e.rps
        row = [e.spec, _reached(outcome, e.spec), str(e.repeats),
               f"{num(rps.value)}" + (f" ({num(rps.low)}–{num(rps.high)})" if e.repeats > 1 else ""),
               num(e.steady.tails.p50.value), p99_cell(e.steady.tails, e.p99),
               "n/a" if e.memory_mb is None else f"{e.memory_mb:.1f}", str(e.errors), _outcome_text(outcome, e.spec)]
        if stall:
            row.insert(7, p99_cell(e.stall.tails, e.stall.tails.p99) if e.stall is not None else "")
        rows.append(row)
    return headers, rows


def pruned_groups(outcome: Outcome) -> list[str]:
    """Per rule: what it means and the candidates it pruned (with the one measured instead)."""
    out = []
    for rule, (label, why) in RULES.items():
        mine = [p for p in outcome.pruned if p.rule == rule]
        if mine:
            items = ", ".join(p.spec + (f" ({p.kept})" if p.kept else "") for p in mine)
            out.append(f"{label} ({len(mine)}, {why}): {items}")
            if rule == "memory":
                out += [f"{p.spec}: {p.reason}" for p in mine]
    return out


def search_sentences(results: Results, outcome: Outcome) -> list[str]:
    """How the budget was spent, why the search stopped, the stall's size and the memory fit."""
    parts = []
    for st in outcome.stages:
        unit = "round" if st.number == 3 else "cell"
        parts.append(f"stage {st.number} {st.name}: {len(st.candidates)} candidates x {st.repeats} {unit}"
                     f"{'s' if st.repeats != 1 else ''} of {st.duration_s} s ({'+'.join(st.scenarios)}), "
                     f"{_mmss(st.seconds)}" + (f" ({st.note})" if st.note else ""))
    rec = results.arguments["tune"]
    budget = rec["settings"]["budget_s"]
    wall = rec.get("wall_s")
    out = ["search: " + "; ".join(parts) + "." if parts else "search: nothing was measured.",
           f"stopped: {outcome.stop}."]
    if wall is not None:
        out.append(f"wall time: {_mmss(wall)} of the {budget / 60:g}-min budget ({wall / budget:.0%}); "
                   f"{len(outcome.blocks)} stack starts.")
    if outcome.stall_note:
        out.append(f"stall: {outcome.stall_note}.")
    for model in outcome.memory_models.values():
        out.append(f"memory fit ({model.server}): +{model.per_process_mb:.1f} MB per process, "
                   f"+{model.per_thread_mb:.2f} MB per thread, {model.base_mb:.1f} MB base, from {model.points} "
                   f"cells (worst residual {model.worst_residual_mb:.1f} MB).")
    return out


def recommended_lines(results: Results) -> list[str]:
    rec = results.arguments["tune"].get("recommended")
    if not rec:
        return []
    # Commands on lines of their own, never wrapped: they are meant to be copied.
    out = wrap(f"recommended files: {rec['dir']}/ ({', '.join(rec['files'])})"
               + (f" and the production bundle in {rec['dir']}/{rec['bundle']}/" if rec.get("bundle") else ""))
    out += ["  serve them here:", f"    {rec['serve']}"]
    out += wrap(f"production: {rec['note']}" + (":" if rec.get("install") else "."), indent="  ")
    if rec.get("install"):
        out += [f"    {rec['install']}"]
    return out


def tune_warnings(results: Results, outcome: Outcome) -> list[str]:
    """The cautions ``bench.tune.cautions`` judged, in words."""
    c = tune_cautions(results, outcome)
    out = list(c.machine)
    for u in c.unsteady:
        fate = ("chosen anyway: it beat the others beyond noise" if u.chosen else
                "not recommended over steadier candidates it did not beat beyond noise")
        out.append(f"{u.spec} is unsteady: its throughput spread {u.spread:.0%} across its {u.repeats} rounds "
                   f"({num(u.low)}–{num(u.high)} req/s), far wider than the other finalists' "
                   f"(median {u.others_median:.0%}); {fate}. A layout that swings like this under the same load (a "
                   "shared socket's pile-up shows up so) is worth a longer look before you deploy it.")
    env = results.environment
    load = ""
    if env.get("loadavg_at_start"):
        load = f" (load average {env['loadavg_at_start'][0]:.1f} at the start"
        load += f", {env['loadavg_at_end'][0]:.1f} at the end)" if env.get("loadavg_at_end") else ")"
    if c.noisy is not None:
        out.append(f"{c.noisy.spec}'s throughput spread {c.noisy.spread:.0%} across its {c.noisy.repeats} "
                   f"cells{load}: the machine was noisy; rerun with a larger --budget, or on a quieter machine, "
                   "before deciding on a few percent.")
    if c.borderline:
        out.append(f"{c.borderline}'s p99 interval straddles the limit: it meets the objective by its pooled p99, "
                   "not beyond noise; a larger --budget measures it longer.")
    if c.thin is not None:
        out.append(f"{c.thin.spec}'s p99 rests on {c.thin.slower} slower requests: a larger --budget "
                   "gives longer cells.")
    if c.early_stop:
        out.append("the budget ended before the final stage: the choice rests on few cells; give a larger --budget.")
    return out


def terminal_lines(results: Results) -> list[str]:
    outcome = outcome_of(results)
    out = [_subject_head(results, outcome)]
    out += subject_lines(results)
    out += wrap("objective: " + outcome.inputs.objective.words())
    out += [""] + [x for line in recommendation(results, outcome) for x in wrap(line)]
    headers, rows = measured_rows(outcome)
    out += ["", f"candidates: {len(outcome.inputs.space)} in the space, {len(outcome.evaluations)} measured, "
                f"{len(outcome.pruned)} pruned"]
    out += table(headers[:-1], [r[:-1] for r in rows], _figures_align(len(headers) - 1))
    out += ["", "why each candidate stopped:"]
    out += [x for r in rows for x in wrap(f"{r[0]}: {r[-1]}", indent="  ")]
    groups = pruned_groups(outcome)
    out += [""] + ([f"pruned before measuring ({len(outcome.pruned)}):"] if groups else
                   ["pruned before measuring: none"])
    out += [x for g in groups for x in wrap(g, indent="  ")]
    out += [""] + [x for line in search_sentences(results, outcome) for x in wrap(line)]
    out += recommended_lines(results)
    warns = tune_warnings(results, outcome)
    if warns:
        out += ["", "warnings:"] + [x for w in warns for x in wrap(w, indent="  ")]
    return out


def markdown_lines(results: Results, plot_files: list[str]) -> list[str]:
    outcome = outcome_of(results)
    a = results.arguments
    out = ["# Tune: which layout to run", "", _subject_head(results, outcome) + ".", "",
           f"**Objective:** {outcome.inputs.objective.words()}.", "", POINT_NOTE, ""]
    out += subject_markdown(results)
    bold = {"RECOMMENDATION:": "**Recommendation:**", "POD:": "**Pod:**", "runner-up:": "**Runner-up:**",
            "closest:": "**Closest:**",
            "NO LAYOUT MEETS THE OBJECTIVE.": "**No layout meets the objective.**"}
    out += ["## Recommendation", ""]
    for line in recommendation(results, outcome):
        for plain, strong in bold.items():
            if line.startswith(plain):
                line = strong + line[len(plain):]
        out += [line, ""]
    rec_data = a["tune"].get("recommended")
    if rec_data:
        out += ["## Recommended files", "", f"`{rec_data['dir']}/`: {', '.join(f'`{f}`' for f in rec_data['files'])}"
                + (", and the production bundle in `bundle/`" if rec_data.get("bundle") else "") + ".", "",
                "Serve them here:", "", "```sh", rec_data["serve"], "```", "",
                f"Production: {rec_data['note']}" + (":" if rec_data.get("install") else "."), ""]
        if rec_data.get("install"):
            out += ["```sh", rec_data["install"], "```", ""]
    headers, rows = measured_rows(outcome, markdown=True)
    out += ["## Every candidate measured", "", "Stage: the last stage a candidate was measured in (1 screen, 2 "
            "narrow, 3 final). req/s: median of its cells (low–high); p50 and p99 pooled over its cells, p99 with "
            "its 95% bootstrap interval; PSS: the app server's memory after load.", ""]
    out += md_table(headers, rows, _figures_align(len(headers) - 1) + "<") + [""]
    out += ["## Pruned before measuring", ""] + ([f"- {g}" for g in pruned_groups(outcome)] or ["None."]) + [""]
    out += ["## How the budget was spent", ""] + [f"- {x}" for x in search_sentences(results, outcome)] + [""]
    warns = tune_warnings(results, outcome)
    if warns:
        out += ["## Warnings", ""] + [f"- {w}" for w in warns] + [""]
    out += plot_lines(plot_files)
    out += ["## Reproduce", "", "```sh", str(a.get("command", "")), "```", "",
            "Re-render this report: `uwsgi-layouts report results.json`; take the decisions again on the stored "
            "cells (timing nothing): `uwsgi-layouts tune --replay results.json`.", ""]
    return out
