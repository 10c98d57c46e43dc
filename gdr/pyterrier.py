"""gdr inside PyTerrier: a run's trained retrievers and its BM25 as ``pt.Transformer`` s (the ``gdr[pyterrier]`` extra).

>>> import pyterrier as pt                                                       # doctest: +SKIP
>>> from gdr.pyterrier import BM25, GenerativeRetriever, topics_and_qrels       # doctest: +SKIP
>>> bm25 = BM25.from_run("runs/bbc")                                            # doctest: +SKIP
>>> gc = GenerativeRetriever.from_run("runs/bbc", indexer="gc", seed=0)         # doctest: +SKIP
>>> hkmi = GenerativeRetriever.from_run("runs/bbc", indexer="hkmi", seed=0)     # doctest: +SKIP
>>> topics, qrels = topics_and_qrels("runs/bbc")                                # the run's test split  # doctest: +SKIP
>>> pt.Experiment([bm25, gc, hkmi], topics, qrels, eval_metrics=["RR@10", "R@10"], baseline=0)  # doctest: +SKIP

A cross-validated run (``queries.folds=K``) has K retrievers per indexer and seed, ``train-gc-s0-f0`` ..
``-f<K-1>``, each trained without the topics of its fold. ``GenerativeRetriever.from_run(run, indexer="gc", seed=0)``
then searches each topic with the retriever of the fold that held it out (the topic's fold as the run split its
topics), so ``pt.Experiment`` over ``topics_and_qrels(run)`` (every topic of the run) gives the report's figures;
``fold=f`` takes the one retriever of fold ``f`` for every topic.

Both take a topics frame (``qid``, ``query``) and give PyTerrier's result frame: the topics' columns plus
``docno``, ``score`` and ``rank`` (from 0, as PyTerrier counts), best first, at most ``k`` rows per query. A
generative retriever's rows are the ones ``gdr evaluate`` writes to ``run.trec`` (the constrained beam search of
:class:`gdr.training.search.Retriever`; documents sharing a docid share its score), BM25's those of ``bm25.trec``
(:mod:`eval.bm25` over the texts the run's models read). ``k`` and the search settings default to the run's
``evaluate:`` section. Neither needs Java: PyTerrier 1.x runs without it, and Terrier's own indexes are not used.

This module is the optional part of gdr that PyTerrier is for, so it imports PyTerrier when it is imported.
"""
from __future__ import annotations

import json
import logging
import os
from dataclasses import replace
from functools import cached_property
from pathlib import Path
from typing import Any, Mapping

import numpy as np
from omegaconf import OmegaConf

from gdr.data import corpus_from_config
from gdr.data.splits import QuerySplits
from gdr.eval.bm25 import BM25Index
from gdr.stages.command_keys import EvaluateQueries, RunQueries
from gdr.stages.settings import EvaluateSettings, section_from
from gdr.training.search import Retriever

try:
    import pandas as pd
    import pyterrier as pt  # optional: the gdr[pyterrier] extra
except ImportError as e:  # pragma: no cover - the message is the point
    raise ImportError("gdr.pyterrier needs PyTerrier: pip install 'gdr[pyterrier]' (or pip install pyterrier)") from e

log = logging.getLogger(__name__)

__all__ = ["GenerativeRetriever", "BM25", "RunFolder", "topics_and_qrels", "queries_frames"]

PathLike = str | os.PathLike


class RunFolder:
    """A ``gdr run`` folder read for PyTerrier: its settings (``run.config.yaml``), stages (``report.json``), corpus
    and query splits. The corpus is loaded once, when first needed."""

    def __init__(self, path: PathLike):
        self.path = Path(path)
        config = self.path / "run.config.yaml"
        if not config.is_file():
            raise FileNotFoundError(f"{self.path}: no run.config.yaml, so not the out folder of `gdr run` (a `gdr "
                                    "train` out_dir is taken by GenerativeRetriever.from_run as it is)")

        self.config: dict[str, Any] = OmegaConf.to_container(OmegaConf.load(config), resolve=True)

    @property
    def evaluate(self) -> EvaluateSettings:
        """The run's search settings (``evaluate:``: k, beam, length_penalty, batch_size, device), typed: a key the
        run.config.yaml of an older gdr lacks (``batch_size``, before it was a setting) at its default."""
        return EvaluateSettings.from_config(self.config["evaluate"])

    @property
    def query_settings(self) -> RunQueries:
        """The run's ``queries:`` section, typed: a key the run.config.yaml of an older gdr lacks (``folds`` and
        ``dev_split``, before they were settings) at its default."""
        return section_from(RunQueries, self.config["queries"], "queries")

    def stage_folder(self, name: str) -> Path:
        """The folder of stage ``name`` (``train-gc-s0``) this run's report names, else the one finished folder
        ``<name>-<key>``; a refusal lists the stages of that kind the folder has."""
        report = self.path / "report.json"
        if report.is_file():
            stages = {s["name"]: s["folder"] for s in json.loads(report.read_text(encoding="utf-8")).get("stages", [])}
            if name in stages and (self.path / stages[name]).is_dir():
                return self.path / stages[name]
        done = sorted(p for p in self.path.glob(f"{name}-*") if _complete(p) and p.name[len(name) + 1:].isalnum())
        if len(done) == 1:
            return done[0]
        kind = name.split("-")[0]
        have = sorted({p.name.rsplit("-", 1)[0] for p in self.path.glob(f"{kind}-*") if _complete(p)})
        if not done:
            raise FileNotFoundError(f"{self.path}: no finished stage {name} (finished {kind} stages: "
                                    f"{', '.join(have) or 'none'}); run `gdr run` with that indexer and seed first")
        raise FileNotFoundError(f"{self.path}: {len(done)} finished {name} folders ({', '.join(p.name for p in done)}) "
                                "and no report.json naming one; pass the folder itself to from_run")

    @cached_property
    def corpus(self):
        """The run's corpus, loaded from its ``data:`` settings."""
        return corpus_from_config(self.config["data"])

    @cached_property
    def _splits(self) -> QuerySplits:
        """The run's query splits over its corpus, the query files read once for all of them."""
        # docs_tsv: a key of the msmarco-lite and nq320k data options alone (conf/data/nq320k.yaml)
        return QuerySplits(self.config["data"], self.corpus.doc_ids, self.config["data"].get("docs_tsv"))

    @property
    def folds(self) -> int | None:
        """K of a run cross-validated over K folds of its topics (``queries.folds``), else None."""
        k = self.query_settings.folds
        return None if k is None else int(k)

    def queries(self, split: str = EvaluateQueries.split, fold: int | None = None):
        """The ``split`` queries the run scores on (those with a relevant document in the corpus), a
        :class:`gdr.data.QuerySet`; ``split`` defaults to the run's test split. In a cross-validated run, those of
        the retrievers that hold out ``fold`` (None: every topic)."""
        from gdr.pipeline import queries_section  # the split as `gdr run` reads it (titles, files, ids ...)

        section = queries_section(OmegaConf.create(self.config), split, fold)
        qs = self._splits(section)
        if qs is None or len(qs) == 0:
            raise ValueError(f"{self.path}: the run's query set {section['name']!r} has no {split!r} query with a "
                             "relevant document in its corpus" + ("" if fold is None else f" in fold {fold}"))
        return qs

    def topic_folds(self) -> dict[str, int]:
        """Each topic id of a cross-validated run -> the fold whose retrievers were trained without it and scored on
        it: the test split of each fold as the run made it (:func:`gdr.data.splits.split_queries` of the sections
        ``gdr run`` read), so the routing is the run's split, never one made anew."""
        if self.folds is None:
            raise ValueError(f"{self.path}: the run is not cross-validated (queries.folds is null), so its topics "
                             "have no folds")
        test = self.query_settings.test_split
        return {qid: fold for fold in range(self.folds) for qid in self.queries(test, fold).qids}


def _complete(folder: Path) -> bool:
    try:
        return json.loads((folder / "stage.json").read_text(encoding="utf-8")).get("status") == "complete"
    except (OSError, ValueError):
        return False


def queries_frames(qs) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A :class:`gdr.data.QuerySet` as PyTerrier's topics (``qid``, ``query``) and qrels (``qid``, ``docno``,
    ``label``: the relevance grade where the set has grades, else 1)."""
    topics = pd.DataFrame({"qid": list(qs.qids), "query": list(qs.texts)})
    n_rel = np.fromiter(map(len, qs.relevant), dtype=np.int64, count=len(qs))
    labels = np.concatenate([np.asarray(g, dtype=np.int64) for g in qs.grades]) if qs.grades is not None and len(qs) \
        else np.ones(int(n_rel.sum()), dtype=np.int64)
    qrels = pd.DataFrame({"qid": np.repeat(np.asarray(qs.qids, dtype=object), n_rel),
                          "docno": [d for rel in qs.relevant for d in rel], "label": labels})
    return topics, qrels


def topics_and_qrels(run_dir: PathLike | RunFolder, split: str | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The topics and qrels of a run's ``split`` (default: its ``queries.test_split``), as :func:`queries_frames`:
    the queries ``gdr run`` scored its retrievers on."""
    run = run_dir if isinstance(run_dir, RunFolder) else RunFolder(run_dir)
    return queries_frames(run.queries(split or run.query_settings.test_split))


def _results(topics: pd.DataFrame, ids: np.ndarray, docs: list[np.ndarray], scores: list[np.ndarray],
             k: int) -> pd.DataFrame:
    """PyTerrier's result frame: each topic row repeated once per result (its first ``k``), with ``docno``,
    ``score`` and ``rank`` (0-based). ``docs``/``scores``: per topic, document indices and scores best first."""
    docs, scores = [d[:k] for d in docs], [s[:k] for s in scores]
    counts = np.fromiter(map(len, docs), dtype=np.int64, count=len(docs))  # (n_topics,)
    out = topics.iloc[np.repeat(np.arange(len(topics)), counts)].reset_index(drop=True)
    flat = np.concatenate(docs) if docs else np.zeros(0, dtype=np.int64)
    out["docno"] = ids[flat] if len(flat) else np.zeros(0, dtype=object)
    out["score"] = np.concatenate(scores).astype(np.float64) if scores else np.zeros(0)
    out["rank"] = np.arange(len(flat)) - np.repeat(np.cumsum(counts) - counts, counts)
    return out


def _topics(transformer: pt.Transformer, topics: pd.DataFrame) -> pd.DataFrame:
    """``topics`` checked as a query frame (``qid``, ``query``), qids as strings."""
    pt.validate.query_frame(topics, extra_columns=["query"], context=transformer)
    return topics.assign(qid=topics["qid"].astype(str))


class GenerativeRetriever(pt.Transformer):
    """A trained gdr retriever (``gdr train`` / a ``train-<indexer>-s<seed>`` stage of ``gdr run``) as a
    ``pt.Transformer``: topics (``qid``, ``query``) in, results (``qid``, ``query``, ``docno``, ``score``,
    ``rank``) out, the top ``k`` of a constrained beam search of width ``beam`` per query.

    With ``fold_of`` (topic id -> fold), the retrievers of a cross-validated run, one per fold in fold order
    (``retriever`` a sequence): each topic is searched by the retriever of its fold, the one trained without it."""

    def __init__(self, retriever, k: int = EvaluateSettings.k, beam: int | None = None, name: str = "gdr",
                 fold_of: Mapping[str, int] | None = None):
        self.retrievers: list[Retriever] = [retriever] if fold_of is None else list(retriever)
        self.fold_of = None if fold_of is None else {str(q): int(f) for q, f in fold_of.items()}
        self.k, self.beam, self.name = int(k), beam, name

    @classmethod
    def from_run(cls, run_dir: PathLike, indexer: str = "gc", seed: int = 0, *, fold: int | None = None,
                 k: int | None = None, beam: int | None = None, device: str | None = None,
                 batch_size: int | str | None = None) -> "GenerativeRetriever":
        """The retriever of ``indexer`` and ``seed`` in the ``gdr run`` folder ``run_dir`` (or the ``gdr train``
        folder ``run_dir`` itself), searching as the run's ``evaluate:`` section says unless ``k``, ``beam``,
        ``device`` or ``batch_size`` are given. Of a cross-validated run (``queries.folds=K``): the K retrievers
        ``train-<indexer>-s<seed>-f<fold>``, each topic routed to that of the fold which held it out
        (:meth:`RunFolder.topic_folds`; a topic the run does not have is refused), or with ``fold`` the one
        retriever of that fold for every topic."""
        path = Path(run_dir)
        name, fold_of = f"gdr-{indexer}-s{int(seed)}", None
        if (path / "model").is_dir() and (path / "docids.tsv").is_file():  # a train folder itself
            if fold is not None:
                raise ValueError(f"{path}: fold={fold} picks a retriever of a cross-validated `gdr run` folder; this "
                                 "is one retriever's folder: leave fold out")
            folders, ev = [path], None
        else:
            run = RunFolder(path)
            stage, ev, n_folds = f"train-{indexer}-s{int(seed)}", run.evaluate, run.folds
            if n_folds is None:
                if fold is not None:
                    raise ValueError(f"{path}: fold={fold}, but the run is not cross-validated (its queries.folds is "
                                     "null): leave fold out")
                folders = [run.stage_folder(stage)]
            elif fold is not None:
                if not 0 <= int(fold) < n_folds:
                    raise ValueError(f"fold={fold}: must be one of the run's folds 0 .. {n_folds - 1} "
                                     f"(queries.folds={n_folds})")
                folders, name = [run.stage_folder(f"{stage}-f{int(fold)}")], f"{name}-f{int(fold)}"
            else:
                folders, fold_of = [run.stage_folder(f"{stage}-f{f}") for f in range(n_folds)], run.topic_folds()
        search = ev if ev is not None else EvaluateSettings.from_config()  # a train folder: gdr evaluate's defaults
        k = k if k is not None else search.k
        # a train folder searches as deep as the results asked for, a run as its evaluate.beam
        beam = beam if beam is not None else k if ev is None else search.beam
        # the door: the arguments checked by gdr evaluate's rules (1 <= k <= beam ...), before any model loads
        search = replace(search, k=k, beam=beam, batch_size=batch_size if batch_size is not None else search.batch_size,
                         device=device if device is not None else search.device)
        retrievers = [Retriever.load(f, device=search.device, beam=search.beam,
                                     length_penalty=float(search.length_penalty), batch_size=search.batch_size)
                      for f in folders]
        return cls(retrievers if fold_of is not None else retrievers[0], k=search.k, beam=search.beam, name=name,
                   fold_of=fold_of)

    def transform(self, topics: pd.DataFrame) -> pd.DataFrame:
        topics = _topics(self, topics)
        if len(topics) == 0:
            return _results(topics, self.retrievers[0].doc_ids, [], [], self.k)
        folds = self._folds(topics["qid"])  # (n_topics,) the retriever of each topic
        parts = []
        for f in np.unique(folds):  # one search per fold, over all of its topics at once
            rows = np.flatnonzero(folds == f)
            part = topics.iloc[rows].assign(_topic=rows)
            retriever = self.retrievers[f]
            docs, scores, _ = retriever.search_ranked(part["query"].tolist(), k=self.k, beam=self.beam)
            parts.append(_results(part, retriever.doc_ids, docs, scores, self.k))
        out = pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]
        # the topics in the order given, each topic's rows best first
        return out.iloc[np.argsort(out["_topic"].to_numpy(), kind="stable")].drop(columns="_topic") \
            .reset_index(drop=True)

    def _folds(self, qids: pd.Series) -> np.ndarray:
        """The index into ``retrievers`` of each topic: 0 for one retriever, else the topic's fold; a topic that is
        not one of the cross-validated run's is refused (every fold's retriever may have trained on it)."""
        if self.fold_of is None:
            return np.zeros(len(qids), dtype=np.int64)
        folds = qids.map(self.fold_of)
        unknown = qids[folds.isna()]
        if len(unknown):
            raise ValueError(f"{self.name}: topic(s) {', '.join(unknown.iloc[:5])}{' ...' if len(unknown) > 5 else ''}"
                             f" are not among the {len(self.fold_of)} topics of the cross-validated run, so no fold "
                             "held them out; pass fold= to GenerativeRetriever.from_run to search with one fold's "
                             "retriever")
        return folds.to_numpy(dtype=np.int64)

    def __repr__(self) -> str:
        folds = "" if self.fold_of is None else f", folds={len(self.retrievers)}"
        return f"GenerativeRetriever({self.name!r}, k={self.k}, beam={self.beam}{folds})"


class BM25(pt.Transformer):
    """BM25 (:class:`eval.bm25.BM25Index`, built once) over a corpus's model inputs (title and text) as a
    ``pt.Transformer``, the reference of a ``gdr run``: topics in, the top ``k`` documents per query out (documents
    sharing no term with a query are not listed)."""

    def __init__(self, corpus, k: int = EvaluateSettings.k, name: str = "bm25"):
        self.doc_ids = np.asarray(corpus.doc_ids, dtype=object)
        self.index = BM25Index(corpus.model_inputs(), doc_ids=corpus.doc_ids)
        self.k, self.name = int(k), name

    @classmethod
    def from_run(cls, run_dir: PathLike | RunFolder, *, k: int | None = None, corpus=None) -> "BM25":
        """BM25 over the corpus of the ``gdr run`` folder ``run_dir`` (or ``corpus``, a :class:`gdr.Corpus`, where
        it is at hand), at the run's ``evaluate.k`` unless ``k`` is given."""
        run = run_dir if isinstance(run_dir, RunFolder) else RunFolder(run_dir)
        return cls(corpus if corpus is not None else run.corpus,
                   k=int(k if k is not None else run.evaluate.k))

    def transform(self, topics: pd.DataFrame) -> pd.DataFrame:
        topics = _topics(self, topics)
        if len(topics) == 0:
            return _results(topics, self.doc_ids, [], [], self.k)
        res = self.index.search(topics["query"].tolist(), k=self.k)
        found = res.doc_idx >= 0  # (n_topics, k)
        return _results(topics, self.doc_ids, [d[m] for d, m in zip(res.doc_idx, found)],
                        [s[m] for s, m in zip(res.scores, found)], self.k)

    def __repr__(self) -> str:
        return f"BM25(n_docs={len(self.doc_ids)}, k={self.k})"
