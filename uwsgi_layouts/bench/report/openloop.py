"""The open-loop report (rate steps, httperf): the knee, the steps table, the rule.

Functions of a ``Results`` of kind ``openloop`` that RETURN lines (nothing prints); the knee
is derived from the steps (``Results.knee``), never read from the file.
"""

from __future__ import annotations

from uwsgi_layouts.bench.analysis import MIN_RATE_OF_TARGET, REPLIES_OF_REQUESTS
from uwsgi_layouts.bench.load.httperf import CLIENT_ERRORS, SERVER_ERRORS
from uwsgi_layouts.bench.report.subject import subject_lines, subject_markdown
from uwsgi_layouts.bench.report.text import comment, md_kv, md_table, plot_lines, table, wrap
from uwsgi_layouts.bench.results import Results, Step
from uwsgi_layouts.bench.verdict import mixes

RULE = (f"A step passes when replies >= {REPLIES_OF_REQUESTS:.0%} of requests, the lowest 5-s reply-rate sample "
        f">= {MIN_RATE_OF_TARGET:.0%} of the offered rate (the first sample, which holds the ramp-up, is left out "
        "when there are others), and no server-side error (4xx/5xx, client timeouts, "
        "refused or reset connections); client-side errors (fd-unavail, addrunavail, ftab-full, other) make it "
        "invalid. httperf opens one connection per request at the offered rate, whatever the server does.")
ALIGN = "<>>>>><>><"


def _errors_text(step: Step) -> str:
    e, s = step.errors, step.status
    parts = [f"{k}={s[k]}" for k in ("4xx", "5xx") if s.get(k)]
    parts += [f"{k.replace('_', '-')}={e[k]}" for k in (*SERVER_ERRORS, *CLIENT_ERRORS) if e.get(k)]
    return ", ".join(parts) or "0"


def step_line(step: Step) -> str:
    """One line per finished step (printed while the run goes on)."""
    r = step.reply_rate
    return (f"rate {step.rate:g}/s: {step.replies}/{step.requests} replies, reply rate min {r['min']:g} "
            f"avg {r['avg']:g} max {r['max']:g} ({r['samples']} samples), errors {_errors_text(step)}: "
            f"{step.verdict}" + (f" ({'; '.join(step.reasons)})" if step.reasons else ""))


def knee_text(results: Results) -> str:
    k = results.knee
    if k["status"] == "found":
        text = (f"knee: {k['rate']:g} req/s, the last offered rate whose replies kept up; at {k['next_rate']:g} "
                f"req/s they fell behind ({'; '.join(k['next_reasons'])})")
    elif k["status"] == "not reached":
        text = f"knee: not reached; every rate up to {k['rate']:g} req/s passed: try higher --rates"
    elif k["status"] == "below the first rate":
        text = (f"knee: below {k['next_rate']:g} req/s, the first rate tried, which already fell behind "
                f"({'; '.join(k['next_reasons'])}): try lower --rates")
    elif k["status"] == "client-limited":
        text = (f"knee: not found; at {k['next_rate']:g} req/s the client was the limit "
                f"({'; '.join(k['next_reasons'])})" + (f"; {k['rate']:g} req/s passed" if k["rate"] else ""))
    else:
        text = "knee: no steps were measured"
    return text + "."


def _rows(results: Results) -> tuple[list[str], list[list[str]]]:
    headers = ["rate/s", "requests", "replies", "reply rate samples", "steady min\n/rate", "conn ms\nmedian/max",
               "errors", "server cores", "httperf CPU", "result"]
    rows = []
    for s in results.steps:
        r, c = s.reply_rate, s.connection_ms
        rows.append([
            f"{s.rate:g}", str(s.requests), str(s.replies),
            " ".join(f"{x:g}" for x in r["each"]) if r.get("each") else f"min {r['min']:g} max {r['max']:g}",
            f"{s.steady_min / s.rate:.2f}", f"{c.get('median', 0):g}/{c.get('max', 0):g}" if c else "",
            _errors_text(s), f"{s.server_cpu_cores:.2f}",
            f"{s.client_cpu_pct:.0f}%" if s.client_cpu_pct is not None else "", s.verdict,
        ])
    return headers, rows


def _header(results: Results) -> str:
    a, env = results.arguments, results.environment
    target = f"files ({a['files']}, random ids from the data set)" if a.get("files") else \
        "your requests (below)" if mixes(results) else f"GET {a.get('path')}"
    return (f"open loop (httperf {env.get('httperf', '')}, fixed request rate): {a.get('layout')}, {target}, "
            f"steps of {a.get('step_s', 0):g} s" + (f", {env['nproc']} cores" if env.get("nproc") else "")
            + (f", httperf under nice {a['client_nice']}" if a.get("client_nice") else ""))


def _generator(results: Results) -> list[str]:
    """Where httperf ran (bench.load.generator), for results that recorded it."""
    where = results.environment.get("load_generator")
    return [f"load generator: {where}"] if where else []


def terminal_lines(results: Results) -> list[str]:
    out = wrap(_header(results)) + [x for line in _generator(results) for x in wrap(line)] + subject_lines(results)
    if comment(results):
        out += wrap(f"note: {comment(results)}")
    out += [""] + wrap(knee_text(results)) + [""]
    headers, rows = _rows(results)
    out += table(headers, rows, ALIGN)
    for s in results.steps:
        if s.reasons:
            out += wrap(f"{s.rate:g}/s: " + "; ".join(s.reasons), indent="  ")
    out += [""] + wrap(RULE)
    return out


def markdown_lines(results: Results, plot_files: list[str]) -> list[str]:
    out = ["# Open-loop benchmark (httperf)", "", _header(results) + ".", "",
           *[x for line in _generator(results) for x in (line + ".", "")], *subject_markdown(results)]
    if comment(results):
        out += [f"> **Note:** {comment(results)}", ""]
    out += [f"**{knee_text(results)}**", "", RULE, ""]
    headers, rows = _rows(results)
    out += md_table(headers, rows, ALIGN) + [""]
    reasons = [f"- {s.rate:g}/s: {'; '.join(s.reasons)}" for s in results.steps if s.reasons]
    if reasons:
        out += reasons + [""]
    command = results.arguments.get("command")
    if command:
        out += ["## How to reproduce", "", "```sh", command, "```", ""]
    return out + md_kv("Environment", results.environment) + plot_lines(plot_files)
