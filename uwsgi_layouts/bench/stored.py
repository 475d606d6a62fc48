"""A kind's stored judgement beside its results: how compare's, tune's and doctor's summaries are
written and read back (``bench.summary.Summary``, ``TuneSummary``, ``DoctorSummary``), with the
JSON codec they share (``to_data``, ``from_data``).

A stored summary is a frozen dataclass with the fields ``version``, ``kind`` and ``created``, and
class constants ``KIND`` and ``VERSION``. It is written as ``summary.json`` (``SUMMARY_NAME``)
by the one atomic writer, through the codec below (fields as JSON, enums as their
values), and read back through the same codec by the fields' type hints, each part validated on
creation. A file that cannot be trusted (not JSON, another kind's, a version this tool does not
read, a field out of place, an outcome its own interval contradicts) is refused with one line
naming the field (``ResultsError``: exit 2). A kind says what it refuses before its fields are read
(``refuse``: compare's old versions) and what it checks after (``contradiction``).
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar

from uwsgi_layouts.bench.results import ResultsError
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
    def refuse(cls, path: Path | str, data) -> None:
        """Before the fields are read: a file of another kind (ResultsError, one line)."""
        if isinstance(data, dict) and data.get("kind") != cls.KIND:
            raise ResultsError(f"{path}: kind: a summary of a {data.get('kind')!r} run, beside the results of a "
                               f"{cls.KIND} run")

    def contradiction(self) -> str | None:
        """After the fields are read: a stored outcome its own figures contradict (None: none)."""
        return None

    @classmethod
    def load(cls, path: Path | str):
        """The summary stored at ``path``; ResultsError (one line naming the field) when it cannot be read."""
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError, RecursionError) as exc:  # RecursionError: nested too deep to be ours
            raise ResultsError(f"{path}: not a readable summary ({exc})") from None
        cls.refuse(path, data)
        try:
            summary = from_data(cls, data)
        except (TypeError, ValueError, KeyError) as exc:
            raise ResultsError(f"{path}: {exc}") from None
        try:
            problem = summary.contradiction()
        except (TypeError, ValueError, KeyError, ArithmeticError, AttributeError) as exc:
            problem = f"its figures cannot be checked ({exc})"  # well typed, but not what we write
        if problem is not None:
            raise ResultsError(f"{path}: {problem}")
        return summary


# --------------------------------------------------------------------------- the JSON codec


def _stored(cls) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(cls) if f.metadata.get("stored", True)]


def to_data(value):
    """JSON-ready data of a summary or any part of it: dataclasses as objects of their stored
    fields, enums as their values, tuples as lists."""
    if dataclasses.is_dataclass(value):
        return {f.name: to_data(getattr(value, f.name)) for f in _stored(type(value))}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Mapping):
        return {k: to_data(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return [to_data(x) for x in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # "inf": an open interval's end; JSON itself has no infinity
    return value


def from_data(cls, data):
    """``cls`` built from ``to_data``'s output, each field by its type hint (and validated by the
    dataclasses themselves on creation)."""
    if not isinstance(data, dict):
        raise ValueError(f"{cls.__name__}: expected an object, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {}
    for f in _stored(cls):
        if f.name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ValueError(f"{cls.__name__}.{f.name}: missing")
            continue
        fields[f.name] = _value(hints[f.name], data[f.name], f"{cls.__name__}.{f.name}")
    return cls(**fields)


def _value(hint, data, where: str):
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if data is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _value(inner, data, where)
    if origin is Mapping:
        if not isinstance(data, dict):
            raise ValueError(f"{where}: expected an object, got {type(data).__name__}")
        return types.MappingProxyType({str(k): _value(args[1], v, where) for k, v in data.items()})
    if origin is tuple:
        if not isinstance(data, list):
            raise ValueError(f"{where}: expected a list, got {type(data).__name__}")
        return tuple(_value(args[0], x, where) for x in data)
    if dataclasses.is_dataclass(hint):
        return from_data(hint, data)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        try:
            return hint(data)
        except ValueError:
            raise ValueError(f"{where}: must be one of {', '.join(str(m.value) for m in hint)}, got {data!r}") from None
    if hint is float and isinstance(data, int) and not isinstance(data, bool):
        return float(data)
    if hint is float and data in ("inf", "-inf"):
        return float(data)
    if not isinstance(data, hint) or (hint is int and isinstance(data, bool)):
        raise ValueError(f"{where}: expected {hint.__name__}, got {data!r}")
    return data
