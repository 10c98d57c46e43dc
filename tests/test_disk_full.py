"""A full disk while writing an artifact: one line naming the file and the space it needs, exit 2, and nothing
truncated left under an artifact's name (gdr.io's atomic writers, the checkpoint writer)."""
from __future__ import annotations

import errno
import os
import re

import pytest

from gdr import guard
from gdr.io import NoSpace, atomic_write_text


class _FullAfter:
    """A file object whose writes fail with ENOSPC once ``room`` bytes are written (a disk filling up)."""

    def __init__(self, f, room: int):
        self.f, self.room = f, room

    def write(self, b):
        if len(b) > self.room:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.room -= len(b)
        return self.f.write(b)

    def __getattr__(self, name):
        return getattr(self.f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()


def fill_disk_for(monkeypatch, marker: str, room: int = 4096) -> None:
    """Every file opened by ``os.fdopen`` whose path holds ``marker`` fails after ``room`` bytes."""
    real = os.fdopen

    def fdopen(fd, *args, **kwargs):
        f = real(fd, *args, **kwargs)
        return _FullAfter(f, room) if marker in os.readlink(f"/proc/self/fd/{fd}") else f

    monkeypatch.setattr(os, "fdopen", fdopen)


def test_an_atomic_write_on_a_full_disk_names_the_file_and_the_space_and_keeps_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "docids.tsv"
    path.write_text("old\n")
    with monkeypatch.context() as m:
        fill_disk_for(m, "docids.tsv", room=10)
        with pytest.raises(NoSpace) as err:
            atomic_write_text(path, "d1\t0-1\n" * 1000)
    assert err.value.filename == str(path) and err.value.needed == 7000 and err.value.errno == errno.ENOSPC
    assert path.read_text() == "old\n" and sorted(p.name for p in tmp_path.iterdir()) == ["docids.tsv"]
    line = guard.write_error_line(err.value, "index")
    assert re.fullmatch(rf"cannot write {re.escape(str(path))} \(no space left on the device: it needs 6.8 KiB, "
                        r"[\d.]+ (bytes|KiB|MiB|GiB) free\); free space on that disk or choose another out= on a disk "
                        r"with room, then rerun the same command to resume", line), line


def test_a_p_matrix_the_disk_cannot_hold_names_its_file_and_size(monkeypatch, tmp_path):
    """P.npy's blocks are reserved before scoring starts: a disk that cannot hold them stops the stage at once with
    the file and the bytes it needs (not a SIGBUS or a traceback mid-run)."""
    import numpy as np

    from gdr import store

    path = tmp_path / "P.npy"
    np.lib.format.open_memmap(path, mode="w+", dtype="float32", shape=(300, 100)).flush()

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    with pytest.raises(NoSpace) as err:
        store._reserve(path)
    assert err.value.filename == str(path) and err.value.needed == path.stat().st_size > 300 * 100 * 4
    line = guard.write_error_line(err.value, "score")
    assert line.startswith(f"cannot write {path} (no space left on the device: it needs 117.3 KiB"), line
