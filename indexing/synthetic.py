"""Synthetic log P with a planted two-level hierarchy (for tests and ``gdr.bench.indexing``).

Documents belong to a top cluster t and a sub cluster s within it; each query j has its own
(t_j, s_j) (as if sampled from a document of that cluster). Then

    log p(y_j | x_i) = base_j + b_i + A [t_i = t_j] + B [t_i = t_j and s_i = s_j] + noise_ij,

with ``base_j`` a query-length term, ``b_i`` a document offset, and, for the one document each
query was "generated from", an outlier bonus (what Eq. clip removes). Rows are produced in
fixed blocks from per-block seeds, so the file and the in-memory version agree bit for bit.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["PlantedHierarchy", "planted_hierarchy", "planted_logp", "write_planted_npy"]

_BLOCK = 2048


@dataclass
class PlantedHierarchy:
    top: np.ndarray        # (n_docs,) top cluster of each document
    sub: np.ndarray        # (n_docs,) sub cluster (0..n_sub-1 within its top cluster)
    q_top: np.ndarray      # (n_queries,)
    q_sub: np.ndarray      # (n_queries,)
    q_source: np.ndarray   # (n_queries,) document each query came from
    base: np.ndarray       # (n_queries,) float64
    doc_offset: np.ndarray  # (n_docs,) float64
    top_signal: float
    sub_signal: float
    noise: float
    outlier: float
    seed: int

    @property
    def n_docs(self) -> int:
        return len(self.top)

    @property
    def n_queries(self) -> int:
        return len(self.q_top)

    def block(self, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` of log P, float32 of shape (stop - start, n_queries)."""
        rng = np.random.default_rng([self.seed, 1, start])
        t, s = self.top[start:stop, None], self.sub[start:stop, None]
        same_top = t == self.q_top[None, :]                                  # (b, J) bool
        x = rng.standard_normal((stop - start, self.n_queries), dtype=np.float32)
        x *= self.noise
        x += self.base[None, :].astype(np.float32)
        x += self.doc_offset[start:stop, None].astype(np.float32)
        np.add(x, np.float32(self.top_signal), out=x, where=same_top)
        same_top &= s == self.q_sub[None, :]
        np.add(x, np.float32(self.sub_signal), out=x, where=same_top)
        src = np.flatnonzero((self.q_source >= start) & (self.q_source < stop))
        x[self.q_source[src] - start, src] += self.outlier
        np.minimum(x, -0.01, out=x)  # log-probabilities are negative
        return x


def planted_hierarchy(n_docs: int, n_queries: int, n_top: int = 30, n_sub: int = 30, *, top_signal: float = 6.0,
                      sub_signal: float = 4.0, noise: float = 1.5, outlier: float = 15.0,
                      seed: int = 0) -> PlantedHierarchy:
    """Draw a planted hierarchy: clusters of (roughly) equal expected size, queries from random documents."""
    rng = np.random.default_rng([seed, 0])
    top = rng.integers(n_top, size=n_docs)
    sub = rng.integers(n_sub, size=n_docs)
    q_source = rng.integers(n_docs, size=n_queries)
    return PlantedHierarchy(
        top=top, sub=sub, q_top=top[q_source], q_sub=sub[q_source], q_source=q_source,
        base=-rng.uniform(15.0, 45.0, size=n_queries), doc_offset=rng.normal(0.0, 1.0, size=n_docs),
        top_signal=top_signal, sub_signal=sub_signal, noise=noise, outlier=outlier, seed=seed)


def planted_logp(h: PlantedHierarchy, dtype=np.float32) -> np.ndarray:
    """The whole log P in memory, of shape (n_docs, n_queries)."""
    out = np.empty((h.n_docs, h.n_queries), dtype=dtype)
    for a in range(0, h.n_docs, _BLOCK):
        b = min(a + _BLOCK, h.n_docs)
        out[a:b] = h.block(a, b)
    return out


def write_planted_npy(path: str | os.PathLike, h: PlantedHierarchy, dtype=np.float16) -> Path:
    """Write log P to a ``.npy`` file block by block (never the whole matrix in memory)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    header = {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False,
              "shape": (h.n_docs, h.n_queries)}
    with open(path, "wb") as f:
        np.lib.format.write_array_header_2_0(f, header)
        for a in range(0, h.n_docs, _BLOCK):
            b = min(a + _BLOCK, h.n_docs)
            f.write(h.block(a, b).astype(dtype).tobytes())
    return path
