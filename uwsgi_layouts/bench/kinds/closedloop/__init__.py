"""Closed-loop cells: the sweep and the runners that measure or replay its cells.

The sweep decides which layouts, which levels, in which order: repeats are interleaved (A B C, A
B C, ...) so that drift of a noisy machine hits every layout alike, with a progress line (ETA)
and a partial save after every block. Repeat r of every layout runs in round r, and each cell
records it (``Cell.round``): the pairs every comparison is made of (``bench.paired``). A runner
does the measuring: ``LiveRunner`` for real, ``ReplayRunner`` to rerun this logic on stored
cells without timing anything. ``compare`` runs a sweep; ``tune`` will run its own plans through
the same runners.


By concern, one module each, in this order (each imports only those before it): ``plan`` (the
``Plan``, round order, blocks and their time), ``runners`` (``LiveRunner``, ``ReplayRunner``),
``until`` (measuring until decided, the verdict's tails rounds), ``sweep`` (``run_sweep``, the
progress line). Other modules import the names below from ``bench.kinds.closedloop`` (the plan's
arithmetic, for tests, from ``plan``).
"""

from uwsgi_layouts.bench.kinds.closedloop.plan import Plan, default_layouts, default_levels, units
from uwsgi_layouts.bench.kinds.closedloop.runners import LiveRunner, ReplayError, ReplayRunner
from uwsgi_layouts.bench.kinds.closedloop.sweep import Progress, run_sweep
from uwsgi_layouts.bench.kinds.closedloop.until import CLAIM_ROUNDS, MAX_ROUNDS, RESERVE_S, TAILS_KEPT, Until

__all__ = [
    "CLAIM_ROUNDS", "MAX_ROUNDS", "RESERVE_S", "TAILS_KEPT", "LiveRunner", "Plan", "Progress", "ReplayError",
    "ReplayRunner", "Until", "default_layouts", "default_levels", "run_sweep", "units",
]
