"""Constrained beam search: tensor trie vs a per-beam Python trie walk.

``python -m gdr.bench.decoding [--queries 32] [--beam 100] [--docs 100000] [--model tiny|small30m]``

Search throughput at the size ``gdr evaluate`` runs (the GPU figure of ``make bench-gpu``)::

    python -m gdr.bench.decoding --model small30m --docs 100000 --beam 100 --queries 4096 --batch 512 --no-reference

A retriever (``--model tiny``: a small random-init one; ``small30m``: the preset of conf/stage/train.yaml,
pretrained MiniLM encoder, random decoder) decodes ``--queries`` random queries at beam ``--beam`` over a trie
of ``--docs`` random docids (K = 30, depth 4), twice on the same model and inputs:

- **ours** (``gdr.training.search.constrained_beam_search``): the allowed symbols of every hypothesis
  come from one gather on the child table; no Python loop per beam or per query;
- **reference**: the way NCI and GENRE constrain HF ``generate``: a ``prefix_allowed_tokens_fn``
  walks a nested-dict trie with each beam's token prefix (``sent.tolist()``) and fills that beam's
  row of a mask, one beam at a time. Everything else (KV-cached decoder steps, top-k, finished
  hypotheses) is the same, so both must return the same ranked docids.

``--no-reference`` skips the reference (slow at large sizes); ``reference_queries_per_s``, ``speedup``
and ``same_results`` are then null. On CUDA the search runs under bf16 autocast, as ``gdr evaluate`` does.

One batch is a warm-up (``warmup_s``; ``load_s`` is the model and, on a cold GPU, the CUDA context); the
timed batches stop after ``--seconds`` or early enough for ``--deadline`` (``queries`` says how many were
timed; the reference decodes the same ones); ``--profile`` profiles one more batch if time is left.
Prints as its last line one JSON object: ``queries_per_s``, ``reference_queries_per_s``,
``speedup``, ``same_results``, ``model``, ``device``, the settings, and the roofline of one search query
(:func:`gdr.cost.roofline`: ``flops_per_unit`` from :func:`gdr.cost.search_flops_per_query`, ``bytes_per_unit``
from :func:`gdr.cost.search_bytes_per_query`, ``limit_per_s``, ``fraction_of_limit``, ``h200_limit_per_s``, ...)
and ``mfu``;
the same line with ``"partial": true`` follows the warm-up and the timed phase.
``--batch auto`` takes ``gdr evaluate``'s auto size (as many queries as fit half the free GPU memory, up to
1,024; 32 on the CPU).
"""
from __future__ import annotations

import argparse
import contextlib
import logging
import time
from dataclasses import replace

import torch

from gdr.bench.common import (
    check_docid_space,
    emit,
    maybe_profile,
    parse_bench_args,
    preset_config,
    random_codes,
    roofline,
    timed_batches,
)
from gdr.cost import device_name, mfu, search_bytes_per_query, search_flops_per_query
from gdr.indexing.trie import DocidTrie, build_trie
from gdr.options import RankingOptions
from gdr.rules import POSITIVE, auto_or, option_type, seed
from gdr.training.model import EOS, PAD, GenerativeRetriever, RetrieverConfig
from gdr.training.search import CPU_SEARCH_BATCH, BeamOutput, constrained_beam_search, search_batch_for_memory

log = logging.getLogger(__name__)

__all__ = ["main", "reference_beam_search", "build_dict_trie", "random_codes"]


def build_dict_trie(model: GenerativeRetriever, codes: list[tuple[int, ...]]) -> dict:
    """Nested dict over decoder token ids ``[PAD, tok(0, c0), tok(1, c1), ..., EOS]`` (GENRE/NCI style)."""
    K = model.config.n_digits
    root: dict = {}
    for code in codes:
        node = root.setdefault(PAD, {})
        for p, d in enumerate(code):
            node = node.setdefault(2 + p * K + d, {})
        node.setdefault(EOS, {})
    return root


def _allowed_tokens(trie: dict, sent: list[int]) -> list[int]:
    """``prefix_allowed_tokens_fn``: walk the dict trie along ``sent``."""
    node = trie
    for tok in sent:
        node = node.get(tok)
        if node is None:
            return []
    return list(node.keys())


@torch.no_grad()
def reference_beam_search(model: GenerativeRetriever, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                          dict_trie: dict, max_len: int, beam: int, k: int,
                          length_penalty: float = RankingOptions.length_penalty) -> BeamOutput:
    """Beam search with a per-beam Python trie walk (the reference).

    Same arithmetic as ``constrained_beam_search``; without a tensor trie there are no node ids, so
    the returned ``nodes`` holds each hypothesis' token sequence, of shape (B, k, steps + 1).
    """
    device = input_ids.device
    K = model.config.n_digits
    K1 = K + 1
    enc = model.encode(input_ids, attention_mask)
    B = enc.shape[0]
    state = model.start(enc, attention_mask)
    neg_inf = float("-inf")
    seqs = torch.full((B, 1, 1), PAD, dtype=torch.long, device=device)  # (B, w, t+1) like HF input_ids
    scores = torch.zeros(B, 1, device=device)
    length = torch.zeros(B, 1, device=device)
    done = torch.zeros(B, 1, dtype=torch.bool, device=device)
    keep_row = torch.full((K1,), float("-inf"), device=device)
    keep_row[0] = 0.0
    tokens = torch.full((B,), PAD, dtype=torch.long, device=device)
    w = 1
    for t in range(max_len + 1):
        logp = model.step(state, tokens).view(B, w, K1)
        # --- the per-beam constraint (PrefixConstrainedLogitsProcessor + a dict trie) ---
        mask = torch.full((B * w, K1), float("-inf"), device=device)
        for i, sent in enumerate(seqs.view(B * w, -1)):
            allowed = _allowed_tokens(dict_trie, sent.tolist())
            slots = [K if tok == EOS else tok - 2 - t * K for tok in allowed]
            if slots:
                mask[i, slots] = 0.0
        mask = mask.view(B, w, K1)
        cand = torch.where(torch.isfinite(mask), scores[..., None] + logp, neg_inf)
        cand = torch.where(done[..., None], scores[..., None] + keep_row, cand)
        if length_penalty:
            cand_len = torch.where(done, length, torch.full_like(length, t + 1))
            rank = cand / cand_len[..., None] ** length_penalty
        else:
            rank = cand
        w_new = min(beam, w * K1)
        top, idx = rank.view(B, w * K1).topk(w_new, dim=1)
        src, slot = idx // K1, idx % K1
        was_done = done.gather(1, src)
        scores = cand.view(B, -1).gather(1, idx)
        length = torch.where(was_done, length.gather(1, src), torch.full_like(length.gather(1, src), t + 1))
        done = was_done | (slot == K)
        step_tok = model.slot_tokens[t][slot]
        tokens = torch.where(done, torch.full_like(step_tok, PAD), step_tok)
        seqs = torch.cat([seqs.gather(1, src[..., None].expand(-1, -1, seqs.shape[2])), tokens[..., None]], 2)
        tokens = tokens.view(-1)
        if t == max_len or bool(done.all()):
            break
        flat = (torch.arange(B, device=device)[:, None] * w + src).view(-1)
        model.reorder(state, flat)
        w = w_new
    final = scores / length.clamp_min(1) ** length_penalty if length_penalty else scores
    final = torch.where(done & torch.isfinite(scores), final, neg_inf)
    best, order = final.topk(min(k, final.shape[1]), dim=1)
    out = seqs.gather(1, order[..., None].expand(-1, -1, seqs.shape[2]))  # (B, k, T) token sequences
    return BeamOutput(out, best)


def _codes_from_tokens(seqs: torch.Tensor, K: int) -> list[list[tuple[int, ...]]]:
    res = []
    for row in seqs.cpu().tolist():
        res.append([tuple((tok - 2) % K for tok in s[1:] if tok >= 2) for s in row])
    return res


def _codes_from_nodes(trie: DocidTrie, nodes: torch.Tensor) -> list[list[tuple[int, ...]]]:
    return [[trie.code_of(n) for n in row if n >= 0] for row in nodes.cpu().tolist()]


def _args(argv: list[str] | None):
    ap = argparse.ArgumentParser(prog="gdr bench decoding", description=__doc__.split("\n\n")[0])
    ap.add_argument("--queries", type=option_type(POSITIVE), default=32, help="number of queries (default 32)")
    ap.add_argument("--beam", type=option_type(POSITIVE), default=100, help="beam width (default 100)")
    ap.add_argument("--docs", type=option_type(POSITIVE),
                    default=100_000, help="random docids in the trie (default 100,000)")
    ap.add_argument("--K", type=option_type(POSITIVE), default=30)
    ap.add_argument("--depth", type=option_type(POSITIVE), default=4)
    ap.add_argument("--batch", type=option_type(auto_or(POSITIVE)),
                    default="16", help="queries per beam-search batch, or auto (gdr evaluate's)")
    ap.add_argument("--query-len", type=option_type(POSITIVE), default=16)
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    ap.add_argument("--seed", type=option_type(seed), default=0)
    ap.add_argument("--threads", type=option_type(POSITIVE),
                    default=None, help="torch CPU threads (default: torch's choice)")
    ap.add_argument("--model", default="tiny", choices=["tiny", "small30m", "mini"],
                    help="tiny (random-init, default) or a preset of conf/stage/train.yaml")
    ap.add_argument("--no-reference", dest="reference", action="store_false",
                    help="skip the per-beam Python reference (slow at large sizes)")
    args = parse_bench_args(ap, argv, "write a torch.profiler table of one more batch here, if time is left")
    check_docid_space(ap, args)
    return args


def _model(args, device: torch.device) -> GenerativeRetriever:
    """The ``tiny`` random-init retriever or a preset, on ``device``; ``args.batch`` resolved (``auto``: what
    ``gdr evaluate`` would take)."""
    if args.model == "tiny":
        cfg = RetrieverConfig(encoder=None, encoder_config=dict(d_model=64, num_layers=2, num_heads=4, d_ff=128),
                              n_digits=args.K, max_code_len=args.depth, d_model=64, num_layers=2, num_heads=4,
                              d_ff=128, dropout=0.0)
        model = GenerativeRetriever.build(cfg, vocab_size=1000).to(device).eval()
    else:
        model = GenerativeRetriever.build(preset_config(args.model, args.K, args.depth)).to(device).eval()
    if args.batch == "auto":
        args.batch = CPU_SEARCH_BATCH if device.type != "cuda" else search_batch_for_memory(
            replace(model.config, max_query_len=args.query_len), torch.cuda.mem_get_info(device)[0], args.beam)
    args.batch = int(args.batch)
    return model


def _reference(args, model, ids, mask, dict_trie, trie, ours: BeamOutput, n: int, t_ours: float, device) -> dict:
    """The per-beam Python reference on the first ``n`` queries: its rate and whether it ranks the same docids."""
    t0 = time.perf_counter()
    outs = [reference_beam_search(model, ids[s:s + args.batch], mask[s:s + args.batch], dict_trie, args.depth,
                                  beam=args.beam, k=args.beam) for s in range(0, n, args.batch)]
    t_ref = time.perf_counter() - t0
    ref = BeamOutput(torch.cat([o.nodes for o in outs]), torch.cat([o.scores for o in outs]))
    same = bool(_codes_from_nodes(trie, ours.nodes) == _codes_from_tokens(ref.nodes, args.K)
                and torch.allclose(ours.scores, ref.scores, atol=1e-5 if device.type == "cpu" else 1e-2))
    out = {"reference_queries_per_s": round(n / t_ref, 2), "speedup": round(t_ref / t_ours, 2), "same_results": same}
    print(f"reference: {t_ref:.3f}s  {n / t_ref:.1f} queries/s (per-beam Python trie walk); speedup "
          f"{out['speedup']:.1f}x; same ranked docids: {same}")
    return out


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    torch.manual_seed(args.seed)
    codes = random_codes(args.docs, args.K, args.depth, args.seed)
    trie = build_trie(codes, n_digits=args.K)
    t0 = time.perf_counter()
    model = _model(args, device)
    t_load = time.perf_counter() - t0  # the encoder's weights and, on a cold GPU, the CUDA context
    dict_trie = build_dict_trie(model, codes) if args.reference else None
    print(f"trie: {args.docs:,} docids, K={args.K}, depth {args.depth}: {trie.n_nodes:,} nodes; model loaded in "
          f"{t_load:.2f}s; device {device}, {torch.get_num_threads()} threads")
    vocab = 1000 if args.model == "tiny" else int(model.encoder.config.vocab_size)
    ids = torch.randint(5, vocab, (args.queries, args.query_len), generator=torch.Generator().manual_seed(args.seed))
    ids = ids.to(device)
    mask, trie_dev = torch.ones_like(ids), trie.to(device)
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def run_ours(start: int, n: int | None = None) -> BeamOutput:
        n = min(args.batch, args.queries - start) if n is None else n
        with amp:
            return constrained_beam_search(model, ids[start:start + n], mask[start:start + n], trie_dev,
                                           beam=args.beam, k=args.beam)

    fpq = search_flops_per_query(model, args.query_len, args.beam)
    bpq = search_bytes_per_query(model, args.query_len, args.beam, args.batch, 2 if device.type == "cuda" else 4)
    state = {"n": 0, "t": 0.0, "warmup_s": None, "prof": None, "extra": {}, "valid": None}

    def figures(partial: bool) -> dict:
        n, t = state["n"], state["t"]
        qps = round(n / t, 2) if n else None
        util = mfu(fpq * n, t, device) if n else None
        return {
            "queries_per_s": qps, "reference_queries_per_s": None, "speedup": None, "same_results": None,
            "model": args.model, "queries": n, "batch": args.batch, "beam": args.beam, "docs": args.docs,
            "K": args.K, "depth": args.depth, "device": device_name(device), "trie_nodes": trie.n_nodes,
            "threads": torch.get_num_threads(), "docids_in_trie": state["valid"], "load_s": round(t_load, 3),
            "warmup_s": state["warmup_s"] and round(state["warmup_s"], 3), "timed_s": round(t, 3),
            "launches_per_query": state["prof"] and state["prof"]["launches_per_unit"], "partial": partial,
            "query_tokens": args.query_len, "mfu": None if util is None else round(util, 5), **state["extra"],
            **roofline(fpq, bpq, qps, device)}

    emit(figures(partial=True))  # load_s
    _, state["warmup_s"], _ = timed_batches(run_ours, [0], argparse.Namespace(seconds=None, deadline=None), sync)
    # the warm-up: one batch (allocator, kernels)
    emit(figures(partial=True))
    parts, state["t"], longest = timed_batches(run_ours, range(0, args.queries, args.batch), args, sync)
    ours = BeamOutput(torch.cat([o.nodes for o in parts]), torch.cat([o.scores.float() for o in parts]))
    state["n"] = ours.nodes.shape[0]
    state["valid"] = all(trie.contains(c) for row in _codes_from_nodes(trie, ours.nodes[:4]) for c in row)
    print(f"ours: {state['t']:.3f}s  {state['n'] / state['t']:.1f} queries/s ({args.model}, batch {args.batch}); "
          f"docids in trie: {state['valid']}")
    emit(figures(partial=True))
    if args.reference:
        state["extra"] = _reference(args, model, ids, mask, dict_trie, trie, ours, state["n"], state["t"], device)
    n = min(args.batch, args.queries)  # the profile: one more batch, if the deadline leaves time for it
    state["prof"] = maybe_profile(args, lambda: run_ours(0, n), n, "query", device,
                                  f"search {args.model}, beam {args.beam}, {args.docs} docids, batch {args.batch}",
                                  longest)
    res = figures(partial=False)
    print(f"roofline: {fpq / 1e6:.1f} MFLOP and {bpq / 1e6:.2f} MB per query; limit {res['limit_per_s']} queries/s "
          f"({res['limit_bound']}-bound), {res['fraction_of_limit']} of it; one H200: {res['h200_limit_per_s']}")
    emit(res)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
