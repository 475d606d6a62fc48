"""watch's sources and metrics without a stack: the recorded samples of real stacks
(fixtures/doctor-samples.json, as test_doctor uses them), a real unix stats socket serving a
recorded stats document, access log lines in the formats nginx writes, real listening sockets of
this machine, and the endpoint on a real unix socket. The stacks, wrk and Prometheus:
tests/integration/test_watch.py."""

from __future__ import annotations

import copy
import json
import os
import socket
import stat
import threading
import time
import urllib.request
from collections import deque
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from tests.refusals import refusal
from tests.test_doctor import CASES, STATS_DOC, serve_once, to_sample, window
from uwsgi_layouts.bench import watchcli
from uwsgi_layouts.bench.diagnosis import diagnose
from uwsgi_layouts.bench.observe import inet_listeners, parse_timed_line
from uwsgi_layouts.bench.watch import (
    METRICS,
    PREFIX,
    LatencyHistograms,
    LogWatch,
    MetricsServer,
    SocketWatch,
    StatsWatch,
    WatchCollector,
    listen_address,
)
from uwsgi_layouts.bench.watch.sources import kernel_listeners

BUCKETS = (0.05, 0.1, 0.25, 0.5)
BUNDLE_LINE = ('203.0.113.9 - - [27/Nov/2026:06:00:00 +0000] "GET /cart HTTP/1.1" {status} 512 "-" "curl/8" '
               'rt={rt} urt="{urt}" ua="unix:/run/shop/blue/uwsgi-{n}.sock"')
LAB_LINE = ('127.0.0.1 [27/Nov/2026:06:00:00 +0000] "GET / HTTP/1.1" {status} {rt} upstream=unix:/tmp/ul/uwsgi-0.sock '
            'upstream_time={urt}')


def exposition(collector) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return generate_latest(registry).decode()


def recorded(case: str) -> StatsWatch:
    """A StatsWatch holding a recorded window (its thread not started: the samples are given)."""
    c = CASES[case]
    watch = StatsWatch("127.0.0.1:1", hz=25, window_s=60, tell=lambda line: None)
    watch.sampler.samples = deque(to_sample(s) for s in c["samples"])
    watch.sampler.latest = to_sample(c["latest"])
    return watch


@pytest.mark.parametrize("case", ["2x4-shared-c4", "2x4-mapped-c4", "2x2-shared-backlog4-c24"])
def test_the_window_shares_are_doctors(case):
    figures = recorded(case).figures()
    d = diagnose(window(case))
    assert figures.pileup == d.inflight["pileup"] and round(figures.all_busy, 4) == d.inflight["saturated"]
    assert figures.slots == d.layout["processes"] * d.layout["threads"] and figures.samples == d.inflight["samples"]
    text = exposition(WatchCollector(recorded(case), None, None))
    assert f"uwsgi_layouts_pileup_share {figures.pileup}" in text
    assert 'uwsgi_layouts_busy_ratio{source="stats"}' in text


def test_shared_piles_up_and_mapped_does_not_in_the_recorded_windows():
    assert recorded("2x4-shared-c4").figures().pileup >= 0.10 > recorded("2x4-mapped-c4").figures().pileup


def test_a_unix_stats_socket_is_read_and_no_request_variable_is_exported(tmp_path):
    doc = copy.deepcopy(STATS_DOC)
    core = doc["workers"][0]["cores"][0]
    core["in_request"] = 1
    core["vars"] = ["HTTP_COOKIE=session=SECRET-COOKIE", "HTTP_AUTHORIZATION=Bearer SECRET-TOKEN",
                    "QUERY_STRING=card=SECRET-CARD"]
    path = str(tmp_path / "stats.sock")
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    server.listen(8)
    serving = threading.Event()

    def serve():  # as uWSGI's stats server: one document per connection, until the test is done
        server.settimeout(0.2)
        while not serving.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                conn.sendall(json.dumps(doc).encode())

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    watch = StatsWatch(path, hz=50, window_s=10, tell=lambda line: None)
    watch.start()
    try:
        deadline = time.monotonic() + 10
        while not watch.up() and time.monotonic() < deadline:
            time.sleep(0.02)  # the sampler's thread reads
        text = exposition(WatchCollector(watch, None, None))
    finally:
        watch.stop()
        serving.set()
        thread.join(timeout=5)
        server.close()
    assert f'uwsgi_layouts_up{{stats="{path}"}} 1.0' in text
    assert 'uwsgi_layouts_worker_busy_threads{worker="1"} 1.0' in text
    assert f'uwsgi_layouts_worker_requests_total{{worker="1"}} {doc["workers"][0]["requests"]}.0' in text
    assert "SECRET" not in text and "COOKIE" not in text.upper().replace("_", "")


def test_a_stats_server_that_stops_leaves_up_0_and_no_worker_figures(tmp_path):
    path = str(tmp_path / "stats.sock")
    serving = serve_once(path, [json.dumps(STATS_DOC).encode()] * 3)
    said = []
    watch = StatsWatch(path, hz=50, window_s=10, tell=said.append)
    watch.start()
    try:
        serving.join(timeout=10)
        deadline = time.monotonic() + 10
        while watch.sampler.failing_since is None and time.monotonic() < deadline:
            time.sleep(0.02)
        watch.check()
        watch.check()
        text = exposition(WatchCollector(watch, None, None))
    finally:
        watch.stop()
    assert f'uwsgi_layouts_up{{stats="{path}"}} 0.0' in text and "worker_busy_threads{" not in text
    assert len(said) == 1 and "does not answer" in said[0], said


def test_access_log_lines_become_histograms_per_upstream_and_status_class(tmp_path):
    log = tmp_path / "access.log"
    log.write_text("")
    said = []
    watch = LogWatch(str(log), BUCKETS, window_s=60, tell=said.append)
    lines = [BUNDLE_LINE.format(status=200, rt=0.031, urt=0.030, n=0),
             BUNDLE_LINE.format(status=200, rt=0.2, urt=0.2, n=0),
             BUNDLE_LINE.format(status=502, rt=0.0, urt=0.0, n=1),
             BUNDLE_LINE.format(status=200, rt=0.9, urt=0.9, n=1),
             LAB_LINE.format(status=200, rt=0.07, urt=0.07),
             '127.0.0.1 - - [27/Nov/2026:06:00:00 +0000] "GET / HTTP/1.1" 200 5 "-" "curl/8"']
    watch.feed(lines, now=time.monotonic())
    watch.feed([lines[-1]], now=time.monotonic())
    text = exposition(WatchCollector(None, None, watch))
    watch.tail.close()
    blue0 = 'status_class="2xx",upstream="unix:/run/shop/blue/uwsgi-0.sock"'
    assert f'uwsgi_layouts_upstream_response_seconds_bucket{{le="0.05",{blue0}}} 1.0' in text
    assert f'uwsgi_layouts_upstream_response_seconds_bucket{{le="0.25",{blue0}}} 2.0' in text
    assert f'uwsgi_layouts_upstream_response_seconds_count{{{blue0}}} 2.0' in text
    blue1 = 'status_class="2xx",upstream="unix:/run/shop/blue/uwsgi-1.sock"'
    assert f'uwsgi_layouts_upstream_response_seconds_bucket{{le="0.5",{blue1}}} 0.0' in text
    assert f'uwsgi_layouts_upstream_response_seconds_bucket{{le="+Inf",{blue1}}} 1.0' in text
    assert 'status_class="5xx",upstream="unix:/run/shop/blue/uwsgi-1.sock"' in text
    assert 'upstream="unix:/tmp/ul/uwsgi-0.sock"' in text
    assert 'uwsgi_layouts_responses_total{status_class="2xx"} 4.0' in text
    assert 'uwsgi_layouts_responses_total{status_class="5xx"} 1.0' in text
    assert 'uwsgi_layouts_log_lines_total{format="untimed"} 2.0' in text
    assert 'uwsgi_layouts_log_lines_total{format="timed"} 5.0' in text
    assert len(said) == 1 and "not the timed format" in said[0]
    assert watch.busy_seconds(time.monotonic())[0] == pytest.approx(0.030 + 0.2 + 0.0 + 0.9 + 0.07)


def test_the_busy_ratio_of_a_server_without_stats_comes_from_the_logged_upstream_time(tmp_path):
    log = tmp_path / "access.log"
    log.write_text("")
    watch = LogWatch(str(log), BUCKETS, window_s=60, tell=lambda line: None)
    watch.started -= 10  # ten seconds of window so far
    watch.feed([BUNDLE_LINE.format(status=200, rt=0.5, urt=0.5, n=0)] * 40, now=time.monotonic())  # 20 s of work
    text = exposition(WatchCollector(None, None, watch, slots=4))
    watch.tail.close()
    value = float(text.split('uwsgi_layouts_busy_ratio{source="access_log"} ')[1].split()[0])
    assert value == pytest.approx(0.5, rel=0.02)  # 20 s of upstream time in 10 s over 4 slots


def test_histograms_keep_the_upstream_labels_bounded():
    h = LatencyHistograms(BUCKETS)
    with pytest.raises(ValueError):
        LatencyHistograms((0.5, 0.1))
    for n in range(300):
        h.add(parse_timed_line(BUNDLE_LINE.format(status=200, rt=0.01, urt=0.01, n=n)))
    assert len({u for u, _ in h.counts}) == 257 and ("other", "2xx") in h.counts


def test_tcp_and_unix_listeners_queue_and_backlog_from_the_kernel(tmp_path):
    tcp = socket.socket()
    tcp.bind(("127.0.0.1", 0))
    tcp.listen(7)
    port = tcp.getsockname()[1]
    unix_path = str(tmp_path / "app.sock")
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(unix_path)
    unix.listen(5)
    clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(2)]
    clients += [socket.socket(socket.AF_UNIX) for _ in range(3)]
    try:
        for c in clients[2:]:
            c.connect(unix_path)
        assert [(x.queue, x.backlog) for x in inet_listeners() if x.name == f"127.0.0.1:{port}"] == [(2, 7)]
        found = kernel_listeners([f"127.0.0.1:{port}", f":{port}", f"unix:{unix_path}", "/nowhere.sock"])
        assert {n: (x.queue, x.backlog) for n, x in found.items()} == {
            f"127.0.0.1:{port}": (2, 7), f":{port}": (2, 7), f"unix:{unix_path}": (3, 5)}
        said = []
        watch = SocketWatch(lambda: [unix_path, "/nowhere.sock"], hz=50, window_s=5, tell=said.append)
        watch.start()
        time.sleep(0.3)
        text = exposition(WatchCollector(None, watch, None))
        watch.stop()
        assert sorted(said) == ["socket /nowhere.sock is not listening", f"socket {unix_path} listens"], said
        assert 'uwsgi_layouts_listening{socket="/nowhere.sock"} 0.0' in text
        assert 'uwsgi_layouts_listen_queue{socket="/nowhere.sock"}' not in text
        assert f'uwsgi_layouts_listening{{socket="{unix_path}"}} 1.0' in text
        assert f'uwsgi_layouts_listen_queue{{socket="{unix_path}"}} 3.0' in text
        assert f'uwsgi_layouts_listen_backlog{{socket="{unix_path}"}} 5.0' in text
        assert f'uwsgi_layouts_listen_queue_max{{socket="{unix_path}"}} 3.0' in text
    finally:
        for c in clients:
            c.close()
        tcp.close()
        unix.close()


def test_the_endpoint_on_a_unix_socket_is_0660_and_removed_on_close(tmp_path):
    path = str(tmp_path / "metrics.sock")
    server = MetricsServer(*listen_address(path), CollectorRegistry())
    server.start()
    try:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o660
        with socket.socket(socket.AF_UNIX) as conn:
            conn.connect(path)
            conn.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
            reply = b""
            while chunk := conn.recv(65536):
                reply += chunk
        assert reply.startswith(b"HTTP/1.0 200") and b"text/plain" in reply
        with pytest.raises(FileExistsError):
            MetricsServer(*listen_address(path), CollectorRegistry())
    finally:
        server.close()
    assert not os.path.exists(path)


def test_the_endpoint_on_loopback_tcp(free_ports):
    port = free_ports(1)[0]
    server = MetricsServer(*listen_address(f"127.0.0.1:{port}"), CollectorRegistry())
    server.start()
    try:
        with urllib.request.urlopen(server.url, timeout=5) as r:
            assert r.status == 200
    finally:
        server.close()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2)


@pytest.mark.parametrize("argv, message", [
    (["--stats", "127.0.0.1:1", "--listen", "0.0.0.0:9717"], "error: listen: 0.0.0.0:9717 would serve the metrics on "
                                                            "every interface"),
    (["--stats", "127.0.0.1:1", "--listen", "[::]:9717"], "or pass --allow-public-listen"),
    (["--stats", "127.0.0.1:1", "--listen", "metrics.example:9717"], "reachable by other machines"),
    (["--stats", "127.0.0.1:1", "--listen", "relative.sock"], "error: listen: must be HOST:PORT"),
    (["--socket", "nonsense"], "uwsgi-layouts watch: error: argument --socket: must be HOST:PORT"),
    (["--socket", "/run/x.sock", "--slots", "0"], "uwsgi-layouts watch: error: argument --slots: must be an integer in "
                                                 "1..100000, got 0"),
    (["--stats", "127.0.0.1:1", "--slots", "8"], "error: slots: only for a server without a stats server"),
    ([], "error: stats: nothing to watch"),
])
def test_bad_arguments_exit_2_with_one_line(argv, message, capsys):
    assert message in refusal(watchcli.main, argv, capsys, silent=True)


def test_an_access_log_without_upstream_times_is_refused_naming_the_format(tmp_path, capsys):
    log = tmp_path / "access.log"
    log.write_text('127.0.0.1 - - [27/Nov/2026:06:00:00 +0000] "GET / HTTP/1.1" 200 5 "-" "curl/8"\n' * 3)
    assert watchcli.main(["--access-log", str(log)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not in a timed format" in err and 'urt="$upstream_response_time"' in err


def test_every_metric_is_documented():
    page = (Path(__file__).resolve().parent.parent / "docs" / "watch.md").read_text()
    suffix = {"counter": "_total", "gauge": "", "histogram": ""}
    missing = [f"{PREFIX}{name}{suffix[kind]}" for name, (kind, _) in METRICS.items()
               if f"| `{PREFIX}{name}{suffix[kind]}` | {kind} |" not in page]
    assert not missing, missing


def test_a_sock_diag_failure_is_said_once_and_the_socket_watch_keeps_polling(tmp_path, monkeypatch):
    """The kernel refusing one sock_diag read (a netlink hiccup) must not end the thread: the
    figures would freeze while the endpoint kept answering."""
    unix_path = str(tmp_path / "app.sock")
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(unix_path)
    unix.listen(5)
    real = kernel_listeners
    calls = {"n": 0}

    def flaky(names):
        calls["n"] += 1
        if calls["n"] <= 3:
            raise OSError(105, "No buffer space available")
        return real(names)

    monkeypatch.setattr("uwsgi_layouts.bench.watch.sources.kernel_listeners", flaky)
    said = []
    watch = SocketWatch(lambda: [unix_path], hz=50, window_s=5, tell=said.append)
    try:
        watch.start()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not watch.window_max():
            time.sleep(0.02)
    finally:
        watch.stop()
        unix.close()
    assert watch.window_max() == {unix_path: 0} and watch.failure is None
    assert said[:3] == ["cannot read the kernel's listening sockets (No buffer space available): trying again",
                        "reading the kernel's listening sockets again", f"socket {unix_path} listens"], said


def test_a_source_thread_that_dies_stops_the_exporter_with_exit_1(tmp_path, monkeypatch, capsys):
    """An unexpected error in a source's thread: said, and watch exits 1 for its supervisor to
    restart it, instead of serving figures that no longer move."""
    def broken(names):
        raise ValueError("an answer sock_diag never gives")

    monkeypatch.setattr("uwsgi_layouts.bench.watch.sources.kernel_listeners", broken)
    started = time.monotonic()
    code = watchcli.main(["--socket", str(tmp_path / "app.sock"), "--listen", str(tmp_path / "metrics.sock")])
    err = capsys.readouterr().err
    assert code == 1 and time.monotonic() - started < 10
    assert "watch: stopping: watch-sockets stopped: ValueError: an answer sock_diag never gives" in err, err
    assert not (tmp_path / "metrics.sock").exists()
