"""The settings of :func:`gdr.training.train.train`: which examples, the optimiser, the Lightning trainer.

Plain dataclasses without torch, so that :mod:`gdr.stages.settings` (and ``gdr --help``) read their fields,
defaults and help without importing Lightning: ``TrainSettings``'s ``examples``, ``optim`` and ``trainer``
sections are these fields, with the few defaults ``gdr train`` and ``gdr run`` change named there; ``gdr qg``'s
``qg.train`` section is :class:`QGOptions` (:func:`gdr.training.qg.fine_tune_qg`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gdr.options import RankingOptions
from gdr.rules import same_setting, setting

__all__ = ["ExampleOptions", "OptimOptions", "TrainerOptions", "QGOptions", "QGDevSplit"]


@dataclass
class ExampleOptions:
    """Which training inputs to use (see ``gdr.training.data``)."""

    use_real: bool = setting(True, effect="result")
    use_generated: bool = setting(True, effect="result")
    doc_first: bool = setting(True, "the first `window` tokens of each document", effect="result")
    doc_windows: int = setting(2, "random `window`-token windows per document (seeded)", effect="result")
    window: int = setting(64, effect="result")
    max_doc_tokens: int = setting(2048, effect="result")
    dev_fraction: float = setting(0.1, "held out from the training queries (never the test split)", effect="result")
    dev_max: int = setting(1000, effect="result")
    dev_min: int = setting(0, "fewer real dev queries than this: held-out generated queries of training documents "
                              "(one per document, removed from training) fill the dev split up to it, so that the "
                              "checkpoint is not picked by a handful of queries (training/data.py)", effect="result")
    dev_max_share: float = setting(0.1, "... but never more than this share of the generated queries: a corpus "
                                        "without training queries (test qrels only) still trains on 90% of its "
                                        "generated ones", effect="result")
    generated_per_doc: int | None = setting(None, "use only the first N generated queries of each document "
                                                  "(null = all)", effect="result")


@dataclass
class OptimOptions:
    """AdamW settings, given at ``base_batch_size``.

    At batch size B the learning rates are multiplied by ``sqrt(B / base_batch_size)`` (``lr_scaling:
    sqrt``, the square-root rule for Adam-type optimisers) or ``B / base_batch_size`` (``linear``) or kept
    (``none``, this class's default, so that code calling :func:`gdr.training.train.train` with its own rates keeps
    them), and the warmup covers the same number of *examples*: ``warmup_steps * base_batch_size / B`` steps. At
    B = base_batch_size nothing changes (see :func:`gdr.training.train.scaled_optim`).
    """

    lr_encoder: float = setting(1e-4, effect="result")
    lr_decoder: float = setting(1e-3, effect="result")
    weight_decay: float = setting(0.01, effect="result")
    warmup_steps: int = setting(1000, effect="result")
    consistency_weight: float = setting(0.0, "NCI's consistency regulariser (two dropout views), 0 = off",
                                        effect="result")
    base_batch_size: int = setting(64, effect="result")
    lr_scaling: str = setting("none", effect="result")
    fused: bool | str = setting("auto", "fused AdamW: auto = on CUDA | true | false (true also runs on the CPU; "
                                        "clipped under bf16-mixed by the module; refused with 16-mixed + clipping)",
                                        effect="result")


@dataclass
class TrainerOptions:
    """Lightning Trainer settings. ``precision`` None or "auto" = bf16-mixed on GPU, 32 on CPU.

    ``batch_size`` "auto" = on CUDA what fits the free memory, up to 4,096, 64 on the CPU
    (:func:`gdr.training.train.resolve_batch_size`; a resumed run keeps its first batch); ``compile`` wraps the model in
    ``torch.compile`` (any device; static shapes: each batch is padded to a fixed width, its length bucket's with
    ``length_buckets``, so that an epoch traces a few graphs once); ``length_buckets`` groups each batch's examples by
    input length (``gdr.training.data.bucketed_order``), so short queries are not padded to the width of document
    windows.
    """

    max_epochs: int = setting(20, effect="resume")
    max_steps: int = setting(-1, effect="resume")
    batch_size: int | str = setting(64, "auto = on CUDA what fits the free memory (<= 4096; > 512 only with >= 16 "
                                        "steps an epoch), 64 on the CPU (with the learning rates scaled, above)",
                                        effect="result")
    eval_batch_size: int = setting(32, effect="resume")
    accelerator: str = setting("auto", "auto | cpu | gpu (= cuda; refused before anything loads where CUDA is "
                                       "missing)", effect="resume")
    devices: Any = setting("auto", effect="resume")
    strategy: str = setting("auto", "multi-GPU: ddp (Lightning strategies only)", effect="resume")
    precision: str | None = setting(None, "null (= auto) = bf16-mixed on GPU, 32-true on CPU; bf16-mixed also runs "
                                          "on the CPU", effect="result")
    gradient_clip_val: float = setting(1.0, effect="result")
    check_val_every_n_epoch: int = setting(1, "null with an integer val_check_interval: validate every N steps "
                                              "instead (long epochs: e.g. check_val_every_n_epoch=null "
                                              "val_check_interval=2000)", effect="resume")
    val_check_interval: float | int | None = setting(None, effect="resume")
    limit_val_batches: float | int = setting(1.0, effect="resume")
    patience: int = setting(5, "EarlyStopping on `monitor`: validation checks without improvement", effect="resume")
    patience_steps: int | None = setting(None, "instead, optimiser steps without improvement (turned into checks for "
                                               "the batch size and validation interval in use, training/stopping.py); "
                                               "null = `patience` checks", effect="resume")
    min_steps: int = setting(0, "no early stop before this many steps (batch 512 and 64 train comparable amounts)",
                             effect="resume")
    monitor: str = setting("val/recall@1", "picks the exported checkpoint: val/recall@1 (NCI) | val/mrr (MRR@val_beam: "
                                           "a small dev set ties recall@1 at 0, and the first epoch would be kept)",
                                           effect="result")
    weights: str = setting("best", "the exported weights: best = the checkpoint of the best `monitor` on the dev split "
                                   "(NCI's ckpt_monitor) | final = the weights of the last step (a fixed budget, the "
                                   "learning rate decayed to 0 there; the dev split only draws the learning curve)",
                           effect="result")
    val_beam: int = setting(10, effect="result")
    length_penalty: float = same_setting(RankingOptions, "length_penalty", "the dev beam search's length penalty")
    num_workers: int = setting(0, effect="speed")
    log_every_n_steps: int = setting(50, effect="speed")
    checkpoint_every_n_steps: int | None = setting(None, "also write last.ckpt every n steps (long epochs)",
                                                   effect="resume")
    checkpoint_every_n_epochs: int = setting(1, "last.ckpt (the resume point, with optimiser state) every n epochs",
                                             effect="resume")
    num_sanity_val_steps: int = setting(2, effect="resume")
    tensorboard: bool = setting(True, "when tensorboard is installed", effect="speed")
    resume: bool = setting(True, "restart from out_dir/checkpoints/last.ckpt if it exists (and it trained on the same "
                                 "inputs and settings; another training in out_dir is refused: resume=false starts "
                                 "over)", effect="resume")
    resume_damaged: str = setting("best", "a damaged last.ckpt (moved aside, with a line): best = start from the best "
                                          "checkpoint's weights (fresh optimiser and step count) | fresh = start over",
                                          effect="speed")
    enable_progress_bar: bool = setting(True, "Lightning's bar, on a terminal only (never into a log file); on CUDA it "
                                              "refreshes every log_every_n_steps (each refresh syncs)", effect="speed")
    compile: bool = setting(False, "torch.compile the retriever's training step (static shapes: each batch padded to a "
                                   "fixed width, its length bucket's with length_buckets; a few graphs, traced once)",
                                   effect="resume")
    length_buckets: bool = setting(False, "batches grouped by input length (seeded): short queries are not padded to "
                                          "the width of document windows (training/data.py: bucketed_order)",
                                          effect="result")


@dataclass
class QGDevSplit:
    """The dev part of :func:`gdr.training.qg.fine_tune_qg`'s pairs (``gdr qg``'s ``qg.dev_fraction``,
    ``qg.dev_max``)."""

    dev_fraction: float = setting(0.05, "documents held out (by a seeded hash of the doc id); their pairs give the "
                                        "dev loss")
    dev_max: int = setting(500, "at most this many dev pairs")


@dataclass
class QGOptions:
    """Optimiser and trainer settings of :func:`gdr.training.qg.fine_tune_qg` (``gdr qg``'s ``qg.train``)."""

    # N: the last N blocks (of the decoder) and the final norm, embeddings frozen: backward stops at the first
    # trained block (about 2x faster on CPU)
    train_layers: int | None = setting(None, "null = every weight; N = only the last N blocks (+ final norm): faster "
                                             "on CPU")
    lr: float = setting(5e-5)
    weight_decay: float = setting(0.0)
    warmup_steps: int = setting(20)
    batch_size: int = setting(16)
    eval_batch_size: int = same_setting(TrainerOptions, "eval_batch_size")
    max_epochs: int = setting(1)
    max_steps: int = same_setting(TrainerOptions, "max_steps", "> 0: stop after this many optimiser steps")
    val_check_interval: float | int | None = setting(None, "null = once per epoch; an integer = every that many steps")
    patience: int = setting(0, "> 0: early stop on the dev loss after that many validations without gain")
    gradient_clip_val: float = same_setting(TrainerOptions, "gradient_clip_val")
    accelerator: str = same_setting(TrainerOptions, "accelerator", "")
    devices: Any = same_setting(TrainerOptions, "devices")
    strategy: str = same_setting(TrainerOptions, "strategy", "")
    precision: str | None = setting(None, "null = bf16-mixed on a GPU, 32-true on CPU")
    log_every_n_steps: int = setting(10, effect="speed")
    checkpoint_every_n_steps: int | None = setting(50)
    resume: bool = same_setting(TrainerOptions, "resume", "restart from out/checkpoints/last.ckpt if it exists")
    enable_progress_bar: bool = same_setting(TrainerOptions, "enable_progress_bar")
