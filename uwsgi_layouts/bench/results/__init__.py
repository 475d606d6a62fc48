"""Results: small immutable records, validated on creation, saved as ONE versioned JSON format.

Every experiment kind saves a ``Results``: its ``kind``, when it was ``created``, the
``environment``, the ``arguments`` (the full argument set, including the command line), the
``workload``, and the kind's records (``KIND_RECORDS`` says which field a kind fills):

- ``cells``  (``Cell``):        closed-loop measurements, one per layout x concurrency x repeat
                                (compare, and tune: ``bench.tune.record`` checks its arguments);
- ``steps``  (``Step``):        open-loop rate steps (openloop), each with its steady minimum;
- ``faults`` (``FaultRecord``): fault experiments with their checks (faults);
- ``diagnoses`` (``Diagnosis``): a running uWSGI watched over a window (doctor: ``bench.diagnosis``
                                registers the kind).

Every record is read-only once created, at any depth: frozen dataclasses whose mappings and lists
are read-only copies of what they were given (``frozen``); a change makes a new record
(``dataclasses.replace``, validated again).

Everything a report shows is derived from this file, so a stored run can be re-reported (or
replayed) without timing anything. Derived values (a cell's ``balance``, the open loop's
``knee``) are written for readers of the JSON but recomputed on load, never trusted from it.

Format version 2 (this one). ``load`` also reads the version-1 files written before, migrating
them: compare's ``results.json`` (no ``kind``) and openloop's ``openloop.json`` (``kind:
openloop``). Anything else (a newer version, not JSON, a missing field) raises ResultsError with
one line saying why.

By concern, one module each, in this order (each imports only those before it):
``checks`` (``ResultsError`` and the validation every record uses), ``frozen`` (the read-only
containers records hand out), the records ``cells`` (``Cell``, ``Latency``, ``Errors``; the
optional fields' schemas), ``steps`` (``Step``, ``find_knee``), ``faults`` (``FaultRecord``,
``Check``), ``diagnoses`` (``Diagnosis``), then ``registry`` (kinds and their record field),
``versions`` (format versions and the migration of version 1), ``record`` (``Results``, ``save``)
and ``loading`` (``load``, ``from_dict``). Other modules import the names below from
``bench.results``, never its modules.
"""

from uwsgi_layouts.bench.results.cells import PERCENTILES, STATUS_CLASSES, Cell, Errors, Latency, server_neutral
from uwsgi_layouts.bench.results.checks import ResultsError
from uwsgi_layouts.bench.results.diagnoses import Diagnosis
from uwsgi_layouts.bench.results.faults import Check, FaultRecord
from uwsgi_layouts.bench.results.frozen import read_only
from uwsgi_layouts.bench.results.loading import from_dict, load
from uwsgi_layouts.bench.results.record import Results, utc_now
from uwsgi_layouts.bench.results.registry import KIND_CHECKS, KIND_RECORDS, register_kind
from uwsgi_layouts.bench.results.steps import Step, find_knee, steady_min
from uwsgi_layouts.bench.results.versions import FORMAT_VERSION

__all__ = [
    "FORMAT_VERSION", "KIND_CHECKS", "KIND_RECORDS", "PERCENTILES", "STATUS_CLASSES", "Cell", "Check", "Diagnosis",
    "Errors", "FaultRecord", "Latency", "Results", "ResultsError", "Step", "find_knee", "from_dict", "load",
    "read_only", "register_kind", "server_neutral", "steady_min", "utc_now",
]
