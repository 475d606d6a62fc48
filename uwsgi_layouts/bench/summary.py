"""One judgement per compare run, as data: the ``Summary`` every compare view renders.

The analysis decides (``bench.analysis``, ``bench.verdict``, ``bench.decisions``); the summary
holds what it decided, so the headline, report.txt, report.md and ``--full`` read one set of
conclusions and cannot disagree. It is stored beside results.json as ``summary.json`` (a format
version of its own), and ``uwsgi-layouts report RUN_DIR`` renders from it, so a re-rendered
report says what the run said, even after the analysis changes its rules. The measured figures
(the tables' medians and ranges) stay in results.json: the summary holds decisions, not data.

pyperf's style: small frozen dataclasses validated on creation, tuples not lists, enums for
outcomes (``paired.Direction``, ``verdict.Standing``, ``verdict.Outcome``,
``verdict.PairDirection``). The JSON is written from the dataclasses' fields and read back by
their type hints (``to_data``, ``from_data``, in ``bench.stored`` with the loader every stored
summary shares): a new field is stored without a new line of codec. Mappings load read-only
(``types.MappingProxyType``). A field whose metadata says ``stored: False``
(``LevelJudgement.pair``: the groups behind a live verdict) is held in memory only.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path

from uwsgi_layouts.bench.analysis import (
    Choice,
    EvenTotals,
    GoalAnswer,
    Lowest,
    Mechanism,
    MemoryCost,
    best_and_runner_up,
    even_totals,
    goal_answer,
    group_cells,
    layout_choice,
    lowest_p99,
    machine_cautions,
    mechanism_of,
    memory_costs,
    rule_of,
    steady_scenarios,
    warnings,
)
from uwsgi_layouts.bench.decisions import KeyComparison, Recommendation, key_comparisons, recommend
from uwsgi_layouts.bench.paired import Comparison, Rule
from uwsgi_layouts.bench.readings import (
    NginxReading,
    PeerReading,
    TlsCost,
    contradiction,
    nginx_reading,
    peer_readings,
    tls_costs,
)
from uwsgi_layouts.bench.results import Results, ResultsError
from uwsgi_layouts.bench.stored import StoredSummary
from uwsgi_layouts.bench.stored import from_data as from_data  # the codec, re-exported for its readers
from uwsgi_layouts.bench.stored import to_data as to_data
from uwsgi_layouts.bench.verdict import ARTICLE, Verdict, article_verdict, is_demo_run

SUMMARY_NAME = "summary.json"
SUMMARY_VERSION = 3
# Versions this tool no longer reads, and what they lack: such a run is judged again from its results.
OLD_VERSIONS = {1: "without the alternatives', nginx and hosts sections", 2: "without the memory costs"}
KIND = "compare"


class OldSummary(ResultsError):
    """A summary of a version this tool no longer reads (``OLD_VERSIONS``): one line saying so."""


class DecisionKind(enum.StrEnum):
    """What a key comparison decides (``bench.decisions.KeyComparison.kind``)."""

    VERDICT = "verdict"
    BEST = "best"  # the best layout at a level against the runner-up
    VARIANT = "variant"  # a peer's best variant against its next
    TARGET = "target"  # the best uWSGI layout against the best peer

    @property
    def label(self) -> str:
        return {"verdict": "verdict", "best": "best vs runner-up", "variant": "peer's best variant vs its next",
                "target": "best uWSGI vs best peer (targets)"}[self.value]


@dataclass(frozen=True)
class Decision:
    """A key comparison as decided: its pairs' outcomes, whether more rounds would change it
    (``settled``), the rounds it rests on and after how many it settled, and whether a p99 of its
    groups is too thin to quote."""

    kind: DecisionKind
    scenario: str
    level: int
    layouts: tuple[str, ...]
    comparisons: tuple[Comparison, ...]
    settled: bool
    rounds: int
    settled_after: int
    thin: bool

    def __post_init__(self):
        if not isinstance(self.kind, DecisionKind):
            object.__setattr__(self, "kind", DecisionKind(self.kind))
        if len(self.layouts) != 2:
            raise ValueError(f"layouts: a decision compares two layouts, got {len(self.layouts)}")
        if self.settled_after > self.rounds:
            raise ValueError(f"settled_after: {self.settled_after} rounds, more than the {self.rounds} measured")

    @property
    def name(self) -> str:
        return f"{self.layouts[0]} vs {self.layouts[1]} at {self.level} connections ({self.scenario})"

    @classmethod
    def of(cls, k: KeyComparison, settled_at: dict) -> "Decision":
        return cls(DecisionKind(k.kind), k.scenario, k.level, k.layouts, k.comparisons, k.settled, k.rounds,
                   min(settled_at.get(k.name, k.rounds), k.rounds) if k.settled else 0, k.thin)


@dataclass(frozen=True)
class GroupRow:
    """One (scenario, layout, level) as judged: its median throughput and pooled (or per-cell) p99,
    whether that p99 can be quoted, its requests, errors and noisy figures."""

    scenario: str
    layout: str
    concurrency: int
    rps: float
    p99: float
    p99_quotable: bool
    requests: int
    errors: int
    noisy: tuple[str, ...]


@dataclass(frozen=True)
class Best:
    """The best layout at one level (``analysis.ranked_at_level``) and, where there is one, its
    paired throughput against the runner-up."""

    scenario: str
    concurrency: int
    layout: str
    runner_up: str
    rps: Comparison | None

    def __post_init__(self):
        if (self.rps is None) != (not self.runner_up):
            raise ValueError("rps: the comparison with the runner-up, exactly when there is one")


@dataclass(frozen=True)
class Extension:
    """What measuring until decided did: the rounds added, why it stopped, within what budget and
    with what cell length (0: the planned one). ``budgeted``: the run set a maximum of rounds."""

    added: tuple[int, ...]
    stop: str
    budget_min: float
    cell_s: float
    budgeted: bool
    tails: tuple[int, ...] = ()  # the rounds for the verdict's tails, after the claim's looks
    tails_stop: str = ""  # why they stopped


@dataclass(frozen=True)
class Summary(StoredSummary):
    """Everything a compare run concluded. ``created`` and ``cells`` tie it to its results.json.
    Saved and loaded as every stored summary is (``bench.stored``), refusing an old version in one
    line (``refuse``) and an outcome its interval contradicts (``contradiction``)."""

    KIND = KIND  # not fields: the class constants ``StoredSummary`` reads
    VERSION = SUMMARY_VERSION

    version: int
    kind: str
    created: str
    cells: int
    rule: Rule
    groups: tuple[GroupRow, ...]
    bests: tuple[Best, ...]  # per scenario and level
    decisions: tuple[Decision, ...]
    verdict: Verdict | None  # None: not the demo app with its own requests (``verdict.is_demo_run``)
    run_here: Recommendation | None
    extension: Extension | None
    cautions: tuple[str, ...]  # the warnings: what is wrong and what to do
    busy: bool  # the machine was busy: differences of a few percent are suspect
    mechanisms: tuple[Mechanism, ...]  # per scenario with pile-up figures, what they say
    even_totals: tuple[EvenTotals, ...]  # where per-worker totals hide a pile-up
    choices: tuple[Choice, ...]  # the layout choice across scenarios (steady state and stalls)
    goal: GoalAnswer  # what it concludes
    lowest: tuple[Lowest, ...]  # per scenario, the lowest healthy p99 at its highest level
    stall_scenarios: tuple[str, ...]  # the scenarios with a stall load
    peers: tuple[PeerReading, ...]  # per scenario with uWSGI layouts and peers: against the alternatives
    nginx: NginxReading  # the nginx scenarios' ratios and targets
    hosts: tuple[TlsCost, ...]  # across app hosts: what TLS costs
    memory: tuple[MemoryCost, ...]  # per scenario and app server: what one more process and thread cost

    def __post_init__(self):
        if self.version != SUMMARY_VERSION:
            raise ValueError(f"version: this tool reads summary version {SUMMARY_VERSION}, got {self.version!r}")
        if self.kind != KIND:
            raise ValueError(f"kind: a summary is of a {KIND} run, got {self.kind!r}")
        if self.cells < 0:
            raise ValueError(f"cells: must be 0 or more, got {self.cells}")
        # The verdict's pairs are also key comparisons: both must say the same of them.
        levels = {lv.concurrency: lv for lv in (self.verdict.levels if self.verdict is not None else ())}
        for d in self.decisions:
            lv = levels.get(d.level) if d.kind is DecisionKind.VERDICT else None
            if lv is not None and (d.comparisons != (lv.rps, lv.p99) or d.settled != lv.decided):
                raise ValueError(f"decisions: {d.name} differs from the verdict at {d.level} connections")

    def best_at(self, scenario: str, concurrency: int) -> Best:
        return next(b for b in self.bests if (b.scenario, b.concurrency) == (scenario, concurrency))

    def matches(self, results: Results) -> bool:
        """Whether this summary was made from ``results`` (the same file, not extended since)."""
        return (self.created, self.cells) == (results.created, len(results.cells))

    @classmethod
    def refuse(cls, path: Path | str, data) -> None:
        """Another kind's file (tune's, doctor's) is refused as such; a summary of an old version in one
        line (``OldSummary``): its run is judged again."""
        if isinstance(data, dict) and "kind" in data:
            super().refuse(path, data)  # tune's and doctor's are version 1 too: not an old compare one
        version = data.get("version") if isinstance(data, dict) else None
        if type(version) is int and version in OLD_VERSIONS:  # not a list or a dict: unhashable
            old = version
            raise OldSummary(f"{path}: a summary of version {old} ({OLD_VERSIONS[old]}); this tool reads version "
                             f"{SUMMARY_VERSION}")

    def contradiction(self) -> str | None:
        return contradiction(self)  # an outcome its own interval does not say: edited, or damaged


def is_summarized(results: Results) -> bool:
    return results.kind == KIND


def summarize(results: Results) -> Summary:
    """What a compare run concluded, decided once, here."""
    verdict = article_verdict(results) if is_demo_run(results) else None
    scenario = ARTICLE if ARTICLE in results.scenarios else (results.scenarios or [""])[0]
    state = results.arguments.get("until_decided") or {}
    settled_at = state.get("settled_at") or {}
    extension = None
    if state:
        extension = Extension(tuple(r["round"] for r in state.get("rounds", [])), state.get("stop") or "",
                              float(results.arguments.get("budget_min") or 0),
                              float(results.arguments.get("extension_duration") or 0),
                              "max_rounds" in results.arguments,
                              tuple(r["round"] for r in state.get("tails", [])), state.get("tails_stop") or "")
    return Summary(SUMMARY_VERSION, KIND, results.created, len(results.cells), rule_of(results),
                   _group_rows(results), _bests(results),
                   tuple(Decision.of(k, settled_at) for k in key_comparisons(results)),
                   verdict, recommend(results, scenario) if results.cells else None, extension,
                   tuple(warnings(results)), bool(machine_cautions(results.environment)),
                   *_inflight_readings(results), *_choice(results), peer_readings(results),
                   nginx_reading(results), tls_costs(results), memory_costs(results))


def _choice(results: Results) -> tuple:
    choices = tuple(layout_choice(results))
    stall = tuple(sc for sc in results.scenarios if sc not in steady_scenarios(results))
    return choices, goal_answer(list(choices)), lowest_p99(results), stall


def _inflight_readings(results: Results) -> tuple[tuple[Mechanism, ...], tuple[EvenTotals, ...]]:
    by_sc = {sc: group_cells(results, sc) for sc in results.scenarios}
    processes = results.arguments.get("processes")
    mechanisms = (mechanism_of(sc, groups, processes) for sc, groups in by_sc.items())
    return (tuple(m for m in mechanisms if m is not None),
            tuple(e for groups in by_sc.values() for e in even_totals(groups)))


def _group_rows(results: Results) -> tuple[GroupRow, ...]:
    return tuple(GroupRow(g.scenario, g.layout, g.concurrency, g.rps.median, g.p99, g.p99_quotable, g.requests,
                          g.errors, tuple(g.noisy_figures))
                 for sc in results.scenarios for g in group_cells(results, sc))


def _bests(results: Results) -> tuple[Best, ...]:
    return tuple(Best(sc, level, b.best.layout, b.runner_up.layout if b.runner_up is not None else "", b.rps)
                 for sc in results.scenarios for level, b in best_and_runner_up(group_cells(results, sc)).items())
