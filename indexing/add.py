"""`gdr index add`'s kernel: place new documents into an existing GC tree without re-clustering (the stage that
reads the index and the P folder and writes the grown index is :mod:`gdr.stages.index_add`).

A new document (its row of log P over the *same* J queries) is clipped with the root's Eq.-clip
bounds and descends the tree: at each internal node it goes to the child whose stored
centroid has the smallest GC distortion
``d(x, k) = (1/J) sum_j W~_xj (log P~_xj - log c_kj)`` with ``W~ = (P~ / phi~)^alpha`` on that
node's resampled columns and localized phi~ (exactly what clustering at that node used).
At a leaf with n positions in use it takes position n, so the code stays prefix-free (a leaf's
documents end in distinct final positions, and nothing is below a leaf).

Full leaves. Positions must stay < K, so a leaf holds at most K documents (the clustering
limit c only bounds leaves it built). We never change an existing code (a trained retriever
depends on them) and never split a leaf. A document whose closest leaf is full stays under its
closest path: the deepest node of that path with m < K children opens a new leaf child m (its
centroid = the document's own normalised W row, Eq. init), and the document gets code
``path + (m, 0)``. Only where every node of that path has K children does the descent turn
capacity-aware: at each node the children are ranked by distortion and the best one *with room*
is taken (a leaf with < K documents, or an internal node with room below it), a new leaf opened
where none has. Only if the whole tree is full is it an error. Documents whose greedy
leaf has room (the usual case) are placed in batches; only overflowing ones take the
per-document path.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np
from scipy.special import logsumexp

from gdr.cluster import distortion_matrix, log_weights
from gdr.indexing.docids import format_code
from gdr.indexing.options import GCOptions
from gdr.indexing.state import NodeState, TreeState
from gdr.store import PMatrix

__all__ = ["AddResult", "place_documents"]


@dataclass
class AddResult:
    doc_ids: list[str]
    codes: list[tuple[int, ...]]
    n_new_leaves: int      # leaves opened because the preferred ones were full
    n_redirected: int      # documents that did not go to their greedy (best) leaf


def _node_weights(x: np.ndarray, st: NodeState, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    xs = x[:, st.columns]                                              # P~ (b, J)
    return xs, log_weights(xs, st.log_phi[st.columns], alpha)          # log W~ (b, J)


def _node_distortion(x: np.ndarray, st: NodeState, alpha: float) -> np.ndarray:
    """d(x, k) at a node for clipped rows ``x`` (b, J): float64 of shape (b, m)."""
    xs, lw = _node_weights(x, st, alpha)
    return distortion_matrix(xs, lw, st.log_centroids)


class _Placer:
    def __init__(self, st: TreeState):
        self.st = st
        self.K = st.n_clusters
        self.full: set[tuple[int, ...]] = set()  # subtrees known to be full (they only fill up)
        self.n_new_leaves = 0

    def has_room(self, path: tuple[int, ...]) -> bool:
        if path in self.full:
            return False
        st = self.st
        if path in st.leaves:
            room = st.leaves[path] < self.K
        else:
            node = st.nodes[path]
            room = node.n_children < self.K or any(self.has_room(path + (k,)) for k in range(node.n_children))
        if not room:
            self.full.add(path)
        return room

    def take(self, leaf: tuple[int, ...]) -> tuple[int, ...]:
        pos = self.st.leaves[leaf]
        self.st.leaves[leaf] = pos + 1
        return leaf + (pos,)

    def open_leaf(self, x: np.ndarray, path: tuple[int, ...]) -> tuple[int, ...]:
        """A new leaf child of internal node ``path`` (< K children), its centroid ``x``'s normalised W row."""
        node = self.st.nodes[path]
        _, lw = _node_weights(x, node, self.st.alpha)
        c = lw[0].astype(np.float64)
        node.log_centroids = np.vstack([node.log_centroids, (c - logsumexp(c))[None].astype(np.float32)])
        child = path + (node.n_children - 1,)
        self.st.leaves[child] = 0
        self.n_new_leaves += 1
        return child

    def place_one(self, x: np.ndarray) -> tuple[int, ...]:
        """One clipped row ``x`` (1, J) whose closest leaf is full: a new leaf under the deepest node of its closest
        path that has room for a child, else the capacity-aware descent."""
        st, path = self.st, ()
        if path in st.leaves:
            if not self.has_room(path):
                raise ValueError(f"the index is full: its root is a leaf with K = {self.K} documents and existing "
                                 "codes never change; rebuild the index over all documents")
            return self.take(path)
        closest = [path]
        while closest[-1] in st.nodes:  # the greedy path, root to leaf
            node = st.nodes[closest[-1]]
            closest.append(closest[-1] + (int(_node_distortion(x, node, st.alpha)[0].argmin()),))
        if self.has_room(closest[-1]):
            return self.take(closest[-1])
        opener = next((q for q in reversed(closest[:-1]) if st.nodes[q].n_children < self.K), None)
        if opener is not None:
            return self.take(self.open_leaf(x, opener))
        while True:
            node = st.nodes[path]
            order = np.argsort(_node_distortion(x, node, st.alpha)[0], kind="stable")
            child = next((path + (int(k),) for k in order if self.has_room(path + (int(k),))), None)
            if child is None:
                if node.n_children >= self.K:
                    raise ValueError(f"the index is full below node {format_code(path) or 'root'} (every leaf "
                                     f"holds K = {self.K} documents); rebuild the index over all documents")
                child = self.open_leaf(x, path)
            if child in st.leaves:
                return self.take(child)
            path = child


def place_documents(st: TreeState, pmatrix: PMatrix, *,
                    chunk_rows: int = GCOptions.chunk_rows) -> tuple[list[tuple[int, ...]], dict]:
    """Codes for the rows of ``pmatrix`` (new documents x the same J queries); updates ``st`` in place."""
    if pmatrix.n_cols != st.n_queries:
        raise ValueError(f"the index was built on J = {st.n_queries} queries but the new P matrix has "
                         f"{pmatrix.n_cols} columns in use")
    placer = _Placer(st)
    clip = None if st.clip_upper is None else np.asarray(st.clip_upper).astype(np.float32)
    codes: list[tuple[int, ...]] = []
    n_redirected = 0
    for _, x in pmatrix.iter_rows(None, chunk_rows):                    # chunks in order: deterministic ids
        if clip is not None:
            np.minimum(x, clip, out=x)
        n = len(x)
        greedy: dict[tuple[int, ...], list[np.ndarray]] = defaultdict(list)
        if () in st.leaves:
            greedy[()].append(np.arange(n))
        frontier = {(): np.arange(n)} if () in st.nodes else {}
        while frontier:                                                 # level by level, vectorized per node
            nxt: dict[tuple[int, ...], list[np.ndarray]] = defaultdict(list)
            for path, idx in frontier.items():
                best = _node_distortion(x[idx], st.nodes[path], st.alpha).argmin(axis=1)
                for k in np.unique(best):
                    child = path + (int(k),)
                    (nxt if child in st.nodes else greedy)[child].append(idx[best == k])
            frontier = {p: np.sort(np.concatenate(v)) for p, v in nxt.items()}
        chunk_codes: list[tuple[int, ...] | None] = [None] * n
        overflow = []
        for leaf in sorted(greedy, key=lambda p: (len(p), p)):
            idx = np.sort(np.concatenate(greedy[leaf]))
            free = max(st.n_clusters - st.leaves[leaf], 0)
            for i in idx[:free].tolist():
                chunk_codes[i] = placer.take(leaf)
            overflow.extend(idx[free:].tolist())
        for i in sorted(overflow):                                     # rare: per-document, capacity-aware
            chunk_codes[i] = placer.place_one(x[i:i + 1])
        n_redirected += len(overflow)
        codes.extend(chunk_codes)  # type: ignore[arg-type]
    return codes, {"n_new_leaves": placer.n_new_leaves, "n_redirected": n_redirected}
