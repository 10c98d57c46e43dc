"""Fine-tune a query generator (DSI-QG / NCI style): teach an LM to write queries for documents.

``fine_tune_qg(...)`` trains any model :class:`gdr.lm.GenerativeLM` can score with (causal, e.g. the
bundled ``smollm2-135m``, or seq2seq, e.g. T5 by hub id or path) on (document, query) pairs, with the
exact input format it will be sampled and scored with: the prompt tokens of ``GenerativeLM.prompt_ids``
followed by the query tokens of ``GenerativeLM.query_ids`` (query + end-of-sequence), cross-entropy on
the query tokens only. So the loss is -log p(query | doc) of Eq. (1) divided by the query's length, and
the exported model scores P with the same prompt it was trained with.

Run folder layout (``gdr qg``)::

    out_dir/
      pairs.manifest.json       where the pairs came from, counts, the train/dev split by document
      model/                    save_pretrained() checkpoint + tokenizer + gdr_generator.json (the prompt)
      checkpoints/last.ckpt     resume point; checkpoints/best-*.ckpt lowest dev loss
      logs/metrics.csv          one file across resumptions (gdr.training.callbacks.TrainingCSVLogger)
      qg.manifest.json          dev loss before and after, steps, seconds

The dev part is held out **by document** (a seeded hash of the doc id, :func:`gdr.data.titles.split_of`),
so no document is seen in training and dev. ``model.name=out_dir/model`` then works in every command.
"""
from __future__ import annotations

import json
import logging
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import pytorch_lightning as pl
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset

from gdr.data.titles import split_of
from gdr.io import atomic_write_text
from gdr.lm import GENERATOR_FILE
from gdr.lm.precision import rotary_buffers, set_buffers
from gdr.logs import on_terminal
from gdr.models import save_pretrained_atomic
from gdr.training.callbacks import TrainingCSVLogger
from gdr.training.checkpoints import checkpoint_step
from gdr.training.data import ResumeSampler, TokenStore, pad_batch, resume_point
from gdr.training.module import linear_warmup_decay
from gdr.training.options import QGDevSplit, QGOptions
from gdr.training.train import trainer_precision

log = logging.getLogger(__name__)

__all__ = ["QGOptions", "QGResult", "QGPairs", "fine_tune_qg", "split_pairs", "export_generator", "pairs_loss"]


@dataclass
class QGPairs:
    """(document, query) training pairs: ``docs[i]`` was answered by ``queries[i]``; ``doc_ids[i]`` names it."""

    docs: list[str]
    queries: list[str]
    doc_ids: list[str]

    def __len__(self) -> int:
        return len(self.queries)

    def take(self, idx: np.ndarray) -> "QGPairs":
        return QGPairs([self.docs[i] for i in idx], [self.queries[i] for i in idx], [self.doc_ids[i] for i in idx])


@dataclass
class QGResult:
    out_dir: Path
    model_dir: Path
    dev_loss_before: float | None  # mean NLL per query token on the dev pairs, before fine-tuning
    dev_loss: float | None  # the same for the exported model (lowest dev loss seen)
    dev_nll_per_query_before: float | None  # -mean log p(query | doc), the P scale
    dev_nll_per_query: float | None
    global_step: int
    n_train: int
    n_dev: int
    n_params: dict[str, int]


def split_pairs(pairs: QGPairs, dev_fraction: float, seed: int = 0,
                dev_max: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Indices of the train and dev pairs: dev = the pairs of a seeded ``dev_fraction`` of the documents
    (hash of the doc id, so the split does not move when pairs are added), capped at ``dev_max`` pairs."""
    if not 0.0 <= dev_fraction < 1.0:
        raise ValueError(f"dev_fraction={dev_fraction}; use a number in [0, 1)")
    uniq, inv = np.unique(np.asarray(pairs.doc_ids, dtype=object).astype(str), return_inverse=True)
    where = np.asarray(split_of(uniq.tolist(), seed, (1.0 - dev_fraction, dev_fraction, 0.0)), dtype=object)
    is_dev = where[inv] == "dev"
    dev = np.flatnonzero(is_dev)
    if dev_max is not None and len(dev) > dev_max:
        # keep whole documents: the first dev documents (in hash order) until dev_max pairs
        dev = dev[:dev_max]
        is_dev[:] = False
        is_dev[dev] = True
        keep_docs = set(inv[dev].tolist())
        is_train = ~np.isin(inv, list(keep_docs)) & ~is_dev
        return np.flatnonzero(is_train), dev
    return np.flatnonzero(~is_dev), dev


class _PairData(Dataset):
    def __init__(self, prompts: TokenStore, queries: TokenStore):
        self.prompts, self.queries = prompts, queries

    def __len__(self) -> int:
        return len(self.queries)

    def __getitem__(self, i: int):
        return self.prompts[i], self.queries[i]


def _collate(pad_id: int, seq2seq: bool):
    def collate(batch):
        prompts, queries = zip(*batch)
        if seq2seq:
            src = [np.asarray(p) for p in prompts]
            tgt = [np.asarray(q) for q in queries]
        else:
            src = [np.concatenate([p, q]) for p, q in zip(prompts, queries)]
            tgt = None
        ids, mask = pad_batch(src, pad_id)
        if seq2seq:
            labels = pad_batch(tgt, -100)[0]
        else:  # loss on the query tokens (and their end-of-sequence token) only
            labels = ids.masked_fill(mask == 0, -100)
            plen = torch.tensor([len(p) for p in prompts])
            labels[torch.arange(ids.shape[1])[None, :] < plen[:, None]] = -100
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}
    return collate


class QGModule(pl.LightningModule):
    """Cross-entropy on query tokens; validation logs ``val/loss`` (per token) and ``val/nll_query``."""

    def __init__(self, model, lr: float, weight_decay: float, warmup_steps: int, seq2seq: bool):
        super().__init__()
        self.model = model
        self.seq2seq = seq2seq
        self.save_hyperparameters(ignore=["model"])
        self._val: list[torch.Tensor] = []
        # the rotary frequencies as loaded (fp32): a bf16-true / 16-true trainer casts the whole module
        self._rotary = {k: b.detach().float().clone() for k, b in rotary_buffers(model).items()}

    def _rotary_fp32(self) -> None:
        """Put the rotary frequencies back to fp32 after the trainer's cast (:mod:`gdr.lm.precision`)."""
        set_buffers(self.model, self._rotary)

    def on_fit_start(self):
        self._rotary_fp32()

    def on_validation_start(self):
        self._rotary_fp32()

    def _token_nll(self, batch) -> tuple[torch.Tensor, torch.Tensor]:
        """Summed NLL per sequence (B,) and scored tokens per sequence (B,)."""
        labels = batch["labels"]
        if self.seq2seq:
            logits = self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                labels=labels).logits
            tgt = labels
        else:
            logits = self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1]
            tgt = labels[:, 1:]
        valid = tgt != -100
        # log-softmax over the vocabulary at the scored tokens only, not at every prompt and document position (a
        # (B, L, V) float copy: 0.2 s a batch of the test's tiny model, gigabytes at 49k words); each row's values
        # and their per-sequence sums are the same
        lp = torch.zeros(tgt.shape, dtype=torch.float32, device=logits.device)
        lp[valid] = torch.log_softmax(logits[valid].float(), -1).gather(-1, tgt[valid][:, None])[:, 0]
        return -lp.sum(-1), valid.sum(-1)

    def training_step(self, batch, batch_idx):
        nll, n = self._token_nll(batch)
        loss = nll.sum() / n.sum().clamp_min(1)
        self.log("train/loss", loss, prog_bar=True, batch_size=len(n))
        return loss

    def validation_step(self, batch, batch_idx):
        nll, n = self._token_nll(batch)
        self._val.append(torch.stack([nll.sum(), n.sum().float(), torch.tensor(float(len(n)), device=nll.device)]))

    def on_validation_epoch_end(self):
        if not self._val:
            return
        s = torch.stack(self._val).sum(0)
        s = self.all_gather(s).reshape(-1, 3).sum(0) if self.trainer.world_size > 1 else s
        self._val.clear()
        self.log("val/loss", s[0] / s[1].clamp_min(1), prog_bar=True, sync_dist=False)
        self.log("val/nll_query", s[0] / s[2].clamp_min(1), sync_dist=False)

    def configure_optimizers(self):
        h = self.hparams
        decay = [p for n, p in self.model.named_parameters() if p.requires_grad and p.ndim >= 2]
        rest = [p for n, p in self.model.named_parameters() if p.requires_grad and p.ndim < 2]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": h.weight_decay},
                                 {"params": rest, "weight_decay": 0.0}], lr=h.lr)
        total = int(self.trainer.estimated_stepping_batches)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, linear_warmup_decay(h.warmup_steps, max(total, 1)))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def freeze_below(model, n_layers: int | None) -> dict[str, int]:
    """Train only the last ``n_layers`` transformer blocks (the decoder's, for seq2seq) and the norms outside
    the blocks; ``None`` trains everything. Returns trainable / total parameter counts."""
    if n_layers is not None:
        seq2seq = bool(getattr(model.config, "is_encoder_decoder", False))
        lists = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.ModuleList) and len(m) > 0
                 and (not seq2seq or "decoder" in n)]
        if not lists:
            raise ValueError(f"{type(model).__name__}: found no list of transformer blocks; use train_layers=null")
        name, blocks = max(lists, key=lambda nm: len(nm[1]))
        if not 1 <= n_layers <= len(blocks):
            raise ValueError(f"train_layers={n_layers}; the model has {len(blocks)} blocks ({name})")
        keep = tuple(f"{name}.{i}." for i in range(len(blocks) - n_layers, len(blocks)))
        in_block = f"{name}."
        for pname, p in model.named_parameters():
            outer_norm = "norm" in pname and not pname.startswith(in_block) and (not seq2seq or "decoder" in pname)
            p.requires_grad_(pname.startswith(keep) or outer_norm)
    total = sum(p.numel() for p in model.parameters())
    return {"trainable": sum(p.numel() for p in model.parameters() if p.requires_grad), "total": total}


def _stores(lm, pairs: QGPairs) -> tuple[TokenStore, TokenStore]:
    return TokenStore.from_lists(lm.prompt_ids(pairs.docs)), TokenStore.from_lists(lm.query_ids(pairs.queries))


def _dev_figures(trainer: pl.Trainer) -> tuple[float | None, float | None]:
    m = trainer.callback_metrics
    loss, per_q = m.get("val/loss"), m.get("val/nll_query")
    return (None if loss is None else float(loss)), (None if per_q is None else float(per_q))


def fine_tune_qg(out_dir: str | os.PathLike, lm, pairs: QGPairs, options: QGOptions = QGOptions(),
                 dev_fraction: float = QGDevSplit.dev_fraction, dev_max: int | None = QGDevSplit.dev_max, seed: int = 0,
                 callbacks: Sequence[pl.Callback] = ()) -> QGResult:
    """Fine-tune ``lm.model`` (a :class:`gdr.lm.GenerativeLM`) on ``pairs``; export to ``out_dir/model``.

    The export is a ``save_pretrained`` checkpoint of the lowest-dev-loss state (the last state when
    there is no dev part) with ``gdr_generator.json``: the prompt and ``max_doc_tokens`` it was trained
    with, which :class:`gdr.lm.GenerativeLM` applies whenever it loads that folder. A killed run resumes
    from ``checkpoints/last.ckpt`` with the batches an uninterrupted run would have seen next (the
    shuffle depends on seed and epoch only; the batches of the killed epoch already trained on are
    skipped), so it ends with the same weights (tested).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if len(pairs) == 0:
        raise ValueError("no training pairs; check the pair source (qg.pairs) and qg.exclude")
    pl.seed_everything(seed, workers=True)
    tr_idx, dev_idx = split_pairs(pairs, dev_fraction, seed, dev_max)
    if len(tr_idx) == 0:
        raise ValueError(f"all {len(pairs)} pairs fell in the dev part; lower qg.dev_fraction")
    o = options
    last = out / "checkpoints" / "last.ckpt"
    resume = str(last) if (o.resume and last.exists()) else None
    r_epoch, r_skip = resume_point(last, len(tr_idx), o.batch_size) if resume else (-1, 0)
    train_dl, dev_dl = _loaders(lm, pairs, tr_idx, dev_idx, o, seed, r_epoch, r_skip)
    lm.model.train()
    counts = freeze_below(lm.model, o.train_layers)
    log.info("query generator parameters: %s", counts)
    module = QGModule(lm.model, o.lr, o.weight_decay, o.warmup_steps, lm.is_seq2seq)
    best_ckpt, cbs = _checkpoints(out / "checkpoints", o, dev_dl is not None, callbacks)
    trainer = pl.Trainer(
        default_root_dir=out, max_epochs=o.max_epochs, max_steps=o.max_steps, accelerator=o.accelerator,
        devices=o.devices, strategy=o.strategy, precision=trainer_precision(o.precision, o.accelerator),
        gradient_clip_val=o.gradient_clip_val, val_check_interval=o.val_check_interval,
        limit_val_batches=1.0 if dev_dl else 0, num_sanity_val_steps=0, log_every_n_steps=o.log_every_n_steps,
        callbacks=cbs, logger=[TrainingCSVLogger(out, resume_step=checkpoint_step(last) if resume else None)],
        enable_progress_bar=o.enable_progress_bar and on_terminal(sys.stdout),  # never into a log file
        enable_model_summary=False,
    )
    state = _dev_before(trainer, module, dev_dl, out / "qg.state.json")
    if resume:
        log.info("resuming from %s (epoch %d, %d examples of it done)", resume, r_epoch, r_skip)
    trainer.fit(module, train_dataloaders=train_dl, val_dataloaders=dev_dl, ckpt_path=resume)

    _load_best(module, best_ckpt, out / "checkpoints")
    dev_loss = dev_per_q = None
    if dev_dl:  # the exported state's dev figures, measured (not read from a callback)
        trainer_eval = pl.Trainer(accelerator=o.accelerator, devices=1, logger=False, enable_progress_bar=False,
                                  precision=trainer_precision(o.precision, o.accelerator), enable_model_summary=False)
        trainer_eval.validate(module, dataloaders=dev_dl, verbose=False)
        dev_loss, dev_per_q = _dev_figures(trainer_eval)
    model_dir = out / "model"
    if trainer.is_global_zero:
        export_generator(lm, model_dir)
    step = int(trainer.global_step)
    if step == 0 and last.exists():
        step = int(torch.load(last, map_location="cpu", weights_only=False, mmap=True).get("global_step", 0))
    return QGResult(out, model_dir, state.get("dev_loss_before"), dev_loss, state.get("dev_nll_per_query_before"),
                    dev_per_q, step, len(tr_idx), len(dev_idx), counts)


def _loaders(lm, pairs: QGPairs, tr_idx: np.ndarray, dev_idx: np.ndarray, o: QGOptions, seed: int, r_epoch: int,
             r_skip: int) -> tuple[DataLoader, DataLoader | None]:
    """The training loader (seeded shuffle, resumed at epoch ``r_epoch`` past ``r_skip`` examples) and the dev
    loader (None without dev pairs)."""
    train_p = _stores(lm, pairs.take(tr_idx))
    dev_p = _stores(lm, pairs.take(dev_idx)) if len(dev_idx) else None
    coll = _collate(lm.pad_id, lm.is_seq2seq)
    train_dl = DataLoader(_PairData(*train_p), batch_size=o.batch_size,
                          sampler=ResumeSampler(len(tr_idx), seed, r_epoch, r_skip), collate_fn=coll)
    dev_dl = None
    if dev_p:
        dev_dl = DataLoader(_PairData(*dev_p), batch_size=o.eval_batch_size, shuffle=False, collate_fn=coll)
    return train_dl, dev_dl


def _checkpoints(ckpt_dir: Path, o: QGOptions, has_dev: bool, extra: Sequence[pl.Callback]
                 ) -> tuple[pl.callbacks.ModelCheckpoint | None, list[pl.Callback]]:
    """The best-dev-loss checkpoint (None without a dev part) and every callback of the run: best, ``last.ckpt``
    for resuming, ``extra``, then early stopping on the dev loss when ``o.patience`` asks for it."""
    last_ckpt = pl.callbacks.ModelCheckpoint(dirpath=ckpt_dir, filename="last", monitor=None, save_top_k=1,
                                             enable_version_counter=False,
                                             every_n_train_steps=o.checkpoint_every_n_steps, save_weights_only=False)
    best_ckpt = pl.callbacks.ModelCheckpoint(dirpath=ckpt_dir, filename="best-{step}", monitor="val/loss", mode="min",
                                             save_top_k=1, auto_insert_metric_name=False,
                                             save_weights_only=True) if has_dev else None
    cbs = [*([best_ckpt] if best_ckpt else []), last_ckpt, *extra]
    if has_dev and o.patience > 0:
        cbs.append(pl.callbacks.EarlyStopping(monitor="val/loss", mode="min", patience=o.patience))
    return best_ckpt, cbs


def _dev_before(trainer: pl.Trainer, module: QGModule, dev_dl: DataLoader | None, state_path: Path) -> dict:
    """The run's state file; on the first call with a dev part, the dev figures before fine-tuning are measured
    and written to it (a resumed run keeps those of its first call)."""
    state = json.loads(state_path.read_text()) if state_path.exists() else {}
    if dev_dl and "dev_loss_before" not in state:
        trainer.validate(module, dataloaders=dev_dl, verbose=False)
        state["dev_loss_before"], state["dev_nll_per_query_before"] = _dev_figures(trainer)
        atomic_write_text(state_path, json.dumps(state))
        log.info("dev loss before fine-tuning: %.4f per token, %.3f nats per query",
                 state["dev_loss_before"], state["dev_nll_per_query_before"])
    return state


def _load_best(module: QGModule, best_ckpt: pl.callbacks.ModelCheckpoint | None, ckpt_dir: Path) -> None:
    """Load the lowest-dev-loss weights into ``module``: the callback's best or, when the callback holds no path,
    the newest ``best-*.ckpt`` on disk; without a dev part (no callback) the last state stays."""
    best = (best_ckpt.best_model_path or None) if best_ckpt else None
    if best_ckpt and not best:
        found = sorted(ckpt_dir.glob("best-*.ckpt"), key=lambda p: p.stat().st_mtime)
        best = str(found[-1]) if found else None
    if best:
        module.load_state_dict(torch.load(best, map_location="cpu", weights_only=False)["state_dict"])


def export_generator(lm, model_dir: str | os.PathLike) -> Path:
    """``save_pretrained`` the model and tokenizer, plus the prompt it must be used with (atomic)."""
    meta = {"prompt": asdict(lm.prompt), "max_doc_tokens": lm.max_doc_tokens, "base_model": lm.name,
            "family": "seq2seq" if lm.is_seq2seq else "causal"}
    lm.model.cpu().eval()
    return save_pretrained_atomic(Path(model_dir), lm.model, lm.tokenizer, {GENERATOR_FILE: json.dumps(meta, indent=2)})


@torch.no_grad()
def pairs_loss(lm, pairs: QGPairs, batch_size: int = 32) -> dict[str, float | int]:
    """The held-out figures of ``lm`` (a :class:`gdr.lm.GenerativeLM`, with its own prompt) on ``pairs``, as
    :func:`fine_tune_qg` measures its dev part: ``loss_per_token`` (mean NLL per query token) and
    ``nll_per_query`` (-mean log p(query | doc), the P scale), with ``n_pairs``."""
    if len(pairs) == 0:
        return {"n_pairs": 0, "loss_per_token": float("nan"), "nll_per_query": float("nan")}
    module = QGModule(lm.model, 0.0, 0.0, 0, lm.is_seq2seq)
    module.eval()
    prompts, queries = _stores(lm, pairs)
    loader = DataLoader(_PairData(prompts, queries), batch_size=batch_size, shuffle=False,
                        collate_fn=_collate(lm.pad_id, lm.is_seq2seq))
    device = next(lm.model.parameters()).device
    sums = torch.zeros(2, dtype=torch.float64)
    for batch in loader:
        nll, n = module._token_nll({k: v.to(device) for k, v in batch.items()})
        sums += torch.stack([nll.sum().double().cpu(), n.sum().double().cpu()])
    return {"n_pairs": len(pairs), "loss_per_token": float(sums[0] / sums[1].clamp_min(1)),
            "nll_per_query": float(sums[0] / len(pairs))}
