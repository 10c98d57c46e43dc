"""Checkpoint integrity: every checkpoint is written whole or not at all, and a damaged one is never resumed from
or exported.

``checkpoints/last.ckpt`` is the resume point, ``checkpoints/best-*.ckpt`` the weights to export. A write goes to a
temporary file beside its target and is renamed into place (:class:`AtomicCheckpointIO`), so a full disk or a kill
leaves the previous file whole; what such a write leaves behind is removed (:func:`remove_partial_writes`). A
damaged ``last.ckpt`` (a copy cut short, an older writer) is moved aside with one line and a fallback
(:func:`check_last`); a damaged best checkpoint is skipped (:func:`intact_best`).
"""
from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from pathlib import Path

import pytorch_lightning as pl
import torch

from gdr.io import no_space

log = logging.getLogger(__name__)

__all__ = ["AtomicCheckpointIO", "readable", "intact_best", "check_last", "checkpoint_batch", "checkpoint_step",
           "remove_partial_writes"]


class AtomicCheckpointIO(pl.plugins.TorchCheckpointIO):
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
        except (OSError, RuntimeError) as e:  # name the checkpoint (gdr.guard.write_error_line), not the temporary file
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)  # before the free space is read
            full = no_space(e, path, _tensor_bytes(checkpoint))  # torch's writer: a RuntimeError from the OSError
            if full is not None:
                raise full from e
            if isinstance(e, OSError):
                raise OSError(e.errno, e.strerror, str(path)) from e
            raise
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)


def _tensor_bytes(obj) -> int:
    """Bytes of the tensors in a checkpoint (nested dicts, lists): about the size of its file."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v) for v in obj)
    return 0


def remove_partial_writes(ckpt_dir: Path) -> None:
    """Delete the temporary files of checkpoint writes cut short (a full disk, a kill): never a checkpoint."""
    for stray in ckpt_dir.glob(".*.tmp"):
        stray.unlink()


def readable(path: Path) -> str | None:
    """None if ``path`` loads as a Lightning checkpoint, else what is wrong with it (one line)."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
    except Exception as e:  # torch raises RuntimeError, EOFError, pickle errors ... for a damaged file
        return str(e).splitlines()[0] if str(e) else type(e).__name__
    return None if isinstance(state, dict) and "state_dict" in state else "not a Lightning checkpoint"


def intact_best(ckpt_dir: Path, prefer: str | None = None) -> str | None:
    """The best checkpoint to export: ``prefer`` if it loads, else the newest ``best-*.ckpt`` that does."""
    found = sorted(ckpt_dir.glob("best-*.ckpt"), key=lambda p: p.stat().st_mtime, reverse=True)
    for path in ([Path(prefer)] if prefer else []) + found:
        problem = readable(path) if path.is_file() else "missing"
        if problem is None:
            return str(path)
        log.warning("%s: damaged (%s); not used as the best checkpoint", path, problem)
    return None


def check_last(last: Path, ckpt_dir: Path, on_damaged: str) -> str | None:
    """A damaged ``last.ckpt`` (truncated by an old writer, a copy, a full disk): one line, then the fallback
    ``trainer.resume_damaged`` names: the weights of the best checkpoint (``best``) or a fresh start
    (``fresh``). The damaged file is moved aside (``last.ckpt.damaged``). Returns the checkpoint whose weights
    to start from, or None."""
    problem = readable(last)
    if problem is None:
        return None
    with contextlib.suppress(FileNotFoundError):  # another rank of a launched job moved it already
        last.replace(last.with_name(last.name + ".damaged"))
    best = intact_best(ckpt_dir) if on_damaged == "best" else None
    then = (f"starting from the weights of {Path(best).name} with a fresh optimiser and step count "
            "(trainer.resume_damaged=fresh starts over instead)" if best else
            "starting over" + (" (no intact best checkpoint)" if on_damaged == "best" else ""))
    log.warning("%s is damaged (%s), moved to %s; %s", last, problem, last.name + ".damaged", then)
    return best


def checkpoint_batch(ckpt: Path, default: int) -> int:
    """The batch size a checkpoint was trained at (``default`` for a checkpoint without it)."""
    try:
        state = torch.load(ckpt, map_location="cpu", weights_only=False, mmap=True)
    except Exception:  # noqa: BLE001 - a damaged last.ckpt: check_last says so and picks what to resume
        return default
    return int(state.get("hyper_parameters", {}).get("batch_size") or default)


def checkpoint_step(ckpt: Path) -> int:
    """The global step a (readable) checkpoint was written at."""
    state = torch.load(ckpt, map_location="cpu", weights_only=False, mmap=True)
    return int(state.get("global_step", 0))
