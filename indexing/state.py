"""``tree_state.npz``: what `gdr index add` needs to place new documents into a GC tree.

Per internal node (path ``p``, m children ``p+(0,)..p+(m-1,)``): its localized ``log_phi`` (J,),
the resampled ``columns`` (J,) into the first J queries, and ``log_centroids`` (m, J) over those
columns. Per leaf: the number of positions in use. Plus the root's Eq.-clip bounds, the global
log phi, alpha, K, c, J and a hash of the J query ids (new documents must be scored against
the same queries).

Layout (plain arrays, no pickles): ``node_paths`` (M,) str, ``node_log_phi`` (M, J) float32,
``node_columns`` (M, J) int32, ``centroid_offsets`` (M+1,) int64 into ``centroids``
(sum m, J) float32, ``leaf_paths`` (L,) str, ``leaf_counts`` (L,) int64, ``clip_upper`` (J,) or
(0,), ``log_phi`` (J,) float64, ``meta`` (a JSON string). Paths are codes like ``12-3``
(the root is ``""``).
"""
from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from indexing.docids import format_code, parse_code
from indexing.tree import IndexTree

__all__ = ["NodeState", "TreeState", "tree_state_from_tree", "save_tree_state", "load_tree_state"]

STATE_VERSION = 1


@dataclass
class NodeState:
    log_phi: np.ndarray        # (J,) float32, localized proposal of the node
    columns: np.ndarray        # (J,) int32, resampled columns
    log_centroids: np.ndarray  # (m, J) float32, one row per child

    @property
    def n_children(self) -> int:
        return len(self.log_centroids)


@dataclass
class TreeState:
    n_clusters: int
    leaf_size: int
    n_queries: int
    alpha: float
    clip_upper: np.ndarray | None  # (J,) float64
    log_phi: np.ndarray            # (J,) float64, global
    nodes: dict[tuple[int, ...], NodeState]
    leaves: dict[tuple[int, ...], int]  # path -> positions in use
    query_hash: str = ""
    meta: dict = field(default_factory=dict)


def _path_str(p: tuple[int, ...]) -> str:
    return format_code(p)


def _str_path(s: str) -> tuple[int, ...]:
    return parse_code(s) if s else ()


def tree_state_from_tree(tree: IndexTree, query_hash: str = "") -> TreeState:
    """Collect the per-node GC state of a tree built by :func:`indexing.gc.build_gc_index`."""
    meta = tree.meta
    if meta.get("method") != "gc":
        raise ValueError("tree_state is kept for GC trees only (the `add` descent needs GC centroids)")
    nodes = {n.path: NodeState(log_phi=n.state["log_phi"], columns=n.state["columns"],
                               log_centroids=n.state["log_centroids"]) for n in tree.internal_nodes}
    leaves = {n.path: n.size for n in tree.leaves}
    return TreeState(n_clusters=tree.n_clusters, leaf_size=tree.leaf_size, n_queries=int(meta["n_queries"]),
                     alpha=float(meta["options"]["alpha"]), clip_upper=meta["clip_upper"], log_phi=meta["log_phi"],
                     nodes=nodes, leaves=leaves, query_hash=query_hash,
                     meta={"options": meta["options"], "seed": meta.get("seed")})


def save_tree_state(path: str | os.PathLike, st: TreeState) -> Path:
    """Write ``st`` atomically (temp file + rename)."""
    path = Path(path)
    order = sorted(st.nodes, key=lambda p: (len(p), p))
    J = st.n_queries
    cents = [st.nodes[p].log_centroids for p in order]
    offsets = np.concatenate([[0], np.cumsum([len(c) for c in cents])]).astype(np.int64)
    leaf_order = sorted(st.leaves, key=lambda p: (len(p), p))
    meta = {"version": STATE_VERSION, "n_clusters": st.n_clusters, "leaf_size": st.leaf_size, "n_queries": J,
            "alpha": st.alpha, "query_hash": st.query_hash, **st.meta}
    arrays = dict(
        node_paths=np.array([_path_str(p) for p in order], dtype=str),
        node_log_phi=np.stack([st.nodes[p].log_phi for p in order]).astype(np.float32) if order
        else np.zeros((0, J), np.float32),
        node_columns=np.stack([st.nodes[p].columns for p in order]).astype(np.int32) if order
        else np.zeros((0, J), np.int32),
        centroid_offsets=offsets,
        centroids=np.concatenate(cents).astype(np.float32) if cents else np.zeros((0, J), np.float32),
        leaf_paths=np.array([_path_str(p) for p in leaf_order], dtype=str),
        leaf_counts=np.array([st.leaves[p] for p in leaf_order], dtype=np.int64),
        clip_upper=np.zeros(0) if st.clip_upper is None else np.asarray(st.clip_upper, np.float64),
        log_phi=np.asarray(st.log_phi, np.float64),
        meta=np.array(json.dumps(meta, default=str)),
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp.npz")
    os.close(fd)
    try:
        np.savez(tmp, **arrays)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def load_tree_state(path: str | os.PathLike) -> TreeState:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: `gdr index add` needs an index built with method=gc")
    with np.load(path, allow_pickle=False) as z:
        meta = json.loads(str(z["meta"]))
        if meta.get("version") != STATE_VERSION:
            raise ValueError(f"{path}: tree_state version {meta.get('version')} (expected {STATE_VERSION}); "
                             "rebuild the index with this gdr")
        offs = z["centroid_offsets"]
        cents = z["centroids"]
        nodes = {}
        for i, s in enumerate(z["node_paths"].tolist()):
            nodes[_str_path(s)] = NodeState(log_phi=z["node_log_phi"][i], columns=z["node_columns"][i],
                                            log_centroids=cents[offs[i]:offs[i + 1]].copy())
        leaves = {_str_path(s): int(c) for s, c in zip(z["leaf_paths"].tolist(), z["leaf_counts"].tolist())}
        clip = z["clip_upper"]
        st = TreeState(
            n_clusters=int(meta.pop("n_clusters")), leaf_size=int(meta.pop("leaf_size")),
            n_queries=int(meta.pop("n_queries")), alpha=float(meta.pop("alpha")),
            clip_upper=clip if clip.size else None, log_phi=z["log_phi"], nodes=nodes, leaves=leaves,
            query_hash=str(meta.pop("query_hash", "")), meta=meta)
    meta.pop("version", None)
    return st
