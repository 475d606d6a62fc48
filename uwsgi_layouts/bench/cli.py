"""``uwsgi-layouts compare|openloop|faults|tune|doctor|report``: run an experiment kind, or re-render a stored run."""

from __future__ import annotations

import sys
from pathlib import Path

from uwsgi_layouts.bench.dataset import DatasetError
from uwsgi_layouts.bench.kinds import KINDS
from uwsgi_layouts.bench.kinds.base import publish
from uwsgi_layouts.bench.kinds.closedloop import ReplayError
from uwsgi_layouts.bench.load.httperf import HttperfError
from uwsgi_layouts.bench.load.traffic import TrafficError
from uwsgi_layouts.bench.load.wrk import WrkError
from uwsgi_layouts.bench.options import BadArgument, MissingTool
from uwsgi_layouts.bench.results import ResultsError, load
from uwsgi_layouts.deploy.cli import PROG, OneLineParser, parse_args
from uwsgi_layouts.deploy.model import LayoutError, RenderError, StackError

EXIT_BAD_INPUT = 2
BAD_INPUT = (BadArgument, LayoutError, ResultsError, ReplayError, DatasetError, TrafficError)
FAILED = (RenderError, StackError, MissingTool, HttperfError, WrkError)


def build_parser(prog: str = PROG) -> OneLineParser:
    parser = OneLineParser(prog=prog, description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    for kind in KINDS.values():
        kind.add_arguments(sub.add_parser(kind.name, help=kind.help))
    rep = sub.add_parser("report", help="render report.txt, report.md and plots from a stored results.json "
                                        "(any kind, any version this tool reads)")
    rep.add_argument("results", help="a results.json written by compare, openloop, faults, tune or doctor (or an "
                                     "old openloop.json)")
    rep.add_argument("--out", help="where to write the report files (default: beside the results file)")
    return parser


def cmd_report(args) -> int:
    results = load(args.results)
    out = Path(args.out) if args.out else Path(args.results).parent
    publish(results, out)
    return 0


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(build_parser(prog), argv)
    args.argv = argv  # the run records the command that reproduces it
    run = cmd_report if args.command == "report" else KINDS[args.command].run
    try:
        return run(args)
    except BAD_INPUT as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except FAILED as exc:
        print(f"error: {exc}", file=sys.stderr)
        for extra in (getattr(exc, "details", ""), getattr(exc, "log_tail", "")):
            if extra:
                print(extra, file=sys.stderr)
        return 1
