"""/files/<id> through real nginx + uWSGI: exact bytes by X-Accel-Redirect, by the app
(?via=app) and by nginx alone (/static/); the internal location is not reachable from
outside; traversal attempts get 400/404 and never the bytes of a file outside the data set.

Under root the stack runs as www-data, so the data set lives in a 0755 directory under a
0711 /tmp/ul-... run directory (traversable, not listable), like the benchmark's.
"""

from __future__ import annotations

import http.client
import os
import socket

import pytest

from bench.dataset import file_bytes, make_dataset
from tests.integration.support import settled_requests, via_nginx

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

SECRET = b"SENTINEL-outside-the-data-set-3f9c1e\n"


@pytest.fixture
def files_stack(start_stack, run_dirs):
    base = run_dirs()  # 0711
    data = base / "ds"
    index = make_dataset(data, small_count=30, small_size=5 * 1024, large_count=1, large_size=300_000, seed=7)
    os.chmod(data, 0o755)
    # Files a traversal could reach: beside the data set (its parent) and at its root, next to files/.
    for path in (base / "sentinel.txt", data / "sentinel.txt"):
        path.write_bytes(SECRET)
        os.chmod(path, 0o644)
    stack = start_stack("2x2-mapped", data_dir=str(data), sendfile=True, run_dir=str(run_dirs()))
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
