"""nginx's id -> path map of a data set, written beside its index (``/nfiles/<id>``): the map
file, then the facts nginx's hash sizes come from (deploy.model's nginx_map explains them),
written last as the map's commit mark."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from uwsgi_layouts.deploy.model import FACTS_NAME, MAP_NAME, MapFacts, map_text, size_hash


def _write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="ascii") as f:
            f.write(text)
        os.chmod(tmp, 0o644)  # nginx (its master, or a test's unprivileged user) reads it
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_map(root: Path, files: dict[str, str], source: dict, check=None) -> MapFacts:
    """Write ``root/nginx-files.map`` and then ``root/nginx-files.json`` (each replaced atomically)."""
    root = Path(root)
    sizing = size_hash(list(files))
    text = map_text(files, check)
    _write_atomic(root / MAP_NAME, text)
    facts = MapFacts(sizing=sizing, map_bytes=len(text.encode("ascii")), source=dict(source))
    _write_atomic(root / FACTS_NAME, json.dumps(facts.to_json(), indent=1) + "\n")
    return facts


