"""Index summary: depth histogram, leaf sizes, balance, fallbacks (``summary.txt/.json/.png``)."""
from __future__ import annotations

import logging
import os
from collections import Counter
from pathlib import Path
from typing import Sequence

import numpy as np
from matplotlib.figure import Figure

from gdr.io import atomic_write_json, atomic_write_text

__all__ = ["summarize", "format_summary", "write_summary"]

log = logging.getLogger(__name__)


def _norm_entropy(sizes: np.ndarray) -> float:
    """Entropy of the child-size distribution over log(m): 1 = perfectly balanced."""
    if len(sizes) < 2:
        return 1.0
    p = sizes / sizes.sum()
    p = p[p > 0]
    return float(-(p * np.log(p)).sum() / np.log(len(sizes)))


def summarize(codes: Sequence[Sequence[int]], nodes: Sequence[dict], n_clusters: int, leaf_size: int,
              method: str = "") -> dict:
    """Statistics of an index.

    Parameters
    ----------
    codes
        One code per document.
    nodes
        Node records as in ``tree.json``: ``path`` (str), ``size``, ``children`` (0 for a leaf),
        optional ``fallback``.
    """
    lengths = np.array([len(c) for c in codes], dtype=np.int64)
    leaves = [n for n in nodes if not n.get("children")]
    internal = [n for n in nodes if n.get("children")]
    leaf_sizes = np.array([n["size"] for n in leaves], dtype=np.int64)
    by_path = {n["path"]: n for n in nodes}
    balance, largest, balance_root = [], [], 1.0
    for n in internal:
        sizes = np.array([by_path[(n["path"] + "-" if n["path"] else "") + str(k)]["size"]
                          for k in range(n["children"])], dtype=np.float64)
        balance.append(_norm_entropy(sizes))
        largest.append(float(sizes.max() / sizes.sum()))
        if n["path"] == "":
            balance_root = balance[-1]
    root = by_path.get("")
    n_fallback = sum(bool(n.get("fallback")) for n in internal)
    return {
        "method": method,
        "n_docs": int(len(codes)),
        "n_clusters": int(n_clusters),
        "leaf_size": int(leaf_size),
        "depth_max": int(lengths.max()) if len(lengths) else 0,
        "depth_mean": float(lengths.mean()) if len(lengths) else 0.0,
        "depth_hist": {int(k): int(v) for k, v in sorted(Counter(lengths.tolist()).items())},
        "n_internal": len(internal),
        "n_leaves": len(leaves),
        "leaf_size_min": int(leaf_sizes.min()) if len(leaf_sizes) else 0,
        "leaf_size_mean": float(leaf_sizes.mean()) if len(leaf_sizes) else 0.0,
        "leaf_size_median": float(np.median(leaf_sizes)) if len(leaf_sizes) else 0.0,
        "leaf_size_max": int(leaf_sizes.max()) if len(leaf_sizes) else 0,
        "leaves_over_c": int((leaf_sizes > leaf_size).sum()),  # only gdr index add grows a leaf past c (up to K)
        "leaf_size_hist": {int(k): int(v) for k, v in sorted(Counter(leaf_sizes.tolist()).items())},
        "branching_mean": float(np.mean([n["children"] for n in internal])) if internal else 0.0,
        "root_children": int(root["children"]) if root and root.get("children") else 0,
        "balance_root": float(balance_root),
        "balance_mean": float(np.mean(balance)) if balance else 1.0,
        "largest_child_frac_mean": float(np.mean(largest)) if largest else 0.0,
        "n_fallback": int(n_fallback),
        "fallback_frac": float(n_fallback / len(internal)) if internal else 0.0,
        "max_position": int(max((max(c) for c in codes), default=0)),
    }


def format_summary(s: dict) -> str:
    lines = [
        f"index {s['method']}: {s['n_docs']} documents, K = {s['n_clusters']}, c = {s['leaf_size']}",
        f"depth: max {s['depth_max']}, mean {s['depth_mean']:.3f}; code lengths "
        + ", ".join(f"{k}: {v}" for k, v in s["depth_hist"].items()),
        f"nodes: {s['n_internal']} internal (mean {s['branching_mean']:.2f} children, root {s['root_children']}), "
        f"{s['n_leaves']} leaves",
        f"leaf sizes: min {s['leaf_size_min']}, median {s['leaf_size_median']:g}, mean {s['leaf_size_mean']:.2f}, "
        f"max {s['leaf_size_max']}" + (f"; {s['leaves_over_c']} leaves hold more than c (grown by gdr index add, up "
                                        "to K)" if s.get("leaves_over_c") else ""),
        f"balance (normalised entropy of child sizes, 1 = even): root {s['balance_root']:.3f}, "
        f"mean {s['balance_mean']:.3f}; largest child holds {100 * s['largest_child_frac_mean']:.1f}% on average",
        f"fallback balanced splits: {s['n_fallback']} ({100 * s['fallback_frac']:.2f}% of internal nodes)",
        f"largest position: {s['max_position']}",
    ]
    return "\n".join(lines) + "\n"


def write_summary(out_dir: str | os.PathLike, s: dict, plot: bool = True) -> None:
    """``summary.json``, ``summary.txt`` and (``plot``) ``summary.png`` in ``out_dir``."""
    out_dir = Path(out_dir)
    atomic_write_json(out_dir / "summary.json", s)
    atomic_write_text(out_dir / "summary.txt", format_summary(s))
    if not plot:
        return

    # a Figure of its own, not pyplot's: pyplot's figures are process-wide state, and an index may be built in a
    # thread beside others that plot (gdr.stages.overlap)
    fig = Figure(figsize=(10, 3.6))
    a, b = fig.subplots(1, 2)
    dh = s["depth_hist"]
    a.bar(list(map(int, dh)), list(dh.values()), color="C0")
    a.set_xlabel("code length (positions)")
    a.set_ylabel("documents")
    a.set_xticks(list(map(int, dh)))
    a.set_title("depth histogram")
    lh = s["leaf_size_hist"]
    b.bar(list(map(int, lh)), list(lh.values()), color="C1")
    b.set_xlabel("documents per leaf")
    b.set_ylabel("leaves")
    b.set_title(f"leaf sizes (c = {s['leaf_size']})")
    fig.suptitle(f"{s['method']} index: {s['n_docs']} docs, K = {s['n_clusters']}, fallbacks = {s['n_fallback']}")
    fig.tight_layout()
    tmp = out_dir / ".summary.png.tmp.png"
    fig.savefig(tmp, dpi=110)
    os.replace(tmp, out_dir / "summary.png")
