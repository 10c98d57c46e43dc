"""``train(...)``: fit a retriever on docids and export it (a pure function; ``gdr train`` wraps it).

Run folder layout::

    out_dir/
      docids.tsv               the docids the model was trained on
      model/                   retriever.json, model.pt, tokenizer files (Retriever.load reads this)
      checkpoints/last.ckpt    resume point (a killed run restarts from here)
      checkpoints/best-*.ckpt  best val/recall@1 (a run that ends before its first validation validates once at
                               its end); every checkpoint is written to a temporary name and renamed, so a full
                               disk or a kill never leaves a truncated one
      logs/version_N/metrics.csv   CSVLogger, one version per start (tensorboard/ when installed)
"""
from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pytorch_lightning as pl
import torch

from indexing.docids import write_docids
from indexing.trie import build_trie
from training.data import RetrievalDataModule, build_examples, resume_point
from training.model import RetrieverConfig, encoder_dims, load_tokenizer
from training.module import RetrieverModule
from training.stopping import effective_min_steps, patience_checks, steps_per_check

log = logging.getLogger(__name__)

__all__ = ["ExampleOptions", "OptimOptions", "TrainerOptions", "TrainResult", "train", "scaled_optim",
           "resolve_batch_size", "resolve_fused", "train_batch_for_memory", "train_memory_per_example"]


@dataclass
class ExampleOptions:
    """Which training inputs to use (see ``training.data``)."""

    use_real: bool = True
    use_generated: bool = True
    doc_first: bool = True
    doc_windows: int = 2
    window: int = 64
    max_doc_tokens: int = 2048
    dev_fraction: float = 0.1
    dev_max: int = 1000
    dev_min: int = 0  # fewer real dev queries: held-out generated queries fill the dev split up to this
    dev_max_share: float = 0.1  # held-out generated queries: at most this share of them (one per document)
    generated_per_doc: int | None = None  # only the first N generated queries of each document


@dataclass
class OptimOptions:
    """AdamW settings, given at ``base_batch_size``.

    At batch size B the learning rates are multiplied by ``sqrt(B / base_batch_size)`` (``lr_scaling:
    sqrt``, the square-root rule for Adam-type optimisers) or ``B / base_batch_size`` (``linear``) or kept
    (``none``, this class's default, so that code calling :func:`train` with its own rates keeps them), and
    the warmup covers the same number of *examples*: ``warmup_steps * base_batch_size / B`` steps. At
    B = base_batch_size nothing changes (see :func:`scaled_optim`).
    """

    lr_encoder: float = 1e-4
    lr_decoder: float = 1e-3
    weight_decay: float = 0.01
    warmup_steps: int = 1000
    consistency_weight: float = 0.0
    base_batch_size: int = 64
    lr_scaling: str = "none"  # conf/stage/train.yaml: sqrt
    fused: bool | str = "auto"  # fused AdamW: auto = on CUDA (see resolve_fused)


LR_SCALINGS = ("sqrt", "linear", "none")


def resolve_fused(fused: bool | str, cuda: bool, precision: str) -> bool:
    """``optim.fused``: ``auto`` -> True on CUDA (one kernel for every parameter's update), False on the CPU.

    A fused AdamW unscales float16 gradients itself, so it cannot be clipped under ``16-mixed`` (its gradient
    scaler): there ``auto`` gives False and ``true`` is refused. Under ``bf16-mixed`` and ``32-true``
    :meth:`training.module.RetrieverModule.configure_gradient_clipping` clips it.
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


@dataclass
class TrainerOptions:
    """Lightning Trainer settings. ``precision`` None or "auto" = bf16-mixed on GPU, 32 on CPU.

    ``batch_size`` "auto" = on CUDA what fits the free memory, up to 4,096, 64 on the CPU (:func:`resolve_batch_size`;
    a resumed run keeps its first batch); ``compile`` wraps the model in ``torch.compile`` (any device; static shapes:
    each batch is padded to a fixed width, its length bucket's with ``length_buckets``, so that an epoch traces a few
    graphs once); ``length_buckets`` groups each batch's examples by input length (``training.data.bucketed_order``),
    so short queries are not padded to the width of document windows.
    """

    max_epochs: int = 20
    max_steps: int = -1
    batch_size: int | str = 64
    eval_batch_size: int = 32
    accelerator: str = "auto"
    devices: Any = "auto"
    strategy: str = "auto"
    precision: str | None = None
    gradient_clip_val: float = 1.0
    check_val_every_n_epoch: int = 1
    val_check_interval: float | int | None = None
    limit_val_batches: float | int = 1.0
    patience: int = 5  # validation checks without improvement before stopping
    patience_steps: int | None = None  # instead: optimiser steps without improvement (training/stopping.py)
    min_steps: int = 0  # no early stop before this many steps
    # what picks the exported checkpoint and stops early: "val/recall@1" (NCI) or "val/mrr" (MRR@val_beam,
    # finer-grained: on a dev set of a few queries recall@1 ties at 0 and the first epoch would be kept)
    monitor: str = "val/recall@1"
    val_beam: int = 10
    length_penalty: float = 1.0
    num_workers: int = 0
    log_every_n_steps: int = 50
    checkpoint_every_n_steps: int | None = None
    checkpoint_every_n_epochs: int = 1
    num_sanity_val_steps: int = 2
    tensorboard: bool = True
    resume: bool = True
    resume_damaged: str = "best"  # a damaged last.ckpt: start from the best checkpoint's weights, or "fresh"
    enable_progress_bar: bool = True
    compile: bool = False
    length_buckets: bool = False


GPU_BATCH, CPU_BATCH, GPU_BATCH_CAP = 512, 64, 4096
MIN_STEPS_PER_EPOCH = 16  # batch auto grows past GPU_BATCH only while an epoch keeps at least this many steps


def _on_cuda(accelerator: str) -> bool:
    return torch.cuda.is_available() and accelerator in ("auto", "gpu", "cuda")


def train_memory_per_example(config: RetrieverConfig) -> int:
    """Device memory one training example holds until its backward pass (estimated generously): what autograd
    saves in every encoder layer over ``max_query_len`` tokens and every decoder layer over the L + 1 docid
    positions (bf16 activations, fp32 layer-norm inputs, attention probabilities as the math attention kernel
    keeps them, the cross-attention keys/values), and the fp32 slot logits. Checked against the bytes autograd
    saves on the CPU under bf16 autocast (tests/test_retriever.py)."""
    e = encoder_dims(config)
    S, T, K1 = config.max_query_len, config.max_code_len + 1, config.n_digits + 1
    d, H, ff = config.d_model, config.num_heads, config.d_ff
    A = H * (config.d_kv or d // H)
    enc = e["layers"] * (S * (32 * e["d_model"] + 8 * e["attn"] + 10 * e["d_ff"]) + 20 * e["heads"] * S * S)
    dec = config.num_layers * (T * (32 * d + 8 * A + 10 * ff) + 2 * S * A * 4 + 20 * H * T * (T + S))
    return enc + dec + S * e["d_model"] * 8 + T * K1 * 16


def _param_estimate(config: RetrieverConfig) -> int:
    """Parameters of the retriever from its config (embeddings, attention, feed-forward; no biases or norms)."""
    e = encoder_dims(config)
    d, A = config.d_model, config.num_heads * (config.d_kv or config.d_model // config.num_heads)
    enc = e["vocab"] * e["d_model"] + e["layers"] * (4 * e["d_model"] * e["attn"] + 2 * e["d_model"] * e["d_ff"])
    dec = config.vocab_size * d + config.num_layers * (8 * d * A + 3 * d * config.d_ff) + e["d_model"] * d
    return enc + dec


def train_batch_for_memory(config: RetrieverConfig, free_bytes: float, cap: int = GPU_BATCH_CAP) -> int:
    """The most examples per step whose activations (:func:`train_memory_per_example`) fit in 60% of
    ``free_bytes`` after the weights, gradients, AdamW states and bf16 weight copies (20 bytes a parameter),
    at most ``cap``; a multiple of 64 from 64 up."""
    room = 0.6 * free_bytes - 20 * _param_estimate(config)
    b = int(max(1, min(cap, room // train_memory_per_example(config))))
    return b // 64 * 64 if b >= 64 else b


def resolve_batch_size(batch_size: int | str, accelerator: str = "auto", config: RetrieverConfig | None = None,
                       n_train: int | None = None, free_bytes: float | None = None) -> int:
    """``auto`` -> on CUDA the batch that fits the free memory (:func:`train_batch_for_memory`, up to 4,096;
    ``config`` needed), but above 512 only while an epoch of ``n_train`` examples keeps at least
    :data:`MIN_STEPS_PER_EPOCH` steps (a power of two); 64 on the CPU. An int stays (a config's 512 is 512).

    ``free_bytes`` : the free device memory (default: asked from CUDA).
    """
    if batch_size != "auto":
        return int(batch_size)
    if not _on_cuda(accelerator):
        return CPU_BATCH
    if config is None:
        return GPU_BATCH
    if free_bytes is None:
        free_bytes, _ = torch.cuda.mem_get_info()
    bs = train_batch_for_memory(config, free_bytes)
    if n_train is not None:
        by_data = 2 ** int(np.log2(max(n_train // MIN_STEPS_PER_EPOCH, 1)))
        bs = min(bs, max(GPU_BATCH, by_data))
    return bs


def _checkpoint_batch(ckpt: Path, default: int) -> int:
    """The batch size a checkpoint was trained at (``default``, the old ``auto``, for a checkpoint without it)."""
    try:
        state = torch.load(ckpt, map_location="cpu", weights_only=False, mmap=True)
    except Exception:  # noqa: BLE001 - a damaged last.ckpt: _check_last says so and picks what to resume
        return default
    return int(state.get("hyper_parameters", {}).get("batch_size") or default)


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


@dataclass
class TrainResult:
    out_dir: Path
    model_dir: Path
    best_checkpoint: str | None
    best_val_recall1: float | None
    counts: dict[str, Any]
    n_params: dict[str, int]
    global_step: int
    losses: list[float] = field(default_factory=list, repr=False)


class _DiesWithParent(pl.Callback):
    """In a process Lightning spawned (``ddp_spawn``; not the one that built the Trainer): die with that one,
    so kill -9 of ``gdr train`` / ``gdr run`` leaves no trainer behind (:func:`gdr.guard.die_with_parent`)."""

    def __init__(self) -> None:
        self.parent = os.getpid()

    def setup(self, trainer, pl_module, stage: str) -> None:
        if os.getpid() != self.parent:
            from gdr.guard import die_with_parent

            die_with_parent(self.parent)


class _StopOnSignal(pl.Callback):
    """SIGTERM / SIGINT during training (:func:`gdr.signals.deferred`): write ``last.ckpt`` at the end of the
    current batch, then stop with :class:`gdr.signals.Stopped`; during validation, stop at the batch end
    (the last checkpoint stands). Only the process that built the Trainer saves."""

    def __init__(self, last: Path) -> None:
        self.last = last
        self.parent = os.getpid()

    def on_train_start(self, trainer, pl_module):
        from gdr import signals

        signals.reclaim()  # Lightning's SIGTERM handler (set after on_fit_start) would stop without a checkpoint

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        from gdr import signals

        signum = signals.take() if os.getpid() == self.parent else None
        if signum is not None:
            trainer.save_checkpoint(self.last)
            log.info("stopping on %s: resume point %s (step %d)", signals.name(signum), self.last,
                     trainer.global_step)
            raise signals.Stopped(signum)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        from gdr import signals

        signum = signals.pending()
        if signum is not None and os.getpid() == self.parent:
            raise signals.Stopped(signum)


class _AtomicCheckpointIO(pl.plugins.TorchCheckpointIO):
    """Every checkpoint is written to a temporary file in its own folder, flushed to disk, then renamed: a full
    disk or a kill leaves the previous checkpoint whole, never a truncated one under a checkpoint's name
    (Lightning's own writer moves a file written in /tmp into place, which a full disk cuts short)."""

    def save_checkpoint(self, checkpoint, path, storage_options=None) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                torch.save(checkpoint, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except OSError as e:  # name the checkpoint (the line of gdr.guard.write_error_line), not the temporary file
            raise OSError(e.errno, e.strerror, str(path)) from e
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)


def _readable(path: Path) -> str | None:
    """What is wrong with a checkpoint file (truncated, not a checkpoint), or None when it loads."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
    except Exception as e:  # torch raises RuntimeError, EOFError, pickle errors ... for a damaged file
        return str(e).splitlines()[0] if str(e) else type(e).__name__
    return None if isinstance(state, dict) and "state_dict" in state else "not a Lightning checkpoint"


def _intact_best(ckpt_dir: Path, prefer: str | None = None) -> str | None:
    """The best checkpoint to export: ``prefer`` if it loads, else the newest ``best-*.ckpt`` that does."""
    found = sorted(ckpt_dir.glob("best-*.ckpt"), key=lambda p: p.stat().st_mtime, reverse=True)
    for path in ([Path(prefer)] if prefer else []) + found:
        problem = _readable(path) if path.is_file() else "missing"
        if problem is None:
            return str(path)
        log.warning("%s: damaged (%s); not used as the best checkpoint", path, problem)
    return None


def _check_last(last: Path, ckpt_dir: Path, on_damaged: str) -> str | None:
    """A damaged ``last.ckpt`` (truncated by an old writer, a copy, a full disk): one line, then the fallback
    ``trainer.resume_damaged`` names: the weights of the best checkpoint (``best``) or a fresh start
    (``fresh``). The damaged file is moved aside (``last.ckpt.damaged``). Returns the checkpoint whose weights
    to start from, or None."""
    problem = _readable(last)
    if problem is None:
        return None
    with contextlib.suppress(FileNotFoundError):  # another rank of a launched job moved it already
        last.replace(last.with_name(last.name + ".damaged"))
    best = _intact_best(ckpt_dir) if on_damaged == "best" else None
    then = (f"starting from the weights of {Path(best).name} with a fresh optimiser and step count "
            "(trainer.resume_damaged=fresh starts over instead)" if best else
            "starting over" + (" (no intact best checkpoint)" if on_damaged == "best" else ""))
    log.warning("%s is damaged (%s), moved to %s; %s", last, problem, last.name + ".damaged", then)
    return best


class _LossRecorder(pl.Callback):
    """Keeps every training loss (used by tests and written to nowhere else).

    The losses stay on the device and are copied to the host every ``flush_every`` steps and when read:
    no host synchronisation per step.
    """

    def __init__(self, flush_every: int = 1000):
        self._pending: list[torch.Tensor] = []
        self._done: list[float] = []
        self.flush_every = flush_every

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        self._pending.append(loss.detach().float())
        if len(self._pending) >= self.flush_every:
            self._flush()

    def _flush(self) -> None:
        if self._pending:
            self._done.extend(torch.stack(self._pending).cpu().tolist())
            self._pending.clear()

    @property
    def losses(self) -> list[float]:
        self._flush()
        return self._done


def _world_size(devices: Any, cuda: bool) -> int:
    """Processes Lightning will train with (an epoch's batches are split among them)."""
    if isinstance(devices, int) or str(devices).isdigit():
        n = int(devices)
        return torch.cuda.device_count() if n == -1 and cuda else max(1, n)
    if isinstance(devices, (list, tuple)):
        return max(1, len(devices))
    return max(1, torch.cuda.device_count()) if cuda and str(devices) in ("auto", "-1") else 1


def _precision(p: str | None, accelerator: str) -> str:
    if p is not None and p != "auto":
        return str(p)
    return "bf16-mixed" if _on_cuda(accelerator) and torch.cuda.is_bf16_supported() else "32-true"


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
    examples: ExampleOptions = ExampleOptions(),
    optim: OptimOptions = OptimOptions(),
    trainer_opts: TrainerOptions = TrainerOptions(),
    seed: int = 0,
    callbacks: Sequence[pl.Callback] = (),
) -> TrainResult:
    """Train a retriever mapping queries to the docids ``codes`` and export it to ``out_dir/model``.

    Parameters
    ----------
    model_config : the architecture; ``n_digits``/``max_code_len`` of 0 or None are taken from ``codes``
    doc_ids, codes : one docid per document (``read_docids``), aligned with ``doc_texts``
    train_queries, train_rel : real training queries and their relevant document indices
    gen_queries, gen_docs : generated queries and their source document indices
    optim : learning rates and warmup at ``optim.base_batch_size``; scaled to the batch size used
        (:func:`scaled_optim`)
    callbacks : extra Lightning callbacks
    """
    out = Path(out_dir)
    if len(doc_ids) != len(codes):
        raise ValueError(f"{len(doc_ids)} doc ids but {len(codes)} codes")
    t = trainer_opts
    if t.max_steps > 0 and t.min_steps > t.max_steps:
        raise ValueError(f"trainer.min_steps={t.min_steps}: must be <= trainer.max_steps={t.max_steps}: training "
                         "stops there; lower it or raise trainer.max_steps")
    if t.resume_damaged not in ("best", "fresh"):
        raise ValueError(f"trainer.resume_damaged={t.resume_damaged!r}: choose best or fresh")
    out.mkdir(parents=True, exist_ok=True)
    pl.seed_everything(seed, workers=True)
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
    ex = build_examples(
        tokenizer, len(doc_ids), doc_texts=doc_texts, train_queries=train_queries, train_rel=train_rel,
        gen_queries=gen_queries, gen_docs=gen_docs, max_query_len=cfg.max_query_len, seed=seed,
        **asdict(examples),
    )
    cuda = _on_cuda(t.accelerator)
    ckpt_dir = out / "checkpoints"
    last = ckpt_dir / "last.ckpt"
    if t.batch_size == "auto" and t.resume and last.exists():  # the batch the run started with, whatever is free now
        batch_size = _checkpoint_batch(last, GPU_BATCH if cuda else CPU_BATCH)
    else:
        batch_size = resolve_batch_size(t.batch_size, t.accelerator, config=cfg,
                                        n_train=len(ex.train) // _world_size(t.devices, cuda))
    optim = scaled_optim(optim, batch_size)
    log.info("batch size %d: lr_encoder %.3g, lr_decoder %.3g, warmup %d steps", batch_size, optim.lr_encoder,
             optim.lr_decoder, optim.warmup_steps)
    precision = _precision(t.precision, t.accelerator)
    fused = resolve_fused(optim.fused, cuda, precision)
    log.info("precision %s, %s AdamW", precision, "fused" if fused else "unfused")
    if cuda:
        torch.set_float32_matmul_precision("high")  # TF32 for what autocast leaves in float32
    dm = RetrievalDataModule(ex, trie, pad_token_id=tokenizer.pad_token_id or 0, batch_size=batch_size,
                             eval_batch_size=t.eval_batch_size, num_workers=t.num_workers, seed=seed,
                             pin_memory=cuda, length_buckets=t.length_buckets, fixed_shapes=t.compile)
    module = RetrieverModule(cfg.to_dict(), lr_encoder=optim.lr_encoder, lr_decoder=optim.lr_decoder,
                             weight_decay=optim.weight_decay, warmup_steps=optim.warmup_steps,
                             consistency_weight=optim.consistency_weight, val_beam=trainer_opts.val_beam,
                             length_penalty=trainer_opts.length_penalty, seed=seed, fused=fused, trie=trie,
                             batch_size=batch_size)
    n_params = module.model.n_params()
    log.info("retriever parameters: %s", n_params)
    if t.compile:
        module.model.compile(dynamic=False)  # in place: the state dict keeps its keys; the data's fixed widths

    has_dev = len(ex.dev) > 0
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
    ) if has_dev else None
    recorder = _LossRecorder()
    # best before last: last.ckpt then carries the best-checkpoint callback's updated state
    callbacks = [*([best_ckpt] if best_ckpt else []), last_ckpt, recorder, pl.callbacks.LearningRateMonitor(logging_interval="step"), _DiesWithParent(),
                 _StopOnSignal(ckpt_dir / "last.ckpt"), *callbacks]
    if t.enable_progress_bar and cuda:  # the bar reads the logged loss (a host sync) at each refresh
        callbacks.append(pl.callbacks.TQDMProgressBar(refresh_rate=t.log_every_n_steps))
    min_steps = t.min_steps
    if has_dev and (t.patience_steps or t.patience > 0):
        min_steps = effective_min_steps(t.min_steps, len(ex.train), batch_size, t.max_epochs, t.max_steps,
                                        world_size=_world_size(t.devices, cuda))
        if min_steps < t.min_steps:
            log.info("trainer.min_steps=%d is past half of this run's steps (trainer.max_epochs=%d at %d examples a "
                     "step): early stopping may act from step %d on", t.min_steps, t.max_epochs, batch_size, min_steps)
        patience = t.patience
        if t.patience_steps:  # steps -> checks at this batch size and validation interval
            per_check = steps_per_check(len(ex.train), batch_size, t.check_val_every_n_epoch, t.val_check_interval,
                                        world_size=_world_size(t.devices, cuda))
            patience = patience_checks(int(t.patience_steps), per_check)
            log.info("early stopping after %d steps without a better %s: %d validations of %.0f steps, "
                     "not before step %d", t.patience_steps, t.monitor, patience, per_check, min_steps)
        # checked right after each validation, never at an epoch end without one (a run stopped by max_steps
        # mid-epoch, a resumed epoch): there the metric does not exist and Lightning would stop the run with an error
        callbacks.append(pl.callbacks.EarlyStopping(monitor=t.monitor, mode="max", patience=patience,
                                                    check_on_train_epoch_end=False))
    # version=None: logs/version_N per start, so a resumed run does not overwrite the earlier metrics
    loggers: list = [pl.loggers.CSVLogger(out, name="logs")]
    if t.tensorboard:
        try:
            import tensorboard  # noqa: F401

            loggers.append(pl.loggers.TensorBoardLogger(out, name="tensorboard"))
        except ImportError:
            pass
    trainer = pl.Trainer(
        default_root_dir=out, max_epochs=t.max_epochs, max_steps=t.max_steps, min_steps=min_steps or None,
        accelerator=t.accelerator, devices=t.devices, strategy=t.strategy, precision=precision,
        gradient_clip_val=t.gradient_clip_val, check_val_every_n_epoch=t.check_val_every_n_epoch,
        val_check_interval=t.val_check_interval, limit_val_batches=t.limit_val_batches if has_dev else 0,
        log_every_n_steps=t.log_every_n_steps, callbacks=callbacks, logger=loggers,
        num_sanity_val_steps=t.num_sanity_val_steps if has_dev else 0, enable_progress_bar=t.enable_progress_bar,
        enable_model_summary=False, deterministic=False, plugins=[_AtomicCheckpointIO()],
    )
    for stray in ckpt_dir.glob(".*.tmp"):  # a checkpoint write cut short (full disk, kill): never a checkpoint
        stray.unlink()
    start = _check_last(last, ckpt_dir, t.resume_damaged) if t.resume and last.exists() else None
    if start is not None:
        module.load_state_dict(torch.load(start, map_location="cpu", weights_only=False)["state_dict"])
    ckpt_path = str(last) if (t.resume and last.exists()) else None
    if ckpt_path:
        if trainer.world_size == 1:  # skip the batches of the killed epoch already trained on (exact resume)
            dm.resume_epoch, dm.resume_skip = resume_point(last, len(ex.train), batch_size)
        else:
            log.warning("resuming under %d processes: the killed epoch is replayed from its start", trainer.world_size)
        log.info("resuming from %s (epoch %d, %d examples of it done)", ckpt_path, dm.resume_epoch, dm.resume_skip)
    from gdr import signals

    with signals.deferred():  # a signal stops at the next batch end, after writing last.ckpt (_StopOnSignal)
        trainer.fit(module, datamodule=dm, ckpt_path=ckpt_path)

    best = (best_ckpt.best_model_path or None) if best_ckpt else None
    best_score = float(best_ckpt.best_model_score) if best_ckpt and best_ckpt.best_model_score is not None else None
    if best_ckpt and best is None and not any(ckpt_dir.glob("best-*.ckpt")):
        best, best_score = _validate_at_end(trainer, module, dm, ckpt_dir, t.monitor)
    if best_ckpt:  # e.g. resumed after the last epoch: nothing new was validated; or a damaged file
        chosen = _intact_best(ckpt_dir, best)
        if chosen != best:
            best, best_score = chosen, None
        keep = Path(best).resolve() if best else None  # Lightning resolves its dirpath; out_dir may be relative
        for other in ckpt_dir.glob("best-*.ckpt") if trainer.is_global_zero else ():
            if other.resolve() != keep:  # an earlier run's best, or one a failed write left: not this run's
                other.unlink()
    global_step = int(trainer.global_step)
    if trainer.is_global_zero:
        if best:
            ckpt = torch.load(best, map_location="cpu", weights_only=False)
            module.load_state_dict(ckpt["state_dict"])
            if best_score is None:  # ddp_spawn hands back only the path: read the score from the checkpoint
                scores = [v.get("best_model_score") for k, v in ckpt.get("callbacks", {}).items()
                          if "ModelCheckpoint" in str(k) and isinstance(v, dict)]
                best_score = next((float(x) for x in scores if x is not None), None)
        if global_step == 0 and last.exists():  # likewise the step count: the last checkpoint has it
            global_step = int(torch.load(last, map_location="cpu", weights_only=False).get("global_step", 0))
        model_dir = out / "model"
        module.model.cpu().save(model_dir)
        tokenizer.save_pretrained(model_dir)
    return TrainResult(out, out / "model", best, best_score, dict(ex.counts), n_params,
                       global_step, recorder.losses)
