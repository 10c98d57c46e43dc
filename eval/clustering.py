"""Clustering metrics (ACC, NMI, ARI) and the paper's best-of-n_init protocol.

``clustering_accuracy``, ``nmi`` and ``ari`` return fractions in [0, 1] (ARI can be negative), like
scikit-learn; ``clustering_scores`` returns the three in percent by default, as the paper's tables do.
Labels may be any hashable values numpy can sort (ints, strings); the numbers of true classes and
predicted clusters may differ. All metrics come from one contingency table built with ``np.bincount``.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment
from tqdm.auto import tqdm

from gdr import cluster as gcmod
from gdr.options import GCFitOptions

log = logging.getLogger(__name__)

__all__ = [
    "RepeatedResult",
    "ari",
    "clustering_accuracy",
    "clustering_scores",
    "contingency_matrix",
    "nmi",
    "repeated_best_of",
]


def _encode(y, name: str) -> tuple[np.ndarray, int]:
    y = np.asarray(y)
    if y.ndim != 1:
        raise ValueError(f"{name} must be 1-D (one label per document); got shape {y.shape}")
    _, codes = np.unique(y, return_inverse=True)
    return codes.reshape(-1), int(codes.max()) + 1 if codes.size else 0


def contingency_matrix(y_true: Sequence, y_pred: Sequence) -> np.ndarray:
    """Counts n_ab of documents with true class a and predicted cluster b, int64 of shape (A, B)."""
    t, n_t = _encode(y_true, "y_true")
    p, n_p = _encode(y_pred, "y_pred")
    if t.shape != p.shape:
        raise ValueError(f"y_true and y_pred differ in length: {t.shape[0]} vs {p.shape[0]}")
    if t.size == 0:
        raise ValueError("y_true and y_pred are empty")
    return np.bincount(t * n_p + p, minlength=n_t * n_p).reshape(n_t, n_p)


def clustering_accuracy(y_true: Sequence, y_pred: Sequence) -> float:
    """ACC: the best one-to-one matching of clusters to classes (Hungarian / Jonker-Volgenant).

    With more clusters than classes, the unmatched clusters count as errors (and vice versa).
    """
    c = contingency_matrix(y_true, y_pred)
    rows, cols = linear_sum_assignment(c, maximize=True)
    return float(c[rows, cols].sum() / c.sum())


def _entropy(counts: np.ndarray) -> float:
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


def _mutual_info(c: np.ndarray) -> float:
    n = c.sum()
    a = c.sum(axis=1, keepdims=True)
    b = c.sum(axis=0, keepdims=True)
    nz = c > 0
    pij = c[nz] / n
    return float(max((pij * (np.log(c[nz] * float(n)) - np.log((a @ b)[nz].astype(np.float64)))).sum(), 0.0))


def nmi(y_true: Sequence, y_pred: Sequence) -> float:
    """NMI = MI / sqrt(H(true) H(pred)) (geometric mean, as in the paper).

    Same conventions as scikit-learn's ``normalized_mutual_info_score(average_method="geometric")``:
    1.0 when both labelings have a single class, 0.0 when the mutual information is 0.
    """
    c = contingency_matrix(y_true, y_pred)
    if c.shape[0] == c.shape[1] == 1:
        return 1.0
    mi = _mutual_info(c)
    if mi == 0.0:
        return 0.0
    h = np.sqrt(_entropy(c.sum(axis=1)) * _entropy(c.sum(axis=0)))
    return float(mi / max(h, np.finfo(np.float64).eps))


def ari(y_true: Sequence, y_pred: Sequence) -> float:
    """Adjusted Rand index (Hubert & Arabie 1985); 1.0 for identical partitions, ~0 for random ones.

    Pair counts are summed in float64 (no int64 overflow for millions of documents). Like
    scikit-learn, the degenerate cases where both labelings are a single cluster or all singletons
    count as perfect agreement (1.0).
    """
    c = contingency_matrix(y_true, y_pred).astype(np.float64)
    n = c.sum()
    if (c.shape[0] == c.shape[1] == 1) or (c.shape[0] == c.shape[1] == n):
        return 1.0

    def pairs(x):
        return float((x * (x - 1.0)).sum() / 2.0)

    index = pairs(c)
    sum_a, sum_b = pairs(c.sum(axis=1)), pairs(c.sum(axis=0))
    expected = sum_a * sum_b / (n * (n - 1.0) / 2.0)
    max_index = (sum_a + sum_b) / 2.0
    if max_index == expected:
        return 1.0
    return float((index - expected) / (max_index - expected))


def clustering_scores(y_true: Sequence, y_pred: Sequence, percent: bool = True) -> dict[str, float]:
    """``{"acc", "nmi", "ari"}``; in percent by default (as the paper reports), else fractions."""
    f = 100.0 if percent else 1.0
    return {"acc": f * clustering_accuracy(y_true, y_pred), "nmi": f * nmi(y_true, y_pred),
            "ari": f * ari(y_true, y_pred)}


@dataclass
class RepeatedResult:
    """Outcome of ``repeated_best_of``.

    mean, std : metric -> mean / population std (ddof=0) over repeats of the selected runs.
    scores : per repeat, the selected run's metrics.
    distortions : (n_repeats, n_init) objective of every run; selected : (n_repeats,) chosen run.
    labels : labels of the selected run of the first repeat (N,).
    """

    mean: dict[str, float]
    std: dict[str, float]
    scores: list[dict[str, float]]
    distortions: np.ndarray
    selected: np.ndarray
    labels: np.ndarray
    seeds: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))


def _unpack(out: Any) -> tuple[np.ndarray, float]:
    if isinstance(out, tuple) and len(out) == 2:
        labels, dist = out
    elif hasattr(out, "labels") and hasattr(out, "distortion"):
        labels, dist = out.labels, out.distortion
    elif hasattr(out, "labels") and hasattr(out, "objective"):
        labels, dist = out.labels, out.objective
    else:
        raise TypeError("fit_fn(seed) must return (labels, distortion) or an object with "
                        f".labels and .distortion (or .objective); got {type(out).__name__}")
    return np.asarray(labels), float(dist)


def repeated_best_of(fit_fn: Callable[[int], Any], y_true: Sequence, n_repeats: int = 100,
                     n_init: int = GCFitOptions.n_init, seed: int = 0, percent: bool = True,
                     progress: bool = True) -> RepeatedResult:
    """The paper's protocol: per repeat, ``n_init`` runs with different seeds; the run with the
    lowest distortion (no labels used) is scored; report mean and std over ``n_repeats``.

    Parameters
    ----------
    fit_fn : ``fit_fn(seed) -> (labels (N,), distortion)`` for ONE run (or an object with
        ``.labels`` and ``.distortion`` / ``.objective``). Precompute anything shared (e.g. W) outside.
    y_true : (N,) true labels.
    seed : the ``n_repeats * n_init`` run seeds are drawn from ``SeedSequence(seed)``, all distinct.
    """
    if n_repeats < 1 or n_init < 1:
        raise ValueError(f"n_repeats and n_init must be >= 1; got {n_repeats}, {n_init}")
    y_true = np.asarray(y_true)
    seeds = np.random.SeedSequence(seed).generate_state(n_repeats * n_init, dtype=np.uint32)
    seeds = seeds.astype(np.int64).reshape(n_repeats, n_init)
    dists = np.empty((n_repeats, n_init))
    selected = np.empty(n_repeats, dtype=np.int64)
    scores: list[dict[str, float]] = []
    first_labels = None
    for r in tqdm(range(n_repeats), desc="repeats", unit="rep", disable=not progress):
        best_labels, best = None, np.inf
        for i in range(n_init):
            labels, dist = _unpack(fit_fn(int(seeds[r, i])))
            if labels.shape != y_true.shape:
                raise ValueError(f"fit_fn returned {labels.shape[0]} labels for {y_true.shape[0]} documents")
            dists[r, i] = dist
            dist = np.inf if np.isnan(dist) else dist  # a failed run (NaN distortion) is never the best
            if dist < best or best_labels is None:
                best_labels, best, selected[r] = labels, dist, i
        scores.append(clustering_scores(y_true, best_labels, percent=percent))
        if first_labels is None:
            first_labels = best_labels
    keys = scores[0].keys()
    mean = {k: float(np.mean([s[k] for s in scores])) for k in keys}
    std = {k: float(np.std([s[k] for s in scores])) for k in keys}
    log.info("best of %d over %d repeats: %s", n_init, n_repeats,
             ", ".join(f"{k} {mean[k]:.2f} ({std[k]:.2f})" for k in keys))
    return RepeatedResult(mean=mean, std=std, scores=scores, distortions=dists, selected=selected,
                          labels=first_labels, seeds=seeds)


def make_gc_fit_fn(logp: np.ndarray, n_clusters: int, *, alpha: float | str = GCFitOptions.alpha,
                   clip_sigma: float | None = GCFitOptions.clip_sigma, phi: str = GCFitOptions.phi,
                   init: str = "random", max_iter: int = GCFitOptions.max_iter, tol: float = GCFitOptions.tol,
                   device=GCFitOptions.device, dtype=None,
                   ess_target: float = GCFitOptions.ess_target) -> Callable[[int], Any]:
    """A single-run GC ``fit_fn(seed)`` for ``repeated_best_of``; clip, phi and W are computed once."""
    est = gcmod.GenerativeClustering(n_clusters, alpha=alpha, clip_sigma=clip_sigma, phi=phi, init=init,
                                     n_init=1, max_iter=max_iter, tol=tol, device=device,
                                     dtype=dtype or torch.float32)
    est._check_params()
    logp = gcmod.as_2d_float(logp, "logp", min_rows=2)
    gcmod.check_n_clusters(n_clusters, logp.shape[0])
    upper = None if clip_sigma is None else gcmod.clip_bounds_unchecked(logp, float(clip_sigma))
    alpha = gcmod.resolve_alpha(alpha, logp, ess_target=ess_target, phi=phi, upper=upper)
    log_phi = gcmod.log_proposal_unchecked(logp, float(alpha), phi, upper)
    prepared = gcmod.prepare_fit(logp, alpha=float(alpha), log_phi=log_phi, upper=upper, device=device,
                              dtype=gcmod.torch_dtype(est.dtype))

    def fit_fn(seed: int):
        return gcmod.fit_prepared(prepared, int(n_clusters), init=init, n_init=1, max_iter=max_iter,
                                   tol=tol, seed=seed)

    return fit_fn
