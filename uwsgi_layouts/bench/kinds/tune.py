"""``uwsgi-layouts tune``: recommend a layout for the app from measurements, and write its configs.

    uwsgi-layouts tune [compare's app and traffic options] --concurrency N [--p99-ms MS]
        [--memory-mb MB] [--budget MINUTES] [--strategies mapped,shared,...]
        [--stall-share 0.05 --stall-ms 3000] [--out DIR] | --replay DIR/results.json

The app and its traffic come from ``bench.subject`` exactly as for compare (pre-flights before
anything is timed). The search (``bench.tune.search``: successive halving sized to the budget)
runs on a live measure: each block one stack from ``bench.stack.Lab`` measured by
``bench.kinds.closedloop.LiveRunner`` (``--replay``: the stored cells and clock instead, nothing
timed). Cells are saved to ``results.json`` (kind ``tune``, ``bench.tune.record``) after every
block; at the end what the search decided is stored as ``summary.json`` beside it
(``bench.tune.summary``), which the report (``bench.report.tune``) renders. With a recommendation,
``DIR/recommended/`` holds the chosen layout rendered as ``deploy render`` would (same app options,
cross-checks, ``nginx -t``), and for a uWSGI layout the production bundle (``deploy.ship``) in
``recommended/bundle/``.

Exit codes: 0 a recommendation, 3 no layout meets the objective (the closest is shown), 2 bad
input (one line, nothing written), 1 a stack or tool failed, 130 interrupted (cells so far saved).

Stalls (``--stall-share``): the stalled requests in flight are sized from the first cell's
throughput (Little's law). The demo app stalls on its own ``/?io_ms=`` request; another app has
no such request, so in the lab only its callable is wrapped by ``app/tune_stall.py`` (a WSGI
middleware that holds a thread for --stall-ms on ``/?ul_tune_stall_ms=N``); the recommended
files never contain it.
"""

from __future__ import annotations

import dataclasses
import math
import os
import shlex
import shutil
import sys
from argparse import ArgumentTypeError
from pathlib import Path

from uwsgi_layouts.arguments import CommaList, Ints, Numbers
from uwsgi_layouts.bench import subject as subj
from uwsgi_layouts.bench.environment import Machine, capture
from uwsgi_layouts.bench.kinds.base import RESULTS_NAME, Kind, publish, sigterm_interrupts
from uwsgi_layouts.bench.kinds.closedloop import LiveRunner
from uwsgi_layouts.bench.load import scenarios as sc
from uwsgi_layouts.bench.load.traffic import TrafficError, redact_argv
from uwsgi_layouts.bench.margin import MARGIN
from uwsgi_layouts.bench.options import (
    CONNECTIONS,
    PROCESSES,
    THREADS,
    TIMEOUT_S,
    BadArgument,
    command_line,
    prepare_out,
    require_tools,
    results_root,
    timestamp_dir,
)
from uwsgi_layouts.bench.results import Results, load, utc_now
from uwsgi_layouts.bench.stack import Lab
from uwsgi_layouts.bench.tune import record
from uwsgi_layouts.bench.tune.objective import Objective
from uwsgi_layouts.bench.tune.pod import pod_record
from uwsgi_layouts.bench.tune.progress import TuneProgress
from uwsgi_layouts.bench.tune.search import Inputs, Outcome, Settings, TapeClock, minimum_budget_s, run_search
from uwsgi_layouts.bench.tune.space import DEFAULT_STRATEGIES, DEFAULT_THREADS, candidate_space, prune_static
from uwsgi_layouts.bench.tune.summary import summarize
from uwsgi_layouts.deploy.machine import PACKAGE_DIR, check_reachable, checked, default_cpus, find_uwsgi, tool_command
from uwsgi_layouts.deploy.model import (
    STRATEGIES,
    TRANSPORTS,
    LayoutError,
    parse_cpus,
    parse_memory_mb,
    parse_variant,
)
from uwsgi_layouts.deploy.render import write_layout
from uwsgi_layouts.deploy.run import http_get
from uwsgi_layouts.deploy.ship import build_bundle, write_bundle
from uwsgi_layouts.files import write_atomic

EXIT_NO_LAYOUT = 3
DEFAULT_BUDGET_MIN = 10.0
DEFAULT_STALL_MS = 3000
WARMUP_S = 1.0
STALL_APP = PACKAGE_DIR / "app" / "tune_stall.py"
STALL_MODULE = "ul_tune_stall"
RECOMMENDED = "recommended"
RUN_DIR = "run"  # where RUN.md's command serves the recommended layout, beside it
# Servers whose cells bench can measure (CPU and memory of the server's tree; per-worker counts
# from uWSGI's stats server or, for the peers, the X-Worker-Pid answers wrk counted).
MEASURED_SERVERS = ("uwsgi", "gunicorn", "granian")


# --------------------------------------------------------------------------- arguments


# The ranges of tune's own options (each checked while parsing and shown in the help).
P99_MS = Numbers(1, 600_000)
MEMORY_MB = Numbers(1, 1_000_000)
BUDGET_MIN = Numbers(1, 1440)
STALL_SHARE = Numbers(0, 0.5, open_low=True, noun="a share")
STALL_MS = Ints(1, 60_000)
THREAD_COUNTS = CommaList(THREADS, "thread count, e.g. 1,2,4,8")


def add_arguments(p) -> None:
    nproc = default_cpus()
    p.add_argument("--concurrency", type=CONNECTIONS,
                   help=f"simultaneous requests expected in production ({CONNECTIONS}; default 2 x the usable CPUs = "
                        f"{2 * nproc}; usable: the affinity's, or the cgroup's quota if smaller)")
    p.add_argument("--p99-ms", type=P99_MS,
                   help=f"objective: p99 of healthy requests at that concurrency, at most this many ms ({P99_MS}; "
                        "pooled over the repeats; default: no limit)")
    p.add_argument("--memory-mb", type=MEMORY_MB,
                   help="objective: the app server's memory (PSS of master and workers after load), at most this many "
                        f"MB ({MEMORY_MB}; default: no limit)")
    p.add_argument("--budget", type=BUDGET_MIN,
                   help=f"minutes the whole search may take, kept within 10%% ({BUDGET_MIN}; default "
                        f"{DEFAULT_BUDGET_MIN:g})")
    p.add_argument("--strategies", type=strategies_arg,
                   help=f"comma-separated strategies to try (default {','.join(DEFAULT_STRATEGIES)}; known: "
                        f"{', '.join(STRATEGIES)}); a peer is tried with its variants too (gunicorn, granian: nginx's "
                        "upstream keep-alive on and off)")
    p.add_argument("--stall-share", type=STALL_SHARE,
                   help=f"robustness: this share {STALL_SHARE} of requests calls a slow external API; the choice must "
                        "meet the objective under it too")
    p.add_argument("--stall-ms", type=STALL_MS,
                   help=f"how long a stalled request waits, ms ({STALL_MS}; default {DEFAULT_STALL_MS}; with "
                        "--stall-share)")
    p.add_argument("--max-processes", type=PROCESSES,
                   help=f"largest P tried ({PROCESSES}; default 2 x the usable CPUs = {2 * nproc})")
    p.add_argument("--threads", type=THREAD_COUNTS,
                   help=f"comma-separated T values tried, each {THREADS} (default "
                        f"{','.join(map(str, DEFAULT_THREADS))})")
    p.add_argument("--scenario", help=f"the demo app's request mix: {', '.join(record.steady_scenarios())} (default "
                                      "article; your app: --request...)")
    p.add_argument("--cpus", help="size it for a pod with this CPU limit (CPUs, fractions allowed, e.g. 0.5 or 2: "
                                  "Kubernetes limits.cpu, docker --cpus): every candidate runs under that quota, and "
                                  "the concurrency, largest P and pilot come from it (default: no limit)")
    p.add_argument("--memory", help="the pod's memory limit in MB: every candidate runs under it, an OOM kill counts "
                                    "as a failed request (default: no limit; --memory-mb is the objective)")
    p.add_argument("--transport", choices=TRANSPORTS,
                   help="uWSGI sockets in the lab and the recommended files: unix or tcp (default unix)")
    p.add_argument("--timeout", type=TIMEOUT_S, help=f"wrk's per-request timeout in seconds ({TIMEOUT_S}; default 10)")
    p.add_argument("--margin", type=MARGIN,
                   help=f"equivalence margin ({MARGIN}): two candidates whose paired throughput ratio lies wholly "
                        "within ±MARGIN are tied, and the tie rule decides (default 0.05)")
    subj.add_arguments(p)
    p.add_argument("--out", help="output directory (default results/<timestamp>-tune)")
    p.add_argument("--replay", metavar="RESULTS_JSON",
                   help="take the search's decisions again on a stored tune run's cells and clock, timing nothing "
                        "(--p99-ms, --memory-mb and --budget may differ from the stored ones)")


def strategies_arg(raw: str) -> tuple[str, ...]:
    """--strategies: known ones whose cells bench can measure, in the order given."""
    names = tuple(dict.fromkeys(x.strip() for x in str(raw).split(",") if x.strip()))
    if not names:
        raise ArgumentTypeError(f"give at least one of {', '.join(STRATEGIES)}")
    for name in names:
        if name not in STRATEGIES:
            raise ArgumentTypeError(f"unknown strategy {name!r}; allowed: {', '.join(STRATEGIES)}")
        server = STRATEGIES[name].server
        if server not in MEASURED_SERVERS:
            ours = ", ".join(n for n, s in STRATEGIES.items() if s.server in MEASURED_SERVERS)
            raise ArgumentTypeError(f"{name} runs {server}, whose cells bench cannot measure yet (it reads uWSGI's "
                                    f"stats server); measurable now: {ours}")
    return names


@dataclasses.dataclass(frozen=True)
class Config:
    inputs: Inputs
    subject: subj.Subject
    steady: sc.Scenario
    options: dict  # the layouts' options: transport + the user's app options (never the lab middleware)
    arguments: dict  # what results.json records (without "tune" and "complete")
    timeout: float
    middleware: bool  # wrap the app in app/tune_stall.py in the lab


def config_from_args(args, stored: Results | None = None, subject: subj.Subject | None = None) -> Config:
    """Everything validated (each option in its range while parsing; here BadArgument, LayoutError,
    TrafficError: exit 2) before anything runs."""
    nproc = default_cpus()  # the CPUs this process may use: affinity, or a cgroup quota if tighter
    base = stored.arguments if stored else {}

    def given(name, default, parse=lambda value: value):
        """The option as parsed (and ``parse``d); not given: the stored run's, else ``default``."""
        value = getattr(args, name, None)
        return parse(value) if value is not None else base.get(name, default)

    if subject is None:
        subject = subj.from_stored(base) if stored else subj.from_args(args)
    cpus = given("cpus", None, parse_cpus)
    pod_memory = given("memory", None, parse_memory_mb)
    if cpus is not None:  # a pod of that size: its CPUs, not this machine's, size the search
        nproc = max(1, math.ceil(cpus - 1e-9))
    concurrency = given("concurrency", 2 * nproc)
    p99 = given("p99_ms", None)
    memory = given("memory_mb", None)
    budget_min = args.budget if args.budget is not None else base.get("budget_min", DEFAULT_BUDGET_MIN)
    strategies = tuple(given("strategies", DEFAULT_STRATEGIES))
    max_p = given("max_processes", 2 * nproc)
    threads = tuple(given("threads", DEFAULT_THREADS, lambda values: sorted(set(values))))
    stall_share = given("stall_share", 0.0)
    if getattr(args, "stall_ms", None) is not None and not stall_share:
        raise BadArgument("stall_ms: only with --stall-share (the share of requests that stall)")
    stall_ms = given("stall_ms", DEFAULT_STALL_MS) if stall_share else 0
    timeout = float(given("timeout", 10.0))
    transport = given("transport", "tcp" if stored else "unix")  # a stored run without it: tcp
    steady = _steady(args, base, subject)
    margin = getattr(args, "margin", None)
    settings = Settings(budget_s=budget_min * 60, warmup_s=WARMUP_S, tie_band=margin or Settings.tie_band) \
        if not stored else Settings.from_dict({**base["tune"]["settings"], "budget_s": budget_min * 60,
                                               **({"tie_band": margin} if margin else {})})
    objective = Objective(concurrency, p99, memory, stall_share, stall_ms, record.server_label(list(strategies)))
    space = candidate_space(max_p, threads, strategies)
    # The pilot's P is the measured machine's usable CPUs (a replay elsewhere takes the same decisions).
    inputs = Inputs(objective, tuple(space), settings, steady.name, record.STALL, base.get("nproc", nproc))
    limits = {k: v for k, v in (("cpus", cpus), ("memory", pod_memory)) if v is not None}
    if not stored:
        screened, _ = prune_static(space, concurrency, idle_rule=not stall_share)
        if not screened:
            raise BadArgument(f"concurrency: no candidate holds {concurrency} requests in flight (at most "
                              f"{max_p} x {max(threads)} threads): raise --max-processes or --threads")
        least = minimum_budget_s(len(screened), settings)
        if settings.budget_s < least:
            raise BadArgument(f"budget: {budget_min:g} min is too short to screen {len(screened)} candidates (about "
                              f"{least / 60:.1f} min at least): raise --budget, or narrow --strategies, "
                              "--max-processes or --threads")
    options = {"transport": transport} | limits | subject.layout_options
    if not stored:
        for strategy in strategies:  # every strategy and variant takes these options (LayoutError naming the field)
            for variant in ("", *STRATEGIES[strategy].variants):
                checked(parse_variant(f"1x1-{strategy}" + (f"@{variant}" if variant else ""),
                                      run_dir=subj.VALIDATE_RUN_DIR, **options))
    arguments = {
        "command": _command(args), "concurrency": concurrency, "p99_ms": p99, "memory_mb": memory,
        "budget_min": budget_min, "strategies": list(strategies), "max_processes": max_p, "threads": list(threads),
        "scenario": steady.name, "scenarios": [steady.name] + ([record.STALL] if stall_share else []),
        "stall_share": stall_share, "stall_ms": stall_ms, "warmup": WARMUP_S, "timeout": timeout,
        "transport": transport, "nproc": base.get("nproc", nproc), "options": options, "app": subject.record,
        "lab_middleware": bool(stall_share and not subject.demo), "margin": settings.tie_band,
        "cpus": cpus, "memory": pod_memory,
    }
    return Config(inputs, subject, steady, options, arguments, timeout, bool(stall_share and not subject.demo))


def _steady(args, base: dict, subject: subj.Subject) -> sc.Scenario:
    """The steady scenario: the user's requests (``traffic``), else the demo's named mix."""
    allowed = record.steady_scenarios()
    name = args.scenario or base.get("scenario") or ("traffic" if subject.mix is not None else "article")
    if args.scenario and subject.mix is not None:
        raise TrafficError("scenario", "your requests are the scenario: leave --scenario out (it names the demo app's "
                                       f"own mixes: {', '.join(allowed)})")
    if subject.mix is None and name not in allowed:
        raise BadArgument(f"scenario: unknown or not a steady mix {name!r}; allowed: {', '.join(allowed)} (the "
                          "stall comes from --stall-share)")
    scenario = sc.SCENARIOS[name].resolved(1)
    return scenario.with_mix(subject.mix) if subject.mix is not None else scenario


def _command(args) -> str:
    argv = getattr(args, "argv", None)
    return command_line("tune", redact_argv(argv) if argv is not None else None)


# --------------------------------------------------------------------------- measuring


@dataclasses.dataclass(frozen=True)
class LabStall(sc.Stall):
    """The stall of the lab middleware (app/tune_stall.py): its own query, answered before the app."""

    @property
    def query(self) -> str:
        return f"ul_tune_stall_ms={self.wait_ms}"


def stall_scenario(steady: sc.Scenario, share: float, wait_ms: int, middleware: bool) -> sc.Scenario:
    cls = LabStall if middleware else sc.Stall
    how = "the lab middleware (app/tune_stall.py)" if middleware else "the demo app's /?io_ms="
    return dataclasses.replace(steady, name=record.STALL, stall=cls(clients=0, wait_ms=wait_ms),
                               description=f"{steady.description}, while {share:.0%} of requests stall {wait_ms} ms "
                                           f"(stalled clients through {how})")


class LiveMeasure:
    """Blocks measured for real: one stack per block (``LiveRunner.run_block``), a steady cell
    at the concurrency and, when asked, a cell under ``stall_clients`` stalled clients."""

    def __init__(self, lab: Lab, raw_dir: Path, config: Config, options: dict):
        self.config = config
        self.level = config.inputs.objective.concurrency
        self.stall = stall_scenario(config.steady, config.inputs.objective.stall_share,
                                    config.inputs.objective.stall_ms, config.middleware)
        self.runner = LiveRunner(lab, raw_dir, {config.steady.name: config.steady}, duration=1, warmup=WARMUP_S,
                                 timeout=config.timeout, layout_options=options, inflight_hz=0)

    def block(self, spec: str, repeat: int, duration_s: int, stall_clients: int):
        names = [self.config.steady.name]
        if stall_clients:
            self.runner.scenarios[record.STALL] = dataclasses.replace(
                self.stall, stall=dataclasses.replace(self.stall.stall, clients=stall_clients))
            names.append(record.STALL)
        self.runner.duration = duration_s
        return self.runner.run_block(spec, repeat, [self.level], names)

    @property
    def workload(self) -> dict:
        return {name: s.to_dict() for name, s in self.runner.scenarios.items()}


def lab_options(lab: Lab, options: dict) -> dict:
    """``options`` with the app wrapped in the lab-only stall middleware: a copy of
    app/tune_stall.py in the lab directory, told the app's callable and directory by env."""
    where = lab.new_dir("stall-app")
    where.chmod(0o755)  # the workers' user lists it to import the module
    target = where / f"{STALL_MODULE}.py"
    shutil.copyfile(STALL_APP, target)
    target.chmod(0o644)
    probe = checked(parse_variant("1x1-shared", run_dir=subj.VALIDATE_RUN_DIR, **options))
    env = (*options.get("env", ()), f"UL_TUNE_APP={probe.app}", f"UL_TUNE_APP_DIR={probe.app_dir}")
    return {**options, "app": f"{STALL_MODULE}:application", "app_dir": str(where), "env": env}


def preflight_lab(lab: Lab, spec: str, options: dict, config: Config) -> tuple[subj.Subject, list[str]]:
    """Each distinct request once through nginx (as compare), and with the middleware one short
    stall: the subject to measure (without the failing requests with --skip-failing) and lines
    to print. TrafficError (exit 2) when an answer is wrong."""
    lines: list[str] = []
    subject = config.subject
    with lab.stack(spec, name="preflight", **options) as stack:
        layout = stack.layout
        if config.subject.mix is not None:
            subject, lines = subj.check_traffic(subject, layout.listen_host, layout.listen_port, config.timeout,
                                                where=spec)
        if config.middleware:
            query = LabStall(wait_ms=1).query
            status, _, body = http_get(layout.listen_host, layout.listen_port, f"/?{query}", timeout=config.timeout)
            if status != 200 or body != b"stalled\n":
                raise TrafficError("stall_share", f"the lab's stall middleware answered {status} {body[:60]!r} to "
                                                  f"/?{query}: the stalled requests cannot be measured")
            lines.append(f"pre-flight: stalled requests go through the lab-only middleware ({STALL_MODULE}, wrapping "
                         f"{config.subject.app}; never in the recommended files)")
    return subject, lines


# --------------------------------------------------------------------------- results and files


def snapshot(config: Config, outcome: Outcome, cells: dict, clock_reads: list[float], environment: dict,
             workload: dict, created: str, complete: bool, recommended: dict | None = None,
             wall_s: float | None = None) -> Results:
    """The run as a Results of kind tune: the cells in block order, the search's record."""
    ordered = [c for b in outcome.blocks for name in b.scenarios for c in cells.get((name, b.spec, b.repeat), [])]
    rec = {"version": record.TUNE_VERSION, "settings": config.inputs.settings.to_dict(),
           "blocks": [b.to_dict() for b in outcome.blocks], "clock": list(clock_reads),
           "stall_clients": outcome.stall_clients, "decision": decision_summary(outcome)}
    if recommended is not None:
        rec["recommended"] = recommended
    pod = pod_record(config.arguments, outcome.chosen.spec, outcome.chosen.memory_mb) if outcome.chosen else None
    if pod is not None:
        rec["pod"] = pod  # the POD line's figures (MB of 10^6 bytes; memory_mb is the limit in MiB)
    if wall_s is not None:
        rec["wall_s"] = wall_s  # the whole run, pre-flights to the last save
    arguments = {**config.arguments, "complete": complete, "tune": rec}
    return Results(environment=environment, arguments=arguments, workload=workload, cells=tuple(ordered),
                   created=created, kind="tune")


def decision_summary(outcome: Outcome) -> dict:
    """For readers of the JSON (never read back: the report renders summary.json)."""
    d = outcome.decision
    return {"chosen": d.chosen.spec if d and d.chosen else None,
            "runner_up": d.runner_up.spec if d and d.runner_up else None,
            "closest": d.closest.spec if d and d.closest else None, "stop": outcome.stop}


def our_virtualenv() -> str | None:
    """The virtualenv holding the uWSGI the lab ran (the demo app's, without --virtualenv)."""
    binary = find_uwsgi()
    return str(Path(binary).resolve().parent.parent) if binary else None


def bundle_for(spec: str, options: dict):
    """(the production bundle of ``spec`` with the run's app options, "") or (None, why not)."""
    if STRATEGIES[spec.partition("@")[0].split("-", 1)[1]].server != "uwsgi":
        return None, "a bundle ships uWSGI only; serve the rendered files with `uwsgi-layouts run`"
    try:
        return build_bundle(spec, app=options.get("app"), app_dir=options.get("app_dir") or str(PACKAGE_DIR),
                            virtualenv=options.get("virtualenv") or our_virtualenv(), env=options.get("env"),
                            static=options.get("static")), ""
    except LayoutError as exc:
        return None, f"no bundle: {exc}"


def run_command(spec: str, options: dict, run_dir: Path) -> str:
    """The ``uwsgi-layouts run`` command that serves the recommended layout (from its own run
    directory: recommended/ stays as written), as this machine's shell finds the tool."""
    argv = [*shlex.split(tool_command()), "run", spec]
    for key in ("app", "app_dir", "virtualenv"):
        if options.get(key):
            argv += [f"--{key.replace('_', '-')}", str(options[key])]
    for key in ("env", "static"):
        for value in options.get(key) or ():
            argv += [f"--{key}", value]
    if options.get("transport") == "tcp":  # unix is deploy run's default
        argv += ["--transport", "tcp"]
    return shlex.join([*argv, "--run-dir", str(run_dir)])


def without_limits(options: dict) -> dict:
    return {k: v for k, v in options.items() if k not in ("cpus", "memory")}


def write_recommended(out: Path, spec: str, options: dict) -> dict:
    """Render ``spec`` into out/recommended as ``deploy render`` would (cross-checks, nginx -t),
    the bundle beside it when it is a uWSGI layout, and RUN.md saying how to use them. Returns
    what the results record (``arguments.tune.recommended``)."""
    where = (out / RECOMMENDED).resolve()
    layout = checked(parse_variant(spec, run_dir=str(where), **options))
    result = write_layout(layout, where)
    bundle, note = bundle_for(spec, options)
    serve = run_command(spec, options, (out / RUN_DIR).resolve())
    install = ""
    if bundle is not None:
        write_bundle(bundle, where / "bundle")
        install = f"uwsgi-layouts install {where / 'bundle'} --dry-run"
        note = (f"bundle {bundle.name}, for the app at the same paths on the server ({bundle.app_dir}, virtualenv "
                f"{bundle.virtualenv} holding uWSGI), answering any host name: for a site, make it again with "
                f"`uwsgi-layouts bundle {spec} --server-name HOST` and the same app options; there, with "
                "uwsgi-layouts installed, run the install command (a dry run first, then without --dry-run; "
                "bundle/INSTALL.md lists every step)")
    lines = [f"<!-- Generated by `uwsgi-layouts tune` for layout {spec}: do not edit. -->",
             f"# Recommended layout: {spec}", "",
             "Rendered by `uwsgi-layouts tune` as `uwsgi-layouts render` renders it (cross-checked, `nginx -t`), with "
             "the app options of the run.", "",
             f"Serve it here (this renders the same files into {RUN_DIR}/ beside this directory, then starts nginx "
             "and the app server; this directory stays as it is):", "", "```sh", serve, "```", ""]
    if install:
        lines += [f"Production: {note}.", "", "```sh", install, "```", ""]
    else:
        lines += [f"Production: {note}.", ""]
    write_atomic(where / "RUN.md", "\n".join(lines))
    return {"dir": RECOMMENDED, "layout": spec, "files": [*result.files, "RUN.md"],
            "bundle": "bundle" if bundle is not None else None, "note": note, "serve": serve, "install": install}


# --------------------------------------------------------------------------- the run


def run(args) -> int:
    clock = TapeClock()
    stored = load(args.replay) if args.replay else None
    if stored is not None and stored.kind != "tune":
        raise BadArgument(f"replay: {args.replay} holds a {stored.kind} run; tune replays tune runs")
    config = config_from_args(args, stored)
    out_path = Path(args.out) if args.out else results_root() / (timestamp_dir() + "-tune")
    first = next(iter(prune_static(list(config.inputs.space), config.inputs.objective.concurrency)[0]),
                 config.inputs.space[0]).spec
    # The recommended files go to out/recommended: the run user must reach it, or the run would
    # fail at its very end.
    where = (out_path / RECOMMENDED).absolute()
    check_reachable(checked(parse_variant(first, run_dir=str(where), **config.options)), where)
    if stored is None:
        require_tools("wrk")
        for note in config.subject.notes:  # first: which app dir and virtualenv the pre-flight uses
            print(note, flush=True)
        subj.preflight_app(first, config.options, config.subject.import_timeout)  # before any stack starts
        _, why_no_bundle = bundle_for(f"1x1-{config.inputs.space[0].strategy}", config.options)
        if why_no_bundle and "uWSGI only" not in why_no_bundle:
            print(f"note: the recommendation will come without a production bundle ({why_no_bundle})", flush=True)
    with Lab() as lab, sigterm_interrupts():
        if stored is None:
            options = lab_options(lab, config.options) if config.middleware else config.options
            if config.subject.mix is not None or config.middleware:
                subject, lines = preflight_lab(lab, first, options, config)
                print("\n".join(lines), flush=True)
                if subject.mix != config.subject.mix:  # --skip-failing left requests out: tune on the others
                    config = config_from_args(args, stored, subject)
        out = prepare_out(str(out_path))
        results_path = out / RESULTS_NAME
        print(header(config, stored, out, args.replay), flush=True)
        machine = None
        if stored is None:
            measure = LiveMeasure(lab, out / "raw", config, options)
            recording = RecordingMeasure(measure)
            environment, search_clock = capture(), clock
            machine = Machine()
        else:
            recording = RecordingMeasure(record.ReplayMeasure(stored))
            environment = stored.environment | {"replayed_from": str(args.replay)}
            search_clock = recording.inner
        created = stored.created if stored else utc_now()
        progress = TuneProgress()

        def save(outcome: Outcome, complete: bool = False, recommended: dict | None = None,
                 wall_s: float | None = None) -> Results:
            if machine is not None and not complete:  # after a block: how busy the machine was
                machine.sample()
                environment["machine"] = machine.record()
            workload = recording.inner.workload if stored is None else stored.workload
            reads = clock.reads if stored is None else list(stored.arguments["tune"]["clock"])
            results = snapshot(config, outcome, recording.cells, reads, environment, workload, created, complete,
                               recommended, wall_s)
            results.save(results_path)
            return results

        try:
            outcome = run_search(config.inputs, recording, search_clock, progress=progress,
                                 on_block=save if stored is None else None)
        except KeyboardInterrupt:
            progress.close()
            print(f"\ninterrupted: the cells measured so far are in {results_path}", file=sys.stderr)
            return 130
        progress.close()
        recommended = None
        if outcome.chosen is not None:
            # The pod's limit is its runtime's to set (the POD line says it): the files are the layout's.
            recommended = write_recommended(out, outcome.chosen.spec, without_limits(config.options))
        if stored is None:
            environment["loadavg_at_end"] = list(os.getloadavg())
        wall = clock.now() if stored is None else stored.arguments["tune"].get("wall_s")
        results = save(outcome, complete=not outcome.interrupted, recommended=recommended, wall_s=wall)
    publish(results, out, saved=results_path, summary=summarize(results, outcome))  # judged once: every view
    if outcome.interrupted:
        return 130
    return 0 if outcome.chosen is not None else EXIT_NO_LAYOUT


class RecordingMeasure:
    """Passes blocks to ``inner`` and keeps their cells by (scenario, spec, repeat), so every
    partial save writes exactly what was measured."""

    def __init__(self, inner):
        self.inner = inner
        self.cells: dict[tuple[str, str, int], list] = {}

    def block(self, spec, repeat, duration_s, stall_clients):
        cells = self.inner.block(spec, repeat, duration_s, stall_clients)
        for c in cells:
            self.cells.setdefault((c.scenario, spec, repeat), []).append(c)
        return cells


def header(config: Config, stored: Results | None, out: Path, replay: str | None) -> str:
    o = config.inputs.objective
    space = list(config.inputs.space)
    kept, pruned = prune_static(space, o.concurrency, idle_rule=not o.stall_share)
    rules = {}
    for p in pruned:
        rules[p.rule] = rules.get(p.rule, 0) + 1
    names = {"threads": "too few threads", "idle-threads": "idle threads", "duplicate": "duplicates"}
    what = (f"replaying {replay} ({config.subject.app})" if stored else f"measuring {config.subject.app}")
    threads = ",".join(map(str, sorted({c.threads for c in space})))
    strategies = ", ".join(dict.fromkeys(c.strategy + (f"@{c.variant}" if c.variant else "") for c in space))
    lines = [
        f"{what}, scenario {config.steady.name}, at {o.concurrency} concurrent requests",
        f"objective: {o.words()}",
        f"space: {len(space)} candidates (P 1..{max(c.processes for c in space)} x T {threads} x {strategies}); "
        f"{len(pruned)} pruned before measuring ("
        + ", ".join(f"{n} {names[r]}" for r, n in rules.items()) + f"): {len(kept)} to screen"
        + ("; more once the stall is sized" if o.stall_share else ""),
        f"budget: {config.inputs.settings.budget_s / 60:g} min; results in {out}",
    ]
    return "\n".join(lines)


KIND = Kind("tune", "recommend a layout for your app from measurements, and write its configs", add_arguments, run)
