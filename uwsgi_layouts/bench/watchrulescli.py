"""``uwsgi-layouts watch-rules``: Prometheus alert rules and a Grafana dashboard over watch's metrics.

    uwsgi-layouts watch-rules --p99-ms MS [--out DIR]

Writes ``uwsgi-layouts-watch.rules.yml`` (load it with Prometheus's ``rule_files``; ``promtool
check rules`` passes on it) and ``uwsgi-layouts-watch.dashboard.json`` (Grafana: Dashboards ->
Import; it asks for the Prometheus data source) into DIR, a new or empty directory (default
results/<timestamp>-watch-rules). The alerts: sustained pile-up, an accept queue full or
growing, every thread busy, a 5xx share, and p99 over the target given here (``bench.watch.rules``).
"""

from __future__ import annotations

from pathlib import Path

from uwsgi_layouts.arguments import PROG, Numbers, OneLineParser
from uwsgi_layouts.bench.options import prepare_out, tool_main
from uwsgi_layouts.bench.watch import dashboard_json, rules_yaml

RULES_NAME = "uwsgi-layouts-watch.rules.yml"
DASHBOARD_NAME = "uwsgi-layouts-watch.dashboard.json"
MAX_P99_MS = 600_000.0
P99_MS = Numbers(1, MAX_P99_MS)
HELP = "write Prometheus alert rules and a Grafana dashboard over watch's metrics (p99 target given here)"


def build_parser(prog: str = f"{PROG} watch-rules") -> OneLineParser:
    p = OneLineParser(prog=prog, description=HELP)
    p.add_argument("--p99-ms", required=True, metavar="MS", type=P99_MS,
                   help=f"alert when the upstream's p99 stays above this many milliseconds ({P99_MS})")
    p.add_argument("--out", help="a new or empty directory for the two files (default results/<timestamp>-watch-rules)")
    return p


def run(args) -> int:
    p99_s = args.p99_ms / 1000
    out = prepare_out(args.out, "-watch-rules")
    written = []
    for name, text in ((RULES_NAME, rules_yaml(p99_s)), (DASHBOARD_NAME, dashboard_json(p99_s))):
        path = Path(out) / name
        path.write_text(text)
        written.append(str(path))
    print("wrote " + " and ".join(written))
    return 0


def main(argv: list[str] | None = None) -> int:
    return tool_main(build_parser, run, argv)
