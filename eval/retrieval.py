"""Retrieval metrics, TREC run files and qrels.

Definitions, under ``ir_measures``' names (:meth:`RetrievalMetrics.as_dict` gives both spellings):

- **Success@k** (hit@k): the fraction of evaluated queries with at least one relevant document among
  the top ``k`` results. This is what NCI, BMI and the seed paper call "Recall@k" (they evaluate on
  NQ320K and MS MARCO, one relevant document per query, where the two coincide); kept here under the
  keys ``recall@k`` (:attr:`RetrievalMetrics.recall`) that the pipeline's outputs have always used.
- **R@k** (recall): per query, the relevant documents among the top ``k`` over all its relevant
  documents, averaged over queries (:attr:`RetrievalMetrics.r_at`).
- **RR@k** (MRR@k): the mean over evaluated queries of ``1 / r``, where ``r`` is the rank of
  the first relevant result, and 0 if there is none in the top k (keys ``mrr@k``).

A run of ``k`` results per query is measured at the depths it has (:func:`depths`): Success@1, Success@10,
Success@k, R@10, R@k and RR@k (:func:`metric_keys`), each named at its depth; a depth past k is never named, as a
run cut at 20 has no Success@100 of its own.

Evaluated queries are those with at least one relevant document in the qrels; a query of the qrels
absent from the run counts as a miss. A *rank* is normally the 1-based position in the ranked list;
a generative retriever gives one rank per *docid*, so documents that share a docid share its rank
(:class:`Run` carries explicit ranks for that case). Everything is computed on arrays: the run as
an int matrix of document indices (n_queries, depth), ranks the same shape.
"""
from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

import numpy as np

from gdr.io import atomic_write_json, atomic_write_text
from gdr.options import RankingOptions

log = logging.getLogger(__name__)

__all__ = [
    "Run", "RetrievalMetrics", "first_relevant_rank", "relevant_found", "metrics_from_ranks", "per_query_metrics",
    "evaluate_run", "write_trec_run", "write_qrels", "read_trec_run", "markdown_table", "write_per_query",
    "read_per_query", "depths", "metric_keys", "metric_name",
]


def depths(k: int) -> tuple[int, ...]:
    """The cut-offs a run of ``k`` results per query is measured at: 1, 10 and k, those up to k."""
    return tuple(sorted({d for d in (1, 10, int(k)) if d <= int(k)}))


def metric_keys(k: int) -> tuple[str, ...]:
    """The keys of the measures of a run of ``k`` results per query, in the order tables show them:
    ``recall@d`` (Success@d) for each of :func:`depths`, ``R@d`` from 10 up (R@1 is Success@1 where a query has one
    relevant document, and below it otherwise: it is kept in ``metrics.json``, not in the tables), ``mrr@k``
    (RR@k)."""
    ds = depths(k)
    return (*(f"recall@{d}" for d in ds), *(f"R@{d}" for d in ds if d >= 10 or d == int(k)), f"mrr@{int(k)}")


def metric_name(metric: str) -> str:
    """A metric key under ir_measures' name: ``recall@1`` (hit@1) is ``Success@1``, ``mrr@20`` ``RR@20``."""
    name, _, depth = metric.partition("@")
    return f"{ {'recall': 'Success', 'mrr': 'RR'}.get(name, name)}@{depth}"


@dataclass
class Run:
    """Ranked results per query, best first.

    qids : n_queries query ids
    doc_ids : per query, the ranked document ids
    scores : per query, the scores (same lengths as doc_ids)
    ranks : per query, 1-based ranks; None means position + 1. Documents sharing a docid share a rank.
    """

    qids: list[str]
    doc_ids: list[list[str]]
    scores: list[list[float]]
    ranks: list[list[int]] | None = None

    def __post_init__(self):
        if not (len(self.qids) == len(self.doc_ids) == len(self.scores)):
            raise ValueError(f"run has {len(self.qids)} qids, {len(self.doc_ids)} result lists, "
                             f"{len(self.scores)} score lists; they must match")
        if self.ranks is not None and len(self.ranks) != len(self.qids):
            raise ValueError(f"run has {len(self.qids)} qids but {len(self.ranks)} rank lists")

    def rank_lists(self) -> list[Sequence[int]]:
        if self.ranks is not None:
            return self.ranks
        return [range(1, len(d) + 1) for d in self.doc_ids]


@dataclass
class RetrievalMetrics:
    """Success@k (hit@k, ``recall``) and R@k (recall, ``r_at``, where known) for each k, and RR@mrr_depth, over
    ``n_queries`` evaluated queries."""

    n_queries: int
    recall: dict[int, float]
    mrr: float
    mrr_depth: int = 100
    extra: dict[str, float] = field(default_factory=dict)
    r_at: dict[int, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, float]:
        """``recall@k`` (Success@k) and ``mrr@<depth>``, the keys of the pipeline's outputs, then the same and R@k
        under ir_measures' names (``Success@k``, ``R@k``, ``RR@<depth>``)."""
        out: dict[str, float] = {f"recall@{k}": v for k, v in self.recall.items()}
        out[f"mrr@{self.mrr_depth}"] = self.mrr
        out.update({f"Success@{k}": v for k, v in self.recall.items()})
        out.update({f"R@{k}": v for k, v in self.r_at.items()})
        out[f"RR@{self.mrr_depth}"] = self.mrr
        out.update(self.extra)
        out["n_queries"] = self.n_queries
        return out


def first_relevant_rank(doc_idx: np.ndarray, ranks: np.ndarray, rel_query: np.ndarray,
                        rel_doc: np.ndarray) -> np.ndarray:
    """Rank of the first relevant result of each query; 0 if none.

    Parameters
    ----------
    doc_idx : int array of shape (n_queries, depth), document indices best first, -1 = padding
    ranks : int array of shape (n_queries, depth), 1-based rank of each entry
    rel_query, rel_doc : int arrays of shape (n_rel,), the relevant (query, document) pairs

    Returns int64 array of shape (n_queries,).
    """
    n_q, depth = doc_idx.shape
    hits = _hits(doc_idx, rel_query, rel_doc)
    r = np.where(hits, ranks, np.iinfo(np.int64).max).min(axis=1) if depth else np.full(n_q, np.iinfo(np.int64).max)
    return np.where(r == np.iinfo(np.int64).max, 0, r).astype(np.int64)


def _hits(doc_idx: np.ndarray, rel_query: np.ndarray, rel_doc: np.ndarray) -> np.ndarray:
    """Bool array of the shape of ``doc_idx`` (n_queries, depth): whether each entry is relevant to its query."""
    n_q = doc_idx.shape[0]
    n_docs = int(max(doc_idx.max(initial=-1), rel_doc.max(initial=-1))) + 1
    key = np.arange(n_q, dtype=np.int64)[:, None] * n_docs + doc_idx  # (n_q, depth)
    return np.isin(key, rel_query.astype(np.int64) * n_docs + rel_doc) & (doc_idx >= 0)


def relevant_found(doc_idx: np.ndarray, ranks: np.ndarray, rel_query: np.ndarray, rel_doc: np.ndarray,
                   ks: Sequence[int]) -> np.ndarray:
    """R@k per query: the relevant documents ranked ``<= k`` over the query's relevant documents, of shape
    (n_queries, len(ks)); arguments as in :func:`first_relevant_rank` (each relevant pair once)."""
    hits = _hits(doc_idx, rel_query, rel_doc)  # (n_q, depth)
    n_rel = np.bincount(rel_query.astype(np.int64), minlength=doc_idx.shape[0])  # (n_q,)
    kk = np.asarray(ks, dtype=np.int64)
    found = (hits[:, :, None] & (ranks[:, :, None] <= kk[None, None, :])).sum(axis=1)  # (n_q, len(ks))
    return found / np.maximum(n_rel, 1)[:, None]


def metrics_from_ranks(first_rank: np.ndarray, ks: Sequence[int] = (1, 10, 100),
                       mrr_depth: int = 100) -> RetrievalMetrics:
    """Recall@k and MRR@mrr_depth from first-relevant ranks of shape (n_queries,) (0 = not found)."""
    n = len(first_rank)
    if n == 0:
        return RetrievalMetrics(0, {k: float("nan") for k in ks}, float("nan"), mrr_depth)
    per_q = per_query_metrics(first_rank, ks, mrr_depth)
    recall = {int(k): float(per_q[f"recall@{int(k)}"].mean()) for k in ks}
    return RetrievalMetrics(n, recall, float(per_q[f"mrr@{mrr_depth}"].mean()), mrr_depth)


def per_query_metrics(first_rank: np.ndarray, ks: Sequence[int] = (1, 10, 100),
                      mrr_depth: int = 100) -> dict[str, np.ndarray]:
    """Per query: ``recall@k`` (1.0 or 0.0) for each k and the reciprocal rank ``mrr@<depth>``, from the
    first-relevant ranks of shape (n_queries,) (0 = not found). Their means are :func:`metrics_from_ranks`."""
    r = np.asarray(first_rank, dtype=np.int64)
    found = r > 0
    out = {f"recall@{int(k)}": (found & (r <= k)).astype(float) for k in ks}
    out[f"mrr@{mrr_depth}"] = np.where(found & (r <= mrr_depth), 1.0 / np.maximum(r, 1), 0.0)
    return out


def _qrels_pairs(qrels: Mapping[str, Iterable[str]]) -> tuple[list[str], list[str]]:
    qs, ds = [], []
    for q, docs in qrels.items():
        for d in docs:
            qs.append(q)
            ds.append(d)
    return qs, ds


def evaluate_run(run: Run, qrels: Mapping[str, Iterable[str]], ks: Sequence[int] = (1, 10, 100),
                 mrr_depth: int = 100) -> tuple[RetrievalMetrics, dict[str, int]]:
    """Evaluate ``run`` against ``qrels`` (qid -> relevant doc ids).

    Returns the metrics and, per evaluated qid, the rank of its first relevant result (0 = none).
    """
    qrels = {q: list(dict.fromkeys(ds)) for q, ds in qrels.items()}  # each relevant document once
    qrels = {q: ds for q, ds in qrels.items() if ds}
    eval_q = list(qrels)
    if not eval_q:
        raise ValueError("no query has a relevant document; nothing to evaluate")
    run_pos = {q: i for i, q in enumerate(run.qids)}
    missing = [q for q in eval_q if q not in run_pos]
    if missing:
        log.warning("%d of %d evaluated queries are missing from the run (counted as misses), e.g. %s",
                    len(missing), len(eval_q), missing[:3])
    depth = max((len(run.doc_ids[run_pos[q]]) for q in eval_q if q in run_pos), default=0)
    rank_lists = run.rank_lists()
    # one vocabulary of doc ids for run and qrels, built by np.unique (vectorised)
    rq, rd = _qrels_pairs(qrels)
    run_docs = [d for q in eval_q if q in run_pos for d in run.doc_ids[run_pos[q]]]
    vocab, inv = np.unique(np.asarray(run_docs + rd, dtype=object).astype(str), return_inverse=True)
    run_inv, rel_inv = inv[: len(run_docs)], inv[len(run_docs):]
    doc_idx = np.full((len(eval_q), depth), -1, dtype=np.int64)
    ranks = np.zeros((len(eval_q), depth), dtype=np.int64)
    lens = np.array([len(run.doc_ids[run_pos[q]]) if q in run_pos else 0 for q in eval_q], dtype=np.int64)
    rows = np.repeat(np.arange(len(eval_q)), lens)
    cols = np.arange(lens.sum()) - np.repeat(np.cumsum(lens) - lens, lens)
    doc_idx[rows, cols] = run_inv
    _refuse_repeats(doc_idx, eval_q, vocab)
    ranks[rows, cols] = np.fromiter((r for q in eval_q if q in run_pos for r in rank_lists[run_pos[q]]),
                                    dtype=np.int64, count=int(lens.sum()))
    qpos = {q: i for i, q in enumerate(eval_q)}
    rel_query = np.fromiter((qpos[q] for q in rq), dtype=np.int64, count=len(rq))
    first = first_relevant_rank(doc_idx, ranks, rel_query, rel_inv.astype(np.int64))
    metrics = metrics_from_ranks(first, ks, mrr_depth)
    r_at = relevant_found(doc_idx, ranks, rel_query, rel_inv.astype(np.int64), ks).mean(axis=0)  # (len(ks),)
    metrics.r_at = {int(k): float(v) for k, v in zip(ks, r_at)}
    return metrics, dict(zip(eval_q, first.tolist()))


def _refuse_repeats(doc_idx: np.ndarray, qids: Sequence[str], vocab: np.ndarray) -> None:
    """Refuse a run that lists a document twice for a query (``doc_idx`` as in :func:`first_relevant_rank`): R@k
    would count it twice."""
    s = np.sort(doc_idx, axis=1)
    twice = (s[:, 1:] == s[:, :-1]) & (s[:, 1:] >= 0)
    if twice.any():
        q, j = np.argwhere(twice)[0]
        raise ValueError(f"the run lists document {str(vocab[s[q, j + 1]])!r} twice for query {qids[q]!r} "
                         f"({int(twice.sum())} repeats in all); a run ranks each document once a query")


def write_trec_run(path: str | os.PathLike, run: Run, tag: str = RankingOptions.tag, depth: int = 100) -> None:
    """TREC run file: ``qid Q0 docid rank score tag``, the top ``depth`` entries of each query.

    Ranks are positions (1, 2, ...) as TREC requires; documents sharing a docid carry equal scores. Scores are
    written in full (the shortest text that reads back as the same float): trec_eval ignores the rank column and
    orders by score, so scores rounded into ties would be reordered by document id.
    """
    lines = []
    for q, docs, scores in zip(run.qids, run.doc_ids, run.scores):
        for i, (d, s) in enumerate(zip(docs[:depth], scores[:depth]), 1):
            lines.append(f"{q} Q0 {d} {i} {float(s)!r} {tag}\n")
    atomic_write_text(path, "".join(lines))


def write_qrels(path: str | os.PathLike, qrels: Mapping[str, Iterable[str]]) -> None:
    """TREC qrels: ``qid 0 docid 1`` per relevant pair."""
    atomic_write_text(path, "".join(f"{q} 0 {d} 1\n" for q, ds in qrels.items() for d in ds))


def read_trec_run(path: str | os.PathLike) -> Run:
    """Read a TREC run file, each query's entries in trec_eval's order: by score, highest first, ties by document
    id, the later in string order first (trec_eval ignores the rank column). A document listed twice for a query
    is refused, as trec_eval refuses it."""
    by_q: dict[str, list[tuple[float, str]]] = {}
    seen: dict[tuple[str, str], int] = {}
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            parts = line.split()
            if not parts:
                continue
            if len(parts) != 6:
                raise ValueError(f"{path}:{lineno}: expected `qid Q0 docid rank score tag`, got {line.strip()!r}")
            q, d = parts[0], parts[2]
            if (q, d) in seen:
                raise ValueError(f"{path}:{lineno}: document {d!r} is listed twice for query {q!r} (first at line "
                                 f"{seen[q, d]}); a run ranks each document once a query: keep its best entry")
            seen[q, d] = lineno
            try:
                by_q.setdefault(q, []).append((float(parts[4]), d))
            except ValueError:
                raise ValueError(f"{path}:{lineno}: the score {parts[4]!r} is not a number") from None
    qids = list(by_q)
    rows = [sorted(by_q[q], reverse=True) for q in qids]
    return Run(qids, [[d for _, d in r] for r in rows], [[s for s, _ in r] for r in rows])


def markdown_table(rows: Mapping[str, Mapping[str, float]], columns: Sequence[str] | None = None) -> str:
    """A markdown table: one row per system, metrics as percentages (n_queries as is)."""
    if not rows:
        return ""
    columns = list(columns or next(iter(rows.values())).keys())
    head = "| system | " + " | ".join(columns) + " |"
    sep = "|---|" + "---:|" * len(columns)
    body = []
    for name, m in rows.items():
        cells = []
        for c in columns:
            v = m.get(c, float("nan"))
            cells.append(str(int(v)) if c == "n_queries" else f"{100 * float(v):.2f}")
        body.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join([head, sep, *body]) + "\n"


PER_QUERY_FILE = "per_query.json"


def write_per_query(path: str | os.PathLike, first: Mapping[str, int]) -> None:
    """Per evaluated query, the rank of its first relevant result (0 = none): ``{"qids": [...],
    "first_rank": [...]}``, from which :func:`per_query_metrics` gives R@k and the reciprocal rank."""
    atomic_write_json(path, {"qids": list(first), "first_rank": [int(r) for r in first.values()]})


def read_per_query(path: str | os.PathLike) -> tuple[list[str], np.ndarray]:
    """(query ids, first-relevant ranks) written by :func:`write_per_query`."""
    with open(path, encoding="utf-8") as f:
        d = json.load(f)
    if not isinstance(d, dict) or len(d.get("qids", [])) != len(d.get("first_rank", [None])):
        raise ValueError(f"{path}: expected {{\"qids\": [...], \"first_rank\": [...]}} of equal lengths; "
                         "re-run the evaluation that wrote it")
    return [str(q) for q in d["qids"]], np.asarray(d["first_rank"], dtype=np.int64)
