"""``Results``: one run of any kind, its records and what they were measured with, written as
one JSON file (``save``); ``utc_now`` for its ``created``."""

from __future__ import annotations

import datetime as dt
import json
import re
from dataclasses import dataclass
from pathlib import Path

from uwsgi_layouts.bench.results import registry
from uwsgi_layouts.bench.results.cells import Cell
from uwsgi_layouts.bench.results.checks import _check, _mapping
from uwsgi_layouts.bench.results.diagnoses import Diagnosis
from uwsgi_layouts.bench.results.faults import FaultRecord
from uwsgi_layouts.bench.results.frozen import read_only
from uwsgi_layouts.bench.results.steps import Step, find_knee
from uwsgi_layouts.bench.results.versions import FORMAT_VERSION
from uwsgi_layouts.files import write_atomic

RECORD_TYPES = {"cells": Cell, "steps": Step, "faults": FaultRecord, "diagnoses": Diagnosis}


@dataclass(frozen=True)
class Results:
    environment: dict
    arguments: dict
    workload: dict
    cells: tuple[Cell, ...] = ()
    created: str = ""
    format_version: int = FORMAT_VERSION
    kind: str = "compare"
    steps: tuple[Step, ...] = ()
    faults: tuple[FaultRecord, ...] = ()
    diagnoses: tuple[Diagnosis, ...] = ()

    def __post_init__(self):
        _check(self.format_version == FORMAT_VERSION,
               f"format_version: this tool writes version {FORMAT_VERSION}, got {self.format_version!r}")
        kinds = registry.KIND_RECORDS
        _check(self.kind in kinds, f"kind: must be one of {', '.join(kinds)}, got {self.kind!r}")
        for name in ("environment", "arguments", "workload"):
            object.__setattr__(self, name, read_only(_mapping(getattr(self, name), name)))
        _check(isinstance(self.created, str), "created: must be a string (ISO 8601 time)")
        for name, cls in RECORD_TYPES.items():
            records = getattr(self, name)
            _check(isinstance(records, (list, tuple)), f"{name}: must be a list")
            _check(not records or name == kinds[self.kind], f"{name}: the results of kind {self.kind} hold "
                                                            f"{kinds[self.kind]}, not {name}")
            object.__setattr__(self, name, tuple(r if isinstance(r, cls) else cls.from_dict(r) for r in records))
        keys = [(c.scenario, *c.key) for c in self.cells]
        _check(len(keys) == len(set(keys)), "cells: a (scenario, layout, concurrency, repeat) appears twice")
        if self.kind in registry.KIND_CHECKS:
            registry.KIND_CHECKS[self.kind](self)

    @property
    def records(self) -> tuple:
        """This kind's records (cells, steps, faults or diagnoses)."""
        return getattr(self, registry.KIND_RECORDS[self.kind])

    @property
    def layouts(self) -> list[str]:
        """Layouts in the order they were given."""
        order = self.arguments.get("layouts") or []
        seen = [c.layout for c in self.cells]
        return [x for x in order if x in seen] + sorted({x for x in seen if x not in order})

    @property
    def levels(self) -> list[int]:
        return sorted({c.concurrency for c in self.cells})

    @property
    def scenarios(self) -> list[str]:
        return list(dict.fromkeys(c.scenario for c in self.cells))

    @property
    def knee(self) -> dict:
        """The open loop's knee, derived from the steps."""
        return find_knee(self.steps)

    def to_dict(self) -> dict:
        records = registry.KIND_RECORDS[self.kind]
        data = {
            "format_version": self.format_version,
            "kind": self.kind,
            "created": self.created,
            "environment": self.environment,
            "arguments": self.arguments,
            "workload": self.workload,
            records: [r.to_dict() for r in self.records],
        }
        if records == "steps":
            data["knee"] = self.knee  # for readers of the JSON; recomputed on load
        return data

    def save(self, path: Path | str) -> Path:
        """Write atomically (temp file + rename): a crash never leaves half a results file. A pair
        of numbers (a histogram's ``[latency_us, count]``) stays on one line."""
        text = _PAIR.sub(r"[\1, \2]", json.dumps(self.to_dict(), indent=2, sort_keys=False))
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        return write_atomic(path, text + "\n")


# Only structural whitespace: JSON strings cannot hold a raw newline, so nothing inside one matches.
_PAIR = re.compile(r"\[\n\s*(-?[0-9][0-9.eE+-]*),\n\s*(-?[0-9][0-9.eE+-]*)\n\s*\]")


def utc_now() -> str:
    """``created``: the time a run started, ISO 8601 in UTC to the second."""
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
