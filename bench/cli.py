"""``python -m bench compare|report``: measure layouts with wrk, report from stored JSON."""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import shutil
import signal
import sys
import tempfile
from pathlib import Path

from bench import scenarios as sc
from bench.results import ResultsError, load
from bench.sweep import (
    Plan,
    Progress,
    ReplayError,
    ReplayRunner,
    default_layouts,
    default_levels,
    run_sweep,
    timestamp_dir,
)
from deploy.cli import OneLineParser, parse_args
from deploy.errors import LayoutError, RenderError, StackError
from deploy.layout import MAX_PROCESSES, MAX_THREADS, PROJECT_ROOT, parse_variant

EXIT_BAD_INPUT = 2
# 5 layouts x 3 levels x 3 repeats of 5 s, plus starts and warm-ups: about 5 minutes on 2 cores.
DEFAULT_DURATION = 5


class BadArgument(ValueError):
    pass


def _int(field: str, raw, low: int, high: int) -> int:
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise BadArgument(f"{field}: must be an integer in {low}..{high}, got {raw!r}") from None
    if not low <= value <= high:
        raise BadArgument(f"{field}: must be an integer in {low}..{high}, got {value}")
    return value


def _float(field: str, raw, low: float, high: float) -> float:
    try:
        value = float(str(raw).strip())
    except ValueError:
        raise BadArgument(f"{field}: must be a number in {low:g}..{high:g}, got {raw!r}") from None
    if not low <= value <= high:
        raise BadArgument(f"{field}: must be a number in {low:g}..{high:g}, got {value:g}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="python -m bench", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    cmp_ = sub.add_parser("compare", help="measure layouts side by side and write results + report")
    cmp_.add_argument("--processes", help="P of the default matrix (default: nproc)")
    cmp_.add_argument("--threads", help="T of the default matrix (default 4)")
    cmp_.add_argument("--layouts", help="comma-separated PxT-STRATEGY list (default: 1xT-shared, Px1-shared, "
                                        "PxT-shared, PxT-thunder, PxT-mapped)")
    cmp_.add_argument("--concurrency", help="comma-separated connection counts (default: P, 2P, ... P*T)")
    cmp_.add_argument("--duration", help=f"seconds of load per cell (default {DEFAULT_DURATION})")
    cmp_.add_argument("--warmup", help="seconds of one-connection warm-up per stack start (default 2)")
    cmp_.add_argument("--repeats", help="interleaved repeats of every layout (default 3)")
    cmp_.add_argument("--timeout", help="wrk's per-request timeout in seconds (default 10)")
    cmp_.add_argument("--scenario",
                      help=f"named request mix, or several comma-separated: {', '.join(sc.SCENARIOS)}")
    cmp_.add_argument("--rounds", help="override the scenario's rounds (0..20)")
    cmp_.add_argument("--fib", help="override the scenario's fib n (0..30)")
    cmp_.add_argument("--io-ms", help="override the scenario's sleep per round in ms (0..10000)")
    cmp_.add_argument("--stall-clients", help="stall scenarios: extra clients that hit the hanging API (default T)")
    cmp_.add_argument("--stall-fraction", help="stall scenarios: instead, this share (0..0.5) of requests hangs")
    cmp_.add_argument("--stall-ms", help="stall scenarios: how long the API hangs, ms (default 3000)")
    cmp_.add_argument("--transport", help="uWSGI sockets: tcp or unix (default tcp)")
    cmp_.add_argument("--out", help="output directory (default results/<timestamp>)")
    cmp_.add_argument("--replay", metavar="RESULTS_JSON",
                      help="rerun the sweep and report on stored cells instead of measuring")
    rep = sub.add_parser("report", help="render the terminal table, report.md and plots from results.json")
    rep.add_argument("results", help="a results.json written by `compare`")
    rep.add_argument("--out", help="where to write report.md and plots (default: beside results.json)")
    return parser


def plan_from_args(args, stored=None) -> Plan:
    nproc = os.cpu_count() or 1
    base = stored.arguments if stored else {}
    p = _int("processes", args.processes, 1, MAX_PROCESSES) if args.processes else base.get("processes", nproc)
    t = _int("threads", args.threads, 1, MAX_THREADS) if args.threads else base.get("threads", 4)
    if args.layouts:
        layouts = tuple(dict.fromkeys(x.strip() for x in args.layouts.split(",") if x.strip()))
    else:
        layouts = tuple(base.get("layouts") or default_layouts(p, t))
    if not layouts:
        raise BadArgument("layouts: give at least one PxT-STRATEGY")
    for spec in layouts:
        parse_variant(spec, run_dir="/tmp/validate")  # raises LayoutError naming the field
    if args.concurrency:
        levels = tuple(sorted({_int("concurrency", x, 1, 1000) for x in args.concurrency.split(",") if x.strip()}))
    else:
        levels = tuple(base.get("concurrency") or default_levels(p, t))
    scenario_arg = args.scenario or ",".join(base.get("scenarios") or ["article"])
    names = tuple(dict.fromkeys(x.strip() for x in scenario_arg.split(",") if x.strip()))
    unknown = [n for n in names if n not in sc.SCENARIOS]
    if unknown or not names:
        raise BadArgument(f"scenario: unknown scenario {unknown[0] if unknown else ''!r}; "
                          f"allowed: {', '.join(sc.SCENARIOS)}")
    if args.transport not in (None, "tcp", "unix"):
        raise BadArgument(f"transport: must be tcp or unix, got {args.transport!r}")
    overrides = {
        "rounds": _int("rounds", args.rounds, 0, 20) if args.rounds else None,
        "fib": _int("fib", args.fib, 0, 30) if args.fib else None,
        "io_ms": _int("io_ms", args.io_ms, 0, 10000) if args.io_ms else None,
        "stall_clients": _int("stall_clients", args.stall_clients, 0, 1000) if args.stall_clients else None,
        "stall_fraction": _float("stall_fraction", args.stall_fraction, 0.01, 0.5) if args.stall_fraction else None,
        "stall_ms": _int("stall_ms", args.stall_ms, 1, 10000) if args.stall_ms else None,
    }
    resolved = {n: sc.SCENARIOS[n].resolved(t, **overrides) for n in names}
    for scenario in resolved.values():
        if scenario.workload.rounds * scenario.workload.io_ms > 30000:
            raise BadArgument("rounds*io_ms: must be at most 30000 ms per request")
    given = lambda name, default: getattr(args, name) or base.get(name, default)  # noqa: E731
    duration = _float("duration", given("duration", DEFAULT_DURATION), 1, 3600)
    timeout = _float("timeout", given("timeout", 10), 1, 600)
    plan = Plan(
        layouts=layouts, concurrency=levels, repeats=_int("repeats", given("repeats", 3), 1, 100),
        duration=duration, warmup=_float("warmup", given("warmup", 2), 1, 600), processes=p, threads=t,
        scenarios=names, workload={n: s.to_dict() for n, s in resolved.items()},
        timeout=timeout, command="python -m bench " + shlex.join(sys.argv[1:] if sys.argv[1:2] == ["compare"]
                                                               else ["compare"]),
        options={"transport": args.transport if args.transport else base.get("options", {}).get("transport", "tcp")},
    )
    return plan, resolved


def _prepare_out(path: str | None) -> Path:
    out = Path(path) if path else PROJECT_ROOT / "results" / timestamp_dir()
    blocker = next((a for a in [out, *out.parents] if a.exists()), None)
    if blocker is not None and not blocker.is_dir():
        raise BadArgument(f"out: {blocker} exists and is not a directory")
    if out.exists() and any(out.iterdir()):
        raise BadArgument(f"out: {out} is not empty; choose a new directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BadArgument(f"out: cannot create {out}: {exc.strerror or exc}") from None
    return out


def cmd_compare(args) -> int:
    from bench.environment import capture
    from bench.exporters import export_all
    from bench.measure import LiveRunner, find_free_ports
    from bench.report import terminal_lines

    stored = load(args.replay) if args.replay else None
    plan, scenarios = plan_from_args(args, stored)
    if stored:  # the stored cells were measured with the stored mix, whatever the defaults say now
        plan = dataclasses.replace(plan, workload=stored.workload)
    if not stored:
        for tool in ("wrk",):
            if not shutil.which(tool):
                print(f"error: {tool} is not installed: run scripts/install-system-deps.sh", file=sys.stderr)
                return 1
    out = _prepare_out(args.out)
    mode = "replaying " + args.replay if stored else "measuring"
    est = plan.estimate_seconds()
    print(f"{mode}: {len(plan.layouts)} layouts x {len(plan.concurrency)} levels {list(plan.concurrency)} x "
          f"{plan.repeats} repeats x scenarios {', '.join(plan.scenarios)}, {plan.duration:g} s per cell; "
          f"about {est / 60:.1f} min; results in {out}", flush=True)
    work_dir = None
    if stored:
        runner, environment = ReplayRunner(stored), stored.environment | {"replayed_from": str(args.replay)}
    else:
        max_sockets = max(len(parse_variant(s, run_dir="/tmp/x").sockets) for s in plan.layouts)
        work_dir = Path(tempfile.mkdtemp(prefix="ul-bench-", dir="/tmp"))  # short: unix socket paths
        work_dir.chmod(0o711)  # started as root, the stacks run as www-data, who must reach their run dirs
        runner = LiveRunner(work_dir, out / "raw", find_free_ports(max_sockets + 1), scenarios,
                            plan.duration, plan.warmup, plan.timeout, layout_options=plan.options)
        environment = capture()
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        results = run_sweep(plan, runner, environment, save=lambda r: r.save(out / "results.json"),
                            progress=Progress(plan))
    except KeyboardInterrupt:
        print(f"\ninterrupted: the cells measured so far are in {out / 'results.json'}", file=sys.stderr)
        return 130
    finally:
        if work_dir:
            shutil.rmtree(work_dir, ignore_errors=True)
    written = export_all(results, out)
    print("\n".join(terminal_lines(results)))
    print(f"\nwrote {out / 'results.json'} and {', '.join(p.name for p in written)} in {out}")
    return 0


def cmd_report(args) -> int:
    from bench.exporters import export_all
    from bench.report import terminal_lines

    results = load(args.results)
    out = Path(args.out) if args.out else Path(args.results).parent
    out.mkdir(parents=True, exist_ok=True)
    written = export_all(results, out)
    print("\n".join(terminal_lines(results)))
    print(f"\nwrote {', '.join(p.name for p in written)} in {out}")
    return 0


def main(argv=None) -> int:
    args = parse_args(build_parser(), argv)
    try:
        return {"compare": cmd_compare, "report": cmd_report}[args.command](args)
    except (BadArgument, LayoutError, ResultsError, ReplayError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (RenderError, StackError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        for extra in (getattr(exc, "details", ""), getattr(exc, "log_tail", "")):
            if extra:
                print(extra, file=sys.stderr)
        return 1
