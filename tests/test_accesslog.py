"""Building a request mix from nginx access logs (pure logic on REAL captured lines).

tests/fixtures/access-combined.log was written by nginx 1.22.1 with the default ``combined`` format
while curl and raw sockets sent: GETs with queries, a User-Agent and Referer holding quotes and a
backslash (nginx logs them as \\x22 and \\x5C), HEAD, POST, PUT, DELETE, a 404, a 302, basic auth,
a quote inside the path, a TLS handshake to the HTTP port (logged as escaped bytes, 400), an unknown
method (405), an absolute-form target and UTF-8 bytes in a path (404).
tests/fixtures/access-upstreams.log was written by a stack of this project rendered with
``access_log=on`` (the ``upstreams`` format) for the demo app.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from uwsgi_layouts.bench.load.accesslog import parse_line, read_access_log
from uwsgi_layouts.bench.load.traffic import TrafficError

FIXTURES = Path(__file__).parent / "fixtures"
COMBINED = FIXTURES / "access-combined.log"
UPSTREAMS = FIXTURES / "access-upstreams.log"


def test_combined_lines_with_quotes_and_escapes():
    lines = COMBINED.read_text(encoding="latin-1").splitlines()
    quoted_agent = next(x for x in lines if "agent" in x)
    assert '\\x22quoted\\x22' in quoted_agent  # the fixture really holds nginx's escapes
    parsed = parse_line(quoted_agent)
    assert (parsed.method, parsed.target, parsed.status, parsed.format) == ("GET", "/api/items?page=3", 200,
                                                                           "combined")
    quote_in_path = parse_line(next(x for x in lines if "/api/\\x22quoted" in x))
    assert quote_in_path.target == '/api/"quoted"'
    assert parse_line(next(x for x in lines if "\\x16\\x03" in x)) is None  # TLS bytes: no request line
    assert parse_line(next(x for x in lines if "alice" in x)).target == "/api/items?q=caf%C3%A9"
    assert parse_line(next(x for x in lines if "\"GET http://example.com" in x)).target == "/api/items"
    assert parse_line(next(x for x in lines if "/caf\\xC3" in x)).target == "/caf%C3%A9"
    # Apache writes a quote inside a field as \" (hand-written line in Apache's combined format).
    apache = '10.0.0.1 - - [22/Nov/2026:10:00:00 +0000] "GET /a?q=\\"b\\" HTTP/1.1" 200 5 "-" "say \\"hi\\""'
    assert parse_line(apache).target == '/a?q="b"'


def test_combined_log_mix_and_summary():
    mix, summary = read_access_log(COMBINED)
    assert summary.lines == 17 and summary.used == 10
    assert dict(summary.skipped) == {"answered 4xx/5xx in the log": 2, "POST (use --include-unsafe)": 1,
                                     "DELETE (use --include-unsafe)": 1, "PUT (use --include-unsafe)": 1,
                                     "unparsable": 1, "with method 'FOO'": 1}
    weights = {(r.method, r.target): r.weight for r in mix.requests}
    assert weights[("GET", "/index.html")] == 2  # one GET and one HEAD, sent as GET
    assert weights[("GET", "/api/items?page=2&sort=name")] == 2
    assert weights[("GET", "/r")] == 1  # a 302 is a success
    assert all(r.method == "GET" for r in mix.requests) and mix.total_weight == 10
    text = summary.describe()
    assert text.startswith(f"{COMBINED}: used 10 of 17 lines; skipped 2 answered 4xx/5xx in the log, ")
    assert "1 POST (use --include-unsafe)" in text and "1 unparsable" in text
    assert "1 HEAD sent as GET" in text
    assert mix.source == f"access log {text}"


def test_include_unsafe_replays_other_methods_without_bodies():
    mix, summary = read_access_log(COMBINED, include_unsafe=True)
    assert summary.used == 13 and "POST (use --include-unsafe)" not in summary.skipped
    post = next(r for r in mix.requests if r.method == "POST")
    assert (post.target, post.body) == ("/api/items", None)
    assert "1 POST, 1 DELETE, 1 PUT replayed without a body" in summary.describe()


def test_upstreams_format():
    mix, summary = read_access_log(UPSTREAMS)
    assert dict(summary.formats) == {"upstreams": 7}
    assert {(r.target, r.weight) for r in mix.requests} == {("/healthz", 4), ("/?rounds=1&fib=1&io_ms=0", 1)}
    assert summary.describe() == (f"{UPSTREAMS}: used 5 of 7 lines; skipped 1 POST (use --include-unsafe), "
                                  "1 answered 4xx/5xx in the log; 1 HEAD sent as GET (wrk 4.1 cannot read HEAD "
                                  "answers)")


def test_gzip_and_top_requests_cap(tmp_path):
    lines = [f'127.0.0.1 - - [22/Nov/2026:10:00:00 +0000] "GET /p/{i % 5} HTTP/1.1" 200 1 "-" "-"'
             for i in range(5)] * 3 + ['127.0.0.1 - - [22/Nov/2026:10:00:00 +0000] "GET /p/0 HTTP/1.1" 200 1 "-" "-"']
    path = tmp_path / "access.log.1.gz"
    with gzip.open(path, "wt") as fh:
        fh.write("\n".join(lines) + "\n\n")
    mix, summary = read_access_log(path, max_requests=2)
    assert summary.lines == 16 and summary.used == 16 and summary.distinct == 5 and summary.kept == 2
    assert mix.requests[0].target == "/p/0" and mix.requests[0].weight == 4
    assert "kept the 2 most frequent of 5 distinct requests (44% of the used lines)" in summary.describe()


def test_no_usable_line_names_the_reasons(tmp_path):
    path = tmp_path / "posts.log"
    path.write_text('127.0.0.1 - - [22/Nov/2026:10:00:00 +0000] "POST /api HTTP/1.1" 201 1 "-" "-"\n'
                    "not a log line\n")
    with pytest.raises(TrafficError) as err:
        read_access_log(path)
    text = str(err.value)
    assert text.startswith(f"access_log: no usable line in {path} (2 lines: ")
    assert "1 POST (use --include-unsafe)" in text and "1 unparsable" in text and "\n" not in text
    empty = tmp_path / "empty.log"
    empty.write_text("")
    with pytest.raises(TrafficError, match="the file is empty"):
        read_access_log(empty)
    with pytest.raises(TrafficError, match="^access_log: cannot read .*missing.log"):
        read_access_log(tmp_path / "missing.log")


# --- the pre-flight's failures: every one named at once, --skip-failing drops them ----------------


def failures_of(mix, answers: dict[str, str]):
    from uwsgi_layouts.bench.load.traffic import Failure
    return [Failure(r, answers[r.target], not answers[r.target].startswith("no answer"))
            for r in mix.requests if r.target in answers]


def test_every_failing_request_is_named_in_one_line():
    from uwsgi_layouts.bench.load.traffic import Request, build_mix, failures_line
    mix = build_mix([Request("GET", "/ok", 5), Request("GET", "/gone", 2), Request("GET", "/boom"),
                     Request("GET", "/slow")])
    failures = failures_of(mix, {"/gone": "404 Not Found: 'no such page'", "/boom": "500 Internal Server Error",
                                 "/slow": "no answer within 10 s"})
    line = failures_line(failures, mix, " through nginx on 2x4-mapped")
    assert line == ("3 of 4 distinct requests failed in the pre-flight through nginx on 2x4-mapped: "
                    "GET /gone -> 404 Not Found: 'no such page'; GET /boom -> 500 Internal Server Error; "
                    "GET /slow -> no answer within 10 s")
    assert "\n" not in line


def test_the_line_names_at_most_twenty_and_counts_the_rest():
    from uwsgi_layouts.bench.load.traffic import Request, build_mix, failures_line
    mix = build_mix([Request("GET", f"/p{i}") for i in range(30)])
    line = failures_line(failures_of(mix, {f"/p{i}": "404 Not Found" for i in range(25)}), mix)
    assert line.startswith("25 of 30 distinct requests failed in the pre-flight: GET /p0 -> 404 Not Found; ")
    assert "GET /p19 -> 404 Not Found; and 5 more" in line and "/p20 " not in line


def test_skip_failing_drops_them_and_the_source_counts_them():
    from uwsgi_layouts.bench.load.traffic import Request, build_mix, without
    mix = build_mix([Request("GET", "/ok", 6), Request("GET", "/gone", 3), Request("GET", "/boom", 1)],
                    [("Host", "shop.example")], source="access log shop.log: used 10 of 10 lines")
    kept = without(mix, failures_of(mix, {"/gone": "404 Not Found", "/boom": "500 Internal Server Error"}))
    assert [r.target for r in kept.requests] == ["/ok"] and kept.headers == mix.headers
    assert kept.source == ("access log shop.log: used 10 of 10 lines; dropped 2 requests (40.0% of the weight) "
                           "that failed in the pre-flight (--skip-failing)")
    assert kept.to_dict()["source"] == kept.source  # what results.json (and the report) say
    with pytest.raises(TrafficError, match="^skip_failing: every request failed in the pre-flight"):
        without(mix, failures_of(mix, {"/ok": "404 Not Found", "/gone": "404 Not Found", "/boom": "500 x"}))
