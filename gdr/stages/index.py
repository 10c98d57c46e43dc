"""``gdr index`` (build prefix-code docids) and ``gdr index add`` (grow a GC index).

Composes ``conf/index.yaml`` with the command-line overrides, loads the inputs the method needs,
calls one builder (:func:`indexing.gc.build_gc_index`, :func:`indexing.kmeans.build_kmeans_index`,
:func:`indexing.tree.random_tree`, :func:`indexing.tree.atomic_codes`) and writes the index with
:func:`indexing.output.write_index`, plus ``config.yaml`` and ``manifest.json``.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path


from gdr.stages.score import load_data
from gdr.cli.validate import validate
from gdr.config import command_config, save_config, to_container
from gdr.guard import claim_out
from gdr.io import read_jsonl, write_manifest

__all__ = ["index_main", "add_main", "build_index"]

log = logging.getLogger(__name__)

METHODS = ("gc", "hkmi", "bmi", "random", "atomic")


def _compose(argv: list[str]):
    cfg = command_config("index", argv)
    if cfg is not None:
        validate("index", cfg)
    return cfg, cfg is None


def _docs_jsonl(path: str) -> tuple[list[str], list[str]]:
    rows = read_jsonl(path)
    for i, r in enumerate(rows, 1):
        if "doc_id" not in r or "text" not in r:
            raise ValueError(f"{path}: record {i} needs 'doc_id' and 'text'; got keys {sorted(r)}")
    return [str(r["doc_id"]) for r in rows], [str(r["text"]) for r in rows]


def _doc_ids(cfg, corpus=None) -> list[str]:
    """Doc ids for random/atomic/bmi: from run=, data=, kmeans.docs or kmeans.doc_queries (first given)."""
    if cfg.run:
        from indexing.pmatrix import load_pmatrix_run

        return load_pmatrix_run(cfg.run).doc_ids
    if cfg.get("data"):
        return (corpus if corpus is not None else load_data(cfg)).doc_ids
    if cfg.kmeans.docs:
        return _docs_jsonl(cfg.kmeans.docs)[0]
    if cfg.kmeans.doc_queries:
        from indexing.kmeans import read_doc_queries

        return list(read_doc_queries(cfg.kmeans.doc_queries))
    raise ValueError(f"method={cfg.method} needs the documents: pass run=<P-matrix run>, data=<corpus>, "
                     "kmeans.docs=<jsonl> or kmeans.doc_queries=<jsonl>")


def _gc_options(g):
    from indexing.gc import GCOptions

    keys = GCOptions.__dataclass_fields__.keys()
    return GCOptions(**{k: v for k, v in to_container(g).items() if k in keys})


def index_main(argv: list[str]) -> int:
    argv = list(argv)
    if argv and argv[0] == "add":
        return add_main(argv[1:])
    cfg, show = _compose(argv)
    if show:
        return 0
    claim_out("index", cfg)
    build_index(cfg)
    print(open(Path(cfg.out) / "summary.txt", encoding="utf-8").read(), end="")
    return 0


def build_index(cfg, corpus=None) -> dict:
    """Build one index from a composed ``conf/index.yaml`` config into ``cfg.out``; returns its summary.

    ``corpus``: the corpus of ``cfg.data`` when the caller has it loaded already (``gdr run``)."""
    if cfg.method not in METHODS:
        raise ValueError(f"method={cfg.method!r}: choose one of {', '.join(METHODS)}")
    if not cfg.out:
        raise ValueError("pass out=<folder> for the index")
    out = Path(cfg.out)
    t0 = time.time()
    K, c = int(cfg.n_clusters), int(cfg.leaf_size)
    extra: dict = {}
    query_texts, query_hash = None, ""
    if cfg.method == "gc":
        from indexing.gc import build_gc_index
        from indexing.pmatrix import load_pmatrix_run

        if not cfg.run:
            raise ValueError("method=gc needs run=<P-matrix run folder> (P.npy, queries.jsonl, doc_ids.json)")
        run = load_pmatrix_run(cfg.run, n_queries=cfg.gc.n_queries)
        doc_ids, query_texts, query_hash = run.doc_ids, run.query_texts, run.query_hash
        tree = build_gc_index(run.pmatrix, n_clusters=K, leaf_size=c, options=_gc_options(cfg.gc),
                              seed=int(cfg.seed), workers=int(cfg.workers), progress=bool(cfg.progress))
        extra.update(run=str(run.path), n_queries=run.pmatrix.n_cols, p_matrix_dtype=str(run.pmatrix.dtype))
    elif cfg.method in ("hkmi", "bmi"):
        from indexing.kmeans import (build_kmeans_index, default_embed_fn, document_embeddings,
                                     query_mean_embeddings, read_doc_queries)

        km = cfg.kmeans
        embed_fn = default_embed_fn(km.embed_model, int(km.batch_size))
        if cfg.method == "hkmi":
            if cfg.get("data"):
                corpus = corpus if corpus is not None else load_data(cfg)
                doc_ids, texts = corpus.doc_ids, corpus.model_inputs()
            elif km.docs:
                doc_ids, texts = _docs_jsonl(km.docs)
            else:
                raise ValueError("method=hkmi needs document texts: data=<corpus> or kmeans.docs=<jsonl>")
            if cfg.run:  # index exactly the documents of the P-matrix run (comparable with gc)
                from indexing.pmatrix import load_pmatrix_run

                pos = {d: i for i, d in enumerate(doc_ids)}
                run_ids = load_pmatrix_run(cfg.run).doc_ids
                missing = [d for d in run_ids if d not in pos]
                if missing:
                    raise ValueError(f"{len(missing)} doc ids of run={cfg.run} have no text (first {missing[0]!r})")
                doc_ids, texts = run_ids, [texts[pos[d]] for d in run_ids]
            emb = document_embeddings(texts, embed_fn)
        else:
            if not km.doc_queries:
                raise ValueError("method=bmi needs kmeans.doc_queries=<jsonl of {doc_id, queries}>")
            doc_queries = read_doc_queries(km.doc_queries)
            doc_ids = _doc_ids(cfg, corpus) if (cfg.run or cfg.get("data") or km.docs) else list(doc_queries)
            emb = query_mean_embeddings(doc_ids, doc_queries, embed_fn)
        tree = build_kmeans_index(emb, n_clusters=K, leaf_size=c, seed=int(cfg.seed), n_init=int(km.n_init),
                                  max_iter=int(km.max_iter), spherical=bool(km.spherical),
                                  workers=int(cfg.workers), progress=bool(cfg.progress), method=cfg.method)
        extra.update(embed_model=km.embed_model, embedding_dim=int(emb.shape[1]))
    elif cfg.method == "random":
        from indexing.tree import random_tree

        doc_ids = _doc_ids(cfg, corpus)
        tree = random_tree(len(doc_ids), K, c, seed=int(cfg.seed), progress=bool(cfg.progress))
    else:
        from indexing.tree import atomic_codes

        doc_ids = _doc_ids(cfg, corpus)
        tree = atomic_codes(len(doc_ids), warn_above=int(cfg.atomic.warn_above))
    from indexing.output import write_index

    summary = write_index(out, tree, doc_ids, method=cfg.method, query_texts=query_texts, query_hash=query_hash,
                          top_queries=int(cfg.gc.top_queries), centroid_json_depth=int(cfg.gc.centroid_json_depth),
                          plot=bool(cfg.plot))
    save_config(cfg, out)
    write_manifest(out, command="index", method=cfg.method, n_docs=len(doc_ids), seconds=round(time.time() - t0, 2),
                   depth=summary["depth_max"], n_fallback=summary["n_fallback"],
                   files=("docids.tsv", "tree.json", "tree_state.npz"), **extra)
    return summary


def add_main(argv: list[str]) -> int:
    """``gdr index add run=<P-matrix run of new documents> index=<GC index folder>``."""
    cfg, show = _compose(list(argv))
    if show:
        return 0
    if not cfg.run or not cfg.index:
        raise ValueError("usage: gdr index add run=<P-matrix run of the new documents> index=<GC index folder>")
    claim_out("index add", cfg)  # the index folder is rewritten
    from indexing.add import add_to_index

    res = add_to_index(cfg.index, cfg.run, chunk_rows=int(cfg.gc.chunk_rows), plot=bool(cfg.plot))
    print(f"added {len(res.codes)} documents to {cfg.index} ({res.n_redirected} redirected from full leaves, "
          f"{res.n_new_leaves} new leaves)")
    return 0
