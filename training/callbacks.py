"""Lightning callbacks of a gdr training: stop on a signal with a resume point, die with the parent process,
keep the training losses."""
from __future__ import annotations

import logging
import os
from pathlib import Path

import pytorch_lightning as pl
import torch

from gdr import signals
from gdr.guard import die_with_parent

log = logging.getLogger(__name__)

__all__ = ["DiesWithParent", "StopOnSignal", "LossRecorder"]


class DiesWithParent(pl.Callback):
    """In a process Lightning spawned (``ddp_spawn``; not the one that built the Trainer): die with that one,
    so kill -9 of ``gdr train`` / ``gdr run`` leaves no trainer behind (:func:`gdr.guard.die_with_parent`)."""

    def __init__(self) -> None:
        self.parent = os.getpid()

    def setup(self, trainer, pl_module, stage: str) -> None:
        if os.getpid() != self.parent:
            die_with_parent(self.parent)


class StopOnSignal(pl.Callback):
    """SIGTERM / SIGINT during training (:func:`gdr.signals.deferred`): write ``last.ckpt`` at the end of the
    current batch, then stop with :class:`gdr.signals.Stopped`; during validation, stop at the batch end
    (the last checkpoint stands). Only the process that built the Trainer saves."""

    def __init__(self, last: Path) -> None:
        self.last = last
        self.parent = os.getpid()

    def on_train_start(self, trainer, pl_module):
        signals.reclaim()  # Lightning's SIGTERM handler (set after on_fit_start) would stop without a checkpoint

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        signum = signals.take() if os.getpid() == self.parent else None
        if signum is not None:
            trainer.save_checkpoint(self.last)
            log.info("stopping on %s: resume point %s (step %d)", signals.name(signum), self.last,
                     trainer.global_step)
            raise signals.Stopped(signum)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        signum = signals.pending()
        if signum is not None and os.getpid() == self.parent:
            raise signals.Stopped(signum)


class LossRecorder(pl.Callback):
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
