"""Whether httperf sent what it was asked, from its own summary: pure, no I/O.

A step's verdict holds the server to the rate httperf was asked for. That is only fair when httperf
sent at that rate: a generator that got too little CPU (it runs at the lowest priority beside a
quota-limited stack, ``bench.load.generator``, or under ``nice`` beside an unlimited one) sends
late, and its replies then fall behind, or queue in a burst and miss the p99, through no fault of
the server. httperf's summary says how it sent, in two ways (``shortfall``):

- **its sending rate.** The ``connections`` it opened were all begun within ``test-duration``
  less the time the last one took, and no connection took longer than the slowest
  (``connection_ms.max``); so it sent at most (connections - 1) / (test-duration - slowest) per
  second. A generator on time sends (connections - 1) / rate over exactly that span, so the bound
  is never below the rate then; below the share of it the verdict's reply-rate rule holds the
  server to (``share``: openloop's 95%, plan's 97%), httperf fell behind over the whole step. The
  bound needs every connection timed: with an error or a missing reply (a timeout's tail is in
  test-duration but in no connection time), it is not used.
- **its longest silence.** httperf's rate generator catches up when it runs late: every
  connection whose time has passed is opened in one pass of its event loop (one return of
  select(), src/core.c), and it prints the largest number opened in one pass (``Maximum connect
  burst length``). That is a bound on its lateness, not a measure: a burst of K at rate R means
  it sent nothing for at least (K - 1) / R s while K - 1 connections were due, then sent them at
  once: the server saw a gap, then a queue (the silence may have been longer, spread over
  passes). A step tolerates being behind by at most what its rules let a sample miss:
  ``LAG_SLACK`` requests (the edges of httperf's samples), or the 1 - ``share`` of one 5-s
  sample's requests, whichever is more (0.25 s at openloop's share at any rate above 8/s; 2
  requests, 0.75 s, at 2.67/s).

Lateness excuses the server as far as it goes, and the burst is only a lower bound on how far
that is (a silence spread over several passes of httperf's loop shows as several small bursts).
So both verdicts (``bench.capacity.judge_rate`` and ``bench.analysis.judge_step``) ask one
question of a step the server answered in full without an error, ``judge_late``, each with its
share and the server's own figures, whenever httperf sent late (a ``shortfall``: its sending
bound below the share, or its largest burst beyond the allowance):

- the server is held to what it was **sent** (the lower of the rate and the sending bound,
  ``sent_rate``) over the steady samples (``steady_samples``), with the rule's allowance (``LAG_SLACK``
  requests or 1 - share of them, whichever is more). Within it the step is still invalid (the rate
  asked was not offered; its queue can still miss the p99);
- within that allowance widened by what the largest burst held back (``held_back``), the lateness
  accounts for the whole shortfall: **invalid**;
- further behind, the step **fails** only with direct evidence that the server was its own limit
  (``at_limit``: a figure of the server's at ``AT_LIMIT`` of its limit: its threads busy, its
  CPU quota used, or its CPU against what httperf left it). Without it, the replies may have
  fallen behind a generator silent longer than its burst shows (a replica idle at 0.3% of its
  quota, beside an httperf with 2.7% of a core, 11 replies behind with a burst of 5): **invalid**,
  never a failure of the server. Every invalid reason of this kind begins ``LATE`` (``starved``).

A burst within the allowance is no sign of lateness: a fast generator opens a few connections in
one pass at high rates (a burst of 5 at 1,000/s is a few milliseconds late), and a server that
falls behind it is judged by the verdict's own rule, so that openloop, which has no busy-thread
figure, still finds the knee of a server held back by a limit its CPU does not show (threads
waiting on a backend). The price: a generator starved in many short silences, each within the
allowance, is not told from a server that fell behind.
"""

from __future__ import annotations

from collections.abc import Mapping

SAMPLE_S = 5  # httperf's reply-rate sample (--verbose)
LAG_SLACK = 2  # requests or replies: what the two outer edges of httperf's samples can move (bench.capacity too)
LATE = "httperf sent late: "  # how every reason of ``shortfall`` begins (``starved`` reads it back)
STARVED = "the load generator got too little CPU, not the server's limit"
# A server figure at this share of its limit or above shows the server was the limit: the share
# bench.analysis.mechanism calls saturated (SATURATED: every thread busy 90% of the time), read
# here of the busy threads, of the CPU quota used, or of the CPU httperf left (never of the CFS
# periods throttled: only those the server ran in are counted, see bench.capacity.judge_rate).
# One threshold for one meaning: at its limit for most of the step, not in a burst (the queue a
# late generator sends at once keeps a server busy for a moment, not for 90% of a step).
AT_LIMIT = 0.9


def sent_rate_bound(parsed: dict) -> float | None:
    """The most connections per second httperf can have opened, from its summary; None when the
    summary cannot bound it (one connection, a connection untimed by an error or a missing reply,
    or a slowest connection as long as the test)."""
    timed = parsed.get("connection_ms")
    connections = parsed["connections"]
    if (timed is None or connections < 2 or parsed["errors"].get("total")
            or parsed["replies"] < parsed["requests"]):
        return None
    span = parsed["test_duration_s"] - timed["max"] / 1000
    return (connections - 1) / span if span > 0 else None


def allowed_lag(rate: float, share: float) -> float:
    """Requests httperf may fall behind ``rate`` at once before the step says nothing of the
    server, for a rule that holds the server to ``share`` of the rate."""
    return max(LAG_SLACK, (1 - share) * rate * SAMPLE_S)


def shortfall(rate: float, parsed: dict, share: float) -> tuple[str, ...]:
    """Why httperf did not send what ``rate`` asks (empty: it did, as far as its summary shows),
    from its parsed summary (``bench.load.httperf.parse``), for a verdict that holds the server to
    ``share`` of the rate. See the module's docstring."""
    cpu = parsed.get("client_cpu_pct")
    why = STARVED + (f" (httperf had {cpu:g}% of a core)" if cpu is not None else "")
    reasons = []
    bound = sent_rate_bound(parsed)
    if bound is not None and bound < share * rate - 1e-9:
        reasons.append(f"{LATE}at most {bound:.3g}/s of the asked {rate:g}/s (below {share:.0%}): {why}")
    burst = parsed.get("max_burst")
    lag = allowed_lag(rate, share)
    if burst is not None and burst - 1 > lag + 1e-9:
        reasons.append(f"{LATE}nothing for at least {(burst - 1) / rate:.2f} s, then {burst} connections in one "
                       f"pass (the asked {rate:g}/s allows {lag:g} behind): {why}")
    return tuple(reasons)


def sent_rate(rate: float, parsed: dict) -> float:
    """The most per second the server can have been sent: ``rate``, or httperf's sending bound
    when that is lower."""
    bound = sent_rate_bound(parsed)
    return rate if bound is None else min(rate, bound)


def held_back(parsed: dict) -> int:
    """Requests httperf's largest burst held back past their time (its length less one; 0 when
    not printed): what a late generator can take from one sample, widening the rule's allowance."""
    burst = parsed.get("max_burst")
    return max(0, burst - 1) if burst is not None else 0


def starved(reasons) -> bool:
    """Whether a step's ``reasons`` say httperf sent late (``shortfall``'s, each starting ``LATE``)."""
    return any(reason.startswith(LATE) for reason in reasons)


def steady_samples(samples: list[float], sending_s: float) -> list[float]:
    """httperf's 5-s reply-rate samples that are steady: after the first (the ramp: no reply
    before one response time) and within the sending (later ones only drain the backlog)."""
    within = int(sending_s // SAMPLE_S + 1e-9)
    return samples[1:within]


def at_limit(figures: Mapping[str, float | None]) -> str | None:
    """The server's figures (name: its share of a limit) at ``AT_LIMIT`` or above, in words
    ("busy threads 97%"); None when none is (or none was measured)."""
    shown = [f"{name} {value:.0%}" for name, value in figures.items()
             if value is not None and value >= AT_LIMIT - 1e-9]
    return ", ".join(shown) or None


def judge_late(rate: float, parsed: dict, share: float,
               figures: Mapping[str, float | None]) -> tuple[str, tuple[str, ...]] | None:
    """The verdict of a step at ``rate`` whose server answered every request without an error, when
    httperf sent late (``shortfall``); None when it did not: the verdict's own rule judges the step.
    ``share``: of the rate the verdict holds the server to; ``figures``: the server's own, each a
    share of a limit (``at_limit``). See the module's docstring."""
    late, held = shortfall(rate, parsed, share), held_back(parsed)
    if not late:
        return None
    steady = steady_samples(parsed["reply_rate"].get("each") or [], parsed["connections"] / rate)
    if not steady:
        return "invalid", late
    per_s = sent_rate(rate, parsed)
    sent, replies = len(steady) * SAMPLE_S * per_s, sum(steady) * SAMPLE_S
    slack = max(LAG_SLACK, (1 - share) * sent)
    behind = (f"replies fell behind what httperf sent: {replies:.0f} in {len(steady)} steady 5-s samples, it sent "
              f"{sent:.1f} at most ({per_s:.3g}/s; short by more than {LAG_SLACK} and {1 - share:.0%}, and the "
              f"{held} its largest burst held back)")
    if sent - replies <= slack + held + 1e-6:
        return "invalid", late  # within the rule's allowance, or the lateness accounts for the rest
    limit = at_limit(figures)
    if limit is not None:
        return "fail", (f"{behind}, and the server was at its limit ({limit})",)
    measured = ", ".join(f"{name} {value:.0%}" for name, value in figures.items() if value is not None)
    seen = f"{measured}, below {AT_LIMIT:.0%}" if measured else "none of its figures measured"
    return "invalid", (*late, f"{LATE}{behind}, but nothing shows the server at its limit ({seen}): a generator "
                              f"can be silent longer than its largest burst shows")
