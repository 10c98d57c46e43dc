"""The P-matrix store: sampled queries and log p(query | doc) in a run folder, resumable and shardable.

A run folder holds::

    doc_ids.json         the documents, in row order
    queries.jsonl        {"qid", "text", "source_doc_id", "source_index"} per line, in column order
    queries.manifest.json
    P.npy                log P, float32 (or float16), shape (n_docs, n_queries), a .npy memmap
    P.manifest.json      model, prompt, doc-id / text / query hashes, shape, dtype, sharding, status
    P.shards/            one ``NNNNN.done`` marker per finished shard, holding the checksum of its rows

Scoring walks shards of ``shard_size`` documents. Documents are ordered by prompt length once (stable
sort), and shard s is the s-th run of that order. Shards are scored in fixed groups of
``ceil(doc_batch_size / shard_size)`` consecutive shards (one shard when a shard holds a doc batch), so
that a small shard never cuts a doc batch short; a group's batches, and therefore its numbers, do not
depend on which process computes it or when. The prompts and queries are tokenised once per run (the
model caches them), whatever the shard size. A shard's rows are flushed to disk before its marker is
written, so after a kill (even SIGKILL) a rerun skips finished shards and recomputes only unfinished
ones: the finished matrix equals an uninterrupted run's exactly.

Nothing on disk is trusted blindly: a rerun checks P.npy's header and size (a wrong one is re-created
and every shard re-scored, never zero-filled) and each finished shard's rows against the checksum in its
marker (a damaged shard is re-scored); the finished file's size and checksum go into P.manifest.json and
``queries.jsonl``'s into queries.manifest.json, and :func:`load_run` checks both before handing them out.

With ``torchrun --nproc_per_node N`` (or any launcher that sets ``RANK``/``WORLD_SIZE``) the shards are
split round-robin across processes through ``torch.distributed`` (gloo on CPU, nccl on GPU); each
process writes its own rows of the shared memmap.
"""
from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from gdr.config import RerunCommand
from gdr.device import local_device
from gdr.io import (
    atomic_write_json,
    bytes_digest,
    check_manifest_files,
    file_digest,
    hash_strings,
    no_space,
    read_jsonl,
    read_manifest,
    write_jsonl,
    write_manifest,
)

log = logging.getLogger(__name__)

__all__ = ["PRun", "sample_run", "score_run", "load_run", "check_p", "read_queries", "dist_info", "local_device",
           "score_folder", "copy_run_queries"]

P_FILE, P_MANIFEST, SHARD_DIR = "P.npy", "P.manifest.json", "P.shards"
Q_FILE, Q_MANIFEST, Q_PARTIAL = "queries.jsonl", "queries.manifest.json", "queries.partial.jsonl"


@dataclass
class PRun:
    """A finished (or partial) P-matrix run loaded from disk."""

    path: Path
    doc_ids: list[str]
    queries: list[dict]
    logp: np.ndarray  # (n_docs, n_queries) memmap, read-only
    manifest: dict

    @property
    def query_texts(self) -> list[str]:
        return [q["text"] for q in self.queries]


def dist_info() -> tuple[int, int]:
    """(rank, world_size), initialising torch.distributed when a launcher asked for several processes:
    NCCL when each local rank has a GPU of its own, gloo otherwise (CPU, or ranks sharing a GPU)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return 0, 1
    import torch.distributed as dist

    if not dist.is_initialized():
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        nccl = torch.cuda.is_available() and local_world <= torch.cuda.device_count()
        if nccl:
            local_device("cuda")
        dist.init_process_group("nccl" if nccl else "gloo")
    return dist.get_rank(), dist.get_world_size()


def _barrier(world: int) -> None:
    if world > 1:
        import torch.distributed as dist

        dist.barrier()


# ---------------------------------------------------------------------------------------------- sampling
def sample_run(lm, texts: Sequence[str], doc_ids: Sequence[str], out_dir: str | os.PathLike, n_queries: int,
               seed: int = 0, batch_size: int | str = "auto", max_new_tokens: int = 32, top_k: int = 50,
               top_p: float = 0.99, temperature: float = 1.0, progress: bool = True, compile: bool | str = "auto",
               compile_min_queries: int | str = "auto") -> list[dict]:
    """Sample ``n_queries`` queries from the corpus into ``out_dir/queries.jsonl`` (resumable).

    An existing finished ``queries.jsonl`` with the same settings is reused; one with different settings,
    drawn by another sampler version, or decoded under other numerics (device kind, dtype, compiled or eager
    decode: :mod:`gdr.lm.numerics`, recorded as ``numerics``), is an error (never silently overwritten or
    mixed). ``batch_size`` (or ``auto``) changes only the speed: query j is the same at any batch size, and a
    resumed run equals an uninterrupted one. ``compile`` / ``compile_min_queries``: whether the decode step is
    compiled (:func:`gdr.lm.compiling.want_compile`), decided once for the folder's ``n_queries``.
    """
    from gdr.lm.compiling import want_compile
    from gdr.lm.decode import SAMPLER_VERSION

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ident = {"sampler": SAMPLER_VERSION, "lm": lm.describe(), "doc_ids_hash": hash_strings(doc_ids),
             "texts_hash": hash_strings(texts), "n_queries": n_queries, "seed": seed,
             "max_new_tokens": max_new_tokens, "top_k": top_k, "top_p": top_p, "temperature": temperature}
    old = read_manifest(out, Q_MANIFEST)
    if old is None and (out / Q_FILE).exists():  # never sampled over: someone put these queries here
        raise FileExistsError(
            f"{out / Q_FILE} has no {Q_MANIFEST}: gdr did not sample it here and will not sample over it; to score "
            f"documents against the queries of another run use `gdr score queries_from=<that run>` (it copies them "
            f"with their manifest), or delete {out / Q_FILE} to sample new queries")
    if old is not None and old.get("from_run"):
        raise FileExistsError(
            f"{out / Q_FILE} holds the queries of {old['from_run']}, copied by `gdr score queries_from=...`: pass "
            f"queries_from={old['from_run']} again to score against them, or use another out= folder to sample new "
            "ones")
    _check_sampler(out, Q_MANIFEST, old, "queries.* (and P.*, scored on them)")
    numerics = _decode_numerics(lm, want_compile(compile, lm.device, n_queries, compile_min_queries))
    _check_numerics(out, Q_MANIFEST, old, numerics, "queries.* (and P.*, scored on them)")
    if old is not None and {k: old.get(k) for k in ident} != json.loads(json.dumps(ident)):
        changed = [k for k in ident if old.get(k) != json.loads(json.dumps(ident[k]))]
        raise FileExistsError(
            f"{out / Q_MANIFEST} was written with different settings ({', '.join(changed)}); "
            f"use another out= folder, or delete {out / Q_FILE} and {out / Q_MANIFEST} (and any {P_FILE}, "
            f"{P_MANIFEST}, P.shards/ scored from them) to sample again")
    if old is not None and old.get("status") == "complete" and (out / Q_FILE).exists():
        rows = read_queries(out, old)
        log.info("reusing %d sampled queries in %s", old["n_queries"], out / Q_FILE)
        return rows
    write_manifest(out, Q_MANIFEST, **ident, numerics=numerics, status="running")

    from gdr.lm import SampledQueries

    start = None
    partial = out / Q_PARTIAL
    if partial.exists():
        rows = read_jsonl(partial)[:n_queries]
        if rows:
            log.info("resuming sampling after %d queries", len(rows))
            start = SampledQueries([r["text"] for r in rows], np.array([r["source_index"] for r in rows]),
                                   int(rows[-1].get("n_redrawn", 0)))

    def checkpoint(sq: SampledQueries) -> None:
        write_jsonl(partial, ({"text": t, "source_index": int(s), "n_redrawn": sq.n_redrawn}
                              for t, s in zip(sq.texts, sq.source_index)))

    t0 = time.perf_counter()
    sq = lm.sample_queries(texts, n_queries, seed=seed, batch_size=batch_size, max_new_tokens=max_new_tokens,
                           top_k=top_k, top_p=top_p, temperature=temperature, progress=progress,
                           start=start, on_batch=checkpoint, compile=compile,
                           compile_min_queries=compile_min_queries)
    rows = [{"qid": f"q{j}", "text": t, "source_doc_id": doc_ids[int(s)], "source_index": int(s)}
            for j, (t, s) in enumerate(zip(sq.texts, sq.source_index))]
    write_jsonl(out / Q_FILE, rows)
    write_manifest(out, Q_MANIFEST, **ident, numerics=numerics, status="complete", queries_hash=hash_strings(sq.texts),
                   n_redrawn=sq.n_redrawn, file=file_digest(out / Q_FILE),
                   seconds_last_call=round(time.perf_counter() - t0, 2), compile_last_call=sq.compile)
    partial.unlink(missing_ok=True)
    return rows


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
                                "temperature", "n_redrawn", "numerics") if k in man}
    write_manifest(out, Q_MANIFEST, **keep, from_run=origin, status="complete", queries_hash=texts_hash,
                   file=file_digest(out / Q_FILE))
    log.info("scoring against the %d queries of %s (copied into %s)", len(rows), origin, out / Q_FILE)
    return rows, scorer


def _check_sampler(out: Path, manifest: str, old: dict | None, files: str) -> None:
    """Refuse queries drawn by another sampler version (other queries for the same seed), in one line."""
    from gdr.lm.decode import SAMPLER_VERSION

    if old is not None and old.get("sampler") != SAMPLER_VERSION:
        raise FileExistsError(
            f"{out / manifest}: these queries were drawn by sampler {old.get('sampler') or 'hf-generate'}, this "
            f"gdr samples with {SAMPLER_VERSION} (other queries for the same seed); to re-sample, delete "
            f"{files} in {out} or use another out= folder")


def _decode_numerics(lm, compiled: bool) -> dict:
    """The numerics of ``lm``'s decode loop with the decode path ``compiled`` (set on it for the run)."""
    dec = lm.decoder()
    dec.set_compile(compiled)
    return dec.numerics()


def _check_numerics(out: Path, manifest: str, old: dict | None, now: dict, files: str) -> None:
    """Refuse, in one line, queries decoded under other numerics than this run's (a folder made before they
    were recorded is taken as it is): resuming would mix the two, reusing would hand out other queries."""
    from gdr.lm.numerics import describe_numerics

    was = (old or {}).get("numerics")
    if was is not None and was != now:
        raise FileExistsError(
            f"{out / manifest}: these queries were decoded on {describe_numerics(was)}, this run decodes on "
            f"{describe_numerics(now)} (other near-ties, so other queries for the same seed; never mixed in one "
            f"folder); run it where they were decoded (device=, sample.compile=), or to re-sample here delete "
            f"{files} in {out}, or use another out= folder")


def read_queries(out_dir: str | os.PathLike, manifest: dict | None = None) -> list[dict]:
    """``queries.jsonl`` of a finished sampling run, checked against its manifest (size and checksum, or
    for manifests of older versions the count and the hash of the texts).

    A file that no longer matches was changed after sampling; editing it back cannot restore what the
    P matrix was scored from, so the error says to re-sample.
    """
    out = Path(out_dir)
    man = read_manifest(out, Q_MANIFEST) if manifest is None else manifest
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


# ---------------------------------------------------------------------------------------------- scoring
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
    """Drop the markers of shards whose rows no longer match their checksum (they are re-scored).

    Markers of older versions hold no checksum: their rows are accepted when finite and non-zero (a
    log-probability is < 0; zeros are what a truncated-and-refilled file holds) and their checksum is
    recorded. Returns the number of markers dropped."""
    dropped = 0
    for marker in sorted(shard_dir.glob("*.done")):
        s = int(marker.stem)
        rows = _shard_rows(order, shard_size, s)
        try:
            want = json.loads(marker.read_text() or "{}").get("rows_crc32")
        except (json.JSONDecodeError, AttributeError):
            want = "unreadable marker"
        if want is None:  # written by an older version: check what can be checked, then record
            block = np.asarray(P[rows], dtype=np.float32)
            if len(rows) and np.isfinite(block).all() and (block != 0).all():
                atomic_write_json(marker, {"rows_crc32": _rows_digest(P, rows)})
                continue
            problem = "hold zeros or non-finite values"
        elif _rows_digest(P, rows) != want:
            problem = "differ from the checksum in its marker"
        else:
            continue
        log.warning("%s: rows of shard %d %s; re-scoring that shard", p_path, s, problem)
        marker.unlink()
        dropped += 1
    return dropped


def _identity(lm, texts, doc_ids, queries, dtype, shard_size, doc_batch_size, max_query_tokens,
              numerics: dict) -> dict:
    """What P's bytes depend on: the model and prompt, the inputs, the sizes (their resolved values) and the
    numerics (device kind and compute dtype, :func:`gdr.lm.numerics.scoring_numerics`)."""
    return {"lm": lm.describe(), "doc_ids_hash": hash_strings(doc_ids), "texts_hash": hash_strings(texts),
            "queries_hash": hash_strings(queries), "shape": [len(doc_ids), len(queries)], "dtype": dtype,
            "shard_size": shard_size, "doc_batch_size": doc_batch_size, "max_query_tokens": max_query_tokens,
            **numerics}


# Identity keys that older manifests lack: absent there means what `auto` resolves to (the only behaviour then).
_NEWER_KEYS = {"compute_dtype", "device"}


def _prepare_p(out: Path, ident: dict, doc_ids: Sequence[str], shape: tuple[int, int], dtype: str,
               order: np.ndarray, shard_size: int, world: int) -> None:
    """Rank 0's part before scoring: refuse a P of another identity, repair or re-create P.npy (a cut file
    keeps the shards before the cut; a broken header re-scores all), drop the markers of damaged shards, and
    record the doc ids and a running manifest."""
    p_path, shard_dir = out / P_FILE, out / SHARD_DIR
    out.mkdir(parents=True, exist_ok=True)
    old = read_manifest(out, P_MANIFEST)
    if old is not None:
        stale = [k for k in ident if (k in old or k not in _NEWER_KEYS)
                 and json.loads(json.dumps(old.get(k))) != json.loads(json.dumps(ident[k]))]
        if stale:
            said = [f"{k} {old[k]} there, {ident[k]} here" if k in ("device", "compute_dtype") else k
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
    write_manifest(out, P_MANIFEST, **ident, status="running", world_size=world)


def score_run(lm, texts: Sequence[str], doc_ids: Sequence[str], queries: Sequence[str],
              out_dir: str | os.PathLike, dtype: str = "float32", shard_size: int = 32,
              doc_batch_size: int = 1, max_query_tokens: int = 2048, progress: bool = True,
              max_shards: int | None = None, compute_dtype: str = "auto") -> Path:
    """Score every (document, query) pair into ``out_dir/P.npy``; resumes unfinished runs.

    Parameters
    ----------
    texts, doc_ids : the corpus, length n_docs, in row order.
    queries : query texts, length n_queries, in column order.
    dtype : ``float32`` or ``float16`` storage.
    compute_dtype : ``auto`` | ``bfloat16`` | ``float32``: the dtype the passes run in
        (:func:`gdr.lm.numerics.score_compute_dtype`); the manifest records what it resolved to.
    max_shards : stop after this many shards in this call (testing kills and partial runs).

    Returns the path of ``P.npy``.
    """
    if dtype not in ("float32", "float16"):
        raise ValueError(f"score.dtype={dtype!r}: use float32 or float16")
    if len(texts) != len(doc_ids):
        raise ValueError(f"{len(texts)} texts but {len(doc_ids)} doc ids")
    from gdr.lm.numerics import scoring_numerics

    numerics = scoring_numerics(lm.device, compute_dtype, next(lm.model.parameters()).dtype)
    out = Path(out_dir)
    rank, world = dist_info()
    ident = _identity(lm, texts, doc_ids, queries, dtype, shard_size, doc_batch_size, max_query_tokens, numerics)
    p_path, shard_dir = out / P_FILE, out / SHARD_DIR
    prompt_len = np.array([len(p) for p in lm.prompt_ids(texts)])
    order = np.argsort(prompt_len, kind="stable")
    n_shards = -(-len(order) // shard_size)
    if rank == 0:
        _prepare_p(out, ident, doc_ids, (len(doc_ids), len(queries)), dtype, order, shard_size, world)
    _barrier(world)

    # shards scored together: a doc batch never straddles two calls
    per_call = max(1, -(-doc_batch_size // shard_size))
    groups = [range(g, min(g + per_call, n_shards)) for g in range(0, n_shards, per_call)]
    mine = [groups[g] for g in range(rank, len(groups), world) if _pending(shard_dir, groups[g])]
    if max_shards is not None:
        mine = mine[:max(1, max_shards // per_call)]
    t0 = time.perf_counter()
    score = {"doc_batch_size": doc_batch_size, "max_query_tokens": max_query_tokens, "progress": False,
             "compute_dtype": getattr(torch, numerics["compute_dtype"])}
    _score_shards(lm, texts, queries, p_path, shard_dir, order, shard_size, mine, dtype, score, progress)
    _barrier(world)
    finished = len(list(shard_dir.glob("*.done"))) == n_shards
    if rank == 0:
        write_manifest(out, P_MANIFEST, **ident, status="complete" if finished else "partial", world_size=world,
                       seconds_last_call=round(time.perf_counter() - t0, 2),
                       **({"file": file_digest(p_path)} if finished else {}))
    return p_path


def _shard_rows(order: np.ndarray, shard_size: int, s: int) -> np.ndarray:
    """The rows of P in shard ``s``, ascending: shards cut the prompt-length ``order`` into ``shard_size`` rows."""
    return np.sort(order[s * shard_size:(s + 1) * shard_size])


def _pending(shard_dir: Path, group: Sequence[int]) -> list[int]:
    """The shards of ``group`` without a ``.done`` marker."""
    return [s for s in group if not (shard_dir / f"{s:05d}.done").exists()]


def _score_shards(lm, texts: Sequence[str], queries: Sequence[str], p_path: Path, shard_dir: Path,
                  order: np.ndarray, shard_size: int, mine: list[range], dtype: str, score: dict,
                  progress: bool) -> None:
    """Score this process's groups of shards into ``p_path``, one ``lm.score`` call per group (keywords
    ``score``); each finished shard's rows are flushed, then its ``.done`` marker written with their checksum."""
    rank, world = dist_info()
    n_shards = -(-len(order) // shard_size)
    P = np.load(p_path, mmap_mode="r+")
    if rank == 0:
        log.info("P %s: %d shards of %d docs, %d left (%d on this process of %d)",
                 tuple(P.shape), n_shards, shard_size, n_shards - len(list(shard_dir.glob("*.done"))),
                 sum(len(_pending(shard_dir, g)) for g in mine), world)
    pairs = sum(len(_shard_rows(order, shard_size, s)) for g in mine for s in _pending(shard_dir, g)) * len(queries)
    bar = tqdm(total=pairs, desc=f"score[{rank}]" if world > 1 else "score", unit="pair", unit_scale=True,
               disable=not progress or pairs == 0)  # nothing left (P reused): no empty bar
    for group in mine:
        if not _pending(shard_dir, group):  # finished meanwhile by another process on this folder
            continue
        # the whole group, finished shards too (a resumed group batches as an uninterrupted one)
        rows = [_shard_rows(order, shard_size, s) for s in group]
        every = np.concatenate(rows)
        lp = lm.score([texts[i] for i in every], queries, **score)
        ends = np.cumsum([len(r) for r in rows])
        for s, r, block in zip(group, rows, np.split(lp, ends[:-1])):
            if (shard_dir / f"{s:05d}.done").exists():
                continue
            block = np.ascontiguousarray(block.astype(dtype))
            P[r] = block
            P.flush()
            atomic_write_json(shard_dir / f"{s:05d}.done", {"rows_crc32": bytes_digest(block)})
            bar.update(block.size)
            bar.set_postfix(shard=f"{s + 1}/{n_shards}")
    bar.close()
    del P


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


def load_run(out_dir: str | os.PathLike, require_complete: bool = True) -> PRun:
    """Open a run folder's P matrix (memmap, read-only), doc ids and queries."""
    out = Path(out_dir)
    man = read_manifest(out, P_MANIFEST)
    if man is None:
        raise FileNotFoundError(f"{out / P_MANIFEST} not found: run `{RerunCommand('score', out)}` first")
    if require_complete and man.get("status") != "complete":
        raise RuntimeError(f"{out / P_FILE} is {man.get('status')}: rerun `{RerunCommand('score', out)}` to finish it")
    check_p(out, man)
    rescore = RerunCommand("score", out, "rerun `{}` (it re-scores what is damaged)")
    p_path = out / P_FILE
    try:
        with open(out / "doc_ids.json", encoding="utf-8") as f:
            doc_ids = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{out / 'doc_ids.json'}: unreadable ({e}); {rescore}") from None
    if man.get("doc_ids_hash") and hash_strings(doc_ids) != man["doc_ids_hash"]:
        raise ValueError(f"{out / 'doc_ids.json'}: does not match {P_MANIFEST} (doc ids hash); {rescore}")
    queries = read_queries(out) if (out / Q_FILE).exists() else []
    if queries and man.get("queries_hash") and hash_strings(q["text"] for q in queries) != man["queries_hash"]:
        raise ValueError(f"{out / Q_FILE}: its queries are not the ones {p_path} was scored with; {rescore}")
    return PRun(out, doc_ids, queries, np.load(p_path, mmap_mode="r"), man)


# ------------------------------------------------------------------------------ per-document generation
DOCQ_FILE, DOCQ_MANIFEST = "doc_queries.jsonl", "doc_queries.manifest.json"


def sample_per_doc_run(lm, texts: Sequence[str], doc_ids: Sequence[str], out_dir: str | os.PathLike,
                       n_per_doc: int, seed: int = 0, batch_size: int | str = "auto", max_new_tokens: int = 32,
                       top_k: int = 50, top_p: float = 0.99, temperature: float = 1.0,
                       progress: bool = True, compile: bool | str = "auto",
                       compile_min_queries: int | str = "auto") -> Path:
    """Generate ``n_per_doc`` queries for every document into ``out_dir/doc_queries.jsonl``.

    One line ``{"doc_id", "queries": [...]}`` per document, in corpus order: the training data of the
    retriever (NCI/BMI's generated queries) and the input of the BMI indexer. Resumable: finished
    documents are appended (and flushed) batch by batch; a rerun continues after the last whole line.
    ``batch_size`` counts queries (``batch_size // n_per_doc`` documents per batch); the queries of
    document i depend only on (seed, i), so neither it nor a resume changes the file. ``compile`` /
    ``compile_min_queries`` and the recorded ``numerics`` as in :func:`sample_run` (decided for all the
    corpus's queries).
    """
    from gdr.lm.compiling import want_compile
    from gdr.lm.decode import SAMPLER_VERSION

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / DOCQ_FILE
    ident = {"sampler": SAMPLER_VERSION, "lm": lm.describe(), "doc_ids_hash": hash_strings(doc_ids),
             "texts_hash": hash_strings(texts), "n_per_doc": n_per_doc, "seed": seed,
             "max_new_tokens": max_new_tokens, "top_k": top_k, "top_p": top_p, "temperature": temperature}
    old = read_manifest(out, DOCQ_MANIFEST)
    _check_sampler(out, DOCQ_MANIFEST, old, "doc_queries.*")
    numerics = _decode_numerics(lm, want_compile(compile, lm.device, len(texts) * n_per_doc, compile_min_queries))
    _check_numerics(out, DOCQ_MANIFEST, old, numerics, "doc_queries.*")
    if old is not None:
        changed = [k for k in ident if json.loads(json.dumps(old.get(k))) != json.loads(json.dumps(ident[k]))]
        if changed:
            raise FileExistsError(f"{out / DOCQ_MANIFEST} was written with different settings "
                                  f"({', '.join(changed)}); use another out= folder or delete {path} and "
                                  f"{out / DOCQ_MANIFEST}")
    if old is not None and old.get("status") == "complete":
        check_manifest_files(out, name=DOCQ_MANIFEST, fix=RerunCommand("sample", out, f"re-sample: delete {path} and "
                                                                       f"{out / DOCQ_MANIFEST}, then run `{{}}`"))
    write_manifest(out, DOCQ_MANIFEST, **ident, numerics=numerics, status="running")
    done = 0
    if path.exists():
        rows = read_jsonl(path, drop_torn_tail=True)[:len(texts)]
        done = len(rows)
        write_jsonl(path, rows)  # whole lines only; a torn line is redone
        if done:
            log.info("resuming per-document generation after %d documents", done)
    bs = lm.auto_batch_size(max_new_tokens) if batch_size == "auto" else int(batch_size)
    docs_per_batch = max(1, bs // n_per_doc)
    t0 = time.perf_counter()
    bar = tqdm(total=len(texts), initial=done, desc="queries per doc", unit="doc",
               disable=not progress or done >= len(texts))
    with open(path, "a", encoding="utf-8") as f:
        for b0 in range(done, len(texts), docs_per_batch):
            batch = list(texts[b0:b0 + docs_per_batch])
            gen = lm.sample_per_doc(batch, n_per_doc, first=b0, seed=seed, max_new_tokens=max_new_tokens,
                                    top_k=top_k, top_p=top_p, temperature=temperature,
                                    max_rows=bs)
            for i, qs in enumerate(gen):
                f.write(json.dumps({"doc_id": doc_ids[b0 + i], "queries": qs}, ensure_ascii=False) + "\n")
            f.flush()
            os.fsync(f.fileno())
            bar.update(len(batch))
    bar.close()
    write_manifest(out, DOCQ_MANIFEST, **ident, numerics=numerics, status="complete", files=[DOCQ_FILE],
                   seconds_last_call=round(time.perf_counter() - t0, 2),
                   compile_last_call=lm.decoder().compile_record())
    return path
