"""The open loop: one httperf step's verdict. (The steady minimum it judges, ``steady_min``, is the
step record's own figure, ``bench.results.Step.steady_min``: reports read it there.)"""

from __future__ import annotations

from uwsgi_layouts.bench.load.httperf import CLIENT_ERRORS, SERVER_ERRORS
from uwsgi_layouts.bench.load.sending import SAMPLE_S, held_back, sent_rate, shortfall
from uwsgi_layouts.bench.results import steady_min

# --- the open loop: one step's verdict ---------------------------------------------------

REPLIES_OF_REQUESTS = 0.99  # a step passes with at least this share of its requests answered
MIN_RATE_OF_TARGET = 0.95  # ... and its lowest steady reply-rate sample at least this share of the offered rate
# (httperf itself must have sent at least that share: bench.load.sending.shortfall's share)


def judge_step(rate: float, parsed: dict) -> tuple[str, list[str]]:
    """("pass" | "fail" | "invalid", reasons) for one open-loop step at ``rate`` from httperf's
    parsed summary (see bench.kinds.openloop)."""
    e = parsed["errors"]
    client = {k: e[k] for k in CLIENT_ERRORS if e[k]}
    if client:
        return "invalid", ["client-side errors " + ", ".join(f"{k}={v}" for k, v in client.items())
                           + ": the load generator, not the server, was the limit"]
    server = {k: e[k] for k in SERVER_ERRORS if e[k]}
    bad_status = {k: parsed["status"][k] for k in ("4xx", "5xx") if parsed["status"][k]}
    late = shortfall(rate, parsed, MIN_RATE_OF_TARGET)
    if late and not server and not bad_status and parsed["replies"] >= parsed["requests"]:
        # httperf sent late and the server answered all it was sent without an error: hold its lowest
        # sample to what it was sent, less what the largest burst held back (bench.load.sending); still
        # below, the server fell behind on its own. An error or a lost reply is the server's anyway.
        if parsed["reply_rate"]["samples"] == 0:
            return "invalid", list(late)
        low, sent = steady_min(parsed["reply_rate"]), sent_rate(rate, parsed)
        floor = MIN_RATE_OF_TARGET * sent - held_back(parsed) / SAMPLE_S
        if low >= floor - 1e-9:
            return "invalid", list(late)
        return "fail", [f"min reply rate {low:g}/s < {MIN_RATE_OF_TARGET:.0%} of the {sent:.3g}/s httperf sent at "
                        f"most, less the {held_back(parsed)} its largest burst held back in a 5-s sample "
                        f"({floor:.3g}/s)"]
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
