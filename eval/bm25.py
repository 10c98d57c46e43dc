"""BM25 reference (``bm25s``) on the same corpus and queries as the generative retriever."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from gdr.eval.retrieval import Run
from gdr.options import RankingOptions

log = logging.getLogger(__name__)

__all__ = ["BM25Result", "BM25Index", "bm25_search", "bm25_run"]


@dataclass
class BM25Result:
    """doc_idx : int64 (n_queries, k) document indices best first, -1 where fewer matched
    scores : float32 (n_queries, k), BM25 scores (-inf where doc_idx = -1)"""

    doc_idx: np.ndarray
    scores: np.ndarray


class BM25Index:
    """A BM25 index (Lucene variant, no stemming) of ``doc_texts``, built once and searched many times.

    Documents that share no term with a query (score 0) are dropped from its list. Given the documents' ids
    (``doc_ids``), equal scores are listed in trec_eval's order, the later id in string order first, so that a
    TREC file of the results reads back, in gdr (:func:`gdr.eval.retrieval.read_trec_run`) and in trec_eval, in
    the order they were evaluated in; without ids, in bm25s's order.
    """

    def __init__(self, doc_texts: Sequence[str], k1: float = 1.5, b: float = 0.75, stopwords: str | None = "en",
                 show_progress: bool = False, doc_ids: Sequence[str] | None = None):
        import bm25s  # optional: gdr[eval]

        if not doc_texts:
            raise ValueError("BM25 needs at least one document")
        if doc_ids is not None and len(doc_ids) != len(doc_texts):
            raise ValueError(f"{len(doc_ids)} doc_ids for {len(doc_texts)} documents")
        self.id_place = None  # each document's place in the string order of the ids
        if doc_ids is not None:
            self.id_place = np.empty(len(doc_ids), dtype=np.int64)
            self.id_place[np.argsort(np.asarray(doc_ids, dtype=str), kind="stable")] = np.arange(len(doc_ids))
        self.n_docs, self.stopwords, self.show_progress = len(doc_texts), stopwords, show_progress
        self.retriever = bm25s.BM25(k1=k1, b=b)
        self.retriever.index(bm25s.tokenize(list(doc_texts), stopwords=stopwords, show_progress=show_progress),
                             show_progress=show_progress)

    def search(self, queries: Sequence[str], k: int = RankingOptions.k) -> BM25Result:
        """Top-k documents per query."""
        import bm25s  # optional: gdr[eval]

        q_tok = bm25s.tokenize(list(queries), stopwords=self.stopwords, return_ids=False,
                               show_progress=self.show_progress)
        kk = min(k, self.n_docs)
        docs, scores = self.retriever.retrieve(q_tok, k=kk, show_progress=self.show_progress)
        docs = np.asarray(docs, dtype=np.int64)
        scores = np.asarray(scores, dtype=np.float32)
        keep = scores > 0
        docs = np.where(keep, docs, -1)
        scores = np.where(keep, scores, -np.inf).astype(np.float32)
        if self.id_place is not None:  # score descending, then the later id first
            later_first = np.where(keep, -self.id_place[np.maximum(docs, 0)], 0)
            order = np.lexsort((later_first, -scores), axis=-1)
            docs, scores = np.take_along_axis(docs, order, axis=1), np.take_along_axis(scores, order, axis=1)
        if kk < k:
            docs = np.pad(docs, ((0, 0), (0, k - kk)), constant_values=-1)
            scores = np.pad(scores, ((0, 0), (0, k - kk)), constant_values=-np.inf)
        return BM25Result(docs, scores)


def bm25_search(doc_texts: Sequence[str], queries: Sequence[str], k: int = RankingOptions.k, k1: float = 1.5,
                b: float = 0.75, stopwords: str | None = "en", show_progress: bool = False) -> BM25Result:
    """Top-k BM25 documents per query (:class:`BM25Index` built for this one search)."""
    return BM25Index(doc_texts, k1=k1, b=b, stopwords=stopwords, show_progress=show_progress).search(queries, k=k)


def bm25_run(doc_ids: Sequence[str], doc_texts: Sequence[str], qids: Sequence[str], queries: Sequence[str],
             k: int = RankingOptions.k, **kw) -> Run:
    """BM25 results as a :class:`~gdr.eval.retrieval.Run` (equal scores in trec_eval's order: :class:`BM25Index`)."""
    ids = list(doc_ids)
    res = BM25Index(doc_texts, doc_ids=ids, **kw).search(queries, k=k)
    ids = np.asarray(ids, dtype=object)
    out_docs, out_scores = [], []
    for d, s in zip(res.doc_idx, res.scores):
        m = d >= 0
        out_docs.append(ids[d[m]].tolist())
        out_scores.append(s[m].astype(float).tolist())
    return Run(list(qids), out_docs, out_scores)
