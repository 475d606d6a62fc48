"""Faults under load on one machine: the experiments ``uwsgi-layouts faults`` runs (its command,
the plan and the results file are ``bench.kinds.faults``; across app hosts: ``bench.hostfaults``).

Every experiment here starts its own nginx + uWSGI stack on loopback (``bench.stack.Lab``),
drives it with real ``wrk`` for a bounded time, injects one kind of fault at a measured moment
(once the uWSGI stats server shows requests flowing, ``bench.observe.Sampler``), and returns a
``bench.results.FaultRecord``: the load held, the faults injected, the requests sent and failed
(wrk's error classes, non-2xx included), the data lost (POST handlers that ran twice), notes,
and the checks of the issue's targets. The integration tests (tests/integration/test_faults.py) call these
same functions and assert the checks, so the figures and the tests cannot disagree.

Experiments: kill -9 of a worker (GET and POST loads), a request stuck beyond harakiri,
a full listen backlog (tcp and unix), a uWSGI chain reload under 50 connections, a chain
reload of broken code, and nginx reloads (SIGHUP) under load. The experiments that need side
effects run ``app/faults.py`` from a copy in their own directory (``bench.faultkit``: that copy, the
loads, the nginx.conf patches, the checks). Those that need nothing but
load (kill-worker, chain-reload, nginx-reload) take another app's options and its requests
(``mix``) instead of the demo app's.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from uwsgi_layouts.bench.faultkit import (
    FAST_GET,
    FaultApp,
    Patch,
    check,
    concurrently,
    describe_errors,
    get_load,
    http_request,
    layout_label,
    nginx_errors_note,
    post_script,
    sent_requests,
    wait_until,
)
from uwsgi_layouts.bench.load.traffic import Mix
from uwsgi_layouts.bench.load.wrk import WrkProcess, WrkRun, run_wrks
from uwsgi_layouts.bench.observe import Sampler, access_log, nginx_workers
from uwsgi_layouts.bench.results import FaultRecord
from uwsgi_layouts.bench.stack import Lab
from uwsgi_layouts.deploy.model import Layout, StackError
from uwsgi_layouts.deploy.run import Stack, tail

# --- experiments -------------------------------------------------------------------------------


def kill_worker(lab: Lab, spec: str = "2x4-mapped", duration: float = 6.0, get_connections: int = 8,
                post_connections: int = 4, post_ms: int = 100, patch: Patch | None = None, mix: Mix | None = None,
                **options) -> FaultRecord:
    """kill -9 one worker while wrk sends GETs and POSTs (each POST with a unique id that the
    handler logs before working): GETs in flight on it are retried on another worker, POSTs
    are not replayed; the master respawns it. With the user's app (``options``) and ``mix``:
    the user's requests only (no POST ids to count)."""
    app = FaultApp.create(lab.new_dir()) if mix is None else None
    options = {"access_log": True, **(app.options() if app else {}), **options}
    with lab.stack(spec, patch, **options) as stack:
        layout = stack.layout
        base = layout.url.rstrip("/")
        with Sampler(layout.stats_address) as sampler:
            gets = get_load(lab, layout, "/?io_ms=20", get_connections, duration, mix)
            posts = WrkProcess(f"{base}/", post_connections, duration,
                               script=post_script(app.app_dir.parent, post_ms)) if app else None
            loads = [w for w in (gets, posts) if w is not None]
            try:
                t_flow = sampler.wait_flowing(50)
                wait_until(sampler.t0 + t_flow, 1.0)  # one second of undisturbed throughput
                old = stack.worker_pids()
                t_kill = sampler.now()
                os.kill(old[1], signal.SIGKILL)
                respawn_s = wait_respawned(stack, old, 1)
                t_back = t_kill + respawn_s
                runs, _ = run_wrks(*loads)
            finally:
                for load in loads:
                    load.stop()
            t_end = sampler.now()
        if app is None:
            return _kill_worker_record(stack, patch, sampler, runs[0], get_connections, duration,
                                       (t_kill, t_back, t_end), respawn_s, mix)
        get_run, post_run = runs
        handled = app.handled()
        twice = {rid: n for rid, n in handled.items() if n > 1}
        log = access_log(stack)
        retried = [a for a in log if len(a.upstreams) > 1]
        post_5xx = [a for a in log if a.method == "POST" and a.status >= 500]
        before = sum(sampler.served_per_worker(t_kill - 1.0, t_kill).values())
        window = max(0.5, t_end - 0.2 - (t_back + 0.5))
        after = sampler.served_per_worker(t_back + 0.5, t_end - 0.2)
        after_total = sum(after.values())
        seconds = [sampler.served_per_worker(t, t + 1.0) for t in range(int(t_kill), int(t_end))]
        kinds = nginx_errors_note(stack)
    new_worker = after.get(1, 0)
    return FaultRecord(
        name="kill-worker", patch=patch.label if patch else "",
        layout=layout_label(layout, patch),
        load=f"wrk -c{get_connections} GET + -c{post_connections} POST {duration:g} s",
        faults_injected=1,
        requests_sent=sent_requests(get_run) + sent_requests(post_run),
        requests_failed=get_run.errors.total + post_run.errors.total,
        data_lost=sum(n - 1 for n in twice.values()),
        notes=(
            f"respawned in {respawn_s * 1000:.0f} ms; nginx retried {len(retried)} GET(s) on another server; "
            f"POSTs answered 5xx: {len(post_5xx)} (not replayed)",
            kinds,
            f"throughput: {before:.0f} req/s in the second before the kill, "
            f"{after_total / window:.0f} req/s after the respawn; the respawned worker served "
            f"{new_worker} request(s) in those {window:.1f} s"
            + (" (nginx kept it out: max_fails=1 fail_timeout=10s)" if new_worker == 0 else ""),
        ),
        checks=(
            check("0 failed GETs", get_run.errors.total == 0, describe_errors(get_run)),
            check("a POST in flight is not replayed: every POST handler ran at most once", not twice,
                  f"{len(handled)} POST ids logged, ran twice: {sorted(twice)[:5] or 'none'}"),
            check("at most one 502 per POST in flight (<= threads of the killed worker)",
                  post_run.errors.total == post_run.errors.status <= layout.threads,
                  describe_errors(post_run)),
            check("the master respawns the worker", respawn_s <= 5.0, f"{respawn_s:.2f} s"),
        ),
        figures={"respawn_s": respawn_s, "retried": len(retried), "post_5xx": len(post_5xx),
                 "rps_before": before, "rps_after": after_total / window, "respawned_worker_served": new_worker,
                 "window_s": window, "get_errors": get_run.errors.total, "post_errors": post_run.errors.total,
                 "per_second": [(t, s.get(1, 0), s.get(2, 0)) for t, s in zip(range(int(t_kill), int(t_end)), seconds,
                                                                                strict=True)]},
    )


def _kill_worker_record(stack: Stack, patch: Patch | None, sampler: Sampler, run: WrkRun, connections: int,
                        duration: float, times: tuple[float, float, float], respawn_s: float, mix: Mix) -> FaultRecord:
    """kill-worker under the user's requests: GETs (and HEADs) in flight on the killed worker are
    retried on another; any other method is not replayed (at most one failure per thread)."""
    layout = stack.layout
    t_kill, t_back, t_end = times
    retried = [a for a in access_log(stack) if len(a.upstreams) > 1]
    before = sum(sampler.served_per_worker(t_kill - 1.0, t_kill).values())
    window = max(0.5, t_end - 0.2 - (t_back + 0.5))
    after = sum(sampler.served_per_worker(t_back + 0.5, t_end - 0.2).values())
    unsafe = sorted({r.method for r in mix.unsafe})
    target = "0 failed requests" if not unsafe else \
        f"at most one failure per thread of the killed worker ({', '.join(unsafe)} are not replayed)"
    ok = run.errors.total == 0 if not unsafe else run.errors.total <= layout.threads
    return FaultRecord(
        name="kill-worker", patch=patch.label if patch else "", layout=layout_label(layout, patch),
        load=f"wrk -c{connections} your requests {duration:g} s", faults_injected=1,
        requests_sent=sent_requests(run), requests_failed=run.errors.total, data_lost=0,
        notes=(f"respawned in {respawn_s * 1000:.0f} ms; nginx retried {len(retried)} request(s) on another server",
               nginx_errors_note(stack),
               f"throughput: {before:.0f} req/s in the second before the kill, {after / window:.0f} req/s after the "
               "respawn"),
        checks=(check(target, ok, describe_errors(run)),
                check("the master respawns the worker", respawn_s <= 5.0, f"{respawn_s:.2f} s")),
        figures={"respawn_s": respawn_s, "retried": len(retried), "rps_before": before, "rps_after": after / window,
                 "window_s": window, "errors": run.errors.total},
    )


def stuck_request(lab: Lab, spec: str = "2x4-mapped", harakiri: int = 2, duration: float = 6.0,
                  connections: int = 4, stuck_ms: int = 10000, patch: Patch | None = None, **options) -> FaultRecord:
    """One request sleeps far beyond harakiri while wrk keeps the stack busy."""
    with lab.stack(spec, patch, harakiri=harakiri, access_log=True, **options) as stack:
        layout = stack.layout
        stuck_uri = f"/?rounds=1&fib=0&io_ms={stuck_ms}"
        with Sampler(layout.stats_address) as sampler:
            load = WrkProcess(layout.url.rstrip("/") + FAST_GET, connections, duration)
            try:
                sampler.wait_flowing(50)
                old = stack.worker_pids()
                status, seconds, _ = http_request(layout, "GET", stuck_uri, timeout=stuck_ms / 1000 + 10)
                respawned = _respawned(stack, old, timeout=3.0)
                (run,), _ = run_wrks(load)
            finally:
                load.stop()
        entries = [a for a in access_log(stack) if a.uri == stuck_uri]
        kinds = nginx_errors_note(stack)
        harakiri_lines = [line for line in stack.uwsgi_log.read_text(errors="replace").splitlines()
                          if "HARAKIRI ON WORKER" in line]
    bound = 2 * harakiri + 2  # nginx's uwsgi_read_timeout is 2 x harakiri + 1 s
    prompt = status in (502, 504) and seconds <= bound
    return FaultRecord(
        name="stuck-request", patch=patch.label if patch else "",
        layout=layout_label(layout, patch) + f" harakiri={harakiri}",
        load=f"wrk -c{connections} GET {duration:g} s + 1 GET of {stuck_ms / 1000:g} s",
        faults_injected=1,
        requests_sent=sent_requests(run) + 1,
        requests_failed=run.errors.total + (status != 200),
        data_lost=0,
        notes=(
            f"stuck request: HTTP {status or 'no answer'} after {seconds:.2f} s; uWSGI harakiri log lines: "
            f"{len(harakiri_lines)}; respawned worker(s): {respawned or 'none'}",
            kinds,
        ) + (("uWSGI 2.0 keeps one harakiri deadline per worker, and every request that ends on that worker "
              "clears it: with threads > 1 under load a stuck request is never killed",)
             if layout.threads > 1 and not harakiri_lines else ()),
        checks=(
            check(f"the client gets a prompt error (502/504 within 2 x harakiri + 2 s = {bound} s, "
                  f"not after {stuck_ms / 1000:g} s)",
                  prompt, f"HTTP {status or 'no answer'} after {seconds:.2f} s"),
            check("the stuck request is not replayed on another worker",
                  len(entries) == 1 and len(entries[0].upstreams) == 1,
                  f"access log: {[a.upstreams for a in entries]}"),
            check("the worker is respawned", bool(respawned), f"workers with a new pid: {respawned or 'none'}"),
            check("other requests are unaffected (0 failed)", run.errors.total == 0, describe_errors(run)),
        ),
        figures={"status": status, "seconds": seconds, "respawned": respawned, "errors": run.errors.total,
                 "harakiri_lines": len(harakiri_lines)},
    )


def _respawned(stack: Stack, old: dict[int, int], timeout: float) -> list[int]:
    """Worker ids whose pid changed (and accept again), polled until ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            now = {w["id"]: (w["pid"], w.get("accepting")) for w in stack.stats()["workers"]}
            changed = [w for w, (pid, acc) in now.items() if pid not in (0, old.get(w)) and acc == 1]
            if changed:
                return changed
        except (OSError, ValueError):
            pass
        if time.monotonic() > deadline:
            return []
        time.sleep(0.05)


def backlog_full(lab: Lab, spec: str = "1x1-shared", transport: str = "tcp", backlog: int = 2,
                 connections: int = 32, duration: float = 4.0, slow_ms: int = 200, probes: int = 8,
                 patch: Patch | None = None, **options) -> FaultRecord:
    """Flood a one-thread layout with a tiny listen backlog: the excess must fail fast, no
    request may hang, and the stack must serve again as soon as the flood stops."""
    with lab.stack(spec, patch, transport=transport, backlog=backlog, **options) as stack:
        layout = stack.layout
        slow = f"/?rounds=1&fib=0&io_ms={slow_ms}"
        with Sampler(layout.stats_address) as sampler:
            flood = WrkProcess(layout.url.rstrip("/") + slow, connections, duration, timeout_s=10)
            try:
                sampler.wait_flowing(2)
                answers = concurrently(lambda: http_request(layout, "GET", slow, timeout=20), [()] * probes)
                (run,), _ = run_wrks(flood)
            finally:
                flood.stop()
        recovery_s, recovery_status = _recovery(layout, timeout=15.0)
        kinds = nginx_errors_note(stack)
        # nginx's default max_fails=1: one failure takes a server out for fail_timeout (10 s).
        conf = (stack.run_dir / "nginx.conf").read_text()
        servers = re.findall(r"(?m)^\s*server (?:unix:)?[\w./:-]+[^;\n]*;", conf)
        can_be_marked_down = any("max_fails=0" not in line for line in servers)
    failed = [(s, t) for s, t, _ in answers if s != 200]
    slowest_failure = max((t for _, t in failed), default=0.0)
    bound = layout.connect_timeout + 0.5
    return FaultRecord(
        name="backlog-full", patch=patch.label if patch else "",
        layout=layout_label(layout, patch) + f" backlog={backlog}",
        load=f"wrk -c{connections} GET of {slow_ms} ms {duration:g} s + {probes} probes",
        faults_injected=1,
        requests_sent=sent_requests(run) + probes,
        requests_failed=run.errors.total + len(failed),
        data_lost=0,
        notes=(
            f"probes: {Counter(s for s, _ in failed) or 'no failure'} failed, slowest failure after "
            f"{slowest_failure:.3f} s; {sum(1 for s, _, _ in answers if s == 200)} served",
            kinds,
            f"after the flood: first 200 after {recovery_s:.2f} s (last status {recovery_status})",
        ),
        checks=(
            check("the backlog overflowed (some excess requests were refused)", bool(failed) or run.errors.status > 0,
                  f"{len(failed)} probes, {run.errors.status} wrk requests refused"),
            check(f"excess connections fail fast (5xx within connect_timeout + 0.5 s = {bound:g} s)",
                  all(s in (502, 503, 504) for s, _ in failed) and slowest_failure <= bound,
                  f"{sorted(Counter(s for s, _ in failed).items())}, slowest after {slowest_failure:.2f} s"),
            check("no request hangs (every probe answered)", all(s != 0 for s, _, _ in answers),
                  f"{sum(1 for s, _, _ in answers if s == 0)} unanswered"),
            check("the stack recovers when load drops (a request succeeds within 3 s)",
                  recovery_status == 200 and recovery_s <= 3.0,
                  f"first 200 after {recovery_s:.2f} s" if recovery_status == 200 else f"still {recovery_status}"),
        ),
        figures={"slowest_failure_s": slowest_failure, "failed_probes": len(failed), "recovery_s": recovery_s,
                 "recovery_status": recovery_status, "wrk_status_errors": run.errors.status,
                 "servers_can_be_marked_down": can_be_marked_down},
    )


def _recovery(layout: Layout, timeout: float) -> tuple[float, int]:
    """Seconds until a normal request is answered 200 again (polled), and the last status."""
    t0 = time.monotonic()
    while True:
        status, _, _ = http_request(layout, "GET", "/?rounds=1&fib=0&io_ms=1", timeout=5)
        elapsed = time.monotonic() - t0
        if status == 200 or elapsed > timeout:
            return elapsed, status
        time.sleep(0.05)


RELOAD_START_S = 30  # the reload command's interpreter may take this long beyond the reload's own --timeout


def reload_deadline(timeout: float) -> float:
    """The longest ``reload_command(timeout=...)`` runs before it is killed (the reload's own
    --timeout, and its interpreter's start)."""
    return timeout + RELOAD_START_S


def reload_command(layout: Layout, timeout: float = 30.0) -> tuple[int, float, str]:
    """``uwsgi-layouts reload`` on a running layout: (exit code, seconds, output)."""
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "uwsgi_layouts", "reload", layout.name, "--run-dir", layout.run_dir,
         "--timeout", str(int(timeout))],
        cwd=Path(__file__).resolve().parent.parent, capture_output=True, text=True, timeout=reload_deadline(timeout),
    )
    return proc.returncode, time.monotonic() - t0, (proc.stdout + proc.stderr).strip()


RELOAD_TIMEOUT_S = 30
AFTER_RELOAD_S = 1.0  # the load goes on this long at least once the reload is done: the new workers serve it


def chain_reload_under_load(lab: Lab, spec: str = "2x4-mapped", connections: int = 50, duration: float = 6.0,
                            patch: Patch | None = None, mix: Mix | None = None, **options) -> FaultRecord:
    """``uwsgi-layouts reload`` (uWSGI chain reload) while wrk holds 50 connections (the demo
    app's fast GET, or the user's ``mix``) for ``duration`` s, and on until ``AFTER_RELOAD_S``
    after the command returned. The command is a Python interpreter starting: on a busy machine
    its start alone can outlast a load of fixed length (7.3 s for a 0.3-s chain reload, at 2
    cores 99% busy), and a reload after the load proves nothing of failed requests; so wrk runs
    until then (its duration is only a cap) and is ended, its summary kept (``end_now``)."""
    with lab.stack(spec, patch, **options) as stack:
        layout = stack.layout
        with Sampler(layout.stats_address) as sampler:
            # wrk's duration is only a cap: past the longest the command can run, and the time after it
            cap = duration + reload_deadline(RELOAD_TIMEOUT_S) + AFTER_RELOAD_S
            load = get_load(lab, layout, FAST_GET, connections, cap, mix)
            try:
                sampler.wait_flowing(100)
                old = stack.worker_pids()
                rc, seconds, output = reload_command(layout, timeout=RELOAD_TIMEOUT_S)
                t_done = time.monotonic() - load.started
                under_load = load.running()  # wrk still sending when the command returned
                new = stack.worker_pids()
                time.sleep(max(AFTER_RELOAD_S, duration - (time.monotonic() - load.started)))
                load.end_now()
                (run,), _ = run_wrks(load)
            finally:
                load.stop()
        kinds = nginx_errors_note(stack)
    changed = sorted(w for w in old if new.get(w) != old[w])
    return FaultRecord(
        name="chain-reload", patch=patch.label if patch else "",
        layout=layout_label(layout, patch),
        load=f"wrk -c{connections} {'your requests' if mix else 'GET'} {duration:g} s (or until {AFTER_RELOAD_S:g} s "
             "after the reload)",
        faults_injected=1,
        requests_sent=sent_requests(run),
        requests_failed=run.errors.total,
        data_lost=0,
        notes=(f"`uwsgi-layouts reload`: exit {rc} after {seconds:.1f} s: {output.splitlines()[-1][:160]}",
               kinds),
        checks=(
            check("the reload command succeeds while the load runs", rc == 0 and under_load,
                  f"exit {rc}, done {t_done:.1f} s into a load of {run.duration_s:.1f} s"),
            check("0 failed requests", run.errors.total == 0, describe_errors(run)),
            check("every worker pid changes", changed == sorted(old), f"changed: {changed} of {sorted(old)}"),
        ),
        figures={"rc": rc, "seconds": seconds, "errors": run.errors.total, "changed": changed,
                 "done_s": round(t_done, 3), "load_s": run.duration_s},
    )


def broken_reload(lab: Lab, spec: str = "2x4-mapped", connections: int = 8, duration: float = 5.0,
                  patch: Patch | None = None, **options) -> FaultRecord:
    """Deploy broken code, then ``uwsgi-layouts reload``, under load: (1) a syntax error;
    (2) valid code that root can read but the run user cannot (mode 0600). The command must
    fail within 10 s naming the cause, and the old workers must keep serving."""
    app = FaultApp.create(lab.new_dir())
    with lab.stack(spec, patch, **app.options(), **options) as stack:
        layout = stack.layout
        good = app.module.read_text()
        cases = [("syntax error", "SyntaxError",
                  lambda: app.module.write_text(good.replace("start_response):", "start_response:", 1)))]
        if layout.drops_privileges:
            cases.append((f"readable by root, not by {layout.user}", "PermissionError",
                          lambda: (app.module.write_text(good), app.module.chmod(0o600))))
        outcomes = []
        with Sampler(layout.stats_address) as sampler:
            load = WrkProcess(layout.url.rstrip("/") + "/?io_ms=20", connections, duration)
            try:
                sampler.wait_flowing(50)
                old = stack.worker_pids()
                for what, needle, deploy_broken in cases:
                    shutil.rmtree(app.app_dir / "__pycache__", ignore_errors=True)
                    deploy_broken()
                    rc, seconds, output = reload_command(layout, timeout=30)
                    outcomes.append((what, needle, rc, seconds, output))
                app.module.write_text(good)
                app.module.chmod(0o644)
                alive = stack.uwsgi.poll() is None
                new = stack.worker_pids() if alive else {}
                (run,), _ = run_wrks(load)
            finally:
                load.stop()
        after, _, _ = http_request(layout, "GET", "/?io_ms=1", timeout=10)
        uwsgi_tail = stack_tail(stack)
    checks = []
    for what, needle, rc, seconds, output in outcomes:
        first = output.splitlines()[0] if output else ""
        checks.append(check(f"{what}: the command fails within 10 s naming the cause ({needle})",
                            rc not in (0, None) and seconds <= 10 and needle in output,
                            f"exit {rc} after {seconds:.1f} s: {first[:200]}"))
    checks += [
        check("the old workers keep serving (same pids, 0 failed requests)",
              alive and new == old and run.errors.total == 0 and after == 200,
              f"uWSGI {'alive' if alive else 'DEAD'}, pids {'unchanged' if new == old else f'{old} -> {new}'}, "
              f"{describe_errors(run)}, then HTTP {after}"),
    ]
    return FaultRecord(
        name="broken-reload", patch=patch.label if patch else "",
        layout=layout_label(layout, patch),
        load=f"wrk -c{connections} GET {duration:g} s",
        faults_injected=len(cases),
        requests_sent=sent_requests(run) + 1,
        requests_failed=run.errors.total + (after != 200),
        data_lost=0,
        notes=tuple(f"{what}: {output.splitlines()[0][:200] if output else '(no output)'}"
                    for what, _, _, _, output in outcomes)
        + (() if alive else ("uWSGI died: " + " | ".join(uwsgi_tail.splitlines()[-4:]),)),
        checks=tuple(checks),
        figures={"outcomes": [(w, rc, s) for w, _, rc, s, _ in outcomes], "alive": alive,
                 "errors": run.errors.total},
    )


def nginx_children(master: int) -> set[int]:
    return {p.pid for p in nginx_workers(master)}


def nginx_reloads(lab: Lab, spec: str = "2x4-mapped", connections: int = 8, duration: float = 8.0,
                  interval: float = 1.5, patch: Patch | None = None, mix: Mix | None = None, **options) -> FaultRecord:
    """SIGHUP nginx every ``interval`` s under two loads (the demo app's fast GET, or the user's
    ``mix``): keep-alive connections (wrk's default) and a new connection per request
    (``Connection: close``)."""
    with lab.stack(spec, patch, **options) as stack:
        layout = stack.layout
        master = stack.nginx.pid
        reloads, replaced = 0, 0
        with Sampler(layout.stats_address) as sampler:
            keep = get_load(lab, layout, FAST_GET, connections, duration, mix)
            close = get_load(lab, layout, FAST_GET, connections, duration, mix, close=True)
            try:
                t_flow = sampler.wait_flowing(50)
                t_next = sampler.t0 + t_flow
                while time.monotonic() + interval < sampler.t0 + duration - 0.5:
                    wait_until(t_next, 0)
                    before = nginx_children(master)
                    os.kill(master, signal.SIGHUP)
                    reloads += 1
                    deadline = time.monotonic() + 5
                    while time.monotonic() < deadline and not (nginx_children(master) - before):
                        time.sleep(0.02)
                    replaced += bool(nginx_children(master) - before)
                    t_next += interval
                (keep_run, close_run), _ = run_wrks(keep, close)
            finally:
                keep.stop()
                close.stop()
        same_master = stack.nginx.poll() is None and stack.nginx.pid == master
        kinds = nginx_errors_note(stack)
    k = keep_run.errors
    return FaultRecord(
        name="nginx-reload", patch=patch.label if patch else "",
        layout=layout_label(layout, patch),
        load=f"wrk -c{connections} keep-alive + -c{connections} Connection: close, "
             f"{'your requests' if mix else 'GET'} {duration:g} s",
        faults_injected=reloads,
        requests_sent=sent_requests(keep_run) + sent_requests(close_run),
        requests_failed=keep_run.errors.total + close_run.errors.total,
        data_lost=0,
        notes=(
            f"{reloads} SIGHUPs, {replaced} saw new nginx workers; keep-alive load: {describe_errors(keep_run)}; "
            f"Connection: close load: {describe_errors(close_run)}",
            "a keep-alive connection that is idle when an old nginx worker exits is closed; a request the "
            "client sends on it at that instant is reset (wrk counts a read error; clients that retry "
            "idempotent requests, as RFC 9112 9.3.1 allows, do not see it). nginx has no directive for it.",
            kinds,
        ),
        checks=(
            check("every SIGHUP reloads nginx, same master", reloads > 0 and replaced == reloads and same_master,
                  f"{replaced}/{reloads} reloads, master {'unchanged' if same_master else 'CHANGED/DEAD'}"),
            check("0 failed requests on new connections (Connection: close)", close_run.errors.total == 0,
                  describe_errors(close_run)),
            check("keep-alive load: no 5xx, timeout or connect error (only resets of idle keep-alive connections)",
                  k.status == k.timeout == k.connect == k.write == 0 and k.read <= reloads * connections,
                  describe_errors(keep_run)),
        ),
        figures={"reloads": reloads, "keep_errors": keep_run.errors.total, "keep_read": k.read,
                 "close_errors": close_run.errors.total},
    )


def wait_respawned(stack: Stack, old: dict[int, int], wid: int, timeout: float = 10.0) -> float:
    """Seconds until worker ``wid`` has a new pid and accepts again (polled)."""
    t0 = time.monotonic()
    deadline = t0 + timeout
    while time.monotonic() < deadline:
        try:
            for w in stack.stats()["workers"]:
                if w["id"] == wid and w["pid"] not in (0, old[wid]) and w.get("accepting") == 1:
                    return time.monotonic() - t0
        except (OSError, ValueError):
            pass
        time.sleep(0.01)
    raise StackError(f"worker {wid} was not respawned within {timeout:.0f} s", stack_tail(stack))


def stack_tail(stack: Stack) -> str:
    return tail(stack.uwsgi_log, 15)


# The experiments run on every layout given (faults' plan adds backlog-full, on a layout of its own).
PER_LAYOUT = {
    "kill-worker": kill_worker,
    "stuck-request": stuck_request,
    "chain-reload": chain_reload_under_load,
    "broken-reload": broken_reload,
    "nginx-reload": nginx_reloads,
}
