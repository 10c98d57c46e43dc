"""Generative clustering (gdr.cluster): every equation on hand-computed toys, the loop's
invariants, numerics at extreme log-probabilities, and the errors at the edge."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from gdr.cluster import (
    GenerativeClustering,
    NotFittedError,
    _kmeanspp_probs,
    centroid_update,
    clip_bounds,
    clip_logp,
    describe_clusters,
    distortion_matrix,
    fit_generative,
    init_centroids,
    log_proposal,
    log_weights,
)
from gdr.eval.clustering import ari
from gdr.indexing.options import GCOptions

F64 = torch.float64


def planted(n=120, j=24, k=3, sep=4.0, noise=1.0, seed=0, doc_offset=0.0):
    """Documents of a cluster share a profile over queries; optional per-document offsets."""
    rng = np.random.default_rng(seed)
    y = np.arange(n) % k
    profile = -40.0 + rng.normal(0.0, sep, (k, j))
    lp = profile[y] + rng.normal(0.0, noise, (n, j)) + rng.uniform(-doc_offset, 0.0, (n, 1))
    return lp, y


def pipeline(lp, alpha=0.25, n_sigma=5.0, method="power"):
    c = clip_logp(lp, n_sigma)
    phi = log_proposal(c, alpha, method)
    return c, log_weights(c, phi, alpha)


# ---------------------------------------------------------------- Eq. clip

def test_clip_hand_computed_one_sigma():
    # column 0: [0,0,0,4]: mu=1, sigma=sqrt(3) -> bound 1+sqrt(3); column 1: [1,2,3,4]: mu=2.5, sigma=sqrt(1.25)
    lp = np.array([[0.0, 1.0], [0.0, 2.0], [0.0, 3.0], [4.0, 4.0]])
    out = clip_logp(lp, n_sigma=1.0)
    b0, b1 = 1 + math.sqrt(3), 2.5 + math.sqrt(1.25)
    np.testing.assert_allclose(out, [[0, 1], [0, 2], [0, 3], [b0, b1]])
    np.testing.assert_allclose(clip_bounds(lp, 1.0), [b0, b1])
    assert lp[3, 0] == 4.0  # input untouched


def test_clip_five_sigma_uses_population_std():
    # n values, one outlier M and the rest 0: the outlier's z-score is exactly sqrt(n - 1)
    def column(n):
        return np.r_[np.zeros(n - 1), 10.0][:, None]
    assert clip_logp(column(25))[-1, 0] == 10.0          # z = sqrt(24) < 5: kept
    clipped = clip_logp(column(27))[-1, 0]               # z = sqrt(26) > 5: set to mu + 5 sigma
    mu, sigma = 10 / 27, 10 * math.sqrt(26) / 27
    assert clipped == pytest.approx(mu + 5 * sigma)
    assert clip_logp(np.float32(column(27))).dtype == np.float32


# ---------------------------------------------------------------- Eq. vmp, weights

def test_proposal_hand_computed():
    # P column [0.04, 0.16]: power (alpha=1/4): ((0.2 + 0.4) / 2)^2 = 0.09; naive: mean = 0.1
    lp = np.log([[0.04], [0.16]])
    np.testing.assert_allclose(log_proposal(lp, 0.25, "power"), [math.log(0.09)])
    np.testing.assert_allclose(log_proposal(lp, 0.25, "naive"), [math.log(0.1)])
    np.testing.assert_allclose(log_proposal(lp, 0.5, "power"), [math.log(0.1)])   # 2 alpha = 1: mean
    np.testing.assert_allclose(log_proposal(lp, 0.0, "power"), [np.log([0.04, 0.16]).mean()])


def test_proposal_no_underflow_far_in_the_tail():
    lp = np.array([[-300.0], [-302.0]])
    expect = -300 + 2 * math.log((1 + math.exp(-1)) / 2)     # 2 * (logsumexp(-150, -151) - log 2)
    np.testing.assert_allclose(log_proposal(lp, 0.25), [expect])
    np.testing.assert_allclose(log_proposal(lp, 0.25, "naive"), [-300 + math.log((1 + math.exp(-2)) / 2)])


def test_weights_hand_computed():
    lp = np.log([[0.04], [0.16]])
    lw = log_weights(lp, np.array([math.log(0.09)]), 0.25)
    np.testing.assert_allclose(np.exp(lw), [[(0.04 / 0.09) ** 0.25], [(0.16 / 0.09) ** 0.25]])


@pytest.mark.parametrize("alpha", [0.25, 1.0])
def test_phi_and_w_match_direct_formulas(alpha):
    rng = np.random.default_rng(1)
    lp = rng.uniform(-6.0, -1.0, (50, 7))
    p = np.exp(lp)
    phi = np.mean(p ** (2 * alpha), axis=0) ** (1 / (2 * alpha))
    np.testing.assert_allclose(np.exp(log_proposal(lp, alpha)), phi, rtol=1e-12)
    np.testing.assert_allclose(np.exp(log_proposal(lp, alpha, "naive")), p.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(np.exp(log_weights(lp, np.log(phi), alpha)), (p / phi) ** alpha, rtol=1e-12)


# ---------------------------------------------------------------- Eq. ris

def test_distortion_hand_computed():
    # one document, W = [1, 1], P = [0.5, 0.5]; centroids [0.5, 0.5] and [0.9, 0.1]
    lp = np.log([[0.5, 0.5]])
    lw = np.zeros((1, 2))
    log_c = np.log([[0.5, 0.5], [0.9, 0.1]])
    d = distortion_matrix(lp, lw, log_c)
    np.testing.assert_allclose(d, [[0.0, 0.5 * (math.log(0.5 / 0.9) + math.log(0.5 / 0.1))]], atol=1e-15)
    # weights scale each term: W = [2, 0.5]
    d2 = distortion_matrix(lp, np.log([[2.0, 0.5]]), log_c)
    np.testing.assert_allclose(d2[0, 1], 0.5 * (2 * math.log(0.5 / 0.9) + 0.5 * math.log(0.5 / 0.1)))


def test_distortion_matches_direct_sum_and_survives_underflow():
    rng = np.random.default_rng(2)
    lp = rng.uniform(-5, -1, (9, 6))
    lw = rng.normal(0, 1, (9, 6))
    log_c = np.log(rng.dirichlet(np.ones(6), size=4))
    direct = (np.exp(lw)[:, None, :] * (lp[:, None, :] - log_c[None])).mean(axis=2)   # (N, K, J) only here
    np.testing.assert_allclose(distortion_matrix(lp, lw, log_c), direct, rtol=1e-12)
    # W entries that underflow and zero centroid entries give no NaN
    lw[0, 0] = -2000.0
    log_c[1, 0] = -np.inf
    assert np.isfinite(distortion_matrix(lp, lw, log_c)).all()


# ---------------------------------------------------------------- Eq. optim-centroid, Eq. init

def test_centroid_update_hand_computed():
    # cluster 0 = docs 0, 1 with W rows [1, 3] + [2, 2] = [3, 5]; cluster 1 = doc 2 with [4, 0.5]
    lw = np.log([[1.0, 3.0], [2.0, 2.0], [4.0, 0.5]])
    labels = np.array([0, 0, 1])
    np.testing.assert_allclose(np.exp(centroid_update(lw, labels, 2)), [[3 / 8, 5 / 8], [8 / 9, 1 / 9]])
    # a common shift of the whole matrix far below exp's range changes nothing (log domain)
    np.testing.assert_allclose(np.exp(centroid_update(lw - 5000.0, labels, 2)), [[3 / 8, 5 / 8], [8 / 9, 1 / 9]])
    # a document's weight counts with its true scale: doc 1 1000x smaller -> cluster 0 ~ doc 0
    lw2 = lw.copy()
    lw2[1] -= math.log(1000.0)
    np.testing.assert_allclose(np.exp(centroid_update(lw2, labels, 2))[0], [1.002 / 4.004, 3.002 / 4.004])


def test_random_init_is_normalised_distinct_rows():
    lp = np.zeros((4, 2))
    lw = np.log([[1.0, 3.0], [2.0, 2.0], [4.0, 4.0], [9.0, 1.0]])
    log_c, idx = init_centroids(lp, lw, 3, init="random", seed=5)
    assert len(set(idx.tolist())) == 3
    w = np.exp(lw[idx])
    np.testing.assert_allclose(np.exp(log_c), w / w.sum(axis=1, keepdims=True))
    log_c2, idx2 = init_centroids(lp, lw, 3, init="random", seed=5)
    np.testing.assert_array_equal(idx, idx2)


def test_kmeanspp_probabilities_hand_computed():
    # offsets [0, 2, 1, 4] -> squares [0, 4, 1, 16]; doc 3 is already chosen -> [0, 4, 1, 0] / 5
    np.testing.assert_allclose(_kmeanspp_probs(np.array([1.0, 3.0, 2.0, 5.0]), np.array([3])), [0, 0.8, 0.2, 0])
    # all distances equal: uniform over the unchosen documents
    np.testing.assert_allclose(_kmeanspp_probs(np.full(4, 7.0), np.array([0])), [0, 1 / 3, 1 / 3, 1 / 3])


def test_kmeanspp_second_pick_follows_the_appendix():
    # d(x) = min over chosen of d-hat(x, k), offset to min 0, P(pick) ~ d^2 (chosen docs excluded)
    lp = np.log([[0.1, 0.2, 0.7], [0.6, 0.3, 0.1], [0.3, 0.3, 0.4], [0.8, 0.1, 0.1]])
    lw = 0.5 * lp
    counts = np.zeros((4, 4))
    for seed in range(600):
        _, idx = init_centroids(lp, lw, 2, init="k-means++", seed=seed)
        assert idx[0] != idx[1]
        counts[idx[0], idx[1]] += 1
    for first in range(4):
        log_c = centroid_update(lw[[first]], np.array([0]), 1)
        d = distortion_matrix(lp, lw, log_c)[:, 0]
        expect = _kmeanspp_probs(d, np.array([first]))
        np.testing.assert_allclose(counts[first] / counts[first].sum(), expect, atol=0.15)
        assert np.all(counts[first][expect == 0] == 0)


# ---------------------------------------------------------------- the loop

def reference_lloyd(lp, lw, init_idx, max_iter=100, tol=1e-6):
    """Algorithm 1's loop written plainly in float64 numpy (no empty clusters expected)."""
    k = len(init_idx)
    log_c = centroid_update(lw[init_idx], np.arange(k), k)
    prev, hist, labels = np.inf, [], None
    for _ in range(max_iter):
        new = distortion_matrix(lp, lw, log_c).argmin(axis=1)
        unchanged = labels is not None and np.array_equal(new, labels)
        labels = new
        log_c = centroid_update(lw, labels, k)
        dist = distortion_matrix(lp, lw, log_c)[np.arange(len(labels)), labels].sum()
        hist.append(dist)
        if unchanged or prev - dist < tol * abs(prev):
            break
        prev = dist
    final = distortion_matrix(lp, lw, log_c).argmin(axis=1)   # labels consistent with the centroids
    return (final if np.bincount(final, minlength=k).min() > 0 else labels), log_c, hist


def test_kernel_matches_plain_numpy_reference():
    lp, _ = planted(n=200, j=20, k=4, sep=1.0, noise=1.0, seed=3)   # overlapping: several iterations
    c, lw = pipeline(lp)
    res = fit_generative(c, lw, 4, init="random", n_init=1, seed=7, dtype=F64)   # Algorithm 1 exactly
    labels, log_c, hist = reference_lloyd(c, lw, res.init_indices)
    assert len(hist) > 2
    np.testing.assert_allclose(res.distortion_history, hist, rtol=1e-10)
    np.testing.assert_array_equal(res.labels, labels)
    np.testing.assert_allclose(res.log_centroids, log_c, rtol=1e-10)
    d = distortion_matrix(c, lw, res.log_centroids)
    assert res.distortion == pytest.approx(d[np.arange(len(labels)), res.labels].sum(), rel=1e-10)


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_distortion_never_increases(dtype):
    rng = np.random.default_rng(4)
    lp = rng.normal(-50, 3, (400, 32))
    c, lw = pipeline(lp)
    for seed in range(4):
        for init in ("random", "k-means++", "greedy-k-means++"):   # the last with split/merge moves
            res = fit_generative(c, lw, 6, init=init, n_init=1, seed=seed, dtype=dtype, tol=0.0)
            h = np.asarray(res.distortion_history)
            slack = 1e-6 * np.abs(h[:-1]) if dtype == torch.float32 else 1e-10 * np.abs(h[:-1])
            assert np.all(np.diff(h) <= slack), h
            assert res.distortion <= h[-1] + slack.max(initial=1e-9)


def test_n_init_selects_lowest_distortion_and_same_seed_same_labels():
    lp, _ = planted(n=150, j=16, k=5, sep=1.5, seed=5)
    a = GenerativeClustering(5, init="random", n_init=4, seed=11).fit(lp)
    b = GenerativeClustering(5, init="random", n_init=4, seed=11).fit(lp)
    np.testing.assert_array_equal(a.labels_, b.labels_)
    assert a.distortion_ == b.distortion_ == min(a.all_distortions_)
    assert len(a.all_distortions_) == 4
    assert a.result_.n_moves == 0 and a.result_.distortion_before_moves is None   # no moves with "random"
    d = GenerativeClustering(5, n_init=4, seed=11).fit(lp)                          # default: moves after selection
    assert d.result_.distortion_before_moves == min(d.all_distortions_)
    assert d.distortion_ <= min(d.all_distortions_)
    g = GenerativeClustering(5, n_init=2, seed=np.random.default_rng(3)).fit(lp)   # a Generator works too
    assert g.labels_.shape == (150,)


def test_empty_clusters_are_reseeded():
    # identical documents: every assignment ties into cluster 0; the empty ones get re-seeded
    lp = np.tile(np.log([[0.2, 0.3, 0.5]]), (5, 1))
    res = fit_generative(lp, np.zeros_like(lp), 3, n_init=1, dtype=F64)
    assert np.bincount(res.labels, minlength=3).min() >= 1
    h = np.asarray(res.distortion_history)
    assert np.all(np.diff(h) <= 1e-12)


def test_estimator_attributes_match_the_equations_and_predict_reproduces_labels():
    lp, y = planted(n=90, j=30, k=3, sep=4.0, seed=6)
    lp[0, 0] += 80.0                                        # an outlier for Eq. clip
    lp -= lp.max() + 1.0                                    # log-probabilities: <= 0 (a shift changes no W)
    gc = GenerativeClustering(3, n_init=3, dtype=F64).fit(lp)
    c, lw = pipeline(lp)
    np.testing.assert_allclose(gc.clip_upper_, clip_bounds(lp))
    np.testing.assert_allclose(gc.log_phi_, log_proposal(c))
    assert ari(y, gc.labels_) == 1.0
    d = distortion_matrix(c, lw, gc.log_centroids_)
    assert gc.distortion_ == pytest.approx(d[np.arange(90), gc.labels_].sum(), rel=1e-10)
    np.testing.assert_allclose(np.exp(gc.log_centroids_).sum(axis=1), 1.0)
    np.testing.assert_array_equal(gc.predict(lp), gc.labels_)
    np.testing.assert_array_equal(gc.predict(lp[:7]), gc.labels_[:7])
    assert gc.transform(lp[:4]).shape == (4, 3)
    assert gc.fit_predict(lp).shape == (90,)
    g2 = GenerativeClustering(3, n_init=2, clip_sigma=None, phi="naive").fit(lp)
    assert g2.clip_upper_ is None and ari(y, g2.labels_) == 1.0


@pytest.mark.parametrize("alpha", [0.25, 1.0])
def test_extreme_log_probs_float32(alpha):
    rng = np.random.default_rng(7)
    lp = rng.uniform(-400.0, -50.0, (200, 40))
    gc = GenerativeClustering(4, alpha=alpha, n_init=2).fit(lp.astype(np.float32))
    assert np.isfinite(gc.distortion_) and not np.isnan(gc.log_centroids_).any()
    assert np.isfinite(gc.distortion_history_).all()
    # planted clusters under per-document offsets of up to 300 nats: W rows differ by exp(alpha*300)
    lp2, y = planted(n=120, j=24, k=3, sep=4.0, doc_offset=300.0, seed=8)
    g32 = GenerativeClustering(3, alpha=alpha, n_init=3, seed=1).fit(lp2.astype(np.float32))
    g64 = GenerativeClustering(3, alpha=alpha, n_init=3, seed=1, dtype=F64).fit(lp2)
    assert ari(y, g32.labels_) == 1.0 and ari(y, g64.labels_) == 1.0
    assert g32.distortion_ == pytest.approx(g64.distortion_, rel=1e-4)


def test_a_small_alpha_in_float32_keeps_the_partition_float64_finds():
    # at alpha 1e-4 every centroid lies within ~1e-4 nats of the others: a float32 product of log c itself (~ -log J)
    # rounds those differences away, the product of their offsets from a common reference keeps them
    lp, y = planted(n=150, j=60, k=5, sep=1.5, seed=11)
    lp -= lp.max() + 1.0
    for alpha in (1e-3, 1e-4):
        g32 = GenerativeClustering(5, alpha=alpha, seed=0).fit(lp.astype(np.float32))
        g64 = GenerativeClustering(5, alpha=alpha, seed=0, dtype=F64).fit(lp)
        assert ari(y, g64.labels_) > 0.9, alpha
        assert ari(g32.labels_, g64.labels_) == 1.0, alpha
        np.testing.assert_array_equal(g32.predict(lp), g32.labels_)
        assert g32.distortion_ == pytest.approx(g64.distortion_, rel=1e-9)


def test_alpha_outside_the_papers_range_and_a_single_query_are_refused_at_the_door():
    lp, _ = planted(n=30, j=8, k=3, seed=2)
    lp -= lp.max() + 1.0
    for alpha in (0.0, 1.5, 300.0):  # 0: every W is 1, any partition as good; > 1 overflows W
        with pytest.raises(ValueError, match=rf"^alpha={alpha}: must be auto or a number in \(0, 1\]"):
            GenerativeClustering(3, alpha=alpha).fit(lp)
    with pytest.raises(ValueError, match="logp has a single column .query.; clustering needs at least 2 queries"):
        GenerativeClustering(3).fit(lp[:, :1])
    with pytest.raises(ValueError, match="gc.alpha must be in the paper's"):
        GCOptions(alpha=2.0).validate()


def test_more_clusters_than_distinct_documents_warns_that_labels_and_predict_may_differ(caplog):
    lp, _ = planted(n=5, j=8, k=1, seed=3)
    lp = np.repeat(lp - lp.max() - 1.0, 2, axis=0)              # 10 documents, 5 distinct
    with caplog.at_level("WARNING", logger="gdr.cluster"):
        gc = GenerativeClustering(10, init="random", seed=0).fit(lp)
    assert "would leave a cluster empty" in caplog.text and "n_clusters=10" in caplog.text
    assert (gc.predict(lp) != gc.labels_).any()                 # what the warning says can happen
    caplog.clear()
    with caplog.at_level("WARNING", logger="gdr.cluster"):
        GenerativeClustering(5, init="random", seed=0).fit(lp)
    assert "would leave a cluster empty" not in caplog.text


# ---------------------------------------------------------------- default fit: greedy k-means++, split/merge

@pytest.fixture
def one_thread():
    """One torch thread (the tests below are small; the CPUs may be shared)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _prepared(lp, alpha=0.25, dtype=F64):
    from gdr.cluster import prepare_fit

    c, lw = pipeline(lp, alpha)
    return c, lw, prepare_fit(c, log_w=lw, dtype=dtype)


def _total(c, lw, labels, k):
    """Reference (numpy, float64) total distortion of ``labels`` with their own centroids."""
    d = distortion_matrix(c, lw, centroid_update(lw, labels, k))
    return d[np.arange(len(labels)), labels].sum()


def test_greedy_probs_hand_computed():
    from gdr.cluster import _greedy_probs

    # excess [0, 2, 1, -0.5 (rounding)] -> squares [0, 4, 1, 0]; doc 0 chosen -> [0, 4, 1, 0] / 5
    np.testing.assert_allclose(_greedy_probs(np.array([0.0, 2.0, 1.0, -0.5]), np.array([0])), [0, 0.8, 0.2, 0])
    np.testing.assert_allclose(_greedy_probs(np.zeros(4), np.array([2])), [1 / 3, 1 / 3, 0, 1 / 3])


def test_greedy_kmeanspp_keeps_the_candidate_that_lowers_the_total_most():
    from gdr.cluster import _init_greedy_kmeanspp

    lp, _ = planted(n=8, j=6, k=3, sep=2.0, seed=2)
    c, lw, p = _prepared(lp)
    d_all = distortion_matrix(c, lw, centroid_update(lw, np.arange(8), 8))      # (8, 8): d(x_i, row k)
    own = np.diag(d_all)
    assert np.allclose(own, d_all.min(axis=1))            # a document's own row is its best centroid
    for seed in range(5):
        # 400 candidates drawn from the 7 unchosen documents: every one with excess > 0 is tried
        idx = _init_greedy_kmeanspp(p, 2, np.random.default_rng(seed), n_local=400)
        first = idx[0]
        pot = np.minimum(d_all[:, [first]], d_all).sum(axis=0)    # total after adding each document
        pot[first] = np.inf
        assert idx[1] == int(np.argmin(pot)), (seed, idx, pot)
    _, idx = init_centroids(lp, lw, 5, init="greedy-k-means++", seed=3)
    assert len(set(idx.tolist())) == 5


def test_merge_costs_and_split_gains_are_exact():
    from gdr.bench.clustering import planted_logp
    from gdr.cluster import _merge_costs, _split_gains, cluster_sums

    lp, y = planted_logp(300, 40, 6, seed=1, dtype=np.float64)
    c, lw, p = _prepared(lp)
    lab = torch.as_tensor(y)
    wk, rk = cluster_sums(p, lab, 6)
    cost = _merge_costs(p, wk.double(), rk).numpy()
    base = _total(c, lw, y, 6)
    for a in range(6):
        assert cost[a, a] == np.inf
        for b in range(a + 1, 6):
            merged = np.where(y == b, a, y)
            merged = np.unique(merged, return_inverse=True)[1]
            assert cost[a, b] == cost[b, a] == pytest.approx(_total(c, lw, merged, 5) - base, rel=1e-9, abs=1e-9)
    gains, half = _split_gains(p, lab, 6, 100, 1e-6, np.random.default_rng(0))
    half = half.numpy()
    for k in range(6):
        split = np.where((y == k) & (half == 1), 6, y)
        assert gains[k] > 0 and gains[k] == pytest.approx(base - _total(c, lw, split, 7), rel=1e-9)


def test_split_merge_escapes_a_local_optimum():
    from gdr.cluster import _lloyd_from, _split_merge, cluster_sums, log_normalise

    lp, y = planted(n=200, j=24, k=4, sep=4.0, noise=1.0, seed=11)
    c, lw, p = _prepared(lp)
    # groups 0 and 1 share a cluster, group 2 is cut in two: a fixed point of the two-step loop
    bad = np.where(y == 1, 0, y)
    g2 = np.flatnonzero(y == 2)
    bad[g2[: len(g2) // 2]] = 1
    wk, _ = cluster_sums(p, torch.as_tensor(bad), 4)
    run = _lloyd_from(p, log_normalise(wk.double()), 100, 1e-9)
    assert ari(y, run.labels.numpy()) < 0.9                    # the loop alone stays there
    out, moves = _split_merge(p, run, 4, 100, 1e-9, np.random.default_rng(0))
    assert moves >= 1 and out.distortion < run.distortion
    assert ari(y, out.labels.numpy()) == 1.0
    assert out.distortion == pytest.approx(_total(c, lw, out.labels.numpy(), 4), rel=1e-9)
    assert np.all(np.diff(out.history) <= 1e-9 * np.abs(np.asarray(out.history[:-1])))


@pytest.mark.parametrize("data_seed", [0, 2])
def test_default_fit_beats_random_init_on_the_planted_benchmark(one_thread, data_seed):
    """The benchmark's generator, small: the default reaches a lower distortion than the paper's
    random init (Algorithm 1, same n_init and seed), below the planted partition's, and a better ARI."""
    from gdr.bench.clustering import planted_distortion, planted_logp

    lp, y = planted_logp(2000, 256, 10, seed=data_seed)
    new = GenerativeClustering(10, seed=0).fit(lp)
    old = GenerativeClustering(10, init="random", seed=0).fit(lp)
    planted_d = planted_distortion(new, lp, y)
    assert new.distortion_ < old.distortion_ - 2.0
    assert new.distortion_ < planted_d
    assert ari(y, new.labels_) >= 0.8 > ari(y, old.labels_)
    # the planted distortion is that of the reference equations (float32 kernel, so a loose rel)
    c = np.minimum(lp.astype(np.float64), new.clip_upper_)
    lw = log_weights(c, new.log_phi_, new.alpha_)
    assert planted_d == pytest.approx(_total(c, lw, y, 10), rel=1e-6)


def test_default_fit_same_seed_same_result(one_thread):
    from gdr.bench.clustering import planted_logp

    lp, _ = planted_logp(600, 64, 8, seed=3)
    runs = [GenerativeClustering(8, seed=5).fit(lp) for _ in range(2)]
    a, b = runs
    np.testing.assert_array_equal(a.labels_, b.labels_)
    np.testing.assert_array_equal(a.log_centroids_, b.log_centroids_)
    assert a.distortion_ == b.distortion_ and a.result_.n_moves == b.result_.n_moves
    assert a.distortion_history_ == b.distortion_history_ and a.all_distortions_ == b.all_distortions_
    np.testing.assert_array_equal(a.result_.init_indices, b.result_.init_indices)
    g1 = GenerativeClustering(8, seed=np.random.default_rng(9)).fit(lp)
    g2 = GenerativeClustering(8, seed=np.random.default_rng(9)).fit(lp)
    np.testing.assert_array_equal(g1.labels_, g2.labels_)
    other = GenerativeClustering(8, seed=6).fit(lp)
    assert not np.array_equal(other.result_.init_indices, a.result_.init_indices)   # the seed matters


def test_describe_clusters():
    log_c = np.log([[0.5, 0.2, 0.3, 0.0 + 1e-9], [0.1, 0.1, 0.1, 0.7 - 1e-9]])
    out = describe_clusters(log_c, ["a", "b", "a", "c"], top=2)
    assert [q for q, _ in out[0]] == ["a", "b"] and out[0][0][1] == pytest.approx(0.8)   # duplicates merged
    assert [q for q, _ in out[1]] == ["c", "a"] and out[1][1][1] == pytest.approx(0.2)
    lift = describe_clusters(log_c, ["a", "b", "a", "c"], top=1, log_reference=np.log([0.3, 0.05, 0.3, 0.35]))
    assert lift[0][0][0] == "b"                                  # 0.2 / 0.05 beats 0.8 / 0.6
    with pytest.raises(ValueError, match="match the queries"):
        describe_clusters(log_c, ["a"], top=1)


# ---------------------------------------------------------------- edge validation

def test_errors_are_clear():
    lp = np.full((3, 4), -10.0)
    with pytest.raises(ValueError, match="larger than the number of documents"):
        GenerativeClustering(4).fit(lp)
    with pytest.raises(ValueError, match="single document"):
        GenerativeClustering(1).fit(lp[:1])
    with pytest.raises(ValueError, match="2-D"):
        GenerativeClustering(2).fit(lp[0])
    with pytest.raises(ValueError, match="2-D"):
        GenerativeClustering(2).fit(lp[None])
    bad = lp.copy()
    bad[1, 2] = np.nan
    with pytest.raises(ValueError, match=r"logp\[1, 2\] = nan \(document row 1, query column 2"):
        GenerativeClustering(2).fit(bad)
    bad[1, 2] = -np.inf
    with pytest.raises(ValueError, match=r"logp\[1, 2\] = -inf"):
        clip_logp(bad)
    with pytest.raises(ValueError, match="phi must be one of"):
        GenerativeClustering(2, phi="mean").fit(lp)
    with pytest.raises(ValueError, match="init must be one of .*greedy-k-means"):
        fit_generative(lp, lp, 2, init="kmeans")
    with pytest.raises(ValueError, match="split_merge must be"):
        GenerativeClustering(2, split_merge="yes").fit(lp)
    with pytest.raises(ValueError, match="log_w has shape"):
        fit_generative(lp, lp[:, :2], 2)
    with pytest.raises(NotFittedError, match="not fitted"):  # scikit-learn's kind: a ValueError, an AttributeError
        GenerativeClustering(2).predict(lp)
    gc = GenerativeClustering(2, n_init=1).fit(np.random.default_rng(0).normal(-10, 1, (6, 4)))
    with pytest.raises(ValueError, match="fitted on 4 queries"):
        gc.predict(lp[:, :3])


def test_what_cannot_be_log_probabilities_is_refused_with_what_to_pass():
    """Probabilities given for their logarithms (all in [0, 1]) clustered 28/1/1 at chance (ARI -0.002) without a
    word; a value above 0, a sparse matrix, a device without CUDA: each one line saying what to pass."""
    import scipy.sparse

    lp, _ = planted(n=30, j=16, k=3, sep=4.0, seed=1)
    lp -= lp.max() + 1.0
    with pytest.raises(ValueError, match=r"logp has no value below 0 .*looks like probabilities.*np.log\(logp\)"):
        GenerativeClustering(3).fit(np.exp(lp))
    up = lp.copy()
    up[4, 7] = 0.5
    with pytest.raises(ValueError, match=r"logp\[4, 7\] = 0.5 > 0: logp holds log-probabilities"):
        GenerativeClustering(3).fit(up)
    gc = GenerativeClustering(3, n_init=1).fit(lp)
    with pytest.raises(ValueError, match="logp_rows has no value below 0"):
        gc.predict(np.exp(lp[:3]))
    with pytest.raises(ValueError, match=r"logp is a sparse matrix; .*logp.toarray\(\)"):
        GenerativeClustering(3).fit(scipy.sparse.csr_matrix(lp))
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="device=cuda: CUDA is not available on this machine; use cpu"):
            GenerativeClustering(3, device="cuda").fit(lp)
    import pandas as pd  # the test extra has it (PyTerrier's, datasets')

    frame = pd.DataFrame(lp).astype("Float64")  # nullable floats: an object array to numpy
    np.testing.assert_array_equal(GenerativeClustering(3, n_init=1).fit(frame).labels_, gc.labels_)


def test_inputs_a_user_hands_in_are_taken_or_refused_by_what_they_are():
    """-inf replaced by np.nan_to_num (-1.8e308) overflowed the clip bounds to NaN and gave near-random labels with a
    NaN distortion: refused naming the entry. A bfloat16 tensor (a GPU scorer's) is taken; ragged rows, a missing
    pandas value, a parameter given as a string or a bool: each one line saying what is wrong."""
    import pandas as pd  # the test extra has it (PyTerrier's, datasets')

    lp, _ = planted(n=30, j=16, k=3, sep=4.0, seed=1)
    lp -= lp.max() + 1.0
    x = lp.copy()
    x[0, 0] = x[5, 0] = -np.inf
    with pytest.raises(ValueError, match=r"logp\[0, 0\] = -1.79769e\+308: no model scores .*np.maximum\(logp, -1e4\)"):
        GenerativeClustering(3).fit(np.nan_to_num(x))
    gc = GenerativeClustering(3, n_init=1).fit(lp)
    bf = torch.tensor(lp).bfloat16()
    np.testing.assert_array_equal(GenerativeClustering(3, n_init=1).fit(bf).labels_,
                                  GenerativeClustering(3, n_init=1).fit(bf.float().numpy()).labels_)
    with pytest.raises(ValueError, match="every row as long"):
        GenerativeClustering(2).fit([[-1.0, -2.0], [-1.0]])
    frame = pd.DataFrame(lp).astype("Float64")
    frame.iloc[2, 3] = pd.NA
    with pytest.raises(ValueError, match="not numbers \\(a missing value such as pd.NA"):
        GenerativeClustering(3).fit(frame.astype(object))
    for bad in ({"clip_sigma": "5"}, {"tol": "1e-4"}, {"alpha": True}, {"ess_target": "0.5"}):
        with pytest.raises(ValueError, match=f"{next(iter(bad))}(=true:)? must be"):
            GenerativeClustering(3, **bad).fit(lp)
    with pytest.raises(ValueError, match="n_clusters must be a positive integer; got True"):
        GenerativeClustering(True).fit(lp)
    assert gc.predict(lp[:0]).shape == (0,) and gc.transform(lp[:0]).shape == (0, 3)  # an empty batch
    np.testing.assert_array_equal(GenerativeClustering(3, n_init=1).fit_transform(lp), gc.transform(lp))


def test_the_estimator_speaks_scikit_learns_protocol():
    """get_params / set_params, so clone and a Pipeline take it; fit(X, y=None); NotFittedError before fit."""
    from sklearn.base import clone
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import FunctionTransformer

    lp, y = planted(n=60, j=20, k=3, sep=4.0, seed=2)
    lp -= lp.max() + 1.0
    gc = GenerativeClustering(3, n_init=2, seed=5)
    params = gc.get_params()
    assert params["n_clusters"] == 3 and params["seed"] == 5 and params["n_init"] == 2
    twin = clone(gc).set_params(n_clusters=3)
    assert twin is not gc and twin.get_params() == params
    np.testing.assert_array_equal(twin.fit_predict(lp, y), gc.fit(lp, y).labels_)
    pipe = make_pipeline(FunctionTransformer(), GenerativeClustering(3, n_init=2, seed=5))
    np.testing.assert_array_equal(pipe.fit(lp).predict(lp), gc.labels_)
    with pytest.raises(ValueError, match="has no parameter 'random_state'; its parameters: n_clusters, alpha"):
        gc.set_params(random_state=0)
    assert issubclass(NotFittedError, ValueError) and issubclass(NotFittedError, AttributeError)
    assert gc.__sklearn_tags__().transformer_tags is not None  # its checks take a clusterer with transform


# ---------------------------------------------------------------- CUDA

@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu():
    lp, y = planted(n=300, j=32, k=4, sep=3.0, seed=9)
    cpu = GenerativeClustering(4, n_init=3, seed=2, dtype=F64).fit(lp)
    gpu = GenerativeClustering(4, n_init=3, seed=2, dtype=F64, device="cuda").fit(lp)
    np.testing.assert_array_equal(cpu.labels_, gpu.labels_)
    assert gpu.distortion_ == pytest.approx(cpu.distortion_, rel=1e-9)
    g32 = GenerativeClustering(4, n_init=3, seed=2, device="cuda", init="k-means++").fit(lp)
    assert ari(y, g32.labels_) == 1.0


def test_effective_sample_size_bounds_and_auto_alpha_hits_its_target():
    from gdr.cluster import GenerativeClustering, auto_alpha, effective_sample_size

    rng = np.random.default_rng(0)
    J = 64
    flat = np.full((3, J), -20.0)
    assert np.allclose(effective_sample_size(flat, 0.25, phi="naive"), J)        # uniform weights: ESS = J
    logp = rng.normal(-60.0, 15.0, size=(200, J))                                 # right-skewed P, like an LM's
    ess = [effective_sample_size(logp, a).mean() for a in (0.05, 0.25, 1.0)]
    assert ess[0] > ess[1] > ess[2] >= 1.0                                        # lower alpha, more ESS
    for target in (0.3, 0.5, 0.8):
        a = auto_alpha(logp, target=target)
        assert 1e-3 < a < 1.0
        assert abs(effective_sample_size(logp, a).mean() / J - target) < 0.01
    gc = GenerativeClustering(3, alpha="auto", n_init=2, seed=0).fit(logp)
    again = GenerativeClustering(3, alpha="auto", n_init=2, seed=0).fit(logp)
    assert gc.alpha_ == again.alpha_ == auto_alpha(logp, 0.5, upper=gc.clip_upper_)
    assert np.array_equal(gc.labels_, again.labels_) and gc.predict(logp[:5]).shape == (5,)
    with pytest.raises(ValueError, match="ESS target"):
        auto_alpha(logp, target=1.5)


def test_hierarchical_gc_with_auto_alpha_resolves_it_once(tmp_path):
    from gdr.indexing.gc import GCOptions, build_gc_index
    from gdr.store.rows import PMatrix

    logp = np.random.default_rng(1).normal(-50.0, 10.0, size=(120, 48)).astype(np.float32)
    tree = build_gc_index(PMatrix(logp), n_clusters=4, leaf_size=4,
                          options=GCOptions(alpha="auto", n_init=2, n_init_inner=1), seed=0, progress=False)
    alpha = tree.meta["options"]["alpha"]
    assert isinstance(alpha, float) and 0 < alpha < 1
    with pytest.raises(ValueError, match="auto"):
        GCOptions(alpha="sometimes").validate()
