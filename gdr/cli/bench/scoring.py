"""Benchmark: the scoring engine against the naive way (one full forward pass per pair).

    python -m gdr.cli.bench.scoring --model smollm2-135m --pairs 512

Documents are real Reuters stories cut to ``--doc-tokens`` tokens; queries are sampled from them by the
same model. The engine scores all ``pairs`` (n_docs x n_queries); the naive reference scores a subset
of them (``--naive-pairs``) one full ``model(input_ids, labels=...)`` pass each; both rates are measured
in this run, on the same pairs where they overlap, and the max abs difference of log-probs is checked.
The LAST line printed is one JSON object.
"""
from __future__ import annotations

import argparse
import json
import logging
import time

import numpy as np
import torch

log = logging.getLogger(__name__)

T5_BASE = dict(d_model=768, d_ff=3072, d_kv=64, num_layers=12, num_decoder_layers=12, num_heads=12,
               vocab_size=32128, feed_forward_proj="relu", tie_word_embeddings=True)


def build_lm(name: str, doc_tokens: int, device: str, tokenizer: str | None = None):
    from gdr.lm import GenerativeLM, PromptConfig

    if name.endswith("-random"):
        # Random-init architectures (no weights needed): tokenizer from the bundled MiniLM model.
        from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, T5Config, T5ForConditionalGeneration

        from gdr.models import resolve_model

        tok = AutoTokenizer.from_pretrained(tokenizer or resolve_model("minilm-l6"))
        tok.eos_token = tok.sep_token
        torch.manual_seed(0)
        if name == "t5-base-random":
            cfg = T5Config(**{**T5_BASE, "vocab_size": len(tok)}, pad_token_id=tok.pad_token_id,
                           decoder_start_token_id=tok.pad_token_id, eos_token_id=tok.sep_token_id)
            model = T5ForConditionalGeneration(cfg)
            prompt = PromptConfig(style="prefix", prefix="text2query: ", system=None, shots=[])
        elif name == "smollm2-135m-random":
            cfg = LlamaConfig(vocab_size=len(tok), hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                              num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True)
            model = LlamaForCausalLM(cfg)
            prompt = PromptConfig(style="prefix", prefix="Document: ", system=None, shots=[])
        else:
            raise SystemExit(f"unknown random architecture {name!r}; use t5-base-random or smollm2-135m-random")
        return GenerativeLM(model, tok, prompt=prompt, max_doc_tokens=doc_tokens, device=device)
    return GenerativeLM(name, max_doc_tokens=doc_tokens, device=device)


def bench_texts(n: int, seed: int, docs_file: str | None = None) -> list[str]:
    if docs_file:  # one document per line (for machines without ../shared/data)
        with open(docs_file, encoding="utf-8") as f:
            lines = [ln.strip() for ln in f if ln.strip()]
        return (lines * (n // max(len(lines), 1) + 1))[:n]
    from gdr.data import load_corpus

    return load_corpus("r5").sample(n, seed=seed).model_inputs()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gdr.cli.bench.scoring", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m", help="bundled name, hub id/path, t5-base-random or smollm2-135m-random")
    ap.add_argument("--pairs", type=int, default=512, help="pairs scored by the engine (n_docs x n_queries)")
    ap.add_argument("--queries", type=int, default=64, help="queries per document (J)")
    ap.add_argument("--naive-pairs", type=int, default=48, help="pairs scored by the naive reference")
    ap.add_argument("--doc-tokens", type=int, default=64)
    ap.add_argument("--doc-batch-size", type=int, default=4)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tokenizer", default=None, help="tokenizer path for *-random models (default: bundled MiniLM)")
    ap.add_argument("--docs-file", default=None, help="one document per line instead of Reuters R5")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    lm = build_lm(args.model, args.doc_tokens, args.device, args.tokenizer)
    n_docs = max(1, args.pairs // args.queries)
    docs = bench_texts(n_docs, args.seed, args.docs_file)
    queries = lm.sample_queries(docs, args.queries, seed=args.seed, progress=False).texts
    print(f"model {args.model} on {lm.device}: {n_docs} docs x {len(queries)} queries, docs cut to {args.doc_tokens} tokens")

    lm.score(docs[:1], queries[:4], progress=False)  # warm-up
    t0 = time.perf_counter()
    engine = lm.score(docs, queries, doc_batch_size=args.doc_batch_size, progress=False)
    t_engine = time.perf_counter() - t0
    n_pairs = engine.size

    nd = max(1, min(n_docs, int(np.ceil(args.naive_pairs / len(queries)))))
    nq = min(len(queries), int(np.ceil(args.naive_pairs / nd)))
    t0 = time.perf_counter()
    naive = lm.score_naive(docs[:nd], queries[:nq])
    t_naive = time.perf_counter() - t0

    eng_rate, naive_rate = n_pairs / t_engine, naive.size / t_naive
    diff = float(np.abs(engine[:nd, :nq] - naive).max())
    print(f"engine: {n_pairs} pairs in {t_engine:.1f} s = {eng_rate:.1f} pairs/s")
    print(f"naive : {naive.size} pairs in {t_naive:.1f} s = {naive_rate:.2f} pairs/s")
    print(f"speedup {eng_rate / naive_rate:.1f}x, max |engine - naive| = {diff:.2e} (over {naive.size} shared pairs)")
    print(json.dumps({"model": args.model, "pairs": int(n_pairs), "engine_pairs_per_s": round(eng_rate, 2),
                      "naive_pairs_per_s": round(naive_rate, 3), "speedup": round(eng_rate / naive_rate, 2),
                      "max_abs_diff": diff, "device": str(lm.device), "doc_tokens": args.doc_tokens,
                      "threads": torch.get_num_threads()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
