"""Read the log P matrix of a scoring run row by row, without holding it in memory.

A P-matrix run folder holds ``P.npy`` (log p(query | doc), float16 or float32, of shape
(n_docs, n_queries)), ``queries.jsonl`` (one ``{"qid", "text", "source_doc_id"}`` per
line, column order) and ``doc_ids.json`` (the doc ids in row order).

``P.npy`` may be larger than memory. :class:`PMatrix` therefore maps the file only for the
duration of one read and copies the requested rows out as float32: pages touched by a read
leave the process when the map closes (the OS page cache keeps them for the next read), so
resident memory stays at the size of what the caller asked for.
"""
from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from gdr.io import hash_strings, read_jsonl, read_manifest

__all__ = ["PMatrix", "PMatrixRun", "load_pmatrix_run"]

log = logging.getLogger(__name__)

# Rows copied per fancy-indexing call: bounds the float16 temporary of a read.
_READ_BLOCK = 2048


class PMatrix:
    """Row reader over log P of shape (n_docs, n_queries).

    Parameters
    ----------
    source
        Path to a ``.npy`` file (memory-mapped per read) or an in-memory array.
    n_cols
        Use only the first ``n_cols`` columns (the first J queries); ``None`` = all.
    """

    def __init__(self, source: str | os.PathLike | np.ndarray, n_cols: int | None = None):
        if isinstance(source, np.ndarray):
            if source.ndim != 2:
                raise ValueError(f"log P must be 2-D (n_docs, n_queries), got shape {source.shape}")
            self.path: Path | None = None
            self._array: np.ndarray | None = source
            shape, self.dtype = source.shape, source.dtype
        else:
            self.path = Path(source)
            if not self.path.exists():
                raise FileNotFoundError(f"no P matrix at {self.path}; run `gdr score` first or fix the path")
            mm = np.load(self.path, mmap_mode="r")
            if mm.ndim != 2:
                raise ValueError(f"{self.path}: P must be 2-D (n_docs, n_queries), got shape {mm.shape}")
            shape, self.dtype = mm.shape, mm.dtype
            del mm
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

    def _open(self) -> np.ndarray:
        return self._array if self._array is not None else np.load(self.path, mmap_mode="r")

    def read_rows(self, rows: np.ndarray | slice) -> np.ndarray:
        """Rows ``rows`` (sorted indices or a slice) as a new float32 array of shape (n, n_cols)."""
        src = self._open()
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
        del src  # closes the map: its pages leave this process's resident set
        return out

    def iter_rows(self, rows: np.ndarray | None, chunk_rows: int) -> Iterator[tuple[int, np.ndarray]]:
        """Yield ``(offset, block)`` with ``block`` = float32 rows of shape (<= chunk_rows, n_cols).

        ``rows`` = sorted row indices, or ``None`` for all rows; ``offset`` indexes into ``rows``.
        """
        n = self.n_rows if rows is None else len(rows)
        for a in range(0, n, chunk_rows):
            b = min(a + chunk_rows, n)
            yield a, self.read_rows(slice(a, b) if rows is None else rows[a:b])


@dataclass
class PMatrixRun:
    """A scoring run: log P plus the ids of its rows and columns."""

    pmatrix: PMatrix
    doc_ids: list[str]
    queries: list[dict]  # one {"qid", "text", ...} per column (all columns, not only the first J)
    path: Path

    @property
    def query_texts(self) -> list[str]:
        return [str(q.get("text", q.get("qid", ""))) for q in self.queries]

    @property
    def query_hash(self) -> str:
        """Hash of the qids of the columns in use (the first J)."""
        return hash_strings(str(q.get("qid", i)) for i, q in enumerate(self.queries[: self.pmatrix.n_cols]))


def load_pmatrix_run(run_dir: str | os.PathLike, n_queries: int | None = None) -> PMatrixRun:
    """Open a P-matrix run folder (``P.npy``, ``queries.jsonl``, ``doc_ids.json``) and check it is consistent."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"P-matrix run folder {run_dir} does not exist; pass run=<folder of `gdr score`>")
    man = read_manifest(run_dir, "P.manifest.json")  # written by gdr.store while scoring
    if man is not None and man.get("status", "complete") != "complete":
        raise RuntimeError(f"{run_dir / 'P.npy'} is {man.get('status')}: rerun `gdr score out={run_dir}` to finish "
                           "it before indexing")
    pm = PMatrix(run_dir / "P.npy", n_cols=n_queries)
    ids_path = run_dir / "doc_ids.json"
    if not ids_path.exists():
        raise FileNotFoundError(f"{ids_path} is missing; the run folder must hold the row order of P.npy")
    with open(ids_path, encoding="utf-8") as f:
        doc_ids = [str(d) for d in json.load(f)]
    if len(doc_ids) != pm.n_rows:
        raise ValueError(f"{ids_path} lists {len(doc_ids)} doc ids but {pm.path} has {pm.n_rows} rows")
    if len(set(doc_ids)) != len(doc_ids):
        seen: set[str] = set()
        dup = next(d for d in doc_ids if d in seen or seen.add(d))  # type: ignore[func-returns-value]
        raise ValueError(f"{ids_path}: doc id {dup!r} occurs more than once; doc ids must be unique")
    q_path = run_dir / "queries.jsonl"
    if q_path.exists():
        queries = read_jsonl(q_path)
        if len(queries) != pm.n_cols_total:
            raise ValueError(f"{q_path} has {len(queries)} queries but {pm.path} has {pm.n_cols_total} columns")
    else:
        log.warning("%s is missing; queries are named by column number", q_path)
        queries = [{"qid": str(j), "text": f"q{j}"} for j in range(pm.n_cols_total)]
    return PMatrixRun(pmatrix=pm, doc_ids=doc_ids, queries=queries, path=run_dir)
