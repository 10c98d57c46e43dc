"""FLOP accounting and model FLOP utilisation (MFU), shared by every benchmark.

MFU = achieved model FLOP/s / the device's peak dense bf16 FLOP/s. Model FLOPs count the matrix
multiplies a forward pass must do (2 FLOPs per multiply-add), the way nanoGPT's ``estimate_mfu`` and the
PaLM paper do: ``2 * N`` per token for the N non-embedding parameters a token passes through (weights
that are looked up, like the input embedding, cost nothing; the output projection counts), plus
attention's ``4 * d_attn * context`` per token per layer (QK^T and AV). Training is 3x a forward pass
(backward = 2x forward). Nothing measured goes into these counts: a faster kernel raises MFU only by
taking less time.

**Roofline** (:func:`roofline`): each benchmark also counts the bytes one unit of work (a query sampled, a pair
scored, a training example, a search query) must move between the device memory and the chip, and reports the
rate the device's peaks allow, ``limit_per_s = min(peak_flops / flops_per_unit, peak_bytes_per_s /
bytes_per_unit)``, and ``fraction_of_limit`` = measured rate / limit beside MFU. How bytes are counted:

- weights are read once per forward pass of a batch (a decode step, a prefill, a scoring chunk, a beam step), at
  the dtype the matmuls read them in (the bf16 copy or autocast's cached cast on CUDA), and shared by the batch's
  units; input embedding tables are not read (a lookup);
- key/value caches are read once per decode step by every row, at the model's real head layout (2 x layers x
  ``num_key_value_heads`` x head dim per position: grouped-query attention reads the KV heads, not copies of
  them), and written once per new position; a beam search's reordered self-attention cache is read and written;
- optimizer traffic: AdamW reads the fp32 weights, gradients and both moments and writes three of them;
- activations are ignored: they stay in on-chip memory in a fused kernel, and counting them would depend on the
  kernels chosen. So ``bytes_per_unit`` is a floor and ``limit_per_s`` an upper bound of what the device allows.

Peaks: on a known GPU the data sheet's (dense bf16 tensor-core FLOP/s, :data:`PEAK_BF16_TFLOPS`; HBM bandwidth,
:data:`PEAK_HBM_TBPS`); on a CPU measured here (:func:`cpu_peaks`: the best of timed fp32 and bf16 matmuls, a
timed copy); an unknown GPU has none (``limit_per_s`` null with ``limit_reason``). Every JSON also says what one
H200 would reach at the limit (``h200_limit_per_s``), so the gap is known before a GPU run.
"""
from __future__ import annotations

import math
import time
from functools import lru_cache

import torch

__all__ = ["PEAK_BF16_TFLOPS", "PEAK_HBM_TBPS", "H200_PEAK_FLOPS", "H200_PEAK_BYTES_PER_S", "device_name",
           "peak_flops", "peak_bandwidth", "cpu_peaks", "roofline", "mfu", "param_count", "linear_flops_per_token",
           "attention_flops_per_token", "attn_dims", "scoring_flops_per_pair", "kv_bytes_per_position", "weight_bytes",
           "sampling_bytes", "scoring_bytes_per_pair", "training_bytes_per_example"]

# Dense (no sparsity) bf16 tensor-core peak, TFLOP/s, from the vendors' data sheets. Matched by substring of
# torch.cuda.get_device_name(), most specific first.
PEAK_BF16_TFLOPS: list[tuple[str, float]] = [
    ("GH200", 989.0),
    ("H200", 989.0),
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.0),
    ("H100", 989.0),  # SXM
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


# HBM bandwidth, TB/s, from the same data sheets (matched the same way).
PEAK_HBM_TBPS: list[tuple[str, float]] = [
    ("GH200", 4.9),
    ("H200", 4.8),
    ("H100 PCIe", 2.0),
    ("H100 NVL", 3.9),
    ("H100", 3.35),  # SXM
    ("H800", 3.35),
    ("B200", 8.0),
    ("A100", 2.0),  # 80 GB SXM 2.04, PCIe 1.94
    ("A800", 2.0),
    ("L40S", 0.864),
    ("L40", 0.864),
    ("L4", 0.3),
    ("A10G", 0.6),
    ("A10", 0.6),
    ("RTX 4090", 1.008),
    ("RTX 3090", 0.936),
    ("V100", 0.9),
    ("T4", 0.32),
]
H200_PEAK_FLOPS, H200_PEAK_BYTES_PER_S = 989.0e12, 4.8e12


def device_name(device: torch.device | str | None = None) -> str:
    """``NVIDIA H200`` on CUDA; ``cpu`` otherwise."""
    device = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return device.type


def _peak(table, device) -> float | None:
    """The first entry of ``table`` ((name part, tera-units) pairs) whose name is in the device's name, x 1e12."""
    name = device_name(device).lower()
    return next((v * 1e12 for key, v in table if key.lower() in name), None)


def peak_flops(device: torch.device | str | None = None) -> float | None:
    """Peak dense bf16 FLOP/s of a known GPU; None for a CPU or an unknown device (MFU is then not reported)."""
    return _peak(PEAK_BF16_TFLOPS, device)


def peak_bandwidth(device: torch.device | str | None = None) -> float | None:
    """Peak memory bandwidth (bytes/s) of a known GPU; None for a CPU or an unknown device."""
    return _peak(PEAK_HBM_TBPS, device)


@lru_cache(maxsize=None)
def cpu_peaks(n: int = 1024, copy_mib: int = 64, repeats: int = 5) -> dict:
    """This CPU's peaks, measured once per process: the best of ``repeats`` timed ``n`` x ``n`` matmuls in fp32
    and in bf16 (FLOP/s; ``flops`` is the larger) and of timed copies of ``copy_mib`` MiB (read + write bytes/s).
    The best, not the median: on a machine shared with other jobs the peak is what the chip did when it could."""
    def best(fn) -> float:
        fn()  # warm-up
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return min(times)

    out: dict = {}
    for dtype in (torch.float32, torch.bfloat16):
        a = torch.randn(n, n).to(dtype)
        out[f"flops_{str(dtype).replace('torch.', '')}"] = 2.0 * n ** 3 / best(lambda: a @ a)
    src = torch.ones(copy_mib * 2 ** 18)  # fp32: 4 bytes each
    dst = torch.empty_like(src)
    out["bytes_per_s"] = 2.0 * src.numel() * 4 / best(lambda: dst.copy_(src))
    out["flops"] = max(out["flops_float32"], out["flops_bfloat16"])
    return out


def roofline(flops_per_unit: float, bytes_per_unit: float, measured_per_s: float | None,
             device: torch.device | str | None = None) -> dict:
    """The roofline figures of one benchmark (see the module docstring): ``flops_per_unit``, ``bytes_per_unit``,
    the peaks used and where they come from, ``limit_per_s`` (null with ``limit_reason`` when the device's peaks
    are unknown), ``limit_bound`` (compute or memory), ``fraction_of_limit`` = measured / limit, and the same
    limit on one H200 (``h200_limit_per_s``, ``h200_limit_bound``)."""
    device = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    reason = None
    if device.type == "cpu":
        try:
            peaks = cpu_peaks()
            pf, pb, source = peaks["flops"], peaks["bytes_per_s"], "measured on this CPU (timed matmul and copy)"
        except Exception as e:  # noqa: BLE001 - the figures still come back, the limit says why it is missing
            pf = pb = source = None
            reason = f"CPU peaks not measured: {type(e).__name__}: {e}"
    else:
        pf, pb, source = peak_flops(device), peak_bandwidth(device), "data sheet"
        if pf is None or pb is None:
            reason, source = f"no peak FLOP/s or bandwidth known for {device_name(device)} (gdr/lm/flops.py)", None

    def limit(peak_f, peak_b):
        if peak_f is None or peak_b is None or flops_per_unit <= 0 or bytes_per_unit <= 0:
            return None, None
        compute, memory = peak_f / flops_per_unit, peak_b / bytes_per_unit
        return (compute, "compute") if compute <= memory else (memory, "memory")

    lim, bound = limit(pf, pb)
    h200, h200_bound = limit(H200_PEAK_FLOPS, H200_PEAK_BYTES_PER_S)
    frac = measured_per_s / lim if lim and measured_per_s is not None else None
    return {"flops_per_unit": _sig(flops_per_unit), "bytes_per_unit": _sig(bytes_per_unit),
            "peak_flops": _sig(pf), "peak_bytes_per_s": _sig(pb), "peak_source": source,
            "limit_per_s": _sig(lim), "limit_bound": bound, "fraction_of_limit": None if frac is None else round(frac, 5),
            "limit_reason": reason, "h200_limit_per_s": _sig(h200), "h200_limit_bound": h200_bound}


def _sig(x: float | None, digits: int = 5) -> float | None:
    return None if x is None else float(f"{x:.{digits}g}")


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


def attn_dims(config) -> tuple[int, int]:
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
    layers, A = attn_dims(model.config)
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



# ---------------------------------------------------------------------------- bytes moved (the roofline)
def weight_bytes(module: torch.nn.Module, element_size: int | None = None) -> float:
    """Bytes of the weights one forward pass reads: :func:`param_count` (input embeddings excluded) at
    ``element_size`` bytes each (default: the module's own dtype)."""
    elt = element_size or next(module.parameters()).element_size()
    return float(param_count(module) * elt)


def kv_bytes_per_position(config, element_size: int) -> float:
    """Key and value bytes of one cached position over all (decoder) layers, at the real head layout:
    2 x layers x ``num_key_value_heads`` x head dim x ``element_size``."""
    cfg = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    get = lambda *names: next((getattr(cfg, n) for n in names if getattr(cfg, n, None)), None)  # noqa: E731
    layers = get("num_decoder_layers", "num_hidden_layers", "num_layers")
    heads = get("num_attention_heads", "num_heads")
    kv_heads = get("num_key_value_heads") or heads
    head_dim = get("head_dim", "d_kv") or get("hidden_size", "d_model") // heads
    return 2.0 * layers * kv_heads * head_dim * element_size


def sampling_bytes(model: torch.nn.Module, stats: dict, decode_steps: float, prefill_passes: float,
                   element_size: int) -> float:
    """Bytes the decode loop moved for ``stats`` (``gdr.lm.decode.Decoder.stats``): the weights once per prefill
    pass and per decode step (a seq2seq decode step reads the decoder's only), each decode row's cache over its
    attention context (``decode_context``), and the keys/values of every prefilled and decoded token written."""
    w = weight_bytes(model, element_size)
    if model.config.is_encoder_decoder:
        w_dec = w - weight_bytes(model.get_encoder(), element_size)
        weights = prefill_passes * w + decode_steps * w_dec
    else:
        weights = (prefill_passes + decode_steps) * w
    kv = kv_bytes_per_position(model.config, element_size)
    return weights + kv * (stats["decode_context"] + stats["prefill_tokens"] + stats["decode_tokens"])


def scoring_bytes_per_pair(model: torch.nn.Module, prompt_tokens: float, query_tokens: float, n_queries: int,
                           doc_batch_size: int, max_query_tokens: int, element_size: int) -> float:
    """Bytes moved per (document, query) pair by :meth:`gdr.lm.GenerativeLM.score` with B = ``doc_batch_size``
    documents of Lp prompt tokens a pass and J queries of n tokens in chunks of ``max_query_tokens``.

    - causal: per doc batch the weights once for the prompts and once per chunk (C = ceil(J n / max tokens)
      chunks), each chunk reading its B prompts' caches (B Lp positions), every position's keys/values written;
    - seq2seq: the encoder's weights once per doc batch, the decoder's once per chunk (a chunk holds max tokens / B
      query tokens per document), each chunk reading its B documents' cross-attention keys/values.
    """
    Lp, n, J, B = float(prompt_tokens), float(query_tokens), max(int(n_queries), 1), max(int(doc_batch_size), 1)
    mq = max(int(max_query_tokens), 1)
    kv = kv_bytes_per_position(model.config, element_size)
    w = weight_bytes(model, element_size)
    if model.config.is_encoder_decoder:
        w_enc = weight_bytes(model.get_encoder(), element_size)
        chunks = math.ceil(J * n / max(1, mq // B))
        batch = w_enc + chunks * (w - w_enc) + B * chunks * Lp * kv + B * (Lp + J * n) * kv
    else:
        chunks = math.ceil(J * n / mq)
        batch = w * (1 + chunks) + B * chunks * Lp * kv + B * (Lp + J * n) * kv
    return batch / (B * J)


def training_bytes_per_example(n_params: int, n_matmul_params: int, batch: int, mixed_bf16: bool) -> float:
    """Bytes moved per training example by one step at ``batch`` examples, shared by the batch.

    The forward, input-gradient and weight-gradient passes read the ``n_matmul_params`` weights a matmul uses
    (:func:`param_count`: embedding tables are looked up), in bf16 under bf16-mixed after one fp32 read and bf16
    write of the cast: 3 x 2 + 6 = 12 bytes each (fp32: 3 x 4). Each of the ``n_params`` gets its fp32 gradient
    written (4), read for the clipping norm and read and written to scale it (12), and AdamW reads weight,
    gradient and both moments and writes weight and moments (28): 44 bytes each."""
    per_matmul = 3 * 2 + 6 if mixed_bf16 else 3 * 4
    return (float(n_matmul_params) * per_matmul + float(n_params) * (4 + 12 + 28)) / max(int(batch), 1)
