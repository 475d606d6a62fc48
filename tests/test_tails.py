"""Honest tails and the in-flight mechanism: pure logic, nothing started, nothing timed.

Inputs are synthetic and labelled so: latency samples drawn from known distributions (so the
true p99 is known), stats-server samples written by hand, wrk histogram lines built here, and
``tests/fixtures/results-tails.json`` (SYNTHETIC, ``make_fixture.build_tails``). The one real
input is ``uwsgi-stats-2x4-mapped.json``, a document read from a running stats server.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace
from pathlib import Path
from statistics import NormalDist

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.refusals import refusal
from uwsgi_layouts.bench.analysis import (
    BOOTSTRAP_REPLICATES,
    MIN_SLOWER_REQUESTS,
    bootstrap_percentiles,
    compare_groups,
    group_cells,
    percentile_of,
    pool,
    pooled_tails,
    requests_for_p99,
    requests_to_quote,
    tail_advice,
    tail_seconds,
    warnings,
)
from uwsgi_layouts.bench.analysis import tails as tails_module
from uwsgi_layouts.bench.load.wrk import (
    compress,
    correction_interval,
    measured_histogram,
    parse_histogram,
    round_latency,
    to_run,
    uncorrect,
)
from uwsgi_layouts.bench.observe import Sample, Sampler, inflight_summary, read_sample
from uwsgi_layouts.bench.results import Cell, Results, ResultsError, load
from uwsgi_layouts.bench.summary import summarize

FIXTURES = Path(__file__).parent / "fixtures"
TAILS = FIXTURES / "results-tails.json"

# ------------------------------------------------------------------------------ synthetic distributions

MU, SIGMA = math.log(200_000), 0.4  # lognormal latencies around 200 ms, in us
TRUE_P99 = math.exp(MU + SIGMA * NormalDist().inv_cdf(0.99))


def lognormal_histogram(rng: np.random.Generator, n: int, scale: float = 1.0):
    values, counts = np.unique(np.round(rng.lognormal(MU, SIGMA, n) * scale).astype(int), return_counts=True)
    return compress(zip(values.tolist(), counts.tolist(), strict=True))


def test_percentile_is_the_nearest_rank():
    hist = [(v, 1) for v in range(1, 101)]  # 1..100, one each
    assert percentile_of(hist, 9900) == 99 and percentile_of(hist, 5000) == 50
    assert percentile_of([(5, 1)], 9900) == 5
    assert percentile_of([], 9900) == 0.0
    assert pool([[(1, 2), (3, 1)], [(1, 1), (2, 4)]]) == ((1, 3), (2, 4), (3, 1))


def test_bootstrap_is_deterministic():
    rng = np.random.default_rng(7)
    hists = [lognormal_histogram(rng, 300) for _ in range(3)]
    a, b = bootstrap_percentiles(hists), bootstrap_percentiles(hists)
    assert (a[9900].low, a[9900].high) == (b[9900].low, b[9900].high)
    assert np.array_equal(a[9900].replicates, b[9900].replicates)
    assert a[9900].low <= a[9900].value <= a[9900].high
    other = bootstrap_percentiles(hists, seed=1)
    assert not np.array_equal(a[9900].replicates, other[9900].replicates)


def test_the_bootstrap_in_chunks_draws_what_it_drew_at_once(monkeypatch):
    """The replicates' mixtures are held 100 at a time; a stored run renders the same intervals as
    when they were held all at once (the chunk size leaves every replicate as it was)."""
    rng = np.random.default_rng(11)
    hists = [lognormal_histogram(rng, n) for n in (900, 1200, 700, 1100)]
    chunked = bootstrap_percentiles(hists)
    monkeypatch.setattr(tails_module, "BOOTSTRAP_CHUNK", BOOTSTRAP_REPLICATES)
    whole = bootstrap_percentiles(hists)
    monkeypatch.setattr(tails_module, "BOOTSTRAP_CHUNK", 333)  # a last chunk of one
    uneven = bootstrap_percentiles(hists)
    for q in (5000, 9900):
        assert np.array_equal(chunked[q].replicates, whole[q].replicates)
        assert np.array_equal(uneven[q].replicates, whole[q].replicates)
        assert (chunked[q].low, chunked[q].high) == (whole[q].low, whole[q].high)


def test_bootstrap_interval_covers_a_known_p99():
    """95% intervals of the pooled p99 of 3 x 1000 lognormal requests contain the true p99 in
    at least 90% of 60 independent trials (measured: 96-100%), and are not uselessly wide."""
    rng = np.random.default_rng(20240901)
    hits, widths = 0, []
    for _ in range(60):
        q = bootstrap_percentiles([lognormal_histogram(rng, 1000) for _ in range(3)])[9900]
        hits += q.low <= TRUE_P99 <= q.high
        widths.append((q.high - q.low) / TRUE_P99)
    assert hits / 60 >= 0.90
    assert np.median(widths) < 0.3


def test_drifting_repeats_widen_the_interval():
    """Resampling repeats first carries their disagreement into the interval."""
    rng = np.random.default_rng(3)
    steady = [lognormal_histogram(rng, 1000) for _ in range(3)]
    drifting = [lognormal_histogram(rng, 1000, scale) for scale in (0.8, 1.0, 1.25)]
    width = lambda hs: (lambda q: q.high - q.low)(bootstrap_percentiles(hs)[9900])  # noqa: E731
    assert width(drifting) > 1.5 * width(steady)


# ------------------------------------------------------------------------------ comparisons (paired by round)


def synthetic_cell(layout, repeat, hist, rps=10.0, scenario="article", level=4, paired=True) -> Cell:
    n = sum(c for _, c in hist)
    p = {k: percentile_of(hist, bp) / 1000 for k, bp in (("p50", 5000), ("p90", 9000), ("p99", 9900),
                                                         ("p999", 9990))}
    return Cell(layout=layout, concurrency=level, repeat=repeat, scenario=scenario, duration_s=n / rps, requests=n,
                rps=rps, latency_ms={**p, "max": hist[-1][0] / 1000}, errors={}, worker_requests={"1": n},
                cpu_s={"uwsgi": 1.0}, unloaded_latency_ms=100.0, capacity_rps=20.0, closed_loop_rps=20.0,
                efficiency=0.5, histogram=hist, round=repeat if paired else 0)


def test_compare_groups_on_pooled_tails():
    rng = np.random.default_rng(11)
    cells = [synthetic_cell("fast", r, lognormal_histogram(rng, 400)) for r in (1, 2, 3)]
    cells += [synthetic_cell("slow", r, lognormal_histogram(rng, 400, 1.6), rps=8.0) for r in (1, 2, 3)]
    cells += [synthetic_cell("twin", r, lognormal_histogram(rng, 400)) for r in (1, 2, 3)]
    r = Results(environment={}, arguments={}, workload={}, cells=tuple(cells))
    g = {x.layout: x for x in group_cells(r)}
    assert g["fast"].tails.pooled and g["fast"].tails.requests == 1200
    assert compare_groups(g["fast"], g["slow"], "p99").outcome == "better"
    assert compare_groups(g["fast"], g["twin"], "p99").outcome == "undecided"  # the same shape: no winner
    rps = compare_groups(g["fast"], g["slow"], "rps")
    assert rps.outcome == "better" and rps.ratio == pytest.approx(10 / 8) and rps.paired
    with pytest.raises(ValueError, match="figure"):
        compare_groups(g["fast"], g["slow"], "p90")


def test_files_without_histograms_fall_back_to_per_cell_figures():
    results = load(FIXTURES / "results-small.json")  # version 1: no histograms
    g = next(x for x in group_cells(results) if x.layout == "2x4-mapped" and x.concurrency == 4)
    cells = [c for c in results.cells if c.layout == "2x4-mapped" and c.concurrency == 4]
    assert not g.tails.pooled and not g.tails.thin
    p99s = sorted(c.latency_ms.p99 for c in cells)
    assert (g.tails.p99.value, g.tails.p99.low, g.tails.p99.high) == (p99s[1], p99s[0], p99s[2])


# ------------------------------------------------------------------------------ the thin-tail flag


def test_thin_p99_is_flagged_with_the_duration_to_use():
    rng = np.random.default_rng(5)
    cells = [synthetic_cell("x", r, lognormal_histogram(rng, 60), rps=12.0) for r in (1, 2, 3)]
    tails = pooled_tails(cells)
    assert tails.requests == 180 and tails.slower < MIN_SLOWER_REQUESTS and tails.thin
    r = Results(environment={}, arguments={"duration": 5}, workload={}, cells=tuple(cells))
    (g,) = group_cells(r)
    # 1000 pooled requests needed (10 above a p99); 3 repeats at 12 req/s: ceil(1000 / 36) = 28 s.
    plural = "" if tails.slower == 1 else "s"
    assert tail_advice(g) == f"p99 rests on {tails.slower} slower request{plural}: use --duration 28 or more --repeats"
    assert tail_advice(g, 5).endswith("(--repeats 17 at --duration 5)")
    assert any("rest on fewer than 10 slower requests" in w and "--duration 28" in w for w in warnings(r))
    enough = [synthetic_cell("x", r, lognormal_histogram(rng, 500)) for r in (1, 2, 3)]
    assert not pooled_tails(enough).thin


def test_ties_at_the_p99_size_the_next_rounds_from_the_share_above_it():
    # 1,200 pooled requests in coarse bins: the p99 (rank 1,188) falls in a bin of 12, and only the
    # 6 slowest lie above it, so 1,200 requests were not enough and more are asked for
    hist = ((100000, 1182), (120000, 12), (150000, 6))
    cells = [synthetic_cell("x", r, tuple((v, c // 3) for v, c in hist), rps=20.0) for r in (1, 2, 3)]
    (g,) = group_cells(Results(environment={}, arguments={}, workload={}, cells=tuple(cells)))
    assert g.tails.requests == 1200 >= requests_for_p99() and g.tails.slower < MIN_SLOWER_REQUESTS
    assert not g.p99_quotable
    # 10 above at the share seen (6 in 1,200): 2,000 pooled, with 20% to spare, at 20 req/s
    assert requests_to_quote(g) == 2000
    assert tail_seconds(g) == pytest.approx((math.ceil(2000 * 1.2) - 1200) / 20.0)
    assert "--duration 34 " in tail_advice(g)  # 2,000 over 3 repeats at 20 req/s
    # without ties, 1,000 requests are the need, as before
    rng = np.random.default_rng(5)
    thin = [synthetic_cell("y", r, lognormal_histogram(rng, 60), rps=12.0) for r in (1, 2, 3)]
    (h,) = group_cells(Results(environment={}, arguments={}, workload={}, cells=tuple(thin)))
    assert requests_to_quote(h) == requests_for_p99()


def test_sparse_in_flight_samples_are_flagged():
    """A cell whose sampler missed more ticks than it sampled (18 of 80 answered, as at load 15 on 2
    cores) gets one warning naming it; 40 of 80 (missed == samples) is not sparse."""
    rng = np.random.default_rng(7)

    def with_inflight(layout, repeat, samples, missed):
        cell = synthetic_cell(layout, repeat, lognormal_histogram(rng, 400))
        return replace(cell, inflight={"samples": samples, "missed": missed, "pileup": 0.5,
                                       "workers": {"1": {"0": 0.5, "1": 0.5}}})

    ok = [with_inflight("even", r, 40, 40) for r in (1, 2, 3)]
    (note,) = [w for w in warnings(Results(environment={}, arguments={}, workload={},
                                           cells=(*ok, with_inflight("late", 1, 18, 62)))) if "sparse" in w]
    assert note.startswith("1 of 4 cells' in-flight samples are sparse") and "late at 4 connections, 18 of 80" in note
    assert not [w for w in warnings(Results(environment={}, arguments={}, workload={}, cells=tuple(ok)))
                if "sparse" in w]


# ------------------------------------------------------------------------------ pile-up from stats samples


def sample(t, *inflight, cores=4) -> Sample:
    return Sample(t, {w: (100 + w, 0, 1) for w in range(1, len(inflight) + 1)},
                  {w: n for w, n in enumerate(inflight, start=1)}, cores)


def test_pileup_counts_uneven_splits_only():
    samples = [sample(0.00, 2, 1),   # 3 requests on 2 workers: 2 / 1 is as even as it gets
               sample(0.04, 3, 0),   # piled up
               sample(0.08, 2, 0),   # piled up
               sample(0.12, 4, 2),   # piled up: 3 / 3 was possible
               sample(0.16, 4, 4),   # full, even
               sample(0.20, 1, 1),
               sample(0.24, 0, 0),
               sample(0.28, 2, 2)]
    s = inflight_summary(samples)
    assert s["samples"] == 8 and s["threads"] == 4
    assert s["pileup"] == pytest.approx(3 / 8)
    assert s["full"] == pytest.approx(2 / 8)
    assert s["interval_ms"] == pytest.approx(40.0)
    assert s["workers"]["1"] == {"0": 1 / 8, "1": 1 / 8, "2": 3 / 8, "3": 1 / 8, "4": 2 / 8}
    for shares in s["workers"].values():
        assert sum(shares.values()) == pytest.approx(1.0)
    Cell(layout="2x4-shared", concurrency=4, repeat=1, duration_s=1, requests=1, rps=1,
         latency_ms={"p50": 1, "p90": 1, "p99": 1, "p999": 1, "max": 1}, errors={}, worker_requests={},
         cpu_s={}, unloaded_latency_ms=1, capacity_rps=1, closed_loop_rps=1, efficiency=1, inflight=s)  # validates


def test_pileup_is_na_with_one_worker_or_one_thread():
    assert inflight_summary([sample(0, 3), sample(0.04, 0)])["pileup"] is None  # P = 1
    one_thread = inflight_summary([sample(0, 1, 0, cores=1), sample(0.04, 1, 1, cores=1)])
    assert one_thread["pileup"] is None and one_thread["full"] == 1.0  # T = 1: full whenever busy


def test_pileup_window_and_no_samples():
    samples = [sample(t / 10, 3, 0) for t in range(5)] + [sample(0.5 + t / 10, 1, 1) for t in range(5)]
    assert inflight_summary(samples, 0.5, 1.0)["pileup"] == 0.0
    assert inflight_summary(samples, 0.0, 0.45)["pileup"] == 1.0
    assert inflight_summary([]) == {}  # a server without a stats server: nothing recorded


def test_sampler_without_a_stats_server_records_nothing():
    with Sampler(None, interval=0.01) as sampler:
        pass
    assert sampler.samples == [] and inflight_summary(sampler.samples) == {}


def test_in_flight_read_from_a_real_stats_document():
    stats = json.loads((FIXTURES / "uwsgi-stats-2x4-mapped.json").read_text())
    busy = {w["id"]: sum(c["in_request"] for c in w["cores"]) for w in stats["workers"]}
    s = read_sample(stats, 1.5)
    assert s.inflight == busy and s.cores == 4 and s.t == 1.5
    stats["workers"][0]["cores"][1]["in_request"] = 1
    stats["workers"][0]["cores"][2]["in_request"] = 1
    assert read_sample(stats, 0).inflight[1] == busy[1] + 2


# ------------------------------------------------------------------------------ wrk's histogram (Lua output)


def stats_correct(hist: dict[int, int], expected: int) -> dict[int, int]:
    """A Python port of wrk 4.1's src/stats.c stats_correct (the reference for ``uncorrect``)."""
    data = dict(hist)
    top = max(hist)
    for n in range(expected * 2, top + 1):
        count, m = hist.get(n, 0), n - expected
        while count and m > expected:
            data[m] = data.get(m, 0) + count
            m -= expected
    return {k: v for k, v in data.items() if v}


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.integers(1, 400), st.integers(1, 5), min_size=1, max_size=40), st.integers(10, 120))
def test_uncorrect_undoes_wrks_correction_exactly(measured, expected):
    corrected = stats_correct(measured, expected)
    assert uncorrect(sorted(corrected.items()), expected) == sorted(measured.items())


def test_correction_interval_matches_wrk():
    assert correction_interval(10_000_000, 400, 4) == 100_000
    assert correction_interval(10_000_000, 3, 4) == 0  # fewer requests than connections: no correction


def wrk_lines(pairs, requests, duration_us=8_000_000, timeouts=0) -> str:
    summary = {"duration_us": duration_us, "requests": requests, "bytes": 1,
               "errors": {"connect": 0, "read": 0, "write": 0, "status": 0, "timeout": timeouts},
               "latency_us": {"min": pairs[0][0], "max": pairs[-1][0], "mean": 1.0, "stdev": 0.0, "p50": pairs[0][0],
                              "p90": pairs[-1][0], "p99": pairs[-1][0], "p999": pairs[-1][0]}}
    return (f"WRK_JSON {json.dumps(summary)}\n"
            f"WRK_HISTOGRAM {json.dumps({'distinct': len(pairs), 'pairs': pairs})}\n")


def test_run_keeps_the_measured_histogram():
    measured = {10_123: 50, 11_456: 30, 1_000_777: 8}  # 88 requests on 4 connections in 8 s
    interval = correction_interval(8_000_000, 88, 4)
    corrected = sorted(stats_correct(measured, interval).items())
    assert sum(c for _, c in corrected) > 88  # wrk's phantom samples
    raw = wrk_lines([list(p) for p in corrected], 88)
    run = to_run(json.loads(raw.splitlines()[0][len("WRK_JSON "):]), raw, connections=4)
    assert run.histogram == ((10_120, 50), (11_460, 30), (1_001_000, 8)) and run.histogram_note == ""
    assert sum(c for _, c in run.histogram) == run.requests == 88


def test_histogram_problems_leave_no_histogram_and_say_why():
    summary = {"duration_us": 1_000_000, "requests": 10, "errors": {"timeout": 1}}
    assert measured_histogram(None, summary, 2) == ((), "the wrk script printed no histogram")
    skipped = parse_histogram('WRK_HISTOGRAM {"distinct": 9000, "skipped": "over the budget"}\n')
    assert measured_histogram(skipped, summary, 2)[1].endswith("over the budget")
    assert measured_histogram({"pairs": [[5, 3]]}, summary, 2) == ((), "histogram holds 3 samples for 10 requests")
    assert measured_histogram({"pairs": [[5, 9]]}, summary, 2)[0] == ((5, 9),)  # 1 too slow: a timeout error
    with pytest.raises(Exception, match="malformed histogram"):
        parse_histogram("WRK_HISTOGRAM {nope\n")
    assert parse_histogram("no such line") is None


@given(st.integers(1, 10**8))
def test_compression_error_is_at_most_half_a_percent_below_10_ms_and_a_twentieth_above(value):
    rounded = round_latency(value)
    assert abs(rounded - value) <= (0.0005 if value >= 10_000 else 0.005) * value + 0.5
    assert len(str(rounded).rstrip("0")) <= (4 if value >= 10_000 else 3) or value < 1000


def test_real_wrk_output_without_histogram_still_parses():
    raw = (FIXTURES / "wrk-2x4-mapped-c2.txt").read_text()  # captured before the histogram block
    data = json.loads(next(line for line in raw.splitlines() if line.startswith("WRK_JSON "))[9:])
    run = to_run(data, raw, connections=2)
    assert run.histogram == () and "no histogram" in run.histogram_note


# ------------------------------------------------------------------------------ results schema


def test_inflight_pileup_may_be_null_but_not_missing():
    base = dict(layout="2x1-shared", concurrency=2, repeat=1, duration_s=1, requests=1, rps=1,
                latency_ms={"p50": 1, "p90": 1, "p99": 1, "p999": 1, "max": 1}, errors={}, worker_requests={},
                cpu_s={}, unloaded_latency_ms=1, capacity_rps=1, closed_loop_rps=1, efficiency=1)
    cell = Cell(**base, inflight={"samples": 3, "pileup": None, "workers": {"1": {"1": 1.0}}})
    assert Cell.from_dict(json.loads(json.dumps(cell.to_dict()))) == cell
    with pytest.raises(ResultsError, match="inflight.pileup: missing"):
        Cell(**base, inflight={"samples": 3, "workers": {"1": {"1": 1.0}}})


def test_tails_fixture_round_trips_and_saves_pairs_on_one_line(tmp_path):
    results = load(TAILS)
    assert "synthetic" in results.environment["_comment"]
    path = results.save(tmp_path / "r.json")
    assert load(path) == results
    pairs = re.findall(r"^\s*\[\d+, \d+\],?$", path.read_text(), flags=re.MULTILINE)
    assert len(pairs) == sum(len(c.histogram) for c in results.cells)  # one line per [latency_us, count]


def test_tails_fixture_matches_its_generator():
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_fixture", FIXTURES / "make_fixture.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.build_tails() == load(TAILS), "rerun tests/fixtures/make_fixture.py"


def test_replace_keeps_histograms_valid():
    cell = load(TAILS).cells[0]
    with pytest.raises(ResultsError, match="ascending"):
        replace(cell, histogram=tuple(reversed(cell.histogram)))


# ------------------------------------------------------------------------------ reports (synthetic fixture)


@pytest.fixture(scope="module")
def tails_results() -> Results:
    return load(TAILS)


def test_terminal_report_shows_pooled_tails_and_pileup(tails_results):
    from uwsgi_layouts.bench.report import terminal_lines

    lines = terminal_lines(tails_results)
    text = "\n".join(lines)
    assert all(len(line) <= 100 for line in lines)
    g = next(x for x in group_cells(tails_results) if (x.scenario, x.layout, x.concurrency) == ("article",
                                                                                             "2x4-mapped", 4))
    p99 = g.tails.p99
    row = next(line for line in lines if line.startswith("2x4-mapped ") and f"({p99.low:.0f}–{p99.high:.0f})" in line)
    assert f"{p99.value:.0f} ({p99.low:.0f}–{p99.high:.0f})" in row and "0% (0–1)" in row
    assert any(line.startswith("2x1-shared ") and " n/a " in line for line in lines)
    # the table's p99 column quotes the pooled p99 where 10 requests or more lie above it, else n/q
    assert re.search(rf"^2x4-mapped\s+13\.3 ±\d+%\s+\d+\s+\d+\s+{p99.value:.0f}\s+n/q", text, flags=re.MULTILINE)
    thin = next(x for x in group_cells(tails_results) if (x.scenario, x.layout, x.concurrency) == ("article",
                                                                                              "2x4-mapped", 2))
    assert not thin.p99_quotable and re.search(r"^2x4-mapped\s+13\.1 ±\d+%\s+\d+\s+\d+\s+n/q", text,
                                                flags=re.MULTILINE)
    assert "tails are per-cell" not in text


def test_mechanism_sentences_are_read_from_the_figures(tails_results):
    from uwsgi_layouts.bench.report.compare import mechanism_sentence

    by = {}
    for g in group_cells(tails_results):
        by.setdefault(g.scenario, []).append(g)
    article = mechanism_sentence(tails_results, "article", by["article"])
    shared = next(g for g in by["article"] if g.layout == "2x4-shared" and g.concurrency == 4)
    assert article.startswith("article, 4 connections (2P): 2x4-shared piled requests up "
                              f"{shared.inflight.pileup.median:.0%}")
    assert "less pile-up, shorter tail" in article
    stall = mechanism_sentence(tails_results, "stall", by["stall"])
    assert "pile-up was about the same" in stall and "is undecided" in stall
    # flip the figures: the sentence follows them
    swapped = replace(tails_results, cells=tuple(
        replace(c, inflight={**c.inflight, "pileup": 0.5}) if c.layout == "2x4-mapped" and c.scenario == "article"
        else c for c in tails_results.cells))
    flipped = mechanism_sentence(swapped, "article", [g for g in group_cells(swapped) if g.scenario == "article"])
    assert re.match(r"article, \d connections \(2?P\): 2x4-mapped piled requests up 50%", flipped)
    assert "yet 2x4-shared's p99 was" in flipped and "does not explain" in flipped


def test_direction_undecided_yet_the_claim_missed_declares_no_winner(tails_results):
    from uwsgi_layouts.bench.report.compare import verdict_lines

    # the stall cells relabelled as the article: mapped and shared are undecided there (no winner),
    # and the claim's 1.25x lies outside every throughput interval: it does not hold
    stall_as_article = replace(tails_results, cells=tuple(replace(c, scenario="article") for c in tails_results.cells
                                                          if c.scenario == "stall"))
    lines = verdict_lines(summarize(stall_as_article))
    text = " ".join(line.strip() for line in lines)
    assert lines[0].startswith("Verdict: the article's claim") and "): does not hold here." in text
    assert text.count("): undecided") == 4 and "better" not in text and "worse" not in text
    assert "at 2 connections (P): does not hold: throughput 0.96x (0.77–1.19): misses it" in text
    assert "p99 1.03x (0.57–1.86): straddles the 0.7x claimed" in text
    assert "): holds here." in " ".join(x.strip() for x in verdict_lines(summarize(tails_results)))


def test_markdown_in_flight_section_and_totals_note(tails_results):
    from uwsgi_layouts.bench.report import markdown_lines
    from uwsgi_layouts.bench.report.plots import plot_file_names

    md = "\n".join(markdown_lines(tails_results, plot_file_names(tails_results)))
    assert "## Requests in flight per worker (the mechanism)" in md
    assert md.index("## Requests in flight") < md.index("## Per-worker shares")
    assert "| p99 pooled ms (95% interval) | >p99 | pile-up |" in md
    assert "> Totals can look balanced while requests pile up" in md
    assert "2x4-shared at 4 connections served 50% / 50%" in md
    assert "| 2x4-shared | 1 | 25% | 20% | 20% | 20% | 15% |" in md
    assert "![inflight-article](inflight-article.png)" in md and "![inflight-stall](inflight-stall.png)" in md


def test_old_files_render_with_per_cell_tails_and_no_inflight_plot(tmp_path):
    from uwsgi_layouts.bench.report import markdown_lines, terminal_lines
    from uwsgi_layouts.bench.report.exporters import export_all

    old = load(FIXTURES / "results-small.json")
    text = "\n".join(terminal_lines(old))
    assert "note: tails are per-cell here" in text and "pile-up" not in text
    assert "Note: Tails are per-cell here" in "\n".join(markdown_lines(old, []))
    names = [p.name for p in export_all(old, tmp_path, formats=("png",))]
    assert "inflight.png" not in names and names == ["throughput.png", "p99.png", "worker-share.png"]


def test_inflight_plot_is_drawn_from_stored_json(tails_results, tmp_path):
    from uwsgi_layouts.bench.report.plots import plot_inflight

    written = plot_inflight(tails_results, tmp_path / "inflight.png")
    assert [p.name for p in written] == ["inflight-article.png", "inflight-stall.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in written)


def test_layout_choice_declares_no_verdict_where_an_interval_straddles_the_slack(tails_results):
    from uwsgi_layouts.bench.analysis import layout_choice
    from uwsgi_layouts.bench.report.choice import choice_lines

    mapped = next(c for c in layout_choice(tails_results) if c.layout == "2x4-mapped")
    # 95% t intervals over 3 rounds: wider than the old 75% range, so 4 connections straddles too
    assert mapped.p99_unsure == ("stall at 2 connections", "stall at 4 connections") and not mapped.p99_misses
    assert mapped.goal == "undecided" and not mapped.meets_goal
    undecided = " ".join(choice_lines(tails_results, summarize(tails_results)))
    assert "No layout meets the goal beyond noise; undecided" in undecided
    shared = next(c for c in layout_choice(tails_results) if c.layout == "2x4-shared")
    assert "article at 4 connections" in shared.p99_misses and not shared.meets_goal


def test_inflight_hz_option(tmp_path, capsys):
    from uwsgi_layouts.bench import cli as bench_cli
    from uwsgi_layouts.bench.kinds import compare as compare_kind

    args = bench_cli.build_parser().parse_args(["compare", "--processes", "2", "--inflight-hz", "0"])
    plan, _ = compare_kind.plan_from_args(args)
    assert plan.inflight_hz == 0 and plan.arguments()["inflight_hz"] == 0
    default, _ = compare_kind.plan_from_args(bench_cli.build_parser().parse_args(["compare", "--processes", "2"]))
    assert default.inflight_hz == 25
    for bad in ("0.5", "500", "fast"):
        line = refusal(bench_cli.main, ["compare", "--out", str(tmp_path / "x"), "--inflight-hz", bad], capsys)
        assert line.startswith("uwsgi-layouts compare: error: argument --inflight-hz: must be 0 (off) or a number in "
                               "1..200, got "), line
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("field,value", [("duration", "x"), ("duration", None), ("repeats", 0),
                                         ("inflight_hz", 0.5), ("warmup", -1), ("timeout", 10_000)])
def test_a_replay_of_a_damaged_stored_option_is_one_line(tmp_path, capsys, field, value):
    # A stored run's options were checked when it was measured; a hand-edited results.json is
    # input too, refused in one line naming the field, with nothing written.
    from uwsgi_layouts.bench import cli as bench_cli

    data = json.loads(TAILS.read_text())
    data["arguments"][field] = value
    damaged = tmp_path / "results.json"
    damaged.write_text(json.dumps(data))
    out = tmp_path / "replayed"
    line = refusal(bench_cli.main, ["compare", "--replay", str(damaged), "--out", str(out)], capsys)
    assert line.startswith(f"error: {field}: must be "), line
    assert not out.exists()


def test_compare_replay_keeps_tails_and_inflight(tmp_path, capsys):
    from uwsgi_layouts.bench import cli as bench_cli

    out = tmp_path / "replayed"
    assert bench_cli.main(["compare", "--replay", str(TAILS), "--out", str(out), "--full"]) == 0
    replayed, stored = load(out / "results.json"), load(TAILS)
    assert replayed.arguments["inflight_hz"] == 25.0
    by_key = lambda r: {(c.scenario, *c.key): c.histogram for c in r.cells}  # noqa: E731
    assert by_key(replayed) == by_key(stored)
    assert [g.tails.p99 for g in group_cells(replayed)] == [g.tails.p99 for g in group_cells(stored)]
    assert (out / "inflight-article.png").is_file() and "pile-up" in capsys.readouterr().out
    old = tmp_path / "old"
    assert bench_cli.main(["compare", "--replay", str(FIXTURES / "results-small.json"), "--out", str(old)]) == 0
    assert load(old / "results.json").arguments["inflight_hz"] == 0


def test_a_group_with_histograms_against_one_without_compares_each_rounds_p99():
    rng = np.random.default_rng(13)
    pooled = [synthetic_cell("a", r, lognormal_histogram(rng, 300)) for r in (1, 2, 3)]
    plain = [replace(synthetic_cell("b", r, lognormal_histogram(rng, 300, 2.0)), histogram=()) for r in (1, 2, 3)]
    r = Results(environment={}, arguments={}, workload={}, cells=tuple(pooled + plain))
    a, b = group_cells(r)
    c = compare_groups(a, b, "p99")
    # each round: a's p99 read from its histogram, b's from wrk's own figure; their ratios paired
    ratios = [percentile_of(x.histogram, 9900) / 1000 / y.latency_ms.p99 for x, y in zip(pooled, plain, strict=True)]
    assert c.ratio == pytest.approx(math.prod(ratios) ** (1 / 3)) and c.outcome == "better" and c.rounds == 3


def test_cells_of_servers_without_a_stats_server_record_no_inflight(tmp_path):
    """LiveRunner's sampler around a load, with stand-in layout and load objects (no process is
    started): a peer server (``has_stats`` False) and an address where nothing listens both
    leave the cell's ``inflight`` empty."""
    import socket
    import time
    from types import SimpleNamespace

    from uwsgi_layouts.bench.kinds.closedloop import LiveRunner

    with socket.socket() as s:  # a loopback port nothing listens on
        s.bind(("127.0.0.1", 0))
        closed = f"127.0.0.1:{s.getsockname()[1]}"
    runner = LiveRunner(None, tmp_path, {}, duration=0.2, warmup=1, timeout=1, inflight_hz=50)
    for layout in (SimpleNamespace(stats_address=closed, has_stats=False), SimpleNamespace(stats_address=closed)):
        with runner._inflight_sampler(layout) as sampler:
            load = SimpleNamespace(started=time.monotonic())
            time.sleep(0.1)
        assert runner._inflight_record(sampler, load) == {}
