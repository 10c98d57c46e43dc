"""Stage ``train``: an NCI-style seq2seq retriever trained on docids (:func:`train_retriever`).

:func:`split_queries` loads the real queries of one split (a query set, or titles as queries) restricted
to the documents of a corpus: the training queries here, the test queries of ``evaluate`` and ``bm25``.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from gdr.stages.settings import TrainSettings

log = logging.getLogger(__name__)

__all__ = ["train_retriever", "split_queries", "model_config_from", "read_checked_docids", "check_train_inputs",
           "check_query_splits"]


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


def split_queries(q: dict[str, Any], data: dict[str, Any], corpus_ids: set[str], docs_tsv=None):
    """Queries of one split restricted to documents of the corpus (a :class:`gdr.data.QuerySet`); None when the
    corpus has none.

    ``q``: ``name`` (a query set, a BEIR folder, or ``titles``), ``split``, ``path``, and for titles ``seed``
    and ``fractions``; ``data``: the corpus's ``data:`` settings (``name``, ``path``; titles reload it)."""
    from gdr.data import QUERY_SETS, load_queries

    name = q.get("name")
    if not name:
        return None
    if name in ("jsonl", "tsv"):  # a file of documents: its queries and judgements are files of their own
        qs = _file_queries(data, corpus_ids)
        if qs is None:
            return None
    elif name == "titles":  # each title is the query of its own article (bbc, r2, r5)
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


def _file_queries(data: dict[str, Any], corpus_ids: set[str]):
    """The queries of ``data=jsonl|tsv`` (``data.queries`` judged in ``data.qrels``), or None without them.
    Judgements are checked against every document of the file (a sample of ``n_docs`` keeps those of its own)."""
    from gdr.data import load_docs_file, load_file_queries

    if not data.get("qrels"):
        log.info("%s has no queries (data.queries, data.qrels); no real queries", data.get("path"))
        return None
    if not data.get("queries"):
        raise ValueError("data.qrels is set but data.queries is not: pass the queries file the judgements name")
    ids = corpus_ids
    if data.get("n_docs") or data.get("on_empty") == "drop":
        fields = {k: data[k] for k in ("id_field", "text_field", "title_field", "label_field") if data.get(k)}
        ids = set(load_docs_file(data["path"], fmt=data["name"], on_empty="keep", **fields).doc_ids)
    return load_file_queries(data["queries"], data["qrels"], doc_ids=ids, name=Path(data["queries"]).stem)


def read_checked_docids(path: str | Path) -> tuple[list[str], list[tuple[int, ...]]]:
    """(doc ids, codes) of a docids.tsv, checked against its folder's manifest and line by line."""
    from gdr.io import check_manifest_files
    from indexing.docids import read_docids, rebuild_advice

    check_manifest_files(Path(path).parent, only=["docids.tsv"], fix=rebuild_advice(path))
    return read_docids(path)


def check_train_inputs(docids: str | Path, generated: str | Path | None = None) -> None:
    """The input files of a training run, read before anything is made or loaded: ``docids.tsv`` (manifest,
    lines) and the generated queries (manifest, lines, each document among the docids; the corpus check
    comes later and is no more lenient)."""
    from training.data import read_generated_queries

    ids, _ = read_checked_docids(docids)
    if generated:
        read_generated_queries(str(generated), ids)


def check_query_splits(sections: Sequence[dict], data: dict, corpus_ids: Sequence[str], need: str | None = None,
                       docs_tsv: str | None = None) -> None:
    """Read the query set of every ``queries`` section (``{"name", "split", "path", ...}``, one per split a
    run will use) against the loaded corpus, so that a bad qrels or query line (an unknown document or
    query id: a :class:`gdr.data.DataError` naming file:line) stops it before its first heavy step rather
    than hours later; and the split ``need`` must hold a query with a relevant document."""
    from gdr.validate import ConfigError

    ids = set(corpus_ids)
    for q in sections:
        qs = split_queries(q, data, ids, docs_tsv)
        if q["split"] == need and (qs is None or len(qs) == 0):
            from gdr.data import file_format

            files = data.get("name") in ("jsonl", "tsv") or file_format(str(data.get("name")))
            hint = ("; a file of documents takes its queries as data=jsonl|tsv data.path=<documents> "
                    "data.queries=<queries file> data.qrels=<test.tsv>") if files else ""
            raise ConfigError(f"queries.test_split={need}: no {need!r} query of queries.name={q['name']} has a "
                              f"relevant document in this corpus, so nothing can be evaluated; choose another "
                              f"queries.test_split or queries.name{hint}")


def _align_docids(path: str, corpus_ids: list[str]) -> list[tuple[int, ...]]:
    """Codes in corpus order; every corpus document needs one."""
    ids, codes = read_checked_docids(path)
    by_id = dict(zip(ids, codes))
    missing = [d for d in corpus_ids if d not in by_id]
    if missing:
        raise ValueError(f"{path}: {len(missing)} corpus documents have no docid (e.g. {missing[0]!r}); "
                         "build docids for this corpus with `gdr index` (same data= settings)")
    extra = len(by_id) - len(corpus_ids)
    if extra > 0:
        log.warning("%s: %d docids belong to documents outside this corpus; ignored", path, extra)
    return [by_id[d] for d in corpus_ids]


def train_retriever(corpus, docids: str | Path, out: str | Path, settings: TrainSettings, *, queries=None,
                    generated: str | Path | None = None):
    """Train one retriever on ``docids`` (a ``docids.tsv`` of ``gdr index``) for ``corpus`` into ``out``.

    ``queries``: real training queries (a :class:`gdr.data.QuerySet` over the corpus, e.g. from
    :func:`split_queries`; its dev part is held out by the trainer) or None; ``generated``: a
    ``doc_queries.jsonl`` of generated queries, or None. Returns the ``training.train.TrainResult``; a killed
    run resumes from ``out/checkpoints/last.ckpt``."""
    from gdr.io import write_manifest
    from training.data import read_generated_queries
    from training.train import ExampleOptions, OptimOptions, TrainerOptions, train

    c = settings.to_dict()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    codes = _align_docids(str(docids), corpus.doc_ids)
    pos = {d: i for i, d in enumerate(corpus.doc_ids)}
    qs = queries
    train_q = qs.texts if qs is not None else []
    train_rel = [[pos[d] for d in rel] for rel in qs.relevant] if qs is not None else []
    gen_q, gen_d = read_generated_queries(str(generated), corpus.doc_ids) if generated else ([], np.zeros(0, np.int64))
    res = train(
        out, model_config_from(c["model"], c["model_presets"]), corpus.doc_ids, codes,
        doc_texts=corpus.model_inputs(), train_queries=train_q, train_rel=train_rel,
        gen_queries=gen_q, gen_docs=gen_d,
        examples=ExampleOptions(**c["examples"]), optim=OptimOptions(**c["optim"]),
        trainer_opts=TrainerOptions(**c["trainer"]), seed=c["seed"],
    )
    write_manifest(out, command="train", corpus=corpus.name, n_docs=len(corpus), docids=str(docids),
                   generated=str(generated) if generated else None, examples=res.counts, n_params=res.n_params,
                   best_checkpoint=res.best_checkpoint, best_val_recall1=res.best_val_recall1,
                   best_val_metric=c["trainer"].get("monitor", "val/recall@1"),  # what best_val_recall1 holds
                   global_step=res.global_step, seconds=round(time.time() - t0, 1), files=("docids.tsv", "model/*"))
    return res
