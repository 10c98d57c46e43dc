"""The real queries of one split of a run, restricted to the documents of its corpus.

:func:`split_queries` loads one split (a query set, a BEIR folder, the queries and judgements files of a file of
documents, or titles as queries) over a loaded corpus: the training queries of ``train``, the test queries of
``evaluate`` and ``bm25``. :func:`check_query_splits` reads every split a run will use before its first heavy
step, so a bad qrels or query line stops it in seconds.

A split is described by a plain ``queries`` section: ``name`` (a query set, a BEIR folder, ``jsonl``/``tsv``,
or ``titles``), ``split``, ``path``, and for titles ``seed`` and ``fractions``; the corpus by its ``data:``
settings (``name``, ``path``; title queries and query files are read from there).

Real topics are split by a setting where the section says so, over every topic of the query set (all its splits
pooled, a topic judged in several joined) that has a relevant document in the corpus:

- ``fractions`` (with ``seed``): train/dev/test by :func:`gdr.data.titles.split_of` of the topic id, as titles
  are split by document id (a topic keeps its split whatever other topics there are);
- ``folds`` (with ``seed`` and ``fold``): K folds of equal size (:func:`fold_of`); the topics of fold ``fold``
  are the test split and the others the train split; ``fold: null`` puts every topic in the asked split (the
  union of the held-out folds, BM25's test queries; every topic that some retriever trains on).
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from gdr.data import (
    file_format,
    load_docs_file,
    load_file_queries,
    load_queries,
    load_title_queries,
    load_trec,
    reads_query_set,
)
from gdr.data.core import QuerySet
from gdr.data.irds import PREFIX as IRDS_PREFIX
from gdr.data.irds import load_irds_query_sets
from gdr.data.options import DataOptions
from gdr.data.titles import TITLE_FRACTIONS, split_of, unit_hash
from gdr.rules import ConfigError

log = logging.getLogger(__name__)

__all__ = ["split_queries", "QuerySplits", "check_query_splits", "fold_of", "resplits"]


def split_queries(q: dict[str, Any], data: dict[str, Any], corpus_ids: set[str], docs_tsv=None):
    """Queries of one split restricted to documents of the corpus (a :class:`gdr.data.QuerySet`); None when the
    corpus has none.

    ``q``: ``name`` (a query set, a BEIR folder, or ``titles``), ``split``, ``path``, and for titles ``seed``
    and ``fractions``; ``fractions`` or ``folds`` and ``fold`` (with ``seed``) split real topics (module
    docstring); ``data``: the corpus's ``data:`` settings (``name``, ``path``; titles reload it)."""
    return _choose(_query_set(q, data, corpus_ids, docs_tsv), q, corpus_ids)


class QuerySplits:
    """The real queries of a run's splits over one loaded corpus, each query set read once: ``splits(q)`` is
    :func:`split_queries` of the section ``q``; the sections of one query set (its train and test splits, its
    folds) share one reading of its files, and every stage after the first gets the split already made."""

    def __init__(self, data: dict[str, Any], corpus_ids: Sequence[str], docs_tsv=None):
        self.data, self.ids, self.docs_tsv = data, set(corpus_ids), docs_tsv
        self._sets: dict[str, QuerySet | None] = {}
        self._splits: dict[str, QuerySet | None] = {}

    def __call__(self, q: dict[str, Any]) -> QuerySet | None:
        key = json.dumps(q, sort_keys=True)
        if key not in self._splits:
            read = json.dumps(_read_by(q), sort_keys=True)
            if read not in self._sets:
                self._sets[read] = _query_set(q, self.data, self.ids, self.docs_tsv)
            self._splits[key] = _choose(self._sets[read], q, self.ids)
        return self._splits[key]


def _read_by(q: dict[str, Any]) -> dict[str, Any]:
    """What of the section ``q`` decides the query set read (:func:`_query_set`), not the split taken from it."""
    return {k: q.get(k) for k in ("name", "path", *(("seed", "fractions") if q.get("name") == "titles" else ()))}


def _query_set(q: dict[str, Any], data: dict[str, Any], corpus_ids: set[str], docs_tsv=None) -> QuerySet | None:
    """The whole query set the section ``q`` names, every split, as its files hold it (None: no queries)."""
    name = q.get("name")
    if not name:
        return None
    if name in ("jsonl", "tsv", "trec"):  # a file of documents: its queries and judgements are files of their own
        return _file_queries(data, corpus_ids)
    if name == "irds" or name.startswith(IRDS_PREFIX):  # an ir_datasets id: its queries and qrels
        return load_irds_query_sets(data["id"] if name == "irds" else name[len(IRDS_PREFIX):],
                                    list(data.get("query_ids") or ()), query_field=data.get("query_field"),
                                    min_relevance=int(data.get("min_relevance") or DataOptions.min_relevance))
    if name == "titles":  # each title is the query of its own article (bbc, r2, r5)
        return load_title_queries(data["name"], path=data.get("path"), seed=int(q.get("seed") or 0),
                                  fractions=tuple(q.get("fractions") or TITLE_FRACTIONS))
    if not reads_query_set(name):
        log.info("%s has no query set; no real queries", name)
        return None
    kw = {"path": q.get("path")} if q.get("path") else {}
    if data.get("drop_unknown_qrels"):  # a BEIR folder whose corpus.jsonl is a subset of its judgements'
        kw["drop_unknown_qrels"] = True
    if data.get("min_relevance") is not None:  # a BEIR folder's graded qrels (the other sets keep their own)
        kw["min_relevance"] = int(data["min_relevance"])
    if docs_tsv:
        kw["docs_tsv"] = docs_tsv
    return load_queries(name, **kw)


def _choose(qs: QuerySet | None, q: dict[str, Any], corpus_ids: set[str]) -> QuerySet | None:
    """The split of the section ``q`` out of its query set ``qs``, restricted to the corpus (None: no queries)."""
    if qs is None:
        return None
    name = q.get("name")
    if resplits(q):
        qs = _assign_splits(_in_corpus(_pooled(qs), corpus_ids, "topics"), q)
        mine = np.flatnonzero(np.asarray(qs.splits, dtype=object) == q["split"])
        if len(mine) == 0:
            log.info("no topic of %s falls in split %r as %s splits them; no real queries from it", name,
                     q["split"], qs.info["split_by"])
            return None
        return qs.select(mine)
    if q["split"] not in qs.split_names:
        log.info("query set %s has no split %r (has %s); no real queries from it", name, q["split"], qs.split_names)
        return None
    return _in_corpus(qs.filter(q["split"]), corpus_ids, q["split"])


def resplits(q: dict[str, Any]) -> bool:
    """Whether the section ``q`` splits the topics itself (``folds``, or ``fractions`` of real topics) rather than
    taking the query set's own splits."""
    return bool(q.get("folds")) or bool(q.get("fractions")) and q.get("name") != "titles"


def fold_of(qids: Sequence[str], k: int, seed: int = 0) -> np.ndarray:
    """The fold in [0, k) of each topic id, of shape (n,): the topics in the order of a seeded hash of their ids
    (:func:`gdr.data.titles.unit_hash`) dealt round-robin, so the folds differ in size by at most one and the same
    topics with the same seed give the same folds in any order."""
    order = np.argsort(unit_hash(qids, seed), kind="stable")
    fold = np.empty(len(qids), dtype=np.int64)
    fold[order] = np.arange(len(qids)) % k
    return fold


def _pooled(qs: QuerySet) -> QuerySet:
    """Every topic of ``qs`` once, whatever split it came in; a topic judged in several splits keeps its first
    text and the union of its judgements. The judgements a loader dropped (``info["unknown_qrels"]`` per split)
    no longer belong to a split: their total is kept under ``"pooled"``."""
    row: dict[str, int] = {}  # topic id -> its row in the pooled set
    src: list[int] = []  # the row of ``qs`` each pooled topic takes its text from
    relevant: list[list[str]] = []
    grades: list[list[int]] | None = None if qs.grades is None else []
    for i, qid in enumerate(qs.qids):
        j = row.setdefault(qid, len(src))
        if j == len(src):
            src.append(i)
            relevant.append(list(qs.relevant[i]))
            if grades is not None:
                grades.append(list(qs.grades[i]))
            continue
        for n, d in enumerate(qs.relevant[i]):  # the same topic in another split: its new judgements join
            if d not in relevant[j]:
                relevant[j].append(d)
                if grades is not None:
                    grades[j].append(qs.grades[i][n])
    info = {k: v for k, v in qs.info.items() if k != "unknown_qrels"}
    unknown = sum((qs.info.get("unknown_qrels") or {}).values())
    if unknown:
        info["unknown_qrels"] = {"pooled": int(unknown)}
    return QuerySet(name=qs.name, qids=list(row), texts=[qs.texts[i] for i in src], relevant=relevant,
                    splits=["test"] * len(src), grades=grades, info=info)


def _assign_splits(qs: QuerySet, q: dict[str, Any]) -> QuerySet:
    """``qs`` with each topic's split as the section ``q`` assigns it (module docstring)."""
    seed = int(q.get("seed") or 0)
    if q.get("folds"):
        if q.get("fold") is None:
            splits = [q["split"]] * len(qs)
        else:
            held_out = fold_of(qs.qids, int(q["folds"]), seed) == int(q["fold"])
            splits = np.where(held_out, "test", "train").tolist()
        how = {"folds": int(q["folds"]), "fold": q.get("fold"), "seed": seed}
    else:
        splits = split_of(qs.qids, seed, q["fractions"])
        how = {"fractions": [float(x) for x in q["fractions"]], "seed": seed}
    return QuerySet(name=qs.name, qids=qs.qids, texts=qs.texts, relevant=qs.relevant, splits=splits,
                    grades=qs.grades, info={**qs.info, "split_by": how})


def _in_corpus(qs: QuerySet, corpus_ids: set[str], what: str) -> QuerySet:
    """The queries of ``qs`` with their relevant documents (and those documents' grades) restricted to
    ``corpus_ids``; a query left with none is dropped (said in the log)."""
    inside = [[d in corpus_ids for d in rel] for rel in qs.relevant]
    keep_rel = [[d for d, k in zip(rel, m) if k] for rel, m in zip(qs.relevant, inside)]
    keep = np.array([len(r) > 0 for r in keep_rel], dtype=bool)
    if not keep.all():
        log.info("%d of %d %s queries have no relevant document in this corpus; dropped",
                 int((~keep).sum()), len(keep), what)
    out = qs.select(np.flatnonzero(keep))
    out.relevant = [r for r, k in zip(keep_rel, keep) if k]
    if qs.grades is not None:
        out.grades = [[g for g, k in zip(gs, m) if k] for gs, m, q in zip(qs.grades, inside, keep) if q]
    return out


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


def check_query_splits(sections: Sequence[dict], splits: QuerySplits, need: str | None = None) -> None:
    """Read the query set of every ``queries`` section (``{"name", "split", "path", ...}``, one per split a
    run will use) against the loaded corpus (``splits``, which keeps them for the run), so that a bad qrels or
    query line (an unknown document or query id: a :class:`gdr.data.DataError` naming file:line) stops it before
    its first heavy step rather than hours later; and the split ``need`` must hold a query with a relevant
    document."""
    data = splits.data
    for q in sections:
        qs = splits(q)
        n = 0 if qs is None else len(qs)
        if q.get("folds") and q.get("fold") is None and n < int(q["folds"]):
            raise ConfigError(f"queries.folds={q['folds']}: only {n} topic(s) of queries.name={q['name']} have a "
                              f"relevant document in this corpus, fewer than the folds, so some fold would have no "
                              f"test topic; lower queries.folds")
        if q["split"] == need and (qs is None or len(qs) == 0):
            files = data.get("name") in ("jsonl", "tsv", "trec") or file_format(str(data.get("name")))
            hint = ("; a file of documents takes its queries as data=jsonl|tsv|trec data.path=<documents> "
                    "data.queries=<queries file> data.qrels=<test.tsv>") if files else ""
            raise ConfigError(f"queries.test_split={need}: no {need!r} query of queries.name={q['name']} has a "
                              f"relevant document in this corpus, so nothing can be evaluated; choose another "
                              f"queries.test_split or queries.name{hint}")
