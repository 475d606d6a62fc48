"""What a tune run concluded, as data: the ``TuneSummary`` its report renders.

The search decides (``bench.tune.search``, ``objective.decide``); ``summarize`` takes its
``Outcome`` once, at the end of the run, and keeps what the report shows: every candidate
measured with the stage it reached, its figures and why it stopped (in the order the choice
ranks them), the ones pruned before measuring, the choice (recommended, runner-up and why, or the
closest miss), each finalist's paired throughput against the choice (its outcome a
``paired.Direction``), how the budget was spent, the cautions (``bench.tune.cautions``) and the
pod (``bench.tune.pod``). It is stored as ``summary.json`` beside results.json (kind ``tune``,
``VERSION``; ``bench.stored``), and ``uwsgi-layouts report`` renders from it without running
the search again. A run stored without one is judged again from its cells and clock
(``record.outcome_of``), as before.
"""

from __future__ import annotations

from dataclasses import dataclass

from uwsgi_layouts.bench.analysis import Tails
from uwsgi_layouts.bench.paired import Comparison, interval_outcomes
from uwsgi_layouts.bench.results import Results
from uwsgi_layouts.bench.stored import StoredSummary
from uwsgi_layouts.bench.tune.cautions import TuneCautions, tune_cautions
from uwsgi_layouts.bench.tune.objective import Evaluation, Objective, rps_comparison
from uwsgi_layouts.bench.tune.outcome import STAGES, Outcome, StageRecord
from uwsgi_layouts.bench.tune.pod import PodSizing, pod_sizing
from uwsgi_layouts.bench.tune.record import outcome_of
from uwsgi_layouts.bench.tune.space import MemoryModel, Pruned

KIND = "tune"
VERSION = 1
PRUNE_RULES = ("threads", "idle-threads", "duplicate", "memory")


@dataclass(frozen=True)
class Figure:
    """An estimate and its interval (``analysis.Interval`` without its bootstrap replicates)."""

    value: float
    low: float
    high: float

    def __post_init__(self):
        if self.low > self.high:
            raise ValueError(f"low: {self.low} above high {self.high}")


@dataclass(frozen=True)
class Tail:
    """A pooled p99 as judged: the figure, and whether it rests on too few slower requests
    (``thin``: not quoted as a figure; ``slower``: the requests above it)."""

    p99: Figure
    thin: bool
    slower: int


def _tail(tails: Tails) -> Tail:
    p99 = tails.p99
    return Tail(Figure(p99.value, p99.low, p99.high), tails.thin, tails.slower)


@dataclass(frozen=True)
class StallFigures:
    """A candidate under the stall: its throughput, its healthy requests' p99 and the stalled
    requests' median wait (None: not recorded)."""

    rps: float
    tail: Tail
    stalled_p50_ms: float | None


@dataclass(frozen=True)
class Measured:
    """One candidate measured: the last stage it reached (1 screen, 2 narrow, 3 final), why it
    stopped (``reason``, "" while still in), its figures against the objective and what it misses."""

    spec: str
    reached: int
    reason: str
    repeats: int
    rps: Figure  # median of its cells, low–high over them
    p50: float
    tail: Tail
    memory_mb: float | None
    errors: int
    borderline: bool  # its p99 interval straddles the limit
    misses: tuple[str, ...]
    stall: StallFigures | None = None

    def __post_init__(self):
        if self.reached not in STAGES:
            raise ValueError(f"reached: a measured candidate reached stage {', '.join(map(str, STAGES))}, "
                             f"got {self.reached!r}")
        if self.repeats < 1 or self.errors < 0:
            raise ValueError(f"{self.spec}: repeats must be 1 or more and errors 0 or more")


def _measured(outcome: Outcome, e: Evaluation) -> Measured:
    state = outcome.states[e.spec]
    stall = None
    if e.stall is not None:
        stalled = e.stall.extra.get("stalled_p50_ms")
        stall = StallFigures(e.stall.throughput.value, _tail(e.stall.tails),
                             None if stalled is None else stalled.median)
    return Measured(e.spec, state.reached, state.reason, e.repeats, Figure(e.rps.value, e.rps.low, e.rps.high),
                     e.steady.tails.p50.value, _tail(e.steady.tails), e.memory_mb, e.errors, e.borderline,
                     e.misses, stall)


@dataclass(frozen=True)
class Against:
    """A finalist's paired throughput against the chosen layout (its outcome a ``Direction``)."""

    spec: str
    rps: Comparison

    def __post_init__(self):
        if self.rps.figure != "rps":
            raise ValueError(f"against: {self.spec}'s comparison is of throughput (rps), got {self.rps.figure!r}")
        # An interval decides its own outcome (as compare's summary is checked: ``paired.interval_outcomes``):
        # a stored outcome that is not its interval's was changed.
        said = interval_outcomes(self.rps, (True,))
        if self.rps.outcome not in said:
            raise ValueError(f"against: {self.spec}'s outcome against the choice is {self.rps.outcome}, but its "
                             f"interval {self.rps.bounds()} says {' or '.join(sorted(said))}")


@dataclass(frozen=True)
class Choice:
    """The search's answer: ``chosen`` ("" when none meets the objective), the ``runner_up`` and
    ``why`` it lost (with no choice: why there is none), the ``closest`` miss when nothing meets,
    the finalists' throughput against the choice and which finalist beat which (spec, by)."""

    chosen: str
    runner_up: str
    why: str
    closest: str
    against: tuple[Against, ...] = ()
    beaten: tuple[tuple[str, ...], ...] = ()  # (spec, the spec that beat it beyond noise)
    unsteady: tuple[str, ...] = ()

    def __post_init__(self):
        if self.chosen and self.closest != self.chosen:
            raise ValueError(f"closest: with a choice, the choice itself ({self.chosen}), got {self.closest!r}")
        if any(a.spec == self.chosen for a in self.against):
            raise ValueError(f"against: the choice {self.chosen} is not compared with itself")
        if any(len(pair) != 2 for pair in self.beaten):
            raise ValueError("beaten: pairs of (spec, the spec that beat it)")


@dataclass(frozen=True)
class Search:
    """How the budget was spent: the stages, why the search stopped, the stack starts, the stall's
    size and the memory fits."""

    stages: tuple[StageRecord, ...]
    stop: str
    blocks: int
    interrupted: bool
    stall_note: str
    memory_models: tuple[MemoryModel, ...]


@dataclass(frozen=True)
class TuneSummary(StoredSummary):
    """Everything a tune run concluded. ``created`` and ``cells`` tie it to its results.json."""

    KIND = KIND
    VERSION = VERSION

    version: int
    kind: str
    created: str
    cells: int
    objective: Objective
    space: int  # candidates in the space
    candidates: tuple[Measured, ...]  # every one measured, the choice first, then by the stage reached
    pruned: tuple[Pruned, ...]
    choice: Choice
    search: Search
    cautions: TuneCautions
    pod: PodSizing | None  # tune ran under --cpus/--memory and chose a layout

    def __post_init__(self):
        self.check_header()
        specs = [c.spec for c in self.candidates]
        if len(set(specs)) != len(specs):
            raise ValueError("candidates: a candidate appears twice")
        named = (("chosen", self.choice.chosen), ("runner_up", self.choice.runner_up),
                 ("closest", self.choice.closest), *(("against", a.spec) for a in self.choice.against))
        for field, spec in named:
            if spec and spec not in specs:
                raise ValueError(f"choice.{field}: {spec} is not a measured candidate")
        if self.choice.chosen and specs[0] != self.choice.chosen:
            raise ValueError(f"candidates: the choice {self.choice.chosen} comes first")
        for p in self.pruned:
            if p.rule not in PRUNE_RULES:
                raise ValueError(f"pruned: rule must be one of {', '.join(PRUNE_RULES)}, got {p.rule!r}")
        if self.pod is not None and self.pod.layout != self.choice.chosen:
            raise ValueError(f"pod: sized for {self.pod.layout}, not the choice {self.choice.chosen or '(none)'}")

    def candidate(self, spec: str) -> Measured:
        return next(c for c in self.candidates if c.spec == spec)

    def matches(self, results: Results) -> bool:
        """Whether this summary was made from ``results`` (the same run, not extended since)."""
        return (self.created, self.cells) == (results.created, len(results.cells))


def _choice(outcome: Outcome) -> Choice:
    d = outcome.decision
    if d is None:
        return Choice("", "", "", "")
    chosen = d.chosen
    against = tuple(Against(e.spec, rps_comparison(e, chosen)) for e in d.order
                    if chosen is not None and e is not chosen and e.meets)
    return Choice(chosen.spec if chosen else "", d.runner_up.spec if d.runner_up else "", d.why,
                  d.closest.spec if d.closest else "", against, tuple(d.beaten.items()), tuple(d.unsteady))


def _ranked(outcome: Outcome) -> list[Evaluation]:
    """The measured candidates as the report lists them: the choice, then by the stage reached,
    then by median throughput."""
    chosen = outcome.chosen.spec if outcome.chosen else None
    return sorted(outcome.evaluations.values(),
                  key=lambda e: (e.spec != chosen, -outcome.states[e.spec].reached, -e.rps.value, e.spec))


def summarize(results: Results, outcome: Outcome | None = None) -> TuneSummary:
    """What a tune run concluded, from its search's ``outcome`` (the live one; default: the
    search taken again on the stored cells and clock)."""
    outcome = outcome if outcome is not None else outcome_of(results)
    chosen = outcome.chosen
    search = Search(tuple(outcome.stages), outcome.stop, len(outcome.blocks), outcome.interrupted,
                    outcome.stall_note, tuple(outcome.memory_models.values()))
    pod = pod_sizing(results, chosen.spec, chosen.memory_mb) if chosen is not None and not outcome.interrupted \
        else None
    return TuneSummary(VERSION, KIND, results.created, len(results.cells), outcome.inputs.objective,
                       len(outcome.inputs.space), tuple(_measured(outcome, e) for e in _ranked(outcome)),
                       tuple(outcome.pruned), _choice(outcome), search, tune_cautions(results, outcome), pod)
