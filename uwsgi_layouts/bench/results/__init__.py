"""Results: small immutable records, validated on creation, saved as ONE versioned JSON format.

Every experiment kind saves a ``Results``: its ``kind``, when it was ``created``, the
``environment``, the ``arguments`` (the full argument set, including the command line), the
``workload``, and the kind's records (``KIND_RECORDS`` says which field a kind fills):

- ``cells``  (``Cell``):        closed-loop measurements, one per layout x concurrency x repeat
                                (compare, and tune: ``bench.tune.record`` checks its arguments);
- ``steps``  (``Step``):        open-loop rate steps (openloop);
- ``faults`` (``FaultRecord``): fault experiments with their checks (faults);
- ``diagnoses`` (``Diagnosis``): a running uWSGI watched over a window (doctor: ``bench.diagnosis``
                                registers the kind).

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
and ``loading`` (``load``, ``from_dict``). Other modules import these names from
``bench.results``, never its modules.
"""

from uwsgi_layouts.bench.results.cells import (
    CELL_OPTIONAL,
    ERROR_CLASSES,
    LEGACY_KEYS,
    LIMIT_COUNTS,
    LIMIT_SECONDS,
    PERCENTILES,
    STATUS_CLASSES,
    Cell,
    Errors,
    Latency,
    balance,
    server_neutral,
)
from uwsgi_layouts.bench.results.checks import ResultsError
from uwsgi_layouts.bench.results.diagnoses import END_STATES, EXPOSURE_KEYS, Diagnosis
from uwsgi_layouts.bench.results.faults import Check, FaultRecord
from uwsgi_layouts.bench.results.frozen import READ_ONLY, ReadOnlyDict, ReadOnlyList, read_only
from uwsgi_layouts.bench.results.loading import from_dict, load
from uwsgi_layouts.bench.results.record import RECORD_TYPES, Results, utc_now
from uwsgi_layouts.bench.results.registry import KIND_CHECKS, KIND_RECORDS, RECORD_FIELDS, register_kind
from uwsgi_layouts.bench.results.steps import HTTP_CLASSES, HTTPERF_ERRORS, VERDICTS, Step, find_knee
from uwsgi_layouts.bench.results.versions import FORMAT_VERSION, READS_VERSIONS, migrate_v1

__all__ = [
    "CELL_OPTIONAL", "END_STATES", "ERROR_CLASSES", "EXPOSURE_KEYS", "FORMAT_VERSION", "HTTPERF_ERRORS",
    "HTTP_CLASSES", "KIND_CHECKS", "KIND_RECORDS", "LEGACY_KEYS", "LIMIT_COUNTS", "LIMIT_SECONDS", "PERCENTILES",
    "READS_VERSIONS", "READ_ONLY", "RECORD_FIELDS", "RECORD_TYPES", "STATUS_CLASSES", "VERDICTS", "Cell", "Check",
    "Diagnosis", "Errors", "FaultRecord", "Latency", "ReadOnlyDict", "ReadOnlyList", "Results", "ResultsError",
    "Step", "balance", "find_knee", "from_dict", "load", "migrate_v1", "read_only", "register_kind",
    "server_neutral", "utc_now",
]
