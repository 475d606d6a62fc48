"""The open loop: one httperf step's verdict. (The steady minimum it judges, ``steady_min``, is the
step record's own figure, ``bench.results.Step.steady_min``: reports read it there.)"""

from __future__ import annotations

from uwsgi_layouts.bench.load.httperf import CLIENT_ERRORS, SERVER_ERRORS
from uwsgi_layouts.bench.load.sending import judge_late
from uwsgi_layouts.bench.results import steady_min

# --- the open loop: one step's verdict ---------------------------------------------------

REPLIES_OF_REQUESTS = 0.99  # a step passes with at least this share of its requests answered
MIN_RATE_OF_TARGET = 0.95  # ... and its lowest steady reply-rate sample at least this share of the offered rate
# (httperf itself must have sent at least that share: bench.load.sending's share)


def cpu_of_what_was_left(parsed: dict, server_cpu_cores: float | None, cores: float | None) -> float | None:
    """The stack's CPU (app and nginx) over a step as a share of the host's ``cores`` less
    httperf's own CPU (from its summary: they share the host); None when either is not known."""
    if server_cpu_cores is None or cores is None:
        return None
    left = cores - (parsed.get("client_cpu_pct") or 0) / 100
    return server_cpu_cores / left if left > 0 else None


def quota_used(app_cpu_cores: float | None, quota: float | None) -> float | None:
    """The app's CPU alone over a step as a share of its CPU ``quota`` (nginx is not under it);
    None without a quota or the app's CPU."""
    return app_cpu_cores / quota if quota and app_cpu_cores is not None else None


def judge_step(rate: float, parsed: dict, server_cpu_cores: float | None = None, cores: float | None = None,
               quota: float | None = None, app_cpu_cores: float | None = None) -> tuple[str, list[str]]:
    """("pass" | "fail" | "invalid", reasons) for one open-loop step at ``rate`` from httperf's
    parsed summary (see bench.kinds.openloop), the stack's CPU over the step (in cores), the host's
    cores, the stack's CPU quota and its app's CPU over the step (None: none, or not known;
    ``cpu_of_what_was_left``, ``quota_used``)."""
    e = parsed["errors"]
    client = {k: e[k] for k in CLIENT_ERRORS if e[k]}
    if client:
        return "invalid", ["client-side errors " + ", ".join(f"{k}={v}" for k, v in client.items())
                           + ": the load generator, not the server, was the limit"]
    server = {k: e[k] for k in SERVER_ERRORS if e[k]}
    bad_status = {k: parsed["status"][k] for k in ("4xx", "5xx") if parsed["status"][k]}
    if not server and not bad_status and parsed["replies"] >= parsed["requests"]:
        # httperf sent late and the server answered all it was sent without an error: the one rule
        # for both verdicts (bench.load.sending.judge_late); the evidence of the server's limit is
        # the stack's CPU against what httperf left it, or the app's against its quota. An error or
        # a lost reply is the server's anyway.
        judged = judge_late(rate, parsed, MIN_RATE_OF_TARGET,
                            {"CPU of what httperf left": cpu_of_what_was_left(parsed, server_cpu_cores, cores),
                             "CPU quota used": quota_used(app_cpu_cores, quota)})
        if judged is not None:
            return judged[0], list(judged[1])
    reasons = []
    if parsed["reply_rate"]["samples"] == 0:
        return "invalid", ["no reply-rate sample (httperf samples every 5 s): use a longer --step"]
    if parsed["replies"] < REPLIES_OF_REQUESTS * parsed["requests"]:
        reasons.append(f"replies {parsed['replies']} < {REPLIES_OF_REQUESTS:.0%} of {parsed['requests']} requests")
    low = steady_min(parsed["reply_rate"])
    if low < MIN_RATE_OF_TARGET * rate:
        reasons.append(f"min reply rate {low:g}/s < {MIN_RATE_OF_TARGET:.0%} of {rate:g}/s")
    if server or bad_status:
        reasons.append("server-side errors " + ", ".join(f"{k}={v}" for k, v in {**bad_status, **server}.items()))
    return ("fail" if reasons else "pass"), reasons
