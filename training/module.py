"""LightningModule: cross-entropy on docid slots, validation Recall@k by constrained beam search."""
from __future__ import annotations

import logging
import math
from typing import Any

import pytorch_lightning as pl
import torch
import torch.nn.functional as F

from gdr.indexing.trie import DocidTrie
from gdr.training.model import GenerativeRetriever, RetrieverConfig
from gdr.training.options import OptimOptions, TrainerOptions
from gdr.training.search import constrained_beam_search

log = logging.getLogger(__name__)

__all__ = ["RetrieverModule", "linear_warmup_decay"]


def linear_warmup_decay(warmup_steps: int, total_steps: int):
    """LR multiplier: linear 0 -> 1 over ``warmup_steps``, then linear 1 -> 0 at ``total_steps``."""
    def f(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / max(1, warmup_steps)
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))
    return f


# NCI's corrupted query (NCI_model/main_utils.py `augment`) keeps 100 characters of the query from a uniform start:
# about 20 wordpiece tokens of English
CORRUPTED_SPAN_TOKENS = 20
# NCI's input dropout (NCI_model/main_models.py `forward`, --input_dropout 1): on half the steps, each input token of
# both views replaced by padding with this probability (its attention mask kept)
INPUT_DROPOUT = 0.1


def corrupted_view(ids: torch.Tensor, mask: torch.Tensor, pad_id: int,
                   span: int = CORRUPTED_SPAN_TOKENS) -> tuple[torch.Tensor, torch.Tensor]:
    """NCI's corrupted query in tokens: each row of ``ids`` (B, T), right-padded with ``mask`` (B, T), becomes its
    tokens from a start drawn uniformly among its own, at most ``span`` of them, moved to the front and padded; returns
    (ids, mask) of the same shape. Drawn on the device from torch's generator, which the training step seeds (a
    resumed run draws the same spans); no host sync."""
    B, T = ids.shape
    n = mask.sum(1)  # (B,) tokens a row, >= 1
    start = (torch.rand(B, device=ids.device) * n).long()  # (B,) uniform in [0, n)
    pos = torch.arange(T, device=ids.device)  # (T,)
    src = start[:, None] + pos  # (B, T) where each kept token comes from
    keep = (pos < span) & (src < n[:, None])  # (B, T)
    return ids.gather(1, src.clamp(max=T - 1)).masked_fill(~keep, pad_id), keep.to(mask.dtype)


def input_dropout(views: tuple[torch.Tensor, ...], pad_id: int, p: float = INPUT_DROPOUT) -> tuple[torch.Tensor, ...]:
    """NCI's input dropout over both views of a step: one coin for the step (heads: no change), then each token
    padded with probability ``p``. The coin is a device tensor folded into the mask, so no host sync decides it."""
    heads = torch.rand((), device=views[0].device) < 0.5
    return tuple(v.masked_fill((torch.rand(v.shape, device=v.device) < p) & ~heads, pad_id) for v in views)


VAL_K = 10  # the dev search's depth: val/recall@10, val/mrr@10 (fewer where trainer.val_beam is narrower)
VALIDATION_SEARCH = 2  # its version, in a train stage's key where val_beam < VAL_K: 2 = at val_beam itself


class RetrieverModule(pl.LightningModule):
    """Trains a :class:`~gdr.training.model.GenerativeRetriever`.

    Parameters
    ----------
    model_config : ``RetrieverConfig.to_dict()``
    lr_encoder, lr_decoder : AdamW learning rates of the encoder and of everything else (a new
        decoder learns faster than a pretrained encoder may move)
    weight_decay : AdamW weight decay on matrices (not on biases, norms, embeddings' 1-D params)
    warmup_steps : linear warmup; then linear decay to 0 at the trainer's last step
    consistency_weight : NCI's consistency regulariser (0 = off): two dropout views of each batch,
        loss = mean CE + w * symmetric KL of their slot distributions
    consistency_view : the second view: ``dropout``, the same input (R-drop); ``corrupted``, NCI's corrupted query
        and input dropout (:func:`corrupted_view`, :func:`input_dropout`)
    val_beam, val_k, length_penalty : validation beam search at ``val_beam``, scored on its top ``min(val_k,
        val_beam)`` (``val/recall@k``, ``val/mrr@k``)
    seed : dropout masks are drawn from (seed, global step, rank), so a run resumed from a
        checkpoint continues exactly as an uninterrupted one
    fused : fused AdamW (one kernel for every parameter's update); None = on CUDA only (``optim.fused: auto``).
        Gradients are then clipped by :meth:`configure_gradient_clipping` (Lightning's AMP plugin refuses to
        clip for an optimizer that unscales its own gradients, although bf16 has nothing to unscale)
    trie : the docid trie (not a hyperparameter; needed for validation)
    batch_size : examples per step, kept in the checkpoint so that a resumed ``batch_size: auto`` run keeps the
        batch it started with (read by ``gdr.training.train``; the data module does the batching)
    """

    def __init__(self, model_config: dict[str, Any], lr_encoder: float = OptimOptions.lr_encoder,
                 lr_decoder: float = OptimOptions.lr_decoder, weight_decay: float = OptimOptions.weight_decay,
                 warmup_steps: int = OptimOptions.warmup_steps,
                 consistency_weight: float = OptimOptions.consistency_weight,
                 consistency_view: str = OptimOptions.consistency_view, val_beam: int = TrainerOptions.val_beam,
                 val_k: int = VAL_K, length_penalty: float = TrainerOptions.length_penalty, seed: int = 0,
                 fused: bool | None = None, trie: DocidTrie | None = None, batch_size: int | None = None):
        super().__init__()
        self.save_hyperparameters(ignore=["trie"])
        self.model = GenerativeRetriever.build(RetrieverConfig.from_dict(dict(model_config)))
        self._pad_id = int(getattr(self.model.encoder.config, "pad_token_id", None) or 0)  # what input dropout puts
        self.trie = trie
        self._trie_dev: DocidTrie | None = None
        self._val_first: list[torch.Tensor] = []

    # ------------------------------------------------------------------ training
    def _slot_ce(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=-100)

    def _step(self, batch: dict[str, torch.Tensor], stage: str) -> torch.Tensor:
        ids, mask, labels = batch["input_ids"], batch["attention_mask"], batch["labels"]
        w = self.hparams.consistency_weight
        regularised = w > 0 and stage == "train"
        ids2, mask2 = ids, mask  # the second view: the same input under another dropout mask
        if regularised and self.hparams.consistency_view == "corrupted":
            ids2, mask2 = corrupted_view(ids, mask, self._pad_id)
            ids, ids2 = input_dropout((ids, ids2), self._pad_id)
        logits = self.model(ids, mask, labels)  # (B, T, K+1)
        loss = ce = self._slot_ce(logits, labels)
        if regularised:
            logits2 = self.model(ids2, mask2, labels)
            ce = (ce + self._slot_ce(logits2, labels)) / 2
            # the symmetric KL of the two views' slot distributions, (KL(p1||p2) + KL(p2||p1)) / 2 = sum over slots of
            # (p1 - p2)(log p1 - log p2) / 2, averaged over the docid positions that have a label: a mask, not a
            # boolean index (x[mask] reads the count on the host: a sync each step on CUDA, and its gradient another)
            valid = (labels >= 0).unsqueeze(-1)  # (B, T, 1)
            lp1 = F.log_softmax(logits.float(), -1).clamp_min(-1e4)  # (B, T, K+1)
            lp2 = F.log_softmax(logits2.float(), -1).clamp_min(-1e4)
            per_position = ((lp1.exp() - lp2.exp()) * (lp1 - lp2)).sum(-1, keepdim=True)
            kl = 0.5 * (per_position * valid).sum() / valid.sum().clamp_min(1)
            loss = ce + w * kl
            self.log(f"{stage}/kl", kl, batch_size=len(ids))
        self.log(f"{stage}/loss", loss, prog_bar=True, batch_size=len(ids))
        if w > 0:
            self.log(f"{stage}/ce", ce, batch_size=len(ids))
        return loss

    def training_step(self, batch, batch_idx):
        torch.manual_seed((self.hparams.seed * 1_000_003 + self.global_step * 1_009 + self.global_rank) % 2**63)
        return self._step(batch, "train")

    # ------------------------------------------------------------------ validation
    def _trie_on_device(self) -> DocidTrie:
        if self._trie_dev is None or self._trie_dev.child.device != self.device:
            self._trie_dev = self.trie.to(self.device)
        return self._trie_dev

    def validation_step(self, batch, batch_idx):
        if self.trie is None:
            return
        out = constrained_beam_search(self.model, batch["input_ids"], batch["attention_mask"], self._trie_on_device(),
                                      beam=self.hparams.val_beam, k=self._val_depth(),
                                      length_penalty=self.hparams.length_penalty)
        rel = batch["rel_nodes"]  # (B, R), -1 padding
        hit = (out.nodes[:, :, None] == rel[:, None, :]) & (rel[:, None, :] >= 0)  # (B, k, R)
        hit_at = hit.any(-1)  # (B, k)
        k = hit_at.shape[1]
        pos = torch.arange(1, k + 1, device=hit_at.device).expand_as(hit_at)
        first = torch.where(hit_at, pos, torch.full_like(pos, k + 1)).min(1).values  # (B,), k+1 = miss
        self._val_first.append(first)

    def _val_depth(self) -> int:
        """The dev search's results: ``val_k``, or fewer where ``val_beam`` is narrower (a beam holds no more)."""
        return min(self.hparams.val_k, self.hparams.val_beam)

    def on_validation_epoch_end(self):
        if not self._val_first:
            return
        first = torch.cat(self._val_first).float()
        self._val_first.clear()
        first = self.all_gather(first).flatten() if self.trainer.world_size > 1 else first
        k = self._val_depth()
        self.log("val/recall@1", (first <= 1).float().mean(), prog_bar=True, sync_dist=False)
        self.log(f"val/recall@{k}", (first <= k).float().mean(), sync_dist=False)
        mrr = torch.where(first <= k, 1.0 / first, torch.zeros_like(first)).mean()
        self.log(f"val/mrr@{k}", mrr, sync_dist=False)
        self.log("val/mrr", mrr, sync_dist=False)  # the same under a name that does not depend on the beam

    # ------------------------------------------------------------------ optimisation
    def configure_optimizers(self):
        hp = self.hparams
        groups: dict[tuple[bool, bool], list[torch.nn.Parameter]] = {}
        enc_ids = {id(p) for p in self.model.encoder.parameters()}
        for p in self.model.parameters():
            if p.requires_grad:
                groups.setdefault((id(p) in enc_ids, p.ndim >= 2), []).append(p)
        param_groups = [
            {"params": ps, "lr": hp.lr_encoder if is_enc else hp.lr_decoder,
             "weight_decay": hp.weight_decay if decay else 0.0}
            for (is_enc, decay), ps in sorted(groups.items())
        ]
        # fused AdamW: one kernel for every parameter's update (auto: on CUDA; the CPU keeps torch's default)
        fused = self.device.type == "cuda" if hp.get("fused") is None else bool(hp.fused)
        opt = torch.optim.AdamW(param_groups, fused=True) if fused else torch.optim.AdamW(param_groups)
        total = self.trainer.estimated_stepping_batches
        total = int(total) if math.isfinite(total) else 10 * hp.warmup_steps
        warmup = hp.warmup_steps
        if warmup >= total > 0:  # the rates would never reach lr_encoder / lr_decoder
            warmup = total // 10
            log.warning("optim.warmup_steps: %d warmup steps (at this batch size) are the whole run of %d steps or "
                        "more, so the learning rates would never reach optim.lr_encoder / lr_decoder; warming up over "
                        "the first %d steps (a tenth) instead", hp.warmup_steps, total, warmup)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, linear_warmup_decay(warmup, total))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
        """The Trainer's ``gradient_clip_val``, also for a fused AdamW under bf16-mixed.

        Lightning's AMP plugin raises for any optimizer that unscales gradients itself (``fused=True``), as a
        float16 gradient scaler would hand it scaled gradients. bf16-mixed has no scaler: the gradients here are
        the true ones, and they are clipped with torch's own norm clipping (what Lightning would do).
        """
        scaler = getattr(self.trainer.precision_plugin, "scaler", None)
        if gradient_clip_val and getattr(optimizer, "_step_supports_amp_scaling", False) and scaler is None:
            params = [p for g in optimizer.param_groups for p in g["params"]]
            if gradient_clip_algorithm == "value":  # a str enum
                torch.nn.utils.clip_grad_value_(params, gradient_clip_val)
            else:
                torch.nn.utils.clip_grad_norm_(params, gradient_clip_val)
            return
        self.clip_gradients(optimizer, gradient_clip_val=gradient_clip_val,
                            gradient_clip_algorithm=gradient_clip_algorithm)
