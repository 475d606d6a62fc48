"""The article's claim judged target by target (bench.verdict), on SYNTHETIC paired rounds, and the
views that render it: the verdict, its target table and the headline must never disagree."""

from __future__ import annotations

import math
import re
from dataclasses import replace
from pathlib import Path

import pytest

from uwsgi_layouts.bench.decisions import KeyComparison, key_comparisons, next_blocks, recommend, tail_blocks
from uwsgi_layouts.bench.paired import Comparison
from uwsgi_layouts.bench.report import markdown_lines
from uwsgi_layouts.bench.report.compare import verdict_lines
from uwsgi_layouts.bench.report.headline import headline_lines
from uwsgi_layouts.bench.results import Cell, Results, load
from uwsgi_layouts.bench.summary import summarize
from uwsgi_layouts.bench.verdict import (
    Outcome,
    Standing,
    TargetJudgement,
    Verdict,
    article_verdict,
    combine,
    combine_levels,
    standing_of,
    straddle_words,
)

FIXTURES = Path(__file__).parent / "fixtures"


def cell(layout: str, level: int, rnd: int, rps: float, p99_ms: float, requests: int = 2000) -> Cell:
    """A SYNTHETIC cell: ``requests`` answers, 99% at a tenth of ``p99_ms`` and 1% at ``p99_ms``
    (so that the cell's own p99 is ``p99_ms`` and 10+ requests lie at it)."""
    slow = max(10, requests // 100)
    hist = ((int(p99_ms * 100), requests - slow), (int(p99_ms * 1000), slow))
    return Cell(layout=layout, concurrency=level, repeat=rnd, round=rnd, scenario="article",
                duration_s=requests / rps, requests=requests, rps=rps,
                latency_ms={"p50": p99_ms / 10, "p90": p99_ms / 10, "p99": p99_ms, "p999": p99_ms, "max": p99_ms},
                errors={}, worker_requests={"1": requests // 2, "2": requests - requests // 2}, cpu_s={"app": 1.0},
                unloaded_latency_ms=1.0, capacity_rps=0.0, closed_loop_rps=0.0, efficiency=0.9, histogram=hist)


def results_of(rounds: dict[int, list[tuple[float, float]]], shared=(10.0, 300.0)) -> Results:
    """mapped / shared per round at each level: level -> [(throughput ratio, p99 ratio), ...]."""
    cells = []
    for level, ratios in rounds.items():
        for rnd, (rps_ratio, p99_ratio) in enumerate(ratios, 1):
            cells.append(cell("2x4-shared", level, rnd, shared[0], shared[1]))
            cells.append(cell("2x4-mapped", level, rnd, shared[0] * rps_ratio, shared[1] * p99_ratio))
    return Results(environment={"nproc": 2, "others_at_start": 0.02, "loadavg_at_start": [0.4, 0.3, 0.2]},
                   arguments={"processes": 2, "threads": 4, "layouts": ["2x4-shared", "2x4-mapped"],
                              "concurrency": sorted(rounds), "repeats": 3, "duration": 3.0, "scenarios": ["article"],
                              "scenario": "article", "app": {"demo": True}},
                   workload={"article": {}}, cells=tuple(cells), created="2026-01-01T00:00:00+00:00", kind="compare")


def test_standing_of_an_interval_against_a_threshold():
    assert standing_of(1.30, 1.40, 1.25, at_most=False) is Standing.CLEARS
    assert standing_of(1.00, 1.07, 1.25, at_most=False) is Standing.MISSES
    assert standing_of(1.12, 1.29, 1.25, at_most=False) is Standing.STRADDLES
    assert standing_of(0.50, 0.69, 0.70, at_most=True) is Standing.CLEARS
    assert standing_of(0.79, 0.93, 0.70, at_most=True) is Standing.MISSES
    assert standing_of(0.65, 0.75, 0.70, at_most=True) is Standing.STRADDLES
    with pytest.raises(ValueError, match="interval"):
        standing_of(1.2, 1.1, 1.25, at_most=False)


def test_the_claim_combines_its_targets():
    c, m, s = Standing.CLEARS, Standing.MISSES, Standing.STRADDLES
    assert combine([c, c, c, c]) is Outcome.HOLDS
    assert combine([m, m, m, m]) is Outcome.DOES_NOT_HOLD
    # at one level the claim is a conjunction: one missed target decides it, whatever the other does
    assert combine([c, m]) is Outcome.DOES_NOT_HOLD and combine([c, m, s]) is Outcome.DOES_NOT_HOLD
    assert combine([m, s]) is Outcome.DOES_NOT_HOLD and combine([s, m]) is Outcome.DOES_NOT_HOLD
    assert combine([c, s]) is Outcome.UNDECIDED and combine([s]) is Outcome.UNDECIDED
    assert combine([]) is Outcome.CANNOT_BE_CHECKED


def test_the_claim_combines_its_levels():
    h, n, u = Outcome.HOLDS, Outcome.DOES_NOT_HOLD, Outcome.UNDECIDED
    assert combine_levels([h, h]) is Outcome.HOLDS and combine_levels([n, n]) is Outcome.DOES_NOT_HOLD
    assert combine_levels([h, n]) is Outcome.PARTLY and combine_levels([n, h]) is Outcome.PARTLY
    # made for P and 2P: not holding at one decides it, even while the other is undecided
    assert combine_levels([n, u]) is Outcome.DOES_NOT_HOLD and combine_levels([u, n]) is Outcome.DOES_NOT_HOLD
    assert combine_levels([h, u]) is Outcome.UNDECIDED and combine_levels([u, u]) is Outcome.UNDECIDED
    assert combine_levels([]) is Outcome.CANNOT_BE_CHECKED


def test_one_missed_target_decides_a_level_while_the_other_straddles():
    """Throughput plainly below 1.25x (its interval wholly under it), the p99 straddling 0.70x:
    the claim does not hold at that level, and the level gets no more rounds; the direction
    (mapped against 1) is undecided there, which changes nothing."""
    r = results_of({2: [(1.00, 0.62), (1.06, 0.80), (1.02, 0.70), (1.05, 0.78), (1.01, 0.66)],
                    4: [(1.50, 0.50), (1.52, 0.52), (1.49, 0.51), (1.51, 0.50), (1.50, 0.52)]})
    v = article_verdict(r)
    at_p, at_2p = v.levels
    rps, p99 = at_p.claim_targets
    assert rps.standing is Standing.MISSES and p99.standing is Standing.STRADDLES
    assert at_p.pair.rps.outcome == "undecided" and at_p.outcome is Outcome.DOES_NOT_HOLD and at_p.decided
    assert at_2p.outcome is Outcome.HOLDS and v.outcome is Outcome.PARTLY
    keys = {k.level: k for k in key_comparisons(r) if k.kind == "verdict"}
    assert keys[2].settled and keys[4].settled
    head = " ".join(" ".join(headline_lines(r, summarize(r), "x")).split())
    assert "P: does not hold: throughput" in head and "holds in part here" in head


def test_direction_undecided_but_the_claim_plainly_missed():
    """The issue's run: 1.03x (1.00-1.07) at P is no decided difference against 1, yet the whole
    interval lies far below the 1.25x claimed: the claim does not hold there."""
    r = results_of({2: [(1.00, 0.88), (1.05, 0.85), (1.03, 0.90), (1.06, 0.86), (1.01, 0.87)],
                    4: [(1.21, 0.77), (1.25, 0.80), (1.18, 0.74), (1.22, 0.78), (1.19, 0.75)]})
    v = article_verdict(r)
    at_p = v.levels[0]
    assert at_p.pair.rps.outcome == "undecided"  # the direction: the decisions' question
    assert at_p.claim_targets[0].standing is Standing.MISSES and at_p.outcome is Outcome.DOES_NOT_HOLD
    assert "far below the 1.25x claimed" in at_p.claim_targets[0].words()
    assert v.outcome is Outcome.DOES_NOT_HOLD
    text = " ".join(" ".join(verdict_lines(summarize(r))).split())
    assert "Verdict: the article's claim" in text and "does not hold here" in text and "undecided" not in text.split(
        "at 2 connections (P):")[1].split(";")[0]


def test_direction_decided_but_the_claim_straddles():
    """mapped better beyond noise (about 1.25x), but the interval straddles the 1.25x claimed: the
    verdict is undecided and says by how much; the budget adds rounds for it."""
    r = results_of({2: [(1.20, 0.60), (1.30, 0.62), (1.24, 0.58)], 4: [(1.50, 0.50), (1.52, 0.52), (1.49, 0.51)]})
    v = article_verdict(r)
    at_p = v.levels[0]
    assert at_p.pair.rps.outcome == "better" and at_p.pair.settled
    assert at_p.claim_targets[0].standing is Standing.STRADDLES and at_p.outcome is Outcome.UNDECIDED
    past, short = at_p.claim_targets[0].reach
    assert past > 0 and short > 0 and f"reaches {past:.0%} past it and {short:.0%} short of it" in \
        at_p.claim_targets[0].words()
    assert v.outcome is Outcome.UNDECIDED
    # the straddling level is a key comparison the budget measures more; the cleared one is not
    keys = {k.level: k for k in key_comparisons(r) if k.kind == "verdict"}
    assert not keys[2].settled and keys[4].settled


def test_partly_and_a_missing_level():
    r = results_of({2: [(1.02, 0.95), (1.03, 0.97), (1.01, 0.96)], 4: [(1.50, 0.50), (1.52, 0.52), (1.49, 0.51)]})
    assert article_verdict(r).outcome is Outcome.PARTLY
    only_p = results_of({2: [(1.50, 0.50), (1.52, 0.52), (1.49, 0.51)]})
    v = article_verdict(only_p)
    assert v.levels[0].outcome is Outcome.HOLDS and v.outcome is Outcome.PARTLY and "at 4 connections" in v.missing
    with pytest.raises(ValueError, match="missing"):
        Verdict(())


def test_a_target_judgement_is_validated_on_creation():
    with pytest.raises(ValueError, match="figure"):
        TargetJudgement(2, "p95", 1.0, True, 1.0, 1.0, 1.0, Standing.CLEARS, False)
    with pytest.raises(ValueError, match="comparison"):
        TargetJudgement(2, "rps", 1.25, False, 1.3, 1.3, 1.3, Standing.CLEARS, True)


def test_a_straddle_too_wide_to_measure_says_so_instead_of_percentages():
    """Two or three noisy rounds: an interval such as 0.19–3.63 straddles 0.7x, and "73% past, 419%
    short" would say nothing; one four times as wide as its low end says it is too wide."""
    def p99_target(low, high):
        c = Comparison("p99", "undecided", (low * high) ** 0.5, low, high, rounds=3, level=0.999)
        return TargetJudgement(2, "p99", 0.7, True, c.ratio, low, high, Standing.STRADDLES, True, c)

    wide, narrow = p99_target(0.19, 3.63), p99_target(0.68, 0.99)
    assert wide.brief() == "0.83x (0.19–3.63) straddles 0.7x (too wide to say by how much)"
    assert wide.judged() == "straddles: too wide to say by how much"
    assert wide.words().endswith("straddles the 0.7x claimed (an interval too wide to say by how much)")
    assert "%" not in wide.brief() + wide.judged() + wide.words()
    assert narrow.brief() == "0.82x (0.68–0.99) straddles 0.7x (3% past, 41% short)"
    # unpaired cells too few to judge the claim by: the judgement's interval is open, whatever the comparison's
    few = Comparison("p99", "undecided", 0.8, 0.75, 0.85, rounds=2, method="unpaired")
    open_ended = TargetJudgement(2, "p99", 0.7, True, 0.8, 0.75, math.inf, Standing.STRADDLES, True, few)
    assert open_ended.brief() == "0.80x (0.75–0.85): too few rounds" and "inf" not in open_ended.words()



def test_an_undecided_target_says_by_how_much_the_way_the_target_table_does():
    """``straddle_words``, which the peers' and overhead's targets print: how far the interval
    reaches either side, or why it cannot say."""
    def c(low, high, method="t", rounds=3):
        return Comparison("p99", "undecided", (low * high) ** 0.5, low, high, rounds=rounds, method=method)

    assert straddle_words(c(0.68, 0.99), 0.7, True) == "3% past, 41% short"
    assert straddle_words(c(1.20, 1.30), 1.25, False) == "4% past, 4% short"
    assert straddle_words(c(0.19, 3.63), 0.7, True) == "too wide to say by how much"
    assert straddle_words(c(0.75, 0.85, "too few rounds"), 0.7, True) == "too few rounds"
    assert straddle_words(c(0.68, 0.99, rounds=1), 0.7, True) == "too few rounds"
    assert straddle_words(c(0.6, math.inf), 0.7, True) == "too few rounds"
    with pytest.raises(ValueError, match="decided"):
        straddle_words(c(0.90, 0.95), 0.7, True)  # a miss, not a straddle


ROW = re.compile(r"^\s+(\d+) \((2?P)\)\s+(.+?)\s{2,}(.+?)\s{2,}(clears|misses|straddles)\b.*$")
SENTENCE = re.compile(r"^\s+- at (\d+) connections \(2?P\): (holds|does not hold|holds in part|undecided):")


@pytest.mark.parametrize("name", ["results-tails.json", "results-small.json"])
def test_the_rendered_verdict_agrees_with_its_target_table(name):
    """From a stored run: each level's sentence is the combination of the claim rows the table
    shows for it, and the first line's outcome that of all of them (read back from the text)."""
    results = load(FIXTURES / name)
    lines = verdict_lines(summarize(results))
    rows = [m.groups() for m in map(ROW.match, lines) if m]
    claim_rows = [r for r in rows if "(check)" not in r[2]]
    assert len(claim_rows) == 4 and len(rows) == 8
    sentences = {int(m[1]): m[2] for m in map(SENTENCE.match, lines) if m}
    for level, said in sentences.items():
        standings = [Standing(r[4]) for r in claim_rows if int(r[0]) == level]
        assert combine(standings).value == said
    overall = combine_levels(combine(Standing(r[4]) for r in claim_rows if int(r[0]) == level)
                             for level in sorted({int(r[0]) for r in claim_rows})).value
    assert f"): {overall} here." in " ".join(" ".join(lines).split())
    # the Markdown report and the headline render the same judgement
    md = " ".join(" ".join(markdown_lines(results, [])).split())
    assert f"): {overall} here." in md
    assert md.index("## The answer") < md.index("## Verdict")
    head = " ".join(" ".join(headline_lines(results, summarize(results), "results/x")).split())
    assert f"): {overall} here." in head and head.count("straddles") == [r[4] for r in claim_rows].count("straddles")


def test_the_headline_is_short_and_names_the_layout():
    r = results_of({2: [(1.00, 0.88), (1.05, 0.85), (1.03, 0.90)], 4: [(1.21, 0.77), (1.25, 0.80), (1.18, 0.74)]})
    lines = headline_lines(r, summarize(r), "results/run")
    assert lines[:2] == ["", "== the answer =="] and len(lines[2:]) <= 15, "\n".join(lines)
    rec = recommend(r, "article")
    text = " ".join(" ".join(lines).split())
    assert rec is not None and f"Run here: {rec.layout}" in text
    assert "How sure: 95% confidence for all looks together, paired over 3 rounds" in text
    assert "other processes used up to 2% of the CPU" in text and "load average 0.4 at the start" in text
    assert "results/run/report.txt" in text
    assert all(len(x) <= 100 for x in lines)


def test_added_rounds_go_to_the_verdicts_pairs_first():
    """A straddling verdict pair and an undecided other comparison: the next round measures the
    verdict's layouts at the straddling level only; once the verdict is settled, the others."""
    r = results_of({2: [(1.20, 0.60), (1.30, 0.62), (1.24, 0.58)], 4: [(1.50, 0.50), (1.52, 0.52), (1.49, 0.51)]})
    keys = key_comparisons(r)
    verdict_at_2 = next(k for k in keys if k.kind == "verdict" and k.level == 2)
    other = KeyComparison("best", "article", 4, (verdict_at_2.groups[0], verdict_at_2.groups[1]), (), False)
    other = replace(other, groups=tuple(replace(g, layout=g.layout.replace("2x4", "1x4")) for g in other.groups))
    assert next_blocks([*keys, other]) == {"2x4-mapped": {"article": [2]}, "2x4-shared": {"article": [2]}}
    settled = [replace(k, settled=True) for k in keys]
    assert next_blocks([*settled, other]) == {"1x4-mapped": {"article": [4]}, "1x4-shared": {"article": [4]}}


def test_one_round_is_judged_as_nothing():
    r = results_of({2: [(1.50, 0.50)], 4: [(1.50, 0.50)]})
    v = article_verdict(r)
    assert v.outcome is Outcome.UNDECIDED
    rps = v.levels[0].claim_targets[0]
    assert rps.judged() == "straddles: too few rounds" and "too few rounds to judge" in rps.words()
    assert "inf" not in " ".join(verdict_lines(summarize(r))) + " ".join(headline_lines(r, summarize(r), "x"))


@pytest.mark.parametrize("cells_each, judged", [(1, False), (2, False), (3, True)])
def test_unpaired_cells_judge_the_claim_only_when_enough_of_them(cells_each, judged):
    """Results from before rounds were recorded compare cells unpaired: one cell a side has a
    cross-ratio "range" that is a single point, which must not clear (or miss) a threshold."""
    r = results_of({2: [(1.50, 0.50)] * cells_each, 4: [(1.50, 0.50)] * cells_each})
    r = replace(r, cells=tuple(replace(c, round=0) for c in r.cells))  # 0: not recorded
    v = article_verdict(r)
    rps = v.levels[0].claim_targets[0]
    assert rps.comparison.method == "unpaired"
    if judged:
        assert rps.standing is Standing.CLEARS and v.outcome is Outcome.HOLDS
    else:
        assert rps.standing is Standing.STRADDLES and v.outcome is Outcome.UNDECIDED


def test_a_decided_levels_thin_tails_wait_for_the_undecided_level():
    """P decided (throughput plainly short) but its cells too short to quote a p99; 2P straddling:
    the next round measures 2P only, so that the undecided level gets every round the budget holds."""
    thin = {2: [(1.00, 0.80), (1.04, 0.82), (1.02, 0.81)], 4: [(1.20, 0.60), (1.30, 0.62), (1.24, 0.58)]}
    r = results_of(thin)
    r = replace(r, cells=tuple(replace(c, histogram=((int(c.latency_ms.p99 * 1000), 40),), requests=40)
                               if c.concurrency == 2 else c for c in r.cells))
    keys = {k.level: k for k in key_comparisons(r) if k.kind == "verdict"}
    assert keys[2].settled and keys[2].thin and not keys[4].settled
    assert next_blocks(list(keys.values())) == {"2x4-mapped": {"article": [4]}, "2x4-shared": {"article": [4]}}
    # once 2P is decided too, no round until decided: the thin tails get rounds of their own, sized
    # from the cells' rates (tail_blocks; tests/test_tail_rounds.py)
    settled = [replace(k, settled=True) for k in keys.values()]
    assert next_blocks(settled) == {}
    assert set(tail_blocks(settled)) == {"2x4-mapped", "2x4-shared"}
    assert all(set(x["article"]) == {2} for x in tail_blocks(settled).values())


def test_the_headline_stays_short_with_thin_tails_and_every_line_in_use():
    """The longest ordinary answer: both levels straddling after rounds added until decided (the
    final look's share in the how-sure line) and the verdict's tails too thin to quote."""
    noisy = [(1.12, 0.74), (1.28, 0.66), (1.19, 0.71), (1.24, 0.69), (1.15, 0.76), (1.22, 0.68), (1.18, 0.72),
             (1.26, 0.70)]
    r = results_of({2: noisy, 4: noisy[::-1]})
    r = replace(r, cells=tuple(replace(c, histogram=((int(c.latency_ms.p99 * 1000), 50),), requests=50)
                               for c in r.cells),
                arguments={**r.arguments, "max_rounds": 9, "final_share": 0.75, "final_round": 8,
                           "until_decided": {"rounds": [{"round": n, "layouts": {}} for n in range(4, 9)],
                                             "settled_at": {}, "stop": "the budget ended"}})
    lines = headline_lines(r, summarize(r), "results/20260101-120000-compare")
    text = " ".join(" ".join(lines).split())
    assert len(lines[2:]) <= 15, "\n".join(lines)
    assert "Tails: p99 not quotable (need 1,000 requests): P mapped 400, shared 400; 2P mapped 400, shared 400." in text
    assert "(looks at 3-9 rounds: interim 99.8%, final 96.2%)" in text and "straddles 1.25x" in text
    assert all(len(x) <= 100 for x in lines)


def test_the_headline_marks_a_tail_that_pooled_enough_requests_yet_ties_at_its_p99():
    """1,200 requests each, all in one latency bin: none lies above the p99, so more requests were
    needed than the 1,000 the line names, and it says why."""
    steady = [(1.3, 0.6)] * 8
    r = results_of({2: steady, 4: steady})
    r = replace(r, cells=tuple(replace(c, histogram=((int(c.latency_ms.p99 * 1000), 150),), requests=150)
                               for c in r.cells))
    lines = headline_lines(r, summarize(r), "results/20260101-120000-compare")
    text = " ".join(" ".join(lines).split())
    assert ("Tails: p99 not quotable (need 1,000 requests): P mapped 1,200 (ties at its p99), shared 1,200 "
            "(ties at its p99); 2P mapped 1,200 (ties at its p99), shared 1,200 (ties at its p99).") in text
    assert all(len(x) <= 100 for x in lines) and len(lines[2:]) <= 15
