"""The generated traffic script through real wrk: weights, headers, bodies, status classes and
seeded replay, against a small recording HTTP server on 127.0.0.1 (Python's http.server, a real
socket server: it records every request it is sent and answers by path)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.conftest import find_free_ports
from uwsgi_layouts.bench.load.traffic import Request, TrafficError, build_mix, preflight_requests, write_mix_script
from uwsgi_layouts.bench.load.wrk import LUA_REPORT, WrkProcess, run_wrks, write_script
from uwsgi_layouts.bench.subject import Subject, check_traffic

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

ANSWERS = {"/moved": 302, "/missing": 404, "/boom": 500}
# Paths answered with a worker pid header, as the demo app sends it (X-Worker-Pid), lowercased (as
# granian's hyper passes it on), and with a value that is not a pid.
PID_HEADERS = {"/pid-upper": ("X-Worker-Pid", "111"), "/pid-lower": ("x-worker-pid", "222"),
               "/pid-junk": ("X-Worker-Pid", "1a")}


class Recorder(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as wrk expects
    disable_nagle_algorithm = True  # headers and body go out in two writes: no 40 ms delayed-ACK stall

    def _answer(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        self.server.seen.append((self.command, self.path, dict(self.headers), body))
        status = ANSWERS.get(self.path.split("?")[0], 200)
        payload = b"ok\n"
        self.send_response(status)
        self.send_header("Content-Length", str(len(payload)))
        if status == 302:
            self.send_header("Location", "/")
        if self.path in PID_HEADERS:
            self.send_header(*PID_HEADERS[self.path])
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST = do_PUT = do_DELETE = _answer

    def log_message(self, *args):  # quiet
        pass


@pytest.fixture
def server():
    (port,) = find_free_ports(1)
    srv = ThreadingHTTPServer(("127.0.0.1", port), Recorder)
    srv.daemon_threads = True
    srv.seen = []
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join(timeout=5)


def run(server, mix, tmp_path, seed: int, duration: float = 2.0, connections: int = 1, threads: int = 1):
    script = write_mix_script(tmp_path / f"mix-{seed}.lua", mix)
    server.seen.clear()
    load = WrkProcess(f"http://127.0.0.1:{server.server_port}/", connections, duration, threads=threads, timeout_s=5,
                      script=script, script_args=[str(seed)])
    (result,), _ = run_wrks(load)
    return result, list(server.seen)


def test_mix_weights_headers_bodies_and_status_classes(server, tmp_path):
    mix = build_mix([Request("GET", "/a", 6), Request("GET", "/moved", 2), Request("GET", "/missing", 1),
                     Request("GET", "/boom", 1), Request("POST", "/items", 2, b'{"name": "cup", "note": "\n\\""}'),
                     Request("DELETE", "/items/1", 1)],
                    [("Host", "shop.example"), ("Cookie", "session=abc; theme=dark"), ("X-Api-Key", "k-1")])
    result, seen = run(server, mix, tmp_path, seed=3)
    assert result.requests > 300, result.raw[-1500:]
    # wrk counted every answer it completed; the server may have answered one more as wrk stopped
    assert sum(result.status.values()) == result.requests <= len(seen) <= result.requests + 1
    by_path = Counter(path for _, path, _, _ in seen[: result.requests])
    classes = {"2xx": by_path["/a"] + by_path["/items"] + by_path["/items/1"], "3xx": by_path["/moved"],
               "4xx": by_path["/missing"], "5xx": by_path["/boom"]}
    assert result.status == classes
    assert result.errors.status == classes["4xx"] + classes["5xx"]  # wrk's own count agrees
    total = mix.total_weight
    for r in mix.requests:
        share = by_path[r.target] / result.requests
        assert abs(share - r.weight / total) < 0.08, (r.target, share, r.weight / total)
    for method, path, headers, body in seen:
        assert headers["Host"] == "shop.example" and headers["Cookie"] == "session=abc; theme=dark"
        assert headers["X-Api-Key"] == "k-1"
        if path == "/items":
            assert method == "POST" and body == b'{"name": "cup", "note": "\n\\""}'
            assert headers["Content-Length"] == str(len(body))
        elif path == "/items/1":
            assert method == "DELETE" and body == b"" and headers.get("Content-Length") == "0"
        else:
            assert method == "GET" and "Content-Length" not in headers


def test_the_same_seed_replays_the_same_sequence(server, tmp_path):
    mix = build_mix([Request("GET", f"/p{i}", i + 1) for i in range(6)])
    _, first = run(server, mix, tmp_path, seed=1, duration=1)
    _, again = run(server, mix, tmp_path, seed=1, duration=1)
    _, other = run(server, mix, tmp_path, seed=2, duration=1)
    n = min(len(first), len(again), len(other), 200)
    assert n >= 100
    assert [p for _, p, _, _ in first[:n]] == [p for _, p, _, _ in again[:n]]
    assert [p for _, p, _, _ in first[:n]] != [p for _, p, _, _ in other[:n]]


def test_preflight_sends_each_request_once_and_names_a_failure(server):
    ok = build_mix([Request("GET", "/a"), Request("GET", "/moved"), Request("POST", "/items", 1, b"{}")],
                   [("Host", "shop.example")])
    assert preflight_requests("127.0.0.1", server.server_port, ok) == {"GET /a": 200, "GET /moved": 302,
                                                                       "POST /items (2-byte body)": 200}
    assert [(m, p, b) for m, p, _, b in server.seen] == [("GET", "/a", b""), ("GET", "/moved", b""),
                                                         ("POST", "/items", b"{}")]
    bad = build_mix([Request("GET", "/missing"), Request("GET", "/a"), Request("GET", "/boom")])
    with pytest.raises(ValueError, match=r"^request: 2 of 3 distinct requests failed in the pre-flight through "
                                         r"nginx: GET /missing -> 404 Not Found: 'ok'; GET /boom -> 500 Internal "
                                         r"Server Error: 'ok': fix the requests"):
        preflight_requests("127.0.0.1", server.server_port, bad)
    (closed,) = find_free_ports(1)
    with pytest.raises(ValueError, match=r"^request: 3 of 3 distinct requests failed in the pre-flight through "
                                         r"nginx: GET /missing -> ConnectionRefusedError.*; GET /boom -> "
                                         r"ConnectionRefusedError"):
        preflight_requests("127.0.0.1", closed, bad)


def test_skip_failing_leaves_the_failing_requests_of_a_log_out(server):
    log_mix = build_mix([Request("GET", "/a", 5), Request("GET", "/missing", 3), Request("GET", "/boom", 2)],
                        source="access log x.log")
    subject = Subject({}, False, {}, log_mix, from_log=True)
    with pytest.raises(TrafficError, match=r"GET /missing -> 404 Not Found: 'ok'; GET /boom -> 500 .*, or leave "
                                           r"them out with --skip-failing; nothing was measured"):
        check_traffic(subject, "127.0.0.1", server.server_port, 5, where="2x4-mapped")
    kept, lines = check_traffic(replace(subject, skip_failing=True), "127.0.0.1", server.server_port, 5,
                                where="2x4-mapped")
    assert [r.target for r in kept.mix.requests] == ["/a"]
    assert "dropped 2 requests (50.0% of the weight) that failed in the pre-flight" in kept.mix.source
    assert lines[0].startswith("--skip-failing: left out 2 of 3 distinct requests failed in the pre-flight through "
                               "nginx on 2x4-mapped: GET /missing -> 404")
    assert lines[-1] == "pre-flight: 1 distinct requests answered 200 through nginx on 2x4-mapped"
    (closed,) = find_free_ports(1)  # nothing answers at all: --skip-failing cannot make that a measurement
    with pytest.raises(TrafficError, match="3 of 3 distinct requests failed"):
        check_traffic(replace(subject, skip_failing=True), "127.0.0.1", closed, 5, where="2x4-mapped")


def test_status_classes_are_summed_over_wrk_threads(server, tmp_path):
    mix = build_mix([Request("GET", "/a", 2), Request("GET", "/moved"), Request("GET", "/missing")])
    result, seen = run(server, mix, tmp_path, seed=5, duration=1, connections=2, threads=2)
    assert "2 threads and 2 connections" in result.raw
    assert sum(result.status.values()) == result.requests > 50
    assert result.requests <= len(seen) <= result.requests + 2
    assert result.status["4xx"] == result.errors.status > 0 and result.status["3xx"] > 0


def test_fractional_seconds_are_rounded_up_for_wrk(server, tmp_path):
    """wrk 4.1 reads whole seconds only (-d2.5s or --timeout=10.5s is a usage error, exit 1)."""
    script = write_mix_script(tmp_path / "mix.lua", build_mix([Request("GET", "/a")]))
    load = WrkProcess(f"http://127.0.0.1:{server.server_port}/", 1, 0.5, timeout_s=1.5, script=script,
                      script_args=["1"])
    assert "-d1s" in load.cmd and "--timeout=2s" in load.cmd
    (result,), _ = run_wrks(load)
    assert result.requests > 0 and result.status["2xx"] == result.requests


def test_answers_are_counted_per_worker_pid_header(server, tmp_path):
    """report.lua counts answers per X-Worker-Pid value (either spelling), summed over wrk's
    threads; a value that is not a pid, or no header, counts nothing. wrk stops with up to one
    answer per connection unread, so its counts trail the server's by at most that."""
    mix = build_mix([Request("GET", "/pid-upper", 2), Request("GET", "/pid-lower"), Request("GET", "/pid-junk"),
                     Request("GET", "/a")])
    result, seen = run(server, mix, tmp_path, seed=3, duration=1, connections=2, threads=2)
    sent = Counter(path for _, path, _, _ in seen)
    assert set(result.worker_pids) == {111, 222}, result.worker_pids
    for pid, path in ((111, "/pid-upper"), (222, "/pid-lower")):
        assert sent[path] - 2 <= result.worker_pids[pid] <= sent[path], (pid, result.worker_pids, sent)
    assert result.worker_pids[111] > result.worker_pids[222] > 20
    assert sum(result.worker_pids.values()) < result.requests  # junk and header-less answers count nothing


def test_worker_pid_count_chains_with_a_scripts_own_response_hook(server, tmp_path):
    """A script with its own response() keeps it (report.lua chains it) and still gets the count."""
    script = write_script(tmp_path / "own.lua", (
        'own_answers = 0\n'
        'request = function() return wrk.format(nil, "/pid-lower") end\n'
        'response = function(status, headers, body) own_answers = own_answers + 1 end\n'))
    (result,), _ = run_wrks(WrkProcess(f"http://127.0.0.1:{server.server_port}/", 1, 1, timeout_s=5, script=script))
    assert result.requests > 20 and result.worker_pids == {222: result.requests}
    off = write_script(tmp_path / "off.lua", "count_worker_pids = false\n")  # scripts/header-cost.py's switch
    (quiet,), _ = run_wrks(WrkProcess(f"http://127.0.0.1:{server.server_port}/pid-upper", 1, 1, timeout_s=5,
                                      script=off))
    assert quiet.requests > 20 and quiet.worker_pids == {}


# report.lua's done() with 180 KB printed before it: more than a pipe holds (64 KB on Linux).
LOUD_DONE = """
local report_done = done
done = function(summary, latency, requests)
  for i = 1, 3000 do io.write(string.rep("#", 59), "\\n") end
  report_done(summary, latency, requests)
end
"""


def test_wrk_ends_by_itself_unread_when_its_output_outgrows_a_pipe(server, tmp_path):
    """Nobody reads wrk while it runs (an observer polls it, as the reuseport scenario's connection
    sampler does): it must still exit when its time is up, however much done() prints (the latency
    histogram of a fast load runs to 70 KB). Through a pipe it blocked on that write until killed."""
    script = tmp_path / "loud.lua"
    script.write_text(LUA_REPORT.read_text() + LOUD_DONE)
    load = WrkProcess(f"http://127.0.0.1:{server.server_port}/", 1, 1, timeout_s=2, script=script)
    deadline = time.monotonic() + 20
    while load.proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    exited = load.proc.poll() is not None
    (result,), _ = run_wrks(load)
    assert exited, "wrk was still running 20 s into a 1-s load: blocked writing its output"
    assert result.requests > 0 and result.raw.count("#" * 59 + "\n") == 3000
