"""The real queries of one split of a run, restricted to the documents of its corpus.

:func:`split_queries` loads one split (a query set, a BEIR folder, the queries and judgements files of a file of
documents, or titles as queries) over a loaded corpus: the training queries of ``train``, the test queries of
``evaluate`` and ``bm25``. :func:`check_query_splits` reads every split a run will use before its first heavy
step, so a bad qrels or query line stops it in seconds.

A split is described by a plain ``queries`` section: ``name`` (a query set, a BEIR folder, ``jsonl``/``tsv``,
or ``titles``), ``split``, ``path``, and for titles ``seed`` and ``fractions``; the corpus by its ``data:``
settings (``name``, ``path``; title queries and query files are read from there).
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from gdr.data import (
    QUERY_SETS,
    file_format,
    load_docs_file,
    load_file_queries,
    load_queries,
    load_title_queries,
    load_trec,
)
from gdr.data.irds import PREFIX as IRDS_PREFIX
from gdr.data.irds import load_irds_query_sets
from gdr.rules import ConfigError

log = logging.getLogger(__name__)

__all__ = ["split_queries", "check_query_splits"]


def split_queries(q: dict[str, Any], data: dict[str, Any], corpus_ids: set[str], docs_tsv=None):
    """Queries of one split restricted to documents of the corpus (a :class:`gdr.data.QuerySet`); None when the
    corpus has none.

    ``q``: ``name`` (a query set, a BEIR folder, or ``titles``), ``split``, ``path``, and for titles ``seed``
    and ``fractions``; ``data``: the corpus's ``data:`` settings (``name``, ``path``; titles reload it)."""
    name = q.get("name")
    if not name:
        return None
    if name in ("jsonl", "tsv", "trec"):  # a file of documents: its queries and judgements are files of their own
        qs = _file_queries(data, corpus_ids)
        if qs is None:
            return None
    elif name == "irds" or name.startswith(IRDS_PREFIX):  # an ir_datasets id: its queries and qrels
        qs = load_irds_query_sets(data["id"] if name == "irds" else name[len(IRDS_PREFIX):],
                                  list(data.get("query_ids") or ()), query_field=data.get("query_field"),
                                  min_relevance=int(data.get("min_relevance") or 1))
    elif name == "titles":  # each title is the query of its own article (bbc, r2, r5)
        qs = load_title_queries(data["name"], path=data.get("path"), seed=int(q.get("seed") or 0),
                                fractions=tuple(q.get("fractions") or (0.8, 0.1, 0.1)))
    elif name not in QUERY_SETS and not (Path(name) / "queries.jsonl").exists():
        log.info("%s has no query set; no real queries", name)
        return None
    else:
        kw = {"path": q.get("path")} if q.get("path") else {}
        if data.get("drop_unknown_qrels"):  # a BEIR folder whose corpus.jsonl is a subset of its judgements'
            kw["drop_unknown_qrels"] = True
        if docs_tsv:
            kw["docs_tsv"] = docs_tsv
        qs = load_queries(name, **kw)
    if q["split"] not in qs.split_names:
        log.info("query set %s has no split %r (has %s); no real queries from it", name, q["split"], qs.split_names)
        return None
    qs = qs.filter(q["split"])
    keep_rel = [[d for d in rel if d in corpus_ids] for rel in qs.relevant]
    keep = np.array([len(r) > 0 for r in keep_rel], dtype=bool)
    if not keep.all():
        log.info("%d of %d %s queries have no relevant document in this corpus; dropped",
                 int((~keep).sum()), len(keep), q["split"])
    qs = qs.select(np.flatnonzero(keep))
    qs.relevant = [r for r, k in zip(keep_rel, keep) if k]
    return qs


def _file_queries(data: dict[str, Any], corpus_ids: set[str]):
    """The queries of ``data=jsonl|tsv|trec`` (``data.queries`` judged in ``data.qrels``), or None without them.
    Judgements are checked against every document of the file (a sample of ``n_docs`` keeps those of its own)."""
    if not data.get("qrels"):
        log.info("%s has no queries (data.queries, data.qrels); no real queries", data.get("path"))
        return None
    if not data.get("queries"):
        raise ValueError("data.qrels is set but data.queries is not: pass the queries file the judgements name")
    ids = corpus_ids
    if data.get("n_docs") or data.get("on_empty") == "drop":
        keys = ("text_fields", "title_fields", "encoding") if data["name"] == "trec" else (
            "id_field", "text_field", "title_field", "label_field")
        fields = {k: data[k] for k in keys if data.get(k)}
        ids = set((load_trec(data["path"], on_empty="keep", **fields) if data["name"] == "trec" else
                   load_docs_file(data["path"], fmt=data["name"], on_empty="keep", **fields)).doc_ids)
    topics = {k: data[k] for k in ("topic_fields", "min_relevance", "encoding") if data.get(k) is not None}
    return load_file_queries(data["queries"], data["qrels"], doc_ids=ids, name=Path(data["queries"]).stem,
                             drop_unknown=bool(data.get("drop_unknown_qrels")), **topics)


def check_query_splits(sections: Sequence[dict], data: dict, corpus_ids: Sequence[str], need: str | None = None,
                       docs_tsv: str | None = None) -> None:
    """Read the query set of every ``queries`` section (``{"name", "split", "path", ...}``, one per split a
    run will use) against the loaded corpus, so that a bad qrels or query line (an unknown document or
    query id: a :class:`gdr.data.DataError` naming file:line) stops it before its first heavy step rather
    than hours later; and the split ``need`` must hold a query with a relevant document."""

    ids = set(corpus_ids)
    for q in sections:
        qs = split_queries(q, data, ids, docs_tsv)
        if q["split"] == need and (qs is None or len(qs) == 0):
            files = data.get("name") in ("jsonl", "tsv", "trec") or file_format(str(data.get("name")))
            hint = ("; a file of documents takes its queries as data=jsonl|tsv|trec data.path=<documents> "
                    "data.queries=<queries file> data.qrels=<test.tsv>") if files else ""
            raise ConfigError(f"queries.test_split={need}: no {need!r} query of queries.name={q['name']} has a "
                              f"relevant document in this corpus, so nothing can be evaluated; choose another "
                              f"queries.test_split or queries.name{hint}")
