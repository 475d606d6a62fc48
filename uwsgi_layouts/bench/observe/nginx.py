"""nginx's side: how its workers share the clients, its error and access logs, and an access log
read from its end while a window runs (LogTail, parse_timed_line)."""

from __future__ import annotations

import os
import re
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, NamedTuple

import psutil

if TYPE_CHECKING:  # annotations only: watch reads nginx's logs without loading the stack machinery
    from uwsgi_layouts.deploy.run import Stack

# --------------------------------------------------------------------------- nginx's workers


def nginx_workers(master_pid: int) -> list[psutil.Process]:
    """The nginx master's worker processes (its children)."""
    try:
        return psutil.Process(master_pid).children()
    except psutil.Error:
        return []


def client_connections(proc: psutil.Process, port: int) -> int:
    """Established TCP connections ``proc`` holds on local ``port`` (accepted clients)."""
    try:
        return sum(1 for c in proc.net_connections(kind="tcp")
                   if c.status == psutil.CONN_ESTABLISHED and c.laddr and c.laddr.port == port)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return 0


def busiest_connections(workers: list[psutil.Process], port: int, running: Callable[[], bool], deadline: float,
                        interval: float = 0.25) -> list[int]:
    """While ``running()`` (and before the monotonic ``deadline``), count each nginx worker's
    client connections every ``interval`` s; keep the sample with the most connections in total
    (wrk opens its connections once)."""
    best: list[int] = [0] * len(workers)
    while running() and time.monotonic() < deadline:
        sample = [client_connections(w, port) for w in workers]
        if sum(sample) > sum(best):
            best = sample
        time.sleep(interval)  # sampling interval while the load runs, not a readiness wait
    return best


def spread_extra(conns: list[int], cpu: list[float]) -> dict:
    """Per-nginx-worker figures for a cell's ``extra``: connections (the busiest sample) and
    CPU seconds, each sorted high to low, and the busiest worker's share of each."""
    conns, cpu = sorted(conns, reverse=True), sorted((round(c, 4) for c in cpu), reverse=True)
    return {
        "nginx_workers": len(conns),
        "nginx_worker_conns": conns,
        "nginx_worker_cpu_s": cpu,
        "nginx_conn_max_share": conns[0] / sum(conns) if conns and sum(conns) else 0.0,
        "nginx_cpu_max_share": cpu[0] / sum(cpu) if cpu and sum(cpu) else 0.0,
    }


# --------------------------------------------------------------------------- nginx's logs


def nginx_log_lines(stack: Stack, since: int = 0) -> list[str]:
    try:
        data = stack.nginx_log.read_bytes()[since:]
    except OSError:
        return []
    return data.decode("utf-8", "replace").splitlines()


def error_kinds(lines: list[str]) -> Counter:
    """nginx error log lines grouped by their message (pids, times and addresses removed)."""
    kinds = Counter()
    for line in lines:
        m = re.search(r"\[(error|warn|crit|alert|emerg)\] \d+#\d+: \*?\d* ?(.*?)(, client:|$)", line)
        if m:
            text = re.sub(r"unix:/\S+|127\.0\.0\.1:\d+", "ADDR", m[2])
            kinds[f"[{m[1]}] {text}"] += 1
    return kinds


ACCESS_RE = re.compile(r'"(?P<method>[A-Z]+) (?P<uri>\S+)[^"]*" (?P<status>\d{3}) (?P<seconds>[\d.]+) '
                       r'upstream=(?P<upstreams>.*?) upstream_time=')


@dataclass(frozen=True)
class Access:
    method: str
    uri: str
    status: int
    seconds: float
    upstreams: tuple[str, ...]  # more than one: nginx retried the request on another server


def access_log(stack: Stack) -> list[Access]:
    """nginx's access log (rendered with ``access_log``): each request with the upstream(s) it went to."""
    try:
        text = (stack.run_dir / "logs" / "access.log").read_text(errors="replace")
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        m = ACCESS_RE.search(line)
        if m:
            ups = tuple(u.strip() for u in re.split(r"[,:]\s(?=\S)", m["upstreams"]) if u.strip())
            out.append(Access(m["method"], m["uri"], int(m["status"]), float(m["seconds"]), ups))
    return out


# --------------------------------------------------------------------------- an access log over a window

LOG_LIMIT_BYTES = 256 * 1024 * 1024  # read at most this much of what a window appended


class LogTail:
    """An nginx access log read from its end: opening it notes where the file ends now, ``read``
    returns the complete lines appended since. Follows a rotation (the file renamed and a new one
    made: the rest of the old file, then the new one from its start) and a truncation
    (copytruncate: from the start). Reads at most ``limit`` bytes (``cut`` says so). Raises
    OSError when the file cannot be opened."""

    def __init__(self, path: Path | str, limit: int = LOG_LIMIT_BYTES):
        self.path = Path(path)
        self.limit = limit
        self.cut = False
        self._fh = open(self.path, "rb")  # noqa: SIM115 (kept open for the window; closed by close())
        self._fh.seek(0, os.SEEK_END)
        self._inode = os.fstat(self._fh.fileno()).st_ino
        self._partial = b""  # a last line still being written: completed by the next read

    def read(self) -> list[str]:
        data = self._drain(self._fh)
        try:
            rotated = os.stat(self.path).st_ino != self._inode
        except OSError:
            rotated = False
        if rotated:
            with open(self.path, "rb") as new:
                data += self._drain(new, len(data))
        *lines, self._partial = (self._partial + data).split(b"\n")
        return [line.decode("utf-8", "replace") for line in lines]

    def _drain(self, fh, already: int = 0) -> bytes:
        if os.fstat(fh.fileno()).st_size < fh.tell():  # truncated in place
            fh.seek(0)
        budget = self.limit - already
        data = fh.read(budget + 1) if budget > 0 else b""
        if len(data) > budget:
            self.cut, data = True, data[:budget]
        return data

    def close(self) -> None:
        self._fh.close()


def log_size(path: Path) -> int:
    """The access log's size in bytes (0 when it cannot be read): where a window's lines begin."""
    try:
        return path.stat().st_size
    except OSError:
        return 0


def logged_requests(path: Path, offset: int) -> list[TimedLine]:
    """Every request nginx logged after ``offset`` bytes of its access log (``path``) that carries
    its $request_time."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return []
    return [timed for timed in map(parse_timed_line, text.splitlines())
            if timed is not None and timed.request_s is not None]


class TimedLine(NamedTuple):
    """What an access log line says of one request: its status, how long nginx took
    ($request_time), and each upstream attempt's address and time ($upstream_addr and
    $upstream_response_time; None where nginx logged "-")."""

    status: int
    request_s: float | None
    upstreams: tuple[str, ...]
    upstream_s: tuple[float | None, ...]
    format: str  # "upstreams" (this project's lab format), "combined", "combined+times"


_QUOTED = r'"(?:[^"\\]|\\.)*"'
COMBINED_TIMED_RE = re.compile(r'^\S+ \S+ \S+ \[[^\]]*\] ' + _QUOTED + r' (\d{3}) (?:\d+|-)(?: ' + _QUOTED + " "
                               + _QUOTED + r')?(.*)$')
UPSTREAMS_TIMED_RE = re.compile(r'^\S+ \[[^\]]*\] ' + _QUOTED + r' (\d{3}) ([\d.]+) upstream=(.*?) upstream_time=(.*)$')
_TIME_LIST = re.compile(r"^(?:\d+(?:\.\d+)?|-)(?:,(?:\d+(?:\.\d+)?|-))*$")
_ADDRESS = r"(?:unix:\S+?|\[[0-9a-fA-F:.]+\]:\d+|[\w.-]+:\d+|-)"
_ADDRESS_LIST = re.compile(rf"^{_ADDRESS}(?:,{_ADDRESS})*$")
_FIELD = re.compile(r'(?:(\w+)=)?("[^"]*"|\S+)')
# Names a log_format may give these fields (nginx's own examples use rt=, urt=, ua=).
REQUEST_TIME_KEYS = ("rt", "request_time")
UPSTREAM_TIME_KEYS = ("urt", "upstream_response_time", "upstream_time")
UPSTREAM_ADDR_KEYS = ("ua", "upstream_addr", "upstream")


def _times(text: str) -> tuple[float | None, ...]:
    return tuple(None if x == "-" else float(x) for x in text.split(","))


def _as_list(text: str) -> str:
    """nginx separates attempts with ", " and internal redirects with " : "; one comma each here."""
    return re.sub(r"\s*,\s*|\s+:\s+", ",", text.strip())


def parse_timed_line(line: str) -> TimedLine | None:
    """A line of this project's ``upstreams`` format, or of nginx's ``combined`` with fields
    appended: ``key=value`` (``rt``/``request_time``, ``urt``/``upstream_response_time``/
    ``upstream_time``, ``ua``/``upstream_addr``/``upstream``; values may be quoted) or bare
    (``$upstream_addr $upstream_response_time``; with two bare times the first is $request_time).
    None for a line in neither format."""
    m = UPSTREAMS_TIMED_RE.match(line)
    if m:
        addrs = _as_list(m[3])
        times = _as_list(m[4])
        return TimedLine(int(m[1]), float(m[2]), tuple(addrs.split(",")) if _ADDRESS_LIST.match(addrs) else (),
                         _times(times) if _TIME_LIST.match(times) else (), "upstreams")
    m = COMBINED_TIMED_RE.match(line)
    if not m:
        return None
    request_s, upstream_s, addrs, bare = None, (), (), []
    for key, raw in _FIELD.findall(_as_list(m[2])):
        value = raw.strip('"')
        if key in REQUEST_TIME_KEYS and _TIME_LIST.match(value):
            request_s = _times(value)[0]
        elif key in UPSTREAM_TIME_KEYS and _TIME_LIST.match(value):
            upstream_s = _times(value)
        elif key in UPSTREAM_ADDR_KEYS and _ADDRESS_LIST.match(value):
            addrs = tuple(value.split(","))
        elif not key and _TIME_LIST.match(value) and value != "-":
            bare.append(_times(value))
        elif not key and _ADDRESS_LIST.match(value) and value != "-":
            addrs = tuple(value.split(","))
    if bare and not upstream_s:
        upstream_s = bare[-1]
        if len(bare) > 1 and request_s is None:
            request_s = bare[0][0]
    timed = request_s is not None or bool(upstream_s)
    return TimedLine(int(m[1]), request_s, addrs, upstream_s, "combined+times" if timed else "combined")
