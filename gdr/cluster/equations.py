"""Generative clustering's equations in numpy (reference-exact, float64, streamed over row blocks): the input
checks, Eq. clip, Eq. vmp, the weights, alpha by effective sample size, Eq. ris and Eq. optim-centroid."""
from __future__ import annotations

import logging
import math

import numpy as np
import torch

from gdr.options import GCFitOptions

log = logging.getLogger(__name__)


_CHUNK_ELEMS = 1 << 21  # elements per row block in the streamed passes (16 MB of float64)
# the lowest log-probability taken: a query of 10^8 tokens at -100 nats each; what is below is a stand-in for -inf
LOGP_FLOOR = -1e10
INITS = ("random", "k-means++", "greedy-k-means++")
_PHIS = ("power", "naive")


# ----------------------------------------------------------------------------------------------
# validation (public edge only; kernels assume valid input)

def as_2d_float(x, name: str, min_rows: int = 1, min_cols: int = 1) -> np.ndarray:
    """``x`` as a float32/float64 ndarray of shape (n, J); clear errors otherwise."""
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        x = (x.float() if x.dtype == torch.bfloat16 else x).numpy()  # numpy has no bfloat16
    if hasattr(x, "tocsr"):  # a scipy.sparse matrix: np.asarray would make a 0-d object array of it
        raise ValueError(f"{name} is a sparse matrix; pass a dense array of log-probabilities ({name}.toarray())")
    try:
        x = np.asarray(x)
    except ValueError as e:  # rows of unequal length
        raise ValueError(f"{name} must be a 2-D array of shape (n_docs, n_queries), every row as long: {e}") from None
    if x.dtype == object:  # e.g. pandas' nullable Float64 columns: numbers unless a value is not one
        try:
            x = x.astype(np.float64)
        except (TypeError, ValueError):
            raise ValueError(f"{name} holds values that are not numbers (a missing value such as pd.NA, or text); "
                             "fill or drop them: log-probabilities are finite numbers") from None
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
    if x.shape[1] < min_cols:  # one query: every centroid is the same point, any partition as good as another
        raise ValueError(f"{name} has a single column (query); clustering needs at least {min_cols} queries, each "
                         "document's log-probability of every one")
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


def check_log_probabilities(x: np.ndarray, name: str, tol: float = 1e-3) -> None:
    """Refuse a matrix that cannot be log-probabilities: a value above 0 (``tol`` allows a scorer's rounding), or
    no value below 0, as probabilities in [0, 1] given where their logarithms are expected would be."""
    hi, lo = float(x.max()), float(x.min())
    if lo < LOGP_FLOOR:
        i, j = np.unravel_index(int(np.argmin(x)), x.shape)
        raise ValueError(f"{name}[{i}, {j}] = {lo:g}: no model scores a query below {LOGP_FLOOR:g} nats, and "
                         f"values this large overflow the clip bounds (np.nan_to_num writes -1.8e308 for -inf); "
                         f"floor -inf at a finite value, e.g. np.maximum({name}, -1e4)")
    if lo >= 0:
        raise ValueError(f"{name} has no value below 0 (all in [{lo:g}, {hi:g}]): it looks like probabilities; "
                         f"{name} holds log-probabilities log p(query | doc): pass np.log({name})")
    if hi > tol:
        i, j = np.unravel_index(int(np.argmax(x)), x.shape)
        raise ValueError(f"{name}[{i}, {j}] = {hi:g} > 0: {name} holds log-probabilities log p(query | doc), which "
                         f"are <= 0; pass np.log of probabilities, or scores as log-probabilities")


def check_n_clusters(n_clusters: int, n_docs: int) -> None:
    if not isinstance(n_clusters, (int, np.integer)) or isinstance(n_clusters, bool) or n_clusters < 1:
        raise ValueError(f"n_clusters must be a positive integer; got {n_clusters!r}")
    if n_clusters > n_docs:
        raise ValueError(f"n_clusters={n_clusters} is larger than the number of documents ({n_docs}); "
                         "use at most one cluster per document")


def _check_alpha(alpha: float) -> None:
    if not (_is_number(alpha) and math.isfinite(alpha) and alpha >= 0):
        raise ValueError(f"alpha must be a finite number >= 0 (the paper uses 0.25); got {alpha!r}")


def _is_number(v) -> bool:
    """A real number given as one (not a bool, not a string)."""
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))


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
