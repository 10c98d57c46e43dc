"""Bytes the attention reads per decode step with and without transformers' ``repeat_kv``,
from the model's config, and the CPU time of one decode step's attention (one layer) both ways, side by side.

    python reports/gqa-decode.py [--batch 64] [--cache 320] [--reps 20]

With ``repeat_kv``: under a mask (every StaticCache decode step) transformers' SDPA path copies each layer's keys and
values G = heads / kv_heads times (``repeat_kv``: read K/V once, write G copies) and SDPA then reads the G
copies. Without it (:func:`gdr.lm.attention.grouped_sdpa`): SDPA reads each layer's K/V once.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from types import SimpleNamespace

import torch


def kv_bytes(cfg, batch: int, cache: int, elem: int = 2) -> dict:
    """Bytes of the KV cache the attention of one decode step touches (all layers), with and without ``repeat_kv``."""
    heads, kv = cfg.num_attention_heads, cfg.num_key_value_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    g = heads // kv
    kv_once = 2 * cfg.num_hidden_layers * batch * kv * cache * head_dim * elem  # K and V, every layer
    return {"batch": batch, "cache_tokens": cache, "dtype_bytes": elem, "groups": g, "kv_cache_bytes": kv_once,
            "bytes_per_step_repeat_kv": kv_once * (1 + 2 * g), "bytes_per_step_grouped": kv_once}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--cache", type=int, default=320)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args(argv)
    import transformers
    import transformers.integrations.sdpa_attention as sa
    from transformers import AutoConfig

    from gdr.lm.attention import gdr_attention
    from gdr.models import resolve_model

    cfg = AutoConfig.from_pretrained(resolve_model("smollm2-135m"))
    out = {"transformers": transformers.__version__, "torch": torch.__version__, "threads": torch.get_num_threads()}
    big = out["smollm2_bf16_batch1024_cache320"] = kv_bytes(cfg, 1024, 320)
    print(f"SmolLM2 bf16, batch 1024, 320-token cache: {big['bytes_per_step_repeat_kv'] / 1e9:.1f} GB of KV read "
          f"or written per decode step with repeat_kv, {big['bytes_per_step_grouped'] / 1e9:.2f} GB grouped")
    # One layer's decode-step attention at SmolLM2's shapes, fp32 on this CPU: query (B, 9, 1, 64) over a
    # static cache (B, 3, S, 64) under the step's (B, 1, 1, S) bool mask (the last slots unused, as in decode).
    B, S, H, Hkv, D = args.batch, args.cache, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, h, t, D, generator=g) for h, t in ((H, 1), (Hkv, S), (Hkv, S)))
    mask = torch.ones(B, 1, 1, S, dtype=torch.bool)
    mask[:, :, :, S - 8:] = False
    module = SimpleNamespace(num_key_value_groups=H // Hkv, is_causal=True)
    # transformers >= 5.2x packs a single query's heads itself when not compiling; a compiled step (CUDA) and
    # 5.17 (the GPU image) call repeat_kv: that is the "before" arm
    compiling = getattr(sa, "is_torchdynamo_compiling", None)

    def before():
        return sa.sdpa_attention_forward(module, q, k, v, mask, scaling=D ** -0.5)[0]

    def after():
        return gdr_attention(module, q, k, v, mask, scaling=D ** -0.5)[0]

    times = {"repeat_kv": [], "grouped": []}
    try:
        if compiling is not None:
            sa.is_torchdynamo_compiling = lambda: True
        with torch.inference_mode():
            torch.testing.assert_close(after(), before(), rtol=0, atol=1e-6)
            for _ in range(args.reps):  # interleaved: both arms see the same machine load
                for name, fn in (("repeat_kv", before), ("grouped", after)):
                    t0 = time.perf_counter()
                    fn()
                    times[name].append(time.perf_counter() - t0)
    finally:
        if compiling is not None:
            sa.is_torchdynamo_compiling = compiling
    med = {k: statistics.median(t) for k, t in times.items()}
    out["cpu_attention_one_layer_fp32"] = {"batch": B, "cache": S,
                                           **{f"{k}_ms": round(1e3 * t, 3) for k, t in med.items()},
                                           "repeat_kv_over_grouped": round(med["repeat_kv"] / med["grouped"], 2)}
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
