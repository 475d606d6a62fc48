"""Request lists for the file scenarios: which URL paths a load generator asks for.

Modes (each line is a request path on the nginx front):

- ``accel``:  ``/files/<id>``          the app looks the id up, nginx sends the file (X-Accel-Redirect)
- ``app``:    ``/files/<id>?via=app``  the app looks it up and streams it from Python
- ``static``: ``/static/<rel path>``   nginx alone, no app
- ``nginx``:  ``/nfiles/<id>``         nginx looks the id up itself (a map of the index) and sends the file
- ``hot``:    one line, the data set's hot file (through ``hot_route``: static by default, as in the
  thread-pool article, where the hot client asks nginx directly)

Random lists exclude the hot file, so in ``files-mixed`` the hot file stays hot and the
random ("cold") requests never hit it. wrk picks lines at random itself
(``bench/load/lua/random_files.lua``); httperf replays its ``--wlog`` list in order, so
``write_wlog`` shuffles it (seeded) and separates paths with NULs as httperf wants.
"""

from __future__ import annotations

import random
from pathlib import Path

from uwsgi_layouts.app.files import ROUTE_PREFIX, STATIC_PREFIX
from uwsgi_layouts.bench.dataset import Index
from uwsgi_layouts.deploy.model import ROUTE_PREFIX as NGINX_ROUTE_PREFIX

RANDOM_FILES_LUA = Path(__file__).resolve().parent / "lua" / "random_files.lua"
MODES = ("accel", "app", "static", "nginx", "hot")
ROUTES = ("accel", "app", "static", "nginx")
WHICH = ("small", "large", "all")


def request_path(index: Index, file_id: str, route: str) -> str:
    if route == "accel":
        return f"{ROUTE_PREFIX}{file_id}"
    if route == "app":
        return f"{ROUTE_PREFIX}{file_id}?via=app"
    if route == "static":
        return f"{STATIC_PREFIX}{index.files[file_id]}"
    if route == "nginx":
        return f"{NGINX_ROUTE_PREFIX}{file_id}"
    raise ValueError(f"route: must be one of {', '.join(ROUTES)}, got {route!r}")


def request_paths(index: Index, mode: str, which: str = "small", hot_route: str = "static") -> list[str]:
    """The request paths for ``mode`` (see the module doc), in index order."""
    if mode not in MODES:
        raise ValueError(f"mode: must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "hot":
        return [request_path(index, index.hot_id, hot_route)]
    if which not in WHICH:
        raise ValueError(f"which: must be one of {', '.join(WHICH)}, got {which!r}")
    ids = {"small": index.small_ids, "large": index.large_ids, "all": list(index.files)}[which]
    ids = [i for i in ids if i != index.hot_id]
    if not ids:
        raise ValueError(f"which: the data set has no {which} files besides the hot one")
    return [request_path(index, i, mode) for i in ids]


def write_path_list(index: Index, mode: str, dest: Path, which: str = "small", hot_route: str = "static") -> Path:
    """One request path per line, for ``random_files.lua``; returns ``dest``."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text("\n".join(request_paths(index, mode, which, hot_route)) + "\n", encoding="ascii")
    return dest


def weighted_paths(index: Index, mode: str, which: str = "small", large_share: float = 0.0,
                   hot_route: str = "static") -> list[str]:
    """``request_paths``, with each large file's path repeated so that a uniform pick from the
    list asks for a large file with probability ``large_share`` (about; 0 = no weighting)."""
    paths = request_paths(index, mode, which, hot_route)
    if not large_share or mode == "hot" or which != "all" or not index.large_ids:
        return paths
    if not 0 < large_share < 1:
        raise ValueError(f"large_share: must be in 0..1, got {large_share!r}")
    large = set(request_paths(index, mode, "large", hot_route))
    small = [p for p in paths if p not in large]
    big = [p for p in paths if p in large]
    if not small:
        return paths
    copies = max(1, round(large_share * len(small) / ((1 - large_share) * len(big))))
    return small + big * copies


def write_lines(dest: Path, paths: list[str]) -> Path:
    """One request path per line (for ``random_files.lua``); returns ``dest``."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text("\n".join(paths) + "\n", encoding="ascii")
    return dest


def write_wlog(index: Index, mode: str, dest: Path, seed: int = 0, which: str = "small",
               hot_route: str = "static") -> Path:
    """The list shuffled with ``seed``, NUL-separated, for ``httperf --wlog=y,FILE``."""
    paths = request_paths(index, mode, which, hot_route)
    random.Random(seed).shuffle(paths)
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_bytes(b"".join(p.encode("ascii") + b"\0" for p in paths))
    return dest


def wrk_script_args(path_list: Path, seed: int = 1) -> list[str]:
    """What follows the URL on wrk's command line for ``-s random_files.lua``."""
    return ["--", str(Path(path_list).resolve()), str(int(seed))]
