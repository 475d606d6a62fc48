"""``GET /files/<id>``: look a file id up and let nginx send the bytes.

The app only does the lookup (id -> path in the data set's index); by default it answers
with ``X-Accel-Redirect: /_internal_files/<relative path>`` and an empty body, and nginx
replaces the response with the file from an ``internal`` location (sendfile, optionally
``aio threads``). ``?via=app`` streams the file from Python instead (``wsgi.file_wrapper``,
which uWSGI turns into sendfile; otherwise 64 KB chunks), for comparison.

Safety: the id must fully match ``ID_RE`` before anything touches the filesystem, so
``..``, slashes (decoded or not), percent signs, NULs, absolute paths and non-ASCII digits
are all rejected with 400. A well-formed id that is not in the index is a 404. The paths in
the index are themselves checked when it is loaded (relative, plain segments, no ``..``),
and a file is only opened after its resolved path is confirmed to lie inside the data set's
``files/`` directory.

Configuration comes from the worker's environment (uWSGI ``env = UL_DATA_DIR=...``): the
data set root made by ``uwsgi-layouts dataset`` (it holds ``index.json`` and ``files/``).
The index is loaded once per worker, on first use, and cached; regenerate the data set ->
restart the stack.
"""

from __future__ import annotations

import json
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl

ENV_DATA_DIR = "UL_DATA_DIR"
INDEX_NAME = "index.json"
FILES_SUBDIR = "files"
FORMAT_VERSION = 1
ROUTE_PREFIX = "/files/"
# nginx: `location /_internal_files/ { internal; alias <root>/files/; }`
INTERNAL_PREFIX = "/_internal_files/"
# nginx: `location /static/ { alias <root>/files/; }` (no app involved)
STATIC_PREFIX = "/static/"

# A file id: one lowercase letter and 4-6 ASCII digits ("s00042", "l0001"). fullmatch only:
# `$` would accept a trailing newline, and \d would accept non-ASCII digits.
ID_RE = re.compile(r"[a-z][0-9]{4,6}", re.ASCII)
# A relative path in the index: plain segments of [A-Za-z0-9_-] (the last may carry one
# extension), so "." and ".." and empty segments cannot occur, nor a leading "/".
REL_PATH_RE = re.compile(r"[A-Za-z0-9_-]+(/[A-Za-z0-9_-]+)*(\.[A-Za-z0-9]+)?", re.ASCII)
VIAS = ("accel", "app")
CHUNK = 64 * 1024
ALLOWED_METHODS = ("GET", "HEAD")
MAX_QUERY_FIELDS = 4


class DatasetUnavailable(ValueError):
    """The data set index is missing or malformed (answered with 503)."""


def valid_id(file_id: str) -> bool:
    return ID_RE.fullmatch(file_id) is not None


def valid_rel_path(rel: str) -> bool:
    return REL_PATH_RE.fullmatch(rel) is not None


@dataclass(frozen=True)
class LoadedIndex:
    root: Path  # the data set root (UL_DATA_DIR), resolved
    files_dir: Path  # root/files, resolved
    files: dict[str, str]  # id -> path relative to files_dir
    hot_id: str


def load_index(root: str | os.PathLike) -> LoadedIndex:
    """Read and check ``root/index.json``; raise DatasetUnavailable with a one-line reason."""
    root = Path(root)
    try:
        root = root.resolve(strict=True)
        text = (root / INDEX_NAME).read_text(encoding="utf-8")
    except OSError as exc:
        raise DatasetUnavailable(f"no readable {INDEX_NAME} in {ENV_DATA_DIR} ({exc.__class__.__name__})") from None
    try:
        data = json.loads(text)
    except ValueError:
        raise DatasetUnavailable(f"{INDEX_NAME}: not valid JSON") from None
    if not isinstance(data, dict) or data.get("format_version") != FORMAT_VERSION:
        raise DatasetUnavailable(f"{INDEX_NAME}: format_version must be {FORMAT_VERSION}")
    files = data.get("files")
    if not isinstance(files, dict) or not files:
        raise DatasetUnavailable(f"{INDEX_NAME}: 'files' must be a non-empty object")
    for file_id, rel in files.items():
        if not (isinstance(file_id, str) and valid_id(file_id)):
            raise DatasetUnavailable(f"{INDEX_NAME}: bad file id {str(file_id)[:20]!r}")
        if not (isinstance(rel, str) and valid_rel_path(rel)):
            raise DatasetUnavailable(f"{INDEX_NAME}: bad relative path for {file_id}")
    hot_id = data.get("hot_id")
    if hot_id not in files:
        raise DatasetUnavailable(f"{INDEX_NAME}: hot_id is not one of the files")
    files_dir = (root / FILES_SUBDIR).resolve()
    return LoadedIndex(root=root, files_dir=files_dir, files=dict(files), hot_id=hot_id)


# One index per worker process, keyed by the data directory it came from.
_cache: dict[str, LoadedIndex] = {}
_cache_lock = threading.Lock()


def cached_index(data_dir: str) -> LoadedIndex:
    index = _cache.get(data_dir)
    if index is None:
        with _cache_lock:  # uWSGI threads: load once
            index = _cache.get(data_dir)
            if index is None:
                index = load_index(data_dir)  # a failure is not cached: the next request retries
                _cache[data_dir] = index
    return index


def reset_cache() -> None:
    with _cache_lock:
        _cache.clear()


def file_path(index: LoadedIndex, file_id: str) -> Path | None:
    """The file's absolute path, or None if it would lie outside ``files_dir`` (e.g. a symlink)."""
    path = (index.files_dir / index.files[file_id]).resolve()
    if index.files_dir not in path.parents:
        return None
    return path


def _parse_via(query_string: str) -> str:
    try:
        pairs = parse_qsl(query_string, keep_blank_values=True, encoding="utf-8", errors="strict",
                          max_num_fields=MAX_QUERY_FIELDS)
    except ValueError:
        raise ValueError("query string: not valid UTF-8 key=value pairs") from None
    via = None
    for key, value in pairs:
        if key != "via":
            raise ValueError("unknown parameter; allowed: via=accel|app")
        if via is not None:
            raise ValueError("via: given more than once")
        if value not in VIAS:
            raise ValueError("via: must be accel or app")
        via = value
    return via or "accel"


class _Chunks:
    """Fallback when the server has no wsgi.file_wrapper: the file in CHUNK-sized blocks."""

    def __init__(self, f, size: int = CHUNK):
        self.f, self.size = f, size

    def __iter__(self):
        while True:
            block = self.f.read(self.size)
            if not block:
                return
            yield block

    def close(self) -> None:
        self.f.close()


def handle(environ, start_response, base_headers=()):
    """Answer a request whose PATH_INFO starts with ``/files/``."""
    method = environ.get("REQUEST_METHOD", "GET")
    path = environ.get("PATH_INFO", "")
    base_headers = list(base_headers)

    def text(status: str, message: str, extra=()):
        body = message.encode("utf-8", "replace")
        headers = [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))]
        start_response(status, headers + base_headers + list(extra))
        return [b""] if method == "HEAD" else [body]

    if method not in ALLOWED_METHODS:
        return text("405 Method Not Allowed", "files: only GET and HEAD\n", [("Allow", ", ".join(ALLOWED_METHODS))])
    file_id = path[len(ROUTE_PREFIX):] if path.startswith(ROUTE_PREFIX) else ""
    # Validate before any filesystem access. The id is never echoed back.
    if not valid_id(file_id):
        return text("400 Bad Request", "bad file id: expected a letter and 4-6 digits, such as s00042\n")
    try:
        via = _parse_via(environ.get("QUERY_STRING", ""))
    except ValueError as exc:
        return text("400 Bad Request", f"{exc}\n")
    data_dir = os.environ.get(ENV_DATA_DIR, "")
    if not data_dir:
        return text("503 Service Unavailable", "no dataset configured: run make dataset\n")
    try:
        index = cached_index(data_dir)
    except DatasetUnavailable as exc:
        return text("503 Service Unavailable", f"dataset unavailable: {exc}; run make dataset\n")
    rel = index.files.get(file_id)
    if rel is None:
        return text("404 Not Found", "unknown file id\n")
    if via == "accel":
        # nginx swaps this response for the internal location's file; the body is unused.
        headers = [("Content-Type", "application/octet-stream"), ("Content-Length", "0"),
                   ("X-Accel-Redirect", INTERNAL_PREFIX + rel)]
        start_response("200 OK", headers + base_headers)
        return [b""]
    return _stream(index, file_id, environ, start_response, base_headers, method, text)


def _stream(index: LoadedIndex, file_id: str, environ, start_response, base_headers, method, text):
    path = file_path(index, file_id)
    if path is None:
        return text("404 Not Found", "unknown file id\n")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return text("404 Not Found", "file missing from the dataset\n")
    f = os.fdopen(fd, "rb")
    try:
        size = os.fstat(fd).st_size
        headers = [("Content-Type", "application/octet-stream"), ("Content-Length", str(size))]
        start_response("200 OK", headers + base_headers)
    except BaseException:
        f.close()
        raise
    if method == "HEAD":
        f.close()
        return [b""]
    wrapper = environ.get("wsgi.file_wrapper")
    return wrapper(f, CHUNK) if wrapper is not None else _Chunks(f)
