"""A kind's stored judgement beside its results: how tune's and doctor's summaries are written and
read back (compare's ``bench.summary.Summary`` is the first of them and keeps its own loader).

A stored summary is a frozen dataclass with the fields ``version``, ``kind`` and ``created``, and
class constants ``KIND`` and ``VERSION``. It is written as ``summary.json`` (``SUMMARY_NAME``)
by the one atomic writer, through ``bench.summary``'s codec (fields as JSON, enums as their
values), and read back through the same codec by the fields' type hints, each part validated on
creation. A file that cannot be trusted (not JSON, another kind's, a version this tool does not
read, a field out of place) is refused with one line naming the field (``ResultsError``: exit 2).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import ClassVar

from uwsgi_layouts.bench.results import ResultsError
from uwsgi_layouts.bench.summary import from_data, to_data
from uwsgi_layouts.files import write_atomic


class StoredSummary:
    """Mixin: ``save`` and ``load`` for a summary dataclass of one kind and version."""

    KIND: ClassVar[str]
    VERSION: ClassVar[int]

    def check_header(self) -> None:
        """For ``__post_init__``: the version and kind this class reads (ValueError naming the field)."""
        if self.version != self.VERSION:
            raise ValueError(f"version: this tool reads {self.KIND} summary version {self.VERSION}, got "
                             f"{self.version!r}")
        if self.kind != self.KIND:
            raise ValueError(f"kind: a summary of a {self.KIND} run, got {self.kind!r}")

    def save(self, path: Path | str) -> Path:
        return write_atomic(Path(path), json.dumps(to_data(self), indent=1, allow_nan=False) + "\n")

    @classmethod
    def load(cls, path: Path | str):
        """The summary stored at ``path``; ResultsError (one line naming the field) when it cannot be read."""
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise ResultsError(f"{path}: not a readable summary ({exc})") from None
        if isinstance(data, dict) and data.get("kind") != cls.KIND:
            raise ResultsError(f"{path}: kind: a summary of a {data.get('kind')!r} run, beside the results of a "
                               f"{cls.KIND} run")
        try:
            return from_data(cls, data)
        except (TypeError, ValueError, KeyError) as exc:
            raise ResultsError(f"{path}: {exc}") from None
