"""A stored reading checked against its own figures as summary.json is read (``Summary.load``):
each outcome must be what the interval (or range) stored beside it says by the analysis's own
rule, so that an edited or damaged file cannot make a report state what its figures contradict.
``contradiction`` walks a summary (or any part of it) and names the first field that disagrees,
by its path in the file: ``peers[0].target.target_readings[1].state: met, but ...``.

The rules are the ones that made the readings, applied to what is stored: a comparison's outcome
(``paired.interval_outcomes``: ``outcome_of`` on its interval and margin, undecided with too few
rounds or unpaired cells; tune's summary checks its finalists by the same function), who is
ahead (``Side.of``), a target against its threshold (``TargetReading.of``), a files target
(``target_verdict``), which choice matters more (``Matters.of``), how a peer's best variant won,
and which way a paired ratio moved (``change_of``). The verdict's targets and
levels and the layout to run here are checked as they are created (``bench.verdict``,
``bench.decisions``). Nothing is judged again from results.json.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

from uwsgi_layouts.bench.analysis import FIGURES
from uwsgi_layouts.bench.paired import Comparison, Direction, interval_outcomes
from uwsgi_layouts.bench.readings.nginx import FilesTarget, MixedPair, change_of, target_verdict
from uwsgi_layouts.bench.readings.peers import (
    MatchupReading,
    Matters,
    Side,
    TargetReading,
    VariantReading,
    VariantWin,
    WhatMatters,
)

HIGHER_IS_BETTER = "rps"  # the one figure of ``analysis.FIGURES`` where more is better (``compare_groups``)


def _directions(figure: str) -> tuple[bool, ...]:
    """Whether a higher ratio is better for ``figure``; both, for a figure the analysis does not name."""
    if figure == HIGHER_IS_BETTER:
        return (True,)
    return (False,) if figure in FIGURES else (True, False)


def _comparison(c: Comparison) -> str | None:
    if not c.low <= c.high:
        return f"low: {c.low:g} above the interval's high end {c.high:g}"
    says = interval_outcomes(c, _directions(c.figure))
    if c.outcome in says:
        return None
    return (f"outcome: {c.outcome.value}, but its interval {c.bounds()} ({c.how()}, equivalent within "
            f"±{c.margin:.0%}) says {' or '.join(sorted(s.value for s in says))}")


def _matchup(m: MatchupReading) -> str | None:
    for name, c, side in (("rps_side", m.rps, m.rps_side), ("p99_side", m.p99, m.p99_side)):
        if side is not Side.of(c):
            return f"{name}: {side.value}, but its comparison ({c.outcome.value}, {c.method}) says {Side.of(c).value}"
    return None


def _target(t: TargetReading) -> str | None:
    judged = TargetReading.of(t.label, t.figure, t.comparison, t.threshold, t.at_most)
    for name in ("state", "side", "point_clears", "margin"):
        stored, says = getattr(t, name), getattr(judged, name)
        if stored != says:
            return (f"{name}: {_word(stored)}, but its interval {t.comparison.text()} against "
                    f"{'at most' if t.at_most else 'at least'} {t.threshold:g} says {_word(says)}")
    return None


def _files_target(t: FilesTarget) -> str | None:
    says = target_verdict(t.rps, t.target)
    if t.verdict is says:
        return None
    return (f"verdict: {t.verdict.value}, but its ratios {t.rps.low:.2f}–{t.rps.high:.2f} over {t.rps.n} repeats "
            f"against {t.target:g} say {says.value}")


# How a peer's best variant can have won, by its throughput's outcome against the runner-up (the
# p99 that tells SHORTER_P99 from HIGHER is not stored).
WINS = {Direction.BETTER: {VariantWin.BETTER}, Direction.EQUIVALENT: {VariantWin.SHORTER_P99, VariantWin.HIGHER}}


def _variant(v: VariantReading) -> str | None:
    if v.rps is None:
        ok = v.win is VariantWin.ONLY and not v.runner_up
        return None if ok else f"win: {v.win.value} with no runner-up compared (only: the one variant measured)"
    says = WINS.get(v.rps.outcome, {VariantWin.UNDECIDED})
    if v.win in says:
        return None
    return (f"win: {v.win.value}, but its throughput against {v.runner_up} ({v.rps.outcome.value}) says "
            f"{' or '.join(sorted(w.value for w in says))}")


def _matters(w: WhatMatters) -> str | None:
    says = Matters.of(w.layout, w.server)
    if w.answer is says:
        return None
    return (f"answer: {w.answer.value}, but the layout's comparison ({w.layout.outcome.value}, {w.layout.text()}) "
            f"and the server's ({w.server.outcome.value}, {w.server.text()}) say {says.value}")


def _mixed(p: MixedPair) -> str | None:
    says = change_of(p.hot)
    return None if p.change is says else f"change: {p.change.value}, but the hot file's ratio {p.hot.median:g} says " \
                                          f"{says.value}"


RULES: dict[type, Callable] = {Comparison: _comparison, MatchupReading: _matchup, TargetReading: _target,
                               FilesTarget: _files_target, VariantReading: _variant, WhatMatters: _matters,
                               MixedPair: _mixed}


def _word(value) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def contradiction(value, where: str = "") -> str | None:
    """The first stored reading in ``value`` (a summary, or any part of it) whose outcome its own
    figures contradict: ``path.field: what it says, and what its figures say``; None when all agree."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        rule = RULES.get(type(value))
        problem = rule(value) if rule is not None else None
        if problem is not None:
            return f"{where}.{problem}" if where else problem
        for f in dataclasses.fields(value):
            found = contradiction(getattr(value, f.name), f"{where}.{f.name}" if where else f.name)
            if found is not None:
                return found
    elif isinstance(value, Mapping):
        for key, x in value.items():
            found = contradiction(x, f"{where}[{key!r}]")
            if found is not None:
                return found
    elif isinstance(value, (tuple, list)):
        for i, x in enumerate(value):
            found = contradiction(x, f"{where}[{i}]")
            if found is not None:
                return found
    return None
