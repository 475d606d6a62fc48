"""Run real wrk and read its figures from the JSON lines our Lua ``done()`` hook prints.

``WRK_JSON``: the run's totals and percentiles. ``WRK_HISTOGRAM``: every distinct latency wrk
recorded with its count (report.lua's histogram block), from which a run keeps its latency
histogram (``WrkRun.histogram``):

* wrk's own histogram is "corrected" for coordinated omission before done() sees it (wrk 4.1
  src/wrk.c ``stats_correct``): every latency n >= 2E (E = the run's time / (requests /
  connections), the mean time between one connection's requests) adds phantom samples at n - E,
  n - 2E, ... above E. A closed loop has no schedule to fall behind, so these samples were never
  sent; ``uncorrect`` removes them exactly (o[n] = c[n] - c[n + E] above E), leaving one count
  per measured response. wrk's own percentiles (``latency_ms``) keep the correction, as before.
* ``compress`` rounds each latency (``round_latency``) to 3 significant digits below 10 ms and 4
  from 10 ms up: at most 0.5% of the value below 10 ms, 0.05% above, well below what repeats vary
  by. With 3 digits everywhere (1-ms steps from 100 ms) several requests tied at a pooled p99 near
  100 ms left fewer than 10 above it after 1,200 requests, in two of five default compare runs.
  Below 10 ms a cell's thousands of requests leave ties there harmless, and 3 digits keep a fast
  cell to about a thousand buckets. A cell holds at most one bucket per request.
"""

from __future__ import annotations

import json
import math
import os
import resource
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from uwsgi_layouts.bench.results import STATUS_CLASSES, Errors, Latency
from uwsgi_layouts.deploy.run import child_setup

LUA_REPORT = Path(__file__).resolve().parent / "lua" / "report.lua"
MARKER = "WRK_JSON "
HISTOGRAM_MARKER = "WRK_HISTOGRAM "
HISTOGRAM_DIGITS = 4  # significant digits kept per latency from FINE_FROM_US up, one fewer below (see compress)
FINE_FROM_US = 10_000


class WrkError(RuntimeError):
    pass


@dataclass(frozen=True)
class WrkRun:
    requests: int
    duration_s: float
    latency_ms: Latency
    errors: Errors
    cpu_s: float  # wrk's own user+system CPU
    raw: str  # wrk's complete output
    # Measured latencies (us, rounded by round_latency) and counts, ascending; () when wrk's walk
    # was skipped or did not add up (``histogram_note`` says why).
    histogram: tuple[tuple[int, int], ...] = ()
    histogram_note: str = ""
    status: dict = field(default_factory=dict)  # answers per status class {"2xx": n, ...} (report.lua)
    # Answers per worker pid, from the app's X-Worker-Pid header (report.lua); {} without it.
    worker_pids: dict = field(default_factory=dict)

    @property
    def rps(self) -> float:
        return self.requests / self.duration_s if self.duration_s else 0.0


def wrk_binary() -> str:
    found = shutil.which("wrk")
    if not found:
        raise WrkError("wrk is not installed: run scripts/install-system-deps.sh (apt-get install wrk)")
    return found


def parse_output(raw: str) -> dict:
    """The JSON object printed by report.lua; raise WrkError if absent or malformed."""
    for line in raw.splitlines():
        if line.startswith(MARKER):
            try:
                return json.loads(line[len(MARKER):])
            except ValueError as exc:
                raise WrkError(f"wrk printed malformed JSON: {exc}") from None
    raise WrkError("wrk printed no WRK_JSON line (did the Lua done() hook run?)\n" + raw[-2000:])


def parse_histogram(raw: str) -> dict | None:
    """The ``WRK_HISTOGRAM`` object report.lua prints (``{"distinct": D, "pairs": [[us, n], ...]}``,
    or ``{"distinct": D, "skipped": why}``); None when the script printed none."""
    for line in raw.splitlines():
        if line.startswith(HISTOGRAM_MARKER):
            try:
                data = json.loads(line[len(HISTOGRAM_MARKER):])
            except ValueError as exc:
                raise WrkError(f"wrk printed a malformed histogram: {exc}") from None
            if not isinstance(data, dict) or not ("pairs" in data or "skipped" in data):
                raise WrkError("wrk printed a histogram without pairs")
            return data
    return None


def correction_interval(duration_us: int, requests: int, connections: int) -> int:
    """E of wrk's ``stats_correct``: runtime_us / (complete / connections), integer divisions as
    in C; 0 when wrk made no correction (fewer requests than connections)."""
    per_connection = requests // connections if connections else 0
    return duration_us // per_connection if per_connection else 0


def uncorrect(pairs, interval: int) -> list[tuple[int, int]]:
    """The histogram wrk measured, from the one ``stats_correct`` left: for n > E,
    c[n] = o[n] + sum over k >= 1 of o[n + kE] = o[n] + c[n + E], so o[n] = c[n] - c[n + E].
    Raise WrkError if that leaves a negative count (the pairs were not wrk's corrected ones)."""
    corrected = {int(v): int(c) for v, c in pairs}
    out = []
    for value in sorted(corrected):
        count = corrected[value] - (corrected.get(value + interval, 0) if interval and value > interval else 0)
        if count < 0:
            raise WrkError(f"histogram: {value} us has fewer samples than {value + interval} us; "
                           "not wrk's corrected histogram")
        if count:
            out.append((value, count))
    return out


def round_significant(value: int, digits: int) -> int:
    """``value`` rounded to ``digits`` significant digits (123456 -> 123500 at 4)."""
    scale = 10 ** max(0, len(str(int(value))) - digits)
    return int(round(value / scale) * scale)


def round_latency(value_us: int) -> int:
    """A latency as a histogram keeps it: HISTOGRAM_DIGITS significant digits from FINE_FROM_US up,
    one fewer below (123456 -> 123500, 1234 -> 1230)."""
    return round_significant(value_us, HISTOGRAM_DIGITS if value_us >= FINE_FROM_US else HISTOGRAM_DIGITS - 1)


def compress(pairs, digits: int | None = None) -> tuple[tuple[int, int], ...]:
    """Latencies rounded by ``round_latency`` (or to ``digits`` significant digits), counts of
    equal values merged."""
    merged: dict[int, int] = {}
    for value, count in pairs:
        key = round_latency(value) if digits is None else round_significant(value, digits)
        merged[key] = merged.get(key, 0) + count
    return tuple(sorted(merged.items()))


def measured_histogram(hist: dict | None, data: dict, connections: int) -> tuple[tuple, str]:
    """(histogram, note) for a run: wrk's walk uncorrected and compressed, checked against the
    request count (each response is one sample; one slower than --timeout is not recorded and
    counts as a timeout error). On any doubt, no histogram and a note saying why."""
    if hist is None:
        return (), "the wrk script printed no histogram"
    if "skipped" in hist:
        return (), f"wrk's histogram walk was skipped: {hist['skipped']}"
    interval = correction_interval(int(data["duration_us"]), int(data["requests"]), connections)
    try:
        pairs = uncorrect(hist["pairs"], interval)
    except WrkError as exc:
        return (), str(exc)
    total, requests = sum(c for _, c in pairs), int(data["requests"])
    if not requests - int(data["errors"].get("timeout", 0)) <= total <= requests:
        return (), f"histogram holds {total} samples for {requests} requests"
    return compress(pairs), ""


def to_run(data: dict, raw: str, cpu_s: float = 0.0, connections: int | None = None) -> WrkRun:
    lat = data["latency_us"]
    ms = {k: lat[k] / 1000 for k in ("p50", "p90", "p99", "p999", "max", "mean")}
    # wrk's histogram rounds; keep the percentiles monotonic so the record validates.
    ms["p90"] = max(ms["p90"], ms["p50"])
    ms["p99"] = max(ms["p99"], ms["p90"])
    ms["p999"] = max(ms["p999"], ms["p99"])
    ms["max"] = max(ms["max"], ms["p999"])
    return WrkRun(
        requests=int(data["requests"]),
        duration_s=data["duration_us"] / 1e6,
        latency_ms=Latency(**ms),
        errors=Errors(**{k: int(v) for k, v in data["errors"].items()}),
        cpu_s=cpu_s,
        raw=raw,
        status=status_classes(data),
        worker_pids=worker_pid_counts(data),
        **_histogram_fields(raw, data, connections),
    )


def _histogram_fields(raw: str, data: dict, connections: int | None) -> dict:
    if connections is None:  # without the connection count wrk's correction cannot be undone
        return {}
    histogram, note = measured_histogram(parse_histogram(raw), data, connections)
    return {"histogram": histogram, "histogram_note": note}


def status_classes(data: dict) -> dict[str, int]:
    """The answers per status class report.lua counted ({} from a script without its count)."""
    status = data.get("status")
    if not isinstance(status, dict):
        return {}
    return {k: int(status.get(k, 0)) for k in STATUS_CLASSES}


def worker_pid_counts(data: dict) -> dict[int, int]:
    """Answers per worker pid that report.lua counted from the X-Worker-Pid header ({} from an app
    without the header, or a script without the count); pids that are not integers are dropped."""
    counts = data.get("worker_pids")
    if not isinstance(counts, dict):
        return {}
    out = {}
    for pid, n in counts.items():
        if str(pid).isdigit() and isinstance(n, int) and not isinstance(n, bool) and n > 0:
            out[int(pid)] = out.get(int(pid), 0) + n
    return out


class WrkProcess:
    """One wrk run in the background, so two loads (healthy and stalled clients) can overlap."""

    def __init__(self, url: str, connections: int, duration_s: float, threads: int = 1, timeout_s: float = 10.0,
                 script: Path = LUA_REPORT, script_args: list[str] | None = None):
        threads = max(1, min(threads, connections))
        self.connections = connections
        self.cmd = [
            # wrk reads whole seconds only ("10.5s" is a usage error): round up.
            wrk_binary(), f"-t{threads}", f"-c{connections}", f"-d{math.ceil(duration_s)}s",
            f"--timeout={math.ceil(timeout_s)}s",
            "--latency", "-s", str(script), url,
        ]
        if script_args:
            self.cmd += ["--", *script_args]  # reach the script's init(args)
        self.limit = duration_s + timeout_s + 30
        self.started = time.monotonic()  # when the load began (observers sample from here)
        # wrk writes into unnamed files, not pipes: done() prints every distinct latency, tens of KB
        # after a fast load, more than a pipe holds, and a wrk blocked on that write never exits while
        # an observer polls it unread (the reuseport scenario's connection sampler then waited out
        # self.limit, 40 s a cell).
        self._out = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace")
        self._err = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace")
        # Load ends with the benchmark, even a SIGKILLed one: nothing left hammering a dead stack.
        try:
            self.proc = subprocess.Popen(self.cmd, stdout=self._out, stderr=self._err,
                                         preexec_fn=child_setup(death_signal=signal.SIGKILL))
        except BaseException:  # no wrk started (missing binary...): nothing will call stop()
            self._out.close()
            self._err.close()
            raise

    def result(self) -> WrkRun:
        try:
            self.proc.wait(timeout=self.limit)
        except subprocess.TimeoutExpired:
            self.stop()
            raise WrkError(f"wrk did not finish within {self.limit:.0f} s") from None
        out, err = self._output()
        raw = f"$ {' '.join(self.cmd)}\n{out}{err}"
        if self.proc.returncode != 0:
            raise WrkError(f"wrk exited with {self.proc.returncode}:\n{raw[-2000:]}")
        return to_run(parse_output(out), raw, connections=self.connections)

    def running(self) -> bool:
        return self.proc.poll() is None

    def end_now(self) -> None:
        """End the load before its duration: wrk stops on SIGINT and prints its summary as at the end
        (its requests over the time it ran); ``result()`` reads it. wrk installs its SIGINT handler
        only once its threads exist: a SIGINT before then is ignored and the load runs to its
        duration, so call this once the load flows (``Sampler.wait_flowing``), as its callers do."""
        if self.running():
            self.proc.send_signal(signal.SIGINT)

    def _output(self) -> tuple[str, str]:
        """What wrk wrote to stdout and stderr (once it has exited)."""
        texts = []
        for f in (self._out, self._err):
            f.seek(0)
            texts.append(f.read())
        return texts[0], texts[1]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for f in (self._out, self._err):
            f.close()


def write_script(path: Path, lua: str, mode: int = 0o644) -> Path:
    """A generated wrk script: ``lua`` (its request logic) followed by the JSON ``done()`` hook
    of report.lua, readable by every user (wrk may run next to a stack that dropped privileges)
    unless ``mode`` says otherwise."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as fh:
        os.fchmod(fh.fileno(), mode)
        fh.write(lua + LUA_REPORT.read_text())
    return path


def fraction_script(directory: Path, healthy_path: str, stall_path: str, fraction: float) -> Path:
    """A wrk script that sends every Nth request to the stalled path (deterministic, so
    repeats are comparable), plus the JSON done() hook."""
    every = max(2, round(1 / fraction))
    return write_script(directory / f"stall-every-{every}.lua", (
        f"-- every {every}th request of each wrk thread stalls ({fraction:.1%} of requests)\n"
        f"local n = 0\n"
        f"request = function()\n"
        f"  n = n + 1\n"
        f"  if n % {every} == 0 then return wrk.format(nil, {stall_path!r}) end\n"
        f"  return wrk.format(nil, {healthy_path!r})\n"
        f"end\n"))


def run_wrks(*loads: WrkProcess, rusage_before=None) -> tuple[list[WrkRun], float]:
    """Wait for every load; return their runs and the CPU seconds all of them used.

    ``rusage_before``: RUSAGE_CHILDREN taken before the loads started, needed when a load
    may already have been reaped (``proc.poll()``) before this call."""
    before = rusage_before or resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        runs = [w.result() for w in loads]
    finally:
        for w in loads:
            w.stop()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return runs, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
