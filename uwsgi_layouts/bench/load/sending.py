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

Lateness excuses the server only as far as it goes (each verdict, ``bench.capacity.judge_rate``
and ``bench.analysis.judge_step``, with ``sent_rate`` and ``held_back``): a server held to what it
was **sent** (the lower of the rate and the sending bound) with its rule's allowance widened by
the requests the largest burst held back (K - 1), that still fell behind, fell behind on its own
(a server that takes the CPU starves the generator, then drains its queue slower than it was
sent): the step fails. Only when the lateness covers the whole shortfall is the step **invalid**,
with a reason naming it (``LATE``, first), never a failure of the server.

A fast generator opens a few connections in one pass at high rates (a burst of 5 at 1,000/s is a
few milliseconds late): far inside the tolerance.
"""

from __future__ import annotations

SAMPLE_S = 5  # httperf's reply-rate sample (--verbose)
LAG_SLACK = 2  # requests: what the two outer edges of httperf's samples can move (bench.capacity.EDGE_REPLIES)
LATE = "httperf sent late: "  # how every reason of ``shortfall`` begins (``starved`` reads it back)
STARVED = "the load generator got too little CPU, not the server's limit"


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
