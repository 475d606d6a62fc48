"""The tune report: the recommendation in one sentence with its figures and spread, the runner-up
and why it lost, every candidate (measured or pruned) with the stage it reached and why it
stopped, how the budget was spent, and warnings.

Everything is rendered from the run's ``TuneSummary`` (``bench.tune.summary``): what the search
decided, stored as summary.json beside results.json, so ``uwsgi-layouts report`` renders what the
run concluded without taking the search again; for a run stored before summaries, the summary is
made once per report from the stored cells and clock (``bench.report.judged``) and handed here.
Facts of the run (its app, budget, wall time, recommended files, load average) come from
results.json. Functions return lines; nothing prints.

The report is built once into a ``TuneSpec`` (what both formats show); ``TuneText`` (report.txt,
the terminal) and ``TuneMarkdown`` (report.md) each say only how its parts are written and in what
order, so the two cannot show different choices or figures (``bench.report.views`` does the same
for compare's sections).
"""

from __future__ import annotations

from dataclasses import dataclass

from uwsgi_layouts.bench.report.limits import pod_sentence
from uwsgi_layouts.bench.report.subject import subject_lines, subject_markdown
from uwsgi_layouts.bench.report.text import fmt_interval, md_table, num, plot_lines, table, wrap
from uwsgi_layouts.bench.report.views import check_lines, check_table, check_text
from uwsgi_layouts.bench.results import Results, ResultsError
from uwsgi_layouts.bench.tune.outcome import STAGES
from uwsgi_layouts.bench.tune.summary import Measured, StallFigures, Tail, TuneSummary

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


def _memory(c: Measured) -> str:
    return "n/a" if c.memory_mb is None else f"{c.memory_mb:.1f} MB"


def p99_text(tail: Tail) -> str:
    """``p99 240 ms (95%: 220–260)``; a p99 with fewer than MIN_SLOWER_REQUESTS requests above it
    is not quoted as a figure (the objective still weighs it: the value is shown as what it judged)."""
    p99 = tail.p99
    if tail.thin:
        return f"p99 n/q (judged at {num(p99.value)} ms, resting on {tail.slower} requests above it)"
    return f"p99 {num(p99.value)} ms (95%: {num(p99.low)}–{num(p99.high)})"


def p99_cell(tail: Tail) -> str:
    return f"n/q ({num(tail.p99.value)}, {tail.slower} above)" if tail.thin else fmt_interval(tail.p99)


def figures(c: Measured, memory_label: str = "PSS") -> str:
    """``21.3 req/s (20.1–22.5 over 7 cells), p50 180 ms, p99 240 ms (95%: 220–260), 24.1 MB PSS, 0 failed``."""
    rps = c.rps
    spread = f" ({num(rps.low)}–{num(rps.high)} over {c.repeats} cells)" if c.repeats > 1 else " (one cell)"
    text = (f"{num(rps.value)} req/s{spread}, p50 {num(c.p50)} ms, "
            f"{p99_text(c.tail)}, {_memory(c)} {memory_label}, {c.errors} failed or non-2xx")
    return text + (" [p99 borderline]" if c.borderline else "")


def stall_figures(s: StallFigures | None) -> str:
    if s is None:
        return ""
    text = f"under the stall {num(s.rps)} req/s, healthy {p99_text(s.tail)}"
    return text + (f", stalled requests p50 {num(s.stalled_p50_ms)} ms" if s.stalled_p50_ms is not None else "")


def memory_label(results: Results) -> str:
    servers = results.arguments.get("strategies") or []
    return "uWSGI PSS" if all(s in ("shared", "thunder", "mapped", "overflow") for s in servers) else "app-server PSS"


def _subject_head(results: Results) -> str:
    a = results.arguments
    app = (a.get("app") or {}).get("app", "app.wsgi:application")
    replayed = results.environment.get("replayed_from")
    return (f"tune: {app}, scenario {a.get('scenario')}, {a.get('concurrency')} concurrent requests, budget "
            f"{a.get('budget_min'):g} min" + (f" (replayed from {replayed})" if replayed else ""))


def recommendation(results: Results, summary: TuneSummary) -> list[str]:
    """The recommendation (or why there is none), the runner-up: one sentence each, unwrapped."""
    choice = summary.choice
    label = memory_label(results)
    if summary.search.interrupted:
        return [f"INTERRUPTED after {summary.search.blocks} blocks: no recommendation (rerun to finish)."]
    if choice.chosen:
        chosen = summary.candidate(choice.chosen)
        out = [f"RECOMMENDATION: {chosen.spec}: {figures(chosen, label)}"
               + (f"; {stall_figures(chosen.stall)}." if chosen.stall is not None else ".")]
        pod = pod_sentence(summary.pod)
        out += [pod] if pod else []
        if choice.runner_up:
            out.append(f"runner-up: {choice.runner_up} ({figures(summary.candidate(choice.runner_up), label)}): "
                       f"{choice.why}.")
        else:
            out.append(f"runner-up: none ({choice.why}).")
        return out
    out = ["NO LAYOUT MEETS THE OBJECTIVE."]
    if choice.closest:
        closest = summary.candidate(choice.closest)
        why = "; ".join(closest.misses) or closest.reason
        out.append(f"closest: {closest.spec}: {figures(closest, label)}; "
                   + (f"misses: {why}." if closest.misses else f"{why}."))
    return out + [f"(the search stopped: {summary.search.stop})"]


def _outcome_text(summary: TuneSummary, c: Measured) -> str:
    if c.spec == summary.choice.chosen:
        return "chosen"
    return c.reason or "(still in)"


def _reached(c: Measured) -> str:
    return f"{c.reached} {STAGES[c.reached]}"


def _figures_align(columns: int) -> str:
    """The layout and stage columns to the left, every figure after them to the right."""
    return "<<" + ">" * (columns - 2)


def measured_rows(summary: TuneSummary) -> tuple[list[str], list[list[str]]]:
    headers = ["layout", "stage", "cells", "req/s", "p50 ms", "p99 ms (95%)", "PSS MB", "failed", "outcome"]
    stall = any(c.stall is not None for c in summary.candidates)
    if stall:
        headers.insert(7, "stall p99 ms")
    rows = []
    for c in summary.candidates:
        rps = c.rps
        row = [c.spec, _reached(c), str(c.repeats),
               f"{num(rps.value)}" + (f" ({num(rps.low)}–{num(rps.high)})" if c.repeats > 1 else ""),
               num(c.p50), p99_cell(c.tail),
               "n/a" if c.memory_mb is None else f"{c.memory_mb:.1f}", str(c.errors), _outcome_text(summary, c)]
        if stall:
            row.insert(7, p99_cell(c.stall.tail) if c.stall is not None else "")
        rows.append(row)
    return headers, rows


def pruned_groups(summary: TuneSummary) -> list[str]:
    """Per rule: what it means and the candidates it pruned (with the one measured instead)."""
    out = []
    for rule, (label, why) in RULES.items():
        mine = [p for p in summary.pruned if p.rule == rule]
        if mine:
            items = ", ".join(p.spec + (f" ({p.kept})" if p.kept else "") for p in mine)
            out.append(f"{label} ({len(mine)}, {why}): {items}")
            if rule == "memory":
                out += [f"{p.spec}: {p.reason}" for p in mine]
    return out


def search_sentences(results: Results, summary: TuneSummary) -> list[str]:
    """How the budget was spent, why the search stopped, the stall's size and the memory fit."""
    search = summary.search
    parts = []
    for st in search.stages:
        unit = "round" if st.number == 3 else "cell"
        parts.append(f"stage {st.number} {st.name}: {len(st.candidates)} candidates x {st.repeats} {unit}"
                     f"{'s' if st.repeats != 1 else ''} of {st.duration_s} s ({'+'.join(st.scenarios)}), "
                     f"{_mmss(st.seconds)}" + (f" ({st.note})" if st.note else ""))
    rec = results.arguments["tune"]
    budget = rec["settings"]["budget_s"]
    wall = rec.get("wall_s")
    out = ["search: " + "; ".join(parts) + "." if parts else "search: nothing was measured.",
           f"stopped: {search.stop}."]
    if wall is not None:
        out.append(f"wall time: {_mmss(wall)} of the {budget / 60:g}-min budget ({wall / budget:.0%}); "
                   f"{search.blocks} stack starts.")
    if search.stall_note:
        out.append(f"stall: {search.stall_note}.")
    for model in search.memory_models:
        out.append(f"memory fit ({model.server}): +{model.per_process_mb:.1f} MB per process, "
                   f"+{model.per_thread_mb:.2f} MB per thread, {model.base_mb:.1f} MB base, from {model.points} "
                   f"cells (worst residual {model.worst_residual_mb:.1f} MB).")
    return out


def tune_warnings(results: Results, summary: TuneSummary) -> list[str]:
    """The cautions ``bench.tune.cautions`` judged, in words."""
    c = summary.cautions
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


@dataclass(frozen=True)
class RecommendedFiles:
    """What tune wrote for the recommended layout (results.json's ``tune.recommended``): its
    directory and files, the production bundle ("" none), the command that serves them here, the
    production note and its install command ("" none)."""

    dir: str
    files: tuple[str, ...]
    bundle: str
    serve: str
    note: str
    install: str

    def __post_init__(self):
        for name in ("dir", "bundle", "serve", "note", "install"):
            check_text(name, getattr(self, name))
        check_lines("files", self.files)
        if not self.dir or not self.files or not self.serve:
            raise ValueError("dir, files, serve: the recommended files need a directory, its files and a command")

    @classmethod
    def of(cls, results: Results) -> "RecommendedFiles | None":
        """From results.json; a stored entry of the wrong shape is refused in one line (ResultsError)."""
        rec = results.arguments["tune"].get("recommended")
        if not rec:
            return None
        try:
            if not isinstance(rec, dict) or not isinstance(rec.get("files"), list):
                raise ValueError("a mapping whose files are a list")
            return cls(rec["dir"], tuple(rec["files"]), rec.get("bundle") or "", rec["serve"], rec["note"],
                       rec.get("install") or "")
        except (KeyError, ValueError) as e:
            raise ResultsError(f"arguments.tune.recommended: {e}") from None


@dataclass(frozen=True)
class TuneSpec:
    """The tune report as both formats show it, built once from the run's summary: the run in one
    line, the objective, the answer (one sentence each, opening with its label), every candidate
    measured (its figures; the last column why it stopped), the pruned groups, how the budget was
    spent, the recommended files, the warnings and the command that reproduces the run."""

    head: str
    objective: str
    answer: tuple[str, ...]
    space: int
    headers: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    pruned_count: int
    pruned: tuple[str, ...]
    budget: tuple[str, ...]
    files: RecommendedFiles | None
    warnings: tuple[str, ...]
    command: str

    def __post_init__(self):
        for name in ("head", "objective", "command"):
            check_text(name, getattr(self, name))
        for name in ("answer", "pruned", "budget", "warnings"):
            check_lines(name, getattr(self, name))
        # the figures' columns are aligned, the last (why a candidate stopped) is written after them
        check_table("candidates", self.headers, self.rows, self.align, len(self.headers) - 1)
        if self.space < 0 or self.pruned_count < 0:
            raise ValueError(f"space, pruned_count: 0 or more, got {self.space} and {self.pruned_count}")
        if self.files is not None and not isinstance(self.files, RecommendedFiles):
            raise ValueError(f"files: RecommendedFiles or None, got {type(self.files).__name__}")

    @property
    def align(self) -> str:
        """The figures' columns (every one but why a candidate stopped)."""
        return _figures_align(len(self.headers) - 1)


def tune_spec(results: Results, summary: TuneSummary) -> TuneSpec:
    headers, rows = measured_rows(summary)
    return TuneSpec(_subject_head(results), summary.objective.words(), tuple(recommendation(results, summary)),
                    summary.space, tuple(headers), tuple(tuple(r) for r in rows), len(summary.pruned),
                    tuple(pruned_groups(summary)), tuple(search_sentences(results, summary)),
                    RecommendedFiles.of(results), tuple(tune_warnings(results, summary)),
                    str(results.arguments.get("command", "")))


class TuneText:
    """report.txt and the terminal: the figures' table, then why each candidate stopped, a line each."""

    def files(self, f: RecommendedFiles | None) -> list[str]:
        if f is None:
            return []
        # Commands on lines of their own, never wrapped: they are meant to be copied.
        out = wrap(f"recommended files: {f.dir}/ ({', '.join(f.files)})"
                   + (f" and the production bundle in {f.dir}/{f.bundle}/" if f.bundle else ""))
        out += ["  serve them here:", f"    {f.serve}"]
        out += wrap(f"production: {f.note}" + (":" if f.install else "."), indent="  ")
        return out + ([f"    {f.install}"] if f.install else [])

    def lines(self, results: Results, s: TuneSpec) -> list[str]:
        out = [s.head] + subject_lines(results) + wrap("objective: " + s.objective)
        out += [""] + [x for line in s.answer for x in wrap(line)]
        out += ["", f"candidates: {s.space} in the space, {len(s.rows)} measured, {s.pruned_count} pruned"]
        out += table(list(s.headers[:-1]), [list(r[:-1]) for r in s.rows], s.align)
        out += ["", "why each candidate stopped:"]
        out += [x for r in s.rows for x in wrap(f"{r[0]}: {r[-1]}", indent="  ")]
        out += [""] + ([f"pruned before measuring ({s.pruned_count}):"] if s.pruned else
                       ["pruned before measuring: none"])
        out += [x for g in s.pruned for x in wrap(g, indent="  ")]
        out += [""] + [x for line in s.budget for x in wrap(line)]
        out += self.files(s.files)
        if s.warnings:
            out += ["", "warnings:"] + [x for w in s.warnings for x in wrap(w, indent="  ")]
        return out


class TuneMarkdown:
    """report.md: a ``##`` section each, the answer's labels in bold, lists, the commands as shell blocks."""

    BOLD = {"RECOMMENDATION:": "**Recommendation:**", "POD:": "**Pod:**", "runner-up:": "**Runner-up:**",
            "closest:": "**Closest:**", "NO LAYOUT MEETS THE OBJECTIVE.": "**No layout meets the objective.**"}

    def sentence(self, line: str) -> str:
        for plain, strong in self.BOLD.items():
            if line.startswith(plain):
                line = strong + line[len(plain):]
        return line

    def files(self, f: RecommendedFiles | None) -> list[str]:
        if f is None:
            return []
        out = ["## Recommended files", "", f"`{f.dir}/`: {', '.join(f'`{x}`' for x in f.files)}"
               + (", and the production bundle in `bundle/`" if f.bundle else "") + ".", "",
               "Serve them here:", "", "```sh", f.serve, "```", "",
               f"Production: {f.note}" + (":" if f.install else "."), ""]
        return out + (["```sh", f.install, "```", ""] if f.install else [])

    def lines(self, results: Results, s: TuneSpec, plot_files: list[str]) -> list[str]:
        out = ["# Tune: which layout to run", "", s.head + ".", "", f"**Objective:** {s.objective}.", "",
               POINT_NOTE, ""]
        out += subject_markdown(results)
        out += ["## Recommendation", ""] + [x for line in s.answer for x in (self.sentence(line), "")]
        out += self.files(s.files)
        out += ["## Every candidate measured", "", "Stage: the last stage a candidate was measured in (1 screen, 2 "
                "narrow, 3 final). req/s: median of its cells (low–high); p50 and p99 pooled over its cells, p99 "
                "with its 95% bootstrap interval; PSS: the app server's memory after load.", ""]
        out += md_table(list(s.headers), [list(r) for r in s.rows], s.align + "<") + [""]
        out += ["## Pruned before measuring", ""] + ([f"- {g}" for g in s.pruned] or ["None."]) + [""]
        out += ["## How the budget was spent", ""] + [f"- {x}" for x in s.budget] + [""]
        if s.warnings:
            out += ["## Warnings", ""] + [f"- {w}" for w in s.warnings] + [""]
        out += plot_lines(plot_files)
        return out + ["## Reproduce", "", "```sh", s.command, "```", "",
                      "Re-render this report: `uwsgi-layouts report results.json`; take the decisions again on the "
                      "stored cells (timing nothing): `uwsgi-layouts tune --replay results.json`.", ""]


def terminal_lines(results: Results, summary: TuneSummary) -> list[str]:
    return TuneText().lines(results, tune_spec(results, summary))


def markdown_lines(results: Results, plot_files: list[str], summary: TuneSummary) -> list[str]:
    return TuneMarkdown().lines(results, tune_spec(results, summary), plot_files)
