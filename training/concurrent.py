"""Several retrievers trained at once on one device, one process each (:func:`run_concurrently`).

Processes sharing the device rather than one process stepping several models:

- A small retriever's step on a GPU is bound by the host (Python, Lightning's loop, kernel launches), far from
  the chip's peak. Processes run that host work on separate CPU cores while the GPU interleaves their kernels;
  one process stepping N models would serialise it.
- Each process runs the whole, unchanged training (Lightning's Trainer, checkpoints, resume, signals, seeds), so a
  retriever trained beside others takes the code path it takes alone: the same seed gives the same model (on the
  CPU exactly, at the same thread count; on CUDA within the kernels' own non-determinism). One process stepping
  several models would share one global RNG and one Lightning loop between them.
- The price: a CUDA context per process (with its workspaces, :data:`gdr.cost.CUDA_CONTEXT_BYTES` in the memory
  plan, where :func:`gdr.training.train.resolve_concurrent` decides how many fit) and a few seconds of imports per
  process.

One worker per slot (``concurrent`` of them), each training the jobs it is handed one after another: a spawn's
imports and CUDA context are paid once per slot, not once per retriever. Workers start with ``spawn`` (a forked
child cannot use CUDA once the parent did), die with their parent (:func:`gdr.guard.die_with_parent`), and hand
back each result as it finishes. A stop (SIGTERM, Ctrl-C, a failed job) sends SIGTERM to the running workers, which
write their resume point and exit. This module imports torch and gdr's ground floor only: a slot pays for the
imports of the jobs it runs, not for the training code's when its jobs do not need it.
"""
from __future__ import annotations

import logging
import multiprocessing
import os
import signal
from multiprocessing.connection import wait
from typing import Any, Callable, Sequence

import torch

from gdr import signals
from gdr.guard import die_with_parent
from gdr.logs import setup_logging

__all__ = ["run_concurrently", "slot_threads"]

_POLL_S = 1.0  # the longest the parent waits on its slots before it looks for a stop whose raise was lost


def _slot(conn, parent: int, threads: int, level: int) -> None:
    """One slot in a spawned process: it runs the jobs the parent sends, one after another, and hands back each
    result (or the exception it raised) through ``conn``; ``None`` ends it. One spawn (imports, CUDA context) per
    slot, not per job."""
    die_with_parent(parent)
    signals.install()  # SIGTERM: the training writes its resume point at the batch end, then stops
    logging.basicConfig(level=level, format=f"[pid {os.getpid()}] %(levelname)s %(name)s: %(message)s")
    setup_logging(logging.getLevelName(level))  # as quiet as the parent: no LOAD REPORT tables, Lightning's tips
    torch.set_num_threads(threads)  # a CPU matmul's sums depend on it: the parent's count on the CPU
    try:
        while (job := conn.recv()) is not None:
            try:
                result = ("ok", job())
            except BaseException as e:  # noqa: BLE001 - handed to the parent, which raises it
                result = ("error", e)
            try:
                conn.send(result)
            except Exception as e:  # noqa: BLE001 - an exception that does not pickle: its type and message
                conn.send(("error", RuntimeError(f"{type(result[1]).__name__}: {result[1]}" if result[0] == "error"
                                                 else f"the job's result could not be sent back: {e}")))
            if result[0] == "error":
                break
    except signals.Stopped:
        # the parent's stop reached this slot between jobs (its last one finished, its record on disk, before the
        # parent read the result): nothing to keep, so it ends quietly, not with a traceback in the run's log
        pass
    conn.close()


def _stop(slots: dict) -> None:
    """SIGTERM to every slot still working (each writes its resume point and exits), the end to the idle ones,
    then wait for them."""
    for conn, (proc, job) in slots.items():
        if not proc.is_alive():
            continue
        if job is None:
            try:
                conn.send(None)
            except OSError:
                pass
        else:
            os.kill(proc.pid, signal.SIGTERM)
    for proc, _ in slots.values():
        proc.join()


def slot_threads(concurrent: int, on_cuda: bool) -> int:
    """CPU threads of each of ``concurrent`` slots: on CUDA the cores shared out (their work there is the host
    loop and data), on the CPU the parent's count, which the bytes of a CPU matmul's sums depend on."""
    if not on_cuda:
        return torch.get_num_threads()
    return max(1, len(os.sched_getaffinity(0)) // max(1, concurrent))


def run_concurrently(jobs: Sequence[Callable[[], Any]], concurrent: int,
                     on_done: Callable[[int, Any], None] | None = None, threads: int | None = None) -> list:
    """Run ``jobs`` (picklable callables, e.g. :func:`functools.partial` of a module-level function) in
    ``concurrent`` slots, one spawned process each, in order of their index; returns their results in that order.
    ``on_done(i, result)`` is called in this process as each one finishes, after its slot has its next job, so it
    runs while the slots work. ``concurrent`` <= 1 runs them here, one after another. The first job that fails
    stops the others (they keep their resume points) and its exception is raised here. ``threads``: each slot's
    CPU threads (default: this process's)."""
    results: list = [None] * len(jobs)
    if concurrent <= 1 or len(jobs) <= 1:
        for i, job in enumerate(jobs):
            results[i] = job()
            if on_done is not None:
                on_done(i, results[i])
        return results
    ctx = multiprocessing.get_context("spawn")
    threads, level = threads or torch.get_num_threads(), logging.getLogger().getEffectiveLevel()
    todo = list(range(len(jobs)))
    slots: dict = {}  # connection -> (process, index of the job it runs, or None when idle)
    for _ in range(min(concurrent, len(jobs))):
        conn, child = ctx.Pipe(duplex=True)
        proc = ctx.Process(target=_slot, args=(child, os.getpid(), threads, level), daemon=False)
        proc.start()
        child.close()
        slots[conn] = (proc, None)
    try:
        finished: list[int] = []
        while True:
            signals.check()  # a stop whose raise was lost (gdr.signals): no job more is handed out
            for conn, (proc, job) in list(slots.items()):  # an idle slot takes the next job
                if job is None and todo:
                    i = todo.pop(0)
                    conn.send(jobs[i])
                    slots[conn] = (proc, i)
            for i in finished:  # each finished job's own work here, while the slots train
                if on_done is not None:
                    signals.check()
                    on_done(i, results[i])
            finished = []
            busy = [conn for conn, (_, job) in slots.items() if job is not None]
            if not busy:
                break
            for conn in wait(busy, timeout=_POLL_S):
                proc, i = slots[conn]
                try:
                    status, value = conn.recv()
                except EOFError:  # died without a word: killed, or out of memory
                    proc.join()
                    status, value = "error", signals.WorkerDied(f"the training process of job {i}", proc.exitcode)
                if status == "error":
                    raise value
                slots[conn] = (proc, None)
                results[i] = value
                finished.append(i)
    finally:
        _stop(slots)
    return results
