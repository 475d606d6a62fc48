"""Request lists for the file scenarios, and random_files.lua under real wrk (integration)."""

from __future__ import annotations

import http.server
import subprocess
import threading
from pathlib import Path

import pytest

from uwsgi_layouts.bench.dataset import make_dataset
from uwsgi_layouts.bench.load.files import (
    RANDOM_FILES_LUA,
    request_paths,
    write_path_list,
    write_wlog,
    wrk_script_args,
)
from uwsgi_layouts.bench.load.wrk import parse_output


@pytest.fixture
def index(tmp_path):
    return make_dataset(tmp_path / "ds", small_count=40, small_size=300, large_count=2, large_size=70_000)


def test_modes_give_the_documented_paths(index):
    assert request_paths(index, "accel")[:2] == ["/files/s00001", "/files/s00002"]
    assert request_paths(index, "app")[0] == "/files/s00001?via=app"
    assert request_paths(index, "static")[0] == "/static/small/00/00/s00001.bin"
    assert request_paths(index, "nginx")[:2] == ["/nfiles/s00001", "/nfiles/s00002"]
    assert request_paths(index, "hot", hot_route="nginx") == ["/nfiles/s00000"]
    assert request_paths(index, "hot") == ["/static/small/00/00/s00000.bin"]
    assert request_paths(index, "hot", hot_route="accel") == ["/files/s00000"]
    assert request_paths(index, "accel", which="large") == ["/files/l0000", "/files/l0001"]
    assert len(request_paths(index, "static", which="all")) == 41


def test_random_lists_leave_the_hot_file_out(index):
    for mode in ("accel", "app", "static", "nginx"):
        paths = request_paths(index, mode, which="all")
        assert not any("s00000" in p for p in paths)


@pytest.mark.parametrize("kw", [{"mode": "ftp"}, {"mode": "accel", "which": "medium"},
                                {"mode": "hot", "hot_route": "ftp"}])
def test_bad_choices_say_what_is_allowed(index, kw):
    with pytest.raises(ValueError, match="must be one of"):
        request_paths(index, **kw)


def test_path_list_is_one_path_per_line(index, tmp_path):
    dest = write_path_list(index, "static", tmp_path / "lists" / "static.txt")
    lines = dest.read_text().splitlines()
    assert lines == request_paths(index, "static")
    assert wrk_script_args(dest, 3) == ["--", str(dest.resolve()), "3"]


def test_wlog_is_a_seeded_shuffle_separated_by_nuls(index, tmp_path):
    a = write_wlog(index, "accel", tmp_path / "a", seed=1).read_bytes()
    b = write_wlog(index, "accel", tmp_path / "b", seed=1).read_bytes()
    c = write_wlog(index, "accel", tmp_path / "c", seed=2).read_bytes()
    assert a == b != c
    assert a.endswith(b"\0")
    entries = a[:-1].decode().split("\0")
    assert sorted(entries) == sorted(request_paths(index, "accel")) and entries != request_paths(index, "accel")


# --- real wrk ----------------------------------------------------------------------------------


class _Recorder(http.server.BaseHTTPRequestHandler):
    seen: list[str]
    root: Path

    def do_GET(self):  # noqa: N802 (http.server's naming)
        self.seen.append(self.path)
        rel = self.path.removeprefix("/static/")
        body = (self.root / rel).read_bytes() if self.path.startswith("/static/") else b"no\n"
        self.send_response(200 if self.path.startswith("/static/") else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def _serve_and_wrk(index, list_path, seed, threads, connections, script_args=None):
    seen: list[str] = []
    handler = type("H", (_Recorder,), {"seen": seen, "root": index.files_dir})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/"
        cmd = ["wrk", f"-t{threads}", f"-c{connections}", "-d1s", "--latency", "-s", str(RANDOM_FILES_LUA), url,
               *(wrk_script_args(list_path, seed) if script_args is None else script_args)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
    return proc, list(seen)


@pytest.mark.integration
def test_random_files_lua_requests_listed_paths_and_reports_json(index, tmp_path):
    listed = write_path_list(index, "static", tmp_path / "static.txt")
    proc, seen = _serve_and_wrk(index, listed, seed=5, threads=2, connections=2)
    assert proc.returncode == 0, proc.stderr
    data = parse_output(proc.stdout)
    assert data["requests"] > 20 and data["errors"]["status"] == 0
    allowed = set(request_paths(index, "static"))
    assert seen and set(seen) <= allowed
    assert len(set(seen)) > 10  # random, not one path


@pytest.mark.integration
def test_random_files_lua_sequence_depends_only_on_the_seed(index, tmp_path):
    listed = write_path_list(index, "static", tmp_path / "static.txt")
    runs = [_serve_and_wrk(index, listed, seed, threads=1, connections=1)[1] for seed in (7, 7, 8)]
    n = min(len(r) for r in runs)
    assert n > 50
    assert runs[0][:n] == runs[1][:n]
    assert runs[0][:n] != runs[2][:n]


@pytest.mark.integration
def test_random_files_lua_without_a_list_fails(index):
    proc, seen = _serve_and_wrk(index, None, None, threads=1, connections=1, script_args=[])
    assert proc.returncode != 0 and seen == []
    assert "PATH_LIST_FILE" in proc.stdout + proc.stderr
