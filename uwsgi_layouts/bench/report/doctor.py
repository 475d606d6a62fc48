"""The doctor report: the layout in use, the findings (each with what to do), the ``bench tune``
suggestion, and the window's figures per worker, per listen queue and from the access log.

Functions of a ``Results`` of kind ``doctor`` that RETURN lines. What was judged (the findings,
the tune command, whether a worker's memory growth is quoted) comes from the run's ``DoctorSummary``
(``bench.doctor_summary``: stored as summary.json beside results.json; for a run stored before
summaries, made once per report from the stored figures by ``bench.report.judged``); the figures
from results.json. The report judges nothing and holds no threshold.
"""

from __future__ import annotations

from uwsgi_layouts.bench.diagnosis import layout_words
from uwsgi_layouts.bench.doctor_summary import DoctorSummary, Judgement
from uwsgi_layouts.bench.report.text import comment, md_footer, md_table, pct, table, wrap
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


def access_tables(d: Diagnosis) -> list[tuple[str, list[str], list[list[str]]]]:
    a = d.access
    status = [[c, str(f["requests"]), _ms(f, "p50_ms"), _ms(f, "p99_ms"), _ms(f, "max_ms")]
              for c, f in a.get("status", {}).items()]
    ups = [[u, str(f["requests"]), _ms(f, "p50_ms"), _ms(f, "p99_ms"), _ms(f, "mean_ms")]
           for u, f in a.get("upstreams", {}).items()]
    out = [("answers per status class", ["status", "requests", "p50 ms", "p99 ms", "max ms"], status)]
    if ups:
        out.append(("per upstream socket (each attempt)", ["upstream", "attempts", "p50 ms", "p99 ms", "mean ms"], ups))
    return out


def access_line(d: Diagnosis) -> str:
    a = d.access
    formats = ", ".join(f"{n} {f}" for f, n in a.get("formats", {}).items()) or "none recognised"
    timing = {"upstream": "latency: $upstream_response_time", "request": "latency: $request_time (nginx's whole "
              "time; add $upstream_response_time for uWSGI's own)",
              "none": "no latency in this format: append $upstream_addr $upstream_response_time to its log_format"}
    text = (f"access log {a['file']}: {a['lines']} lines in the window, {a['used']} read ({formats}); "
            f"{timing.get(a.get('timing', 'none'))}")
    return text + ("; only the first 256 MB were read" if a.get("cut") else "")


def terminal_lines(results: Results, summary: DoctorSummary) -> list[str]:
    out = [f"note: {comment(results)}", ""] if comment(results) else []
    for d, j in zip(results.diagnoses, summary.diagnoses, strict=True):
        out += _header(d, results) + ["", "Findings:"]
        found = j.findings
        for i, f in enumerate(found, 1):
            out += wrap(f"{i}. {f.text}", "  ", "     ")
            out += wrap(f"-> {f.action}", "     ", "        ")
        if not found:
            out.append("  none: no sample was read")
        if j.tune:
            out += ["", "Try (where uwsgi-layouts is installed, with the app's code; measures layouts with your app):",
                    f"  {j.tune}"]
        headers, rows = worker_rows(d, j)
        out += ["", f"Workers over the window (pile-up {pct(d.inflight.get('pileup'))}, some worker full "
                    f"{pct(d.inflight.get('full', 0.0))}, every thread busy {pct(d.inflight.get('saturated', 0.0))}, "
                    f"peak {d.inflight.get('peak', 0)} in flight):"]
        out += table(headers, rows, "<>>>>>>>")
        headers, rows = queue_rows(d)
        overflows = d.queue.get("kernel_overflows")
        errors = d.queue.get("uwsgi_queue_errors")
        out += ["", f"Listen queues ({d.queue.get('source', '')}"
                    + (f"; uWSGI found a queue full {errors} time(s) in the window" if errors else "")
                    + (f"; kernel TCP listen overflows in the window: {overflows}" if overflows is not None else "")
                    + "):"]
        out += table(headers, rows, "<>>>")
        if d.access:
            out += [""] + wrap(access_line(d))
            for title, headers, rows in access_tables(d):
                if rows:
                    out += [f"{title}:"] + table(headers, rows, "<" + ">" * (len(headers) - 1))
    return out


def markdown_lines(results: Results, plot_files: list[str], summary: DoctorSummary) -> list[str]:
    out = ["# Doctor: a running uWSGI, diagnosed", ""]
    if comment(results):
        out += [f"> **Note:** {comment(results)}", ""]
    for d, j in zip(results.diagnoses, summary.diagnoses, strict=True):
        out += [f"- {line}" for line in _header(d, results)] + ["", "## Findings", ""]
        out += [f"{i}. {f.text}  \n   **Do:** {f.action}" for i, f in enumerate(j.findings, 1)] + [""]
        if j.tune:
            out += ["## Layout to try", "", "```sh", j.tune, "```", ""]
        headers, rows = worker_rows(d, j)
        out += ["## Workers", ""] + md_table([h.replace("\n", " ") for h in headers], rows, "<>>>>>>>") + [""]
        headers, rows = queue_rows(d)
        out += ["## Listen queues", "", f"Read from: {d.queue.get('source', '')}.", ""]
        out += md_table(headers, rows, "<>>>") + [""]
        if d.access:
            out += ["## Access log", "", access_line(d), ""]
            for title, headers, rows in access_tables(d):
                if rows:
                    out += [f"{title[0].upper()}{title[1:]}:", ""]
                    out += md_table(headers, rows, "<" + ">" * (len(headers) - 1)) + [""]
    return out + md_footer(results, plot_files)
