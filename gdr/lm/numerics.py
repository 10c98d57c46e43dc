"""What decides the bytes of sampled queries and of P beyond the settings: the device kind, the compute dtype and,
for sampling, the decode path (compiled or eager kernels break floating-point near-ties differently).

The sampling and scoring manifests record these dicts and refuse a folder made under others (never mixed);
:func:`sampling_numerics` and :func:`scoring_numerics` give them from the settings alone, before a model loads,
for stage keys.
"""
from __future__ import annotations

import torch

from gdr.lm.compiling import want_compile
from gdr.models import SamplingOptions

__all__ = ["COMPUTE_DTYPES", "decode_dtype", "decode_numerics", "describe_numerics", "resolve_device",
           "sampling_numerics", "score_compute_dtype", "scoring_numerics"]


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``auto`` (or None): CUDA when there is one, else the CPU; anything else as given."""
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


COMPUTE_DTYPES = ("auto", "bfloat16", "float32")


def score_compute_dtype(name: str, device: torch.device, own: torch.dtype = torch.float32) -> torch.dtype:
    """The dtype the scoring passes run in for ``score.compute_dtype`` = ``name``.

    ``auto``: bf16 on CUDA, the model's own dtype (``own``; fp32 as loaded) elsewhere, also on CPUs with native
    bf16 (1.5-2x faster there, but P would then depend on the CPU's instruction set). On the demo's P, bf16 (rotary
    frequencies fp32) moved log p by 0.23 nats on average (1.79 at most), kept each document's query order
    (Spearman >= 0.9993) and GC's ARI within its spread, and changed the GC docids about as much as another seed
    does (reports/bf16-scoring.md)."""
    if name not in COMPUTE_DTYPES:
        raise ValueError(f"score.compute_dtype={name!r}: use {' | '.join(COMPUTE_DTYPES)}")
    if name == "auto":
        return torch.bfloat16 if torch.device(device).type == "cuda" else own
    return getattr(torch, name)


def decode_dtype(device: torch.device, own: torch.dtype = torch.float32) -> torch.dtype:
    """The dtype the decode loop runs in: bf16 on CUDA (a copy of the weights), the model's own elsewhere."""
    return torch.bfloat16 if torch.device(device).type == "cuda" else own


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def decode_numerics(device: torch.device | str, dtype: torch.dtype, compiled: bool) -> dict:
    """{"device": kind, "dtype": name, "decode": "compiled" | "eager"} of a decode loop."""
    return {"device": torch.device(device).type, "dtype": _name(dtype), "decode": "compiled" if compiled else "eager"}


def sampling_numerics(device: str | torch.device | None, n_queries: int, compile: bool | str = SamplingOptions.compile,
                      compile_min_queries: int | str = SamplingOptions.compile_min_queries,
                      model_dtype: torch.dtype = torch.float32) -> dict:
    """The numerics of sampling ``n_queries`` queries (all of a folder's, not the ones left) under these settings."""
    dev = resolve_device(device)
    return decode_numerics(dev, decode_dtype(dev, model_dtype),
                           want_compile(compile, dev, n_queries, compile_min_queries))


def scoring_numerics(device: str | torch.device | None, compute_dtype: str,
                     model_dtype: torch.dtype = torch.float32, threads: int | None = None) -> dict:
    """{"device": kind, "compute_dtype": name} of scoring under ``score.compute_dtype``, and on a CPU the torch
    ``threads`` it scores with where given (:func:`gdr.device.cpu_threads`: they decide a CPU P's last bits)."""
    dev = resolve_device(device)
    out = {"device": dev.type, "compute_dtype": _name(score_compute_dtype(compute_dtype, dev, model_dtype))}
    return {**out, "threads": int(threads)} if dev.type == "cpu" and threads is not None else out


def describe_numerics(numerics: dict) -> str:
    """``cuda, bfloat16, compiled decode`` for a one-line message."""
    parts = [numerics.get("device"), numerics.get("dtype") or numerics.get("compute_dtype")]
    if numerics.get("decode"):
        parts.append(f"{numerics['decode']} decode")
    return ", ".join(str(p) for p in parts)
