"""The P-matrix store: the run folder's format, its readers, writers, manifests and checksums.

A run folder holds::

    doc_ids.json         the documents, in row order
    queries.jsonl        {"qid", "text", "source_doc_id", "source_index"} per line, in column order
    queries.manifest.json
    P.npy                log P, float32 (or float16), shape (n_docs, n_queries), a .npy memmap
    P.manifest.json      model, prompt, doc-id / text / query hashes, shape, dtype, sharding, status
    P.shards/            one ``NNNNN.done`` marker per finished shard, holding the checksum of its rows
    doc_texts.json       a digest of each row's model input, in row order: what lets a later P of an edited
                         corpus reuse this one's entries (:func:`reuse_map`)

P is written in shards of ``shard_size`` documents. Documents are ordered by prompt length once (stable
sort), and shard s is the s-th run of that order (:func:`shard_rows`). A shard's rows are flushed to disk
before its marker is written (:func:`write_shard`), so after a kill (even SIGKILL) a rerun skips finished
shards and recomputes only unfinished ones.

Nothing on disk is trusted blindly: before a rerun writes, :func:`prepare_p` checks P.npy's header and size
(a wrong one is re-created and every shard re-scored, never zero-filled) and each finished shard's rows
against the checksum in its marker (a damaged shard is re-scored); the finished file's size and checksum go
into P.manifest.json (:func:`finish_p`) and ``queries.jsonl``'s into queries.manifest.json
(:func:`write_queries`), and :func:`load_run`, the one reader of a run folder, checks both before handing
them out. :mod:`gdr.store.rows` reads P's rows without mapping the file (P may exceed memory).

The jobs that fill a folder live with the model stages that run them: sampling in :mod:`gdr.stages.sample`,
scoring (sharded, resumable, split across ``torchrun`` ranks) in :mod:`gdr.stages.score`, the queries per
document in :mod:`gdr.stages.doc_queries`.
"""
from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

import numpy as np

from gdr.formats import FORMAT, require_format
from gdr.io import (
    atomic_write_json,
    bytes_digest,
    file_digest,
    hash_strings,
    no_space,
    read_jsonl,
    read_manifest,
    write_jsonl,
    write_manifest,
)
from gdr.rerun import RerunCommand
from gdr.store.rows import PMatrix

log = logging.getLogger(__name__)

__all__ = ["PRun", "PMatrix", "load_run", "check_p", "read_queries",
           "score_folder", "copy_run_queries", "prepare_p", "shard_rows", "pending_shards", "write_shard",
           "finish_p", "Reuse", "reuse_map", "text_digests", "match_strings", "query_groups", "TEXTS_FILE",
           "BY_SOURCE", "query_ended", "scored_as"]

P_FILE, P_MANIFEST, SHARD_DIR = "P.npy", "P.manifest.json", "P.shards"
Q_FILE, Q_MANIFEST, Q_PARTIAL = "queries.jsonl", "queries.manifest.json", "queries.partial.jsonl"
DOCQ_FILE, DOCQ_MANIFEST = "doc_queries.jsonl", "doc_queries.manifest.json"
TEXTS_FILE = "doc_texts.json"


@dataclass
class PRun:
    """A P-matrix run: log P with the ids of its rows (documents) and columns (queries)."""

    path: Path
    doc_ids: list[str]
    queries: list[dict]  # one {"qid", "text", ...} per column (all columns, not only the first J)
    logp: np.ndarray  # (n_docs, n_queries) memmap, read-only: every column
    manifest: dict  # P.manifest.json ({} for a folder without one)
    pmatrix: PMatrix | None = None  # row reader over the first J columns; None: over all of ``logp``
    origin: str = ""  # where the queries were sampled: this folder, or the run they were copied from

    def __post_init__(self):
        if self.pmatrix is None:
            self.pmatrix = PMatrix(self.logp)

    @property
    def scorer(self) -> dict | None:
        """The model that scored P (P.manifest.json's ``lm``), when recorded."""
        return self.manifest.get("lm")

    @property
    def query_texts(self) -> list[str]:
        return [str(q.get("text", q.get("qid", ""))) for q in self.queries]

    @property
    def query_keys(self) -> list[str]:
        """What each column of P was scored as (:func:`scored_as`)."""
        return scored_as(self.query_texts, query_ended(self.queries))

    def first_queries(self, n_queries: int | None) -> PRun:
        """This run with its rows read over the first ``n_queries`` columns of P (all when None): GC's J."""
        if n_queries is None:
            return self
        return replace(self, pmatrix=PMatrix(self.pmatrix.path or self.logp, n_cols=n_queries))

    def query_identity(self) -> dict:
        """What the columns in use (the first J) are, by content: the hash of their texts, the model that
        scored them and where they were sampled. Two runs whose P columns can be compared (``gdr index add``)
        agree on ``texts_hash`` and ``scorer``; qids (``q0 .. q{J-1}`` in every run) say nothing."""
        return {"texts_hash": hash_strings(self.query_texts[: self.pmatrix.n_cols]), "n_queries": self.pmatrix.n_cols,
                "scorer": self.scorer, "source": self.origin or str(self.path)}


def score_folder(path: str | os.PathLike) -> Path:
    """The folder of sampled queries and P that ``path`` names: a ``gdr score`` folder, or a ``gdr run`` folder
    holding exactly one finished ``score-<key>/`` stage."""
    p = Path(path)
    if (p / Q_FILE).is_file():
        return p
    stages = sorted(d for d in p.glob("score-*") if (d / Q_FILE).is_file()) if p.is_dir() else []
    if len(stages) == 1:
        return stages[0]
    if len(stages) > 1:
        raise ValueError(f"queries_from={p}: the run folder holds {len(stages)} score stages "
                         f"({', '.join(d.name for d in stages)}); pass the one the index was built on")
    raise FileNotFoundError(f"queries_from={p}: no {Q_FILE} there (nor a single score-*/ stage of `gdr run`); pass the "
                            "folder of the `gdr score` (or `gdr run`) whose queries the new documents are scored "
                            "against")


def copy_run_queries(run_dir: str | os.PathLike, out_dir: str | os.PathLike) -> tuple[list[dict], dict | None]:
    """Copy the sampled queries of the finished run ``run_dir`` (checked against its manifest) into ``out_dir``,
    with a manifest naming where they came from (``from_run``), so that a P scored there has the run's columns.
    Returns (the query rows, the model that scored the run's P, or None when its manifest does not say).
    An ``out_dir`` holding other queries is refused; the same queries are reused."""
    src, out = score_folder(run_dir), Path(out_dir)
    man = read_manifest(src, Q_MANIFEST)
    if man is None or man.get("status") != "complete":
        raise FileNotFoundError(f"queries_from={src}: {src / Q_MANIFEST} is missing or unfinished; finish that run "
                                "first")
    rows = read_queries(src, man)
    texts_hash = hash_strings(r["text"] for r in rows)
    scorer = (read_manifest(src, P_MANIFEST) or {}).get("lm")
    origin = str(man.get("from_run") or src.resolve())
    old = read_manifest(out, Q_MANIFEST)
    if old is not None or (out / Q_FILE).exists():
        if old is not None and old.get("queries_hash") == texts_hash and (out / Q_FILE).exists():
            return read_queries(out, old), scorer
        where = f"queries sampled in {old.get('from_run') or out}" if old else f"a {Q_FILE} without {Q_MANIFEST}"
        raise FileExistsError(f"out={out}: holds {where}, not the queries of {origin}; use another out= folder")
    out.mkdir(parents=True, exist_ok=True)
    write_jsonl(out / Q_FILE, rows)
    keep = {k: man[k] for k in ("sampler", "lm", "n_queries", "seed", "max_new_tokens", "top_k", "top_p",
                                "temperature", "n_redrawn", "numerics", "p_per_doc", "query_end", "n_cut") if k in man}
    write_manifest(out, Q_MANIFEST, **keep, format=FORMAT, from_run=origin, status="complete", queries_hash=texts_hash,
                   file=file_digest(out / Q_FILE))
    log.info("scoring against the %d queries of %s (copied into %s)", len(rows), origin, out / Q_FILE)
    return rows, scorer


def read_queries(out_dir: str | os.PathLike, manifest: dict | None = None) -> list[dict]:
    """``queries.jsonl`` of a finished sampling run, checked against its manifest (size and checksum, the count
    and the hash of the texts).

    A file that no longer matches was changed after sampling; editing it back cannot restore what the
    P matrix was scored from, so the error says to re-sample.
    """
    out = Path(out_dir)
    man = read_manifest(out, Q_MANIFEST) if manifest is None else manifest
    if man is not None:
        require_format(man, out / Q_MANIFEST, out)
    path = out / Q_FILE
    redo = (f"re-sample: delete {path} and {out / Q_MANIFEST} (and any P.npy, P.manifest.json, P.shards/ "
            f"scored from them), then run `{RerunCommand('score', out)}`")
    if man is None:
        return read_jsonl(path)
    if man.get("file"):
        d = file_digest(path)
        if d["size"] != man["file"]["size"]:
            raise ValueError(f"{path}: {d['size']:,} bytes, {man['file']['size']:,} recorded in {Q_MANIFEST}: "
                             f"the file was changed after sampling; {redo}")
        if d["crc32"] != man["file"]["crc32"]:
            raise ValueError(f"{path}: checksum differs from the one in {Q_MANIFEST}: the file was changed after "
                             f"sampling; {redo}")
    try:
        rows = read_jsonl(path)
    except ValueError as e:
        raise ValueError(f"{str(e).split('; fix')[0]}; the file was changed after sampling: {redo}") from None
    want = man.get("queries_hash")
    if want is not None and (len(rows) != man.get("n_queries")
                             or hash_strings(r.get("text", "") for r in rows) != want):
        raise ValueError(f"{path}: {len(rows)} queries that do not match {Q_MANIFEST} ({man.get('n_queries')} "
                         f"queries, hash {man['queries_hash']}): the file was changed after sampling; {redo}")
    return rows


# ------------------------------------------------------------------------------------ writing P
def _reserve(path: Path) -> None:
    """Reserve a memmap's blocks: a full disk is ENOSPC now, not SIGBUS mid-run."""
    if hasattr(os, "posix_fallocate"):
        with open(path, "r+b") as f:
            size = os.fstat(f.fileno()).st_size
            try:
                os.posix_fallocate(f.fileno(), 0, size)
            except OSError as e:  # one line naming P and the bytes it needs (gdr.guard), not a traceback
                raise no_space(e, path, size) or e from e


def _npy_problem(path: Path, shape: Sequence[int], dtype: str) -> str | None:
    """What is wrong with the .npy file at ``path`` for a (shape, dtype) matrix, or None."""
    problem, _ = _npy_check(path, shape, dtype)
    return problem


def _npy_check(path: Path, shape: Sequence[int], dtype: str) -> tuple[str | None, int | None]:
    """(what is wrong or None, the right file size when the header is right and only the size is wrong)."""
    try:
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            hshape, fortran, hdtype = read(f)
            offset = f.tell()
    except (ValueError, OSError, SyntaxError, EOFError) as e:
        return f"unreadable .npy header ({e})", None
    if tuple(hshape) != tuple(shape) or np.dtype(hdtype) != np.dtype(dtype) or fortran:
        return f"header says {np.dtype(hdtype).name} {tuple(hshape)}, expected {dtype} {tuple(shape)}", None
    want = offset + int(np.prod(shape)) * np.dtype(dtype).itemsize
    size = path.stat().st_size
    if size != want:
        return f"{size:,} bytes, a {dtype} {tuple(shape)} matrix needs {want:,} (truncated or extended)", want
    return None, None


def _rows_digest(P: np.ndarray, rows: np.ndarray) -> str:
    return bytes_digest(np.ascontiguousarray(P[rows]))


def _check_shards(P: np.ndarray, shard_dir: Path, order: np.ndarray, shard_size: int, p_path: Path) -> int:
    """Drop the markers of shards whose rows do not match the checksum in their marker (they are re-scored); a
    marker without a readable ``rows_crc32`` counts as damaged. Returns the number of markers dropped."""
    dropped = 0
    for marker in sorted(shard_dir.glob("*.done")):
        s = int(marker.stem)
        try:
            want = json.loads(marker.read_text() or "{}").get("rows_crc32")
        except (json.JSONDecodeError, AttributeError):
            want = None
        if want is not None and _rows_digest(P, shard_rows(order, shard_size, s)) == want:
            continue
        log.warning("%s: rows of shard %d differ from the checksum in its marker; re-scoring that shard", p_path, s)
        marker.unlink()
        dropped += 1
    return dropped


def prepare_p(out: Path, ident: dict, doc_ids: Sequence[str], shape: tuple[int, int], dtype: str,
              order: np.ndarray, shard_size: int, world: int, digests: Sequence[str] | None = None) -> None:
    """Rank 0's part before scoring: refuse a P of another identity, repair or re-create P.npy (a cut file
    keeps the shards before the cut; a broken header re-scores all), drop the markers of damaged shards, and
    record the doc ids, each row's text digest (``digests``, :func:`text_digests`) and a running manifest."""
    p_path, shard_dir = out / P_FILE, out / SHARD_DIR
    out.mkdir(parents=True, exist_ok=True)
    old = read_manifest(out, P_MANIFEST)
    if old is not None:
        require_format(old, out / P_MANIFEST, out)
        stale = [k for k in ident if json.loads(json.dumps(old.get(k))) != json.loads(json.dumps(ident[k]))]
        if stale:
            said = [f"{k} {old.get(k)} there, {ident[k]} here" if k in ("device", "compute_dtype", "threads") else k
                    for k in stale]
            raise FileExistsError(
                f"{out / P_MANIFEST} belongs to a different P matrix (differs in: {', '.join(said)}); "
                "use another out= folder, or delete P.npy, P.manifest.json and P.shards/ to start over")
    problem = None
    if old is not None and p_path.exists():
        problem, right_size = _npy_check(p_path, shape, dtype)
        if problem and right_size is not None:
            # header intact: restore the length; the shard checksums find (and re-score) the lost rows,
            # so the shards before the cut keep their work
            log.warning("%s: %s; re-scoring the shards whose rows it lost", p_path, problem)
            os.truncate(p_path, right_size)
            _reserve(p_path)
            problem = None
        elif problem:
            log.warning("%s: %s; re-creating it and re-scoring every shard", p_path, problem)
    if old is None or not p_path.exists() or problem:
        shard_dir.mkdir(parents=True, exist_ok=True)
        for f in shard_dir.glob("*.done"):
            f.unlink()
        np.lib.format.open_memmap(p_path, mode="w+", dtype=dtype, shape=shape).flush()
        _reserve(p_path)
    else:
        _check_shards(np.load(p_path, mmap_mode="r"), shard_dir, order, shard_size, p_path)
    atomic_write_json(out / "doc_ids.json", list(doc_ids))
    if digests is not None:
        atomic_write_json(out / TEXTS_FILE, list(digests))
    write_manifest(out, P_MANIFEST, **ident, format=FORMAT, status="running", world_size=world)


# ------------------------------------------------------------------------------ reusing an older P
# What a P's entries depend on besides its rows' and columns' texts: an older P agreeing on all of these
# holds, at an entry whose row and query group it shares (:func:`reuse_map`), the bytes a full rescore writes.
_INPUT_KEYS = {"doc_ids_hash", "texts_hash", "queries_hash", "cut_hash", "shape"}
# P.manifest.json's ``query_chunks`` when the scorer packed each source document's queries apart (absent: all
# queries packed together)
BY_SOURCE = "by_source"


def text_digests(texts: Sequence[str]) -> list[str]:
    """One digest per text (:func:`gdr.io.hash_strings` of it alone): rows are matched by content."""
    return [hash_strings([t]) for t in texts]


@dataclass
class Reuse:
    """Where a new P's entries already sit in an older P: ``row_src[i]`` the older row with document i's text,
    ``col_src[j]`` the older column of query j, in an older query group of the same texts (-1: none). Entry
    (i, j) is reused when both are >= 0; a query group is reused whole or not at all."""

    path: Path  # the older run folder
    logp: np.ndarray  # (n_old_docs, n_old_queries) memmap, read-only
    row_src: np.ndarray  # (n_docs,) int64
    col_src: np.ndarray  # (n_queries,) int64

    def block(self, rows: np.ndarray) -> np.ndarray:
        """(len(rows), n_queries) float32: the older entries of ``rows`` at reused columns, NaN elsewhere."""
        out = np.full((len(rows), len(self.col_src)), np.nan, dtype=np.float32)
        src, cols = self.row_src[rows], self.col_src
        r, c = src >= 0, cols >= 0
        if r.any() and c.any():
            out[np.ix_(r, c)] = self.logp[np.ix_(src[r], cols[c])]
        return out


def match_strings(old: Sequence[str], new: Sequence[str]) -> np.ndarray:
    """(len(new),) int64: for each of ``new``, the index of an equal string in ``old``, -1 when none."""
    if not len(old) or not len(new):
        return np.full(len(new), -1, dtype=np.int64)
    o, n = np.asarray(old, dtype=object).astype(str), np.asarray(new, dtype=object).astype(str)
    order = np.argsort(o, kind="stable")
    pos = np.searchsorted(o, n, sorter=order).clip(max=len(o) - 1)
    return np.where(o[order[pos]] == n, order[pos], -1).astype(np.int64)


def query_groups(texts: Sequence[str], groups: np.ndarray | None) -> tuple[list[np.ndarray], list[str]]:
    """The columns of each query group ((n_queries,) ``groups``; None: one group of all), each in column order,
    and each group's key: the hash of its query texts in that order (what its entries depend on)."""
    g = np.zeros(len(texts), dtype=np.int64) if groups is None else np.asarray(groups)
    order = np.argsort(g, kind="stable")
    cols = np.split(order, np.flatnonzero(np.diff(g[order])) + 1) if len(g) else []
    return cols, [hash_strings([texts[j] for j in c]) for c in cols]


def query_ended(rows: Sequence[dict]) -> np.ndarray:
    """(n_queries,) bool: whether each query record (of ``queries.jsonl``) ended at a stop id, i.e. is not marked
    ``cut`` at ``max_new_tokens`` (records of given queries carry no mark: ended)."""
    return np.array([not r.get("cut") for r in rows], dtype=bool)


def scored_as(texts: Sequence[str], ended: Sequence[bool] | np.ndarray | None) -> list[str]:
    """The key a P column was scored by: its query's text, and a NUL after it for a query cut before its end (P
    scores no end for it, :data:`gdr.lm.scoring.QUERY_END`; a query's text holds no NUL). ``ended`` None: all."""
    if ended is None:
        return list(texts)
    return [t if e else t + "\0" for t, e in zip(texts, ended, strict=True)]


def _column_map(old_texts: Sequence[str], old_groups: np.ndarray | None, texts: Sequence[str],
                groups: np.ndarray | None) -> np.ndarray:
    """(n_queries,) int64: for each column, its column in the older P's group of the same key, -1 when none."""
    old_cols, old_keys = query_groups(old_texts, old_groups)
    where = dict(zip(old_keys, old_cols))
    col_src = np.full(len(texts), -1, dtype=np.int64)
    for cols, key in zip(*query_groups(texts, groups)):
        if key in where:
            col_src[cols] = where[key]
    return col_src


def reuse_map(old_dir: str | os.PathLike, ident: dict, digests: Sequence[str], queries: Sequence[str],
              groups: np.ndarray | None = None, ended: np.ndarray | None = None) -> Reuse | None:
    """How much of the finished P in ``old_dir`` a P of identity ``ident`` (rows with text ``digests``, columns
    ``queries`` in chunk groups ``groups``, (n_queries,) or None, ended or cut as ``ended``, :func:`scored_as`) can
    take as it is, when a row's entries depend
    only on its document's text and the queries of their group (the caller's part: one document per pass).

    None, with one log line why, when nothing: that P was scored by another model, prompt, dtype, sizes, numerics
    or query packing (the keys of ``ident`` other than its inputs), is unfinished or damaged, does not record its
    rows' and columns' texts (``doc_texts.json``, ``queries.jsonl``), or shares no query group (all queries packed
    together: no other query list)."""
    old_dir = Path(old_dir)
    man = read_manifest(old_dir, P_MANIFEST)
    if (man is None or man.get("status") != "complete" or not (old_dir / TEXTS_FILE).is_file()
            or not (old_dir / Q_FILE).is_file()):
        log.info("not reusing %s: unfinished, or without %s and %s", old_dir / P_FILE, TEXTS_FILE, Q_FILE)
        return None
    differs = [k for k in set(ident) | {"query_chunks"} if k not in _INPUT_KEYS
               and json.loads(json.dumps(man.get(k))) != json.loads(json.dumps(ident.get(k)))]
    if differs:
        log.info("not reusing %s: scored with other %s", old_dir / P_FILE, ", ".join(sorted(differs)))
        return None
    try:
        run = load_run(old_dir)
        with open(old_dir / TEXTS_FILE, encoding="utf-8") as f:
            old_digests = json.load(f)
        old_groups = (np.array([int(q["source_index"]) for q in run.queries], dtype=np.int64)
                      if man.get("query_chunks") == BY_SOURCE else None)
    except (OSError, ValueError, RuntimeError, KeyError) as e:
        log.warning("not reusing %s: %s", old_dir / P_FILE, e)
        return None
    if len(old_digests) != run.logp.shape[0] or hash_strings(old_digests) != man.get("doc_texts_hash"):
        log.warning("not reusing %s: %s does not match %s", old_dir / P_FILE, TEXTS_FILE, P_MANIFEST)
        return None
    col_src = _column_map(run.query_keys, old_groups, scored_as(queries, ended), groups)
    if not (col_src >= 0).any():
        log.info("not reusing %s: no query group of it is this P's (all queries packed together: other queries)",
                 old_dir / P_FILE)
        return None
    return Reuse(old_dir, run.logp, match_strings(old_digests, digests), col_src)


def shard_rows(order: np.ndarray, shard_size: int, s: int) -> np.ndarray:
    """The rows of P in shard ``s``, ascending: shards cut the prompt-length ``order`` into ``shard_size`` rows."""
    return np.sort(order[s * shard_size:(s + 1) * shard_size])


def pending_shards(shard_dir: Path, group: Sequence[int]) -> list[int]:
    """The shards of ``group`` without a ``.done`` marker."""
    return [s for s in group if not (shard_dir / f"{s:05d}.done").exists()]


def write_shard(P: np.ndarray, shard_dir: Path, s: int, rows: np.ndarray, block: np.ndarray) -> None:
    """Write shard ``s``'s ``block`` (shape (len(rows), n_queries), P's dtype) into rows ``rows`` of the memmap
    ``P``, flush it, then write the shard's ``.done`` marker with the block's checksum."""
    P[rows] = block
    P.flush()
    atomic_write_json(shard_dir / f"{s:05d}.done", {"rows_crc32": bytes_digest(block)})


def finish_p(out: Path, ident: dict, n_shards: int, world: int, **extra) -> bool:
    """Rank 0's part after scoring: the manifest says ``complete`` (with P.npy's size and checksum) when all
    ``n_shards`` shards are done, ``partial`` otherwise; ``extra`` (timings) is recorded too. Returns whether
    P is complete."""
    finished = len(list((out / SHARD_DIR).glob("*.done"))) == n_shards
    write_manifest(out, P_MANIFEST, **ident, format=FORMAT, status="complete" if finished else "partial",
                   world_size=world, **extra, **({"file": file_digest(out / P_FILE)} if finished else {}))
    return finished


def check_p(out_dir: str | os.PathLike, manifest: dict) -> None:
    """Raise an error naming ``P.npy`` when its header, size or checksum disagrees with ``manifest``."""
    out = Path(out_dir)
    p_path = out / P_FILE
    problem = _npy_problem(p_path, manifest["shape"], manifest["dtype"]) if p_path.exists() else "missing"
    if problem is None and manifest.get("file"):
        if file_digest(p_path)["crc32"] != manifest["file"]["crc32"]:
            problem = f"checksum differs from the one in {P_MANIFEST}"
    if problem:
        raise ValueError(f"{p_path}: {problem}; rerun `{RerunCommand('score', out)}` (it re-scores what is damaged)")


def load_run(out_dir: str | os.PathLike, require_complete: bool = True, require_manifest: bool = True) -> PRun:
    """Open a run folder: P (a read-only memmap, and a row reader that does not map it), its doc ids and queries,
    each checked against the manifests (:meth:`PRun.first_queries`: the rows over fewer columns).

    ``require_manifest=False`` also opens a folder that holds only ``P.npy``, ``doc_ids.json`` and optionally
    ``queries.jsonl`` (a P computed elsewhere, for ``gdr index``); what a manifest records is checked when there
    is one."""
    out = Path(out_dir)
    man = read_manifest(out, P_MANIFEST)
    if man is not None:
        require_format(man, out / P_MANIFEST, out)
    if man is None and require_manifest:
        # a folder of no saved config has no command of its own: the default one would score the default corpus
        how = RerunCommand("score", out, "run `{}` first", fallback=f"score a corpus into it first (`gdr score "
                           f"data=<your corpus> out={out}`), or pass the folder of a `gdr score` run")
        raise FileNotFoundError(f"{out / P_MANIFEST} not found: {how}")
    if man is None and not out.is_dir():
        raise FileNotFoundError(f"P-matrix run folder {out} does not exist; pass run=<folder of `gdr score`>")
    man = man or {}
    if require_complete and man.get("status", "complete") != "complete":
        how = RerunCommand("score", out, "rerun `{}` to finish it", fallback="rerun the `gdr score` command that "
                           "wrote it, with its settings, to finish it")
        raise ValueError(f"{out / P_FILE} is {man.get('status')}, not finished: {how}")
    if "shape" in man:
        check_p(out, man)  # header, size and checksum
    pm = PMatrix(out / P_FILE)
    rescore = RerunCommand("score", out, "rerun `{}` (it re-scores what is damaged)")
    doc_ids = _read_doc_ids(out, man, pm.n_rows, rescore)
    if (out / Q_FILE).exists():
        queries = read_queries(out)  # checked against queries.manifest.json when there is one
        if man.get("queries_hash") and hash_strings(q["text"] for q in queries) != man["queries_hash"]:
            raise ValueError(f"{out / Q_FILE}: its queries are not the ones {out / P_FILE} was scored with; {rescore}")
        if len(queries) != pm.n_cols_total:
            raise ValueError(f"{out / Q_FILE} has {len(queries)} queries but {pm.path} has {pm.n_cols_total} columns")
    else:
        log.warning("%s is missing; queries are named by column number", out / Q_FILE)
        queries = [{"qid": str(j), "text": f"q{j}"} for j in range(pm.n_cols_total)]
    origin = (read_manifest(out, Q_MANIFEST) or {}).get("from_run") or out
    return PRun(out, doc_ids, queries, np.load(out / P_FILE, mmap_mode="r"), man, pmatrix=pm, origin=str(origin))


def _read_doc_ids(out: Path, man: dict, n_rows: int, rescore: RerunCommand) -> list[str]:
    """``doc_ids.json``: one unique id per row of P, matching the manifest's hash when it records one."""
    path = out / "doc_ids.json"
    if not man and not path.exists():
        raise FileNotFoundError(f"{path} is missing; the run folder must hold the row order of P.npy")
    try:
        with open(path, encoding="utf-8") as f:
            doc_ids = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: unreadable ({e}); {rescore}") from None
    if man.get("doc_ids_hash") and hash_strings(doc_ids) != man["doc_ids_hash"]:
        raise ValueError(f"{path}: does not match {P_MANIFEST} (doc ids hash); {rescore}")
    doc_ids = [str(d) for d in doc_ids]
    if len(doc_ids) != n_rows:
        raise ValueError(f"{path} lists {len(doc_ids)} doc ids but {out / P_FILE} has {n_rows} rows")
    if len(set(doc_ids)) != len(doc_ids):
        seen: set[str] = set()
        dup = next(d for d in doc_ids if d in seen or seen.add(d))  # type: ignore[func-returns-value]
        raise ValueError(f"{path}: doc id {dup!r} occurs more than once; doc ids must be unique")
    return doc_ids
