"""Stage ``score``: log p(query | doc) for every pair, the matrix P (Algorithm 1, line 2; Eq. 1).

:func:`score_corpus` samples the queries (unless ``queries.jsonl`` exists) and scores them, in this process,
split across ``torchrun`` ranks, or in ``processes`` processes it starts (:func:`score_in_processes`);
:func:`score_queries` scores given queries with a loaded model; :func:`score_run` is the job that fills
``P.npy`` (the folder's format, checks and shard markers: :mod:`gdr.store`).

:func:`score_run` walks shards of ``shard_size`` documents in prompt-length order. Shards are scored in fixed
groups of ``ceil(doc_batch_size / shard_size)`` consecutive shards (one shard when a shard holds a doc batch),
so that a small shard never cuts a doc batch short; a group's batches, and therefore its numbers, do not depend
on which process computes it or when. The prompts and queries are tokenised once per run (the model caches
them), whatever the shard size. After a kill a rerun skips finished shards, so the finished matrix equals an
uninterrupted run's exactly. With ``torchrun --nproc_per_node N`` (or any launcher that sets
``RANK``/``WORLD_SIZE``) the shard groups are split round-robin across processes through ``torch.distributed``
(gloo on CPU, nccl on GPU); each process writes its own rows of the shared memmap.
"""
from __future__ import annotations

import contextlib
import json
import logging
import multiprocessing as mp
import os
import shlex
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
import torch.distributed as dist
from tqdm.auto import tqdm

from gdr.device import dist_info, local_device, machine_differences, machine_record, torch_threads
from gdr.guard import die_with_parent, holding
from gdr.io import hash_strings, read_jsonl, read_manifest
from gdr.lm.numerics import scoring_numerics
from gdr.lm.scoring import QUERY_END, auto_score_sizes
from gdr.logs import setup_logging
from gdr.rerun import RerunCommand
from gdr.stages.sample import check_texts, sample_queries
from gdr.stages.settings import LMSettings, SampleSettings, ScoreSettings
from gdr.store import (
    BY_SOURCE,
    P_FILE,
    P_MANIFEST,
    Q_MANIFEST,
    SHARD_DIR,
    Reuse,
    check_p,
    copy_run_queries,
    finish_p,
    pending_shards,
    prepare_p,
    query_ended,
    reuse_map,
    score_folder,
    shard_rows,
    text_digests,
    write_shard,
)

__all__ = ["resolve_sizes", "score_corpus", "score_queries", "score_in_processes", "score_run"]

log = logging.getLogger(__name__)


def resolve_sizes(lm, settings: ScoreSettings) -> ScoreSettings:
    """``settings`` with ``doc_batch_size`` and ``max_query_tokens`` resolved for ``lm``'s device when ``auto``
    (:func:`gdr.lm.scoring.auto_score_sizes`, from free memory after emptying the CUDA cache). Called once per
    run: under a launcher (``torchrun``) rank 0's sizes are broadcast, and :func:`score_in_processes` hands the
    parent's to every worker, so that all processes group the shards alike."""
    bs, mq = settings.doc_batch_size, settings.max_query_tokens
    if "auto" not in (bs, mq):
        return settings
    auto_bs, auto_mq = auto_score_sizes(lm.model, lm.device, lm.longest_prompt_tokens())
    sizes = [auto_bs if bs == "auto" else int(bs), auto_mq if mq == "auto" else int(mq)]
    if dist_info()[1] > 1:
        dist.broadcast_object_list(sizes, src=0)
    return settings.resolved(doc_batch_size=int(sizes[0]), max_query_tokens=int(sizes[1]))


def score_queries(lm, corpus, queries: list[dict], out: str | os.PathLike, settings: ScoreSettings,
                  progress: bool = True, reuse_from: str | os.PathLike | None = None) -> Path:
    """Score ``queries`` (rows of ``queries.jsonl``) against every document of ``corpus`` with ``lm`` into
    ``out/P.npy`` (sharded, resumable); ``auto`` sizes are resolved here (:func:`resolve_sizes`) unless the caller
    resolved them. ``reuse_from``: an older P whose matching entries are copied (:func:`score_run`). Queries of
    the per-document sampler (``sample.p_per_doc``, recorded in ``out``'s queries manifest) are scored by source
    document (``groups``). Returns its path."""
    sc = resolve_sizes(lm, settings)  # the run's manifest records the sizes that made its numbers
    per_doc = (read_manifest(Path(out), Q_MANIFEST) or {}).get("p_per_doc")
    groups = np.array([int(q["source_index"]) for q in queries], dtype=np.int64) if per_doc else None
    return score_run(lm, corpus.model_inputs(), corpus.doc_ids, [q["text"] for q in queries], Path(out),
                     ended=query_ended(queries),
                     dtype=sc.dtype, shard_size=sc.shard_size, doc_batch_size=int(sc.doc_batch_size),
                     max_query_tokens=int(sc.max_query_tokens), progress=progress, compute_dtype=sc.compute_dtype,
                     reuse_from=reuse_from, query_groups=groups)


def score_corpus(corpus, lm, out: str | os.PathLike, sample: SampleSettings, score: ScoreSettings,
                 progress: bool = True, queries_from: str | os.PathLike | None = None,
                 resample: str | None = None, reuse_from: str | os.PathLike | None = None) -> Path:
    """Sample (unless ``queries.jsonl`` exists) and score into ``out``; returns the P matrix path.

    ``lm``: a :class:`gdr.stages.settings.LMSettings` (loaded here when needed; ``score.processes > 1`` loads
    it in each process), or a loaded :class:`gdr.lm.GenerativeLM` for one process (or a pair
    ``(GenerativeLM, LMSettings)``: the loaded model here, the settings for the processes).
    ``queries_from``: instead of sampling, score against the queries of that finished ``gdr score`` (or ``gdr
    run``) folder, with the model that scored them (another one is refused): the P of new documents that
    ``gdr index add`` places into an index built on that run (:func:`gdr.store.copy_run_queries`).
    ``resample``: the command that samples the queries, named when a launched rank > 0 finds none (the
    ``gdr score`` command passes its own overrides, :func:`sample_command`; default ``gdr sample out=<out>``).
    ``reuse_from``: the folder of an older run of the same model and settings over an overlapping corpus (before
    an edit, or before ``gdr index add``'s new documents): its queries of unchanged documents and its P entries
    of unchanged (document, query) pairs are taken, and only the rest is sampled and scored."""
    check_texts(corpus)
    with holding(out):  # one writer per folder, as with `gdr score` (the scoring processes share it)
        return _score_corpus(corpus, lm, Path(out), sample, score, progress, queries_from,
                             resample or sample_command(out), reuse_from)


def _score_corpus(corpus, lm, out: Path, sample: SampleSettings, score: ScoreSettings, progress: bool,
                  queries_from: str | os.PathLike | None, resample: str,
                  reuse_from: str | os.PathLike | None = None) -> Path:
    built, spec = (lm if isinstance(lm, tuple) else (None, lm) if isinstance(lm, LMSettings) else (lm, None))
    lm = built if built is not None else spec.build()
    rank, _ = dist_info()
    qfile = out / "queries.jsonl"
    if queries_from is not None and rank == 0:
        queries = queries_of_run(lm, queries_from, out)
    elif rank == 0 or qfile.exists():
        queries = sample_queries(lm, corpus, out, sample, progress=progress, reuse_from=reuse_from)
    else:
        raise SystemExit(f"{qfile} missing: run `{resample}` before a multi-process `gdr score`")
    n_proc = int(score.processes or ScoreSettings.processes)
    score = resolve_sizes(lm, score)  # once, here: every process groups the shards alike
    if n_proc > 1 and "WORLD_SIZE" not in os.environ and not _finished(out):
        if spec is None:
            raise ValueError(f"score.processes={n_proc}: each process loads its own model; pass the model as "
                             "LMSettings (or (GenerativeLM, LMSettings)), not only a loaded GenerativeLM")
        path = score_in_processes(corpus, spec, out, score, n_proc, progress=progress, reuse_from=reuse_from)
    else:
        path = score_queries(lm, corpus, queries, out, score, progress=progress, reuse_from=reuse_from)
    if rank == 0:
        _check_complete(out)
        log.info("P matrix %s", path)
    return path


def _check_complete(out: Path) -> None:
    """Raise, in one line, when the processes left shards of ``out``'s P unscored (they grouped the shards
    differently, or one stopped early): the stage is not finished and is never reported so."""
    man = read_manifest(out, P_MANIFEST) or {}
    if man.get("status") == "complete":
        return
    n_docs, size = (man.get("shape") or [0])[0], int(man.get("shard_size") or 1)
    left = sorted(set(range(-(-n_docs // size))) - {int(f.stem) for f in (out / SHARD_DIR).glob("*.done")})
    shown = ", ".join(map(str, left[:5])) + (f" and {len(left) - 5} more" if len(left) > 5 else "")
    raise RuntimeError(f"{out / 'P.npy'}: {len(left)} shard(s) left unscored ({shown}) after every scoring process "
                       f"finished; rerun `{RerunCommand('score', out)}` to score them (the finished shards are kept)")


def queries_of_run(lm, run, out: Path) -> list[dict]:
    """The queries of ``run`` copied into ``out``; the model must be the one that scored ``run``'s P."""
    scorer = (read_manifest(score_folder(run), P_MANIFEST) or {}).get("lm")
    mine = json.loads(json.dumps(lm.describe()))
    if scorer is not None and scorer != mine:
        diff = sorted(k for k in set(scorer) | set(mine) if scorer.get(k) != mine.get(k))
        raise ValueError(f"queries_from={run}: its P was scored by another model ("
                         + ", ".join(f"{k}={scorer.get(k)!r}" for k in diff) + ") than this one ("
                         + ", ".join(f"{k}={mine.get(k)!r}" for k in diff) + "); pass that run's model settings "
                         "(model.name=, model.max_doc_tokens=, model.prompt.*), so that the rows compare")
    return copy_run_queries(run, out)[0]


def sample_command(out, overrides: Sequence[str] | None = None) -> str:
    """The ``gdr sample`` that samples the queries of a ``gdr score`` into ``out``: ``overrides`` (that command's
    own, its ``score.*`` settings dropped), else ``out=<out>`` alone."""
    if overrides is None:
        return f"gdr sample out={shlex.quote(str(out))}"
    return " ".join(["gdr", "sample", *map(shlex.quote, overrides)])


def _finished(out) -> bool:
    """A complete, undamaged P in ``out``: scored here in-process (the identity check, nothing left to score)
    instead of spawning processes that would each load the model to find no shard left. A damaged one is
    repaired by the processes."""
    man = read_manifest(Path(out), P_MANIFEST)
    if not man or man.get("status") != "complete":
        return False
    try:
        check_p(out, man)
    except ValueError:
        return False
    return True


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _leave(signum, frame) -> None:
    """A scoring worker's SIGTERM: exit now, through Python's clean-up (no leaked-semaphore warnings), silently
    (``multiprocessing`` exits a process on ``SystemExit`` without a traceback)."""
    sys.exit(128 + signum)


def _exit_from_finaliser(unraisable) -> None:
    """A scoring worker's ``sys.unraisablehook``: a SIGTERM that lands while a finaliser runs (tqdm's
    ``__del__``) raises :func:`_leave`'s SystemExit there, where Python can only print it ("Exception ignored
    in ...", a traceback) and go on. Exit at once instead, with the same code and nothing printed."""
    if isinstance(unraisable.exc_value, SystemExit):
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        code = unraisable.exc_value.code
        os._exit(code if isinstance(code, int) else 1)
    sys.__unraisablehook__(unraisable)


def _score_worker(rank: int, world: int, port: int, corpus, lm_settings: dict, score_settings: dict, out: str,
                  progress: bool, parent: int | None = None, reuse_from: str | None = None) -> None:
    """One scoring process of :func:`score_in_processes`: its round-robin share of the shards.

    With CUDA and ``device`` auto/cuda, rank r scores on ``cuda:{r % n_gpus}``. The process group is
    set up here, after ``torch.cuda.set_device``, so that :func:`gdr.device.dist_info` finds it ready: NCCL
    when every rank has a GPU of its own, gloo when ranks share one (NCCL refuses two ranks on one
    device; the group only carries barriers). On a CPU, ``dist_info`` sets up gloo as before.
    The worker dies with ``parent`` (the spawning process): kill -9 of ``gdr`` leaves no writer behind."""
    die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the parent decides
    signal.signal(signal.SIGTERM, _leave)  # the parent's terminate(), or a scheduler: go at once, quietly
    sys.unraisablehook = _exit_from_finaliser  # ... also when it lands inside a finaliser
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    setup_logging()
    spec = LMSettings.from_config(lm_settings)  # the parent's settings, checked at its door
    spec.threads = spec.scoring_threads(world)  # one a process unless told: as the parent keyed P
    if torch.cuda.is_available() and str(spec.device or LMSettings.device) in ("auto", "cuda"):
        spec.device = local_device(spec.device)  # before the process group: NCCL binds each rank to the current device
        dist.init_process_group("nccl" if world <= torch.cuda.device_count() else "gloo", rank=rank, world_size=world)
        log.info("scoring process %d of %d on %s", rank, world, spec.device)
    lm = spec.build()
    score_queries(lm, corpus, read_jsonl(Path(out) / "queries.jsonl"), out, ScoreSettings.from_config(score_settings),
                  progress=progress, reuse_from=reuse_from)

    if dist.is_initialized():
        dist.destroy_process_group()


def score_in_processes(corpus, lm: LMSettings, out: str | os.PathLike, settings: ScoreSettings, n_proc: int,
                       progress: bool = True, reuse_from: str | os.PathLike | None = None) -> Path:
    """Score ``out`` (its queries already sampled) with ``n_proc`` processes on this machine.

    On a CPU, one single-threaded process per core beats one multi-threaded process (measured: 11.8 vs
    7.4 pairs/s on 2 cores). The processes split the shards as ``torchrun`` ranks do, so the matrix is the
    same as one process's, and a killed run resumes from the finished shards."""
    ctx = mp.get_context("spawn")
    port = _free_port()
    procs = [ctx.Process(target=_score_worker, args=(r, n_proc, port, corpus, lm.to_dict(), settings.to_dict(),
                                                     str(out), progress, os.getpid(),
                                                     None if reuse_from is None else str(reuse_from)), daemon=True)
             for r in range(n_proc)]
    failed = []
    try:
        for p in procs:
            p.start()
        for r, p in enumerate(procs):
            p.join()
            if p.exitcode != 0:
                failed.append((r, p.exitcode))
    finally:  # a failed worker, or a SIGTERM / Ctrl-C of this process (gdr.signals): none is left running
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            if p.pid is not None:
                p.join()
    if failed:
        raise RuntimeError(f"scoring process(es) {failed} failed (rank, exit code); rerun the same command to "
                           f"resume from the finished shards in {out} (a script must call gdr.score(processes=N) "
                           "under `if __name__ == \"__main__\":`: each process imports it again)")
    return Path(out) / "P.npy"


def score_run(lm, texts: Sequence[str], doc_ids: Sequence[str], queries: Sequence[str],
              out_dir: str | os.PathLike, dtype: str = ScoreSettings.dtype, shard_size: int = ScoreSettings.shard_size,
              doc_batch_size: int = 1, max_query_tokens: int = 2048, progress: bool = True,
              max_shards: int | None = None, compute_dtype: str = ScoreSettings.compute_dtype,
              reuse_from: str | os.PathLike | None = None, query_groups: np.ndarray | None = None,
              ended: np.ndarray | None = None) -> Path:
    """Score every (document, query) pair into ``out_dir/P.npy``; resumes unfinished runs.

    ``query_groups`` (n_queries,) int, e.g. each query's source document: a packed chunk of queries never mixes two
    groups (:meth:`gdr.lm.scoring.ScoringMixin.score`), recorded as ``query_chunks: by_source``; None: all
    queries packed together.

    With ``reuse_from`` (the folder of an older finished P of the same model, prompt, dtype, sizes, numerics and
    packing, e.g. of the corpus before an edit) the entries whose row has the same document text there and whose
    column's whole query group is there are copied, and only the others are scored: the rows of new or edited
    documents against every query, and the other rows against the new groups' queries (:func:`gdr.store.
    reuse_map`). This equals a full rescore byte for byte by construction: with one document per pass
    (``doc_batch_size=1``) and shapes that depend on nothing else (not compiled, which pads to a run-wide shape),
    an entry depends only on its document's text and its query group's texts. Elsewhere nothing is reused (one
    log line says why). The manifest records ``reused_from`` and the pairs scored.

    Parameters
    ----------
    texts, doc_ids : the corpus, length n_docs, in row order.
    queries : query texts, length n_queries, in column order.
    ended : (n_queries,) bool, or None (all): False for a query cut at ``max_new_tokens`` before the model ended it
        (the ``cut`` of its record): no end term (:data:`gdr.lm.scoring.QUERY_END`).
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
    threads = lm.scoring_threads()  # on a CPU: set for the scoring below, whatever the process had (None: a GPU)
    numerics = scoring_numerics(lm.device, compute_dtype, next(lm.model.parameters()).dtype, threads)
    out = Path(out_dir)
    rank, world = dist_info()
    ended = np.ones(len(queries), dtype=bool) if ended is None else np.asarray(ended, dtype=bool)
    ident = _p_identity(lm, texts, doc_ids, queries, ended, dtype, shard_size, doc_batch_size, max_query_tokens,
                        numerics)
    if query_groups is not None:
        ident["query_chunks"] = BY_SOURCE  # absent otherwise: the P manifests of all queries packed together stay
    p_path, shard_dir = out / P_FILE, out / SHARD_DIR
    prompt_len = np.array([len(p) for p in lm.prompt_ids(texts)])
    order = np.argsort(prompt_len, kind="stable")
    n_shards = -(-len(order) // shard_size)
    digests = text_digests(texts)
    earlier = read_manifest(out, P_MANIFEST) if rank == 0 else None
    if rank == 0:
        prepare_p(out, ident, doc_ids, (len(doc_ids), len(queries)), dtype, order, shard_size, world, digests)
    _barrier(world)
    scored_on = _scored_on(out, earlier) if rank == 0 else []
    reuse = None
    if reuse_from is not None and Path(reuse_from).resolve() != out.resolve() and _rows_apart(lm, doc_batch_size,
                                                                                            reuse_from):
        reuse = reuse_map(reuse_from, ident, digests, queries, query_groups, ended)
        if reuse is not None and rank == 0:
            log.info("reusing %s: %d of %d documents and %d of %d queries found there", reuse.path / P_FILE,
                     int((reuse.row_src >= 0).sum()), len(doc_ids), int((reuse.col_src >= 0).sum()), len(queries))

    # shards scored together: a doc batch never straddles two calls
    per_call = max(1, -(-doc_batch_size // shard_size))
    groups = [range(g, min(g + per_call, n_shards)) for g in range(0, n_shards, per_call)]
    mine = [groups[g] for g in range(rank, len(groups), world) if pending_shards(shard_dir, groups[g])]
    if max_shards is not None:
        mine = mine[:max(1, max_shards // per_call)]
    t0 = time.perf_counter()
    score = {"doc_batch_size": doc_batch_size, "max_query_tokens": max_query_tokens, "progress": False,
             "compute_dtype": getattr(torch, numerics["compute_dtype"]), "groups": query_groups, "ended": ended}
    with torch_threads(threads):
        pairs = _score_shards(lm, texts, queries, p_path, shard_dir, order, shard_size, mine, dtype, score, progress,
                              reuse)
    _barrier(world)
    if rank == 0:
        extra = {"reused_from": str(reuse.path)} if reuse is not None else {}
        finish_p(out, ident, n_shards, world, seconds_last_call=round(time.perf_counter() - t0, 2),
                 pairs_scored_last_call=pairs, doc_texts_hash=hash_strings(digests), machine=scored_on[-1],
                 **({"machines": scored_on} if len(scored_on) > 1 else {}), **extra)
    return p_path


def _scored_on(out: Path, earlier: dict | None) -> list[dict]:
    """The machines whose shards P holds: those of an unfinished P in ``out`` (``earlier``, its manifest before this
    call), then this one where its kernels round otherwise, said in a warning (each machine's shards are kept; the
    manifest lists them all as ``machines``)."""
    now = machine_record()
    if not earlier or earlier.get("status") == "complete" or not earlier.get("machine"):
        return [now]
    before = earlier.get("machines") or [earlier["machine"]]
    differ = machine_differences(before[-1], now)
    if differ:
        log.warning("%s: resuming a P whose finished shards were scored on another machine (%s): their last bits may "
                    "differ from shards scored here; the manifest lists both machines (delete %s to score all here)",
                    out / P_FILE, "; ".join(differ), out)
        return [*before, now]
    return before


def _p_identity(lm, texts, doc_ids, queries, ended: np.ndarray, dtype, shard_size, doc_batch_size, max_query_tokens,
                numerics: dict) -> dict:
    """What P's bytes depend on: the model and prompt, how a query's end is scored, the inputs (which queries were
    cut before their end among them), the sizes (their resolved values) and the numerics (device kind and compute
    dtype, :func:`gdr.lm.numerics.scoring_numerics`)."""
    return {"lm": lm.describe(), "query_end": QUERY_END, "doc_ids_hash": hash_strings(doc_ids),
            "texts_hash": hash_strings(texts), "queries_hash": hash_strings(queries),
            "cut_hash": hash_strings([str(j) for j in np.flatnonzero(~ended)]),
            "shape": [len(doc_ids), len(queries)], "dtype": dtype,
            "shard_size": shard_size, "doc_batch_size": doc_batch_size, "max_query_tokens": max_query_tokens,
            **numerics}


def _rows_apart(lm, doc_batch_size: int, reuse_from) -> bool:
    """Whether ``lm`` scores each document in passes of its own, in shapes nothing else decides (the condition
    for an older P's rows to be this one's bytes); False with one log line why."""
    if doc_batch_size != 1:
        why = f"score.doc_batch_size={doc_batch_size}: a row's bytes depend on the documents padded beside it"
    elif lm.kernels.compiled(lm.device):
        why = "compiled scoring pads every pass to a shape of the whole run"
    else:
        return True
    log.info("not reusing %s: %s (a full rescore)", Path(reuse_from) / P_FILE, why)
    return False


def _barrier(world: int) -> None:
    if world > 1:
        dist.barrier()


def _score_shards(lm, texts: Sequence[str], queries: Sequence[str], p_path: Path, shard_dir: Path,
                  order: np.ndarray, shard_size: int, mine: list[range], dtype: str, score: dict,
                  progress: bool, reuse: Reuse | None = None) -> int:
    """Score this process's groups of shards into ``p_path``, one ``lm.score`` call per group (keywords
    ``score``; with ``reuse``, :func:`_score_group_reusing`); each finished shard's rows are flushed, then its
    ``.done`` marker written with their checksum. Returns the number of (document, query) pairs scored."""
    rank, world = dist_info()
    n_shards = -(-len(order) // shard_size)
    P = np.load(p_path, mmap_mode="r+")
    if rank == 0:
        log.info("P %s: %d shards of %d docs, %d left (%d on this process of %d)",
                 tuple(P.shape), n_shards, shard_size, n_shards - len(list(shard_dir.glob("*.done"))),
                 sum(len(pending_shards(shard_dir, g)) for g in mine), world)
    left = [s for g in mine for s in pending_shards(shard_dir, g)]
    pairs = len(queries) * sum(len(shard_rows(order, shard_size, s)) for s in left)
    bar = tqdm(total=pairs, desc=f"score[{rank}]" if world > 1 else "score", unit="pair", unit_scale=True,
               disable=not progress or pairs == 0)  # nothing left (P reused): no empty bar
    scored = 0
    for group in mine:
        if not pending_shards(shard_dir, group):  # finished meanwhile by another process on this folder
            continue
        # the whole group, finished shards too (a resumed group batches as an uninterrupted one)
        rows = [shard_rows(order, shard_size, s) for s in group]
        every = np.concatenate(rows)
        if reuse is None:
            lp = lm.score([texts[i] for i in every], queries, **score)
            scored += lp.size
        else:
            lp, n = _score_group_reusing(lm, texts, queries, every, reuse, score)
            scored += n
        ends = np.cumsum([len(r) for r in rows])
        for s, r, block in zip(group, rows, np.split(lp, ends[:-1])):
            if (shard_dir / f"{s:05d}.done").exists():
                continue
            block = np.ascontiguousarray(block.astype(dtype))
            write_shard(P, shard_dir, s, r, block)
            bar.update(block.size)
            bar.set_postfix(shard=f"{s + 1}/{n_shards}")
    bar.close()
    del P
    return scored


def _score_group_reusing(lm, texts: Sequence[str], queries: Sequence[str], rows: np.ndarray, reuse: Reuse,
                         score: dict) -> tuple[np.ndarray, int]:
    """P's ``rows`` (len(rows), n_queries) float32: the older P's entries where ``reuse`` has both the row and
    the column, scored elsewhere: the new rows against every query in one call, the reused rows against the
    new queries in another. Returns the block and the number of pairs scored."""
    block = reuse.block(rows)
    have = reuse.row_src[rows] >= 0  # (len(rows),)
    new_cols = np.flatnonzero(reuse.col_src < 0)  # (n_new_queries,) whole query groups
    n = 0
    if (~have).any():
        lp = lm.score([texts[i] for i in rows[~have]], queries, **score)  # (n_new_rows, n_queries)
        block[~have] = lp
        n += lp.size
    if have.any() and len(new_cols):
        groups = score["groups"]
        lp = lm.score([texts[i] for i in rows[have]], [queries[j] for j in new_cols],
                      **{**score, "groups": None if groups is None else groups[new_cols],
                         "ended": score["ended"][new_cols]})
        block[np.ix_(have, new_cols)] = lp
        n += lp.size
    return block, n
