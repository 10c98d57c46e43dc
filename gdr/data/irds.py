"""Collections by ir_datasets id (``data=irds data.id=beir/scifact/test``, ``load_corpus("irds:<id>")``).

ir_datasets downloads a collection once into its own cache (``$IR_DATASETS_HOME``, default ``~/.ir_datasets``) and
reads it from there; gdr reads its documents, queries and qrels through it and keeps nothing of its own.

- Documents: ``doc_id``; the text is the ``text`` field (the ``title`` field, where there is one, the title), or
  for documents without a ``text`` field ir_datasets' ``default_text()`` (e.g. a TREC document's body).
- Queries: the ``text`` field, or ``query_field`` (``description`` of a TREC topic), else ``default_text()``.
  Only queries with a relevant judgement (``relevance >= min_relevance``) are kept; grades are kept.
- The split: an id names one query set; its split is the last part of the id that is ``train``, ``dev``
  (``valid``, ``validation``) or ``test`` (``msmarco-passage/dev/small`` -> dev), else ``test``
  (``vaswani``, ``cranfield``), as a qrels file not named after a split is the test split. ``query_ids`` (ids of
  the same documents) add their splits: ``data.id=beir/scifact/test data.query_ids=[beir/scifact/train]``.
- ``n_docs``: a subset, judged documents first. Documents judged relevant by a query of the id come first, then
  the other judged ones, then the rest; within each group a uniform draw with ``seed``; kept in collection order.
  The collection is read once, holding at most ``2 * n_docs`` documents' texts at a time.
"""
from __future__ import annotations

import difflib
import functools
import logging
from typing import Any

import numpy as np

from gdr.data.core import Corpus, DataError, DocTable, QuerySet
from gdr.data.options import DataOptions

log = logging.getLogger(__name__)

__all__ = ["PREFIX", "irds_split", "load_irds", "load_irds_queries", "load_irds_query_sets", "irds_problem"]

PREFIX = "irds:"  # load_corpus("irds:<id>")
_SPLIT_WORDS = {"train": "train", "dev": "dev", "valid": "dev", "validation": "dev", "test": "test"}
INSTALL = "pip install 'gdr[irds]' (or pip install ir_datasets)"


def _ir_datasets():
    try:
        import ir_datasets  # optional: the gdr[irds] extra
    except ImportError as e:
        raise ImportError(f"data=irds needs ir_datasets: {INSTALL}") from e
    return ir_datasets


def irds_problem(dataset_id: Any) -> str | None:
    """Why ``dataset_id`` is not a dataset ir_datasets knows (with the closest ids), or None."""
    if not isinstance(dataset_id, str) or not dataset_id.strip():
        return "must be an ir_datasets id (e.g. beir/scifact/test, vaswani, msmarco-passage/dev/small)"
    try:
        ird = _ir_datasets()
    except ImportError as e:
        return str(e)
    try:
        ird.load(dataset_id)
    except KeyError:
        close = difflib.get_close_matches(dataset_id, list(ird.registry), n=3)
        return ("is not an ir_datasets id" + (f"; did you mean {', '.join(close)}?" if close else
                                               "; see https://ir-datasets.com for the ids"))
    return None


def _load(dataset_id: str):
    _ir_datasets()  # a missing package is an ImportError naming the extra, not a bad id
    problem = irds_problem(dataset_id)
    if problem:
        raise ValueError(f"ir_datasets id {dataset_id!r}: {problem}")
    return _ir_datasets().load(dataset_id)


def irds_split(dataset_id: str) -> str:
    """The query split an id names: the last of its parts that is a split word, else ``test``."""
    words = [_SPLIT_WORDS[p] for p in dataset_id.split("/") if p in _SPLIT_WORDS]
    return words[-1] if words else "test"


def _doc_text(doc) -> tuple[str, str | None]:
    """(text, title) of one ir_datasets document."""
    fields = doc._fields
    if "text" in fields:
        return doc.text or "", (doc.title or None) if "title" in fields else None
    if hasattr(doc, "default_text"):
        return doc.default_text() or "", None
    return " ".join(str(getattr(doc, f)) for f in fields if f != "doc_id" and isinstance(getattr(doc, f), str)), None


def _judged(datasets, min_relevance: int) -> tuple[set[str], set[str]]:
    """(documents judged relevant, documents judged at all) by the qrels of ``datasets`` (those that have qrels)."""
    relevant, judged = set(), set()
    for ds in datasets:
        if not ds.has_qrels():
            continue
        for q in ds.qrels_iter():
            judged.add(q.doc_id)
            if q.relevance >= min_relevance:
                relevant.add(q.doc_id)
    return relevant, judged


def _fetched(load):
    """``load`` with its collection's files failing to come (ir_datasets downloads them on first use; without a
    network, or with the server down, that is an OSError, as requests' errors are) as one line naming the id."""
    @functools.wraps(load)
    def inner(dataset_id: str, *args, **kwargs):
        try:
            return load(dataset_id, *args, **kwargs)
        except OSError as e:
            first = (str(e).strip().splitlines() or [""])[0][:200]
            raise DataError(f"ir_datasets id {dataset_id!r}: its files could not be read or downloaded "
                            f"({type(e).__name__}: {first}); check the network, or fetch them on a machine that has "
                            "one and copy its $IR_DATASETS_HOME (default ~/.ir_datasets) here") from e
    return inner


@_fetched
def load_irds(dataset_id: str, *, n_docs: int | None = None, seed: int = DataOptions.seed, on_empty: str = "error",
              min_relevance: int = DataOptions.min_relevance, judged_by: tuple[str, ...] | list[str] = ()) -> Corpus:
    """The documents of ir_datasets' ``dataset_id`` (all, or ``n_docs`` of them, judged ones first: judged by the
    qrels of ``dataset_id`` and of the ids ``judged_by``)."""
    ds = _load(dataset_id)
    if not ds.has_docs():
        raise DataError(f"ir_datasets id {dataset_id!r} has no documents (it provides {ds!r}); name a dataset that "
                        "has them (its parent id, e.g. beir/scifact for beir/scifact/test)")
    source = f"ir_datasets:{dataset_id}"
    table = DocTable(on_empty=on_empty)
    if n_docs is None:
        for doc in ds.docs_iter():
            text, title = _doc_text(doc)
            table.add(str(doc.doc_id), text, title, where=f"{source} doc {doc.doc_id}")
        return table.build(dataset_id, source)
    relevant, judged = _judged([ds, *(_load(i) for i in judged_by)], min_relevance)
    kept, n_seen = _subset(ds.docs_iter(), n_docs, seed, relevant, judged)
    for _, doc in sorted(kept, key=lambda r: r[0]):  # collection order
        text, title = _doc_text(doc)
        table.add(str(doc.doc_id), text, title, where=f"{source} doc {doc.doc_id}")
    n_rel = sum(str(d.doc_id) in relevant for _, d in kept)
    info = {"sample": {"n": len(kept), "seed": int(seed), "of": n_seen, "judged_relevant": n_rel,
                       "judged": sum(str(d.doc_id) in judged for _, d in kept)}}
    if n_rel < len(relevant):
        log.warning("%s: n_docs=%d holds %d of the %d documents judged relevant; queries whose relevant documents "
                    "are all left out are dropped", source, n_docs, n_rel, len(relevant))
    return table.build(dataset_id, source, info)


def _subset(docs, n: int, seed: int, relevant: set[str], judged: set[str]) -> tuple[list, int]:
    """``n`` of ``docs`` by (group, random key): relevant-judged (0), judged (1), the rest (2), a seeded uniform draw
    within each group. Returns ([(position, doc)], documents seen); pruned to ``n`` whenever ``2 n`` are held."""
    rng = np.random.default_rng(seed)
    held: list[tuple[int, Any]] = []
    keys = np.zeros((0,), dtype=np.float64)  # (len(held),) group + a uniform key in [0, 1)
    pending: list[float] = []
    n_seen = 0
    for pos, doc in enumerate(docs):
        d = str(doc.doc_id)
        group = 0.0 if d in relevant else 1.0 if d in judged else 2.0
        held.append((pos, doc))
        pending.append(group)
        n_seen = pos + 1
        if len(held) >= 2 * n:
            keys = np.concatenate([keys, np.asarray(pending) + rng.random(len(pending))])
            pending = []
            best = np.sort(np.argpartition(keys, n - 1)[:n])
            held, keys = [held[i] for i in best], keys[best]
    keys = np.concatenate([keys, np.asarray(pending, dtype=np.float64) + rng.random(len(pending))])
    if len(held) > n:
        best = np.sort(np.argpartition(keys, n - 1)[:n])
        held = [held[i] for i in best]
    return held, n_seen


def load_irds_query_sets(dataset_id: str, query_ids=(), *, query_field: str | None = None,
                         min_relevance: int = DataOptions.min_relevance) -> QuerySet:
    """The queries of ``dataset_id`` and of each of ``query_ids`` (ids of the same documents, e.g.
    ``beir/scifact/train`` beside ``beir/scifact/test``), each in the split its id names, as one set."""
    sets = [load_irds_queries(i, query_field=query_field, min_relevance=min_relevance)
            for i in (dataset_id, *query_ids)]
    if query_ids:
        ird = _ir_datasets()
        docs = ird.docs_parent_id(dataset_id)
        other = next((i for i in query_ids if ird.docs_parent_id(i) != docs), None)
        if other is not None:
            raise DataError(f"data.query_ids: {other!r} judges the documents of {ird.docs_parent_id(other)!r}, "
                            f"data.id={dataset_id!r} those of {docs!r}; name ids of one collection")
    splits = [qs.splits[0] for qs in sets if len(qs)]
    if len(set(splits)) != len(splits):
        raise DataError(f"data.id and data.query_ids name the split {max(splits, key=splits.count)!r} twice "
                        f"({', '.join((dataset_id, *query_ids))}); each id gives one split (train, dev, test)")
    return QuerySet(name=dataset_id, qids=[q for qs in sets for q in qs.qids],
                    texts=[t for qs in sets for t in qs.texts], relevant=[r for qs in sets for r in qs.relevant],
                    splits=[x for qs in sets for x in qs.splits], grades=[g for qs in sets for g in qs.grades],
                    info={"source": ", ".join(qs.info["source"] for qs in sets),
                          "filtered": {"no_relevant": sum(qs.info["filtered"]["no_relevant"] for qs in sets)}})


@_fetched
def load_irds_queries(dataset_id: str, *, query_field: str | None = None,
                      min_relevance: int = DataOptions.min_relevance) -> QuerySet:
    """The queries of ``dataset_id`` that have a relevant judgement, in the split the id names (:func:`irds_split`),
    relevant documents in qrels order with their grades."""
    ds = _load(dataset_id)
    if not (ds.has_queries() and ds.has_qrels()):
        raise DataError(f"ir_datasets id {dataset_id!r} has no queries with qrels (it provides {ds!r}); name a "
                        "dataset with both, e.g. beir/scifact/test")
    texts: dict[str, str] = {}
    for q in ds.queries_iter():
        if query_field is not None and query_field not in q._fields:
            raise DataError(f"ir_datasets id {dataset_id!r}: its queries have no field {query_field!r} (they have "
                            f"{', '.join(q._fields)}); set data.query_field to one of them or null")
        field = query_field or ("text" if "text" in q._fields else None)
        texts[str(q.query_id)] = getattr(q, field) if field else q.default_text()
    rel: dict[str, list[str]] = {}
    grades: dict[str, list[int]] = {}
    unknown = 0
    for j in ds.qrels_iter():
        qid = str(j.query_id)
        if qid not in texts:
            unknown += 1
            continue
        if j.relevance >= min_relevance:
            rel.setdefault(qid, []).append(str(j.doc_id))
            grades.setdefault(qid, []).append(int(j.relevance))
    qids = [q for q in texts if q in rel]
    split = irds_split(dataset_id)
    info = {"source": f"ir_datasets:{dataset_id}",
            "filtered": {"no_relevant": len(texts) - len(qids), **({"unknown_query": unknown} if unknown else {})}}
    return QuerySet(name=dataset_id, qids=qids, texts=[texts[q] for q in qids], relevant=[rel[q] for q in qids],
                    splits=[split] * len(qids), grades=[grades[q] for q in qids], info=info)
