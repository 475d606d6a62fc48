"""Run real httperf (open loop) and read its summary.

httperf opens new connections at a fixed rate R whatever the server does, one request each
here, so a server that cannot keep up shows it: replies lag, time out or fail (wrk's closed
loop hides that: slow replies slow the client down). httperf busy-polls one core, so it runs
under ``nice`` by default, in a cgroup of its own at the lowest CPU priority when the stack is
held to a quota (``bench.load.generator``), and its own CPU time is part of the summary.
"""

from __future__ import annotations

import random
import re
import shutil
import signal
import subprocess
from pathlib import Path

from uwsgi_layouts.deploy.run import child_setup

# httperf 0.9.0's summary lines (its exit code is 0 whatever happened).
RE_TOTAL = re.compile(r"Total: connections (\d+) requests (\d+) replies (\d+) test-duration ([\d.]+) s")
RE_REPLY_RATE = re.compile(
    r"Reply rate \[replies/s\]: min ([\d.]+) avg ([\d.]+) max ([\d.]+) stddev ([\d.]+) \((\d+) samples\)")
RE_STATUS = re.compile(r"Reply status: 1xx=(\d+) 2xx=(\d+) 3xx=(\d+) 4xx=(\d+) 5xx=(\d+)")
RE_ERRORS = re.compile(r"Errors: total (\d+) client-timo (\d+) socket-timo (\d+) connrefused (\d+) connreset (\d+)")
RE_CLIENT_ERRORS = re.compile(r"Errors: fd-unavail (\d+) addrunavail (\d+) ftab-full (\d+) other (\d+)")
RE_CONN_TIME = re.compile(
    r"Connection time \[ms\]: min ([\d.]+) avg ([\d.]+) max ([\d.]+) median ([\d.]+) stddev ([\d.]+)")
RE_REQUEST_RATE = re.compile(r"Request rate: ([\d.]+) req/s")
RE_SAMPLE = re.compile(r"^reply-rate = ([\d.]+)", re.MULTILINE)  # one per 5-s sample, with --verbose
RE_BURST = re.compile(r"Maximum connect burst length: (\d+)")  # connections opened in one pass of its loop
RE_CPU = re.compile(r"CPU time \[s\]: user ([\d.]+) system ([\d.]+) \(user ([\d.]+)% system ([\d.]+)% "
                    r"total ([\d.]+)%\)")

# The errors httperf counts: the server's doing, or the client's (its own limits).
SERVER_ERRORS = ("client_timo", "socket_timo", "connrefused", "connreset")
CLIENT_ERRORS = ("fd_unavail", "addrunavail", "ftab_full", "other")


class HttperfError(RuntimeError):
    """Unusable httperf output or run; the message says what is missing."""


def parse(text: str) -> dict:
    """httperf's summary as a dict; raise HttperfError naming the first line that is missing."""

    def need(regex: re.Pattern, what: str) -> re.Match:
        m = regex.search(text)
        if m is None:
            raise HttperfError(f"httperf output has no '{what}' line")
        return m

    total = need(RE_TOTAL, "Total: connections")
    rate = need(RE_REPLY_RATE, "Reply rate")
    status = need(RE_STATUS, "Reply status")
    errors = need(RE_ERRORS, "Errors: total")
    client = need(RE_CLIENT_ERRORS, "Errors: fd-unavail")
    out = {
        "connections": int(total[1]), "requests": int(total[2]), "replies": int(total[3]),
        "test_duration_s": float(total[4]),
        "reply_rate": {"min": float(rate[1]), "avg": float(rate[2]), "max": float(rate[3]),
                       "stddev": float(rate[4]), "samples": int(rate[5])},
        "status": {k: int(v) for k, v in zip(("1xx", "2xx", "3xx", "4xx", "5xx"), status.groups(), strict=True)},
        "errors": {"total": int(errors[1]), "client_timo": int(errors[2]), "socket_timo": int(errors[3]),
                   "connrefused": int(errors[4]), "connreset": int(errors[5]),
                   **{k: int(v) for k, v in zip(CLIENT_ERRORS, client.groups(), strict=True)}},
    }
    if m := RE_CONN_TIME.search(text):
        out["connection_ms"] = dict(zip(("min", "avg", "max", "median", "stddev"), map(float, m.groups()),
                                        strict=True))
    if m := RE_REQUEST_RATE.search(text):
        out["request_rate"] = float(m[1])
    if m := RE_CPU.search(text):
        out["client_cpu_pct"] = float(m[5])
    if m := RE_BURST.search(text):
        out["max_burst"] = int(m[1])
    samples = [float(x) for x in RE_SAMPLE.findall(text)]
    if samples:
        out["reply_rate"]["each"] = samples
    return out


def command(port: int, path: str, rate: float, step_s: float, timeout_s: float, nice: int = 19,
            wlog: Path | None = None, headers=()) -> list[str]:
    """httperf at ``rate`` new connections/s for ``step_s`` seconds, one request each, sampling
    the reply rate every 5 s (``--verbose``); ``wlog``: replay that request list instead of ``path``;
    ``headers``: (name, value) pairs sent with every request (a Host among them replaces httperf's)."""
    conns = max(1, round(rate * step_s))
    cmd = ["nice", "-n", str(nice)] if nice else []
    cmd += [shutil.which("httperf") or "httperf", "--verbose", "--hog", "--server", "127.0.0.1", "--port", str(port),
            "--rate", f"{rate:g}", "--num-conns", str(conns), "--num-calls", "1", "--timeout", f"{timeout_s:g}"]
    cmd += [f"--wlog=y,{wlog}"] if wlog else ["--uri", path]
    if headers:  # one string, each header ended by httperf's "\n" escape (a backslash is "\\")
        cmd += ["--add-header", "".join(f"{n}: {v}".replace("\\", "\\\\") + "\\n" for n, v in headers)]
        if any(n.lower() == "host" for n, _ in headers):
            cmd.append("--no-host-hdr")
    return cmd


def write_mix_wlog(dest: Path, mix, seed: int = 0, size: int = 10_000) -> Path:
    """The GET targets of ``mix`` as httperf's ``--wlog`` list (NUL-separated, replayed in a
    loop): each request about weight/total of ``size`` times (at least once), shuffled with
    ``seed``, so the requests httperf opens follow the mix's weights."""
    total = mix.total_weight
    targets = [r.target for r in mix.requests for _ in range(max(1, round(r.weight * size / total)))]
    random.Random(seed).shuffle(targets)
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_bytes(b"".join(t.encode("ascii") + b"\0" for t in targets))
    return dest


def run(cmd: list[str], limit_s: float, cgroup_files: tuple[str, ...] = ()) -> str:
    """Run httperf once (inside the cgroup whose ``cgroup.procs`` files are ``cgroup_files``, if
    any, joined before exec); its complete output (stdout + stderr) with the command line on top."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=child_setup(death_signal=signal.SIGKILL,  # ends with the benchmark
                                                   cgroup_files=cgroup_files))
    try:
        out, err = proc.communicate(timeout=limit_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise HttperfError(f"httperf did not finish within {limit_s:.0f} s") from None
    return f"$ {' '.join(cmd)}\n{out}{err}"


def version() -> str:
    try:
        out = subprocess.run(["httperf", "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    m = re.search(r"httperf-([\w.]+)", out.stdout + out.stderr)
    return m[1] if m else ""
