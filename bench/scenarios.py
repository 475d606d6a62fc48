"""Named request mixes: the healthy workload, and optionally a stall load beside it.

A stall stands for an external API that hangs: some clients (``clients``) send requests
that only wait ``wait_ms``, back to back, while the healthy clients run the normal mix; or
a ``fraction`` of the healthy clients' own requests stall. Stalled clients run in a second
wrk process, so healthy and stalled latencies are measured separately.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from urllib.parse import urlencode


@dataclass(frozen=True)
class Workload:
    rounds: int = 5
    fib: int = 25
    io_ms: int = 10

    @property
    def query(self) -> str:
        return urlencode({"rounds": self.rounds, "fib": self.fib, "io_ms": self.io_ms})

    def with_overrides(self, **kw) -> "Workload":
        return replace(self, **{k: v for k, v in kw.items() if v is not None})


@dataclass(frozen=True)
class Stall:
    clients: int | None = None  # None: T, enough to tie up one worker's threads
    wait_ms: int = 3000
    fraction: float = 0.0  # instead of clients: share of healthy requests that stall

    @property
    def query(self) -> str:
        return urlencode({"rounds": 1, "fib": 0, "io_ms": self.wait_ms})


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    workload: Workload
    stall: Stall | None = None

    def resolved(self, threads: int, **overrides) -> "Scenario":
        """Apply CLI overrides and fill defaults that depend on the layout (T)."""
        workload = self.workload.with_overrides(
            rounds=overrides.get("rounds"), fib=overrides.get("fib"), io_ms=overrides.get("io_ms"))
        stall = self.stall
        if stall is not None:
            fraction = overrides.get("stall_fraction")
            clients = overrides.get("stall_clients")
            stall = replace(
                stall,
                wait_ms=overrides.get("stall_ms") or stall.wait_ms,
                fraction=fraction if fraction is not None else stall.fraction,
                clients=0 if fraction else (clients if clients is not None else (stall.clients or threads)),
            )
        return replace(self, workload=workload, stall=stall)

    def to_dict(self) -> dict:
        data = {"description": self.description, **asdict(self.workload), "query": self.workload.query}
        if self.stall is not None:
            data["stall"] = asdict(self.stall) | {"query": self.stall.query}
        return data


SCENARIOS = {
    s.name: s
    for s in (
        Scenario("article", "the article's request: 5 x (sleep 10 ms + fib(25)), about half of it holding the GIL",
                 Workload(5, 25, 10)),
        Scenario("io-heavy", "mostly waiting on an external API: 5 x (sleep 40 ms + fib(15))", Workload(5, 15, 40)),
        Scenario("cpu-heavy", "mostly CPU: 5 x fib(27), no waiting", Workload(5, 27, 0)),
        Scenario("stall", "the article's mix while T extra clients hit an external API that hangs 3 s",
                 Workload(5, 25, 10), Stall()),
        Scenario("stall-io", "the I/O-heavy mix while T extra clients hit an external API that hangs 3 s",
                 Workload(5, 15, 40), Stall()),
    )
}
