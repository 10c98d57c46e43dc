"""``tree_state.npz``: what `gdr index add` needs to place new documents into a GC tree.

Per internal node (path ``p``, m children ``p+(0,)..p+(m-1,)``): its localized ``log_phi`` (J,),
the resampled ``columns`` (J,) into the first J queries, and ``log_centroids`` (m, J) over those
columns. Per leaf: the number of positions in use. Plus the root's Eq.-clip bounds, the global
log phi, alpha, K, c, J and, in ``meta["queries"]``, what the first J queries are by content (the hash of their
texts, the model that scored them, where they were sampled): new documents must be scored against the same queries.

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
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gdr.indexing.docids import format_code, parse_code
from gdr.indexing.tree import IndexTree

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
    meta: dict = field(default_factory=dict)


def _path_str(p: tuple[int, ...]) -> str:
    return format_code(p)


def _str_path(s: str) -> tuple[int, ...]:
    return parse_code(s) if s else ()


def tree_state_from_tree(tree: IndexTree) -> TreeState:
    """Collect the per-node GC state of a tree built by :func:`gdr.indexing.gc.build_gc_index`."""
    meta = tree.meta
    if meta.get("method") != "gc":
        raise ValueError("tree_state is kept for GC trees only (the `add` descent needs GC centroids)")
    nodes = {n.path: NodeState(log_phi=n.state["log_phi"], columns=n.state["columns"],
                               log_centroids=n.state["log_centroids"]) for n in tree.internal_nodes}
    leaves = {n.path: n.size for n in tree.leaves}
    return TreeState(n_clusters=tree.n_clusters, leaf_size=tree.leaf_size, n_queries=int(meta["n_queries"]),
                     alpha=float(meta["options"]["alpha"]), clip_upper=meta["clip_upper"], log_phi=meta["log_phi"],
                     nodes=nodes, leaves=leaves,
                     meta={"options": meta["options"], "seed": meta.get("seed"),
                           **({"queries": meta["queries"]} if meta.get("queries") else {})})


def _write_npy_member(zf: zipfile.ZipFile, name: str, arr: np.ndarray) -> None:
    with zf.open(f"{name}.npy", "w", force_zip64=True) as f:
        np.lib.format.write_array(f, np.asanyarray(arr), allow_pickle=False)


def _write_stacked_member(zf: zipfile.ZipFile, name: str, parts, n_rows: int, n_cols: int, dtype) -> None:
    """Write ``np.concatenate(parts)`` (shape (n_rows, n_cols)) as one ``.npy`` member, part by part.

    The stacked array is never built: each part is converted (if needed) and written on its own.
    """
    dtype = np.dtype(dtype)
    with zf.open(f"{name}.npy", "w", force_zip64=True) as f:
        np.lib.format.write_array_header_1_0(f, {"descr": np.lib.format.dtype_to_descr(dtype),
                                                  "fortran_order": False, "shape": (n_rows, n_cols)})
        written = 0
        for part in parts:
            part = np.ascontiguousarray(part, dtype=dtype)
            if part.ndim == 1:
                part = part[None]
            if part.shape[1:] != (n_cols,):
                raise ValueError(f"tree_state {name}: a part of shape {part.shape} does not have {n_cols} columns")
            f.write(memoryview(part).cast("B"))
            written += len(part)
        if written != n_rows:
            raise ValueError(f"tree_state {name}: wrote {written} rows, expected {n_rows}")


def save_tree_state(path: str | os.PathLike, st: TreeState) -> Path:
    """Write ``st`` atomically (temp file + rename), node by node.

    The per-node arrays are streamed into the ``.npz`` (an uncompressed zip of ``.npy`` members, as
    ``np.savez`` writes it), so writing never holds a second, stacked copy of the state in memory.
    """
    path = Path(path)
    order = sorted(st.nodes, key=lambda p: (len(p), p))
    J = st.n_queries
    sizes = np.array([st.nodes[p].n_children for p in order], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    leaf_order = sorted(st.leaves, key=lambda p: (len(p), p))
    meta = {"version": STATE_VERSION, "n_clusters": st.n_clusters, "leaf_size": st.leaf_size, "n_queries": J,
            "alpha": st.alpha, **st.meta}
    small = dict(
        node_paths=np.array([_path_str(p) for p in order], dtype=str),
        centroid_offsets=offsets,
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
        with zipfile.ZipFile(tmp, mode="w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
            _write_npy_member(zf, "node_paths", small.pop("node_paths"))
            _write_stacked_member(zf, "node_log_phi", (st.nodes[p].log_phi for p in order), len(order), J,
                                  np.float32)
            _write_stacked_member(zf, "node_columns", (st.nodes[p].columns for p in order), len(order), J,
                                  np.int32)
            _write_npy_member(zf, "centroid_offsets", small.pop("centroid_offsets"))
            _write_stacked_member(zf, "centroids", (st.nodes[p].log_centroids for p in order), int(offsets[-1]), J,
                                  np.float32)
            for name, arr in small.items():
                _write_npy_member(zf, name, arr)
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
        log_phi, columns = z["node_log_phi"], z["node_columns"]
        nodes = {}
        for i, s in enumerate(z["node_paths"].tolist()):
            nodes[_str_path(s)] = NodeState(log_phi=log_phi[i], columns=columns[i],
                                            log_centroids=cents[offs[i]:offs[i + 1]])  # views, no copies
        leaves = {_str_path(s): int(c) for s, c in zip(z["leaf_paths"].tolist(), z["leaf_counts"].tolist())}
        clip = z["clip_upper"]
        st = TreeState(
            n_clusters=int(meta.pop("n_clusters")), leaf_size=int(meta.pop("leaf_size")),
            n_queries=int(meta.pop("n_queries")), alpha=float(meta.pop("alpha")),
            clip_upper=clip if clip.size else None, log_phi=z["log_phi"], nodes=nodes, leaves=leaves,
            meta=meta)
    meta.pop("version", None)
    return st
