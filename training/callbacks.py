"""Lightning callbacks of a gdr training: stop on a signal with a resume point, die with the parent process,
keep the training losses; the one ``metrics.csv`` of a training, across its resumptions."""
from __future__ import annotations

import csv
import logging
import math
import os
import time
from pathlib import Path

import pytorch_lightning as pl
import torch
from pytorch_lightning.loggers.csv_logs import ExperimentWriter

from gdr import signals
from gdr.guard import die_with_parent

log = logging.getLogger(__name__)

__all__ = ["DiesWithParent", "StopOnSignal", "LossRecorder", "ValidationLog", "validates_next", "TrainingCSVLogger",
           "learning_curve"]


class DiesWithParent(pl.Callback):
    """In a process Lightning spawned (``ddp_spawn``; not the one that built the Trainer): die with that one,
    so kill -9 of ``gdr train`` / ``gdr run`` leaves no trainer behind (:func:`gdr.guard.die_with_parent`)."""

    def __init__(self) -> None:
        self.parent = os.getpid()

    def setup(self, trainer, pl_module, stage: str) -> None:
        if os.getpid() != self.parent:
            die_with_parent(self.parent)


class StopOnSignal(pl.callbacks.Checkpoint):
    """SIGTERM / SIGINT during training (:func:`gdr.signals.deferred`): write ``last.ckpt`` at a point a rerun
    resumes from exactly as the unbroken run goes on, then stop with :class:`gdr.signals.Stopped`.

    That point is the end of the current batch, unless a validation follows that batch (or is running when the
    signal comes): then it is the end of that validation, so the resumed run neither skips it (Lightning skips a
    validation due right after a batch-end checkpoint) nor repeats it. Lightning runs checkpoint callbacks after
    all others, so this one writes after early stopping and the best checkpoint callback (which writes at the
    validation's end, never at the epoch's end: see ``gdr.training.train``) have seen the batch or the validation;
    an early stop decided there is kept in the checkpoint, as Lightning keeps no such flag. After a batch-end
    checkpoint the stop is raised at the next batch start or epoch end by :attr:`first` (a callback the Trainer
    runs before the others), once Lightning has logged the batch and before another callback logs the next:
    every row of ``metrics.csv`` is written once across the stop. Only the process that built the Trainer
    saves and stops.
    """

    def __init__(self, last: Path) -> None:
        self.last = last
        self.parent = os.getpid()
        self.signum: int | None = None
        self.saved = False
        self.trainer: pl.Trainer | None = None
        self.resumed_stopping = False
        self.first = _StopAtNextBatch(self)

    def notice(self) -> bool:
        if self.signum is None and os.getpid() == self.parent:
            self.signum = signals.take()  # cancels the grace timer: a validation may take longer than it
        return self.signum is not None

    def save(self, trainer) -> None:
        trainer.save_checkpoint(self.last)
        self.saved = True
        log.info("stopping on %s: resume point %s (step %d)", signals.name(self.signum), self.last,
                 trainer.global_step)

    def state_dict(self) -> dict:
        # a stop decided (early stopping) when the checkpoint was written: Lightning keeps no such flag in it
        return {"should_stop": bool(self.trainer is not None and self.trainer.should_stop)}

    def load_state_dict(self, state_dict: dict) -> None:
        self.resumed_stopping = bool(state_dict.get("should_stop"))

    def setup(self, trainer, pl_module, stage: str) -> None:
        self.trainer = trainer

    def on_train_start(self, trainer, pl_module):
        signals.reclaim()  # Lightning's SIGTERM handler (set after on_fit_start) would stop without a checkpoint
        if self.resumed_stopping:  # the stopped run had decided to end there: so does its resumption
            trainer.should_stop = True

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self.notice() and not self.saved and not validates_next(trainer):
            self.save(trainer)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        if trainer.state.fn != "fit" or os.getpid() != self.parent:
            return
        if trainer.sanity_checking and signals.pending() is not None:  # nothing trained yet: stop at once
            raise signals.Stopped(signals.pending())
        if not trainer.sanity_checking:
            self.notice()

    def on_validation_end(self, trainer, pl_module):
        if trainer.state.fn == "fit" and not trainer.sanity_checking and self.notice():
            if not self.saved:
                self.save(trainer)
            raise signals.Stopped(self.signum)


class _StopAtNextBatch(pl.Callback):
    """The first callback of the Trainer: raises the stop :class:`StopOnSignal` saved for at a batch end."""

    def __init__(self, stop: StopOnSignal) -> None:
        self.stop = stop

    def _raise(self) -> None:
        if self.stop.saved:
            raise signals.Stopped(self.stop.signum)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._raise()

    def on_train_epoch_end(self, trainer, pl_module):
        self._raise()


def validates_next(trainer: pl.Trainer) -> bool:
    """Whether Lightning validates right after the training batch that has just ended: its own rule, a private
    method of its epoch loop (tests/test_train_resume.py stops a training at every step and fails if it moves)."""
    loop = trainer.fit_loop.epoch_loop
    return bool(loop._should_check_val_fx(trainer.fit_loop._data_fetcher))


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


class ValidationLog(pl.Callback):
    """One INFO line per validation, so a training can be watched from its log::

        step 120 (epoch 7): train loss 0.8123, val/recall@1 0.4375 (best 0.4500), 1,234 examples/s, ETA 0:03:10

    ``examples/s`` counts the examples trained since this start (a resumed run counts from its resume point);
    the ETA is the time to the last step ``max_steps``/``max_epochs`` allow at that rate (early stopping may end
    the run sooner). ``examples_per_step``: the batch size times the processes that train.
    """

    def __init__(self, monitor: str, examples_per_step: int) -> None:
        self.monitor, self.examples_per_step = monitor, examples_per_step
        self.start: tuple[float, int] | None = None

    def on_train_start(self, trainer, pl_module):
        self.start = (time.monotonic(), trainer.global_step)

    def on_validation_end(self, trainer, pl_module):
        if trainer.sanity_checking or trainer.state.fn != "fit" or self.start is None:
            return
        metrics = trainer.callback_metrics  # one host sync per validation
        score, loss = metrics.get(self.monitor), metrics.get("train/loss")
        best = trainer.checkpoint_callback.best_model_score if trainer.checkpoint_callback else None
        if score is not None:  # this callback runs before the checkpoint callbacks take in this validation
            best = float(score) if best is None or not math.isfinite(float(best)) else max(float(best), float(score))
        step, (t0, step0) = trainer.global_step, self.start
        seconds = time.monotonic() - t0
        rate = (step - step0) / seconds if seconds > 0 else 0.0
        total = trainer.estimated_stepping_batches
        eta = (total - step) / rate if rate > 0 and math.isfinite(total) else None
        log.info("step %d (epoch %d): train loss %s, %s %s (best %s), %s examples/s, ETA %s", step,
                 trainer.current_epoch, _num(loss), self.monitor, _num(score), _num(best),
                 f"{rate * self.examples_per_step:,.0f}", _clock(eta))


def _num(x) -> str:
    return "n/a" if x is None else f"{float(x):.4f}"


def _clock(seconds: float | None) -> str:
    if seconds is None:
        return "n/a"
    s = int(round(max(seconds, 0.0)))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


class TrainingCSVLogger(pl.loggers.CSVLogger):
    """``out/logs/metrics.csv``: one file for a training however often it resumed (Lightning's CSVLogger starts a
    ``version_N`` folder per start, or deletes the file of a fixed version).

    ``resume_step``: None for a fresh start (an earlier file is replaced); else the global step of the checkpoint
    the training resumes from: the rows logged before it are kept and the new ones appended, while rows of step
    ``resume_step`` and later (logged after that checkpoint by a run killed before its next one) are dropped, as the
    resumed run logs those steps again. Given here or set before the first row is logged
    (:func:`gdr.training.train.train` sets it once it knows the checkpoint)."""

    def __init__(self, save_dir, name: str = "logs", resume_step: int | None = None) -> None:
        super().__init__(save_dir, name=name, version="")
        self.resume_step = resume_step

    @property
    def experiment(self) -> ExperimentWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _ResumedWriter(self.log_dir, self.resume_step)
        return self._experiment


class _ResumedWriter(ExperimentWriter):
    """Lightning's CSV writer, started from the rows of ``metrics.csv`` before ``resume_step`` (None: none)."""

    def __init__(self, log_dir: str, resume_step: int | None) -> None:
        self.resume_step = resume_step
        super().__init__(log_dir)

    def _check_log_dir_exists(self) -> None:  # called by the writer's __init__, in place of deleting the file
        path = Path(self.metrics_file_path)
        if not path.is_file():
            return
        if self.resume_step is None:
            path.unlink()
            return
        with path.open(newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            keys, rows = list(reader.fieldnames or []), list(reader)
        kept = [r for r in rows if not r.get("step", "").isdigit() or int(r["step"]) < self.resume_step]
        self.metrics_keys = sorted(keys)  # new columns are merged into these (the writer rewrites the header)
        if len(kept) < len(rows):
            tmp = path.with_name(f".{path.name}.tmp")
            with tmp.open("w", newline="", encoding="utf-8") as f:
                writer = csv.DictWriter(f, fieldnames=self.metrics_keys)
                writer.writeheader()
                writer.writerows(kept)
            os.replace(tmp, path)


def learning_curve(out_dir: str | os.PathLike, metric: str, steps: int | None = None) -> list[list[float]]:
    """``[[step, value], ...]`` of ``metric`` (e.g. ``val/recall@1``) from a training's ``out_dir/logs/metrics.csv``,
    one point per validation in step order, ``step`` the optimiser steps taken before it (Lightning logs a
    validation within fit under the index of the step it follows, one less). ``steps``: the steps the training
    took, which no validation comes after (a validation of the final weights after fit, which Lightning logs under
    the step count itself, is at ``steps``); a step validated twice keeps its last value; [] when the file or the
    column is missing (a training without a dev split)."""
    path = Path(out_dir) / "logs" / "metrics.csv"
    if not path.is_file():
        return []
    last = float("inf") if steps is None else int(steps)
    with path.open(newline="", encoding="utf-8") as f:
        points = {min(int(r["step"]) + 1, last): float(r[metric]) for r in csv.DictReader(f)
                  if r.get(metric) not in (None, "") and str(r.get("step", "")).isdigit()}
    return [[int(step), points[step]] for step in sorted(points)]
