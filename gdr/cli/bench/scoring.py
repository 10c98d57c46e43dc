"""Benchmark: the scoring engine against the naive way (one full forward pass per pair), with MFU.

    python -m gdr.cli.bench.scoring --model smollm2-135m --pairs 512
    python -m gdr.cli.bench.scoring --device cuda --model smollm2-135m --queries 1024 --doc-tokens 128 \
        --pairs 262144 --naive-pairs 64
    python -m gdr.cli.bench.scoring --device cuda --model t5-base-random --queries 1024 --doc-tokens 128 \
        --query-tokens 32 --pairs 262144 --naive-pairs 64

Documents are real Reuters stories cut to ``--doc-tokens`` tokens; queries are sampled from them by the
same model (``--query-tokens`` new tokens at most). The engine scores all ``pairs`` (n_docs x n_queries);
the naive reference scores a subset of them (``--naive-pairs``, 0 to skip) one full
``model(input_ids, labels=...)`` pass each; both rates are measured in this run, on the same pairs where
they overlap, and the max abs difference of log-probs is checked. ``flops_per_pair`` is
:func:`gdr.lm.flops.scoring_flops_per_pair` at the measured mean prompt and query lengths; ``mfu`` is the
engine's model FLOP/s over the device's peak bf16 FLOP/s (None on a CPU or an unknown GPU).
The LAST line printed is one JSON object; its keys: model, device, torch_device, peak_bf16_tflops,
pairs, docs, queries, prompt_tokens, query_tokens, doc_batch_size, max_query_tokens, attention,
compute_dtype, engine_pairs_per_s, engine_s, flops_per_pair, mfu, naive_pairs, naive_pairs_per_s, speedup,
max_abs_diff, doc_tokens, threads, partial, and the roofline of one pair (:func:`gdr.lm.flops.roofline`:
flops_per_unit, bytes_per_unit from :func:`gdr.lm.flops.scoring_bytes_per_pair`, limit_per_s, fraction_of_limit,
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
from pathlib import Path

import numpy as np
import torch

from gdr.cli.bench.common import add_time_args, bench_texts, build_lm, emit, seconds_left

log = logging.getLogger(__name__)

def _int_or_auto(v: str):
    return v if v == "auto" else int(v)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gdr.cli.bench.scoring", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m", help="bundled name, hub id/path, t5-base-random or smollm2-135m-random")
    ap.add_argument("--pairs", type=int, default=512, help="pairs scored by the engine (n_docs x n_queries)")
    ap.add_argument("--queries", type=int, default=64, help="queries per document (J)")
    ap.add_argument("--naive-pairs", type=int, default=48, help="pairs scored by the naive reference (0: skip it)")
    ap.add_argument("--doc-tokens", type=int, default=64)
    ap.add_argument("--query-tokens", type=int, default=32, help="max new tokens of a sampled query")
    ap.add_argument("--doc-batch-size", type=_int_or_auto, default=4, help="documents per pass, or auto")
    ap.add_argument("--max-query-tokens", type=_int_or_auto, default=2048, help="query tokens per chunk, or auto")
    ap.add_argument("--attention", default="auto", choices=["auto", "flex", "dense"], help="causal query packing")
    ap.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"],
                    help="compute dtype of the engine (auto: bf16 on CUDA, the model's on a CPU)")
    ap.add_argument("--sample-batch-size", type=int, default=None, help="queries sampled per batch (default 16, 256 on CUDA)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tokenizer", default=None, help="tokenizer path for *-random models (default: bundled MiniLM)")
    ap.add_argument("--docs-file", default=None, help="one document per line instead of Reuters R5")
    ap.add_argument("--profile", default=None,
                    help="write (and print) a torch.profiler table of one more batch of the timed path here, "
                         "if time is left")
    add_time_args(ap)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from gdr.lm.flops import device_name, mfu, peak_flops, roofline, scoring_bytes_per_pair, scoring_flops_per_pair
    from gdr.lm.scoring import auto_score_sizes, score_compute_dtype

    t_load = time.perf_counter()
    lm = build_lm(args.model, args.doc_tokens, args.device, args.tokenizer)
    t_load = time.perf_counter() - t_load
    cuda = lm.device.type == "cuda"
    n_docs = max(1, args.pairs // args.queries)
    docs = bench_texts(n_docs, args.seed, args.docs_file)
    t_sample = time.perf_counter()
    queries = lm.sample_queries(docs, args.queries, seed=args.seed, progress=False, max_new_tokens=args.query_tokens,
                                batch_size=args.sample_batch_size or (256 if cuda else 16)).texts
    t_sample = time.perf_counter() - t_sample
    prompt_len = [len(p) for p in lm.prompt_ids(docs)]
    query_len = [len(q) for q in lm.query_ids(queries)]
    bs, mq = args.doc_batch_size, args.max_query_tokens
    if "auto" in (bs, mq):
        abs_, amq = auto_score_sizes(lm.model, lm.device, max(prompt_len))
        bs, mq = (abs_ if bs == "auto" else bs), (amq if mq == "auto" else mq)
    dtype = None if args.dtype == "auto" else getattr(torch, args.dtype)
    kw = dict(doc_batch_size=bs, max_query_tokens=mq, progress=False, compute_dtype=dtype, attention=args.attention)
    print(f"model {args.model} on {lm.device} ({device_name(lm.device)}): {n_docs} docs x {len(queries)} queries, "
          f"docs cut to {args.doc_tokens} tokens, doc batch {bs}, {mq} query tokens per chunk")

    peak = peak_flops(lm.device)
    fpp = scoring_flops_per_pair(lm.model, float(np.mean(prompt_len)), float(np.mean(query_len)), len(queries))
    elt = torch.empty((), dtype=score_compute_dtype(args.dtype, lm.device,
                                                    next(lm.model.parameters()).dtype)).element_size()
    bpp = scoring_bytes_per_pair(lm.model, float(np.mean(prompt_len)), float(np.mean(query_len)), len(queries), bs, mq,
                                 elt)
    t_warm, t_engine = None, 0.0
    parts: list[np.ndarray] = []  # the engine's rows, doc batch by doc batch
    naive_rate = diff = naive_size = prof = None

    def figures(partial: bool) -> dict:
        """The figures so far (the engine's null before its first timed doc batch)."""
        n_pairs = sum(p.size for p in parts)
        eng_rate = n_pairs / t_engine if n_pairs else None
        util = mfu(fpp * n_pairs, t_engine, lm.device) if n_pairs else None
        return {
            "model": args.model, "device": device_name(lm.device), "torch_device": str(lm.device),
            "peak_bf16_tflops": None if peak is None else peak / 1e12, "pairs": int(n_pairs),
            "docs": n_pairs // len(queries), "queries": len(queries),
            "prompt_tokens": round(float(np.mean(prompt_len)), 1),
            "query_tokens": round(float(np.mean(query_len)), 2), "doc_batch_size": bs, "max_query_tokens": mq,
            "attention": args.attention, "compute_dtype": args.dtype,
            "engine_pairs_per_s": None if eng_rate is None else round(eng_rate, 2),
            "engine_s": round(t_engine, 3), "load_s": round(t_load, 2), "sample_s": round(t_sample, 2),
            "warmup_s": t_warm and round(t_warm, 2), "launches_per_pair": prof and prof["launches_per_unit"],
            "flops_per_pair": fpp, "mfu": None if util is None else round(util, 4),
            "naive_pairs": naive_size, "naive_pairs_per_s": None if naive_rate is None else round(naive_rate, 3),
            "speedup": None if naive_rate is None or eng_rate is None else round(eng_rate / naive_rate, 2),
            "max_abs_diff": diff, "doc_tokens": args.doc_tokens, "threads": torch.get_num_threads(),
            "partial": partial, **roofline(fpp, bpp, eng_rate, lm.device)}

    emit(figures(partial=True))
    # Warm-up (compiles on CUDA: two full batches, so that the dynamic-shape kernels exist before timing).
    t_warm = time.perf_counter()
    lm.score(docs[:2 * bs], queries, **kw) if cuda else lm.score(docs[:1], queries[:4], **kw)
    t_warm = time.perf_counter() - t_warm
    emit(figures(partial=True))
    # The timed phase, one doc batch at a time: every document once, or fewer after --seconds / before the
    # deadline (at least one batch).
    longest = 0.0
    for b0 in range(0, n_docs, bs):
        if parts and ((args.seconds is not None and t_engine >= args.seconds) or seconds_left(args) < 2 * longest + 5):
            print(f"timed phase stopped after {b0} of {n_docs} documents (--seconds {args.seconds}, "
                  f"{seconds_left(args):.0f} s to the deadline)")
            break
        t0 = time.perf_counter()
        parts.append(lm.score(docs[b0:b0 + bs], queries, **kw))
        longest = max(longest, time.perf_counter() - t0)
        t_engine += time.perf_counter() - t0
    engine = np.concatenate(parts)
    res = figures(partial=True)
    print(f"engine: {engine.size} pairs in {t_engine:.1f} s = {res['engine_pairs_per_s']} pairs/s, "
          f"{fpp / 1e9:.2f} GFLOP/pair" + (f", MFU {100 * res['mfu']:.1f}% of {peak / 1e12:.0f} TFLOP/s"
                                           if res["mfu"] is not None else ""))
    emit(res)

    if args.naive_pairs > 0 and seconds_left(args) > 2 * longest + 10:
        nd = max(1, min(len(engine), int(np.ceil(args.naive_pairs / len(queries)))))
        nq = min(len(queries), int(np.ceil(args.naive_pairs / nd)))
        t0 = time.perf_counter()
        naive = lm.score_naive(docs[:nd], queries[:nq])
        t_naive = time.perf_counter() - t0
        naive_rate, naive_size = naive.size / t_naive, naive.size
        diff = float(np.abs(engine[:nd, :nq] - naive).max())
        print(f"naive : {naive.size} pairs in {t_naive:.1f} s = {naive_rate:.2f} pairs/s")
        print(f"speedup {res['engine_pairs_per_s'] / naive_rate:.1f}x, max |engine - naive| = {diff:.2e} "
              f"(over {naive.size} shared pairs)")
        emit(figures(partial=True))
    if args.profile:  # one more batch of documents against every query, after the timing, if time is left
        from gdr.cli.bench.common import profile_skipped, profile_table

        nb, need = min(bs, n_docs), 3 * longest + 10
        title = f"scoring {args.model}, {nb} docs x {len(queries)} queries"
        if seconds_left(args) > need:
            prof = profile_table(lambda: lm.score(docs[:nb], queries, **kw), nb * len(queries), "pair", lm.device,
                                 args.profile, title=title)
            print(Path(args.profile).read_text(encoding="utf-8"))  # the timed path's profile, as written
        else:
            prof = profile_skipped(args.profile, title, seconds_left(args), need)
    emit(figures(partial=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
