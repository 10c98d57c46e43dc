"""Scoring time and error of the demo's P in fp32, bf16, and bf16 with bf16 rotary frequencies (what
``Module.to(bfloat16)`` gives), side by side in one process.

    python reports/bf16-scoring-speed.py runs/bf16-eval/fp32 [--docs 8] [--reps 3] [--threads 1] [--max-doc-tokens N]

The demo's first documents (``+experiment=demo``) and the run folder's queries, scored with the demo's
settings (one document per pass, 2,048 query tokens per chunk, one thread: what each of `make demo`'s two
scoring processes does); the arms alternate, so all see the same machine load. Prints the median seconds per
document of each, their ratio, and |P - P_fp32| (max, mean) of the two bf16 arms.
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import statistics
import time

import numpy as np
import torch


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("run")
    ap.add_argument("--docs", type=int, default=8)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--max-doc-tokens", type=int, default=None, help="instead of the demo's 64 (longer prompts)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    from omegaconf import OmegaConf

    from gdr.config import load_config
    from gdr.data import corpus_from_config
    from gdr.stages.settings import LMSettings
    from gdr.store import read_queries

    cfg = load_config("score", ["+experiment=demo"])
    corpus = corpus_from_config(cfg.data)
    docs = corpus.model_inputs()[:args.docs]
    queries = [q["text"] for q in read_queries(args.run)]
    model = OmegaConf.to_container(cfg.model)
    model["max_doc_tokens"] = args.max_doc_tokens or model["max_doc_tokens"]
    lm = LMSettings.from_dict(model, device="cpu", threads=args.threads).build()
    kw = dict(doc_batch_size=1, max_query_tokens=2048, progress=False)
    bf16 = torch.bfloat16

    lm.score(docs[:1], queries[:8], compute_dtype=bf16, **kw)  # warm-up; makes the held bf16 copy and its stamp
    held = lm.score_copy
    new_copy = held.model
    old_copy = copy.deepcopy(lm.model).to(bf16).eval()  # the pre-fix copy: rotary buffers cast to bf16 too
    old_copy.set_attn_implementation(new_copy.config._attn_implementation)
    copies = {"bfloat16": new_copy, "bfloat16_rotary_bf16": old_copy}
    names = ("float32", "bfloat16", "bfloat16_rotary_bf16")
    times: dict[str, list[float]] = {k: [] for k in names}
    P = {}
    lm.score(docs[:1], queries[:8], **kw)  # warm-up, fp32
    for _ in range(args.reps):
        for name in names:
            if name in copies:  # where `score` takes its bf16 copy from
                lm.score_copy = dataclasses.replace(held, model=copies[name])
            t0 = time.perf_counter()
            P[name] = lm.score(docs, queries, compute_dtype=torch.float32 if name == "float32" else bf16, **kw)
            times[name].append((time.perf_counter() - t0) / len(docs))
    med = {k: statistics.median(v) for k, v in times.items()}
    flags = open("/proc/cpuinfo").read()
    out = {"max_doc_tokens": lm.max_doc_tokens, "docs": len(docs), "queries": len(queries), "threads": args.threads,
           "reps": args.reps,
           "prompt_tokens_mean": float(np.mean([len(p) for p in lm.prompt_ids(docs)])),
           "avx512_bf16": "avx512_bf16" in flags, "amx_bf16": "amx_bf16" in flags,
           **{f"{k}_s_per_doc": round(v, 3) for k, v in med.items()},
           "fp32_over_bf16": round(med["float32"] / med["bfloat16"], 3), "all_s": times}
    for name in names[1:]:
        d = P[name].astype(np.float64) - P["float32"]
        out[f"{name}_vs_fp32"] = {"max_abs": float(np.abs(d).max()), "mean_abs": float(np.abs(d).mean()),
                                  "mean_signed": float(d.mean())}
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
