"""Format versions: the one this tool writes, those it reads, and the migration of version 1
(compare's ``results.json`` without a ``kind``, openloop's ``openloop.json``) to version 2."""

from __future__ import annotations

from uwsgi_layouts.bench.results.checks import ResultsError

FORMAT_VERSION = 2
READS_VERSIONS = (1, 2)

def migrate_v1(data: dict, source: str) -> dict:
    """Version 1 as version 2: compare's results.json had no ``kind``; openloop's openloop.json
    had ``kind: openloop``, its arguments and steps, and a stored knee (dropped: derived)."""
    kind = data.get("kind", "compare")
    if kind == "compare":
        return {**data, "kind": "compare", "format_version": FORMAT_VERSION}
    if kind == "openloop":
        arguments = data.get("arguments", {})
        if not isinstance(arguments, dict):
            raise ResultsError(f"{source}: arguments must be an object")
        data = {k: v for k, v in data.items() if k != "knee"}
        return {**data, "format_version": FORMAT_VERSION,
                "workload": {"path": arguments.get("path", ""), "files": arguments.get("files", "")}}
    raise ResultsError(f"{source}: format_version 1 files of kind {kind!r} were never written by this tool")
