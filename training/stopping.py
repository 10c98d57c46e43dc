"""Early stopping counted in optimiser steps, so that runs at different batch sizes train comparable amounts.

Lightning's ``EarlyStopping`` counts *validation checks* without improvement. Validated once per epoch, a
patience of 5 is 5 epochs: at batch 512 on 1,000 documents an epoch is ~13 steps, so training stopped after
~180 steps, where batch 64 would have run eight times as many. Here the patience is given in steps
(``patience_steps``) and turned into checks for the validation interval in use (every ``val_check_interval``
steps across epochs, or once per ``check_val_every_n_epoch`` epochs of ``ceil(n_train / batch)`` steps), and
a minimum number of steps (``min_steps``, Lightning's ``Trainer(min_steps=...)``) holds off any stop before it.

Lightning lets ``max_epochs`` (or ``max_steps``) win over ``min_steps``: a floor at or past the run's last step
leaves the dev metric no say, and every run trains to its cap. :func:`effective_min_steps` keeps the floor within
the first half of the run's steps, so the cap stays a cap and the dev metric decides in the second half.
"""
from __future__ import annotations

import math

from gdr.training.options import TrainerOptions

__all__ = ["steps_per_check", "patience_checks", "effective_min_steps"]


def steps_per_check(n_train: int, batch_size: int, check_val_every_n_epoch: int | None,
                    val_check_interval: float | int | None, world_size: int = 1) -> float:
    """Optimiser steps between two validations for Lightning's validation settings."""
    per_epoch = max(1, math.ceil(n_train / (batch_size * max(1, world_size))))
    if isinstance(val_check_interval, int) and not isinstance(val_check_interval, bool):
        if check_val_every_n_epoch is None:
            return float(val_check_interval)
        return float(min(val_check_interval, per_epoch))
    frac = 1.0 if val_check_interval is None else float(val_check_interval)
    return per_epoch * (frac if check_val_every_n_epoch is None else frac * check_val_every_n_epoch)


def patience_checks(patience_steps: int, per_check: float) -> int:
    """Validation checks without improvement that span ``patience_steps`` steps (at least 1)."""
    if patience_steps <= 0:
        raise ValueError(f"trainer.patience_steps={patience_steps}: give a positive number of steps, or null "
                         "to count the patience in validation checks (trainer.patience)")
    return max(1, math.ceil(patience_steps / max(per_check, 1e-9)))


def effective_min_steps(min_steps: int, n_train: int, batch_size: int, max_epochs: int,
                        max_steps: int = TrainerOptions.max_steps, world_size: int = 1) -> int:
    """``min_steps`` capped at half the steps the run may take (``max_epochs`` epochs of ``ceil(n_train / batch)``
    steps, or ``max_steps`` if fewer), so that early stopping can end the run before its cap."""
    per_epoch = max(1, math.ceil(n_train / (batch_size * max(1, world_size))))
    cap = per_epoch * max(1, max_epochs)
    if max_steps > 0:
        cap = min(cap, max_steps)
    return min(int(min_steps), cap // 2)
