"""Paired comparison of retrieval systems (eval/compare.py) on constructed per-query metrics."""
from __future__ import annotations

import numpy as np
import pytest

from gdr.eval.compare import compare_folders, compare_systems, find, paired_test, verdict
from gdr.eval.retrieval import metrics_from_ranks, per_query_metrics, write_per_query


def test_a_clear_difference_has_an_interval_excluding_zero_and_a_small_p():
    # 60 queries: a finds 50, b finds 20 of them (b's hits are a subset of a's)
    a = np.r_[np.ones(50), np.zeros(10)]
    b = np.r_[np.ones(20), np.zeros(40)]
    diff, lo, hi, p = paired_test(a, b)
    assert diff == pytest.approx(0.5)
    assert 0 < lo < diff < hi < 1
    assert p < 1e-3
    assert paired_test(a, b) == (diff, lo, hi, p)  # fixed resampling seed: same inputs, same result


def test_no_difference_gives_p_one_and_a_zero_interval():
    x = np.r_[np.ones(7), np.zeros(5)]
    assert paired_test(x, x) == (0.0, 0.0, 0.0, 1.0)


def test_one_query_is_compared_without_a_test_that_needs_two():
    """A run of one test query (a tiny collection) ended its report in scipy's "two or more observations": its
    sign flips, d and -d, are as extreme, so p = 1, and the interval is the one difference."""
    assert paired_test(np.array([1.0]), np.array([0.0])) == (1.0, 1.0, 1.0, 1.0)


def test_the_permutation_test_is_paired_and_exact_for_few_queries():
    # 5 queries, a wins each by 1: of the 2^5 sign flips only all-plus and all-minus reach |mean| = 1
    diff, lo, hi, p = paired_test(np.ones(5), np.zeros(5))
    assert (diff, lo, hi) == (1.0, 1.0, 1.0)
    assert p == pytest.approx(2 / 32)
    # an unpaired test would see two groups {1,1,1,1,1} vs {0,0,0,0,0}; pairing matters when queries differ in
    # difficulty: a constant +0.1 on queries of very different levels is significant only when paired
    base = np.linspace(0, 0.8, 12)
    _, lo, _, p = paired_test(base + 0.1, base)
    assert lo > 0 and p < 0.001


def test_noise_is_not_significant():
    rng = np.random.default_rng(3)
    a, b = rng.integers(0, 2, 40).astype(float), rng.integers(0, 2, 40).astype(float)
    diff, lo, hi, p = paired_test(a, b)
    assert lo < 0 < hi and p > 0.05


def test_compare_systems_averages_seeds_per_query_and_aligns_queries():
    q = [f"q{i}" for i in range(30)]
    gc = np.stack([np.r_[np.ones(25), np.zeros(5)], np.r_[np.ones(20), np.zeros(10)]])  # 2 seeds
    other = np.r_[np.ones(5), np.zeros(25)]
    order = np.random.default_rng(0).permutation(30)
    systems = {"gc": {"recall@1": gc}, "hkmi": {"recall@1": other[order][None]}}
    out = compare_systems(systems, {"gc": q, "hkmi": [q[i] for i in order]}, "gc", metrics=("recall@1",), scale=100)
    (c,) = out
    assert (c.a, c.b, c.metric, c.n_queries, c.n_seeds_a, c.n_seeds_b) == ("gc", "hkmi", "recall@1", 30, 2, 1)
    assert c.diff == pytest.approx(100 * (22.5 - 5) / 30, abs=1e-3)
    assert c.ci95[0] > 0 and c.p_value < 0.01
    assert "GC beats HKmI" in verdict(c, names={"gc": "GC", "hkmi": "HKmI"})
    flipped = compare_systems(systems, {"gc": q, "hkmi": [q[i] for i in order]}, "hkmi", metrics=("recall@1",))[0]
    assert flipped.diff == pytest.approx(-c.diff / 100, abs=1e-4)
    assert "is beaten by" in verdict(flipped)


def test_per_query_metrics_average_to_the_reported_metrics():
    ranks = np.array([0, 1, 3, 12, 1, 150])
    pq = per_query_metrics(ranks)
    m = metrics_from_ranks(ranks)
    assert pq["recall@1"].tolist() == [0, 1, 0, 0, 1, 0]
    assert pq["mrr@100"].mean() == pytest.approx(m.mrr)
    assert pq["recall@10"].mean() == pytest.approx(m.recall[10])


def test_compare_folders_reads_per_query_files(tmp_path):
    qids = [f"q{i}" for i in range(40)]
    dirs = {}
    for name, found in (("gc", 30), ("hkmi", 28), ("bm25", 40)):
        d = tmp_path / name
        d.mkdir()
        write_per_query(d / "per_query.json", dict(zip(qids, [1] * found + [0] * (40 - found))))
        dirs[name] = [d]
    comps = compare_folders(dirs, reference="gc")
    assert {(c["b"], c["metric"]) for c in comps} == {(b, m) for b in ("hkmi", "bm25")
                                                      for m in ("recall@1", "recall@10", "mrr@100")}
    assert set(comps[0]) >= {"a", "b", "metric", "n_queries", "diff", "ci95", "p_value"}
    near = find(comps, "gc", "hkmi", "recall@1")
    assert near["diff"] == pytest.approx(5.0) and near["ci95"][0] <= 0 <= near["ci95"][1]
    assert "not significant" in verdict(near)
    far = find(comps, "gc", "bm25", "recall@1")
    assert far["diff"] == pytest.approx(-25.0) and far["ci95"][1] < 0 and far["p_value"] < 0.01
    assert compare_folders({"gc": dirs["gc"]}) == []


def test_mean_interval_covers_the_mean():
    from gdr.eval.compare import mean_interval

    x = np.r_[np.ones(30), np.zeros(70)]
    mean, lo, hi = mean_interval(x)
    assert mean == pytest.approx(0.3) and 0.19 < lo < 0.3 < hi < 0.41
    assert mean_interval(np.ones(5)) == (1.0, 1.0, 1.0)


def test_one_discordant_query_of_ten_gives_an_interval_inside_the_resampled_range():
    a, b = np.zeros(10), np.r_[1.0, np.zeros(9)]
    diff, lo, hi, p = paired_test(a, b)
    assert diff == pytest.approx(-0.1) and -0.31 < lo <= diff and hi == 0.0 and p == 1.0


def test_compare_folders_joins_the_folds_of_a_seed(tmp_path):
    """Cross-validation: a seed is a list of folders, one per fold, each scored on its own topics; joined, the
    comparison runs over every topic, seeds averaged per topic as without folds."""
    qids = [f"q{i}" for i in range(12)]
    folds = [qids[0::3], qids[1::3], qids[2::3]]  # 3 folds of 4 topics
    hits = {"gc": [set(qids[:9]), set(qids[:6])], "hkmi": [set(qids[:3]), set(qids[:3])]}  # 2 seeds each
    dirs = {}
    for name, seeds in hits.items():
        dirs[name] = []
        for s, found in enumerate(seeds):
            group = []
            for f, topics in enumerate(folds):
                d = tmp_path / f"{name}-s{s}-f{f}"
                d.mkdir()
                write_per_query(d / "per_query.json", {q: int(q in found) for q in topics})
                group.append(d)
            dirs[name].append(group)
    c = find(compare_folders(dirs, reference="gc"), "gc", "hkmi", "recall@1")
    # per topic: gc (9/12 + 6/12 averaged over seeds) - hkmi 3/12 = 7.5/12 - 3/12
    assert c["n_queries"] == 12 and c["diff"] == pytest.approx(100 * 4.5 / 12)
    assert (c["n_seeds_a"], c["n_seeds_b"]) == (2, 2)


# ---------------------------------------------------------------------------------------------- seeds and queries
def _schemes(shift: float, seed_sd: float, n_seeds: int = 5, n: int = 400, seed: int = 0):
    """Per-seed per-query values (points) of two schemes on the same queries: a query effect shared by both, a
    seed effect per retriever of size ``seed_sd``, a small residual, and a - b = ``shift`` on average."""
    rng = np.random.default_rng(seed)
    q = rng.normal(50, 20, n)
    a = q + shift + rng.normal(0, seed_sd, (n_seeds, 1)) + rng.normal(0, 2, (n_seeds, n))
    b = q + rng.normal(0, seed_sd, (n_seeds, 1)) + rng.normal(0, 2, (n_seeds, n))
    return a, b


def test_a_shift_without_seed_noise_is_decided():
    from gdr.eval.compare import primary_verdict, seed_query_test
    a, b = _schemes(5.0, 0.0)
    t = seed_query_test(a, b, ("gc", "hkmi"), "recall@1")
    assert t.ci95[0] > 0 and t.ci95[0] <= t.diff <= t.ci95[1]
    assert t.diff == pytest.approx(5.0, abs=0.5)
    v = primary_verdict(t, margin=2.0, names={"gc": "GC", "hkmi": "HKmI"})
    assert v["status"] == "decided" and v["line"].startswith("Decided: GC beats HKmI")


def test_identical_schemes_with_little_noise_are_equivalent_within_the_margin():
    from gdr.eval.compare import primary_verdict, seed_query_test
    a, b = _schemes(0.0, 0.1)
    v = primary_verdict(seed_query_test(a, b, ("gc", "hkmi"), "recall@1"), margin=2.0)
    assert v["status"] == "equivalent" and "+-2 points" in v["line"]


@pytest.mark.parametrize("a, b, why", [
    (np.full((2, 3), 100.0), np.zeros((2, 3)), "3 test queries are too few for any test at this level (at least 6)"),
    (np.zeros((2, 50)), np.zeros((2, 50)), "score alike on every query and seed, so the noise of their difference "
                                           "cannot be estimated"),
    (np.full((1, 50), 100.0), np.zeros((3, 50)), "gc ran one seed, so the seed noise that could flip this difference "
                                                 "is not measured: run at least 2 seeds a scheme"),
])
def test_no_verdict_from_a_few_queries_values_that_do_not_vary_or_one_seed(a, b, why):
    """A bootstrap of 3 queries all won by a gives the interval [+100, +100], yet no sign-flip test of 3 pairs goes
    below p = 0.25; 50 queries failed by both give an interval of width 0 that measures no noise; a scheme of one
    seed has a seed variance of 0 that is not a measured one (its interval covered 0.58-0.87 of simulated runs)."""
    from gdr.eval.compare import primary_verdict, seed_query_test
    v = primary_verdict(seed_query_test(a, b, ("gc", "hkmi"), "recall@1"), margin=2.0)
    assert v["status"] == "undecided" and why in v["line"] and v["line"].startswith("Undecided: gc vs hkmi")


def test_the_same_difference_on_every_query_and_seed_is_decided_by_its_sign_flips():
    from gdr.eval.compare import primary_verdict, seed_query_test
    v = primary_verdict(seed_query_test(np.full((2, 50), 100.0), np.zeros((2, 50)), ("gc", "hkmi"), "recall@1"), 2.0)
    assert v["status"] == "decided" and v["line"].startswith("Decided: gc beats hkmi") and "p = 1.8e-15" in v["line"]


def test_a_nan_among_per_query_values_is_refused_not_found_significant():
    from gdr.eval.compare import paired_test, seed_query_test
    a, b = np.ones(50), np.zeros(50)
    a[7] = np.nan
    with pytest.raises(ValueError, match=r"^a\[7\] = nan: per-query values must be finite numbers \(1 are not\)"):
        paired_test(a, b)
    with pytest.raises(ValueError, match=r"^a\[0, 7\] = nan: per-query values must be finite"):
        seed_query_test(a[None, :], b[None, :])


def test_a_difference_that_rounds_to_zero_at_one_decimal_is_shown_with_two_digits():
    from gdr.eval.compare import points
    assert [points(x) for x in (0.0376, -0.04, 0.0, 1.26)] == ["+0.038", "-0.04", "+0.0", "+1.3"]
    assert points(0.02, sign=False) == "0.02"


def test_seed_noise_widens_the_interval_and_asks_for_more_seeds():
    from gdr.eval.compare import primary_verdict, seed_query_test
    a, b = _schemes(3.0, 6.0, n_seeds=3, n=2000)
    t = seed_query_test(a, b, ("gc", "hkmi"), "recall@1")
    # the query-only interval (seeds averaged) is far narrower than the one counting the seeds
    _, lo, hi, _ = paired_test(a.mean(0), b.mean(0))
    assert (hi - lo) * 3 < t.ci95[1] - t.ci95[0]
    assert t.var_seed_a > 5 and t.var_seed_b > 5  # the seeds' variance is seen (true 36 + residual / n)
    assert t.detectable > 3.0
    v = primary_verdict(t, margin=1.0)
    assert v["status"] == "undecided"
    assert v["needed"]["seeds"] is not None and v["needed"]["seeds"] > 3 and "seeds a scheme" in v["line"]
    # the counts named decide it by the same interval: at them, t(df) x se reaches the goal, one fewer does not
    # (advice that named the run's own counts, when a bootstrap and a normal-quantile SE disagreed, is not possible)
    from gdr.eval.compare import _parts, _t
    goal = max(abs(t.diff), 1.0 - abs(t.diff))
    s = v["needed"]["seeds"]
    half = [float(_t(0.95, df) * se) for se, df in (_parts(t.var_query, t.var_seed_a, t.var_seed_b, 2000, c, c)
                                                    for c in (s - 1, s))]
    assert half[1] <= goal < half[0]


def test_the_counts_that_would_decide_are_the_fewest_of_an_exhaustive_search():
    """_needed searches the counts in growing blocks and gives a level up when even infinitely many cannot reach
    the goal: the same answers as t(df) x se evaluated at every count from the run's own up to the limit."""
    from scipy import stats

    from gdr.eval.compare import _needed, _parts, seed_query_test

    def exhaustive(t, goal, most):
        out = {}
        for level, counts in (("seeds", np.arange(max(t.n_seeds_a, t.n_seeds_b, 2), most + 1)),
                              ("queries", np.arange(t.n_queries, most + 1))):
            n, sa, sb = (t.n_queries, counts, counts) if level == "seeds" else (counts, t.n_seeds_a, t.n_seeds_b)
            se, df = _parts(t.var_query, t.var_seed_a, t.var_seed_b, n, sa, sb)
            ok = np.flatnonzero(stats.t.ppf(0.975, df) * se <= goal)
            out[level] = int(counts[ok[0]]) if ok.size else None
        return out

    rng = np.random.default_rng(3)
    answers = set()
    for _ in range(40):
        sa, sb = (int(x) for x in rng.integers(1, 6, 2))
        n = int(rng.integers(5, 400))
        a = (rng.random((sa, n)) < rng.random()) + rng.normal(0, rng.random() * 0.1, (sa, 1))
        b = (rng.random((sb, n)) < rng.random()) + rng.normal(0, rng.random() * 0.1, (sb, 1))
        t = seed_query_test(a, b)
        for goal in (0.003, 0.03, 0.1, 0.3):
            found = _needed(t, goal, 0.95, most=20_000)
            assert found == exhaustive(t, goal, 20_000), (t, goal)
            answers |= {(level, x is None, x == first) for level, x, first in
                        (("seeds", found["seeds"], max(sa, sb, 2)), ("queries", found["queries"], n))}
    # every kind of answer was met: none, the run's own count, and a count found further on, at both levels
    assert answers == {(level, none, own) for level in ("seeds", "queries")
                       for none, own in ((True, False), (False, True), (False, False))}


def test_a_rewritten_report_computes_only_the_comparisons_whose_values_changed():
    from gdr.eval.compare import _paired_test

    rng = np.random.default_rng(0)
    systems = {name: {"recall@1": (rng.random((2, 50)) < 0.5).astype(float)} for name in ("gc", "hkmi", "random")}
    qids = {name: [f"q{i}" for i in range(50)] for name in systems}
    _paired_test.cache_clear()
    first = compare_systems(systems, qids, "gc", metrics=["recall@1"])
    assert _paired_test.cache_info().misses == 2
    systems["random"] = {"recall@1": np.vstack([systems["random"]["recall@1"], rng.random((1, 50)) < 0.5])}
    again = compare_systems(systems, qids, "gc", metrics=["recall@1"])
    assert (_paired_test.cache_info().misses, _paired_test.cache_info().hits) == (3, 1)  # random's seed 2 only
    assert again[0] == first[0] and again[1] != first[1]


def test_the_standard_error_adds_the_query_and_the_seed_parts_with_their_degrees_of_freedom():
    from scipy import stats

    from gdr.eval.compare import seed_query_test
    a = np.array([[1.0, 0.0, 1.0, 1.0], [1.0, 1.0, 1.0, 0.0]])
    b = np.array([[0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    t = seed_query_test(a, b)
    d_q = a.mean(0) - b.mean(0)
    parts = np.array([d_q.var(ddof=1) / 4, a.mean(1).var(ddof=1) / 2, b.mean(1).var(ddof=1) / 3])
    se = np.sqrt(parts.sum())
    df = parts.sum() ** 2 / (parts ** 2 / np.array([3, 1, 2])).sum()  # Welch-Satterthwaite
    assert t.se == pytest.approx(se, abs=1e-4) and t.df == pytest.approx(df, abs=0.01)
    half = stats.t.ppf(0.975, df) * se
    assert t.ci95 == pytest.approx([d_q.mean() - half, d_q.mean() + half], abs=1e-3)
    assert t.detectable == pytest.approx((stats.t.ppf(0.975, df) + stats.t.ppf(0.8, df)) * se, abs=1e-3)
    assert (t.mean_a, t.n_seeds_a, t.n_seeds_b) == (0.75, 2, 3)


def test_the_interval_over_seeds_and_queries_covers_95_percent_with_three_seeds():
    """300 simulated runs of two equal schemes, 3 seeds each and 200 queries: a query effect, a seed effect (SD 3
    points) and a residual. The 95% interval must hold the true difference 0 about 95% of the time: a percentile
    bootstrap over the 3 seeds held it 82% of the time (its reach ends at the extreme seed means), a normal
    quantile on 2 degrees of freedom per seed variance too narrow as well."""
    from gdr.eval.compare import seed_query_test
    rng = np.random.default_rng(1)
    covered = []
    for _ in range(300):
        q = rng.normal(50, 20, 200)
        a = q + rng.normal(0, 3, (3, 1)) + rng.normal(0, 5, (3, 200))
        b = q + rng.normal(0, 3, (3, 1)) + rng.normal(0, 5, (3, 200))
        lo, hi = seed_query_test(a, b).ci95
        covered.append(lo <= 0 <= hi)
    assert 0.92 <= np.mean(covered) <= 0.99


def test_one_seed_counts_no_seed_noise():
    from scipy import stats

    from gdr.eval.compare import seed_query_test
    a, b = _schemes(2.0, 5.0, n_seeds=1)
    t = seed_query_test(a, b)
    assert (t.var_seed_a, t.var_seed_b, t.sd_a) == (0.0, 0.0, None)
    ci = stats.ttest_rel(a[0], b[0]).confidence_interval(0.95)
    assert t.ci95 == pytest.approx([ci.low, ci.high], abs=1e-3)  # the paired t interval over the queries alone
    assert t.df == a.shape[1] - 1


def test_the_shared_resamples_agree_with_scipys_tests():
    """Beyond a few queries paired_test draws its sign flips and bootstrap counts once per number of queries
    (shared by every comparison): its p-value and interval agree with scipy's permutation_test and bootstrap within
    the Monte Carlo error of 9,999 resamples."""
    from scipy import stats

    rng = np.random.default_rng(3)
    a = (rng.random(300) < 0.55).astype(float)
    b = (rng.random(300) < 0.48).astype(float)
    diff, lo, hi, p = paired_test(a, b)

    def mean_diff(x, y, axis=-1):
        return np.mean(x - y, axis=axis)

    ref_p = stats.permutation_test((a, b), mean_diff, permutation_type="samples", vectorized=True,
                                   rng=np.random.default_rng(0)).pvalue
    ref = stats.bootstrap((a, b), mean_diff, paired=True, vectorized=True, method="percentile",
                          rng=np.random.default_rng(0)).confidence_interval
    assert diff == pytest.approx(np.mean(a - b))
    assert p == pytest.approx(ref_p, abs=0.02) and 0 < p < 1
    assert lo == pytest.approx(ref.low, abs=0.01) and hi == pytest.approx(ref.high, abs=0.01)
    assert paired_test(a, b) == (diff, lo, hi, p)  # drawn again or kept: the same figures
