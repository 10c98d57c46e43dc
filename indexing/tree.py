"""The recursive driver shared by every hierarchical indexer (GC, hierarchical k-means, random).

A node with more than ``leaf_size`` (c) documents is split into at most ``n_clusters`` (K)
children by a *splitter*; a node with at most c documents is a leaf and gives its documents
the positions 0..n-1. A document's code is the path of positions from the root, so codes
are unique and prefix-free by construction, and every position is < K (we require c <= K).

The tree is walked level by level (breadth-first). The nodes of one level are independent
and may run in a thread pool; every splitter derives its randomness from the global seed
and the node's path (:func:`node_seed_sequence`), so the result does not depend on the
traversal order or the number of workers.

Degenerate splits. A splitter may return empty clusters (they are dropped and the children
renumbered 0..m-1, keeping positions dense) or fewer than two non-empty clusters (identical
rows, duplicate documents): the node then falls back to a balanced split into
``min(K, max(2, ceil(n / c)))`` contiguous groups of its documents (in row order) and the
fallback is counted. Every split therefore has at least two non-empty children, every child
is strictly smaller than its parent, and the recursion terminates.
"""
from __future__ import annotations

import logging
import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Protocol

import numpy as np
from tqdm.auto import tqdm

from gdr.indexing.options import IndexAtomic, TreeOptions

__all__ = [
    "SplitResult",
    "Splitter",
    "Node",
    "IndexTree",
    "build_tree",
    "densify_labels",
    "balanced_labels",
    "node_seed_sequence",
    "check_prefix_code",
]

log = logging.getLogger(__name__)


def node_seed_sequence(seed: int, path: tuple[int, ...]) -> np.random.SeedSequence:
    """The seed of the node at ``path``: depends only on the global seed and the path."""
    return np.random.SeedSequence(int(seed), spawn_key=tuple(int(p) for p in path))


@dataclass
class SplitResult:
    """What a splitter proposes for one node.

    labels
        Raw cluster labels of shape (n,), any non-negative ints < n_children (the driver
        densifies them or falls back to a balanced split).
    finalize
        Optional ``finalize(labels, kept) -> state``: called once with the final dense labels
        (shape (n,), values 0..m-1) and ``kept`` (shape (m,), the raw cluster id of each child,
        or ``None`` after a fallback); returns the per-node state to keep (e.g. centroids).
    info
        Small diagnostics (distortion, iterations, ...), kept on the node.
    """

    labels: np.ndarray
    finalize: Callable[[np.ndarray, np.ndarray | None], dict | None] | None = None
    info: dict = field(default_factory=dict)


class Splitter(Protocol):
    def __call__(self, rows: np.ndarray, path: tuple[int, ...], n_children: int) -> SplitResult:
        """Cluster the documents ``rows`` (sorted, shape (n,)) of the node at ``path`` into at most ``n_children``."""
        ...


@dataclass
class Node:
    path: tuple[int, ...]
    size: int
    n_children: int = 0  # 0 for a leaf
    fallback: bool = False
    state: dict | None = None  # splitter state (GC: log_phi, columns, log_centroids, typical queries)
    info: dict = field(default_factory=dict)

    @property
    def depth(self) -> int:
        return len(self.path)

    @property
    def is_leaf(self) -> bool:
        return self.n_children == 0


@dataclass
class IndexTree:
    """A built index: per-document codes plus the nodes (breadth-first order)."""

    codes: list[tuple[int, ...]]  # per document, in row order
    nodes: list[Node]
    n_clusters: int
    leaf_size: int
    n_fallback: int = 0
    meta: dict = field(default_factory=dict)  # method-specific (GC: clip bounds, global log phi, options)

    @property
    def depth(self) -> int:
        """Length of the longest code."""
        return max((len(c) for c in self.codes), default=0)

    @property
    def internal_nodes(self) -> list[Node]:
        return [n for n in self.nodes if not n.is_leaf]

    @property
    def leaves(self) -> list[Node]:
        return [n for n in self.nodes if n.is_leaf]


def balanced_labels(n: int, n_children: int, leaf_size: int) -> np.ndarray:
    """Contiguous balanced groups: ``min(n_children, max(2, ceil(n / leaf_size)))`` of them, shape (n,)."""
    m = min(n_children, n, max(2, math.ceil(n / leaf_size)))
    return (np.arange(n, dtype=np.int64) * m) // n


def densify_labels(labels: np.ndarray, n_children: int) -> tuple[np.ndarray, np.ndarray]:
    """Drop empty clusters and renumber: returns (dense labels (n,), kept raw ids (m,))."""
    labels = np.asarray(labels)
    if labels.ndim != 1 or (labels.size and (labels.min() < 0 or labels.max() >= n_children)):
        raise ValueError(f"splitter returned labels outside 0..{n_children - 1}")
    counts = np.bincount(labels.astype(np.int64), minlength=n_children)
    kept = np.flatnonzero(counts)
    remap = np.full(n_children, -1, dtype=np.int64)
    remap[kept] = np.arange(len(kept))
    return remap[labels], kept


def _split_node(splitter: Splitter, rows: np.ndarray, path: tuple[int, ...], n_clusters: int, leaf_size: int):
    n = len(rows)
    k = min(n_clusters, n)
    res = splitter(rows, path, k)
    if len(res.labels) != n:
        raise ValueError(f"splitter returned {len(res.labels)} labels for {n} documents at node {path}")
    labels, kept = densify_labels(res.labels, k)
    fallback = len(kept) < 2
    if fallback:
        labels, kept = balanced_labels(n, k, leaf_size), None
        log.debug("node %s (%d docs): fewer than 2 non-empty clusters, balanced split", path, n)
    state = res.finalize(labels, kept) if res.finalize is not None else None
    return labels, fallback, state, res.info


def build_tree(
    n_docs: int,
    splitter: Splitter,
    n_clusters: int = TreeOptions.n_clusters,
    leaf_size: int = TreeOptions.leaf_size,
    workers: int = TreeOptions.workers,
    progress: bool = True,
    desc: str = "index",
) -> IndexTree:
    """Build a prefix-code tree over documents ``0..n_docs-1`` by recursive splitting.

    Parameters
    ----------
    n_docs
        Number of documents (rows).
    splitter
        ``splitter(rows, path, n_children) -> SplitResult`` (see :class:`Splitter`).
    n_clusters
        K, the maximum number of children of a node (every position is < K).
    leaf_size
        c, the largest node that is not split (requires ``1 <= c <= K``).
    workers
        Threads splitting the nodes of one level concurrently.
    """
    if n_docs < 1:
        raise ValueError("cannot index an empty corpus (0 documents)")
    if n_clusters < 2:
        raise ValueError(f"n_clusters (K) must be >= 2, got {n_clusters}")
    if not 1 <= leaf_size <= n_clusters:
        raise ValueError(
            f"leaf_size (c) = {leaf_size} must be between 1 and n_clusters (K) = {n_clusters}: a leaf's documents "
            "take positions 0..c-1, which must be valid positions < K"
        )
    doc_leaf = np.full(n_docs, -1, dtype=np.int64)  # index into `nodes` of each document's leaf
    doc_pos = np.zeros(n_docs, dtype=np.int64)
    nodes: list[Node] = []
    n_fallback = 0
    frontier: list[tuple[tuple[int, ...], np.ndarray]] = [((), np.arange(n_docs, dtype=np.int64))]
    bar = tqdm(total=n_docs, desc=desc, unit="doc", disable=not progress, dynamic_ncols=True)
    pool = ThreadPoolExecutor(max_workers=workers) if workers > 1 else None
    try:
        while frontier:
            depth = len(frontier[0][0])
            t_level = time.time()
            to_split = [(p, r) for p, r in frontier if len(r) > leaf_size]
            bar.set_postfix(level=depth, nodes=len(frontier), splitting=len(to_split))
            if pool is not None:
                results = iter(pool.map(lambda pr: _split_node(splitter, pr[1], pr[0], n_clusters, leaf_size),
                                        to_split))
            else:
                results = (_split_node(splitter, r, p, n_clusters, leaf_size) for p, r in to_split)
            next_frontier = []
            for path, rows in frontier:
                if len(rows) <= leaf_size:
                    doc_leaf[rows] = len(nodes)
                    doc_pos[rows] = np.arange(len(rows))
                    nodes.append(Node(path=path, size=len(rows)))
                    bar.update(len(rows))
                    continue
                labels, fallback, state, info = next(results)
                m = int(labels.max()) + 1
                n_fallback += fallback
                nodes.append(Node(path=path, size=len(rows), n_children=m, fallback=fallback, state=state, info=info))
                order = np.argsort(labels, kind="stable")  # keeps each child's rows sorted
                bounds = np.concatenate([[0], np.cumsum(np.bincount(labels, minlength=m))])
                for k in range(m):
                    next_frontier.append((path + (k,), rows[order[bounds[k]:bounds[k + 1]]]))
            log.info("level %d: %d nodes (%d split, %d leaves) in %.1f s", depth, len(frontier), len(to_split),
                     len(frontier) - len(to_split), time.time() - t_level)
            frontier = next_frontier
    finally:
        if pool is not None:
            pool.shutdown()
        bar.close()
    leaf_paths = [n.path for n in nodes]
    codes = [leaf_paths[l] + (int(p),) for l, p in zip(doc_leaf.tolist(), doc_pos.tolist())]
    tree = IndexTree(codes=codes, nodes=nodes, n_clusters=n_clusters, leaf_size=leaf_size, n_fallback=n_fallback)
    if n_fallback:
        log.info("%d of %d internal nodes fell back to a balanced split", n_fallback, len(tree.internal_nodes))
    return tree


def check_prefix_code(codes: list[tuple[int, ...]], n_clusters: int | None = None) -> None:
    """Raise ``ValueError`` unless ``codes`` are unique, prefix-free and (if given) every position < K."""
    seen = set(codes)
    if len(seen) != len(codes):
        raise ValueError("codes are not unique")
    for c in codes:
        if not c:
            raise ValueError("empty code")
        if n_clusters is not None and max(c) >= n_clusters:
            raise ValueError(f"code {c} has a position >= K = {n_clusters}")
    for c in codes:
        for i in range(1, len(c)):
            if c[:i] in seen:
                raise ValueError(f"code {c[:i]} is a prefix of {c}")


# Simple splitters ---------------------------------------------------------------------------------------------


@dataclass
class RandomSplitter:
    """Balanced random split: ``min(K, max(2, ceil(n / c)))`` groups of equal size, seeded by node path."""

    leaf_size: int
    seed: int = 0

    def __call__(self, rows: np.ndarray, path: tuple[int, ...], n_children: int) -> SplitResult:
        n = len(rows)
        m = min(n_children, max(2, math.ceil(n / self.leaf_size)))
        rng = np.random.default_rng(node_seed_sequence(self.seed, path))
        return SplitResult(labels=rng.permutation(n) % m)


def random_tree(n_docs: int, n_clusters: int = TreeOptions.n_clusters, leaf_size: int = TreeOptions.leaf_size,
                seed: int = 0, progress: bool = True) -> IndexTree:
    """A balanced random tree with the same K and c as the clustered indexes (a baseline)."""
    return build_tree(n_docs, RandomSplitter(leaf_size, seed), n_clusters, leaf_size, progress=progress,
                      desc="random index")


def atomic_codes(n_docs: int, warn_above: int = IndexAtomic.warn_above) -> IndexTree:
    """Atomic ids: document i gets the single position i (a vocabulary of n_docs tokens; small corpora only)."""
    if n_docs < 1:
        raise ValueError("cannot index an empty corpus (0 documents)")
    if n_docs > warn_above:
        log.warning("atomic ids for %d documents: the decoder needs one output token per document", n_docs)
    codes = [(i,) for i in range(n_docs)]
    return IndexTree(codes=codes, nodes=[Node(path=(), size=n_docs)], n_clusters=n_docs, leaf_size=n_docs)


__all__ += ["RandomSplitter", "random_tree", "atomic_codes"]
