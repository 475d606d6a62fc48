"""``uwsgi-layouts faults`` (what ``make faults`` runs): faults under load, with figures.

The experiments (``bench.localfaults``; with ``--hosts``, across app hosts: ``bench.hostfaults``)
each start their own stack, inject one kind of fault under load and return a ``FaultRecord``
with the checks of the issue's targets. This module is the command: which experiments run on
which layouts, its options, and the results file.

Your app (``--app`` and the traffic options, as compare takes them: ``bench.subject``): the
experiments that need nothing but load (kill-worker, chain-reload, nginx-reload) run it, under
your requests instead of the demo app's; the others need the demo app's slow endpoint or edit
its code, and are refused for another app. It is pre-flighted, and each distinct request sent
once through nginx, before the first experiment.

The run saves ``results.json`` (kind ``faults``, after every experiment), ``report.txt`` and
``report.md`` under results/<timestamp>-faults/, and prints the table (``bench.report.faults``).
"""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import Callable

from uwsgi_layouts.arguments import Ints
from uwsgi_layouts.bench import subject as subj
from uwsgi_layouts.bench.environment import capture
from uwsgi_layouts.bench.faultkit import Patch
from uwsgi_layouts.bench.hostfaults import HOST_EXPERIMENTS
from uwsgi_layouts.bench.kinds.base import RESULTS_NAME, Kind, publish, sigterm_interrupts
from uwsgi_layouts.bench.load.traffic import TrafficError, redact_argv
from uwsgi_layouts.bench.localfaults import PER_LAYOUT, backlog_full, stuck_request
from uwsgi_layouts.bench.options import (
    BadArgument,
    MissingTool,
    command_line,
    prepare_out,
    require_tools,
    split_specs,
)
from uwsgi_layouts.bench.results import FaultRecord, Results, utc_now
from uwsgi_layouts.bench.stack import Lab
from uwsgi_layouts.deploy.model import LayoutError, StackError, parse_layout, parse_variant
from uwsgi_layouts.deploy.run import unavailable as netns_unavailable

DEFAULT_LAYOUTS = ("2x4-mapped", "2x4-shared")

# --- the run: every experiment, then a table ---------------------------------------------------

EXPERIMENTS = (*PER_LAYOUT, "backlog-full")
# What runs your app under your requests: the rest needs the demo app's slow endpoint
# (stuck-request, backlog-full) or edits the app's code (broken-reload).
APP_EXPERIMENTS = ("kill-worker", "chain-reload", "nginx-reload")
HOSTS = Ints(2, 8)  # --hosts: app hosts, each in a network namespace of its own


def plan(layouts: list[str], only: list[str] | None = None,
         hosts: int = 0, demo: bool = True) -> list[tuple[str, Callable[..., FaultRecord], dict]]:
    """(name, function, keyword arguments) for every experiment to run, in order. With
    ``hosts``: the experiments across app hosts (bench.hostfaults), on every layout; for
    another app than the demo (``demo`` False): APP_EXPERIMENTS only."""
    if hosts:
        return [(name, fn, {"spec": spec}) for spec in layouts for name, fn in HOST_EXPERIMENTS.items()
                if name in set(only or HOST_EXPERIMENTS)]
    wanted = set(only or (EXPERIMENTS if demo else APP_EXPERIMENTS))
    steps = []
    for spec in layouts:
        for name, fn in PER_LAYOUT.items():
            if name in wanted:
                steps.append((name, fn, {"spec": spec}))
    if "stuck-request" in wanted:
        # The same layout with one thread per worker: uWSGI 2.0's harakiri is per worker.
        first = parse_layout(layouts[0], run_dir="/tmp/x")
        single = f"{first.processes}x1-{first.strategy}"
        if all(parse_layout(s, run_dir="/tmp/x").threads != 1 for s in layouts):
            steps.append(("stuck-request", stuck_request, {"spec": single}))
    if "backlog-full" in wanted:
        for transport in ("tcp", "unix"):
            steps.append(("backlog-full", backlog_full, {"spec": "1x1-shared", "transport": transport}))
    return steps


def add_arguments(p) -> None:
    p.add_argument("--layouts", default=",".join(DEFAULT_LAYOUTS),
                   help=f"comma-separated layouts for the per-layout experiments (default {','.join(DEFAULT_LAYOUTS)})")
    p.add_argument("--only", default="", help=f"comma-separated experiments to run (of {', '.join(EXPERIMENTS)})")
    p.add_argument("--strict", action="store_true", help="exit 1 when any target is missed (default: report only)")
    p.add_argument("--try-server-params", default="",
                   help="experiment only: append these parameters to every upstream server line of the rendered "
                        "nginx.conf (e.g. max_fails=0), to measure a proposed template change")
    p.add_argument("--try-location", default="",
                   help="experiment only: add these directives to the uwsgi_pass location (e.g. "
                        "'uwsgi_read_timeout 3s'), to measure a proposed template change")
    p.add_argument("--hosts", type=HOSTS, default=0,
                   help=f"run the experiments across this many app hosts ({HOSTS}), each in its own network "
                        f"namespace (root): {', '.join(HOST_EXPERIMENTS)}")
    subj.add_arguments(p)  # your app: the experiments that only need load (APP_EXPERIMENTS), under your requests
    p.add_argument("--out", help="output directory (default results/<timestamp>-faults)")


def resolve_args(args) -> tuple[list[str], list[str], subj.Subject]:
    """The layouts, the experiments to run and the app; BadArgument, LayoutError or
    TrafficError naming the field."""
    layouts = list(split_specs(args.layouts))
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    if not layouts:
        raise BadArgument("layouts: give at least one layout, e.g. 2x4-mapped")
    hosts = args.hosts
    subject = subj.from_args(args)
    if subject.mix is not None and (hosts or subject.demo):
        raise TrafficError("app" if hosts else "request",
                           "the experiments across hosts run the demo app with its own requests" if hosts else
                           "the demo app's experiments send their own requests: give --app for yours")
    for spec in layouts:
        parsed = parse_variant(spec.partition("@")[0] if hosts else spec, run_dir="/tmp/x", **subject.layout_options)
        if parsed.replicas > 1:
            # The experiments watch one uWSGI (its stats server, its workers): each replica is a stack of its own.
            raise BadArgument(f"layouts: {spec} has {parsed.replicas} replicas; faults runs one app server: "
                              "measure a replica alone (drop replicas=)")
    allowed = HOST_EXPERIMENTS if hosts else EXPERIMENTS
    unknown = sorted(set(only) - set(allowed))
    if unknown:
        raise BadArgument(f"only: unknown experiment {unknown[0]!r}; allowed: {', '.join(allowed)}"
                          + (" (with --hosts)" if hosts else ""))
    demo_only = sorted(set(only) - set(APP_EXPERIMENTS))
    if not subject.demo and demo_only:
        raise BadArgument(f"only: {demo_only[0]} runs the demo app (it needs its slow endpoint or edits its code); "
                          f"with --app: {', '.join(APP_EXPERIMENTS)}")
    return layouts, only, subject


def run_experiment(lab: Lab, name: str, fn: Callable[..., FaultRecord], kwargs: dict,
                   patch: Patch | None, app: dict | None = None) -> FaultRecord:
    """One experiment, timed; one that could not run (its stack failed, ...) is recorded with the
    error. ``app``: the user's app options and ``mix`` (not recorded in the workload: the run's
    arguments name the app, its traffic is recorded once)."""
    t0 = time.monotonic()
    try:
        record = fn(lab, patch=patch, **kwargs, **(app or {}))
    except (StackError, LayoutError, OSError, RuntimeError) as exc:  # the experiment could not run
        label = " ".join(f"{v}" for v in kwargs.values())
        return FaultRecord(name=name, layout=label, load="", faults_injected=0, requests_sent=0, requests_failed=0,
                           data_lost=0, patch=patch.label if patch else "", seconds=time.monotonic() - t0,
                           error=str(exc), figures={"log_tail": getattr(exc, "log_tail", "") or ""})
    return dataclasses.replace(record, seconds=time.monotonic() - t0)


def run(args) -> int:
    layouts, only, subject = resolve_args(args)
    hosts = args.hosts
    require_tools("wrk")
    if hosts and netns_unavailable():
        raise MissingTool(f"--hosts: {netns_unavailable()}")
    for note in subject.notes:
        print(note, file=sys.stderr, flush=True)
    if not subject.demo:  # before anything is written
        subj.preflight_app(layouts[0], subject.layout_options, subject.import_timeout)
    out = prepare_out(args.out, suffix="-faults")
    patch = Patch(args.try_server_params, args.try_location) or None
    steps = plan(layouts, only or None, hosts, demo=subject.demo)
    argv = getattr(args, "argv", None)
    arguments = {"layouts": layouts, "only": only, "strict": bool(args.strict), "hosts": hosts,
                 "try_server_params": args.try_server_params, "try_location": args.try_location,
                 "command": command_line("faults", redact_argv(argv) if argv is not None else None),
                 **({} if subject.demo else {"app": subject.record})}
    workload = {"experiments": [{"name": name, **kwargs} for name, _, kwargs in steps]}
    environment, created = capture(), utc_now()
    records: list[FaultRecord] = []
    results_path = out / RESULTS_NAME

    def snapshot(complete: bool) -> Results:
        return Results(kind="faults", created=created, environment=environment, workload=workload,
                       arguments=arguments | {"complete": complete}, faults=tuple(records))

    print(f"faults: {len(steps)} experiments on {', '.join(layouts)}; results in {out}", file=sys.stderr, flush=True)
    t0 = time.monotonic()
    with Lab(hosts=hosts) as lab, sigterm_interrupts():
        app = None
        if not subject.demo:  # each distinct request once through nginx (--skip-failing: the others only)
            subject, lines = subj.preflight_traffic(lab, layouts[0], subject.layout_options, subject, 10.0)
            print("\n".join(lines), file=sys.stderr, flush=True)
            workload = {**workload, "traffic": {"description": "your requests, under every experiment's load",
                                                "traffic": subject.mix.to_dict()}}
            app = {**subject.layout_options, "mix": subject.mix}
        try:
            for name, fn, kwargs in steps:
                label = " ".join(f"{v}" for v in kwargs.values())
                print(f"[{time.monotonic() - t0:5.1f} s] {name} on {label} ...", file=sys.stderr, flush=True)
                records.append(run_experiment(lab, name, fn, kwargs, patch, app))
                if records[-1].error:
                    print(f"error: {name} on {label}: {records[-1].error}", file=sys.stderr)
                    if records[-1].figures["log_tail"]:
                        print(records[-1].figures["log_tail"], file=sys.stderr)
                snapshot(complete=False).save(results_path)  # an interruption keeps every finished experiment
        except KeyboardInterrupt:
            print(f"\ninterrupted: the experiments finished so far are in {results_path}", file=sys.stderr)
            return 130
    results = snapshot(complete=True)
    results.save(results_path)
    publish(results, out, saved=results_path)
    crashed = any(r.error for r in records)
    missed = any(r.failed_checks for r in records)
    return 1 if crashed or (missed and args.strict) else 0


KIND = Kind("faults", "faults under load (kill -9, stuck requests, full backlog, reloads): figures table",
            add_arguments, run)
