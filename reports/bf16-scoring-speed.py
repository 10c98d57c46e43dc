"""Scoring time of the demo's P in fp32 and in bf16 on this CPU, side by side in one process (issue 26).

    python reports/bf16-scoring-speed.py runs/bf16-eval/fp32 [--docs 8] [--reps 3] [--threads 1]

The demo's documents (``+experiment=demo``) and the run folder's queries, scored with the demo's settings
(one document per pass, 2,048 query tokens per chunk, one thread: what each of `make demo`'s two scoring
processes does); the two dtypes alternate, so both see the same machine load. Prints the median seconds per
document of each and their ratio.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("run")
    ap.add_argument("--docs", type=int, default=8)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    from gdr.config import load_config
    from gdr.data import corpus_from_config
    from gdr.stages.settings import LMSettings
    from gdr.store import read_queries
    from omegaconf import OmegaConf

    cfg = load_config("score", ["+experiment=demo"])
    corpus = corpus_from_config(cfg.data)
    docs = corpus.model_inputs()[:args.docs]
    queries = [q["text"] for q in read_queries(args.run)]
    lm = LMSettings.from_dict(OmegaConf.to_container(cfg.model), device="cpu", threads=args.threads).build()
    times: dict[str, list[float]] = {"float32": [], "bfloat16": []}
    kw = dict(doc_batch_size=1, max_query_tokens=2048, progress=False)
    for dtype in times:  # warm-up (the bf16 copy, oneDNN's kernels)
        lm.score(docs[:1], queries[:8], compute_dtype=getattr(torch, dtype), **kw)
    for _ in range(args.reps):
        for dtype in times:
            t0 = time.perf_counter()
            lm.score(docs, queries, compute_dtype=getattr(torch, dtype), **kw)
            times[dtype].append((time.perf_counter() - t0) / len(docs))
    med = {k: statistics.median(v) for k, v in times.items()}
    flags = open("/proc/cpuinfo").read()
    out = {"docs": len(docs), "queries": len(queries), "threads": args.threads, "reps": args.reps,
           "avx512_bf16": "avx512_bf16" in flags, "amx_bf16": "amx_bf16" in flags,
           **{f"{k}_s_per_doc": round(v, 3) for k, v in med.items()},
           "fp32_over_bf16": round(med["float32"] / med["bfloat16"], 3), "all_s": times}
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
