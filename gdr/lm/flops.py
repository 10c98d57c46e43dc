"""FLOP accounting and model FLOP utilisation (MFU), shared by every benchmark.

MFU = achieved model FLOP/s / the device's peak dense bf16 FLOP/s. Model FLOPs count the matrix
multiplies a forward pass must do (2 FLOPs per multiply-add), the way nanoGPT's ``estimate_mfu`` and the
PaLM paper do: ``2 * N`` per token for the N non-embedding parameters a token passes through (weights
that are looked up, like the input embedding, cost nothing; the output projection counts), plus
attention's ``4 * d_attn * context`` per token per layer (QK^T and AV). Training is 3x a forward pass
(backward = 2x forward). Nothing measured goes into these counts: a faster kernel raises MFU only by
taking less time.
"""
from __future__ import annotations

import torch

__all__ = ["PEAK_BF16_TFLOPS", "device_name", "peak_flops", "mfu", "param_count", "linear_flops_per_token",
           "attention_flops_per_token", "scoring_flops_per_pair"]

# Dense (no sparsity) bf16 tensor-core peak, TFLOP/s, from the vendors' data sheets. Matched by substring of
# torch.cuda.get_device_name(), most specific first.
PEAK_BF16_TFLOPS: list[tuple[str, float]] = [
    ("GH200", 989.0),
    ("H200", 989.0),
    ("H100 PCIe", 756.0),
    ("H100", 989.0),  # SXM / NVL
    ("H800", 989.0),
    ("B200", 2250.0),
    ("A100", 312.0),
    ("A800", 312.0),
    ("L40S", 362.0),
    ("L40", 181.0),
    ("L4", 121.0),
    ("A10G", 70.0),
    ("A10", 125.0),
    ("RTX 4090", 165.0),
    ("RTX 3090", 71.0),
    ("V100", 125.0),  # fp16 (V100 has no bf16)
    ("T4", 65.0),  # fp16
]


def device_name(device: torch.device | str | None = None) -> str:
    """``NVIDIA H200`` on CUDA; ``cpu`` otherwise."""
    device = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return device.type


def peak_flops(device: torch.device | str | None = None) -> float | None:
    """Peak dense bf16 FLOP/s of a known GPU; None for a CPU or an unknown device (MFU is then not reported)."""
    name = device_name(device)
    for key, tflops in PEAK_BF16_TFLOPS:
        if key.lower() in name.lower():
            return tflops * 1e12
    return None


def mfu(flops: float, seconds: float, device: torch.device | str | None = None) -> float | None:
    """Model FLOP utilisation in [0, 1]: ``flops / seconds / peak``; None where the peak is unknown."""
    peak = peak_flops(device)
    if peak is None or seconds <= 0:
        return None
    return flops / seconds / peak


def param_count(module: torch.nn.Module, exclude_embeddings: bool = True) -> int:
    """Parameters a token's forward pass multiplies by: all, less input embedding tables (a lookup is free).

    A tied output projection (``lm_head.weight is embed_tokens.weight``) does a matmul, so it counts once.
    """
    seen: set[int] = set()
    total = 0
    emb_ids = {id(m.weight) for m in module.modules() if isinstance(m, torch.nn.Embedding)} if exclude_embeddings else set()
    out = module.get_output_embeddings() if hasattr(module, "get_output_embeddings") else None
    out_id = id(out.weight) if out is not None and getattr(out, "weight", None) is not None else None
    for p in module.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        if id(p) in emb_ids and id(p) != out_id:
            continue
        total += p.numel()
    return total


def linear_flops_per_token(n_params: int) -> float:
    """Forward matmul FLOPs of one token through ``n_params`` weights: 2 per multiply-add."""
    return 2.0 * n_params


def attention_flops_per_token(n_layers: int, d_attn: int, context: float) -> float:
    """Forward attention FLOPs of one token attending to ``context`` positions: QK^T and AV, each
    ``2 * d_attn * context`` per layer (``d_attn`` = heads x head dim of the queries)."""
    return 4.0 * n_layers * d_attn * context


def _attn_dims(config) -> tuple[int, int]:
    """(layers, heads x head dim) of a decoder-only or encoder-decoder transformers config."""
    get = lambda *names: next(getattr(config, n) for n in names if getattr(config, n, None))  # noqa: E731
    layers = get("num_hidden_layers", "num_layers")
    heads = get("num_attention_heads", "num_heads")
    head_dim = getattr(config, "head_dim", None) or getattr(config, "d_kv", None) or get("hidden_size", "d_model") // heads
    return int(layers), int(heads * head_dim)


def scoring_flops_per_pair(model: torch.nn.Module, prompt_tokens: float, query_tokens: float, n_queries: int) -> float:
    """Model FLOPs of one (document, query) log-probability in :meth:`gdr.lm.GenerativeLM.score`.

    With P = non-embedding parameters incl. the output projection (:func:`param_count`), L layers,
    A = heads x head dim, Lp the prompt (or encoder input) tokens, n the query tokens incl. EOS, J the
    queries scored against one document:

    - causal: ``n * 2P + n * 4 L A (Lp + (n + 1) / 2)`` per pair (each query token through every weight,
      attending to the prompt and its own earlier tokens), plus the prompt's own pass
      ``(Lp * 2P + 4 L A Lp^2 / 2) / J``, amortised over the J queries that share its key/value cache.
    - seq2seq: P_dec = decoder + head less the cross-attention key/value weights (applied to the encoder
      states once per document), so ``n * 2 P_dec + n * 4 L A ((n + 1) / 2 + Lp)`` (self- and
      cross-attention) per pair plus ``(Lp * 2 (P_enc + P_kv) + 4 L A Lp^2) / J`` for the encoder and the
      cross-attention keys/values.

    ``prompt_tokens`` and ``query_tokens`` are means over the scored documents and queries.
    """
    Lp, n, J = float(prompt_tokens), float(query_tokens), max(int(n_queries), 1)
    layers, A = _attn_dims(model.config)
    if not model.config.is_encoder_decoder:
        P = param_count(model)
        per_pair = n * linear_flops_per_token(P) + n * attention_flops_per_token(layers, A, Lp + (n + 1) / 2)
        prompt = Lp * linear_flops_per_token(P) + Lp * attention_flops_per_token(layers, A, Lp / 2)
        return per_pair + prompt / J
    enc = param_count(model.get_encoder())
    kv = sum(m.weight.numel() for name, m in model.named_modules()
             if "EncDecAttention" in name and name.rsplit(".", 1)[-1] in ("k", "v"))
    dec = param_count(model) - enc - kv
    per_pair = n * linear_flops_per_token(dec) + n * attention_flops_per_token(layers, A, (n + 1) / 2 + Lp)
    doc = Lp * linear_flops_per_token(enc + kv) + Lp * attention_flops_per_token(layers, A, Lp)
    return per_pair + doc / J
