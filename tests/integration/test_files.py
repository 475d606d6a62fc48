"""/files/<id> through real nginx + uWSGI: exact bytes by X-Accel-Redirect, by the app
(?via=app) and by nginx alone (/static/, and /nfiles/<id> through nginx's map of the index,
which no request reaches uWSGI through: the stats server's request count says so); the
internal location is not reachable from outside; traversal attempts get 400/404 and never
the bytes of a file outside the data set.

Under root the stack runs as www-data, so the data set lives in a 0755 directory under a
0711 /tmp/ul-... run directory (traversable, not listable), like the benchmark's.
"""

from __future__ import annotations

import http.client
import os
import socket

import pytest

from tests.integration.support import settled_requests, via_nginx
from uwsgi_layouts.bench.dataset import file_bytes, make_dataset
from uwsgi_layouts.deploy.machine import read_map_facts
from uwsgi_layouts.deploy.render import nginx_test

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

SECRET = b"SENTINEL-outside-the-data-set-3f9c1e\n"


@pytest.fixture(scope="module")
def files_stack(start_module_stack, module_run_dirs):
    """One stack for the module's tests: each only sends requests (and counts the app's own
    around them), none changes the stack, so a stack per test bought nothing but its start."""
    base = module_run_dirs()  # 0711
    data = base / "ds"
    index = make_dataset(data, small_count=30, small_size=5 * 1024, large_count=1, large_size=300_000, seed=7)
    os.chmod(data, 0o755)
    # Files a traversal could reach: beside the data set (its parent) and at its root, next to files/.
    for path in (base / "sentinel.txt", data / "sentinel.txt"):
        path.write_bytes(SECRET)
        os.chmod(path, 0o644)
    stack = start_module_stack("2x2-mapped", data_dir=str(data), sendfile=True, run_dir=str(module_run_dirs()))
    return stack, index


def raw_get(layout, target: str, timeout: float = 10.0) -> tuple[int, bytes]:
    """GET with the request target sent byte for byte (http.client would not normalise it
    either, but this also allows targets it refuses, such as ones with '\\')."""
    with socket.create_connection((layout.listen_host, layout.listen_port), timeout=timeout) as conn:
        conn.sendall(f"GET {target} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n".encode("latin-1"))
        data = b""
        while chunk := conn.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, body


def test_accel_app_and_static_send_the_exact_bytes(files_stack):
    stack, index = files_stack
    layout = stack.layout
    for file_id in ("s00003", "s00029", "l0000", index.hot_id):
        want = file_bytes(index.seed, file_id, index.sizes[file_id])
        for path in (f"/files/{file_id}", f"/files/{file_id}?via=app", f"/static/{index.files[file_id]}"):
            status, headers, body = via_nginx(layout, path)
            assert status == 200, (path, status, body[:200])
            assert body == want, path
            assert int(headers["content-length"]) == len(want), path
            # nginx consumes the X-Accel-Redirect header: the client never sees the internal path.
            assert "x-accel-redirect" not in headers, path

    # The id lookup went through uWSGI; /static/ did not.
    before = sum(settled_requests(layout).values())
    assert via_nginx(layout, "/files/s00004")[0] == 200
    after_accel = sum(settled_requests(layout, at_least=before + 1).values())
    assert via_nginx(layout, f"/static/{index.files['s00004']}")[0] == 200
    assert after_accel == before + 1 == sum(settled_requests(layout).values())


def test_internal_location_is_not_reachable_directly(files_stack):
    stack, index = files_stack
    rel = index.files["s00003"]
    for target in (f"/_internal_files/{rel}", "/_internal_files/", f"/_internal_files//{rel}",
                   f"/%5Finternal_files/{rel}", f"/static/../_internal_files/{rel}"):
        status, body = raw_get(stack.layout, target)
        assert status == 404, (target, status)
        assert body != file_bytes(index.seed, "s00003", index.sizes["s00003"])


@pytest.mark.parametrize("target", [
    "/files/../sentinel.txt",
    "/files/..%2fsentinel.txt",
    "/files/..%2F..%2Fsentinel.txt",
    "/files/%2e%2e/sentinel.txt",
    "/files/s00001/../../sentinel.txt",
    "/files/s00001%00",
    "/files/s00001%2f..%2f..%2fsentinel.txt",
    "/files/s00001?via=../../sentinel.txt",
    "/files/%2e%2e%2fsentinel.txt?via=app",
    "/static/../sentinel.txt",
    "/static/..%2fsentinel.txt",
    "/static/%2e%2e/sentinel.txt",
    "/static/%2e%2e/%2e%2e/sentinel.txt",
    "/static/../../sentinel.txt",
    "/static/small/../../sentinel.txt",
    "/static/small/../../../sentinel.txt",
    "/static/..\\sentinel.txt",
    "/static../sentinel.txt",
    "/static/../index.json",
    "/_internal_files/../sentinel.txt",
    "/_internal_files/..%2fsentinel.txt",
    "/../sentinel.txt",
    "/sentinel.txt",
])
def test_traversal_attempts_get_400_or_404_never_the_sentinel(files_stack, target):
    stack, _ = files_stack
    status, body = raw_get(stack.layout, target)
    assert status in (400, 404), (target, status, body[:200])
    assert SECRET not in body
    assert b'"files"' not in body  # nor index.json


def test_bad_and_unknown_ids(files_stack):
    stack, _ = files_stack
    for path, want in (("/files/s99999", 404), ("/files/x1", 400), ("/files/S00001", 400), ("/files/", 400),
                       ("/files/s00001?via=disk", 400), ("/files/s00001?via=app&via=app", 400)):
        status, _, body = via_nginx(stack.layout, path)
        assert status == want, (path, status, body[:200])


def test_head_sends_no_body(files_stack):
    stack, index = files_stack
    layout = stack.layout
    conn = http.client.HTTPConnection(layout.listen_host, layout.listen_port, timeout=10)
    try:
        for path in ("/files/s00002", "/files/s00002?via=app"):
            conn.request("HEAD", path)
            resp = conn.getresponse()
            assert resp.status == 200 and resp.read() == b""
            assert int(resp.getheader("content-length")) == index.sizes["s00002"], path
    finally:
        conn.close()


# --- /nfiles/<id>: nginx looks the id up itself (a map of the index) -------------------------------


def uwsgi_requests(layout) -> int:
    return sum(settled_requests(layout).values())


def test_nfiles_sends_the_exact_bytes_without_uwsgi(files_stack):
    stack, index = files_stack
    layout = stack.layout
    before = uwsgi_requests(layout)
    for file_id in ("s00003", "s00029", "l0000", index.hot_id):
        want = file_bytes(index.seed, file_id, index.sizes[file_id])
        status, headers, body = via_nginx(layout, f"/nfiles/{file_id}")
        assert status == 200 and body == want, (file_id, status, body[:100])
        assert int(headers["content-length"]) == len(want)
        assert headers["content-type"] == "application/octet-stream"
    conn = http.client.HTTPConnection(layout.listen_host, layout.listen_port, timeout=10)
    try:
        conn.request("HEAD", "/nfiles/s00002")
        resp = conn.getresponse()
        assert resp.status == 200 and resp.read() == b""
        assert int(resp.getheader("content-length")) == index.sizes["s00002"]
        conn.request("POST", "/nfiles/s00002", body=b"x")
        resp = conn.getresponse()
        resp.read()
        assert resp.status == 405  # nginx's static module: GET and HEAD only
    finally:
        conn.close()
    # A request the app does count, so an unchanged count below means something.
    assert via_nginx(layout, "/files/s00004")[0] == 200
    assert sum(settled_requests(layout, at_least=before + 1).values()) == before + 1


# Each stays under /nfiles/ once nginx has decoded and normalised it, so nginx alone answers.
NFILES_REFUSED = [
    "/nfiles/s99999",  # well-formed, not in the index
    "/nfiles/s00030",  # one past the last id
    "/nfiles/S00001",  # map keys match case-insensitively; the location's regex does not
    "/nfiles/s000011",  # too long for the index's ids
    "/nfiles/s0000100000000000000000000000000000000001",
    "/nfiles/s001",  # too short
    "/nfiles/",
    "/nfiles/default",  # a map keyword, not a key
    "/nfiles/s00001/",
    "/nfiles/s00001/x",
    "/nfiles/s00001.bin",
    "/nfiles/small/00/00/s00001.bin",
    "/nfiles/x/../s99999",
    "/nfiles/s00001/../s99999",
    "/nfiles/s00001/%2e%2e/s99999",
    "/nfiles/s00001%2f..%2fs99999",
    "/nfiles/%73%30%30%30%30%31%2e%2e",
    "/nfiles/s00001%20",
    "/nfiles/s00001;x",
    "/nfiles/\u00e9s00001".encode().decode("latin-1"),
    "/nfiles/s0000\u0661",  # a non-ASCII digit (as UTF-8 bytes)
]


def test_nfiles_unknown_and_traversal_ids_get_404_from_nginx_alone(files_stack):
    stack, index = files_stack
    layout = stack.layout
    before = uwsgi_requests(layout)
    for target in NFILES_REFUSED:
        status, body = raw_get(layout, target.encode("utf-8").decode("latin-1"))
        assert status == 404, (target, status, body[:200])
        assert SECRET not in body and b'"files"' not in body
        assert not any(body == file_bytes(index.seed, i, index.sizes[i]) for i in ("s00001", "s00000"))
    # None of them reached uWSGI: its stats server counts every request its workers took.
    assert uwsgi_requests(layout) == before


@pytest.mark.parametrize("target", [
    "/nfiles/../sentinel.txt",
    "/nfiles/..%2fsentinel.txt",
    "/nfiles/%2e%2e/sentinel.txt",
    "/nfiles/..%2f..%2fnfiles%2fs99999",  # above the root: nginx's 400
    "/nfiles/%2e%2e/ds/sentinel.txt",
    "/nfiles/s00001/../../sentinel.txt",
    "/nfiles/s00001/%2e%2e/%2e%2e%2fsentinel.txt",
    "/nfiles/s00001%2f..%2f..%2fsentinel.txt",
    "/nfiles/%2e%2e/index.json",
    "/nfiles/%2e%2e/_internal_files/small/00/00/s00001.bin",
    "/nfiles/s00001%00",
])
def test_nfiles_traversal_out_of_the_route_never_reaches_a_file(files_stack, target):
    """A `..` that climbs out of /nfiles/ is resolved by nginx before it picks a location (RFC
    3986 dot segments), so it is a request for another path and goes where that path goes: here
    the app, which answers 404, or nginx's 400. Never a file, never the sentinel. (/nfiles/%2e%2e
    is a request for /, the app's page.)"""
    stack, _ = files_stack
    status, body = raw_get(stack.layout, target)
    assert status in (400, 404), (target, status, body[:200])
    assert SECRET not in body and b'"files"' not in body


def test_a_10000_id_map_passes_nginx_t_and_serves(start_stack, run_dirs):
    base = run_dirs()
    data = base / "ds"
    index = make_dataset(data, small_count=10_000, small_size=64, large_count=0, seed=3)
    os.chmod(data, 0o755)
    facts = read_map_facts(data)
    assert facts.sizing.ids == 10_000 and facts.sizing.max_size > 2048  # nginx's default would warn
    layout_dir = run_dirs()
    stack = start_stack("1x2-mapped", data_dir=str(data), sendfile=True, run_dir=str(layout_dir))
    ok, output = nginx_test(layout_dir)
    assert ok and "test is successful" in output and "could not build" not in output, output
    before = uwsgi_requests(stack.layout)
    for file_id in ("s00000", "s04567", "s09999"):
        status, _, body = via_nginx(stack.layout, f"/nfiles/{file_id}")
        assert status == 200 and body == file_bytes(index.seed, file_id, 64), file_id
    assert via_nginx(stack.layout, "/nfiles/s10000")[0] == 404
    assert uwsgi_requests(stack.layout) == before
