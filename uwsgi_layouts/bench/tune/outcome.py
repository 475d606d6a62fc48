"""What the search takes and gives, as data: its ``Inputs`` and ``Settings``, the ``Measure`` and
``Clock`` it runs on, the blocks and stages it ran, each candidate's ``State``, the ``Event`` after
each block and the ``Outcome`` (bench/tune/search.py runs the search)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Protocol

from uwsgi_layouts.bench.paired import Rule
from uwsgi_layouts.bench.results import Cell
from uwsgi_layouts.bench.tune.objective import Decision, Evaluation, Objective
from uwsgi_layouts.bench.tune.space import Candidate, MemoryModel, Pruned

STAGES = {1: "screen", 2: "narrow", 3: "final"}


@dataclass(frozen=True)
class Settings:
    """The search's knobs. Recorded with every run, so a replay uses the same ones."""

    budget_s: float
    warmup_s: float = 1.0
    min_duration_s: int = 2
    screen_max_s: int = 6
    max_duration_s: int = 15
    keep_share: float = 1 / 3
    min_keep: int = 3
    finalists: int = 3
    narrow_repeats: int = 2
    max_rounds: int = 4
    tie_band: float = 0.05
    reserve_s: float = 8.0
    block_overhead_s: float = 3.0  # the first estimate of a block's fixed cost
    screen_share: float = 0.4
    narrow_share: float = 0.55
    seed: int = 1

    def to_dict(self) -> dict:
        return asdict(self)

    def rule(self) -> Rule:
        """How the search judges its comparisons: ``tie_band`` is the equivalence margin; the looks
        run from the end of stage 2 (1 + narrow_repeats rounds) to the most stage 3 may add."""
        first = 1 + self.narrow_repeats
        return Rule(margin=self.tie_band, first=first, last=first + self.max_rounds)

    @classmethod
    def from_dict(cls, data: dict) -> "Settings":
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)


@dataclass(frozen=True)
class Block:
    """One measured block: which stage, layout and repeat, its scenarios and cell length, when it
    started on the run's clock and how long it took (stack start to stop)."""

    stage: int
    spec: str
    repeat: int
    scenarios: tuple[str, ...]
    duration_s: int
    started_s: float
    seconds: float

    def to_dict(self) -> dict:
        return {**asdict(self), "scenarios": list(self.scenarios)}


@dataclass
class State:
    """Where a candidate got to: ``reached`` the last stage it was measured in (0: never),
    ``dropped_at`` ("pruned", "stage 1", "stage 2", "final", "budget"; "" = chosen or still in)
    and why."""

    spec: str
    reached: int = 0
    dropped_at: str = ""
    reason: str = ""


@dataclass(frozen=True)
class StageRecord:
    number: int
    candidates: tuple[str, ...]
    repeats: int  # blocks per candidate planned (stage 3: rounds run)
    duration_s: int
    scenarios: tuple[str, ...]
    planned_s: float
    seconds: float = 0.0
    note: str = ""

    @property
    def name(self) -> str:
        return STAGES[self.number]


@dataclass(frozen=True)
class Inputs:
    objective: Objective
    space: tuple[Candidate, ...]
    settings: Settings
    steady: str  # the steady scenario's name
    stall: str = "stall"
    pilot_processes: int = 2  # the pilot's P (nproc): the layout most users would start with


class Measure(Protocol):
    def block(self, spec: str, repeat: int, duration_s: int, stall_clients: int) -> list[Cell]:
        """Start ``spec``, warm it up, measure one cell of ``duration_s`` at the concurrency (and, with
        ``stall_clients`` > 0, one more under that many stalled clients), stop it; the cells."""
        ...


class Clock(Protocol):
    def now(self) -> float: ...


class Stopped(Exception):
    """The measure has nothing more to give (the replay of an interrupted run)."""


@dataclass(frozen=True)
class Event:
    """What the progress line shows after each block."""

    stage: int
    done: int  # blocks done in this stage
    total: int  # blocks planned in this stage
    block: Block
    cells: tuple[Cell, ...]
    best: Evaluation | None
    stage_eta_s: float
    left_s: float  # of the budget


@dataclass
class Outcome:
    inputs: Inputs
    pruned: list[Pruned] = field(default_factory=list)
    states: dict[str, State] = field(default_factory=dict)
    stages: list[StageRecord] = field(default_factory=list)
    blocks: list[Block] = field(default_factory=list)
    evaluations: dict[str, Evaluation] = field(default_factory=dict)  # the latest, per measured spec
    decision: Decision | None = None
    stop: str = ""  # why the search ended
    stall_clients: int = 0
    stall_note: str = ""
    memory_models: dict[str, MemoryModel] = field(default_factory=dict)
    started_s: float = 0.0
    ended_s: float = 0.0
    interrupted: bool = False

    @property
    def chosen(self) -> Evaluation | None:
        return self.decision.chosen if self.decision else None

    @property
    def finalists(self) -> list[str]:
        return list(self.stages[-1].candidates) if self.stages else []
