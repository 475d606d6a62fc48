"""From records to conclusions: medians and spread over repeats, pooled tails with intervals,
requests in flight, best layout, verdict; the open loop's step verdicts.

Pure functions of a ``Results`` (or of a parsed httperf summary): no timing, no processes, so
they are tested on fixtures and used unchanged by ``report`` for a live run and a replayed one.

Honest tails. A 5-s cell holds 60-80 requests, so its own p99 is its maximum. Each group
(scenario, layout, level) therefore pools its repeats' latency histograms (``Cell.histogram``:
the requests wrk measured) and reads p50/p99 from the pool, with a bootstrap confidence interval
(``pooled_tails``). Resampling: first the repeats (with replacement), then the requests of the
drawn repeats (from their histograms; ``bootstrap_percentiles``). Requests of one cell are not
independent (they queue behind each other, on one machine state) and repeats drift on a noisy
machine; resampling requests alone would treat every request as independent and give intervals
far too narrow, while resampling repeats first carries the between-repeat spread into the
interval. The repeat draws are the same for every group with the same number of repeats, so two
layouts' replicates are paired by repeat number (repeats are interleaved: repeat r of each
layout ran under the same machine drift), which is what the ratio's interval uses. Everything is
seeded: the same file gives the same intervals.

Comparisons (``compare_groups``, the one function every decision calls: the verdict, the best
per level, the alternatives, the layout choice and tune): paired by round (``bench.paired``):
the per-round ratios of throughput, or of each round's p99, with their interval, and one of
"better", "worse", "equivalent" (within the margin) or "undecided". Cells that record no round
(older files) are compared unpaired, conservatively, and reports say so. The margin and the
looks of the stopping rule come from the run's arguments (``rule_of``). The pooled p99 with its
bootstrap interval is what tables quote (only when at least ``MIN_SLOWER_REQUESTS`` requests lie
above it); files without histograms fall back to per-cell figures: the median of the repeats'
p99 with its low–high range (``Tails.pooled`` False).

By concern, one module each: ``tails`` (statistics: medians, pooled tails, bootstrap intervals,
requests in flight), ``groups`` (grouping, comparing and ranking), ``cautions`` (the machine's
state and the warnings), ``choice`` (the layout to run, and uWSGI against the peers),
``memory`` (the cost of a process and of a thread), ``openloop`` (a step's verdict),
``mechanism`` (what the requests in flight per worker say). Other
modules import these names from ``bench.analysis``.
"""

from uwsgi_layouts.bench.analysis.cautions import (
    LOAD_CAUTION_SHARE,
    OTHERS_CAUTION,
    STEAL_CAUTION,
    machine_cautions,
    unpaired_note,
    warnings,
)
from uwsgi_layouts.bench.analysis.choice import (
    GOAL_P99_SLACK,
    GOAL_RPS_OF_MAPPED,
    TARGET_VS_PEER_P99,
    TARGET_VS_PEER_RPS,
    UWSGI,
    Alternatives,
    Answer,
    Choice,
    GoalAnswer,
    Lowest,
    Matchup,
    PeerChoice,
    against,
    alternatives,
    goal_answer,
    layout_choice,
    lowest_p99,
    peer_choices,
    server_of,
    steady_scenarios,
)
from uwsgi_layouts.bench.analysis.groups import (
    FIGURES,
    BestAtLevel,
    Group,
    ahead_of_next,
    best_and_runner_up,
    best_per_level,
    cell_cpu_ms,
    cell_p50,
    cell_p99,
    compare_groups,
    group_cells,
    group_of,
    memory_stats,
    ranked_at_level,
    requests_for_p99,
    requests_to_quote,
    rule_of,
    sum_status,
    tail_advice,
    tail_seconds,
    throughput_scores,
)
from uwsgi_layouts.bench.analysis.mechanism import (
    EVEN_TOTALS,
    PILED_UP,
    PILEUP_ALIKE,
    SATURATED,
    EvenTotals,
    Mechanism,
    even_totals,
    mechanism_of,
    pileup_level,
)
from uwsgi_layouts.bench.analysis.memory import (
    LAYOUT_SIZE_RE,
    MEMORY_KEY,
    MemoryCost,
    fit_memory,
    memory_cost,
    memory_costs,
)
from uwsgi_layouts.bench.analysis.openloop import (
    MIN_RATE_OF_TARGET,
    REPLIES_OF_REQUESTS,
    judge_step,
    steady_min,
)
from uwsgi_layouts.bench.analysis.tails import (
    BOOTSTRAP_REPLICATES,
    BOOTSTRAP_SEED,
    CONFIDENCE,
    MIN_REQUESTS_FOR_P99,
    MIN_SLOWER_REQUESTS,
    NOISY_SPREAD,
    TAIL_QUANTILES,
    Inflight,
    Interval,
    Stat,
    Tails,
    bootstrap_percentiles,
    inflight_of,
    percentile_of,
    pool,
    pooled_tails,
    rank,
    repeat_draws,
    repeats_interval,
    slower_than,
)

__all__ = [
    "against",
    "ahead_of_next",
    "Alternatives",
    "alternatives",
    "Answer",
    "best_and_runner_up",
    "best_per_level",
    "BestAtLevel",
    "bootstrap_percentiles",
    "BOOTSTRAP_REPLICATES",
    "BOOTSTRAP_SEED",
    "cell_cpu_ms",
    "cell_p50",
    "cell_p99",
    "Choice",
    "compare_groups",
    "CONFIDENCE",
    "EVEN_TOTALS",
    "even_totals",
    "EvenTotals",
    "FIGURES",
    "fit_memory",
    "GOAL_P99_SLACK",
    "GOAL_RPS_OF_MAPPED",
    "goal_answer",
    "GoalAnswer",
    "Group",
    "group_cells",
    "group_of",
    "Inflight",
    "inflight_of",
    "Interval",
    "judge_step",
    "layout_choice",
    "LAYOUT_SIZE_RE",
    "LOAD_CAUTION_SHARE",
    "Lowest",
    "lowest_p99",
    "machine_cautions",
    "Matchup",
    "memory_cost",
    "memory_costs",
    "MEMORY_KEY",
    "memory_stats",
    "MemoryCost",
    "Mechanism",
    "mechanism_of",
    "MIN_RATE_OF_TARGET",
    "MIN_REQUESTS_FOR_P99",
    "MIN_SLOWER_REQUESTS",
    "NOISY_SPREAD",
    "OTHERS_CAUTION",
    "peer_choices",
    "PeerChoice",
    "percentile_of",
    "PILED_UP",
    "PILEUP_ALIKE",
    "pileup_level",
    "pool",
    "pooled_tails",
    "rank",
    "ranked_at_level",
    "repeat_draws",
    "repeats_interval",
    "REPLIES_OF_REQUESTS",
    "requests_for_p99",
    "requests_to_quote",
    "rule_of",
    "SATURATED",
    "server_of",
    "slower_than",
    "Stat",
    "steady_min",
    "steady_scenarios",
    "STEAL_CAUTION",
    "sum_status",
    "tail_advice",
    "tail_seconds",
    "TAIL_QUANTILES",
    "Tails",
    "TARGET_VS_PEER_P99",
    "TARGET_VS_PEER_RPS",
    "throughput_scores",
    "unpaired_note",
    "UWSGI",
    "warnings",
]
