"""What a closed-loop run measured (the app, its virtualenv, the request mix) and the answers'
status classes, for the compare report. Lines only; nothing prints.

A run of the demo app with its own scenarios renders as before (nothing added). For another app,
or the demo app with the user's requests, the report names the app, app dir, virtualenv and mix,
and the article's verdict is not shown (it is about the demo app's request).
"""

from __future__ import annotations

from uwsgi_layouts.bench.report.text import md_table, wrap
from uwsgi_layouts.bench.results import Results
from uwsgi_layouts.bench.verdict import app_record, is_demo_run, mixes

MAX_REQUEST_ROWS = 20

def _mix_summary(mix: dict, limit: int = 3) -> str:
    requests = sorted(mix.get("requests") or [], key=lambda r: -r.get("weight", 0))
    shown = ", ".join(f"{_label(r)} {r.get('share', 0):.0%}" for r in requests[:limit])
    more = f", and {len(requests) - limit} more" if len(requests) > limit else ""
    return f"{len(requests)} request{'s' if len(requests) != 1 else ''}: {shown}{more}"

def _label(r: dict) -> str:
    text = f"{r.get('method', '?')} {r.get('target', '?')}"
    if "body_bytes" in r:
        text += f" @{r['body_file']}" if r.get("body_file") else ""
        text += f" ({r['body_bytes']} bytes)"
    return text

def _app_text(app: dict) -> str:
    text = f"app: {app.get('app', '?')} from {app.get('app_dir', '?')}"
    if app.get("virtualenv"):
        text += f", virtualenv {app['virtualenv']}"
    if app.get("env"):
        text += f", env {', '.join(app['env'])}"
    return text + (" (the demo app)" if app.get("demo") else "")

def subject_lines(results: Results) -> list[str]:
    """Terminal: the app and each scenario's mix (nothing for a demo run)."""
    if is_demo_run(results):
        return []
    out = wrap(_app_text(app_record(results))) if app_record(results) else []
    for name, mix in mixes(results).items():
        headers = ", ".join(n for n, _ in mix.get("headers") or [])
        out += wrap(f"traffic ({name}): {_mix_summary(mix)}" + (f"; headers {headers}" if headers else "")
                    + (f"; from {mix['source']}" if mix.get("source") else ""))
    return out

def subject_markdown(results: Results) -> list[str]:
    """Markdown: a "What was measured" section (nothing for a demo run)."""
    if is_demo_run(results):
        return []
    app = app_record(results)
    out = ["## What was measured", ""]
    if app:
        rows = [["app", str(app.get("app", ""))], ["app dir", str(app.get("app_dir", ""))],
                ["virtualenv", str(app.get("virtualenv") or "(this project's)")],
                ["demo app", "yes" if app.get("demo") else "no"]]
        if app.get("env"):
            rows.append(["env (names only)", ", ".join(app["env"])])
        if app.get("static"):
            rows.append(["static", ", ".join(f"{p}/ = {d}" for p, d in app["static"])])
        out += md_table(["", ""], rows) + [""]
    for name, mix in mixes(results).items():
        requests = sorted(mix.get("requests") or [], key=lambda r: -r.get("weight", 0))
        out += [f"Scenario `{name}` sent {_mix_summary(mix, limit=0).split(':')[0]}"
                + (f" ({mix['source']})" if mix.get("source") else "")
                + ", each drawn at random by weight (seeded with the repeat number):", ""]
        rows = [[_label(r), str(r.get("weight", "")), f"{r.get('share', 0):.1%}"] for r in requests[:MAX_REQUEST_ROWS]]
        out += md_table(["request", "weight", "share"], rows, "<>>") + [""]
        if len(requests) > MAX_REQUEST_ROWS:
            rest = sum(r.get("share", 0) for r in requests[MAX_REQUEST_ROWS:])
            out += [f"... and {len(requests) - MAX_REQUEST_ROWS} more requests ({rest:.1%} of the traffic); "
                    "results.json lists them all.", ""]
        if mix.get("headers"):
            out += ["Headers sent with every request: " + ", ".join(f"`{n}: {v}`" for n, v in mix["headers"]), ""]
    return out

def short_workload(results: Results) -> dict:
    """The workload with each mix replaced by its summary (the mix has its own section)."""
    out = {}
    for name, data in results.workload.items():
        if isinstance(data, dict) and isinstance(data.get("traffic"), dict):
            data = {**data, "traffic": _mix_summary(data["traffic"])}
        out[name] = data
    return out

def status_text(status: dict[str, int]) -> str:
    """``3xx 12, 4xx 3``: the answers that were not 2xx ("" when all were)."""
    return ", ".join(f"{k} {n}" for k, n in status.items() if k != "2xx" and n)

def any_non_2xx(groups) -> bool:
    return any(g.non_2xx for g in groups)
