"""Stage ``cluster``: flat generative clustering of a scored corpus, evaluated against its labels.

:func:`cluster_run` runs generative clustering (and its configured variants) on the P matrix of a
``score`` folder, evaluates against labels when the corpus has them (with the k-means baselines), and
writes ``metrics.json``, ``results.md``, ``clusters.md``, ``labels.tsv`` and ``clusters.png``.
"""
from __future__ import annotations

import logging
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from gdr.eval.cluster_report import cluster_corpus, descriptions_md, plot_clusters, restrict, results_table
from gdr.guard import holding
from gdr.io import atomic_write_json, atomic_write_text, write_manifest
from gdr.stages.settings import ClusterSettings, LMSettings

__all__ = ["cluster_run"]

log = logging.getLogger(__name__)


def cluster_run(corpus, run, out: str | Path, settings: ClusterSettings,
                device: str = LMSettings.device) -> tuple[dict, str]:
    """Cluster the P matrix of ``run`` (a :class:`gdr.store.PRun` of ``corpus``, e.g. ``gdr.store.load_run(folder)``)
    with ``settings``; write metrics.json, results.md, clusters.md, labels.tsv, clusters.png into ``out``.

    ``settings`` passed their checks against ``corpus`` at the caller's door (:meth:`ClusterSettings.check_corpus`:
    ``gdr cluster``, ``gdr run``, :func:`gdr.evaluate_clusters`). Returns (the result of
    :func:`gdr.eval.cluster_report.cluster_corpus` plus ``labels``, the results table)."""
    with holding(out):  # one writer per folder, as with `gdr cluster`
        return _cluster_run(corpus, run, Path(out), settings, device)


def _cluster_run(corpus, run, out: Path, settings: ClusterSettings, device: str) -> tuple[dict, str]:
    c = settings
    queries = run.queries
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
    base = asdict(c.gc)
    variants = {name: {**base, **(dict(v) if v else {})} for name, v in c.variants.items()}
    result = cluster_corpus(logp, qtexts, k, variants, labels=labels, texts=texts,
                            baselines=list(c.baselines) if labels is not None else [], embed_model=c.embed_model,
                            n_init=c.n_init, repeats=c.repeats if labels is not None else 0, init=c.init,
                            max_iter=c.max_iter, tol=c.tol, seed=c.seed, describe_top=c.describe_top,
                            device="cuda" if str(device) in ("auto", "cuda") and _cuda() else "cpu")
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
    write_manifest(out, f"cluster{suffix}.manifest.json", dataset=tag, p_matrix=run.manifest.get("doc_ids_hash"),
                   queries_hash=run.manifest.get("queries_hash"),
                   files=[f"{n}{suffix}.{e}" for n, e in (("metrics", "json"), ("results", "md"), ("clusters", "md"),
                                                          ("labels", "tsv"), ("clusters", "png"))])
    result["labels"] = labels
    return result, table


def _cuda() -> bool:
    return torch.cuda.is_available()
