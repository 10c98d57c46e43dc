"""The cost model: model dimensions, FLOPs, bytes and memory per unit of work, and what fits in memory.

One place for what a unit of work costs (a query sampled, a pair scored, a training example, a search query):
the automatic sizes (``score.doc_batch_size: auto``, ``trainer.batch_size: auto``, ``evaluate.batch_size: auto``),
the benchmarks' MFU and roofline and ``gdr plan`` all read it. It imports torch and the standard library only, so
every floor of gdr may use it.

**Dimensions** (:func:`dims`): layers, widths, heads and vocabulary of any transformers config (object or dict),
read once here; the attention width is ``heads x head dim``.

**FLOPs**: MFU = achieved model FLOP/s / the device's peak dense bf16 FLOP/s. Model FLOPs count the matrix
multiplies a forward pass must do (2 FLOPs per multiply-add), the way nanoGPT's ``estimate_mfu`` and the
PaLM paper do: ``2 * N`` per token for the N non-embedding parameters a token passes through (weights
that are looked up, like the input embedding, cost nothing; the output projection counts), plus
attention's ``4 * d_attn * context`` per token per layer (QK^T and AV). Training is 3x a forward pass
(backward = 2x forward). Nothing measured goes into these counts: a faster kernel raises MFU only by
taking less time.

**Bytes** (the roofline, :func:`roofline`): the bytes one unit of work must move between the device memory and
the chip, and the rate the device's peaks allow, ``limit_per_s = min(peak_flops / flops_per_unit,
peak_bytes_per_s / bytes_per_unit)``; ``fraction_of_limit`` = measured rate / limit beside MFU. How bytes are
counted:

- weights are read once per forward pass of a batch (a decode step, a prefill, a scoring chunk, a beam step), at
  the dtype the matmuls read them in (the bf16 copy or autocast's cached cast on CUDA), and shared by the batch's
  units; input embedding tables are not read (a lookup);
- key/value caches are read once per decode step by every row, at the model's real head layout (2 x layers x
  ``num_key_value_heads`` x head dim per position: grouped-query attention reads the KV heads, not copies of
  them), and written once per new position; a beam search's reordered self-attention cache is read and written;
- optimizer traffic: AdamW reads the fp32 weights, gradients and both moments and writes three of them;
- activations are ignored: they stay in on-chip memory in a fused kernel, and counting them would depend on the
  kernels chosen. So ``bytes_per_unit`` is a floor and ``limit_per_s`` an upper bound of what the device allows.

**Memory** (generous estimates of the device memory a unit holds at its peak) and :func:`batch_for_memory`, the
one rule that turns free memory into a batch size: the units whose memory fits in a share of the free bytes
after what the batch needs once.

**Peaks**: a known GPU's from the data sheets (``device_peaks.json`` beside this module: dense bf16 tensor-core
FLOP/s, HBM bandwidth, memory); a CPU's are measured by the benchmarks and passed in; an unknown GPU has none
(``limit_per_s`` null with ``limit_reason``). Every roofline also says what one H200 would reach at the limit
(``h200_limit_per_s``), so the gap is known before a GPU run.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Mapping

import torch

__all__ = ["Dims", "dims", "DevicePeaks", "device_table", "device_peaks", "device_name", "peak_flops",
           "peak_bandwidth", "H200", "roofline", "mfu", "param_count", "linear_flops_per_token",
           "attention_flops_per_token", "scoring_flops_per_pair", "sampling_flops", "train_flops_per_example",
           "hypotheses_per_step", "search_flops_per_query", "kv_bytes_per_position", "weight_bytes", "sampling_bytes",
           "scoring_bytes_per_pair", "training_bytes_per_example", "search_bytes_per_query",
           "train_memory_per_example", "search_memory_per_query", "score_memory", "batch_for_memory",
           "TRAIN_BYTES_PER_PARAM"]

PEAKS_FILE = Path(__file__).with_name("device_peaks.json")


# ---------------------------------------------------------------------------- dimensions
@dataclass(frozen=True)
class Dims:
    """The sizes of a transformer stack that its cost depends on.

    ``attn`` (heads x head dim) is the width of the queries; ``kv`` (key/value heads x head dim) the width of
    the cached keys and values (smaller under grouped-query attention).
    """

    layers: int
    d_model: int
    heads: int
    kv_heads: int
    head_dim: int
    d_ff: int
    vocab: int

    @property
    def attn(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv(self) -> int:
        return self.kv_heads * self.head_dim


_LAYERS = ("num_hidden_layers", "num_layers", "n_layers")


def dims(config: Any, decoder: bool = False) -> Dims:
    """The :class:`Dims` of a transformers config (a ``PretrainedConfig``, its ``to_dict()``, or any object with
    the same attribute names, such as a retriever's decoder settings).

    ``decoder`` : read the decoder's layers of an encoder-decoder config (``num_decoder_layers``) and the text
    config of a multimodal one. A missing feed-forward width is 4 x d_model, a missing vocabulary 0.
    """
    if decoder and hasattr(config, "get_text_config"):
        config = config.get_text_config(decoder=True)
    if isinstance(config, Mapping):
        look = config.get
    else:
        def look(name):
            return getattr(config, name, None)

    def get(*names, default=None):
        return next((int(look(n)) for n in names if look(n)), default)

    layers = get(*(("num_decoder_layers",) if decoder else ()), *_LAYERS)
    d = get("hidden_size", "d_model", "dim")
    heads = get("num_attention_heads", "num_heads", "n_heads")
    if layers is None or d is None or heads is None:
        raise ValueError(f"cannot tell the layers, width and heads of config {type(config).__name__}")
    head_dim = get("head_dim", "d_kv", default=d // heads)
    return Dims(layers=layers, d_model=d, heads=heads, kv_heads=get("num_key_value_heads", default=heads),
                head_dim=head_dim, d_ff=get("intermediate_size", "d_ff", "hidden_dim", default=4 * d),
                vocab=get("vocab_size", default=0))


# ---------------------------------------------------------------------------- device peaks
@dataclass(frozen=True)
class DevicePeaks:
    """A device's peak dense bf16 FLOP/s, memory bandwidth (bytes/s) and memory (bytes; None where unknown)."""

    name: str
    flops: float
    bytes_per_s: float
    memory: float | None = None


@cache
def device_table() -> tuple[DevicePeaks, ...]:
    """The data-sheet peaks of ``device_peaks.json``, in its order (most specific name first)."""
    rows = json.loads(PEAKS_FILE.read_text(encoding="utf-8"))["devices"]
    return tuple(DevicePeaks(r["match"], r["bf16_tflops"] * 1e12, r["hbm_tbps"] * 1e12,
                             r["memory_gb"] * 1e9 if r.get("memory_gb") else None) for r in rows)


def device_peaks(name: str) -> DevicePeaks | None:
    """The first table row whose name is part of ``name`` (case-insensitive): ``NVIDIA H100 80GB HBM3`` -> H100."""
    low = name.lower()
    return next((row for row in device_table() if row.name.lower() in low), None)


H200: DevicePeaks = device_peaks("H200")


def _device(device: torch.device | str | None) -> torch.device:
    """``device``, by default the GPU when there is one."""
    return torch.device(device if device is not None else "cuda" if torch.cuda.is_available() else "cpu")


def device_name(device: torch.device | str | None = None) -> str:
    """``NVIDIA H200`` on CUDA; ``cpu`` otherwise."""
    device = _device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return device.type


def peak_flops(device: torch.device | str | None = None) -> float | None:
    """Peak dense bf16 FLOP/s of a known GPU; None for a CPU or an unknown device (MFU is then not reported)."""
    peaks = device_peaks(device_name(device))
    return None if peaks is None else peaks.flops


def peak_bandwidth(device: torch.device | str | None = None) -> float | None:
    """Peak memory bandwidth (bytes/s) of a known GPU; None for a CPU or an unknown device."""
    peaks = device_peaks(device_name(device))
    return None if peaks is None else peaks.bytes_per_s


def roofline(flops_per_unit: float, bytes_per_unit: float, measured_per_s: float | None,
             device: torch.device | str | None = None, cpu: DevicePeaks | str | None = None) -> dict:
    """The roofline figures of one benchmark (see the module docstring): ``flops_per_unit``, ``bytes_per_unit``,
    the peaks used and where they come from, ``limit_per_s`` (null with ``limit_reason`` when the device's peaks
    are unknown), ``limit_bound`` (compute or memory), ``fraction_of_limit`` = measured / limit, and the same
    limit on one H200 (``h200_limit_per_s``, ``h200_limit_bound``).

    ``cpu`` : on a CPU, its measured peaks (the benchmarks time a matmul and a copy), or why they are missing.
    """
    device = _device(device)
    reason = source = None
    if device.type == "cpu":
        peaks = cpu if isinstance(cpu, DevicePeaks) else None
        if peaks is None:
            reason = f"CPU peaks not measured: {cpu}" if cpu else "CPU peaks not measured"
        else:
            source = "measured on this CPU (timed matmul and copy)"
    else:
        peaks = device_peaks(device_name(device))
        source = "data sheet"
        if peaks is None:
            reason, source = f"no peak FLOP/s or bandwidth known for {device_name(device)} ({PEAKS_FILE.name})", None

    def limit(pk: DevicePeaks | None):
        if pk is None or flops_per_unit <= 0 or bytes_per_unit <= 0:
            return None, None
        compute, memory = pk.flops / flops_per_unit, pk.bytes_per_s / bytes_per_unit
        return (compute, "compute") if compute <= memory else (memory, "memory")

    lim, bound = limit(peaks)
    h200, h200_bound = limit(H200)
    frac = measured_per_s / lim if lim and measured_per_s is not None else None
    return {"flops_per_unit": _sig(flops_per_unit), "bytes_per_unit": _sig(bytes_per_unit),
            "peak_flops": _sig(peaks and peaks.flops), "peak_bytes_per_s": _sig(peaks and peaks.bytes_per_s),
            "peak_source": source, "limit_per_s": _sig(lim), "limit_bound": bound,
            "fraction_of_limit": None if frac is None else round(frac, 5),
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
    emb_ids = ({id(m.weight) for m in module.modules() if isinstance(m, torch.nn.Embedding)}
               if exclude_embeddings else set())
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
    d = dims(model.config)
    layers, A = d.layers, d.attn
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


def sampling_flops(model: torch.nn.Module, stats: dict) -> float:
    """Model FLOPs of the tokens a decode loop computed (``stats``: ``gdr.lm.decode.Decoder.stats``, its prefill
    and decode tokens and the attention contexts they saw): a seq2seq model's prompt tokens go through the
    encoder and its decode tokens through the decoder and head; a causal model's all tokens through every weight."""
    d = dims(model.config, decoder=True)
    context = stats["prefill_context"] + stats["decode_context"]
    att = attention_flops_per_token(d.layers, d.attn, 1.0) * context
    if model.config.is_encoder_decoder:
        n_enc = param_count(model.get_encoder())
        n_dec = param_count(model) - n_enc
        return stats["prefill_tokens"] * linear_flops_per_token(n_enc) + \
            stats["decode_tokens"] * linear_flops_per_token(n_dec) + att
    return (stats["prefill_tokens"] + stats["decode_tokens"]) * linear_flops_per_token(param_count(model)) + att


def _retriever_parts(model: torch.nn.Module) -> tuple[int, int, int, Dims, Dims]:
    """(encoder + projection parameters, decoder parameters less the cross-attention keys/values, those keys/values,
    encoder dims, decoder dims) of a ``gdr.training.model.GenerativeRetriever``; PAWA's layers count with the
    decoder."""
    cfg = model.config
    enc_d, dec_d = dims(model.encoder.config), dims(cfg)
    enc = param_count(model.encoder) + sum(p.numel() for p in model.proj.parameters())
    cross_kv = dec_d.layers * 2 * dec_d.d_model * dec_d.attn  # applied to the S input tokens, not per docid step
    dec = param_count(model.decoder) - cross_kv
    if cfg.pawa:
        dec += sum(p.numel() for n, p in model.named_parameters() if n.startswith("pawa_"))
    return enc, dec, cross_kv, enc_d, dec_d


def train_flops_per_example(model: torch.nn.Module, seq_len: int) -> float:
    """Training FLOPs of one example of a ``gdr.training.model.GenerativeRetriever``: 3 x forward (the encoder over
    ``seq_len`` tokens, the decoder over L + 1 docid positions with self- and cross-attention, the slot logits)."""
    S, T = seq_len, model.config.max_code_len + 1
    enc, dec, cross_kv, e, d = _retriever_parts(model)
    fwd = S * linear_flops_per_token(enc) + S * attention_flops_per_token(e.layers, e.attn, S)
    fwd += T * linear_flops_per_token(dec) + S * linear_flops_per_token(cross_kv)
    fwd += T * attention_flops_per_token(d.layers, d.attn, T) + T * attention_flops_per_token(d.layers, d.attn, S)
    fwd += T * 2.0 * d.d_model * (model.config.n_digits + 1)  # slot logits against the tied embeddings
    return 3.0 * fwd


def hypotheses_per_step(n_digits: int, max_code_len: int, beam: int) -> list[int]:
    """Hypotheses per query at each decoder step of a beam search: 1 at the start, then at most ``beam``,
    growing by K + 1 per step until it is reached (a docid has at most ``max_code_len`` digits and EOS)."""
    out, w = [], 1
    for _ in range(max_code_len + 1):
        out.append(w)
        w = min(beam, w * (n_digits + 1))
    return out


def search_flops_per_query(model: torch.nn.Module, query_tokens: float, beam: int) -> float:
    """Model FLOPs of one query's beam search over a ``gdr.training.model.GenerativeRetriever``: the encoder over
    its S tokens (bidirectional attention over S), the cross-attention keys/values once over S, then at step t
    each of its w_t hypotheses (:func:`hypotheses_per_step`) through the decoder's other weights, self-attention
    over t + 1 positions, cross-attention over S, and the K + 1 slot logits (and PAWA's layers when on)."""
    cfg, S = model.config, float(query_tokens)
    enc, dec, cross_kv, e, d = _retriever_parts(model)
    flops = S * linear_flops_per_token(enc) + S * attention_flops_per_token(e.layers, e.attn, S)
    flops += S * linear_flops_per_token(cross_kv)
    per_hyp = linear_flops_per_token(dec) + 2.0 * d.d_model * (cfg.n_digits + 1)
    for t, w in enumerate(hypotheses_per_step(cfg.n_digits, cfg.max_code_len, beam)):
        flops += w * (per_hyp + attention_flops_per_token(d.layers, d.attn, t + 1 + S))
    return flops


# ---------------------------------------------------------------------------- bytes moved (the roofline)
def weight_bytes(module: torch.nn.Module, element_size: int | None = None) -> float:
    """Bytes of the weights one forward pass reads: :func:`param_count` (input embeddings excluded) at
    ``element_size`` bytes each (default: the module's own dtype)."""
    elt = element_size or next(module.parameters()).element_size()
    return float(param_count(module) * elt)


def kv_bytes_per_position(config, element_size: int) -> float:
    """Key and value bytes of one cached position over all (decoder) layers, at the real head layout:
    2 x layers x ``num_key_value_heads`` x head dim x ``element_size``."""
    d = dims(config, decoder=True)
    return 2.0 * d.layers * d.kv * element_size


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


def search_bytes_per_query(model: torch.nn.Module, query_tokens: float, beam: int, batch: int,
                           element_size: int) -> float:
    """Bytes one query's beam search over a ``gdr.training.model.GenerativeRetriever`` moves (``element_size``: 2
    under CUDA autocast, 4 in fp32): the encoder's weights once per batch and the decoder's once per step, shared
    by the ``batch`` queries; the query's cross-attention keys/values written once and read once per step (once
    per query, not per hypothesis); at step t each hypothesis reads its t + 1 cached positions and writes one,
    and the reorder after the step reads and writes the kept hypotheses' caches."""
    cfg, S = model.config, float(query_tokens)
    kv = 2.0 * cfg.num_layers * dims(cfg).attn * element_size  # one position, every layer
    w_enc = weight_bytes(model.encoder, element_size) + sum(p.numel() for p in model.proj.parameters()) * element_size
    steps = hypotheses_per_step(cfg.n_digits, cfg.max_code_len, beam)
    out = (w_enc + len(steps) * weight_bytes(model.decoder, element_size)) / max(batch, 1)
    out += S * kv * (1 + len(steps))
    for t, w in enumerate(steps):
        out += w * (t + 2) * kv  # read t + 1 positions, write one
        if t + 1 < len(steps):
            out += steps[t + 1] * (t + 1) * kv * 2  # the reorder: read and write the kept caches
    return out


# ---------------------------------------------------------------------------- memory, and what fits
TRAIN_BYTES_PER_PARAM = 20  # fp32 weight, gradient and two AdamW moments, and a bf16 copy of the weight
CUDA_CONTEXT_BYTES = 600 << 20  # one process's CUDA context and its cuBLAS/cuDNN workspaces


def train_memory_per_example(enc: Dims, dec: Dims, query_len: int, code_len: int, n_digits: int,
                             passes: int = 1) -> int:
    """Device memory one retriever training example holds until its backward pass (estimated generously): what
    autograd saves in every encoder layer over ``query_len`` tokens and every decoder layer over the L + 1 docid
    positions (bf16 activations, fp32 layer-norm inputs, attention probabilities as the math attention kernel
    keeps them, the cross-attention keys/values), and the fp32 slot logits; ``passes`` times (R-drop's two dropout
    views are two forward passes, both held until the one backward). Checked against the bytes autograd saves in a
    training step on the CPU under bf16 autocast (tests/test_retriever.py)."""
    S, T, K1 = query_len, code_len + 1, n_digits + 1
    e = enc.layers * (S * (32 * enc.d_model + 8 * enc.attn + 10 * enc.d_ff) + 20 * enc.heads * S * S)
    d = dec.layers * (T * (32 * dec.d_model + 8 * dec.attn + 10 * dec.d_ff) + 2 * S * dec.attn * 4
                      + 20 * dec.heads * T * (T + S))
    return passes * (e + d + S * enc.d_model * 8 + T * K1 * 16)


def search_memory_per_query(enc: Dims, dec: Dims, query_len: int, code_len: int, n_digits: int, beam: int) -> int:
    """Device memory one query of a beam search takes at most (estimated generously, bf16 activations as under
    CUDA autocast): its cross-attention keys and values (once per query), one encoder layer's activations, and
    per hypothesis the self-attention cache (and its reordered copy), a decoder layer's step activations with the
    cross-attention scores, and the search's fp32/int64 candidate tensors."""
    S, T, K1 = query_len, code_len + 1, n_digits + 1
    cross = 2 * dec.layers * S * dec.attn * 2
    encoder = S * (12 * enc.d_model + 2 * enc.d_ff) * 2 + enc.heads * S * S * 4
    per_hyp = 2 * 2 * dec.layers * T * dec.attn * 2 + (8 * dec.d_model + 2 * dec.d_ff) * 2 + 2 * dec.heads * S * 4 \
        + 40 * K1
    return cross + encoder + beam * per_hyp


def score_memory(d: Dims, prompt_tokens: int, chunk_tokens: int) -> tuple[int, int]:
    """(bytes per document, bytes once) of a scoring pass of ``chunk_tokens`` query tokens per document after a
    prompt of ``prompt_tokens``: per document the key/value cache of prompt + chunk (twice: the cache and its
    concatenated copy, bf16) and a chunk's activations (hidden, MLP and attention outputs, bf16); once, the
    log-prob tile (chunk tokens x vocabulary, fp32, twice; a vocabulary of 32,000 where the config has none)."""
    kv = 2 * 2 * d.layers * 2 * d.kv * (prompt_tokens + chunk_tokens)
    act = chunk_tokens * (4 * d.d_model + 3 * d.d_ff + 2 * d.attn) * 2
    return kv + act, chunk_tokens * (d.vocab or 32000) * 4 * 2


def batch_for_memory(free_bytes: float, per_unit: float, share: float, fixed: float = 0.0, cap: int | None = None,
                     multiple: int = 1) -> int:
    """The most units (at least 1, at most ``cap``) whose ``per_unit`` bytes fit in ``share`` of ``free_bytes``
    after the ``fixed`` bytes the batch needs once; rounded down to a multiple of ``multiple`` from there up."""
    room = share * free_bytes - fixed
    b = int(max(1, min(cap if cap is not None else math.inf, room // per_unit)))
    return b // multiple * multiple if b >= multiple else b
