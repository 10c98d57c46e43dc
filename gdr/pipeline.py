"""``gdr run``: the whole pipeline, from a corpus to the retrieval accuracy of each docid indexer.

Stages, in order (each keeps the folder layout of its own command, so any of them can be run by hand)::

    score-<key>/             gdr score     sampled queries + P matrix (queries.jsonl, P.npy, manifests)
    cluster-<key>/           gdr cluster   flat GC vs k-means against the corpus labels (when it has labels)
    doc-queries-<key>/       gdr sample sample.per_doc=N   generated training queries per document
    index-<method>-<key>/    gdr index     docids.tsv, tree.json, summary.json per indexer
    bm25-<key>/              BM25 on the test queries (reference)
    train-<method>-s<seed>-<key>/           gdr train     one retriever per (indexer, seed)
    eval-<method>-s<seed>-<key>/            gdr evaluate  Recall@1/10/100, MRR@100, TREC run
    report.md  report.png  report.json  run.config.yaml

A stage's ``<key>`` is a hash of everything that determines its output: its own settings and the keys of
the stages it reads. ``stage.json`` in the folder records the key, the inputs and the wall time, and is
marked complete only when the stage finished, so a second run reuses every finished stage, a changed
``index.gc.alpha`` gives a new ``index-gc-<key>`` and new retrievers on it and nothing else, and a killed run
continues where it stopped (the stages themselves resume: scoring by shard, sampling by batch, training
from ``last.ckpt``).

``stage.json`` also lists every file the stage wrote with its size and CRC-32 checksum, and the
checksums of the upstream stages it read. Before a finished stage is reused both are checked: a damaged,
missing or changed file (or an upstream stage rebuilt with different content) re-runs the stage, with one
log line naming the file and what was wrong, and the stages after it see the change in turn. Stages
finished by an older gdr, without that list, are checked as far as possible (files parse, sizes match
headers, P has no zero rows, docids.tsv is well formed), then their checksums are recorded.
"""
from __future__ import annotations

import fnmatch
import json
import logging
import shlex
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
from omegaconf import DictConfig, OmegaConf

from gdr import signals
from gdr.config import save_config, to_container
from gdr.guard import LOCK_FILE, claim_folder, withdraw
from gdr.io import (atomic_write_json, bytes_digest, check_manifest_files, check_readable, hash_strings,
                    record_files, verify_files)

log = logging.getLogger(__name__)

__all__ = ["run_pipeline", "Pipeline", "StageRecord", "check_settings", "lm_settings"]

STAGE_FILE = "stage.json"
# Before a finished stage is reused, every file's size is checked, and the checksum of every file a later
# stage reads (its ``outputs``) or of at most this size: that leaves out only large files nothing reads
# again, the training checkpoints (resume points of an unfinished stage), which would otherwise dominate.
CHECKSUM_MAX_OTHER = 4 << 20
REPORT_FILES = ("report.json", "report.md", "report.png")  # report.json first: readers trust it most
# Which settings of conf/stage/index.yaml each indexer's ids depend on (workers/progress/plot do not).
INDEX_KEYS = {
    "gc": ("seed", "n_clusters", "leaf_size", "gc"),
    "hkmi": ("seed", "n_clusters", "leaf_size", "kmeans"),
    "bmi": ("seed", "n_clusters", "leaf_size", "kmeans"),
    "random": ("seed", "n_clusters", "leaf_size"),
    "atomic": ("atomic",),
}
# Settings that change how fast a stage runs, not what it computes: left out of its key.
_NOT_KEYED = {"progress", "workers", "plot", "enable_progress_bar", "tensorboard", "num_workers",
              "log_every_n_steps", "torch_threads", "device", "processes", "resume_damaged", "concurrent"}


def stage_key(inputs: dict) -> str:
    """A short hash of a stage's inputs (canonical JSON)."""
    return hash_strings([json.dumps(inputs, sort_keys=True, default=str)])[:10]


# Settings added after stages were keyed without them: left out of a key at these values (their defaults, which
# compute what the stage computed before they existed), so the keys of finished stages stay.
_KEYED_UNLESS = {"length_buckets": False}


def _keyed(d: Any) -> Any:
    if isinstance(d, dict):
        return {k: _keyed(v) for k, v in d.items()
                if k not in _NOT_KEYED and not (k in _KEYED_UNLESS and v is _KEYED_UNLESS[k])}
    return d


@dataclass
class StageRecord:
    """One stage of a pipeline run: where it lives, its key, how long it took, whether it was reused."""

    name: str
    path: Path
    key: str
    seconds: float
    reused: bool
    info: dict = field(default_factory=dict)
    digest: str = ""  # checksum over its files' checksums: what a later stage records of it


class Pipeline:
    """Runs stages in a root folder, each cached under ``<name>-<key>/`` by the hash of its inputs."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.records: list[StageRecord] = []

    def stage(self, name: str, inputs: dict, build: Callable[[Path], dict | None], after: Sequence[StageRecord] = (),
              resumes: Sequence[str] | None = None, check: Callable[[Path], tuple[str, str] | None] | None = None,
              outputs: Sequence[str] = ("*",)) -> StageRecord:
        """Run ``build(folder)`` unless a finished, undamaged stage with the same inputs exists; return its record.

        ``build`` returns a small dict of facts kept in ``stage.json`` (``info``). ``after``: the stages whose
        files ``build`` reads; a change in their content re-runs this one. ``resumes``: ``None`` when a damaged
        stage is rebuilt from an empty folder; else the stage resumes in place: its damaged file is deleted
        and rebuilt, except the files named here, which ``build`` checks and repairs piece by piece itself
        (P.npy: only damaged shards are re-scored). ``check(folder)``: what is wrong with the files of a
        stage finished by an older gdr (no checksums recorded): ``(file, what is wrong)`` or None.
        ``outputs``: patterns of the files later stages read; only their checksums count as this stage's
        content for them (manifests with times, logs and checkpoints differ between identical rebuilds)."""
        inputs = json.loads(json.dumps(inputs, default=str))
        key = stage_key(inputs)
        folder = self.root / f"{name}-{key}"
        marker = folder / STAGE_FILE
        upstream = {r.path.name: r.digest for r in after}
        try:
            old = json.loads(marker.read_text()) if marker.exists() else None
            damage = None
        except (ValueError, OSError) as e:
            old, damage = None, (STAGE_FILE, f"unreadable ({e})")
        if old is not None and old.get("key") == key and old.get("status") == "complete":
            damage = self._damage(folder, old, upstream, check, outputs)
            if damage is None:
                log.info("stage %s: reusing %s (finished in %.1f s)", name, folder, old.get("seconds", 0.0))
                rec = StageRecord(name, folder, key, float(old.get("seconds", 0.0)), True, old.get("info") or {},
                                  _digest(old["artifacts"], outputs))
                self.records.append(rec)
                return rec
        claim_folder(folder, "out")  # one writer: a `gdr score out=<this folder>` elsewhere is refused
        if damage is not None:
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
        atomic_write_json(marker, {"stage": name, "key": key, "status": "running", "inputs": inputs})
        t0 = time.perf_counter()
        signals.set_where(f"stage {name}")  # what a SIGTERM's one line names
        info = build(folder) or {}
        seconds = round(time.perf_counter() - t0, 2)
        artifacts = record_files(folder, exclude=(STAGE_FILE,))
        atomic_write_json(marker, {"stage": name, "key": key, "status": "complete", "inputs": inputs,
                                   "seconds": seconds, "info": info, "artifacts": artifacts, "outputs": list(outputs),
                                   "upstream": upstream,
                                   "finished": time.strftime("%Y-%m-%dT%H:%M:%S")})
        signals.set_where(None)
        rec = StageRecord(name, folder, key, seconds, False, info, _digest(artifacts, outputs))
        self.records.append(rec)
        return rec

    @staticmethod
    def _damage(folder: Path, old: dict, upstream: dict, check, outputs: Sequence[str]) -> tuple[str, str] | None:
        """(file, what is wrong) for a finished stage that must not be reused, or None.

        A stage finished by an older gdr (no ``artifacts`` in stage.json) is checked as far as that is
        possible, then its checksums are recorded in stage.json, so it is verified fully from then on."""
        if "artifacts" in old:
            bad = verify_files(folder, old["artifacts"], checksum=checksummed(old["artifacts"], outputs))
            if bad is None and old.get("upstream", {}) != upstream:
                changed = sorted(k for k in set(upstream) | set(old.get("upstream", {}))
                                 if upstream.get(k) != old.get("upstream", {}).get(k))
                bad = (STAGE_FILE, f"upstream stage {', '.join(changed)} changed since this stage was built")
            return bad
        files = [p.relative_to(folder).as_posix() for p in sorted(folder.rglob("*"))
                 if p.is_file() and p.name != STAGE_FILE and not p.name.startswith(".")]
        bad = check_readable(folder, files)
        for manifest in sorted(folder.glob("*manifest.json")) if bad is None else ():
            # what the stage's own command recorded (a train folder's model/*, docids.tsv): checked, not trusted
            bad = _failure(folder, lambda m=manifest: check_manifest_files(folder, name=m.name))
            if bad is not None:
                break
        if bad is None and check is not None:
            bad = check(folder)
        if bad is None:
            log.info("stage %s: recording checksums of the %d files of %s, written by an older gdr "
                     "(checked: they parse and match their headers)", old.get("stage"), len(files), folder.name)
            old.update(artifacts=record_files(folder, exclude=(STAGE_FILE,)), outputs=list(outputs),
                       upstream=upstream)  # the caller's dict
            atomic_write_json(folder / STAGE_FILE, old)
        return bad


def _failure(folder: Path, read: Callable[[], Any]) -> tuple[str, str] | None:
    """Run ``read()``; an error ``<path>: <what>`` (gdr's messages name the file first) becomes
    ``(path relative to folder, what)``."""
    try:
        read()
    except (ValueError, RuntimeError, OSError) as e:
        path, _, what = str(e).partition(": ")
        path, _, line = path.partition(":")
        what = f"line {line}: {what}" if line else what
        try:
            path = Path(path).relative_to(folder).as_posix()
        except ValueError:
            pass
        return path, what or str(e)
    return None


def _check_score_folder(folder: Path) -> tuple[str, str] | None:
    """A score stage of an older gdr: P, doc ids and queries agree with their manifests, no zero rows in P
    (what the old code left after re-entering a truncated P)."""
    from gdr.store import P_FILE, load_run

    box = {}
    bad = _failure(folder, lambda: box.setdefault("run", load_run(folder)))
    if bad is None:
        P = np.asarray(box["run"].logp)
        if not (np.isfinite(P).all() and (P != 0).all()):
            bad = (P_FILE, "holds zeros or non-finite values (what re-entering a truncated P used to leave)")
    return bad


def _drop_damaged_queries(folder: Path) -> None:
    """Inside ``gdr run``, sampled queries (or a manifest) changed since they were written are re-sampled,
    with one line, where ``gdr score`` by hand refuses them; P.npy is repaired shard by shard by scoring."""
    from gdr.io import read_manifest
    from gdr.store import P_MANIFEST, Q_FILE, Q_MANIFEST, read_queries

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
    from gdr.store import DOCQ_FILE, DOCQ_MANIFEST

    try:
        check_manifest_files(folder, name=DOCQ_MANIFEST)
    except (ValueError, OSError) as e:
        log.warning("stage doc-queries: %s; re-sampling", str(e).split("; re-sample")[0])
        for name in (DOCQ_FILE, DOCQ_MANIFEST):
            (folder / name).unlink(missing_ok=True)


def _check_index_folder(folder: Path) -> tuple[str, str] | None:
    from indexing.docids import read_docids

    return _failure(folder, lambda: read_docids(folder / "docids.tsv"))


def _digest(artifacts: dict, outputs: Sequence[str]) -> str:
    """One checksum over the recorded checksums of the files matching ``outputs``."""
    mine = {k: v["crc32"] for k, v in artifacts.items() if _matches(k, outputs)}
    return bytes_digest(json.dumps(mine, sort_keys=True).encode())


def _matches(rel: str, patterns: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(rel, p) for p in patterns)


def checksummed(artifacts: dict, outputs: Sequence[str]) -> list[str]:
    """The files whose checksum is verified before reuse: what later stages read, and every small file."""
    return [k for k, v in artifacts.items() if v["size"] <= CHECKSUM_MAX_OTHER or _matches(k, outputs)]


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
def _queries_section(cfg: DictConfig, split: str) -> dict:
    q = cfg.queries
    out = {"name": q.name, "split": split, "path": q.path}
    if q.name == "titles":
        out.update(seed=int(q.get("seed") or 0), fractions=list(q.get("fractions") or (0.8, 0.1, 0.1)))
    return out


def check_settings(cfg: DictConfig) -> None:
    """Settings the pipeline needs beyond each stage's own checks."""
    if cfg.queries.name == "titles" and not cfg.data.get("drop_title"):
        raise ValueError("queries.name=titles needs data.drop_title=true: a document that still holds its title "
                         "makes the title query trivial")
    if "bmi" in cfg.indexers and int(cfg.doc_queries.per_doc) < 1:
        raise ValueError("indexer bmi needs generated queries: set doc_queries.per_doc to 1 or more, "
                         "or drop bmi from indexers")
    from gdr.validate import ConfigError

    n_cols, J = cfg.index.gc.get("n_queries"), int(cfg.sample.n_queries)
    if "gc" in cfg.indexers and n_cols is not None and int(n_cols) > J:
        raise ConfigError(f"index.gc.n_queries={n_cols}: must be <= sample.n_queries={J}, the J columns of P it takes "
                          "the first of; lower index.gc.n_queries (null = all) or raise sample.n_queries")


def check_corpus_settings(cfg: DictConfig, corpus) -> None:
    """The settings that compare with the corpus, checked once it is loaded and before the first stage (in seconds,
    not at their stage after sampling and scoring); the messages name the full key."""
    from gdr.stages.cluster import check_cluster_settings
    from gdr.stages.settings import ClusterSettings

    if cfg.cluster.enabled and corpus.labels is not None:
        check_cluster_settings(ClusterSettings.from_dict(to_container(cfg.cluster)), corpus, prefix="cluster.")
    if int(cfg.index.leaf_size) >= len(corpus):
        log.warning("index.leaf_size=%d holds all %d documents: every docid tree is one leaf of flat positions (the "
                    "indexers do not differ); lower index.leaf_size", int(cfg.index.leaf_size), len(corpus))


def run_pipeline(cfg: DictConfig, argv: Sequence[str] = ()) -> dict:
    """Run every stage of ``conf/run.yaml`` (a composed config) into ``cfg.out``; returns the report (also in
    report.json). :func:`gdr.api.run` takes the same settings as a plain dict."""
    from gdr.data import corpus_from_config
    from gdr.stages.train import check_query_splits

    check_settings(cfg)
    t_start = time.perf_counter()
    corpus = corpus_from_config(to_container(cfg.data))
    # the query set (qrels against the corpus and the queries) before the first stage, not at bm25 hours later
    check_query_splits([_queries_section(cfg, s) for s in (cfg.queries.train_split, cfg.queries.test_split)],
                       to_container(cfg.data), corpus.doc_ids, need=cfg.queries.test_split,
                       docs_tsv=cfg.data.get("docs_tsv"))
    check_corpus_settings(cfg, corpus)  # refused before the folder changes: its report and config stay
    pipe = Pipeline(cfg.out)
    if withdraw([pipe.root / n for n in REPORT_FILES]):  # until this run finishes, no report looks current
        log.info("%s: the previous run's report is withdrawn until this run finishes", pipe.root)
    save_config(cfg, pipe.root, "run.config.yaml")
    corpus_sig = corpus_signature(cfg, corpus)
    lm_spec = lm_settings(cfg)
    lm_box: dict = {}

    def lm():
        if "lm" not in lm_box:
            lm_box["lm"] = lm_spec.build()
        return lm_box["lm"]

    # 1. sampled queries and P
    def build_score(folder: Path) -> dict:
        from gdr.stages.score import score_corpus
        from gdr.stages.settings import SampleSettings, ScoreSettings
        from gdr.store import P_MANIFEST

        sub = _with(cfg, out=str(folder))
        save_config(sub, folder, "score.config.yaml")
        _drop_damaged_queries(folder)
        sample, score_settings = SampleSettings.from_dict(to_container(cfg.sample)), \
            ScoreSettings.from_dict(to_container(cfg.score))
        try:
            path = score_corpus(corpus, (lm(), lm_spec), folder, sample, score_settings, progress=cfg.progress)
        except FileExistsError as e:
            if P_MANIFEST not in str(e):
                raise
            # The folder is keyed by exactly these settings, so a P manifest that disagrees was damaged:
            # start the matrix over rather than stop.
            log.warning("stage score: %s disagrees with this stage's settings; scoring P again", folder / P_MANIFEST)
            (folder / P_MANIFEST).unlink()
            path = score_corpus(corpus, (lm(), lm_spec), folder, sample, score_settings, progress=cfg.progress)
        return {"p_matrix": str(path)}

    # P.manifest.json resumes in place too: a `gdr score` that repaired P by hand rewrites it, and the shard
    # checksums (not this stage's record of the manifest) say which rows are still good.
    # only GC's docids and the flat clustering read P: a run of other indexers alone skips it
    clustering = bool(cfg.cluster.enabled and corpus.labels is not None)
    if cfg.cluster.enabled and not clustering:
        log.info("stage cluster: skipped: corpus %s has no labels, which the flat clustering is scored against "
                 "(a label field in the documents adds it; cluster.enabled=false silences this line)", corpus.name)
    score = pipe.stage("score", score_inputs(cfg, corpus_sig), build_score, resumes=("P.npy", "P.manifest.json"),
                       check=_check_score_folder, outputs=("P.npy", "queries.jsonl", "doc_ids.json")) \
        if "gc" in cfg.indexers or clustering else None

    # 2. flat clustering against labels (the data scientist's view; the demo's headline)
    cluster_rec = None
    if clustering:
        def build_cluster(folder: Path) -> dict:
            from gdr.stages.cluster import cluster_run
            from gdr.stages.report import cluster_headline
            from gdr.stages.settings import ClusterSettings
            from gdr.store import load_run

            result, _ = cluster_run(corpus, load_run(score.path), folder,
                                    ClusterSettings.from_dict(to_container(cfg.cluster)), device=cfg.device)
            save_config(cfg, folder, "cluster.config.yaml")
            return cluster_headline(result)

        cl = {k: v for k, v in to_container(cfg.cluster).items() if k != "enabled"}
        cluster_rec = pipe.stage("cluster", {"score": score.key, "cluster": cl}, build_cluster, after=[score])

    # 3. generated training queries per document
    dq = cfg.doc_queries
    doc_q = None
    if int(dq.per_doc) > 0:
        def build_doc_queries(folder: Path) -> dict:
            from gdr.stages.doc_queries import sample_doc_queries
            from gdr.stages.settings import SampleSettings

            # the training queries' own decoding (doc_queries.top_k/top_p/temperature), not the clustering's
            sub = _with(cfg, out=str(folder), sample={"per_doc": int(dq.per_doc), "seed": int(dq.seed),
                                                       "batch_size": dq.batch_size,
                                                       "max_new_tokens": int(dq.max_new_tokens),
                                                       "top_k": int(dq.top_k), "top_p": float(dq.top_p),
                                                       "temperature": float(dq.temperature)})
            save_config(sub, folder, "sample.config.yaml")
            settings = SampleSettings.from_dict(to_container(sub.sample))
            _drop_damaged_doc_queries(folder)
            return {"doc_queries": str(sample_doc_queries(lm(), corpus, folder, settings, progress=cfg.progress))}

        doc_q = pipe.stage("doc-queries", doc_queries_inputs(cfg, corpus_sig), build_doc_queries,
                           outputs=("doc_queries.jsonl",))
    lm_box.clear()  # the generator is not needed from here on

    # 4. docids per indexer
    index_cfg = to_container(cfg.index)
    indexes: dict[str, StageRecord] = {}
    for method in cfg.indexers:
        upstream = {"gc": score.key if score else None, "bmi": doc_q.key if doc_q else None}.get(method, "corpus")
        inputs = {"method": method, "corpus": corpus_sig, "upstream": upstream,
                  "index": {k: index_cfg[k] for k in INDEX_KEYS[method]}}

        def build_index_stage(folder: Path, method=method) -> dict:
            from gdr.stages.index import build_index
            from gdr.stages.settings import IndexSettings

            sub = OmegaConf.create({**index_cfg, "method": method, "out": str(folder), "index": None,
                                    "data": to_container(cfg.data),
                                    "run": str(score.path) if method == "gc" else None})
            if method == "bmi":
                sub.kmeans.doc_queries = str(doc_q.path / "doc_queries.jsonl")
            settings = IndexSettings.from_dict({**index_cfg, "method": method, "kmeans": to_container(sub.kmeans)})
            summary = build_index(settings, folder, corpus=corpus, run=sub.run)
            save_config(sub, folder)
            return {k: summary[k] for k in ("depth_max", "depth_mean", "balance_mean", "largest_child_frac_mean",
                                            "leaf_size_max", "n_leaves", "n_fallback") if k in summary}

        after = {"gc": [score], "bmi": [doc_q] if doc_q else []}.get(method, [])
        indexes[method] = pipe.stage(f"index-{method}", inputs, build_index_stage, after=after,
                                     check=_check_index_folder, outputs=("docids.tsv",))

    # 5. BM25 on the test queries, once
    test_q = _queries_section(cfg, cfg.queries.test_split)
    bm25_rec = None
    if cfg.bm25:
        def build_bm25(folder: Path) -> dict:
            from gdr.stages.bm25 import bm25_baseline

            return bm25_baseline(corpus, _test_queries(cfg, corpus, test_q), folder, k=int(cfg.evaluate.k),
                                 split=test_q["split"])

        bm25_rec = pipe.stage("bm25", {"corpus": corpus_sig, "queries": test_q, "k": int(cfg.evaluate.k),
                                       "per_query": 1}, build_bm25)

    # 6-7. one retriever per (indexer, seed), each evaluated on the test split
    train_cfg = to_container(cfg.train)
    use_gen = doc_q is not None and train_cfg["examples"].get("use_generated", True)
    results: dict[str, list[dict]] = {}
    eval_dirs: dict[str, list[Path]] = {}  # per-query metrics (per_query.json) for the paired tests
    trainings = {}  # (method, seed) -> the arguments of its stage
    for method, idx in indexes.items():
        for seed in cfg.seeds:
            t_inputs = {"index": idx.key, "doc_queries": doc_q.key if use_gen else None, "corpus": corpus_sig,
                        "queries": _queries_section(cfg, cfg.queries.train_split), "train": _keyed(train_cfg),
                        "seed": int(seed)}
            build = _TrainBuild(corpus, train_cfg, to_container(cfg.data),
                                _queries_section(cfg, cfg.queries.train_split), int(seed), str(idx.path / "docids.tsv"),
                                str(doc_q.path / "doc_queries.jsonl") if use_gen else None)
            trainings[method, seed] = (f"train-{method}-s{seed}", t_inputs, build, [idx] + ([doc_q] if use_gen else []))
    _train_at_once(pipe, list(trainings.values()), train_cfg, corpus, int(cfg.doc_queries.per_doc) if use_gen else 0)
    for method, idx in indexes.items():
        for seed in cfg.seeds:
            name, t_inputs, build, after = trainings[method, seed]
            tr = pipe.stage(name, t_inputs, build, after=after, outputs=TRAIN_OUTPUTS)

            def build_eval(folder: Path, tr=tr) -> dict:
                from gdr.stages.evaluate import evaluate_model
                from gdr.stages.settings import EvaluateSettings

                sub = OmegaConf.create({**to_container(cfg.evaluate), "data": to_container(cfg.data),
                                        "run_dir": str(tr.path), "out_dir": str(folder), "bm25": False,
                                        "queries": test_q})
                folder.mkdir(parents=True, exist_ok=True)
                save_config(sub, folder)
                settings = EvaluateSettings.from_dict(to_container(cfg.evaluate), bm25=False)
                m, _ = evaluate_model(tr.path, corpus, _test_queries(cfg, corpus, test_q), folder, settings,
                                      split=test_q["split"])
                return {"metrics": m["systems"][settings.tag]}

            ev = pipe.stage(f"eval-{method}-s{seed}", {"train": tr.key, "queries": test_q, "per_query": 1,
                                                      "evaluate": _keyed(to_container(cfg.evaluate))}, build_eval,
                            after=[tr])
            results.setdefault(method, []).append({"seed": int(seed), **ev.info["metrics"]})
            eval_dirs.setdefault(method, []).append(ev.path)

    seconds = round(time.perf_counter() - t_start, 1)
    if bm25_rec is not None:
        eval_dirs["bm25"] = [bm25_rec.path]
    report = _report(cfg, argv, pipe, corpus, results, indexes, bm25_rec, cluster_rec, seconds, eval_dirs,
                     trained_on=trained_on(cfg, corpus, use_gen))
    return report


TRAIN_OUTPUTS = ("model/*", "docids.tsv")


@dataclass
class _TrainBuild:
    """``build`` of one retriever's stage (``gdr train`` into the stage folder); picklable, so that
    :func:`gdr.stages.train.train_retrievers` can run it in a process of its own."""

    corpus: Any
    train_cfg: dict
    data: dict
    queries: dict
    seed: int
    docids: str
    generated: str | None

    def __call__(self, folder: Path) -> dict:
        from gdr.stages import train as train_stage
        from gdr.stages.settings import TrainSettings

        sub = OmegaConf.create({**self.train_cfg, "data": self.data, "seed": self.seed, "docids": self.docids,
                                "out_dir": str(folder), "queries": self.queries, "generated": self.generated})
        qs = train_stage.split_queries(self.queries, self.data, set(self.corpus.doc_ids), self.data.get("docs_tsv"))
        settings = TrainSettings.from_dict(self.train_cfg, seed=self.seed)
        # the folder is this stage's own: a checkpoint of other inputs in it is cleared, not refused
        res = train_stage.train_retriever(self.corpus, self.docids, folder, settings, queries=qs,
                                          generated=self.generated, stale="restart",
                                          write_config=lambda f: save_config(sub, f))
        return {"best_val_recall1": res.best_val_recall1, "global_step": res.global_step, "n_params": res.n_params}


def _train_stage(root: Path, name: str, inputs: dict, build: _TrainBuild, after: list) -> StageRecord:
    """One retriever's stage, run in a training process of its own (its stage.json marks it finished there)."""
    return Pipeline(root).stage(name, inputs, build, after=after, outputs=TRAIN_OUTPUTS)


def _train_at_once(pipe: Pipeline, trainings: list[tuple], train_cfg: dict, corpus, per_doc: int) -> None:
    """Train the run's unfinished retrievers ``train.concurrent`` at a time, one process each, when that is more
    than one; each stage is marked finished as its retriever finishes, and the stages are then reused in order.
    ``per_doc``: generated training queries per document (0 without them)."""
    from functools import partial

    from gdr.stages.settings import TrainSettings
    from gdr.stages.train import retrievers_at_once, split_queries, train_retrievers

    todo = []
    for name, inputs, build, after in trainings:
        marker = pipe.root / f"{name}-{stage_key(json.loads(json.dumps(inputs, default=str)))}" / STAGE_FILE
        try:
            done = json.loads(marker.read_text()).get("status") == "complete"
        except (OSError, ValueError, AttributeError):  # none yet, or damaged: Pipeline.stage says what and re-runs
            done = False
        if not done:
            todo.append((name, inputs, build, after))
    if len(todo) < 2:
        return
    settings = TrainSettings.from_dict(train_cfg)
    first = todo[0][2]
    n_train = None
    if settings.concurrent == "auto":  # an upper bound on a retriever's examples sizes its batch (batch auto)
        qs = split_queries(first.queries, first.data, set(corpus.doc_ids), first.data.get("docs_tsv"))
        windows = 1 + int(train_cfg["examples"].get("doc_windows") or 0)
        n_train = len(corpus) * (windows + per_doc) + (sum(len(r) for r in qs.relevant) if qs is not None else 0)
    at_once = retrievers_at_once(settings, len(todo), n_train, first.docids)
    if at_once > 1:
        train_retrievers([partial(_train_stage, pipe.root, *t) for t in todo], at_once)


def trained_on(cfg: DictConfig, corpus, use_generated: bool) -> str:
    """What the retrievers of a run learnt from, in words, for the report: the real training split when the
    query set has one, else generated queries (and the documents' own windows) only."""
    from gdr.stages.train import split_queries

    qs = split_queries(_queries_section(cfg, cfg.queries.train_split), to_container(cfg.data), set(corpus.doc_ids),
                       cfg.data.get("docs_tsv"))
    split = f"`{cfg.queries.train_split}`"
    if qs is not None and len(qs):
        return f"{split} ({len(qs)} queries)" + (" and generated queries" if use_generated else "")
    name = corpus.name if cfg.queries.name == cfg.data.name else cfg.queries.name  # a BEIR folder by its name
    return (f"generated queries only: `{name}` has no {split} queries" if use_generated else
            f"the documents' own text only: `{name}` has no {split} queries and there are no generated queries")


def _report(cfg, argv, pipe: Pipeline, corpus, results, indexes, bm25_rec, cluster_rec, seconds: float,
            eval_dirs: dict | None = None, trained_on: str | None = None) -> dict:
    from gdr.stages.report import write_report

    command = "gdr run " + " ".join(shlex.quote(a) for a in argv)
    return write_report(to_container(cfg), command, pipe.root, pipe.records, len(corpus), results,
                        {m: r.info for m, r in indexes.items()}, bm25_rec.info["metrics"] if bm25_rec else None,
                        cluster_rec.info if cluster_rec is not None else None, seconds, eval_dirs,
                        corpus_name=getattr(corpus, "name", None), trained_on=trained_on)


def corpus_signature(cfg: DictConfig, corpus) -> dict:
    """What identifies the corpus in stage keys: its config and hashes of its ids and model inputs."""
    return {"data": to_container(cfg.data), "doc_ids": hash_strings(corpus.doc_ids),
            "texts": hash_strings(corpus.model_inputs()), "n_docs": len(corpus)}


def score_inputs(cfg: DictConfig, corpus_sig: dict) -> dict:
    """The inputs that key the score stage (sampled queries and P)."""
    return {"corpus": corpus_sig, "lm": to_container(cfg.model), "sample": _unbatched(cfg.sample),
            "sampler": _sampler(), "score": _score_key(cfg.score)}


def _score_key(section: DictConfig) -> dict:
    """The score section as it keys the stage; ``compute_dtype: auto`` (what every older run used) is left out,
    so that older score stages stay reusable."""
    return {k: v for k, v in _keyed(to_container(section)).items() if not (k == "compute_dtype" and v == "auto")}


def doc_queries_inputs(cfg: DictConfig, corpus_sig: dict) -> dict:
    """The inputs that key the doc-queries stage (generated training queries, with their own decoding)."""
    return {"corpus": corpus_sig, "lm": to_container(cfg.model), "doc_queries": _unbatched(cfg.doc_queries),
            "sampler": _sampler()}


def _sampler() -> str:
    """The sampler version (gdr.lm.decode): another version draws other queries, so it keys the stages."""
    from gdr.lm.decode import SAMPLER_VERSION

    return SAMPLER_VERSION


def _unbatched(section: DictConfig) -> dict:
    """A sampling section without its batch size and compile switch, which change the speed, not the queries."""
    return {k: v for k, v in _keyed(to_container(section)).items() if k not in _SPEED_ONLY}


_SPEED_ONLY = ("batch_size", "compile", "compile_min_queries")


def _with(cfg: DictConfig, **overrides) -> DictConfig:
    """A copy of ``cfg`` with some keys replaced (nested dicts merged)."""
    sub = OmegaConf.merge(cfg, OmegaConf.create(overrides))
    return sub


def lm_settings(cfg: DictConfig):
    """The query generator of a composed config (``model:``, ``device``, ``threads``)."""
    from gdr.stages.settings import LMSettings

    return LMSettings.from_dict(to_container(cfg.model), device=str(cfg.get("device") or "auto"),
                                threads=cfg.get("threads"))


def _test_queries(cfg: DictConfig, corpus, test_q: dict):
    """The test queries of the run (for bm25 and every evaluation); an error when the corpus has none."""
    from gdr.stages.train import split_queries

    qs = split_queries(test_q, to_container(cfg.data), set(corpus.doc_ids), cfg.data.get("docs_tsv"))
    if qs is None or len(qs) == 0:
        raise ValueError(f"no {test_q['split']!r} queries with a relevant document for {cfg.data.name}: "
                         "set queries.name / queries.test_split")
    return qs
