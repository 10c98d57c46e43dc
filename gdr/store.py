"""The P-matrix store: sampled queries and log p(query | doc) in a run folder, resumable and shardable.

A run folder holds::

    doc_ids.json         the documents, in row order
    queries.jsonl        {"qid", "text", "source_doc_id", "source_index"} per line, in column order
    queries.manifest.json
    P.npy                log P, float32 (or float16), shape (n_docs, n_queries), a .npy memmap
    P.manifest.json      model, prompt, doc-id / text / query hashes, shape, dtype, sharding, status
    P.shards/            one ``NNNNN.done`` marker per finished shard

Scoring walks shards of ``shard_size`` documents. Documents are ordered by prompt length once (stable
sort), and shard s is the s-th run of that order, so a shard's batches, and therefore its numbers, do not
depend on which process computes it or when. A shard's rows are flushed to disk before its marker is
written, so after a kill (even SIGKILL) a rerun skips finished shards and recomputes only unfinished
ones: the finished matrix equals an uninterrupted run's exactly.

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

from gdr.io import atomic_write_json, hash_strings, read_jsonl, read_manifest, write_jsonl, write_manifest

log = logging.getLogger(__name__)

__all__ = ["PRun", "sample_run", "score_run", "load_run", "dist_info", "local_device"]

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


def local_device(device: str | None = "auto") -> str:
    """The device of this process: under a launcher that sets ``LOCAL_RANK`` (``torchrun``), ``auto`` and
    ``cuda`` mean ``cuda:{LOCAL_RANK % n_gpus}``, made the current CUDA device (before NCCL binds to it);
    anything else is returned as given."""
    device = "auto" if device is None else str(device)
    local = os.environ.get("LOCAL_RANK")
    if local is None or device not in ("auto", "cuda") or not torch.cuda.is_available():
        return device
    gpu = int(local) % torch.cuda.device_count()
    torch.cuda.set_device(gpu)
    return f"cuda:{gpu}"


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
               seed: int = 0, batch_size: int = 16, max_new_tokens: int = 32, top_k: int = 50,
               top_p: float = 0.99, temperature: float = 1.0, progress: bool = True) -> list[dict]:
    """Sample ``n_queries`` queries from the corpus into ``out_dir/queries.jsonl`` (resumable by batch).

    An existing finished ``queries.jsonl`` with the same settings is reused; one with different settings
    is an error (never silently overwritten).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ident = {"lm": lm.describe(), "doc_ids_hash": hash_strings(doc_ids), "texts_hash": hash_strings(texts),
             "n_queries": n_queries, "seed": seed, "batch_size": batch_size, "max_new_tokens": max_new_tokens,
             "top_k": top_k, "top_p": top_p, "temperature": temperature}
    old = read_manifest(out, Q_MANIFEST)
    if old is not None and {k: old.get(k) for k in ident} != json.loads(json.dumps(ident)):
        changed = [k for k in ident if old.get(k) != json.loads(json.dumps(ident[k]))]
        raise FileExistsError(
            f"{out / Q_MANIFEST} was written with different settings ({', '.join(changed)}); "
            "use another out= folder or delete that run's queries")
    if old is not None and old.get("status") == "complete" and (out / Q_FILE).exists():
        log.info("reusing %d sampled queries in %s", old["n_queries"], out / Q_FILE)
        return read_jsonl(out / Q_FILE)
    write_manifest(out, Q_MANIFEST, **ident, status="running")

    from gdr.lm import SampledQueries

    start = None
    partial = out / Q_PARTIAL
    if partial.exists():
        rows = read_jsonl(partial)
        keep = len(rows) - len(rows) % batch_size if len(rows) < n_queries else n_queries
        rows = rows[:keep]
        if rows:
            log.info("resuming sampling after %d queries", len(rows))
            start = SampledQueries([r["text"] for r in rows], np.array([r["source_index"] for r in rows]),
                                   int(rows[-1].get("n_redrawn", 0)))

    def checkpoint(sq: SampledQueries) -> None:
        write_jsonl(partial, ({"text": t, "source_index": int(s), "n_redrawn": sq.n_redrawn}
                              for t, s in zip(sq.texts, sq.source_index)))

    sq = lm.sample_queries(texts, n_queries, seed=seed, batch_size=batch_size, max_new_tokens=max_new_tokens,
                           top_k=top_k, top_p=top_p, temperature=temperature, progress=progress,
                           start=start, on_batch=checkpoint)
    rows = [{"qid": f"q{j}", "text": t, "source_doc_id": doc_ids[int(s)], "source_index": int(s)}
            for j, (t, s) in enumerate(zip(sq.texts, sq.source_index))]
    write_jsonl(out / Q_FILE, rows)
    write_manifest(out, Q_MANIFEST, **ident, status="complete", queries_hash=hash_strings(sq.texts),
                   n_redrawn=sq.n_redrawn)
    partial.unlink(missing_ok=True)
    return rows


# ---------------------------------------------------------------------------------------------- scoring
def _identity(lm, texts, doc_ids, queries, dtype, shard_size, doc_batch_size, max_query_tokens) -> dict:
    return {"lm": lm.describe(), "doc_ids_hash": hash_strings(doc_ids), "texts_hash": hash_strings(texts),
            "queries_hash": hash_strings(queries), "shape": [len(doc_ids), len(queries)], "dtype": dtype,
            "shard_size": shard_size, "doc_batch_size": doc_batch_size, "max_query_tokens": max_query_tokens}


def score_run(lm, texts: Sequence[str], doc_ids: Sequence[str], queries: Sequence[str],
              out_dir: str | os.PathLike, dtype: str = "float32", shard_size: int = 32,
              doc_batch_size: int = 1, max_query_tokens: int = 2048, progress: bool = True,
              max_shards: int | None = None) -> Path:
    """Score every (document, query) pair into ``out_dir/P.npy``; resumes unfinished runs.

    Parameters
    ----------
    texts, doc_ids : the corpus, length n_docs, in row order.
    queries : query texts, length n_queries, in column order.
    dtype : ``float32`` or ``float16`` storage.
    max_shards : stop after this many shards in this call (testing kills and partial runs).

    Returns the path of ``P.npy``.
    """
    if dtype not in ("float32", "float16"):
        raise ValueError(f"score.dtype={dtype!r}: use float32 or float16")
    if len(texts) != len(doc_ids):
        raise ValueError(f"{len(texts)} texts but {len(doc_ids)} doc ids")
    out = Path(out_dir)
    rank, world = dist_info()
    ident = _identity(lm, texts, doc_ids, queries, dtype, shard_size, doc_batch_size, max_query_tokens)
    p_path, shard_dir = out / P_FILE, out / SHARD_DIR
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        old = read_manifest(out, P_MANIFEST)
        if old is not None:
            stale = [k for k in ident if json.loads(json.dumps(old.get(k))) != json.loads(json.dumps(ident[k]))]
            if stale:
                raise FileExistsError(
                    f"{out / P_MANIFEST} belongs to a different P matrix (differs in: {', '.join(stale)}); "
                    "use another out= folder, or delete P.npy, P.manifest.json and P.shards/ to start over")
        if old is None or not p_path.exists():
            shard_dir.mkdir(parents=True, exist_ok=True)
            for f in shard_dir.glob("*.done"):
                f.unlink()
            np.lib.format.open_memmap(p_path, mode="w+", dtype=dtype, shape=(len(doc_ids), len(queries))).flush()
            atomic_write_json(out / "doc_ids.json", list(doc_ids))
        write_manifest(out, P_MANIFEST, **ident, status="running", world_size=world)
    _barrier(world)

    P = np.load(p_path, mmap_mode="r+")
    prompt_len = np.array([len(p) for p in lm.prompt_ids(texts)])
    order = np.argsort(prompt_len, kind="stable")
    n_shards = -(-len(order) // shard_size)
    mine = [s for s in range(rank, n_shards, world) if not (shard_dir / f"{s:05d}.done").exists()]
    if max_shards is not None:
        mine = mine[:max_shards]
    done_before = n_shards - len(list(shard_dir.glob("*.done")))
    if rank == 0:
        log.info("P %s: %d shards of %d docs, %d left (%d on this process of %d)",
                 tuple(P.shape), n_shards, shard_size, done_before, len(mine), world)
    pairs = sum(len(order[s * shard_size:(s + 1) * shard_size]) for s in mine) * len(queries)
    bar = tqdm(total=pairs, desc=f"score[{rank}]" if world > 1 else "score", unit="pair", unit_scale=True,
               disable=not progress)
    t0 = time.perf_counter()
    for s in mine:
        if (shard_dir / f"{s:05d}.done").exists():  # finished meanwhile by another process on this folder
            continue
        rows = np.sort(order[s * shard_size:(s + 1) * shard_size])
        lp = lm.score([texts[i] for i in rows], queries, doc_batch_size=doc_batch_size,
                      max_query_tokens=max_query_tokens, progress=False)
        P[rows] = lp.astype(dtype)
        P.flush()
        (shard_dir / f"{s:05d}.done").touch()
        bar.update(lp.size)
        bar.set_postfix(shard=f"{s + 1}/{n_shards}")
    bar.close()
    del P
    _barrier(world)
    finished = len(list(shard_dir.glob("*.done"))) == n_shards
    if rank == 0:
        write_manifest(out, P_MANIFEST, **ident, status="complete" if finished else "partial", world_size=world,
                       seconds_last_call=round(time.perf_counter() - t0, 2))
    return p_path


def load_run(out_dir: str | os.PathLike, require_complete: bool = True) -> PRun:
    """Open a run folder's P matrix (memmap, read-only), doc ids and queries."""
    out = Path(out_dir)
    man = read_manifest(out, P_MANIFEST)
    if man is None:
        raise FileNotFoundError(f"{out / P_MANIFEST} not found: run `gdr score out={out}` first")
    if require_complete and man.get("status") != "complete":
        raise RuntimeError(f"{out / P_FILE} is {man.get('status')}: rerun `gdr score out={out}` to finish it")
    with open(out / "doc_ids.json", encoding="utf-8") as f:
        doc_ids = json.load(f)
    queries = read_jsonl(out / Q_FILE) if (out / Q_FILE).exists() else []
    return PRun(out, doc_ids, queries, np.load(out / P_FILE, mmap_mode="r"), man)


# ------------------------------------------------------------------------------ per-document generation
DOCQ_FILE = "doc_queries.jsonl"


def sample_per_doc_run(lm, texts: Sequence[str], doc_ids: Sequence[str], out_dir: str | os.PathLike,
                       n_per_doc: int, seed: int = 0, batch_size: int = 16, max_new_tokens: int = 32,
                       top_k: int = 50, top_p: float = 0.99, temperature: float = 1.0,
                       progress: bool = True) -> Path:
    """Generate ``n_per_doc`` queries for every document into ``out_dir/doc_queries.jsonl``.

    One line ``{"doc_id", "queries": [...]}`` per document, in corpus order: the training data of the
    retriever (NCI/BMI's generated queries) and the input of the BMI indexer. Resumable: finished
    batches are appended (and flushed) as they complete; a rerun continues after the last full batch.
    Batch b is generated with seed ``seed * 1_000_003 + b`` so a resumed file equals an uninterrupted one.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / DOCQ_FILE
    ident = {"lm": lm.describe(), "doc_ids_hash": hash_strings(doc_ids), "texts_hash": hash_strings(texts),
             "n_per_doc": n_per_doc, "seed": seed, "batch_size": batch_size, "max_new_tokens": max_new_tokens,
             "top_k": top_k, "top_p": top_p, "temperature": temperature}
    old = read_manifest(out, "doc_queries.manifest.json")
    if old is not None:
        changed = [k for k in ident if json.loads(json.dumps(old.get(k))) != json.loads(json.dumps(ident[k]))]
        if changed:
            raise FileExistsError(f"{out / 'doc_queries.manifest.json'} was written with different settings "
                                  f"({', '.join(changed)}); use another out= folder or delete {path}")
    write_manifest(out, "doc_queries.manifest.json", **ident, status="running")
    done = 0
    if path.exists():
        rows = read_jsonl(path, drop_torn_tail=True)
        done = len(rows) - (len(rows) % batch_size if len(rows) < len(texts) else 0)
        write_jsonl(path, rows[:done])  # keep whole batches only; the torn batch is redone
        if done:
            log.info("resuming per-document generation after %d documents", done)
    bar = tqdm(total=len(texts), initial=done, desc="queries per doc", unit="doc", disable=not progress)
    with open(path, "a", encoding="utf-8") as f:
        for b0 in range(done, len(texts), batch_size):
            batch = list(texts[b0:b0 + batch_size])
            gen = lm.generate(batch, seed=seed * 1_000_003 + b0, max_new_tokens=max_new_tokens, top_k=top_k,
                              top_p=top_p, temperature=temperature, num_return_sequences=n_per_doc)
            for i in range(len(batch)):
                qs = [q for q in gen[i * n_per_doc:(i + 1) * n_per_doc] if q]
                f.write(json.dumps({"doc_id": doc_ids[b0 + i], "queries": qs}, ensure_ascii=False) + "\n")
            f.flush()
            os.fsync(f.fileno())
            bar.update(len(batch))
    bar.close()
    write_manifest(out, "doc_queries.manifest.json", **ident, status="complete")
    return path
