"""The fault-injection app for ``uwsgi-layouts faults``: GET sleeps ``?io_ms=``; POST records
``?id=`` (one line per handler run, written BEFORE the work, so a POST replayed after a crash
shows up twice) and then sleeps. Nothing else.

The experiments copy this file into a temporary app directory of their own, so the handler log
(``data/handled.log`` next to the copy) lands outside the repository; they also rewrite the copy
to deploy broken code. It does not import anything of this repository: the copy must run alone.
"""

import os
import time
from urllib.parse import parse_qs

HERE = os.path.dirname(os.path.abspath(__file__))
LOG = os.path.join(HERE, "data", "handled.log")
MAX_IO_MS = 30000


def application(environ, start_response):
    query = parse_qs(environ.get("QUERY_STRING", ""))
    io_ms = int(query.get("io_ms", ["0"])[0] or 0)
    if environ.get("REQUEST_METHOD") == "POST":
        line = "%s %d\n" % (query.get("id", ["-"])[0], os.getpid())
        fd = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
        length = int(environ.get("CONTENT_LENGTH") or 0)
        if length:
            environ["wsgi.input"].read(min(length, 1 << 20))
    if io_ms:
        time.sleep(min(io_ms, MAX_IO_MS) / 1000)
    body = b"ok"
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body))),
                              ("X-Worker-Pid", str(os.getpid()))])
    return [body]
