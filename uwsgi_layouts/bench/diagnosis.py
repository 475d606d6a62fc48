"""``doctor``'s judgement: a window of a running uWSGI's samples -> a ``Diagnosis`` record (figures
only), and the findings in words derived from a record, each with its figures and what to do.

Pure: nothing here opens a socket, reads a file or looks at a clock. ``bench.kinds.doctor``
observes (``bench.observe``) and hands the observations in; reports call ``findings`` on stored
records, so a stored run always reads the same.

    layout_of(stats, holdings, app)            the layout in use: P, T, sockets per worker
    diagnose(Window(...))                      -> Diagnosis, its findings filled
    all_busy_share(samples, slots)             the share of samples with every thread busy (saturated)
    summarise_access(lines, path, cut)         an access log's window: latency per status class and upstream
    findings(diagnosis)                        -> [Finding]: what the figures mean and what to do
    tune_command(diagnosis)                    the ready-to-run ``bench tune`` suggestion

The definitions (pile-up, full) are those of compare's in-flight sampler
(``bench.observe.inflight_summary``): one sampler, one meaning.
"""

from __future__ import annotations

import math
import shlex
from collections import Counter
from dataclasses import dataclass, field, replace

from uwsgi_layouts.bench.observe import Sample, TimedLine, WorkerCounters, inflight_summary, parse_timed_line
from uwsgi_layouts.bench.results import STATUS_CLASSES, Diagnosis, register_kind

# A finding is stated when its figure reaches these (shares of the window's samples).
PILEUP_FINDING = 0.10  # compare's 2x4-mapped stayed at 0-4% at P and 2P, 2x4-shared at 40-96%
SATURATED_FINDING = 0.25  # every thread of every worker busy
# Requests waited in the listen queues this long on average (Little's law: mean queued / throughput)
# and at least this share of the time they then spent in a worker. Below it a queue is the handoff
# between the kernel and a free thread: for requests of a millisecond a socket holds one now and then.
QUEUE_WAIT_MS = 10.0
QUEUE_WAIT_SHARE = 0.05
MEMORY_FINDING_MB_PER_H = 10.0
MEMORY_MIN_RISE_MB = 1.0  # and grown at least this much within the window...
MEMORY_MIN_SPAN_S = 30.0  # ... over at least this long (shorter windows say little about a leak)
SERVER_ERRORS_FINDING = 0.01  # 5xx answers in the access log
TIMELINE_POINTS = 3000  # a longer window keeps each bin's highest values (peaks stay visible)
MB = 1e6


FINDING_NAMES = ("stats-exposed", "idle", "stuck", "pileup", "saturated", "queue", "harakiri", "respawns", "memory",
                 "errors", "healthy")


@dataclass(frozen=True)
class Finding:
    name: str  # one of FINDING_NAMES
    text: str  # what was seen, with its figures
    action: str  # what to do about it

    def __post_init__(self):
        if self.name not in FINDING_NAMES:
            raise ValueError(f"name: a finding is one of {', '.join(FINDING_NAMES)}, got {self.name!r}")

    def to_dict(self) -> dict:
        return {"name": self.name, "text": self.text, "action": self.action}


# --------------------------------------------------------------------------- the layout in use

STRATEGY_WORDS = {
    "shared": "every worker accepts on one shared socket",
    "thunder": "every worker accepts on one shared socket, accept() serialised (thunder-lock)",
    "mapped": "one socket per worker (map-socket)",
    "overflow": "one socket per worker plus one every worker accepts on (overflow)",
}


def layout_of(stats: dict, holdings: dict[int, list[str]] | None, app: dict | None = None,
              config: str = "") -> dict:
    """The layout ``record`` of a stats document: processes (workers), threads (cores per
    worker), the sockets with their backlog, and the strategy. ``holdings``: worker id -> the
    socket names its open descriptors hold (read from /proc), None when they could not be read:
    then the strategy is inferred from the counts and ``evidence`` says so."""
    workers = stats["workers"]
    processes = len(workers)
    threads = max((len(w.get("cores") or []) for w in workers), default=1) or 1
    names = [str(s["name"]) for s in stats.get("sockets", [])]
    thunder = any("thunder" in lock for lock in stats.get("locks", []) if isinstance(lock, dict))
    shared_name = "thunder" if thunder else "shared"
    if holdings is not None and len(holdings) == processes:
        held = {w: set(socks) for w, socks in holdings.items()}
        evidence = "the workers' open sockets (/proc/PID/fd)"
        common = set.intersection(*held.values()) if held else set()
        own = {w: s - common for w, s in held.items()}
        if held and all(s == set(names) for s in held.values()):
            strategy = shared_name if len(names) == 1 else f"{shared_name} ({len(names)} sockets, every worker on each)"
        elif processes > 1 and all(len(s) == 1 for s in own.values()) and len(set().union(*own.values())) == processes:
            strategy = "mapped" if not common else "overflow" if len(common) == 1 else "custom"
        else:
            strategy = "custom"
        per_socket = {n: sorted(w for w, s in held.items() if n in s) for n in names}
    else:
        per_socket = {}
        if len(names) == 1:
            strategy, evidence = shared_name, "one socket: every worker accepts on it"
        elif processes > 1 and len(names) == processes:
            strategy = "mapped"
            evidence = (f"{len(names)} sockets for {processes} workers: map-socket assumed (the workers' descriptors "
                        "could not be read: run as root or as the service's user to check)")
        elif processes > 1 and len(names) == processes + 1:
            strategy = "overflow"
            evidence = (f"{len(names)} sockets for {processes} workers: one per worker plus a shared one assumed (the "
                        "workers' descriptors could not be read)")
        else:
            strategy, evidence = "unknown", f"{len(names)} sockets for {processes} workers"
    record = {
        "processes": processes, "threads": threads, "strategy": strategy, "evidence": evidence,
        # Each socket's backlog is in the queue figures: uWSGI's master fills it in a second after start.
        "sockets": [{"name": n, **({"workers": per_socket[n]} if per_socket else {})} for n in names],
        "uwsgi": str(stats.get("version", "")), "master_pid": int(stats.get("pid", 0)),
    }
    if app:
        record["app"] = dict(app)
    if config:
        record["config"] = config
    return record


def layout_words(layout: dict) -> str:
    """``2 processes x 4 threads, one socket per worker (map-socket)``."""
    strategy = layout["strategy"]
    return (f"{layout['processes']} process{'es' if layout['processes'] != 1 else ''} x {layout['threads']} "
            f"thread{'s' if layout['threads'] != 1 else ''}, {STRATEGY_WORDS.get(strategy, strategy)}")


# --------------------------------------------------------------------------- the window -> a record


@dataclass
class Window:
    """What ``doctor`` observed, as handed to ``diagnose``."""

    address: str
    planned_s: float
    hz: float
    layout: dict
    samples: list[Sample]  # light samples (no counters), in time order
    first: Sample | None  # the window's first and latest full samples (with counters)
    latest: Sample | None
    memory: dict[int, list[tuple[float, int, int]]] = field(default_factory=dict)  # worker -> (t, pid, bytes)
    memory_kind: str = ""  # "pss" or "rss"
    queue_source: str = "uwsgi"
    kernel_overflows: int | None = None
    access: dict = field(default_factory=dict)
    ended: str = "complete"
    end_note: str = ""
    observed_s: float | None = None  # default: from the first to the last sample
    exposure: dict = field(default_factory=dict)  # who else can open the stats server ({} = nobody)


def served(samples: list[Sample]) -> dict[int, int]:
    """Requests each worker id served over the samples (a counter that went down, a worker slot's
    respawn or a restarted master, counts from 0; as ``Sampler.served_per_worker``)."""
    out: dict[int, int] = {}
    for a, b in zip(samples, samples[1:], strict=False):
        for wid, (_, req, _) in b.workers.items():
            prev = a.workers.get(wid)
            out.setdefault(wid, 0)
            if prev is not None:
                out[wid] += req - prev[1] if req >= prev[1] else req
    return out


def worker_figures(samples: list[Sample], first: Sample | None, latest: Sample | None) -> dict:
    """Per worker id: pid (the latest), requests served, ``mean_ms`` (time in requests over the
    requests, from uWSGI's cumulative running_time), harakiri, respawns and exceptions in the window."""
    counts = served(samples)
    out = {}
    ids = sorted(latest.workers) if latest else sorted(counts)
    for wid in ids:
        figures = {"pid": latest.workers[wid][0] if latest else 0, "requests": counts.get(wid, 0)}
        a = first.counters.get(wid) if first else None
        b = latest.counters.get(wid) if latest else None
        if a is not None and b is not None:
            delta = WorkerCounters(*(max(0, y - x) for x, y in zip(a, b, strict=True)))
            done = latest.workers[wid][1] - first.workers[wid][1] if wid in first.workers else 0
            if done > 0 and b.running_us >= a.running_us:
                figures["mean_ms"] = round(delta.running_us / done / 1000, 2)
            figures |= {"harakiri": delta.harakiri, "respawns": delta.respawns, "exceptions": delta.exceptions}
        out[str(wid)] = figures
    return out


def queue_figures(samples: list[Sample], source: str, kernel_overflows: int | None) -> dict:
    """Per socket: the longest listen queue seen, its size, the share of samples it was not empty;
    and the times uWSGI's master found a queue full in the window (``uwsgi_queue_errors``; a
    restart in the window resets uWSGI's counter: then only what came after it)."""
    sockets: dict[str, dict] = {}
    n = len(samples)
    for name in dict.fromkeys(name for s in samples for name in s.sockets):
        seen = [s.sockets[name] for s in samples if name in s.sockets]
        sockets[name] = {"max": max(q for q, _ in seen), "backlog": max(b for _, b in seen),
                         "nonempty": round(sum(1 for q, _ in seen if q > 0) / n, 4) if n else 0.0}
    errors = 0
    if samples:
        last = samples[-1]
        first = next(s for s in samples if s.master == last.master)  # since the last restart, if any
        errors = max(0, last.queue_errors - first.queue_errors)
    return {"source": source, "sockets": sockets, "kernel_overflows": kernel_overflows, "uwsgi_queue_errors": errors}


def timeline_of(samples: list[Sample], points: int = TIMELINE_POINTS) -> dict:
    """Times, requests in flight per worker and queued (all sockets), one point per sample; a
    longer window keeps, per bin of consecutive samples, its first time and highest values."""
    if not samples:
        return {}
    ids = sorted({w for s in samples for w in s.inflight})
    size = max(1, math.ceil(len(samples) / points))
    bins = [samples[i:i + size] for i in range(0, len(samples), size)]
    return {
        "t": [round(b[0].t, 3) for b in bins],
        "inflight": {str(w): [max(s.inflight.get(w, 0) for s in b) for b in bins] for w in ids},
        "queue": [max(sum(q for q, _ in s.sockets.values()) for s in b) for b in bins],
    }


def memory_figures(series: dict[int, list[tuple[float, int, int]]], kind: str) -> dict:
    """Per worker: memory at the window's first and last reading of its latest process, and the
    least-squares slope in MB per hour (a respawned worker starts a new series)."""
    workers = {}
    for wid, points in sorted(series.items()):
        if not points:
            continue
        pid = points[-1][1]
        mine = [(t, b / MB) for t, p, b in points if p == pid]
        span = mine[-1][0] - mine[0][0]
        slope = 0.0
        if len(mine) > 1 and span > 0:
            mt = sum(t for t, _ in mine) / len(mine)
            mm = sum(m for _, m in mine) / len(mine)
            var = sum((t - mt) ** 2 for t, _ in mine)
            slope = sum((t - mt) * (m - mm) for t, m in mine) / var * 3600 if var else 0.0
        workers[str(wid)] = {"first_mb": round(mine[0][1], 2), "last_mb": round(mine[-1][1], 2),
                             "growth_mb_per_h": round(slope, 2), "span_s": round(span, 1)}
    return {"kind": kind, "workers": workers} if workers and kind else {}


def all_busy_share(samples: list[Sample], slots: int) -> float:
    """The share of the samples (those with in-flight counts) in which every one of the ``slots``
    threads (processes x threads) held a request: the ``saturated`` figure. 0.0 without samples."""
    totals = [sum(s.inflight.values()) for s in samples if s.inflight]
    return sum(1 for t in totals if t >= slots) / len(totals) if totals else 0.0


def diagnose(w: Window) -> Diagnosis:
    """The window's record, its findings filled."""
    samples = w.samples
    inflight = inflight_summary(samples)
    if inflight:
        slots = w.layout["processes"] * w.layout["threads"]
        window = [s for s in samples if s.inflight]
        totals = [sum(s.inflight.values()) for s in window]
        # Requests at once: in flight, and with the waiting ones in the listen queues. 99th
        # percentiles, not maxima: one thread still closing a request while another reads the next
        # one makes a momentary extra that no client sent.
        at_once = sorted(t + sum(q for q, _ in s.sockets.values()) for t, s in zip(totals, window, strict=True))
        inflight |= {"peak": max(totals), "saturated": round(all_busy_share(samples, slots), 4),
                     "p99": _percentile(sorted(totals), 0.99), "demand_p99": _percentile(at_once, 0.99)}
    observed = w.observed_s if w.observed_s is not None else (samples[-1].t - samples[0].t if samples else 0.0)
    workers = worker_figures(samples, w.first, w.latest)
    requests = sum(f["requests"] for f in workers.values())
    queue = queue_figures(samples, w.queue_source, w.kernel_overflows)
    if samples:
        queue["mean_queued"] = round(sum(q for s in samples for q, _ in s.sockets.values()) / len(samples), 4)
        if requests and observed > 0:
            queue["mean_wait_ms"] = round(1000 * queue["mean_queued"] / (requests / observed), 3)
    record = Diagnosis(
        address=w.address, planned_s=w.planned_s, observed_s=round(observed, 3), hz=w.hz, layout=w.layout,
        requests=requests, workers=workers, inflight=inflight, queue=queue, timeline=timeline_of(samples),
        memory=memory_figures(w.memory, w.memory_kind), access=w.access, ended=w.ended, end_note=w.end_note,
        exposure=w.exposure,
    )
    return replace(record, findings=tuple(f.to_dict() for f in findings(record)))


# --------------------------------------------------------------------------- the access log


def _percentile(sorted_values: list[float], q: float) -> float:
    """Nearest rank: the smallest value with at least q of the values at or below it."""
    return sorted_values[max(0, math.ceil(q * len(sorted_values)) - 1)]


def _latency(values: list[float]) -> dict:
    if not values:
        return {}
    v = sorted(values)
    return {"p50_ms": round(1000 * _percentile(v, 0.5), 2), "p99_ms": round(1000 * _percentile(v, 0.99), 2),
            "max_ms": round(1000 * v[-1], 2), "mean_ms": round(1000 * sum(v) / len(v), 2)}


def summarise_access(lines: list[str], path: str, cut: bool = False) -> dict:
    """The access log's lines of the window: answers and latency per status class (the time in
    the upstream: $upstream_response_time over every attempt, else $request_time), per upstream
    socket (each attempt's own time), and the count of each status code."""
    parsed: list[TimedLine] = [p for p in (parse_timed_line(x) for x in lines if x.strip()) if p]
    formats = Counter(p.format for p in parsed)
    by_class: dict[str, list[float]] = {}
    counts: Counter = Counter()
    codes: Counter = Counter()
    upstreams: dict[str, list[float]] = {}
    timing = "none"
    for p in parsed:
        cls = f"{p.status // 100}xx"
        counts[cls] += 1
        codes[str(p.status)] += 1
        attempts = [t for t in p.upstream_s if t is not None]
        if attempts:
            timing = "upstream"
            by_class.setdefault(cls, []).append(sum(attempts))
        elif p.request_s is not None:
            timing = "request" if timing == "none" else timing
            by_class.setdefault(cls, []).append(p.request_s)
        if len(p.upstreams) == len(p.upstream_s):
            for addr, t in zip(p.upstreams, p.upstream_s, strict=True):
                if t is not None and addr != "-":
                    upstreams.setdefault(addr, []).append(t)
    return {
        "file": path, "lines": sum(1 for x in lines if x.strip()), "used": len(parsed), "formats": dict(formats),
        "timing": timing, "cut": cut,
        "status": {c: {"requests": counts[c], **_latency(by_class.get(c, []))} for c in (*STATUS_CLASSES, "1xx")
                   if counts[c]},
        "codes": dict(sorted(codes.items())),
        "upstreams": {a: {"requests": len(v), **_latency(v)} for a, v in sorted(upstreams.items())},
    }


# --------------------------------------------------------------------------- findings


def _pct(x: float) -> str:
    return f"{x:.0%}"


def demand(d: Diagnosis) -> int:
    """Requests at once the service had to hold (99th percentile of the samples): in flight, plus
    the queued ones when requests really waited (else a queue is the handoff to a free thread)."""
    key = "demand_p99" if queue_matters(d) else "p99"
    return max(1, math.ceil(d.inflight.get(key, d.inflight.get("peak", 0))))


def queue_was_full(d: Diagnosis) -> bool:
    return any(f["backlog"] and f["max"] >= f["backlog"] for f in d.queue.get("sockets", {}).values())


def mean_service_ms(d: Diagnosis) -> float | None:
    """Time in a worker per request, all workers (weighted by their requests)."""
    timed = [(f["mean_ms"], f["requests"]) for f in d.workers.values() if "mean_ms" in f and f["requests"]]
    total = sum(n for _, n in timed)
    return sum(ms * n for ms, n in timed) / total if total else None


def queue_matters(d: Diagnosis) -> bool:
    """A queue filled up (seen full, or uWSGI counted it full), or requests waited in the queues
    long enough to matter (QUEUE_WAIT_*)."""
    wait = d.queue.get("mean_wait_ms")
    service = mean_service_ms(d) or 0.0
    return (queue_was_full(d) or bool(d.queue.get("uwsgi_queue_errors"))
            or (wait is not None and wait >= max(QUEUE_WAIT_MS, QUEUE_WAIT_SHARE * service)))


def tune_command(d: Diagnosis) -> str:
    """``uwsgi-layouts tune --concurrency N`` for the observed peak (in flight + queued), with
    the app options read from the uWSGI config when it was readable (else placeholders) and the
    access log as the traffic when one was read."""
    args = ["uwsgi-layouts", "tune", "--concurrency", str(demand(d))]
    app = d.layout.get("app") or {}
    args += ["--app", app.get("app", "MODULE:CALLABLE")]
    if app.get("app_dir") or not app:
        args += ["--app-dir", app.get("app_dir", "APP_DIR")]
    if app.get("virtualenv"):
        args += ["--virtualenv", app["virtualenv"]]
    if d.access.get("used"):
        args += ["--access-log", d.access["file"]]
    # The ini's variables by name only (their values may be secrets, and results.json keeps this line).
    args += [arg for name in app.get("env_names", ()) for arg in ("--env", f"{name}=...")]
    return shlex.join(args)


def _num(x: float) -> str:
    """About three significant figures, never in exponent form (180, 18.2, 0.42)."""
    return f"{x:.0f}" if abs(x) >= 100 else f"{x:.1f}" if abs(x) >= 10 else f"{x:.2f}"


def _by_worker(d: Diagnosis, key: str, unit: str = "") -> str:
    parts = [f"worker {w} {_num(f[key])}{unit}" for w, f in d.workers.items() if f.get(key) is not None]
    return ", ".join(parts)


def _pileup(d: Diagnosis, tune: str) -> Finding | None:
    share = d.inflight.get("pileup")
    if share is None or share < PILEUP_FINDING:
        return None
    strategy = d.layout["strategy"]
    text = (f"pile-up {_pct(share)} of the time: some worker held 2 or more requests in flight while another had "
            f"at least 2 fewer (idle threads), so requests shared one worker's GIL instead of running on another's "
            f"idle threads")
    means = _by_worker(d, "mean_ms", " ms")
    if means:
        text += f"; mean time per request: {means}"
    if strategy in ("shared", "thunder") or strategy.startswith(("shared ", "thunder ")):
        text += f". The {d.layout['processes']} workers share one socket ({strategy}): whichever accepts first takes " \
                "the request, however busy it is"
        action = ("one socket per worker balanced by nginx's least_conn (mapped) is the layout built against this; "
                  f"measure it with your app: {tune}")
    elif strategy in ("mapped", "overflow"):
        text += f". Each worker has its own socket ({strategy}), so nginx chose the busy worker"
        action = ("check the site's upstream: least_conn, and with several nginx workers a shared `zone` (without "
                  f"it each nginx worker balances on its own counts; deploy's configs have both); then {tune}")
    else:
        action = f"find a layout that spreads requests over the workers: {tune}"
    return Finding("pileup", text, action)


def _queue(d: Diagnosis, tune: str) -> Finding | None:
    if not queue_matters(d):
        return None
    parts = []
    for name, f in sorted(d.queue["sockets"].items(), key=lambda nf: -nf[1]["max"]):
        if not f["max"]:
            continue
        size = f" of {f['backlog']}" if f["backlog"] else ""
        full = " (full: new connections were refused or dropped)" if f["backlog"] and f["max"] >= f["backlog"] else ""
        parts.append(f"{name} reached {f['max']}{size}{full}, not empty {_pct(f['nonempty'])} of the time")
    text = ("the listen queue of " + "; of ".join(parts)) if parts else \
        "a listen queue (between these reads: none was seen above 0)"
    if d.queue.get("mean_wait_ms") is not None:
        text += f"; requests waited about {_num(d.queue['mean_wait_ms'])} ms there on average"
    if d.queue.get("uwsgi_queue_errors"):
        text += f"; uWSGI found its listen queue full {d.queue['uwsgi_queue_errors']} time(s) in the window"
    if d.queue.get("kernel_overflows"):
        text += (f"; the kernel dropped {d.queue['kernel_overflows']} connection(s) on full TCP listen queues "
                 "meanwhile (every socket of this host)")
    saturated = d.inflight.get("saturated", 0.0)
    slots = d.layout["processes"] * d.layout["threads"]
    at_least = "at least " if queue_was_full(d) else ""  # a full queue turned the rest away unseen
    if saturated >= SATURATED_FINDING:
        text = (f"every thread busy {_pct(saturated)} of the time and {text}: under-provisioned for the observed peak "
                f"of {at_least}{demand(d)} requests at once ({slots} threads)")
        action = (f"more threads or processes for {at_least}{demand(d)} requests at once, or less time per request (a "
                  f"larger `listen` only lets requests wait longer); find the layout: {tune}")
        return Finding("queue", text, action)
    text += f", while {_pct(1 - saturated)} of the time some thread was idle"
    if d.layout["strategy"] in ("mapped", "overflow"):
        action = ("requests queued on a busy worker's own socket while others had idle threads: more threads per "
                  f"worker, or the overflow layout (max_conns + a shared backup socket); compare on your app: {tune}")
    else:
        action = f"requests waited though threads were idle at other moments: bursts; size for them: {tune}"
    return Finding("queue", text, action)


def _saturated(d: Diagnosis, tune: str) -> Finding | None:
    saturated = d.inflight.get("saturated", 0.0)
    if saturated < SATURATED_FINDING:
        return None
    slots = d.layout["processes"] * d.layout["threads"]
    return Finding("saturated", f"every thread of every worker busy {_pct(saturated)} of the time ({slots} threads); "
                                "the listen queues stayed empty",
                   f"at capacity: more traffic would queue; size for the peak: {tune}")


def _restarts(d: Diagnosis) -> list[Finding]:
    out = []
    harakiri = {w: f.get("harakiri", 0) for w, f in d.workers.items() if f.get("harakiri")}
    respawns = {w: f.get("respawns", 0) - f.get("harakiri", 0) for w, f in d.workers.items()}
    respawns = {w: n for w, n in respawns.items() if n > 0}
    if harakiri:
        n = sum(harakiri.values())
        out.append(Finding("harakiri", f"harakiri fired {n} time{'s' if n != 1 else ''} (worker "
                                       f"{', '.join(harakiri)}): requests ran longer than the harakiri limit and were "
                                       "killed (their clients got a 502 or 504)",
                           "find the slow requests (nginx's log at those times) and make them faster, or raise "
                           "harakiri if they are legitimate; with several threads uWSGI 2.0 keeps one deadline per "
                           "worker, so a stuck thread may outlive it"))
    if respawns:
        n = sum(respawns.values())
        out.append(Finding("respawns", f"workers respawned {n} time{'s' if n != 1 else ''} without harakiri (worker "
                                       f"{', '.join(respawns)})",
                           "a crash (segfault, out of memory), max-requests / reload-on-rss, or a reload: see "
                           "uWSGI's log at those times"))
    return out


def growth_quotable(figures: dict) -> bool:
    """Whether a worker's memory growth per hour says anything: a slope over a few seconds
    extrapolated to an hour is noise, so only one over at least ``MEMORY_MIN_SPAN_S`` is."""
    return figures["span_s"] >= MEMORY_MIN_SPAN_S


def _memory(d: Diagnosis) -> Finding | None:
    grew = {w: f for w, f in d.memory.get("workers", {}).items()
            if f["growth_mb_per_h"] >= MEMORY_FINDING_MB_PER_H and f["last_mb"] - f["first_mb"] >= MEMORY_MIN_RISE_MB
            and growth_quotable(f)}
    if not grew:
        return None
    kind = d.memory["kind"].upper()
    parts = [f"worker {w} {kind} grew {f['growth_mb_per_h']:.0f} MB/h ({f['first_mb']:.1f} -> {f['last_mb']:.1f} MB "
             f"in {f['span_s']:.0f} s)" for w, f in grew.items()]
    return Finding("memory", "; ".join(parts),
                   "a leak or a cache still filling: watch longer (--for 600) to tell them apart; uWSGI's "
                   "reload-on-rss or max-requests bound it meanwhile")


def _errors(d: Diagnosis) -> Finding | None:
    status = d.access.get("status", {})
    total = sum(f["requests"] for f in status.values())
    errors = status.get("5xx", {}).get("requests", 0)
    if not total or errors / total < SERVER_ERRORS_FINDING:
        return None
    codes = ", ".join(f"{c}: {n}" for c, n in d.access.get("codes", {}).items() if c.startswith("5"))
    return Finding("errors", f"{errors / total:.1%} of the answers in the access log were 5xx ({errors} of {total}; "
                             f"{codes})",
                   "502: nginx could not reach uWSGI (a full unix listen queue, workers restarting); 504: no answer "
                   "in time (a full TCP listen queue, slow requests): nginx's error log says which")


def _exposed(d: Diagnosis) -> Finding | None:
    """A stats server other local users can open: its JSON holds the variables of every request in
    flight (Cookie, Authorization headers), so any of them can take over the app's users' sessions."""
    if not d.exposure:
        return None
    e = d.exposure
    return Finding("stats-exposed", f"{e['who']} can read the stats server {e['address']}, and with it the "
                                    f"cookies and Authorization headers of every request in flight: {e['why']}",
                   e["fix"])


def findings(d: Diagnosis) -> list[Finding]:
    """What the record's figures say, most important first (a stats server others can read, first
    of all); "healthy" when traffic showed none."""
    exposed = _exposed(d)
    return ([exposed] if exposed else []) + _load_findings(d)


def _load_findings(d: Diagnosis) -> list[Finding]:
    restarts = _restarts(d)
    memory = _memory(d)
    extra = [f for f in (*restarts, memory, _errors(d)) if f]
    if not d.inflight:
        return extra
    peak = int(d.inflight.get("peak", 0))
    if d.requests == 0 and peak == 0:
        return [Finding("idle", f"no traffic in the window: no request finished in {d.observed_s:.0f} s and none was "
                                "in flight",
                        "nothing to diagnose: run doctor while the service is busy (at its peak hour), or longer "
                        "(--for)"), *extra]
    if d.requests == 0:
        return [Finding("stuck", f"no request finished in {d.observed_s:.0f} s while up to {peak} were in flight: "
                                 "they are stuck",
                        "see what the workers are doing (py-spy dump --pid PID); harakiri kills requests that run "
                        "longer than its limit"), *extra]
    tune = tune_command(d)
    found = [f for f in (_pileup(d, tune), _queue(d, tune)) if f]
    if not any(f.name == "queue" for f in found) and (sat := _saturated(d, tune)):
        found.append(sat)
    found += extra
    if not found:
        pile = d.inflight.get("pileup")
        wait = d.queue.get("mean_wait_ms")
        queues = "listen queues empty" if not d.queue.get("mean_queued") else \
            f"about {_num(wait or 0.0)} ms of wait in the listen queues on average"
        found.append(Finding(
            "healthy", f"no problem found in {d.observed_s:.0f} s: {d.requests} requests, pile-up "
                       f"{'n/a' if pile is None else _pct(pile)}, every thread busy "
                       f"{_pct(d.inflight.get('saturated', 0.0))} of the time, {queues}",
            f"nothing to change for this traffic; run it again at the peak hour (to size for more: {tune})"))
    return found


register_kind("doctor", "diagnoses")
