"""k-means baselines of the paper's Table 2 (faiss k-means, best of ``n_init`` seeds by objective).

Representations:

* ``tfidf``: scikit-learn ``TfidfVectorizer`` (``max_features=20000``, sublinear tf, l2 norm,
  English stop words) made dense float32, because faiss needs dense vectors. That costs
  ``n_docs * n_features * 4`` bytes (R5: 6,807 x 20,000 -> 545 MB); lower ``max_features`` for
  larger corpora (a warning is logged above 2 GB).
* ``embedding``: sentence embeddings from ``gdr.embed.embed_texts`` (bundled ``minilm-l6`` by
  default, or any sentence-transformers name/path), L2-normalised.
* ``logp``: the rows of log P ("Doc2Query log-prob. P" in Table 2), float32, unclipped.

k-means: ``faiss.Kmeans`` on all points (no subsampling: ``max_points_per_centroid`` is raised to
N), k-means++ initialisation by default, ``max_iter`` Lloyd iterations; ``n_init`` runs with
distinct seeds and the one with the lowest sum of squared distances to its centroid is kept.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Sequence

import faiss
import numpy as np

from gdr.embed import embed_texts
from gdr.eval.clustering import repeated_best_of
from gdr.models import EMBED_MODEL
from gdr.options import GCFitOptions

log = logging.getLogger(__name__)

__all__ = ["BaselineResult", "KMeansResult", "kmeans_fit", "run_baselines", "tfidf_matrix"]


@dataclass
class KMeansResult:
    """labels (N,) int64; objective = sum of squared distances to the assigned centroid (float64);
    centroids (k, d) float32; all_objectives: every run's objective; best_run: its index."""

    labels: np.ndarray
    objective: float
    centroids: np.ndarray
    all_objectives: list[float] = field(default_factory=list)
    best_run: int = 0


def _check_x(x, name: str = "X") -> np.ndarray:
    x = np.asarray(x)
    if x.ndim != 2:
        raise ValueError(f"{name} must be 2-D of shape (n_docs, dim); got shape {x.shape}")
    x = np.ascontiguousarray(x, dtype=np.float32)
    bad = np.flatnonzero(~np.isfinite(x.sum(axis=1, dtype=np.float64)))
    for i in bad:
        cols = np.flatnonzero(~np.isfinite(x[i]))
        if cols.size:
            raise ValueError(f"{name}[{i}, {cols[0]}] = {x[i, cols[0]]} (row {i}); k-means needs finite vectors")
    return x


_SMALL = 1 << 20  # below this many vector entries faiss runs single-threaded


def _kmeans_once(x: np.ndarray, k: int, seed: int, max_iter: int, init: str):
    """One faiss k-means run: (labels (N,), objective, centroids (k, d))."""
    if x.size < _SMALL:  # OpenMP barriers cost more than the work (0.2 s vs 0.3 ms on tiny inputs)
        n_threads = faiss.omp_get_max_threads()
        faiss.omp_set_num_threads(1)
        try:
            return _kmeans_faiss(faiss, x, k, seed, max_iter, init)
        finally:
            faiss.omp_set_num_threads(n_threads)
    return _kmeans_faiss(faiss, x, k, seed, max_iter, init)


def _kmeans_faiss(faiss, x: np.ndarray, k: int, seed: int, max_iter: int, init: str):
    kw = dict(niter=max_iter, seed=int(seed) % (2**31), verbose=False, min_points_per_centroid=1,
              max_points_per_centroid=max(x.shape[0], 256))
    if init == "k-means++":
        kw["init_method"] = faiss.ClusteringInitMethod_KMEANS_PLUS_PLUS
    km = faiss.Kmeans(x.shape[1], k, **kw)
    km.train(x)
    dist, idx = km.index.search(x, 1)
    return idx[:, 0].astype(np.int64), float(dist[:, 0].astype(np.float64).sum()), km.centroids


def kmeans_fit(x: np.ndarray, k: int, n_init: int = GCFitOptions.n_init, seed: int = 0,
               max_iter: int = GCFitOptions.max_iter, init: str = "k-means++") -> KMeansResult:
    """k-means with faiss: ``n_init`` runs (seeds from ``SeedSequence(seed)``), lowest objective kept.

    Parameters
    ----------
    x : (n_docs, dim) vectors (cast to float32).
    init : ``"k-means++"`` or ``"random"`` (k distinct random points).
    """
    x = _check_x(x)
    if not (1 <= k <= x.shape[0]):
        raise ValueError(f"k={k} must be between 1 and the number of rows ({x.shape[0]})")
    if init not in ("k-means++", "random"):
        raise ValueError(f"init must be 'k-means++' or 'random'; got {init!r}")
    if n_init < 1:
        raise ValueError(f"n_init must be >= 1; got {n_init}")
    seeds = np.random.SeedSequence(seed).generate_state(n_init, dtype=np.uint32)
    best, objs = None, []
    for r, s in enumerate(seeds):
        labels, obj, cent = _kmeans_once(x, k, int(s), max_iter, init)
        objs.append(obj)
        if best is None or obj < best.objective:
            best = KMeansResult(labels=labels, objective=obj, centroids=cent, best_run=r)
    best.all_objectives = objs
    return best


def tfidf_matrix(texts: Sequence[str], max_features: int = 20000, sublinear_tf: bool = True,
                 stop_words: str | None = "english", min_df: int = 1) -> np.ndarray:
    """Dense float32 tf-idf of shape (n_docs, n_features <= max_features), rows L2-normalised."""
    from sklearn.feature_extraction.text import TfidfVectorizer  # optional: gdr[eval]

    texts = list(texts)
    if not texts:
        raise ValueError("texts is empty")
    vec = TfidfVectorizer(max_features=max_features, sublinear_tf=sublinear_tf, stop_words=stop_words,
                          min_df=min_df, norm="l2", dtype=np.float32)
    sparse = vec.fit_transform(texts)
    gb = sparse.shape[0] * sparse.shape[1] * 4 / 2**30
    if gb > 2:
        log.warning("dense tf-idf is %.1f GB (%d x %d); lower max_features", gb, *sparse.shape)
    return sparse.toarray()


@dataclass
class BaselineResult:
    """One representation's k-means result.

    labels / objective : the selected run (of the first repeat). dim : vector size.
    mean, std : metrics in percent over repeats (only with ``y_true``); seconds : wall time.
    """

    name: str
    labels: np.ndarray
    objective: float
    dim: int
    seconds: float
    mean: dict[str, float] | None = None
    std: dict[str, float] | None = None


def run_baselines(texts: Sequence[str] | None, logp: np.ndarray | None, k: int, n_init: int = GCFitOptions.n_init,
                  repeats: int = 1, seed: int = 0, embed_model: str | None = EMBED_MODEL,
                  y_true: Sequence | None = None, max_iter: int = GCFitOptions.max_iter, init: str = "k-means++",
                  tfidf_max_features: int = 20000, progress: bool = False) -> dict[str, BaselineResult]:
    """k-means on tf-idf, sentence embeddings and log P rows, with the paper's protocol.

    Representations whose input is None are skipped (``texts`` for tf-idf and embeddings,
    ``embed_model`` for embeddings, ``logp`` for the log-prob rows). With ``y_true`` each one is
    scored by ``repeated_best_of`` (``repeats`` x best-of-``n_init``); otherwise one best-of-
    ``n_init`` fit is made. Returns ``{"tfidf" | "embedding:<model>" | "logp": BaselineResult}``.
    """
    reps: dict[str, np.ndarray] = {}
    if texts is not None:
        reps["tfidf"] = tfidf_matrix(texts, max_features=tfidf_max_features)
        if embed_model:
            reps[f"embedding:{embed_model}"] = embed_texts(list(texts), model=embed_model, progress=progress)
    if logp is not None:
        reps["logp"] = _check_x(logp, "logp")
    n = {name: x.shape[0] for name, x in reps.items()}
    if len(set(n.values())) > 1:
        raise ValueError(f"texts and logp disagree on the number of documents: {n}")
    out: dict[str, BaselineResult] = {}
    for name, x in reps.items():
        x = _check_x(x, name)
        t0 = time.perf_counter()
        if y_true is not None:
            rep = repeated_best_of(lambda s, x=x: _kmeans_once(x, k, s, max_iter, init)[:2], y_true,
                                   n_repeats=repeats, n_init=n_init, seed=seed, progress=progress)
            res = BaselineResult(name=name, labels=rep.labels, objective=float(rep.distortions[0, rep.selected[0]]),
                                 dim=x.shape[1], seconds=0.0, mean=rep.mean, std=rep.std)
        else:
            km = kmeans_fit(x, k, n_init=n_init, seed=seed, max_iter=max_iter, init=init)
            res = BaselineResult(name=name, labels=km.labels, objective=km.objective, dim=x.shape[1], seconds=0.0)
        res.seconds = time.perf_counter() - t0
        log.info("k-means on %s (dim %d): objective %.6g%s (%.1f s)", name, x.shape[1], res.objective,
                 "" if res.mean is None else "; " + ", ".join(f"{m} {v:.1f}" for m, v in res.mean.items()),
                 res.seconds)
        out[name] = res
    return out
