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
from gdr.rules import (
    NON_NEGATIVE,
    OPT_POSITIVE,
    POSITIVE,
    accelerator,
    any_value,
    auto_or,
    boolean,
    get,
    int_at_least,
    is_int,
    key_of,
    number,
    one_of,
    optional,
    precision,
    same_setting,
    setting,
    trainer_devices_at,
)

__all__ = ["ExampleOptions", "OptimOptions", "TrainerOptions", "QGOptions", "QGDevSplit", "LR_LIMIT"]

# AdamW moves each weight by about lr a step: above 1 every step overshoots, and the batch scaling of lr_scaling
# can take a huge value to inf, which fails only in training, after sampling, scoring and indexing
LR_LIMIT = "AdamW moves each weight by about lr a step: at most 1"
# the consistency regulariser's second view of a batch: the same input under another dropout mask (R-drop), or NCI's
# (NCI_model/train.sh: --aug_query 1 --aug_query_type corrupted_query --input_dropout 1) corrupted input
CONSISTENCY_VIEWS = ("dropout", "corrupted")


# The cross-field rules of the training settings: their section is ``gdr train``'s config (``trainer.*``, ``optim.*``)

def fused(v, sec):
    """``optim.fused``: auto, true or false; true cannot be clipped under 16-mixed's gradient scaler."""
    if v != "auto" and not isinstance(v, bool):
        return "must be auto, true or false"
    scaled = str(get(sec, "trainer.precision")) in ("16-mixed", "16")
    if v is True and scaled and get(sec, "trainer.gradient_clip_val"):
        return ("cannot be true with trainer.precision=16-mixed and gradient clipping (a fused AdamW unscales "
                "float16 gradients itself); use false, bf16-mixed or trainer.gradient_clip_val=null")
    return None


def consistency_view(v, sec):
    """``optim.consistency_view``: dropout or corrupted; corrupted only with the regulariser on (its second view)."""
    if v not in CONSISTENCY_VIEWS:
        return f"must be one of {', '.join(CONSISTENCY_VIEWS)}"
    weight = get(sec, "optim.consistency_weight")
    if v != "dropout" and isinstance(weight, (int, float)) and weight <= 0:
        return (f"{v} is the second view of the consistency regulariser, which optim.consistency_weight=0 turns off; "
                "set optim.consistency_weight > 0 (0.15 in NCI's train.sh) or consistency_view=dropout")
    return None


def min_steps(v, sec):
    """``trainer.min_steps``: no more than ``trainer.max_steps`` (Lightning would stop at max_steps, silently)."""
    problem = NON_NEGATIVE(v, sec)
    most = get(sec, "trainer.max_steps")
    if problem is None and is_int(most) and most > 0 and v > most:
        key = key_of(sec, "trainer.max_steps")
        return f"must be <= {key}={most}: training stops there; lower it or raise {key}"
    return problem


def final_weights(v, sec):
    """``trainer.weights``: ``final`` keeps the last step of a fixed budget, which early stopping would cut short."""
    problem = one_of("best", "final")(v, sec)
    patience, steps = get(sec, "trainer.patience"), get(sec, "trainer.patience_steps")
    if problem is None and v == "final" and (steps or (is_int(patience) and patience > 0)):
        patience_key, steps_key = key_of(sec, "trainer.patience"), key_of(sec, "trainer.patience_steps")
        on = f"{steps_key}={steps}" if steps else f"{patience_key}={patience}"
        return (f"final keeps the last step of a fixed budget (the learning rate decayed to 0 there), but early "
                f"stopping is on ({on}) and would end training before it: set {patience_key}=0 and "
                f"{steps_key}=null too, or keep weights=best")
    return problem


def steps_limit(v, sec):
    """``trainer.max_steps``: -1 (no limit) or a positive count."""
    return None if v == -1 or (is_int(v) and v > 0) else "must be -1 (no limit) or a positive integer"


@dataclass
class ExampleOptions:
    """Which training inputs to use (see ``gdr.training.data``)."""

    use_real: bool = setting(True, effect="result", rule=boolean)
    use_generated: bool = setting(True, effect="result", rule=boolean)
    doc_first: bool = setting(True, "the first `window` tokens of each document", effect="result", rule=boolean)
    doc_windows: int = setting(2, "random `window`-token windows per document (seeded)", effect="result",
                               rule=NON_NEGATIVE, rule_help="random windows per document")
    window: int = setting(64, effect="result", rule=POSITIVE, rule_help="tokens per document window")
    max_doc_tokens: int = setting(2048, effect="result", rule=POSITIVE)
    dev_fraction: float = setting(0.1, "held out from the training queries (never the test split)", effect="result",
                                  rule=number(0, 1, lo_open=False, hi_open=True),
                                  rule_help="queries held out for validation")
    dev_max: int = setting(1000, effect="result", rule=NON_NEGATIVE)
    dev_min: int = setting(0, "fewer real dev queries than this: held-out generated queries of training documents "
                              "(one per document, removed from training) fill the dev split up to it, so that the "
                              "checkpoint is not picked by a handful of queries (training/data.py)", effect="result",
                           rule=NON_NEGATIVE, rule_help="dev queries filled up with held-out generated queries")
    dev_max_share: float = setting(0.1, "... but never more than this share of the generated queries: a corpus "
                                        "without training queries (test qrels only) still trains on 90% of its "
                                        "generated ones", effect="result",
                                   rule=number(0, 1, lo_open=False),
                                   rule_help="the most generated queries held out for dev")
    generated_per_doc: int | None = setting(None, "use only the first N generated queries of each document "
                                                  "(null = all)", effect="result",
                                            rule=OPT_POSITIVE,
                                            rule_help="generated queries used per document; null = all")


@dataclass
class OptimOptions:
    """AdamW settings, given at ``base_batch_size``.

    At batch size B the learning rates are multiplied by ``sqrt(B / base_batch_size)`` (``lr_scaling:
    sqrt``, the square-root rule for Adam-type optimisers) or ``B / base_batch_size`` (``linear``) or kept
    (``none``, this class's default, so that code calling :func:`gdr.training.train.train` with its own rates keeps
    them), and the warmup covers the same number of *examples*: ``warmup_steps * base_batch_size / B`` steps. At
    B = base_batch_size nothing changes (see :func:`gdr.training.train.scaled_optim`).
    """

    lr_encoder: float = setting(1e-4, effect="result",
                                rule=number(0, 1, lo_open=False), rule_help=f"0 freezes the encoder; {LR_LIMIT}")
    lr_decoder: float = setting(1e-3, effect="result", rule=number(0, 1), rule_help=LR_LIMIT)
    weight_decay: float = setting(0.01, effect="result", rule=number(0, lo_open=False))
    warmup_steps: int = setting(1000, effect="result", rule=NON_NEGATIVE)
    consistency_weight: float = setting(0.0, "NCI's consistency regulariser (two dropout views), 0 = off",
                                        effect="result", rule=number(0, lo_open=False), rule_help="0 = off")
    consistency_view: str = setting("dropout", "the regulariser's second view: dropout = the same input (R-drop) | "
                                               "corrupted = NCI's: a random span of the input, and on half the steps "
                                               "10% of both views' tokens padded (training/module.py)",
                                    effect="result", rule=consistency_view, rule_help="dropout | corrupted")
    base_batch_size: int = setting(64, effect="result",
                                   rule=POSITIVE, rule_help="the batch size the learning rates are stated at")
    lr_scaling: str = setting("none", effect="result",
                              rule=one_of("sqrt", "linear", "none"),
                              rule_help="how learning rates follow the batch size")
    fused: bool | str = setting("auto", "fused AdamW: auto = on CUDA | true | false (true also runs on the CPU; "
                                        "clipped under bf16-mixed by the module; refused with 16-mixed + clipping)",
                                        effect="result", rule=fused, rule_help="fused AdamW; auto = on CUDA")

    @property
    def forward_passes(self) -> int:
        """Forward passes a training step makes: 2 with the consistency regulariser (R-drop's two dropout views,
        both held until the backward), else 1."""
        return 2 if self.consistency_weight > 0 else 1


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

    max_epochs: int = setting(20, effect="resume", rule=POSITIVE)
    max_steps: int = setting(-1, effect="resume", rule=steps_limit)
    batch_size: int | str = setting(64, "auto = on CUDA what fits the free memory (<= 4096; > 512 only with >= 16 "
                                        "steps an epoch), 64 on the CPU (with the learning rates scaled, above)",
                                        effect="result",
                                    rule=auto_or(POSITIVE),
                                    rule_help="auto = what fits on CUDA (<= 4096), 64 on the CPU")
    eval_batch_size: int = setting(32, effect="resume", rule=POSITIVE)
    accelerator: str = setting("auto", "auto | cpu | gpu (= cuda; refused before anything loads where CUDA is "
                                       "missing)", effect="resume",
                               rule=accelerator, rule_help="Lightning's accelerator; auto = cuda when available")
    devices: Any = setting("auto", effect="resume", rule=trainer_devices_at("trainer"), rule_help="Lightning's devices")
    strategy: str = setting("auto", "multi-GPU: ddp (Lightning strategies only)", effect="resume", rule=any_value)
    precision: str | None = setting(None, "null (= auto) = bf16-mixed on GPU, 32-true on CPU; bf16-mixed also runs "
                                          "on the CPU", effect="result",
                                    rule=precision, rule_help="Lightning's precision; null/auto = bf16-mixed on CUDA, "
                                                              "32-true on the CPU")
    gradient_clip_val: float = setting(1.0, effect="result", rule=optional(number(0, lo_open=False)))
    check_val_every_n_epoch: int = setting(1, "null with an integer val_check_interval: validate every N steps "
                                              "instead (long epochs: e.g. check_val_every_n_epoch=null "
                                              "val_check_interval=2000)", effect="resume", rule=OPT_POSITIVE)
    val_check_interval: float | int | None = setting(None, effect="resume", rule=optional(number(0)))
    limit_val_batches: float | int = setting(1.0, effect="resume", rule=number(0))
    patience: int = setting(5, "EarlyStopping on `monitor`: validation checks without improvement", effect="resume",
                            rule=NON_NEGATIVE, rule_help="validations without improvement before stopping")
    patience_steps: int | None = setting(None, "instead, optimiser steps without improvement (turned into checks for "
                                               "the batch size and validation interval in use, training/stopping.py); "
                                               "null = `patience` checks", effect="resume",
                                         rule=OPT_POSITIVE,
                                         rule_help="steps without improvement before stopping; null = `patience`")
    min_steps: int = setting(0, "no early stop before this many steps (batch 512 and 64 train comparable amounts)",
                             effect="resume", rule=min_steps, rule_help="steps before any early stop")
    monitor: str = setting("val/recall@1", "picks the exported checkpoint: val/recall@1 (NCI) | val/mrr (MRR at "
                                           "min(10, val_beam): a small dev set ties recall@1 at 0, and the first epoch "
                                           "would be kept)",
                                           effect="result",
                           rule=one_of("val/recall@1", "val/mrr"), rule_help="the dev metric that picks the checkpoint")
    weights: str = setting("best", "the exported weights: best = the checkpoint of the best `monitor` on the dev split "
                                   "(NCI's ckpt_monitor) | final = the weights of the last step (a fixed budget, with "
                                   "patience=0: the learning rate decayed to 0 there; the dev split only draws the "
                                   "learning curve)",
                           effect="result",
                           rule=final_weights,
                           rule_help="the exported weights: the best dev checkpoint or the last step's")
    val_beam: int = setting(10, effect="result", rule=POSITIVE)
    length_penalty: float = same_setting(RankingOptions, "length_penalty", "the dev beam search's length penalty")
    num_workers: int = setting(0, effect="speed", rule=NON_NEGATIVE)
    log_every_n_steps: int = setting(50, effect="speed", rule=POSITIVE)
    checkpoint_every_n_steps: int | None = setting(None, "also write last.ckpt every n steps (long epochs)",
                                                   effect="resume", rule=OPT_POSITIVE)
    checkpoint_every_n_epochs: int = setting(1, "last.ckpt (the resume point, with optimiser state) every n epochs",
                                             effect="resume", rule=POSITIVE, rule_help="epochs between resume points")
    num_sanity_val_steps: int = setting(2, effect="resume", rule=int_at_least(-1))
    tensorboard: bool = setting(True, "when tensorboard is installed", effect="speed", rule=boolean)
    resume: bool = setting(True, "restart from out_dir/checkpoints/last.ckpt if it exists (and it trained on the same "
                                 "inputs and settings; another training in out_dir is refused: resume=false starts "
                                 "over)", effect="resume", rule=boolean)
    resume_damaged: str = setting("best", "a damaged last.ckpt (moved aside, with a line): best = start from the best "
                                          "checkpoint's weights (fresh optimiser and step count) | fresh = start over",
                                          effect="speed",
                                  rule=one_of("best", "fresh"),
                                  rule_help="a damaged last.ckpt: start from the best weights or over")
    enable_progress_bar: bool = setting(True, "Lightning's bar, on a terminal only (never into a log file); on CUDA it "
                                              "refreshes every log_every_n_steps (each refresh syncs)", effect="speed",
                                        rule=boolean)
    compile: bool = setting(False, "torch.compile the retriever's training step (static shapes: each batch padded to a "
                                   "fixed width, its length bucket's with length_buckets; a few graphs, traced once)",
                                   effect="resume", rule=boolean)
    length_buckets: bool = setting(False, "batches grouped by input length (seeded): short queries are not padded to "
                                          "the width of document windows (training/data.py: bucketed_order)",
                                          effect="result", rule=boolean, rule_help="batches grouped by input length")


@dataclass
class QGDevSplit:
    """The dev part of :func:`gdr.training.qg.fine_tune_qg`'s pairs (``gdr qg``'s ``qg.dev_fraction``,
    ``qg.dev_max``)."""

    dev_fraction: float = setting(0.05, "documents held out (by a seeded hash of the doc id); their pairs give the "
                                        "dev loss", rule=number(0, 1, lo_open=False, hi_open=True),
                                  rule_help="documents held out for the dev loss")
    dev_max: int = setting(500, "at most this many dev pairs", rule=OPT_POSITIVE, rule_help="dev pairs at most")


@dataclass
class QGOptions:
    """Optimiser and trainer settings of :func:`gdr.training.qg.fine_tune_qg` (``gdr qg``'s ``qg.train``, ``gdr
    run``'s too): its rules are keyed ``qg.train.<name>``, the section's place in both commands' configs."""

    # N: the last N blocks (of the decoder) and the final norm, embeddings frozen: backward stops at the first
    # trained block (about 2x faster on CPU)
    train_layers: int | None = setting(None, "null = every weight; N = only the last N blocks (+ final norm): faster "
                                             "on CPU", rule=OPT_POSITIVE, rule_help="blocks trained; null = all")
    lr: float = setting(5e-5, rule=number(0, 1), rule_help=f"AdamW learning rate; {LR_LIMIT}")
    weight_decay: float = setting(0.0, rule=number(0, lo_open=False))
    warmup_steps: int = setting(20, rule=NON_NEGATIVE)
    batch_size: int = setting(16, rule=POSITIVE, rule_help="pairs per step")
    eval_batch_size: int = same_setting(TrainerOptions, "eval_batch_size")
    max_epochs: int = setting(1, rule=POSITIVE)
    max_steps: int = same_setting(TrainerOptions, "max_steps", "> 0: stop after this many optimiser steps",
                                  rule_help="-1 = by max_epochs")
    val_check_interval: float | int | None = setting(None, "null = once per epoch; an integer = every that many steps",
                                                     rule=optional(number(0)))
    patience: int = setting(0, "> 0: early stop on the dev loss after that many validations without gain",
                            rule=NON_NEGATIVE)
    gradient_clip_val: float = same_setting(TrainerOptions, "gradient_clip_val")
    accelerator: str = same_setting(TrainerOptions, "accelerator")
    devices: Any = same_setting(TrainerOptions, "devices", rule=trainer_devices_at("qg.train"))
    strategy: str = same_setting(TrainerOptions, "strategy")
    precision: str | None = same_setting(TrainerOptions, "precision", "null = bf16-mixed on a GPU, 32-true on CPU")
    log_every_n_steps: int = setting(10, effect="speed", rule=NON_NEGATIVE)  # 0: Lightning logs nothing
    checkpoint_every_n_steps: int | None = setting(50, rule=optional(NON_NEGATIVE),
                                                   rule_help="steps between resume points (last.ckpt); null = once "
                                                             "an epoch")
    resume: bool = same_setting(TrainerOptions, "resume", "restart from out/checkpoints/last.ckpt if it exists")
    enable_progress_bar: bool = same_setting(TrainerOptions, "enable_progress_bar")
