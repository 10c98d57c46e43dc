"""Host stages beside the device's: the stages of ``gdr run`` that no device stage waits on run in one background
worker thread while the main thread keeps the GPU busy, and are taken where their results are needed.

In ``gdr run`` (``overlap``: ``auto`` = on when the run's device is CUDA; on the CPU the host stages would only
compete with the LM and the trainer for the same cores) these are the flat clustering and its k-means baselines
(beside the generated training queries), the indexes that read P or the corpus alone (beside that sampling too;
BMI's once its generated queries exist) and BM25 (beside what follows, training included). One worker runs them one
at a time, the most urgent first (:class:`Priority`: what the next device stage waits on before what only the report
reads), so the host's cores serve one kernel at a time, as without overlap; numpy, faiss, torch and bm25s release
the GIL in their kernels, so the main thread keeps feeding the device meanwhile.

Where a result is needed the main thread takes it (:meth:`HostStages.take`), waiting for it if it has not finished:
the indexes before the retrievers train, the clustering and BM25 before the first report. The stage's record goes
into the run's list of records at the place it was started (a placeholder, :class:`Pending`, holds it until then),
so the report's stage table is the same with overlap on and off.

What a stage writes does not depend on where it ran: each stage seeds its own generators (numpy ``default_rng``,
torch ``Generator``, faiss's seed; none draws from a process-wide stream), writes only into its own folder with
atomic writes, and keeps its own ``stage.json`` (``gdr.pipeline.Pipeline.stage``); the stage keys, P, the docids and
the report's figures are the same with overlap on and off (tests/test_overlap.py).

A failure in the worker is raised in the main thread the next time it starts or takes a host stage: the original
exception (its type kept, so the command's one-line errors still apply), its message prefixed with the stage's name.
The worker goes on with the other stages it holds until then, so what finished is reused by the rerun. The main
thread stopped by an error waits for the running host stage to end (no thread writes into the run folder after
``gdr run`` returns) and drops the queued ones; stopped by a signal (:class:`gdr.signals.Stopped`) it does not wait:
the process ends and the running stage resumes on the rerun as after a kill (its ``stage.json`` says running).

Time: the main thread's clock counts a host stage only where the main thread ran it (overlap off) or waited for it;
the rest of its seconds ran beside the device stages, and the report says so (:meth:`HostStages.accounts`).
"""
from __future__ import annotations

import contextlib
import itertools
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Callable, ContextManager, Iterator

from gdr import signals

log = logging.getLogger(__name__)

__all__ = ["HostStages", "Pending", "Priority", "overlap_on"]


class Priority(IntEnum):
    """The order in which the worker takes the stages it holds: lowest first, then in the order they came."""

    INDEX = 0  # the retrievers wait on every index
    CLUSTER = 1  # the report alone reads it
    BM25 = 2  # the report alone reads it, and it is the shortest


def overlap_on(setting: Any, device_kind: str) -> bool:
    """Whether host stages run beside the device stages: ``overlap`` as set (``true`` / ``false``), or with ``auto``
    when the run's device is CUDA."""
    if isinstance(setting, bool):
        return setting
    return device_kind == "cuda"


@dataclass(eq=False)
class Pending:
    """A host stage's place in the run's list of records while it runs in the background (nothing reads the list
    before :meth:`HostStages.take_all`; a reader that does meets this rather than a record with made-up figures)."""

    name: str


@dataclass(eq=False)
class _Task:
    name: str
    job: Callable[[], Any]
    slot: Pending
    done: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    error: BaseException | None = None
    seconds: float = 0.0  # its wall time in the worker (or inline)
    waited: float = 0.0  # the main thread's wait for it
    inline: bool = False
    taken: bool = False
    started: bool = False  # the worker has taken it up
    cancelled: bool = False  # dropped before it started


class HostStages:
    """Host stages started now and taken later: run by one background worker thread when ``enabled``, else at once
    in the calling thread (the order and the results are the same; only the time differs).

    ``records``: the run's list of stage records (each host stage's record is put at the place it was started);
    ``part``: the main thread's clock part for time spent on a stage (``RunClock.part("stages")``), around a stage
    run inline and a wait for one."""

    def __init__(self, records: list, enabled: bool, part: Callable[[], ContextManager] = contextlib.nullcontext):
        self.records, self.enabled, self._part = records, enabled, part
        self._tasks: dict[str, _Task] = {}
        self._queue: queue.PriorityQueue = queue.PriorityQueue()
        self._order = itertools.count()
        self._lock = threading.Lock()  # the tasks' state, shared by the worker and the main thread
        self._worker: threading.Thread | None = None
        self._closed = False
        self._current: str | None = None  # the stage the worker runs now, named in its log lines

    # ------------------------------------------------------------------ the main thread
    def start(self, name: str, job: Callable[[], Any] | None, priority: int) -> None:
        """Start the host stage ``name`` (``job`` runs it and returns its record; None: this run leaves it out)."""
        self.check()
        if job is None:
            return
        if name in self._tasks:
            raise ValueError(f"host stage {name} started twice in one run")
        task = _Task(name, job, Pending(name))
        self.records.append(task.slot)
        self._tasks[name] = task
        if not self.enabled:
            task.inline = True
            with self._part():
                self._run(task)
            self._raise(task)
            self._place(task, task.result)
            task.taken = True
            return
        if self._worker is None:
            self._worker = threading.Thread(target=self._work, name=signals.BACKGROUND_THREAD, daemon=True)
            self._worker.start()
        log.info("stage %s: started in the background, beside the device stages", name)
        self._queue.put((int(priority), next(self._order), task))

    def take(self, name: str) -> Any:
        """The record of the host stage ``name``, once it has finished (waited for here if not); None when no such
        stage was started. Raises the stage's error (or that of another host stage that failed meanwhile)."""
        task = self._tasks.get(name)
        if task is None:
            self.check()
            return None
        if not task.done.is_set():
            log.info("stage %s: waiting for it (running in the background)", name)
            t0 = time.perf_counter()
            with self._part():
                task.done.wait()
            task.waited += time.perf_counter() - t0
        self._raise(task)
        self.check()
        if not task.taken:
            self._place(task, task.result)
            task.taken = True
        return task.result

    def take_all(self) -> None:
        """Every host stage started, taken (in the order they were started)."""
        for name in list(self._tasks):
            self.take(name)

    def check(self) -> None:
        """Raise the error of a host stage that failed, if one did."""
        with self._lock:
            failed = next((t for t in self._tasks.values() if t.done.is_set() and t.error is not None), None)
        if failed is not None:
            self._raise(failed)

    def accounts(self) -> dict | None:
        """What ran beside the device stages, for the report: ``{"stages": {name: {"seconds", "waited"}},
        "seconds": their sum, "waited": the main thread's waits for them}`` over the stages that ran in the
        background and finished; None when none did (overlap off)."""
        with self._lock:
            ran = {t.name: {"seconds": round(t.seconds, 1), "waited": round(t.waited, 1)}
                   for t in self._tasks.values()
                   if not t.inline and not t.cancelled and t.done.is_set() and t.error is None}
        if not ran:
            return None
        return {"stages": ran, "seconds": round(sum(r["seconds"] for r in ran.values()), 1),
                "waited": round(sum(r["waited"] for r in ran.values()), 1)}

    def summary(self) -> str | None:
        """The log's line on what overlapped (None: nothing did)."""
        a = self.accounts()
        if a is None:
            return None
        each = ", ".join(f"{n} {r['seconds']:.1f} s" for n, r in a["stages"].items())
        return (f"overlap: {each} ran in the background beside the device stages ({a['seconds']:.1f} s; the run "
                f"waited {a['waited']:.1f} s of it)")

    @contextlib.contextmanager
    def running(self) -> Iterator[HostStages]:
        """The host stages' lifetime: at the end every one is taken (its error raised); on an error in the main
        thread the queued ones are dropped and the running one is waited for (not on a signal, see the module)."""
        previous = logging.getLogRecordFactory()

        def named(*args, **kwargs) -> logging.LogRecord:  # the worker's log lines name its stage
            record = previous(*args, **kwargs)
            where = self._current
            if where is not None and self._worker is not None and record.thread == self._worker.ident \
                    and not str(record.msg).startswith(f"stage {where}"):
                record.msg = f"stage {where} (background): {record.msg}"
            return record

        logging.setLogRecordFactory(named)
        try:
            yield self
            self.take_all()
        except signals.Stopped:
            self._close(wait=False)
            raise
        except BaseException:
            self._close(wait=True)
            raise
        finally:
            logging.setLogRecordFactory(previous)
        self._close(wait=True)
        line = self.summary()
        if line:
            log.info("%s", line)

    # ------------------------------------------------------------------ the worker
    def _work(self) -> None:
        while True:
            _, _, task = self._queue.get()
            if task is None:
                return
            with self._lock:
                cancelled = task.cancelled
                task.started = not cancelled
            if cancelled:
                task.done.set()
                continue
            self._current = task.name
            try:
                self._run(task)
            finally:
                self._current = None

    def _run(self, task: _Task) -> None:
        t0 = time.perf_counter()
        try:
            result = task.job()
        except BaseException as e:  # raised in the main thread (check, take)
            with self._lock:
                task.error = e
        else:
            with self._lock:
                task.result = result
        finally:
            with self._lock:
                task.seconds = time.perf_counter() - t0
            task.done.set()

    def _close(self, wait: bool) -> None:
        if self._closed:
            return
        self._closed = True
        with self._lock:
            for t in self._tasks.values():
                if not t.started and not t.inline:
                    t.cancelled = True  # queued ones are dropped; the running one ends on its own
                    t.done.set()
        if self._worker is None:
            return
        self._queue.put((-1, -1, None))  # ahead of everything queued: the worker ends after its current stage
        if wait:
            self._worker.join()
        for t in self._tasks.values():  # the records hold what finished, and no placeholder
            if not t.taken and t.done.is_set() and t.error is None and not t.cancelled:
                self._place(t, t.result)
                t.taken = True
            elif not t.taken and (t.cancelled or t.error is not None or not wait):
                self._place(t, None)

    def _place(self, task: _Task, record: Any) -> None:
        """The task's placeholder in the records replaced by its record (or removed: None)."""
        i = next((i for i, r in enumerate(self.records) if r is task.slot), None)
        if i is None:
            return
        if record is None:
            del self.records[i]
        else:
            self.records[i] = record

    def _raise(self, task: _Task) -> None:
        e = task.error
        if e is None:
            return
        if not task.taken:
            task.taken = True
            self._place(task, None)
            if task.inline:
                raise e
            log.error("stage %s failed in the background: %s: %s", task.name, type(e).__name__, e)
            if len(e.args) == 1 and isinstance(e.args[0], str):  # the one-line error names the stage
                e.args = (f"stage {task.name} (run in the background): {e.args[0]}",)
            e.add_note(f"raised by the host stage {task.name}, run in the background beside the device stages")
        raise e
