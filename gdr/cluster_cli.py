"""``gdr cluster``: one command from a dataset to a clustering result.

Samples queries and scores P (reusing a finished P matrix whose manifest matches), runs generative
clustering (and its configured variants), evaluates against labels when the corpus has them (with the
k-means baselines), and writes ``metrics.json``, ``results.md``, ``clusters.md``, ``labels.tsv`` and
``clusters.png`` into the run folder.
"""
from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Sequence

import numpy as np
from scipy.special import logsumexp

from gdr.config import save_config, to_container
from gdr.io import atomic_write_json, atomic_write_text, write_manifest

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


def cluster_corpus(logp: np.ndarray, queries: Sequence[str], n_clusters: int, variants: dict[str, dict],
                   labels: Sequence[str] | None = None, texts: Sequence[str] | None = None,
                   baselines: Sequence[str] = (), embed_model: str = "minilm-l6", n_init: int = 10,
                   repeats: int = 1, init: str = "random", max_iter: int = 100, tol: float = 1e-6,
                   seed: int = 0, describe_top: int = 5, device: str = "cpu") -> dict:
    """Cluster rows of ``logp`` (n_docs, n_queries) with GC variants; evaluate when ``labels`` are given.

    Returns a dict with, per method, the selected run's labels, distortion, and (with labels) mean/std
    of ACC/NMI/ARI over ``repeats`` best-of-``n_init`` repeats; and GC's cluster descriptions.
    """
    from eval.clustering import clustering_scores, make_gc_fit_fn, repeated_best_of
    from gdr.cluster import GenerativeClustering, describe_clusters

    out: dict = {"methods": {}, "n_docs": int(logp.shape[0]), "n_queries": int(logp.shape[1]),
                 "n_clusters": n_clusters}
    for name, v in variants.items():
        t0 = time.perf_counter()
        gc = GenerativeClustering(n_clusters, alpha=v["alpha"], clip_sigma=v["clip_sigma"], phi=v["phi"],
                                  init=init, n_init=n_init, max_iter=max_iter, tol=tol, seed=seed,
                                  device=device).fit(logp)
        res = {"kind": "gc", "settings": v, "labels": gc.labels_.tolist(), "distortion": float(gc.distortion_),
               "n_iter": int(gc.n_iter_), "distortion_history": [float(d) for d in gc.distortion_history_],
               # what sets a cluster apart: lift of its centroid over the mean centroid of all clusters
               # (ranking by c_k alone, or by c_k / phi, lists the same generic queries for every cluster)
               "descriptions": describe_clusters(gc.log_centroids_, queries, top=describe_top,
                                                 log_reference=logsumexp(gc.log_centroids_, axis=0)
                                                 - np.log(n_clusters))}
        if labels is not None:
            res["single"] = clustering_scores(labels, gc.labels_)
            if repeats > 0:
                fit_fn = make_gc_fit_fn(logp, n_clusters, alpha=v["alpha"], clip_sigma=v["clip_sigma"], phi=v["phi"],
                                        init=init, max_iter=max_iter, tol=tol, device=device)
                rep = repeated_best_of(fit_fn, labels, n_repeats=repeats, n_init=n_init, seed=seed, progress=False)
                res["mean"], res["std"] = rep.mean, rep.std
        res["seconds"] = round(time.perf_counter() - t0, 2)
        out["methods"][f"GC ({name})" if name != "gc" else "GC"] = res
        log.info("%s done in %.1f s%s", name, res["seconds"],
                 f": {res.get('mean')}" if "mean" in res else "")
    if labels is not None and baselines:
        from eval.baselines import run_baselines

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
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gc = result["methods"]["GC"]
    pred = np.asarray(gc["labels"])
    k = result["n_clusters"]
    if labels is None:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.bar(np.arange(k), np.bincount(pred, minlength=k))
        ax.set_xlabel("cluster")
        ax.set_ylabel("documents")
        ax.set_title("GC cluster sizes")
    else:
        names = sorted(set(labels))
        lab = np.searchsorted(names, np.asarray(labels))
        cm = np.zeros((len(names), k), dtype=int)
        np.add.at(cm, (lab, pred), 1)
        fig, ax = plt.subplots(figsize=(1.2 + 0.6 * k, 1.0 + 0.5 * len(names)))
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
    plt.close(fig)


def cluster_main(argv: list[str]) -> int:
    from gdr.commands import _compose, build_lm, load_data, sample_queries_for, score_matrix_for
    from gdr.store import load_run

    cfg = _compose("cluster", argv)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    corpus = load_data(cfg)
    c = cfg.cluster
    if corpus.labels is None and c.n_clusters is None:
        raise SystemExit(f"corpus {corpus.name!r} has no labels: set cluster.n_clusters=K")
    lm = build_lm(cfg)
    queries = sample_queries_for(cfg, lm, corpus)
    score_matrix_for(cfg, lm, corpus, queries)
    del lm
    run = load_run(out)
    logp = np.asarray(run.logp, dtype=np.float32)
    qtexts = run.query_texts
    labels, texts = corpus.labels, corpus.model_inputs()
    if c.restrict_labels:
        rows, cols = restrict(logp, corpus.labels, np.array([q["source_index"] for q in queries]),
                              list(c.restrict_labels))
        log.info("restricting to labels %s: %d of %d documents, %d of %d queries", list(c.restrict_labels),
                 len(rows), logp.shape[0], len(cols), logp.shape[1])
        logp = logp[np.ix_(rows, cols)]
        qtexts = [qtexts[j] for j in cols]
        labels, texts = [labels[i] for i in rows], [texts[i] for i in rows]
    k = c.n_clusters or len(set(labels))
    base = to_container(c.gc)
    variants = {name: {**base, **(to_container(v) if v else {})} for name, v in c.variants.items()}
    result = cluster_corpus(logp, qtexts, k, variants, labels=labels, texts=texts,
                            baselines=list(c.baselines) if labels is not None else [], embed_model=c.embed_model,
                            n_init=c.n_init, repeats=c.repeats if labels is not None else 0, init=c.init,
                            max_iter=c.max_iter, tol=c.tol, seed=c.seed,
                            device="cuda" if str(cfg.device) in ("auto", "cuda") and _cuda() else "cpu")
    tag = "-".join(c.restrict_labels) if c.restrict_labels else corpus.name
    metrics = {name: {key: r.get(key) for key in ("mean", "std", "single", "distortion", "objective", "n_iter",
                                                   "seconds", "settings")}
               for name, r in result["methods"].items()}
    atomic_write_json(out / f"metrics.{tag}.json" if c.restrict_labels else out / "metrics.json",
                      {"dataset": tag, "n_docs": result["n_docs"], "n_queries": result["n_queries"],
                       "n_clusters": k, "repeats": c.repeats, "n_init": c.n_init, "methods": metrics})
    suffix = f".{tag}" if c.restrict_labels else ""
    table = results_table(result)
    atomic_write_text(out / f"results{suffix}.md",
                      f"# {tag}: {result['n_docs']} documents, J = {result['n_queries']}, K = {k}\n\n"
                      f"Mean (std) over {c.repeats} repeats of best-of-{c.n_init} by distortion.\n\n" + table)
    atomic_write_text(out / f"clusters{suffix}.md", descriptions_md(result, labels))
    atomic_write_text(out / f"labels{suffix}.tsv", "".join(
        f"{d}\t{l}\n" for d, l in zip(np.asarray(corpus.doc_ids)[rows] if c.restrict_labels else corpus.doc_ids,
                                      result["methods"]["GC"]["labels"])))
    plot_clusters(result, labels, out / f"clusters{suffix}.png")
    save_config(cfg, out, f"cluster{suffix}.config.yaml")
    write_manifest(out, f"cluster{suffix}.manifest.json", dataset=tag, p_matrix=run.manifest.get("doc_ids_hash"),
                   queries_hash=run.manifest.get("queries_hash"))
    print()
    if labels is not None:
        print(table)
    for kk, desc in enumerate(result["methods"]["GC"]["descriptions"]):
        print(f"cluster {kk}: " + " | ".join(q for q, _ in desc[:3]))
    print(f"\nresults in {out}")
    return 0


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()
