"""When gdr compiles, to which shapes, and where the compiled code is kept between processes.

- **The switch**: ``compile: auto | true | false`` (``sample.compile``). ``auto`` compiles on CUDA when the call
  has at least ``compile_min_queries`` queries to decode (``auto``: :data:`AUTO_COMPILE_MIN_QUERIES`); smaller
  work runs eagerly, where tracing, compiling and capturing would cost more than they save. ``true`` compiles
  on any device, the CPU included (what the tests do, with a cheap backend).
- **Shape buckets**: a compiled decode step is specialised to its batch rows and cache length, so the rows of
  a batch are padded up to a power of two (at least :data:`MIN_BUCKET`, at most the configured batch size)
  and cache lengths to a multiple of 64 (:class:`gdr.lm.decode.Decoder`): the last, smaller batch reuses a
  few compiled shapes instead of compiling one of its own, and re-draws of empty queries compile nothing new
  (their bucket's graph where it exists, else eager). A shape that fails to compile or capture decodes eagerly.
- **A persistent cache**: inductor's on-disk caches (FX graphs, AOT autograd, Triton kernels, autotuning) go
  to ``$GDR_CACHE/torch-compile`` (unless ``TORCHINDUCTOR_CACHE_DIR`` is set), so a second process with the
  same model and shapes loads the compiled kernels instead of compiling them again.
"""
from __future__ import annotations

import gc
import os
from pathlib import Path

import torch
import torch._dynamo
import torch._dynamo.config as dc
from torch._inductor.runtime.cache_dir_utils import default_cache_dir

from gdr.models import cache_dir

__all__ = ["AUTO_COMPILE_MIN_QUERIES", "MIN_BUCKET", "allow_bucket_recompiles", "batch_bucket", "compile_cache_dir",
           "release_compiled", "want_compile"]

# sample.compile_min_queries=auto. On one H200 (reports/gpu-runs/2026-11-27.md) the compiled decode step reaches
# ~1,000 q/s in steady state but costs ~30 s of compilation and capture in a fresh process; our eager loop is the
# HF-generate class of speed (~200-400 q/s). Compiling pays once it saves more than it costs:
# 30 s / (1/300 - 1/1000 s per query) ~ 13k queries cold, a few thousand with a warm compile cache.
AUTO_COMPILE_MIN_QUERIES = 8192
MIN_BUCKET = 8


def want_compile(setting: bool | str | None, device: torch.device | str, n_queries: int,
                 min_queries: int | str | None = "auto") -> bool:
    """Whether a decode of ``n_queries`` queries on ``device`` is compiled under ``compile: setting``.

    setting : True / False / ``"auto"`` (None = auto); ``"true"`` / ``"false"`` strings are accepted.
    min_queries : the ``auto`` threshold, or ``"auto"`` / None for :data:`AUTO_COMPILE_MIN_QUERIES`.
    """
    if isinstance(setting, str):
        low = setting.lower()
        if low not in ("auto", "true", "false"):
            raise ValueError(f"compile={setting!r}: use auto, true or false")
        setting = None if low == "auto" else low == "true"
    if setting is not None:
        return bool(setting)
    threshold = AUTO_COMPILE_MIN_QUERIES if min_queries in (None, "auto") else int(min_queries)
    return torch.device(device).type == "cuda" and n_queries >= threshold


def batch_bucket(n: int, cap: int | None = None) -> int:
    """Rows a batch of ``n`` rows is padded to: the next power of two (at least :data:`MIN_BUCKET`), but not
    past ``cap`` (the configured batch size, itself a bucket: full batches are never padded). Above ``cap``: n."""
    if cap is not None and n >= cap:
        return n
    b = max(MIN_BUCKET, 1 << (max(n, 1) - 1).bit_length())
    return min(b, cap) if cap is not None else b


def compile_cache_dir() -> Path:
    """Point inductor's on-disk caches at ``$GDR_CACHE/torch-compile`` (unless ``TORCHINDUCTOR_CACHE_DIR`` is
    set already) and return the folder. Call before the first ``torch.compile`` of a process."""
    path = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    # inductor writes its default into the variable once it has looked: that one is not a user's choice
    if not path or os.path.abspath(path) == os.path.abspath(default_cache_dir()):
        path = str(cache_dir() / "torch-compile")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = path
    Path(path).mkdir(parents=True, exist_ok=True)
    return Path(path)


def allow_bucket_recompiles(n: int = 32) -> None:
    """Let dynamo keep ``n`` specialisations of a compiled function (its default, 8, is fewer than the row
    buckets of a 1,024-row batch times the cache lengths of a run; past it dynamo silently runs eagerly)."""
    dc.recompile_limit = max(int(dc.recompile_limit), n)


def release_compiled() -> None:
    """Free what compiled code holds once its model is dropped: dynamo's compiled frames (whose guards and bound
    methods keep the decoder, its weights and static KV cache alive) and the CUDA-graph trees of
    ``mode="reduce-overhead"``, whose memory pools outlive the model they were captured for; then the allocator's
    cache. Without this, what runs after the LM stages (the retrievers) would size their batch and concurrency for
    the memory those pools keep. The on-disk compile cache stays, so a later compile of the same shapes is cheap."""
    torch._dynamo.reset()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
