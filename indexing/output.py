"""Write a built index: ``docids.tsv``, ``tree.json``, ``tree_state.npz`` (GC), ``summary.*``.

``tree.json``::

    {"method": "gc", "n_docs": N, "n_clusters": K, "leaf_size": c, "depth": D, "n_fallback": F,
     "nodes": [  # breadth-first
        {"path": "", "depth": 0, "size": N, "children": 30, "fallback": false,
         "typical_queries": [[5 query texts] per child],            # GC, when query texts are known
         "columns": [...], "log_centroids": [[...] per child]},      # GC, nodes of depth <= centroid_json_depth
        {"path": "12-3", "depth": 2, "size": 17, "children": 0},    # a leaf: positions 0..16
     ...]}

Full-precision centroids of every node are in ``tree_state.npz`` (see :mod:`gdr.indexing.state`);
``tree.json`` keeps them (rounded to 4 decimals) only near the root because all of them would
take about a gigabyte of JSON at the paper's scale.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Sequence

import numpy as np

from gdr.cluster import describe_clusters
from gdr.indexing.docids import format_code, write_docids
from gdr.indexing.options import IndexGC
from gdr.indexing.state import save_tree_state, tree_state_from_tree
from gdr.indexing.summary import summarize, write_summary
from gdr.indexing.tree import IndexTree, check_prefix_code
from gdr.io import atomic_write_json

__all__ = ["node_records", "write_index"]

log = logging.getLogger(__name__)


def node_records(tree: IndexTree, query_texts: Sequence[str] | None = None, top_queries: int = IndexGC.top_queries,
                 centroid_json_depth: int = IndexGC.centroid_json_depth) -> list[dict]:
    """One JSON-able record per node (breadth-first), as stored in ``tree.json``."""
    out = []
    for n in tree.nodes:
        rec = {"path": format_code(n.path), "depth": n.depth, "size": n.size, "children": n.n_children}
        if n.n_children:
            rec["fallback"] = bool(n.fallback)
            if n.info:
                rec["info"] = {k: (round(v, 6) if isinstance(v, float) else v) for k, v in n.info.items()}
        st = n.state or {}
        if "log_centroids" in st:
            cols = np.asarray(st["columns"])
            log_c = np.asarray(st["log_centroids"], dtype=np.float64)
            if query_texts is not None and top_queries > 0:
                texts = [query_texts[j] for j in cols.tolist()]
                rec["typical_queries"] = [[q for q, _ in child]
                                          for child in describe_clusters(log_c, texts, top=top_queries)]
            if n.depth <= centroid_json_depth:
                rec["columns"] = cols.tolist()
                rec["log_centroids"] = np.round(log_c, 4).tolist()
        out.append(rec)
    return out


def write_index(
    out_dir: str | os.PathLike,
    tree: IndexTree,
    doc_ids: Sequence[str],
    *,
    method: str,
    query_texts: Sequence[str] | None = None,
    top_queries: int = IndexGC.top_queries,
    centroid_json_depth: int = IndexGC.centroid_json_depth,
    plot: bool = True,
) -> dict:
    """Write every artifact of an index to ``out_dir``; returns the summary dict."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if len(doc_ids) != len(tree.codes):
        raise ValueError(f"{len(doc_ids)} doc ids but {len(tree.codes)} codes")
    if method != "atomic":
        check_prefix_code(tree.codes, tree.n_clusters)
    write_docids(out_dir / "docids.tsv", doc_ids, tree.codes)
    records = node_records(tree, query_texts, top_queries, centroid_json_depth)
    atomic_write_json(out_dir / "tree.json", {
        "method": method, "n_docs": len(doc_ids), "n_clusters": tree.n_clusters, "leaf_size": tree.leaf_size,
        "depth": tree.depth, "n_fallback": tree.n_fallback, "nodes": records})
    if tree.meta.get("method") == "gc":
        save_tree_state(out_dir / "tree_state.npz", tree_state_from_tree(tree))
    summary = summarize(tree.codes, records, tree.n_clusters, tree.leaf_size, method=method)
    write_summary(out_dir, summary, plot=plot)
    log.info("wrote %s index of %d documents (depth %d, %d fallbacks) to %s", method, len(doc_ids), tree.depth,
             tree.n_fallback, out_dir)
    return summary
