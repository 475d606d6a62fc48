"""`uwsgi-layouts render|run` as a user runs it: exit codes, one-line errors, nothing written."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import threading
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from tests.leaks import assert_nothing_left, nothing_left, process_state
from uwsgi_layouts import console

REPO_ROOT = Path(__file__).resolve().parent.parent
FILES = {"nginx.conf", "mime.types", "uwsgi.ini", "layout.json", "uwsgi_params"}


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "uwsgi_layouts", *map(str, args)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout,
    )


def cli_in_process(*args: str) -> subprocess.CompletedProcess:
    """``cli(*args)`` run by the console's main in this process, from the checkout as ``cli`` runs it,
    its output captured: a new interpreter per call (0.5 CPU-s for the deploy side, about 2.3 for the
    bench side's imports) was most of many tests' CPU. Used for renders and bundles, for installs and
    for runs of compare, doctor and the refusals, where another test covers the command as a real
    process. argparse's refusals leave through SystemExit, as they end the process; an exception
    escaping main fails the test, as the traceback a user would see.

    What a real process's exit would clean up lives on in the test worker here, so what the call
    leaves behind fails the test: a thread, a child process, an open file descriptor, a changed
    signal handler. Not observable here, so covered by real-process tests: the exit on a signal, and
    output written past Python's sys.stdout. No timeout of its own: pytest's per-test timeout bounds
    it."""
    out, err = io.StringIO(), io.StringIO()
    here = os.getcwd()
    os.chdir(REPO_ROOT)
    try:
        with nothing_left(f"uwsgi-layouts {' '.join(map(str, args))}"), redirect_stdout(out), redirect_stderr(err):
            try:
                code = console.main([str(a) for a in args])
            except SystemExit as exc:
                code = exc.code
    finally:
        os.chdir(here)
    return subprocess.CompletedProcess(["uwsgi-layouts", *map(str, args)], code, out.getvalue(), err.getvalue())


def test_an_in_process_call_fails_on_what_it_leaves_behind():
    """The check cli_in_process runs after each call must be able to fail: a thread, a child, an open
    pipe and a signal handler planted after the state before it was read are each named."""
    before = process_state()
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, daemon=True)
    thread.start()
    child = subprocess.Popen(["sleep", "30"])
    read_end, write_end = os.pipe()
    previous = signal.signal(signal.SIGHUP, lambda *_: None)
    try:
        with pytest.raises(AssertionError) as caught:
            assert_nothing_left(before, "planted", grace_s=0.2)
    finally:
        signal.signal(signal.SIGHUP, previous)
        stop.set()
        thread.join()
        child.kill()
        child.wait()
        os.close(read_end)
        os.close(write_end)
    message = str(caught.value)
    assert str(thread.ident) in message and str(child.pid) in message, message
    assert "pipe:" in message and "SIGHUP" in message, message
    assert_nothing_left(before, "cleaned up", grace_s=0.2)  # and passes once they are gone


def port_args(free_ports, n_sockets: int) -> list[str]:
    ports = free_ports(n_sockets + 1)
    return ["--base-port", str(ports[0]), "--listen", f"127.0.0.1:{ports[n_sockets]}"]


def snapshot(root: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


def staging_dirs(out: Path) -> list[Path]:
    return list(out.parent.glob(f".{out.name}.staging-*"))


def assert_one_line_error(proc: subprocess.CompletedProcess, names: str) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got {proc.stderr!r}"
    assert names in lines[0], lines[0]
    return lines[0]


# --- render: success -----------------------------------------------------------------------


def test_render_writes_the_four_files(tmp_run_dir, free_ports):
    out = tmp_run_dir / "out"
    proc = cli("render", "2x4-mapped", "--out", out, *port_args(free_ports, 2))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert {p.name for p in out.iterdir() if p.is_file()} == FILES
    assert {p.name for p in out.iterdir() if p.is_dir()} == {"logs", "tmp", "sockets", "control"}
    assert "rendered 2x4-mapped" in proc.stdout
    assert "nginx -t: ok" in proc.stdout
    assert "map-socket = 1:2" in (out / "uwsgi.ini").read_text()
    assert not staging_dirs(out)


def test_render_all_options(tmp_run_dir, free_ports, run_dirs):
    tmp_path = run_dirs()
    tmp_path.chmod(0o755)  # an app dir must be readable by the unprivileged user the stack drops to under root
    (tmp_path / "mod.py").write_text("def app(e, s):\n    return []\n")
    out = tmp_run_dir / "o"
    ports = free_ports(3)
    proc = cli("render", "3x2-mapped", "--out", out, "--transport", "unix", "--listen", f"127.0.0.1:{ports[0]}",
               "--stats-port", ports[1], "--allow-tcp-stats", "--nginx-workers", "2", "--backlog", "50",
               "--app", "mod:app", "--app-dir", tmp_path)
    assert proc.returncode == 0, proc.stderr
    ini = (out / "uwsgi.ini").read_text()
    for line in ("module = mod:app", f"chdir = {tmp_path.resolve()}", "listen = 50", "chmod-socket = 660",
                 f"socket = {out}/sockets/uwsgi-2.sock", f"stats = 127.0.0.1:{ports[1]}"):
        assert line in ini.splitlines(), line
    conf = (out / "nginx.conf").read_text()
    assert "worker_processes 2;" in conf and "zone uwsgi_app" in conf
    assert f"server unix:{out}/sockets/uwsgi-0.sock max_fails=0;" in conf


def test_render_no_nginx_test_flag(tmp_run_dir, free_ports):
    out = tmp_run_dir / "o"
    proc = cli("render", "1x1-shared", "--out", out, "--no-nginx-test", *port_args(free_ports, 1))
    assert proc.returncode == 0, proc.stderr
    assert "nginx -t: skipped" in proc.stdout


# --- bad input: exit 2, one line naming the field, nothing written --------------------------

BAD = [
    # (id, layout, extra args, text the error line must contain)
    ("zero-processes", "0x4-mapped", [], "processes"),
    ("negative-processes", "-1x4-mapped", [], "processes"),
    ("zero-threads", "2x0-mapped", [], "threads"),
    ("bad-strategy", "2x4-nope", [], "strategy"),
    ("garbage", "garbage", [], "layout"),
    ("base-port-high", "2x4-mapped", ["--base-port", "70000"], "base_port"),
    ("base-port-text", "2x4-mapped", ["--base-port", "five"], "base_port"),
    ("sockets-past-65535", "4x4-mapped", ["--transport", "tcp", "--base-port", "65534"], "base_port"),
    ("backlog-huge", "2x4-mapped", ["--backlog", "99999999"], "backlog"),
    ("transport", "2x4-mapped", ["--transport", "udp"], "transport"),
    ("listen", "2x4-mapped", ["--listen", "nowhere"], "listen"),
    ("nginx-workers", "2x4-mapped", ["--nginx-workers", "0"], "nginx_workers"),
    ("app", "2x4-mapped", ["--app", "not a callable"], "app"),
    ("app-dir", "2x4-mapped", ["--app-dir", "/nonexistent/dir/for/ul"], "app_dir"),
    ("virtualenv-missing", "2x4-mapped", ["--virtualenv", "/nonexistent/venv/for/ul"], "virtualenv"),
    ("virtualenv-not-one", "2x4-mapped", ["--virtualenv", "/tmp"], "virtualenv"),
    ("env-no-equals", "2x4-mapped", ["--env", "DJANGO_SETTINGS_MODULE"], "env"),
    ("env-key", "2x4-mapped", ["--env", "1A=x"], "env"),
    ("env-expansion", "2x4-mapped", ["--env", "A=$(HOME)"], "env"),
    ("env-newline", "2x4-mapped", ["--env", "A=x\ny"], "env"),
    ("env-uwsgi", "2x4-mapped", ["--env", "UWSGI_MODULE=os:system"], "env"),
    ("static-prefix", "2x4-mapped", ["--static", "assets=/tmp"], "static"),
    ("static-dotdot", "2x4-mapped", ["--static", "/a/../b=/tmp"], "static"),
    ("static-dir", "2x4-mapped", ["--static", "/assets=/nonexistent/dir/for/ul"], "static"),
    ("static-overlap", "2x4-mapped", ["--static", "/a=/tmp", "--static", "/a/b=/tmp"], "static"),
    ("stats-on-listen", "2x4-mapped", ["--listen", "127.0.0.1:8000", "--stats-port", "8000", "--allow-tcp-stats"],
     "stats_port"),
    # TCP stats hands every local user the cookies of requests in flight: only with the option named for it.
    ("stats-port-unaccepted", "2x4-mapped", ["--stats-port", "9191"], "stats_port"),
    ("bogus-option", "2x4-mapped", ["--bogus"], "--bogus"),
    ("bogus-option-value", "2x4-mapped", ["--bogus=1"], "--bogus"),
]


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_render_bad_input(tmp_run_dir, case):
    _, spec, extra, names = case
    out = tmp_run_dir / "out"
    proc = cli("render", "--out", out, *extra, "--", spec)  # "--": argparse would take "-1x4-..." for an option
    line = assert_one_line_error(proc, names)
    if not names.startswith("--"):
        assert line.startswith(f"error: {names}: "), line
    assert not out.exists()
    assert not staging_dirs(out)
    assert list(tmp_run_dir.iterdir()) == []


def test_render_unix_path_too_long(tmp_run_dir):
    out = tmp_run_dir / ("d" * 100)
    line = assert_one_line_error(cli("render", "2x4-mapped", "--out", out, "--transport", "unix"), "run_dir")
    assert line.startswith("error: run_dir: ")
    assert list(tmp_run_dir.iterdir()) == []


def test_render_out_under_a_regular_file(tmp_run_dir, free_ports):
    blocker = tmp_run_dir / "plain-file"
    blocker.write_text("keep me\n")
    out = blocker / "sub" / "out"
    proc = cli("render", "2x4-mapped", "--out", out, *port_args(free_ports, 2))
    line = assert_one_line_error(proc, "out")
    assert line.startswith("error: out: "), line
    assert blocker.read_text() == "keep me\n"
    assert [p.name for p in tmp_run_dir.iterdir()] == ["plain-file"]


def test_missing_command_and_layout_are_one_line_errors():
    assert_one_line_error(cli(), "command")
    assert_one_line_error(cli("render"), "layout")
    assert_one_line_error(cli("deploy-everything", "2x4-mapped"), "deploy-everything")
    # argparse would read "-1x4-mapped" as an option; the CLI still reports it as a bad layout
    line = assert_one_line_error(cli("render", "-1x4-mapped"), "processes")
    assert line.startswith("error: processes: ")


@pytest.mark.parametrize("case", BAD[:6] + BAD[-2:], ids=[c[0] for c in BAD[:6] + BAD[-2:]])
def test_run_bad_input_starts_nothing(tmp_run_dir, case):
    _, spec, extra, names = case
    run_dir = tmp_run_dir / "run"
    proc = cli("run", "--run-dir", run_dir, "--for", "1", *extra, "--", spec)
    assert_one_line_error(proc, names)
    assert not run_dir.exists()
    assert list(tmp_run_dir.iterdir()) == []


def test_run_bad_duration(tmp_run_dir):
    assert_one_line_error(cli("run", "1x1-shared", "--run-dir", tmp_run_dir / "r", "--for", "soon"), "--for")
    assert list(tmp_run_dir.iterdir()) == []


@pytest.mark.parametrize(
    "bad",
    [["0x4-mapped"], ["2x4-nope"], ["2x4-mapped", "--base-port", "70000"], ["2x4-mapped", "--backlog", "99999999"],
     ["2x4-mapped", "--bogus"], ["2x4-mapped", "--transport", "unix", "--app", "x y"]],
    ids=["processes", "strategy", "base_port", "backlog", "bogus", "app"],
)
def test_rerender_with_bad_layout_keeps_old_files(tmp_run_dir, free_ports, bad):
    out = tmp_run_dir / "out"
    proc = cli("render", "2x4-mapped", "--out", out, *port_args(free_ports, 2))
    assert proc.returncode == 0, proc.stderr
    before = snapshot(tmp_run_dir)
    assert {"out/nginx.conf", "out/uwsgi.ini", "out/layout.json", "out/uwsgi_params"} <= set(before)
    spec, *extra = bad
    proc = cli("render", spec, "--out", out, *extra)
    assert proc.returncode == 2, proc.stderr
    assert snapshot(tmp_run_dir) == before
