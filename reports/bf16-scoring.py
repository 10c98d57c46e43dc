"""bf16 vs fp32 scoring of the same queries (reports/bf16-scoring.md): P differences, per-document Spearman,
GC ARI (from each folder's `gdr cluster` metrics.json) and GC docids (from each `gdr index` folder).

    python reports/bf16-scoring.py runs/bf16-eval/fp32 runs/bf16-eval/bf16 \
        runs/bf16-eval/fp32-index runs/bf16-eval/bf16-index
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr

from gdr.eval.clustering import ari
from gdr.indexing.docids import read_docids
from gdr.store import load_run


def _p(folder: str) -> tuple[np.ndarray, dict]:
    """P (n_docs, J) as float64 and its manifest; a partial P's unscored rows are NaN."""
    try:
        run = load_run(folder)
        return np.asarray(run.logp, np.float64), run.manifest
    except RuntimeError:  # partial: scored rows only (unscored rows are still the file's zeros)
        p = np.load(Path(folder) / "P.npy").astype(np.float64)
        p[(p == 0).all(1)] = np.nan
        return p, json.loads((Path(folder) / "P.manifest.json").read_text())


def _codes(folder: str) -> dict[str, tuple[int, ...]]:
    ids, codes = read_docids(Path(folder) / "docids.tsv")
    return dict(zip(ids, map(tuple, codes)))


def _level_ari(a: dict, b: dict, depth: int) -> float:
    """ARI of the two partitions of the documents by docid prefix (depth 1: the root's children; -1: the leaf,
    the code without its last position)."""
    ids = sorted(a)
    return float(ari([str(a[i][:depth]) for i in ids], [str(b[i][:depth]) for i in ids]))


def main(fp32: str, bf16: str, idx32: str | None = None, idx16: str | None = None) -> dict:
    (pa, ma), (pb, mb) = _p(fp32), _p(bf16)
    assert ma["doc_ids_hash"] == mb["doc_ids_hash"] and ma["queries_hash"] == mb["queries_hash"], \
        "not the same documents and queries"
    both = ~np.isnan(pa).any(1) & ~np.isnan(pb).any(1)
    pa, pb = pa[both], pb[both]  # (n_docs scored in both, J)
    d = np.abs(pa - pb)
    rel = d / np.abs(pa)
    rho = np.array([spearmanr(x, y).statistic for x, y in zip(pa, pb)])  # per document, over its J queries
    # the top query of each document (its most likely query) and the best document of each query
    top_q = float((pa.argmax(1) == pb.argmax(1)).mean())
    top_d = float((pa.argmax(0) == pb.argmax(0)).mean())
    out = {"shape": list(pa.shape), "compute_dtype": [ma.get("compute_dtype"), mb.get("compute_dtype")],
           "max_abs_diff": float(d.max()), "mean_abs_diff": float(d.mean()), "median_abs_diff": float(np.median(d)),
           "p99_abs_diff": float(np.quantile(d, 0.99)), "mean_rel_diff": float(rel.mean()),
           "mean_logp_fp32": float(pa.mean()), "mean_signed_diff_bf16_minus_fp32": float((pb - pa).mean()),
           "spearman_per_doc_mean": float(rho.mean()), "spearman_per_doc_min": float(rho.min()),
           "same_top_query_per_doc": top_q, "same_best_doc_per_query": top_d}
    if idx16 is None:  # P only (a partial run)
        print(json.dumps(out, indent=1))
        return out
    for name, folder in (("fp32", fp32), ("bf16", bf16)):
        m = json.loads((Path(folder) / "metrics.json").read_text())["methods"]
        out[f"gc_ari_{name}"] = {k: {"mean": m[k]["mean"]["ari"], "std": m[k]["std"]["ari"],
                                     "single": m[k]["single"]["ari"], "alpha_used": m[k]["settings"].get("alpha_used")}
                                 for k in m if k.startswith("GC")}
        labels = [line.split("\t")[1].strip() for line in (Path(folder) / "labels.tsv").read_text().splitlines()]
        out[f"gc_labels_{name}"] = labels
    out["gc_labels_ari_fp32_vs_bf16"] = float(ari(out.pop("gc_labels_fp32"), out.pop("gc_labels_bf16")))
    c32, c16 = _codes(idx32), _codes(idx16)
    out["n_docs"] = len(c32)
    out["docids_differ"] = sum(c32[i] != c16[i] for i in c32)
    out["docids_first_level_differ"] = sum(c32[i][0] != c16[i][0] for i in c32)
    out["first_level_ari"] = _level_ari(c32, c16, 1)  # the partitions, whatever the children's numbering
    out["leaf_ari"] = _level_ari(c32, c16, -1)
    # the scale of that: the same P indexed with another seed (folders <index>-seed1, when they exist)
    for name, folder, ref in (("fp32", idx32, c32), ("bf16", idx16, c16)):
        if (Path(folder + "-seed1") / "docids.tsv").exists():
            other = _codes(folder + "-seed1")
            out[f"docids_differ_seed0_vs_seed1_{name}"] = sum(ref[i] != other[i] for i in ref)
            out[f"docids_first_level_differ_seed0_vs_seed1_{name}"] = sum(ref[i][0] != other[i][0] for i in ref)
            out[f"first_level_ari_seed0_vs_seed1_{name}"] = _level_ari(ref, other, 1)
            out[f"leaf_ari_seed0_vs_seed1_{name}"] = _level_ari(ref, other, -1)
    print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main(*sys.argv[1:])
