"""Paired comparisons: the one way every decision between two layouts is taken.

Interleaved rounds are pairs: in round i, layout A's cell and layout B's cell ran one after the
other on the same machine, so a slowdown of the whole machine in that round hits both and hardly
moves their ratio. A is compared with B through the per-round ratios r_i = A_i / B_i (throughput,
or each round's p99), never through two ranges that overlap.

The interval of the ratio, from the n rounds both measured:

* n < 3: none; the outcome is "undecided" (two rounds cannot say anything at any useful level).
* n = 3 (``RANGE_ROUNDS``): the range [min r_i, max r_i]. Why it holds, with no assumption about
  the shape of the noise: when the rounds are independent and the ratio's distribution is the
  same in every round, each r_i lies on either side of the true median ratio with probability
  1/2, so the range misses it only when all three lie on one side: 2 x (1/2)^3 = 25%. A 75%
  interval, then, and a difference called from 3 rounds (all three on the same side of 1) is a
  fluke at most 1 time in 8 per direction. That is the price of three rounds; more rounds buy more.
* n >= 4: Student's t interval on the log ratios (mean +- t x s / sqrt(n)), whose point is the
  geometric mean of the ratios. It assumes roughly normal log-ratio noise; a round that went
  wrong (a neighbour's burst) inflates s and widens the interval rather than narrowing it, so it
  errs towards "undecided". Its level is 95% divided by the number of looks (below).
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
the t looks that maximum allows (Bonferroni: ``Rule.look_alpha``): however many of them are
taken, the chance that any of them calls a difference (or an equivalence) that is not there stays
at most 5%, on top of the first look's own (1 in 8 per direction at 3 rounds; none at 2). The
3-round range needs no correction: once one ratio falls on the other side of 1, no later range
can exclude 1 again.

Unpaired (``compare_unpaired``): cells without a round index (results written before rounds were
recorded) cannot be paired; their ratio interval is the conservative [min A / max B, max A / min B]
of all the cross ratios, and the outcome says "unpaired". Pure functions: nothing here is timed.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

RANGE_ROUNDS = 3  # with exactly this many rounds, the interval is their range
MIN_ROUNDS = 3  # fewer paired rounds decide nothing
DEFAULT_MARGIN = 0.05
CONFIDENCE = 0.95
OUTCOMES = ("better", "worse", "equivalent", "undecided")


class MarginError(ValueError):
    pass


def check_margin(margin: float) -> float:
    """The equivalence margin must lie in (0, 0.5): 0 would make equivalence impossible, 0.5
    would call a layout with half the throughput equivalent."""
    if not (isinstance(margin, (int, float)) and not isinstance(margin, bool) and 0 < margin < 0.5):
        raise MarginError(f"margin: must be a share in (0, 0.5), e.g. 0.05 for ±5%, got {margin!r}")
    return float(margin)


@dataclass(frozen=True)
class Rule:
    """How comparisons are judged: the equivalence ``margin``, the ``confidence`` of one look, and
    the looks the stopping rule allows: the first at ``first`` rounds (the planned ones), the last
    at ``last`` rounds (the fixed maximum). ``last`` <= ``first``: a single look."""

    margin: float = DEFAULT_MARGIN
    confidence: float = CONFIDENCE
    first: int = 0
    last: int = 0

    def __post_init__(self):
        check_margin(self.margin)

    @property
    def t_looks(self) -> int:
        """The looks that use the t interval (more than ``RANGE_ROUNDS`` rounds); at least 1."""
        if self.last <= self.first:
            return 1
        return max(1, sum(1 for n in range(self.first, self.last + 1) if n > RANGE_ROUNDS))

    @property
    def look_alpha(self) -> float:
        """The two-sided error of one t look: 1 - confidence, split over the looks (Bonferroni)."""
        return (1 - self.confidence) / self.t_looks

    def level(self, rounds: int) -> float:
        """The confidence of the interval at ``rounds`` rounds (exact for the range)."""
        if rounds < MIN_ROUNDS:
            return 0.0
        if rounds == RANGE_ROUNDS:
            return 1 - 2 * 0.5 ** rounds
        return 1 - self.look_alpha

    def words(self) -> str:
        looks = (f"; looks from {self.first} to at most {self.last} rounds, each t look at "
                 f"{percent(1 - self.look_alpha)} (Bonferroni over {self.t_looks})" if self.last > self.first else "")
        return f"equivalent within ±{percent(self.margin)}{looks}"


@dataclass(frozen=True)
class Comparison:
    """A against B on one figure: ``ratio`` = A / B (the geometric mean of the per-round ratios),
    its interval, and the outcome for A ("better", "worse", "equivalent", "undecided")."""

    figure: str  # "rps", "p50", "p99"
    outcome: str
    ratio: float
    low: float
    high: float
    rounds: int = 0  # paired rounds behind it (unpaired: the fewer cells of the two)
    method: str = "range"  # "range", "t", "unpaired", "too few rounds"
    level: float = 0.0  # the interval's confidence
    margin: float = DEFAULT_MARGIN

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

    def text(self) -> str:
        """``"0.61x (0.52–0.70)"``."""
        if self.method == "too few rounds":
            return f"{self.ratio:.2f}x"
        return f"{self.ratio:.2f}x ({self.low:.2f}–{self.high:.2f})"

    def how(self) -> str:
        """``"range of 3 rounds, 75%"``, ``"t over 5 rounds, 98.3%"``, ``"unpaired: ..."``."""
        if self.method == "unpaired":
            return "unpaired: the cells record no rounds"
        if self.method == "too few rounds":
            return f"{self.rounds} paired round{'s' if self.rounds != 1 else ''}: too few to judge"
        kind = "range of" if self.method == "range" else "t over"
        return f"{kind} {self.rounds} rounds, {percent(self.level)}"

    def describe(self) -> str:
        """``"1.25x (1.10–1.40; range of 3 rounds, 75%): better"``."""
        inner = self.how() if self.method == "too few rounds" else f"{self.low:.2f}–{self.high:.2f}; {self.how()}"
        return f"{self.ratio:.2f}x ({inner}): {self.outcome}"


def percent(share: float) -> str:
    """``75%``, ``98.3%``: one decimal only where it is not a whole percentage."""
    value = round(share * 100, 1)
    return f"{value:g}%"


def outcome_of(low: float, high: float, higher_is_better: bool, margin: float) -> str:
    """The outcome of an interval of A / B."""
    if 1 - margin <= low and high <= 1 + margin:
        return "equivalent"
    if low > 1:
        return "better" if higher_is_better else "worse"
    if high < 1:
        return "worse" if higher_is_better else "better"
    return "undecided"


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
    if n == RANGE_ROUNDS:
        low, high, method = min(values), max(values), "range"
    else:
        sigma2 = sum(wi * (x - mean) ** 2 for wi, x in zip(w, logs, strict=True)) / (n - 1)
        half = t_quantile(rule.look_alpha / 2, n - 1) * math.sqrt(sigma2 / total)
        low, high, method = math.exp(mean - half), math.exp(mean + half), "t"
    return Comparison(figure, outcome_of(low, high, higher_is_better, rule.margin), point, low, high, n, method,
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
    outcome = outcome_of(low, high, higher_is_better, rule.margin) if n >= MIN_ROUNDS else "undecided"
    return Comparison(figure, outcome, point, low, high, n, "unpaired", 0.0, rule.margin)


def _median(values: list[float]) -> float:
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


# --- Student's t quantile (no scipy here): the regularised incomplete beta function ------------


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (Lentz's method)."""
    tiny, eps = 1e-300, 3e-16
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < eps:
            break
    return h


def incomplete_beta(a: float, b: float, x: float) -> float:
    """I_x(a, b), the regularised incomplete beta function."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1) / (a + b + 2):
        return front * _beta_fraction(a, b, x) / a
    return 1.0 - front * _beta_fraction(b, a, 1.0 - x) / b


def t_tail(t: float, df: int) -> float:
    """P(T > t) for Student's t with ``df`` degrees of freedom, t >= 0."""
    return 0.5 * incomplete_beta(df / 2, 0.5, df / (df + t * t))


@functools.lru_cache(maxsize=256)
def t_quantile(upper: float, df: int) -> float:
    """The q with P(T > q) = ``upper`` (0 < upper <= 0.5), by bisection on the tail."""
    if not 0 < upper <= 0.5:
        raise ValueError(f"upper tail must be in (0, 0.5], got {upper}")
    low, high = 0.0, 1.0
    while t_tail(high, df) > upper:
        high *= 2
    for _ in range(100):
        mid = (low + high) / 2
        if t_tail(mid, df) > upper:
            low = mid
        else:
            high = mid
    return (low + high) / 2
