"""What a tune run should be read with, judged once, as data (``TuneCautions``): the machine's
state, candidates flagged unsteady, a chosen layout whose throughput was noisy, whose p99 only
borderline meets the limit or rests on few slower requests, and a budget that ended before the
final stage. The tune report words them (``bench.report.tune``); it judges nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from uwsgi_layouts.bench.analysis import NOISY_SPREAD, machine_cautions
from uwsgi_layouts.bench.results import Results
from uwsgi_layouts.bench.tune.objective import UNSTEADY_MIN_ROUNDS
from uwsgi_layouts.bench.tune.outcome import STAGES, Outcome

FINAL_STAGE = max(STAGES)  # the stage whose rounds the choice should rest on


@dataclass(frozen=True)
class Unsteady:
    """A candidate whose throughput swung far more than the other finalists' (``Decision.unsteady``)."""

    spec: str
    spread: float
    repeats: int
    low: float  # its lowest and highest cell's throughput
    high: float
    others_median: float  # the median spread of the other finalists with enough rounds
    chosen: bool  # chosen anyway: it beat the others beyond noise


@dataclass(frozen=True)
class Noisy:
    """The chosen layout's throughput spread above ``NOISY_SPREAD`` across its cells."""

    spec: str
    spread: float
    repeats: int


@dataclass(frozen=True)
class ThinTail:
    """The chosen layout's p99 rests on few slower requests."""

    spec: str
    slower: int


@dataclass(frozen=True)
class TuneCautions:
    machine: tuple[str, ...]  # ``analysis.machine_cautions``
    unsteady: tuple[Unsteady, ...] = ()
    noisy: Noisy | None = None
    borderline: str = ""  # the chosen spec, when its p99 interval straddles the limit
    thin: ThinTail | None = None
    early_stop: bool = False  # the budget ended before the final stage, yet a layout was chosen


def _others_median(outcome: Outcome, spec: str) -> float:
    d = outcome.decision
    others = sorted(x.spread for x in d.order if x.spec != spec and x.repeats >= UNSTEADY_MIN_ROUNDS)
    return others[len(others) // 2] if others else 0.0


def tune_cautions(results: Results, outcome: Outcome) -> TuneCautions:
    chosen = outcome.chosen
    d = outcome.decision
    unsteady = []
    for spec in (d.unsteady if d is not None else ()):
        e = outcome.evaluations[spec]
        unsteady.append(Unsteady(spec, e.spread, e.repeats, e.steady.rps.low, e.steady.rps.high,
                                 _others_median(outcome, spec), chosen is not None and chosen.spec == spec))
    if chosen is None:
        return TuneCautions(tuple(machine_cautions(results.environment)), tuple(unsteady))
    noisy = chosen.repeats > 1 and chosen.steady.rps.spread > NOISY_SPREAD
    early = (bool(outcome.stages) and outcome.stages[-1].number < FINAL_STAGE and not outcome.interrupted
             and "only" not in outcome.stop and "decided" not in outcome.stop)
    return TuneCautions(tuple(machine_cautions(results.environment)), tuple(unsteady),
                        Noisy(chosen.spec, chosen.steady.rps.spread, chosen.repeats) if noisy else None,
                        chosen.spec if chosen.borderline else "",
                        ThinTail(chosen.spec, chosen.steady.tails.slower) if chosen.steady.tails.thin else None, early)
