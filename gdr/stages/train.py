"""Stage ``train``: an NCI-style seq2seq retriever trained on docids (:func:`train_retriever`).

A training folder knows what it was trained on: ``trained_on.json`` holds hashes of the docids, the corpus,
the real and the generated training queries, and every setting that changes the model. A folder holding a
training (a checkpoint, a model) is resumed only when they match; anything else is refused before a file is
written, with one line naming what differs (:func:`check_trained_on`). A finished training run again with the same
trainer settings too is reused from its manifest, dev score included (:func:`_finished`).

The real queries of a split come from :func:`gdr.data.splits.split_queries`.

:func:`train_retrievers` trains the retrievers of a run (indexers x seeds) ``train.concurrent`` at a time on one
device, one process each (:mod:`gdr.training.concurrent`), each recorded as it finishes.
"""
from __future__ import annotations

import json
import logging
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from gdr.config import flat_leaves
from gdr.cost import device_name
from gdr.device import cpu_threads, torch_threads
from gdr.guard import holding
from gdr.indexing.docids import format_code, read_docids, rebuild_advice
from gdr.io import (
    atomic_write_json,
    check_manifest_files,
    file_digest,
    hash_strings,
    read_manifest,
    verify_files,
    write_manifest,
)
from gdr.models import model_digest
from gdr.rules import ConfigError
from gdr.stages.settings import TrainSettings, resumable
from gdr.training.callbacks import learning_curve
from gdr.training.concurrent import run_concurrently, slot_threads
from gdr.training.data import read_generated_queries
from gdr.training.model import RetrieverConfig
from gdr.training.options import OptimOptions
from gdr.training.train import (
    TrainerOptions,
    TrainResult,
    resolve_concurrent,
    resolve_fused,
    resolve_train_batch,
    train,
    trainer_precision,
    trainer_world_size,
    uses_cuda,
)

log = logging.getLogger(__name__)

__all__ = ["train_retriever", "train_retrievers", "retrievers_at_once", "resolve_run_batch", "training_device",
           "training_numerics", "training_threads", "keyed_model", "corpus_hash",
           "model_config_from", "read_checked_docids",
           "check_train_inputs", "trained_on", "check_trained_on", "TRAINED_ON", "trained_splits",
           "check_not_trained_on", "CURVE", "read_curve", "check_dev_apart", "retriever_folds", "retriever_name"]

TRAINED_ON = "trained_on.json"
CURVE = "curve.json"  # the learning curve: [[step, dev value of trainer.monitor], ...] (one point per validation)
# Trainer settings a resumed run may change (their fields say effect="speed" or "resume"): how long and on what it
# runs, how often it validates and saves, not what the model learns. Every other setting must match to resume.
RESUMABLE = resumable(TrainerOptions)


def retriever_folds(folds: int | None) -> list[int | None]:
    """The held-out folds of a run's retrievers: 0 .. K-1 with ``queries.folds=K``, else one split ([None])."""
    return [None] if folds is None else list(range(int(folds)))


def retriever_name(method: str, seed: int, fold: int | None = None) -> str:
    """A retriever's part of its stage names (``train-<it>``, ``eval-<it>``): ``<indexer>-s<seed>``, with folds
    ``<indexer>-s<seed>-f<fold>``."""
    return f"{method}-s{seed}" if fold is None else f"{method}-s{seed}-f{fold}"


def model_config_from(model: dict[str, Any], presets: dict[str, Any]):
    """The preset named ``model['size']`` with every non-null key of ``model`` on top."""
    size = model.get("size")
    if size not in presets:
        raise ValueError(f"model.size={size!r}; choose one of {sorted(presets)}")
    merged = dict(presets[size])
    merged.update({k: v for k, v in model.items() if k != "size" and v is not None})
    merged.setdefault("n_digits", 0)
    merged.setdefault("max_code_len", 0)
    return RetrieverConfig.from_dict(merged)


def read_checked_docids(path: str | Path) -> tuple[list[str], list[tuple[int, ...]]]:
    """(doc ids, codes) of a docids.tsv, checked against its folder's manifest and line by line."""
    check_manifest_files(Path(path).parent, only=["docids.tsv"], fix=rebuild_advice(path))
    return read_docids(path)


def check_train_inputs(docids: str | Path, generated: str | Path | None = None) -> None:
    """The input files of a training run, read before anything is made or loaded: ``docids.tsv`` (manifest,
    lines) and the generated queries (manifest, lines, each document among the docids; the corpus check
    comes later and is no more lenient)."""
    ids, _ = read_checked_docids(docids)
    if generated:
        from gdr.training.data import read_generated_queries  # Lightning's import: only when there is a file to read

        read_generated_queries(str(generated), ids)


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


def corpus_hash(corpus) -> str:
    """The hash ``trained_on.json`` records of the documents a retriever was trained on: their ids and texts."""
    return hash_strings([*corpus.doc_ids, "\0", *corpus.model_inputs()])


def trained_on(corpus, docids: str | Path, codes: Sequence[Sequence[int]], settings: TrainSettings, queries=None,
               generated: str | Path | None = None, dev=None) -> dict:
    """What a model trained on these inputs is trained on (``trained_on.json``): a hash and a description of each
    input (``dev``: the dev split given whole, recorded only when given), and the settings that change the model
    (``model.*`` as resolved from its preset, ``examples.*``, ``optim.*``, ``seed``, the trainer's other than
    :data:`RESUMABLE`, and :func:`training_numerics`)."""
    c = settings.to_dict()
    keyed = {"model": keyed_model(settings), **_own_settings(c), "seed": c["seed"],
             "device": training_numerics(settings)}
    inputs = {
        "docids": {"hash": hash_strings(f"{d}\t{format_code(x)}" for d, x in zip(corpus.doc_ids, codes)),
                   "what": str(docids)},
        "corpus": {"hash": corpus_hash(corpus),
                   "what": f"{corpus.name}, {len(corpus)} documents"},
        "queries": None if queries is None else {
            "hash": _queries_hash(queries),
            "what": f"{len(queries)} real queries", "splits": list(dict.fromkeys(queries.splits))},
        "generated": None if not generated else {"hash": file_digest(generated)["crc32"], "what": str(generated)},
    }
    if dev is not None:  # its checkpoint choice (or curve) reads it; absent, the dev split is held out as before
        inputs["dev"] = {"hash": _queries_hash(dev), "what": f"{len(dev)} dev queries",
                         "splits": list(dict.fromkeys(dev.splits))}
    return {"inputs": inputs, "settings": _as_recorded(keyed)}


def _as_recorded(settings: dict) -> dict:
    """``settings`` flat (``a.b`` keys) and in JSON's types, as ``trained_on.json`` holds them."""
    return json.loads(json.dumps(flat_leaves(settings), default=str))


def _queries_hash(qs) -> str:
    return hash_strings([*qs.texts, "\0", *("\t".join(r) for r in qs.relevant)])


def check_dev_apart(train, dev, key: str = "queries.dev_split") -> None:
    """Refuse a dev split (a QuerySet) that shares a query with the training queries ``train`` (a QuerySet or None):
    by id, or by the same text judged relevant to the same document. A dev query trained on would draw the learning
    curve (or pick the checkpoint) on what the retriever memorised."""
    if train is None or dev is None:
        return
    ids = set(train.qids)
    pairs = {(t, d) for t, rel in zip(train.texts, train.relevant) for d in rel}
    for qid, text, rel in zip(dev.qids, dev.texts, dev.relevant):
        if qid in ids or any((text, d) in pairs for d in rel):
            raise ConfigError(f"{key}: dev query {qid!r} ({text[:60]!r}) is also a training query (split "
                              f"{train.splits[0] if train.splits else '?'!r}); the dev split must be apart from what "
                              "the retrievers train on: fix the query set's splits, or set queries.dev_split=null (the "
                              "trainer then holds its dev split out of the training queries)")


def keyed_optim(optim: dict) -> dict:
    """``optim.*`` (a dict) as it keys a `gdr run` training stage: ``consistency_view`` only when it is not R-drop's
    own view, which every training had before the choice existed (their stage keys, and their folders, stay).
    ``trained_on.json`` records it always: a record without it, of an earlier gdr, is compared as if it held the
    default (:func:`_differences`)."""
    if optim.get("consistency_view") == OptimOptions.consistency_view:
        return {k: v for k, v in optim.items() if k != "consistency_view"}
    return optim


# The retriever's settings that name a model: keyed by the digest of its files, not by the name or path.
_MODEL_REFS = ("encoder", "tokenizer")


def keyed_model(settings: TrainSettings) -> dict:
    """The retriever's ``model.*`` as resolved from its preset, with the encoder and tokenizer each keyed by the
    digest of its files (:func:`gdr.models.model_digest`): a model changed in place is another input, a moved
    one the same."""
    model = dict(settings.model_presets[settings.model.size])  # model.size names a preset: its rule, at the door
    model.update({k: v for k, v in asdict(settings.model).items() if v is not None})
    return {k: model_digest(v) if k in _MODEL_REFS and isinstance(v, str) else v for k, v in model.items()}


def training_numerics(settings: TrainSettings) -> dict:
    """What of the machine decides a retriever's bytes, as resolved here: the device kind, the precision
    (``trainer.precision: null`` is bf16-mixed on CUDA, 32-true on the CPU), whether AdamW is fused and, on the
    CPU, the torch threads it trains with (:func:`training_threads`)."""
    accelerator = str(settings.trainer.accelerator)
    cuda = uses_cuda(accelerator)
    precision = trainer_precision(settings.trainer.precision, accelerator)
    out = {"kind": "cuda" if cuda else "cpu", "precision": precision,
           "fused": resolve_fused(settings.optim.fused, cuda, precision)}
    return out if cuda else {**out, "threads": training_threads()}


def training_threads() -> int:
    """The torch threads a retriever trains with on the CPU, by every entry point (``gdr run``, ``gdr train``, a
    training worker): :func:`gdr.device.cpu_threads`, set at the training's start rather than inherited from what
    an earlier stage of the process left (the query generator sets ``threads``)."""
    return cpu_threads()


def _differences(old: dict, new: dict) -> list[str]:
    """What differs between two :func:`trained_on` records: ``name (old -> new)`` for each input and setting. A
    setting only the new record has was added by a later gdr, whose default is what the earlier one did: it differs
    when it is not that default (``name (not recorded: default X -> Y)``). A setting only the old record has, or one
    without a default (``model.*`` resolved from a preset, ``device.*``), is not compared."""
    out = []
    for name, now in new["inputs"].items():
        was, now = old.get("inputs", {}).get(name) or {}, now or {}
        if was.get("hash") != now.get("hash"):
            a, b = was.get("what", "none"), now.get("what", "none")
            if a == b:  # the same description, other content
                a, b = f"{a}, hash {was.get('hash')}", f"{b}, hash {now.get('hash')}"
            out.append(f"{name} ({a} -> {b})")
    was_s, now_s = old.get("settings", {}), new["settings"]
    out += [f"{k} ({was_s[k]} -> {now_s[k]})" for k in sorted(set(was_s) & set(now_s)) if was_s[k] != now_s[k]]
    defaults = _recorded_defaults()
    out += [f"{k} (not recorded: default {defaults[k]} -> {now_s[k]})" for k in sorted(set(now_s) - set(was_s))
            if k in defaults and defaults[k] != now_s[k]]
    return out


def _own_settings(c: dict) -> dict:
    """The settings of :func:`trained_on` that have a default of their own, from ``TrainSettings.to_dict()``."""
    return {"examples": c["examples"], "optim": c["optim"],
            "trainer": {k: v for k, v in c["trainer"].items() if k not in RESUMABLE}}


def _recorded_defaults() -> dict:
    """:func:`_own_settings` at their defaults, flat as :func:`trained_on` records them."""
    return _as_recorded(_own_settings(TrainSettings().to_dict()))


def holds_training(out: Path) -> bool:
    """Whether ``out`` holds a training: its record, a checkpoint or a model."""
    return (out / TRAINED_ON).exists() or (out / "checkpoints" / "last.ckpt").exists() or \
        (out / "model" / "retriever.json").exists()


def check_trained_on(out: str | Path, fingerprint: dict, resume: bool = TrainerOptions.resume,
                     stale: str = "refuse") -> None:
    """Make ``out`` ready for a training on the inputs ``fingerprint`` (:func:`trained_on`) before a file is written.

    A folder holding another training (a checkpoint, a model, ``trained_on.json`` of other inputs) is refused with
    one line naming what differs (``stale="refuse"``: ``gdr train``, the API), or cleared with a warning
    (``stale="restart"``: ``gdr run``, whose stage folder is its own); ``resume=False`` clears it too. (A training
    of format 0, without ``trained_on.json``, is refused before the stage by
    :func:`gdr.upgrade.refuse_format_0_training`.)"""
    out = Path(out)
    if not holds_training(out):
        return
    try:
        old = json.loads((out / TRAINED_ON).read_text(encoding="utf-8"))
        diff = _differences(old, fingerprint)
    except (ValueError, OSError, AttributeError) as e:
        diff = [f"{TRAINED_ON} unreadable ({e})"]
    if resume and not diff:
        return
    if resume and stale == "refuse":
        more = f" and {len(diff) - 3} more" if len(diff) > 3 else ""
        raise ConfigError(f"out_dir={out}: holds a training on other inputs or settings: {'; '.join(diff[:3])}{more}; "
                          "resuming would continue that model. To start over in this folder set trainer.resume=false, "
                          "or choose a fresh out_dir")
    why = "trainer.resume=false" if not resume else f"it was trained on other inputs ({'; '.join(diff[:3])})"
    log.warning("%s: starting over (%s): the earlier training's checkpoints and model are removed", out, why)
    for name in ("checkpoints", "model"):
        shutil.rmtree(out / name, ignore_errors=True)
    for name in ("manifest.json", TRAINED_ON):
        (out / name).unlink(missing_ok=True)


def trained_splits(run_dir: str | Path) -> list[str]:
    """The query splits the retriever in ``run_dir`` was trained on (``trained_on.json``'s); [] when it had no real
    queries, or ``run_dir`` holds no training (the evaluation then says what is missing). (A retriever of format 0,
    without them recorded, is refused before the stage by :func:`gdr.upgrade.refuse_format_0_retriever`.)"""
    run_dir, record = Path(run_dir), Path(run_dir) / TRAINED_ON
    if not holds_training(run_dir):
        return []
    try:
        queries = (json.loads(record.read_text(encoding="utf-8")).get("inputs") or {}).get("queries")
    except (OSError, ValueError, AttributeError) as e:
        raise ConfigError(f"{record}: unreadable ({e}); train the retriever again (`gdr train`)") from None
    return list((queries or {}).get("splits") or [])


def check_not_trained_on(run_dir: str | Path, split: str, allow: bool = False, key: str = "queries.split") -> None:
    """Refuse to score the retriever of ``run_dir`` on a query ``split`` it was trained on (its scores would measure
    memory, not retrieval), unless ``allow`` (``--allow-train-split``, ``allow_train_split=True``)."""
    if split in trained_splits(run_dir) and not allow:
        raise ConfigError(f"{key}={split}: the retriever in {run_dir} was trained on the {split!r} queries; score "
                          f"it on a split it never saw, or add --allow-train-split (allow_train_split=True in "
                          "Python) to measure it on its training queries, as the report will then say")


def train_retriever(corpus, docids: str | Path, out: str | Path, settings: TrainSettings, *, queries=None,
                    generated: str | Path | None = None, write_config: Callable[[Path], Any] | None = None,
                    stale: str = "refuse", dev=None):
    """Train one retriever on ``docids`` (a ``docids.tsv`` of ``gdr index``) for ``corpus`` into ``out``.

    ``queries``: real training queries (a :class:`gdr.data.QuerySet` over the corpus, e.g. from
    :func:`gdr.data.splits.split_queries`; its dev part is held out by the trainer, unless ``dev``, a QuerySet
    apart from them (:func:`check_dev_apart`: a query set's own dev split), is the dev split) or None; ``generated``: a
    ``doc_queries.jsonl`` of generated queries, or None. Returns the ``gdr.training.train.TrainResult``; a killed
    run resumes from ``out/checkpoints/last.ckpt``, and only a training on the same inputs and settings
    (:func:`check_trained_on`; ``stale``: ``refuse`` or ``restart`` another one). ``write_config(out)``: writes the
    command's config once the folder is known to be this training's (``gdr train``'s ``config.yaml``). A training
    on the CPU runs at :func:`training_threads`, whatever ran before it in the process."""
    out = Path(out)
    codes = _align_docids(str(docids), corpus.doc_ids)
    with holding(out, "out_dir"):  # one writer per folder, as with `gdr train`
        fingerprint = trained_on(corpus, docids, codes, settings, queries, generated, dev)
        resume = bool(settings.trainer.resume)
        check_trained_on(out, fingerprint, resume=resume, stale=stale)
        if write_config is not None:
            write_config(out)
        atomic_write_json(out / TRAINED_ON, fingerprint)
        done = _finished(out, settings)
        if done is not None:
            log.info("%s: a finished training on these inputs and settings (step %d, best %s %s); reused",
                     out, done.global_step, done.monitor, done.best_score)
            return done
        with torch_threads(fingerprint["settings"].get("device.threads")):
            return _train(corpus, docids, codes, out, settings, queries, generated, dev)


def _trainer_record(settings: TrainSettings) -> dict:
    """The trainer settings as the manifest records them (JSON values)."""
    return json.loads(json.dumps(settings.to_dict()["trainer"], default=str))


def _finished(out: Path, settings: TrainSettings):
    """The ``TrainResult`` of the finished training in ``out`` (its manifest written, its files intact) when it
    ran with these trainer settings too (the inputs and other settings :func:`check_trained_on` compared), else
    None: a rerun of a finished training is that training, with its dev score, not another fit."""
    try:
        man = read_manifest(out)
    except (ValueError, OSError):
        return None
    if not man or man.get("command") != "train" or man.get("trainer") != _trainer_record(settings):
        return None
    if not man.get("files") or verify_files(out, man["files"]) is not None:
        return None
    monitor, score = best_of_manifest(man)
    return TrainResult(out, out / "model", man.get("best_checkpoint"), score,
                       man.get("examples") or {}, man.get("n_params") or {}, int(man.get("global_step") or 0),
                       batch_size=man.get("batch_size"), precision=man.get("precision"), device=man.get("device"),
                       monitor=monitor, memory=man.get("memory"), start_step=int(man.get("global_step") or 0))


def best_of_manifest(man: dict) -> tuple[str, float | None]:
    """(the dev metric that picked a training's checkpoint, its best value) from its manifest: ``best_val_metric``
    and ``best_val_score``; a manifest written before ``best_val_score`` holds the value as ``best_val_recall1``
    (whatever the metric was)."""
    monitor = str(man.get("best_val_metric") or "val/recall@1")
    return monitor, man.get("best_val_score", man.get("best_val_recall1"))


def best_record(monitor: str, score: float | None) -> dict:
    """The best dev score as a manifest or a record keeps it: under its metric's name (``best_val_metric``,
    ``best_val_score``), and as ``best_val_recall1`` too when that metric is recall@1 (what readers of earlier
    records read)."""
    return {"best_val_metric": monitor, "best_val_score": score,
            **({"best_val_recall1": score} if monitor == "val/recall@1" else {})}


def _train(corpus, docids, codes, out: Path, settings: TrainSettings, queries, generated, dev=None):
    c = settings.to_dict()
    t0 = time.time()
    pos = {d: i for i, d in enumerate(corpus.doc_ids)}
    qs = queries
    train_q = qs.texts if qs is not None else []
    train_rel = [[pos[d] for d in rel] for rel in qs.relevant] if qs is not None else []
    gen_q, gen_d = read_generated_queries(str(generated), corpus.doc_ids) if generated else ([], np.zeros(0, np.int64))
    res = train(
        out, model_config_from(c["model"], c["model_presets"]), corpus.doc_ids, codes,
        doc_texts=corpus.model_inputs(), train_queries=train_q, train_rel=train_rel,
        gen_queries=gen_q, gen_docs=gen_d, dev_queries=None if dev is None else dev.texts,
        dev_rel=[] if dev is None else [[pos[d] for d in rel] for rel in dev.relevant],
        examples=settings.examples, optim=settings.optim, trainer_opts=settings.trainer, seed=settings.seed,
    )
    atomic_write_json(out / CURVE, learning_curve(out, res.monitor, res.global_step))
    write_manifest(out, command="train", corpus=corpus.name, n_docs=len(corpus), docids=str(docids),
                   generated=str(generated) if generated else None, examples=res.counts, n_params=res.n_params,
                   best_checkpoint=res.best_checkpoint, **best_record(res.monitor, res.best_score),
                   global_step=res.global_step, batch_size=res.batch_size, precision=res.precision,
                   device=res.device, memory=res.memory, trainer=_trainer_record(settings),
                   seconds=round(time.time() - t0, 1), files=("docids.tsv", "model/*", CURVE))
    return res


def read_curve(folder: str | Path) -> list[list[float]]:
    """The learning curve of the training in ``folder`` (:data:`CURVE`); [] when it has none (a training by an
    earlier gdr)."""
    path = Path(folder) / CURVE
    try:
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else []
    except ValueError as e:
        raise ConfigError(f"{path}: unreadable ({e}); delete the training folder to train it again") from None


def retrievers_at_once(settings: TrainSettings, n_jobs: int, n_train: int | None = None,
                       docids: str | Path | None = None) -> int:
    """``settings.concurrent`` for ``n_jobs`` retrievers: a number is kept (at most ``n_jobs``); ``auto`` is 1 on the
    CPU and on CUDA as many as the free memory holds at the batch each will train at (``n_train``: an upper bound
    on a retriever's training examples; ``docids``: a ``docids.tsv`` of the run, for the docid length and digits
    the decoder's memory depends on). A retriever trained on several devices (``trainer.devices``) has them to itself:
    1."""
    c, t = settings.to_dict(), settings.trainer
    accelerator = str(t.accelerator)
    if trainer_world_size(t.devices, uses_cuda(accelerator)) > 1:
        if settings.concurrent not in ("auto", 1):
            log.info("train.concurrent=%s: 1, as each retriever trains on %s devices", settings.concurrent, t.devices)
        return 1
    config = model_config_from(c["model"], c["model_presets"])
    if docids is not None and settings.concurrent == "auto":
        _, codes = read_checked_docids(docids)
        config.n_digits = config.n_digits or max(max(x) for x in codes) + 1
        config.max_code_len = config.max_code_len or max(len(x) for x in codes)
    return resolve_concurrent(settings.concurrent, n_jobs, accelerator, config, t.batch_size, n_train,
                              passes=settings.optim.forward_passes)


def training_device(settings: TrainSettings) -> str:
    """The device a retriever of ``settings`` trains on, by name (``NVIDIA H200``, ``cpu``): what an ``auto`` size
    resolved for it holds for."""
    accelerator = str(settings.trainer.accelerator)
    return device_name("cuda" if uses_cuda(accelerator) else "cpu")


def resolve_run_batch(settings: TrainSettings, docids: Sequence[str | Path], n_train: int) -> int:
    """``trainer.batch_size`` for every retriever of a run, resolved once
    (:func:`gdr.training.train.resolve_train_batch`, free memory read with the cache emptied): sized for the largest
    decoder among the runs' ``docids`` files (the most digits and the longest docid) and ``n_train`` training
    examples."""
    c = settings.to_dict()
    config = model_config_from(c["model"], c["model_presets"])
    codes = [code for path in docids for code in read_checked_docids(path)[1]]
    if codes:
        config.n_digits = config.n_digits or max(max(x) for x in codes) + 1
        config.max_code_len = config.max_code_len or max(len(x) for x in codes)
    return resolve_train_batch(settings.trainer, config, n_train, settings.optim.forward_passes)


def train_retrievers(jobs: Sequence[Callable[[], Any]], concurrent: int,
                     on_done: Callable[[int, Any], None] | None = None, on_cuda: bool = False) -> list:
    """Run the training ``jobs`` of a run (picklable callables, one per retriever, each training and recording one
    retriever, e.g. a ``gdr run`` stage) ``concurrent`` at a time on this device; returns their results in order.
    Each finished job's own record stands as it finishes, so a run cut short keeps them; ``on_done(i, result)`` runs
    here as job ``i`` finishes, while the others train. ``on_cuda``: the jobs train on CUDA, so each of the
    ``concurrent`` slots takes its share of the CPU cores (:func:`gdr.training.concurrent.slot_threads`)."""
    t0 = time.time()
    log.info("training %d retrievers, %d at once", len(jobs), concurrent)

    def done(i: int, result: Any) -> None:
        log.info("retriever %d of %d trained (%.0f s into the batch)", i + 1, len(jobs), time.time() - t0)
        if on_done is not None:
            on_done(i, result)

    return run_concurrently(jobs, concurrent, on_done=done, threads=slot_threads(concurrent, on_cuda))
