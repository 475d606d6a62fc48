"""nginx's id -> path map of a data set, written beside its index (``/nfiles/<id>``): the map
file, then the facts nginx's hash sizes come from (deploy.model's nginx_map explains them),
written last as the map's commit mark."""

from __future__ import annotations

import json
from pathlib import Path

from uwsgi_layouts.deploy.model import FACTS_NAME, MAP_NAME, MapFacts, map_text, size_hash
from uwsgi_layouts.files import write_atomic


def _write_atomic(path: Path, text: str) -> None:
    # 0644: nginx (its master, or a test's unprivileged user) reads it
    write_atomic(path, text.encode("ascii"), mode=0o644)


def write_map(root: Path, files: dict[str, str], source: dict, check=None) -> MapFacts:
    """Write ``root/nginx-files.map`` and then ``root/nginx-files.json`` (each replaced atomically)."""
    root = Path(root)
    sizing = size_hash(list(files))
    text = map_text(files, check)
    _write_atomic(root / MAP_NAME, text)
    facts = MapFacts(sizing=sizing, map_bytes=len(text.encode("ascii")), source=dict(source))
    _write_atomic(root / FACTS_NAME, json.dumps(facts.to_json(), indent=1) + "\n")
    return facts


