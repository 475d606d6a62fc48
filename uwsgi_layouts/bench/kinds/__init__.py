"""Experiment kinds: each one a subcommand of ``uwsgi-layouts`` that plugs into the shared
stack lifecycle (``bench.stack``), load (``bench.load``), results (``bench.results``) and reports
(``bench.report``).

- ``compare``:  closed-loop cells, layouts side by side (the sweep and runners in ``closedloop``);
- ``openloop``: httperf rate steps until replies fall behind (the knee);
- ``faults``:   faults injected under load, with checks of their targets;
- ``tune``:     a layout recommended from a budgeted search (``bench.tune``), and its configs;
- ``doctor``:   a running uWSGI watched through its stats server, findings in words (``bench.diagnosis``);
- ``plan``:     how many replicas of a pod carry a rate within a p99 (``bench.capacity``), checked if asked.

``KINDS`` is the registry the CLI builds its subcommands from; ``base`` holds ``Kind`` and the
steps every kind ends with (``publish``). No kind imports the CLI.
"""

from __future__ import annotations

from uwsgi_layouts.bench.kinds import compare, doctor, faults, openloop, plan, tune
from uwsgi_layouts.bench.kinds.base import Kind

KINDS: dict[str, Kind] = {k.name: k for k in (compare.KIND, openloop.KIND, faults.KIND, tune.KIND, doctor.KIND,
                                               plan.KIND)}
