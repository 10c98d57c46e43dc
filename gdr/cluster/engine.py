"""Generative clustering's torch engine: W factorised per row on the device (:func:`prepare_fit`), the seedings
(random, k-means++, greedy k-means++) and the two-step (Lloyd) loop."""
from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch

from gdr.cluster.equations import _row_blocks
from gdr.options import GCFitOptions

# The kernel's version, in the keys of the stages that cluster (gdr run's cluster and GC index stages): bump it
# whenever a change alters the labels a seed gives for the same inputs (e.g. how its float32 products round).
GC_KERNEL = "gdr-gc-2"


def torch_dtype(dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        out = dtype
    else:
        out = {"float32": torch.float32, "float": torch.float32,
               "float64": torch.float64, "double": torch.float64}.get(str(dtype))
    if out not in (torch.float32, torch.float64):
        raise ValueError(f"dtype must be torch.float32 or torch.float64 (or their names); got {dtype!r}")
    return out


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
    ref: torch.Tensor        # (J,) float64, log of V's normalised column sum: a log centroid close to every other
    v_ref: torch.Tensor      # (N,) float64, V_i . ref (V as the kernel holds it, summed in float64)

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
    col = np.zeros(j)
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
        col += vv.sum(axis=0)
        v[s:e].copy_(torch.from_numpy(vv))
    r_max = float(r.max())
    a_total = float(np.dot(np.exp(r - r_max), a))
    ref = torch.from_numpy(np.log(np.maximum(col, np.finfo(np.float64).tiny) / col.sum())).to(device)
    v_ref = torch.empty(n, dtype=torch.float64, device=device)
    for s, e in _row_blocks(n, j):
        v_ref[s:e] = v[s:e].double() @ ref
    return _Prepared(v=v, r=torch.from_numpy(r).to(device), a=torch.from_numpy(a).to(device),
                     r_max=r_max, a_total=a_total, s_self=torch.from_numpy(s_self).to(device), ref=ref, v_ref=v_ref)


def scores(p: _Prepared, log_c64: torch.Tensor) -> torch.Tensor:
    """``V @ log c^T``, float64 of shape (N, L), for (L, J) float64 log centroids.

    The kernel-dtype product takes the centroids' offsets from the common reference ``p.ref`` and ``V . ref`` is
    added back in float64: the differences between centroids, which decide the assignment, keep the kernel's
    relative precision even where a small alpha puts every centroid close to the others (a float32 product of
    ``log c`` itself, of size log J, would round them away).
    """
    return (p.v @ (log_c64 - p.ref).to(p.v.dtype).T).double() + p.v_ref[:, None]


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
        log_c = log_normalise(p.v[int(chosen[step - 1])][None, :].double())      # (1, J)
        d = _doc_distortion(p, scores(p, log_c)[:, 0]).cpu().numpy()             # (N,) up to exp(r_max)/J
        dmin = d if dmin is None else np.minimum(dmin, d)
        if step == k:
            break
        chosen[step] = rng.choice(p.n, p=_kmeanspp_probs(dmin, chosen[:step]))
    return chosen


def _seed_distortions(p: _Prepared, idx, scale: torch.Tensor) -> torch.Tensor:
    """d(x_i, normalised W row of each doc in ``idx``) up to exp(r_max)/J, float64 of shape (N, len(idx)).

    ``scale`` = exp(r - r_max), shape (N,).
    """
    log_c = log_normalise(p.v[torch.as_tensor(idx, device=p.v.device)].double())   # (L, J)
    return scale[:, None] * (p.a[:, None] - scores(p, log_c))


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
    settled: bool = True     # labels are every document's closest centroid (the final assignment emptied no cluster)


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
        s = scores(p, log_c64)                                            # (N, K) = V @ log c^T
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
    s = scores(p, log_c64)
    s_best, final = s.max(dim=1)
    if int(torch.bincount(final, minlength=k).min()) > 0:
        labels = final
    else:
        s_best = s.gather(1, labels[:, None])[:, 0]
    d = _doc_distortion(p, s_best)
    dist = math.exp(p.r_max) * float(d.sum()) / p.j
    return _Run(labels=labels, log_c64=log_c64, distortion=dist, n_iter=it, history=hist, converged=converged,
                settled=bool(torch.equal(labels, final)))



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
