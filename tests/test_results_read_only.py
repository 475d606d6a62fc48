"""Every record of ``bench.results`` is read-only once created, at any depth.

For each record type (``Results`` of every kind, ``Cell``, ``Latency``, ``Errors``, ``Step``,
``FaultRecord``, ``Check``, ``Diagnosis``): setting or deleting a field raises
FrozenInstanceError, and every mapping and list a record hands out, however deep, refuses every
change with TypeError (a change makes a new record: ``dataclasses.replace``). What a caller passed
in stays the caller's. And a stored file of every kind (format version 2) is written again byte
for byte: files written before the records were read-only (``make_results_v2.py``) and after read
the same in old and new code.

Pure logic on stored JSON: the openloop and doctor files hold real measurements, the compare and
faults files are SYNTHETIC (their scripts, ``make_fixture.py`` and ``make_results_v2.py``, say
which part is which).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import pickle
from pathlib import Path

import pytest

import uwsgi_layouts.bench.kinds  # noqa: F401  (registers every kind, doctor's included)
from uwsgi_layouts.bench.results import Cell, Diagnosis, FaultRecord, Results, Step, from_dict, load

FIXTURES = Path(__file__).parent / "fixtures"
STORED = {"compare": "results-tails.json", "openloop": "results-v2-openloop.json",
          "faults": "results-v2-faults.json", "doctor": "results-v2-doctor.json"}


def stored(kind: str) -> Results:
    return load(FIXTURES / STORED[kind])


# Record type -> a record of it from the stored files.
RECORDS = {
    "Results compare": lambda: stored("compare"),
    "Results openloop": lambda: stored("openloop"),
    "Results faults": lambda: stored("faults"),
    "Results doctor": lambda: stored("doctor"),
    "Cell": lambda: stored("compare").cells[0],
    "Latency": lambda: stored("compare").cells[0].latency_ms,
    "Errors": lambda: stored("compare").cells[0].errors,
    "Step": lambda: stored("openloop").steps[0],
    "FaultRecord": lambda: stored("faults").faults[0],
    "Check": lambda: stored("faults").faults[0].checks[0],
    "Diagnosis": lambda: stored("doctor").diagnoses[0],
}

# Record type -> mappings and lists it must hand out, deep ones included (so that the walk below
# cannot pass by finding nothing).
MUST_REACH = {
    "Results compare": {"environment", "arguments", "arguments.layouts", "workload", "workload.article"},
    "Results openloop": {"environment", "arguments", "arguments.rates", "workload"},
    "Results faults": {"arguments.layouts", "workload.experiments", "workload.experiments[0]"},
    "Results doctor": {"environment", "arguments", "workload"},
    "Cell": {"worker_requests", "cpu_s", "extra", "inflight", "inflight.workers", "inflight.workers.1"},
    "Step": {"reply_rate", "reply_rate.each", "status", "errors", "connection_ms"},
    "FaultRecord": {"figures", "figures.per_second", "figures.per_second[0]", "figures.workers.1"},
    "Diagnosis": {"layout", "layout.sockets", "layout.sockets[0]", "workers", "workers.1", "inflight",
                  "inflight.workers.1", "queue", "queue.sockets", "timeline.t", "timeline.inflight.1",
                  "memory.workers.1", "access", "access.status", "access.codes", "exposure", "findings[0]"},
}


def containers(value, path: str = ""):
    """(path, container) for every dict and list in ``value``, at any depth; tuples are walked too
    (they cannot change, what they hold might)."""
    if isinstance(value, dict):
        yield path, value
        for k, v in value.items():
            yield from containers(v, f"{path}.{k}")
    elif isinstance(value, list):
        yield path, value
        for i, v in enumerate(value):
            yield from containers(v, f"{path}[{i}]")
    elif isinstance(value, tuple):
        for i, v in enumerate(value):
            yield from containers(v, f"{path}[{i}]")


def handed_out(record) -> dict[str, object]:
    """Every mapping and list the record's fields hold, by path (``field.key[index]``)."""
    return {f"{f.name}{path}": c for f in dataclasses.fields(record)
            for path, c in containers(getattr(record, f.name))}


def as_json(record) -> str:
    return json.dumps(dataclasses.asdict(record))


def _ior(d: dict) -> None:
    d |= {"probe": 1}


def _iadd(items: list) -> None:
    items += [1]


def _imul(items: list) -> None:
    items *= 2


DICT_CHANGES = {
    "d[k] = v": lambda d: d.__setitem__("probe", 1),
    "del d[k]": lambda d: d.__delitem__(next(iter(d), "probe")),
    "update": lambda d: d.update(probe=1),
    "setdefault": lambda d: d.setdefault("probe", 1),
    "pop": lambda d: d.pop(next(iter(d), "probe"), None),
    "popitem": lambda d: d.popitem(),
    "clear": lambda d: d.clear(),
    "|=": _ior,
}
LIST_CHANGES = {
    "l[0] = v": lambda items: items.__setitem__(0, 1),
    "l[:] = []": lambda items: items.__setitem__(slice(None), []),
    "del l[0]": lambda items: items.__delitem__(0),
    "append": lambda items: items.append(1),
    "extend": lambda items: items.extend([1]),
    "insert": lambda items: items.insert(0, 1),
    "remove": lambda items: items.remove(items[0] if items else 1),
    "pop": lambda items: items.pop(),
    "clear": lambda items: items.clear(),
    "sort": lambda items: items.sort(),
    "reverse": lambda items: items.reverse(),
    "+=": _iadd,
    "*=": _imul,
}


@pytest.mark.parametrize("name", RECORDS)
def test_no_field_of_a_record_can_be_set_or_deleted(name):
    record = RECORDS[name]()
    for f in dataclasses.fields(record):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(record, f.name, getattr(record, f.name))
        with pytest.raises(dataclasses.FrozenInstanceError):
            delattr(record, f.name)


@pytest.mark.parametrize("name", MUST_REACH)
def test_every_mapping_and_list_a_record_hands_out_refuses_every_change(name):
    record = RECORDS[name]()
    before = as_json(record)
    found = handed_out(record)
    assert MUST_REACH[name] <= set(found), sorted(MUST_REACH[name] - set(found))
    for path, container in found.items():
        changes = DICT_CHANGES if isinstance(container, dict) else LIST_CHANGES
        for change, attempt in changes.items():
            with pytest.raises(TypeError, match="read-only after creation"):
                attempt(container)
                pytest.fail(f"{name}.{path}: {change} was allowed")
    assert as_json(record) == before


# Record type -> how it is built from its JSON form.
BUILD = {"Results faults": from_dict, "Results doctor": from_dict, "Cell": Cell.from_dict, "Step": Step.from_dict,
         "FaultRecord": FaultRecord.from_dict, "Diagnosis": Diagnosis.from_dict}


@pytest.mark.parametrize("name", BUILD)
def test_what_a_caller_passed_in_stays_the_callers(name):
    """A record copies what it is given: changing the caller's dicts and lists afterwards, at any
    depth, changes nothing in the record (and the caller's own data stays changeable)."""
    data = json.loads(json.dumps(RECORDS[name]().to_dict()))
    record = BUILD[name](data)
    before = as_json(record)
    given = list(containers(data))
    assert len(given) > 3
    for _, container in given:
        if isinstance(container, dict):
            container["probe"] = 1
        else:
            container.append(1)
    assert as_json(record) == before


# Record type -> a field to change and its new value.
CHANGE = {"Results openloop": ("created", "2026-11-28T00:00:00+00:00"), "Cell": ("rps", 1.0),
          "Step": ("server_cpu_cores", 1.25), "FaultRecord": ("seconds", 1.0), "Diagnosis": ("end_note", "changed")}


@pytest.mark.parametrize("name", CHANGE)
def test_a_change_is_a_new_record_and_copies_stay_read_only(name):
    """``dataclasses.replace`` (how faults stamps an experiment's seconds) re-validates and gives a
    record as read-only as the first; copies and pickles too; the original is unchanged."""
    record = RECORDS[name]()
    before = as_json(record)
    field, value = CHANGE[name]
    changed = dataclasses.replace(record, **{field: value})
    assert getattr(changed, field) == value != getattr(record, field)
    copies = (copy.copy(record), copy.deepcopy(record), pickle.loads(pickle.dumps(record)))
    assert all(c == record and as_json(c) == before for c in copies)
    paths = set(handed_out(record))
    assert paths, name
    for other in (changed, *copies):
        found = handed_out(other)
        assert set(found) == paths
        for container in found.values():
            with pytest.raises(TypeError, match="read-only after creation"):
                (DICT_CHANGES["update"] if isinstance(container, dict) else LIST_CHANGES["append"])(container)
    assert as_json(record) == before


@pytest.mark.parametrize("kind", STORED)
def test_a_stored_file_of_every_kind_is_written_again_byte_for_byte(kind, tmp_path):
    """The file another version of this tool wrote (``make_results_v2.py``: before the records were
    read-only) loads, and saving it gives the very same bytes: old and new code read each other's files."""
    path = FIXTURES / STORED[kind]
    results = load(path)
    assert results.kind == kind and results.records
    assert results.save(tmp_path / path.name).read_bytes() == path.read_bytes()
