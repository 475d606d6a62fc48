"""The user's traffic: a weighted mix of requests, validated on creation, and the wrk script that
sends it.

    --request '3*GET /api/items'          a request line: [WEIGHT*]METHOD TARGET [@BODY_FILE]
    --request 'POST /api/items @item.json'
    --requests FILE                       the same, one per line; '#' starts a comment
    --header 'Authorization: Bearer ...'  sent with every request of the mix

``parse_request_line``, ``read_requests_file`` and ``parse_header`` turn those into ``Request``
objects and header pairs; ``build_mix`` merges them into a ``Mix`` (the same request given twice
adds its weights). ``bench.load.accesslog`` builds a ``Mix`` from an nginx access log.
``mix_lua(mix)`` is the wrk script: every request pre-formatted once, each next request drawn at
random by weight from a generator seeded with the script's argument (the repeat number), so a
repeat replays the same sequence on every layout. ``write_mix_script`` appends the JSON
``done()`` hook (``bench.load.wrk.write_script``). ``send_once`` sends one request of the mix
(the pre-flight, before anything is timed).

Pure logic except ``send_once`` and the file reads; every error is a ``TrafficError`` with one
line naming the field (exit 2 in the CLI).
"""

from __future__ import annotations

import hashlib
import http.client
import os
import re
from dataclasses import dataclass
from pathlib import Path

from uwsgi_layouts.bench.load.wrk import write_script

# Methods a request line may use. HEAD is not among them: wrk 4.1 does not tell its HTTP
# parser that a HEAD answer has no body, so it waits for Content-Length bytes that never come
# (measured: 0 requests completed in 2 s). Access-log HEAD lines are sent as GET (accesslog.py).
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
BODY_METHODS = ("POST", "PUT", "PATCH", "DELETE")
SAFE_METHODS = ("GET", "HEAD")  # replaying anything else can change the app's data
MAX_WEIGHT = 1_000_000_000
MAX_TOTAL_WEIGHT = 2**31 - 1  # math.random(total) in wrk's LuaJIT stays exact far beyond this
MAX_REQUESTS = 1000  # distinct requests in a mix: each is pre-flighted once and held in wrk's Lua
# nginx reads a request line and headers into 8 KB buffers (large_client_header_buffers 4 8k)
# and refuses bodies over 1 MB (client_max_body_size 1m) by default.
MAX_TARGET = 8000
MAX_HEADER_BYTES = 8000
MAX_HEADERS = 50
MAX_BODY = 1024 * 1024
MAX_BODIES = 4 * MAX_BODY  # bodies are written into the generated wrk script
# Sent by wrk itself (from the body), so a user's value could only contradict it.
MANAGED_HEADERS = ("content-length", "transfer-encoding")
SENSITIVE_HEADERS = ("authorization", "cookie", "proxy-authorization")

TOKEN_RE = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # RFC 9110 token: a header name
WEIGHT_RE = re.compile(r"^(?P<weight>[^*\s]+)\*(?P<rest>.*)$")
BAD_ESCAPE_RE = re.compile(r"%(?![0-9A-Fa-f]{2})")
REQUEST_SYNTAX = "[WEIGHT*]METHOD PATH [@BODY_FILE], e.g. 'GET /', '3*GET /api/items?page=2' or " \
                 "'POST /api/items @item.json'"


class TrafficError(ValueError):
    """Bad traffic input; the message starts with the field (request, header, requests,
    access_log) and says what is allowed."""

    def __init__(self, field: str, problem: str):
        self.field = field
        super().__init__(f"{field}: {problem}")


def _shown(text: str, limit: int = 80) -> str:
    """``text`` as a one-line quoted value (control characters escaped), shortened."""
    text = text if len(text) <= limit else text[: limit - 3] + "..."
    return repr(text)


def check_target(target: str, field: str = "request") -> str:
    """A request target nginx takes as it is: an origin-form path (and query), printable ASCII
    without spaces or '#', every '%' starting an escape, at most MAX_TARGET bytes."""
    if not target.startswith("/"):
        raise TrafficError(field, f"path {_shown(target)} must start with '/' (e.g. /api/items?page=2)")
    if len(target) > MAX_TARGET:
        raise TrafficError(field, f"path of {len(target)} characters is longer than nginx's request line buffer "
                                  f"allows (at most {MAX_TARGET})")
    bad = next((c for c in target if not ("!" <= c <= "~") or c == "#"), None)
    if bad is not None:
        what = "'#' (a fragment is never sent to the server)" if bad == "#" else \
            f"{bad!r}: percent-encode it (e.g. %20 for a space, UTF-8 bytes as %C3%A9)"
        raise TrafficError(field, f"path {_shown(target)} contains {what}")
    if BAD_ESCAPE_RE.search(target):
        raise TrafficError(field, f"path {_shown(target)} has a '%' not followed by two hex digits: write '%25' "
                                  "for a literal '%'")
    return target


@dataclass(frozen=True)
class Request:
    """One request of a mix. ``target`` is the path and query as sent; ``body`` the bytes sent
    (None: no body); ``body_file`` where they came from (recorded, "" = none)."""

    method: str
    target: str
    weight: int = 1
    body: bytes | None = None
    body_file: str = ""

    def __post_init__(self):
        if self.method not in METHODS:
            raise TrafficError("request", f"method {_shown(self.method)} is not one of {', '.join(METHODS)}")
        check_target(self.target)
        if isinstance(self.weight, bool) or not isinstance(self.weight, int) or not 1 <= self.weight <= MAX_WEIGHT:
            raise TrafficError("request", f"weight must be an integer in 1..{MAX_WEIGHT}, got {self.weight!r}")
        if self.body is not None:
            if not isinstance(self.body, bytes):
                raise TrafficError("request", "body must be bytes")
            if self.method not in BODY_METHODS:
                raise TrafficError("request", f"{self.method} takes no body (bodies go with "
                                              f"{', '.join(BODY_METHODS)})")
            if len(self.body) > MAX_BODY:
                raise TrafficError("request", f"body of {len(self.body)} bytes is over {MAX_BODY} (nginx's default "
                                              "client_max_body_size 1m would answer 413)")

    @property
    def key(self) -> tuple:
        """What makes two requests the same request (their weights add up)."""
        return (self.method, self.target, self.body)

    @property
    def label(self) -> str:
        """``POST /api/items @item.json (312 bytes)``: how messages and reports name it."""
        text = f"{self.method} {self.target}"
        if self.body is not None and self.body_file:
            text += f" @{self.body_file} ({len(self.body)} bytes)"
        elif self.body is not None:
            text += f" ({len(self.body)}-byte body)"
        return text

    def to_dict(self, total_weight: int) -> dict:
        data = {"method": self.method, "target": self.target, "weight": self.weight,
                "share": self.weight / total_weight if total_weight else 0.0}
        if self.body is not None:
            data.update({"body_bytes": len(self.body), "body_sha256": hashlib.sha256(self.body).hexdigest()})
            if self.body_file:
                data["body_file"] = self.body_file
        return data


@dataclass(frozen=True)
class Mix:
    """The requests a load sends, each drawn with probability weight / total weight, and the
    headers every request carries. ``source`` says where the mix came from (for the record)."""

    requests: tuple[Request, ...]
    headers: tuple[tuple[str, str], ...] = ()
    source: str = ""

    def __post_init__(self):
        object.__setattr__(self, "requests", tuple(self.requests))
        object.__setattr__(self, "headers", tuple(tuple(h) for h in self.headers))
        if not self.requests:
            raise TrafficError("request", "the mix has no request: give at least one " + REQUEST_SYNTAX)
        if len(self.requests) > MAX_REQUESTS:
            raise TrafficError("request", f"{len(self.requests)} distinct requests; at most {MAX_REQUESTS} (each is "
                                          "sent once in the pre-flight and held in wrk's memory)")
        if not all(isinstance(r, Request) for r in self.requests):
            raise TrafficError("request", "every request of a mix must be a Request")
        keys = [r.key for r in self.requests]
        if len(set(keys)) != len(keys):
            raise TrafficError("request", "a request appears twice in the mix: merge them with build_mix")
        if self.total_weight > MAX_TOTAL_WEIGHT:
            raise TrafficError("request", f"weights add up to {self.total_weight}; at most {MAX_TOTAL_WEIGHT}")
        body_bytes = sum(len(r.body or b"") for r in self.requests)
        if body_bytes > MAX_BODIES:
            raise TrafficError("request", f"bodies add up to {body_bytes} bytes; at most {MAX_BODIES} in one mix")
        check_headers(self.headers)

    @property
    def total_weight(self) -> int:
        return sum(r.weight for r in self.requests)

    def share(self, request: Request) -> float:
        return request.weight / self.total_weight

    @property
    def unsafe(self) -> list[Request]:
        """Requests whose replay may change the app's data (anything but GET/HEAD)."""
        return [r for r in self.requests if r.method not in SAFE_METHODS]

    def summary(self, limit: int = 3) -> str:
        """``3 requests: GET / 33%, GET /api/items 67%``, the heaviest first."""
        heavy = sorted(self.requests, key=lambda r: -r.weight)
        shown = ", ".join(f"{r.label} {self.share(r):.0%}" for r in heavy[:limit])
        more = f", and {len(heavy) - limit} more" if len(heavy) > limit else ""
        n = len(self.requests)
        return f"{n} request{'s' if n != 1 else ''}: {shown}{more}"

    def to_dict(self) -> dict:
        """The mix as results.json records it. Bodies are recorded by size and SHA-256; values
        of credential headers (Authorization, Cookie) are not written."""
        total = self.total_weight
        return {
            "source": self.source,
            "requests": [r.to_dict(total) for r in self.requests],
            "total_weight": total,
            "headers": [[name, redact(name, value)] for name, value in self.headers],
        }


def redact(name: str, value: str) -> str:
    """A header value as results and reports show it: credentials replaced by their length."""
    return f"<{len(value)} characters, not recorded>" if name.lower() in SENSITIVE_HEADERS else value


def redact_argv(argv: list[str]) -> list[str]:
    """A command line as results record it: the values of credential ``--header`` options
    (Authorization, Cookie) replaced, so a results file can be shared."""
    out, header_next = [], False
    for arg in argv:
        prefix = ""
        if header_next:
            text = arg
        elif arg.startswith("--header="):
            prefix, text = "--header=", arg[len("--header="):]
        else:
            out.append(arg)
            header_next = arg == "--header"
            continue
        name, sep, value = text.partition(":")
        if sep and name.strip().lower() in SENSITIVE_HEADERS:
            text = f"{name}: {redact(name.strip(), value.strip())}"
        out.append(prefix + text)
        header_next = False
    return out


# --------------------------------------------------------------------------- parsing


def _read_body(spec: str, base_dir: Path, field: str) -> tuple[bytes, str]:
    name = spec[1:]
    if not name:
        raise TrafficError(field, "'@' must be followed by a body file, e.g. @item.json")
    path = Path(os.path.expanduser(name))
    path = path if path.is_absolute() else base_dir / path
    try:
        size = path.stat().st_size
        if not path.is_file():
            raise TrafficError(field, f"body file {path} is not a regular file")
    except OSError as exc:
        raise TrafficError(field, f"body file {path} cannot be read ({exc.strerror or exc}); relative names are "
                                  f"read from {base_dir}") from None
    if size > MAX_BODY:
        raise TrafficError(field, f"body file {path} has {size} bytes; at most {MAX_BODY} (nginx's default "
                                  "client_max_body_size 1m would answer 413)")
    try:
        return path.read_bytes(), name
    except OSError as exc:
        raise TrafficError(field, f"body file {path} cannot be read ({exc.strerror or exc})") from None


def parse_request_line(text: str, base_dir: Path | str | None = None, field: str = "request") -> Request:
    """``[WEIGHT*]METHOD TARGET [@BODY_FILE]`` -> Request. Body files are read relative to
    ``base_dir`` (default: the current directory)."""
    base = Path(base_dir) if base_dir is not None else Path.cwd()
    line = str(text)
    bad = next((c for c in line if c in "\r\n\x00"), None)
    if bad is not None:
        raise TrafficError(field, f"{_shown(line)} contains {bad!r}: one request per line")
    line = line.strip()
    weight = 1
    match = WEIGHT_RE.match(line)
    if match:
        raw = match["weight"]
        if not raw.isdigit() or not 1 <= int(raw) <= MAX_WEIGHT:
            raise TrafficError(field, f"weight {_shown(raw)} in {_shown(line)} must be an integer in 1..{MAX_WEIGHT}")
        weight, line = int(raw), match["rest"].strip()
    parts = line.split()
    if len(parts) not in (2, 3) or (len(parts) == 3 and not parts[2].startswith("@")):
        raise TrafficError(field, f"{_shown(str(text).strip())} is not a request line: expected {REQUEST_SYNTAX}")
    method, target = parts[0], parts[1]
    if method == "HEAD":
        raise TrafficError(field, "HEAD cannot be measured with wrk 4.1 (it waits for a body a HEAD answer never "
                                  "has): use GET, which runs the same view")
    if method not in METHODS:
        hint = f" (methods are upper case: {method.upper()})" if method.upper() in METHODS else ""
        raise TrafficError(field, f"method {_shown(method)} is not one of {', '.join(METHODS)}{hint}")
    check_target(target, field)
    body, body_file = None, ""
    if len(parts) == 3:
        if method not in BODY_METHODS:
            raise TrafficError(field, f"{method} takes no body; bodies go with {', '.join(BODY_METHODS)}")
        body, body_file = _read_body(parts[2], base, field)
    return Request(method, target, weight, body, body_file)


def read_requests_file(path: Path | str) -> list[Request]:
    """A file of request lines (``#`` starts a comment, blank lines are skipped); body files are
    read relative to the file's own directory."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        why = getattr(exc, "strerror", None) or exc
        raise TrafficError("requests", f"cannot read {path} ({why})") from None
    out = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()  # '#' cannot be part of a request target
        if line:
            out.append(parse_request_line(line, path.resolve().parent, field=f"requests: {path}:{number}"))
    if not out:
        raise TrafficError("requests", f"{path} holds no request line (expected {REQUEST_SYNTAX}, one per line)")
    return out


def parse_header(text: str) -> tuple[str, str]:
    """``Name: value`` -> (name, value), value stripped. The name is an HTTP token; the value one
    line of printable ASCII (no CR or LF, which would end the header and inject another)."""
    raw = str(text)
    name, sep, value = raw.partition(":")
    if not sep:
        raise TrafficError("header", f"{_shown(raw)} has no ':': expected 'Name: value', e.g. 'Host: shop.example'")
    name, value = name.strip(), value.strip(" \t")
    if not name or not TOKEN_RE.match(name):
        raise TrafficError("header", f"name {_shown(name)} must be letters, digits and !#$%&'*+-.^_`|~ "
                                     "(no spaces), e.g. X-Api-Key")
    bad = next((c for c in value if c in "\r\n"), None)
    if bad is not None:
        raise TrafficError("header", f"value of {name} contains {bad!r}: a line break would end the header and "
                                     "start another")
    bad = next((c for c in value if not (" " <= c <= "~" or c == "\t")), None)
    if bad is not None:
        raise TrafficError("header", f"value of {name} contains {bad!r}: use printable ASCII (percent- or "
                                     "base64-encode other bytes)")
    if name.lower() in MANAGED_HEADERS:
        raise TrafficError("header", f"{name} is set by wrk from each request's body; leave it out")
    return name, value


def check_headers(headers) -> tuple[tuple[str, str], ...]:
    seen: dict[str, str] = {}
    for name, value in headers:
        parse_header(f"{name}: {value}")
        lower = name.lower()
        if lower in seen:
            join = "'; '" if lower == "cookie" else "', '"
            raise TrafficError("header", f"{name} is given twice: give it once, with the values joined by {join}")
        seen[lower] = name
    if len(seen) > MAX_HEADERS:
        raise TrafficError("header", f"{len(seen)} headers; at most {MAX_HEADERS}")
    size = sum(len(n) + len(v) + 4 for n, v in headers)
    if size > MAX_HEADER_BYTES:
        raise TrafficError("header", f"headers add up to {size} bytes; nginx's buffers take at most {MAX_HEADER_BYTES}")
    return tuple(headers)


def build_mix(requests, headers=(), source: str = "") -> Mix:
    """A Mix of ``requests`` in the order first given; the same request (method, target, body)
    given again adds its weight."""
    merged: dict[tuple, Request] = {}
    for r in requests:
        prev = merged.get(r.key)
        merged[r.key] = r if prev is None else Request(r.method, r.target, prev.weight + r.weight, r.body,
                                                       prev.body_file or r.body_file)
    return Mix(tuple(merged.values()), tuple(headers), source)


# --------------------------------------------------------------------------- the wrk script


def lua_string(data: bytes | str) -> str:
    """A Lua string literal holding exactly ``data``: printable ASCII as is, every other byte
    (and the quote and the backslash) as a decimal escape."""
    raw = data.encode() if isinstance(data, str) else data
    out = []
    for byte in raw:
        char = chr(byte)
        out.append(char if " " <= char <= "~" and char not in '"\\' else f"\\{byte:03d}")
    return '"' + "".join(out) + '"'


def mix_lua(mix: Mix) -> str:
    """The wrk script that sends ``mix`` (without the done() hook: ``write_mix_script`` adds it).

    Run as ``wrk ... -s SCRIPT URL -- SEED``: each wrk thread seeds LuaJIT's generator with
    SEED * 1000 + its thread number, so the same SEED replays the same sequence of requests.
    """
    rows = []
    for r in mix.requests:
        body = lua_string(r.body) if r.body is not None else ("\"\"" if r.method in BODY_METHODS else "nil")
        rows.append(f"  {{{lua_string(r.method)}, {lua_string(r.target)}, {body}}},  -- weight {r.weight}")
    cumulative, running = [], 0
    for r in mix.requests:
        running += r.weight
        cumulative.append(str(running))
    headers = "".join(f"  [{lua_string(n)}] = {lua_string(v)},\n" for n, v in mix.headers)
    return (
        "-- wrk script generated by bench.load.traffic (the user's request mix): do not edit.\n"
        f"-- {mix.summary()}\n"
        "-- usage: wrk ... -s THIS_SCRIPT URL -- SEED\n"
        "local mix_requests = {  -- method, target, body (a body-taking method without one sends Content-Length: 0)\n"
        + "\n".join(rows) + "\n}\n"
        f"local mix_cumulative = {{{', '.join(cumulative)}}}\n"
        f"local mix_total = {running}\n"
        "local mix_headers = {\n" + headers + "}\n"
        "local mix_formatted = {}\n"
        "local mix_threads = 0\n"
        "\n"
        "-- Runs in the main Lua state once per thread, before that thread's init().\n"
        "function setup(thread)\n"
        "  mix_threads = mix_threads + 1\n"
        "  thread:set(\"mix_thread_no\", mix_threads)\n"
        "end\n"
        "\n"
        "function init(args)\n"
        "  local seed = tonumber(args[1] or \"1\")\n"
        "  if seed == nil then error(\"traffic script: SEED must be a number, got \" .. tostring(args[1])) end\n"
        "  for i, r in ipairs(mix_requests) do\n"
        "    local headers = {}  -- wrk.format writes Host and Content-Length into the table it is given\n"
        "    for name, value in pairs(mix_headers) do headers[name] = value end\n"
        "    mix_formatted[i] = wrk.format(r[1], r[2], headers, r[3])\n"
        "  end\n"
        "  math.randomseed(seed * 1000 + (mix_thread_no or 0))\n"
        "end\n"
        "\n"
        "function request()\n"
        "  local x = math.random(mix_total)\n"
        "  local lo, hi = 1, #mix_cumulative  -- the first request whose cumulative weight reaches x\n"
        "  while lo < hi do\n"
        "    local mid = math.floor((lo + hi) / 2)\n"
        "    if mix_cumulative[mid] < x then lo = mid + 1 else hi = mid end\n"
        "  end\n"
        "  return mix_formatted[lo]\n"
        "end\n\n"
    )


def write_mix_script(path: Path, mix: Mix) -> Path:
    """``mix_lua(mix)`` plus the JSON done() hook, at ``path``, readable by its owner only
    (header values may be credentials). wrk runs it as ``-s PATH URL -- SEED``."""
    return write_script(path, mix_lua(mix), mode=0o600)


# --------------------------------------------------------------------------- the pre-flight


@dataclass(frozen=True)
class Answer:
    status: int
    reason: str
    body: bytes


def send_once(host: str, port: int, request: Request, headers=(), timeout: float = 10.0) -> Answer:
    """Send ``request`` once (with the mix's ``headers``) and read the whole answer. Raises
    OSError (connection refused or reset, timeout) and http.client.HTTPException."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        body = request.body if request.body is not None else (b"" if request.method in BODY_METHODS else None)
        conn.request(request.method, request.target, body=body, headers=dict(headers))
        resp = conn.getresponse()
        return Answer(resp.status, resp.reason, resp.read())
    finally:
        conn.close()


@dataclass(frozen=True)
class Failure:
    """A request of the mix that failed in the pre-flight, and how (``404 Not Found: 'body...'``,
    ``no answer within 10 s``, ``ConnectionResetError``)."""

    request: Request
    answer: str
    answered: bool  # an HTTP answer (4xx/5xx); False: none at all


MAX_LISTED = 20  # failures named in the one line
MAX_UNANSWERED = 20  # requests without any answer before the pre-flight gives up (each may take the timeout)


def check_requests(host: str, port: int, mix: Mix, timeout: float = 10.0) -> tuple[dict[str, int], list[Failure]]:
    """Send each distinct request of ``mix`` once: (label -> status of those answered below 400,
    the failures: a 4xx/5xx or no answer). Stops early after MAX_UNANSWERED requests without any
    answer (the stack, not a path, is the problem then)."""
    statuses: dict[str, int] = {}
    failures: list[Failure] = []
    for r in mix.requests:
        try:
            answer = send_once(host, port, r, mix.headers, timeout)
        except TimeoutError:
            failures.append(Failure(r, f"no answer within {timeout:g} s", False))
        except (OSError, http.client.HTTPException) as exc:
            failures.append(Failure(r, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__, False))
        else:
            if answer.status < 400:
                statuses[r.label] = answer.status
                continue
            text = " ".join(re.sub(r"<[^>]*>", " ", answer.body[:400].decode("utf-8", "replace")).split())
            failures.append(Failure(r, f"{answer.status} {answer.reason}" + (f": {text[:40]!r}" if text else ""),
                                    True))
        if sum(not f.answered for f in failures) >= MAX_UNANSWERED:
            break
    return statuses, failures


def failures_line(failures: list[Failure], mix: Mix, place: str = "", limit: int = MAX_LISTED) -> str:
    """One line naming every failing request (the first ``limit``) and its answer."""
    shown = "; ".join(f"{f.request.label} -> {f.answer}" for f in failures[:limit])
    more = f"; and {len(failures) - limit} more" if len(failures) > limit else ""
    stopped = " (stopped: too many requests got no answer)" if sum(not f.answered for f in failures) >= \
        MAX_UNANSWERED else ""
    return (f"{len(failures)} of {len(mix.requests)} distinct requests failed in the pre-flight{place}{stopped}: "
            f"{shown}{more}")


def without(mix: Mix, failures: list[Failure]) -> Mix:
    """``mix`` without the failing requests; its source says how many were dropped and their
    share of the weight (what results.json and the report show)."""
    dropped = {f.request.key for f in failures}
    kept = tuple(r for r in mix.requests if r.key not in dropped)
    if not kept:
        raise TrafficError("skip_failing", f"every request failed in the pre-flight ({len(failures)}): nothing is "
                                           "left to measure")
    share = sum(r.weight for r in mix.requests if r.key in dropped) / mix.total_weight
    source = f"{mix.source}; dropped {len(dropped)} requests ({share:.1%} of the weight) that failed in the " \
             "pre-flight (--skip-failing)"
    return Mix(kept, mix.headers, source.lstrip("; "))


def preflight_requests(host: str, port: int, mix: Mix, timeout: float = 10.0, where: str = "") -> dict[str, int]:
    """Send each distinct request of ``mix`` once; return request label -> status. Any 4xx or 5xx
    answer, or no answer, raises TrafficError naming every failing request (up to MAX_LISTED)
    and its answer, so nobody benchmarks an error page."""
    statuses, failures = check_requests(host, port, mix, timeout)
    if failures:
        place = f" through nginx{' on ' + where if where else ''}"
        raise TrafficError("request", failures_line(failures, mix, place) + ": fix the requests (or the app) so they "
                                      "succeed; nothing was measured")
    return statuses
