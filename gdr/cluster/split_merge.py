"""Split/merge moves after the two-step loop: merge the pair of clusters whose union raises the total distortion
least, split the cluster whose split lowers it most, keep the move when the distortion ends lower."""
from __future__ import annotations

import logging
import math

import numpy as np
import torch

from gdr.cluster.engine import _cpu_threads, _lloyd_from, _Prepared, _Run, cluster_sums, log_normalise, total_distortion
from gdr.cluster.equations import _CHUNK_ELEMS, _row_blocks

log = logging.getLogger(__name__)


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
    """``V_i . log_c[idx_i]`` for every document, float64 of shape (N,); row blocks, no N x J temporary. As
    :func:`gdr.cluster.engine.scores`, the kernel-dtype product takes the offsets from ``p.ref``, and ``V . ref``
    is added in float64."""
    out = torch.empty(p.n, dtype=torch.float64, device=p.v.device)
    lc = (log_c.double() - p.ref).to(p.v.dtype)
    for s, e in _row_blocks(p.n, p.j):
        out[s:e] = (p.v[s:e] * lc[idx[s:e]]).sum(dim=1).double() + p.v_ref[s:e]
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
                   converged=kept.converged, settled=kept.settled)
        moves += 1
    return run, moves
