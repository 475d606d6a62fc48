"""Paired comparisons: the one way every decision between two layouts is taken.

Interleaved rounds are pairs: in round i, layout A's cell and layout B's cell ran one after the
other on the same machine, so a slowdown of the whole machine in that round hits both and hardly
moves their ratio. A is compared with B through the per-round ratios r_i = A_i / B_i (throughput,
or each round's p99), never through two ranges that overlap.

The interval of the ratio, from the n rounds both measured, always at the run's one confidence
level (``CONFIDENCE``, 95%, split over the looks below), whatever n is:

* n < 2 (``MIN_ROUNDS``): none; the outcome is "undecided" (one round has no spread to judge by).
* n >= 2: Student's t interval on the log ratios (mean +- t x s / sqrt(n), the t quantile from
  ``scipy.special``), whose point is the geometric mean of the ratios. It assumes roughly normal
  log-ratio noise; a round that went wrong (a neighbour's burst) inflates s and widens the
  interval rather than narrowing it, so it errs towards "undecided". Few rounds pay in width,
  not in level: with 3 rounds the t quantile is 4.30 (95%, 2 degrees of freedom) against 2.78 with
  5, so a small difference needs more rounds to be called, and a difference called from 3 rounds
  is still a fluke at most 1 time in 40 per direction. (The range of 3 ratios, used before, is
  only a 75% interval: 1 time in 8 per direction.)
  Rounds need not be alike: a round whose cells held more requests says more (a 3-s cell of 66
  requests moves its throughput by 1.5% per request, a 9-s one by 0.5%). With ``weights`` (w_i:
  for two cells of N_a and N_b requests, 1 / (1/N_a + 1/N_b), the inverse of a count ratio's
  variance), the point is the weighted mean of the log ratios and the interval the weighted
  (generalised least squares) one: variance sigma^2 / w_i per round, sigma^2 estimated by
  sum w_i (x_i - mean)^2 / (n - 1), the mean's by sigma^2 / sum w_i, Student's t with n - 1
  degrees of freedom. Equal weights give the plain interval above.

The outcome, for A against B, with the equivalence margin m (default 5%, ``--margin``):

* "equivalent": the whole interval lies within [1 - m, 1 + m];
* "better" / "worse": the interval excludes 1 and is not inside the margin (better means higher
  throughput, or a lower p99);
* "undecided": neither: measure more rounds, or say so.

Looking again (``Rule``). A run that adds rounds until a comparison is decided looks at it after
every round. Each look could call a difference by chance, so the stopping rule fixes the maximum
of rounds before the first extra round is measured (``Rule.last``) and splits the 5% error over
the t looks that maximum allows (Bonferroni: ``Rule.look_alpha``), equally or keeping most of it
for the final look (``Rule.final_share``, compare's default: its budget fixes the rounds, so the
answer at the end matters more than stopping early): however many of them are taken, the chance
that any of them calls a difference (or an equivalence) that is not there stays at most 5%.
Every comparison of a run is judged by the same rule: one stated level for the run, 95% over
all its looks together (``Rule.level`` gives the share one interval carries).

Unpaired (``compare_unpaired``): cells without a round index (results written before rounds were
recorded) cannot be paired; their ratio interval is the conservative [min A / max B, max A / min B]
of all the cross ratios, and the outcome says "unpaired". Pure functions: nothing here is timed.
"""

from __future__ import annotations

import enum
import functools
import math
from dataclasses import dataclass

from scipy import special

from uwsgi_layouts.bench.margin import check_margin

MIN_ROUNDS = 2  # fewer paired rounds decide nothing: one ratio has no spread
UNPAIRED_MIN = 3  # unpaired cells: fewer on either side decide nothing (their cross-ratio range has no level)
DEFAULT_MARGIN = 0.05
CONFIDENCE = 0.95  # every decision of a run, over all its looks (docs/compare.md)
# A budgeted compare keeps this share of the error for its final look (``Rule.final_share``): its
# budget fixes how many rounds it measures, so stopping early saves little; 3/4 for the answer at
# the end and 1/4 over the interim looks still stops a plain answer early.
FINAL_SHARE = 0.75
METHODS = ("t", "unpaired", "too few rounds")


class Direction(enum.StrEnum):
    """A comparison's outcome for A against B. A ``StrEnum``: it equals, hashes and formats as its
    word, so it reads as the bare strings older code and stored files hold."""

    BETTER = "better"
    WORSE = "worse"
    EQUIVALENT = "equivalent"
    UNDECIDED = "undecided"


@dataclass(frozen=True)
class Rule:
    """How comparisons are judged: the equivalence ``margin``, the run's ``confidence`` over all
    its looks, and the looks the stopping rule allows: the first at ``first`` rounds (the planned
    ones), the last at ``last`` rounds (the fixed maximum). ``last`` <= ``first``: a single look.

    How the error is spent over the looks (fixed before the first added round, so that every
    split is honest by the union bound): with ``final_share`` 0, equally (Bonferroni); with
    ``final_share`` s > 0, the final look (the one at which the run stopped measuring, ``final``
    rounds; 0 while it runs) gets the share s of the error and the interim looks share the rest
    equally. A run whose budget fixes how many rounds it measures loses little by stopping early
    only when the answer is plain: most of the error is kept for the answer at the end."""

    margin: float = DEFAULT_MARGIN
    confidence: float = CONFIDENCE
    first: int = 0
    last: int = 0
    final_share: float = 0.0
    final: int = 0

    def __post_init__(self):
        check_margin(self.margin)
        if not 0.9 <= self.confidence < 1:
            raise ValueError(f"confidence: must be in [0.9, 1), got {self.confidence!r}")
        if not 0 <= self.final_share < 1:
            raise ValueError(f"final_share: must be in [0, 1), got {self.final_share!r}")

    @property
    def t_looks(self) -> int:
        """The looks that can decide (``MIN_ROUNDS`` rounds or more), from ``first`` to ``last``; at least 1."""
        if self.last <= self.first:
            return 1
        return max(1, sum(1 for n in range(self.first, self.last + 1) if n >= MIN_ROUNDS))

    @property
    def spends(self) -> bool:
        """The final look keeps its own share of the error (``final_share``)."""
        return self.final_share > 0 and self.t_looks > 1

    @property
    def look_alpha(self) -> float:
        """The two-sided error of one interim look: 1 - confidence split over the looks (Bonferroni),
        or, when the final look keeps its share, the rest split over the interim looks."""
        alpha = 1 - self.confidence
        return alpha * (1 - self.final_share) / (self.t_looks - 1) if self.spends else alpha / self.t_looks

    @property
    def final_alpha(self) -> float:
        """The two-sided error of the final look."""
        return (1 - self.confidence) * self.final_share if self.spends else self.look_alpha

    def alpha_at(self, rounds: int) -> float:
        """The error of the look at ``rounds`` rounds: the final one's at (or past) ``final``."""
        return self.final_alpha if self.spends and self.final and rounds >= self.final else self.look_alpha

    def level(self, rounds: int) -> float:
        """The confidence of one interval at ``rounds`` rounds."""
        return 0.0 if rounds < MIN_ROUNDS else 1 - self.alpha_at(rounds)

    def looks_words(self) -> str:
        """``3 looks, each at 98.3%``; spending: ``looks at 3-12 rounds: interim 99.9%, final 96.2%``."""
        if self.spends:
            return (f"looks at {self.first}-{self.last} rounds: interim {percent(1 - self.look_alpha)}, "
                    f"final {percent(1 - self.final_alpha)}")
        return f"{self.t_looks} looks, each at {percent(1 - self.look_alpha)}"

    def words(self) -> str:
        looks = f"; {self.looks_words()} (Bonferroni over {self.t_looks})" if self.last > self.first else ""
        return (f"{percent(self.confidence)} confidence, t intervals on the log ratios{looks}; "
                f"equivalent within ±{percent(self.margin)}")


# An interval whose high end is more than this many times its low end (2x either way of its point)
# says nothing: two or three noisy rounds give t intervals such as <0.01–>100.
UNINFORMATIVE_SPAN = 4.0


@dataclass(frozen=True)
class Comparison:
    """A against B on one figure: ``ratio`` = A / B (the geometric mean of the per-round ratios),
    its interval, and the outcome for A ("better", "worse", "equivalent", "undecided")."""

    figure: str  # "rps", "p50", "p99"
    outcome: Direction  # a word ("better") is taken and made a Direction
    ratio: float
    low: float
    high: float
    rounds: int = 0  # paired rounds behind it (unpaired: the fewer cells of the two)
    method: str = "t"  # "t", "unpaired", "too few rounds"
    level: float = 0.0  # the interval's confidence
    margin: float = DEFAULT_MARGIN

    def __post_init__(self):
        if self.method not in METHODS:
            raise ValueError(f"method: must be one of {', '.join(METHODS)}, got {self.method!r}")
        try:  # frozen: the word (a stored file's, or an older caller's) becomes its Direction
            object.__setattr__(self, "outcome", Direction(self.outcome))
        except ValueError:
            raise ValueError(f"outcome: must be one of {', '.join(Direction)}, got {self.outcome!r}") from None

    @property
    def paired(self) -> bool:
        return self.method != "unpaired"

    @property
    def decided(self) -> bool:
        """A difference was called: better or worse."""
        return self.outcome in ("better", "worse")

    @property
    def settled(self) -> bool:
        """No more rounds needed: decided, or equivalent."""
        return self.outcome != "undecided"

    @property
    def uninformative(self) -> bool:
        """Too few rounds, or an interval too wide to order or place anything (``UNINFORMATIVE_SPAN``)."""
        return self.method == "too few rounds" or not self.low > 0 or self.high / self.low > UNINFORMATIVE_SPAN

    def bounds(self) -> str:
        """``"0.52–0.70"``; an end past 100x either way as ``<0.01``/``>100`` (two or three rounds of a
        noisy pair give t intervals of 10^60: digits that say nothing)."""
        low = "<0.01" if self.low < 0.01 else f"{self.low:.2f}"
        high = ">100" if self.high > 100 else f"{self.high:.2f}"
        return f"{low}–{high}"

    def text(self) -> str:
        """``"0.61x (0.52–0.70)"``."""
        if self.method == "too few rounds":
            return f"{self.ratio:.2f}x"
        return f"{self.ratio:.2f}x ({self.bounds()})"

    def how(self) -> str:
        """``"t over 5 rounds, 98.3%"``, ``"unpaired: ..."``."""
        if self.method == "unpaired":
            return "unpaired: the cells record no rounds"
        if self.method == "too few rounds":
            return f"{self.rounds} paired round{'s' if self.rounds != 1 else ''}: too few to judge"
        return f"t over {self.rounds} rounds, {percent(self.level)}"

    def describe(self) -> str:
        """``"1.25x (1.10–1.40; t over 3 rounds, 95%): better"``."""
        inner = self.how() if self.method == "too few rounds" else f"{self.bounds()}; {self.how()}"
        return f"{self.ratio:.2f}x ({inner}): {self.outcome}"


def percent(share: float) -> str:
    """``75%``, ``98.3%``: one decimal only where it is not a whole percentage."""
    value = round(share * 100, 1)
    return f"{value:g}%"


def outcome_of(low: float, high: float, higher_is_better: bool, margin: float) -> Direction:
    """The outcome of an interval of A / B."""
    if 1 - margin <= low and high <= 1 + margin:
        return Direction.EQUIVALENT
    if low > 1:
        return Direction.BETTER if higher_is_better else Direction.WORSE
    if high < 1:
        return Direction.WORSE if higher_is_better else Direction.BETTER
    return Direction.UNDECIDED


def interval_outcomes(c: Comparison, higher_is_better: tuple[bool, ...]) -> frozenset[Direction]:
    """The outcomes a stored comparison's own interval gives, by the rule that made it
    (``judge_ratios``, ``compare_unpaired``): undecided with too few rounds or too few unpaired
    cells, else ``outcome_of`` for each direction asked (both, for a figure whose direction is not
    known). A stored outcome outside them was edited or damaged: summary.json is checked by it
    as it is read, compare's (``readings.consistency``) and tune's (``tune.summary.Against``)."""
    if c.method == "too few rounds" or (c.method == "unpaired" and c.rounds < UNPAIRED_MIN):
        return frozenset({Direction.UNDECIDED})
    return frozenset(outcome_of(c.low, c.high, h, c.margin) for h in higher_is_better)


def compare_rounds(a: dict[int, float], b: dict[int, float], higher_is_better: bool, figure: str = "",
                   rule: Rule = Rule(), weights: dict[int, float] | None = None) -> Comparison:
    """A (round -> value) against B, paired by the rounds both measured (a round with a zero or
    missing value left out); ``weights``: round -> what that round's ratio weighs (see the module
    docstring); all rounds weigh alike unless every round has a weight above 0."""
    rounds = [r for r in sorted(set(a) & set(b)) if a[r] and b[r] and a[r] > 0 and b[r] > 0]
    return judge_ratios([a[r] / b[r] for r in rounds], higher_is_better, figure, rule,
                        weights=[weights.get(r, 0.0) for r in rounds] if weights else None)


def request_weight(requests_a: int, requests_b: int) -> float:
    """What a round's ratio of two cells weighs: 1 / (1/N_a + 1/N_b), 0 for a cell without requests."""
    return 1.0 / (1.0 / requests_a + 1.0 / requests_b) if requests_a > 0 and requests_b > 0 else 0.0


def judge_ratios(values: list[float], higher_is_better: bool, figure: str = "", rule: Rule = Rule(),
                 weights: list[float] | None = None) -> Comparison:
    """The comparison from per-round ratios (see the module docstring for the interval)."""
    n = len(values)
    if not n:
        return Comparison(figure, "undecided", 0.0, 0.0, float("inf"), 0, "too few rounds", 0.0, rule.margin)
    logs = [math.log(x) for x in values]
    w = list(weights) if weights is not None and len(weights) == n and all(x > 0 for x in weights) else [1.0] * n
    total = sum(w)
    mean = sum(wi * x for wi, x in zip(w, logs, strict=True)) / total
    point = math.exp(mean)
    if n < MIN_ROUNDS:
        return Comparison(figure, "undecided", point, min(values), max(values), n, "too few rounds", 0.0, rule.margin)
    sigma2 = sum(wi * (x - mean) ** 2 for wi, x in zip(w, logs, strict=True)) / (n - 1)
    half = t_quantile(rule.alpha_at(n) / 2, n - 1) * math.sqrt(sigma2 / total)
    low, high = math.exp(mean - half), math.exp(mean + half)
    return Comparison(figure, outcome_of(low, high, higher_is_better, rule.margin), point, low, high, n, "t",
                      rule.level(n), rule.margin)


def compare_unpaired(a: list[float], b: list[float], higher_is_better: bool, figure: str = "",
                     rule: Rule = Rule()) -> Comparison:
    """A's values against B's when no round pairs them: the point is median A / median B, the
    interval every cross ratio (min A / max B .. max A / min B): conservative, never narrower
    than a paired one would be."""
    a = [x for x in a if x > 0]
    b = [x for x in b if x > 0]
    n = min(len(a), len(b))
    if not n:
        return Comparison(figure, "undecided", 0.0, 0.0, float("inf"), 0, "unpaired", 0.0, rule.margin)
    point = _median(a) / _median(b)
    low, high = min(a) / max(b), max(a) / min(b)
    outcome = outcome_of(low, high, higher_is_better, rule.margin) if n >= UNPAIRED_MIN else "undecided"
    return Comparison(figure, outcome, point, low, high, n, "unpaired", 0.0, rule.margin)


def _median(values: list[float]) -> float:
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


@functools.lru_cache(maxsize=256)
def t_quantile(upper: float, df: int) -> float:
    """The q with P(T > q) = ``upper`` (0 < upper <= 0.5) for Student's t with ``df`` degrees of freedom.

    ``scipy.special.stdtrit`` is the function ``scipy.stats.t.isf`` evaluates (as ``-stdtrit(df, q)
    * scale + loc``): called directly, without scipy.stats, whose import cost every command that
    imports this module about 1.1 CPU-s (scipy.special alone: 0.4). ``0.0 -`` gives isf's +0.0 at
    the median, where ``-stdtrit`` is -0.0; tests/test_paired_quantile.py holds the two equal bit
    for bit."""
    if not 0 < upper <= 0.5:
        raise ValueError(f"upper tail must be in (0, 0.5], got {upper}")
    return 0.0 - float(special.stdtrit(df, upper))
