"""``paired.t_quantile`` takes Student's t quantile from ``scipy.special.stdtrit`` instead of
``scipy.stats.t.isf`` (whose import cost every bench command about a CPU-second at start). Every
comparison's interval, and so every verdict, rests on that number: the two must agree bit for bit
for each (upper tail, degrees of freedom) the comparisons ask, and across a grid around them."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy import stats

from uwsgi_layouts.bench.paired import FINAL_SHARE, MIN_ROUNDS, Rule, t_quantile

LEVELS = (0.9, 0.95, 0.975, 0.99, 0.999)  # Rule accepts confidence in [0.9, 1)
SHARES = (0.0, 0.5, FINAL_SHARE, 0.9)
MOST_ROUNDS = 80  # compare's and tune's budgets stop far below this many rounds of one pair


def asked() -> set[tuple[float, int]]:
    """(upper tail, degrees of freedom) as ``judge_ratios`` asks them (alpha_at(n) / 2 and n - 1),
    for every rule over these levels, shares and look ranges: alpha_at(n) is the rule's interim
    or its final look's error, so each with every n up to ``MOST_ROUNDS`` (a superset)."""
    alphas = set()
    for confidence, share, first in itertools.product(LEVELS, SHARES, (0, 2, 3, 5, 8)):
        for last in (first, first + 1, first + 4, first + 10, MOST_ROUNDS):
            rule = Rule(confidence=confidence, first=first, last=last, final_share=share, final=last)
            alphas |= {rule.look_alpha, rule.final_alpha}
    return {(alpha / 2, n - 1) for alpha in alphas for n in range(MIN_ROUNDS, MOST_ROUNDS + 1)}


def same_bits(a: float, b: float) -> bool:
    return a.hex() == b.hex()


def test_the_quantile_every_comparison_asks_is_scipy_stats_own():
    pairs = sorted(asked())
    assert len(pairs) > 5000  # the rules above ask many distinct looks, not a handful
    different = [(u, df, t_quantile(u, df), float(stats.t.isf(u, df))) for u, df in pairs
                 if not same_bits(t_quantile(u, df), float(stats.t.isf(u, df)))]
    assert not different, different[:5]


def test_the_quantile_agrees_across_a_grid_of_tails_and_degrees_of_freedom():
    """Tails from 1e-12 to the median (0.5: 0.0 both ways, the same zero, not -0.0) and degrees of
    freedom from 1 to 10,000: scipy.stats computed over the whole grid at once, ours one by one
    as the comparisons call it."""
    uppers = np.concatenate([np.geomspace(1e-12, 0.5, 157), np.linspace(0.001, 0.5, 100)])
    dfs = np.unique(np.concatenate([np.arange(1, 200), np.geomspace(200, 10_000, 40).astype(int)]))
    theirs = stats.t.isf(uppers[:, None], dfs[None, :])
    different = [(float(u), int(df)) for i, u in enumerate(uppers) for j, df in enumerate(dfs)
                 if not same_bits(t_quantile.__wrapped__(float(u), int(df)), float(theirs[i, j]))]
    assert not different, different[:5]
    assert same_bits(t_quantile(0.5, 3), 0.0)


def test_known_values():
    """The figures the docs quote: 4.30 with 3 rounds, 2.78 with 5 (95%, two-sided)."""
    assert t_quantile(0.025, 2) == pytest.approx(4.302653, abs=1e-6)
    assert t_quantile(0.025, 4) == pytest.approx(2.776445, abs=1e-6)
    with pytest.raises(ValueError, match="upper tail"):
        t_quantile(0.6, 3)
