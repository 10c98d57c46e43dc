"""Generative clustering of documents (the paper's Algorithm 1).

Input is ``logp = log P`` of shape (n_docs, n_queries): ``logp[i, j] = log p(y_j | x_i)`` for J
texts sampled once from the generative LM. The pipeline, with the paper's equation names:

1. Eq. clip      ``clip_logp``      per column, values above ``mu_j + 5 sigma_j`` are set to that bound.
2. Eq. vmp       ``log_proposal``   ``log phi_j = (logsumexp_i(2 alpha logp_ij) - log N) / (2 alpha)``.
3. weights       ``log_weights``    ``log W_ij = alpha (logp_ij - log phi_j)``.
4. Eq. ris       ``distortion_matrix``  ``d(x_i, k) = (1/J) sum_j W_ij (logp_ij - log c_kj)``.
5. Eqs. init / optim-centroid and the two-step loop: ``fit_generative`` / ``GenerativeClustering``.

Numerics
--------
Everything is kept in the log domain until the last moment. The kernel factorises each row of W
exactly as ``W_ij = exp(r_i) * V_ij`` with ``r_i = max_j log W_ij`` (float64) and
``V_ij = exp(log W_ij - r_i)`` in (0, 1] (the kernel dtype). This is *not* a row rescaling that
is forgotten: ``exp(r_i)`` is carried along exactly, so

* assignment ``argmin_k d(x_i, k) = argmax_k V_i . log c_k`` only needs V (a row factor never
  changes a row's argmin), and every row has an entry equal to 1, so no row underflows to zeros;
* the centroid update weighs each document by ``exp(r_i - R_k)`` (``R_k`` = largest ``r_i`` in
  cluster k), which is Eq. optim-centroid up to the per-cluster factor ``exp(R_k)`` that the
  normalisation removes;
* distortions are assembled in float64 as ``exp(r_i) / J * (a_i - V_i . log c_k)`` with
  ``a_i = sum_j V_ij logp_ij``.

With this factorisation float32 (the default ``dtype``) is safe for log-probabilities anywhere in
float range (tested with ``logp`` in [-400, -50] and alpha = 1); ``dtype=torch.float64`` doubles
the cost and is used by the equation tests. Entries that underflow (``V_ij`` or ``c_kj`` below the
dtype's smallest normal number, i.e. ``exp(-87)`` relative to the row maximum in float32) count as
zero weight; ``log c`` is floored at ``log(tiny)`` so that ``0 * log 0`` never produces NaN.

Empty clusters: when an assignment step leaves a cluster empty, it is re-seeded (as scikit-learn
does) with the document of largest current distortion taken from a cluster that keeps at least
one member; that document becomes the cluster's only member, so the new centroid is its normalised
W row. This never increases the total distortion: for a single document, its own normalised W row
is the distortion-minimising centroid (Eq. optim-centroid with one member).

Stopping: after each iteration (assign, update, total distortion as in Algorithm 1) the loop stops
when no label changed, when the relative improvement ``(D_prev - D) / |D_prev|`` is below ``tol``,
or after ``max_iter`` iterations. A final assignment with the final centroids makes ``labels``
consistent with ``log_centroids`` (as scikit-learn's k-means does), unless that would empty a
cluster. Model selection: the run with the lowest total distortion among ``n_init`` (no labels).

Seeding and split/merge moves (the default; ``init="random"`` is the paper's Eq. init)
-------------------------------------------------------------------------------------
The two-step loop stops in local optima: on the planted benchmark (``gdr.bench.clustering``)
the planted partition had a lower total distortion than every fitted run from random seeds. The
default ``init="greedy-k-means++"`` seeds as scikit-learn's greedy k-means++: at each step
``2 + floor(ln K)`` candidates are drawn with probability proportional to ``excess_i^2``, where
``excess_i = min_k d(x_i, k) - d(x_i, own row)`` (d at the document's own normalised W row is the
smallest distortion any centroid can give it), and the candidate that lowers the total distortion
most is kept. After the best of ``n_init`` runs is selected, split/merge moves (``split_merge``)
merge the pair of clusters whose union raises the distortion least (computed exactly from the
per-cluster W sums) and split in two the other cluster whose split lowers it most (all K clusters
are split at once as one 2K-cluster problem: greedy k-means++ with two seeds per cluster and the
two-step loop; best of three draws), whenever the predicted net change is a decrease; the loop
then resumes from the new partition, and the move is kept if the total distortion ends lower.
Every choice compares total distortions only; labels are never used.
"""
from __future__ import annotations

import logging
import math
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from gdr.options import GCFitOptions

log = logging.getLogger(__name__)

__all__ = [
    "GCResult",
    "GenerativeClustering",
    "auto_alpha",
    "effective_sample_size",
    "resolve_alpha",
    "centroid_update",
    "clip_bounds",
    "clip_logp",
    "describe_clusters",
    "distortion_matrix",
    "fit_generative",
    "init_centroids",
    "log_proposal",
    "log_weights",
]

_CHUNK_ELEMS = 1 << 21  # elements per row block in the streamed passes (16 MB of float64)
INITS = ("random", "k-means++", "greedy-k-means++")
_PHIS = ("power", "naive")


# ----------------------------------------------------------------------------------------------
# validation (public edge only; kernels assume valid input)

def as_2d_float(x, name: str, min_rows: int = 1) -> np.ndarray:
    """``x`` as a float32/float64 ndarray of shape (n, J); clear errors otherwise."""
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    x = np.asarray(x)
    if x.ndim != 2:
        raise ValueError(f"{name} must be a 2-D array of shape (n_docs, n_queries); got shape {x.shape}")
    if x.dtype not in (np.float32, np.float64):
        if not (np.issubdtype(x.dtype, np.floating) or np.issubdtype(x.dtype, np.integer)):
            raise ValueError(f"{name} must hold numbers (log-probabilities); got dtype {x.dtype}")
        x = x.astype(np.float64)
    if x.shape[0] < min_rows:
        what = "a single document" if x.shape[0] == 1 else f"{x.shape[0]} documents"
        raise ValueError(f"{name} has {what}; clustering needs at least {min_rows} documents (rows)")
    if x.shape[1] < 1:
        raise ValueError(f"{name} has no columns (queries); shape {x.shape}")
    _check_finite(x, name)
    return x


def _check_finite(x: np.ndarray, name: str) -> None:
    """Raise naming the first non-finite entry. A row sum finds suspect rows without an N x J mask."""
    sums = x.sum(axis=1, dtype=np.float64)
    bad_rows = np.flatnonzero(~np.isfinite(sums))
    for i in bad_rows:  # loops over offending rows only (usually none)
        cols = np.flatnonzero(~np.isfinite(x[i]))
        if cols.size:  # else the row sum merely overflowed
            j = int(cols[0])
            raise ValueError(
                f"{name}[{i}, {j}] = {x[i, j]} (document row {i}, query column {j}; "
                f"{int((~np.isfinite(x[bad_rows])).sum())} non-finite value(s) in all): log-probabilities "
                "must be finite. Re-score that pair, drop the row/column, or floor -inf, e.g. "
                "np.maximum(logp, -1e4).")


def check_n_clusters(n_clusters: int, n_docs: int) -> None:
    if not isinstance(n_clusters, (int, np.integer)) or n_clusters < 1:
        raise ValueError(f"n_clusters must be a positive integer; got {n_clusters!r}")
    if n_clusters > n_docs:
        raise ValueError(f"n_clusters={n_clusters} is larger than the number of documents ({n_docs}); "
                         "use at most one cluster per document")


def _check_alpha(alpha: float) -> None:
    if not (isinstance(alpha, (int, float, np.floating)) and math.isfinite(alpha) and alpha >= 0):
        raise ValueError(f"alpha must be a finite number >= 0 (the paper uses 0.25); got {alpha!r}")


def torch_dtype(dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        out = dtype
    else:
        out = {"float32": torch.float32, "float": torch.float32,
               "float64": torch.float64, "double": torch.float64}.get(str(dtype))
    if out not in (torch.float32, torch.float64):
        raise ValueError(f"dtype must be torch.float32 or torch.float64 (or their names); got {dtype!r}")
    return out


def _row_blocks(n_rows: int, n_cols: int):
    step = max(1, _CHUNK_ELEMS // max(n_cols, 1))
    for s in range(0, n_rows, step):
        yield s, min(n_rows, s + step)


# ----------------------------------------------------------------------------------------------
# Eq. clip, Eq. vmp, weights

def clip_bounds(logp: np.ndarray, n_sigma: float = GCFitOptions.clip_sigma) -> np.ndarray:
    """Upper bounds ``mu_j + n_sigma * sigma_j`` of Eq. clip (population std), float64 of shape (J,).

    Streams over row blocks in float64, so no N x J temporary is made.
    """
    logp = as_2d_float(logp, "logp")
    return clip_bounds_unchecked(logp, float(n_sigma))


def clip_bounds_unchecked(logp: np.ndarray, n_sigma: float) -> np.ndarray:
    n, j = logp.shape
    total = np.zeros(j)
    for s, e in _row_blocks(n, j):
        total += logp[s:e].sum(axis=0, dtype=np.float64)
    mu = total / n
    sq = np.zeros(j)
    for s, e in _row_blocks(n, j):  # two passes: no cancellation in E[x^2] - E[x]^2
        dev = logp[s:e] - mu
        sq += np.einsum("ij,ij->j", dev, dev)
    return mu + n_sigma * np.sqrt(sq / n)


def clip_logp(logp: np.ndarray, n_sigma: float = GCFitOptions.clip_sigma) -> np.ndarray:
    """Eq. clip: per column j, values above ``mu_j + n_sigma * sigma_j`` are set to that bound.

    Parameters
    ----------
    logp : array of shape (n_docs, n_queries)
        log P; mean and population standard deviation are taken per column (query).

    Returns
    -------
    array of shape (n_docs, n_queries), same dtype as ``logp`` (a new array).
    """
    logp = as_2d_float(logp, "logp")
    upper = clip_bounds_unchecked(logp, float(n_sigma))
    return np.minimum(logp, upper.astype(logp.dtype))


def log_proposal(logp: np.ndarray, alpha: float = GCFitOptions.alpha, method: str = GCFitOptions.phi) -> np.ndarray:
    """log phi(y_j) of Eq. vmp, float64 of shape (n_queries,).

    ``method="power"``: ``(logsumexp_i(2 alpha logp_ij) - log N) / (2 alpha)``, the 2-alpha power
    mean of each column of P (for ``alpha = 0`` its limit, the column mean of log P).
    ``method="naive"``: ``logsumexp_i(logp_ij) - log N``, the log of the column mean of P.
    Pass the clipped ``logp`` (Algorithm 1 clips first). Streams over row blocks in float64.
    """
    logp = as_2d_float(logp, "logp")
    _check_alpha(alpha)
    if method not in _PHIS:
        raise ValueError(f"method must be one of {_PHIS}; got {method!r}")
    return log_proposal_unchecked(logp, float(alpha), method, None)


def log_proposal_unchecked(logp: np.ndarray, alpha: float, method: str, upper: np.ndarray | None) -> np.ndarray:
    """Column power means in log space; ``upper`` clips on the fly (no clipped copy of logp)."""
    n, j = logp.shape
    p = 1.0 if method == "naive" else 2.0 * alpha
    if p == 0.0:  # geometric mean: the p -> 0 limit of the power mean
        total = np.zeros(j)
        for s, e in _row_blocks(n, j):
            blk = logp[s:e] if upper is None else np.minimum(logp[s:e], upper)
            total += blk.sum(axis=0, dtype=np.float64)
        return total / n
    colmax = logp.max(axis=0).astype(np.float64)
    if upper is not None:
        colmax = np.minimum(colmax, upper)
    acc = np.zeros(j)
    for s, e in _row_blocks(n, j):
        blk = logp[s:e].astype(np.float64)
        if upper is not None:
            np.minimum(blk, upper, out=blk)
        blk -= colmax
        blk *= p
        acc += np.exp(blk, out=blk).sum(axis=0)
    return colmax + (np.log(acc) - math.log(n)) / p


def effective_sample_size(logp: np.ndarray, alpha: float, phi: str = GCFitOptions.phi,
                          upper: np.ndarray | None = None) -> np.ndarray:
    """Kish's effective sample size of each document's importance weights, float64 of shape (n_docs,).

    ``ESS_i = (sum_j W_ij)^2 / sum_j W_ij^2`` with ``W_ij = (P_ij / phi_j)^alpha`` (Eq. vmp phi on the
    clipped P when ``upper`` is given): how many of the J queries effectively carry document i's
    estimate of Eq. ris. It runs from 1 (one query holds all the weight) to J (uniform weights).
    """
    logp = as_2d_float(logp, "logp")
    _check_alpha(alpha)
    log_phi = log_proposal_unchecked(logp, float(alpha), phi, upper)
    ess = np.empty(logp.shape[0])
    for s, e in _row_blocks(*logp.shape):
        blk = logp[s:e].astype(np.float64)
        if upper is not None:
            np.minimum(blk, upper, out=blk)
        lw = alpha * (blk - log_phi)                                        # (b, J) log W
        lw -= lw.max(axis=1, keepdims=True)
        w = np.exp(lw)
        ess[s:e] = w.sum(axis=1) ** 2 / (w * w).sum(axis=1)
    return ess


def auto_alpha(logp: np.ndarray, target: float = GCFitOptions.ess_target, phi: str = GCFitOptions.phi,
               upper: np.ndarray | None = None, lo: float = 1e-3, hi: float = 1.0, max_rows: int = 20_000,
               seed: int = 0) -> float:
    """The largest alpha in [lo, hi] whose mean effective sample size is at least ``target * J``.

    The paper (Discussions, "Bias-Variance Tradeoff") explains alpha through the effective sample size
    of the importance weights: LM probabilities are heavily right-skewed, and lowering alpha raises
    the ESS (less variance) at the price of bias. How skewed depends on the LM: at the paper's 0.25 a
    135M chat model's log-probs (row spread ~17 nats) leave ~6 of 192 queries per document effectively
    weighted (measured on BBC). Choosing alpha for a fixed ESS fraction, as adaptive tempering in
    sequential Monte Carlo chooses its temperatures (ESS = J/2 is the usual target), is label-free.
    Bisection on log alpha (ESS falls as alpha grows); at most ``max_rows`` rows (a seeded sample).
    """
    logp = as_2d_float(logp, "logp")
    if not 0.0 < target < 1.0:
        raise ValueError(f"ESS target must be in (0, 1) (a fraction of J); got {target!r}")
    if logp.shape[0] > max_rows:
        rows = np.sort(np.random.default_rng(seed).choice(logp.shape[0], max_rows, replace=False))
        logp = logp[rows]
    J = logp.shape[1]

    def frac(a: float) -> float:
        return float(effective_sample_size(logp, a, phi, upper).mean()) / J

    if frac(hi) >= target:
        return hi
    if frac(lo) < target:
        log.warning("alpha=auto: even alpha=%g leaves a mean ESS below %.0f%% of J; using it", lo, 100 * target)
        return lo
    a, b = math.log(lo), math.log(hi)
    for _ in range(30):  # |b - a| shrinks to ~1e-8 of log(hi/lo)
        m = 0.5 * (a + b)
        a, b = (m, b) if frac(math.exp(m)) >= target else (a, m)
    return float(f"{math.exp(a):.4g}")


def resolve_alpha(alpha: float | str, logp: np.ndarray, *, ess_target: float = GCFitOptions.ess_target,
                  phi: str = GCFitOptions.phi, upper: np.ndarray | None = None) -> float:
    """``alpha`` as a number: itself, or :func:`auto_alpha` for ``"auto"``."""
    if alpha == "auto":
        a = auto_alpha(logp, ess_target, phi, upper)
        log.info("alpha=auto: %.4g (mean ESS %.0f%% of J)", a, 100 * ess_target)
        return a
    _check_alpha(alpha)
    return float(alpha)


def log_weights(logp: np.ndarray, log_phi: np.ndarray, alpha: float = GCFitOptions.alpha) -> np.ndarray:
    """log W_ij = alpha (logp_ij - log phi_j), of shape (n_docs, n_queries), dtype of ``logp``."""
    logp = as_2d_float(logp, "logp")
    log_phi = np.asarray(log_phi, dtype=np.float64)
    if log_phi.shape != (logp.shape[1],):
        raise ValueError(f"log_phi must have shape ({logp.shape[1]},) to match logp {logp.shape}; "
                         f"got {log_phi.shape}")
    _check_alpha(alpha)
    return (alpha * (logp - log_phi.astype(logp.dtype))).astype(logp.dtype, copy=False)


# ----------------------------------------------------------------------------------------------
# Eq. ris, Eq. optim-centroid as plain numpy (reference-exact, float64)

def _row_factors(log_w: np.ndarray, logp: np.ndarray):
    """r (n,), V (n, J) float64 with W = exp(r)[:, None] * V, and a_i = sum_j V_ij logp_ij."""
    log_w = np.asarray(log_w, dtype=np.float64)
    r = log_w.max(axis=1)
    v = np.exp(log_w - r[:, None])
    a = np.einsum("ij,ij->i", v, np.asarray(logp, dtype=np.float64))
    return r, v, a


def distortion_matrix(logp: np.ndarray, log_w: np.ndarray, log_c: np.ndarray) -> np.ndarray:
    """Eq. ris for every document and cluster, float64 of shape (n_docs, n_clusters).

    ``d(x_i, k) = (1/J) sum_j W_ij (logp_ij - log c_kj)``, computed as
    ``(1/J) [sum_j W_ij logp_ij - W @ log_c.T]`` with W factorised per row (see module doc);
    never an N x J x K tensor.

    Parameters
    ----------
    logp : (n_docs, n_queries) log P (clipped as in fitting).
    log_w : (n_docs, n_queries) log W.
    log_c : (n_clusters, n_queries) log centroids (normalised or not; unnormalised shifts d).
    """
    logp = as_2d_float(logp, "logp")
    log_w = as_2d_float(log_w, "log_w")
    log_c = np.asarray(log_c, dtype=np.float64)
    if log_w.shape != logp.shape or log_c.ndim != 2 or log_c.shape[1] != logp.shape[1]:
        raise ValueError(f"shapes do not match: logp {logp.shape}, log_w {log_w.shape}, log_c {log_c.shape} "
                         "(expected (N, J), (N, J), (K, J))")
    return _distortion_matrix(logp, log_w, log_c)


def _distortion_matrix(logp, log_w, log_c) -> np.ndarray:
    r, v, a = _row_factors(log_w, logp)
    log_c = np.maximum(log_c, np.log(np.finfo(np.float64).tiny))  # 0 * log 0 -> 0, not NaN
    s = v @ log_c.T                                                # (N, K)
    return np.exp(r)[:, None] / logp.shape[1] * (a[:, None] - s)


def centroid_update(log_w: np.ndarray, labels: np.ndarray, n_clusters: int) -> np.ndarray:
    """Eq. optim-centroid: log c_k = log(sum_{i in k} W_i) normalised, float64 of shape (K, J).

    An empty cluster gets a row of NaN (the fitting loop never produces one; see module doc).
    """
    log_w = as_2d_float(log_w, "log_w")
    labels = np.asarray(labels)
    if labels.shape != (log_w.shape[0],) or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"labels must be integers of shape ({log_w.shape[0]},); got {labels.dtype} {labels.shape}")
    if labels.size and (labels.min() < 0 or labels.max() >= n_clusters):
        raise ValueError(f"labels must lie in [0, {n_clusters}); got range [{labels.min()}, {labels.max()}]")
    lw = log_w.astype(np.float64)
    r = lw.max(axis=1)
    rk = np.full(n_clusters, -np.inf)
    np.maximum.at(rk, labels, r)
    wts = np.exp(r - rk[labels])                          # (N,) in (0, 1]
    v = np.exp(lw - r[:, None])
    wk = np.zeros((n_clusters, lw.shape[1]))
    np.add.at(wk, labels, v * wts[:, None])                # scatter-add of W rows (per-cluster scale)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log(wk) - np.log(wk.sum(axis=1, keepdims=True))


# ----------------------------------------------------------------------------------------------
# torch kernel

@dataclass
class _Prepared:
    """W factorised per row, on the device. Shapes: V (N, J); r, a, s_self (N,)."""

    v: torch.Tensor          # (N, J) kernel dtype, V_ij = exp(log W_ij - r_i) in (0, 1]
    r: torch.Tensor          # (N,) float64, r_i = max_j log W_ij
    a: torch.Tensor          # (N,) float64, a_i = sum_j V_ij logp_ij
    r_max: float             # max_i r_i (global shift, undone when reporting distortions)
    a_total: float           # sum_i exp(r_i - r_max) a_i
    s_self: torch.Tensor     # (N,) float64, V_i . log(V_i / sum_j V_ij): V_i . log c at its own row

    @property
    def n(self) -> int:
        return self.v.shape[0]

    @property
    def j(self) -> int:
        return self.v.shape[1]


def prepare_fit(logp: np.ndarray, *, alpha: float = 0.0, log_phi: np.ndarray | None = None,
             upper: np.ndarray | None = None, log_w: np.ndarray | None = None,
             device=GCFitOptions.device, dtype=torch.float32) -> _Prepared:
    """Stream row blocks: clip (``upper``), log W (given or ``alpha (logp - log_phi)``), V, r, a.

    Only V (N x J, kernel dtype) is allocated at full size.
    """
    n, j = logp.shape
    v = torch.empty((n, j), dtype=dtype, device=device)
    r = np.empty(n)
    a = np.empty(n)
    s_self = np.empty(n)
    for s, e in _row_blocks(n, j):
        lp = logp[s:e].astype(np.float64)
        if upper is not None:
            np.minimum(lp, upper, out=lp)
        lw = log_w[s:e].astype(np.float64) if log_w is not None else alpha * (lp - log_phi)
        rr = lw.max(axis=1)
        lw -= rr[:, None]                                        # log V
        vv = np.exp(lw)
        tot = vv.sum(axis=1)
        s_self[s:e] = np.einsum("ij,ij->i", vv, lw) - tot * np.log(tot)   # V_i . log(V_i / sum V_i)
        r[s:e] = rr
        a[s:e] = np.einsum("ij,ij->i", vv, lp)
        v[s:e].copy_(torch.from_numpy(vv))
    r_max = float(r.max())
    a_total = float(np.dot(np.exp(r - r_max), a))
    return _Prepared(v=v, r=torch.from_numpy(r).to(device), a=torch.from_numpy(a).to(device),
                     r_max=r_max, a_total=a_total, s_self=torch.from_numpy(s_self).to(device))


def log_normalise(w: torch.Tensor) -> torch.Tensor:
    """log(w / w.sum(1)) with a floor at log(tiny) for zero entries; w of shape (K, J), >= 0."""
    tiny = torch.finfo(w.dtype).tiny
    return torch.log(w.clamp_min(tiny)) - torch.log(w.sum(dim=1, keepdim=True))


def _doc_distortion(p: _Prepared, s_best: torch.Tensor) -> torch.Tensor:
    """exp(r_i - r_max) (a_i - s_i), float64 of shape (N,): d(x_i, .) up to exp(r_max) / J."""
    return torch.exp(p.r - p.r_max) * (p.a - s_best.double())


def cluster_sums(p: _Prepared, labels: torch.Tensor, k: int):
    """Per-cluster W-row sums up to exp(R_k): (wk (K, J) kernel dtype, R (K,) float64).

    A sparse (K, N) one-hot with weights exp(r_i - R_k) times V: N x J multiply-adds, no N x J
    temporary (index_add_ of V rows with per-doc scales would need one).
    """
    n = p.n
    rk = torch.full((k,), -math.inf, dtype=torch.float64, device=p.v.device)
    rk = rk.scatter_reduce(0, labels, p.r, reduce="amax")
    wts = torch.exp(p.r - rk[labels]).to(p.v.dtype)                      # (N,) in (0, 1]
    idx = torch.stack([labels, torch.arange(n, device=p.v.device)])      # (2, N)
    onehot = torch.sparse_coo_tensor(idx, wts, (k, n), check_invariants=False)
    return torch.sparse.mm(onehot, p.v), rk


def total_distortion(p: _Prepared, wk64: torch.Tensor, rk: torch.Tensor, log_c64: torch.Tensor) -> float:
    """sum_i d(x_i, f(x_i)) = (1/J)[sum_i W_i.logp_i - sum_k (sum_{i in k} W_i) . log c_k], float64."""
    scale = torch.exp(rk - p.r_max)
    scale = torch.where(torch.isfinite(rk), scale, torch.zeros_like(scale))     # empty clusters
    b = float((scale * (wk64 * log_c64).sum(dim=1)).sum())
    return math.exp(p.r_max) * (p.a_total - b) / p.j


def _init_random(p: _Prepared, k: int, rng: np.random.Generator) -> np.ndarray:
    return rng.choice(p.n, size=k, replace=False)


def _kmeanspp_probs(dmin: np.ndarray, chosen: np.ndarray) -> np.ndarray:
    """Appendix k-means++: offset d so min is 0, p proportional to d^2; chosen docs get 0.

    Falls back to uniform over the unchosen documents when all offsets are 0.
    """
    return _squared_probs(dmin - dmin.min(), chosen)


def _squared_probs(x: np.ndarray, chosen: np.ndarray) -> np.ndarray:
    """p proportional to x^2 with the ``chosen`` docs at 0; uniform over the unchosen when all are 0."""
    prob = x * x
    prob[chosen] = 0.0
    total = prob.sum()
    if not np.isfinite(total) or total <= 0.0:
        prob = np.ones_like(x)
        prob[chosen] = 0.0
        total = prob.sum()
    return prob / total


def _init_kmeanspp(p: _Prepared, k: int, rng: np.random.Generator) -> np.ndarray:
    """Appendix k-means++ (loop over centroids; each step one (N, J) @ (J,) product)."""
    chosen = np.empty(k, dtype=np.int64)
    chosen[0] = rng.integers(p.n)
    dmin = None
    for step in range(1, k + 1):
        row = p.v[int(chosen[step - 1])]
        log_c = log_normalise(row[None, :])[0]                       # (J,)
        d = _doc_distortion(p, p.v @ log_c).cpu().numpy()             # (N,) up to exp(r_max)/J
        dmin = d if dmin is None else np.minimum(dmin, d)
        if step == k:
            break
        chosen[step] = rng.choice(p.n, p=_kmeanspp_probs(dmin, chosen[:step]))
    return chosen


def _seed_distortions(p: _Prepared, idx, scale: torch.Tensor) -> torch.Tensor:
    """d(x_i, normalised W row of each doc in ``idx``) up to exp(r_max)/J, float64 of shape (N, len(idx)).

    ``scale`` = exp(r - r_max), shape (N,).
    """
    log_c = log_normalise(p.v[torch.as_tensor(idx, device=p.v.device)].double()).to(p.v.dtype)   # (L, J)
    s = p.v @ log_c.T                                                                            # (N, L)
    return scale[:, None] * (p.a[:, None] - s.double())


def _greedy_probs(excess: np.ndarray, chosen: np.ndarray) -> np.ndarray:
    """Greedy k-means++ sampling: p proportional to excess^2 (chosen docs get 0); uniform if all are 0."""
    return _squared_probs(np.maximum(excess, 0.0), chosen)


def _init_greedy_kmeanspp(p: _Prepared, k: int, rng: np.random.Generator, n_local: int | None = None) -> np.ndarray:
    """Greedy k-means++ (as scikit-learn's): ``2 + floor(ln k)`` candidates per step, keep the best.

    The first centroid is a uniformly drawn document. At each further step, ``n_local`` candidate
    documents are drawn with probability proportional to ``excess_i^2``, where
    ``excess_i = min_k d(x_i, k) - d(x_i, own)`` is how much document i's distortion to its nearest
    chosen centroid exceeds its distortion to its own normalised W row (the smallest distortion any
    centroid can give it, so every excess is >= 0 and the chosen documents have 0). The candidate
    whose addition lowers the total distortion sum_i min_k d(x_i, k) most is kept. Labels play no
    role; each step is one (N, J) @ (J, n_local) product.
    """
    n_local = n_local or 2 + int(math.log(k))
    chosen = np.empty(k, dtype=np.int64)
    chosen[0] = rng.integers(p.n)
    if k == 1:
        return chosen
    scale = torch.exp(p.r - p.r_max)
    d_self = scale * (p.a - p.s_self)                                                # (N,) own-row minimum
    dmin = _seed_distortions(p, chosen[:1], scale)[:, 0]                             # (N,)
    for step in range(1, k):
        excess = (dmin - d_self).cpu().numpy()
        cand = rng.choice(p.n, size=n_local, p=_greedy_probs(excess, chosen[:step]))   # with replacement
        d = torch.minimum(_seed_distortions(p, cand, scale), dmin[:, None])           # (N, L)
        best = int(torch.argmin(d.sum(dim=0)))
        chosen[step] = cand[best]
        dmin = d[:, best]
    return chosen


_INIT_FNS = {"random": _init_random, "k-means++": _init_kmeanspp, "greedy-k-means++": _init_greedy_kmeanspp}


def _reseed_empty(p: _Prepared, labels: torch.Tensor, s_best: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Move the worst-fitting documents into empty clusters (never emptying their own cluster)."""
    counts = counts.cpu().numpy().copy()
    lab = labels.cpu().numpy().copy()
    order = np.argsort(-_doc_distortion(p, s_best).cpu().numpy(), kind="stable")
    pos = 0
    for k in np.flatnonzero(counts == 0):   # loop over empty clusters; the scan is short
        while counts[lab[order[pos]]] < 2:
            pos += 1
        i = order[pos]
        pos += 1
        counts[lab[i]] -= 1
        lab[i] = k
        counts[k] = 1
    return torch.from_numpy(lab).to(labels.device)


@dataclass
class _Run:
    labels: torch.Tensor
    log_c64: torch.Tensor
    distortion: float
    n_iter: int
    history: list[float]
    converged: bool


def _lloyd(p: _Prepared, init_idx: np.ndarray, max_iter: int, tol: float) -> _Run:
    """Algorithm 1, lines 9-14, from centroids = normalised W rows ``init_idx`` (Eq. init)."""
    idx = torch.as_tensor(init_idx, device=p.v.device)
    return _lloyd_from(p, log_normalise(p.v[idx].double()), max_iter, tol)


def _lloyd_from(p: _Prepared, log_c64: torch.Tensor, max_iter: int, tol: float) -> _Run:
    """The two-step loop from given (K, J) float64 log centroids."""
    k = log_c64.shape[0]
    labels = None
    hist: list[float] = []
    prev = math.inf
    converged = False
    it = 0
    for it in range(1, max_iter + 1):  # noqa: B007 - read after the loop: the number of iterations run
        s = p.v @ log_c64.to(p.v.dtype).T                                 # (N, K) = V @ log c^T
        s_best, new = s.max(dim=1)                                        # argmin_k d = argmax_k V.log c_k
        counts = torch.bincount(new, minlength=k)
        if bool((counts == 0).any()):
            new = _reseed_empty(p, new, s_best, counts)
        unchanged = labels is not None and torch.equal(new, labels)
        labels = new
        wk, rk = cluster_sums(p, labels, k)                              # Eq. optim-centroid
        wk64 = wk.double()
        log_c64 = log_normalise(wk64)
        dist = total_distortion(p, wk64, rk, log_c64)
        hist.append(dist)
        if unchanged or prev - dist < tol * abs(prev):
            converged = True
            break
        prev = dist
    # final assignment: labels consistent with the returned centroids (unless it empties a cluster)
    s = p.v @ log_c64.to(p.v.dtype).T
    s_best, final = s.max(dim=1)
    if int(torch.bincount(final, minlength=k).min()) > 0:
        labels = final
    else:
        s_best = s.gather(1, labels[:, None])[:, 0]
    d = _doc_distortion(p, s_best)
    dist = math.exp(p.r_max) * float(d.sum()) / p.j
    return _Run(labels=labels, log_c64=log_c64, distortion=dist, n_iter=it, history=hist, converged=converged)


def _cluster_terms(w: torch.Tensor, rk: torch.Tensor, r_max: float) -> torch.Tensor:
    """E = exp(R - r_max) sum_j w_j log(w_j / sum w), float64 of shape ``w.shape[:-1]``.

    For the per-cluster sums (wk (K, J), R (K,)): total distortion = e^r_max (a_total - sum_k E_k) / J.
    An empty cluster (R = -inf) has E = 0.
    """
    scale = torch.exp(rk - r_max)
    scale = torch.where(torch.isfinite(rk), scale, torch.zeros_like(scale))
    log_c = torch.log(w.clamp_min(torch.finfo(w.dtype).tiny)) - torch.log(w.sum(dim=-1, keepdim=True))
    return scale * (w * log_c).sum(dim=-1)


def _merge_costs(p: _Prepared, wk64: torch.Tensor, rk: torch.Tensor) -> torch.Tensor:
    """Increase of the total distortion when clusters a and b are merged, float64 (K, K); +inf on the diagonal.

    Merging a and b replaces E_a + E_b by E_{a+b} (their W sums added in a common scale); the
    increase is ``e^r_max / J (E_a + E_b - E_{a+b}) >= 0`` (a generalised Jensen-Shannon divergence),
    with ``E = scale (sum_j w_j log w_j - S log S)``, ``S = sum_j w_j``. Blocks of rows a, each a
    (block, K, J) temporary of at most ``_CHUNK_ELEMS`` elements and three passes over it.
    """
    k, j = wk64.shape
    e = _cluster_terms(wk64, rk, p.r_max)                                   # (K,)
    rk = torch.where(torch.isfinite(rk), rk, torch.full_like(rk, -1e300))   # empty clusters: weight 0, no NaN
    sk = wk64.sum(dim=1)                                                     # (K,)
    cost = torch.full((k, k), math.inf, dtype=torch.float64, device=wk64.device)
    step = max(1, _CHUNK_ELEMS // (k * j))
    for s in range(0, k - 1, step):                                          # blocks of rows a, columns b > s
        e_ = min(k - 1, s + step)
        rb = rk[s + 1:]
        m = torch.maximum(rk[s:e_, None], rb[None, :])                       # (b, K-s-1) common scale
        fa, fb = torch.exp(rk[s:e_, None] - m), torch.exp(rb[None, :] - m)   # (b, K-s-1) each
        wab = torch.addcmul(wk64[None, s + 1:, :] * fb[..., None], wk64[s:e_, None, :], fa[..., None])
        xlx = torch.special.xlogy(wab, wab).sum(dim=-1)                      # (b, K-s-1) sum_j w log w
        sab = fa * sk[s:e_, None] + fb * sk[None, s + 1:]
        e_ab = torch.exp(m - p.r_max) * (xlx - torch.special.xlogy(sab, sab))
        cost[s:e_, s + 1:] = math.exp(p.r_max) / p.j * (e[s:e_, None] + e[None, s + 1:] - e_ab)
    cost = torch.triu(cost, diagonal=1) + torch.tril(torch.full_like(cost, math.inf))
    return torch.minimum(cost, cost.T)


def _pick_per_group(groups: np.ndarray, weights: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """One document per group drawn with probability proportional to ``weights``; (k,) int64, -1 where none.

    Vectorized weighted sampling by exponential races: document i draws ``t_i = E_i / w_i`` with
    ``E_i ~ Exp(1)``, and each group keeps its smallest t (a weight of 0 never wins).
    """
    with np.errstate(divide="ignore"):
        t = rng.standard_exponential(len(groups)) / weights
    order = np.lexsort((t, groups))                                           # by group, then t
    counts = np.bincount(groups, minlength=k)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    pick = np.full(k, -1, dtype=np.int64)
    has = counts > 0
    pick[has] = order[starts[has]]
    pick[has & ~np.isfinite(t[np.maximum(pick, 0)])] = -1                     # all weights 0 in the group
    return pick


def _rowdot(p: _Prepared, log_c: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """``V_i . log_c[idx_i]`` for every document, float64 of shape (N,); row blocks, no N x J temporary."""
    out = torch.empty(p.n, dtype=torch.float64, device=p.v.device)
    lc = log_c.to(p.v.dtype)
    for s, e in _row_blocks(p.n, p.j):
        out[s:e] = (p.v[s:e] * lc[idx[s:e]]).sum(dim=1).double()
    return out


def _split_gains(p: _Prepared, labels: torch.Tensor, k: int, max_iter: int, tol: float,
                 rng: np.random.Generator, n_local: int = 3) -> tuple[np.ndarray, torch.Tensor]:
    """Split every cluster in two at once; the decrease of the total distortion each split gives.

    All K two-way splits run together as one problem with 2K "halves" (half h of cluster c is
    ``c + h K``; a document only ever chooses between the two halves of its own cluster):

    * seeding, greedy k-means++ with two centroids per cluster: a uniformly drawn member, then
      ``n_local`` candidate members drawn with probability proportional to their squared excess
      distortion to the first (by vectorized exponential races), keeping the candidate that lowers
      the cluster's distortion most;
    * the two-step loop: assignment ``argmax_h V_i . log c_{c_i + h K}`` (two row-wise products),
      Eq. optim-centroid on the 2K halves; until no document moves, the relative improvement is
      below ``tol``, or ``max_iter``.

    Returns gains (K,) float64 (``e^r_max / J (E_half0 + E_half1 - E_c)``, 0 for clusters that
    cannot split) and half (N,) int64 in {0, 1}.
    """
    dev = p.v.device
    lab = labels.cpu().numpy()
    n = p.n
    scale = torch.exp(p.r - p.r_max)
    counts = np.bincount(lab, minlength=k)
    first = _pick_per_group(lab, np.ones(n), k, rng)
    seed_rows = torch.as_tensor(np.maximum(first, 0), device=dev)
    lc1 = log_normalise(p.v[seed_rows].double())                            # (K, J)
    d1 = scale * (p.a - _rowdot(p, lc1, labels))                               # (N,) d(x, first seed)
    excess = (d1 - scale * (p.a - p.s_self)).cpu().numpy()                    # minus d(x, own row), >= 0
    w = np.square(np.maximum(excess, 0.0))
    w[first[first >= 0]] = 0.0
    flat = (np.bincount(lab, weights=w, minlength=k) <= 0) & (counts >= 2)    # duplicates: uniform
    w = np.where(flat[lab], 1.0, w)
    w[first[first >= 0]] = 0.0
    # greedy: n_local candidates per cluster, keep the one that lowers the cluster's distortion most
    best_pot = np.full(k, np.inf)
    second = np.maximum(first, 0)                                             # < 2 members: both halves alike
    for _ in range(n_local):
        cand = _pick_per_group(lab, w, k, rng)
        ok = cand >= 0
        lc2 = log_normalise(p.v[torch.as_tensor(np.where(ok, cand, 0), device=dev)].double())
        d2 = scale * (p.a - _rowdot(p, lc2, labels))
        pot = np.bincount(lab, weights=torch.minimum(d1, d2).cpu().numpy(), minlength=k)
        better = ok & (pot < best_pot)
        second = np.where(better, cand, second)
        best_pot = np.where(better, pot, best_pot)
    log_h = log_normalise(p.v[torch.as_tensor(np.concatenate([np.maximum(first, 0), second]), device=dev)]
                           .double())                                        # (2K, J)
    half = None
    prev = math.inf
    wk64 = rk = None
    for _ in range(max_iter):
        new = (_rowdot(p, log_h, labels + k) > _rowdot(p, log_h, labels)).long()
        unchanged = half is not None and torch.equal(new, half)
        half = new
        wk, rk = cluster_sums(p, labels + k * half, 2 * k)
        wk64 = wk.double()
        log_h = torch.where(torch.isfinite(rk)[:, None], log_normalise(wk64), log_h)   # keep an emptied half
        dist = total_distortion(p, wk64, rk, log_h)
        if unchanged or prev - dist < tol * abs(prev):
            break
        prev = dist
    e_half = _cluster_terms(wk64, rk, p.r_max)                                 # (2K,)
    wk1, rk1 = cluster_sums(p, labels, k)
    e_one = _cluster_terms(wk1.double(), rk1, p.r_max)                        # (K,)
    gains = (math.exp(p.r_max) / p.j * (e_half[:k] + e_half[k:] - e_one)).cpu().numpy()
    both = torch.isfinite(rk[:k]) & torch.isfinite(rk[k:])
    gains[~both.cpu().numpy()] = 0.0
    return gains, half


_SM_TRIALS = 3
_SPLIT_INITS = 3


def _split_merge(p: _Prepared, run: _Run, max_moves: int, max_iter: int, tol: float,
                 rng: np.random.Generator, n_trials: int | None = None) -> tuple[_Run, int]:
    """Split/merge moves after the two-step loop (K stays fixed); only distortions decide.

    A candidate move splits cluster c in two (the best of ``_SPLIT_INITS`` draws of
    ``_split_gains``) and merges the pair of other clusters {a, b} whose merge costs least; its
    predicted change is the merge cost minus the split gain. Candidates are the ``n_trials``
    clusters with the largest split gains; those predicted to lower the total distortion (by more
    than ``tol``, relative) are tried in order: the two-step loop restarts from the moved
    partition's centroids, and the first move whose loop ends lower is kept. Moves stop when no
    candidate is kept, or after ``max_moves``. The result is never worse than ``run``. Returns the
    refined run (its history extended by the distortion after each kept move) and the number of
    moves made.
    """
    n_trials = n_trials or _SM_TRIALS
    k = run.log_c64.shape[0]
    moves = 0
    if k < 3:
        return run, moves
    while moves < max_moves:
        labels = run.labels
        with _cpu_threads(p.v.device, 0):   # many small ops: one CPU thread (measured 5-7x faster under load)
            wk, rk = cluster_sums(p, labels, k)
            cost = _merge_costs(p, wk.double(), rk).cpu().numpy()            # (K, K), +inf on the diagonal
            gains, half = _split_gains(p, labels, k, max_iter, tol, rng)      # (K,), (N,)
            for _ in range(_SPLIT_INITS - 1):                                  # best of a few 2-way splits
                g2, h2 = _split_gains(p, labels, k, max_iter, tol, rng)
                better = g2 > gains
                half = torch.where(torch.as_tensor(better, device=half.device)[labels], h2, half)
                gains = np.where(better, g2, gains)
        cands = []
        for c in np.argsort(-gains, kind="stable")[:n_trials]:                # a loop over a few clusters
            if not gains[c] > 0:
                break
            cc = cost.copy()
            cc[c, :] = cc[:, c] = math.inf
            a, b = np.unravel_index(int(np.argmin(cc)), cc.shape)
            cands.append((gains[c] - cc[a, b], int(min(a, b)), int(max(a, b)), int(c)))
        cands.sort(key=lambda t: -t[0])
        kept = None
        for net, a, b, c in cands:
            if not net > tol * abs(run.distortion):
                break
            new = labels.clone()
            new[labels == b] = a
            new[(labels == c) & (half == 1)] = b
            wk, _ = cluster_sums(p, new, k)
            after = _lloyd_from(p, log_normalise(wk.double()), max_iter, tol)
            if run.distortion - after.distortion > tol * abs(run.distortion):
                kept = after
                log.debug("gc split/merge: merged %d+%d, split %d (net %.4g): distortion %.6g -> %.6g", a, b, c,
                          net, run.distortion, after.distortion)
                break
        if kept is None:
            break
        run = _Run(labels=kept.labels, log_c64=kept.log_c64, distortion=kept.distortion,
                   n_iter=run.n_iter + kept.n_iter, history=run.history + [kept.distortion],
                   converged=kept.converged)
        moves += 1
    return run, moves


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


_SMALL_WORK = 1 << 20  # N * J * K below this: one CPU thread (thread wake-ups cost more than the work)


@contextmanager
def _cpu_threads(device, work: int):
    if torch.device(device).type != "cpu" or work >= _SMALL_WORK or torch.get_num_threads() == 1:
        yield
        return
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


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
    if not (0 <= tol < math.inf):
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
    logp = as_2d_float(logp, "logp", min_rows=2)
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
    logp = as_2d_float(logp, "logp", min_rows=2)
    log_w = as_2d_float(log_w, "log_w", min_rows=2)
    check_n_clusters(n_clusters, logp.shape[0])
    _check_fit_params(init, 1, 1, 0.0)
    p = prepare_fit(logp, log_w=log_w, dtype=torch_dtype(dtype))
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    idx = _INIT_FNS[init](p, int(n_clusters), rng)
    return log_normalise(p.v[torch.as_tensor(idx)].double()).numpy(), np.asarray(idx, dtype=np.int64)


# ----------------------------------------------------------------------------------------------
# estimator

class GenerativeClustering:
    """Generative clustering (Algorithm 1), scikit-learn style.

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
        if self.alpha != "auto":
            _check_alpha(self.alpha)
        if self.phi not in _PHIS:
            raise ValueError(f"phi must be one of {_PHIS}; got {self.phi!r}")
        if self.clip_sigma is not None and not (0 < self.clip_sigma < math.inf):
            raise ValueError(f"clip_sigma must be > 0 or None (no clipping); got {self.clip_sigma!r}")
        if not (isinstance(self.ess_target, (int, float, np.floating)) and 0 < self.ess_target < 1):
            raise ValueError(f"ess_target must be in (0, 1) (the mean effective sample size as a fraction of J); "
                             f"got {self.ess_target!r}")
        integer = isinstance(self.seed, (int, np.integer))
        if not (integer and 0 <= self.seed < 2**32 or self.seed is None or isinstance(self.seed, np.random.Generator)):
            raise ValueError(f"seed must be an integer in [0, 2^32) or a numpy Generator; got {self.seed!r}")
        _check_fit_params(self.init, self.n_init, self.max_iter, self.tol)
        _check_split_merge(self.split_merge)

    def fit(self, logp: np.ndarray) -> "GenerativeClustering":
        """Cluster documents from ``logp`` = log P of shape (n_docs, n_queries).

        Clipping, phi and W are streamed in row blocks: besides ``logp`` only one N x J array
        (V, kernel dtype) is held.
        """
        self._check_params()
        logp = as_2d_float(logp, "logp", min_rows=2)
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
            raise RuntimeError("GenerativeClustering is not fitted yet; call fit(logp) first")
        x = as_2d_float(x, name)
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

    def fit_predict(self, logp: np.ndarray) -> np.ndarray:
        return self.fit(logp).labels_


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
