"""Stage ``score``: log p(query | doc) for every pair, the matrix P (Algorithm 1, line 2; Eq. 1).

:func:`score_corpus` samples the queries (unless ``queries.jsonl`` exists) and scores them, in this process,
split across ``torchrun`` ranks, or in ``processes`` processes it starts (:func:`score_in_processes`);
:func:`score_queries` scores given queries with a loaded model.
"""
from __future__ import annotations

import contextlib
import logging
import os
import shlex
import signal
import socket
import sys
from pathlib import Path
from typing import Sequence

import torch

from gdr.config import RerunCommand
from gdr.stages.settings import LMSettings, SampleSettings, ScoreSettings

__all__ = ["resolve_sizes", "score_corpus", "score_queries", "score_in_processes"]

log = logging.getLogger(__name__)


def resolve_sizes(lm, settings: ScoreSettings) -> ScoreSettings:
    """``settings`` with ``doc_batch_size`` and ``max_query_tokens`` resolved for ``lm``'s device when ``auto``
    (:func:`gdr.lm.scoring.auto_score_sizes`, from free memory after emptying the CUDA cache). Called once per
    run: under a launcher (``torchrun``) rank 0's sizes are broadcast, and :func:`score_in_processes` hands the
    parent's to every worker, so that all processes group the shards alike."""
    from gdr.lm.scoring import auto_score_sizes
    from gdr.store import dist_info

    bs, mq = settings.doc_batch_size, settings.max_query_tokens
    if "auto" not in (bs, mq):
        return settings
    auto_bs, auto_mq = auto_score_sizes(lm.model, lm.device, lm.longest_prompt_tokens())
    sizes = [auto_bs if bs == "auto" else int(bs), auto_mq if mq == "auto" else int(mq)]
    if dist_info()[1] > 1:
        import torch.distributed as dist

        dist.broadcast_object_list(sizes, src=0)
    return settings.replace(doc_batch_size=int(sizes[0]), max_query_tokens=int(sizes[1]))


def score_queries(lm, corpus, queries: list[dict], out: str | os.PathLike, settings: ScoreSettings,
                  progress: bool = True) -> Path:
    """Score ``queries`` (rows of ``queries.jsonl``) against every document of ``corpus`` with ``lm`` into
    ``out/P.npy`` (sharded, resumable); ``auto`` sizes are resolved here (:func:`resolve_sizes`) unless the caller
    resolved them. Returns its path."""
    from gdr.store import score_run

    sc = resolve_sizes(lm, settings)  # the run's manifest records the sizes that made its numbers
    return score_run(lm, corpus.model_inputs(), corpus.doc_ids, [q["text"] for q in queries], Path(out),
                     dtype=sc.dtype, shard_size=sc.shard_size, doc_batch_size=int(sc.doc_batch_size),
                     max_query_tokens=int(sc.max_query_tokens), progress=progress, compute_dtype=sc.compute_dtype)


def score_corpus(corpus, lm, out: str | os.PathLike, sample: SampleSettings, score: ScoreSettings,
                 progress: bool = True, queries_from: str | os.PathLike | None = None,
                 resample: str | None = None) -> Path:
    """Sample (unless ``queries.jsonl`` exists) and score into ``out``; returns the P matrix path.

    ``lm``: a :class:`gdr.stages.settings.LMSettings` (loaded here when needed; ``score.processes > 1`` loads
    it in each process), or a loaded :class:`gdr.lm.GenerativeLM` for one process (or a pair
    ``(GenerativeLM, LMSettings)``: the loaded model here, the settings for the processes).
    ``queries_from``: instead of sampling, score against the queries of that finished ``gdr score`` (or ``gdr
    run``) folder, with the model that scored them (another one is refused): the P of new documents that
    ``gdr index add`` places into an index built on that run (:func:`gdr.store.copy_run_queries`).
    ``resample``: the command that samples the queries, named when a launched rank > 0 finds none (the
    ``gdr score`` command passes its own overrides, :func:`sample_command`; default ``gdr sample out=<out>``)."""
    from gdr.guard import holding
    from gdr.stages.sample import check_texts

    check_texts(corpus)
    with holding(out):  # one writer per folder, as with `gdr score` (the scoring processes share it)
        return _score_corpus(corpus, lm, Path(out), sample, score, progress, queries_from,
                             resample or sample_command(out))


def _score_corpus(corpus, lm, out: Path, sample: SampleSettings, score: ScoreSettings, progress: bool,
                  queries_from: str | os.PathLike | None, resample: str) -> Path:
    from gdr.stages.sample import sample_queries
    from gdr.store import dist_info

    built, spec = (lm if isinstance(lm, tuple) else (None, lm) if isinstance(lm, LMSettings) else (lm, None))
    lm = built if built is not None else spec.build()
    rank, _ = dist_info()
    qfile = out / "queries.jsonl"
    if queries_from is not None and rank == 0:
        queries = _queries_of_run(lm, queries_from, out)
    elif rank == 0 or qfile.exists():
        queries = sample_queries(lm, corpus, out, sample, progress=progress)
    else:
        raise SystemExit(f"{qfile} missing: run `{resample}` before a multi-process `gdr score`")
    n_proc = int(score.processes or 1)
    score = resolve_sizes(lm, score)  # once, here: every process groups the shards alike
    if n_proc > 1 and "WORLD_SIZE" not in os.environ and not _finished(out):
        if spec is None:
            raise ValueError(f"score.processes={n_proc}: each process loads its own model; pass the model as "
                             "LMSettings (or (GenerativeLM, LMSettings)), not only a loaded GenerativeLM")
        path = score_in_processes(corpus, spec, out, score, n_proc, progress=progress)
    else:
        path = score_queries(lm, corpus, queries, out, score, progress=progress)
    if rank == 0:
        _check_complete(out)
        log.info("P matrix %s", path)
    return path


def _check_complete(out: Path) -> None:
    """Raise, in one line, when the processes left shards of ``out``'s P unscored (they grouped the shards
    differently, or one stopped early): the stage is not finished and is never reported so."""
    from gdr.store import P_MANIFEST, SHARD_DIR, read_manifest

    man = read_manifest(out, P_MANIFEST) or {}
    if man.get("status") == "complete":
        return
    n_docs, size = (man.get("shape") or [0])[0], int(man.get("shard_size") or 1)
    left = sorted(set(range(-(-n_docs // size))) - {int(f.stem) for f in (out / SHARD_DIR).glob("*.done")})
    shown = ", ".join(map(str, left[:5])) + (f" and {len(left) - 5} more" if len(left) > 5 else "")
    raise RuntimeError(f"{out / 'P.npy'}: {len(left)} shard(s) left unscored ({shown}) after every scoring process "
                       f"finished; rerun `{RerunCommand('score', out)}` to score them (the finished shards are kept)")


def _queries_of_run(lm, run, out: Path) -> list[dict]:
    """The queries of ``run`` copied into ``out``; the model must be the one that scored ``run``'s P."""
    import json

    from gdr.store import P_MANIFEST, copy_run_queries, read_manifest, score_folder

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
    from gdr.store import P_MANIFEST, check_p, read_manifest

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
                  progress: bool, parent: int | None = None) -> None:
    """One scoring process of :func:`score_in_processes`: its round-robin share of the shards.

    With CUDA and ``device`` auto/cuda, rank r scores on ``cuda:{r % n_gpus}``. The process group is
    set up here, after ``torch.cuda.set_device``, so that ``gdr.store.dist_info`` finds it ready: NCCL
    when every rank has a GPU of its own, gloo when ranks share one (NCCL refuses two ranks on one
    device; the group only carries barriers). On a CPU, ``dist_info`` sets up gloo as before.
    The worker dies with ``parent`` (the spawning process): kill -9 of ``gdr`` leaves no writer behind."""
    from gdr.guard import die_with_parent

    die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the parent decides
    signal.signal(signal.SIGTERM, _leave)  # the parent's terminate(), or a scheduler: go at once, quietly
    sys.unraisablehook = _exit_from_finaliser  # ... also when it lands inside a finaliser
    import torch.distributed as dist

    from gdr.io import read_jsonl
    from gdr.logs import setup_logging

    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    setup_logging()
    spec = LMSettings.from_dict(lm_settings)
    if not spec.threads:
        spec.threads = 1
    if torch.cuda.is_available() and str(spec.device or "auto") in ("auto", "cuda"):
        from gdr.device import local_device

        spec.device = local_device(spec.device)  # before the process group: NCCL binds each rank to the current device
        dist.init_process_group("nccl" if world <= torch.cuda.device_count() else "gloo", rank=rank, world_size=world)
        log.info("scoring process %d of %d on %s", rank, world, spec.device)
    lm = spec.build()
    score_queries(lm, corpus, read_jsonl(Path(out) / "queries.jsonl"), out, ScoreSettings.from_dict(score_settings),
                  progress=progress)

    if dist.is_initialized():
        dist.destroy_process_group()


def score_in_processes(corpus, lm: LMSettings, out: str | os.PathLike, settings: ScoreSettings, n_proc: int,
                       progress: bool = True) -> Path:
    """Score ``out`` (its queries already sampled) with ``n_proc`` processes on this machine.

    On a CPU, one single-threaded process per core beats one multi-threaded process (measured: 11.8 vs
    7.4 pairs/s on 2 cores). The processes split the shards as ``torchrun`` ranks do, so the matrix is the
    same as one process's, and a killed run resumes from the finished shards."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    port = _free_port()
    procs = [ctx.Process(target=_score_worker, args=(r, n_proc, port, corpus, lm.to_dict(), settings.to_dict(),
                                                     str(out), progress, os.getpid()), daemon=True)
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
