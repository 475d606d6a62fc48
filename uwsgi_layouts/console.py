"""``uwsgi-layouts COMMAND [options]``: every command of the toolkit, from any directory.

The layout commands are deploy's (``uwsgi_layouts.deploy.cli``), the experiments bench's
(``uwsgi_layouts.bench.cli``); a few tools of their own parse their own options. This module
only routes the first word; ``uwsgi-layouts COMMAND --help`` is the command's own help.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from uwsgi_layouts.bench import cli as bench_cli
from uwsgi_layouts.bench import dataset, mapscale
from uwsgi_layouts.bench.tune import accuracy
from uwsgi_layouts.deploy import cli as deploy_cli

PROG = deploy_cli.PROG
EXIT_BAD_INPUT = 2

# The tools beside the two parsers: name -> (main(argv), one line of help).
TOOLS: dict[str, tuple[Callable[[list[str]], int], str]] = {
    "dataset": (dataset.main, "make the file set for the file-offload scenarios (and nginx's id map)"),
    "map-scale": (mapscale.main, "nginx's id map by id count: build time, nginx start, memory"),
    "tune-accuracy": (accuracy.main, "tune against an exhaustive grid of the same space (a benchmark)"),
}


def subcommands(parser) -> dict[str, str]:
    """The subcommands of an argparse parser, with their help lines."""
    action = next(a for a in parser._subparsers._group_actions)  # argparse keeps them here
    helps = {choice.dest: choice.help for choice in action._choices_actions}
    return {name: helps.get(name, "") for name in action.choices}


def commands() -> dict[str, tuple[Callable[[list[str]], int], str]]:
    table = {name: (lambda argv, f=deploy_cli.main: f(argv, prog=PROG), text)
             for name, text in subcommands(deploy_cli.build_parser(PROG)).items()}
    table |= {name: (lambda argv, f=bench_cli.main: f(argv, prog=PROG), text)
              for name, text in subcommands(bench_cli.build_parser(PROG)).items()}
    return table | TOOLS


def usage(table: dict) -> str:
    width = max(len(name) for name in table)
    lines = [f"usage: {PROG} COMMAND [options]   ({PROG} COMMAND --help for a command's options)", "",
             "How to run a WSGI app behind nginx + uWSGI (or a peer), from measurements: compare and tune",
             "layouts, render and run them, ship them to a server, watch the running service.", "", "commands:"]
    lines += [f"  {name.ljust(width)}  {text}" for name, text in ((n, t) for n, (_, t) in table.items())]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    table = commands()
    if not argv:
        print(f"{PROG}: error: the following arguments are required: command ({PROG} --help lists them)",
              file=sys.stderr)
        return EXIT_BAD_INPUT
    if argv[0] in ("-h", "--help"):
        print(usage(table))
        return 0
    command = argv[0]
    if command not in table:
        print(f"{PROG}: error: unknown command {command!r}; commands: {', '.join(table)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    run, _ = table[command]
    # The deploy and bench parsers take the command word themselves; a tool takes what follows it.
    return run(argv) if command not in TOOLS else run(argv[1:])
