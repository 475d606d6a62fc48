"""The live progress of a tune run: one status line per block on stderr (the stage, the block and
its figures, the best candidate so far, the stage's ETA and the budget left)."""

from __future__ import annotations

import sys

from uwsgi_layouts.bench.tune.outcome import Event
from uwsgi_layouts.bench.tune.record import STALL


class TuneProgress:
    """One status line per block on stderr: stage, block, its figures, the best so far, ETAs."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()

    def line(self, e: Event) -> str:
        b = e.block
        figures = ", ".join(f"{'stall ' if c.scenario == STALL else ''}{c.rps:.1f} req/s p99 "
                            f"{c.latency_ms.p99:.0f} ms" + (f" {c.errors.total} errors" if c.errors.total else "")
                            for c in e.cells)
        best = (f"{e.best.spec} {e.best.rps.value:.1f} req/s p99 {e.best.p99.value:.0f} ms"
                + ("" if e.best.meets else " (misses)")) if e.best else "none yet"
        return (f"[stage {e.stage} {'screen narrow final'.split()[e.stage - 1]} {e.done}/{e.total}] {b.spec} "
                f"r{b.repeat} {b.duration_s} s: {figures} | best so far {best} | stage ETA {_mmss(e.stage_eta_s)}, "
                f"budget left {_mmss(e.left_s)}")

    def __call__(self, event: Event) -> None:
        text = self.line(event)
        self.stream.write(("\r\033[K" + text) if self.tty else text + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")


def _mmss(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    return f"{seconds // 60}m{seconds % 60:02d}s"
