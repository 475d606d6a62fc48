"""A WSGI app whose requests mix GIL-holding CPU work and GIL-free waiting.

``GET /`` reproduces the source article's request: 5 rounds of ``sleep(10 ms)``
(standing in for an external API call) followed by a naive recursive ``fib(25)``
(about 10 ms of pure-Python CPU that holds the GIL). Query parameters ``rounds``,
``fib`` and ``io_ms`` override the mix within fixed bounds, so no request can
burn unbounded CPU or hold a thread forever.

``GET /healthz`` is a cheap 200 for readiness checks.

``GET /files/<id>`` looks a data-set file up and hands it to nginx (``X-Accel-Redirect``),
or streams it itself with ``?via=app``: see ``app/files.py``.

Every response says which uWSGI worker served it (``X-Worker-Id``, ``X-Worker-Pid``),
so tests and the benchmark can check balancing from the client side too.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from urllib.parse import parse_qsl

from . import files  # relative: uWSGI imports this package as `app`, our tools as uwsgi_layouts.app

try:  # only importable inside a uWSGI worker
    import uwsgi  # type: ignore[import-not-found]
except ImportError:  # plain WSGI server or unit tests
    uwsgi = None

BODY = b"Hello, world"


@dataclass(frozen=True)
class Knob:
    name: str
    default: int
    low: int
    high: int
    meaning: str


# Bounds keep the worst single request to about 3 s of CPU on a 2020s core
# (fib(30) ~ 0.14 s, x20 rounds) and its waiting to at most MAX_TOTAL_WAIT_MS.
KNOBS = {
    k.name: k
    for k in (
        Knob("rounds", 5, 0, 20, "number of wait+compute rounds"),
        Knob("fib", 25, 0, 30, "n of the naive recursive fib computed each round"),
        Knob("io_ms", 10, 0, 10_000, "milliseconds of sleep (external API) each round"),
    )
}
MAX_TOTAL_WAIT_MS = 30_000
MAX_QUERY_FIELDS = 10
ALLOWED_METHODS = ("GET", "HEAD", "POST")


class BadRequest(ValueError):
    """A client error, answered with 400 and this message as plain text."""


def fib(n: int) -> int:
    # Deliberately naive: the point is to hold the GIL for a predictable time.
    return n if n < 2 else fib(n - 1) + fib(n - 2)


def parse_workload(query_string: str) -> dict[str, int]:
    """Validate the query string into {rounds, fib, io_ms}; raise BadRequest with a reason."""
    try:
        pairs = parse_qsl(
            query_string,
            keep_blank_values=True,
            strict_parsing=False,
            encoding="utf-8",
            errors="strict",
            max_num_fields=MAX_QUERY_FIELDS,
        )
    except ValueError as exc:  # UnicodeDecodeError and "too many fields" are ValueErrors
        raise BadRequest(f"query string: not valid UTF-8 key=value pairs ({exc.__class__.__name__})") from None
    values = {name: knob.default for name, knob in KNOBS.items()}
    seen: set[str] = set()
    for key, raw in pairs:
        knob = KNOBS.get(key)
        if knob is None:
            shown = key if len(key) <= 40 else key[:40] + "..."
            raise BadRequest(f"{shown!r}: unknown parameter; allowed: {', '.join(KNOBS)}")
        if key in seen:
            raise BadRequest(f"{key}: given more than once")
        seen.add(key)
        if not (raw.isascii() and raw.isdigit()) or len(raw) > 6:
            shown = raw if len(raw) <= 20 else raw[:20] + "..."
            raise BadRequest(f"{key}: must be an integer in {knob.low}..{knob.high}, got {shown!r}")
        value = int(raw)
        if not knob.low <= value <= knob.high:
            raise BadRequest(f"{key}: must be an integer in {knob.low}..{knob.high}, got {value}")
        values[key] = value
    total_wait = values["rounds"] * values["io_ms"]
    if total_wait > MAX_TOTAL_WAIT_MS:
        raise BadRequest(f"rounds*io_ms: must be at most {MAX_TOTAL_WAIT_MS} ms in total, got {total_wait}")
    return values


def do_work(rounds: int, fib_n: int, io_ms: int) -> None:
    for _ in range(rounds):
        if io_ms:
            time.sleep(io_ms / 1000)  # releases the GIL, like waiting on a socket
        if fib_n:
            fib(fib_n)  # holds the GIL


def worker_headers() -> list[tuple[str, str]]:
    # uwsgi.worker_id() is 1-based; 0 means "not under uWSGI".
    worker_id = uwsgi.worker_id() if uwsgi is not None else 0
    return [("X-Worker-Id", str(worker_id)), ("X-Worker-Pid", str(os.getpid()))]


def _respond(start_response, status: str, body: bytes, method: str, extra=()):
    headers = [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))]
    headers += worker_headers()
    headers += list(extra)
    start_response(status, headers)
    return [b""] if method == "HEAD" else [body]


def application(environ, start_response):
    method = environ.get("REQUEST_METHOD", "GET")
    path = environ.get("PATH_INFO", "/")
    if method not in ALLOWED_METHODS:
        return _respond(
            start_response, "405 Method Not Allowed", f"method {method[:20]!r} not allowed\n".encode(), method,
            extra=[("Allow", ", ".join(ALLOWED_METHODS))],
        )
    if path == "/healthz":
        return _respond(start_response, "200 OK", b"ok\n", method)
    if path.startswith(files.ROUTE_PREFIX):
        return files.handle(environ, start_response, worker_headers())
    if path != "/":
        return _respond(start_response, "404 Not Found", b"not found\n", method)
    try:
        workload = parse_workload(environ.get("QUERY_STRING", ""))
    except BadRequest as exc:
        return _respond(start_response, "400 Bad Request", (str(exc) + "\n").encode("utf-8", "replace"), method)
    if method == "POST":
        _drain_body(environ)
    do_work(workload["rounds"], workload["fib"], workload["io_ms"])
    return _respond(start_response, "200 OK", BODY, method)


def _drain_body(environ, limit: int = 1 << 20) -> None:
    # Read (and discard) a bounded request body so the connection stays usable.
    try:
        length = min(int(environ.get("CONTENT_LENGTH") or 0), limit)
    except ValueError:
        length = 0
    if length:
        environ["wsgi.input"].read(length)
