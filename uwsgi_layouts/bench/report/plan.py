"""The capacity plan's report (``uwsgi-layouts plan``): the steps one replica was offered, the
plan and its autoscaler settings, and, when it checked itself, predicted against measured per
replica count. Plain lines; report.md is the same text in a code block."""

from __future__ import annotations

from uwsgi_layouts.bench.capacity import Plan


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def _num(x: float | None, unit: str = "") -> str:
    return "-" if x is None else f"{x:g}{unit}"


def step_lines(plan_or_steps, target_p99_ms: float) -> list[str]:
    steps = plan_or_steps.steps if isinstance(plan_or_steps, Plan) else plan_or_steps
    out = [f"{'rate/s':>8} {'verdict':>8} {'p99 ms':>8} {'meets':>6} {'CPU/limit':>10} {'busy thr':>9}"]
    for s in sorted(steps, key=lambda s: s.rate):
        out.append(f"{s.rate:>8g} {s.verdict:>8} {_num(s.p99_ms):>8} {'yes' if s.meets(target_p99_ms) else 'no':>6} "
                   f"{_pct(s.cpu_share):>10} {_num(s.busy_ratio):>9}"
                   + (f"  ({'; '.join(s.reasons)})" if s.reasons else ""))
    return out


def plan_lines(plan: Plan) -> list[str]:
    above = [s.rate for s in plan.steps if s.rate > plan.per_replica_rate and not s.meets(plan.target_p99_ms)]
    nxt = f"; {min(above):g} req/s did not" if above else " (no higher rate was tried)"
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
           f"{'PSS MB':>8} {'throttled':>10}"]
    for run in check["runs"]:
        predicted = "meets" if run["predicted"] else "misses"
        out.append(f"{run['replicas']:>8} {run['per_replica_rate']:>12g} {predicted:>10} "
                   f"{run['verdict']:>8} {_num(run['p99_ms']):>8} {'yes' if run['meets'] else 'no':>6} "
                   f"{_num(run.get('pss_mb')):>8} {_pct(run.get('throttled_share')):>10}")
    out.append(f"CHECK: {check['verdict']}")
    return out


def report_lines(data: dict, plan: Plan | None, steps, target_p99_ms: float) -> list[str]:
    """The whole report: the header, the steps, the plan (or why there is none), the check."""
    a = data["arguments"]
    out = [f"plan: {a['layout']} for {a['rate']:g} req/s within p99 {a['p99_ms']:g} ms (open loop, httperf; p99 "
           f"from nginx's $request_time); load {data['load_before']} before, {data['load_after']} after", ""]
    out += ["One replica under its quota, offered fixed rates:", *step_lines(steps, target_p99_ms), ""]
    out += plan_lines(plan) if plan is not None else [f"NO PLAN: {data['error']}"]
    if data.get("check"):
        out += ["", *check_lines(data["check"])]
    if data.get("validation"):
        out += ["", *validation_lines(data["validation"])]
    return out


def validation_lines(rows: list[dict]) -> list[str]:
    """Each replica count's own capacity (searched), per replica, against the plan's."""
    out = ["VALIDATION: each count's own capacity, searched as one replica's was",
           f"{'replicas':>8} {'carried/s':>10} {'per replica':>12} {'plan':>8} {'plan vs measured':>17}"]
    for r in rows:
        diff = "-" if r["difference"] is None else f"{r['difference']:+.0%}"
        out.append(f"{r['replicas']:>8} {_num(r['rate']):>10} {_num(r['per_replica_rate']):>12} "
                   f"{r['plan_per_replica_rate']:>8g} {diff:>17}")
    return out
