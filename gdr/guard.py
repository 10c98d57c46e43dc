"""Output guards: one writer per folder, out folders checked before work, children that die with their parent.

* :func:`claim_out` is what every command calls right after validating its config (before any data or
  model loads): it checks the out folder (creates it, refuses a regular file, test-writes a probe file so
  an unwritable folder or a full disk is found now, not after an hour of scoring) and locks it for this
  process. The lock is an advisory ``fcntl.flock`` on ``<folder>/.gdr.lock``, which holds the holder's PID
  and command; the kernel drops it when the holder exits, however it exits (kill -9 leaves no stale
  lock). A second process gets :class:`FolderBusy`: one line naming the folder and the holder.
  The locks are per process and re-entrant: ``gdr run`` locks its run folder and each stage folder it
  builds; a stage re-entering a folder its own process holds is fine.
* Spawned workers of the same job are not locked out: ``score.processes`` workers never call
  :func:`claim_out` (the parent holds the lock), and with a launcher that starts every rank as a copy of
  the command (``torchrun``, Lightning's ``ddp``) only rank 0 (``RANK``, else ``LOCAL_RANK``, unset or
  0) takes the lock; the other ranks trust it. One job = one lock, held by its first process.
* :func:`die_with_parent` makes a spawned worker exit when its parent dies (``PR_SET_PDEATHSIG`` on
  Linux, else a thread that watches ``os.getppid()``), so kill -9 of ``gdr`` leaves no writer behind.
  Users: the ``score.processes`` workers, Lightning ``ddp_spawn`` workers (a callback in
  :mod:`gdr.training.train`), and ranks started by ``torchrun`` or Lightning ``ddp`` (:func:`claim_out`). The
  multiprocessing resource tracker exits by itself once the parent and the workers are gone (its pipe
  closes), and DataLoader workers have torch's own parent watchdog (``os.getppid()``, every 5 s); they
  write no files.
* A folder made by a claim and left holding only its lock (the command was refused after the claim) is
  removed when the lock is released, so a refused run leaves no empty ``out=`` folder behind.
* :func:`replace_together` writes a set of files (``report.md``, ``report.png``, ``report.json``) to
  temporary names first and renames them only when all are written, the JSON last, so a failed write
  leaves the old set whole.
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import shlex
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

__all__ = ["OutputError", "FolderBusy", "claim_out", "claim_folder", "check_out_folder", "lock_folder",
           "holding", "release", "release_all", "die_with_parent", "launched_rank", "replace_together",
           "write_error_line", "OUT_OPTION"]

LOCK_FILE = ".gdr.lock"
# The option that names each command's output folder.
OUT_OPTION = {"sample": "out", "score": "out", "cluster": "out", "index": "out", "qg": "out", "run": "out",
              "train": "out_dir", "evaluate": "out_dir", "index add": "index"}
COMMAND_LINE = ""  # what the lock file names as the holder's command; set by ``gdr``'s main
_HELD: dict[Path, tuple[int, str]] = {}  # folder (resolved) -> (fd of its lock file, "option=path"), this process's
_MADE: dict[Path, list[Path]] = {}  # held folder (resolved) -> the folders claiming it created, deepest first
_NO_SPACE = {errno.ENOSPC, errno.EDQUOT}
_NO_WRITE = {errno.EACCES, errno.EPERM, errno.EROFS}


class OutputError(ValueError):
    """An output folder or file that cannot be written; one line naming the option, the path and the fix."""


class FolderBusy(OutputError):
    """Another process holds the folder's lock."""


def launched_rank() -> int:
    """This process's rank in a launcher's job (``torchrun``, Lightning ``ddp``): ``RANK``, else ``LOCAL_RANK``,
    else 0."""
    for var in ("RANK", "LOCAL_RANK"):
        v = os.environ.get(var)
        if v is not None and v.strip().lstrip("-").isdigit():
            return int(v)
    return 0


def _fix(option: str, e: OSError) -> str:
    if e.errno in _NO_SPACE:
        return f"free space on that disk or choose another {option}= on a disk with room"
    return (f"make it writable (chmod u+w; chattr -i if it is immutable) or choose another {option}=")


def _reason(e: OSError) -> str:
    return e.strerror or type(e).__name__


def check_out_folder(path: str | os.PathLike, option: str = "out") -> Path:
    """Create ``path`` if needed and test-write a probe file in it; raise :class:`OutputError` if it cannot
    hold outputs (a regular file, a file on the way, unwritable, read-only, full)."""
    p = Path(path).expanduser()
    if p.exists() and not p.is_dir():
        raise OutputError(f"{option}={path}: is a regular file, not a folder; choose another {option}= "
                          "(or move that file away)")
    blocker = next((a for a in p.parents if a.exists() and not a.is_dir()), None)
    if blocker is not None:
        raise OutputError(f"{option}={path}: {blocker} is a regular file, so the folder cannot be made there; "
                          f"choose another {option}=")
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputError(f"{option}={path}: cannot create the folder ({_reason(e)}); {_fix(option, e)}") from e
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=p, prefix=".gdr-probe-", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(b"\0" * 4096)  # one block: a full disk fails here, not after the heavy work
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        raise OutputError(f"{option}={path}: cannot write into the folder ({_reason(e)}); {_fix(option, e)}") from e
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
    return p


def _holder(lock: Path) -> str:
    """``pid N (command)`` from a lock file; the holder writes it right after locking, so wait a moment for it."""
    for _ in range(50):
        try:
            text = lock.read_text(encoding="utf-8").strip()
        except OSError:
            text = ""
        if text:
            pid, _, cmd = text.partition(" ")
            return f"pid {pid}" + (f" ({cmd})" if cmd else "")
        time.sleep(0.01)
    return "pid unknown"


def lock_folder(path: str | os.PathLike, option: str = "out", command: str | None = None) -> Path:
    """Take this process's exclusive lock on folder ``path`` (re-entrant); :class:`FolderBusy` if another holds it."""
    p = Path(path).expanduser().resolve()
    if p in _HELD:
        return p
    lock = p / LOCK_FILE
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise OutputError(f"{option}={path}: cannot create {LOCK_FILE} ({_reason(e)}); {_fix(option, e)}") from e
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        os.close(fd)
        if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise
        raise FolderBusy(f"{option}={path}: in use by another gdr process, {_holder(lock)}; wait for it to finish, "
                         f"stop it, or choose another {option}=") from None
    command = command or COMMAND_LINE or "gdr " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()} {command}\n".encode(), 0)
    _HELD[p] = (fd, f"{option}={path}")
    return p


def claim_folder(path: str | os.PathLike, option: str = "out", command: str | None = None) -> Path:
    """:func:`check_out_folder` then :func:`lock_folder`; nothing for ranks > 0 of a launched job."""
    if launched_rank() > 0:
        return Path(path).expanduser()
    if Path(path).expanduser().resolve() in _HELD:
        return Path(path).expanduser()
    target = Path(path).expanduser().absolute()
    made = [a for a in (target, *target.parents) if not a.exists()]
    check_out_folder(path, option)
    held = lock_folder(path, option, command)
    if made:
        _MADE[held] = made
    return Path(path).expanduser()


def claim_out(command: str, cfg) -> Path | None:
    """Check and lock the out folder of ``gdr <command>`` (its option from :data:`OUT_OPTION`).

    Called right after validation, before data or models load. A process started by a launcher
    (``torchrun``, Lightning ``ddp``) also dies with its launcher (:func:`die_with_parent`)."""
    if os.environ.get("TORCHELASTIC_RUN_ID") or launched_rank() > 0:
        die_with_parent()
    option = OUT_OPTION[command]
    path = cfg.get(option) if hasattr(cfg, "get") else None
    if not path:
        return None
    return claim_folder(str(path), option, COMMAND_LINE or f"gdr {command}")


@contextlib.contextmanager
def holding(path: str | os.PathLike, option: str = "out") -> Iterator[Path]:
    """:func:`claim_folder` for the length of a stage function's work (``with holding(out): ...``), so that a
    script calling ``gdr.score(...)`` and a ``gdr score`` of the same folder exclude each other as two commands
    do. A folder this process already holds (the command's own lock, a stage folder of ``gdr run``) stays held
    afterwards; a lock taken here is released when the block ends, so the script does not keep the folder."""
    p = Path(path).expanduser()
    already = p.resolve() in _HELD or launched_rank() > 0
    claim_folder(p, option)
    try:
        yield p
    finally:
        if not already:
            release(p)


def release(path: str | os.PathLike) -> None:
    """Drop this process's lock on one folder (nothing if it holds none). A folder this process made when it
    claimed it and left holding nothing but its lock (a run refused after the claim) is removed, with the
    parent folders made for it that are empty, while the lock is still held."""
    p = Path(path).expanduser().resolve()
    held, made = _HELD.pop(p, None), _MADE.pop(p, [])
    if held is not None:
        try:
            if made and _only_lock(p):
                (p / LOCK_FILE).unlink(missing_ok=True)
                for folder in made:
                    with contextlib.suppress(OSError):  # not empty (another writer's files): kept
                        folder.rmdir()
            fcntl.flock(held[0], fcntl.LOCK_UN)
        finally:
            os.close(held[0])


def _only_lock(folder: Path) -> bool:
    try:
        return {c.name for c in folder.iterdir()} <= {LOCK_FILE}
    except OSError:  # gone already, or unreadable: nothing to tidy
        return False


def release_all() -> None:
    """Drop every lock this process holds (``gdr``'s ``main`` does, when a command returns)."""
    for p in list(_HELD):
        release(p)


# ----------------------------------------------------------------------------------- parent death
PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int | None = None, sig: int = signal.SIGKILL, poll_s: float = 1.0) -> str:
    """Make this process get ``sig`` when its parent dies; returns how (``prctl`` or ``watch``).

    Call it first thing in a spawned worker, with the parent's PID as the parent saw it (``os.getpid()``
    before the spawn): a parent that died before the call is then found too. ``PR_SET_PDEATHSIG``
    (Linux) needs nothing more; elsewhere a daemon thread checks ``os.getppid()`` every ``poll_s``."""
    parent = os.getppid() if parent_pid is None else int(parent_pid)
    how = "watch"
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0:
                how = "prctl"
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:  # the parent died before the signal was armed
        os.kill(os.getpid(), sig)
        os._exit(1)
    if how == "watch":
        def watch():
            while True:
                time.sleep(poll_s)
                if os.getppid() != parent:
                    os.kill(os.getpid(), sig)
                    os._exit(1)

        threading.Thread(target=watch, name="gdr-parent-watch", daemon=True).start()
    return how


# ----------------------------------------------------------------------------------- replacing files
def replace_together(files: dict[str | os.PathLike, Callable[[Path], None]]) -> None:
    """Write each ``path`` with ``writer(tmp_path)``, then rename every temp file into place, in order.

    Nothing is renamed until every writer has succeeded, so a failure (disk full, unwritable) leaves the
    old files as they were; put the file readers trust most (the JSON) last."""
    staged: list[tuple[str, Path]] = []
    try:
        for path, writer in files.items():
            path = Path(path)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=f".tmp{path.suffix}")
            os.close(fd)
            staged.append((tmp, path))
            writer(Path(tmp))
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
            os.chmod(tmp, 0o644)
        for tmp, path in staged:
            os.replace(tmp, path)
        staged = []
    finally:
        for tmp, _ in staged:
            if os.path.exists(tmp):
                os.unlink(tmp)


# ----------------------------------------------------------------------------------- late write errors
def write_error_line(exc: BaseException, command: str) -> str | None:
    """One line for a disk-full or permission error while writing outputs (after the early checks), else None."""
    if not isinstance(exc, OSError) or exc.errno not in _NO_SPACE | _NO_WRITE:
        return None
    option = OUT_OPTION.get(command, "out")
    # A copy or a move (shutil: Lightning's checkpoints are written to a temporary file, then moved into the
    # out folder) names the source first and the file it was writing second: that one is on the full disk.
    target = getattr(exc, "filename2", None) or exc.filename
    if exc.errno in _NO_WRITE and target and not any(
            Path(os.path.realpath(target)).is_relative_to(p) for p in _HELD):
        return f"{target}: {_reason(exc)} (an input, outside the folders this command writes); fix its permissions"
    # a failed write or flush names no file: name the folder this command writes (the first it locked)
    where = target or next((f"into {held}" for _, held in _HELD.values()), "its outputs")
    what = "no space left on the device" if exc.errno in _NO_SPACE else _reason(exc)
    needed, free = getattr(exc, "needed", None), getattr(exc, "free", None)  # gdr.io.NoSpace
    if needed is not None:
        what += f": it needs {_size(needed)}" + (f", {_size(free)} free" if free is not None else "")
    return f"cannot write {where} ({what}); {_fix(option, exc)}, then rerun the same command to resume"


def _size(n: int) -> str:
    """Bytes for a message: ``812 bytes``, ``3.4 MiB``, ``1.2 GiB``."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"
