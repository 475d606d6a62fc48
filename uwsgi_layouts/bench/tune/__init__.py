"""``bench tune``'s pure logic: which layouts to try, how to judge them, how to spend the budget.

    space.py      the candidates (P x T x strategy) and the pruning rules (before measuring)
    objective.py  the objective in words, a candidate judged against it, the tie rule
    search.py     successive halving sized to the budget, on any ``Measure`` and ``Clock``
    outcome.py    what the search takes and gives, as data: inputs, settings, stages, outcome
    record.py     the stored form of a run (checked on load) and its replay
    cautions.py   what a run should be read with (machine, unsteady, noisy, borderline, thin tails)
    pod.py        the pod recommended under --cpus/--memory (its memory request)
    summary.py    what a run concluded, as data: the TuneSummary stored as summary.json
    progress.py   the live run's status line per block
    accuracy.py   the benchmark: tune against an exhaustive grid (``uwsgi-layouts tune-accuracy``)

Nothing here starts a process except ``accuracy`` (a benchmark, not a library): the live
measure (a ``bench.stack.Lab`` and ``bench.kinds.closedloop.LiveRunner``) is plugged in by the
kind (``bench.kinds.tune``); tests plug in stored or synthetic cells and a fake clock.
"""
