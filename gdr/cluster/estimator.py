"""Generative clustering's estimator: :func:`fit_generative` (the best of ``n_init`` runs, then split/merge),
:func:`init_centroids`, :class:`GenerativeClustering` (scikit-learn style) and :func:`describe_clusters`."""
from __future__ import annotations

import inspect
import logging
import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from gdr.cluster.engine import _INIT_FNS, _cpu_threads, _lloyd, _Prepared, _Run, log_normalise, prepare_fit, torch_dtype
from gdr.cluster.equations import (
    _PHIS,
    INITS,
    _distortion_matrix,
    _is_number,
    _row_blocks,
    as_2d_float,
    check_log_probabilities,
    check_n_clusters,
    clip_bounds_unchecked,
    log_proposal_unchecked,
    resolve_alpha,
)
from gdr.cluster.split_merge import _split_merge
from gdr.options import GCFitOptions
from gdr.rules import check_values, rule_of

log = logging.getLogger(__name__)


def _spawn(seed, n: int) -> list[np.random.Generator]:
    if isinstance(seed, np.random.Generator):
        return seed.spawn(n)
    return [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(n)]


@dataclass
class GCResult:
    """Result of ``fit_generative`` (the selected run among ``n_init``).

    labels : (N,) int64 cluster of each document.
    log_centroids : (K, J) float64 log c_k, normalised (logsumexp over j = 0).
    distortion : total distortion sum_i d(x_i, f(x_i)) at ``labels`` and ``log_centroids``.
    n_iter : iterations of the selected run.
    distortion_history : total distortion after each iteration of the selected run, then after each
        split/merge move (non-increasing).
    all_distortions : final distortion of every run before split/merge moves, in run order (n_init,).
    best_run : index of the selected run; converged : whether it stopped before ``max_iter``.
    n_moves : split/merge moves made on the selected run (0 without ``split_merge``).
    distortion_before_moves : the selected run's distortion before the moves (None without ``split_merge``).
    """

    labels: np.ndarray
    log_centroids: np.ndarray
    distortion: float
    n_iter: int
    distortion_history: list[float]
    all_distortions: list[float]
    best_run: int = 0
    converged: bool = True
    n_iter_total: int = 0
    init_indices: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    n_moves: int = 0
    distortion_before_moves: float | None = None


def use_split_merge(init: str, split_merge: bool | None) -> bool:
    """``split_merge=None``: on for the default ``"greedy-k-means++"``, off for the paper's inits."""
    return init == "greedy-k-means++" if split_merge is None else bool(split_merge)


def fit_prepared(p: _Prepared, n_clusters: int, *, init: str, n_init: int, max_iter: int, tol: float,
                  seed, progress: bool = False, split_merge: bool | None = None) -> GCResult:
    with _cpu_threads(p.v.device, p.n * p.j * n_clusters):
        return _fit_runs(p, n_clusters, init=init, n_init=n_init, max_iter=max_iter, tol=tol, seed=seed,
                         progress=progress, split_merge=use_split_merge(init, split_merge))


def _fit_runs(p: _Prepared, n_clusters: int, *, init: str, n_init: int, max_iter: int, tol: float,
              seed, progress: bool, split_merge: bool = False) -> GCResult:
    best: _Run | None = None
    best_r, best_idx = -1, None
    dists: list[float] = []
    total_iter = 0
    init_fn = _INIT_FNS[init]
    rngs = _spawn(seed, n_init + 1 if split_merge else n_init)   # the extra child: the split/merge moves
    for r in tqdm(range(n_init), desc="gc runs", unit="run", disable=not progress, leave=False):
        with _cpu_threads(p.v.device, 0):   # seeding: small ops and (N, J) @ (J, few) products, one thread
            idx = init_fn(p, n_clusters, rngs[r])
        run = _lloyd(p, idx, max_iter, tol)
        total_iter += run.n_iter
        dists.append(run.distortion)
        log.debug("gc run %d: distortion %.6g after %d iterations", r, run.distortion, run.n_iter)
        if best is None or run.distortion < best.distortion:
            best, best_r, best_idx = run, r, idx
    if not best.converged:
        log.warning("generative clustering: the selected run hit max_iter=%d before converging", max_iter)
    n_moves, before = 0, None
    if split_merge:
        before = best.distortion
        refined, n_moves = _split_merge(p, best, n_clusters, max_iter, tol, rngs[n_init])
        total_iter += refined.n_iter - best.n_iter
        log.debug("gc split/merge: %d move(s), distortion %.6g -> %.6g", n_moves, before, refined.distortion)
        best = refined
    if not best.settled:
        log.warning("generative clustering: assigning every document to its closest centroid would leave a cluster "
                    "empty (identical documents, or n_clusters=%d above the number of distinct rows): the labels keep "
                    "the loop's last assignment, and predict() may put some of these documents in another cluster",
                    n_clusters)
    return GCResult(
        labels=best.labels.cpu().numpy().astype(np.int64), log_centroids=best.log_c64.cpu().numpy(),
        distortion=best.distortion, n_iter=best.n_iter, distortion_history=best.history,
        all_distortions=dists, best_run=best_r, converged=best.converged, n_iter_total=total_iter,
        init_indices=np.asarray(best_idx, dtype=np.int64), n_moves=n_moves, distortion_before_moves=before)


def _check_fit_params(init: str, n_init: int, max_iter: int, tol: float) -> None:
    if init not in INITS:
        raise ValueError(f"init must be one of {INITS}; got {init!r}")
    if not (isinstance(n_init, (int, np.integer)) and n_init >= 1):
        raise ValueError(f"n_init must be a positive integer; got {n_init!r}")
    if not (isinstance(max_iter, (int, np.integer)) and max_iter >= 1):
        raise ValueError(f"max_iter must be a positive integer; got {max_iter!r}")
    if not (_is_number(tol) and 0 <= tol < math.inf):
        raise ValueError(f"tol must be >= 0; got {tol!r}")


def _check_split_merge(split_merge) -> None:
    if split_merge is not None and not isinstance(split_merge, (bool, np.bool_)):
        raise ValueError(f"split_merge must be true, false or null (on for init='greedy-k-means++'); "
                         f"got {split_merge!r}")


def fit_generative(logp: np.ndarray, log_w: np.ndarray, n_clusters: int, *, init: str = GCFitOptions.init,
                   n_init: int = GCFitOptions.n_init, max_iter: int = GCFitOptions.max_iter,
                   tol: float = GCFitOptions.tol, seed=0, device=GCFitOptions.device, dtype=torch.float32,
                   progress: bool = False, split_merge: bool | None = None) -> GCResult:
    """The CLUSTERING function of Algorithm 1 on given log P and log W.

    Parameters
    ----------
    logp : (n_docs, n_queries) log P, already clipped if clipping is wanted.
    log_w : (n_docs, n_queries) log W, e.g. ``log_weights(logp, log_proposal(logp, alpha), alpha)``.
    n_clusters : K.
    init : ``"greedy-k-means++"`` (default): k-means++ seeding that draws ``2 + floor(ln K)`` candidates
        per step (probability proportional to the squared excess of a document's distortion over its
        own-row minimum) and keeps the one that lowers the total distortion most;
        ``"random"`` (Eq. init: K distinct random rows of W, normalised); ``"k-means++"`` (Appendix).
    n_init : runs with different seeds; the one with lowest total distortion is selected.
    split_merge : after selecting the run, repeat split/merge moves (merge the cheapest pair of
        clusters, split the cluster whose split gains most, re-run the loop) while they lower the total
        distortion (at most K moves). None (default): on for ``"greedy-k-means++"``, off for
        ``"random"`` and ``"k-means++"`` (which then run Algorithm 1 exactly).
    seed : int or numpy Generator; run r uses the r-th child of ``SeedSequence(seed)``.
    device : torch device of the kernel (``"cpu"``, ``"cuda"``).
    dtype : kernel dtype, float32 (default; safe thanks to the per-row factorisation) or float64.
    """
    logp = as_2d_float(logp, "logp", min_rows=2, min_cols=2)
    log_w = as_2d_float(log_w, "log_w", min_rows=2)
    if log_w.shape != logp.shape:
        raise ValueError(f"log_w has shape {log_w.shape} but logp has {logp.shape}; they must match")
    check_n_clusters(n_clusters, logp.shape[0])
    _check_fit_params(init, n_init, max_iter, tol)
    _check_split_merge(split_merge)
    p = prepare_fit(logp, log_w=log_w, device=device, dtype=torch_dtype(dtype))
    return fit_prepared(p, int(n_clusters), init=init, n_init=int(n_init), max_iter=int(max_iter),
                         tol=float(tol), seed=seed, progress=progress, split_merge=split_merge)


def init_centroids(logp: np.ndarray, log_w: np.ndarray, n_clusters: int, *, init: str = GCFitOptions.init,
                   seed=0, dtype=torch.float64):
    """Initial centroids as ``fit_generative`` makes them (for inspection and tests).

    Returns ``(log_c, indices)``: (K, J) float64 normalised log W rows and the (K,) chosen rows.
    """
    logp = as_2d_float(logp, "logp", min_rows=2, min_cols=2)
    log_w = as_2d_float(log_w, "log_w", min_rows=2)
    check_n_clusters(n_clusters, logp.shape[0])
    _check_fit_params(init, 1, 1, 0.0)
    p = prepare_fit(logp, log_w=log_w, dtype=torch_dtype(dtype))
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    idx = _INIT_FNS[init](p, int(n_clusters), rng)
    return log_normalise(p.v[torch.as_tensor(idx)].double()).numpy(), np.asarray(idx, dtype=np.int64)


# ----------------------------------------------------------------------------------------------
# estimator

class NotFittedError(ValueError, AttributeError):
    """A model used before ``fit``: a ValueError and an AttributeError, as scikit-learn's ``NotFittedError`` is."""


class GenerativeClustering:
    """Generative clustering (Algorithm 1), a scikit-learn estimator by its protocol (``get_params`` /
    ``set_params``, so ``sklearn.base.clone`` and ``Pipeline`` take it; ``fit(X, y=None)``; ``NotFittedError`` before
    ``fit``), without depending on scikit-learn. The randomness is ``seed`` (scikit-learn's ``random_state``).

    Parameters
    ----------
    n_clusters : K.
    alpha : RIS regularisation (Eq. ris), 0.25 in the paper; ``"auto"``: :func:`auto_alpha`, the largest
        alpha whose importance weights keep a mean effective sample size of ``ess_target * J``.
    clip_sigma : n_sigma of Eq. clip (5 in the paper); None disables clipping.
    phi : ``"power"`` (Eq. vmp) or ``"naive"`` (column mean of P).
    init, n_init, max_iter, tol, seed, device, dtype, progress, split_merge : see ``fit_generative``
        (default: greedy k-means++ seeding, best of ``n_init`` runs, then split/merge moves;
        ``init="random", split_merge=None`` is the paper's Algorithm 1).
    ess_target : the ESS fraction for ``alpha="auto"``.

    Attributes after ``fit``
    ------------------------
    alpha_ (the alpha used), labels_ (N,), distortion_, log_centroids_ (K, J), n_iter_, distortion_history_,
    all_distortions_, log_phi_ (J,), clip_upper_ (J,) or None, result_ (GCResult).
    """

    def __init__(self, n_clusters: int, alpha: float | str = GCFitOptions.alpha,
                 clip_sigma: float | None = GCFitOptions.clip_sigma, phi: str = GCFitOptions.phi,
                 init: str = GCFitOptions.init, n_init: int = GCFitOptions.n_init,
                 max_iter: int = GCFitOptions.max_iter, tol: float = GCFitOptions.tol, seed=0,
                 device=GCFitOptions.device, dtype=torch.float32, progress: bool = False,
                 ess_target: float = GCFitOptions.ess_target, split_merge: bool | None = None):
        self.n_clusters = n_clusters
        self.alpha = alpha
        self.ess_target = ess_target
        self.clip_sigma = clip_sigma
        self.phi = phi
        self.init = init
        self.n_init = n_init
        self.max_iter = max_iter
        self.tol = tol
        self.seed = seed
        self.device = device
        self.dtype = dtype
        self.progress = progress
        self.split_merge = split_merge

    def _check_params(self) -> None:
        if self.phi not in _PHIS:
            raise ValueError(f"phi must be one of {_PHIS}; got {self.phi!r}")
        if self.clip_sigma is not None and not (_is_number(self.clip_sigma) and 0 < self.clip_sigma < math.inf):
            raise ValueError(f"clip_sigma must be > 0 or None (no clipping); got {self.clip_sigma!r}")
        if not (_is_number(self.ess_target) and 0 < self.ess_target < 1):
            raise ValueError(f"ess_target must be in (0, 1) (the mean effective sample size as a fraction of J); "
                             f"got {self.ess_target!r}")
        integer = isinstance(self.seed, (int, np.integer))
        if not (integer and 0 <= self.seed < 2**32 or self.seed is None or isinstance(self.seed, np.random.Generator)):
            raise ValueError(f"seed must be an integer in [0, 2^32) or a numpy Generator; got {self.seed!r}")
        _check_fit_params(self.init, self.n_init, self.max_iter, self.tol)
        _check_split_merge(self.split_merge)
        device = str(self.device) if isinstance(self.device, torch.device) else self.device
        fields = GCFitOptions.__dataclass_fields__
        check_values({"alpha": self.alpha, "device": device}, tuple(rule_of(fields[k], k) for k in ("alpha", "device")))

    def get_params(self, deep: bool = True) -> dict:
        """The constructor's arguments by name (scikit-learn's protocol: ``clone``, grid searches)."""
        return {name: getattr(self, name) for name in _PARAMS}

    def set_params(self, **params) -> "GenerativeClustering":
        """Set constructor arguments by name (checked at the next ``fit``); an unknown name is refused."""
        unknown = sorted(set(params) - set(_PARAMS))
        if unknown:
            raise ValueError(f"GenerativeClustering has no parameter {', '.join(map(repr, unknown))}; "
                             f"its parameters: {', '.join(_PARAMS)}")
        for name, value in params.items():
            setattr(self, name, value)
        return self

    def __sklearn_tags__(self):
        """scikit-learn's tags, which its ``Pipeline`` and searches read from version 1.6 on: a clusterer that
        transforms."""
        # optional: gdr[eval] (only scikit-learn calls this)
        from sklearn.utils import Tags, TargetTags, TransformerTags

        return Tags(estimator_type="clusterer", target_tags=TargetTags(required=False),
                    transformer_tags=TransformerTags())  # transform: the distortion to each cluster

    def fit(self, logp: np.ndarray, y=None) -> "GenerativeClustering":
        """Cluster documents from ``logp`` = log P of shape (n_docs, n_queries) (``y`` is ignored: scikit-learn's
        signature).

        Clipping, phi and W are streamed in row blocks: besides ``logp`` only one N x J array
        (V, kernel dtype) is held.
        """
        self._check_params()
        logp = as_2d_float(logp, "logp", min_rows=2, min_cols=2)
        check_log_probabilities(logp, "logp")
        check_n_clusters(self.n_clusters, logp.shape[0])
        self.clip_upper_ = None if self.clip_sigma is None else clip_bounds_unchecked(logp, float(self.clip_sigma))
        self.alpha_ = alpha = resolve_alpha(self.alpha, logp, ess_target=self.ess_target, phi=self.phi,
                                            upper=self.clip_upper_)
        self.log_phi_ = log_proposal_unchecked(logp, alpha, self.phi, self.clip_upper_)
        p = prepare_fit(logp, alpha=alpha, log_phi=self.log_phi_, upper=self.clip_upper_,
                     device=self.device, dtype=torch_dtype(self.dtype))
        res = fit_prepared(p, int(self.n_clusters), init=self.init, n_init=int(self.n_init),
                            max_iter=int(self.max_iter), tol=float(self.tol), seed=self.seed,
                            progress=self.progress, split_merge=self.split_merge)
        del p
        self.result_ = res
        self.labels_ = res.labels
        self.distortion_ = res.distortion
        self.log_centroids_ = res.log_centroids
        self.n_iter_ = res.n_iter
        self.distortion_history_ = res.distortion_history
        self.all_distortions_ = res.all_distortions
        self.n_features_in_ = logp.shape[1]
        return self

    def _check_fitted(self, x, name: str) -> np.ndarray:
        if not hasattr(self, "log_centroids_"):
            raise NotFittedError("GenerativeClustering is not fitted yet; call fit(logp) first")
        x = as_2d_float(x, name, min_rows=0)  # no rows in, none out (scikit-learn's predict of an empty batch)
        if len(x):
            check_log_probabilities(x, name)
        if x.shape[1] != self.n_features_in_:
            raise ValueError(f"{name} has {x.shape[1]} columns but the model was fitted on "
                             f"{self.n_features_in_} queries; score the same sampled queries")
        return x

    def transform(self, logp_rows: np.ndarray) -> np.ndarray:
        """Distortion d(x, k) of new documents, float64 of shape (n, K) (same clip bounds and phi)."""
        logp_rows = self._check_fitted(logp_rows, "logp_rows")
        out = np.empty((logp_rows.shape[0], self.n_clusters))
        for s, e in _row_blocks(*logp_rows.shape):
            lp = logp_rows[s:e].astype(np.float64)
            if self.clip_upper_ is not None:
                np.minimum(lp, self.clip_upper_, out=lp)
            out[s:e] = _distortion_matrix(lp, self.alpha_ * (lp - self.log_phi_), self.log_centroids_)
        return out

    def predict(self, logp_rows: np.ndarray) -> np.ndarray:
        """Cluster of new documents (rows of log P over the same queries), int64 of shape (n,)."""
        return self.transform(logp_rows).argmin(axis=1).astype(np.int64)

    def fit_transform(self, logp: np.ndarray, y=None) -> np.ndarray:
        """``fit(logp)``, then the documents' distortion to each cluster, float64 of shape (n_docs, K)."""
        return self.fit(logp).transform(logp)

    def fit_predict(self, logp: np.ndarray, y=None) -> np.ndarray:
        """``fit(logp)``, then the documents' clusters ``labels_``."""
        return self.fit(logp).labels_


_PARAMS = tuple(n for n in inspect.signature(GenerativeClustering.__init__).parameters if n != "self")


# ----------------------------------------------------------------------------------------------
# descriptions

def describe_clusters(log_centroids: np.ndarray, queries: Sequence[str], top: int = 5,
                      log_reference: np.ndarray | None = None) -> list[list[tuple[str, float]]]:
    """For each cluster, the ``top`` sampled queries with the highest centroid weight c_kj.

    Duplicate query strings (i.i.d. sampling or resampling repeats texts) are merged by summing
    their weights. With ``log_reference`` (J,), e.g. ``log_phi_``, queries are ranked by the lift
    ``c_kj / ref_j`` instead (still reporting c_kj), which favours cluster-specific queries.

    Returns a list (K) of lists of (query, weight) pairs, highest first.
    """
    log_c = np.asarray(log_centroids, dtype=np.float64)
    if log_c.ndim != 2 or log_c.shape[1] != len(queries):
        raise ValueError(f"log_centroids must have shape (K, {len(queries)}) to match the queries; got {log_c.shape}")
    uniq, inv = np.unique(np.asarray(queries, dtype=object).astype(str), return_inverse=True)
    weight = np.exp(log_c)                                   # (K, J)
    merged = np.zeros((log_c.shape[0], len(uniq)))
    np.add.at(merged, (slice(None), inv), weight)            # (K, U) summed over duplicate texts
    score = merged
    if log_reference is not None:
        ref = np.zeros(len(uniq))
        np.add.at(ref, inv, np.exp(np.asarray(log_reference, dtype=np.float64)))
        score = merged / ref
    top = min(int(top), len(uniq))
    order = np.argsort(-score, axis=1, kind="stable")[:, :top]
    return [[(str(uniq[u]), float(merged[k, u])) for u in order[k]] for k in range(log_c.shape[0])]
