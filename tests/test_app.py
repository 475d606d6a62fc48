"""The WSGI app, called directly (no server): routing, workload validation, responses."""

from __future__ import annotations

import io
import os
import time

import pytest

from uwsgi_layouts.app import wsgi
from uwsgi_layouts.app.wsgi import application

FAST = "rounds=1&fib=1&io_ms=0"


def call(path: str = "/", query: str = "", method: str = "GET", body: bytes = b""):
    environ = {
        "REQUEST_METHOD": method,
        "PATH_INFO": path,
        "QUERY_STRING": query,
        "SERVER_NAME": "test",
        "SERVER_PORT": "80",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "CONTENT_LENGTH": str(len(body)) if body else "",
        "wsgi.input": io.BytesIO(body),
        "wsgi.errors": io.StringIO(),
        "wsgi.url_scheme": "http",
        "wsgi.version": (1, 0),
        "wsgi.multithread": False,
        "wsgi.multiprocess": False,
        "wsgi.run_once": False,
    }
    seen = {}

    def start_response(status, headers, exc_info=None):
        assert "status" not in seen, "start_response called twice"
        seen["status"] = status
        seen["headers"] = headers
        return lambda data: pytest.fail("the app must not use write()")

    chunks = application(environ, start_response)
    body_out = b"".join(chunks)
    assert "status" in seen, "start_response was never called"
    headers = {}
    for k, v in seen["headers"]:
        assert isinstance(k, str) and isinstance(v, str), (k, v)
        assert k.lower() not in headers, f"header {k} sent twice"
        headers[k.lower()] = v
    return seen["status"], headers, body_out


# --- successful requests -----------------------------------------------------------------


def test_fast_get_says_hello():
    status, headers, body = call("/", FAST)
    assert status == "200 OK"
    assert body == b"Hello, world"
    assert headers["content-type"] == "text/plain"
    assert headers["content-length"] == str(len(body))


def test_worker_headers_outside_uwsgi():
    _, headers, _ = call("/", FAST)
    assert headers["x-worker-id"] == "0"  # 0 = not under uWSGI
    assert headers["x-worker-pid"] == str(os.getpid())


def test_true_default_workload_runs_the_articles_request():
    """No query: 5 x (sleep 10 ms + fib(25)) -> at least 50 ms of waiting."""
    t0 = time.monotonic()
    status, headers, body = call("/", "")
    elapsed = time.monotonic() - t0
    assert status == "200 OK"
    assert body == b"Hello, world"
    assert headers["content-type"] == "text/plain"
    assert elapsed >= 0.05, f"default request returned in {elapsed:.3f} s: the 5 x 10 ms sleeps did not happen"


def test_parse_workload_defaults_and_values():
    assert wsgi.parse_workload("") == {"rounds": 5, "fib": 25, "io_ms": 10}
    assert wsgi.parse_workload("fib=3") == {"rounds": 5, "fib": 3, "io_ms": 10}
    assert wsgi.parse_workload("rounds=0&fib=30&io_ms=10000") == {"rounds": 0, "fib": 30, "io_ms": 10000}
    assert wsgi.parse_workload("rounds=20&io_ms=1500") == {"rounds": 20, "fib": 25, "io_ms": 1500}
    assert wsgi.parse_workload("rounds=3&io_ms=10000") == {"rounds": 3, "fib": 25, "io_ms": 10000}


def test_io_ms_is_waited_for():
    t0 = time.monotonic()
    status, _, _ = call("/", "rounds=2&fib=0&io_ms=60")
    assert status == "200 OK"
    assert time.monotonic() - t0 >= 0.12


def test_rounds_zero_does_nothing_slow():
    t0 = time.monotonic()
    status, _, body = call("/", "rounds=0&fib=30&io_ms=10000")
    assert status == "200 OK" and body == b"Hello, world"
    assert time.monotonic() - t0 < 1.0


def test_fib_is_the_real_fibonacci():
    assert [wsgi.fib(n) for n in range(10)] == [0, 1, 1, 2, 3, 5, 8, 13, 21, 34]
    assert wsgi.fib(20) == 6765


def test_healthz():
    status, headers, body = call("/healthz")
    assert status == "200 OK"
    assert body == b"ok\n"
    assert headers["content-type"] == "text/plain"
    assert "x-worker-id" in headers


def test_healthz_ignores_the_workload_query():
    status, _, _ = call("/healthz", "rounds=bogus")
    assert status == "200 OK"


@pytest.mark.parametrize("path", ["/nope", "/healthz/", "//", "/index.html", ""])
def test_unknown_path_is_404(path):
    status, headers, body = call(path, FAST)
    assert status.startswith("404 ")
    assert headers["content-type"] == "text/plain"
    assert body == b"not found\n"


@pytest.mark.parametrize("method", ["DELETE", "PUT", "PATCH", "OPTIONS"])
def test_other_methods_are_405_with_allow(method):
    status, headers, body = call("/", FAST, method=method)
    assert status.startswith("405 ")
    assert set(h.strip() for h in headers["allow"].split(",")) == {"GET", "HEAD", "POST"}
    assert method.encode() in body
    assert headers["content-length"] == str(len(body))


def test_head_has_headers_but_empty_body():
    status, headers, body = call("/", FAST, method="HEAD")
    assert status == "200 OK"
    assert body == b""
    assert headers["content-type"] == "text/plain"
    assert headers["content-length"] == str(len(b"Hello, world"))


def test_head_of_a_bad_request_is_still_400_and_empty():
    status, _, body = call("/", "rounds=x", method="HEAD")
    assert status.startswith("400 ")
    assert body == b""


def test_post_drains_body_and_says_hello():
    status, _, body = call("/", FAST, method="POST", body=b"x" * 1000)
    assert status == "200 OK" and body == b"Hello, world"


# --- bad requests ------------------------------------------------------------------------

BAD = [
    # (query string, text the 400 body must contain)
    ("rounds=abc", "rounds"),
    ("fib=1.5", "fib"),
    ("io_ms=ten", "io_ms"),
    ("rounds=", "rounds"),
    ("rounds", "rounds"),
    ("rounds=-1", "rounds"),
    ("fib=-3", "fib"),
    ("io_ms=-1", "io_ms"),
    ("rounds=%2B1", "rounds"),  # "+1"
    ("rounds=%201", "rounds"),  # " 1"
    ("rounds=21", "rounds"),
    ("fib=31", "fib"),
    ("io_ms=10001", "io_ms"),
    ("rounds=1234567", "rounds"),  # too long (7 digits)
    ("fib=0000001", "fib"),  # too long even though the value is small
    ("io_ms=" + "9" * 5000, "io_ms"),
    ("rounds=%D9%A1", "rounds"),  # ARABIC-INDIC DIGIT ONE: isdigit() but not ASCII
    ("rounds=%EF%BC%91", "rounds"),  # FULLWIDTH DIGIT ONE
    ("rounds=1&rounds=1", "rounds"),  # duplicated key
    ("fib=1&io_ms=0&fib=2", "fib"),
    ("bogus=1", "bogus"),
    ("ROUNDS=1", "ROUNDS"),
    ("rounds=1&extra=2", "extra"),
    ("rounds=%ff", "query string"),  # not UTF-8 after percent-decoding
    ("%ff=1", "query string"),
    ("rounds=20&io_ms=1501", "rounds*io_ms"),  # 30020 ms > 30000
    ("rounds=4&io_ms=10000", "rounds*io_ms"),
    ("&".join(f"k{i}=1" for i in range(11)), "query string"),  # more than 10 fields
]


@pytest.mark.parametrize("query,names", BAD, ids=[q[:30] for q, _ in BAD])
def test_bad_query_is_400_naming_the_parameter(query, names):
    t0 = time.monotonic()
    status, headers, body = call("/", query)
    assert time.monotonic() - t0 < 0.5, "a rejected request must not do any work"
    assert status.startswith("400 "), (status, body)
    assert headers["content-type"] == "text/plain"
    assert headers["content-length"] == str(len(body))
    text = body.decode("utf-8")
    assert names in text, text
    assert text.endswith("\n") and text.count("\n") == 1, "one line of reason"
    assert len(text) < 300, "a huge bad value must not be echoed back whole"


def test_cap_is_inclusive():
    status, _, _ = call("/", "rounds=3&io_ms=0&fib=0")
    assert status == "200 OK"
    assert wsgi.parse_workload("rounds=20&io_ms=1500&fib=0")["io_ms"] == 1500  # exactly 30000 ms


def test_bad_request_message_is_specific():
    _, _, body = call("/", "fib=31")
    assert b"0..30" in body and b"31" in body
    _, _, body = call("/", "bogus=1")
    assert b"rounds" in body and b"fib" in body and b"io_ms" in body  # lists what is allowed
