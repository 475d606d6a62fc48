"""The capacity plan's report (``uwsgi-layouts plan``): the steps one replica was offered, the
plan and its autoscaler settings, and, when it checked itself, predicted against measured per
replica count. Plain lines; report.md is the same text in a code block.

Rendered from plan.json only (``write_plan_reports``), so ``uwsgi-layouts report DIR`` re-renders
a stored plan as the run did (``read_plan``: one line naming what is wrong with a file). What it
states of the steps and the validation (which steps met the target, whether the plan is within 10%
of every count measured) is the judgement plan.json stores (``bench.readings.plan_judgement``):
nothing here decides it."""

from __future__ import annotations

import json
from pathlib import Path

from uwsgi_layouts.bench.capacity import Plan, RateStep
from uwsgi_layouts.bench.readings import PlanJudgement, Validation, plan_judgement
from uwsgi_layouts.bench.results import ResultsError
from uwsgi_layouts.bench.warm_up import WarmUp

PLAN_JSON = "plan.json"
PLAN_VERSIONS = (1, 2)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def _num(x: float | None, unit: str = "") -> str:
    return "-" if x is None else f"{x:g}{unit}"


def step_lines(plan_or_steps, met) -> list[str]:
    """One line per step, by rate; ``met``: the rates that met the target (``PlanJudgement.met``)."""
    steps = plan_or_steps.steps if isinstance(plan_or_steps, Plan) else plan_or_steps
    out = [f"{'rate/s':>8} {'s':>4} {'requests':>8} {'verdict':>8} {'kept up':>8} {'errors':>6} {'p99 ms':>8} "
           f"{'meets':>6} {'CPU/limit':>10} {'throttled':>9} {'busy thr':>9} {'httperf CPU':>11}"]
    for s in sorted(steps, key=lambda s: s.rate):
        out.append(f"{s.rate:>8g} {_num(s.step_s):>4} {s.requests_logged:>8} {s.verdict:>8} {_pct(s.kept_up):>8} "
                   f"{s.errors:>6} {_num(s.p99_ms):>8} {'yes' if s.rate in met else 'no':>6} "
                   f"{_pct(s.cpu_share):>10} {_pct(s.throttled_share):>9} {_num(s.busy_ratio):>9} "
                   f"{_num(s.client_cpu_pct, '%'):>11}"
                   + (f"  ({'; '.join(s.reasons)})" if s.reasons else ""))
    return out


def plan_lines(plan: Plan, next_miss: float | None) -> list[str]:
    """The plan; ``next_miss``: the lowest rate above its rate per replica that missed (``PlanJudgement``)."""
    nxt = f"; {next_miss:g} req/s did not" if next_miss is not None else " (no higher rate was tried)"
    limit = f"limits.cpu {round(plan.cpus * 1000)}m" if plan.cpus else "no CPU limit"
    out = [f"ONE REPLICA: {plan.per_replica_rate:g} req/s with p99 <= {plan.target_p99_ms:g} ms and no errors{nxt}",
           f"PLAN: {plan.replicas} replicas of {plan.layout} = ceil({plan.target_rate:g} / "
           f"({plan.per_replica_rate:g} x {plan.headroom:g})) + {plan.spare} spare for a lost pod",
           f"AUTOSCALER: keep each replica at or below {plan.design_rate:g} req/s ({plan.headroom:.0%} of what it "
           f"carried): CPU utilisation target {_pct(plan.cpu_target)} of its limit ({limit}), busy-thread ratio "
           f"{_num(plan.busy_target)} (uWSGI stats: threads inside a request / threads), as measured at that rate; "
           f"minimum {plan.replicas} replicas"]
    if plan.pss_mb is not None:
        out.append(f"MEMORY: {plan.replicas} x {plan.pss_mb:g} MB PSS = {plan.memory_total_mb:g} MB; request "
                   f"{plan.memory_request_mb:g} MB per replica (PSS after load + 25%)")
    if plan.cpus is None:
        out.append("note: the layout has no @cpus: the replica used the whole machine, so the plan's pods have no "
                   "size; give e.g. @cpus=1")
    return out


def check_lines(check: dict) -> list[str]:
    """The self-check: one line per replica count run, then the verdict."""
    if not check:
        return []
    out = [f"CHECK at {check['rate']:g} req/s (measured, this machine; {check['note']})" if check.get("note")
           else f"CHECK at {check['rate']:g} req/s (measured, this machine)",
           f"{'replicas':>8} {'per replica':>12} {'predicted':>10} {'verdict':>8} {'p99 ms':>8} {'meets':>6} "
           f"{'PSS MB':>8} {'throttled':>10} {'httperf CPU':>11}"]
    for run in check["runs"]:
        predicted = "meets" if run["predicted"] else "misses"
        out.append(f"{run['replicas']:>8} {run['per_replica_rate']:>12g} {predicted:>10} "
                   f"{run['verdict']:>8} {_num(run['p99_ms']):>8} {'yes' if run['meets'] else 'no':>6} "
                   f"{_num(run.get('pss_mb')):>8} {_pct(run.get('throttled_share')):>10} "
                   f"{_num(run.get('client_cpu_pct'), '%'):>11}")
    out.append(f"CHECK: {check['verdict']}")
    return out


def warm_up_lines(warm: WarmUp | None) -> list[str]:
    """The one-connection warm-up before the first step, as nginx timed it (none in a plan.json
    written before it was recorded)."""
    if warm is None:
        return []
    timed = (f"{warm.timed} answered requests timed, fastest {warm.fastest_ms:g} ms, p99 {warm.p99_ms:g} ms"
             if warm.timed else "no answered request timed")
    return [f"warm-up: one connection for {warm.seconds:g} s, {warm.rate:g} req/s; {timed}; the replica throttled "
            f"{1000 * warm.throttled_s:g} ms"]


def report_lines(data: dict, plan: Plan | None, steps, judged: PlanJudgement, warm: WarmUp | None = None) -> list[str]:
    """The whole report: the header, the warm-up, the steps, the plan (or why there is none), the
    check, as ``judged`` (``bench.readings.plan_judgement``) decided them."""
    a = data["arguments"]
    out = [f"plan: {a['layout']} for {a['rate']:g} req/s within p99 {a['p99_ms']:g} ms (open loop, httperf; p99 "
           f"from nginx's $request_time); load {data['load_before']} before, {data['load_after']} after",
           *([f"load generator: {data['load_generator']}"] if data.get("load_generator") else []),
           *warm_up_lines(warm), ""]
    rule = (f"each step >= {a['min_requests']} requests, bisected to {a['resolution']:.0%}"
            if "min_requests" in a else "steps of the first plan format")
    out += ([f"One replica under its quota, offered fixed rates ({rule}):", *step_lines(steps, judged.met), ""]
            if steps else ["One replica under its quota: no rate offered (the warm-up ruled every rate out)", ""])
    out += plan_lines(plan, judged.next_miss) if plan is not None else [f"NO PLAN: {data['error']}"]
    if data.get("check"):
        out += ["", *check_lines(data["check"])]
    if data.get("validation"):
        out += ["", *validation_lines(data["validation"], judged.validation)]
    return out


def validation_lines(rows: list[dict], validation: Validation | None) -> list[str]:
    """Each replica count's own capacity (searched), per replica, against the plan's; then
    ``validation``'s verdict (``PlanJudgement.validation``), when a count was resolved."""
    out = ["VALIDATION: each count's own capacity, searched as one replica's was (same rule, resolution and "
           "step length per replica's rate)",
           f"{'replicas':>8} {'carried/s':>10} {'per replica':>12} {'resolved':>9} {'plan':>8} "
           f"{'plan vs measured':>17} {'CPU/limit':>10} {'httperf CPU':>11}"]
    for r in rows:
        diff = "-" if r["difference"] is None else f"{r['difference']:+.0%}"
        resolution = "-" if r.get("resolution") is None else f"{r['resolution']:.0%}"
        at = next((s for s in r.get("steps", []) if s["rate"] == r["rate"]), {})  # the step at the count's capacity
        out.append(f"{r['replicas']:>8} {_num(r['rate']):>10} {_num(r['per_replica_rate']):>12} {resolution:>9} "
                   f"{r['plan_per_replica_rate']:>8g} {diff:>17} {_pct(at.get('cpu_share')):>10} "
                   f"{_num(at.get('client_cpu_pct'), '%'):>11}")
    if validation is not None:
        verdict = "within" if validation.within else "NOT within"
        out.append(f"VALIDATION: the plan's rate per replica is {verdict} {validation.target:.0%} of every count "
                   f"measured (largest difference {validation.difference:+.0%}, {validation.replicas} replica(s))")
    return out


def read_plan(path: Path | str) -> dict:
    """A stored plan.json, checked enough to render (ResultsError, one line, otherwise)."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise ResultsError(f"{path}: cannot read the plan ({exc.strerror or exc})") from None
    except ValueError as exc:
        raise ResultsError(f"{path}: cannot read the plan's JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("kind") != "plan":
        raise ResultsError(f"{path}: not a plan (kind {data.get('kind') if isinstance(data, dict) else None!r})")
    if data.get("format_version") not in PLAN_VERSIONS:
        raise ResultsError(f"{path}: plan format_version {data.get('format_version')!r} is not supported (this tool "
                           f"reads {' and '.join(map(str, PLAN_VERSIONS))})")
    missing = [k for k in ("arguments", "steps", "load_before", "load_after") if k not in data]
    if data.get("plan") is None and "error" not in data:
        missing.append("plan or error")
    if missing:
        raise ResultsError(f"{path}: missing {', '.join(missing)}")
    try:
        plan_and_steps(data)
        warm_up_of(data)
    except (ValueError, KeyError, TypeError) as exc:
        raise ResultsError(f"{path}: a bad plan, step or warm-up ({exc})") from None
    try:
        plan_judgement(data)
    except (ValueError, KeyError, TypeError) as exc:
        raise ResultsError(f"{path}: a bad judgement ({exc})") from None
    return data


def plan_and_steps(data: dict) -> tuple[Plan | None, list[RateStep]]:
    steps = [RateStep.from_dict(s) for s in data["steps"]]
    return (Plan.from_dict(data["plan"]) if data.get("plan") else None), steps


def warm_up_of(data: dict) -> WarmUp | None:
    """The warm-up a plan.json records (None in one written before it was recorded)."""
    return WarmUp.from_dict(data["warm_up"]) if data.get("warm_up") is not None else None


def write_plan_reports(out: Path, data: dict) -> list[str]:
    """report.txt and report.md in ``out`` from a plan's data (as plan.json holds it); the lines."""
    plan, steps = plan_and_steps(data)
    lines = report_lines(data, plan, steps, plan_judgement(data), warm_up_of(data))
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.txt").write_text("\n".join(lines) + "\n")
    (out / "report.md").write_text("# Capacity plan\n\n```\n" + "\n".join(lines) + "\n```\n")
    return lines
