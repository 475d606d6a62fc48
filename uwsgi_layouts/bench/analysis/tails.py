"""Statistics of a group's cells: medians and spread over repeats (``Stat``), pooled latency
histograms read with bootstrap intervals (``pooled_tails``, ``Tails``), and requests in flight per
worker (``inflight_of``: the mechanism)."""

from __future__ import annotations

import functools
import statistics
import zlib
from dataclasses import dataclass, field

import numpy as np

from uwsgi_layouts.bench.results import Cell

NOISY_SPREAD = 0.10  # (max - min) / median across repeats above this is flagged
MIN_REQUESTS_FOR_P99 = 100  # below this a "p99" is the sample's max


@dataclass(frozen=True)
class Stat:
    """One figure across repeats."""

    median: float
    low: float
    high: float
    n: int

    @classmethod
    def of(cls, values: list[float]) -> "Stat":
        values = list(values)
        if not values:
            return cls(0.0, 0.0, 0.0, 0)
        return cls(statistics.median(values), min(values), max(values), len(values))

    @property
    def spread(self) -> float:
        return (self.high - self.low) / self.median if self.median else 0.0

    @property
    def noisy(self) -> bool:
        return self.n > 1 and self.spread > NOISY_SPREAD


# --- honest tails: pooled histograms, bootstrap intervals, comparisons ---------------------

CONFIDENCE = 0.95
BOOTSTRAP_REPLICATES = 1000
BOOTSTRAP_CHUNK = 100  # replicates whose mixtures are held at once
BOOTSTRAP_SEED = 20240901  # fixed: one stored run always renders the same intervals
MIN_SLOWER_REQUESTS = 10  # a p99 with fewer pooled requests above it is flagged
TAIL_QUANTILES = {"p50": 5000, "p99": 9900}  # in basis points, so ranks are exact integers


@dataclass(frozen=True)
class Interval:
    """A figure with its interval. ``method``: "pooled" (percentile of the pooled histograms,
    bootstrap interval), "repeats" (median of the repeats, interval = their low–high range).
    ``replicates``: the bootstrap values behind it (paired by repeat across groups), for ratios."""

    value: float
    low: float
    high: float
    method: str
    replicates: np.ndarray | None = field(default=None, repr=False, compare=False)

    def overlaps(self, other: "Interval") -> bool:
        return self.low <= other.high and other.low <= self.high


def rank(total: int, basis_points: int) -> int:
    """The nearest-rank position of a percentile: ceil(q x N), at least 1 (integer arithmetic)."""
    return max(1, -(-total * basis_points // 10000))


def percentile_of(histogram, basis_points: int) -> float:
    """The smallest latency whose cumulative count reaches ``rank`` (0.0 for an empty histogram)."""
    total = sum(c for _, c in histogram)
    if not total:
        return 0.0
    need, seen = rank(total, basis_points), 0
    for value, count in histogram:
        seen += count
        if seen >= need:
            return float(value)
    return float(histogram[-1][0])


def pool(histograms) -> tuple[tuple[float, int], ...]:
    """Several histograms as one (counts of equal latencies added), ascending."""
    merged: dict[float, int] = {}
    for h in histograms:
        for value, count in h:
            merged[value] = merged.get(value, 0) + count
    return tuple(sorted(merged.items()))


def slower_than(histogram, value: float) -> int:
    """Requests strictly slower than ``value``."""
    return sum(c for v, c in histogram if v > value)


def repeat_draws(n: int, replicates: int = BOOTSTRAP_REPLICATES, seed: int = BOOTSTRAP_SEED) -> np.ndarray:
    """(replicates x n) indices of repeats drawn with replacement; the same for every group with
    ``n`` repeats, which pairs two groups' replicates by repeat."""
    return np.random.default_rng([seed, n]).integers(0, n, size=(replicates, n))


def _bounds(replicates: np.ndarray, confidence: float) -> tuple[float, float]:
    alpha = (1 - confidence) / 2
    return (float(np.quantile(replicates, alpha, method="lower")),
            float(np.quantile(replicates, 1 - alpha, method="higher")))


def bootstrap_percentiles(histograms, quantiles=(5000, 9900),
                          replicates: int = BOOTSTRAP_REPLICATES, seed: int = BOOTSTRAP_SEED,
                          confidence: float = CONFIDENCE) -> dict[int, Interval]:
    """Pooled percentiles (basis points -> Interval) of the repeats' ``histograms`` (in repeat
    order), each with a bootstrap interval. Per replicate: draw the repeats with replacement, then
    as many requests as the drawn repeats hold from their pooled distribution, and read the
    percentile. The k-th smallest of N draws from a distribution F is F^-1 of a Beta(k, N - k + 1)
    variable, so that is one Beta draw per replicate, not N (fast on long runs). Drawing the N
    requests from the drawn repeats' mixture, rather than exactly n from each, lets each repeat's
    share vary a little: a slightly wider interval, never a narrower one."""
    hists = [tuple(h) for h in histograms if h]
    if not hists:
        return {}
    pooled = pool(hists)
    grid = np.array([v for v, _ in pooled], dtype=float)
    sizes = np.array([sum(c for _, c in h) for h in hists], dtype=float)
    cdf = np.zeros((len(hists), len(grid)))
    for r, h in enumerate(hists):
        cdf[r, np.searchsorted(grid, [v for v, _ in h])] = [c for _, c in h]
    cdf = np.cumsum(cdf, axis=1) / sizes[:, None]
    picks = repeat_draws(len(hists), replicates, seed)
    drawn = np.stack([(picks == r).sum(axis=1) for r in range(len(hists))], axis=1) * sizes  # requests per repeat
    total = drawn.sum(axis=1)
    rng = np.random.default_rng([seed, zlib.crc32(repr(hists).encode())])  # its own stream per data set
    draws = {}
    for q in quantiles:
        k = np.maximum(1, -(-total.astype(np.int64) * q // 10000))
        draws[q] = rng.beta(k, total - k + 1)
    values = {q: np.empty(len(total)) for q in quantiles}
    # The replicates' mixtures a chunk at a time: replicates x distinct latencies at once would be
    # 80 MB for a group of 10,000 distinct latencies.
    for start in range(0, len(total), BOOTSTRAP_CHUNK):
        rows = slice(start, start + BOOTSTRAP_CHUNK)
        mixture = (drawn[rows] @ cdf) / total[rows, None]
        for q, u in draws.items():
            values[q][rows] = grid[np.minimum((mixture < u[rows, None]).sum(axis=1), len(grid) - 1)]
    return {q: Interval(percentile_of(pooled, q), *_bounds(values[q], confidence), "pooled", values[q])
            for q in quantiles}


def repeats_interval(values, replicates: int = BOOTSTRAP_REPLICATES, seed: int = BOOTSTRAP_SEED) -> Interval:
    """The median of per-repeat ``values`` (in repeat order) with their low–high range; the
    replicates are medians of repeats drawn as in ``bootstrap_percentiles`` (paired by repeat)."""
    v = np.asarray(list(values), dtype=float)
    if not len(v):
        return Interval(0.0, 0.0, 0.0, "repeats", np.zeros(0))
    reps = np.median(v[repeat_draws(len(v), replicates, seed)], axis=1)
    return Interval(float(np.median(v)), float(v.min()), float(v.max()), "repeats", reps)


@dataclass(frozen=True)
class Tails:
    """A group's latency figures in ms. ``pooled``: read from the pooled histograms (bootstrap
    intervals); else (files without histograms) the repeats' per-cell p50/p99, median and range."""

    p50: Interval
    p99: Interval
    pooled: bool
    requests: int = 0  # requests in the pooled histograms
    slower: int = 0  # pooled requests slower than the pooled p99
    per_cell: dict = field(default_factory=dict, compare=False)  # "p50"/"p99" -> the repeats' own, always

    @property
    def thin(self) -> bool:
        """The p99 rests on fewer than MIN_SLOWER_REQUESTS requests above it."""
        return self.pooled and self.slower < MIN_SLOWER_REQUESTS


@functools.lru_cache(maxsize=1024)
def _tails(histograms: tuple, p50s: tuple, p99s: tuple) -> Tails:
    per_cell = {"p50": repeats_interval(p50s), "p99": repeats_interval(p99s)}
    if histograms and all(histograms):
        q = bootstrap_percentiles(histograms)
        ms = {name: _scaled(q[bp], 1 / 1000) for name, bp in TAIL_QUANTILES.items()}
        pooled = pool(histograms)
        return Tails(ms["p50"], ms["p99"], True, sum(c for _, c in pooled),
                     slower_than(pooled, q[TAIL_QUANTILES["p99"]].value), per_cell)
    return Tails(per_cell["p50"], per_cell["p99"], False, per_cell=per_cell)


def _scaled(i: Interval, factor: float) -> Interval:
    reps = None if i.replicates is None else i.replicates * factor
    return Interval(i.value * factor, i.low * factor, i.high * factor, i.method, reps)


def pooled_tails(cells: list[Cell]) -> Tails:
    """p50/p99 (ms) of ``cells`` (one group's repeats): pooled with bootstrap intervals when every
    cell has a histogram, else per-cell medians with the repeats' range."""
    cells = sorted(cells, key=lambda c: c.repeat)
    return _tails(tuple(c.histogram for c in cells), tuple(c.latency_ms.p50 for c in cells),
                  tuple(c.latency_ms.p99 for c in cells))


# --- requests in flight per worker (the mechanism) -------------------------------------------


@dataclass(frozen=True)
class Inflight:
    """A group's in-flight figures (``Cell.inflight``) over its repeats."""

    pileup: Stat | None  # share of time piled up (bench.observe.inflight_summary); None = n/a
    full: Stat  # share of time some worker had every thread busy
    shares: dict[str, dict[str, float]]  # worker -> in-flight count -> share of samples, pooled
    samples: int
    threads: int


def inflight_of(cells: list[Cell]) -> Inflight | None:
    cells = [c for c in cells if c.inflight]
    if not cells:
        return None
    samples = sum(c.inflight["samples"] for c in cells)
    shares: dict[str, dict[str, float]] = {}
    for c in cells:
        weight = c.inflight["samples"] / samples
        for w, dist in c.inflight["workers"].items():
            for n, share in dist.items():
                shares.setdefault(w, {}).setdefault(n, 0.0)
                shares[w][n] += share * weight
    shares = {w: dict(sorted(d.items(), key=lambda kv: int(kv[0]))) for w, d in sorted(shares.items(),
                                                                                      key=lambda kv: int(kv[0]))}
    piles = [c.inflight["pileup"] for c in cells if c.inflight.get("pileup") is not None]
    return Inflight(pileup=Stat.of(piles) if piles else None,
                    full=Stat.of([c.inflight.get("full", 0.0) for c in cells]), shares=shares, samples=samples,
                    threads=int(max(c.inflight.get("threads", 0) for c in cells)))
