"""Benchmark: the scoring engine against the naive way (one full forward pass per pair), with MFU.

    python -m gdr.bench.scoring --model smollm2-135m --pairs 512
    python -m gdr.bench.scoring --device cuda --model smollm2-135m --queries 1024 --doc-tokens 128 \
        --pairs 262144 --naive-pairs 64
    python -m gdr.bench.scoring --device cuda --model t5-base-random --queries 1024 --doc-tokens 128 \
        --query-tokens 32 --pairs 262144 --naive-pairs 64

Documents are real Reuters stories cut to ``--doc-tokens`` tokens; queries are sampled from them by the
same model (``--query-tokens`` new tokens at most). The engine scores all ``pairs`` (n_docs x n_queries);
the naive reference scores a subset of them (``--naive-pairs``, 0 to skip) one full
``model(input_ids, labels=...)`` pass each; both rates are measured in this run, on the same pairs where
they overlap, and the max abs difference of log-probs is checked. ``flops_per_pair`` is
:func:`gdr.cost.scoring_flops_per_pair` at the measured mean prompt and query lengths; ``mfu`` is the
engine's model FLOP/s over the device's peak bf16 FLOP/s (None on a CPU or an unknown GPU).
The LAST line printed is one JSON object; its keys: model, device, torch_device, peak_bf16_tflops,
pairs, docs, queries, prompt_tokens, query_tokens, doc_batch_size, max_query_tokens, attention,
compute_dtype, engine_pairs_per_s, engine_s, flops_per_pair, mfu, naive_pairs, naive_pairs_per_s, speedup,
max_abs_diff, doc_tokens, threads, partial, and the roofline of one pair (:func:`gdr.cost.roofline`:
flops_per_unit, bytes_per_unit from :func:`gdr.cost.scoring_bytes_per_pair`, limit_per_s, fraction_of_limit,
h200_limit_per_s, ...).

On a cold GPU the warm-up (``warmup_s``) holds the compilation of flex attention and the log-prob kernel.
The timed phase scores one doc batch at a time and stops after ``--seconds`` or early enough for
``--deadline`` (at least one batch; ``pairs`` and ``docs`` say how many were timed); the naive reference and
``--profile`` run after it, only when the deadline leaves time for them. A JSON line (``"partial": true``)
follows the sampling, the warm-up, the timed phase and the reference.
"""
from __future__ import annotations

import argparse
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gdr.bench.common import (
    bench_texts,
    build_lm,
    emit,
    maybe_profile,
    parse_bench_args,
    roofline,
    seconds_left,
    timed_batches,
)
from gdr.cost import device_name, mfu, peak_flops, scoring_bytes_per_pair, scoring_flops_per_pair
from gdr.lm.scoring import auto_score_sizes, score_compute_dtype
from gdr.rules import NON_NEGATIVE, POSITIVE, auto_or, option_type, seed

log = logging.getLogger(__name__)


def _args(argv: list[str] | None):
    ap = argparse.ArgumentParser(prog="gdr bench scoring", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m",
                    help="bundled name, hub id/path, t5-base-random or smollm2-135m-random")
    ap.add_argument("--pairs", type=option_type(POSITIVE),
                    default=512, help="pairs scored by the engine (n_docs x n_queries)")
    ap.add_argument("--queries", type=option_type(POSITIVE), default=64, help="queries per document (J)")
    ap.add_argument("--naive-pairs", type=option_type(NON_NEGATIVE),
                    default=48, help="pairs scored by the naive reference (0: skip it)")
    ap.add_argument("--doc-tokens", type=option_type(POSITIVE), default=64)
    ap.add_argument("--query-tokens", type=option_type(POSITIVE), default=32, help="max new tokens of a sampled query")
    ap.add_argument("--doc-batch-size", type=option_type(auto_or(POSITIVE)),
                    default=4, help="documents per pass, or auto")
    ap.add_argument("--max-query-tokens", type=option_type(auto_or(POSITIVE)),
                    default=2048, help="query tokens per chunk, or auto")
    ap.add_argument("--attention", default="auto", choices=["auto", "flex", "dense"], help="causal query packing")
    ap.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"],
                    help="compute dtype of the engine (auto: bf16 on CUDA, the model's on a CPU)")
    ap.add_argument("--sample-batch-size", type=option_type(POSITIVE), default=None,
                    help="queries sampled per batch (default 16, 256 on CUDA)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--seed", type=option_type(seed), default=0)
    ap.add_argument("--tokenizer", default=None, help="tokenizer path for *-random models (default: bundled MiniLM)")
    ap.add_argument("--docs-file", default=None, help="one document per line instead of Reuters R5")
    return parse_bench_args(ap, argv, "write a torch.profiler table of one more batch here, if time is left")


@dataclass
class _Bench:
    """The model, texts and sizes of one scoring benchmark, and what it has measured so far."""

    args: argparse.Namespace
    lm: Any
    docs: list[str]
    queries: list[str]
    prompt_tokens: float
    query_tokens: float
    kw: dict
    load_s: float
    sample_s: float
    warmup_s: float | None = None
    engine_s: float = 0.0
    parts: list = field(default_factory=list)  # the engine's rows, doc batch by doc batch
    naive: dict = field(default_factory=dict)  # naive_pairs, naive_pairs_per_s, speedup, max_abs_diff
    prof: dict | None = None

    def costs(self) -> tuple[float, float]:
        """(FLOPs, bytes) of one pair (gdr.cost)."""
        lm, kw, J = self.lm, self.kw, len(self.queries)
        elt = torch.empty((), dtype=score_compute_dtype(self.args.dtype, lm.device,
                                                        next(lm.model.parameters()).dtype)).element_size()
        return (scoring_flops_per_pair(lm.model, self.prompt_tokens, self.query_tokens, J),
                scoring_bytes_per_pair(lm.model, self.prompt_tokens, self.query_tokens, J, kw["doc_batch_size"],
                                       kw["max_query_tokens"], elt))

    def figures(self, partial: bool) -> dict:
        """The figures so far (the engine's null before its first timed doc batch)."""
        args, lm = self.args, self.lm
        fpp, bpp = self.costs()
        n_pairs = sum(p.size for p in self.parts)
        eng_rate = n_pairs / self.engine_s if n_pairs else None
        util = mfu(fpp * n_pairs, self.engine_s, lm.device) if n_pairs else None
        peak = peak_flops(lm.device)
        nrate = self.naive.get("naive_pairs_per_s")
        return {
            "model": args.model, "device": device_name(lm.device), "torch_device": str(lm.device),
            "peak_bf16_tflops": None if peak is None else peak / 1e12, "pairs": int(n_pairs),
            "docs": n_pairs // len(self.queries), "queries": len(self.queries),
            "prompt_tokens": round(self.prompt_tokens, 1), "query_tokens": round(self.query_tokens, 2),
            "doc_batch_size": self.kw["doc_batch_size"], "max_query_tokens": self.kw["max_query_tokens"],
            "attention": args.attention, "compute_dtype": args.dtype,
            "engine_pairs_per_s": None if eng_rate is None else round(eng_rate, 2),
            "engine_s": round(self.engine_s, 3), "load_s": round(self.load_s, 2), "sample_s": round(self.sample_s, 2),
            "warmup_s": self.warmup_s and round(self.warmup_s, 2),
            "launches_per_pair": self.prof and self.prof["launches_per_unit"],
            "flops_per_pair": fpp, "mfu": None if util is None else round(util, 4),
            "naive_pairs": self.naive.get("naive_pairs"),
            "naive_pairs_per_s": None if nrate is None else round(nrate, 3),
            "speedup": None if nrate is None or eng_rate is None else round(eng_rate / nrate, 2),
            "max_abs_diff": self.naive.get("max_abs_diff"), "doc_tokens": args.doc_tokens,
            "threads": torch.get_num_threads(), "partial": partial, **roofline(fpp, bpp, eng_rate, lm.device)}


def _setup(args) -> _Bench:
    """Load the model, sample the queries, resolve the batch sizes."""
    t_load = time.perf_counter()
    lm = build_lm(args.model, args.doc_tokens, args.device, args.tokenizer)
    t_load = time.perf_counter() - t_load
    docs = bench_texts(max(1, args.pairs // args.queries), args.seed, args.docs_file)
    t_sample = time.perf_counter()
    queries = lm.sample_queries(docs, args.queries, seed=args.seed, progress=False, max_new_tokens=args.query_tokens,
                                batch_size=args.sample_batch_size or (256 if lm.device.type == "cuda" else 16)).texts
    t_sample = time.perf_counter() - t_sample
    prompt_len = [len(p) for p in lm.prompt_ids(docs)]
    bs, mq = args.doc_batch_size, args.max_query_tokens
    if "auto" in (bs, mq):
        abs_, amq = auto_score_sizes(lm.model, lm.device, max(prompt_len))
        bs, mq = (abs_ if bs == "auto" else bs), (amq if mq == "auto" else mq)
    dtype = None if args.dtype == "auto" else getattr(torch, args.dtype)
    kw = dict(doc_batch_size=bs, max_query_tokens=mq, progress=False, compute_dtype=dtype, attention=args.attention)
    print(f"model {args.model} on {lm.device} ({device_name(lm.device)}): {len(docs)} docs x {len(queries)} queries, "
          f"docs cut to {args.doc_tokens} tokens, doc batch {bs}, {mq} query tokens per chunk")
    return _Bench(args, lm, docs, queries, float(np.mean(prompt_len)),
                  float(np.mean([len(q) for q in lm.query_ids(queries)])), kw, t_load, t_sample)


def _naive(b: _Bench, engine: np.ndarray) -> None:
    """The naive per-pair forward on a few pairs: its rate and the largest difference from the engine."""
    nd = max(1, min(len(engine), int(np.ceil(b.args.naive_pairs / len(b.queries)))))
    nq = min(len(b.queries), int(np.ceil(b.args.naive_pairs / nd)))
    t0 = time.perf_counter()
    naive = b.lm.score_naive(b.docs[:nd], b.queries[:nq])
    t_naive = time.perf_counter() - t0
    b.naive = {"naive_pairs": naive.size, "naive_pairs_per_s": naive.size / t_naive,
               "max_abs_diff": float(np.abs(engine[:nd, :nq] - naive).max())}
    print(f"naive : {naive.size} pairs in {t_naive:.1f} s = {naive.size / t_naive:.2f} pairs/s, "
          f"max |engine - naive| = {b.naive['max_abs_diff']:.2e} (over {naive.size} shared pairs)")


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    b = _setup(args)
    lm, docs, queries, kw, bs = b.lm, b.docs, b.queries, b.kw, b.kw["doc_batch_size"]
    emit(b.figures(partial=True))
    # Warm-up (compiles on CUDA: two full batches, so that the dynamic-shape kernels exist before timing).
    t0 = time.perf_counter()
    lm.score(docs[:2 * bs], queries, **kw) if lm.device.type == "cuda" else lm.score(docs[:1], queries[:4], **kw)
    b.warmup_s = time.perf_counter() - t0
    emit(b.figures(partial=True))
    # The timed phase, one doc batch at a time: every document once, or fewer after --seconds or before the
    # deadline (at least one batch).
    b.parts, b.engine_s, longest = timed_batches(lambda b0: lm.score(docs[b0:b0 + bs], queries, **kw),
                                                 range(0, len(docs), bs), args)
    engine = np.concatenate(b.parts)
    res = b.figures(partial=True)
    print(f"engine: {engine.size} pairs in {b.engine_s:.1f} s = {res['engine_pairs_per_s']} pairs/s, "
          f"{res['flops_per_pair'] / 1e9:.2f} GFLOP/pair" + (f", MFU {100 * res['mfu']:.1f}%"
                                                            if res["mfu"] is not None else ""))
    emit(res)
    if args.naive_pairs > 0 and seconds_left(args) > 2 * longest + 10:
        _naive(b, engine)
        emit(b.figures(partial=True))
    nb = min(bs, len(docs))  # the profile: one more batch of documents against every query, if time is left
    b.prof = maybe_profile(args, lambda: lm.score(docs[:nb], queries, **kw), nb * len(queries), "pair", lm.device,
                           f"scoring {args.model}, {nb} docs x {len(queries)} queries", longest)
    if b.prof is not None:
        print(Path(args.profile).read_text(encoding="utf-8"))  # the timed path's profile, as written
    emit(b.figures(partial=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
