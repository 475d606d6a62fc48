"""The candidates ``bench tune`` may recommend, and what is pruned before anything is measured.

Space: P in 1..max_processes (default 2 x nproc), T in a set (default 1, 2, 4, 8, 16, 32),
every allowed strategy, and each strategy's variants (``Strategy.variants``: a peer with and
without nginx's upstream keep-alive, whose better value depends on the workload). Three rules
remove candidates whose fate is known without measuring (each says why, and which candidate
stands for it):

- too few threads: P x T below the requests in flight (the concurrency, plus the stalled
  requests of a stall) cannot hold them all at once: the rest would queue;
- idle threads: a process with more threads than the requests ever in flight never has them
  all busy, so T above the smallest allowed T >= the requests in flight behaves as that T and
  only costs memory: the smaller T is kept;
- duplicates: with one process, ``shared``, ``thunder`` and ``mapped`` are the same stack (one
  socket, one worker, nothing to balance): ``shared`` is kept (the plainest config), else the
  first of them allowed.

A fourth rule needs a first measurement: memory predicted over the budget (``memory_prune``)
from the fitted cost of a process and of a thread (``bench.analysis.fit_memory``).
Pure functions: nothing here starts or times anything.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from uwsgi_layouts.deploy.model import STRATEGIES

DEFAULT_THREADS = (1, 2, 4, 8, 16, 32)
DEFAULT_STRATEGIES = ("mapped", "shared")
# Strategies that are one stack when there is one process; the first allowed one is kept.
SAME_WITH_ONE_PROCESS = ("shared", "thunder", "mapped")


@dataclass(frozen=True)
class Candidate:
    processes: int
    threads: int
    strategy: str
    variant: str = ""  # options after the "@" (``keepalive=off``), "" for the plain strategy

    @property
    def spec(self) -> str:
        return f"{self.processes}x{self.threads}-{self.strategy}" + (f"@{self.variant}" if self.variant else "")

    @property
    def server(self) -> str:
        return STRATEGIES[self.strategy].server

    @classmethod
    def parse(cls, spec: str) -> "Candidate":
        base, _, variant = spec.partition("@")
        size, _, strategy = base.partition("-")
        p, _, t = size.partition("x")
        return cls(int(p), int(t), strategy, variant)


@dataclass(frozen=True)
class Pruned:
    """A candidate left out before it was measured: ``rule`` (``threads``, ``idle-threads``,
    ``duplicate``, ``memory``), why in words, and the candidate standing for it (if any)."""

    spec: str
    rule: str
    reason: str
    kept: str = ""


def candidate_space(max_processes: int, threads: tuple[int, ...], strategies: tuple[str, ...]) -> list[Candidate]:
    """Every (P, T, strategy, variant), strategies in the order given, each plain then its
    variants, then P, then T."""
    return [Candidate(p, t, s, v) for s in strategies for v in ("", *STRATEGIES[s].variants)
            for p in range(1, max_processes + 1) for t in sorted(threads)]


def prune_static(candidates: list[Candidate], in_flight: int, idle_rule: bool = True
                 ) -> tuple[list[Candidate], list[Pruned]]:
    """(kept, pruned) by the three rules above, for ``in_flight`` requests at once.
    ``idle_rule`` False skips the idle-threads rule (its bound is not known yet)."""
    kept: list[Candidate] = []
    pruned: list[Pruned] = []
    allowed_t = sorted({c.threads for c in candidates})
    cap = next((t for t in allowed_t if t >= in_flight), None)
    present = {c.spec for c in candidates}
    for c in candidates:
        if c.processes * c.threads < in_flight:
            pruned.append(Pruned(c.spec, "threads", f"P x T = {c.processes * c.threads} thread"
                                 f"{'s' if c.processes * c.threads > 1 else ''} for {in_flight} requests in "
                                 "flight: the rest would queue"))
        elif idle_rule and cap is not None and c.threads > cap:
            stand_in = Candidate(c.processes, cap, c.strategy, c.variant)
            pruned.append(Pruned(c.spec, "idle-threads", f"T = {c.threads} > the {in_flight} requests ever in "
                                 f"flight: threads above {cap} stay idle and only cost memory",
                                 stand_in.spec if stand_in.spec in present else ""))
        else:
            kept.append(c)
    out: list[Candidate] = []
    for c in kept:
        twin = one_process_twin(c, {k.strategy for k in kept if k.processes == 1 and k.threads == c.threads})
        if twin is not None:
            pruned.append(Pruned(c.spec, "duplicate", f"with one process {c.strategy} is the same stack as "
                                 f"{twin.strategy} (one socket, one worker, nothing to balance)", twin.spec))
        else:
            out.append(c)
    # An idle-threads candidate stands for the smaller T; if that one is a duplicate, for its twin.
    twins = {x.spec: x.kept for x in pruned if x.rule == "duplicate"}
    pruned = [replace(x, kept=twins.get(x.kept, x.kept)) for x in pruned]
    return out, pruned


def one_process_twin(c: Candidate, strategies_here: set[str]) -> Candidate | None:
    """The candidate kept instead of ``c`` when ``c`` is a one-process duplicate, else None."""
    if c.processes != 1 or c.strategy not in SAME_WITH_ONE_PROCESS:
        return None
    first = next(s for s in SAME_WITH_ONE_PROCESS if s in strategies_here)
    return None if first == c.strategy else Candidate(1, c.threads, first)


@dataclass(frozen=True)
class MemoryModel:
    """PSS = base + per_process x P + per_thread x P x (T - 1), fitted per app server on the
    candidates measured so far; ``worst_residual_mb`` the fit's largest miss."""

    server: str
    base_mb: float
    per_process_mb: float
    per_thread_mb: float
    worst_residual_mb: float
    points: int

    def predict(self, c: Candidate) -> float:
        return self.base_mb + self.per_process_mb * c.processes + self.per_thread_mb * c.processes * (c.threads - 1)

    def margin(self, predicted: float) -> float:
        """How far a prediction may be off: twice the worst residual, at least 5% or 2 MB."""
        return max(2 * self.worst_residual_mb, 0.05 * predicted, 2.0)


def memory_prune(candidates: list[Candidate], models: dict[str, MemoryModel], limit_mb: float
                 ) -> tuple[list[Candidate], list[Pruned]]:
    """(kept, pruned): candidates whose predicted PSS is over ``limit_mb`` by more than the margin."""
    kept, pruned = [], []
    for c in candidates:
        model = models.get(c.server)
        predicted = model.predict(c) if model else None
        if predicted is not None and predicted - model.margin(predicted) > limit_mb:
            pruned.append(Pruned(c.spec, "memory", f"predicted {predicted:.0f} MB of PSS (+{model.per_process_mb:.1f} "
                                 f"MB per process, +{model.per_thread_mb:.2f} per thread, fitted on "
                                 f"{model.points} measured layouts) > {limit_mb:g} MB"))
        else:
            kept.append(c)
    return kept, pruned


def memory_probes(candidates: list[Candidate]) -> list[Candidate]:
    """Up to three candidates per server that let the memory fit separate base, process and
    thread: the fewest processes and threads, the most processes with the fewest threads, the
    most threads in all (P x (T - 1))."""
    out: list[Candidate] = []
    for server in dict.fromkeys(c.server for c in candidates):
        mine = [c for c in candidates if c.server == server]
        picks = [min(mine, key=lambda c: (c.processes, c.threads)),
                 max(mine, key=lambda c: (c.processes, -c.threads)),
                 max(mine, key=lambda c: (c.processes * (c.threads - 1), c.processes))]
        out.extend(p for p in dict.fromkeys(picks) if p not in out)
    return out
