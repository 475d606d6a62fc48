"""Reading a results file of any kind and of any version this tool reads (``load``,
``from_dict``): version 1 is migrated, anything else refused with one line saying why."""

from __future__ import annotations

import json
from pathlib import Path

from uwsgi_layouts.bench.results import registry
from uwsgi_layouts.bench.results.checks import ResultsError
from uwsgi_layouts.bench.results.record import Results
from uwsgi_layouts.bench.results.versions import READS_VERSIONS, migrate_v1


def load(path: Path | str) -> Results:
    """A results file of any kind and of any version this tool reads (version 1 is migrated)."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ResultsError(f"{path}: cannot read results JSON ({exc.strerror or exc})") from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ResultsError(f"{path}: cannot read results JSON ({exc})") from None
    return from_dict(data, source=str(path))


def from_dict(data, source: str = "results") -> Results:
    if not isinstance(data, dict):
        raise ResultsError(f"{source}: not a results object")
    version = data.get("format_version")
    if version not in READS_VERSIONS:
        raise ResultsError(f"{source}: format_version {version!r} is not supported (this tool reads "
                           f"{' and '.join(map(str, READS_VERSIONS))})")
    if version == 1:
        data = migrate_v1(data, source)
    kind = data.get("kind")
    kinds = registry.KIND_RECORDS
    if kind not in kinds:
        # Kinds beyond the three built in register themselves when their module is imported.
        raise ResultsError(f"{source}: kind {kind!r} is not one this tool reads ({', '.join(kinds)}); "
                           "in Python, import uwsgi_layouts.bench.kinds first: it registers every kind")
    records = kinds[kind]
    missing = [k for k in ("environment", "arguments", "workload", records) if k not in data]
    if missing:
        raise ResultsError(f"{source}: missing {', '.join(missing)}")
    for name in registry.RECORD_FIELDS:
        if name in data and not isinstance(data[name], list):
            raise ResultsError(f"{source}: {name} must be a list")
    try:
        return Results(
            environment=data["environment"], arguments=data["arguments"], workload=data["workload"],
            created=data.get("created", ""), kind=kind,
            **{name: tuple(data.get(name) or ()) for name in registry.RECORD_FIELDS},
        )
    except ResultsError as exc:
        raise ResultsError(f"{source}: {exc}") from None
