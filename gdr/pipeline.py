"""``gdr run``: the whole pipeline, from a corpus to the retrieval accuracy of each docid indexer.

Stages, in order (each keeps the folder layout of its own command, so any of them can be run by hand)::

    qg-<key>/                gdr qg        qg.enabled: the query generator fine-tuned on the training split's pairs;
                                           the LM stages after it use it and are keyed by its key
    score-<key>/             gdr score     sampled queries + P matrix (queries.jsonl, P.npy, manifests)
    cluster-<key>/           gdr cluster   flat GC vs k-means against the corpus labels (when it has labels)
    doc-queries-<key>/       gdr sample sample.per_doc=N   generated training queries per document
    index-<method>-<key>/    gdr index     docids.tsv, tree.json, summary.json per indexer (index_seed=retriever:
                                           index-<method>-s<seed>-<key>/, one per retriever seed)
    bm25-<key>/              BM25 on the test queries (reference)
    train-<method>-s<seed>-<key>/           gdr train     one retriever per (indexer, seed); curve.json: its learning
                                            curve (dev metric against step), also in its retrievers.jsonl line
    eval-<method>-s<seed>-<key>/            gdr evaluate  Success@1/10/k, R@10/k, RR@k (k = evaluate.k), TREC run
                                            (queries.folds=K: -s<seed>-f<fold>, K of each, one per held-out fold)
    retrievers.jsonl         a line of test figures per retriever of this run finished so far (rewritten)
    per_query.jsonl          a line per retriever of those: its test queries' ids and first-relevant ranks
    report.md  report.png  report.json  run.config.yaml  curves.png (the retrievers' learning curves)

:func:`run_pipeline` is the list of these stages, in order, over a :class:`RunContext` (the config, the corpus,
the run folder and the records so far); each stage is a :class:`StageSpec` built by its own function below it
(``score_spec`` ... ``eval_spec``): the inputs that key it, how it is built, what it reads and leaves. The host
stages that no device stage waits on (the indexes on P or the corpus, the clustering, BM25; BMI's index once its
generated queries exist) are started as soon as their inputs are made and taken where they are needed
(:func:`start_host_stages`): with ``overlap`` (``auto``: on CUDA) they run in a background thread beside the LM
stages and training (:mod:`gdr.stages.overlap`), with the same keys, files and figures.

A stage's ``<key>`` is a hash of everything that determines its output: its own settings and the keys of
the stages it reads, each input by its content, never by a path. Sampling and scoring read only the documents, so
their keys hold the documents' ids and texts, the LM (by the digest of its files, :func:`gdr.models.model_digest`),
their settings and the device kind and compute dtype, not the query settings: the same documents from a moved
file, a DataFrame or a folder reuse one P, and a model changed in place makes a new one. The other stages hold the
documents, queries and judgements by their content (:func:`corpus_signature`, :func:`queries_signature`) and a
retriever the device, precision, AdamW kind and CPU threads it trains with, so a moved or copied collection reuses
every stage. ``stage.json`` in the folder records
the key, the inputs and the seconds of every attempt (a stopped one too), and is marked complete only when the
stage finished, so a second run reuses every finished stage, a changed
``index.gc.alpha`` gives a new ``index-gc-<key>`` and new retrievers on it and nothing else, and a killed run
continues where it stopped (the stages themselves resume: scoring by shard, sampling by batch, training
from ``last.ckpt``).

``stage.json`` also lists every file the stage wrote with its size and CRC-32 checksum, and the
checksums of the upstream stages it read. Before a finished stage is reused both are checked: a damaged,
missing or changed file (or an upstream stage rebuilt with different content) re-runs the stage, with one
log line naming the file and what was wrong, and the stages after it see the change in turn. ``stage.json``
carries the folder's ``format`` (:mod:`gdr.formats`); a run folder of an older one is upgraded when it is opened
(:mod:`gdr.upgrade`), so everything here reads the current format only. A retriever whose weights ``gdr prune``
dropped (:mod:`gdr.carry`) is taken in from its finished evaluation without them, and retrained under its key
only when that evaluation must run again.

The report is rewritten after every retriever, marked partial until the last one, so a run cut short keeps
what it finished; the report of an earlier run of the folder stays, marked in progress, until then.
"""
from __future__ import annotations

import contextlib
import json
import logging
import shlex
import shutil
import threading
import time
from dataclasses import dataclass, field, fields, replace
from functools import partial
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
from omegaconf import DictConfig

from gdr import signals
from gdr.cluster import GC_KERNEL
from gdr.config import save_config, to_container
from gdr.data import corpus_from_config
from gdr.data.splits import QuerySplits, check_query_splits
from gdr.data.titles import TITLE_FRACTIONS
from gdr.device import free_memory, machine_differences, machine_record
from gdr.eval.retrieval import PER_QUERY_FILE, read_per_query
from gdr.formats import FORMAT, STAGE_FILE, matches, require_format, stage_digest, stage_key
from gdr.guard import LOCK_FILE, claim_folder
from gdr.io import (
    atomic_write_json,
    atomic_write_text,
    check_manifest_files,
    hash_strings,
    read_manifest,
    record_files,
    verify_files,
    write_jsonl,
)
from gdr.lm import PromptConfig
from gdr.lm.compiling import release_compiled
from gdr.lm.decode import PER_DOC_SAMPLER, SAMPLER_VERSION
from gdr.lm.prompts import PROMPT_LEAD
from gdr.lm.scoring import QUERY_END, score_compute_dtype
from gdr.models import ModelOptions, model_digest
from gdr.rules import ConfigError
from gdr.stages import train as train_stage
from gdr.stages.bm25 import bm25_baseline
from gdr.stages.cluster import cluster_run
from gdr.stages.command_keys import DocQueries, RunQG
from gdr.stages.doc_queries import sample_doc_queries
from gdr.stages.evaluate import evaluate_model
from gdr.stages.index import BMI_REAL_QUERIES, build_index, index_stage_name, index_stages, queries_by_document
from gdr.stages.overlap import HostStages, Priority, overlap_on
from gdr.stages.plan_file import plan_identity, predicted_from_plan, read_plan, run_device
from gdr.stages.qg import run_pairs, run_title_pairs
from gdr.stages.qg_report import add_generator_section, generator_summary
from gdr.stages.report import cluster_headline, mark_in_progress, mark_stopped, pooled_index_facts, write_report
from gdr.stages.score import score_corpus
from gdr.stages.settings import (
    ClusterSettings,
    EvaluateSettings,
    IndexSettings,
    LMSettings,
    SampleSettings,
    ScoreSettings,
    TrainSettings,
    config_dict,
    index_key_values,
    keyed_values,
    section_from,
)
from gdr.store import DOCQ_FILE, DOCQ_MANIFEST, P_MANIFEST, Q_FILE, Q_MANIFEST, load_run, read_queries
from gdr.training.module import VAL_K, VALIDATION_SEARCH
from gdr.training.qg import fine_tune_qg, pairs_loss
from gdr.upgrade import upgrade_run
from gdr.validate import check_corpus

log = logging.getLogger(__name__)

__all__ = ["run_pipeline", "open_run", "Pipeline", "RunContext", "RunSettings", "run_settings", "StageRecord",
           "StageSpec", "lm_settings", "STAGE_FILE", "stage_key"]

# Before a finished stage is reused, every file's size is checked, and the checksum of every file a later
# stage reads (its ``outputs``) or of at most this size: that leaves out only large files nothing reads
# again, the training checkpoints (resume points of an unfinished stage), which would otherwise dominate.
CHECKSUM_MAX_OTHER = 4 << 20
RETRIEVERS_FILE = "retrievers.jsonl"  # one line of test figures per retriever of this run finished so far
# one line per retriever finished so far: its test queries' ids and first-relevant ranks (0: none in the top k),
# the run's per-query results in one small file that comes back from a lease whole (eval/compare.py reads ranks)
PER_QUERY_RUN_FILE = "per_query.jsonl"
RUN_FILE = "run.json"  # the machine that ran the run (gdr.device.machine_record), rewritten by each gdr run


@dataclass
class StageRecord:
    """One stage of a pipeline run: where it lives, its key, how long it took (``seconds``: every attempt of a
    stage resumed after a stop, summed; ``last_seconds``: the attempt that finished it), whether it was reused."""

    name: str
    path: Path
    key: str
    seconds: float
    reused: bool
    info: dict = field(default_factory=dict)
    digest: str = ""  # checksum over its files' checksums: what a later stage records of it
    last_seconds: float | None = None  # the attempt that finished it (``seconds`` sums every attempt)
    attempts: int = 1


class Pipeline:
    """Runs stages in a root folder, each cached under ``<name>-<key>/`` by the hash of its inputs."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.records: list[StageRecord] = []

    def folder(self, name: str, inputs: dict) -> tuple[Path, str]:
        """(the folder of the stage ``name`` with ``inputs``: ``<root>/<name>-<key>``, that key)."""
        key = stage_key(json.loads(json.dumps(inputs, default=str)))
        return self.root / f"{name}-{key}", key

    def stage(self, name: str, inputs: dict, build: Callable[[Path], dict | None], after: Sequence[StageRecord] = (),
              resumes: Sequence[str] | None = None, outputs: Sequence[str] = ("*",)) -> StageRecord:
        """Run ``build(folder)`` unless a finished, undamaged stage with the same inputs exists; return its record.

        ``build`` returns a small dict of facts kept in ``stage.json`` (``info``). ``after``: the stages whose
        files ``build`` reads; a change in their content re-runs this one. ``resumes``: ``None`` when a damaged
        stage is rebuilt from an empty folder; else the stage resumes in place: its damaged file is deleted
        and rebuilt, except the files named here, which ``build`` checks and repairs piece by piece itself
        (P.npy: only damaged shards are re-scored). ``outputs``: patterns of the files later stages read; only
        their checksums count as this stage's content for them (manifests with times, logs and checkpoints differ
        between identical rebuilds)."""
        signals.check()  # a stop whose raise was lost in the stage before: none starts after it
        inputs = json.loads(json.dumps(inputs, default=str))
        folder, key = self.folder(name, inputs)
        marker = folder / STAGE_FILE
        upstream = {r.path.name: r.digest for r in after}
        try:
            old = json.loads(marker.read_text()) if marker.exists() else None
            damage = None
        except (ValueError, OSError) as e:
            old, damage = None, (STAGE_FILE, f"unreadable ({e})")
        if old is not None:
            require_format(old, marker, self.root)
        pruned = old is not None and old.get("key") == key and bool(old.get("pruned"))
        if old is not None and old.get("key") == key and old.get("status") == "complete" and not pruned:
            damage = self._damage(folder, old, upstream, outputs)
            if damage is None:
                log.info("stage %s: reusing %s (finished in %.1f s)", name, folder, old.get("seconds", 0.0))
                seconds = float(old.get("seconds", 0.0))
                rec = StageRecord(name, folder, key, seconds, True, old.get("info") or {},
                                  stage_digest(old["artifacts"], outputs), float(old.get("last_seconds", seconds)),
                                  len(old.get("attempts") or [seconds]))
                self.records.append(rec)
                return rec
        claim_folder(folder, "out")  # one writer: a `gdr score out=<this folder>` elsewhere is refused
        if pruned:  # its weights were dropped (gdr prune) and a stage after it needs them again
            log.info("stage %s: %s was pruned (its weights dropped by gdr prune) and is needed again; retraining it "
                     "under its key %s", name, folder, key)
            _clear(folder, STAGE_FILE, None)
        elif damage is not None:
            rel, what = damage
            log.warning("stage %s: %s: %s; re-running the stage", name, folder / rel, what)
            _clear(folder, rel, resumes)
        elif old is not None:
            log.info("stage %s: continuing the unfinished run in %s", name, folder)
        elif any(p.name not in (LOCK_FILE,) for p in folder.iterdir()):
            log.warning("stage %s: %s is missing, though the folder holds files; re-running the stage (it resumes "
                        "from what passes its checks)", name, marker)
        else:
            log.info("stage %s: running into %s", name, folder)
        attempts = _earlier_attempts(folder, old if old is not None and old.get("key") == key else None)
        running = {"format": FORMAT, "stage": name, "key": key, "status": "running", "inputs": inputs,
                   "attempts": attempts}
        atomic_write_json(marker, {**running, "started": time.time()})
        t0 = time.perf_counter()
        signals.set_where(f"stage {name}")  # what a SIGTERM's one line names
        try:
            info = build(folder) or {}
        except BaseException:  # a stop, a kill by signal, an error: this attempt's seconds count on resume
            atomic_write_json(marker, {**running, "attempts": attempts + [round(time.perf_counter() - t0, 2)]})
            raise
        last = round(time.perf_counter() - t0, 2)
        seconds = round(sum(attempts) + last, 2)
        artifacts = record_files(folder, exclude=(STAGE_FILE,))
        atomic_write_json(marker, {"format": FORMAT, "stage": name, "key": key, "status": "complete", "inputs": inputs,
                                   "seconds": seconds, "last_seconds": last, "attempts": attempts + [last],
                                   "info": info, "artifacts": artifacts, "outputs": list(outputs), "upstream": upstream,
                                   "finished": time.strftime("%Y-%m-%dT%H:%M:%S")})
        signals.set_where(None)
        rec = StageRecord(name, folder, key, seconds, False, info, stage_digest(artifacts, outputs), last,
                          len(attempts) + 1)
        self.records.append(rec)
        return rec

    def pruned(self, name: str, inputs: dict, after: Sequence[StageRecord] = (),
               outputs: Sequence[str] = ("*",)) -> StageRecord | None:
        """The record of the finished stage ``name`` of ``inputs`` whose weights ``gdr prune`` dropped
        (:mod:`gdr.carry`), as it was before (its key, info, seconds and the digest later stages recorded of it),
        when the files it kept are undamaged and its upstream stages unchanged; else None. Nothing is recorded: a
        caller that takes it (its evaluation is reused) appends it to :attr:`records`."""
        folder, key = self.folder(name, inputs)
        try:
            old = json.loads((folder / STAGE_FILE).read_text())
        except (OSError, ValueError):
            return None
        if not (isinstance(old, dict) and old.get("pruned") and old.get("key") == key
                and old.get("status") == "complete"):
            return None
        upstream = {r.path.name: r.digest for r in after}
        if self._damage(folder, old, upstream, outputs) is not None:
            return None
        seconds = float(old.get("seconds", 0.0))
        return StageRecord(name, folder, key, seconds, True, old.get("info") or {}, old["pruned"]["digest"],
                           float(old.get("last_seconds", seconds)), len(old.get("attempts") or [seconds]))

    def reusable(self, name: str, inputs: dict, after: Sequence[StageRecord] = (),
                 outputs: Sequence[str] = ("*",)) -> bool:
        """Whether :meth:`stage` would reuse the finished stage ``name`` of ``inputs`` as it is (runs nothing)."""
        folder, key = self.folder(name, inputs)
        try:
            old = json.loads((folder / STAGE_FILE).read_text())
        except (OSError, ValueError):
            return False
        return (isinstance(old, dict) and old.get("key") == key and old.get("status") == "complete"
                and not old.get("pruned")
                and self._damage(folder, old, {r.path.name: r.digest for r in after}, outputs) is None)

    @staticmethod
    def _damage(folder: Path, old: dict, upstream: dict, outputs: Sequence[str]) -> tuple[str, str] | None:
        """(file, what is wrong) for a finished stage that must not be reused, or None."""
        if "artifacts" not in old:
            return STAGE_FILE, "records no checksums of the stage's files"
        bad = verify_files(folder, old["artifacts"], checksum=checksummed(old["artifacts"], outputs))
        if bad is None and old.get("upstream", {}) != upstream:
            changed = sorted(k for k in set(upstream) | set(old.get("upstream", {}))
                             if upstream.get(k) != old.get("upstream", {}).get(k))
            bad = (STAGE_FILE, f"upstream stage {', '.join(changed)} changed since this stage was built")
        return bad


def _earlier_attempts(folder: Path, old: dict | None) -> list[float]:
    """The seconds of the unfinished attempts at a stage before this one (from its ``stage.json`` of the same key
    while it was running); a finished stage that is rebuilt starts a new count. An attempt killed without a chance
    to record itself (kill -9, a power cut) counts until the newest file it wrote."""
    if old is None or old.get("status") != "running":
        return []
    attempts = [float(x) for x in old.get("attempts") or []]
    started = old.get("started")
    if started is not None:
        newest = max((p.stat().st_mtime for p in folder.rglob("*") if p.is_file() and p.name != LOCK_FILE),
                     default=started)
        attempts.append(round(max(0.0, newest - float(started)), 2))
    return attempts


def _drop_damaged_queries(folder: Path) -> None:
    """Inside ``gdr run``, sampled queries (or a manifest) changed since they were written are re-sampled,
    with one line, where ``gdr score`` by hand refuses them; P.npy is repaired shard by shard by scoring."""
    for name in (Q_MANIFEST, P_MANIFEST):
        try:
            read_manifest(folder, name)
        except ValueError as e:
            log.warning("stage score: %s: unreadable (%s); writing it again", folder / name, e)
            (folder / name).unlink()
            if name == Q_MANIFEST:  # queries without their manifest are never sampled over: they go with it
                (folder / Q_FILE).unlink(missing_ok=True)
    if (folder / Q_FILE).exists():
        try:
            read_queries(folder)
        except ValueError as e:
            log.warning("stage score: %s; re-sampling", str(e).split("; re-sample")[0].split(": re-sample")[0])
            (folder / Q_FILE).unlink()


def _drop_damaged_doc_queries(folder: Path) -> None:
    """Inside ``gdr run``, finished generated queries changed since they were written (a line deleted, a
    ``stage.json`` lost with them) are re-sampled, with one line, where ``gdr sample`` by hand refuses them."""
    try:
        check_manifest_files(folder, name=DOCQ_MANIFEST)
    except (ValueError, OSError) as e:
        log.warning("stage doc-queries: %s; re-sampling", str(e).split("; re-sample")[0])
        for name in (DOCQ_FILE, DOCQ_MANIFEST):
            (folder / name).unlink(missing_ok=True)


def checksummed(artifacts: dict, outputs: Sequence[str]) -> list[str]:
    """The files whose checksum is verified before reuse: what later stages read, and every small file."""
    return [k for k, v in artifacts.items() if v["size"] <= CHECKSUM_MAX_OTHER or matches(k, outputs)]


def _clear(folder: Path, damaged: str, resumes: Sequence[str] | None) -> None:
    """Remove what a damaged stage must rebuild: its whole folder, or (a stage that resumes in place) only
    the damaged file, unless the stage repairs that file itself."""
    if not folder.is_dir():
        return
    if resumes is None:
        for p in folder.iterdir():
            if p.name not in (STAGE_FILE, LOCK_FILE):  # the lock stays: this process holds it
                shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    elif damaged != STAGE_FILE and damaged not in resumes:
        (folder / damaged).unlink(missing_ok=True)


# ---------------------------------------------------------------------------------------------- stages
def queries_section(cfg: DictConfig, split: str, fold: int | None = None) -> dict:
    """The ``queries`` section of one split (:func:`gdr.data.splits.split_queries`); with ``queries.folds``, of the
    retrievers that hold out ``fold`` (None: every topic)."""
    q = cfg.queries
    out = {"name": q.name, "split": split, "path": q.path}
    if q.name == "titles":
        out.update(seed=int(q.get("seed") or 0), fractions=list(q.get("fractions") or TITLE_FRACTIONS))
    elif q.get("fractions") is not None:
        out.update(seed=int(q.get("seed") or 0), fractions=list(q.fractions))
    if q.get("folds") is not None:
        out.update(seed=int(q.get("seed") or 0), folds=int(q.folds), fold=fold)
    return out


def dev_section(cfg: DictConfig) -> dict | None:
    """The ``queries`` section of the retrievers' dev split (``queries.dev_split``), or None: the trainer holds its
    dev split out of the training queries."""
    split = cfg.queries.dev_split
    return None if split is None else queries_section(cfg, str(split))


def check_dev_split(cfg: DictConfig, splits: QuerySplits) -> None:
    """``queries.dev_split``, read before the first stage: it holds a query with a relevant document in the corpus,
    and none of its queries is a training query (:func:`gdr.stages.train.check_dev_apart`)."""
    section = dev_section(cfg)
    if section is None:
        return
    dev = splits(section)
    if dev is None or len(dev) == 0:
        raise ConfigError(f"queries.dev_split={section['split']}: no {section['split']!r} query of "
                          f"queries.name={section['name']} has a relevant document in this corpus; choose another "
                          "split, or set queries.dev_split=null (the trainer holds its dev split out of the training "
                          "queries)")
    train_stage.check_dev_apart(splits(queries_section(cfg, cfg.queries.train_split)), dev)
    log.info("queries.dev_split=%s: the retrievers' dev split is its %d queries", section["split"], len(dev))


def bmi_real_queries(cfg: DictConfig) -> dict | None:
    """The ``queries`` section whose real queries BMI's document vector averages (``index.bmi.inputs=realq_*``, an
    indexer of the run): the training split's; None when BMI takes none."""
    if "bmi" not in cfg.indexers or not str(cfg.index.bmi.inputs).startswith("realq"):
        return None
    return queries_section(cfg, cfg.queries.train_split)


def check_bmi_real_queries(cfg: DictConfig, splits: QuerySplits) -> None:
    """``index.bmi.inputs=realq_*``, read before the first stage: the training split holds queries to average."""
    section = bmi_real_queries(cfg)
    if section is not None and not len(splits(section) or ()):
        raise ConfigError(f"index.bmi.inputs={cfg.index.bmi.inputs}: BMI's vector averages the real queries of the "
                          f"{section['split']!r} split, and queries.name={section['name']} has none with a relevant "
                          "document in this corpus; set index.bmi.inputs=genq_docseg")


def _folds(cfg: DictConfig) -> list[int | None]:
    """The held-out folds of a run (:func:`gdr.stages.train.retriever_folds`)."""
    return train_stage.retriever_folds(cfg.queries.get("folds"))


@dataclass
class StageSpec:
    """One stage of a run, before it runs: its name, the inputs that key it, how to build it into its folder,
    and what it reads and leaves (see :meth:`Pipeline.stage` for ``after``, ``resumes``, ``outputs``)."""

    name: str
    inputs: dict
    build: Callable[[Path], dict | None]
    after: Sequence[StageRecord] = ()
    resumes: Sequence[str] | None = None
    outputs: Sequence[str] = ("*",)


@dataclass
class RunSettings:
    """The settings of one ``gdr run``, one typed object per section, built once from its composed config at the door
    (:func:`run_settings`); each stage reads its own and writes its saved config from it."""

    lm: LMSettings  # the base query generator (``model:``, ``device``, ``threads``)
    sample: SampleSettings
    score: ScoreSettings
    cluster: ClusterSettings
    index: IndexSettings  # method: each indexer's is ``index.resolved(method=...)``
    train: TrainSettings  # seed: each retriever's is ``train.resolved(seed=...)``
    evaluate: EvaluateSettings
    doc_queries: DocQueries
    qg: RunQG | None  # None: a config without the section
    data: dict  # the corpus's section as composed: how it loads, and what a stage's saved config names


def run_settings(cfg: DictConfig) -> RunSettings:
    """The typed settings of a composed ``gdr run`` config that passed :func:`gdr.validate.validate`."""
    return RunSettings(lm=lm_settings(cfg), sample=SampleSettings.from_config(to_container(cfg.sample)),
                       score=ScoreSettings.from_config(to_container(cfg.score)),
                       cluster=ClusterSettings.from_config(to_container(cfg.cluster)),
                       index=IndexSettings.from_config(to_container(cfg.index)),
                       train=TrainSettings.from_config(to_container(cfg.train)),
                       evaluate=EvaluateSettings.from_config(to_container(cfg.evaluate)),
                       doc_queries=section_from(DocQueries, to_container(cfg.doc_queries), "doc_queries"),
                       qg=None if cfg.get("qg") is None else section_from(RunQG, to_container(cfg.qg), "qg"),
                       data=to_container(cfg.data))


@dataclass
class RunContext:
    """What every stage of one ``gdr run`` shares: the config, the loaded corpus, its signature in stage keys,
    the run folder, the query generator (loaded on first use, dropped once no stage needs it) and the records
    of the stages finished so far."""

    cfg: DictConfig
    corpus: Any
    pipe: Pipeline
    corpus_sig: dict
    lm_spec: Any
    test_q: dict
    t_start: float
    splits: QuerySplits  # the real queries of each split, read once for every stage
    settings: RunSettings  # the config's sections, typed once at the door
    argv: Sequence[str] = ()
    queries_sig: dict = field(default_factory=dict)  # per split (train, test): queries_signature, what keys them
    _lm: Any = None
    score: StageRecord | None = None
    cluster: StageRecord | None = None
    doc_queries: StageRecord | None = None
    indexes: dict[str, StageRecord] = field(default_factory=dict)  # per indexer (index_seed=retriever: the first
    # seed's, whose facts the report gives)
    seed_indexes: dict[tuple[str, int], StageRecord] = field(default_factory=dict)  # index_seed=retriever: per
    # (indexer, seed) the index its retriever of that seed trains on (:func:`index_of`)
    bm25: StageRecord | None = None
    results: dict[str, list[dict]] = field(default_factory=dict)  # per indexer, one row of test metrics per seed
    eval_dirs: dict[str, list] = field(default_factory=dict)  # per-query metrics for the paired tests (per seed:
    # a folder, or with queries.folds the list of its folds' folders, joined)
    folds_done: dict[tuple[str, int], dict[int, tuple[dict, Path]]] = field(default_factory=dict)  # queries.folds:
    # per (indexer, seed), each finished fold's test metrics and evaluation folder
    train_batch: int | None = None  # trainer.batch_size=auto resolved once for every retriever of the run
    retrievers: dict[tuple, dict] = field(default_factory=dict)  # (indexer, seed[, fold]): its retrievers.jsonl line
    per_query: dict[tuple, str] = field(default_factory=dict)  # (indexer, seed[, fold]): its per_query.jsonl line
    qg: StageRecord | None = None  # the fine-tuned query generator (qg.enabled), None: the base model's
    two_shot: dict[str, StageRecord] = field(default_factory=dict)  # qg.compare_two_shot: its score and cluster
    clock: RunClock = field(default_factory=lambda: RunClock())  # this invocation's wall time, in and outside stages
    training: dict = field(default_factory=dict)  # this invocation's training phase (:func:`_training_started`)
    host: HostStages | None = None  # the host stages run beside the device stages (:func:`start_host_stages`)

    def lm(self):
        if self._lm is None:
            with self.clock.part("lm_load"):
                self._lm = self.lm_spec.build()
        return self._lm

    def drop_lm(self) -> None:
        """Let the query generator go, with what its compiled code holds on the device (the training after it
        sizes its batch and concurrency by the free memory)."""
        self._lm = None
        release_compiled()

    def add_index(self, method: str, seed: int | None, rec: StageRecord) -> None:
        """Index ``rec`` of ``method`` built with ``seed`` (None: the run's one index of it): the one its retrievers of
        that seed train on (:func:`index_of`); an indexer's first is the one whose facts the report gives."""
        if seed is not None:
            self.seed_indexes[(method, seed)] = rec
        self.indexes.setdefault(method, rec)

    def stage(self, spec: StageSpec | None) -> StageRecord | None:
        """Run (or reuse) the stage of ``spec``; None for a stage this run leaves out."""
        if spec is None:
            return None
        if self.host is not None:
            self.host.check()  # a host stage that failed in the background stops the run before this one
        with self.clock.part("stages"):
            return self.pipe.stage(spec.name, spec.inputs, spec.build, after=spec.after, resumes=spec.resumes,
                                   outputs=spec.outputs)

    @property
    def uses_generated(self) -> bool:
        """Whether the retrievers learn from the generated queries too."""
        return self.doc_queries is not None and self.settings.train.examples.use_generated


def run_pipeline(cfg: DictConfig, argv: Sequence[str] = ()) -> dict:
    """Run every stage of ``conf/run.yaml`` (a composed config) into ``cfg.out``; returns the report (also in
    report.json). :func:`gdr.api.run` takes the same settings as a plain dict."""
    run = open_run(cfg, argv)
    run.host = HostStages(run.pipe.records, overlap_on(cfg.overlap, device_key(run.settings)["kind"]),
                          part=lambda: run.clock.part("stages"))
    try:
        with run.host.running():  # the host stages beside the device stages (gdr.stages.overlap)
            run_generator(run)
            run.score = run.stage(score_spec(run))
            _note_other_machine(run.score)
            start_host_stages(run, generated=False)  # the indexes on P or the corpus, the clustering, BM25
            run.doc_queries = run.stage(doc_queries_spec(run))
            start_host_stages(run, generated=True)  # BMI's index, on the generated queries
            compare_two_shot(run)
            run.drop_lm()  # the generator is not needed from here on
            take_indexes(run)
            train_and_evaluate(run)
            return _report(run)
    except BaseException as e:  # the previous run's report, if still the folder's, says this run stopped
        mark_stopped(run.pipe.root, f"stopped by {e}" if isinstance(e, signals.Stopped) else type(e).__name__)
        raise


TWO_SHOT_CLUSTER = "cluster (two-shot)"  # the host stage of qg.compare_two_shot's clustering (:func:`compare_two_shot`)


def start_host_stages(run: RunContext, generated: bool) -> None:
    """Start the host stages whose inputs are made and that no device stage waits on (:mod:`gdr.stages.overlap`):
    after the score stage (``generated=False``), every index but BMI's, the flat clustering and BM25; once the
    generated queries are made (``generated=True``), BMI's index. Each runs beside the device stages (``overlap``)
    or here at once, and is taken where it is needed: the indexes before the retrievers train, the clustering and
    BM25 by the first report (:func:`_report`)."""
    for method, seed in run_indexes(run.cfg):
        if (method == "bmi") == generated:
            _start(run, index_spec(run, method, seed), Priority.INDEX)
    if not generated:
        _start(run, cluster_spec(run), Priority.CLUSTER)
        _start(run, bm25_spec(run), Priority.BM25)


def _start(run: RunContext, spec: StageSpec | None, priority: Priority, name: str | None = None) -> None:
    """One host stage started (None: the run leaves it out) under ``name`` (default: the stage's), kept by a
    :class:`Pipeline` of its own (its record is placed in the run's by :class:`gdr.stages.overlap.HostStages`)."""
    if spec is not None:
        run.host.start(name or spec.name, partial(Pipeline(run.pipe.root).stage, spec.name, spec.inputs, spec.build,
                                          after=spec.after, resumes=spec.resumes, outputs=spec.outputs), priority)


def _take_host_stages(run: RunContext) -> None:
    """Every host stage started, finished and taken (waited for if need be): the clustering and BM25 for the
    report."""
    if run.host is not None:
        run.host.take_all()
        run.cluster, run.bm25 = run.host.take("cluster"), run.host.take("bm25")
        two = run.host.take(TWO_SHOT_CLUSTER)
        if two is not None:
            run.two_shot["cluster"] = two


def retriever_order(run: RunContext) -> list[tuple]:
    """The run's retrievers as (indexer, seed), seed by seed: the first complete comparison of every docid scheme
    (seed 0) comes before any second seed starts, so a run cut short has compared the schemes at least once.
    With ``queries.folds`` (indexer, seed, fold), (seed, fold) major: every scheme of a fold before the next fold,
    so a run cut short has compared the schemes on whole folds (paired tests need a topic scored by both), and
    every fold of seed 0 (each topic a test topic) before any second seed."""
    if run.cfg.queries.get("folds") is None:
        return [(method, int(seed)) for seed in run.cfg.seeds for method in run.indexes]
    return [(method, int(seed), fold) for seed in run.cfg.seeds for fold in _folds(run.cfg) for method in run.indexes]


def train_and_evaluate(run: RunContext) -> None:
    """6-7. Every retriever trained, evaluated and folded into the report as soon as it is trained (also when
    ``train.concurrent`` trains several at once: the parent evaluates each as it finishes while the others train),
    so a run cut short keeps each retriever it finished in ``retrievers.jsonl`` and the partial report. Retrievers
    trained by an earlier attempt are taken in first."""
    order = retriever_order(run)
    taken: set[tuple] = set()

    def take(ms: tuple, ran_here: bool = False, train: StageRecord | None = None) -> None:
        """Evaluate and report retriever ``ms`` (indexer, seed[, fold]), training it here if it is not yet;
        ``ran_here``: one of this run's workers trained it, so the parent finds it finished but it ran; ``train``:
        its pruned stage, whose evaluation is reused (:func:`_pruned_evaluated`)."""
        train = train or run.stage(train_spec(run, *ms))
        if ran_here:
            train.reused = False
        _trained(run, train, alone=not ran_here)
        ev = run.stage(eval_spec(run, ms[0], ms[1], train, *ms[2:]))
        finish_retriever(run, ms[0], ms[1], train, ev, *ms[2:])
        taken.add(ms)

    n_train = _train_examples_bound(run)
    run.train_batch = resolve_train_batch(run, n_train)
    specs = {ms: train_spec(run, *ms) for ms in order}
    for ms in order:
        pruned = _pruned_evaluated(run, ms, specs[ms])
        if pruned is not None or _finished(run.pipe, specs[ms]):
            take(ms, train=pruned)
    todo = [ms for ms in order if ms not in taken]
    settings = _train_settings(run)
    docids = str(next(iter(run.indexes.values())).path / "docids.tsv")
    at_once = train_stage.retrievers_at_once(settings, len(todo), n_train, docids) if len(todo) > 1 else 1
    _training_started(run, settings, at_once, len(todo))
    if at_once > 1:
        jobs = [partial(_train_stage, run.pipe.root, s.name, s.inputs, s.build, list(s.after))
                for s in (specs[ms] for ms in todo)]
        t0 = time.perf_counter()
        with run.clock.part("stages"):
            train_stage.train_retrievers(jobs, at_once, on_done=lambda i, _: take(todo[i], ran_here=True),
                                         on_cuda=train_stage.training_device(settings) != "cpu")
        run.training["seconds"] += time.perf_counter() - t0
    for ms in order:
        if ms not in taken:
            take(ms)


def open_run(cfg: DictConfig, argv: Sequence[str] = ()) -> RunContext:
    """Load the corpus, read its query splits and check the settings that compare with them, all before the run
    folder changes (a refused run leaves its report and config as they were); then mark the previous report in
    progress and save the config. ``cfg`` passed :func:`gdr.validate.validate` at the door (``gdr run``,
    ``gdr.run``): its rules are not checked again here."""
    t_start = time.perf_counter()
    settings = run_settings(cfg)
    corpus = corpus_from_config(settings.data)
    splits = QuerySplits(settings.data, corpus.doc_ids, cfg.data.get("docs_tsv"))
    # the query set (qrels against the corpus and the queries) before the first stage, not at bm25 hours later
    check_query_splits([queries_section(cfg, s) for s in (cfg.queries.train_split, cfg.queries.test_split)],
                       splits, need=cfg.queries.test_split)
    check_dev_split(cfg, splits)
    check_bmi_real_queries(cfg, splits)
    check_corpus("run", cfg, corpus)  # refused before the folder changes: its report and config stay
    pipe = Pipeline(cfg.out)
    upgrade_run(pipe.root)  # a folder of an older gdr brought to the current format, or refused in one line
    if mark_in_progress(pipe.root, _command(argv)):  # kept until this run's own replaces it, but marked
        log.info("%s: the previous run's report is marked in progress until this run replaces it", pipe.root)
    save_config(cfg, pipe.root, "run.config.yaml")
    # what ran it, as information (`gdr plan --check` reads the device from it); no stage key reads it
    atomic_write_text(pipe.root / RUN_FILE, json.dumps({"machine": machine_record()}, indent=2) + "\n")
    signatures = {s: queries_signature(splits(queries_section(cfg, s)), s)
                  for s in (cfg.queries.train_split, cfg.queries.test_split)}
    return RunContext(cfg, corpus, pipe, corpus_signature(corpus), settings.lm,
                      queries_section(cfg, cfg.queries.test_split), t_start, splits, settings, tuple(argv), signatures)


# ---------------------------------------------------------------------------------------------- stage specs
def score_spec(run: RunContext) -> StageSpec | None:
    """1. Sampled queries and P; only GC's docids and the flat clustering read P, so a run of other indexers alone
    leaves it out. P.manifest.json resumes in place too: a `gdr score` that repaired P by hand rewrites it, and
    the shard checksums (not this stage's record of the manifest) say which rows are still good."""
    cfg, corpus = run.cfg, run.corpus
    if cfg.cluster.enabled and corpus.labels is None:
        log.info("stage cluster: skipped: corpus %s has no labels, which the flat clustering is scored against "
                 "(a label field in the documents adds it; cluster.enabled=false silences this line)", corpus.name)
    if "gc" not in cfg.indexers and not _clustering(run):
        return None

    sample, score = run.settings.sample, run.settings.score

    def build(folder: Path) -> dict:
        save_config(_saved_run_config(run, out=str(folder)), folder, "score.config.yaml")
        _drop_damaged_queries(folder)
        older = _older_score(folder, run.lm().describe())  # an edited corpus: its unchanged part is taken from there
        try:
            path = score_corpus(corpus, (run.lm(), run.lm_spec), folder, sample, score, progress=cfg.progress,
                                reuse_from=older)
        except FileExistsError as e:
            if P_MANIFEST not in str(e):
                raise
            # The folder is keyed by exactly these settings, so a P manifest that disagrees was damaged:
            # start the matrix over rather than stop.
            log.warning("stage score: %s disagrees with this stage's settings; scoring P again", folder / P_MANIFEST)
            (folder / P_MANIFEST).unlink()
            path = score_corpus(corpus, (run.lm(), run.lm_spec), folder, sample, score, progress=cfg.progress,
                                reuse_from=older)
        return {"p_matrix": str(path)}

    return StageSpec("score", score_inputs(run.settings, run.corpus_sig, generator_key(run)), build,
                     resumes=("P.npy", "P.manifest.json"), outputs=("P.npy", "queries.jsonl", "doc_ids.json"))


def _embed_by_digest(settings: Any) -> Any:
    """A settings dict with its ``embed_model`` (a sentence-transformers name or path) keyed by the digest of the
    model's files (:func:`gdr.models.model_digest`); anything else as it is."""
    if isinstance(settings, dict) and isinstance(settings.get("embed_model"), str):
        return {**settings, "embed_model": model_digest(settings["embed_model"])}
    return settings


def _note_other_machine(score: StageRecord | None) -> None:
    """One log line when the P reused made on a machine whose kernels round differently (another CPU instruction
    set, GPU or torch build; its manifest's ``machine``): reused, not refused, as its key says it may be."""
    if score is None or not score.reused:
        return
    made = (read_manifest(score.path, P_MANIFEST) or {}).get("machine")
    differ = machine_differences(made, machine_record())
    if differ:
        log.info("stage score: reusing %s made on another machine (%s): its last bits may differ from a P made "
                 "here (reused, not refused: the device kind and dtype key P, the machine does not)",
                 score.path / P_MANIFEST, "; ".join(differ))


def _older_score(folder: Path, lm: dict) -> Path | None:
    """The newest other finished score stage beside ``folder`` whose P the same ``lm`` scored (the run of this
    corpus before an edit), or None. Its queries and entries are taken only where they are the bytes this stage
    would compute (:func:`gdr.stages.score.score_corpus`'s ``reuse_from``): which stage it is decides the speed,
    never the result, so it is no part of the stage key."""
    lm = json.loads(json.dumps(lm))
    found = []
    for d in folder.parent.glob("score-*"):
        man = read_manifest(d, P_MANIFEST) if d != folder and d.is_dir() else None
        if man and man.get("status") == "complete" and man.get("lm") == lm:
            found.append((d.joinpath(P_MANIFEST).stat().st_mtime, d))
    return max(found)[1] if found else None


def _clustering(run: RunContext) -> bool:
    return bool(run.cfg.cluster.enabled and run.corpus.labels is not None)


def cluster_spec(run: RunContext) -> StageSpec | None:
    """2. Flat clustering against the corpus labels (the data scientist's view; the demo's headline)."""
    if not _clustering(run):
        return None
    cfg, score, cluster = run.cfg, run.score, run.settings.cluster

    def build(folder: Path) -> dict:
        result, _ = cluster_run(run.corpus, load_run(score.path), folder, cluster, device=cfg.device)
        save_config(_saved_run_config(run), folder, "cluster.config.yaml")
        return cluster_headline(result)

    settings = _embed_by_digest({k: v for k, v in config_dict(cluster).items() if k != "enabled"})
    # P is keyed by the documents alone: the labels it is scored against key this stage
    inputs = {"score": score.key, "labels": hash_strings(run.corpus.labels), "cluster": settings, "kernel": GC_KERNEL}
    return StageSpec("cluster", inputs, build, after=[score])


def doc_queries_spec(run: RunContext) -> StageSpec | None:
    """3. Generated training queries per document, with their own decoding (doc_queries.top_k/top_p/temperature),
    not the clustering's."""
    cfg, dq = run.cfg, run.settings.doc_queries
    if int(dq.per_doc) <= 0:
        return None
    # the sampler of `gdr sample sample.per_doc=N` with the decoding of doc_queries
    settings = run.settings.sample.resolved(per_doc=int(dq.per_doc), seed=int(dq.seed), batch_size=dq.batch_size,
                                            max_new_tokens=int(dq.max_new_tokens), top_k=int(dq.top_k),
                                            top_p=float(dq.top_p), temperature=float(dq.temperature))

    def build(folder: Path) -> dict:
        save_config(_saved_run_config(run, out=str(folder), sample=settings), folder, "sample.config.yaml")
        _drop_damaged_doc_queries(folder)
        return {"doc_queries": str(sample_doc_queries(run.lm(), run.corpus, folder, settings, progress=cfg.progress))}

    return StageSpec("doc-queries", doc_queries_inputs(run.settings, run.corpus_sig, generator_key(run)), build,
                     outputs=("doc_queries.jsonl",))


# ---------------------------------------------------------------------------------------------- the generator
def generator_key(run: RunContext) -> dict | None:
    """What keys the LM stages (score, doc-queries) when the run fine-tuned its generator: the qg stage's KEY (the
    content that made it), not the digest of its weights, so a run whose generator weights ``gdr prune`` dropped
    still reuses them; None: the base model's :func:`lm_key`."""
    return None if run.qg is None else {"qg": run.qg.key}


def _qg_pairs(run: RunContext):
    """(the generator's training pairs, the held-out pairs on which the report's held-out losses are measured).
    ``qg.pairs=queries``: the run's training split only (:func:`gdr.stages.qg.run_pairs`), held out: the dev split's
    pairs. ``qg.pairs=titles``: (document, its own title) pairs of the corpus, read again with its titles, the
    document as the run's LM reads it; held out: the titles of a seeded ``qg.dev_fraction`` of the documents
    (:func:`gdr.stages.qg.run_title_pairs`); no query of the run in either."""
    cfg = run.cfg
    q = run.settings.qg
    train = run.splits(queries_section(cfg, cfg.queries.train_split))
    held = {s: run.splits(queries_section(cfg, s)) for s in ("dev", cfg.queries.test_split)
            if s != cfg.queries.train_split}
    if q.pairs == "titles":
        titled = corpus_from_config({**run.settings.data, "drop_title": False})
        pairs, dev = run_title_pairs(titled, float(q.dev_fraction), int(q.seed) + 1, [train, *held.values()])
        if q.dev_max is not None and len(dev) > int(q.dev_max):
            dev = dev.take(np.arange(int(q.dev_max)))
    else:
        pairs = run_pairs(run.corpus, train, list(held.values()), split=cfg.queries.train_split)
        dev = run_pairs(run.corpus, held.get("dev"), [], split="dev")
    if q.lowercase:
        pairs.queries = [t.lower() for t in pairs.queries]
    if q.max_pairs and len(pairs) > int(q.max_pairs):
        rng = np.random.default_rng(int(q.seed))
        pairs = pairs.take(np.sort(rng.choice(len(pairs), int(q.max_pairs), replace=False)))
    if q.lowercase and q.pairs == "titles":  # the held-out titles as the trained ones
        dev.queries = [t.lower() for t in dev.queries]
    return pairs, dev


def qg_spec(run: RunContext) -> StageSpec | None:
    """0. The query generator fine-tuned on the run's training split's (document, query) pairs (``qg.enabled``),
    keyed by the base LM, the pairs' content, the qg settings and the device kind. Its info holds the held-out loss
    on the dev split's pairs (``qg.pairs=titles``: on the held-out documents' titles) of the fine-tuned generator
    and of the base model with its (two-shot) prompt."""
    cfg = run.cfg
    if run.settings.qg is None or not run.settings.qg.enabled:
        return None
    pairs, dev = _qg_pairs(run)
    if len(pairs) == 0 and run.settings.qg.pairs == "titles":
        raise ValueError(f"qg.enabled=true, qg.pairs=titles: no document of data={cfg.data.name} outside the "
                         "held-out share has a title of its own to fine-tune the generator on; set "
                         "qg.pairs=queries or qg.enabled=false")
    if len(pairs) == 0:
        raise ValueError(f"qg.enabled=true: the {cfg.queries.train_split!r} split of queries.name={cfg.queries.name} "
                         "has no (query, document) pair in the corpus to fine-tune the generator on; set "
                         "qg.enabled=false")
    q = run.settings.qg
    # qg.pairs keys the stage only where it is not `queries`, so the keys of the runs before it stay; the pairs'
    # content (below) tells the two kinds apart anyway: title pairs hold no query, and a run whose queries are the
    # titles may not take them (gdr.validate.check_qg_pairs)
    settings = {k: v for k, v in keyed_values(RunQG, config_dict(q)).items()
                if k not in ("enabled", "compare_two_shot") and (k, v) != ("pairs", "queries")}
    inputs = {"lm": lm_key(run.settings.lm), "pairs": hash_strings([*pairs.doc_ids, "\0", *pairs.queries, "\0",
                                                              *pairs.docs]),
              "n_pairs": len(pairs), "dev_pairs": hash_strings([*dev.doc_ids, "\0", *dev.queries]), "qg": settings,
              "device": device_key(run.settings)}

    def build(folder: Path) -> dict:
        lm = run.lm_spec.build()  # the base model, loaded for this stage alone: fine-tuning changes its weights
        batch = q.train.eval_batch_size
        two_shot = pairs_loss(lm, dev, batch)  # the base model with its configured (few-shot) prompt
        p = lm.prompt
        if not lm.is_seq2seq and p.shots:  # a fine-tuned generator needs no examples (as `gdr qg qg.shots=0`)
            lm.prompt = PromptConfig(style=p.style, prefix=p.prefix, system=p.system, user=p.user, shots=[])
        res = fine_tune_qg(folder, lm, pairs, q.train, dev_fraction=float(q.dev_fraction),
                           dev_max=q.dev_max, seed=int(q.seed))
        del lm
        tuned = pairs_loss(replace(run.lm_spec, name=str(res.model_dir)).build(), dev, batch)
        titles = q.pairs == "titles"
        info = {"pairs": {"pairs": len(pairs), "documents": len(set(pairs.doc_ids)), "source": q.pairs,
                          "split": "documents with a title" if titles else cfg.queries.train_split},
                "n_train": res.n_train, "n_checkpoint_dev": res.n_dev, "global_step": res.global_step,
                "held_out": {"split": "titles of held-out documents" if titles else "dev", "n_pairs": len(dev),
                             "two_shot": two_shot, "fine_tuned": tuned}}
        atomic_write_json(folder / "qg.manifest.json", {"command": "gdr run (qg stage)", "base_model": cfg.model.name,
                                                         "model_dir": "model", **info})
        return info

    return StageSpec("qg", inputs, build, outputs=("model/*",))


def run_generator(run: RunContext) -> None:
    """The qg stage (``qg.enabled``): fine-tune the generator, or reuse it, and make it the run's query generator
    for every LM stage after it. A generator whose weights ``gdr prune`` dropped is taken as it was when the LM
    stages it made are all reusable, and retrained under its key only when one of them must run again."""
    spec = qg_spec(run)
    if spec is None:
        return
    base = run.lm_spec
    pruned = run.pipe.pruned(spec.name, spec.inputs, spec.after, spec.outputs)
    if pruned is not None:
        run.qg = pruned
        later = [s for s in (score_spec(run), doc_queries_spec(run)) if s is not None]
        if all(run.pipe.reusable(s.name, s.inputs, s.after, s.outputs) for s in later):
            log.info("stage qg: reusing %s (pruned: the stages it made stand without its weights)", pruned.path)
            run.pipe.records.append(pruned)
        else:
            run.qg = None
    if run.qg is None:
        run.qg = run.stage(spec)
    run.lm_spec, run._lm = replace(base, name=str(run.qg.path / "model")), None


def compare_two_shot(run: RunContext) -> None:
    """``qg.compare_two_shot``: the P of the base model with its two-shot prompt and its flat clustering, for the
    report's clustering with each generator; the same stages (and keys) as a run with ``qg.enabled=false``."""
    if run.qg is None or not run.settings.qg.compare_two_shot or not _clustering(run):
        return
    saved = (run.qg, run.lm_spec, run._lm, run.score)
    run.drop_lm()
    run.qg, run.lm_spec = None, run.settings.lm
    try:
        run.score = run.two_shot["score"] = run.stage(score_spec(run))
        _start(run, cluster_spec(run), Priority.CLUSTER, TWO_SHOT_CLUSTER)  # a host stage, taken by the report
    finally:
        run.drop_lm()
        run.qg, run.lm_spec, run._lm, run.score = saved


def _generator_report(run: RunContext, report: dict) -> dict:
    """The report with its query generator section (:mod:`gdr.stages.qg_report`) when the run fine-tuned one."""
    if run.qg is None:
        return report
    two = run.two_shot.get("cluster")
    summary = generator_summary(run.qg.info, run.cluster.info if run.cluster is not None else None,
                                two.info if two is not None else None)
    return add_generator_section(run.pipe.root, report, summary)


def take_indexes(run: RunContext) -> None:
    """4. Every indexer's docids, in the order of ``indexers`` (started by :func:`start_host_stages`, waited for if
    need be): one index each, or with ``index_seed=retriever`` one per retriever seed for an indexer whose ids depend
    on a seed (:func:`gdr.stages.index.index_seeds`)."""
    for method, seed in run_indexes(run.cfg):
        run.add_index(method, seed, run.host.take(index_stage_name(method, seed)))


def run_indexes(cfg: DictConfig) -> list[tuple[str, int | None]]:
    """(indexer, index seed) of every index stage of a run, in the order of ``indexers``: one an indexer (seed None),
    or with ``index_seed=retriever`` one per retriever seed for an indexer whose ids depend on a seed
    (:func:`gdr.stages.index.index_seeds`)."""
    return index_stages(cfg.indexers, str(cfg.index_seed), cfg.seeds)


def index_of(run: RunContext, method: str, seed: int) -> StageRecord:
    """The index whose docids the retriever of ``method`` and ``seed`` trains on (:func:`take_indexes`)."""
    return run.seed_indexes.get((method, int(seed))) or run.indexes[method]


def index_facts(run: RunContext) -> dict[str, dict]:
    """Per indexer, the facts of its index the report gives (depth, balance); with an index per retriever seed, over
    its indexes (:func:`gdr.stages.report.pooled_index_facts`)."""
    per_seed: dict[str, list[dict]] = {}
    for (method, _), rec in run.seed_indexes.items():
        per_seed.setdefault(method, []).append(rec.info)
    return {m: pooled_index_facts(per_seed[m]) if m in per_seed else r.info for m, r in run.indexes.items()}


def index_spec(run: RunContext, method: str, seed: int | None = None) -> StageSpec:
    """4. The docids of one indexer: GC reads P, BMI the generated queries, the others the corpus alone; ``seed``:
    built with ``index.seed`` = ``seed`` (``index_seed=retriever``), in a stage of its own."""
    score, doc_q = run.score, run.doc_queries
    settings = run.settings.index.resolved(method=method, **({} if seed is None else {"seed": int(seed)}))
    values = config_dict(settings)
    upstream = {"gc": score.key if score else None, "bmi": doc_q.key if doc_q else None}.get(method, "corpus")
    inputs = {"method": method, "corpus": run.corpus_sig, "upstream": upstream,
              "index": {k: _embed_by_digest(v) for k, v in index_key_values(method, values).items()}}
    if method == "gc":
        inputs["kernel"] = GC_KERNEL
    real_q = bmi_real_queries(run.cfg) if method == "bmi" else None
    if real_q is not None:
        inputs["real_queries"] = _queries_key(run, real_q)

    def build(folder: Path) -> dict:
        index = settings
        if method == "bmi":  # its input: the generated queries of this run
            index = index.resolved(kmeans=replace(index.kmeans, doc_queries=str(doc_q.path / "doc_queries.jsonl")))
        if real_q is not None:  # and the training split's real queries, by relevant document
            path = folder / BMI_REAL_QUERIES
            write_jsonl(path, queries_by_document(run.splits(real_q)))
            index = index.resolved(bmi=replace(index.bmi, real_queries=str(path)))
        p_run = str(score.path) if method == "gc" else None
        summary = build_index(index, folder, corpus=run.corpus, run=p_run)
        # `gdr index`'s config: its settings with the method after them, as the command composes it
        saved = {k: v for k, v in config_dict(index).items() if k != "method"}
        save_config({**saved, "method": method, "out": str(folder), "index": None, "data": run.settings.data,
                     "run": p_run}, folder)
        return {k: summary[k] for k in ("depth_max", "depth_mean", "balance_mean", "largest_child_frac_mean",
                                        "leaf_size_max", "n_leaves", "n_fallback") if k in summary}

    after = {"gc": [score], "bmi": [doc_q] if doc_q else []}.get(method, [])
    return StageSpec(index_stage_name(method, seed), inputs, build, after=after, outputs=("docids.tsv",))


# The form of the TREC run files an evaluation writes, in its stage key: 2 = scores in full, BM25's equal scores in
# trec_eval's order (gdr.eval.bm25.BM25Index)
TREC_FILES = 2


def bm25_spec(run: RunContext) -> StageSpec | None:
    """5. BM25 on the test queries, once: the reference every retriever is compared with."""
    cfg, test_q = run.cfg, run.test_q
    if not cfg.bm25:
        return None

    def build(folder: Path) -> dict:
        return bm25_baseline(run.corpus, _test_queries(run, test_q), folder, k=int(cfg.evaluate.k),
                             split=test_q["split"])

    inputs = {"corpus": run.corpus_sig, "queries": run.queries_sig[test_q["split"]], "k": int(cfg.evaluate.k),
              "per_query": 1, "trec_files": TREC_FILES}
    return StageSpec("bm25", inputs, build)


def train_spec(run: RunContext, method: str, seed: int, fold: int | None = None) -> StageSpec:
    """6. One retriever per (indexer, seed) on that indexer's docids; with ``queries.folds``, per (indexer, seed,
    fold), trained without the topics of ``fold``."""
    cfg, idx, doc_q, use_gen = run.cfg, index_of(run, method, seed), run.doc_queries, run.uses_generated
    train_q = queries_section(cfg, cfg.queries.train_split, fold)
    settings = _train_settings(run).resolved(seed=seed)  # the resolved batch keys the stage: `auto` hides none
    keyed = {k: v for k, v in keyed_values(TrainSettings, config_dict(settings)).items()
             if k not in ("model_presets", "seed")}  # the seed keys the stage beside them
    keyed["model"], keyed["optim"] = train_stage.keyed_model(settings), train_stage.keyed_optim(keyed["optim"])
    inputs = {"index": idx.key, "doc_queries": doc_q.key if use_gen else None, "corpus": run.corpus_sig,
              "queries": _queries_key(run, train_q), "train": keyed, "seed": seed,
              "device": train_stage.training_numerics(settings)}
    dev_q = dev_section(cfg)
    if dev_q is not None:  # only then: the keys of a run without queries.dev_split stay as they were
        inputs["dev"] = queries_signature(run.splits(dev_q), dev_q["split"])
    if settings.trainer.val_beam < VAL_K:  # only there is a search at val_beam not one at VAL_K: other keys stay
        inputs["validation"] = VALIDATION_SEARCH
    build = _TrainBuild(run.corpus, settings, run.settings.data, train_q, run.splits(train_q),
                        str(idx.path / "docids.tsv"), str(doc_q.path / "doc_queries.jsonl") if use_gen else None,
                        None if dev_q is None else run.splits(dev_q))
    return StageSpec(f"train-{train_stage.retriever_name(method, seed, fold)}", inputs, build,
                     after=[idx] + ([doc_q] if use_gen else []),
                     outputs=TRAIN_OUTPUTS)


def _train_examples_bound(run: RunContext) -> int:
    """An upper bound on one retriever's training examples (real training queries, each document's first window,
    its random windows and its generated queries), which sizes ``auto`` batches."""
    cfg = run.cfg
    qs = run.splits(queries_section(cfg, cfg.queries.train_split))
    per_doc = int(run.settings.doc_queries.per_doc) if run.uses_generated else 0
    windows = 1 + int(run.settings.train.examples.doc_windows)
    return len(run.corpus) * (windows + per_doc) + (sum(len(r) for r in qs.relevant) if qs is not None else 0)


AUTO_SIZES_FILE = "auto_sizes.json"  # the run's resolved auto sizes, on the device that resolved them


def resolve_train_batch(run: RunContext, n_train: int) -> int | None:
    """``trainer.batch_size=auto`` resolved once per run and recorded in ``<run>/auto_sizes.json``: every retriever
    of the run, and the run resumed on the same kind of device, trains at that batch whatever else holds the
    device's memory by then; another device resolves (and keys) its own. None for a batch size given as a number."""
    settings = run.settings.train
    if settings.trainer.batch_size != "auto":
        return None
    path = run.pipe.root / AUTO_SIZES_FILE
    device = train_stage.training_device(settings)
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        saved = {}
    if saved.get("device") == device and isinstance(saved.get("train_batch"), int):
        return saved["train_batch"]
    docids = list(dict.fromkeys(str(r.path / "docids.tsv") for r in [*run.indexes.values(),
                                                                      *run.seed_indexes.values()]))
    batch = train_stage.resolve_run_batch(settings, docids, n_train)
    atomic_write_json(path, {"device": device, "train_batch": batch})
    log.info("trainer.batch_size=auto: %d on %s for every retriever of this run (%s)", batch, device, path.name)
    return batch


def eval_spec(run: RunContext, method: str, seed: int, train: StageRecord, fold: int | None = None) -> StageSpec:
    """7. A retriever on the test split (search, metrics, per-query figures, TREC run): with ``queries.folds``, on
    the topics of the fold it was trained without."""
    cfg = run.cfg
    test_q = run.test_q if fold is None else queries_section(cfg, cfg.queries.test_split, fold)
    inputs = {"train": train.key, "queries": _queries_key(run, test_q), "per_query": 1, "trec_files": TREC_FILES,
              "evaluate": keyed_values(EvaluateSettings, config_dict(run.settings.evaluate))}
    settings = run.settings.evaluate.resolved(bm25=False)  # BM25 is the run's own stage

    def build(folder: Path) -> dict:
        folder.mkdir(parents=True, exist_ok=True)
        save_config({**config_dict(settings), "data": run.settings.data, "run_dir": str(train.path),
                     "out_dir": str(folder), "queries": test_q}, folder)
        m, _ = evaluate_model(train.path, run.corpus, _test_queries(run, test_q), folder, settings,
                              split=test_q["split"])
        return {"metrics": m["systems"][settings.tag]}

    return StageSpec(f"eval-{train_stage.retriever_name(method, seed, fold)}", inputs, build, after=[train])


TRAIN_OUTPUTS = ("model/*", "docids.tsv")


@dataclass
class _TrainBuild:
    """``build`` of one retriever's stage (``gdr train`` into the stage folder); picklable, so that
    :func:`gdr.stages.train.train_retrievers` can run it in a process of its own."""

    corpus: Any
    settings: TrainSettings  # with its seed
    data: dict
    queries: dict  # the section, saved in the stage's config
    split: Any  # its real queries (a QuerySet), or None
    docids: str
    generated: str | None
    dev: Any = None  # the dev split given whole (queries.dev_split, a QuerySet), or None: held out by the trainer

    def __call__(self, folder: Path) -> dict:
        settings = self.settings
        # `gdr train`'s config: the train section of `gdr run` (its seed after it) and the command's own keys
        saved = {k: v for k, v in config_dict(settings).items() if k != "seed"}
        sub = {**saved, "data": self.data, "seed": settings.seed, "docids": self.docids, "out_dir": str(folder),
               "queries": self.queries, "generated": self.generated}
        # the folder is this stage's own: a checkpoint of other inputs in it is cleared, not refused
        res = train_stage.train_retriever(self.corpus, self.docids, folder, settings, queries=self.split,
                                          generated=self.generated, stale="restart", dev=self.dev,
                                          write_config=lambda f: save_config(sub, f))
        return {**train_stage.best_record(res.monitor, res.best_score), "global_step": res.global_step,
                "start_step": res.start_step, "n_params": res.n_params, "memory": res.memory}


def _train_stage(root: Path, name: str, inputs: dict, build: _TrainBuild, after: list) -> StageRecord:
    """One retriever's stage, run in a training process of its own (its stage.json marks it finished there)."""
    return Pipeline(root).stage(name, inputs, build, after=after, outputs=TRAIN_OUTPUTS)


def _finished(pipe: Pipeline, spec: StageSpec) -> bool:
    """Whether ``spec``'s stage folder is marked complete and holds its files (its checks come when
    :meth:`Pipeline.stage` reuses it); a pruned one is not (:func:`_pruned_evaluated`)."""
    marker = pipe.folder(spec.name, spec.inputs)[0] / STAGE_FILE
    try:
        record = json.loads(marker.read_text())
        return record.get("status") == "complete" and not record.get("pruned")
    except (OSError, ValueError, AttributeError):  # none yet, or damaged: Pipeline.stage says what and re-runs
        return False


def _pruned_evaluated(run: RunContext, ms: tuple, spec: StageSpec) -> StageRecord | None:
    """The record of retriever ``ms``'s training stage when ``gdr prune`` dropped its weights and its evaluation is
    finished and reusable as it is: the retriever is taken in from its evaluation, without its weights. None
    otherwise; a pruned retriever whose evaluation must run again is retrained under its key
    (:meth:`Pipeline.stage`)."""
    train = run.pipe.pruned(spec.name, spec.inputs, spec.after, spec.outputs)
    if train is None:
        return None
    ev = eval_spec(run, ms[0], ms[1], train, *ms[2:])
    if not run.pipe.reusable(ev.name, ev.inputs, ev.after, ev.outputs):
        return None
    log.info("stage %s: reusing %s (pruned: its evaluation stands without its weights)", spec.name, train.path)
    run.pipe.records.append(train)
    return train


def _train_settings(run: RunContext) -> TrainSettings:
    """The run's training settings, with ``trainer.batch_size=auto`` as resolved for the run."""
    settings = run.settings.train
    if run.train_batch is None:
        return settings
    return settings.resolved(trainer=replace(settings.trainer, batch_size=run.train_batch))


def trained_on(cfg: DictConfig, corpus, qs, use_generated: bool) -> str:
    """What the retrievers of a run learnt from, in words, for the report: the real training split ``qs`` (a
    QuerySet, or None) when the query set has one, else generated queries (and the documents' own windows) only."""
    if cfg.queries.get("folds") is not None:
        k = int(cfg.queries.folds)
        return f"the topics of the {k - 1} other folds of {k}" + (" and generated queries" if use_generated else "")
    split = f"`{cfg.queries.train_split}`"
    if qs is not None and len(qs):
        return f"{split} ({len(qs)} queries)" + (" and generated queries" if use_generated else "")
    name = corpus.name if cfg.queries.name == cfg.data.name else cfg.queries.name  # a BEIR folder by its name
    return (f"generated queries only: `{name}` has no {split} queries" if use_generated else
            f"the documents' own text only: `{name}` has no {split} queries and there are no generated queries")


def finish_retriever(run: RunContext, method: str, seed: int, train: StageRecord, ev: StageRecord,
                     fold: int | None = None) -> None:
    """Take in one finished retriever: its test figures join the run's, ``retrievers.jsonl`` is rewritten to hold
    the retrievers finished so far (one line each, in the run's order: :func:`retriever_order`), and the report is
    rewritten over them, marked partial, so a run cut short (a lease that ends) leaves what it finished. With
    ``queries.folds`` a seed's figures are those of its folds joined (:func:`_joined_folds`)."""
    if fold is None:
        rows = [*zip(run.results.get(method, []), run.eval_dirs.get(method, [])),
                ({"seed": seed, **ev.info["metrics"]}, ev.path)]
        rows.sort(key=lambda r: [int(s) for s in run.cfg.seeds].index(r[0]["seed"]))
        run.results[method], run.eval_dirs[method] = [r for r, _ in rows], [d for _, d in rows]
    else:
        run.folds_done.setdefault((method, seed), {})[fold] = (ev.info["metrics"], ev.path)
        run.results[method], run.eval_dirs[method] = _joined_folds(run, method)
    # the report's rows in the order of `indexers`, whatever order the retrievers finished in
    run.results = {m: run.results[m] for m in run.indexes if m in run.results}
    run.eval_dirs = {m: run.eval_dirs[m] for m in run.indexes if m in run.eval_dirs}
    monitor, score = train.info.get("best_val_metric"), train.info.get("best_val_score")
    ms = (method, seed) if fold is None else (method, seed, fold)
    run.retrievers[ms] = {
        "indexer": method, "seed": seed, **({} if fold is None else {"fold": fold}), "train": train.path.name,
        "eval": ev.path.name, "train_seconds": train.seconds, "eval_seconds": ev.seconds,
        **train_stage.best_record(monitor, score), "curve": train_stage.read_curve(train.path),
        "metrics": ev.info["metrics"]}
    qids, first = read_per_query(ev.path / PER_QUERY_FILE)
    run.per_query[ms] = json.dumps({"indexer": method, "seed": seed, **({} if fold is None else {"fold": fold}),
                                    "eval": ev.path.name, "qids": qids, "first_rank": first.tolist()}) + "\n"
    _write_retrievers(run)
    done = sum(map(len, run.folds_done.values())) if fold is not None else sum(map(len, run.results.values()))
    total = len(run.indexes) * len(run.cfg.seeds) * len(_folds(run.cfg))
    if done < total:
        _report(run, partial={"retrievers_done": done, "retrievers": total})


def _joined_folds(run: RunContext, method: str) -> tuple[list[dict], list[list[Path]]]:
    """(one row of test figures per seed, per seed its folds' evaluation folders) of ``method`` under
    ``queries.folds``: a seed counts once all its folds are scored, its figures the means over all their topics
    (each fold's weighted by its topics); while no seed has every fold, the first seed's finished folds count, so
    a run cut short compares the schemes on the folds it finished."""
    k = len(_folds(run.cfg))
    seeds = [int(s) for s in run.cfg.seeds if (method, int(s)) in run.folds_done]
    whole = [s for s in seeds if len(run.folds_done[(method, s)]) == k]
    rows, dirs = [], []
    for s in whole or seeds[:1]:
        done = run.folds_done[(method, s)]
        folds = sorted(done)
        rows.append({"seed": s, **_pooled_metrics([done[f][0] for f in folds]), "folds": folds})
        dirs.append([done[f][1] for f in folds])
    return rows, dirs


def _pooled_metrics(rows: Sequence[dict]) -> dict:
    """Test figures of several disjoint query sets as one: each mean weighted by its ``n_queries``, which add up."""
    n = np.array([float(r["n_queries"]) for r in rows])
    out: dict = {}
    for key, value in rows[0].items():
        if key == "n_queries":
            out[key] = int(n.sum())
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = float(np.dot(n, [float(r[key]) for r in rows]) / n.sum())
        else:
            out[key] = value
    return out


def _write_retrievers(run: RunContext) -> None:
    """``retrievers.jsonl``: exactly the retrievers of this run finished so far, one line each keyed by (indexer,
    seed[, fold]), in the run's order; replaced whole (a temporary file renamed), so a retriever superseded since an
    earlier run of the folder (e.g. by a changed ``index.gc.alpha``) or not part of this run leaves no line; and
    ``per_query.jsonl``, the same retrievers' per-query results (:data:`PER_QUERY_RUN_FILE`)."""
    lines = [json.dumps(run.retrievers[ms], default=str) + "\n" for ms in retriever_order(run) if ms in run.retrievers]
    atomic_write_text(run.pipe.root / RETRIEVERS_FILE, "".join(lines))
    order = [ms for ms in retriever_order(run) if ms in run.per_query]
    atomic_write_text(run.pipe.root / PER_QUERY_RUN_FILE, "".join(run.per_query[ms] for ms in order))


def _command(argv: Sequence[str]) -> str:
    return "gdr run " + " ".join(shlex.quote(a) for a in argv)


def _report(run: RunContext, partial: dict | None = None) -> dict:
    """The run's report (report.md, report.png, report.json) over the stages and retrievers finished so far;
    ``partial``: how many of the run's retrievers those are, while some are still to come. Its seconds count as
    ``report_rewrites`` in the report's ``outside_stages``."""
    _take_host_stages(run)
    with run.clock.part("report_rewrites"):
        return _write_report(run, partial)


def _write_report(run: RunContext, partial: dict | None = None) -> dict:
    cfg = run.cfg
    seconds = round(time.perf_counter() - run.t_start, 1)
    predicted, plan_note = _predicted(run)
    eval_dirs = {**run.eval_dirs, **({"bm25": [run.bm25.path]} if run.bm25 is not None else {})}
    train_q = run.splits(queries_section(cfg, cfg.queries.train_split))
    report = write_report(to_container(cfg), _command(run.argv), run.pipe.root, run.pipe.records, len(run.corpus),
                        run.results, index_facts(run),
                        run.bm25.info["metrics"] if run.bm25 is not None else None,
                        run.cluster.info if run.cluster is not None else None, seconds, eval_dirs,
                        corpus_name=getattr(run.corpus, "name", None),
                        trained_on=trained_on(cfg, run.corpus, train_q, run.uses_generated), partial=partial,
                        unknown_qrels=sum((_test_queries(run, run.test_q).info.get("unknown_qrels")
                                           or {}).get(s, 0) for s in (run.test_q["split"], "pooled")),
                        predicted=predicted, plan_note=plan_note, query_split=query_split(run),
                        retrievers=[run.retrievers[ms] for ms in retriever_order(run) if ms in run.retrievers],
                        timing=run_timing(run, seconds))
    return _generator_report(run, report)


def _predicted(run: RunContext) -> tuple[dict[str, float | None] | None, str]:
    """(the seconds of the run's ``plan.json`` per stage, or None; the report's line on them): the run reads the
    plan written into its folder (``gdr plan``) and never makes one (:mod:`gdr.stages.plan_file`)."""
    rec, note = read_plan(run.pipe.root, plan_identity(to_container(run.cfg), run_device(run.cfg.get("device"))[0]))
    return (None if rec is None else predicted_from_plan(rec, [r.name for r in run.pipe.records])), note


class RunClock:
    """Wall time of one invocation by part (``stages``, ``lm_load``, ``report_rewrites``), each second counted once:
    a part entered inside another pauses the outer one (the LM loaded inside the score stage counts as ``lm_load``,
    a report rewritten while retrievers train concurrently as ``report_rewrites``). It is the critical path's clock:
    a part entered from another thread (a host stage run beside, :mod:`gdr.stages.overlap`, which accounts its own
    seconds) counts nothing here, so no second is counted twice and the stack of open parts stays the main
    thread's."""

    def __init__(self):
        self.parts: dict[str, float] = {}
        self._open: list[list] = []  # [part, since] from the outermost to the innermost
        self._thread = threading.current_thread()

    @contextlib.contextmanager
    def part(self, name: str):
        if threading.current_thread() is not self._thread:
            yield
            return
        now = time.perf_counter()
        if self._open:
            self._add(*self._open[-1], now)
        self._open.append([name, now])
        try:
            yield
        finally:
            now = time.perf_counter()
            self._add(*self._open.pop(), now)
            if self._open:
                self._open[-1][1] = now

    def _add(self, name: str, since: float, now: float) -> None:
        self.parts[name] = self.parts.get(name, 0.0) + now - since


def _training_started(run: RunContext, settings, at_once: int, n_todo: int) -> None:
    """The training phase begins: the free device memory (GB; None on the CPU), the retrievers at once and the batch
    logged and kept for the report (:func:`run_timing`)."""
    on_cuda = train_stage.training_device(settings) != "cpu"
    free = free_memory() if on_cuda and n_todo else None
    batch = run.train_batch or run.settings.train.trainer.batch_size
    run.training = {"free_gb": None if free is None else round(free / 1e9, 1), "retrievers_at_once": at_once,
                    "batch": batch, "forward_passes": settings.optim.forward_passes, "retrievers": 0, "examples": 0,
                    "seconds": 0.0, "peak_gb": None, "estimate_gb": None}
    if n_todo:
        log.info("training %d retrievers: %s free, %d at once, batch %s", n_todo,
                 "n/a (CPU)" if free is None else f"{free / 1e9:.1f} GB", at_once, batch)


def _trained(run: RunContext, train: StageRecord, alone: bool) -> None:
    """Count a retriever trained by this invocation in its training phase: its examples (the steps it trained here,
    from the step it resumed at, x batch), the most device memory one held (CUDA's allocator peak) and the batch
    rule planned for one, and, when it trained alone, its seconds (a concurrent phase counts its wall time once)."""
    if train.reused or not run.training:
        return
    run.training["retrievers"] += 1
    steps = int(train.info.get("global_step") or 0) - int(train.info.get("start_step") or 0)
    run.training["examples"] += steps * int(run.training["batch"])
    memory = train.info.get("memory") or {}
    for key, part in (("peak_gb", "peak_bytes"), ("estimate_gb", "estimate_bytes")):
        if memory.get(part) is not None:
            run.training[key] = max(run.training[key] or 0.0, round(memory[part] / 1e9, 2))
    if alone:
        run.training["seconds"] += float(train.last_seconds or train.seconds)


def run_timing(run: RunContext, seconds: float) -> dict:
    """The report's accounts of this invocation: ``training`` (free GB at its start, retrievers at once, batch,
    forward passes an example (2 with R-drop), retrievers trained here, their examples, the phase's seconds with
    validations, ``examples_per_s`` (each example once, whatever its passes), the most device memory one of them
    held, ``peak_gb`` (CUDA; None on the CPU), beside what the batch rule planned for one, ``estimate_gb``; None when
    none trained here), ``outside_stages`` (the seconds not inside a stage: LM load, report rewrites, the rest: corpus
    load, process starts outside a stage, bookkeeping) and ``overlapped`` (the host stages that ran beside the device
    stages, :meth:`gdr.stages.overlap.HostStages.accounts`: their seconds, and the main thread's waits for them,
    which alone count in ``stages``; None: none did)."""
    t = dict(run.training)
    training = None
    if t.get("retrievers"):
        t["seconds"] = round(t["seconds"], 1)
        t["examples_per_s"] = round(t["examples"] / t["seconds"], 1) if t["seconds"] else None
        training = t
    parts = run.clock.parts
    outside = max(0.0, seconds - parts.get("stages", 0.0))
    lm, reports = parts.get("lm_load", 0.0), parts.get("report_rewrites", 0.0)
    return {"training": training,
            # to 0.01 s: a small model loads, and a report is rewritten, in well under 0.1 s
            "outside_stages": {"seconds": round(outside, 2), "lm_load": round(lm, 2),
                               "report_rewrites": round(reports, 2),
                               "other": round(max(0.0, outside - lm - reports), 2)},
            "overlapped": run.host.accounts() if run.host is not None else None}


def query_split(run: RunContext) -> dict:
    """How the run's topics were split, for the report: ``{"by": "folds", "folds", "seed", "n_topics"}`` (every
    topic a test topic once), ``{"by": "fractions", "fractions", "seed"}`` (a seeded hash of the topic id;
    ``"by": "titles"``: of the document id) or ``{"by": "query set"}`` (its own splits)."""
    section = run.test_q
    if section.get("folds"):
        n = len(_test_queries(run, section))
        return {"by": "folds", "folds": section["folds"], "seed": section["seed"], "n_topics": n}
    if section.get("fractions"):
        return {"by": "titles" if section["name"] == "titles" else "fractions", "fractions": section["fractions"],
                "seed": section["seed"]}
    return {"by": "query set"}


def corpus_signature(corpus) -> dict:
    """What identifies the corpus in the keys of the stages that read more of it than the LM does (index, bm25,
    train): :func:`documents_signature` and hashes of the bodies, titles and labels, never the files or settings it
    was loaded by, so a moved or copied collection reuses every stage."""
    def optional(values):
        return None if values is None else hash_strings("\0" if v is None else f"={v}" for v in values)

    return {**documents_signature(corpus), "bodies": hash_strings(corpus.texts), "titles": optional(corpus.titles),
            "labels": optional(corpus.labels)}


def _queries_key(run: RunContext, section: dict) -> dict:
    """What keys a stage by the queries of ``section``: the split's :func:`queries_signature` read once per run, or
    with ``queries.folds`` the fold's own (the topics a fold trains on or is tested on differ by fold)."""
    if section.get("fold") is None:
        return run.queries_sig[section["split"]]
    return {**queries_signature(run.splits(section), section["split"]), "fold": section["fold"]}


def queries_signature(qs, split: str) -> dict:
    """What identifies the real queries ``qs`` of the split ``split`` (a QuerySet read against the corpus, or None)
    in a key: their ids, texts, relevant documents and grades, never the files they came from."""
    if qs is None:
        return {"split": split, "n": 0}
    judged = [*("\t".join(r) for r in qs.relevant), "\0", *("\t".join(map(str, g)) for g in qs.grades or ())]
    return {"split": split, "n": len(qs), "queries": hash_strings([*qs.qids, "\0", *qs.texts]),
            "judged": hash_strings(judged)}


def documents_signature(corpus) -> dict:
    """What identifies the documents in the keys of the stages that read nothing else of the corpus (sampling,
    scoring): hashes of their ids and of the texts the LM reads, never where they were loaded from."""
    return {"doc_ids": hash_strings(corpus.doc_ids), "texts": hash_strings(corpus.model_inputs()),
            "n_docs": len(corpus)}


def score_inputs(settings: RunSettings, corpus_sig: dict, lm: dict | None = None) -> dict:
    """The inputs that key the score stage (sampled queries and P): the documents (of ``corpus_sig``, a
    :func:`documents_signature` or a :func:`corpus_signature`), the LM, the sampling and scoring settings, how P scores
    a query's end (:data:`gdr.lm.scoring.QUERY_END`) and the machine's part (:func:`device_key`); not the paths of the
    files nor the query or judgement settings.
    ``lm``: the generator's key in place of :func:`lm_key` (a fine-tuned one: :func:`generator_key`)."""
    return {"documents": _documents(corpus_sig), "lm": lm or lm_key(settings.lm),
            "sample": keyed_values(SampleSettings, config_dict(settings.sample)),
            "sampler": _sampler(), "query_end": QUERY_END, "score": _score_key(settings.score),
            "device": device_key(settings, scoring=True)}


def lm_key(lm: LMSettings) -> dict:
    """The query generator as it keys a stage: its ``model:`` settings with the name replaced by the digest of the
    model's files (:func:`gdr.models.model_digest`), so a model changed in place re-runs what it made and a moved
    one re-runs nothing. A prefix prompt keys how it starts too (:data:`gdr.lm.prompts.PROMPT_LEAD`)."""
    model = {f.name: config_dict(getattr(lm, f.name)) for f in fields(ModelOptions)}
    lead = {"prompt_lead": PROMPT_LEAD} if (model["prompt"] or {}).get("style") == "prefix" else {}
    return {**{k: v for k, v in model.items() if k != "name"}, "weights": model_digest(lm.name), **lead}


def _documents(corpus_sig: dict) -> dict:
    return {k: corpus_sig[k] for k in ("doc_ids", "texts", "n_docs") if k in corpus_sig}


def _score_key(score: ScoreSettings) -> dict:
    """The score section as it keys the stage; the compute dtype keys it as resolved (:func:`device_key`)."""
    return {k: v for k, v in keyed_values(ScoreSettings, config_dict(score)).items() if k != "compute_dtype"}


def device_key(settings: RunSettings, scoring: bool = False) -> dict:
    """What of the machine decides sampled queries and P: the device kind the LM runs on (CUDA decodes a bf16
    copy, the CPU fp32) and, for scoring, the dtype its passes compute in (``score.compute_dtype`` resolved
    for that device, :func:`gdr.lm.scoring.score_compute_dtype`) and on a CPU the threads it scores with
    (:meth:`gdr.stages.settings.LMSettings.scoring_threads`)."""
    device = settings.lm.device
    kind = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else torch.device(device).type
    out = {"kind": kind}
    if scoring:
        dtype = score_compute_dtype(settings.score.compute_dtype, torch.device(kind))
        out["compute_dtype"] = str(dtype).removeprefix("torch.")
        if kind == "cpu":
            out["threads"] = settings.lm.scoring_threads(settings.score.processes)
    return out


def doc_queries_inputs(settings: RunSettings, corpus_sig: dict, lm: dict | None = None) -> dict:
    """The inputs that key the doc-queries stage (generated training queries, with their own decoding): as
    :func:`score_inputs`, the documents, the LM (``lm``, as there), the decoding settings and the device kind."""
    return {"documents": _documents(corpus_sig), "lm": lm or lm_key(settings.lm),
            "doc_queries": keyed_values(DocQueries, config_dict(settings.doc_queries)), "sampler": _sampler(),
            "per_doc_sampler": PER_DOC_SAMPLER,
            "device": device_key(settings)}


def _sampler() -> str:
    """The sampler version (gdr.lm.decode): another version draws other queries, so it keys the stages."""
    return SAMPLER_VERSION


def _saved_run_config(run: RunContext, out: str | None = None, **sections) -> dict:
    """The run's config as a stage saves it (``gdr score``'s, ``gdr sample``'s, ``gdr cluster``'s view of the run):
    every section from the run's settings, ``sections`` (settings objects) in place of the run's, each with the keys
    the config gives it, in its order (a field the run sets per stage, ``index.method``, ``train.seed``, is not one);
    ``out``: the stage's folder."""
    saved = to_container(run.cfg)
    typed = {**{f.name: getattr(run.settings, f.name) for f in fields(RunSettings) if f.name != "lm"}, **sections}
    for name, settings in typed.items():
        if settings is not None and name in saved:
            values = config_dict(settings)
            saved[name] = {k: values[k] for k in saved[name]}
    return saved if out is None else {**saved, "out": out}


def lm_settings(cfg: DictConfig):
    """The query generator of a composed config (``model:``, ``device``, ``threads``)."""
    return LMSettings.from_config(to_container(cfg.model), device=str(cfg.get("device") or LMSettings.device),
                                threads=cfg.get("threads"))


def _test_queries(run: RunContext, test_q: dict):
    """The test queries of the run (for bm25 and every evaluation); an error when the corpus has none."""
    qs = run.splits(test_q)
    if qs is None or len(qs) == 0:
        raise ValueError(f"no {test_q['split']!r} queries with a relevant document for {run.cfg.data.name}: "
                         "set queries.name / queries.test_split")
    return qs
