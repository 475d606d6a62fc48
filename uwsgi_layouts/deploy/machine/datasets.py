"""A data set (uwsgi-layouts dataset) on this machine: its files, its index and nginx's map
of it, with the facts the map was sized from (``deploy.render.write_map`` writes them)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from uwsgi_layouts.deploy.machine.paths import is_kind
from uwsgi_layouts.deploy.model import FACTS_NAME, MAP_NAME, LayoutError, MapError, MapFacts, config_path


def check_data_dir(raw: str) -> str:
    """The data set's directory resolved, with files/, index.json and a current map, or
    LayoutError("data_dir", ...) saying how to make what is missing."""
    data = Path(os.path.expanduser(str(raw))).resolve()
    if not is_kind(data / "files", "dir") or not is_kind(data / "index.json", "file"):
        raise LayoutError("data_dir", f"{raw!r} is not a data set (files/ and index.json): "
                                      "create one with `make dataset`")
    try:
        read_map_facts(data)  # nginx's id -> path map for /nfiles/, written with the data set
    except MapError as exc:
        raise LayoutError("data_dir", f"{exc}: write it with `uwsgi-layouts dataset --root {data} "
                                      "--map-only`") from None
    return config_path("data_dir", str(data), nginx=True)


def read_map_facts(root: Path) -> MapFacts:
    """The map facts of the data set at ``root``; MapError (one line) if missing or inconsistent."""
    root = Path(root)
    try:
        data = json.loads((root / FACTS_NAME).read_text(encoding="utf-8"))
    except OSError:
        raise MapError(f"no {FACTS_NAME} in {root}") from None
    except ValueError:
        raise MapError(f"{FACTS_NAME}: not valid JSON") from None
    facts = MapFacts.from_json(data)
    try:
        size = (root / MAP_NAME).stat().st_size
    except OSError:
        raise MapError(f"no {MAP_NAME} in {root}") from None
    if size != facts.map_bytes:
        raise MapError(f"{MAP_NAME} is {size} bytes but {FACTS_NAME} describes {facts.map_bytes}: "
                       "they were not written together")
    return facts


def map_is_current(root: Path, source: dict) -> bool:
    """True if ``root`` holds a consistent map made from ``source``."""
    try:
        return read_map_facts(root).source == source
    except MapError:
        return False
