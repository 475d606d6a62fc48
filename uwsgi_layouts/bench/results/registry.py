"""Which experiment kinds a ``Results`` may be of, the record field each fills, and each kind's
own check. The built-in kinds are here; ``register_kind`` adds one (tune, doctor). The records
and the loader read these tables through this module (``registry.KIND_RECORDS``), so that a test
may swap them for a copy."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from uwsgi_layouts.bench.results.record import Results

# Experiment kind -> the record field its Results fill. ``register_kind`` adds one (e.g. tune).
KIND_RECORDS: dict[str, str] = {"compare": "cells", "openloop": "steps", "faults": "faults"}
RECORD_FIELDS = ("cells", "steps", "faults", "diagnoses")

# Experiment kind -> a check of its whole Results (e.g. its own arguments), run on creation and load.
KIND_CHECKS: dict[str, Callable[[Results], None]] = {}


def register_kind(name: str, records: str, check: Callable[[Results], None] | None = None) -> None:
    """Let a new experiment kind save ``Results``: ``records`` is the field it fills; ``check``
    (optional) validates what else the kind stores, raising ResultsError with one line."""
    if records not in RECORD_FIELDS:
        raise ValueError(f"records: must be one of {', '.join(RECORD_FIELDS)}, got {records!r}")
    if KIND_RECORDS.get(name, records) != records:
        raise ValueError(f"kind {name!r} is already registered with {KIND_RECORDS[name]!r}")
    KIND_RECORDS[name] = records
    if check is not None:
        KIND_CHECKS[name] = check
