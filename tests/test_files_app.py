"""``GET /files/<id>`` called directly on the WSGI app with a tiny data set (no server).

The X-Accel-Redirect answer, the app-streamed answer, unknown ids, and a long list of
traversal attempts that must get 400/404 without any file outside the data set (a
sentinel next to it, in particular) ever being opened.
"""

from __future__ import annotations

import builtins
import io
import os
from pathlib import Path

import pytest

from uwsgi_layouts.app import files
from uwsgi_layouts.app.wsgi import application
from uwsgi_layouts.bench.dataset import make_dataset

SENTINEL = b"SENTINEL-must-never-be-served-7f3a"


def call(path: str, query: str = "", method: str = "GET", file_wrapper=None):
    environ = {
        "REQUEST_METHOD": method,
        "PATH_INFO": path,
        "QUERY_STRING": query,
        "SERVER_NAME": "test",
        "SERVER_PORT": "80",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "wsgi.input": io.BytesIO(b""),
        "wsgi.errors": io.StringIO(),
        "wsgi.url_scheme": "http",
        "wsgi.version": (1, 0),
        "wsgi.multithread": True,
        "wsgi.multiprocess": True,
        "wsgi.run_once": False,
    }
    if file_wrapper is not None:
        environ["wsgi.file_wrapper"] = file_wrapper
    seen = {}

    def start_response(status, headers, exc_info=None):
        assert "status" not in seen, "start_response called twice"
        seen["status"], seen["headers"] = status, headers
        return lambda data: pytest.fail("the app must not use write()")

    result = application(environ, start_response)
    try:
        body = b"".join(result)
    finally:
        if hasattr(result, "close"):
            result.close()
    headers = {}
    for k, v in seen["headers"]:
        assert isinstance(k, str) and isinstance(v, str), (k, v)
        assert k.lower() not in headers, f"header {k} sent twice"
        headers[k.lower()] = v
    return seen["status"], headers, body


@pytest.fixture
def data(tmp_path, monkeypatch):
    """A tiny data set in tmp_path/ds, UL_DATA_DIR pointing at it, and a sentinel beside it."""
    (tmp_path / "sentinel").write_bytes(SENTINEL)
    (tmp_path / "ds-sibling").mkdir()
    (tmp_path / "ds-sibling" / "sentinel").write_bytes(SENTINEL)
    index = make_dataset(tmp_path / "ds", small_count=30, small_size=700, large_count=1, large_size=200_000,
                         seed=4)
    monkeypatch.setenv(files.ENV_DATA_DIR, str(index.root))
    files.reset_cache()
    yield index
    files.reset_cache()


@pytest.fixture
def opened(monkeypatch):
    """Every path passed to open()/io.open()/os.open() from now on, resolved."""
    paths: list[Path] = []
    real_open, real_io_open, real_os_open = builtins.open, io.open, os.open

    def note(file):
        if isinstance(file, (str, bytes, os.PathLike)):
            paths.append(Path(os.fsdecode(file)).resolve())

    def fake_open(file, *a, **kw):
        note(file)
        return real_open(file, *a, **kw)

    def fake_io_open(file, *a, **kw):
        note(file)
        return real_io_open(file, *a, **kw)

    def fake_os_open(path, *a, **kw):
        note(path)
        return real_os_open(path, *a, **kw)

    monkeypatch.setattr(builtins, "open", fake_open)
    monkeypatch.setattr(io, "open", fake_io_open)
    monkeypatch.setattr(os, "open", fake_os_open)
    return paths


# --- the normal answers ------------------------------------------------------------------------


def test_default_answer_is_an_accel_redirect_with_an_empty_body(data):
    status, headers, body = call("/files/s00007")
    assert status == "200 OK"
    assert headers["x-accel-redirect"] == "/_internal_files/small/00/00/s00007.bin"
    assert headers["x-accel-redirect"] == files.INTERNAL_PREFIX + data.files["s00007"]
    assert headers["content-type"] == "application/octet-stream"
    assert headers["content-length"] == "0" and body == b""
    assert "x-worker-pid" in headers


def test_accel_is_also_the_explicit_via(data):
    _, headers, _ = call("/files/l0000", "via=accel")
    assert headers["x-accel-redirect"] == "/_internal_files/large/l0000.bin"


def test_accel_never_opens_the_file(data, opened):
    call("/files/s00001")  # loads the index
    opened.clear()
    call("/files/s00002")
    assert opened == []


@pytest.mark.parametrize("file_id", ["s00000", "s00029", "l0000"])
def test_via_app_streams_the_file_bytes_without_a_file_wrapper(data, file_id):
    status, headers, body = call(f"/files/{file_id}", "via=app")
    assert status == "200 OK"
    assert body == data.path(file_id).read_bytes()
    assert headers["content-length"] == str(len(body))
    assert headers["content-type"] == "application/octet-stream"
    assert "x-accel-redirect" not in headers


def test_via_app_uses_the_servers_file_wrapper(data):
    used = []

    def file_wrapper(f, block_size):
        used.append(block_size)
        return iter(lambda: f.read(block_size), b"")

    status, headers, body = call("/files/l0000", "via=app", file_wrapper=file_wrapper)
    assert status == "200 OK" and used == [64 * 1024]
    assert body == data.path("l0000").read_bytes() and headers["content-length"] == "200000"


def test_via_app_fallback_comes_in_64k_chunks_and_closes_the_file(data):
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/files/l0000", "QUERY_STRING": "via=app"}
    result = application(environ, lambda status, headers: None)
    chunks = list(result)
    assert [len(c) for c in chunks] == [65536, 65536, 65536, 200_000 - 3 * 65536]
    result.close()
    assert result.f.closed


def test_head_gets_headers_only(data):
    status, headers, body = call("/files/l0000", "via=app", method="HEAD")
    assert status == "200 OK" and body == b"" and headers["content-length"] == "200000"
    status, headers, body = call("/files/l0000", method="HEAD")
    assert status == "200 OK" and body == b"" and "x-accel-redirect" in headers


def test_index_is_loaded_once_per_worker(data, opened):
    for _ in range(5):
        call("/files/s00003")
    assert [p.name for p in opened].count("index.json") == 1


def test_unknown_id_is_404_text(data):
    for file_id in ("s00030", "s99999", "l0001", "x00001", "s000001"):
        status, headers, body = call(f"/files/{file_id}")
        assert status.startswith("404 "), file_id
        assert headers["content-type"] == "text/plain" and body == b"unknown file id\n"
        assert "x-accel-redirect" not in headers


def test_post_and_others_are_405(data):
    status, headers, _ = call("/files/s00001", method="POST")
    assert status.startswith("405 ") and headers["allow"] == "GET, HEAD"


@pytest.mark.parametrize("query", ["via=nginx", "via=app&via=app", "via=", "foo=1", "via=app&x=1", "via=%ff"])
def test_bad_query_is_400(data, query):
    status, headers, _ = call("/files/s00001", query)
    assert status.startswith("400 ") and "x-accel-redirect" not in headers


# --- no escape from the data directory ------------------------------------------------------

TRAVERSALS = [
    "/files/", "/files/..", "/files/.", "/files/../sentinel", "/files/../../sentinel",
    "/files/..%2fsentinel", "/files/..%2Fsentinel", "/files/%2e%2e/sentinel", "/files/%2e%2e%2fsentinel",
    "/files/..%252fsentinel", "/files/..\\sentinel", "/files/%5c..%5csentinel",
    "/files//etc/passwd", "/files/etc/passwd", "/files/" + "/" * 3 + "sentinel",
    "/files/s00001/../../sentinel", "/files/s00001/../../../ds-sibling/sentinel", "/files/s00001/",
    "/files/s00001/x", "/files/s00001%00", "/files/s00001\x00", "/files/s00001\x00/../sentinel",
    "/files/s00001\n", "/files/s00001\r\n", "/files/ s00001", "/files/s00001 ", "/files/S00001",
    "/files/s0000\u0661", "/files/s\uff10\uff10\uff10\uff11", "/files/s00001.bin", "/files/s00001;x",
    "/files/s00001?via=app", "/files/small/00/00/s00001.bin", "/files/index.json", "/files/index",
    "/files/~/sentinel", "/files/%7e", "/files/s1", "/files/s0000001", "/files/" + "s0" * 5000,
    "/files/\xc3\xa9", "/files/..\u2215sentinel", "/files/.%2e/sentinel", "/files/%u002e%u002e",
    "/files/" + "../" * 20 + "etc/passwd",
]


@pytest.mark.parametrize("path", TRAVERSALS)
def test_traversal_attempts_are_refused_without_opening_anything(data, opened, path):
    call("/files/s00001")  # index loaded and cached: any further open would be a file read
    opened.clear()
    for query in ("", "via=app"):
        status, headers, body = call(path, query)
        # Every entry is a malformed id: the validator, not the index lookup, must stop it.
        assert status.startswith("400 "), (path, status)
        assert "x-accel-redirect" not in headers
        assert SENTINEL not in body
        assert headers["content-type"] == "text/plain"
    assert opened == [], opened


@pytest.mark.parametrize("path", TRAVERSALS)
def test_bad_ids_are_refused_before_the_data_set_is_even_looked_for(monkeypatch, opened, path):
    # Validation happens before any filesystem access: even without a data set, a bad id is 400.
    monkeypatch.setenv(files.ENV_DATA_DIR, "/nonexistent-data-dir")
    files.reset_cache()
    status, _, _ = call(path)
    assert status.startswith("400 "), (path, status)
    assert opened == []


@pytest.mark.parametrize("file_id, ok", [
    ("s00042", True), ("l0001", True), ("s123456", True), ("z0000", True),
    ("s000", False), ("s0000000", False), ("S00042", False), ("s00042\n", False), ("\ns00042", False),
    ("s0004\u0662", False), ("s\uff10\uff10\uff10\uff10", False), ("", False), ("ss0000", False),
    ("s00042 ", False), ("s-0042", False), ("s+0042", False), ("\u017f00042", False),
])
def test_valid_id_is_strict(file_id, ok):
    assert files.valid_id(file_id) is ok


def test_a_tampered_index_cannot_point_outside(tmp_path, monkeypatch, opened):
    root = tmp_path / "ds"
    (root / "files").mkdir(parents=True)
    (tmp_path / "sentinel").write_bytes(SENTINEL)
    monkeypatch.setenv(files.ENV_DATA_DIR, str(root))
    opened.clear()  # from here on, only the app's opens are recorded (plus our index writes)
    for rel in ("../sentinel", "/etc/passwd", "a/../../sentinel", "a//b", "./x", "a/.."):
        (root / "index.json").write_text(
            '{"format_version": 1, "files": {"s00001": %s}, "hot_id": "s00001"}' % repr(rel).replace("'", '"'))
        files.reset_cache()
        status, headers, body = call("/files/s00001", "via=app")
        assert status.startswith("503 ") and SENTINEL not in body and "x-accel-redirect" not in headers, rel
    assert all(p.name == "index.json" for p in opened)


def test_a_symlink_out_of_the_data_set_is_not_followed(data, opened):
    target = data.path("s00005")
    target.unlink()
    target.symlink_to(data.root.parent / "sentinel")
    call("/files/s00001")
    opened.clear()
    status, _, body = call("/files/s00005", "via=app")
    assert status.startswith("404 ") and SENTINEL not in body
    assert opened == []


def test_a_missing_file_is_404_via_app(data):
    data.path("s00006").unlink()
    status, _, body = call("/files/s00006", "via=app")
    assert status.startswith("404 ") and body == b"file missing from the dataset\n"


# --- not configured -----------------------------------------------------------------------------


def test_without_a_data_dir_it_is_503(monkeypatch):
    monkeypatch.delenv(files.ENV_DATA_DIR, raising=False)
    files.reset_cache()
    status, headers, body = call("/files/s00001")
    assert status == "503 Service Unavailable"
    assert headers["content-type"] == "text/plain"
    assert body == b"no dataset configured: run make dataset\n"


def test_a_data_dir_without_an_index_is_503_and_retried(tmp_path, monkeypatch):
    monkeypatch.setenv(files.ENV_DATA_DIR, str(tmp_path / "ds"))
    files.reset_cache()
    status, _, body = call("/files/s00001")
    assert status.startswith("503 ") and b"run make dataset" in body
    make_dataset(tmp_path / "ds", small_count=3, small_size=10, large_count=0)
    status, headers, _ = call("/files/s00001")  # the failure was not cached
    assert status == "200 OK" and headers["x-accel-redirect"].endswith("/s00001.bin")


def test_other_routes_are_unchanged(data):
    assert call("/healthz")[0] == "200 OK"
    assert call("/files")[0].startswith("404 ")
    assert call("/filesx/s00001")[0].startswith("404 ")
    assert call("/", "rounds=0&fib=0&io_ms=0")[2] == b"Hello, world"
