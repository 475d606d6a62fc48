"""``uwsgi-layouts plan``: how many replicas of a pod carry a target rate within a p99.

    uwsgi-layouts plan --layout 2x2-mapped@cpus=1 --rate 100 --p99-ms 250 [--headroom 0.8] [--check]

One replica of the layout (its ``@cpus`` quota and ``@memory`` limit in a cgroup of its own) is
offered fixed rates in open loop, as ``openloop`` does (httperf: new connections at a fixed rate,
one request each; ``bench.analysis.judge_step`` passes a step whose replies kept up without
server-side errors): a ladder from half the rate one connection reached in the warm-up, x1.5 a
rung, until a rate misses the target, then ``--bisections`` rates between the last that met it and
the first that did not. A rate meets the target when its step passes and the p99 of its requests
is within ``--p99-ms``. The arithmetic is ``bench.capacity``'s: replicas = ceil(rate / (one
replica's rate x headroom)) + spare, the autoscaler targets (CPU used / limit and busy threads /
threads at the design rate) and the memory (PSS of one replica after load).

Why p99 comes from nginx's access log: httperf prints only the min, mean, max, median and
standard deviation of its connection times, no percentile and no per-request time; nginx logs
``$request_time`` for every request (to the millisecond), from its first byte read to the last
byte sent, which holds every wait at the app server (its sockets' queues, the quota's
throttling). It leaves out the client's connect to nginx, which is the same for every pod size.
The stack runs with ``access_log`` on; nginx stays outside the replica's cgroup, so the log costs
the quota nothing.

``--check`` (the plan checks itself): where the planned serving replicas fit this machine (the sum
of their quotas within its CPUs; else the largest count that fits, at the rate the plan gives that
many), they run together at that rate behind one nginx (``@replicas``), then one fewer, and on
down while the p99 is still met (the plan was oversized by that much). Predicted against measured
per count is in the report.

Writes ``plan.json`` (the arguments, the machine's load, every step, the plan or why there is
none, the check), ``report.txt``, ``report.md`` and httperf's raw output under ``raw/``. A replica
that cannot meet the p99 at any rate tried is bad input for a plan: one line, exit 2 (plan.json
still records the steps).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import time
from pathlib import Path

from uwsgi_layouts.bench.analysis import judge_step
from uwsgi_layouts.bench.capacity import (
    DEFAULT_HEADROOM,
    DEFAULT_SPARE,
    Plan,
    PlanError,
    RateStep,
    best_rate,
    make_plan,
    next_rate,
    p99_ms,
)
from uwsgi_layouts.bench.environment import capture
from uwsgi_layouts.bench.kinds.base import Kind, sigterm_interrupts
from uwsgi_layouts.bench.load import httperf
from uwsgi_layouts.bench.load.wrk import WrkProcess, run_wrks
from uwsgi_layouts.bench.observe import Sampler, limit_record, parse_timed_line, stack_memory
from uwsgi_layouts.bench.options import (
    BadArgument,
    command_line,
    float_arg,
    int_arg,
    prepare_out,
    require_tools,
)
from uwsgi_layouts.bench.report.plan import report_lines
from uwsgi_layouts.bench.stack import Lab, dir_name
from uwsgi_layouts.deploy.machine import cpu_limit
from uwsgi_layouts.deploy.model import parse_variant, total_limits
from uwsgi_layouts.deploy.run import Stack

DEFAULT_PATH = "/?rounds=5&fib=25&io_ms=10"  # the article's request (as openloop's)
MIN_STEP_S = 15  # httperf samples the reply rate every 5 s: at least 2 full samples
LADDER_FACTOR = 1.5
DEFAULT_BISECTIONS = 2
MAX_STEPS = 16
MAX_RATE = 100_000
PLAN_JSON = "plan.json"
FORMAT_VERSION = 1
SAMPLE_INTERVAL_S = 0.1  # the stats server, for the busy-thread ratio
DRAIN_TIMEOUT_S = 60.0  # at most this long waiting for the stack to be idle before a step
DRAIN_POLL_S = 0.2
VALIDATE_COUNTS = 3  # --validate searches 1..3 replicas' own capacity (those that fit)


def add_arguments(p) -> None:
    p.add_argument("--layout", help="the pod: one PxT-STRATEGY with its size, e.g. 2x2-mapped@cpus=1,memory=512 "
                                    "(no @replicas: the plan says how many)")
    p.add_argument("--rate", help="the target rate the replicas must carry together, req/s (> 0)")
    p.add_argument("--p99-ms", help="the p99 each request must stay within, ms (> 0)")
    p.add_argument("--headroom", help=f"share of one replica's measured rate the plan loads it with, in (0, 1] "
                                      f"(default {DEFAULT_HEADROOM})")
    p.add_argument("--spare", help=f"replicas added for lost pods (default {DEFAULT_SPARE})")
    p.add_argument("--start", help="the first rate offered, req/s (default: half what one connection reached in "
                                   "the warm-up)")
    p.add_argument("--bisections", help=f"rates tried between the last that met the target and the first that "
                                        f"did not (default {DEFAULT_BISECTIONS})")
    p.add_argument("--step", help=f"seconds per rate (default and minimum {MIN_STEP_S})")
    p.add_argument("--path", help=f"request path (default {DEFAULT_PATH}, the article's request)")
    p.add_argument("--timeout", help="httperf's per-request timeout in seconds (default 5)")
    p.add_argument("--warmup", help="seconds of one-connection warm-up before the first step (default 2)")
    p.add_argument("--client-nice", help="niceness of httperf, which busy-polls a core (default 19)")
    p.add_argument("--check", action="store_true", help="run the planned replicas at the target rate (and one "
                                                        "fewer) where they fit this machine, and report predicted "
                                                        "against measured")
    p.add_argument("--validate", action="store_true", help=f"also search the capacity of 1..{VALIDATE_COUNTS} "
                                                           "replicas together (those that fit this machine) and "
                                                           "compare their rate per replica with the plan's")
    p.add_argument("--out", help="output directory (default results/<timestamp>-plan)")


def positive(field: str, raw, what: str) -> float:
    """A required number > 0 (one line naming the field otherwise)."""
    if raw is None or not str(raw).strip():
        raise BadArgument(f"{field}: give {what}, a number > 0")
    try:
        value = float(str(raw).strip())
    except ValueError:
        raise BadArgument(f"{field}: must be a number > 0 ({what}), got {raw!r}") from None
    if not (math.isfinite(value) and 0 < value <= MAX_RATE):
        raise BadArgument(f"{field}: must be a number > 0 and at most {MAX_RATE} ({what}), got {raw!r}")
    return value


@dataclasses.dataclass(frozen=True)
class PlanArgs:
    layout: str
    rate: float
    p99_ms: float
    headroom: float = DEFAULT_HEADROOM
    spare: int = DEFAULT_SPARE
    start: float | None = None
    bisections: int = DEFAULT_BISECTIONS
    step: float = MIN_STEP_S
    path: str = DEFAULT_PATH
    timeout: float = 5
    warmup: float = 2
    client_nice: int = 19
    check: bool = False
    validate: bool = False
    out: str | None = None
    command: str = ""

    def arguments(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "out"}


def resolve_args(args) -> PlanArgs:
    """Validate and fill defaults; raise BadArgument (or LayoutError) naming the field."""
    rate = positive("rate", args.rate, "the target rate in req/s, e.g. --rate 100")
    p99 = positive("p99_ms", args.p99_ms, "the p99 target in ms, e.g. --p99-ms 250")
    if not args.layout or not str(args.layout).strip():
        raise BadArgument("layout: give the pod to plan for, e.g. --layout 2x2-mapped@cpus=1")
    spec = str(args.layout).strip()
    layout = parse_variant(spec, run_dir="/tmp/validate")  # LayoutError names the field
    if layout.replicas != 1:
        raise BadArgument(f"layout: plan measures one replica and says how many: leave @replicas out of {spec!r}")
    if layout.server != "uwsgi":
        raise BadArgument(f"layout: plan reads uWSGI's stats server (busy threads): {spec} runs {layout.server}")
    path = args.path or DEFAULT_PATH
    if not path.startswith("/") or any(c.isspace() for c in path) or len(path) > 2000:
        raise BadArgument(f"path: must start with / and contain no spaces, got {path!r}")
    return PlanArgs(
        layout=spec, rate=rate, p99_ms=p99,
        headroom=float_arg("headroom", args.headroom or DEFAULT_HEADROOM, 0.05, 1),
        spare=int_arg("spare", args.spare if args.spare is not None else DEFAULT_SPARE, 0, 10),
        start=positive("start", args.start, "the first rate in req/s") if args.start is not None else None,
        bisections=int_arg("bisections", args.bisections if args.bisections is not None else DEFAULT_BISECTIONS,
                           0, 6),
        step=float_arg("step", args.step or MIN_STEP_S, MIN_STEP_S, 600), path=path,
        timeout=float_arg("timeout", args.timeout or 5, 1, 60), warmup=float_arg("warmup", args.warmup or 2, 1, 60),
        client_nice=int_arg("client_nice", args.client_nice if args.client_nice is not None else 19, 0, 19),
        check=bool(args.check), validate=bool(args.validate), out=args.out,
        command=command_line("plan", getattr(args, "argv", None)))


# --------------------------------------------------------------------------- one step


def _log_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def request_times(path: Path, offset: int) -> list[float]:
    """$request_time of every request nginx logged after ``offset`` bytes (the healthz polls of
    the stack's start come before, the warm-up too)."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return []
    times = []
    for line in text.splitlines():
        timed = parse_timed_line(line)
        if timed is not None and timed.request_s is not None:
            times.append(timed.request_s)
    return times


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


def offer(stack: Stack, a: PlanArgs, rate: float, raw: Path, name: str, sample: bool) -> Offered:
    """One open-loop step at ``rate`` against ``stack`` once it is idle; httperf's output saved as
    raw/``name``."""
    layout = stack.layout
    drained = drain(stack, DRAIN_TIMEOUT_S)
    log = Path(layout.run_dir) / "logs" / "access.log"
    offset = _log_size(log)
    before, t0 = stack.cgroup_reading(), time.monotonic()
    cmd = httperf.command(layout.listen_port, a.path, rate, a.step, a.timeout, nice=a.client_nice)
    with Sampler(layout.stats_address if sample else None, interval=SAMPLE_INTERVAL_S) as sampler:
        text = httperf.run(cmd, a.step * 2 + a.timeout + 30)
    after, t1 = stack.cgroup_reading(), time.monotonic()
    stack.check_alive()
    raw.mkdir(parents=True, exist_ok=True)
    (raw / name).write_text(text)
    parsed = httperf.parse(text)
    verdict, reasons = judge_step(rate, parsed)
    if not drained:
        reasons = [*reasons, f"started before the previous step's requests drained ({DRAIN_TIMEOUT_S:g} s)"]
    times = request_times(log, offset)
    limit = limit_record(*total_limits(layout), before, after, t1 - t0)
    step = RateStep(rate=rate, verdict=verdict, p99_ms=p99_ms(times), cpu_share=limit.get("quota_share"),
                    busy_ratio=busy_ratio(sampler) if sample else None, reasons=tuple(reasons),
                    requests_logged=len(times))
    return Offered(step, limit, parsed)


def warm_up(stack: Stack, a: PlanArgs) -> float:
    """One connection for ``a.warmup`` s; the rate it reached (req/s)."""
    (run,), _ = run_wrks(WrkProcess(f"http://{stack.layout.listen}{a.path}", 1, a.warmup, timeout_s=a.timeout))
    return run.rps


# --------------------------------------------------------------------------- the search and the check


def search(a: PlanArgs, lab: Lab, raw: Path, on_step=print, replicas: int = 1,
           start: float | None = None) -> tuple[list[RateStep], float | None]:
    """``replicas`` replicas (one for the plan), rates up the ladder then bisected; (the steps,
    their PSS after them in MB). The busy-thread ratio is sampled with one replica only (one stats
    server)."""
    steps: list[RateStep] = []
    name, prefix = (dir_name(a.layout), "step") if replicas == 1 else (f"capacity-{replicas}", f"capacity-{replicas}x")
    with lab.stack(a.layout, name=name, access_log="on", replicas=str(replicas)) as stack:
        reached = warm_up(stack, a)
        rate = start or a.start or max(0.5, round(reached / 2, 2))
        while rate is not None and len(steps) < MAX_STEPS:
            steps.append(offer(stack, a, rate, raw, f"{prefix}-{rate:g}.txt", sample=replicas == 1).step)
            on_step(steps[-1])
            first_miss = next((i for i, s in enumerate(steps) if not s.meets(a.p99_ms)), None)
            done = 0 if first_miss is None else len(steps) - 1 - first_miss
            rate = next_rate(steps, a.p99_ms, LADDER_FACTOR, a.bisections - done)
        pss = stack_memory(stack).get("app_pss_mb")
    return steps, pss


def validate(a: PlanArgs, plan: Plan, lab: Lab, raw: Path, host_cpus: int, on_step=print) -> list[dict]:
    """Each replica count from 1 to VALIDATE_COUNTS that fits this machine, searched for its own
    capacity as one replica was (from 0.8 x count x one replica's rate): its rate per replica
    against the plan's."""
    fits = math.floor(host_cpus / plan.cpus + 1e-9) if plan.cpus else VALIDATE_COUNTS
    out = []
    for count in range(1, min(VALIDATE_COUNTS, fits) + 1):
        steps, _ = search(a, lab, raw, on_step, replicas=count,
                          start=round(0.8 * count * plan.per_replica_rate, 2))
        carried = best_rate(steps, a.p99_ms)
        per_replica = round(carried / count, 3) if carried is not None else None
        out.append({"replicas": count, "rate": carried, "per_replica_rate": per_replica,
                    "plan_per_replica_rate": plan.per_replica_rate,
                    "difference": round(plan.per_replica_rate / per_replica - 1, 4) if per_replica else None,
                    "steps": [s.to_dict() for s in steps]})
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
    """``count`` replicas together at ``rate``: one step, with the p99, the summed PSS and throttling."""
    with lab.stack(a.layout, name=f"check-{count}", access_log="on", replicas=str(count)) as stack:
        warm_up(stack, a)
        offered = offer(stack, a, rate, raw, f"check-{count}x-{rate:g}.txt", sample=False)
        pss = stack_memory(stack).get("app_pss_mb")
    s = offered.step
    return {"replicas": count, "rate": rate, "per_replica_rate": round(rate / count, 3),
            "predicted": rate / count <= per_replica_rate, "verdict": s.verdict, "p99_ms": s.p99_ms,
            "meets": s.meets(a.p99_ms), "reasons": list(s.reasons), "pss_mb": pss,
            "throttled_share": offered.limit.get("throttled_share"), "cpu_share": offered.limit.get("quota_share")}


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


def check_verdict(count: int, runs: list[dict], target_p99_ms: float) -> str:
    """The planned count meets the p99 and one fewer does not: confirmed; else by how much not."""
    planned = runs[0]
    if not planned["meets"]:
        return (f"UNDERSIZED: {count} replicas missed p99 {target_p99_ms:g} ms at {planned['rate']:g} req/s "
                f"(p99 {planned['p99_ms']} ms, {planned['verdict']})")
    smallest = min(r["replicas"] for r in runs if r["meets"])
    if smallest == count:
        return (f"CONFIRMED: {count} replicas met p99 {target_p99_ms:g} ms at {planned['rate']:g} req/s and "
                f"{count - 1} did not" if count > 1 else f"CONFIRMED: 1 replica met p99 {target_p99_ms:g} ms")
    extra = count - smallest
    return (f"OVERSIZED by {extra} replica{'s' if extra > 1 else ''} ({extra / count:.0%}): {smallest} met p99 "
            f"{target_p99_ms:g} ms at {planned['rate']:g} req/s"
            + (f", {smallest - 1} did not" if any(not r["meets"] for r in runs) else ""))


# --------------------------------------------------------------------------- the command


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def write_reports(out: Path, data: dict, plan: Plan | None, steps: list[RateStep], target_p99_ms: float) -> list[str]:
    (out / PLAN_JSON).write_text(json.dumps(data, indent=2) + "\n")
    lines = report_lines(data, plan, steps, target_p99_ms)
    (out / "report.txt").write_text("\n".join(lines) + "\n")
    (out / "report.md").write_text("# Capacity plan\n\n```\n" + "\n".join(lines) + "\n```\n")
    return lines


def run(args) -> int:
    a = resolve_args(args)
    require_tools("httperf", "wrk")
    out = prepare_out(a.out, suffix="-plan")
    print(f"plan: one replica of {a.layout}, rates x{LADDER_FACTOR:g} up the ladder then {a.bisections} "
          f"bisection(s), {a.step:g} s each; target {a.rate:g} req/s within p99 {a.p99_ms:g} ms; results in {out}",
          flush=True)
    data: dict = {"format_version": FORMAT_VERSION, "kind": "plan", "arguments": a.arguments(),
                  "environment": capture() | {"httperf": httperf.version()}, "load_before": load_average()}
    cpus = parse_variant(a.layout, run_dir="/tmp/validate").cpus

    def on_step(step: RateStep) -> None:
        print(f"  {step.rate:g} req/s: {step.verdict}, p99 {step.p99_ms} ms, CPU/limit {step.cpu_share}, "
              f"busy threads {step.busy_ratio}" + (f" ({'; '.join(step.reasons)})" if step.reasons else ""),
              flush=True)

    try:
        return _measure_and_plan(a, out, data, cpus, on_step)
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the lab has stopped every stack on the way out
        print(f"\ninterrupted: no plan; httperf's output so far is in {out / 'raw'}", file=sys.stderr)
        return 130


def _measure_and_plan(a: PlanArgs, out: Path, data: dict, cpus: float | None, on_step) -> int:
    with Lab() as lab, sigterm_interrupts():
        steps, pss = search(a, lab, out / "raw", on_step)
        try:
            plan = make_plan(a.layout, cpus, steps, a.rate, a.p99_ms, a.headroom, a.spare, pss)
        except PlanError as exc:
            data |= {"steps": [s.to_dict() for s in steps], "plan": None, "error": str(exc),
                     "load_after": load_average()}
            write_reports(out, data, None, steps, a.p99_ms)
            raise BadArgument(str(exc)) from None
        data |= {"plan": plan.to_dict(), "steps": [s.to_dict() for s in steps]}
        if a.check:
            data["check"] = check(a, plan, lab, out / "raw")
        if a.validate:
            data["validation"] = validate(a, plan, lab, out / "raw", cpu_limit().host, on_step)
    data["load_after"] = load_average()
    print("\n".join(write_reports(out, data, plan, steps, a.p99_ms)))
    print(f"\nwrote {PLAN_JSON}, report.txt, report.md in {out}")
    return 0


KIND = Kind("plan", "how many replicas of a pod carry a target rate within a p99: one replica measured in open "
                    "loop, the plan, its autoscaler settings and memory, and (--check) the plan run", add_arguments,
            run)
