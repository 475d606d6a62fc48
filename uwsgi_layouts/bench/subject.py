"""What a closed-loop run measures: the app (deploy's own app options) and the traffic sent to it.

Every kind that loads stacks with closed-loop cells (``compare``; ``tune`` later) takes the same
options and checks them the same way:

    add_arguments(parser)          --app --app-dir --virtualenv --env --static --import-timeout
                                   (deploy.cli), their --allow-world-writable --allow-system-static,
                                   and --request --requests --header --access-log --include-unsafe
                                   --skip-failing
    subject = from_args(args)      a validated ``Subject``: the layouts' app options, demo app or
                                   not, the request mix (``bench.load.traffic.Mix``), notes to print
    check_scenarios(names, subject, args)   the scenarios that make sense with this subject
    preflight_app(spec, options, timeout) the app imports as the workers will (deploy.machine.preflight)
    preflight_traffic(lab, spec, options, subject, timeout)   each distinct request once through
                                   nginx: every failing one named; with --skip-failing (an access
                                   log) dropped, and the subject returned without them
    check_mix_for_httperf(subject, refused)   the open-loop kinds (openloop, plan): a mix httperf
                                   can replay (GET only, no credential headers on its command line)
    httperf_traffic(subject, layout, work_dir, timeout, warmup_s)   on a started stack: the mix
                                   checked through nginx, as httperf's --wlog list, and what starts wrk's warm-up

The demo app (``app.wsgi:application`` from this project) keeps its named scenarios. Another app
gets the user's requests, ``GET /`` when none are given: its cells run as scenario ``traffic``.
Bad input raises ``LayoutError`` or ``TrafficError`` (one line, exit 2) before anything starts.
"""

from __future__ import annotations

import argparse
import functools
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from uwsgi_layouts.bench.load import httperf
from uwsgi_layouts.bench.load import scenarios as sc
from uwsgi_layouts.bench.load.accesslog import read_access_log
from uwsgi_layouts.bench.load.traffic import (
    MAX_UNANSWERED,
    SAFE_METHODS,
    SENSITIVE_HEADERS,
    Mix,
    Request,
    TrafficError,
    build_mix,
    check_headers,
    check_requests,
    failures_line,
    parse_header,
    parse_request_line,
    read_requests_file,
    without,
    write_mix_script,
)
from uwsgi_layouts.bench.load.wrk import WrkProcess
from uwsgi_layouts.bench.stack import Lab
from uwsgi_layouts.deploy.cli import add_app_options, add_risk_options, app_options, import_timeout
from uwsgi_layouts.deploy.machine import PACKAGE_DIR, PREFLIGHT_TIMEOUT, checked, preflight
from uwsgi_layouts.deploy.model import DEFAULT_APP, Layout, parse_layout, parse_variant

APP_KEYS = ("app", "app_dir", "virtualenv", "env", "static", "allow")
VALIDATE_RUN_DIR = "/tmp/validate"  # layouts are checked before any run directory exists
TRAFFIC = "traffic"
KNOBS = ("rounds", "fib", "io_ms")  # the demo app's query parameters


@dataclass(frozen=True)
class Subject:
    """The app under test and its traffic. ``layout_options``: the app options every layout of
    the run gets; ``record``: what results.json says was measured (``arguments["app"]``)."""

    layout_options: dict
    demo: bool
    record: dict
    mix: Mix | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)
    import_timeout: float = PREFLIGHT_TIMEOUT
    from_log: bool = False  # the mix comes from --access-log
    skip_failing: bool = False  # --skip-failing: drop the log's requests that fail in the pre-flight

    @property
    def app(self) -> str:
        return self.record.get("app", DEFAULT_APP)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_app_options(p)
    add_risk_options(p, "world-writable", "system-static")
    p.add_argument("--request", action="append", metavar="'[N*]METHOD PATH [@BODY_FILE]'",
                   help="a request of your traffic (repeatable), e.g. 'GET /', '3*GET /api/items?page=2' (weight "
                        "3), 'POST /api/items @item.json' (body read from the file, relative to the current "
                        "directory); replaces the scenario's own request")
    p.add_argument("--requests", metavar="FILE",
                   help="request lines from a file, one per line ('#' comments; body files relative to FILE)")
    p.add_argument("--header", action="append", metavar="'Name: value'",
                   help="a header sent with every request of your traffic (repeatable): Host, Cookie, "
                        "Authorization... (credential values are not written to results.json)")
    p.add_argument("--access-log", metavar="FILE",
                   help="your traffic from an nginx access log (combined or this project's upstreams format): "
                        "method, path and query, weighted by frequency; GET and HEAD lines only")
    p.add_argument("--include-unsafe", action="store_true",
                   help="with --access-log: replay POST, PUT, PATCH, DELETE lines too (without bodies; they may "
                        "change your app's data)")
    p.add_argument("--skip-failing", action="store_true",
                   help="with --access-log: leave out the requests that fail in the pre-flight (4xx/5xx or no "
                        "answer), instead of stopping there; the summary counts them")


def _record(layout: Layout, demo: bool) -> dict:
    return {"app": layout.app, "app_dir": layout.app_dir, "virtualenv": layout.virtualenv, "demo": demo,
            "env": [k for k, _ in layout.env],  # names (the values are in options and the command, as in layout.json)
            "static": [list(s) for s in layout.static]}


def from_stored(arguments: dict) -> Subject:
    """The subject a stored run recorded (replay: nothing is sent, so no mix is rebuilt)."""
    record = arguments.get("app") or {"app": DEFAULT_APP, "app_dir": str(PACKAGE_DIR), "demo": True}
    options = arguments.get("options") or {}
    return Subject({k: options[k] for k in APP_KEYS if k in options}, bool(record.get("demo", True)), record)


def from_args(args: argparse.Namespace, cwd: Path | None = None) -> Subject:
    """The app options (validated as a layout would validate them) and the traffic options."""
    picked: list[str] = []
    options = app_options(args, notes=picked)  # with --app, the defaults follow the current directory
    timeout = import_timeout(args)
    probe = checked(parse_layout("1x1-shared", run_dir=VALIDATE_RUN_DIR, **options))  # LayoutError naming the field
    demo = probe.app == DEFAULT_APP and Path(probe.app_dir) == PACKAGE_DIR
    mix, notes = _traffic(args, probe, demo, cwd)
    from_log = bool(getattr(args, "access_log", None))
    skip_failing = bool(getattr(args, "skip_failing", False))
    if skip_failing and not from_log:
        raise TrafficError("skip_failing", "only applies to --access-log (fix or remove a failing --request line)")
    return Subject(options, demo, _record(probe, demo), mix, tuple(picked + notes), timeout, from_log, skip_failing)


def _traffic(args, probe: Layout, demo: bool, cwd: Path | None) -> tuple[Mix | None, list[str]]:
    lines = list(getattr(args, "request", None) or [])
    requests_file = getattr(args, "requests", None)
    access_log = getattr(args, "access_log", None)
    include_unsafe = bool(getattr(args, "include_unsafe", False))
    headers = check_headers([parse_header(h) for h in (getattr(args, "header", None) or [])])
    if access_log and (lines or requests_file):
        raise TrafficError("access_log", "give either --access-log or --request/--requests, not both (a log's "
                                         "counts and request weights do not add up)")
    if include_unsafe and not access_log:
        raise TrafficError("include_unsafe", "only applies to --access-log (a --request line names its method)")
    notes: list[str] = []
    if access_log:
        mix, summary = read_access_log(access_log, include_unsafe=include_unsafe, headers=headers)
        notes.append(f"traffic from {summary.describe()}")
    elif lines or requests_file:
        requests = [parse_request_line(x, cwd) for x in lines]
        if requests_file:
            requests += read_requests_file(requests_file)
        sources = ([f"{len(lines)} --request"] if lines else []) + ([f"--requests {requests_file}"]
                                                                    if requests_file else [])
        mix = build_mix(requests, headers, source=" and ".join(sources))
    elif not demo:
        mix = build_mix([Request("GET", "/")], headers, source="default: GET / (no --request given)")
        notes.append(f"no --request given: measuring GET / of {probe.app} (give --request lines, --requests or "
                     "--access-log for your real traffic)")
    elif headers:
        raise TrafficError("header", "applies to your requests (--request, --requests or --access-log); the demo "
                                     "app's scenarios send their own")
    else:
        return None, notes
    if mix.unsafe:
        methods = ", ".join(sorted({r.method for r in mix.unsafe}))
        share = sum(mix.share(r) for r in mix.unsafe)
        notes.append(f"{share:.0%} of the requests are {methods}: replayed hundreds of times, they may change your "
                     "app's data (measure against a copy)")
    notes.append(f"traffic: {mix.summary()}")
    return mix, notes


def default_scenarios(subject: Subject) -> list[str]:
    return [TRAFFIC] if subject.mix is not None else ["article"]


def check_scenarios(names: tuple[str, ...], subject: Subject, args: argparse.Namespace | None = None) -> None:
    """Refuse, with one line, scenarios and knobs that make no sense with this subject: a mix
    replaces the demo scenarios' own request; stalled clients call the demo app only."""
    given = (lambda name: getattr(args, name, None)) if args is not None else (lambda name: None)
    if subject.mix is None:
        if TRAFFIC in names:
            raise TrafficError("scenario", "traffic sends your requests: give --request, --requests or --access-log")
        return
    for knob in KNOBS:
        if given(knob) is not None:
            raise TrafficError(knob, "only the demo app's scenarios read it; your requests say what they ask for")
    if given("stall_fraction") is not None:
        raise TrafficError("stall_fraction", "cannot be mixed into your requests; use --stall-clients (stalled "
                                             "clients beside your traffic)")
    for name in names:
        scenario = sc.SCENARIOS[name]
        if name == TRAFFIC:
            continue
        if scenario.files is not None or scenario.nginx_spread:
            raise TrafficError("scenario", f"{name} requests the data set's files, not your requests: leave "
                                           "--scenario out (your requests run as scenario traffic)")
        if scenario.stall is None:
            raise TrafficError("scenario", f"{name} is the demo app's own request, which your requests replace: use "
                                           "--scenario traffic (the default), or stall / stall-io to add stalled "
                                           "clients to your requests")
        if not subject.demo:
            raise TrafficError("scenario", f"{name}'s stalled clients call the demo app's /?io_ms= endpoint, which "
                                           f"{subject.app} does not have: add a slow request of your own to the mix "
                                           "with --request instead")


def preflight_app(spec: str, options: dict, timeout: float = PREFLIGHT_TIMEOUT) -> None:
    """The app imports (and answers one test GET) as the workers of ``spec`` will (raises
    LayoutError with the app's own line); ``timeout``: the subject's --import-timeout."""
    preflight(checked(parse_variant(spec, run_dir=VALIDATE_RUN_DIR, **options)), timeout=timeout)


def preflight_traffic(lab: Lab, spec: str, options: dict, subject: Subject,
                      timeout: float) -> tuple[Subject, list[str]]:
    """Start ``spec`` once and send each distinct request of the subject's mix through nginx
    (``check_traffic``): the subject to measure (without the failing requests, with
    --skip-failing) and lines to print."""
    with lab.stack(spec, name="preflight", **options) as stack:
        layout = stack.layout
        return check_traffic(subject, layout.listen_host, layout.listen_port, timeout, where=spec)


def check_traffic(subject: Subject, host: str, port: int, timeout: float, where: str) -> tuple[Subject, list[str]]:
    """Each distinct request of ``subject.mix`` once to nginx at host:port. A 4xx/5xx or no
    answer raises TrafficError naming every failing request (up to 20), unless --skip-failing:
    then they leave the mix (its source counts them, as results.json and the report show).
    Returns the subject to measure and lines to print."""
    mix = subject.mix
    statuses, failures = check_requests(host, port, mix, timeout)
    place = f" through nginx on {where}"
    lines = []
    if failures:
        # Without any answer from many, or from all, the stack (or the whole log) is the problem.
        hopeless = sum(not f.answered for f in failures) >= MAX_UNANSWERED or len(failures) == len(mix.requests)
        if not subject.skip_failing or hopeless:
            hint = ", or leave them out with --skip-failing" if subject.from_log and not hopeless else ""
            raise TrafficError("request", failures_line(failures, mix, place) + f": fix the requests (or the app) so "
                                          f"they succeed{hint}; nothing was measured")
        subject = replace(subject, mix=without(mix, failures))
        lines.append(f"--skip-failing: left out {failures_line(failures, mix, place)}")
        lines.append(f"traffic: {subject.mix.summary()}")
    answered = ", ".join(sorted({str(s) for s in statuses.values()}))
    lines.append(f"pre-flight: {len(statuses)} distinct requests answered {answered}{place}")
    return subject, lines


def check_mix_for_httperf(subject: Subject, refused: dict[str, bool]) -> None:
    """httperf (openloop, plan) opens one connection per request from a list of paths, one method
    for all, and takes headers on its command line (which other local users can read).
    ``refused``: the kind's own request options given beside the mix (e.g. {"path": True})."""
    given = next((name for name, on in refused.items() if on), None)
    if given:
        raise TrafficError(given, "your requests (--request, --requests, --access-log, or GET / of your --app) "
                                  "replace it: leave it out")
    other = sorted({r.method for r in subject.mix.requests if r.method not in SAFE_METHODS})
    if other:
        raise TrafficError("request", f"httperf (openloop, plan) sends GET requests only (it replays a list of "
                                      f"paths), the mix has {', '.join(other)}: leave them out (compare and tune "
                                      "send them)")
    secret = [n for n, _ in subject.mix.headers if n.lower() in SENSITIVE_HEADERS]
    if secret:
        raise TrafficError("header", f"{secret[0]}: httperf (openloop, plan) takes headers on its command line, "
                                     "which other local users can read: leave credentials out (compare and tune "
                                     "send them from a private file)")


@dataclass(frozen=True)
class HttperfTraffic:
    """The user's requests as httperf replays them on one started stack."""

    subject: Subject  # without the requests that failed the pre-flight (--skip-failing)
    wlog: Path  # httperf's --wlog list of paths, by weight
    headers: tuple
    # starts one connection of the mix, the warm-up before the first step (when called: plan times
    # the warm-up's requests apart from the pre-flight's in nginx's log)
    start_warm_up: Callable[[], WrkProcess]
    lines: tuple[str, ...]  # the pre-flight's, to print


def httperf_traffic(subject: Subject, layout: Layout, work_dir: Path, timeout: float, warmup_s: float,
                    where: str) -> HttperfTraffic:
    """Each distinct request once through the stack's nginx (``check_traffic``), then the mix as
    httperf's --wlog list under ``work_dir/traffic`` and the warm-up that sends it."""
    subject, lines = check_traffic(subject, layout.listen_host, layout.listen_port, timeout, where=where)
    mix = subject.mix
    wlog = httperf.write_mix_wlog(work_dir / "traffic" / "mix.wlog", mix)
    warm = functools.partial(WrkProcess, layout.url, 1, warmup_s, timeout_s=timeout, script_args=["1"],
                             script=write_mix_script(work_dir / "traffic" / "warmup.lua", mix))
    return HttperfTraffic(subject, wlog, tuple(mix.headers), warm, tuple(lines))
