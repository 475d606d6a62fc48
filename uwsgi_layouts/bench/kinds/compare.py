"""``uwsgi-layouts compare``: measure layouts side by side with wrk (closed loop).

The plan comes from the arguments (or, with ``--replay``, from a stored run): layouts x
connection levels x interleaved repeats x scenarios, defaults derived from ``nproc``. The sweep
(``bench.kinds.closedloop``) measures every cell on a stack from ``bench.stack.Lab``, saves
``results.json`` after every block, and the report (``bench.report``) says which layout to run.

The app and its traffic come from ``bench.subject`` (deploy's app options, --request...): the
app is imported once (pre-flight) before any stack starts, and each distinct request is sent once
through nginx before anything is timed; either failing exits 2 with nothing written.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import sys
import tempfile
import time
from argparse import ArgumentTypeError
from pathlib import Path

from uwsgi_layouts.arguments import CommaList, Ints, Numbers, OneOf, on_off, refuse
from uwsgi_layouts.bench import subject as subj
from uwsgi_layouts.bench.environment import Machine, capture
from uwsgi_layouts.bench.kinds.base import RESULTS_NAME, Kind, publish, sigterm_interrupts
from uwsgi_layouts.bench.kinds.closedloop import (
    RESERVE_S,
    LiveRunner,
    Plan,
    Progress,
    ReplayRunner,
    Until,
    default_layouts,
    default_levels,
    run_sweep,
)
from uwsgi_layouts.bench.load import scenarios as sc
from uwsgi_layouts.bench.load.traffic import redact_argv
from uwsgi_layouts.bench.margin import MARGIN
from uwsgi_layouts.bench.options import (
    CONNECTIONS,
    PROCESSES,
    THREADS,
    TIMEOUT_S,
    BadArgument,
    MissingTool,
    chosen_transport,
    command_line,
    dataset_facts,
    default_data_dir,
    prepare_dataset,
    prepare_out,
    require_tools,
    split_specs,
)
from uwsgi_layouts.bench.report.headline import headline_lines
from uwsgi_layouts.bench.results import load
from uwsgi_layouts.bench.stack import Lab
from uwsgi_layouts.bench.summary import summarize
from uwsgi_layouts.bench.verdict import ARTICLE
from uwsgi_layouts.deploy.machine import checked, default_cpus
from uwsgi_layouts.deploy.model import TRANSPORTS, parse_variant
from uwsgi_layouts.deploy.run import unavailable as netns_unavailable
from uwsgi_layouts.deploy.ship import make_certs

# 6 layouts (5 of uWSGI and gunicorn at its best) x 3 levels x 2 planned rounds, with starts and
# 1-s warm-ups: every context cell 2 s, the verdict's cells (PxT-mapped and PxT-shared at P and
# 2P, run as one paired block) 4 s: about 2 minutes on 2 cores. --budget auto (make compare's
# default) is 5 minutes in all, so that make compare from a fresh clone, even on a bare machine
# (the system packages and the venv's build, 30-50 s here, included), ends within 6 minutes; the
# rounds added until decided (the verdict's pair first, about 21 s a round) bring the verdict's
# pair to up to about 10 rounds: its noise is from round to round (a cell of 2 s varied about as
# much as one of 10 s in the runs of docs/measured.md), so more, shorter rounds narrow its interval
# more than longer cells would, and the context layouts' third planned round (about 35 s) buys the
# verdict two of them. Quotable tails need about 160 s of the verdict's cells at this machine's
# rates (1,200 requests a cell at 23-43 req/s), most of which the claim's rounds pool: the budget
# held both in 10 of 11 fresh-clone runs (docs/measured.md); the headline says which are short.
DEFAULT_DURATION = 2
DEFAULT_KEY_DURATION = 4
DEFAULT_WARMUP = 1
DEFAULT_REPEATS = 2
AUTO_BUDGET_MIN = 5.0  # --budget auto: at least this, or the planned rounds' estimate + AUTO_EXTENSION_S
AUTO_EXTENSION_S = 75.0
# Requests last ~100 ms here: 25 samples a second see each one ~2 times; the cost is measured
# by scripts/sampler-cost.py (README, "Comparing layouts").
DEFAULT_INFLIGHT_HZ = 25.0
MAX_NET_HOSTS = 8
# With --hosts: what TLS costs on a request that does nothing, and on the article's.
HOSTS_SCENARIOS = ["overhead", "article"]


def hosts_layouts(processes: int, threads: int) -> tuple[str, ...]:
    """With --hosts: mapped over plain uwsgi (measured only inside the namespaces), over TLS
    (the default) and over uWSGI's https-socket (the alternative)."""
    spec = f"{processes}x{threads}-mapped"
    return (f"{spec}@uwsgi_tls=off", spec, f"{spec}@uwsgi_tls=https")


# The ranges of compare's own options (each checked while parsing and shown in the help).
NET_HOSTS = Ints(1, MAX_NET_HOSTS)
LEVELS = CommaList(CONNECTIONS, "connection count")
DURATION_S = Numbers(1, 3600)
WARMUP_S = Numbers(1, 600)
REPEATS = Ints(1, 100)
BUDGET_MIN = Numbers(0.1, 1440, noun="a number of minutes")
INFLIGHT_HZ = Numbers(1, 200, off=0)
SCENARIO_NAMES = CommaList(OneOf((*sc.SCENARIOS, *sc.ALIASES)), "scenario")
# The demo app's knobs and the scenarios' loads (bench.load.scenarios: Scenario.resolved), as
# --rounds ... override them: (name, range, help, default).
OVERRIDES = (
    ("rounds", Ints(0, 20), "override the scenario's rounds", ""),
    ("fib", Ints(0, 30), "override the scenario's fib n", ""),
    ("io_ms", Ints(0, 10000), "override the scenario's sleep per round in ms", ""),
    ("stall_clients", Ints(0, 1000), "stall scenarios: extra clients that hit the hanging API", "T"),
    ("stall_fraction", Numbers(0.01, 0.5), "stall scenarios: instead, this share of requests hangs", ""),
    ("stall_ms", Ints(1, 10000), "stall scenarios: how long the API hangs, ms", "3000"),
    ("hot_clients", Ints(1, 1000), "files-mixed: connections asking for the hot file", "4"),
    ("large_share", Numbers(0, 0.5), "files-mixed: share of requests for a large file", "0.02"),
)


def budget(raw: str) -> float | str:
    """--budget: ``auto``, or minutes (the plan's minimum is checked once the plan is known)."""
    if str(raw).strip().lower() == "auto":
        return "auto"
    try:
        return BUDGET_MIN(raw)
    except ArgumentTypeError:
        raise refuse(f"auto or {BUDGET_MIN.allowed}", repr(raw)) from None


def add_arguments(p) -> None:
    p.add_argument("--processes", type=PROCESSES,
                   help=f"P of the default matrix ({PROCESSES}; default: the usable CPUs: nproc, or the cgroup's CPU "
                        "quota rounded up if smaller)")
    p.add_argument("--threads", type=THREADS, help=f"T of the default matrix ({THREADS}; default 4)")
    p.add_argument("--layouts", help="comma-separated PxT-STRATEGY list (default: 1xT-shared, Px1-shared, "
                                     "PxT-shared, PxT-thunder, PxT-mapped, PxT-gunicorn)")
    p.add_argument("--concurrency", type=LEVELS,
                   help=f"comma-separated connection counts, each {CONNECTIONS} (default: P, 2P, ... P*T)")
    p.add_argument("--duration", type=DURATION_S,
                   help=f"seconds of load per cell ({DURATION_S}; default {DEFAULT_DURATION})")
    p.add_argument("--warmup", type=WARMUP_S,
                   help=f"seconds of one-connection warm-up per stack start ({WARMUP_S}; default {DEFAULT_WARMUP})")
    p.add_argument("--key-duration", type=DURATION_S,
                   help="seconds per cell of the cells the article's verdict quotes (PxT-mapped and PxT-shared at P "
                        f"and 2P connections; {DURATION_S}; default {DEFAULT_KEY_DURATION:g}, never below --duration)")
    p.add_argument("--repeats", type=REPEATS,
                   help=f"interleaved repeats (rounds) of every layout ({REPEATS}; default {DEFAULT_REPEATS})")
    p.add_argument("--budget", type=budget,
                   help=f"minutes for the whole run ({BUDGET_MIN}), or auto (the planned rounds' estimate + "
                        f"{AUTO_EXTENSION_S:g} s, at least {AUTO_BUDGET_MIN:g}; make compare's default): after the "
                        "planned rounds, add rounds of the key comparisons still undecided until each is decided or "
                        "equivalent, or the budget ends (default: the planned rounds only)")
    p.add_argument("--margin", type=MARGIN,
                   help=f"equivalence margin of every comparison ({MARGIN}): two layouts are equivalent when the "
                        "whole interval of their paired ratio lies within ±MARGIN (default 0.05)")
    p.add_argument("--timeout", type=TIMEOUT_S, help=f"wrk's per-request timeout in seconds ({TIMEOUT_S}; default 10)")
    p.add_argument("--scenario", type=SCENARIO_NAMES,
                   help=f"named request mix, or several comma-separated: {SCENARIO_NAMES.item} (default: "
                        "article; traffic with --request or another --app)")
    for name, allowed, text, default in OVERRIDES:
        p.add_argument(f"--{name.replace('_', '-')}", type=allowed,
                       help=f"{text} ({allowed}" + (f"; default {default})" if default else ")"))
    p.add_argument("--cold-cache", type=on_off, metavar="on|off",
                   help="file scenarios: on = evict the data set before every cell (default: on for files-mixed, "
                        "off otherwise)")
    p.add_argument("--data-dir", help="file scenarios: the data set (default build/dataset, created if missing; "
                                      "uwsgi-layouts dataset makes others)")
    p.add_argument("--transport", choices=TRANSPORTS,
                   help="uWSGI sockets: unix or tcp (default unix; tcp with --hosts)")
    p.add_argument("--hosts", type=NET_HOSTS,
                   help=f"run every layout on this many app hosts ({NET_HOSTS}), each in its own network namespace "
                        "behind a front namespace, with TLS between them (root); reports each host's share and what "
                        "TLS costs (layouts ...@uwsgi_tls=off)")
    p.add_argument("--inflight-hz", type=INFLIGHT_HZ,
                   help="stats-server samples per second during each cell, for the requests in flight per worker "
                        f"({INFLIGHT_HZ.allowed}; default {DEFAULT_INFLIGHT_HZ:g})")
    subj.add_arguments(p)
    p.add_argument("--out", help="output directory (default results/<timestamp>)")
    p.add_argument("--full", action="store_true",
                   help="print the full report (every table, the decisions, the warnings) instead of the headline; "
                        "it is in report.txt and report.md either way")
    p.add_argument("--replay", metavar="RESULTS_JSON",
                   help="rerun the sweep and report on stored cells instead of measuring")


def plan_from_args(args, stored=None, subject: subj.Subject | None = None) -> tuple[Plan, dict[str, sc.Scenario]]:
    """The plan the options (parsed, so each in its range) or a stored run describe: BadArgument,
    LayoutError or TrafficError naming the field for what needs several options together."""
    nproc = default_cpus()  # the CPUs this process may use: affinity, or a cgroup quota if tighter
    base = stored.arguments if stored else {}

    def given(name: str, default):
        """The option as parsed; not given: the stored run's, else ``default``."""
        value = getattr(args, name, None)
        return base.get(name, default) if value is None else value

    def given_in(name: str, allowed, default):
        """``given``, checked with the option's own validator: a stored run's value was checked
        when it was measured, but a hand-edited or damaged results.json is input too."""
        try:
            return allowed(given(name, default))
        except ArgumentTypeError as exc:
            raise BadArgument(f"{name}: {exc}") from None

    if subject is None:
        subject = subj.from_stored(base) if stored else subj.from_args(args)
    p, t, hosts = given("processes", nproc), given("threads", 4), given("hosts", 0)
    given_names = list(args.scenario or base.get("scenarios") or (
        HOSTS_SCENARIOS if hosts and subject.mix is None else subj.default_scenarios(subject)))
    unknown = [n for n in given_names if n not in SCENARIO_NAMES.item.names]
    if unknown:  # a stored run's scenario that this version no longer has (--scenario is checked while parsing)
        raise BadArgument(f"scenario: unknown scenario {unknown[0]!r}; allowed: {SCENARIO_NAMES.item}")
    names = sc.expand(given_names)
    if not stored:
        subj.check_scenarios(names, subject, args)
    family = sc.family_defaults(names, p, t)
    if args.layouts:
        layouts = split_specs(args.layouts)
    else:
        layouts = tuple(base.get("layouts") or (family[0] if family else hosts_layouts(p, t) if hosts
                                                else default_layouts(p, t)))
    if not layouts:
        raise BadArgument("layouts: give at least one PxT-STRATEGY")
    options = _layout_options(args, base, names, hosts) | subject.layout_options
    with _validation_options(hosts, options) as validation:
        for spec in layouts:
            checked(parse_variant(spec, **validation))  # raises LayoutError naming the field
    if args.concurrency is not None:
        levels = tuple(sorted(set(args.concurrency)))
    else:
        levels = tuple(base.get("concurrency") or (family[1] if family else default_levels(p * max(1, hosts), t)))
    overrides = {name: getattr(args, name) for name, *_ in OVERRIDES} | {"cold_cache": args.cold_cache}
    resolved = {n: sc.SCENARIOS[n].resolved(t, **overrides) for n in names}
    if subject.mix is not None:
        resolved = {n: s.with_mix(subject.mix) for n, s in resolved.items()}
    for scenario in resolved.values():
        if scenario.workload.rounds * scenario.workload.io_ms > 30000:
            raise BadArgument("rounds*io_ms: must be at most 30000 ms per request")
    duration = given_in("duration", DURATION_S, DEFAULT_DURATION)
    # A replayed file without the option was measured without the sampler.
    inflight_hz = given_in("inflight_hz", INFLIGHT_HZ, 0 if stored else DEFAULT_INFLIGHT_HZ)
    # A replayed file without a warm-up recorded ran with the old default of 2 s.
    warmup = given_in("warmup", WARMUP_S, 2 if stored else DEFAULT_WARMUP)
    plan = Plan(
        layouts=layouts, concurrency=levels, repeats=given_in("repeats", REPEATS, DEFAULT_REPEATS),
        duration=duration, warmup=warmup, processes=p, threads=t,
        scenarios=names, workload={n: s.to_dict() for n, s in resolved.items()},
        timeout=given_in("timeout", TIMEOUT_S, 10), inflight_hz=inflight_hz, command=_command(args),
        options=options, app=subject.record, hosts=hosts, margin=given("margin", 0.05),
    )
    plan = with_key_cells(plan, args, base)
    if stored:
        return dataclasses.replace(plan, budget_min=base.get("budget_min")), resolved
    return dataclasses.replace(plan, budget_min=budget_arg(getattr(args, "budget", None), plan)), resolved


def with_key_cells(plan: Plan, args, base: dict) -> Plan:
    """The verdict's cells and their duration: a demo run with the article's scenario and both of
    PxT-mapped and PxT-shared; a stored run keeps what it recorded (nothing, if written before)."""
    if base:
        cells = tuple((str(x), int(lv)) for x, lv in base.get("key_cells") or ())
        return dataclasses.replace(plan, key_duration=base.get("key_duration"), key_cells=cells)
    pair = (f"{plan.processes}x{plan.threads}-mapped", f"{plan.processes}x{plan.threads}-shared")
    if not plan.app.get("demo", True) or ARTICLE not in plan.scenarios or not set(pair) <= set(plan.layouts):
        return plan
    given = getattr(args, "key_duration", None)
    key = max(plan.duration, DEFAULT_KEY_DURATION if given is None else given)
    levels = [lv for lv in (plan.processes, 2 * plan.processes) if lv in plan.concurrency]
    return dataclasses.replace(plan, key_duration=key, key_cells=tuple((x, lv) for x in pair for lv in levels))


def budget_arg(given: float | str | None, plan: Plan) -> float | None:
    """--budget as parsed (``budget``): minutes, "auto" (from the plan), or None (the planned rounds
    only). Below what the planned rounds need: BadArgument naming the minimum."""
    if given is None:
        return None
    estimate = plan.estimate_seconds() + RESERVE_S
    if given == "auto":
        return round(max(AUTO_BUDGET_MIN * 60, estimate + AUTO_EXTENSION_S) / 60, 1)
    minutes = given
    if minutes * 60 < estimate:
        least = math.ceil(estimate / 6) / 10
        raise BadArgument(f"budget: {minutes:g} min is less than the planned rounds need: about {least:g} min "
                          f"({len(plan.layouts)} layouts x {len(plan.concurrency)} levels x {plan.repeats} repeats of "
                          f"{plan.duration:g} s, stack starts, warm-ups and {RESERVE_S:g} s to write the results); "
                          f"give --budget {least:g} or more, or fewer --layouts, --repeats or a shorter --duration")
    return minutes


@contextlib.contextmanager
def _validation_options(hosts: int, options: dict):
    """What a layout is validated with before anything runs: with --hosts, one stand-in host on
    loopback and throwaway certificates for it (the real ones are made with the namespaces)."""
    options = {k: v for k, v in options.items() if k == "transport"}  # the data set may not exist yet
    if not hosts:
        yield {"run_dir": "/tmp/validate", **options}
        return
    with tempfile.TemporaryDirectory(prefix="ul-validate-") as tmp:
        uwsgi_tls_dir = make_certs(Path(tmp) / "uwsgi_tls", ["127.0.0.1"]).directory
        yield {"run_dir": "/tmp/validate", **options, "hosts": ("127.0.0.1",), "uwsgi_tls_dir": str(uwsgi_tls_dir)}


def _command(args) -> str:
    """The command line to record, credential header values left out."""
    argv = getattr(args, "argv", None)
    return command_line("compare", redact_argv(argv) if argv is not None else None)


def _layout_options(args, base: dict, names, hosts: int = 0) -> dict:
    """Options every layout of the run gets (a variant's own ``@option=value`` wins): the
    transport (a stored run without one was measured over tcp, the default then), and for file
    scenarios the data set and ``sendfile on``."""
    stored = base.get("options", {})
    transport = (stored.get("transport", "tcp") if base and not args.transport
                 else chosen_transport(args.transport, hosts))
    options = {"transport": transport}
    if sc.needs_dataset(names):
        data_dir = args.data_dir or stored.get("data_dir") or str(default_data_dir())
        options.update({"data_dir": str(Path(data_dir).absolute()), "sendfile": stored.get("sendfile", "on")})
    elif args.data_dir:
        raise BadArgument("data_dir: only file scenarios (files, files-mixed, reuseport) use a data set")
    return options


def run(args) -> int:
    started = time.monotonic()
    stored = load(args.replay) if args.replay else None
    subject = subj.from_stored(stored.arguments) if stored else subj.from_args(args)
    plan, scenarios = plan_from_args(args, stored, subject)
    if stored:  # the stored cells were measured with the stored mix, whatever the defaults say now
        plan = dataclasses.replace(plan, workload=stored.workload)
    index = None
    if not stored:
        require_tools("wrk")
        if plan.hosts and netns_unavailable():
            raise MissingTool(f"--hosts: {netns_unavailable()}")
        for note in subject.notes:
            print(note, flush=True)
        # before any stack starts (with --hosts, without the variant: its TLS needs the namespaces' certificates)
        subj.preflight_app(plan.layouts[0].partition("@")[0] if plan.hosts else plan.layouts[0], plan.options,
                           subject.import_timeout)
        index = prepare_dataset(Path(plan.options["data_dir"])) if "data_dir" in plan.options else None
    with Lab(hosts=plan.hosts) as lab, sigterm_interrupts():
        if subject.mix is not None and not stored:
            checked_subject, lines = subj.preflight_traffic(lab, plan.layouts[0], plan.options, subject, plan.timeout)
            print("\n".join(lines), flush=True)
            if checked_subject.mix != subject.mix:  # --skip-failing left requests out: plan the others
                subject = checked_subject
                plan, scenarios = plan_from_args(args, stored, subject)
        out = prepare_out(args.out)
        mode = f"replaying {args.replay} ({subject.app})" if stored else f"measuring {subject.app}"
        est = plan.estimate_seconds()
        key = f" ({plan.key_duration:g} s for the verdict's cells)" if plan.key_cells else ""
        print(f"{mode}: {len(plan.layouts)} layouts x {len(plan.concurrency)} levels "
              f"{list(plan.concurrency)} x {plan.repeats} repeats x scenarios {', '.join(plan.scenarios)}, "
              f"{plan.duration:g} s per cell{key}; about {est / 60:.1f} min; results in {out}", flush=True)
        results_path = out / RESULTS_NAME
        until = None
        on_block = None
        if stored:
            runner, environment = ReplayRunner(stored), stored.environment | {"replayed_from": str(args.replay)}
            if plan.budget_min is not None:
                until = Until(None, lambda: 0.0, max_rounds=stored.arguments.get("max_rounds") or plan.repeats,
                              stored_rounds=frozenset(c.round for c in stored.cells),
                              final_share=stored.arguments.get("final_share") or 0.0,
                              stored_tails=tuple((stored.arguments.get("until_decided") or {}).get("tails") or ()),
                              stored_tails_stop=(stored.arguments.get("until_decided") or {}).get("tails_stop") or "",
                              stored_cells=frozenset((c.layout, c.concurrency, c.round) for c in stored.cells))
        else:
            runner = LiveRunner(lab, out / "raw", scenarios, plan.duration, plan.warmup, plan.timeout,
                                layout_options=plan.options, inflight_hz=plan.inflight_hz)
            environment = capture()
            if index is not None:
                environment["dataset"] = dataset_facts(index)
            machine = Machine()
            on_block = lambda: environment.update(machine=machine.sample() and machine.record())  # noqa: E731
            if plan.budget_min is not None:
                print(f"budget: {plan.budget_min:g} min; after the planned rounds, the key comparisons still "
                      f"undecided get more rounds (equivalent within ±{plan.margin:.0%})", flush=True)
                until = Until(plan.budget_min * 60, lambda: time.monotonic() - started)
        try:
            results = run_sweep(plan, runner, environment, save=lambda r: r.save(results_path),
                                progress=Progress(plan), until=until, on_block=on_block)
        except KeyboardInterrupt:
            print(f"\ninterrupted: the cells measured so far are in {results_path}", file=sys.stderr)
            return 130
    # The answer where the eye lands; the tables are in report.txt (or here with --full).
    summary = summarize(results)  # decided once: the headline, every report file and summary.json
    publish(results, out, saved=results_path, summary=summary,
            screen=None if args.full else headline_lines(results, summary, str(out)))
    return 0


KIND = Kind("compare", "measure layouts side by side and write results + report", add_arguments, run)
