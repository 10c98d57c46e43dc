"""Stage ``bm25``: BM25 (bm25s) on the test queries, the reference every retriever is compared with."""
from __future__ import annotations

from pathlib import Path

from gdr.data.options import DataOptions
from gdr.eval.bm25 import bm25_run
from gdr.eval.retrieval import PER_QUERY_FILE, depths, evaluate_run, write_per_query, write_qrels, write_trec_run
from gdr.guard import holding
from gdr.io import atomic_write_json
from gdr.stages.command_keys import EvaluateQueries
from gdr.stages.settings import EvaluateSettings

__all__ = ["bm25_baseline"]


def bm25_baseline(corpus, queries, out: str | Path, k: int = EvaluateSettings.k, split: str = EvaluateQueries.split,
                  drop_unknown_qrels: bool = DataOptions.drop_unknown_qrels) -> dict:
    """BM25 over ``corpus`` for the ``split`` queries of ``queries`` (a :class:`gdr.data.QuerySet` over it) into
    ``out``: ``bm25.trec``, ``qrels.txt``, ``metrics.json`` and ``per_query.json``; returns ``{"metrics":
    {recall@1, recall@10, recall@k, mrr@k, ...}}`` (measured at the ``k`` results per query:
    :func:`gdr.eval.retrieval.metric_keys`). A relevant id not in ``corpus`` is refused, or dropped
    with ``drop_unknown_qrels`` (:meth:`gdr.data.QuerySet.judged_in`; ``metrics.json`` counts them)."""
    qs, unknown = queries.scored_split(corpus, split, drop_unknown_qrels)
    with holding(out):  # one writer per folder
        return _bm25_baseline(corpus, qs, Path(out), int(k), split, unknown)


def _bm25_baseline(corpus, qs, out: Path, k: int, split: str, unknown: int) -> dict:
    qrels = {q: list(rel) for q, rel in zip(qs.qids, qs.relevant)}
    run = bm25_run(corpus.doc_ids, corpus.model_inputs(), qs.qids, qs.texts, k=int(k))
    metrics, first = evaluate_run(run, qrels, ks=depths(k), mrr_depth=k)
    write_per_query(out / PER_QUERY_FILE, first)  # per-query metrics for the paired tests (eval/compare.py)
    write_trec_run(out / "bm25.trec", run, tag="bm25", depth=int(k))
    write_qrels(out / "qrels.txt", qrels)
    m = metrics.as_dict()
    atomic_write_json(out / "metrics.json", {"split": split, "systems": {"bm25": m},
                                             **({"unknown_qrels": unknown} if unknown else {})})
    return {"metrics": m}
