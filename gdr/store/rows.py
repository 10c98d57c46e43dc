"""Read the log P matrix of a run row by row, without holding it in memory.

``P.npy`` holds log p(query | doc), float16 or float32, of shape (n_docs, n_queries) (the folder
around it: :mod:`gdr.store`).

``P.npy`` may be larger than memory. :class:`PMatrix` copies the requested rows out as float32
with explicit reads (``os.preadv`` into a bounded buffer) and never memory-maps the file (a
Fortran-ordered ``P.npy``, which ``gdr score`` never writes, is mapped for each read): the
pages of a map that a process touches count in its resident set (``ru_maxrss``) until the map
closes, and a fault maps a whole page-cache folio (up to 2 MiB on Linux 6.x with large folios,
measured), so a map-based gather of a few thousand scattered rows pulled nearly all of P into
the process. With reads, the file's pages stay in the kernel's page cache (shared, reclaimable)
and resident memory stays at the size of what the caller asked for plus one buffer.

Scattered rows are read as *runs*: rows closer than ``_MERGE_BYTES`` are read together (the
rows in between are read and dropped), so a gather costs one system call per run -- a loop over
runs of rows, which is as vectorized as reading scattered rows without mapping them can be.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import numpy as np

from gdr.rerun import RerunCommand

__all__ = ["PMatrix"]

# Rows copied per block of a read: bounds the float16/float32 temporaries of a read.
_READ_BLOCK = 2048
# Bytes of one read buffer (a gather uses two), and the largest gap read through between two rows.
_BUFFER_BYTES = 8 << 20
_MERGE_BYTES = 32 << 10


def _read_npy_header(path: Path) -> tuple[tuple[int, ...], bool, np.dtype, int]:
    """(shape, fortran_order, dtype, data offset) of a ``.npy`` file, without mapping it."""
    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
        else:  # 3.0: utf-8 header, same layout
            shape, fortran, dtype = np.lib.format._read_array_header(f, version)  # noqa: SLF001
        return tuple(int(d) for d in shape), bool(fortran), np.dtype(dtype), f.tell()


def _pread_into(fd: int, mv: memoryview, offset: int) -> None:
    """Fill the byte view ``mv`` with the file's bytes from ``offset`` (loops over short reads)."""
    done = 0
    while done < len(mv):
        if _HAS_PREADV:
            k = os.preadv(fd, [mv[done:]], offset + done)
        else:  # no preadv (e.g. Windows): one copy through bytes; fds are per read, so seeking is safe
            os.lseek(fd, offset + done, os.SEEK_SET)
            chunk = os.read(fd, len(mv) - done)
            k = len(chunk)
            mv[done:done + k] = chunk
        if k <= 0:
            raise OSError(f"unexpected end of file at byte {offset + done}")
        done += k


_HAS_PREADV = hasattr(os, "preadv")


class PMatrix:
    """Row reader over log P of shape (n_docs, n_queries).

    Parameters
    ----------
    source
        Path to a ``.npy`` file (read with explicit reads, never mapped; see the module doc) or an
        in-memory array.
    n_cols
        Use only the first ``n_cols`` columns (the first J queries); ``None`` = all.
    """

    def __init__(self, source: str | os.PathLike | np.ndarray, n_cols: int | None = None):
        if isinstance(source, np.ndarray):
            if source.ndim != 2:
                raise ValueError(f"log P must be 2-D (n_docs, n_queries), got shape {source.shape}")
            self.path: Path | None = None
            self._array: np.ndarray | None = source
            self._fortran, self._offset = False, 0
            shape, self.dtype = source.shape, source.dtype
        else:
            self.path = Path(source)
            if not self.path.exists():
                raise FileNotFoundError(f"no P matrix at {self.path}; run `gdr score` first or fix the path")
            shape, self._fortran, self.dtype, self._offset = _read_npy_header(self.path)
            if len(shape) != 2:
                raise ValueError(f"{self.path}: P must be 2-D (n_docs, n_queries), got shape {shape}")
            need = self._offset + shape[0] * shape[1] * self.dtype.itemsize
            if self.path.stat().st_size < need:
                raise ValueError(f"{self.path} is truncated ({self.path.stat().st_size} bytes, its header needs "
                                 f"{need}); rerun `{RerunCommand('score', self.path.parent)}` to finish it")
            self._array = None
        if not np.issubdtype(self.dtype, np.floating):
            raise ValueError(f"{self.path or 'log P'}: expected float16/float32 log-probabilities, got {self.dtype}")
        self.n_rows, self.n_cols_total = int(shape[0]), int(shape[1])
        if n_cols is None:
            n_cols = self.n_cols_total
        if not 1 <= n_cols <= self.n_cols_total:
            raise ValueError(
                f"n_queries={n_cols} but {self.path or 'log P'} has {self.n_cols_total} query columns; "
                f"pass a J between 1 and {self.n_cols_total}"
            )
        self.n_cols = int(n_cols)

    @property
    def shape(self) -> tuple[int, int]:
        return self.n_rows, self.n_cols

    @property
    def nbytes_on_disk(self) -> int:
        return self.n_rows * self.n_cols_total * np.dtype(self.dtype).itemsize

    def read_rows(self, rows: np.ndarray | slice) -> np.ndarray:
        """Rows ``rows`` (sorted indices or a slice) as a new float32 array of shape (n, n_cols)."""
        if isinstance(rows, slice):
            start, stop, step = rows.indices(self.n_rows)
            if step != 1:
                rows = np.arange(start, stop, step, dtype=np.int64)
        if self._array is not None or self._fortran:
            return self._read_mapped(rows)
        J = self.n_cols
        if isinstance(rows, slice):
            out = np.empty((max(stop - start, 0), J), dtype=np.float32)
            with open(self.path, "rb", buffering=0) as f:
                self._read_run(f.fileno(), start, out)
            return out
        rows = np.asarray(rows, dtype=np.int64)
        out = np.empty((len(rows), J), dtype=np.float32)
        if not len(rows):
            return out
        if rows[0] < 0 or rows[-1] >= self.n_rows:
            raise IndexError(f"row indices must lie in [0, {self.n_rows}); got {rows[0]}..{rows[-1]}")
        with open(self.path, "rb", buffering=0) as f:
            if rows[-1] - rows[0] + 1 == len(rows):                 # one run of consecutive rows
                self._read_run(f.fileno(), int(rows[0]), out)
            else:
                self._gather(f.fileno(), rows, out)
        return out

    def _read_run(self, fd: int, start: int, out: np.ndarray) -> None:
        """Rows ``start:start + len(out)`` into ``out`` (float32, (b, n_cols)) by ``preadv``, in blocks."""
        J, Jt = self.n_cols, self.n_cols_total
        row_bytes = Jt * self.dtype.itemsize
        buf = np.empty((min(_READ_BLOCK, len(out)), Jt), dtype=self.dtype)
        for a in range(0, len(out), _READ_BLOCK):
            b = min(a + _READ_BLOCK, len(out))
            blk = buf[:b - a]
            _pread_into(fd, memoryview(blk).cast("B"), self._offset + (start + a) * row_bytes)
            out[a:b] = blk[:, :J]

    def _gather(self, fd: int, rows: np.ndarray, out: np.ndarray) -> None:
        """Sorted scattered ``rows`` (shape (n,)) into ``out`` (float32, (n, n_cols)), one ``preadv`` per run.

        Runs: consecutive requested rows at most ``_MERGE_BYTES`` apart are read as one span, and
        spans are cut to at most ``cap`` rows. Span ``s`` starts at row ``c_s`` of the concatenation
        of all spans; it lands in buffer ``c_s // cap`` at row ``c_s % cap`` (a buffer holds 2 * cap
        rows, so every span fits), and each filled buffer is gathered into ``out`` at once.
        """
        Jt = self.n_cols_total
        row_bytes = Jt * self.dtype.itemsize
        cap = max(1, _BUFFER_BYTES // row_bytes)
        merge = max(1, _MERGE_BYTES // row_bytes)
        n = len(rows)
        new_run = np.empty(n, dtype=bool)
        new_run[0] = True
        new_run[1:] = np.diff(rows) > merge
        run = np.cumsum(new_run) - 1                                    # (n,) run of each row
        run_first = rows[new_run]
        piece_key = run * (cap + int(rows[-1] - rows[0]) + 1) + (rows - run_first[run]) // cap
        new_piece = np.empty(n, dtype=bool)
        new_piece[0] = True
        new_piece[1:] = piece_key[1:] != piece_key[:-1]
        piece = np.cumsum(new_piece) - 1                                # (n,) span of each row
        starts = np.flatnonzero(new_piece)
        first = rows[starts]                                            # (S,) first file row of each span
        last = rows[np.append(starts[1:], n) - 1]
        span = last - first + 1                                         # (S,) rows read, <= cap
        c = np.cumsum(span) - span
        batch, base = c // cap, c % cap                                 # (S,) buffer, row in it
        local = base[piece] + (rows - first[piece])                     # (n,) row of each row in its buffer
        row_batch = batch[piece]
        buf = np.empty((2 * cap, Jt), dtype=self.dtype)
        mv = memoryview(buf).cast("B")
        bounds = np.searchsorted(batch, np.arange(int(batch[-1]) + 2))  # spans of each buffer
        rbounds = np.searchsorted(row_batch, np.arange(int(batch[-1]) + 2))
        offs = (self._offset + first * row_bytes).tolist()
        lo, hi = (base * row_bytes).tolist(), ((base + span) * row_bytes).tolist()
        for bi in range(len(bounds) - 1):
            for s_ in range(bounds[bi], bounds[bi + 1]):                # one system call per span
                _pread_into(fd, mv[lo[s_]:hi[s_]], offs[s_])
            a, b = rbounds[bi], rbounds[bi + 1]
            out[a:b] = buf[local[a:b], :self.n_cols]

    def _read_mapped(self, rows: np.ndarray | slice) -> np.ndarray:
        """In-memory arrays (and Fortran-ordered files, mapped for the duration of the read)."""
        src = self._array if self._array is not None else np.load(self.path, mmap_mode="r")
        J = self.n_cols
        if isinstance(rows, slice):
            start, stop, _ = rows.indices(self.n_rows)
            out = np.empty((max(stop - start, 0), J), dtype=np.float32)
            for a in range(start, stop, _READ_BLOCK):
                b = min(a + _READ_BLOCK, stop)
                out[a - start:b - start] = src[a:b, :J]
        else:
            rows = np.asarray(rows, dtype=np.int64)
            out = np.empty((len(rows), J), dtype=np.float32)
            for a in range(0, len(rows), _READ_BLOCK):
                r = rows[a:a + _READ_BLOCK]
                if len(r) and r[-1] - r[0] + 1 == len(r):  # a contiguous run: slice, no gather
                    out[a:a + len(r)] = src[r[0]:r[-1] + 1, :J]
                else:
                    out[a:a + len(r)] = src[r, :J]
        del src
        return out

    def iter_rows(self, rows: np.ndarray | None, chunk_rows: int) -> Iterator[tuple[int, np.ndarray]]:
        """Yield ``(offset, block)`` with ``block`` = float32 rows of shape (<= chunk_rows, n_cols).

        ``rows`` = sorted row indices, or ``None`` for all rows; ``offset`` indexes into ``rows``.
        """
        n = self.n_rows if rows is None else len(rows)
        for a in range(0, n, chunk_rows):
            b = min(a + chunk_rows, n)
            yield a, self.read_rows(slice(a, b) if rows is None else rows[a:b])
