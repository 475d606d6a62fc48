"""The doctor report: the layout in use, the findings (each with what to do), the ``bench tune``
suggestion, and the window's figures per worker, per listen queue and from the access log.

Functions of a ``Results`` of kind ``doctor`` that RETURN lines. What was judged (the findings,
the tune command, whether a worker's memory growth is quoted) comes from the run's ``DoctorSummary``
(``bench.doctor_summary``: stored as summary.json beside results.json; for a run stored before
summaries, made once per report from the stored figures by ``bench.report.judged``); the figures
from results.json. The report judges nothing and holds no threshold.

Each diagnosis is built once into a ``DiagnosisSpec``; ``DoctorText`` (report.txt, the terminal)
and ``DoctorMarkdown`` (report.md) each say only how its parts are written (``bench.report.views``
does the same for compare's sections), so the two show the same facts, findings, tune command and
table rows. Not every figure, though: a table's heading is its own per format, and the text's
(``Figures.text_title``) carries figures the Markdown does not show (the workers' pile-up, full and
busy shares and their peak in flight; the listen queues' full count and kernel overflows), as the
reports did before the spec.
"""

from __future__ import annotations

from dataclasses import dataclass

from uwsgi_layouts.bench.diagnosis import Finding, layout_words
from uwsgi_layouts.bench.doctor_summary import DoctorSummary, Judgement
from uwsgi_layouts.bench.report.text import comment, md_footer, md_table, pct, table, wrap
from uwsgi_layouts.bench.report.views import check_lines, check_table, check_text
from uwsgi_layouts.bench.results import Diagnosis, Results

ENDINGS = {"complete": "", "stopped": "STOPPED EARLY", "interrupted": "INTERRUPTED"}


def _header(d: Diagnosis, results: Results) -> list[str]:
    samples = d.inflight.get("samples", 0)
    head = [f"doctor: uWSGI {d.layout.get('uwsgi') or '?'} at {d.address}, {d.observed_s:.1f} s of {d.planned_s:g} "
            f"watched at {d.hz:g} reads/s ({samples} samples), started {results.created or '?'}",
            f"layout: {layout_words(d.layout)} ({d.layout['evidence']})"]
    if d.layout.get("config"):
        head.append(f"config: {d.layout['config']}")
    if d.ended != "complete":
        head.append(f"{ENDINGS[d.ended]}: {d.end_note}")
    return head


def _shares(d: Diagnosis, wid: str) -> str:
    dist = d.inflight.get("workers", {}).get(wid, {})
    threads = int(d.inflight.get("threads", d.layout["threads"]))
    return " ".join(f"{round(100 * dist.get(str(n), 0.0)):d}" for n in range(threads + 1)) if dist else "n/a"


def _memory(d: Diagnosis, j: Judgement, wid: str) -> str:
    m = d.memory.get("workers", {}).get(wid)
    if not m:
        return "n/a"
    return f"{m['last_mb']:.1f} ({m['growth_mb_per_h']:+.0f}/h)" if wid in j.growth_quoted else f"{m['last_mb']:.1f}"


def worker_rows(d: Diagnosis, j: Judgement) -> tuple[list[str], list[list[str]]]:
    threads = int(d.inflight.get("threads", d.layout["threads"]))
    kind = d.memory.get("kind", "memory").upper()
    headers = ["worker", "pid", "requests", "mean ms", f"% of time with\n0..{threads} in flight", "harakiri",
               "respawns", f"{kind} MB\n(growth)"]
    rows = [[w, str(f.get("pid", "")), str(f["requests"]), f"{f['mean_ms']:.1f}" if "mean_ms" in f else "n/a",
             _shares(d, w), str(f.get("harakiri", "n/a")), str(f.get("respawns", "n/a")), _memory(d, j, w)]
            for w, f in d.workers.items()]
    return headers, rows


def queue_rows(d: Diagnosis) -> tuple[list[str], list[list[str]]]:
    rows = [[name, str(f["max"]), str(f["backlog"] or "?"), pct(f["nonempty"])]
            for name, f in d.queue.get("sockets", {}).items()]
    return ["socket", "longest queue", "backlog", "not empty"], rows


def _ms(figures: dict, key: str) -> str:
    return f"{figures[key]:.1f}" if key in figures else "n/a"


def access_line(d: Diagnosis) -> str:
    a = d.access
    formats = ", ".join(f"{n} {f}" for f, n in a.get("formats", {}).items()) or "none recognised"
    timing = {"upstream": "latency: $upstream_response_time", "request": "latency: $request_time (nginx's whole "
              "time; add $upstream_response_time for uWSGI's own)",
              "none": "no latency in this format: append $upstream_addr $upstream_response_time to its log_format"}
    text = (f"access log {a['file']}: {a['lines']} lines in the window, {a['used']} read ({formats}); "
            f"{timing.get(a.get('timing', 'none'))}")
    return text + ("; only the first 256 MB were read" if a.get("cut") else "")


@dataclass(frozen=True)
class Figures:
    """One table of the window's figures: its heading in each format (the text's carries what the
    Markdown says in ``note`` under its own), its columns and rows."""

    text_title: str
    title: str
    headers: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    align: str
    note: str = ""

    def __post_init__(self):
        for name in ("text_title", "title", "note"):
            check_text(name, getattr(self, name))
        check_table("figures", self.headers, self.rows, self.align, len(self.headers))


@dataclass(frozen=True)
class DiagnosisSpec:
    """One diagnosis as both formats show it, built once from the figures and their judgement:
    the window's facts, the findings (each with what to do), the tune command to try ("": none),
    the workers' and listen queues' tables, the access log's line ("": not read) and its tables."""

    facts: tuple[str, ...]
    findings: tuple[Finding, ...]
    tune: str
    workers: Figures
    queues: Figures
    access: str
    access_tables: tuple[Figures, ...]

    def __post_init__(self):
        check_lines("facts", self.facts)
        check_text("tune", self.tune)
        check_text("access", self.access)
        if not isinstance(self.findings, tuple) or not all(isinstance(f, Finding) for f in self.findings):
            raise ValueError(f"findings: a tuple of Finding, got {self.findings!r:.80}")
        tables = (self.workers, self.queues, *self.access_tables) if isinstance(self.access_tables, tuple) else ()
        if not tables or not all(isinstance(f, Figures) for f in tables):
            raise ValueError("workers, queues, access_tables: Figures (access_tables a tuple of them)")


def _figures(text_title: str, title: str, headers: list[str], rows: list[list[str]], align: str,
             note: str = "") -> Figures:
    return Figures(text_title, title, tuple(headers), tuple(tuple(r) for r in rows), align, note)


def access_tables(d: Diagnosis) -> tuple[Figures, ...]:
    """The access log's tables that hold rows: per status class, and per upstream socket when logged."""
    a = d.access
    status = [[c, str(f["requests"]), _ms(f, "p50_ms"), _ms(f, "p99_ms"), _ms(f, "max_ms")]
              for c, f in a.get("status", {}).items()]
    ups = [[u, str(f["requests"]), _ms(f, "p50_ms"), _ms(f, "p99_ms"), _ms(f, "mean_ms")]
           for u, f in a.get("upstreams", {}).items()]
    tables = [("answers per status class", ["status", "requests", "p50 ms", "p99 ms", "max ms"], status),
              ("per upstream socket (each attempt)", ["upstream", "attempts", "p50 ms", "p99 ms", "mean ms"], ups)]
    return tuple(_figures(title, title[:1].upper() + title[1:], headers, rows, "<" + ">" * (len(headers) - 1))
                 for title, headers, rows in tables if rows)


def diagnosis_spec(d: Diagnosis, j: Judgement, results: Results) -> DiagnosisSpec:
    inflight, queue = d.inflight, d.queue
    workers = _figures(f"Workers over the window (pile-up {pct(inflight.get('pileup'))}, some worker full "
                       f"{pct(inflight.get('full', 0.0))}, every thread busy {pct(inflight.get('saturated', 0.0))}, "
                       f"peak {inflight.get('peak', 0)} in flight)", "Workers", *worker_rows(d, j), "<>>>>>>>")
    overflows, errors = queue.get("kernel_overflows"), queue.get("uwsgi_queue_errors")
    queues = _figures(f"Listen queues ({queue.get('source', '')}"
                      + (f"; uWSGI found a queue full {errors} time(s) in the window" if errors else "")
                      + (f"; kernel TCP listen overflows in the window: {overflows}" if overflows is not None else "")
                      + ")", "Listen queues", *queue_rows(d), "<>>>", note=f"Read from: {queue.get('source', '')}.")
    return DiagnosisSpec(tuple(_header(d, results)), j.findings, j.tune, workers, queues,
                         access_line(d) if d.access else "", access_tables(d) if d.access else ())


def specs(results: Results, summary: DoctorSummary) -> list[DiagnosisSpec]:
    return [diagnosis_spec(d, j, results) for d, j in zip(results.diagnoses, summary.diagnoses, strict=True)]


class DoctorText:
    """report.txt and the terminal: facts as lines, findings numbered with their action below."""

    def table(self, f: Figures) -> list[str]:
        return [f"{f.text_title}:"] + table(list(f.headers), [list(r) for r in f.rows], f.align)

    def lines(self, s: DiagnosisSpec) -> list[str]:
        out = list(s.facts) + ["", "Findings:"]
        for i, f in enumerate(s.findings, 1):
            out += wrap(f"{i}. {f.text}", "  ", "     ")
            out += wrap(f"-> {f.action}", "     ", "        ")
        if not s.findings:
            out.append("  none: no sample was read")
        if s.tune:
            out += ["", "Try (where uwsgi-layouts is installed, with the app's code; measures layouts with your app):",
                    f"  {s.tune}"]
        out += [""] + self.table(s.workers) + [""] + self.table(s.queues)
        if s.access:
            out += [""] + wrap(s.access) + [x for f in s.access_tables for x in self.table(f)]
        return out


class DoctorMarkdown:
    """report.md: facts as a list, a ``##`` section each, the tune command as a shell block."""

    def table(self, f: Figures) -> list[str]:
        return md_table(list(f.headers), [list(r) for r in f.rows], f.align) + [""]

    def lines(self, s: DiagnosisSpec) -> list[str]:
        out = [f"- {line}" for line in s.facts] + ["", "## Findings", ""]
        out += [f"{i}. {f.text}  \n   **Do:** {f.action}" for i, f in enumerate(s.findings, 1)] + [""]
        if s.tune:
            out += ["## Layout to try", "", "```sh", s.tune, "```", ""]
        for f in (s.workers, s.queues):
            out += [f"## {f.title}", ""] + ([f.note, ""] if f.note else []) + self.table(f)
        if s.access:
            out += ["## Access log", "", s.access, ""]
            out += [x for f in s.access_tables for x in [f"{f.title}:", ""] + self.table(f)]
        return out


def terminal_lines(results: Results, summary: DoctorSummary) -> list[str]:
    out = [f"note: {comment(results)}", ""] if comment(results) else []
    return out + [x for s in specs(results, summary) for x in DoctorText().lines(s)]


def markdown_lines(results: Results, plot_files: list[str], summary: DoctorSummary) -> list[str]:
    out = ["# Doctor: a running uWSGI, diagnosed", ""]
    if comment(results):
        out += [f"> **Note:** {comment(results)}", ""]
    out += [x for s in specs(results, summary) for x in DoctorMarkdown().lines(s)]
    return out + md_footer(results, plot_files)
