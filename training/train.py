"""``train(...)``: fit a retriever on docids and export it (a pure function; ``gdr train`` wraps it).

Run folder layout::

    out_dir/
      docids.tsv               the docids the model was trained on
      model/                   retriever.json, model.pt, tokenizer files (Retriever.load reads this)
      checkpoints/last.ckpt    resume point (a killed run restarts from here)
      checkpoints/best-*.ckpt  best ``trainer.monitor`` (a run that ends before its first validation validates once at
                               its end), exported unless ``trainer.weights=final`` (then the last step's weights are);
                               every checkpoint is written to a temporary name and renamed, so a full
                               disk or a kill never leaves a truncated one
      logs/metrics.csv         every logged row, one file across resumptions (tensorboard/ when installed)
"""
from __future__ import annotations

import logging
import os
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pytorch_lightning as pl
import torch

from gdr import cost, signals
from gdr.device import free_memory
from gdr.indexing.docids import write_docids
from gdr.indexing.trie import DocidTrie, build_trie
from gdr.logs import on_terminal
from gdr.training.callbacks import DiesWithParent, LossRecorder, StopOnSignal, TrainingCSVLogger, ValidationLog
from gdr.training.checkpoints import (
    AtomicCheckpointIO,
    check_last,
    checkpoint_batch,
    checkpoint_step,
    intact_best,
    remove_partial_writes,
)
from gdr.training.data import RetrievalDataModule, RetrievalExamples, build_examples, resume_point
from gdr.training.model import RetrieverConfig, decoder_dims, encoder_dims, load_tokenizer, meta_param_count
from gdr.training.module import RetrieverModule
from gdr.training.options import ExampleOptions, OptimOptions, TrainerOptions
from gdr.training.stopping import effective_min_steps, patience_checks, steps_per_check

log = logging.getLogger(__name__)

__all__ = ["ExampleOptions", "OptimOptions", "TrainerOptions", "TrainResult", "train", "scaled_optim",
           "resolve_batch_size", "resolve_train_batch", "resolve_fused", "train_batch_for_memory",
           "train_memory_per_example", "cuda_batch_size", "concurrent_for_memory", "resolve_concurrent"]


LR_SCALINGS = ("sqrt", "linear", "none")


def resolve_fused(fused: bool | str, cuda: bool, precision: str) -> bool:
    """``optim.fused``: ``auto`` -> True on CUDA (one kernel for every parameter's update), False on the CPU.

    A fused AdamW unscales float16 gradients itself, so it cannot be clipped under ``16-mixed`` (its gradient
    scaler): there ``auto`` gives False and ``true`` is refused. Under ``bf16-mixed`` and ``32-true``
    :meth:`gdr.training.module.RetrieverModule.configure_gradient_clipping` clips it.
    """
    if fused not in ("auto", True, False):
        raise ValueError(f"optim.fused={fused!r}; choose auto, true or false")
    scaled = str(precision) in ("16-mixed", "16")
    if fused == "auto":
        return cuda and not scaled
    if fused and scaled:
        raise ValueError(f"optim.fused=true with trainer.precision={precision}: a fused AdamW unscales float16 "
                         "gradients itself, so they cannot be clipped; use optim.fused=false or bf16-mixed")
    return bool(fused)


def scaled_optim(optim: OptimOptions, batch_size: int) -> OptimOptions:
    """The optimiser settings for ``batch_size``: learning rates scaled, warmup kept in examples."""
    if optim.lr_scaling not in LR_SCALINGS:
        raise ValueError(f"optim.lr_scaling={optim.lr_scaling!r}; choose one of {', '.join(LR_SCALINGS)}")
    if optim.lr_scaling == "none":
        return optim
    ratio = batch_size / optim.base_batch_size
    factor = {"sqrt": ratio ** 0.5, "linear": ratio, "none": 1.0}[optim.lr_scaling]
    warmup = int(round(optim.warmup_steps / ratio))
    return replace(optim, lr_encoder=optim.lr_encoder * factor, lr_decoder=optim.lr_decoder * factor,
                   warmup_steps=warmup, base_batch_size=batch_size)


GPU_BATCH, CPU_BATCH, GPU_BATCH_CAP = 512, 64, 4096
MIN_STEPS_PER_EPOCH = 16  # batch auto grows past GPU_BATCH only while an epoch keeps at least this many steps


def uses_cuda(accelerator: str) -> bool:
    """Whether a training with ``accelerator`` runs on CUDA (``auto``, ``gpu``, ``cuda`` on a machine with one)."""
    return torch.cuda.is_available() and accelerator in ("auto", "gpu", "cuda")


def train_memory_per_example(config: RetrieverConfig, passes: int = 1) -> int:
    """Device memory one training example of ``config`` holds until its backward pass, over ``passes`` forward
    passes a step (:attr:`OptimOptions.forward_passes`; :func:`gdr.cost.train_memory_per_example`)."""
    return cost.train_memory_per_example(encoder_dims(config), decoder_dims(config), config.max_query_len,
                                         config.max_code_len, config.n_digits, passes)


def train_batch_for_memory(config: RetrieverConfig, free_bytes: float, cap: int = GPU_BATCH_CAP,
                           passes: int = 1) -> int:
    """The most examples per step whose activations over ``passes`` forward passes (:func:`train_memory_per_example`)
    fit in 60% of
    ``free_bytes`` after the weights, gradients, AdamW states and bf16 weight copies
    (:data:`gdr.cost.TRAIN_BYTES_PER_PARAM` a parameter, counted on a build on the meta device), at most
    ``cap``; a multiple of 64 from 64 up."""
    fixed = cost.TRAIN_BYTES_PER_PARAM * meta_param_count(config)
    return cost.batch_for_memory(free_bytes, train_memory_per_example(config, passes), share=0.6, fixed=fixed, cap=cap,
                                 multiple=64)


def resolve_batch_size(batch_size: int | str, accelerator: str = TrainerOptions.accelerator,
                       config: RetrieverConfig | None = None, n_train: int | None = None,
                       free_bytes: float | None = None, passes: int = 1) -> int:
    """``auto`` -> on CUDA the batch that fits the free memory (:func:`train_batch_for_memory`, up to 4,096;
    ``config`` needed), but above 512 only while an epoch of ``n_train`` examples keeps at least
    :data:`MIN_STEPS_PER_EPOCH` steps (a power of two); 64 on the CPU. An int stays (a config's 512 is 512).

    ``free_bytes`` : the free device memory (default: :func:`gdr.device.free_memory`, the cache emptied first).
    ``passes``: forward passes a step (:attr:`OptimOptions.forward_passes`).
    """
    if batch_size != "auto":
        return int(batch_size)
    if not uses_cuda(accelerator):
        return CPU_BATCH
    if config is None:
        return GPU_BATCH
    if free_bytes is None:
        free_bytes = free_memory()
    return cuda_batch_size(config, free_bytes, n_train, passes)


def cuda_batch_size(config: RetrieverConfig, free_bytes: float, n_train: int | None = None, passes: int = 1) -> int:
    """``auto`` on a GPU with ``free_bytes`` free (:func:`resolve_batch_size`): what fits at ``passes`` forward
    passes a step, above 512 only while an epoch of ``n_train`` examples keeps :data:`MIN_STEPS_PER_EPOCH` steps."""
    bs = train_batch_for_memory(config, free_bytes, passes=passes)
    if n_train is not None:
        by_data = 2 ** int(np.log2(max(n_train // MIN_STEPS_PER_EPOCH, 1)))
        bs = min(bs, max(GPU_BATCH, by_data))
    return bs


def concurrent_for_memory(config: RetrieverConfig, batch_size: int, free_bytes: float, n_jobs: int,
                          passes: int = 1) -> int:
    """How many retrievers training at ``batch_size`` (``passes`` forward passes a step) fit in ``free_bytes`` at once
    (at least 1, at most ``n_jobs``).

    Each needs its CUDA context (:data:`gdr.cost.CUDA_CONTEXT_BYTES`) and what the batch rule plans for it
    (:func:`train_batch_for_memory`):
    :data:`gdr.cost.TRAIN_BYTES_PER_PARAM` a parameter (weights, gradients, AdamW states, bf16 copies) and the
    activations of ``batch_size`` examples, within 60% of the memory left to it. So the last one to start still
    finds the memory its batch was sized for, and a retriever trained beside others gets the batch it would get
    alone."""
    fixed = cost.TRAIN_BYTES_PER_PARAM * meta_param_count(config)
    need = cost.CUDA_CONTEXT_BYTES + (fixed + batch_size * train_memory_per_example(config, passes)) / 0.6
    return int(max(1, min(n_jobs, free_bytes // need)))


def resolve_concurrent(concurrent: int | str, n_jobs: int, accelerator: str = TrainerOptions.accelerator,
                       config: RetrieverConfig | None = None, batch_size: int | str = TrainerOptions.batch_size,
                       n_train: int | None = None, free_bytes: float | None = None, passes: int = 1) -> int:
    """``train.concurrent``: a number is kept (at most ``n_jobs``); ``auto`` is 1 on the CPU and on CUDA what
    :func:`concurrent_for_memory` fits at the batch each retriever will train at (``config``, ``n_train``: an upper
    bound on its training examples, ``passes``: forward passes a step, as
    :func:`gdr.training.train.resolve_batch_size` takes them)."""
    if concurrent != "auto":
        return max(1, min(int(concurrent), n_jobs))
    if not uses_cuda(accelerator) or config is None or n_jobs <= 1:
        return 1
    if free_bytes is None:
        free_bytes = free_memory()
    batch = resolve_batch_size(batch_size, accelerator, config=config, n_train=n_train, free_bytes=free_bytes,
                               passes=passes)
    n = concurrent_for_memory(config, batch, free_bytes, n_jobs, passes)
    log.info("train.concurrent=auto: %d retrievers at once (batch %d, %.1f GB free)", n, batch, free_bytes / 1e9)
    return n


def resolve_train_batch(trainer_opts: TrainerOptions, config: RetrieverConfig, n_train: int, passes: int = 1) -> int:
    """The examples per optimiser step of a run, resolved once: ``trainer.batch_size`` as given, or for ``auto``
    what :func:`resolve_batch_size` gives for the free memory now (the CUDA cache emptied first) and ``n_train``
    training examples shared by the processes that train. ``config``: the architecture with its docid sizes
    (``n_digits``, ``max_code_len``); a caller training several retrievers resolves it for the largest and passes
    the number to each, so they all train at one batch whatever ran before. ``passes``: forward passes a step
    (:attr:`OptimOptions.forward_passes`)."""
    cuda = uses_cuda(trainer_opts.accelerator)
    return resolve_batch_size(trainer_opts.batch_size, trainer_opts.accelerator, config=config,
                              n_train=n_train // trainer_world_size(trainer_opts.devices, cuda), passes=passes)


@dataclass
class TrainResult:
    """What a training left: its folders, the best checkpoint and its dev score ``best_score`` under the metric
    that picked it (``monitor``, ``trainer.monitor``), the example counts and the steps."""

    out_dir: Path
    model_dir: Path
    best_checkpoint: str | None
    best_score: float | None  # the best dev value of ``monitor``
    counts: dict[str, Any]
    n_params: dict[str, int]
    global_step: int
    losses: list[float] = field(default_factory=list, repr=False)
    batch_size: int | None = None  # examples per optimiser step, as resolved (``trainer.batch_size: auto``)
    precision: str | None = None  # as resolved (``trainer.precision: null``): bf16-mixed on a GPU, 32-true on the CPU
    device: str | None = None  # cuda or cpu
    monitor: str = "val/recall@1"  # the dev metric ``best_score`` is a value of
    # the device memory the batch rule planned for this training (``estimate_bytes``: weights, gradients, AdamW states,
    # bf16 copies and the activations of a batch, :func:`train_batch_for_memory`'s sum) and, on one CUDA device, the
    # allocator's peak over the fit, validations included (``peak_bytes``; None on the CPU and over several devices)
    memory: dict[str, int | None] | None = None
    start_step: int = 0  # the step this start resumed from: global_step - start_step steps were trained by it

    @property
    def best_val_recall1(self) -> float | None:
        """The best dev recall@1 when it picked the checkpoint (``trainer.monitor=val/recall@1``), else None: another
        metric's value is never given under this name (``best_score`` holds it)."""
        return self.best_score if self.monitor == "val/recall@1" else None


@dataclass
class _Data:
    """What :func:`_prepare_data` made: the architecture with its docid sizes, the trie, the tokenizer, the examples."""

    cfg: RetrieverConfig
    trie: DocidTrie
    tokenizer: Any
    examples: RetrievalExamples


@dataclass
class _Run:
    """How this run trains: batch size, the optimiser at that batch, precision, fused AdamW, on CUDA or not."""

    batch_size: int
    optim: OptimOptions
    precision: str
    fused: bool
    cuda: bool
    world_size: int


def trainer_world_size(devices: Any, cuda: bool) -> int:
    """Processes Lightning will train with (an epoch's batches are split among them)."""
    if isinstance(devices, int) or str(devices).isdigit():
        n = int(devices)
        return torch.cuda.device_count() if n == -1 and cuda else max(1, n)
    if isinstance(devices, (list, tuple)):
        return max(1, len(devices))
    return max(1, torch.cuda.device_count()) if cuda and str(devices) in ("auto", "-1") else 1


def trainer_precision(p: str | None, accelerator: str) -> str:
    """Lightning's precision for ``p``: as given, or for ``auto`` bf16-mixed on a CUDA that has bf16, else 32-true."""
    if p is not None and p != "auto":
        return str(p)
    return "bf16-mixed" if uses_cuda(accelerator) and torch.cuda.is_bf16_supported() else "32-true"


def _prepare_data(out: Path, model_config: RetrieverConfig, doc_ids: Sequence[str], codes: Sequence[Sequence[int]],
                  examples: ExampleOptions, seed: int, **texts: Any) -> _Data:
    """The architecture sized for the docids, their trie, ``out/docids.tsv``, the tokenizer and the examples
    (``texts``: the text arguments of :func:`train`)."""
    K = max(max(c) for c in codes) + 1
    L = max(len(c) for c in codes)
    cfg = RetrieverConfig.from_dict(model_config.to_dict())
    if not cfg.n_digits:
        cfg.n_digits = K
    if not cfg.max_code_len:
        cfg.max_code_len = L
    if cfg.n_digits < K or cfg.max_code_len < L:
        raise ValueError(f"docids need K >= {K} digits and length >= {L}, but the model has "
                         f"n_digits={cfg.n_digits}, max_code_len={cfg.max_code_len}; raise them or set them to null")
    trie = build_trie(codes, n_digits=cfg.n_digits)
    write_docids(out / "docids.tsv", doc_ids, codes)
    tokenizer = load_tokenizer(cfg.tokenizer_name)
    ex = build_examples(tokenizer, len(doc_ids), max_query_len=cfg.max_query_len, seed=seed, **texts,
                        **asdict(examples))
    return _Data(cfg, trie, tokenizer, ex)


def _plan_run(t: TrainerOptions, optim: OptimOptions, data: _Data, last: Path) -> _Run:
    """The batch size (a resumed ``auto`` run keeps the batch it started with, whatever is free now), the
    optimiser scaled to it, the precision and the AdamW kind."""
    cuda = uses_cuda(t.accelerator)
    world = trainer_world_size(t.devices, cuda)
    if t.batch_size == "auto" and t.resume and last.exists():
        batch_size = checkpoint_batch(last, GPU_BATCH if cuda else CPU_BATCH)
    else:
        batch_size = resolve_train_batch(t, data.cfg, len(data.examples.train), optim.forward_passes)
    optim = scaled_optim(optim, batch_size)
    log.info("batch size %d: lr_encoder %.3g, lr_decoder %.3g, warmup %d steps", batch_size, optim.lr_encoder,
             optim.lr_decoder, optim.warmup_steps)
    precision = trainer_precision(t.precision, t.accelerator)
    fused = resolve_fused(optim.fused, cuda, precision)
    log.info("precision %s, %s AdamW", precision, "fused" if fused else "unfused")
    return _Run(batch_size, optim, precision, fused, cuda, world)


def _build_module(data: _Data, run: _Run, t: TrainerOptions, seed: int) -> RetrieverModule:
    o = run.optim
    module = RetrieverModule(data.cfg.to_dict(), lr_encoder=o.lr_encoder, lr_decoder=o.lr_decoder,
                             weight_decay=o.weight_decay, warmup_steps=o.warmup_steps,
                             consistency_weight=o.consistency_weight, consistency_view=o.consistency_view,
                             val_beam=t.val_beam,
                             length_penalty=t.length_penalty, seed=seed, fused=run.fused, trie=data.trie,
                             batch_size=run.batch_size)
    log.info("retriever parameters: %s", module.model.n_params())
    if t.compile:
        module.model.compile(dynamic=False)  # in place: the state dict keeps its keys; the data's fixed widths
    return module


def _min_steps(t: TrainerOptions, run: _Run, n_train: int, has_dev: bool) -> int:
    """``trainer.min_steps``, held to half of the run's steps when early stopping is on, so that the epoch cap
    does not always win over it (:func:`gdr.training.stopping.effective_min_steps`)."""
    if not (has_dev and (t.patience_steps or t.patience > 0)):
        return t.min_steps
    min_steps = effective_min_steps(t.min_steps, n_train, run.batch_size, t.max_epochs, t.max_steps,
                                    world_size=run.world_size)
    if min_steps < t.min_steps:
        log.info("trainer.min_steps=%d is past half of this run's steps (trainer.max_epochs=%d at %d examples a "
                 "step): early stopping may act from step %d on", t.min_steps, t.max_epochs, run.batch_size, min_steps)
    return min_steps


def _early_stopping(t: TrainerOptions, run: _Run, n_train: int, min_steps: int) -> pl.callbacks.EarlyStopping | None:
    if not (t.patience_steps or t.patience > 0):
        return None
    patience = t.patience
    if t.patience_steps:  # steps -> checks at this batch size and validation interval
        per_check = steps_per_check(n_train, run.batch_size, t.check_val_every_n_epoch, t.val_check_interval,
                                    world_size=run.world_size)
        patience = patience_checks(int(t.patience_steps), per_check)
        log.info("early stopping after %d steps without a better %s: %d validations of %.0f steps, "
                 "not before step %d", t.patience_steps, t.monitor, patience, per_check, min_steps)
    # checked right after each validation, never at an epoch end without one (a run stopped by max_steps
    # mid-epoch, a resumed epoch): there the metric does not exist and Lightning would stop the run with an error
    return pl.callbacks.EarlyStopping(monitor=t.monitor, mode="max", patience=patience,
                                      check_on_train_epoch_end=False)


def _say_early_stop(trainer: pl.Trainer, monitor: str) -> None:
    """One log line when early stopping ended the training before the steps its epochs or ``max_steps`` allow."""
    stopper = next((c for c in trainer.callbacks if isinstance(c, pl.callbacks.EarlyStopping)), None)
    planned = trainer.estimated_stepping_batches
    if stopper is None or stopper.wait_count < stopper.patience or trainer.global_step >= planned:
        return
    log.info("early stop at step %d of %d: no better %s in %d validations (best %.4f); trainer.patience=0 trains "
             "every step", trainer.global_step, planned, monitor, stopper.wait_count, float(stopper.best_score))


def _loggers(out: Path, tensorboard: bool) -> list:
    # one folder per training, whatever its starts: logs/metrics.csv continued by a resumed run (TrainingCSVLogger),
    # tensorboard/ with an event file per start, which TensorBoard reads as one run
    loggers: list = [TrainingCSVLogger(out, name="logs")]
    if tensorboard:
        try:
            import tensorboard as _  # noqa: F401 - an optional dependency: its logger only when installed

            loggers.append(pl.loggers.TensorBoardLogger(out, name="tensorboard", version=""))
        except ImportError:
            pass
    return loggers


def _build_trainer(out: Path, t: TrainerOptions, run: _Run, data: _Data, extra: Sequence[pl.Callback]):
    """The Trainer with gdr's callbacks; returns (trainer, the best-checkpoint callback or None, the loss recorder)."""
    ckpt_dir = out / "checkpoints"
    has_dev = len(data.examples.dev) > 0
    # Lightning 2.6 writes `save_last` only when a top-k checkpoint is written in the same step, so
    # the resume point is a checkpoint callback of its own: monitor None, top-1 = the latest state.
    last_ckpt = pl.callbacks.ModelCheckpoint(
        dirpath=ckpt_dir, filename="last", monitor=None, save_top_k=1, enable_version_counter=False,
        every_n_train_steps=t.checkpoint_every_n_steps,
        every_n_epochs=None if t.checkpoint_every_n_steps else t.checkpoint_every_n_epochs,
    )
    best_ckpt = pl.callbacks.ModelCheckpoint(
        dirpath=ckpt_dir, filename="best-{epoch}-{step}", monitor=t.monitor, mode="max", save_top_k=1,
        auto_insert_metric_name=False, save_weights_only=True,  # only exported, never resumed from: no optimiser state
        save_on_train_epoch_end=False,  # at each validation's end, before a stop's resume point (StopOnSignal)
    ) if has_dev else None
    recorder = LossRecorder()
    stop = StopOnSignal(ckpt_dir / "last.ckpt")
    # best before last: last.ckpt then carries the best-checkpoint callback's updated state; the stop's resume
    # point after both (Lightning runs checkpoint callbacks last, in this order), its raise before every callback
    callbacks = [stop.first, *([best_ckpt] if best_ckpt else []), last_ckpt, stop, recorder,
                 pl.callbacks.LearningRateMonitor(logging_interval="step"), DiesWithParent(),
                 ValidationLog(t.monitor, run.batch_size * run.world_size), *extra]
    # Lightning's bar (on stdout) only on a terminal: in a log file every refresh would stay as a line, and the
    # log has ValidationLog's line per validation instead
    progress = t.enable_progress_bar and on_terminal(sys.stdout)
    if progress and run.cuda:  # the bar reads the logged loss (a host sync) at each refresh
        callbacks.append(pl.callbacks.TQDMProgressBar(refresh_rate=t.log_every_n_steps))
    min_steps = _min_steps(t, run, len(data.examples.train), has_dev)
    stopping = _early_stopping(t, run, len(data.examples.train), min_steps) if has_dev else None
    if stopping is not None:
        callbacks.append(stopping)
    trainer = pl.Trainer(
        default_root_dir=out, max_epochs=t.max_epochs, max_steps=t.max_steps, min_steps=min_steps or None,
        accelerator=t.accelerator, devices=t.devices, strategy=t.strategy, precision=run.precision,
        gradient_clip_val=t.gradient_clip_val, check_val_every_n_epoch=t.check_val_every_n_epoch,
        val_check_interval=t.val_check_interval, limit_val_batches=t.limit_val_batches if has_dev else 0,
        log_every_n_steps=t.log_every_n_steps, callbacks=callbacks, logger=_loggers(out, t.tensorboard),
        num_sanity_val_steps=t.num_sanity_val_steps if has_dev else 0, enable_progress_bar=progress,
        enable_model_summary=False, deterministic=False, plugins=[AtomicCheckpointIO()],
    )
    return trainer, best_ckpt, recorder


def _resume(trainer: pl.Trainer, module: RetrieverModule, dm: RetrievalDataModule, t: TrainerOptions,
            ckpt_dir: Path, n_train: int, batch_size: int) -> str | None:
    """The checkpoint to resume from (``last.ckpt``; None = a fresh start), with the data module set to skip
    the batches of the stopped epoch already trained on. A damaged ``last.ckpt`` starts from the fallback
    :func:`gdr.training.checkpoints.check_last` picks."""
    remove_partial_writes(ckpt_dir)
    last = ckpt_dir / "last.ckpt"
    if not (t.resume and last.exists()):
        return None
    start = check_last(last, ckpt_dir, t.resume_damaged)
    if start is not None:
        module.load_state_dict(torch.load(start, map_location="cpu", weights_only=False)["state_dict"])
    if not last.exists():  # damaged and moved aside
        return None
    if trainer.world_size == 1:  # skip the batches of the stopped epoch already trained on (exact resume)
        dm.resume_epoch, dm.resume_skip = resume_point(last, n_train, batch_size)
    else:
        log.warning("resuming under %d processes: the killed epoch is replayed from its start", trainer.world_size)
    log.info("resuming from %s (epoch %d, %d examples of it done)", last, dm.resume_epoch, dm.resume_skip)
    return str(last)


def _validate_at_end(trainer, module, dm, ckpt_dir: Path, monitor: str) -> tuple[str | None, float | None]:
    """A run that ended before its first validation (``max_steps`` within the first epoch): validate the final
    weights once and keep them as the best checkpoint, so the run has a dev score and a checkpoint like any other."""
    metrics = trainer.validate(module, datamodule=dm, verbose=False)
    score = metrics[0].get(monitor) if metrics else None
    path = ckpt_dir / f"best-{trainer.current_epoch}-{trainer.global_step}.ckpt"
    trainer.save_checkpoint(path, weights_only=True)
    log.info("no validation within these %d steps: validated the final weights once (%s %s)", trainer.global_step,
             monitor, "n/a" if score is None else f"{float(score):.4f}")
    return str(path), None if score is None else float(score)


def _best_of_run(trainer, module, dm, best_ckpt, ckpt_dir: Path, monitor: str) -> tuple[str | None, float | None]:
    """This run's best checkpoint and its score; earlier runs' best checkpoints (and damaged ones) deleted."""
    if best_ckpt is None:
        return None, None
    best = best_ckpt.best_model_path or None
    score = float(best_ckpt.best_model_score) if best_ckpt.best_model_score is not None else None
    if best is None and not any(ckpt_dir.glob("best-*.ckpt")):
        best, score = _validate_at_end(trainer, module, dm, ckpt_dir, monitor)
    chosen = intact_best(ckpt_dir, best)  # e.g. resumed after the last epoch: nothing new was validated
    if chosen != best:
        best, score = chosen, None
    keep = Path(best).resolve() if best else None  # Lightning resolves its dirpath; out_dir may be relative
    for other in ckpt_dir.glob("best-*.ckpt") if trainer.is_global_zero else ():
        if other.resolve() != keep:  # an earlier run's best, or one a failed write left: not this run's
            other.unlink()
    return best, score


def _export(out: Path, module: RetrieverModule, tokenizer, best: str | None, score: float | None,
            global_step: int) -> tuple[float | None, int]:
    """Load the best weights into ``module`` and write ``out/model``; returns the best score and the step count,
    read from the checkpoints where the Trainer does not have them (``ddp_spawn`` hands back only paths)."""
    if best:
        ckpt = torch.load(best, map_location="cpu", weights_only=False)
        module.load_state_dict(ckpt["state_dict"])
        if score is None:
            scores = [v.get("best_model_score") for k, v in ckpt.get("callbacks", {}).items()
                      if "ModelCheckpoint" in str(k) and isinstance(v, dict)]
            score = next((float(x) for x in scores if x is not None), None)
    last = out / "checkpoints" / "last.ckpt"
    if global_step == 0 and last.exists():
        global_step = int(torch.load(last, map_location="cpu", weights_only=False).get("global_step", 0))
    model_dir = out / "model"
    module.model.cpu().save(model_dir)
    tokenizer.save_pretrained(model_dir)
    return score, global_step


def train(
    out_dir: str | os.PathLike,
    model_config: RetrieverConfig,
    doc_ids: Sequence[str],
    codes: Sequence[Sequence[int]],
    doc_texts: Sequence[str] | None = None,
    train_queries: Sequence[str] = (),
    train_rel: Sequence[Sequence[int]] = (),
    gen_queries: Sequence[str] = (),
    gen_docs: Sequence[int] | np.ndarray = (),
    dev_queries: Sequence[str] | None = None,
    dev_rel: Sequence[Sequence[int]] = (),
    examples: ExampleOptions = ExampleOptions(),
    optim: OptimOptions = OptimOptions(),
    trainer_opts: TrainerOptions = TrainerOptions(),
    seed: int = 0,
    callbacks: Sequence[pl.Callback] = (),
) -> TrainResult:
    """Train a retriever mapping queries to the docids ``codes`` and export it to ``out_dir/model``.

    The phases: prepare the data, plan the run (batch size, optimiser, precision), build the module and the
    trainer, resume from ``last.ckpt``, fit, export the best checkpoint.

    Parameters
    ----------
    model_config : the architecture; ``n_digits``/``max_code_len`` of 0 or None are taken from ``codes``
    doc_ids, codes : one docid per document (``read_docids``), aligned with ``doc_texts``
    train_queries, train_rel : real training queries and their relevant document indices
    gen_queries, gen_docs : generated queries and their source document indices
    dev_queries, dev_rel : the dev split given whole (a query set's own) and its relevant document indices; None:
        held out from the training queries (:func:`gdr.training.data.build_examples`)
    optim : learning rates and warmup at ``optim.base_batch_size``; scaled to the batch size used
        (:func:`scaled_optim`)
    callbacks : extra Lightning callbacks
    """
    out, t = Path(out_dir), trainer_opts  # its values passed the rules of gdr.stages.settings.TrainSettings
    if len(doc_ids) != len(codes):
        raise ValueError(f"{len(doc_ids)} doc ids but {len(codes)} codes")
    out.mkdir(parents=True, exist_ok=True)
    pl.seed_everything(seed, workers=True)
    data = _prepare_data(out, model_config, doc_ids, codes, examples, seed, doc_texts=doc_texts,
                         train_queries=train_queries, train_rel=train_rel, gen_queries=gen_queries, gen_docs=gen_docs,
                         dev_queries=dev_queries, dev_rel=dev_rel)
    ckpt_dir = out / "checkpoints"
    run = _plan_run(t, optim, data, ckpt_dir / "last.ckpt")
    if run.cuda:
        torch.set_float32_matmul_precision("high")  # TF32 for what autocast leaves in float32
    dm = RetrievalDataModule(data.examples, data.trie, pad_token_id=data.tokenizer.pad_token_id or 0,
                             batch_size=run.batch_size, eval_batch_size=t.eval_batch_size, num_workers=t.num_workers,
                             seed=seed, pin_memory=run.cuda, length_buckets=t.length_buckets,
                             fixed_shapes=t.compile)
    module = _build_module(data, run, t, seed)
    trainer, best_ckpt, recorder = _build_trainer(out, t, run, data, callbacks)
    ckpt_path = _resume(trainer, module, dm, t, ckpt_dir, len(data.examples.train), run.batch_size)
    if ckpt_path is None and trainer.is_global_zero:  # a fresh start: a best checkpoint here is another training's
        for stale in ckpt_dir.glob("best-*.ckpt"):
            stale.unlink()
    start_step = checkpoint_step(Path(ckpt_path)) if ckpt_path else 0  # read before fit() writes last.ckpt again
    for logger in trainer.loggers:
        if isinstance(logger, TrainingCSVLogger):  # rows up to the resume point kept, later ones logged again
            logger.resume_step = start_step if ckpt_path else None
    peak = run.cuda and run.world_size == 1  # one device: this process's allocator holds the whole training
    if peak:
        torch.cuda.reset_peak_memory_stats()
    with signals.deferred():  # a signal stops where a rerun resumes exactly, after writing last.ckpt (StopOnSignal)
        trainer.fit(module, datamodule=dm, ckpt_path=ckpt_path)
    _say_early_stop(trainer, t.monitor)
    memory = {"estimate_bytes": int(cost.TRAIN_BYTES_PER_PARAM * meta_param_count(data.cfg) + run.batch_size
                                    * train_memory_per_example(data.cfg, optim.forward_passes)),
              "peak_bytes": int(torch.cuda.max_memory_allocated()) if peak else None}
    best, score = _best_of_run(trainer, module, dm, best_ckpt, ckpt_dir, t.monitor)
    global_step = int(trainer.global_step)
    if trainer.is_global_zero:  # trainer.weights=final: the weights fit() ended with, whatever the dev preferred
        score, global_step = _export(out, module, data.tokenizer, best if t.weights == "best" else None, score,
                                     global_step)
    return TrainResult(out, out / "model", best, score, dict(data.examples.counts), module.model.n_params(),
                       global_step, recorder.losses, run.batch_size, run.precision, "cuda" if run.cuda else "cpu",
                       t.monitor, memory, start_step)
