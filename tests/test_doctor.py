"""doctor's pure logic, its record and its report: nothing started, nothing timed.

The samples are REAL: ``fixtures/doctor-samples.json`` holds 2 s of compare's sampler on four
real stacks under real wrk load (make_doctor_fixture.py): 2x4-shared and 2x4-mapped at 2P, a
saturated 2x2-shared with a backlog of 4, and an idle 2x4-mapped. Where a test needs what those
stacks did not do (harakiri, a leak, a stopped service), it changes a recorded sample and says
so. Access log lines are written here in the formats nginx writes. The socket tests use real
sockets of this machine (a unix server in a thread, a listening socket, files rotated on disk).
"""

from __future__ import annotations

import json
import math
import os
import pwd
import shlex
import socket
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from tests.refusals import refusal
from uwsgi_layouts.bench import cli
from uwsgi_layouts.bench.diagnosis import (
    PILEUP_FINDING,
    Window,
    demand,
    diagnose,
    findings,
    layout_of,
    memory_figures,
    summarise_access,
    timeline_of,
    tune_command,
)
from uwsgi_layouts.bench.kinds.base import RESULTS_NAME
from uwsgi_layouts.bench.observe import (
    ENTRY_NAME,
    LogTail,
    Sample,
    Sampler,
    WorkerCounters,
    app_options_of_ini,
    factory_of_entry,
    inflight_summary,
    parse_timed_line,
    process_listeners,
    read_sample,
    same_listener,
    unix_listen_queues,
    unix_listeners,
    uwsgi_config,
)
from uwsgi_layouts.bench.report import markdown_lines, terminal_lines
from uwsgi_layouts.bench.report.exporters import export_all
from uwsgi_layouts.bench.results import Diagnosis, Results, ResultsError, load
from uwsgi_layouts.deploy.machine import PACKAGE_DIR, read_stats, stats_exposure, without_requests

FIXTURES = Path(__file__).parent / "fixtures"
CASES = json.loads((FIXTURES / "doctor-samples.json").read_text())["cases"]
STATS_DOC = json.loads((FIXTURES / "uwsgi-stats-2x4-mapped.json").read_text())


def to_sample(data: dict) -> Sample:
    return Sample(data["t"], {int(w): tuple(v) for w, v in data["workers"].items()},
                  {int(w): n for w, n in data["inflight"].items()}, data["cores"],
                  {n: tuple(v) for n, v in data["sockets"].items()}, data["master"],
                  {int(w): WorkerCounters(*c) for w, c in data.get("counters", {}).items()})


def window(case: str, **changes) -> Window:
    c = CASES[case]
    w = Window(address=c["address"], planned_s=2, hz=c["hz"], layout=c["layout"],
               samples=[to_sample(s) for s in c["samples"]], first=to_sample(c["first"]),
               latest=to_sample(c["latest"]))
    return replace(w, **changes)


def names(d: Diagnosis) -> list[str]:
    return [f.name for f in findings(d)]


# ------------------------------------------------------------------------------ findings from real samples


def test_shared_at_2p_piles_up_and_says_what_to_try():
    d = diagnose(window("2x4-shared-c4"))
    assert d.layout["strategy"] == "shared" and d.requests > 0
    assert d.inflight["pileup"] >= PILEUP_FINDING
    first = findings(d)[0]
    assert first.name == "pileup"
    assert f"pile-up {d.inflight['pileup']:.0%} of the time" in first.text
    assert "share one socket (shared)" in first.text and "mean time per request: worker 1" in first.text
    assert "least_conn (mapped)" in first.action and tune_command(d) in first.action
    assert [f["name"] for f in d.findings] == names(d), "stored for readers, the same as derived"


def test_mapped_at_2p_does_not():
    d = diagnose(window("2x4-mapped-c4"))
    assert d.layout["strategy"] == "mapped" and d.inflight["pileup"] < PILEUP_FINDING and d.requests > 0
    assert names(d) == ["healthy"]
    assert "no problem found" in findings(d)[0].text


def test_the_mapped_samples_piled_up_would_blame_nginx_balancing_not_the_socket():
    """The same real mapped samples with worker 1 given 3 more requests in every sample (changed
    here): pile-up, and the advice for a per-worker-socket layout is about nginx's upstream."""
    w = window("2x4-mapped-c4")
    piled = [replace(s, inflight={**s.inflight, 1: s.inflight[1] + 3}) for s in w.samples]
    first = findings(diagnose(replace(w, samples=piled)))[0]
    assert first.name == "pileup" and "own socket (mapped)" in first.text and "zone" in first.action


def test_idle_stack_says_no_traffic():
    d = diagnose(window("2x4-mapped-idle"))
    assert names(d) == ["idle"] and d.requests == 0 and d.inflight["peak"] == 0
    assert findings(d)[0].text.startswith("no traffic in the window")


def test_saturated_small_backlog_is_the_queue_finding():
    d = diagnose(window("2x2-shared-backlog4-c24"))
    (sock, q), = d.queue["sockets"].items()
    assert q["backlog"] == 4 and q["max"] >= 4
    f = findings(d)[0]
    assert f.name == "queue" and "saturated" not in names(d)
    assert f"reached {q['max']} of 4 (full" in f.text
    assert "under-provisioned for the observed peak of at least" in f.text
    assert demand(d) > d.inflight["peak"], "queued requests count in the demand"
    assert f"--concurrency {demand(d)} " in tune_command(d)


@pytest.mark.parametrize("share,found", [(0.05, False), (0.6, True)])
def test_a_queue_is_a_finding_when_requests_wait_in_it_not_for_a_handoff(share, found):
    """The real mapped samples with 1 connection waiting on socket 0 in a share of the samples
    (changed here): now and then it is the handoff to a free thread (a few ms by Little's law),
    most of the time it is a wait worth saying."""
    w = window("2x4-mapped-c4")
    every = round(1 / share)
    queued = [replace(s, sockets={n: (1 if (i % every == 0 and k == 0) else q, b)
                                  for k, (n, (q, b)) in enumerate(s.sockets.items())})
              for i, s in enumerate(w.samples)]
    d = diagnose(replace(w, samples=queued))
    assert ("queue" in names(d)) == found, (d.queue, findings(d))
    if found:
        f = next(f for f in findings(d) if f.name == "queue")
        assert "requests waited about" in f.text and "own socket" in f.action
        assert demand(d) == math.ceil(d.inflight["demand_p99"])
    else:
        assert d.queue["mean_wait_ms"] < 10 and demand(d) == math.ceil(d.inflight["p99"])


def test_a_request_in_flight_all_window_without_any_finishing_is_stuck():
    w = window("2x4-mapped-idle")
    stuck = [replace(s, inflight={**s.inflight, 2: 1}) for s in w.samples]  # changed here
    assert names(diagnose(replace(w, samples=stuck))) == ["stuck"]


def test_harakiri_and_respawns_from_the_counters():
    """The recorded latest counters with 2 harakiri on worker 1 and 3 respawns on worker 2 (changed)."""
    w = window("2x4-mapped-c4")
    counters = dict(w.latest.counters)
    counters[1] = counters[1]._replace(harakiri=counters[1].harakiri + 2, respawns=counters[1].respawns + 2)
    counters[2] = counters[2]._replace(respawns=counters[2].respawns + 3)
    d = diagnose(replace(w, latest=replace(w.latest, counters=counters)))
    by = {f.name: f for f in findings(d)}
    assert "harakiri fired 2 times (worker 1)" in by["harakiri"].text
    assert "respawned 3 times without harakiri (worker 2)" in by["respawns"].text
    assert d.workers["1"]["harakiri"] == 2 and d.workers["2"]["respawns"] == 3


def test_memory_growth_needs_a_real_rise_over_a_long_enough_span():
    grow = {1: [(t, 100, int(50e6 + t * 10e6 / 3600 * 3)) for t in range(0, 61, 5)],  # 30 MB/h, 0.5 MB in 60 s
            2: [(t, 101, int(50e6 + t * 100e6 / 3600)) for t in range(0, 61, 5)]}  # 100 MB/h, 1.7 MB
    m = memory_figures(grow, "pss")
    assert m["workers"]["2"]["growth_mb_per_h"] == pytest.approx(100, rel=0.01)
    d = diagnose(window("2x4-mapped-c4", memory=grow, memory_kind="pss"))
    (f,) = [f for f in findings(d) if f.name == "memory"]
    assert f.text.startswith("worker 2 PSS grew 100 MB/h") and "worker 1" not in f.text
    short = {2: [(t / 10, 101, int(50e6 + t * 1e6)) for t in range(0, 21)]}  # 20 MB in 2 s: too short to call
    assert "memory" not in names(diagnose(window("2x4-mapped-c4", memory=short, memory_kind="pss")))
    respawned = {2: [(0, 100, int(50e6)), (30, 100, int(90e6)), (35, 222, int(50e6)), (60, 222, int(50e6))]}
    assert memory_figures(respawned, "pss")["workers"]["2"]["growth_mb_per_h"] == 0, "a new pid starts over"


def test_timeline_keeps_peaks_when_binned():
    w = window("2x4-shared-c4")
    full = timeline_of(w.samples)
    assert len(full["t"]) == len(w.samples) and set(full["inflight"]) == {"1", "2"}
    binned = timeline_of(w.samples, points=10)
    assert len(binned["t"]) == 10
    assert max(binned["inflight"]["2"]) == max(full["inflight"]["2"])


def test_a_stopped_window_is_said():
    d = diagnose(window("2x4-shared-c4", ended="stopped", end_note="the stats server stopped answering at 1.2 s"))
    text = "\n".join(terminal_lines(results_of(d)))
    assert "STOPPED EARLY: the stats server stopped answering at 1.2 s" in text


# ------------------------------------------------------------------------------ the layout in use


def doc(sockets: list[str], workers: int = 2, threads: int = 4, thunder: bool = False) -> dict:
    return {"version": "2.0.31", "pid": 10, "locks": [{"user 0": 0}] + ([{"thunder": 0}] if thunder else []),
            "sockets": [{"name": n, "max_queue": 100} for n in sockets],
            "workers": [{"id": i, "pid": 10 + i, "cores": [{}] * threads} for i in range(1, workers + 1)]}


@pytest.mark.parametrize("sockets,holdings,strategy", [
    (["a"], {1: ["a"], 2: ["a"]}, "shared"),
    (["a", "b"], {1: ["a"], 2: ["b"]}, "mapped"),
    (["a", "b", "c"], {1: ["a", "c"], 2: ["b", "c"]}, "overflow"),
    (["a", "b"], {1: ["a", "b"], 2: ["a"]}, "custom"),
    (["a"], None, "shared"),
    (["a", "b"], None, "mapped"),
    (["a", "b", "c"], None, "overflow"),
    (["a", "b", "c", "d"], None, "unknown"),
])
def test_strategy_from_the_workers_sockets_or_inferred_from_counts(sockets, holdings, strategy):
    layout = layout_of(doc(sockets), holdings)
    assert (layout["processes"], layout["threads"], layout["strategy"]) == (2, 4, strategy)
    assert layout["evidence"].startswith("the workers' open sockets") == (holdings is not None)
    if strategy == "mapped" and holdings is None:
        assert "map-socket assumed" in layout["evidence"]
    assert [s["name"] for s in layout["sockets"]] == sockets


def test_thunder_lock_is_read_from_the_locks():
    assert layout_of(doc(["a"], thunder=True), {1: ["a"], 2: ["a"]})["strategy"] == "thunder"


def test_app_options_from_the_uwsgi_ini():
    ini = """[uwsgi]
; the bundle's ini
chdir = /srv/shop
module = shop.wsgi:app
virtualenv = /srv/shop/venv
[other]
module = not.this:one
"""
    assert app_options_of_ini(ini) == {"app": "shop.wsgi:app", "app_dir": "/srv/shop", "virtualenv": "/srv/shop/venv"}
    assert app_options_of_ini("[uwsgi]\nwsgi-file = /srv/x/run.py\ncallable = app\n") == {
        "app": "run:app", "app_dir": "/srv/x", "wsgi_file": "/srv/x/run.py"}
    # env lines: their names only (values may be secrets), the lab's own UL_* left out
    assert app_options_of_ini("[uwsgi]\nmodule = m:a\nenv = SECRET_KEY=s3cr3t\nenv = UL_DATA_DIR=/d\n"
                              "env = LANG=C.UTF-8\n") == {"app": "m:a", "env_names": ["SECRET_KEY", "LANG"]}
    assert app_options_of_ini("[uwsgi]\nmodule = plain\nhome = /v\n") == {"app": "plain:application",
                                                                          "virtualenv": "/v"}


def test_a_factory_app_is_read_back_from_the_entry_module_render_wrote(tmp_path):
    """An app factory runs through a generated entry module (wsgi-file): doctor's tune line must
    name the factory as the user passed it, not the entry module."""
    app = "storefront:create_app(greeting='a b', debug=False)"
    template = (PACKAGE_DIR / "templates" / "entry.py.j2").read_text()
    entry = template.replace("{{ layout.app }}", app).replace("{{ server.label }}", "uWSGI")
    assert factory_of_entry(entry) == app
    (tmp_path / "entry").mkdir()
    (tmp_path / "entry" / ENTRY_NAME).write_text(entry)
    ini = tmp_path / "uwsgi.ini"
    ini.write_text(f"[uwsgi]\nchdir = /srv/store\nwsgi-file = {tmp_path}/entry/{ENTRY_NAME}\nenv = TOKEN=x\n")
    # a process whose command line names the ini as uWSGI's master's does
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "--ini", str(ini)]) as proc:
        try:
            deadline = time.monotonic() + 10  # until /proc shows its own command line (a loaded machine)
            while "--ini" not in psutil.Process(proc.pid).cmdline() and time.monotonic() < deadline:
                time.sleep(0.05)
            path, options = uwsgi_config(proc.pid)
        finally:
            proc.kill()
    assert path == str(ini) and options == {"app": app, "app_dir": "/srv/store", "env_names": ["TOKEN"]}
    d = diagnose(window("2x4-shared-c4"))
    line = tune_command(replace(d, layout={**d.layout, "app": options}))
    assert shlex.split(line)[-6:] == ["--app", app, "--app-dir", "/srv/store", "--env", "TOKEN=..."]


def test_tune_command_is_ready_to_run_or_names_what_to_fill_in():
    d = diagnose(window("2x4-shared-c4"))
    assert tune_command(d).startswith("uwsgi-layouts tune --concurrency ")
    assert "--app MODULE:CALLABLE --app-dir APP_DIR" in tune_command(d)  # the recording read no ini
    layout = {**d.layout, "app": {"app": "shop.wsgi:app", "app_dir": "/srv/my shop"}}
    d2 = replace(d, layout=layout, access={**summarise_access([], "/var/log/nginx/shop.access.log"), "used": 3})
    assert tune_command(d2).endswith("--app shop.wsgi:app --app-dir '/srv/my shop' "
                                     "--access-log /var/log/nginx/shop.access.log")


# ------------------------------------------------------------------------------ the access log

UPSTREAMS = ('127.0.0.1 [24/Nov/2026:10:00:00 +0000] "GET /?a=1 HTTP/1.1" 200 0.105 '
             'upstream=127.0.0.1:5000, 127.0.0.1:5001 upstream_time=0.005, 0.100')
COMBINED = '10.0.0.9 - - [24/Nov/2026:10:00:00 +0000] "GET /x HTTP/1.1" 200 512 "-" "curl/8.1"'
NGINX_DOCS = (COMBINED.replace(" 200 ", " 502 ")
              + ' rt=0.002 uct="0.000" uht="-" urt="0.001" ua="unix:/run/shop/uwsgi-0.sock"')
BARE = COMBINED + " unix:/run/shop/uwsgi-1.sock 0.250"
TWO_TIMES = COMBINED + " 0.300 0.250"


def test_timed_lines_in_every_format():
    p = parse_timed_line(UPSTREAMS)
    assert (p.status, p.request_s, p.upstreams, p.upstream_s, p.format) == (
        200, 0.105, ("127.0.0.1:5000", "127.0.0.1:5001"), (0.005, 0.1), "upstreams")
    assert parse_timed_line(COMBINED) == (200, None, (), (), "combined")
    assert parse_timed_line(NGINX_DOCS) == (502, 0.002, ("unix:/run/shop/uwsgi-0.sock",), (0.001,), "combined+times")
    assert parse_timed_line(BARE)[2:4] == (("unix:/run/shop/uwsgi-1.sock",), (0.25,))
    assert parse_timed_line(TWO_TIMES)[1:4] == (0.3, (), (0.25,))
    assert parse_timed_line(COMBINED + ' 127.0.0.1:5000 : 127.0.0.1:5001 0.010 : -')[2:4] == (
        ("127.0.0.1:5000", "127.0.0.1:5001"), (0.01, None))
    assert parse_timed_line("not a log line") is None


def test_access_summary_per_status_class_and_upstream():
    lines = [UPSTREAMS] * 98 + [UPSTREAMS.replace(" 200 ", " 504 ")] * 2 + ["garbage", ""]
    a = summarise_access(lines, "access.log")
    assert (a["lines"], a["used"], a["formats"], a["timing"]) == (101, 100, {"upstreams": 100}, "upstream")
    assert a["status"]["2xx"] == {"requests": 98, "p50_ms": 105.0, "p99_ms": 105.0, "max_ms": 105.0, "mean_ms": 105.0}
    assert a["upstreams"]["127.0.0.1:5001"]["p50_ms"] == 100.0 and a["upstreams"]["127.0.0.1:5000"]["requests"] == 100
    assert a["codes"] == {"200": 98, "504": 2}
    d = diagnose(window("2x4-mapped-c4", access=a))
    (f,) = [f for f in findings(d) if f.name == "errors"]
    assert f.text.startswith("2.0% of the answers in the access log were 5xx (2 of 100; 504: 2)")
    combined = summarise_access([COMBINED] * 5, "site.log")
    assert combined["timing"] == "none" and combined["status"]["2xx"] == {"requests": 5}


def test_log_tail_reads_only_what_the_window_appended_through_rotation_and_truncation(tmp_path):
    log = tmp_path / "access.log"
    log.write_text("before 1\nbefore 2\n")
    tail = LogTail(log)
    with open(log, "a") as fh:
        fh.write("during 1\nduring 2\npartial")
    assert tail.read() == ["during 1", "during 2"]
    with open(log, "a") as fh:
        fh.write(" line\nold file\n")
    log.rename(tmp_path / "access.log.1")  # logrotate's create: a new file
    log.write_text("new 1\n")
    assert tail.read() == ["partial line", "old file", "new 1"]
    tail.close()
    tail = LogTail(log)
    log.write_text("cut\n")  # copytruncate: emptied, then nginx writes on
    assert tail.read() == ["cut"]
    tail.close()
    tail = LogTail(log, limit=10)
    with open(log, "a") as fh:
        fh.write("0123456789abcdef\nnext\n")
    assert tail.read() == [] and tail.cut
    tail.close()


# ------------------------------------------------------------------------------ real sockets


def serve_once(path: str, payloads: list[bytes], delays: dict[int, float] | None = None) -> threading.Thread:
    """A unix socket server writing one payload per connection, then closing (as uWSGI's stats server);
    ``delays``: payload index -> seconds to wait before writing it (a master answering late)."""
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    server.listen(4)
    server.settimeout(10)

    def run():
        with server:
            for i, payload in enumerate(payloads):
                conn, _ = server.accept()
                with conn:
                    threading.Event().wait((delays or {}).get(i, 0.0))
                    conn.sendall(payload)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_stats_over_a_unix_socket_and_what_is_not_a_stats_server(tmp_path):
    path = str(tmp_path / "stats.sock")
    thread = serve_once(path, [json.dumps(STATS_DOC).encode(), b"HTTP/1.1 400 Bad Request\r\n\r\n", b'{"a": 1}'])
    assert read_stats(path)["workers"][0]["id"] == 1
    with pytest.raises(ValueError):
        read_stats(path)
    with pytest.raises(ValueError, match="without a list of workers"):
        read_stats("unix:" + path)
    thread.join(timeout=5)
    with pytest.raises(OSError):
        read_stats(path)  # nobody listens any more


def sampled_until_failing(path: str, server: threading.Thread, interval: float) -> Sampler:
    """A Sampler of ``path`` run until the server has answered all it will and a read has failed."""
    with Sampler(path, interval=interval) as sampler:
        server.join(timeout=5)
        deadline = 200
        while sampler.failing_since is None and deadline:
            threading.Event().wait(0.02)  # the sampler's thread reads; this waits for its verdict
            deadline -= 1
    return sampler


def test_sampler_says_when_reads_start_failing(tmp_path):
    path = str(tmp_path / "stats.sock")
    thread = serve_once(path, [json.dumps(STATS_DOC).encode()] * 3)
    sampler = sampled_until_failing(path, thread, 0.02)
    assert len(sampler.samples) == 3 and sampler.failing_since is not None and sampler.last_error
    assert sampler.first.counters and sampler.latest.counters and not sampler.samples[1].counters
    assert sampler.latest.sockets == {"127.0.0.1:18125": (0, 0), "127.0.0.1:18126": (0, 0)}


def test_sampler_counts_the_ticks_a_late_answer_skipped(tmp_path):
    """The second read takes 0.23 s at 20 Hz: it spans at least 4 ticks' starts, which the sampler
    skips (keeping its schedule) and the next sample counts. Against the clock: the first read is
    at tick 0 and each read starts at or after its tick, so the last sample's time bounds the
    ticks there were: samples and missed together are those ticks, or one fewer when the last
    read (its wake-up and answer) ran past a tick's start; no more."""
    interval = 0.05
    path = str(tmp_path / "stats.sock")
    thread = serve_once(path, [json.dumps(STATS_DOC).encode()] * 3, delays={1: 0.23})
    sampler = sampled_until_failing(path, thread, interval)
    first, _, after_late = sampler.samples
    ticks_by_clock = int(after_late.t / interval) + 1  # ticks 0 .. the one at or before the last sample
    missed = [s.missed for s in sampler.samples]
    assert first.missed == 0 and 4 <= after_late.missed <= ticks_by_clock - 3, (missed, after_late.t)
    summary = inflight_summary(sampler.samples)
    assert summary["samples"] == 3, summary
    assert ticks_by_clock - 1 <= summary["samples"] + summary["missed"] <= ticks_by_clock, (missed, after_late.t)


def test_unix_listen_queue_and_holder_from_the_kernel(tmp_path):
    path = str(tmp_path / "q.sock")
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    server.listen(7)
    clients = [socket.socket(socket.AF_UNIX) for _ in range(3)]
    try:
        for c in clients:
            c.connect(path)
        assert unix_listen_queues()[path] == (3, 7)
        held = process_listeners(os.getpid(), unix_listeners())
        assert [s.name for s in held if s.name == path] == [path]
    finally:
        for c in clients:
            c.close()
        server.close()
    assert same_listener("unix:/run/x.sock", "/run/x.sock") and same_listener(":5000", "0.0.0.0:5000")
    assert same_listener("127.0.0.1:5000", "127.0.0.1:5000") and not same_listener("127.0.0.1:5000", "127.0.0.1:5001")


# ------------------------------------------------------------------------------ the record and its report


def results_of(d: Diagnosis) -> Results:
    return Results(kind="doctor", environment={"nproc": 2}, arguments={"stats": d.address, "command": "uwsgi-layouts "
                   "doctor --stats X"}, workload={}, diagnoses=(d,))


def test_record_round_trips_and_the_report_renders_again(tmp_path):
    d = diagnose(window("2x4-shared-c4"))
    path = results_of(d).save(tmp_path / RESULTS_NAME)
    loaded = load(path)
    assert loaded.kind == "doctor" and loaded.diagnoses[0] == d
    assert cli.main(["report", str(path)]) == 0
    assert {p.name for p in tmp_path.iterdir()} == {RESULTS_NAME, "report.txt", "report.md", "timeline.png"}
    text = (tmp_path / "report.txt").read_text()
    assert "Findings:" in text and "1. pile-up" in text and "uwsgi-layouts tune --concurrency" in text
    md = "\n".join(markdown_lines(loaded, ["timeline.png"]))
    assert "## Findings" in md and "![timeline](timeline.png)" in md and "## Layout to try" in md


def test_an_idle_window_renders_without_a_tune_line(tmp_path):
    d = diagnose(window("2x4-mapped-idle"))
    text = "\n".join(terminal_lines(results_of(d)))
    assert "no traffic in the window" in text and "bench tune" not in text
    assert [p.name for p in export_all(results_of(d), tmp_path)] == ["timeline.png", "report.md", "report.txt"]


@pytest.mark.parametrize("change,message", [
    ({"ended": "crashed"}, "ended: must be one of complete, stopped, interrupted"),
    ({"requests": -1}, "requests: must be an integer >= 0"),
    ({"layout": {"processes": 0, "threads": 1, "strategy": "x", "sockets": []}}, "layout.processes"),
    ({"workers": {"w1": {"requests": 1}}}, "workers: keys must be numbers"),
    ({"timeline": {"t": [0, 1], "inflight": {"1": [0]}, "queue": [0, 0]}}, "timeline.inflight.1: must have one value"),
    ({"queue": {"sockets": {"a": {"max": 1, "nonempty": 2}}}}, "queue.sockets.a.nonempty: must be a share"),
    ({"memory": {"kind": "vsz", "workers": {}}}, "memory.kind: must be pss or rss"),
    ({"findings": ({"name": "x"},)}, "findings[0]: must hold the strings name, text and action"),
    ({"exposure": {"address": "127.0.0.1:9191", "who": "every local user"}}, "exposure: must hold"),
])
def test_a_bad_record_is_refused_in_one_line(change, message):
    d = diagnose(window("2x4-shared-c4"))
    with pytest.raises(ResultsError, match=message.replace("[", r"\[").replace("]", r"\]")) as exc:
        Diagnosis(**{**d.__dict__, **change})
    assert "\n" not in str(exc.value)


def test_a_stored_file_with_a_bad_record_names_it(tmp_path):
    data = results_of(diagnose(window("2x4-shared-c4"))).to_dict()
    data["diagnoses"][0]["hz"] = -1
    (tmp_path / "r.json").write_text(json.dumps(data))
    with pytest.raises(ResultsError, match=r"diagnosis of 127\.0\.0\.1:\d+: hz: must be a finite number >= 0"):
        load(tmp_path / "r.json")


# ------------------------------------------------------------------------------ the command line (no server needed)


@pytest.mark.parametrize("argv,message", [
    (["--stats", "nonsense"], "uwsgi-layouts doctor: error: argument --stats: must be HOST:PORT"),
    (["--stats", "127.0.0.1:99999"], "uwsgi-layouts doctor: error: argument --stats: must be HOST:PORT"),
    (["--stats", "/x.sock", "--for", "0"], "uwsgi-layouts doctor: error: argument --for: must be an integer in "
                                           "1..3600, got 0"),
    (["--stats", "/x.sock", "--for", "ten"], "uwsgi-layouts doctor: error: argument --for: must be an integer in "
                                             "1..3600, got 'ten'"),
    (["--stats", "/x.sock", "--hz", "0.5"], "uwsgi-layouts doctor: error: argument --hz: must be a number in 1..100, "
                                            "got 0.5"),
    (["--stats", "/x.sock", "--for", "3601"], "uwsgi-layouts doctor: error: argument --for: must be an integer in "
                                              "1..3600, got 3601"),
    (["--stats", "/x.sock", "--hz", "0"], "uwsgi-layouts doctor: error: argument --hz: must be a number in 1..100, "
                                          "got 0"),
    (["--stats", "/x.sock", "--hz", "500"], "uwsgi-layouts doctor: error: argument --hz: must be a number in 1..100, "
                                            "got 500"),
    (["--stats", "/x.sock", "--for", "3600", "--hz", "50"], "error: for: at 50 Hz at most 720 s"),
])
def test_bad_arguments_exit_2_with_one_line(argv, message, capsys, tmp_path):
    assert message in refusal(cli.main, ["doctor", *argv, "--out", str(tmp_path / "out")], capsys)
    assert not (tmp_path / "out").exists()


def test_nothing_listening_at_the_stats_address_is_one_line(capsys, tmp_path, free_ports):
    """A free port and a socket path that is not there: refused before anything starts, nothing written."""
    out = tmp_path / "out"
    for address in (f"127.0.0.1:{free_ports(1)[0]}", str(tmp_path / "none.sock")):
        line = refusal(cli.main, ["doctor", "--stats", address, "--for", "2", "--out", str(out)], capsys, silent=True)
        assert line.startswith(f"error: stats: no stats server at {address} ("), line
    assert not out.exists()


def test_stats_is_required(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["doctor"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "--stats" in err and err.count("\n") == 1


# ------------------------------------------------------------------------------ the stats server's secrets (issue 31)

IN_FLIGHT = ["REQUEST_METHOD=GET", "HTTP_COOKIE=session=SECRET-SESSION-123", "HTTP_AUTHORIZATION=Bearer TOKEN-XYZ"]


def with_a_request_in_flight(doc: dict) -> dict:
    """The stats document as uWSGI writes it while worker 1's first thread serves a request."""
    doc = json.loads(json.dumps(doc))
    core = doc["workers"][0]["cores"][0]
    core.update(in_request=1, vars=IN_FLIGHT, req_info={"request_start": 1764226000})
    return doc


def test_the_reader_drops_every_request_variable_and_keeps_the_counters(tmp_path):
    doc = with_a_request_in_flight(STATS_DOC)
    assert "SECRET-SESSION-123" in json.dumps(doc)
    path = str(tmp_path / "stats.sock")
    thread = serve_once(path, [json.dumps(doc).encode()])
    read = read_stats(path)
    thread.join(timeout=5)
    text = json.dumps(read)
    assert "SECRET-SESSION-123" not in text and "TOKEN-XYZ" not in text and '"vars"' not in text
    assert "req_info" not in text
    assert read_sample(read, 0.0).inflight[1] == 1  # what the samplers need is still there
    assert read == without_requests(doc) and doc["workers"][0]["cores"][0]["vars"] == IN_FLIGHT  # input untouched
    assert read["workers"][0]["requests"] == doc["workers"][0]["requests"]


def test_a_tcp_stats_server_is_exposed_to_every_local_user():
    found = stats_exposure("127.0.0.1:9191")
    assert found.who == "every local user" and "TCP 127.0.0.1:9191" in found.why and "unix socket" in found.fix
    assert "network" in stats_exposure("0.0.0.0:1717").who


def test_a_unix_stats_socket_is_exposed_only_when_others_can_reach_and_open_it(run_dirs):
    top = run_dirs()  # under /tmp, which every user traverses
    top.chmod(0o755)
    path = top / "stats.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    with server:
        assert all(os.stat(p).st_mode & 0o001 for p in [top, *top.parents])
        path.chmod(0o660)
        assert stats_exposure(str(path)).who == ""
        path.chmod(0o666)
        found = stats_exposure(str(path))
        assert found.who == "every local user" and "666" in found.why and "chmod-socket = 660" in found.fix
        top.chmod(0o750)  # its directory closed to others: they cannot reach it
        assert stats_exposure(str(path)).who == ""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: hands the socket to other users")
def test_a_group_socket_is_exposed_when_its_group_has_members_besides_its_owner(run_dirs):
    data = pwd.getpwnam("www-data")
    top = run_dirs()
    top.chmod(0o755)
    path = top / "stats.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    with server:
        path.chmod(0o660)
        os.chown(path, 0, data.pw_gid)  # root's socket, www-data's group: www-data may connect
        found = stats_exposure(str(path))
        assert found.who == "the other members of group www-data (www-data)" and "660 (root:www-data)" in found.why
        os.chown(path, data.pw_uid, data.pw_gid)  # the service's own user and group (the lab under root)
        assert stats_exposure(str(path)).who == ""


def test_an_exposed_stats_server_is_the_first_finding_even_of_an_idle_window():
    exposure = stats_exposure("127.0.0.1:9191").to_dict()
    for case in ("2x4-mapped-idle", "2x4-shared-c4"):
        d = diagnose(window(case, exposure=exposure))
        first = findings(d)[0]
        assert first.name == "stats-exposed" and "every local user" in first.text and "cookies" in first.text
        assert first.action == exposure["fix"]
        assert names(d)[1:] == names(diagnose(window(case)))  # the rest as without it
        assert Diagnosis.from_dict(json.loads(json.dumps(d.to_dict()))).exposure == exposure
    assert "stats-exposed" not in names(diagnose(window("2x4-shared-c4")))
