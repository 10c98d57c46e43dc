"""Stage ``evaluate``: Success@k, R@k and RR@k of a trained retriever on held-out queries (BM25 beside it), each
named at the depth it was measured at (``k``: the results per query)."""
from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Sequence

from gdr.data.core import DataError
from gdr.data.options import DataOptions
from gdr.eval.bm25 import bm25_run
from gdr.eval.retrieval import (
    PER_QUERY_FILE,
    Run,
    depths,
    evaluate_run,
    markdown_table,
    metric_keys,
    metric_name,
    write_per_query,
    write_qrels,
    write_trec_run,
)
from gdr.guard import holding
from gdr.io import atomic_write_json, atomic_write_text, hash_strings, recorded_identity, write_manifest
from gdr.models import model_digest
from gdr.stages.command_keys import EvaluateQueries
from gdr.stages.settings import EvaluateSettings
from gdr.stages.train import TRAINED_ON, corpus_hash
from gdr.training.search import Retriever

log = logging.getLogger(__name__)

__all__ = ["evaluate_model", "evaluate_retriever"]


def evaluate_retriever(retriever, qids: Sequence[str], queries: Sequence[str], qrels: dict[str, list[str]],
                       k: int = EvaluateSettings.k, beam: int | None = None, progress: bool = True):
    """Search ``queries`` and evaluate; returns (Run, RetrievalMetrics, first-relevant ranks by qid)."""
    docs, scores, ranks = retriever.search_ranked(list(queries), k=k, beam=beam, progress=progress)
    run = Run(list(qids), [retriever.doc_ids[d].tolist() for d in docs], [s.astype(float).tolist() for s in scores],
              [r.tolist() for r in ranks])
    metrics, first = evaluate_run(run, qrels, ks=depths(k), mrr_depth=k)
    return run, metrics, first


def evaluate_model(run_dir: str | Path, corpus, queries, out: str | Path, settings: EvaluateSettings,
                   split: str = EvaluateQueries.split, drop_unknown_qrels: bool = DataOptions.drop_unknown_qrels,
                   on_train_split: bool = False) -> tuple[dict, str]:
    """Evaluate the retriever trained in ``run_dir`` (a ``train`` folder) on ``queries`` (a
    :class:`gdr.data.QuerySet` over ``corpus``, e.g. from :func:`gdr.data.splits.split_queries`) into ``out``:
    ``metrics.json`` (Success@1/10/k, R@10/k, RR@k at k = ``settings.k``, the results per query, under
    ir_measures' names and the keys ``recall@d``, ``R@d``, ``mrr@k``: :func:`gdr.eval.retrieval.metric_keys`; BM25 too
    with ``settings.bm25``), ``metrics.md``, ``run.trec``.

    Only the ``split`` queries are scored; a relevant id not in ``corpus`` is refused, or dropped with
    ``drop_unknown_qrels`` (``metrics.json`` counts them). ``on_train_split``: ``split`` is one the retriever was
    trained on, allowed by the caller (``--allow-train-split``): ``metrics.json`` and ``metrics.md`` say so. Returns
    (the ``metrics.json`` content, its markdown table)."""
    c = settings.to_dict()
    _check_trained_corpus(Path(run_dir), corpus)
    if queries is None or len(queries) == 0:
        raise ValueError("no queries with relevant documents in this corpus to evaluate on")
    qs, unknown = queries.scored_split(corpus, split, drop_unknown_qrels)
    with holding(out, "out_dir"):  # one writer per folder, as with `gdr evaluate`
        identity = _claim_evaluation_folder(Path(out), _identity(run_dir, corpus, qs, split, c))
        return _evaluate_model(run_dir, corpus, qs, Path(out), c, split, unknown, on_train_split, identity)


def _check_trained_corpus(run_dir: Path, corpus) -> None:
    """Refuse a corpus other than the one the retriever in ``run_dir`` was trained on (its ids and texts, as
    ``trained_on.json`` hashes them): its docids name those documents, so scores on another corpus mean nothing."""
    path = run_dir / TRAINED_ON
    if not path.is_file():  # a retriever of format 0: its docids are checked against the corpus at load
        return
    was = (json.loads(path.read_text(encoding="utf-8")).get("inputs") or {}).get("corpus") or {}
    if was.get("hash") and was["hash"] != corpus_hash(corpus):
        raise DataError(f"run_dir={run_dir}: its retriever was trained on {was.get('what')}; corpus {corpus.name!r} "
                        f"({len(corpus)} documents) is another, or holds other texts: pass the corpus it was trained "
                        "on (the same data settings, e.g. data.n_docs, data.drop_title)")


def _identity(run_dir, corpus, qs, split: str, c: dict) -> dict:
    """What an evaluation's figures are a function of, by content: the retriever's files, the documents, the queries
    and their judgements, the split and the search settings."""
    return {"retriever": model_digest(str(Path(run_dir) / "model")),
            "documents": hash_strings([*corpus.doc_ids, *corpus.model_inputs()]),
            "queries": hash_strings([f"{q}\t{t}\t{' '.join(r)}" for q, t, r in zip(qs.qids, qs.texts, qs.relevant)]),
            "split": split, **{k: c[k] for k in ("k", "beam", "length_penalty", "bm25")}}


def _claim_evaluation_folder(out: Path, identity: dict) -> dict:
    """Refuse, in one line, to evaluate into ``out`` over an evaluation of another retriever, corpus, query set or
    search settings (naming what differs); the same evaluation again is written over. Returns ``identity``."""
    was = recorded_identity(out, "evaluate", "out_dir")
    if was is not None and was != identity:
        changed = ", ".join(k for k in identity if was.get(k) != identity[k])
        raise FileExistsError(f"out_dir={out} holds an evaluation of other inputs ({changed}): pass another out_dir, "
                              f"or delete {out} to evaluate there")
    return identity


def _evaluate_model(run_dir, corpus, qs, out: Path, c: dict, split: str, unknown: int, on_train_split: bool,
                    identity: dict) -> tuple[dict, str]:
    t0 = time.time()
    qrels = {q: list(rel) for q, rel in zip(qs.qids, qs.relevant)}
    retriever = Retriever.load(str(run_dir), device=c.get("device"), beam=c["beam"],
                               length_penalty=c["length_penalty"], batch_size=c["batch_size"])
    foreign = set(retriever.doc_ids.tolist()) - set(corpus.doc_ids)
    if foreign:
        raise DataError(f"run_dir={run_dir}: {len(foreign)} docids of the retriever name documents this corpus does "
                        f"not hold (e.g. {sorted(foreign)[0]!r}): pass the corpus it was trained on")
    t1 = time.time()
    run, metrics, first = evaluate_retriever(retriever, qs.qids, qs.texts, qrels, k=c["k"], beam=c["beam"])
    search_s = time.time() - t1
    rows = {c["tag"]: metrics.as_dict()}
    write_trec_run(out / "run.trec", run, tag=c["tag"], depth=c["k"])
    write_qrels(out / "qrels.txt", qrels)
    write_per_query(out / PER_QUERY_FILE, first)  # the paired tests of `gdr run` read it (eval/compare.py)
    if c["bm25"]:
        brun = bm25_run(corpus.doc_ids, corpus.model_inputs(), qs.qids, qs.texts, k=c["k"])
        bm, bfirst = evaluate_run(brun, qrels, ks=depths(c["k"]), mrr_depth=c["k"])
        rows["bm25"] = bm.as_dict()
        write_trec_run(out / "bm25.trec", brun, tag="bm25", depth=c["k"])
        write_per_query(out / f"bm25.{PER_QUERY_FILE}", bfirst)
    metrics_json = {"split": split, "systems": rows, "queries_per_s": len(qs) / max(search_s, 1e-9),
                    **({"unknown_qrels": unknown} if unknown else {}),
                    **({"trained_on_this_split": True} if on_train_split else {})}
    atomic_write_json(out / "metrics.json", metrics_json)
    table = markdown_table(rows, [*map(metric_name, metric_keys(c["k"])), "n_queries"])
    if on_train_split:  # --allow-train-split: these figures measure memory of training queries, not retrieval
        table = (f"Scored on `{split}`, a split the retriever was trained on (--allow-train-split): not a held-out "
                 f"measure.\n\n{table}")
    atomic_write_text(out / "metrics.md", table)
    write_manifest(out, command="evaluate", run_dir=str(run_dir), corpus=corpus.name, split=split,
                   n_queries=len(qs), seconds=round(time.time() - t0, 1), search_seconds=round(search_s, 2),
                   identity=identity,
                   files=("metrics.json", "metrics.md", "run.trec", "bm25.trec", "qrels.txt", PER_QUERY_FILE,
                          f"bm25.{PER_QUERY_FILE}"))
    return metrics_json, table
