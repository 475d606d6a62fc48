"""``uwsgi-layouts compare|openloop|faults|tune|doctor|plan|report``: run a kind, or re-render a stored run."""

from __future__ import annotations

import sys
from pathlib import Path

from uwsgi_layouts.arguments import EXIT_BAD_INPUT, PROG, OneLineParser
from uwsgi_layouts.bench.dataset import DatasetError
from uwsgi_layouts.bench.kinds import KINDS
from uwsgi_layouts.bench.kinds.base import RESULTS_NAME, publish
from uwsgi_layouts.bench.kinds.closedloop import ReplayError
from uwsgi_layouts.bench.load.httperf import HttperfError
from uwsgi_layouts.bench.load.traffic import TrafficError
from uwsgi_layouts.bench.load.wrk import WrkError
from uwsgi_layouts.bench.options import BadArgument, MissingTool
from uwsgi_layouts.bench.report import AnySummary, renderer
from uwsgi_layouts.bench.report.plan import PLAN_JSON, read_plan, write_plan_reports
from uwsgi_layouts.bench.results import Results, ResultsError, load
from uwsgi_layouts.bench.summary import SUMMARY_NAME, OldSummary
from uwsgi_layouts.deploy.cli import parse_args
from uwsgi_layouts.deploy.model import LayoutError, RenderError, StackError

BAD_INPUT = (BadArgument, LayoutError, ResultsError, ReplayError, DatasetError, TrafficError)
FAILED = (RenderError, StackError, MissingTool, HttperfError, WrkError)


def build_parser(prog: str = PROG) -> OneLineParser:
    parser = OneLineParser(prog=prog, description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    for kind in KINDS.values():
        kind.add_arguments(sub.add_parser(kind.name, help=kind.help))
    rep = sub.add_parser("report", help="render report.txt, report.md and plots from a stored results.json "
                                        "(any kind, any version this tool reads)")
    rep.add_argument("results", help="a run's directory, or its results.json (compare, openloop, faults, tune, "
                                     "doctor; or an old openloop.json) or plan.json (plan); a compare, tune or "
                                     "doctor run's judgements come from the summary.json beside it, when there is "
                                     "one")
    rep.add_argument("--out", help="where to write the report files (default: beside the results file)")
    return parser


def stored_run(path: Path) -> Path:
    """The results file a run's directory holds (results.json, else plan.json), or ``path``."""
    if not path.is_dir():
        return path
    found = next((path / name for name in (RESULTS_NAME, PLAN_JSON) if (path / name).is_file()), None)
    if found is None:
        raise ResultsError(f"results: {path} holds neither {RESULTS_NAME} nor {PLAN_JSON}")
    return found


def cmd_report(args) -> int:
    source = stored_run(Path(args.results))
    out = Path(args.out) if args.out else source.parent
    if source.name == PLAN_JSON:  # plan's own file: its report is rendered from it alone
        print("\n".join(write_plan_reports(out, read_plan(source))))
        print(f"\nwrote report.txt, report.md in {out}")
        return 0
    results = load(source)
    publish(results, out, summary=stored_summary(results, source.parent / SUMMARY_NAME))
    return 0


def stored_summary(results: Results, path: Path) -> AnySummary | None:
    """The judgements a run stored beside its results (compare, tune, doctor). None, said in one
    line: an older run (without the file, or with a version this tool no longer reads) or a summary
    of other results: the run is judged again from its results."""
    kind = renderer(results).summary
    if kind is None:
        return None
    if not path.is_file():
        print(f"note: no {path.name} beside the results (a run stored before its kind kept one, or "
              "stopped before its end): judged again from the results", file=sys.stderr)
        return None
    try:
        summary = kind.load(path)
    except OldSummary as old:
        print(f"note: {old}: judged again from the results", file=sys.stderr)
        return None
    if summary.matches(results):
        return summary
    print(f"note: {path} is not this results file's summary (made from {_extent(summary)} of "
          f"{summary.created or 'an unknown time'}): judged again from the results", file=sys.stderr)
    return None


def _extent(summary: AnySummary) -> str:
    """What a summary was made from: compare's and tune's cells, doctor's diagnoses."""
    cells = getattr(summary, "cells", None)
    return f"{cells} cells" if cells is not None else f"{len(summary.diagnoses)} diagnoses"


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
