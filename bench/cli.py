"""``python -m bench compare|report|openloop``: measure layouts (wrk; httperf), report from stored JSON."""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shlex
import shutil
import signal
import sys
import tempfile
from pathlib import Path

from bench import scenarios as sc
from bench.dataset import DatasetError
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

DEFAULT_DATA_DIR = PROJECT_ROOT / "build" / "dataset"

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
    cmp_.add_argument("--hot-clients", help="files-mixed: connections asking for the hot file (default 4)")
    cmp_.add_argument("--cold-cache", help="file scenarios: on = evict the data set before every cell "
                                           "(default: on for files-mixed, off otherwise)")
    cmp_.add_argument("--large-share", help="files-mixed: share of requests for a large file (default 0.02)")
    cmp_.add_argument("--data-dir", help="file scenarios: the data set (default build/dataset, created if missing; "
                                         "python -m bench.dataset makes others)")
    cmp_.add_argument("--transport", help="uWSGI sockets: tcp or unix (default tcp)")
    cmp_.add_argument("--out", help="output directory (default results/<timestamp>)")
    cmp_.add_argument("--replay", metavar="RESULTS_JSON",
                      help="rerun the sweep and report on stored cells instead of measuring")
    rep = sub.add_parser("report", help="render the terminal table, report.md and plots from results.json")
    rep.add_argument("results", help="a results.json written by `compare` (or an openloop.json)")
    rep.add_argument("--out", help="where to write report.md and plots (default: beside results.json)")
    from bench import openloop

    openloop.add_parser(sub)
    return parser


def split_specs(text: str) -> tuple[str, ...]:
    """Comma-separated layouts, where a variant's own options also use commas:
    ``2x4-mapped@aio=off,sendfile=on,2x4-mapped@aio=threads`` is two layouts. An item that is
    ``OPTION=VALUE`` (no ``PxT-`` in front) continues the previous layout's options."""
    specs: list[str] = []
    for item in (x.strip() for x in str(text).split(",")):
        if not item:
            continue
        if specs and "@" in specs[-1] and "=" in item and "@" not in item and not re.match(r"[+-]?\d+x", item):
            specs[-1] += "," + item
        else:
            specs.append(item)
    return tuple(dict.fromkeys(specs))


def _on_off(field: str, raw) -> bool:
    text = str(raw).strip().lower()
    if text in ("on", "true", "yes", "1"):
        return True
    if text in ("off", "false", "no", "0"):
        return False
    raise BadArgument(f"{field}: must be on or off, got {raw!r}")


def plan_from_args(args, stored=None) -> Plan:
    nproc = os.cpu_count() or 1
    base = stored.arguments if stored else {}
    p = _int("processes", args.processes, 1, MAX_PROCESSES) if args.processes else base.get("processes", nproc)
    t = _int("threads", args.threads, 1, MAX_THREADS) if args.threads else base.get("threads", 4)
    scenario_arg = args.scenario or ",".join(base.get("scenarios") or ["article"])
    given_names = [x.strip() for x in scenario_arg.split(",") if x.strip()]
    unknown = [n for n in given_names if n not in sc.SCENARIOS and n not in sc.ALIASES]
    if unknown or not given_names:
        raise BadArgument(f"scenario: unknown scenario {unknown[0] if unknown else ''!r}; "
                          f"allowed: {', '.join([*sc.SCENARIOS, *sc.ALIASES])}")
    names = sc.expand(given_names)
    family = sc.family_defaults(names, p, t)
    if args.layouts:
        layouts = split_specs(args.layouts)
    else:
        layouts = tuple(base.get("layouts") or (family[0] if family else default_layouts(p, t)))
    if not layouts:
        raise BadArgument("layouts: give at least one PxT-STRATEGY")
    for spec in layouts:
        parse_variant(spec, run_dir="/tmp/validate")  # raises LayoutError naming the field
    if args.concurrency:
        levels = tuple(sorted({_int("concurrency", x, 1, 1000) for x in args.concurrency.split(",") if x.strip()}))
    else:
        levels = tuple(base.get("concurrency") or (family[1] if family else default_levels(p, t)))
    if args.transport not in (None, "tcp", "unix"):
        raise BadArgument(f"transport: must be tcp or unix, got {args.transport!r}")
    overrides = {
        "rounds": _int("rounds", args.rounds, 0, 20) if args.rounds else None,
        "fib": _int("fib", args.fib, 0, 30) if args.fib else None,
        "io_ms": _int("io_ms", args.io_ms, 0, 10000) if args.io_ms else None,
        "stall_clients": _int("stall_clients", args.stall_clients, 0, 1000) if args.stall_clients else None,
        "stall_fraction": _float("stall_fraction", args.stall_fraction, 0.01, 0.5) if args.stall_fraction else None,
        "stall_ms": _int("stall_ms", args.stall_ms, 1, 10000) if args.stall_ms else None,
        "hot_clients": _int("hot_clients", args.hot_clients, 1, 1000) if args.hot_clients else None,
        "cold_cache": _on_off("cold_cache", args.cold_cache) if args.cold_cache else None,
        "large_share": _float("large_share", args.large_share, 0, 0.5) if args.large_share else None,
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
        options=_layout_options(args, base, names),
    )
    return plan, resolved


def _layout_options(args, base: dict, names) -> dict:
    """Options every layout of the run gets (a variant's own ``@option=value`` wins): the
    transport, and for file scenarios the data set and ``sendfile on``."""
    stored = base.get("options", {})
    options = {"transport": args.transport if args.transport else stored.get("transport", "tcp")}
    if sc.needs_dataset(names):
        data_dir = args.data_dir or stored.get("data_dir") or str(DEFAULT_DATA_DIR)
        options.update({"data_dir": str(Path(data_dir).absolute()), "sendfile": stored.get("sendfile", "on")})
    elif args.data_dir:
        raise BadArgument("data_dir: only file scenarios (files, files-mixed, reuseport) use a data set")
    return options


def unreachable_parent(path: Path) -> Path | None:
    """Under root the stack runs as an unprivileged user, who must traverse every directory
    above ``path``: the first one that others cannot enter (no o+x), else None."""
    if os.geteuid() != 0:
        return None
    for d in [path, *path.parents]:
        try:
            if not d.stat().st_mode & 0o001:
                return d
        except OSError:
            return d
    return None


def prepare_dataset(root: Path):
    """The data set at ``root`` as it is if valid and complete, else the default one made there."""
    from bench import dataset as ds

    index = ds.read_index(root)
    if index is None or not ds.is_complete(index):
        print(f"creating the data set in {root} (python -m bench.dataset)", flush=True)
        try:
            index, _ = ds.ensure_dataset(root)
        except ds.DatasetError as exc:
            raise BadArgument(f"data_dir: {exc}") from None
    blocked = unreachable_parent(index.files_dir)
    if blocked is not None:
        raise BadArgument(f"data_dir: {blocked} is not enterable by others (mode "
                          f"{blocked.stat().st_mode & 0o777:o}), so the stack's nginx workers cannot read the "
                          f"data set: chmod o+x {blocked}, or use --data-dir under /tmp")
    return index


def dataset_facts(index) -> dict:
    """What a report says about the data set: sizes, where, on which filesystem."""
    from bench import dataset as ds

    return {**index.params(), "total_bytes": index.total_bytes, "root": str(index.root),
            "fs_type": ds.fs_type(index.root), "block_device": ds.disk_read_bytes(index.files_dir) is not None}


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
        index = prepare_dataset(Path(plan.options["data_dir"])) if "data_dir" in plan.options else None
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
        if index is not None:
            environment["dataset"] = dataset_facts(index)
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
    from bench import openloop
    from bench.exporters import export_all
    from bench.report import terminal_lines

    if openloop.is_openloop_file(args.results):
        return openloop.cmd_report(args)
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
        from bench import openloop

        return {"compare": cmd_compare, "report": cmd_report, "openloop": openloop.cmd_openloop}[args.command](args)
    except (BadArgument, LayoutError, ResultsError, ReplayError, DatasetError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (RenderError, StackError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        for extra in (getattr(exc, "details", ""), getattr(exc, "log_tail", "")):
            if extra:
                print(extra, file=sys.stderr)
        return 1
