"""Hierarchical generative clustering (the paper's Algorithm 2) as a splitter of :mod:`gdr.indexing.tree`.

At a node with documents D~ (rows of the root log P, of shape (n_docs, J)):

1. read the node's rows (float32) and clip them with the *root's* Eq.-clip bounds
   ``mu_j + n_sigma sigma_j`` (computed once over all documents, before the global phi, as
   Algorithm 1 does; clipping is never recomputed on a subset);
2. localized proposal (Appendix, "Localized proposal"): ``log phi~ = log_proposal(rows)``
   (Eq. vmp on D~ only); the root uses the global phi, which is the same estimator on D;
3. bootstrap (Eq. resampling): draw J column indices with replacement with probabilities
   proportional to ``r_j = (phi~_j / phi_j)^alpha`` (phi = global); ``P~ = P[:, idx]`` and
   ``log W~ = alpha (log P~ - log phi~[idx])``; P is never recomputed. The root does not
   resample by default (it runs Algorithm 1; ``bootstrap_root=True`` resamples it uniformly);
4. ``fit_generative(P~, W~, K)`` from :mod:`gdr.cluster` (by default greedy k-means++ seeding, the
   best of ``n_init`` runs by total distortion, then split/merge moves; ``init="random"`` is Eq. init).

Exact duplicates. Rows identical on the node's columns are clustered once, with their
multiplicity folded into the weights (``log W += log m``: the distortion of a row scales by m,
so argmins are unchanged and centroid sums are those of the full data). Without this, a node
of many identical documents would be peeled K-1 documents per level by the kernel's
empty-cluster re-seeding. A node with a single distinct row falls back to a balanced split.

Memory. A node whose working set (about ``6 * 4 * n * J`` bytes) exceeds ``memory_mb`` is not
loaded: ``fit_generative`` runs on a uniform row sample of the node that fits the budget, and
its centroids are then refined by full-data two-step iterations (assignment with
``distortion_matrix``, Eq. optim-centroid as streamed log-sums) that read ``chunk_rows`` rows at a
time, until the total distortion improves by less than ``tol`` (relative) or ``refine_max_iter``
passes. At the paper's scale (138k x 4096) this is the root only.

Randomness: each node's generator is ``SeedSequence(seed, spawn_key=path)`` (column resampling,
row sample, and the seed of ``fit_generative``), so ids do not depend on traversal order.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass, fields, replace

import numpy as np
import torch
from scipy.special import logsumexp
from tqdm.auto import tqdm

from gdr.cluster import (
    auto_alpha,
    centroid_update,
    clip_bounds_unchecked,
    distortion_matrix,
    fit_generative,
    log_proposal,
    log_weights,
)
from gdr.indexing.options import GCOptions, TreeOptions
from gdr.indexing.tree import IndexTree, SplitResult, build_tree, node_seed_sequence
from gdr.store.rows import PMatrix

__all__ = [
    "GCOptions",
    "RootStats",
    "root_statistics",
    "resampling_log_probs",
    "bootstrap_columns",
    "row_groups",
    "GCSplitter",
    "build_gc_index",
    "partition_distortion",
]

log = logging.getLogger(__name__)

# Bytes per element of a node's (n, J) block in the in-memory path: the float32 rows, the
# resampled rows, log W, the temporary of log_weights, and the kernel's V (float32 each), plus slack.
_BYTES_PER_ELEM = 24


@dataclass
class RootStats:
    """Statistics of the whole (root) P: Eq.-clip bounds (J,) or None, and the global log phi (J,)."""

    clip_upper: np.ndarray | None
    log_phi: np.ndarray


def _proposal_power(alpha: float, proposal: str) -> float:
    """The exponent p of the power mean of Eq. vmp (1 for the naive mean of P)."""
    return 1.0 if proposal == "naive" else 2.0 * alpha


def _combine_proposals(parts: list[tuple[int, np.ndarray]], p: float) -> np.ndarray:
    """Combine per-chunk ``log_proposal`` results (n_c, log phi_c) into that of all rows, exactly."""
    n = np.array([c for c, _ in parts], dtype=np.float64)
    lp = np.stack([x for _, x in parts])                                   # (chunks, J)
    if p == 0.0:                                                          # geometric mean
        return (n[:, None] * lp).sum(0) / n.sum()
    return (logsumexp(p * lp + np.log(n)[:, None], axis=0) - math.log(n.sum())) / p


def _chunked_proposal(pm: PMatrix, rows: np.ndarray | None, clip_upper: np.ndarray | None, alpha: float,
                      proposal: str, chunk_rows: int, desc: str = "phi", progress: bool = False) -> np.ndarray:
    parts = []
    n = pm.n_rows if rows is None else len(rows)
    for _, x in tqdm(pm.iter_rows(rows, chunk_rows), total=math.ceil(n / chunk_rows), desc=desc, unit="chunk",
                     disable=not progress, leave=False):
        if clip_upper is not None:
            np.minimum(x, clip_upper.astype(np.float32), out=x)
        parts.append((len(x), log_proposal(x, alpha, proposal)))
    return _combine_proposals(parts, _proposal_power(alpha, proposal))


def _resolve_auto_alpha(pm: PMatrix, options: GCOptions, seed: int, max_rows: int = 20_000) -> GCOptions:
    """``alpha="auto"`` made a number once, on (a seeded sample of) the clipped root P."""
    n = pm.n_rows
    rows = np.arange(n) if n <= max_rows else np.sort(np.random.default_rng(seed).choice(n, max_rows, replace=False))
    x = pm.read_rows(rows).astype(np.float32)
    upper = None if options.clip_sigma is None else clip_bounds_unchecked(x, float(options.clip_sigma))
    alpha = auto_alpha(x, options.ess_target, options.proposal, upper)
    log.info("gc.alpha=auto: %.4g (mean ESS %.0f%% of J at the root)", alpha, 100 * options.ess_target)
    return replace(options, alpha=alpha)


def root_statistics(pm: PMatrix, *, clip_sigma: float | None = GCOptions.clip_sigma, alpha: float = GCOptions.alpha,
                    proposal: str = GCOptions.proposal, chunk_rows: int = GCOptions.chunk_rows,
                    progress: bool = True) -> RootStats:
    """Eq.-clip bounds and the global phi (Eq. vmp on clipped P), streamed over row chunks.

    Also validates P: every entry finite (an error names the document row and query column).
    """
    n, J = pm.shape
    upper = None
    if clip_sigma is not None:
        # Chan et al.'s pairwise update of (count, mean, M2) per column, in float64
        cnt, mean, m2 = 0, np.zeros(J), np.zeros(J)
        for off, x in tqdm(pm.iter_rows(None, chunk_rows), total=math.ceil(n / chunk_rows), desc="clip bounds",
                           unit="chunk", disable=not progress, leave=False):
            _check_block(x, off, pm)
            b = len(x)
            mb = x.mean(axis=0, dtype=np.float64)
            dev = x - mb.astype(np.float32)
            m2b = np.einsum("ij,ij->j", dev, dev, dtype=np.float64)
            delta = mb - mean
            tot = cnt + b
            mean = mean + delta * (b / tot)
            m2 = m2 + m2b + delta**2 * (cnt * b / tot)
            cnt = tot
        upper = mean + clip_sigma * np.sqrt(m2 / cnt)
    else:
        for off, x in pm.iter_rows(None, chunk_rows):
            _check_block(x, off, pm)
    log_phi = _chunked_proposal(pm, None, upper, alpha, proposal, chunk_rows, desc="global phi", progress=progress)
    return RootStats(clip_upper=upper, log_phi=log_phi)


def _check_block(x: np.ndarray, off: int, pm: PMatrix) -> None:
    if not np.isfinite(x.sum(dtype=np.float64)):
        bad = np.argwhere(~np.isfinite(x))
        if len(bad):
            i, j = (int(v) for v in bad[0])
            raise ValueError(
                f"{pm.path or 'log P'}: entry [{off + i}, {j}] (document row {off + i}, query column {j}) is "
                f"{x[i, j]}; log-probabilities must be finite: re-score that pair or floor it, e.g. at -1e4")
    if x.size and float(x.max()) > 1e-3:
        log.warning("%s: positive entries (max %.3g near row %d): P.npy should hold log p(query | doc) <= 0",
                    pm.path or "log P", float(x.max()), off)


def resampling_log_probs(log_phi_local: np.ndarray, log_phi_global: np.ndarray, alpha: float) -> np.ndarray:
    """Eq. resampling: log of r_j / sum r, with r_j = (phi~_j / phi_j)^alpha; float64 of shape (J,)."""
    lr = alpha * (np.asarray(log_phi_local, np.float64) - np.asarray(log_phi_global, np.float64))
    return lr - logsumexp(lr)


def bootstrap_columns(log_r: np.ndarray, n_samples: int, rng: np.random.Generator) -> np.ndarray:
    """Draw ``n_samples`` column indices with replacement, P(j) = exp(log_r_j); sorted int64."""
    p = np.exp(log_r - log_r.max())
    idx = rng.choice(len(p), size=n_samples, replace=True, p=p / p.sum())
    idx.sort()
    return idx


_HASH_COEF = np.random.default_rng(0x5EED).integers(1, 2**63, size=1 << 16, dtype=np.uint64) | np.uint64(1)


def row_groups(x: np.ndarray, block_rows: int = 1024) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Identical rows of ``x`` (float32, C-contiguous, shape (n, J)).

    Returns ``first`` (u,) index of the first row of each distinct row, ``inverse`` (n,) group of
    each row, ``counts`` (u,). Rows are grouped by a hash of their bit patterns (a polynomial hash
    mod 2^64, one coefficient per column, vectorized over blocks), and every row is then compared
    with its group's first row: distinct rows whose hashes collide are never merged (an exact
    grouping by the rows' bytes is taken instead).
    """
    n, J = x.shape
    coef = _HASH_COEF[:J] if J <= len(_HASH_COEF) else _hash_coefficients(J)
    h = np.empty(n, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for a in range(0, n, block_rows):
            bits = np.ascontiguousarray(x[a:a + block_rows]).view(np.uint32).astype(np.uint64)
            bits *= coef
            h[a:a + block_rows] = bits.sum(axis=1, dtype=np.uint64)
    _, first, inverse, counts = np.unique(h, return_index=True, return_inverse=True, return_counts=True)
    inverse = inverse.reshape(-1)
    if len(first) < n and not _same_as_first(x, first, inverse, block_rows):
        rows = np.ascontiguousarray(x).view(np.dtype((np.void, x.dtype.itemsize * J))).reshape(-1)
        _, first, inverse, counts = np.unique(rows, return_index=True, return_inverse=True, return_counts=True)
        inverse = inverse.reshape(-1)
    # np.unique orders groups by hash (or bytes); renumber them by first occurrence (deterministic, row order)
    order = np.argsort(first, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    return first[order], rank[inverse], counts[order]


def _hash_coefficients(n_cols: int) -> np.ndarray:
    """Odd 64-bit coefficients, one per column, for rows wider than :data:`_HASH_COEF`."""
    return np.random.default_rng(0x5EED).integers(1, 2**63, size=n_cols, dtype=np.uint64) | np.uint64(1)


def _same_as_first(x: np.ndarray, first: np.ndarray, inverse: np.ndarray, block_rows: int) -> bool:
    """Whether every row of ``x`` equals (bit for bit) the first row of its hash group."""
    bits = x.view(np.uint32) if x.flags.c_contiguous else np.ascontiguousarray(x).view(np.uint32)
    return all(np.array_equal(bits[a:a + block_rows], bits[first[inverse[a:a + block_rows]]])
               for a in range(0, len(x), block_rows))


@dataclass
class _Fit:
    labels: np.ndarray       # (n,) raw labels
    log_c: np.ndarray        # (k, J) float64
    info: dict


class GCSplitter:
    """Splitter of :func:`gdr.indexing.tree.build_tree` running Algorithm 2 at each node.

    Parameters
    ----------
    pmatrix
        The root log P (rows = all documents; its ``n_cols`` = J in use).
    stats
        :func:`root_statistics` of ``pmatrix`` (clip bounds, global phi).
    options
        :class:`GCOptions`.
    seed
        Global seed; each node derives its own from it and its path.
    """

    def __init__(self, pmatrix: PMatrix, stats: RootStats, options: GCOptions, seed: int = 0,
                 progress: bool = False):
        options.validate()
        self.pm = pmatrix
        self.stats = stats
        self.opt = options
        self.seed = int(seed)
        self.progress = progress
        self._clip32 = None if stats.clip_upper is None else stats.clip_upper.astype(np.float32)

    # -- helpers -------------------------------------------------------------------------------
    def _read(self, rows: np.ndarray | slice) -> np.ndarray:
        x = self.pm.read_rows(rows)
        if self._clip32 is not None:
            np.minimum(x, self._clip32, out=x)
        return x

    def _rngs(self, path: tuple[int, ...]):
        fit_ss, col_ss, sub_ss = node_seed_sequence(self.seed, path).spawn(3)
        return int(fit_ss.generate_state(1)[0]), np.random.default_rng(col_ss), np.random.default_rng(sub_ss)

    def _columns(self, log_phi: np.ndarray, path: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
        J = self.pm.n_cols
        if not self.opt.bootstrap or (not path and not self.opt.bootstrap_root):
            return np.arange(J)
        return bootstrap_columns(resampling_log_probs(log_phi, self.stats.log_phi, self.opt.alpha), J, rng)

    def _fit(self, xs: np.ndarray, log_w: np.ndarray, k: int, n_init: int, seed: int) -> _Fit:
        """fit_generative on the distinct rows of (xs, log_w), multiplicities folded into log W."""
        n = len(xs)
        if self.opt.dedupe:
            first, inverse, counts = row_groups(xs)
        else:
            first, inverse, counts = np.arange(n), np.arange(n), np.ones(n, dtype=np.int64)
        u = len(first)
        if u < 2:  # nothing to cluster: the driver falls back to a balanced split
            return _Fit(labels=np.zeros(n, dtype=np.int64), log_c=np.zeros((1, xs.shape[1])),
                        info={"n_distinct": u})
        if u < n:
            xs_u = xs[first]
            lw_u = log_w[first] + np.log(counts).astype(log_w.dtype)[:, None]
        else:
            xs_u, lw_u = xs, log_w
        res = fit_generative(xs_u, lw_u, min(k, u), init=self.opt.init, n_init=n_init, max_iter=self.opt.max_iter,
                             tol=self.opt.tol, seed=seed, device=self.opt.device, split_merge=self.opt.split_merge)
        info = {"distortion": float(res.distortion), "n_iter": int(res.n_iter), "converged": bool(res.converged),
                "n_distinct": u}
        if res.distortion_before_moves is not None:
            info["split_merge_moves"] = int(res.n_moves)
        return _Fit(labels=np.asarray(res.labels, dtype=np.int64)[inverse], log_c=np.asarray(res.log_centroids),
                    info=info)

    @staticmethod
    def _state(log_phi, cols, log_c) -> dict:
        return {"log_phi": np.asarray(log_phi, np.float32), "columns": np.asarray(cols, np.int32),
                "log_centroids": np.asarray(log_c, np.float32)}

    # -- the splitter ---------------------------------------------------------------------------
    def __call__(self, rows: np.ndarray, path: tuple[int, ...], n_children: int) -> SplitResult:
        n, J = len(rows), self.pm.n_cols
        if n * J * _BYTES_PER_ELEM <= self.opt.memory_mb * 2**20:
            return self._split_in_memory(rows, path, n_children)
        return self._split_streamed(rows, path, n_children)

    def _split_in_memory(self, rows: np.ndarray, path: tuple[int, ...], k: int) -> SplitResult:
        fit_seed, col_rng, _ = self._rngs(path)
        x = self._read(rows)                                                     # (n, J) float32
        if path and self.opt.localized:
            log_phi = log_proposal(x, self.opt.alpha, self.opt.proposal)          # Eq. vmp on D~
        else:
            log_phi = self.stats.log_phi
        cols = self._columns(log_phi, path, col_rng)                            # (J,)
        xs = x if _is_identity(cols) else x[:, cols]                              # P~ (n, J)
        del x
        log_w = log_weights(xs, log_phi[cols], self.opt.alpha)                  # log W~ (n, J)
        fit = self._fit(xs, log_w, k, self.opt.n_init if not path else self.opt.n_init_inner, fit_seed)

        def finalize(labels: np.ndarray, kept: np.ndarray | None) -> dict:
            log_c = fit.log_c[kept] if kept is not None else centroid_update(log_w, labels, int(labels.max()) + 1)
            return self._state(log_phi, cols, log_c)

        return SplitResult(labels=fit.labels, finalize=finalize, info=fit.info)

    def _split_streamed(self, rows: np.ndarray, path: tuple[int, ...], k: int) -> SplitResult:
        opt, J = self.opt, self.pm.n_cols
        n = len(rows)
        fit_seed, col_rng, sub_rng = self._rngs(path)
        if path and opt.localized:
            log_phi = _chunked_proposal(self.pm, rows, self.stats.clip_upper, opt.alpha, opt.proposal,
                                        opt.chunk_rows, desc=f"phi~ {path}", progress=self.progress)
        else:
            log_phi = self.stats.log_phi
        cols = self._columns(log_phi, path, col_rng)
        lphi = log_phi[cols]
        # 1. fit_generative on a row sample that fits the budget
        m = int(min(n, max(2 * k, opt.memory_mb * 2**20 // (J * _BYTES_PER_ELEM))))
        sample = np.sort(sub_rng.choice(n, size=m, replace=False))
        log.info("node %s: %d docs x %d queries exceed gc.memory_mb=%g; fitting on %d sampled rows, then "
                 "refining on all rows in chunks of %d", path or "root", n, J, opt.memory_mb, m, opt.chunk_rows)
        xs = self._read(rows[sample])
        if not _is_identity(cols):
            xs = xs[:, cols]                                                     # P~ of the sample (m, J)
        fit = self._fit(xs, log_weights(xs, lphi, opt.alpha), k, opt.n_init if not path else opt.n_init_inner,
                        fit_seed)
        del xs
        info = {"fit_rows": m, **fit.info, "streamed": True}
        if fit.info["n_distinct"] < 2:
            labels = np.zeros(n, dtype=np.int64)
            info["refine_passes"] = 0
        else:
            # 2. full-data two-step iterations, streamed
            log_c = fit.log_c
            prev = math.inf
            bar = tqdm(range(opt.refine_max_iter), desc=f"refine {path or 'root'}", unit="pass",
                       disable=not self.progress, leave=False)
            labels, total, acc, passes = None, math.inf, None, 0
            for passes in range(1, opt.refine_max_iter + 1):
                labels, total, acc = self._pass(rows, cols, lphi, log_c=log_c)
                bar.update(1)
                bar.set_postfix(distortion=f"{total:.6g}")
                if prev - total < opt.tol * abs(prev) or passes == opt.refine_max_iter:
                    break  # labels are those of log_c: keep both
                with np.errstate(invalid="ignore"):
                    new = acc - logsumexp(acc, axis=1, keepdims=True)       # Eq. optim-centroid
                empty = ~np.isfinite(acc).any(axis=1)
                new[empty] = log_c[empty]                                    # keep an emptied centroid
                log_c, prev = new, total
            bar.close()
            if labels is None:                                               # refine_max_iter = 0
                labels, total, _ = self._pass(rows, cols, lphi, log_c=log_c)
            fit = _Fit(labels=labels, log_c=log_c, info=fit.info)
            info.update(distortion=float(total), refine_passes=passes)

        def finalize(final: np.ndarray, kept: np.ndarray | None) -> dict:
            if kept is not None:
                log_c = fit.log_c[kept]
            else:
                _, _, acc = self._pass(rows, cols, lphi, labels=final)
                log_c = acc - logsumexp(acc, axis=1, keepdims=True)
            return self._state(log_phi, cols, log_c)

        return SplitResult(labels=labels, finalize=finalize, info=info)

    def _pass(self, rows: np.ndarray, cols: np.ndarray, lphi: np.ndarray, *, log_c: np.ndarray | None = None,
              labels: np.ndarray | None = None):
        """One streamed pass: assign with ``log_c`` (or take ``labels``); per-cluster log sums of W rows.

        With both ``log_c`` and ``labels``, the labels are kept and the total distortion is that of
        ``labels`` under ``log_c``. Returns labels (n,), total distortion (0 without ``log_c``), and
        ``acc`` (k, J) float64 with
        ``acc[k, j] = log sum_{i in k} W~_ij`` (-inf for an empty cluster). Per chunk, the sums are
        one (k, b) @ (b, J) product of row-scaled weights with ``V = exp(log W~ - row max)`` in (0, 1].
        """
        n = len(rows)
        k = len(log_c) if log_c is not None else int(labels.max()) + 1
        out = np.empty(n, dtype=np.int64) if labels is None else labels
        acc = np.full((k, len(cols)), -np.inf)
        total = 0.0
        identity = _is_identity(cols)
        for off, x in self.pm.iter_rows(rows, self.opt.chunk_rows):
            b = len(x)
            if self._clip32 is not None:
                np.minimum(x, self._clip32, out=x)
            xs = x if identity else x[:, cols]                                   # (b, J)
            del x
            lw = log_weights(xs, lphi, self.opt.alpha)                          # (b, J) float32
            if log_c is not None:
                d = distortion_matrix(xs, lw, log_c)                             # (b, k) float64
                lab = d.argmin(axis=1) if labels is None else labels[off:off + b]
                total += float(d[np.arange(b), lab].sum())
                if labels is None:
                    out[off:off + b] = lab
                del d
            else:
                lab = labels[off:off + b]
            del xs
            r = lw.max(axis=1).astype(np.float64)                               # (b,)
            lw -= r.astype(np.float32)[:, None]
            v = np.exp(lw, out=lw)                                               # V (b, J) in (0, 1]
            rk = np.full(k, -np.inf)
            np.maximum.at(rk, lab, r)                                            # (k,) largest r per cluster
            onehot = np.zeros((k, b), dtype=np.float32)
            onehot[lab, np.arange(b)] = np.exp(r - rk[lab])                      # weights in (0, 1]
            with np.errstate(divide="ignore"):
                part = np.log((onehot @ v).astype(np.float64)) + rk[:, None]     # (k, J) log sums of the chunk
            np.logaddexp(acc, part, out=acc)
        return out, total, acc


def partition_distortion(pmatrix: PMatrix, tree: IndexTree, labels: np.ndarray,
                         options: GCOptions | None = None) -> float:
    """Total distortion at the root of ``tree`` of a given partition of all documents (e.g. planted labels).

    Uses the root's clip bounds, global phi and columns (as stored in ``tree``) and the partition's
    own centroids (Eq. optim-centroid), in two streamed passes of ``chunk_rows`` rows, so it is
    directly comparable with the root's fitted ``info["distortion"]``. Labels are not used by the
    fit; this is for benchmarks and diagnostics.
    """
    options = options or GCOptions(**{k: v for k, v in tree.meta["options"].items()
                                      if k in GCOptions.__dataclass_fields__})
    labels = np.asarray(labels, dtype=np.int64)
    stats = RootStats(clip_upper=tree.meta["clip_upper"], log_phi=np.asarray(tree.meta["log_phi"]))
    sp = GCSplitter(pmatrix, stats, options, seed=int(tree.meta.get("seed") or 0))
    root = tree.nodes[0]
    cols = np.asarray(root.state["columns"]) if root.state else np.arange(pmatrix.n_cols)
    lphi = stats.log_phi[cols]
    rows = np.arange(pmatrix.n_rows)
    _, _, acc = sp._pass(rows, cols, lphi, labels=labels)
    with np.errstate(invalid="ignore"):
        log_c = acc - logsumexp(acc, axis=1, keepdims=True)                  # Eq. optim-centroid
    _, total, _ = sp._pass(rows, cols, lphi, log_c=log_c, labels=labels)
    return float(total)


def _is_identity(cols: np.ndarray) -> bool:
    return len(cols) > 0 and bool(np.array_equal(cols, np.arange(len(cols))))


def build_gc_index(
    pmatrix: PMatrix,
    *,
    n_clusters: int = TreeOptions.n_clusters,
    leaf_size: int = TreeOptions.leaf_size,
    options: GCOptions | None = None,
    seed: int = 0,
    workers: int = TreeOptions.workers,
    stats: RootStats | None = None,
    progress: bool = True,
) -> IndexTree:
    """GC indexing (Algorithm 2, recursive): prefix codes for the rows of ``pmatrix``.

    Parameters
    ----------
    pmatrix
        log P of shape (n_docs, J) (:class:`gdr.store.rows.PMatrix`; may be a file larger than memory).
    n_clusters, leaf_size
        K and c (30 and 30 as in NCI).
    options
        :class:`GCOptions` (alpha, clipping, localized phi, bootstrap, inits, memory budget).
    seed
        Global seed: same seed, same ids (independent of ``workers``).
    stats
        Precomputed :func:`root_statistics` (computed here if None).

    Returns
    -------
    IndexTree whose internal nodes carry ``state`` = {log_phi (J,), columns (J,), log_centroids (m, J)}
    and whose ``meta`` holds the root ``clip_upper`` and ``log_phi`` plus the options.
    """
    options = options or GCOptions()
    options.validate()
    if options.alpha == "auto":
        options = _resolve_auto_alpha(pmatrix, options, seed)
        stats = None  # the global phi depends on alpha
    if stats is None:
        stats = root_statistics(pmatrix, clip_sigma=options.clip_sigma, alpha=options.alpha,
                                proposal=options.proposal, chunk_rows=options.chunk_rows, progress=progress)
    splitter = GCSplitter(pmatrix, stats, options, seed=seed, progress=progress)
    prev_threads = torch.get_num_threads()
    if options.torch_threads:
        torch.set_num_threads(int(options.torch_threads))
    try:
        tree = build_tree(pmatrix.n_rows, splitter, n_clusters, leaf_size, workers=workers, progress=progress,
                          desc="gc index")
    finally:
        torch.set_num_threads(prev_threads)
    # the kernel's own options: a settings section that is a GCOptions (index.gc) holds more keys
    kernel = {f.name: getattr(options, f.name) for f in fields(GCOptions)}
    tree.meta.update(method="gc", clip_upper=stats.clip_upper, log_phi=stats.log_phi, options=kernel,
                     seed=seed, n_queries=pmatrix.n_cols)
    return tree
