"""``uwsgi-layouts openloop``: offer fixed request rates, step them up until replies fall behind; the knee.

wrk is closed-loop: each connection waits for its answer before asking again, so an
overloaded server just slows the clients down. httperf (as in the "finding nginx's async
limit" article) instead opens new connections at a fixed rate R whatever happens, one
request each, so a server that cannot keep up shows it: replies lag, time out or fail.

    uwsgi-layouts openloop --layout 2x4-mapped --rates 10,20,40 --step 15 [--path /?...]
    uwsgi-layouts openloop --app shop:app --request 'GET /api/items' ...   (your app: bench.subject)

Per step, httperf runs ``--rate R --num-conns R*step --num-calls 1`` and samples the reply
rate every 5 s. A step **passes** when replies >= 99% of requests, the lowest reply-rate
sample >= 95% of R (the first sample is left out when there are others: it holds the
ramp-up, see ``bench.analysis.steady_min``), and there is no server-side error (4xx/5xx,
client timeouts, refused or reset connections); a client-side error (fd-unavail, addrunavail, ftab-full, other) makes
the step **invalid**: the client, not the server, was the limit; so does httperf sending late
(``bench.load.sending.judge_late``: too little CPU) when the server answered all it was sent
without an error, unless it fell behind what it was sent beyond what httperf's largest burst held
back **and** its CPU over the step was at its limit (90%: the stack's of the host's cores less
httperf's own, or the app's alone of its quota): then it fails. The knee is the last rate
that passed before the first one that did not (stepping stops there unless ``--all``).

httperf busy-polls: it keeps one core at ~100% whatever the rate. On a small machine that
core is taken from the server, so httperf runs under ``nice 19`` by default (the server
wins when both want the CPU), in a cgroup of its own at the lowest CPU priority when the layout
has ``@cpus`` (``bench.load.generator``), and every step records httperf's own CPU share.

Your app and its traffic (``bench.subject``: --app, --request, --access-log..., as compare takes
them): the app is pre-flighted before the stack starts, each distinct request is sent once through
nginx before the first step (--skip-failing leaves a log's failing ones out), and httperf replays
the GET requests in proportion to their weights (``--wlog``, a list of paths; headers go on its
command line, so credential headers are refused here).

Writes ``results.json`` (kind ``openloop``: the steps, the environment, the arguments; saved
after every step; ``uwsgi-layouts report`` re-renders it), ``report.txt``, ``report.md``,
``reply-rate.png`` and httperf's raw output under ``raw/``. The stack comes from
``bench.stack.Lab``, the load from ``bench.load.httperf``, the verdicts from ``bench.analysis``.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from uwsgi_layouts.arguments import CommaList, Numbers
from uwsgi_layouts.bench import subject as subj
from uwsgi_layouts.bench.analysis import judge_step
from uwsgi_layouts.bench.environment import capture
from uwsgi_layouts.bench.kinds.base import RESULTS_NAME, Kind, publish, sigterm_interrupts
from uwsgi_layouts.bench.load import httperf
from uwsgi_layouts.bench.load.files import ROUTES, write_wlog
from uwsgi_layouts.bench.load.generator import describe, placed
from uwsgi_layouts.bench.load.traffic import redact_argv
from uwsgi_layouts.bench.load.wrk import WrkProcess, run_wrks
from uwsgi_layouts.bench.observe import tree_cpu_seconds
from uwsgi_layouts.bench.options import (
    DEFAULT_PATH,
    MIN_STEP_S,
    STEP_S,
    BadArgument,
    add_httperf_client,
    chosen_transport,
    command_line,
    default_data_dir,
    prepare_dataset,
    prepare_out,
    require_tools,
)
from uwsgi_layouts.bench.report.openloop import step_line
from uwsgi_layouts.bench.results import Results, Step, utc_now
from uwsgi_layouts.bench.stack import Lab, dir_name
from uwsgi_layouts.deploy.machine import usable_cpus
from uwsgi_layouts.deploy.model import TRANSPORTS, parse_variant, total_limits

DEFAULT_RATES = (5, 10, 15, 20, 25, 30, 40)
# The ranges of openloop's own options (each checked while parsing and shown in the help).
RATES = CommaList(Numbers(0.1, 100_000), "rate")
TIMEOUT_S = Numbers(1, 60)


def add_arguments(p) -> None:
    p.add_argument("--layout", help="one PxT-STRATEGY (variants as in compare, e.g. 2x4-mapped@nginx_workers=2)")
    p.add_argument("--rates", type=RATES,
                   help=f"comma-separated request rates per second, ascending, each {RATES.item} "
                        f"(default {','.join(map(str, DEFAULT_RATES))})")
    p.add_argument("--step", type=STEP_S, default=float(MIN_STEP_S),
                   help=f"seconds per rate ({STEP_S}; default and minimum {MIN_STEP_S})")
    p.add_argument("--files", choices=ROUTES, help="instead of --path: random data-set files by route (httperf "
                                                   "--wlog, shuffled)")
    p.add_argument("--data-dir", help="with --files: the data set (default build/dataset, created if missing)")
    p.add_argument("--timeout", type=TIMEOUT_S, default=5.0,
                   help=f"httperf's per-request timeout in seconds ({TIMEOUT_S}; default 5)")
    add_httperf_client(p)
    p.add_argument("--transport", choices=TRANSPORTS, help="uWSGI sockets: unix or tcp (default unix)")
    p.add_argument("--all", action="store_true", help="run every rate, not only up to the first that fails")
    subj.add_arguments(p)
    p.add_argument("--out", help="output directory (default results/<timestamp>-openloop)")


def resolve_args(args) -> "_Args":
    """Fill the defaults and check what needs several options (each is in its range, checked while
    parsing); raise BadArgument naming the field."""
    spec = (args.layout or "2x4-mapped").strip()
    parse_variant(spec, run_dir="/tmp/validate")  # LayoutError names the field
    rates = DEFAULT_RATES if args.rates is None else args.rates
    rates = [int(r) if float(r).is_integer() else float(r) for r in rates]
    if list(rates) != sorted(set(rates)):
        raise BadArgument(f"rates: must be ascending without repeats, got {','.join(map(str, rates))}")
    path = args.path or DEFAULT_PATH
    subject = subj.from_args(args)
    if subject.mix is not None:
        subj.check_mix_for_httperf(subject, {"path": bool(args.path), "files": bool(args.files)})
    elif not subject.demo and args.files:
        raise BadArgument("files: the data set's routes are the demo app's; your app gets --request lines")
    parse_variant(spec, run_dir="/tmp/validate", **subject.layout_options)
    return _Args(
        layout=spec, rates=list(rates), step=args.step,
        path=path, files=args.files or "", data_dir=str(Path(args.data_dir or default_data_dir()).absolute()),
        timeout=args.timeout, warmup=args.warmup, client_nice=args.client_nice,
        transport=chosen_transport(args.transport), all=bool(args.all), out=args.out,
        command=command_line("openloop", redact_argv(getattr(args, "argv", None) or []) or None),
        subject=subject)


@dataclasses.dataclass(frozen=True)
class _Args:
    layout: str = ""
    rates: list = dataclasses.field(default_factory=list)
    step: float = MIN_STEP_S
    path: str = DEFAULT_PATH
    files: str = ""
    data_dir: str = ""
    timeout: float = 5
    warmup: float = 2
    client_nice: int = 19
    transport: str = "unix"
    all: bool = False
    out: str | None = None
    command: str = ""
    subject: subj.Subject | None = None  # the app and its traffic (None: the demo app, --path)

    @property
    def options(self) -> dict:
        """The layout's options: the transport and the app's."""
        return {"transport": self.transport, **(self.subject.layout_options if self.subject else {})}

    def arguments(self) -> dict:
        """What results.json records as the run's arguments."""
        mix = self.subject is not None and self.subject.mix is not None
        return {"layout": self.layout, "rates": list(self.rates), "step_s": self.step,
                "path": "" if mix else self.path, "files": self.files,
                "data_dir": self.data_dir if self.files else "", "timeout_s": self.timeout,
                "client_nice": self.client_nice, "warmup_s": self.warmup, "all": self.all,
                "transport": self.transport, "command": self.command,
                **({"app": self.subject.record} if self.subject else {})}


def measure(a: _Args, lab: Lab, raw: Path, steps: list[Step], on_step=print, traffic: dict | None = None) -> None:
    """Start the layout's stack once, warm it up, run every step; each finished step is
    appended to ``steps`` and handed to ``on_step``. Stops after the first step that does not
    pass, unless ``a.all``. With the user's requests, each is sent once first (the pre-flight);
    ``traffic["mix"]`` is then the mix measured (without failing ones, with --skip-failing)."""
    options = a.options
    wlog, headers, mix = None, (), a.subject.mix if a.subject else None
    if a.files:
        index = prepare_dataset(Path(a.data_dir))
        options.update({"data_dir": str(index.root), "sendfile": "on"})
        wlog = write_wlog(index, a.files, lab.work_dir / "wlog", seed=0)
    raw.mkdir(parents=True, exist_ok=True)
    with lab.stack(a.layout, name=dir_name(a.layout), **options) as stack:
        layout = stack.layout
        if mix is not None:
            replay = subj.httperf_traffic(a.subject, layout, lab.work_dir, a.timeout, a.warmup, where=a.layout)
            print("\n".join(replay.lines), flush=True)
            if traffic is not None:
                traffic["mix"] = replay.subject.mix
            wlog, headers, warm = replay.wlog, replay.headers, replay.start_warm_up()
        else:
            warm_url = f"http://{layout.listen}{a.path}" if not a.files else layout.url + "healthz"
            warm = WrkProcess(warm_url, 1, a.warmup, timeout_s=a.timeout)
        run_wrks(warm)
        for rate in a.rates:
            cmd = httperf.command(layout.listen_port, a.path, rate, a.step, a.timeout, nice=a.client_nice, wlog=wlog,
                                  headers=headers)
            # every app member's (replicas), and nginx's apart: the quota covers the app only
            app0, nginx0 = sum(tree_cpu_seconds(p) for p in stack.app_pids), tree_cpu_seconds(stack.pids["nginx"])
            with placed(layout) as place:
                text = httperf.run(cmd, a.step * 2 + a.timeout + 30, place.join_files)
            app1, nginx1 = sum(tree_cpu_seconds(p) for p in stack.app_pids), tree_cpu_seconds(stack.pids["nginx"])
            stack.check_alive()
            name = f"step-{rate:g}.txt"
            (raw / name).write_text(text)
            parsed = httperf.parse(text)
            seconds = parsed["test_duration_s"]
            app_cores = (app1 - app0) / seconds if seconds else 0.0
            cores = app_cores + ((nginx1 - nginx0) / seconds if seconds else 0.0)
            # the stack's CPU against what it could have had says whether it was the limit when
            # httperf sent late (bench.load.sending.judge_late)
            verdict, reasons = judge_step(rate, parsed, cores, usable_cpus(), total_limits(layout)[0], app_cores)
            step = Step(rate=rate, num_conns=max(1, round(rate * a.step)), **parsed,
                        server_cpu_cores=cores,
                        verdict=verdict, reasons=tuple(reasons), raw_output=f"raw/{name}")
            steps.append(step)
            on_step(step)
            if verdict != "pass" and not a.all:
                break


def run(args) -> int:
    a = resolve_args(args)
    require_tools("httperf", "wrk")
    for note in a.subject.notes:
        print(note, flush=True)
    subj.preflight_app(a.layout, a.options, a.subject.import_timeout)  # before any stack starts
    out = prepare_out(a.out, suffix="-openloop")
    est = len(a.rates) * (a.step + 2) + a.warmup + 5
    print(f"open loop: {a.layout} ({a.subject.app}), rates {','.join(f'{r:g}' for r in a.rates)} req/s, {a.step:g} "
          f"s each; at most about {est / 60:.1f} min; results in {out}", flush=True)
    environment = capture() | {"httperf": httperf.version(),
                               "load_generator": describe(parse_variant(a.layout, run_dir="/tmp/validate"),
                                                          a.client_nice)}
    created = utc_now()
    steps: list[Step] = []
    results_path = out / RESULTS_NAME
    traffic = {"mix": a.subject.mix}

    def snapshot(complete: bool) -> Results:
        workload = {"path": a.path, "files": a.files} if traffic["mix"] is None else \
            {"path": "", "files": "", "traffic": {"description": "your requests, GET by weight (httperf --wlog)",
                                                  "traffic": traffic["mix"].to_dict()}}
        return Results(kind="openloop", created=created, environment=environment,
                       arguments=a.arguments() | {"complete": complete}, workload=workload, steps=tuple(steps))

    def on_step(step: Step) -> None:
        print(step_line(step), flush=True)
        snapshot(complete=False).save(results_path)  # an interruption keeps every finished step

    with Lab() as lab, sigterm_interrupts():
        try:
            measure(a, lab, out / "raw", steps, on_step=on_step, traffic=traffic)
        except KeyboardInterrupt:
            snapshot(complete=False).save(results_path)
            print(f"\ninterrupted: the steps measured so far are in {results_path}", file=sys.stderr)
            return 130
    results = snapshot(complete=True)
    results.save(results_path)
    publish(results, out, saved=results_path)
    return 0


KIND = Kind("openloop", "fixed request rates with httperf, stepped up until replies fall behind", add_arguments, run)
