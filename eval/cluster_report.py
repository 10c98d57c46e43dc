"""Clustering a corpus's log P with GC variants, evaluated against labels with the k-means baselines.

The library side of ``gdr cluster`` (:mod:`gdr.stages.cluster`) and of the pipeline's clustering stage:
``cluster_corpus`` fits and scores, ``results_table`` / ``descriptions_md`` / ``plot_clusters`` write
what a person reads.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Sequence

import numpy as np
from matplotlib.figure import Figure
from scipy.special import logsumexp

from gdr.cluster import GenerativeClustering, describe_clusters
from gdr.eval.baselines import run_baselines
from gdr.eval.clustering import clustering_scores, make_gc_fit_fn, repeated_best_of
from gdr.models import EMBED_MODEL
from gdr.options import GCFitOptions

log = logging.getLogger(__name__)


def restrict(logp: np.ndarray, labels: Sequence[str], source_index: np.ndarray, keep: Sequence[str]):
    """Rows whose label is in ``keep`` and the columns sampled from those rows.

    Sampling a query from a uniformly drawn document of the subset is the same as sampling from a
    uniformly drawn document of the whole corpus and keeping it when its source is in the subset, so
    this is an honest smaller run on the subset (with fewer queries).
    """
    labels = np.asarray(labels)
    unknown = sorted(set(keep) - set(labels.tolist()))
    if unknown:
        raise ValueError(f"cluster.restrict_labels: {unknown} not among the corpus labels {sorted(set(labels))}")
    rows = np.flatnonzero(np.isin(labels, list(keep)))
    cols = np.flatnonzero(np.isin(source_index, rows))
    return rows, cols


def cluster_corpus(logp: np.ndarray, queries: Sequence[str], n_clusters: int, variants: dict[str, dict], *,
                   labels: Sequence[str] | None = None, texts: Sequence[str] | None = None,
                   baselines: Sequence[str] = (), embed_model: str = EMBED_MODEL, n_init: int = GCFitOptions.n_init,
                   repeats: int = 1, init: str = "random", max_iter: int = GCFitOptions.max_iter,
                   tol: float = GCFitOptions.tol, seed: int = 0, describe_top: int,
                   device: str = GCFitOptions.device) -> dict:
    """Cluster rows of ``logp`` (n_docs, n_queries) with GC variants; evaluate when ``labels`` are given.

    Returns a dict with, per method, the selected run's labels, distortion, and (with labels) mean/std
    of ACC/NMI/ARI over ``repeats`` best-of-``n_init`` repeats; and GC's cluster descriptions.
    """
    out: dict = {"methods": {}, "n_docs": int(logp.shape[0]), "n_queries": int(logp.shape[1]),
                 "n_clusters": n_clusters}
    for name, v in variants.items():
        t0 = time.perf_counter()
        ess = v.get("ess_target", GCFitOptions.ess_target)
        gc = GenerativeClustering(n_clusters, alpha=v["alpha"], clip_sigma=v["clip_sigma"], phi=v["phi"],
                                  init=init, n_init=n_init, max_iter=max_iter, tol=tol, seed=seed,
                                  device=device, ess_target=ess).fit(logp)
        res = {"kind": "gc", "settings": {**v, "alpha_used": gc.alpha_}, "labels": gc.labels_.tolist(),
               "distortion": float(gc.distortion_),
               "n_iter": int(gc.n_iter_), "distortion_history": [float(d) for d in gc.distortion_history_],
               # what sets a cluster apart: lift of its centroid over the mean centroid of all clusters
               # (ranking by c_k alone, or by c_k / phi, lists the same generic queries for every cluster)
               "descriptions": describe_clusters(gc.log_centroids_, queries, top=describe_top,
                                                 log_reference=logsumexp(gc.log_centroids_, axis=0)
                                                 - np.log(n_clusters))}
        if labels is not None:
            res["single"] = clustering_scores(labels, gc.labels_)
            if repeats > 0:
                fit_fn = make_gc_fit_fn(logp, n_clusters, alpha=gc.alpha_, clip_sigma=v["clip_sigma"], phi=v["phi"],
                                        init=init, max_iter=max_iter, tol=tol, device=device)
                rep = repeated_best_of(fit_fn, labels, n_repeats=repeats, n_init=n_init, seed=seed, progress=False)
                res["mean"], res["std"] = rep.mean, rep.std
        res["seconds"] = round(time.perf_counter() - t0, 2)
        out["methods"][f"GC ({name})" if name != "gc" else "GC"] = res
        log.info("%s done in %.1f s%s", name, res["seconds"],
                 f": {res.get('mean')}" if "mean" in res else "")
    if labels is not None and baselines:
        names = set(baselines)
        bl = run_baselines(texts if names & {"tfidf", "embedding"} else None,
                           logp if "logp" in names else None, n_clusters, n_init=n_init, repeats=max(repeats, 1),
                           seed=seed, embed_model=embed_model if "embedding" in names else None, y_true=labels)
        for key, r in bl.items():
            if key.split(":")[0] not in names:
                continue
            out["methods"][f"k-means ({key})"] = {"kind": "kmeans", "labels": r.labels.tolist(),
                                                  "objective": float(r.objective), "dim": r.dim,
                                                  "mean": r.mean, "std": r.std, "seconds": round(r.seconds, 2)}
    return out


def results_table(result: dict) -> str:
    lines = ["| method | ACC | NMI | ARI | seconds |", "|---|---|---|---|---|"]
    for name, r in result["methods"].items():
        if r.get("mean") is None:
            continue
        cells = [f"{r['mean'][k]:.1f} ({r['std'][k]:.1f})" for k in ("acc", "nmi", "ari")]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {r['seconds']} |")
    return "\n".join(lines) + "\n"


def descriptions_md(result: dict, labels: Sequence[str] | None) -> str:
    gc = result["methods"]["GC"] if "GC" in result["methods"] else next(iter(result["methods"].values()))
    pred = np.asarray(gc["labels"])
    lines = ["# What each cluster is about", "",
             "The sampled queries whose centroid weight most exceeds the mean centroid of all clusters (lift).", ""]
    for k, desc in enumerate(gc["descriptions"]):
        members = pred == k
        head = f"## cluster {k}: {int(members.sum())} documents"
        if labels is not None and members.any():
            vals, cnt = np.unique(np.asarray(labels)[members], return_counts=True)
            top = np.argsort(-cnt)[:3]
            head += " (" + ", ".join(f"{vals[t]} {cnt[t]}" for t in top) + ")"
        lines += [head, ""] + [f"- {q}" for q, _ in desc] + [""]
    return "\n".join(lines)


def plot_clusters(result: dict, labels: Sequence[str] | None, path: Path) -> None:
    # Figures of its own, not pyplot's: pyplot's figures are process-wide state, and the clustering may run in a
    # thread beside others that plot (gdr.stages.overlap)

    gc = result["methods"]["GC"]
    pred = np.asarray(gc["labels"])
    k = result["n_clusters"]
    if labels is None:
        fig = Figure(figsize=(6, 3.5))
        ax = fig.subplots()
        ax.bar(np.arange(k), np.bincount(pred, minlength=k))
        ax.set_xlabel("cluster")
        ax.set_ylabel("documents")
        ax.set_title("GC cluster sizes")
    else:
        names = sorted(set(labels))
        lab = np.searchsorted(names, np.asarray(labels))
        cm = np.zeros((len(names), k), dtype=int)
        np.add.at(cm, (lab, pred), 1)
        fig = Figure(figsize=(1.2 + 0.6 * k, 1.0 + 0.5 * len(names)))
        ax = fig.subplots()
        ax.imshow(cm, cmap="Blues", aspect="auto")
        for (i, j), v in np.ndenumerate(cm):
            ax.text(j, i, str(v), ha="center", va="center", fontsize=8,
                    color="white" if v > cm.max() / 2 else "black")
        ax.set_xticks(range(k))
        ax.set_yticks(range(len(names)), names)
        ax.set_xlabel("GC cluster")
        ax.set_title("labels x GC clusters")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
