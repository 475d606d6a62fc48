"""``uwsgi-layouts COMMAND [options]``: every command of the toolkit, from any directory.

The layout commands are deploy's (``uwsgi_layouts.deploy.cli``), the experiments bench's
(``uwsgi_layouts.bench.cli``); a few tools of their own parse their own options. This module
only routes the first word; ``uwsgi-layouts COMMAND --help`` is the command's own help.

The routing table is written out rather than read from the parsers so that a command imports
only the side it belongs to: the bench side pulls in numpy and scipy.special (about half a
CPU-second at every start; matplotlib only when a run writes its plots), which ``render``, ``run``
or ``install`` never need. tests/test_console.py holds the table equal to the parsers' subcommands,
and checks what a layout command and a bench command's --help load.
"""

from __future__ import annotations

import importlib
import sys

PROG = "uwsgi-layouts"
EXIT_BAD_INPUT = 2

DEPLOY = "uwsgi_layouts.deploy.cli"
BENCH = "uwsgi_layouts.bench.cli"

# command -> (the module whose main(argv) runs it, one line of help). deploy's and bench's parsers
# take the command word themselves; the tools (TOOLS) parse what follows it.
COMMANDS: dict[str, tuple[str, str]] = {
    "render": (DEPLOY, "write nginx.conf, uwsgi.ini and layout.json for a layout"),
    "run": (DEPLOY, "render into a run directory and serve the layout until Ctrl-C"),
    "reload": (DEPLOY, "chain-reload the uWSGI workers of a running layout, one at a time"),
    "certs": (DEPLOY, "make a CA, one server certificate per app host and nginx's client certificate, for "
                      "--uwsgi-tls"),
    "bundle": (DEPLOY, "write a production bundle (nginx site, uwsgi.ini, systemd unit, INSTALL.md) for a "
                       "Debian/Ubuntu server"),
    "install": (DEPLOY, "install a bundle: copy, enable, nginx -t (undone if it fails), start where systemd runs"),
    "uninstall": (DEPLOY, "remove what install wrote for a bundle: the site first (nginx reloaded), then the app "
                          "(stopped gracefully), then the files"),
    "compare": (BENCH, "measure layouts side by side and write results + report"),
    "openloop": (BENCH, "fixed request rates with httperf, stepped up until replies fall behind"),
    "faults": (BENCH, "faults under load (kill -9, stuck requests, full backlog, reloads): figures table"),
    "tune": (BENCH, "recommend a layout for your app from measurements, and write its configs"),
    "doctor": (BENCH, "diagnose a running uWSGI from its stats server (pile-up, saturation, listen queue, "
                      "harakiri, memory) and suggest a layout to try, without a benchmark"),
    "plan": (BENCH, "how many replicas of a pod carry a target rate within a p99: one replica measured in open "
                    "loop, the plan, its autoscaler settings and memory, and (--check) the plan run"),
    "report": (BENCH, "render report.txt, report.md and plots from a stored results.json (any kind, any version "
                      "this tool reads)"),
    "dataset": ("uwsgi_layouts.bench.dataset", "make the file set for the file-offload scenarios (and nginx's id "
                                               "map)"),
    "map-scale": ("uwsgi_layouts.bench.mapscale", "nginx's id map by id count: build time, nginx start, memory"),
    "tune-accuracy": ("uwsgi_layouts.bench.tune.accuracy", "tune against an exhaustive grid of the same space "
                                                          "(a benchmark)"),
    "watch": ("uwsgi_layouts.bench.watchcli", "export a running service's figures to Prometheus, continuously "
                                              "(pile-up, busy threads, accept queues, busy ratio, latency histograms)"),
    "watch-rules": ("uwsgi_layouts.bench.watchrulescli", "write Prometheus alert rules and a Grafana dashboard over "
                                                         "watch's metrics"),
}
TOOLS = ("dataset", "map-scale", "tune-accuracy", "watch", "watch-rules")


def usage() -> str:
    width = max(len(name) for name in COMMANDS)
    lines = [f"usage: {PROG} COMMAND [options]   ({PROG} COMMAND --help for a command's options)", "",
             "How to run a WSGI app behind nginx + uWSGI (or a peer), from measurements: compare and tune",
             "layouts, render and run them, ship them to a server, watch the running service.", "", "commands:"]
    lines += [f"  {name.ljust(width)}  {text}" for name, (_, text) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        print(f"{PROG}: error: the following arguments are required: command ({PROG} --help lists them)",
              file=sys.stderr)
        return EXIT_BAD_INPUT
    if argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    command = argv[0]
    if command not in COMMANDS:
        print(f"{PROG}: error: unknown command {command!r}; commands: {', '.join(COMMANDS)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    module = importlib.import_module(COMMANDS[command][0])
    if command in TOOLS:
        return module.main(argv[1:])
    return module.main(argv, prog=PROG)
