"""A request mix from an nginx access log: method, path and query, weighted by how often each
request appears.

Two formats are read, line by line (a ``.gz`` file is read through gzip):

- nginx's default ``combined``:
  ``$remote_addr - $remote_user [$time_local] "$request" $status $body_bytes_sent "$http_referer"
  "$http_user_agent"`` (anything after the status and size is ignored, so ``common`` and formats
  that append fields to ``combined`` are read too);
- this project's ``upstreams`` (templates/nginx.conf.j2):
  ``$remote_addr [$time_local] "$request" $status $request_time upstream=... upstream_time=...``.

nginx writes a ``"`` or ``\\`` inside a field as ``\\x22``/``\\x5C`` (Apache as ``\\"``); both are
read. Only GET and HEAD lines are used unless ``include_unsafe``, because replaying a POST can
change data (and the log has no bodies: such requests are sent without one). HEAD lines are sent
as GET (wrk 4.1 cannot read HEAD answers; the app runs the same view). Lines the log shows
answered 4xx/5xx are skipped: the pre-flight would stop on them. A target in absolute form
(``http://host/path``) is sent as its path; bytes nginx logged as ``\\xHH`` are percent-encoded.
The mix keeps the ``MAX_REQUESTS`` most frequent distinct requests. ``LogSummary.describe()``
says how many lines were used and skipped, and why.
"""

from __future__ import annotations

import gzip
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from uwsgi_layouts.bench.load.traffic import (
    MAX_REQUESTS,
    METHODS,
    SAFE_METHODS,
    Mix,
    Request,
    TrafficError,
    build_mix,
    check_target,
)

QUOTED = r'"((?:[^"\\]|\\.)*)"'
COMBINED_RE = re.compile(r'^\S+ \S+ \S+ \[[^\]]*\] ' + QUOTED + r' (\d{3}) (?:\d+|-)(?:\s|$)')
UPSTREAMS_RE = re.compile(r'^\S+ \[[^\]]*\] ' + QUOTED + r' (\d{3}) [\d.]+ upstream=')
FORMATS = (("combined", COMBINED_RE), ("upstreams", UPSTREAMS_RE))
ESCAPE_RE = re.compile(r"\\x([0-9A-Fa-f]{2})|\\(.)")
MAX_LINE = 64 * 1024
# Methods nginx logs that a client may legitimately send but that we cannot or must not replay.
KNOWN_METHODS = (*METHODS, "HEAD", "CONNECT", "TRACE")


ABSOLUTE_RE = re.compile(r"^https?://[^/?#]+(?=[/?]|$)", re.IGNORECASE)


def _unescape(text: str) -> str:
    return ESCAPE_RE.sub(lambda m: chr(int(m[1], 16)) if m[1] else m[2], text)


def _as_sent(target: str) -> str:
    """The target in origin form (``http://host/path`` -> ``/path``), bytes outside printable
    ASCII percent-encoded (nginx decodes both alike before routing)."""
    target = ABSOLUTE_RE.sub("", target, count=1) or "/"
    target = "/" + target if target.startswith("?") else target
    return "".join(c if "!" <= c <= "~" else "".join(f"%{b:02X}" for b in c.encode("latin-1", "replace"))
                   for c in target)


@dataclass(frozen=True)
class Line:
    """One parsed log line: the request as logged and the status the server answered."""

    method: str
    target: str
    status: int
    format: str


def parse_line(line: str) -> Line | None:
    """A log line in one of ``FORMATS`` -> Line, else None (unparsable)."""
    if len(line) > MAX_LINE:
        return None
    for name, regex in FORMATS:
        m = regex.match(line)
        if m:
            parts = _unescape(m[1]).split(" ")
            if len(parts) != 3 or not parts[2].startswith("HTTP/"):
                return None  # "-" (nothing was sent), binary garbage, a space in the target
            return Line(parts[0], _as_sent(parts[1]), int(m[2]), name)
    return None


@dataclass
class LogSummary:
    """What reading a log found: lines read, used, skipped by reason, and what the mix kept."""

    path: str
    lines: int = 0
    used: int = 0
    skipped: Counter = field(default_factory=Counter)
    formats: Counter = field(default_factory=Counter)
    head_as_get: int = 0
    unsafe_used: Counter = field(default_factory=Counter)
    distinct: int = 0
    kept: int = 0
    kept_lines: int = 0

    def describe(self) -> str:
        """``used 9,812 of 10,000 lines; skipped 150 POST (use --include-unsafe), 38 unparsable``."""
        text = f"{self.path}: used {self.used:,} of {self.lines:,} lines"
        if self.skipped:
            text += "; skipped " + ", ".join(f"{n:,} {reason}" for reason, n in self.skipped.most_common())
        notes = []
        if self.head_as_get:
            notes.append(f"{self.head_as_get:,} HEAD sent as GET (wrk 4.1 cannot read HEAD answers)")
        if self.unsafe_used:
            methods = ", ".join(f"{n:,} {m}" for m, n in self.unsafe_used.most_common())
            notes.append(f"{methods} replayed without a body (the log has none)")
        if self.kept < self.distinct:
            share = self.kept_lines / self.used if self.used else 0.0
            notes.append(f"kept the {self.kept:,} most frequent of {self.distinct:,} distinct requests "
                         f"({share:.0%} of the used lines)")
        return text + ("; " + "; ".join(notes) if notes else "")


def _open(path: Path):
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="latin-1", newline="")
    return open(path, encoding="latin-1", newline="")


def read_access_log(path: Path | str, include_unsafe: bool = False, headers=(),
                    max_requests: int = MAX_REQUESTS) -> tuple[Mix, LogSummary]:
    """The mix an access log describes, and what was used and skipped. Raises TrafficError when
    the file cannot be read or no line is usable (naming the reasons)."""
    path = Path(path)
    summary = LogSummary(str(path))
    counts: Counter = Counter()
    try:
        with _open(path) as fh:
            for raw in fh:
                line = raw.rstrip("\r\n")
                if not line.strip():
                    continue
                summary.lines += 1
                reason, key = _classify(line, include_unsafe, summary)
                if reason:
                    summary.skipped[reason] += 1
                else:
                    summary.used += 1
                    counts[key] += 1
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise TrafficError("access_log", f"cannot read {path} ({getattr(exc, 'strerror', None) or exc})") from None
    if not counts:
        why = ", ".join(f"{n:,} {reason}" for reason, n in summary.skipped.most_common()) or "the file is empty"
        raise TrafficError("access_log", f"no usable line in {path} ({summary.lines:,} lines: {why}); expected "
                                         "nginx's combined format or this project's upstreams format")
    summary.distinct = len(counts)
    top = counts.most_common(max_requests)
    summary.kept = len(top)
    summary.kept_lines = sum(n for _, n in top)
    requests = [Request(method, target, n) for (method, target), n in top]
    return build_mix(requests, headers, source=f"access log {summary.describe()}"), summary


def _classify(line: str, include_unsafe: bool, summary: LogSummary) -> tuple[str, tuple[str, str] | None]:
    """(reason the line is skipped, "") or ("", (method, target)) for a used line."""
    parsed = parse_line(line)
    if parsed is None:
        return "unparsable", None
    summary.formats[parsed.format] += 1
    method = parsed.method
    if method not in KNOWN_METHODS:
        return f"with method {method[:20]!r}" if method.isalpha() and method.isupper() else "unparsable", None
    if parsed.status >= 400:
        return "answered 4xx/5xx in the log", None
    try:
        target = check_target(parsed.target, "access_log")
    except TrafficError:
        return "with a target that is not a path", None
    if method in ("CONNECT", "TRACE"):
        return f"{method} (never replayed)", None
    if method not in SAFE_METHODS:
        if not include_unsafe:
            return f"{method} (use --include-unsafe)", None
        summary.unsafe_used[method] += 1
    if method == "HEAD":
        summary.head_as_get += 1
        method = "GET"
    return "", (method, target)
