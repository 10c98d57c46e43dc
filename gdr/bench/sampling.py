"""Benchmark: query sampling with our decode loop against transformers' ``generate``, side by side.

    python -m gdr.bench.sampling                                  # this machine, small defaults on a CPU
    python -m gdr.bench.sampling --device cuda --doc-tokens 128 --max-new-tokens 32 --queries 8192

For each model (``--models``; default the bundled SmolLM2 and a random-init T5-base, see
``gdr.bench.common.build_lm``) both samplers draw the same documents (Reuters R5 stories cut to
``--doc-tokens`` tokens, drawn with replacement as ``sample_queries`` does): ours through
``GenerativeLM.sample_queries`` (``--queries`` queries), the reference through ``GenerativeLM.generate`` in
batches of ``--hf-batch-size`` (``--hf-queries`` of them, the first ones of the same draw), the two
alternating batch by batch so that other jobs on a shared machine slow both alike. On CUDA one warm-up
batch of each is not timed (it also compiles the decode step). Reported: queries/s, new tokens/s (up to and
including the stop token), MFU (model FLOPs of the computed tokens / the GPU's peak bf16 FLOP/s;
null on a CPU), the speedup, and the roofline of one query (:func:`gdr.cost.roofline`: ``flops_per_unit``,
``bytes_per_unit`` from :func:`gdr.cost.sampling_bytes` with decode steps = decode rows / batch size and
one prefill pass per batch, ``limit_per_s``, ``fraction_of_limit``, ``h200_limit_per_s``). One JSON line per
model, then the LAST line: one JSON object with the first model's figures at the top level and every model's
under ``models``.

On a cold GPU most of the time goes to loading (``load_s``) and to compiling and capturing the decode step
(``warmup_s``): every timed batch has the warm-up batch's shape, and re-draws of empty queries compile
nothing new. The timed rounds stop after ``--seconds`` or early enough for ``--deadline``; a JSON line
(``"partial": true``) follows the warm-up and every round. ``--profile`` profiles one more batch of the
timed (compiled) path, after the timing and only when the deadline leaves time for it.
"""
from __future__ import annotations

import argparse
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from gdr.bench.common import bench_texts, build_lm, emit, maybe_profile, parse_bench_args, roofline, timed_batches
from gdr.cost import device_name, mfu, sampling_bytes, sampling_flops
from gdr.lm.decode import Decoder
from gdr.rules import NON_NEGATIVE, POSITIVE, auto_or, number, option_type, seed

log = logging.getLogger(__name__)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _hf_tokens(lm, docs, seed, bs, **kw) -> tuple[int, list[str]]:
    """The reference sampler (transformers' ``generate``) on ``docs`` in batches of ``bs``: (new tokens generated,
    texts)."""
    n_tok, texts = 0, []
    stops = torch.tensor(lm._stop_ids())
    for b0 in range(0, len(docs), bs):
        ids = lm.prompt_ids(docs[b0:b0 + bs])
        batch = lm._pad(ids, left=not lm.is_seq2seq)
        torch.manual_seed(seed * 1_000_003 + b0)
        with torch.inference_mode():  # exactly `GenerativeLM.generate` (fp32 on CUDA too)
            out = lm.model.generate(**batch, do_sample=True, eos_token_id=lm._stop_ids(), pad_token_id=lm.pad_id,
                                    **kw)
        out = out[:, batch["input_ids"].shape[1]:] if not lm.is_seq2seq else out[:, 1:]
        out = out.cpu()
        stop = torch.isin(out, stops)
        first = torch.where(stop.any(1), stop.float().argmax(1) + 1, torch.tensor(out.shape[1]))
        n_tok += int(first.sum())
        texts += lm.tokenizer.batch_decode(out, skip_special_tokens=True)
    return n_tok, texts


@dataclass
class _Bench:
    """One model's sampling benchmark: the model and its sizes, and what it has measured so far."""

    name: str
    args: argparse.Namespace
    lm: Any
    docs: list[str]
    n_q: int  # queries of ours (whole batches: the timed run has one batch shape, compiled once on CUDA)
    n_hf: int  # queries of transformers' generate
    bs: int
    hf_bs: int
    load_s: float
    warmup_s: float | None = None
    t_ours: float = 0.0
    t_hf: float = 0.0
    ours: Any = None  # the SampledQueries so far
    hf_tok: int = 0
    hf_texts: list = field(default_factory=list)
    stats: dict = field(default_factory=dict)  # the decoder's work in the timed rounds (not the profiled batch)
    prof: dict | None = None

    def sample_kw(self) -> dict:
        a = self.args  # compiled or not for the whole bench (sample_queries' own auto would decide per batch)
        return dict(max_new_tokens=a.max_new_tokens, top_k=a.top_k, top_p=a.top_p, temperature=1.0,
                    compile=self.lm.device.type == "cuda" if a.compile == "auto" else a.compile == "on")

    def figures(self, partial: bool) -> dict:
        """The figures so far (rates null before the first timed round)."""
        args, dec, dev, stats = self.args, self.lm.decoder(), self.lm.device, self.stats or {"new_tokens": 0}
        n_done, n_hf_done = len(self.ours.texts) if self.ours else 0, len(self.hf_texts)
        rate = lambda n, t: round(n / t, 2) if t > 0 and n else None  # noqa: E731
        qps, hf_qps = rate(n_done, self.t_ours), rate(n_hf_done, self.t_hf)
        flops = sampling_flops(self.lm.model, stats) if self.stats else 0.0
        m = mfu(flops, self.t_ours, dev) if self.t_ours else None
        res = {"model": self.name, "device": device_name(dev), "queries": n_done, "hf_queries": n_hf_done,
               "batch_size": self.bs, "hf_batch_size": self.hf_bs, "doc_tokens": args.doc_tokens,
               "max_new_tokens": args.max_new_tokens, "queries_per_s": qps,
               "tokens_per_s": rate(stats["new_tokens"], self.t_ours), "hf_queries_per_s": hf_qps,
               "hf_tokens_per_s": rate(self.hf_tok, self.t_hf),
               "speedup": round(qps / hf_qps, 2) if qps and hf_qps else None,
               "mfu": round(m, 4) if m is not None else None,
               "tflops_per_s": round(flops / self.t_ours / 1e12, 3) if self.t_ours else None,
               "mean_new_tokens": round(stats["new_tokens"] / n_done, 2) if n_done else None,
               "hf_mean_new_tokens": round(self.hf_tok / n_hf_done, 2) if n_hf_done else None,
               "empty_redrawn": int(self.ours.n_redrawn) if self.ours else 0, "compiled": bool(dec.compile),
               "compile": dec.compile_record(), "load_s": round(self.load_s, 2),
               "warmup_s": self.warmup_s and round(self.warmup_s, 2), "timed_s": round(self.t_ours, 3),
               "launches_per_query": self.prof and self.prof["launches_per_unit"],
               "dtype": str(next(dec.model.parameters()).dtype).replace("torch.", ""),
               "threads": torch.get_num_threads(), "partial": partial}
        if n_done and self.t_ours:  # the roofline of one query (module docstring)
            elt = next(dec.model.parameters()).element_size()
            moved = sampling_bytes(dec.model, stats, decode_steps=stats["decode_tokens"] / self.bs,
                                   prefill_passes=max(1, n_done // self.bs), element_size=elt)
            res.update(roofline(flops / n_done, moved / n_done, qps, dev))
        return res


def _setup(name: str, args) -> _Bench:
    """Load model ``name`` and fix the sizes of its run."""
    t_load = time.perf_counter()
    lm = build_lm(name, args.doc_tokens, args.device, args.tokenizer)
    t_load = time.perf_counter() - t_load
    if args.compile != "auto":
        lm._decoder = Decoder(lm, compile=args.compile == "on")
    cuda = lm.device.type == "cuda"
    n_q = args.queries or (8192 if cuda else 48)
    n_hf = min(n_q, args.hf_queries or (1024 if cuda else 32))
    bs = int(args.batch_size if args.batch_size != "auto" else lm.auto_batch_size(args.max_new_tokens))
    b = _Bench(name, args, lm, bench_texts(args.docs, args.seed, args.docs_file), -(-n_q // bs) * bs, n_hf, bs,
               int(args.hf_batch_size or bs), t_load)
    log.info("%s on %s: %d docs cut to %d tokens, %d queries in batches of %d (HF generate: %d in batches of %d), "
             "%d new tokens", name, device_name(lm.device), len(b.docs), args.doc_tokens, b.n_q, bs, n_hf, b.hf_bs,
             args.max_new_tokens)
    return b


def _round(b: _Bench, r: int, b0: int) -> None:
    """One timed round: a batch of ours, then transformers' generate on the same drawn documents."""
    args, dev, kw = b.args, b.lm.device, b.sample_kw()
    _sync(dev)
    t0 = time.perf_counter()
    b.ours = b.lm.sample_queries(b.docs, b0 + b.bs, seed=args.seed, batch_size=b.bs, progress=False, start=b.ours,
                                 **kw)
    _sync(dev)
    b.t_ours += time.perf_counter() - t0
    if len(b.hf_texts) < b.n_hf:  # transformers' generate on the same documents, in batches of hf_bs
        drawn = [b.docs[i] for i in b.ours.source_index[len(b.hf_texts):min(b0 + b.bs, b.n_hf)]]
        t0 = time.perf_counter()
        tok, texts = _hf_tokens(b.lm, drawn, args.seed + r, b.hf_bs, **_hf_kw(kw))
        _sync(dev)
        b.t_hf += time.perf_counter() - t0
        b.hf_tok, b.hf_texts = b.hf_tok + tok, b.hf_texts + texts
    b.stats = dict(b.lm.decoder().stats)


def _hf_kw(kw: dict) -> dict:
    return {k: v for k, v in kw.items() if k != "compile"}


def bench_model(name: str, args, report=lambda res: None) -> dict:
    """Load, warm up and time model ``name``; ``report(figures)`` gets the partial figures as they come.

    The warm-up (on CUDA it compiles the decode step), then the timed rounds: one batch of ours, then the old
    sampler on the same drawn documents, alternately, so that a machine shared with other jobs slows both alike.
    A JSON line after the warm-up and after every round (a step stopped at its limit keeps them)."""
    b = _setup(name, args)
    lm, bs, kw = b.lm, b.bs, b.sample_kw()
    report(b.figures(partial=True))  # load_s: a figure already
    t0 = time.perf_counter()
    if lm.device.type == "cuda":
        lm.sample_queries(b.docs, min(bs, b.n_q), seed=args.seed + 1, batch_size=bs, progress=False, **kw)
        _hf_tokens(lm, b.docs[:min(b.hf_bs, b.n_hf)], args.seed + 1, b.hf_bs, **_hf_kw(kw))
        _sync(lm.device)
    b.warmup_s = time.perf_counter() - t0
    lm.decoder().stats = {k: 0 for k in lm.decoder().stats}
    report(b.figures(partial=True))
    state = argparse.Namespace(seconds=args.seconds, deadline=args.deadline, round=0)

    def one_round(b0: int) -> None:
        _round(b, state.round, b0)
        state.round += 1
        report(b.figures(partial=True))

    _, _, longest = timed_batches(one_round, range(0, b.n_q, bs), args)  # ours and generate: each round
    path = Path(args.profile) if args.profile else None  # one more batch of ours, the timed (compiled) path
    if path is not None and len([m for m in args.models.split(",") if m]) > 1:
        path = path.with_name(f"{path.stem}-{Path(name).name}{path.suffix}")
    b.prof = maybe_profile(argparse.Namespace(**{**vars(args), "profile": path}),
                           lambda: lm.sample_queries(b.docs, bs, seed=args.seed + 2, batch_size=bs, progress=False,
                                                     **kw), bs, "query", lm.device, f"sampling {name}, batch {bs}",
                           longest)
    res = b.figures(partial=False)
    log.info("ours: %d queries in %.1f s = %s q/s (%s new tokens/s, MFU %s); generate: %d in %.1f s = %s q/s; "
             "speedup %sx", res["queries"], b.t_ours, res["queries_per_s"], res["tokens_per_s"], res["mfu"],
             res["hf_queries"], b.t_hf, res["hf_queries_per_s"], res["speedup"])
    for t_new, t_old in list(zip(b.ours.texts, b.hf_texts))[:3]:
        log.info("  ours: %-50s | generate: %s", t_new[:50], t_old.strip()[:50])
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="gdr bench sampling", description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="smollm2-135m,t5-base-random",
                    help="comma-separated: bundled name, hub id/path, t5-base-random or smollm2-135m-random")
    ap.add_argument("--doc-tokens", type=option_type(POSITIVE), default=128, help="documents cut to this many tokens")
    ap.add_argument("--max-new-tokens", type=option_type(POSITIVE), default=32)
    ap.add_argument("--batch-size", type=option_type(auto_or(POSITIVE)),
                    default="auto", help="queries per batch, or auto (sample.batch_size=auto)")
    ap.add_argument("--hf-batch-size", type=option_type(POSITIVE), default=None,
                    help="batch of HF generate (default: --batch-size; 16 was the old sample.batch_size)")
    ap.add_argument("--queries", type=option_type(POSITIVE), default=None,
                    help="queries sampled by ours (default 8192 on CUDA, 48 on CPU)")
    ap.add_argument("--hf-queries", type=option_type(POSITIVE), default=None,
                    help="queries sampled by HF generate (default 1024 on CUDA, 32 on CPU)")
    ap.add_argument("--docs", type=option_type(POSITIVE), default=5000,
                    help="documents the queries are drawn from (few repeats at the default; the demo has 80)")
    ap.add_argument("--top-k", type=option_type(NON_NEGATIVE), default=50)
    ap.add_argument("--top-p", type=option_type(number(0, 1), float), default=0.99)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--compile", choices=("auto", "on", "off"), default="auto",
                    help="capture the decode step with torch.compile(mode='reduce-overhead'); auto = on CUDA")
    ap.add_argument("--seed", type=option_type(seed), default=0)
    ap.add_argument("--tokenizer", default=None, help="tokenizer path for *-random models (default: bundled MiniLM)")
    ap.add_argument("--docs-file", default=None, help="one document per line instead of Reuters R5")
    args = parse_bench_args(ap, argv, "write a torch.profiler table of one more (compiled) batch here, if time is left")

    results: list[dict] = []

    def summary(done: list[dict]) -> dict:  # the first model's figures at the top level, every model's under models
        return {"bench": "sampling", **done[0], "models": {r["model"]: r for r in done}}

    for name in [m for m in args.models.split(",") if m]:
        res = bench_model(name, args, report=lambda partial: emit(summary([*results, partial])))
        results.append(res)
        print(json.dumps(res))
    emit(summary(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
