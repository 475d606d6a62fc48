"""The user's traffic as pure logic: request lines, weights, bodies, headers, the mix, the
generated wrk script's text, and which app/scenario combinations ``bench.subject`` accepts.
Nothing starts a process here (the script runs through real wrk in
tests/integration/test_traffic_wrk.py)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from uwsgi_layouts.bench import subject as subj
from uwsgi_layouts.bench.load.scenarios import SCENARIOS
from uwsgi_layouts.bench.load.traffic import (
    MAX_BODY,
    MAX_REQUESTS,
    Mix,
    Request,
    TrafficError,
    build_mix,
    check_headers,
    lua_string,
    mix_lua,
    parse_header,
    parse_request_line,
    read_requests_file,
    redact,
    redact_argv,
    write_mix_script,
)
from uwsgi_layouts.deploy.machine import PACKAGE_DIR
from uwsgi_layouts.deploy.model import DEFAULT_APP, LayoutError

# --- request lines ------------------------------------------------------------------------------


@pytest.mark.parametrize("line, method, target, weight", [
    ("GET /", "GET", "/", 1),
    ("  GET   /api/items?page=2&sort=name  ", "GET", "/api/items?page=2&sort=name", 1),
    ("3*GET /api/items", "GET", "/api/items", 3),
    ("3* GET /api/items", "GET", "/api/items", 3),
    ("DELETE /api/items/1", "DELETE", "/api/items/1", 1),
    ("OPTIONS /api/items", "OPTIONS", "/api/items", 1),
    ("GET /search?q=caf%C3%A9&x=%2F", "GET", "/search?q=caf%C3%A9&x=%2F", 1),
])
def test_request_lines_parse(line, method, target, weight):
    r = parse_request_line(line)
    assert (r.method, r.target, r.weight, r.body) == (method, target, weight, None)


@pytest.mark.parametrize("line, needle", [
    ("GET", "is not a request line"),
    ("", "is not a request line"),
    ("/api/items", "is not a request line"),
    ("GET /a b", "is not a request line"),
    ("GET / HTTP/1.1", "is not a request line"),
    ("get /", "methods are upper case: GET"),
    ("FETCH /", "is not one of GET, POST"),
    ("HEAD /", "HEAD cannot be measured with wrk 4.1"),
    ("GET api/items", "must start with '/'"),
    ("GET /café", "percent-encode it"),
    ("GET /a#frag", "fragment is never sent"),
    ("GET /100%", "'%' not followed by two hex digits"),
    ("GET /%zz", "'%' not followed by two hex digits"),
    ("0*GET /", "weight '0'"),
    ("x*GET /", "weight 'x'"),
    ("-1*GET /", "weight '-1'"),
    ("99999999999*GET /", "must be an integer in 1..1000000000"),
    ("GET /\nPOST /", "one request per line"),
    ("GET / @body.json", "GET takes no body"),
    ("POST /api @", "'@' must be followed by a body file"),
    ("GET /" + "a" * 9000, "longer than nginx's request line buffer"),
])
def test_bad_request_lines_say_why(line, needle):
    with pytest.raises(TrafficError) as err:
        parse_request_line(line)
    assert str(err.value).startswith("request: ")
    assert needle in str(err.value)
    assert "\n" not in str(err.value)


def test_bodies_are_read_relative_to_the_given_dir(tmp_path, monkeypatch):
    (tmp_path / "item.json").write_bytes(b'{"name": "cup"}')
    r = parse_request_line("2*POST /api/items @item.json", tmp_path)
    assert (r.method, r.weight, r.body, r.body_file) == ("POST", 2, b'{"name": "cup"}', "item.json")
    assert r.label == "POST /api/items @item.json (15 bytes)"
    monkeypatch.chdir(tmp_path)  # the default: the current directory
    assert parse_request_line("PUT /api/items/1 @item.json").body == b'{"name": "cup"}'


def test_missing_empty_and_oversized_bodies(tmp_path):
    with pytest.raises(TrafficError, match=r"body file .*nope.json cannot be read \(No such file"):
        parse_request_line("POST /api @nope.json", tmp_path)
    (tmp_path / "empty").write_bytes(b"")
    assert parse_request_line("POST /api @empty", tmp_path).body == b""
    (tmp_path / "big").write_bytes(b"x" * (MAX_BODY + 1))
    with pytest.raises(TrafficError, match="client_max_body_size"):
        parse_request_line("POST /api @big", tmp_path)
    (tmp_path / "dir").mkdir()
    with pytest.raises(TrafficError, match="not a regular file"):
        parse_request_line("POST /api @dir", tmp_path)


def test_requests_file_comments_and_line_numbers(tmp_path):
    bodies = tmp_path / "bodies"
    bodies.mkdir()
    (bodies / "item.json").write_text('{"name": "teapot"}')
    f = tmp_path / "requests.txt"
    f.write_text("# the shop's traffic\n\nGET /\n3*GET /api/items   # the busiest page\n"
                 "POST /api/items @bodies/item.json\n")
    requests = read_requests_file(f)
    assert [(r.method, r.target, r.weight) for r in requests] == [("GET", "/", 1), ("GET", "/api/items", 3),
                                                                  ("POST", "/api/items", 1)]
    assert requests[2].body == b'{"name": "teapot"}'  # relative to the file's directory
    f.write_text("GET /\nGET nope\n")
    with pytest.raises(TrafficError, match=r"^requests: .*requests.txt:2: path 'nope' must start with '/'"):
        read_requests_file(f)
    f.write_text("# nothing\n\n")
    with pytest.raises(TrafficError, match="holds no request line"):
        read_requests_file(f)
    with pytest.raises(TrafficError, match=r"^requests: cannot read .*missing.txt"):
        read_requests_file(tmp_path / "missing.txt")


# --- headers ------------------------------------------------------------------------------------


def test_headers_parse_and_strip():
    assert parse_header("Host: shop.example") == ("Host", "shop.example")
    assert parse_header("Authorization:Bearer abc.def") == ("Authorization", "Bearer abc.def")
    assert parse_header("X-Empty:") == ("X-Empty", "")
    assert parse_header("Cookie:  a=1; b=2  ") == ("Cookie", "a=1; b=2")


@pytest.mark.parametrize("text, needle", [
    ("Host", "has no ':'"),
    (": value", "name ''"),
    ("Bad Name: x", "name 'Bad Name'"),
    ("X-A: one\r\nX-Injected: two", "line break"),
    ("X-A: a\nb", "line break"),
    ("X-A: caf\u00e9", "printable ASCII"),
    ("X-A: nul\x00", "printable ASCII"),
    ("Content-Length: 5", "set by wrk"),
    ("transfer-encoding: chunked", "set by wrk"),
])
def test_bad_headers_say_why(text, needle):
    with pytest.raises(TrafficError) as err:
        parse_header(text)
    assert str(err.value).startswith("header: ") and needle in str(err.value)


def test_duplicate_headers_are_refused_case_insensitively():
    with pytest.raises(TrafficError, match="Cookie is given twice.*'; '"):
        check_headers([("cookie", "a=1"), ("Cookie", "b=2")])
    assert check_headers([("Host", "a"), ("X-B", "b")]) == (("Host", "a"), ("X-B", "b"))


# --- the mix ------------------------------------------------------------------------------------


def test_build_mix_merges_repeats_and_keeps_order():
    mix = build_mix([parse_request_line("GET /"), parse_request_line("2*GET /api/items"),
                     parse_request_line("3*GET /")], [("Host", "shop.example")], source="test")
    assert [(r.target, r.weight) for r in mix.requests] == [("/", 4), ("/api/items", 2)]
    assert mix.total_weight == 6 and mix.share(mix.requests[0]) == pytest.approx(4 / 6)
    assert mix.summary() == "2 requests: GET / 67%, GET /api/items 33%"
    assert not mix.unsafe


def test_the_same_path_with_different_bodies_stays_apart():
    a, b = Request("POST", "/api", body=b"a"), Request("POST", "/api", body=b"b")
    mix = build_mix([a, b, a])
    assert [(r.body, r.weight) for r in mix.requests] == [(b"a", 2), (b"b", 1)]
    assert mix.unsafe == list(mix.requests)


def test_mix_validation():
    with pytest.raises(TrafficError, match="no request"):
        Mix(())
    with pytest.raises(TrafficError, match="appears twice"):
        Mix((Request("GET", "/"), Request("GET", "/", 2)))
    many = tuple(Request("GET", f"/{i}") for i in range(MAX_REQUESTS + 1))
    with pytest.raises(TrafficError, match=f"at most {MAX_REQUESTS}"):
        Mix(many)
    with pytest.raises(TrafficError, match="weights add up"):
        Mix((Request("GET", "/a", 10**9), Request("GET", "/b", 10**9), Request("GET", "/c", 10**9)))
    with pytest.raises(TrafficError, match="GET takes no body"):
        Request("GET", "/", body=b"x")
    with pytest.raises(TrafficError, match="weight must be an integer"):
        Request("GET", "/", weight=True)


def test_mix_record_redacts_credentials_and_hashes_bodies():
    mix = build_mix([Request("POST", "/api", 1, b"secret-body", "item.json"), Request("GET", "/")],
                    [("Authorization", "Bearer xyz"), ("Cookie", "s=1"), ("Host", "shop.example")], source="t")
    data = mix.to_dict()
    assert data["headers"] == [["Authorization", "<10 characters, not recorded>"],
                               ["Cookie", "<3 characters, not recorded>"], ["Host", "shop.example"]]
    post = data["requests"][0]
    assert post["body_bytes"] == 11 and len(post["body_sha256"]) == 64 and post["body_file"] == "item.json"
    assert "secret-body" not in repr(data) and "xyz" not in repr(data)
    assert sum(r["share"] for r in data["requests"]) == pytest.approx(1)
    assert redact("X-Api-Key", "k") == "k"  # only the well-known credential headers


# --- the generated wrk script (text; it runs through real wrk in the integration test) -----------


def test_lua_string_escapes_everything_but_printable_ascii():
    assert lua_string("GET") == '"GET"'
    assert lua_string('a"b\\c') == '"a\\034b\\092c"'
    assert lua_string(b"\x00\n\xff1") == '"\\000\\010\\2551"'  # 3-digit escapes: a digit after stays a digit


def test_mix_lua_holds_requests_cumulative_weights_and_headers():
    mix = build_mix([Request("GET", "/", 1), Request("GET", "/api/items", 2), Request("POST", "/api/items"),
                     Request("PUT", "/x", 1, b'{"a": "\n"}')], [("Host", "shop.example")])
    lua = mix_lua(mix)
    assert "local mix_cumulative = {1, 3, 4, 5}" in lua and "local mix_total = 5" in lua
    assert '{"POST", "/api/items", ""}' in lua  # a body method without a body sends Content-Length: 0
    assert '{"GET", "/", nil}' in lua
    assert '"{\\034a\\034: \\034\\010\\034}"' in lua
    assert '["Host"] = "shop.example"' in lua
    assert "math.randomseed(seed * 1000 + (mix_thread_no or 0))" in lua
    assert "function request()" in lua and "function done" not in lua  # write_mix_script appends it


def test_write_mix_script_appends_the_report_hook_owner_only(tmp_path):
    path = write_mix_script(tmp_path / "s" / "mix.lua", build_mix([Request("GET", "/")], [("Cookie", "s=1")]))
    text = path.read_text()
    assert text.index("function request()") < text.index("done = function")
    assert re.search(r"status_json\(\)", text)
    assert path.stat().st_mode & 0o777 == 0o600


# --- which app, which scenarios (bench.subject) --------------------------------------------------


def args(**kw) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    subj.add_arguments(parser)
    ns = parser.parse_args([])
    for name in ("rounds", "fib", "io_ms", "stall_fraction"):
        setattr(ns, name, None)
    for k, v in kw.items():
        setattr(ns, k, v)
    return ns


@pytest.fixture
def other_app(tmp_path) -> Path:
    d = tmp_path / "shop"
    d.mkdir()
    (d / "shop.py").write_text("def app(environ, start_response):\n    return []\n")
    return d


def test_demo_app_without_traffic_keeps_its_scenarios():
    s = subj.from_args(args())
    assert s.demo and s.mix is None and s.record["app"] == DEFAULT_APP and s.record["app_dir"] == str(PACKAGE_DIR)
    assert subj.default_scenarios(s) == ["article"]
    subj.check_scenarios(("article", "stall"), s, args())
    with pytest.raises(TrafficError, match="scenario: traffic sends your requests"):
        subj.check_scenarios(("traffic",), s, args())
    with pytest.raises(TrafficError, match="^header: applies to your requests"):
        subj.from_args(args(header=["Host: x"]))


def test_another_app_gets_get_slash_by_default(other_app):
    s = subj.from_args(args(app="shop:app", app_dir=str(other_app)))
    assert not s.demo and s.record["demo"] is False and s.record["app"] == "shop:app"
    assert [(r.method, r.target) for r in s.mix.requests] == [("GET", "/")]
    assert any("no --request given: measuring GET / of shop:app" in n for n in s.notes)
    assert subj.default_scenarios(s) == ["traffic"]
    assert s.layout_options == {"app": "shop:app", "app_dir": str(other_app)}


def test_traffic_replaces_the_scenario_request(other_app, tmp_path):
    demo = subj.from_args(args(request=["GET /healthz", "2*GET /?rounds=1&fib=1&io_ms=0"]))
    assert demo.demo and demo.mix.total_weight == 3
    subj.check_scenarios(("traffic", "stall", "stall-io"), demo, args())  # stalled clients still apply
    for name in ("article", "io-heavy", "cpu-heavy"):
        with pytest.raises(TrafficError, match=f"scenario: {name} is the demo app's own request"):
            subj.check_scenarios((name,), demo, args())
    for name in ("files-accel", "reuseport"):
        with pytest.raises(TrafficError, match=f"scenario: {name} requests the data set's files"):
            subj.check_scenarios((name,), demo, args())
    with pytest.raises(TrafficError, match="^fib: only the demo app's scenarios"):
        subj.check_scenarios(("traffic",), demo, args(fib="20"))
    with pytest.raises(TrafficError, match="^stall_fraction: cannot be mixed"):
        subj.check_scenarios(("stall",), demo, args(stall_fraction="0.1"))
    other = subj.from_args(args(app="shop:app", app_dir=str(other_app), request=["GET /"]))
    with pytest.raises(TrafficError, match="stall's stalled clients call the demo app's /\\?io_ms= endpoint, which "
                                           "shop:app does not have"):
        subj.check_scenarios(("stall",), other, args())


def test_traffic_option_combinations(tmp_path):
    log = tmp_path / "access.log"
    log.write_text('127.0.0.1 - - [22/Nov/2026:10:52:32 +0000] "GET / HTTP/1.1" 200 5 "-" "curl"\n')
    with pytest.raises(TrafficError, match="^access_log: give either --access-log or --request"):
        subj.from_args(args(access_log=str(log), request=["GET /"]))
    with pytest.raises(TrafficError, match="^include_unsafe: only applies to --access-log"):
        subj.from_args(args(request=["GET /"], include_unsafe=True))
    with pytest.raises(TrafficError, match="^skip_failing: only applies to --access-log"):
        subj.from_args(args(request=["GET /"], skip_failing=True))
    s = subj.from_args(args(access_log=str(log), header=["Host: shop.example"]))
    assert s.mix.headers == (("Host", "shop.example"),) and s.from_log and not s.skip_failing
    assert subj.from_args(args(access_log=str(log), skip_failing=True)).skip_failing
    assert any(n.startswith(f"traffic from {log}: used 1 of 1 lines") for n in s.notes)
    s = subj.from_args(args(request=["POST /api/items"]))
    assert any("100% of the requests are POST" in n for n in s.notes)


def test_bad_app_options_are_layout_errors(tmp_path):
    with pytest.raises(LayoutError, match="^app_dir: must be an existing directory"):
        subj.from_args(args(app="shop:app", app_dir=str(tmp_path / "nope")))
    with pytest.raises(LayoutError, match="^virtualenv: .* does not exist"):
        subj.from_args(args(virtualenv=str(tmp_path / "venv")))


def test_scenario_traffic_carries_the_mix_into_the_workload():
    mix = build_mix([Request("GET", "/")])
    data = SCENARIOS["traffic"].resolved(4).with_mix(mix).to_dict()
    assert data["traffic"]["requests"][0]["target"] == "/" and "fib" not in data and "query" not in data
    stall = SCENARIOS["stall"].resolved(4).with_mix(mix).to_dict()
    assert stall["traffic"]["total_weight"] == 1 and stall["stall"]["clients"] == 4


def test_recorded_command_lines_leave_credentials_out():
    argv = ["compare", "--header", "Authorization: Bearer s3cret", "--header=Cookie: sid=abc", "--header",
            "Host: shop.example", "--request", "GET /"]
    assert redact_argv(argv) == ["compare", "--header", "Authorization: <13 characters, not recorded>",
                                 "--header=Cookie: <7 characters, not recorded>", "--header", "Host: shop.example",
                                 "--request", "GET /"]
