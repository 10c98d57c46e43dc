"""Stage ``index``: prefix-code docids of a corpus by one indexer (gc | hkmi | bmi | random | atomic).

:func:`build_index` loads the inputs the method needs, calls one builder (:func:`gdr.indexing.gc.build_gc_index`,
:func:`gdr.indexing.kmeans.build_kmeans_index`, :func:`gdr.indexing.tree.random_tree`,
:func:`gdr.indexing.tree.atomic_codes`) and writes the index with :func:`gdr.indexing.output.write_index`, plus
``manifest.json``. ``gdr index add`` (grow a GC index) is :func:`gdr.stages.index_add.add_to_index`.
"""
from __future__ import annotations

import functools
import json
import logging
import time
from pathlib import Path
from typing import Callable, Sequence

from gdr.guard import holding
from gdr.indexing.gc import build_gc_index
from gdr.indexing.kmeans import (
    bmi_document_texts,
    build_kmeans_index,
    default_embed_fn,
    document_embeddings,
    document_segments,
    query_mean_embeddings,
    read_doc_queries,
    tfidf_svd_embeddings,
)
from gdr.indexing.output import write_index
from gdr.indexing.tree import atomic_codes, random_tree
from gdr.io import hash_strings, read_jsonl, recorded_identity, what_differs, write_manifest
from gdr.stages.settings import IndexSettings, index_key_values, index_keys
from gdr.store import load_run

__all__ = ["build_index", "METHODS", "BMI_REAL_QUERIES", "index_seeds", "index_stage_name", "index_stages",
           "queries_by_document"]

log = logging.getLogger(__name__)

METHODS = ("gc", "hkmi", "bmi", "random", "atomic")
# in a `gdr run`'s BMI index folder (``bmi.inputs=realq_*``): the training split's queries its vector averages
BMI_REAL_QUERIES = "real_queries.jsonl"


def index_seeds(mode: str, method: str, seeds: Sequence[int]) -> list[int | None]:
    """The index seeds of ``method`` in a ``gdr run`` whose retrievers train with ``seeds``, by ``index_seed``:
    ``shared``, one index of ``index.seed`` for them all ([None]); ``retriever``, one per retriever seed (the index
    of seed s under the retriever of seed s), for an indexer whose ids depend on a seed (``index.seed`` keys it:
    :func:`gdr.stages.settings.index_keys`); an indexer whose ids do not (atomic) keeps one index ([None])."""
    if mode == "retriever" and "seed" in index_keys()[method]:
        return [int(s) for s in dict.fromkeys(seeds)]
    return [None]


def index_stages(indexers: Sequence[str], mode: str, seeds: Sequence[int]) -> list[tuple[str, int | None]]:
    """(indexer, index seed) of every index stage of a ``gdr run`` of ``indexers`` and retriever ``seeds``, in the
    order of ``indexers``: one an indexer (seed None), or with ``index_seed=retriever`` (``mode``) one per retriever
    seed for an indexer whose ids depend on a seed (:func:`index_seeds`)."""
    return [(m, s) for m in indexers for s in index_seeds(mode, m, seeds)]


def queries_by_document(qs) -> list[dict]:
    """``bmi.real_queries`` rows of a :class:`gdr.data.QuerySet`: ``{"doc_id", "queries"}`` per document with a
    query, each query under every document judged relevant to it, documents in the order first judged."""
    by_doc: dict[str, list[str]] = {}
    for text, rel in zip(qs.texts, qs.relevant):
        for d in rel:
            by_doc.setdefault(d, []).append(text)
    return [{"doc_id": d, "queries": q} for d, q in by_doc.items()]


def index_stage_name(method: str, seed: int | None) -> str:
    """A ``gdr run`` index stage's name: ``index-<method>``, or ``index-<method>-s<seed>`` for an index built with
    its retriever's seed (:func:`index_seeds`)."""
    return f"index-{method}" if seed is None else f"index-{method}-s{int(seed)}"


def _docs_jsonl(path: str) -> tuple[list[str], list[str]]:
    """``kmeans.docs``: ``{"doc_id", "text"}`` records; an id given twice is refused (a docids.tsv with it would be
    refused by every reader)."""
    rows = read_jsonl(path)
    first: dict[str, int] = {}
    for i, r in enumerate(rows, 1):
        if "doc_id" not in r or "text" not in r:
            raise ValueError(f"{path}: record {i} needs 'doc_id' and 'text'; got keys {sorted(r)}")
        d = str(r["doc_id"])
        if d in first:
            raise ValueError(f"{path}: record {i}: duplicate doc_id {d!r} (first seen at record {first[d]}); give "
                             "each document a unique id or delete the duplicate")
        first[d] = i
    return [str(r["doc_id"]) for r in rows], [str(r["text"]) for r in rows]


def _doc_ids(settings: IndexSettings, run, corpus: Callable | None) -> list[str]:
    """Doc ids for random/atomic/bmi: from run=, data=, kmeans.docs or kmeans.doc_queries (first given)."""
    if run:
        return load_run(run, require_manifest=False).doc_ids
    if corpus is not None:
        return corpus().doc_ids
    if settings.kmeans.docs:
        return _docs_jsonl(settings.kmeans.docs)[0]
    if settings.kmeans.doc_queries:
        return list(read_doc_queries(settings.kmeans.doc_queries))
    raise ValueError(f"method={settings.method} needs the documents: pass run=<P-matrix run>, data=<corpus>, "
                     "kmeans.docs=<jsonl> or kmeans.doc_queries=<jsonl>")


def build_index(settings: IndexSettings, out: str | Path, *, corpus=None, run: str | Path | None = None) -> dict:
    """Build one index (``settings.method``) into ``out``; returns its summary (depth, balance, leaves ...).

    ``corpus``: a :class:`gdr.data.Corpus` (or a function returning one, called only when the method needs
    it): the documents of hkmi, and the doc ids of random/atomic/bmi without ``run``. ``run``: a ``score``
    folder (P.npy, queries.jsonl, doc_ids.json): the input of gc, and the documents of the others.
    ``settings.kmeans`` may name ``docs`` (jsonl of doc_id/text) and ``doc_queries`` (bmi's input)."""
    cfg = settings
    # the corpus loaded once, however many of the method's inputs read it (bmi: its doc ids and its texts)
    load = None if corpus is None else functools.cache(corpus if callable(corpus) else (lambda: corpus))
    if cfg.method not in METHODS:
        raise ValueError(f"method={cfg.method!r}: choose one of {', '.join(METHODS)}")
    if not out:
        raise ValueError("pass out=<folder> for the index")

    with holding(out):  # one writer per folder, as with `gdr index`
        return _build_index(cfg, Path(out), load, run)


def _build_index(settings: IndexSettings, out: Path, load, run) -> dict:
    cfg = settings
    t0 = time.time()
    K, c = int(cfg.n_clusters), int(cfg.leaf_size)
    extra: dict = {}
    query_texts = None
    if cfg.method == "gc":
        if not run:
            raise ValueError("method=gc needs run=<P-matrix run folder> (P.npy, queries.jsonl, doc_ids.json)")
        prun = _gc_input(run, cfg.gc.n_queries)
        doc_ids, query_texts = prun.doc_ids, prun.query_texts
        queries = {k: v for k, v in prun.query_identity().items() if k != "source"}
        identity = _claim_index_folder(out, _identity(cfg, doc_ids, queries=queries))
        tree = build_gc_index(prun.pmatrix, n_clusters=K, leaf_size=c, options=cfg.gc,
                              seed=int(cfg.seed), workers=int(cfg.workers), progress=bool(cfg.progress))
        tree.meta["queries"] = prun.query_identity()  # what `gdr index add` checks new documents' P against
        extra.update(run=str(prun.path), n_queries=prun.pmatrix.n_cols, p_matrix_dtype=str(prun.pmatrix.dtype))
    elif cfg.method in ("hkmi", "bmi"):
        km = cfg.kmeans
        tfidf = km.embedding == "tfidf-svd"
        embed_fn = (functools.partial(tfidf_svd_embeddings, dim=int(km.svd_dim), seed=int(cfg.seed)) if tfidf
                    else default_embed_fn(km.embed_model, int(km.batch_size)))
        if cfg.method == "hkmi":
            doc_ids, texts = _document_texts(cfg, load, "method=hkmi needs document texts")
            if run:  # index exactly the documents of the P-matrix run (comparable with gc)
                run_ids = load_run(run, require_manifest=False).doc_ids
                doc_ids, texts = run_ids, _texts_of(run_ids, doc_ids, texts, f"doc ids of run={run}")
            identity = _claim_index_folder(out, _identity(cfg, doc_ids, texts=hash_strings(texts)))
            emb = document_embeddings(texts, embed_fn)
        else:
            if not km.doc_queries:
                raise ValueError("method=bmi needs kmeans.doc_queries=<jsonl of {doc_id, queries}>")
            doc_queries = read_doc_queries(km.doc_queries)
            doc_ids = _doc_ids(cfg, run, load) if (run or load is not None or km.docs) else list(doc_queries)
            real, segments, inputs = _bmi_extra_inputs(cfg, doc_ids, load)
            identity = _claim_index_folder(out, _identity(cfg, doc_ids, doc_queries=hash_strings(
                q for d in doc_ids for q in doc_queries.get(d, ())), **inputs))
            emb = query_mean_embeddings(doc_ids, bmi_document_texts(doc_ids, doc_queries, real, segments), embed_fn)
            extra.update(bmi_texts={"inputs": cfg.bmi.inputs, "real_queries": sum(map(len, real.values())),
                                    "documents_with_real_queries": sum(1 for d in doc_ids if real.get(d)),
                                    "segments": sum(map(len, segments.values()))})
        tree = build_kmeans_index(emb, n_clusters=K, leaf_size=c, seed=int(cfg.seed), n_init=int(km.n_init),
                                  max_iter=int(km.max_iter), spherical=bool(km.spherical),
                                  workers=int(cfg.workers), progress=bool(cfg.progress), method=cfg.method)
        extra.update(embed_model="tfidf-svd" if tfidf else km.embed_model, embedding_dim=int(emb.shape[1]))
    elif cfg.method == "random":
        doc_ids = _doc_ids(cfg, run, load)
        identity = _claim_index_folder(out, _identity(cfg, doc_ids))
        tree = random_tree(len(doc_ids), K, c, seed=int(cfg.seed), progress=bool(cfg.progress))
    else:
        doc_ids = _doc_ids(cfg, run, load)
        identity = _claim_index_folder(out, _identity(cfg, doc_ids))
        tree = atomic_codes(len(doc_ids), warn_above=int(cfg.atomic.warn_above))

    summary = write_index(out, tree, doc_ids, method=cfg.method, query_texts=query_texts,
                          top_queries=int(cfg.gc.top_queries),
                          centroid_json_depth=int(cfg.gc.centroid_json_depth),
                          plot=bool(cfg.plot))
    write_manifest(out, command="index", method=cfg.method, n_docs=len(doc_ids), seconds=round(time.time() - t0, 2),
                   depth=summary["depth_max"], n_fallback=summary["n_fallback"],
                   files=("docids.tsv", "tree.json", "tree_state.npz"), identity=identity, **extra)
    return summary


def _document_texts(settings: IndexSettings, load, need: str) -> tuple[list[str], list[str]]:
    """(doc ids, the texts the models read) of the corpus (``data=``) or of ``kmeans.docs``; ``need`` heads the
    error when neither is given."""
    if load is not None:
        corpus = load()
        return corpus.doc_ids, corpus.model_inputs()
    if settings.kmeans.docs:
        return _docs_jsonl(settings.kmeans.docs)
    raise ValueError(f"{need}: data=<corpus> or kmeans.docs=<jsonl of {{doc_id, text}}>")


def _texts_of(wanted: Sequence[str], doc_ids: Sequence[str], texts: Sequence[str], what: str) -> list[str]:
    """The texts of ``wanted`` ids, from ``doc_ids``' ``texts``; an error naming the first without one."""
    pos = {d: i for i, d in enumerate(doc_ids)}
    missing = [d for d in wanted if d not in pos]
    if missing:
        raise ValueError(f"{len(missing)} {what} have no text (first {missing[0]!r})")
    return [texts[pos[d]] for d in wanted]


def _bmi_extra_inputs(settings: IndexSettings, doc_ids: Sequence[str], load) -> tuple[dict, dict, dict]:
    """What BMI's vector averages besides the generated queries (``bmi.inputs``): the real training queries of
    ``bmi.real_queries`` by document (those of other documents are ignored) and the random segments of the
    documents' texts (``data=`` or ``kmeans.docs``), with their hashes for the index's identity."""
    bmi, real, segments, inputs = settings.bmi, {}, {}, {}
    if bmi.inputs.startswith("realq"):
        if not bmi.real_queries:
            raise ValueError(f"bmi.inputs={bmi.inputs} needs bmi.real_queries=<jsonl of {{doc_id, queries}}> of real "
                             "training queries, or bmi.inputs=genq_docseg")
        kept = set(doc_ids)
        real = {d: q for d, q in read_doc_queries(bmi.real_queries).items() if d in kept}
        inputs["real_queries"] = hash_strings(q for d in doc_ids for q in real.get(d, ()))
    if bmi.inputs.endswith("docseg"):
        texts = _texts_of(doc_ids, *_document_texts(settings, load, f"bmi.inputs={bmi.inputs} segments the "
                                                                    "document texts (or bmi.inputs=genq)"),
                          f"documents of bmi.inputs={bmi.inputs}")
        segments = document_segments(doc_ids, texts, words=int(bmi.segment_words), per_doc=int(bmi.segments),
                                     seed=int(settings.seed))
        inputs["texts"] = hash_strings(texts)
    return real, segments, inputs


def _gc_input(run, n_queries: int | None):
    """The P run ``run`` over its first ``n_queries`` columns (``gc.n_queries``; all when None), more than it has
    refused by that key."""
    full = load_run(run, require_manifest=False)
    if n_queries is not None and n_queries > full.pmatrix.n_cols:
        raise ValueError(f"gc.n_queries={n_queries}: more than the {full.pmatrix.n_cols} queries of the P of "
                         f"run={run}; pass at most {full.pmatrix.n_cols}, or null for all of them")
    return full.first_queries(n_queries)


# an index's inputs, named by what their hashes hash
_INPUTS = {"doc_ids": "the documents (their ids)", "queries": "the P columns' queries", "texts": "the documents' texts",
           "doc_queries": "the generated queries", "real_queries": "the real queries"}


def _identity(settings: IndexSettings, doc_ids: Sequence[str], **inputs) -> dict:
    """What an index's ids are a function of: its method, the settings of that method (:func:`index_key_values`) and
    its inputs by content (the documents' ids, and the P columns', texts', generated or real queries' hashes)."""
    c = settings.to_dict()
    if "kmeans" in c:  # the files it names count by their content, in ``inputs``
        c["kmeans"] = {k: v for k, v in c["kmeans"].items() if k not in ("docs", "doc_queries")}
    return json.loads(json.dumps({"method": settings.method,
                                  "settings": index_key_values(settings.method, c),
                                  "doc_ids": hash_strings(doc_ids), **inputs}, default=str))


def _claim_index_folder(out: Path, identity: dict) -> dict:
    """Refuse, in one line and before the index is computed, to build into ``out`` over an index of other inputs
    or settings (naming what differs) or over one that ``gdr index add`` has grown (a rebuild would drop the
    documents it placed); returns ``identity``, recorded in the manifest. An index of the same identity is rebuilt
    as it was."""
    grown = sorted(out.glob("manifest.add-*.json"))
    if grown:
        raise FileExistsError(f"{out}: gdr index add has placed documents into this index ({len(grown)} addition(s), "
                              f"{grown[-1].name}); building over it would drop them: pass another out=, or delete "
                              f"{out} to build this index there")
    was = recorded_identity(out, "index")
    if was is None:  # a new folder, or an index of an earlier gdr, which recorded none: built over
        return identity
    if was.get("method") != identity["method"]:
        raise FileExistsError(f"{out}: holds a {was.get('method')} index, not a {identity['method']} one; pass another "
                              f"out=, or delete {out} to build this one there")
    if was != identity:
        def unnest(ident: dict) -> dict:  # the settings named as the command's keys (``gc.alpha``)
            return {**{k: v for k, v in ident.items() if k != "settings"}, **(ident.get("settings") or {})}

        changed = what_differs(unnest(was), unnest(identity), inputs=_INPUTS)
        raise FileExistsError(f"{out}: holds an index of other inputs or settings ({changed}); pass another out=, "
                              f"or delete {out} to build this one there")
    return identity
