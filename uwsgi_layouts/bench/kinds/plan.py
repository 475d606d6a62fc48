"""``uwsgi-layouts plan``: how many replicas of a pod carry a target rate within a p99.

    uwsgi-layouts plan --layout 2x2-mapped@cpus=1 --rate 100 --p99-ms 250 [--headroom 0.8] [--check]
    uwsgi-layouts plan --app shop:app --requests traffic.txt ...   (your app: bench.subject)

One replica of the layout (its ``@cpus`` quota and ``@memory`` limit in a cgroup of its own) is
warmed up with one connection for ``--warmup`` seconds, timed as the steps are; when every request
of it was slower than ``--p99-ms``, no rate can meet the target and the plan says so at once
(``bench.warm_up``: the exact rule and why). Else it is offered fixed rates in open loop (httperf:
new connections at a fixed rate, one request each): a ladder from half the rate one connection
reached in the warm-up, x1.5 a rung, until a rate misses the target, then bisections between the
last that met it and the first that did not until they are within ``--resolution``
(``bench.capacity.search_capacity``). Each step lasts long enough for
``--min-requests`` requests per replica; it passes by ``bench.capacity.judge_rate`` (replies kept
up over every steady 5-s sample together, no server-side error) and meets the target when the p99
of that step's requests is within ``--p99-ms``. A step in which httperf sent late (too little CPU:
``bench.load.sending``) says nothing of the replica: the rate is offered again, at most
``LATE_RETRIES`` more times (``until_judged``), and a step still late is invalid, unless the
replica fell behind what it was sent and its own figures show it at its limit (busy threads or
CPU quota used: ``bench.load.sending.judge_late``), when it fails. The arithmetic
is ``bench.capacity``'s: replicas = ceil(rate / (one replica's rate x headroom)) + spare, the
autoscaler targets (CPU used / limit and busy threads / threads at the design rate) and the memory
(PSS of one replica after load).

Your app and its requests: the options of ``compare`` and ``openloop`` (``bench.subject``: --app,
--request, --requests, --access-log...), pre-flighted as openloop does; httperf replays the GET
requests by weight.

Why p99 comes from nginx's access log: httperf prints only the min, mean, max, median and
standard deviation of its connection times, no percentile and no per-request time; nginx logs
``$request_time`` for every request (to the millisecond), from its first byte read to the last
byte sent, which holds every wait at the app server (its sockets' queues, the quota's
throttling). It leaves out the client's connect to nginx, which is the same for every pod size.
The stack runs with ``access_log`` on; nginx stays outside the replica's cgroup, so the log costs
the quota nothing.

``--validate``: 1, 2 and 3 replicas together (those that fit), each count's capacity searched
exactly as one replica's was (the same rule, the same resolution, steps of the same length per
replica's rate), so their rate per replica compares like with like with the plan's.

``--check`` (the plan checks itself): where the planned serving replicas fit this machine (the sum
of their quotas within its CPUs; else the largest count that fits, at the rate the plan gives that
many), they run together at that rate behind one nginx (``@replicas``), then one fewer, and on
down while the p99 is still met (the plan was oversized by that much). Predicted against measured
per count is in the report.

Writes ``plan.json`` (the arguments, the machine's load, the warm-up, every step, the plan or why
there is none, the check, and what it judged of the steps and the validation: ``judgement``),
``report.txt``, ``report.md`` and httperf's raw output under ``raw/``. A replica that cannot meet
the p99 is bad input for a plan: one line, exit 2, either right after the warm-up (which proved
it: no step run) or after the ladder (no rate tried met it); plan.json still records the warm-up
and the steps run.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Callable, NoReturn

from uwsgi_layouts.arguments import Ints, Numbers
from uwsgi_layouts.bench import subject as subj
from uwsgi_layouts.bench.capacity import (
    DEFAULT_HEADROOM,
    DEFAULT_RESOLUTION,
    DEFAULT_SPARE,
    LADDER_FACTOR,
    MAX_BISECTIONS,
    MIN_REQUESTS,
    Plan,
    PlanError,
    RateStep,
    best_rate,
    check_verdict,
    judge_rate,
    make_plan,
    p99_ms,
    resolved,
    search_capacity,
    step_seconds,
)
from uwsgi_layouts.bench.environment import capture
from uwsgi_layouts.bench.kinds.base import Kind, sigterm_interrupts
from uwsgi_layouts.bench.load import httperf
from uwsgi_layouts.bench.load.generator import describe, placed
from uwsgi_layouts.bench.load.sending import starved
from uwsgi_layouts.bench.load.traffic import redact_argv
from uwsgi_layouts.bench.load.wrk import WrkProcess, run_wrks
from uwsgi_layouts.bench.observe import Sampler, limit_record, log_size, logged_requests, stack_memory
from uwsgi_layouts.bench.options import (
    DEFAULT_PATH,
    MIN_STEP_S,
    STEP_S,
    TIMEOUT_S,
    BadArgument,
    add_httperf_client,
    command_line,
    prepare_out,
    require_tools,
)
from uwsgi_layouts.bench.readings import judge_plan
from uwsgi_layouts.bench.report.plan import PLAN_JSON, warm_up_lines, write_plan_reports
from uwsgi_layouts.bench.stack import Lab, dir_name
from uwsgi_layouts.bench.warm_up import ANSWERED_BELOW, RuledOut, WarmUp, ruled_out
from uwsgi_layouts.deploy.machine import cpu_limit
from uwsgi_layouts.deploy.model import parse_variant, total_limits
from uwsgi_layouts.deploy.run import Stack

MAX_RATE = 100_000
FORMAT_VERSION = 2  # 2: steps sized by --min-requests, judged by capacity.judge_rate; the subject
MIN_TIMEOUT_S = 5
SAMPLE_INTERVAL_S = 0.1  # the stats server, for the busy-thread ratio
DRAIN_TIMEOUT_S = 60.0  # at most this long waiting for the stack to be idle before a step
DRAIN_POLL_S = 0.2
VALIDATE_COUNTS = 3  # --validate searches 1..3 replicas' own capacity (those that fit)
# A step httperf sent late (bench.load.sending) says nothing of replicas not at their limit, and a
# busy machine's load comes and goes: the rate is offered again, this many times at most, before
# the step counts.
LATE_RETRIES = 2


# The ranges of plan's own options (each checked while parsing and shown in the help).
RATE = Numbers(0, MAX_RATE, open_low=True)
P99_MS = Numbers(0, 100_000, open_low=True)
HEADROOM = Numbers(0.05, 1)
SPARE = Ints(0, 10)
RESOLUTION = Numbers(0.01, 0.5)
BISECTIONS = Ints(0, 12)
STEP_REQUESTS = Ints(20, 100_000)


def add_arguments(p) -> None:
    p.add_argument("--layout", help="the pod: one PxT-STRATEGY with its size, e.g. 2x2-mapped@cpus=1,memory=512 "
                                    "(no @replicas: the plan says how many)")
    p.add_argument("--rate", type=RATE, help=f"the target rate the replicas must carry together, req/s ({RATE})")
    p.add_argument("--p99-ms", type=P99_MS, help=f"the p99 each request must stay within, ms ({P99_MS})")
    p.add_argument("--headroom", type=HEADROOM, default=DEFAULT_HEADROOM,
                   help=f"share of one replica's measured rate the plan loads it with ({HEADROOM}; default "
                        f"{DEFAULT_HEADROOM})")
    p.add_argument("--spare", type=SPARE, default=DEFAULT_SPARE,
                   help=f"replicas added for lost pods ({SPARE}; default {DEFAULT_SPARE})")
    p.add_argument("--start", type=RATE, help=f"the first rate offered, req/s ({RATE}; default: half what one "
                                              "connection reached in the warm-up)")
    p.add_argument("--resolution", type=RESOLUTION, default=DEFAULT_RESOLUTION,
                   help="bisect until the lowest rate missed is within this share above the highest met "
                        f"({RESOLUTION}; default {DEFAULT_RESOLUTION})")
    p.add_argument("--bisections", type=BISECTIONS, default=MAX_BISECTIONS,
                   help="at most this many rates between the last that met the target and the first that did not "
                        f"({BISECTIONS}; default {MAX_BISECTIONS})")
    p.add_argument("--min-requests", type=STEP_REQUESTS, default=MIN_REQUESTS,
                   help="requests per replica in every step: a step lasts max(--step, this / rate per replica) s "
                        f"({STEP_REQUESTS}; default {MIN_REQUESTS})")
    p.add_argument("--step", type=STEP_S, default=float(MIN_STEP_S),
                   help=f"shortest step, seconds ({STEP_S}; default and minimum {MIN_STEP_S})")
    p.add_argument("--timeout", type=TIMEOUT_S,
                   help=f"httperf's per-request timeout in seconds, above the p99 target ({TIMEOUT_S}; default "
                        f"max({MIN_TIMEOUT_S}, 2 x the p99 target))")
    add_httperf_client(p)
    p.add_argument("--check", action="store_true", help="run the planned replicas at the target rate (and one "
                                                        "fewer) where they fit this machine, and report predicted "
                                                        "against measured")
    p.add_argument("--validate", action="store_true", help=f"also search the capacity of 1..{VALIDATE_COUNTS} "
                                                           "replicas together (those that fit this machine), as "
                                                           "one replica's was, and compare their rate per replica "
                                                           "with the plan's")
    subj.add_arguments(p)
    p.add_argument("--out", help="output directory (default results/<timestamp>-plan)")


def required(field: str, value, what: str):
    """A required option's value, as parsed (BadArgument naming the field when it is missing)."""
    if value is None:
        raise BadArgument(f"{field}: give {what}")
    return value


@dataclasses.dataclass(frozen=True)
class PlanArgs:
    layout: str
    rate: float
    p99_ms: float
    headroom: float = DEFAULT_HEADROOM
    spare: int = DEFAULT_SPARE
    start: float | None = None
    resolution: float = DEFAULT_RESOLUTION
    bisections: int = MAX_BISECTIONS
    min_requests: int = MIN_REQUESTS
    step: float = MIN_STEP_S
    path: str = DEFAULT_PATH
    timeout: float = MIN_TIMEOUT_S
    warmup: float = 2
    client_nice: int = 19
    check: bool = False
    validate: bool = False
    out: str | None = None
    command: str = ""
    subject: subj.Subject | None = None  # the app and its requests (None: the demo app, --path)

    @property
    def mix(self):
        return self.subject.mix if self.subject is not None else None

    @property
    def stack_options(self) -> dict:
        """Every stack's options: nginx's access log (the p99) and the app's."""
        return {"access_log": "on", **(self.subject.layout_options if self.subject else {})}

    def arguments(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in ("out", "subject")}
        if self.subject is not None:
            out["app"] = self.subject.record
            if self.mix is not None:
                out |= {"path": "", "traffic": self.mix.to_dict()}
        return out


def default_timeout(p99_target_ms: float) -> float:
    """httperf gives up on a request after this: well above the p99 target, so that a slow request
    is timed (and counted in the p99) rather than cut."""
    return max(MIN_TIMEOUT_S, math.ceil(2 * p99_target_ms / 1000))


def resolve_args(args) -> PlanArgs:
    """Fill the defaults and check what needs several options (each is in its range, checked while
    parsing); raise BadArgument (or LayoutError, TrafficError) naming the field."""
    rate = required("rate", args.rate, "the target rate in req/s, e.g. --rate 100")
    p99 = required("p99_ms", args.p99_ms, "the p99 target in ms, e.g. --p99-ms 250")
    if not args.layout or not str(args.layout).strip():
        raise BadArgument("layout: give the pod to plan for, e.g. --layout 2x2-mapped@cpus=1")
    spec = str(args.layout).strip()
    layout = parse_variant(spec, run_dir="/tmp/validate")  # LayoutError names the field
    if layout.replicas != 1:
        raise BadArgument(f"layout: plan measures one replica and says how many: leave @replicas out of {spec!r}")
    if layout.server != "uwsgi":
        raise BadArgument(f"layout: plan reads uWSGI's stats server (busy threads): {spec} runs {layout.server}")
    path = args.path or DEFAULT_PATH
    subject = subj.from_args(args)
    if subject.mix is not None:
        subj.check_mix_for_httperf(subject, {"path": bool(args.path)})
    parse_variant(spec, run_dir="/tmp/validate", **subject.layout_options)
    timeout = default_timeout(p99) if args.timeout is None else args.timeout
    if timeout * 1000 <= p99:
        raise BadArgument(f"timeout: must be above the p99 target ({p99:g} ms), so that slow requests are timed, "
                          f"not cut; got {timeout:g} s")
    return PlanArgs(
        layout=spec, rate=rate, p99_ms=p99, headroom=args.headroom, spare=args.spare, start=args.start,
        resolution=args.resolution, bisections=args.bisections, min_requests=args.min_requests, step=args.step,
        path=path, timeout=timeout, warmup=args.warmup, client_nice=args.client_nice, check=bool(args.check),
        validate=bool(args.validate), out=args.out,
        command=command_line("plan", redact_argv(getattr(args, "argv", None) or []) or None), subject=subject)


# --------------------------------------------------------------------------- one step


def request_times(path: Path, offset: int) -> list[float]:
    """$request_time of every request nginx logged after ``offset`` bytes (the healthz polls of
    the stack's start come before, the warm-up too): a step's, errors included (they fail it)."""
    return [timed.request_s for timed in logged_requests(path, offset)]


def answered_times(path: Path, offset: int) -> list[float]:
    """$request_time of the requests nginx answered below 400 after ``offset`` bytes: the warm-up's
    (``bench.warm_up`` says why only those)."""
    return [timed.request_s for timed in logged_requests(path, offset) if timed.status < ANSWERED_BELOW]


def access_log(stack: Stack) -> Path:
    return Path(stack.layout.run_dir) / "logs" / "access.log"


def busy_ratio(sampler: Sampler) -> float | None:
    """Mean share of the workers' threads inside a request over the samples taken."""
    shares = [sum(s.inflight.values()) / (len(s.inflight) * s.cores) for s in sampler.samples if s.inflight and s.cores]
    return round(sum(shares) / len(shares), 4) if shares else None


@dataclasses.dataclass(frozen=True)
class Offered:
    """What one httperf step at a rate showed: the step (verdict, p99, CPU, busy threads), the
    cgroups' limit record over it, and httperf's summary."""

    step: RateStep
    limit: dict
    httperf: dict


def in_flight(stack: Stack) -> int | None:
    """Requests inside every replica's workers now (uWSGI's stats servers); None if unreadable."""
    try:
        return sum(1 for stats in stack.host_stats().values() for w in stats["workers"]
                   for core in w.get("cores") or [] if core.get("in_request"))
    except (OSError, ValueError, KeyError):
        return None


def drain(stack: Stack, timeout_s: float) -> bool:
    """Wait until no request is in flight in two polls in a row: after an overloaded step uWSGI
    still works through the requests whose clients gave up, which would load the next step."""
    deadline = time.monotonic() + timeout_s
    idle = 0
    while time.monotonic() < deadline:
        idle = idle + 1 if in_flight(stack) == 0 else 0
        if idle >= 2:
            return True
        time.sleep(DRAIN_POLL_S)  # polling interval, not a guess at when it is idle
    return False


@dataclasses.dataclass(frozen=True)
class Load:
    """What httperf sends to one started stack: a path, or the user's requests as a --wlog list
    with their headers; and what starts the one-connection warm-up before the first step (started
    when called, so that its requests are told apart in nginx's log from the pre-flight's)."""

    path: str
    wlog: Path | None
    headers: tuple
    start_warm_up: Callable[[], WrkProcess]


def prepare_load(stack: Stack, a: PlanArgs, work_dir: Path) -> Load:
    """The demo app's path, or the user's requests checked once through this stack's nginx."""
    layout = stack.layout
    if a.mix is None:
        return Load(a.path, None, (), functools.partial(WrkProcess, f"http://{layout.listen}{a.path}", 1, a.warmup,
                                                        timeout_s=a.timeout))
    replay = subj.httperf_traffic(a.subject, layout, work_dir, a.timeout, a.warmup, where=a.layout)
    print("\n".join(replay.lines), flush=True)
    return Load(a.path, replay.wlog, replay.headers, replay.start_warm_up)


def offer(stack: Stack, a: PlanArgs, load: Load, rate: float, raw: Path, name: str, sample: bool) -> Offered:
    """One open-loop step at ``rate`` against ``stack``'s replicas once they are idle, long enough
    for ``a.min_requests`` requests per replica (``step_seconds``); httperf's output saved as
    raw/``name``; judged by ``judge_rate`` on the requests nginx logged during the step only."""
    layout = stack.layout
    drained = drain(stack, DRAIN_TIMEOUT_S)
    seconds = step_seconds(rate / layout.replicas, a.min_requests, a.step)
    log = access_log(stack)
    offset = log_size(log)
    before, t0 = stack.cgroup_reading(), time.monotonic()
    cmd = httperf.command(layout.listen_port, load.path, rate, seconds, a.timeout, nice=a.client_nice,
                          wlog=load.wlog, headers=load.headers)
    with placed(layout) as place, \
            Sampler(layout.stats_address if sample else None, interval=SAMPLE_INTERVAL_S) as sampler:
        text = httperf.run(cmd, seconds * 2 + a.timeout + 30, place.join_files)
    after, t1 = stack.cgroup_reading(), time.monotonic()
    stack.check_alive()
    raw.mkdir(parents=True, exist_ok=True)
    (raw / name).write_text(text)
    parsed = httperf.parse(text)
    times = request_times(log, offset)
    limit = limit_record(*total_limits(layout), before, after, t1 - t0)
    busy = busy_ratio(sampler) if sample else None
    # the replicas' own figures say whether they were at their limit when httperf sent late
    judged = judge_rate(rate, parsed, len(times), busy_ratio=busy, cpu_share=limit.get("quota_share"))
    reasons = judged.reasons
    if not drained:
        reasons = (*reasons, f"started before the previous step's requests drained ({DRAIN_TIMEOUT_S:g} s)")
    step = RateStep(rate=rate, verdict=judged.verdict, p99_ms=p99_ms(times), cpu_share=limit.get("quota_share"),
                    busy_ratio=busy, reasons=reasons,
                    requests_logged=len(times), errors=judged.errors, kept_up=judged.kept_up, step_s=seconds,
                    throttled_share=limit.get("throttled_share"), client_cpu_pct=parsed.get("client_cpu_pct"))
    return Offered(step, limit, parsed)


def late(step: RateStep) -> bool:
    """Whether ``step`` was not judged because httperf sent late (bench.load.sending)."""
    return step.verdict == "invalid" and starved(step.reasons)


def until_judged(attempt: Callable[[str], Offered], name: str,
                 on_line: Callable[[str], None] = functools.partial(print, flush=True)) -> Offered:
    """``attempt(raw file name)`` again while httperf sent late, at most LATE_RETRIES more times:
    the last try, with how many before it were late. Each try's output is kept: ``name``, then
    ``name`` with -late1, -late2 before its suffix."""
    stem, dot, suffix = name.rpartition(".")
    offered, tries = attempt(name), 0
    while tries < LATE_RETRIES and late(offered.step):
        on_line(f"  {offered.step.rate:g} req/s: not judged, offered again ({offered.step.reasons[0]})")
        tries += 1
        offered = attempt(f"{stem}-late{tries}{dot}{suffix}")
    return dataclasses.replace(offered, step=dataclasses.replace(offered.step, late_tries=tries))


def warm_up(stack: Stack, load: Load) -> WarmUp:
    """One connection for the warm-up's seconds: the rate it reached, its requests timed from
    nginx's log as a step's are, and the replica's throttling over it (``bench.warm_up``)."""
    log = access_log(stack)
    offset = log_size(log)
    before, t0 = stack.cgroup_reading(), time.monotonic()
    (run,), _ = run_wrks(load.start_warm_up())
    after, t1 = stack.cgroup_reading(), time.monotonic()
    throttled = after.since(before).throttled_s if before is not None and after is not None else 0.0
    return WarmUp.of(round(t1 - t0, 2), run.rps, answered_times(log, offset), throttled)


# --------------------------------------------------------------------------- the search and the check


@dataclasses.dataclass(frozen=True)
class Searched:
    """One search's warm-up, its steps in the order run, and the replicas' PSS after them (MB)."""

    warm_up: WarmUp
    steps: tuple[RateStep, ...]
    pss_mb: float | None


def search(a: PlanArgs, lab: Lab, raw: Path, on_step=print, replicas: int = 1, start: float | None = None,
           validating: bool = False) -> Searched:
    """``replicas`` replicas (one for the plan) searched for their capacity (``search_capacity``:
    up the ladder, then bisected to ``a.resolution``). The busy-thread ratio is sampled with one
    replica only (one stats server). ``validating``: a count of the validation, whose raw files are
    named apart from the plan's own steps. The plan's own search raises ``RuledOut`` (its stack
    stopped) when the warm-up proves no rate can meet the target (``bench.warm_up.ruled_out``)."""
    name, prefix = ((f"capacity-{replicas}", f"capacity-{replicas}x") if validating else
                    (dir_name(a.layout), "step"))
    with lab.stack(a.layout, name=name, replicas=str(replicas), **a.stack_options) as stack:
        load = prepare_load(stack, a, lab.work_dir)
        warm = warm_up(stack, load)
        print("\n".join(f"  {line}" for line in warm_up_lines(warm)), flush=True)
        threads = stack.layout.processes * stack.layout.threads
        refusal = None if validating else ruled_out(a.layout, warm, a.p99_ms, threads)
        if refusal is not None:
            raise refusal
        first = start or a.start or max(0.5, round(warm.rate / 2, 2))

        def one(rate: float) -> RateStep:
            step = until_judged(lambda name: offer(stack, a, load, rate, raw, name, sample=replicas == 1),
                                f"{prefix}-{rate:g}.txt").step
            on_step(step)
            return step

        steps = search_capacity(one, first, a.p99_ms, LADDER_FACTOR, a.resolution, a.bisections)
        pss = stack_memory(stack).get("app_pss_mb")
    return Searched(warm, tuple(steps), pss)


def validation_row(count: int, steps: tuple[RateStep, ...], plan: Plan, target_p99_ms: float) -> dict:
    """One replica count's capacity (searched) per replica, against the plan's."""
    carried = best_rate(steps, target_p99_ms)
    per_replica = round(carried / count, 3) if carried is not None else None
    return {"replicas": count, "rate": carried, "per_replica_rate": per_replica,
            "plan_per_replica_rate": plan.per_replica_rate, "resolution": resolved(steps, target_p99_ms),
            "difference": round(plan.per_replica_rate / per_replica - 1, 4) if per_replica else None,
            "steps": [s.to_dict() for s in steps]}


def validate(a: PlanArgs, plan: Plan, lab: Lab, raw: Path, host_cpus: int, on_step=print) -> list[dict]:
    """Each replica count from 1 to VALIDATE_COUNTS that fits this machine, searched for its own
    capacity exactly as one replica was (the same rule and resolution; steps as long per replica's
    rate), from 0.8 x count x one replica's rate: its rate per replica against the plan's."""
    fits = math.floor(host_cpus / plan.cpus + 1e-9) if plan.cpus else VALIDATE_COUNTS
    out = []
    for count in range(1, min(VALIDATE_COUNTS, fits) + 1):
        print(f"validate: {count} replica(s) together, their own capacity", flush=True)
        searched = search(a, lab, raw, on_step, replicas=count,
                          start=round(0.8 * count * plan.per_replica_rate, 2), validating=True)
        out.append(validation_row(count, searched.steps, plan, a.p99_ms))
    return out


def check_counts(plan: Plan, host_cpus: int) -> tuple[int, float, str]:
    """(the replica count to check, the rate to offer it, a note when the plan does not fit)."""
    serving = plan.serving
    fits = math.floor(host_cpus / plan.cpus + 1e-9) if plan.cpus else serving
    if serving <= fits:
        return serving, plan.target_rate, ""
    if fits < 1:
        return 0, 0.0, f"one replica of {plan.cpus:g} CPUs does not fit {host_cpus} CPUs"
    rate = round(fits * plan.design_rate, 2)
    return fits, rate, (f"{serving} serving replicas x {plan.cpus:g} CPUs do not fit this machine's {host_cpus} "
                        f"CPUs: checked the largest count that fits, {fits}, at the rate the plan gives it, "
                        f"{rate:g} req/s")


def run_count(a: PlanArgs, lab: Lab, raw: Path, count: int, rate: float, per_replica_rate: float) -> dict:
    """``count`` replicas together at ``rate``: one step (as long as the search's at that rate per
    replica), with the p99, the summed PSS and throttling."""
    with lab.stack(a.layout, name=f"check-{count}", replicas=str(count), **a.stack_options) as stack:
        load = prepare_load(stack, a, lab.work_dir)
        warm_up(stack, load)
        offered = until_judged(lambda name: offer(stack, a, load, rate, raw, name, sample=False),
                               f"check-{count}x-{rate:g}.txt")
        pss = stack_memory(stack).get("app_pss_mb")
    s = offered.step
    return {"replicas": count, "rate": rate, "per_replica_rate": round(rate / count, 3),
            "predicted": rate / count <= per_replica_rate, "verdict": s.verdict, "p99_ms": s.p99_ms,
            "meets": s.meets(a.p99_ms), "reasons": list(s.reasons), "pss_mb": pss, "errors": s.errors,
            "step_s": s.step_s, "throttled_share": offered.limit.get("throttled_share"),
            "cpu_share": offered.limit.get("quota_share"), "client_cpu_pct": s.client_cpu_pct}


def check(a: PlanArgs, plan: Plan, lab: Lab, raw: Path, on_line=print) -> dict:
    count, rate, note = check_counts(plan, cpu_limit().host)
    if count == 0:
        return {"rate": 0, "note": note, "runs": [], "verdict": f"not checked: {note}"}
    runs = [run_count(a, lab, raw, count, rate, plan.per_replica_rate)]
    on_line(f"check: {count} replica(s) at {rate:g} req/s: p99 {runs[-1]['p99_ms']} ms, {runs[-1]['verdict']}")
    while runs[-1]["meets"] and runs[-1]["replicas"] > 1:
        runs.append(run_count(a, lab, raw, runs[-1]["replicas"] - 1, rate, plan.per_replica_rate))
        on_line(f"check: {runs[-1]['replicas']} replica(s) at {rate:g} req/s: p99 {runs[-1]['p99_ms']} ms, "
                f"{runs[-1]['verdict']}")
    return {"rate": rate, "note": note, "runs": runs, "verdict": check_verdict(count, runs, a.p99_ms)}


# --------------------------------------------------------------------------- the command


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def write_reports(out: Path, data: dict) -> list[str]:
    """plan.json (first: the reports are rendered from what it holds), with what the plan judged of
    its steps and validation (``judgement``, ``bench.readings.judge_plan``), report.txt and report.md."""
    data["judgement"] = judge_plan(data).to_dict()
    (out / PLAN_JSON).write_text(json.dumps(data, indent=2) + "\n")
    return write_plan_reports(out, data)


def run(args) -> int:
    a = resolve_args(args)
    require_tools("httperf", "wrk")
    for note in a.subject.notes:
        print(note, flush=True)
    subj.preflight_app(a.layout, a.subject.layout_options, a.subject.import_timeout)  # before any stack starts
    out = prepare_out(a.out, suffix="-plan")
    print(f"plan: one replica of {a.layout} ({a.subject.app}), rates x{LADDER_FACTOR:g} up the ladder, then "
          f"bisected to within {a.resolution:.0%} (at most {a.bisections}); each step at least {a.step:g} s and "
          f"{a.min_requests} requests per replica; target {a.rate:g} req/s within p99 {a.p99_ms:g} ms; results in "
          f"{out}", flush=True)
    data: dict = {"format_version": FORMAT_VERSION, "kind": "plan", "arguments": a.arguments(),
                  "environment": capture() | {"httperf": httperf.version()}, "load_before": load_average()}
    layout = parse_variant(a.layout, run_dir="/tmp/validate")
    cpus = layout.cpus
    data["load_generator"] = describe(layout, a.client_nice)

    def on_step(step: RateStep) -> None:
        print(f"  {step.rate:g} req/s for {step.step_s:g} s: {step.verdict}, p99 {step.p99_ms} ms over "
              f"{step.requests_logged} requests, kept up {step.kept_up}, CPU/limit {step.cpu_share}, throttled "
              f"{step.throttled_share}, busy threads {step.busy_ratio}, httperf CPU {step.client_cpu_pct}%"
              + (f" ({'; '.join(step.reasons)})" if step.reasons else ""), flush=True)

    try:
        return _measure_and_plan(a, out, data, cpus, on_step)
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the lab has stopped every stack on the way out
        print(f"\ninterrupted: no plan; httperf's output so far is in {out / 'raw'}", file=sys.stderr)
        return 130


def refuse(out: Path, data: dict, exc: PlanError, steps: tuple[RateStep, ...]) -> NoReturn:
    """A run that makes no plan: plan.json (no plan, the steps run, the line) and its reports are
    written, then the line is raised as bad input (exit 2)."""
    data |= {"steps": [s.to_dict() for s in steps], "plan": None, "error": str(exc), "load_after": load_average()}
    write_reports(out, data)
    raise BadArgument(str(exc)) from None


def _measure_and_plan(a: PlanArgs, out: Path, data: dict, cpus: float | None, on_step) -> int:
    with Lab() as lab, sigterm_interrupts():
        try:
            searched = search(a, lab, out / "raw", on_step)
        except RuledOut as exc:  # the warm-up proved it: no step was run, the stack is stopped
            data["warm_up"] = exc.warm_up.to_dict()
            refuse(out, data, exc, ())
        data["warm_up"] = searched.warm_up.to_dict()
        steps = list(searched.steps)
        try:
            plan = make_plan(a.layout, cpus, steps, a.rate, a.p99_ms, a.headroom, a.spare, searched.pss_mb)
        except PlanError as exc:
            refuse(out, data, exc, searched.steps)
        data |= {"plan": plan.to_dict(), "steps": [s.to_dict() for s in steps]}
        if a.check:
            data["check"] = check(a, plan, lab, out / "raw")
        if a.validate:
            data["validation"] = validate(a, plan, lab, out / "raw", cpu_limit().host, on_step)
    data["load_after"] = load_average()
    print("\n".join(write_reports(out, data)))
    print(f"\nwrote {PLAN_JSON}, report.txt, report.md in {out}")
    return 0


KIND = Kind("plan", "how many replicas of a pod carry a target rate within a p99: one replica measured in open "
                    "loop, the plan, its autoscaler settings and memory, and (--check) the plan run", add_arguments,
            run)
