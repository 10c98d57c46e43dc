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

from eval.clustering import ari
from gdr.store import load_run
from indexing.docids import read_docids


def _p(folder: str) -> tuple[np.ndarray, dict]:
    """P (n_docs, J) as float64 and its manifest; a partial P's unscored rows are NaN."""
    try:
        run = load_run(folder)
        return np.asarray(run.logp, np.float64), run.manifest
    except RuntimeError:  # partial: scored rows only (unscored rows are still the file's zeros)
        p = np.load(Path(folder) / "P.npy").astype(np.float64)
        p[(p == 0).all(1)] = np.nan
        return p, json.loads((Path(folder) / "P.manifest.json").read_text())


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
    ids32, codes32 = read_docids(Path(idx32) / "docids.tsv")
    ids16, codes16 = read_docids(Path(idx16) / "docids.tsv")
    c32, c16 = dict(zip(ids32, map(tuple, codes32))), dict(zip(ids16, map(tuple, codes16)))
    diff = [i for i in c32 if c32[i] != c16[i]]
    out["docids_differ"] = len(diff)
    out["docids_first_level_differ"] = sum(c32[i][0] != c16[i][0] for i in c32)
    out["n_docs"] = len(c32)
    print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main(*sys.argv[1:])
