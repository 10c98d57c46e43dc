"""``gdr train``, ``gdr evaluate`` and ``gdr search``: parse config, call one library function, write outputs."""
from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from gdr.cli.validate import validate
from gdr.guard import claim_out

log = logging.getLogger(__name__)

__all__ = ["train_main", "evaluate_main", "search_main", "model_config_from", "evaluate_retriever",
           "train_from_config", "evaluate_from_config"]


def model_config_from(model: dict[str, Any], presets: dict[str, Any]):
    """The preset named ``model['size']`` with every non-null key of ``model`` on top."""
    from training.model import RetrieverConfig

    size = model.get("size")
    if size not in presets:
        raise ValueError(f"model.size={size!r}; choose one of {sorted(presets)}")
    merged = dict(presets[size])
    merged.update({k: v for k, v in model.items() if k != "size" and v is not None})
    merged.setdefault("n_digits", 0)
    merged.setdefault("max_code_len", 0)
    return RetrieverConfig.from_dict(merged)


def _load_queries(q: dict[str, Any], data: dict[str, Any], corpus_ids: set[str], docs_tsv=None):
    """Queries of one split restricted to documents of the corpus; None when the corpus has none."""
    from gdr.data import QUERY_SETS, load_queries

    name = q.get("name")
    if not name:
        return None
    if name == "titles":  # each title is the query of its own article (bbc, r2, r5)
        from gdr.data import load_title_queries

        qs = load_title_queries(data["name"], path=data.get("path"), seed=int(q.get("seed") or 0),
                                fractions=tuple(q.get("fractions") or (0.8, 0.1, 0.1)))
    elif name not in QUERY_SETS and not (Path(name) / "queries.jsonl").exists():
        log.info("%s has no query set; no real queries", name)
        return None
    else:
        kw = {"path": q.get("path")} if q.get("path") else {}
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


def _read_docids(path: str) -> tuple[list[str], list[tuple[int, ...]]]:
    """(doc ids, codes) of a docids.tsv, checked against its folder's manifest and line by line."""
    from gdr.io import check_manifest_files
    from indexing.docids import read_docids, rebuild_advice

    check_manifest_files(Path(path).parent, only=["docids.tsv"], fix=rebuild_advice(path))
    return read_docids(path)


def _align_docids(path: str, corpus_ids: list[str]) -> list[tuple[int, ...]]:
    """Codes in corpus order; every corpus document needs one."""
    ids, codes = _read_docids(path)
    by_id = dict(zip(ids, codes))
    missing = [d for d in corpus_ids if d not in by_id]
    if missing:
        raise ValueError(f"{path}: {len(missing)} corpus documents have no docid (e.g. {missing[0]!r}); "
                         "build docids for this corpus with `gdr index` (same data= settings)")
    extra = len(by_id) - len(corpus_ids)
    if extra > 0:
        log.warning("%s: %d docids belong to documents outside this corpus; ignored", path, extra)
    return [by_id[d] for d in corpus_ids]


def train_main(argv: list[str]) -> int:
    from gdr.config import command_config

    cfg = command_config("train", argv)
    if cfg is None:  # --cfg: printed
        return 0
    validate("train", cfg)
    _read_docids(cfg.docids)  # a bad docids.tsv is refused before out_dir is made (it would hold a config only)
    claim_out("train", cfg)
    res = train_from_config(cfg)
    print(f"model: {res.model_dir}  best val/recall@1: {res.best_val_recall1}  steps: {res.global_step}")
    return 0


def _start(cfg, corpus=None):
    """The config as a dict, the output folder (created, config saved), the start time and the corpus
    (``corpus`` when the caller has the corpus of ``cfg.data`` loaded already, e.g. ``gdr run``)."""
    from gdr.config import save_config, to_container
    from gdr.data import corpus_from_config

    c = to_container(cfg)
    out = Path(c["out_dir"])
    out.mkdir(parents=True, exist_ok=True)
    save_config(cfg, out)
    return c, out, time.time(), corpus if corpus is not None else corpus_from_config(c["data"])


def train_from_config(cfg, corpus=None):
    """Train one retriever from a composed ``conf/train.yaml`` config; returns the ``TrainResult``."""
    from gdr.io import write_manifest
    from training.data import read_generated_queries
    from training.train import ExampleOptions, OptimOptions, TrainerOptions, train

    c, out, t0, corpus = _start(cfg, corpus)
    codes = _align_docids(c["docids"], corpus.doc_ids)
    pos = {d: i for i, d in enumerate(corpus.doc_ids)}
    qs = _load_queries(c["queries"], c["data"], set(pos), c["data"].get("docs_tsv"))
    train_q = qs.texts if qs is not None else []
    train_rel = [[pos[d] for d in rel] for rel in qs.relevant] if qs is not None else []
    gen_q, gen_d = read_generated_queries(c["generated"], corpus.doc_ids) if c.get("generated") else ([], np.zeros(0, np.int64))
    res = train(
        out, model_config_from(c["model"], c["model_presets"]), corpus.doc_ids, codes,
        doc_texts=corpus.model_inputs(), train_queries=train_q, train_rel=train_rel,
        gen_queries=gen_q, gen_docs=gen_d,
        examples=ExampleOptions(**c["examples"]), optim=OptimOptions(**c["optim"]),
        trainer_opts=TrainerOptions(**c["trainer"]), seed=c["seed"],
    )
    write_manifest(out, command="train", corpus=corpus.name, n_docs=len(corpus), docids=c["docids"],
                   generated=c.get("generated"), examples=res.counts, n_params=res.n_params,
                   best_checkpoint=res.best_checkpoint, best_val_recall1=res.best_val_recall1,
                   best_val_metric=c["trainer"].get("monitor", "val/recall@1"),  # what best_val_recall1 holds
                   global_step=res.global_step, seconds=round(time.time() - t0, 1), files=("docids.tsv", "model/*"))
    return res


def evaluate_retriever(retriever, qids: Sequence[str], queries: Sequence[str], qrels: dict[str, list[str]],
                       k: int = 100, beam: int | None = None, progress: bool = True):
    """Search ``queries`` and evaluate; returns (Run, RetrievalMetrics, first-relevant ranks by qid)."""
    from eval.retrieval import Run, evaluate_run

    docs, scores, ranks = retriever.search_ranked(list(queries), k=k, beam=beam, progress=progress)
    run = Run(list(qids), [retriever.doc_ids[d].tolist() for d in docs], [s.astype(float).tolist() for s in scores],
              [r.tolist() for r in ranks])
    metrics, first = evaluate_run(run, qrels, ks=(1, 10, 100), mrr_depth=100)
    return run, metrics, first


def evaluate_main(argv: list[str]) -> int:
    from gdr.config import command_config

    cfg = command_config("evaluate", argv)
    if cfg is None:  # --cfg: printed
        return 0
    validate("evaluate", cfg)
    claim_out("evaluate", cfg)
    _, table = evaluate_from_config(cfg)
    print(table, end="")
    return 0


def evaluate_from_config(cfg, corpus=None) -> tuple[dict, str]:
    """Evaluate a trained retriever from a composed ``conf/evaluate.yaml`` config into ``out_dir``.

    Returns (the ``metrics.json`` content, its markdown table)."""
    from eval.bm25 import bm25_run
    from eval.retrieval import evaluate_run, markdown_table, write_qrels, write_trec_run
    from gdr.io import atomic_write_json, atomic_write_text, write_manifest
    from training.search import Retriever

    c, out, t0, corpus = _start(cfg, corpus)
    qs = _load_queries(c["queries"], c["data"], set(corpus.doc_ids), c["data"].get("docs_tsv"))
    if qs is None or len(qs) == 0:
        raise SystemExit(f"gdr evaluate: no {c['queries']['split']!r} queries with relevant documents "
                         f"for {c['data']['name']}; set queries.name / queries.split")
    qrels = {q: list(rel) for q, rel in zip(qs.qids, qs.relevant)}
    retriever = Retriever.load(c["run_dir"], device=c.get("device"), beam=c["beam"],
                               length_penalty=c["length_penalty"], batch_size=c["batch_size"])
    unknown = set(retriever.doc_ids.tolist()) - set(corpus.doc_ids)
    if unknown:
        log.warning("%d docids of the model are not in this corpus (e.g. %s)", len(unknown), next(iter(unknown)))
    t1 = time.time()
    run, metrics, _ = evaluate_retriever(retriever, qs.qids, qs.texts, qrels, k=c["k"], beam=c["beam"])
    search_s = time.time() - t1
    rows = {c["tag"]: metrics.as_dict()}
    write_trec_run(out / "run.trec", run, tag=c["tag"], depth=c["k"])
    write_qrels(out / "qrels.txt", qrels)
    if c["bm25"]:
        brun = bm25_run(corpus.doc_ids, corpus.model_inputs(), qs.qids, qs.texts, k=c["k"])
        bm, _ = evaluate_run(brun, qrels)
        rows["bm25"] = bm.as_dict()
        write_trec_run(out / "bm25.trec", brun, tag="bm25", depth=c["k"])
    metrics_json = {"split": c["queries"]["split"], "systems": rows, "queries_per_s": len(qs) / max(search_s, 1e-9)}
    atomic_write_json(out / "metrics.json", metrics_json)
    table = markdown_table(rows, ["recall@1", "recall@10", "recall@100", "mrr@100", "n_queries"])
    atomic_write_text(out / "metrics.md", table)
    write_manifest(out, command="evaluate", run_dir=c["run_dir"], corpus=corpus.name, split=c["queries"]["split"],
                   n_queries=len(qs), seconds=round(time.time() - t0, 1), search_seconds=round(search_s, 2),
                   files=("metrics.json", "metrics.md", "run.trec", "bm25.trec", "qrels.txt"))
    return metrics_json, table


def search_main(argv: list[str]) -> int:
    """``gdr search "query" ["another"] run_dir=... k=10``: prints doc ids and scores (JSON lines with --json)."""
    from gdr.config import load_config, to_container
    from training.search import Retriever

    as_json = "--json" in argv
    overrides = [a for a in argv if "=" in a and not a.startswith("-")]
    queries = [a for a in argv if "=" not in a and not a.startswith("-")]
    if not queries:
        print('usage: gdr search "query" [...] run_dir=RUN [k=10] [beam=100] [--json]', file=sys.stderr)
        return 2
    cfg = load_config("evaluate", overrides)
    validate("search", cfg)
    c = to_container(cfg)
    retriever = Retriever.load(c["run_dir"], device=c.get("device"), beam=c["beam"],
                               length_penalty=c["length_penalty"], batch_size=c["batch_size"])
    k = int(c["k"]) if any(a.startswith("k=") for a in overrides) else 10
    results = retriever.search(queries, k=k)
    for q, res in zip(queries, results):
        if as_json:
            print(json.dumps({"query": q, "results": [{"doc_id": d, "score": s} for d, s in res]}))
        else:
            print(f"# {q}")
            for rank, (d, s) in enumerate(res, 1):
                print(f"{rank:>4}  {d}  {s:.4f}")
    return 0
