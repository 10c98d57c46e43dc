"""Clustering metrics against hand values, brute force and scikit-learn; the best-of protocol;
the k-means baselines on tiny cases."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

from gdr.eval.baselines import kmeans_fit, run_baselines, tfidf_matrix
from gdr.eval.clustering import (
    ari,
    clustering_accuracy,
    clustering_scores,
    contingency_matrix,
    make_gc_fit_fn,
    nmi,
    repeated_best_of,
)


def brute_force_accuracy(y_true, y_pred):
    """Max over all one-to-one maps between classes and clusters (small cases only)."""
    t = np.unique(y_true, return_inverse=True)[1]
    p = np.unique(y_pred, return_inverse=True)[1]
    a, b = int(t.max()) + 1, int(p.max()) + 1
    best = 0
    if a <= b:
        for perm in itertools.permutations(range(b), a):   # class i <-> cluster perm[i]
            best = max(best, sum(int(np.sum((t == i) & (p == perm[i]))) for i in range(a)))
    else:
        for perm in itertools.permutations(range(a), b):
            best = max(best, sum(int(np.sum((p == i) & (t == perm[i]))) for i in range(b)))
    return best / len(t)


def test_hand_computed_cases():
    assert contingency_matrix([0, 0, 1, 1], ["b", "a", "a", "a"]).tolist() == [[1, 1], [2, 0]]
    # a relabelled perfect clustering
    assert clustering_scores([0, 0, 1, 1], [1, 1, 0, 0]) == pytest.approx({"acc": 100.0, "nmi": 100.0, "ari": 100.0})
    # independent halves: acc 1/2, nmi 0, ari = (0 - 2/3) / (2 - 2/3) = -1/2
    y, p = [0, 0, 1, 1], ["a", "b", "a", "b"]
    assert clustering_accuracy(y, p) == 0.5 and nmi(y, p) == 0.0 and ari(y, p) == pytest.approx(-0.5)
    assert clustering_scores(y, p, percent=False)["ari"] == pytest.approx(-0.5)
    # more clusters than classes: unmatched cluster counts as error
    assert clustering_accuracy([0, 0, 0, 1], [0, 0, 2, 1]) == 0.75


def test_metrics_equal_sklearn_and_brute_force():
    rng = np.random.default_rng(0)
    for trial in range(30):
        n = int(rng.integers(2, 40))
        y = rng.integers(0, int(rng.integers(1, 5)), n)
        p = rng.integers(0, int(rng.integers(1, 6)), n)
        if trial % 3 == 0:
            p = np.where(rng.random(n) < 0.7, y, p)            # correlated cases too
        assert clustering_accuracy(y, p) == pytest.approx(brute_force_accuracy(y, p))
        assert nmi(y, p) == pytest.approx(normalized_mutual_info_score(y, p, average_method="geometric"), abs=1e-12)
        assert ari(y, p) == pytest.approx(adjusted_rand_score(y, p), abs=1e-12)


def test_string_labels_and_degenerate_cases():
    y = np.array(["earn", "acq", "earn", "crude", "acq", "earn"])
    p = np.array([2, 0, 2, 1, 0, 1])
    assert nmi(y, p) == pytest.approx(normalized_mutual_info_score(y, p, average_method="geometric"))
    assert ari(y, p) == pytest.approx(adjusted_rand_score(y, p))
    one = np.zeros(5, dtype=int)
    assert nmi(one, one) == 1.0 and ari(one, one) == 1.0
    assert nmi(one, np.arange(5)) == normalized_mutual_info_score(one, np.arange(5), average_method="geometric")
    assert ari(np.arange(5), np.arange(5)) == 1.0
    with pytest.raises(ValueError, match="differ in length"):
        nmi([0, 1], [0, 1, 1])


def test_ari_large_counts_no_overflow():
    n = 1_000_000  # pair-count products ~1e22: would overflow int64
    y = np.arange(n) % 3
    p = (np.arange(n) // 7) % 3
    assert ari(y, p) == pytest.approx(adjusted_rand_score(y, p), abs=1e-9)


def test_repeated_best_of_selects_by_distortion():
    y = np.array([0, 0, 1, 1])
    good, bad = np.array([1, 1, 0, 0]), np.array([0, 1, 0, 1])

    def fit_fn(seed):          # low distortion <-> the good partition, for odd seeds only
        return (good, -1.0) if seed % 2 else (bad, 5.0 + seed % 7)

    res = repeated_best_of(fit_fn, y, n_repeats=6, n_init=4, seed=3, progress=False)
    assert res.distortions.shape == (6, 4) and len(set(res.seeds.ravel().tolist())) == 24
    for r in range(6):
        assert res.selected[r] == int(np.argmin(res.distortions[r]))
        want = 100.0 if (res.seeds[r] % 2).any() else 50.0
        assert res.scores[r]["acc"] == want
    accs = [s["acc"] for s in res.scores]
    assert res.mean["acc"] == pytest.approx(np.mean(accs)) and res.std["acc"] == pytest.approx(np.std(accs))
    again = repeated_best_of(fit_fn, y, n_repeats=6, n_init=4, seed=3, progress=False)
    np.testing.assert_array_equal(again.seeds, res.seeds)


def test_repeated_best_of_never_selects_a_failed_run_of_nan_distortion():
    y = np.array([0, 0, 1, 1])
    runs = iter([(np.array([0, 1, 0, 1]), float("nan")), (np.array([1, 1, 0, 0]), 1.0), (np.array([0, 1, 1, 0]), 2.0)])
    res = repeated_best_of(lambda seed: next(runs), y, n_repeats=1, n_init=3, seed=0, progress=False)
    assert res.selected.tolist() == [1] and res.scores[0]["acc"] == 100.0


def test_gc_under_the_protocol():
    rng = np.random.default_rng(1)
    y = np.arange(60) % 3
    lp = -40.0 + rng.normal(0, 4, (3, 20))[y] + rng.normal(0, 1, (60, 20))
    res = repeated_best_of(make_gc_fit_fn(lp, 3), y, n_repeats=2, n_init=3, progress=False)
    assert res.mean == pytest.approx({"acc": 100.0, "nmi": 100.0, "ari": 100.0})


def test_kmeans_baselines_on_a_tiny_case():
    rng = np.random.default_rng(2)
    y = np.arange(40) % 2
    x = rng.normal(0, 0.1, (40, 5)) + 3.0 * y[:, None]
    km = kmeans_fit(x, 2, n_init=3, seed=0)
    assert ari(y, km.labels) == 1.0 and km.objective == min(km.all_objectives)
    assert km.objective == pytest.approx(((x - km.centroids[km.labels]) ** 2).sum(), rel=1e-4)
    texts = ["the cat sat on the mat", "a cat chased the kitten", "cats and kittens purr",
             "shares fell on the stock market", "the bank raised interest rates", "stock prices and rates"]
    tf = tfidf_matrix(texts)
    assert tf.dtype == np.float32 and np.allclose(np.linalg.norm(tf, axis=1), 1.0)
    ty = np.array([0, 0, 0, 1, 1, 1])
    logp = -30.0 + 5.0 * np.c_[ty, 1 - ty] + rng.normal(0, 0.1, (6, 2))
    out = run_baselines(texts, logp, 2, n_init=2, repeats=2, y_true=ty, embed_model=None)
    assert set(out) == {"tfidf", "logp"}
    assert out["logp"].mean["ari"] == 100.0 and out["tfidf"].dim == tf.shape[1]
    plain = run_baselines(None, logp, 2, n_init=2)
    assert ari(ty, plain["logp"].labels) == 1.0 and plain["logp"].mean is None
    with pytest.raises(ValueError, match="k=7"):
        kmeans_fit(x[:5], 7)
    with pytest.raises(ValueError, match="disagree on the number of documents"):
        run_baselines(texts, logp[:4], 2, embed_model=None)


@pytest.mark.slow
def test_embedding_baseline_with_the_bundled_model():
    texts = ["the cat sat on the mat", "a cat chased the kitten", "cats and kittens purr",
             "shares fell on the stock market", "the bank raised interest rates", "stock prices and rates"]
    out = run_baselines(texts, None, 2, n_init=2, y_true=[0, 0, 0, 1, 1, 1])
    emb = out["embedding:minilm-l6"]
    assert emb.dim == 384 and emb.labels.shape == (6,) and emb.mean["acc"] >= 50.0
