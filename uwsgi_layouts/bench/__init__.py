"""Benchmark: drive real load against nginx + uWSGI layouts and report which one to run.

One pipeline, every experiment kind plugs into it:

    stack.py  -> load/       -> results.py -> analysis/   -> report/
    (a Lab:      (wrk,          (one versioned   (statistics,    (text, Markdown and PNG
     render,      httperf,       JSON format:     conclusions)    from stored JSON only)
     start,       scenarios,     cells, steps
     stop)        file lists)    or faults)
       observe/ reads a running stack: processes (CPU, memory, per-worker requests), stats
       (the stats server over time), sockets (listen queues), nginx (workers, logs), config
       subject.py: the app under test and its traffic (deploy's app options, --request...)

    kinds/    compare (closed-loop cells, sweep in closedloop/), openloop (httperf rate steps),
              faults (fault experiments), tune (a budgeted search that recommends a layout),
              doctor (a running uWSGI watched through its stats server; its pure judgement is
              diagnosis.py, beside analysis/): the subcommands of ``uwsgi-layouts`` (cli.py);
              options.py holds the argument validators they share.
    tune/     tune's pure logic (space, objective, search, stored record and replay) and its
              accuracy benchmark (``uwsgi-layouts tune-accuracy``).

Add an experiment kind (``tune`` is the latest example):

1. ``bench/kinds/NAME.py``: ``add_arguments(parser)`` (validate with ``bench.options``) and
   ``run(args) -> exit code``: get stacks from ``with Lab() as lab: with lab.stack(spec, **options)``,
   load them with ``bench.load``, read them with ``bench.observe`` (or reuse
   ``kinds.closedloop``'s ``LiveRunner``/``run_sweep`` for closed-loop cells; ``bench.subject``
   gives it the user's app and traffic: ``add_arguments``, ``from_args``, ``preflight_app``,
   ``preflight_traffic``, and ``Scenario.with_mix`` for the runner), build
   ``Results(kind="NAME", ...)`` with your records, ``save`` it to ``out / "results.json"``
   (``options.prepare_out``) and end with ``kinds.base.publish(results, out, saved=...)``;
   ``KIND = Kind("NAME", help, add_arguments, run)``.
2. Register it: ``KINDS`` in ``bench/kinds/__init__.py``, and ``results.register_kind("NAME",
   "cells")`` (or a new record type in ``results.py``) so its files load.
3. Its report: ``bench/report/NAME.py`` with ``terminal_lines(results)`` and
   ``markdown_lines(results, plot_files)``, one entry in ``bench.report.RENDERERS``, and its
   plots (if any) in ``bench.report.plots.PLOTS``. ``uwsgi-layouts report`` then renders it.
   A kind that judges stores its judgements as a summary (``bench.stored``): its views then take
   it as a last argument and never judge; ``Renderer.summary`` loads it and ``Renderer.judge``
   makes it once per report for a run stored without one.
"""
