"""How a tune run is stored, checked and replayed.

A tune run is a ``Results`` of kind ``tune`` (one results.json, format version 2): its records
are the cells it measured (``cells``, as compare's), and ``arguments["tune"]`` holds what the
search needs besides the cells to take its decisions again, versioned on its own
(``TUNE_VERSION``) and checked on load (``check``, registered with ``register_kind``):

    {"version": 1,
     "settings": {...},                      # bench.tune.search.Settings
     "blocks": [{"stage", "spec", "repeat", "scenarios", "duration_s", "started_s", "seconds"}, ...],
     "clock": [seconds, ...],                # every clock read of the search, in order
     "stall_clients": k,
     "decision": {...},                      # for readers of the JSON: never read back
     "recommended": {...}}                   # what was written to DIR/recommended (a fact, not derived)

What the search decided is stored once, beside results.json, as summary.json
(``bench.tune.summary``), which the report renders. ``--replay`` (and the report of a run stored
without a summary) takes every decision again from the cells, the blocks and the clock by
running the search again on them (``ReplayMeasure``, ``replay``): no figure of the decision is
read back from results.json.
The objective and the space come from the other arguments (``concurrency``, ``p99_ms``,
``memory_mb``, ``stall_share``, ``stall_ms``, ``max_processes``, ``threads``, ``strategies``).
"""

from __future__ import annotations

import math

from uwsgi_layouts.bench.load.scenarios import SCENARIOS
from uwsgi_layouts.bench.results import Cell, Results, ResultsError, register_kind
from uwsgi_layouts.bench.tune.objective import Objective
from uwsgi_layouts.bench.tune.outcome import Block, Inputs, Outcome, Settings, Stopped
from uwsgi_layouts.bench.tune.search import run_search
from uwsgi_layouts.bench.tune.space import candidate_space
from uwsgi_layouts.deploy.model import STRATEGIES

TUNE_VERSION = 1
STALL = "stall"


class ReplayError(KeyError):
    """A replay asked for a block the stored run did not measure."""

    def __str__(self) -> str:
        return str(self.args[0])


def _fail(what: str) -> None:
    raise ResultsError(f"arguments.tune: {what}")


def _number(x, name: str, low: float = 0.0, allow_none: bool = False) -> None:
    if x is None and allow_none:
        return
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x < low:
        _fail(f"{name} must be a number >= {low:g}, got {x!r}")


def _count(x, name: str, low: int = 0) -> None:
    if isinstance(x, bool) or not isinstance(x, int) or x < low:
        _fail(f"{name} must be an integer >= {low}, got {x!r}")


def check(results: Results) -> None:
    """The checks a tune run's arguments pass on load (ResultsError with one line otherwise)."""
    a = results.arguments
    rec = a.get("tune")
    if not isinstance(rec, dict):
        _fail("missing (the search's blocks and clock)")
    if rec.get("version") != TUNE_VERSION:
        _fail(f"version {rec.get('version')!r} is not supported (this tool reads {TUNE_VERSION})")
    _count(a.get("concurrency"), "concurrency", 1)
    _count(a.get("max_processes"), "max_processes", 1)
    _number(a.get("p99_ms"), "p99_ms", allow_none=True)
    _number(a.get("memory_mb"), "memory_mb", allow_none=True)
    _number(a.get("stall_share", 0), "stall_share")
    _count(a.get("stall_ms", 0), "stall_ms")
    threads, strategies = a.get("threads"), a.get("strategies")
    if not isinstance(threads, list) or not threads or not all(isinstance(t, int) and t >= 1 for t in threads):
        _fail(f"threads must be a list of integers >= 1, got {threads!r}")
    if not isinstance(strategies, list) or not strategies or any(s not in STRATEGIES for s in strategies):
        _fail(f"strategies must be a list of known strategies, got {strategies!r}")
    if not isinstance(a.get("scenario"), str) or not a["scenario"]:
        _fail(f"scenario must be a name, got {a.get('scenario')!r}")
    settings = rec.get("settings")
    if not isinstance(settings, dict):
        _fail("settings must be an object")
    _number(settings.get("budget_s"), "settings.budget_s", low=1)
    for key, value in settings.items():
        if key in Settings.__dataclass_fields__:
            _number(value, f"settings.{key}")
    _count(rec.get("stall_clients", 0), "stall_clients")
    clock = rec.get("clock")
    if not isinstance(clock, list):
        _fail("clock must be a list of seconds")
    for i, x in enumerate(clock):
        _number(x, f"clock[{i}]")
        if i and x < clock[i - 1]:
            _fail(f"clock[{i}] goes back in time ({x} after {clock[i - 1]})")
    blocks = rec.get("blocks")
    if not isinstance(blocks, list):
        _fail("blocks must be a list")
    keys = set()
    for i, b in enumerate(blocks):
        name = f"blocks[{i}]"
        if not isinstance(b, dict):
            _fail(f"{name} must be an object")
        if b.get("stage") not in (1, 2, 3):
            _fail(f"{name}.stage must be 1, 2 or 3, got {b.get('stage')!r}")
        if not isinstance(b.get("spec"), str) or not b["spec"]:
            _fail(f"{name}.spec must be a layout name")
        _count(b.get("repeat"), f"{name}.repeat", 1)
        _count(b.get("duration_s"), f"{name}.duration_s", 1)
        _number(b.get("started_s"), f"{name}.started_s")
        _number(b.get("seconds"), f"{name}.seconds")
        scenarios = b.get("scenarios")
        if not isinstance(scenarios, list) or not scenarios or not all(isinstance(s, str) for s in scenarios):
            _fail(f"{name}.scenarios must be a list of scenario names")
        if (b["spec"], b["repeat"]) in keys:
            _fail(f"{name}: {b['spec']} repeat {b['repeat']} appears twice")
        keys.add((b["spec"], b["repeat"]))
        for sc in scenarios:
            if not any(c.scenario == sc and c.layout == b["spec"] and c.repeat == b["repeat"] for c in results.cells):
                _fail(f"{name}: no stored {sc} cell for {b['spec']} repeat {b['repeat']}")


register_kind("tune", "cells", check)


def blocks_of(results: Results) -> list[Block]:
    return [Block(b["stage"], b["spec"], b["repeat"], tuple(b["scenarios"]), b["duration_s"], b["started_s"],
                  b["seconds"]) for b in results.arguments["tune"]["blocks"]]


def objective_of(arguments: dict) -> Objective:
    return Objective(concurrency=arguments["concurrency"], p99_ms=arguments.get("p99_ms"),
                     memory_mb=arguments.get("memory_mb"), stall_share=arguments.get("stall_share") or 0.0,
                     stall_ms=arguments.get("stall_ms") or 0,
                     server_label=server_label(arguments["strategies"]))


def server_label(strategies: list[str]) -> str:
    servers = {STRATEGIES[s].server for s in strategies}
    return "uWSGI" if servers == {"uwsgi"} else "app-server"


def inputs_of(arguments: dict, settings: dict | None = None) -> Inputs:
    """The search's inputs from a run's arguments (``settings``: instead of the stored ones)."""
    space = candidate_space(arguments["max_processes"], tuple(arguments["threads"]), tuple(arguments["strategies"]))
    stored = settings if settings is not None else arguments["tune"]["settings"]
    return Inputs(objective_of(arguments), tuple(space), Settings.from_dict(stored), arguments["scenario"], STALL,
                  arguments.get("nproc") or 2)


def steady_scenarios() -> list[str]:
    """The demo app's scenarios tune measures on its own (no second load): the rest are not offered."""
    return [n for n, s in SCENARIOS.items() if s.stall is None and s.files is None and not s.needs_mix]


class ReplayMeasure:
    """Stored cells instead of measurements, and the stored clock instead of time: the search
    takes exactly the live run's decisions. When it asks for a block the run measured in another
    order (a replay with another objective), the clock is simulated from then on (each block
    costs its stored seconds). A block never measured: ReplayError; past the end of an
    interrupted run: ``Stopped``."""

    def __init__(self, results: Results):
        a = results.arguments
        self.level = a["concurrency"]
        self.cells: dict[tuple[str, str, int], Cell] = {(c.scenario, c.layout, c.repeat): c for c in results.cells
                                                         if c.concurrency == self.level}
        self.sequence = blocks_of(results)
        self.by_key = {(b.spec, b.repeat): b for b in self.sequence}
        self.tape = list(a["tune"]["clock"])
        self.complete = bool(a.get("complete"))
        self.read = 0
        self.next_block = 0
        self.simulated: float | None = None
        self.last = 0.0

    def now(self) -> float:
        if self.simulated is None and self.read < len(self.tape):
            self.last = self.tape[self.read]
            self.read += 1
            return self.last
        if self.simulated is None:  # the tape ran out: time stands still
            self.simulated = self.last
        return self.simulated

    @property
    def diverged(self) -> bool:
        return self.simulated is not None

    def block(self, spec: str, repeat: int, duration_s: int, stall_clients: int) -> list[Cell]:
        stored = self.by_key.get((spec, repeat))
        if stored is None:
            if not self.complete and self.next_block >= len(self.sequence):
                raise Stopped
            raise ReplayError(f"replay: no stored block for {spec} repeat {repeat} (the stored run did not measure "
                              "it: another objective or budget asks for other measurements)")
        in_order = (not self.diverged and self.next_block < len(self.sequence)
                    and self.sequence[self.next_block] == stored)
        self.next_block += 1
        if not in_order:
            if self.simulated is None:
                self.simulated = self.last
            self.simulated = round(self.simulated + stored.seconds, 3)
        scenarios = list(stored.scenarios)
        if stall_clients and STALL not in scenarios:
            raise ReplayError(f"replay: {spec} repeat {repeat} was measured without the stall")
        if not stall_clients:
            scenarios = [s for s in scenarios if s != STALL]
        out = []
        for sc in scenarios:
            cell = self.cells.get((sc, spec, repeat))
            if cell is None:
                raise ReplayError(f"replay: no stored {sc} cell for {spec} at {self.level} connections, "
                                  f"repeat {repeat}")
            out.append(cell)
        return out


def replay(results: Results, inputs: Inputs | None = None, progress=None) -> Outcome:
    """The search run again on a stored tune run's cells and clock (``inputs``: other inputs,
    e.g. another objective; default: the stored ones)."""
    measure = ReplayMeasure(results)
    return run_search(inputs or inputs_of(results.arguments), measure, measure, progress=progress)


_CACHE: list[tuple[Results, Outcome]] = []


def outcome_of(results: Results) -> Outcome:
    """The stored run's own outcome (recomputed once per Results object: the report's sections and
    plots all ask)."""
    for stored, outcome in _CACHE:
        if stored is results:
            return outcome
    outcome = replay(results)
    _CACHE.append((results, outcome))
    del _CACHE[:-4]
    return outcome
