"""SIGTERM and SIGINT: a stop, never a success; one line, exit 128 + signal, a resume point where it is cheap.

A scheduler that preempts a job (SLURM sends SIGTERM, then SIGKILL after a grace period; ``sbatch
--signal=TERM@120`` sends it earlier) and a user pressing Ctrl-C both mean "stop now, I will rerun". ``gdr``'s
``main`` calls :func:`install` before a command runs; from then on either signal raises :class:`Stopped` in
the main thread, wherever it is (loading data, sampling, scoring, between stages, evaluating), so the
command unwinds through its ``finally`` blocks (locks released, workers terminated) and ``main`` prints

    gdr run: stopped by SIGTERM in stage train-gc-s0; rerun the same command to resume

and returns 143 (SIGTERM) or 130 (SIGINT). Every stage resumes on a rerun: P by shard, sampling by batch,
training from ``checkpoints/last.ckpt``. A signal whose raise Python dropped (it came while a ``__del__`` or a
weakref callback ran) is raised at the next :func:`check`, which the long loops call at each step.

Training is the one place where stopping at an arbitrary bytecode would waste work: inside
:func:`deferred` (``gdr.training.train`` wraps the fit in it) a signal is only recorded, and the trainer's
callback (:func:`pending`) writes ``last.ckpt`` at the end of the current batch and then raises
:class:`Stopped`. A second signal, or ``grace_s`` seconds without a batch end, stops at once.

``where`` names what is running for the message (``gdr run`` sets it to the current stage).
"""
from __future__ import annotations

import _thread
import contextlib
import signal
import threading
from typing import Iterator

__all__ = ["Stopped", "WorkerDied", "install", "reclaim", "uninstall", "received", "check", "pending", "take",
           "deferred", "stop_line", "exit_code", "set_where", "name", "SIGNALS", "BACKGROUND_THREAD", "background_busy"]

SIGNALS = (signal.SIGTERM, signal.SIGINT)
BACKGROUND_THREAD = "gdr-host-stages"  # the thread of gdr run's host stages (gdr.stages.overlap)
_state: dict = {"signum": None, "defer": 0, "where": None, "timer": None, "previous": {}}


def background_busy() -> bool:
    """A host stage still runs in :data:`BACKGROUND_THREAD` (a stop does not wait for it): the interpreter must not
    finalise under it (a daemon thread inside torch or faiss then aborts the process, ``std::terminate``), so the
    command ends with ``os._exit``, as a kill would, its files as resumable as after one."""
    return any(t.name == BACKGROUND_THREAD and t.is_alive() for t in threading.enumerate())


class Stopped(BaseException):
    """A SIGTERM or SIGINT arrived. A ``BaseException`` (like ``KeyboardInterrupt``): ``except Exception``
    blocks do not swallow it, and Lightning re-raises it after its own clean-up."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = int(signum)


class WorkerDied(RuntimeError):
    """A worker process (a training slot) ended without a word: killed (``kill -9``, the OOM killer) or crashed.
    Its work keeps its resume point, so the message says to rerun; ``gdr`` prints it as one line."""

    def __init__(self, what: str, exitcode: int | None):
        known = exitcode is not None and exitcode < 0 and -exitcode in {int(x) for x in signal.Signals}
        how = f"was killed by {name(-exitcode)}" if known else f"exited with code {exitcode}"
        hint = " (kill -9, or the kernel's out-of-memory killer)" if exitcode == -signal.SIGKILL else ""
        super().__init__(f"{what} {how}{hint} before it finished; the other jobs stopped at their resume points: "
                         "rerun the same command to continue")
        self.exitcode = exitcode


def _handler(signum: int, frame) -> None:
    first = _state["signum"] is None
    if first:
        _state["signum"] = int(signum)
    if _state["defer"] and first:
        grace = _state["defer_grace"]
        timer = threading.Timer(grace, _thread.interrupt_main, args=(int(signum),))
        timer.daemon = True
        timer.start()  # no batch end within the grace period: the handler runs again and raises
        _state["timer"] = timer
        return
    raise Stopped(_state["signum"])


def install() -> None:
    """Route SIGTERM and SIGINT to :class:`Stopped` (main thread only; elsewhere a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        return
    _state.update(signum=None, defer=0, where=None)
    for sig in SIGNALS:
        prev = signal.signal(sig, _handler)
        _state["previous"].setdefault(sig, prev)


def reclaim() -> None:
    """Route the signals to :class:`Stopped` again after a library replaced the handlers (Lightning's
    Trainer turns SIGTERM into its own exit, without a checkpoint); a no-op unless :func:`install` ran."""
    if _state["previous"] and threading.current_thread() is threading.main_thread():
        for sig in SIGNALS:
            signal.signal(sig, _handler)


def uninstall() -> None:
    """Restore the handlers :func:`install` replaced and forget a received signal."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig, prev in _state["previous"].items():
        signal.signal(sig, prev if prev is not None else signal.SIG_DFL)
    _state["previous"] = {}
    _cancel_timer()
    _state.update(signum=None, defer=0, where=None)


def _cancel_timer() -> None:
    timer = _state.get("timer")
    if timer is not None:
        timer.cancel()
        _state["timer"] = None


def received() -> int | None:
    """The signal number received since :func:`install`, or None."""
    return _state["signum"]


def check() -> None:
    """Raise :class:`Stopped` for a signal received since :func:`install` whose raise was lost (main thread, outside
    :func:`deferred`). Python drops an exception that a handler raises while the main thread runs a ``__del__`` or a
    weakref callback (it prints "Exception ignored in ..." and goes on): the handler has recorded the signal first,
    so the loops that run long (a stage, a batch of queries or documents, a training slot's finished job) call this
    at each step and stop there, not when the command ends."""
    if _state["signum"] is not None and not _state["defer"] and threading.current_thread() is threading.main_thread():
        raise Stopped(_state["signum"])


def pending() -> int | None:
    """Inside :func:`deferred`: the signal waiting for a safe point to stop at, or None."""
    return _state["signum"] if _state["defer"] else None


def take() -> int | None:
    """At a safe point inside :func:`deferred`: the pending signal, or None. With one, the grace timer is
    cancelled, since the caller stops now (after writing its resume point, which the timer must not cut)."""
    signum = pending()
    if signum is not None:
        _cancel_timer()
    return signum


@contextlib.contextmanager
def deferred(grace_s: float = 10.0) -> Iterator[None]:
    """Record a signal instead of raising it; the code inside polls :func:`pending` at safe points
    (a training batch end) and raises :class:`Stopped` itself. A second signal, or none of those
    points within ``grace_s`` seconds, raises at once."""
    _state["defer"] += 1
    _state["defer_grace"] = grace_s
    try:
        yield
    finally:
        _state["defer"] -= 1
        if not _state["defer"]:
            _cancel_timer()
    if _state["signum"] is not None:  # a signal that came while finishing the deferred block
        raise Stopped(_state["signum"])


def set_where(where: str | None) -> None:
    """What the stop line names as running (``stage train-gc-s0``); None = nothing in particular. Only the main
    thread's say counts: the signal stops the main thread, and a stage run beside it in another thread
    (:mod:`gdr.stages.overlap`) would otherwise name itself, or clear the main thread's stage when it ends."""
    if threading.current_thread() is threading.main_thread():
        _state["where"] = where


def name(signum: int) -> str:
    return signal.Signals(signum).name


def exit_code(signum: int) -> int:
    return 128 + int(signum)


def stop_line(command: str, signum: int) -> str:
    """``gdr run: stopped by SIGTERM in stage train-gc-s0; rerun the same command to resume``."""
    where = f" in {_state['where']}" if _state["where"] else ""
    return f"gdr {command}: stopped by {signal.Signals(signum).name}{where}; rerun the same command to resume"
