"""The attention function of the scoring and sampling passes, registered with transformers' AttentionInterface.

One function (:func:`gdr_attention`) serves both: it is transformers' SDPA for everything except three cases
that SDPA handles with copies or dense masks:

- a flex-attention ``BlockMask`` (scoring's packed causal queries): block-sparse flex attention, compiled on
  CUDA (the scorer's choice); a compiler failure raises :class:`FlexFailed` so that the scorer can take
  its dense path (never eager flex on a GPU: it materialises the fp32 scores);
- T5 cross-attention with G query rows per document: the rows folded into one sequence per document;
- grouped-query attention under a mask (:func:`grouped_sdpa`): no ``repeat_kv`` copies of the keys and values
  (also every decode step of :class:`gdr.lm.decode.Decoder`).
"""
from __future__ import annotations

import functools
import warnings

import torch
import torch.nn.attention.flex_attention as flex  # flex.flex_attention is read at each call: a test may swap it
from torch.nn.attention.flex_attention import BlockMask
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from gdr.lm.compiling import compile_cache_dir

__all__ = ["ATTN_IMPL", "FlexFailed", "compiled_flex", "eager_flex", "flex_attention_fn", "gdr_attention",
           "grouped_sdpa", "register_attention", "set_attention", "use_gdr_attention"]

ATTN_IMPL = "gdr_scoring"  # the name of gdr_attention in transformers' AttentionInterface


class FlexFailed(RuntimeError):
    """Compiled flex attention failed: the scorer scores the batch on its dense path."""


@functools.cache
def compiled_flex(options: tuple = ()):
    """``torch.compile(flex_attention, dynamic=True, **dict(options))``, built once per process and options: a
    compiled function depends on nothing but the torch build, so every scorer of the process shares it (and its
    compiled graphs). ``options``: sorted (name, value) pairs of further ``torch.compile`` arguments."""
    compile_cache_dir()
    return torch.compile(flex.flex_attention, dynamic=True, **dict(options))


def eager_flex():
    """Eager flex attention (unfused, correct: the tests' path), looked up at call time."""
    warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")  # said once
    return flex.flex_attention


def flex_attention_fn() -> tuple[object, bool]:
    """(flex attention, whether it is compiled) for a caller that does not choose: compiled on CUDA, eager
    without CUDA. The scorer passes its own choice (``gdr_flex``, :class:`gdr.lm.scoring.ScoringKernels`)."""
    if torch.cuda.is_available():
        return compiled_flex(), True
    return eager_flex(), False


def grouped_sdpa(query, key, value, mask, scaling=None, dropout=0.0) -> torch.Tensor:
    """SDPA of H query heads over Hkv = H / G key/value heads without repeating the keys and values (transformers'
    ``repeat_kv``: G copies of the whole KV cache per layer and decode step). The G query heads of a key/value
    head are folded into its sequence, (B, H, T, D) -> (B, Hkv, G*T, D) (a view when T = 1); a mask shared by the
    heads, (B, 1, T, S), is repeated over the G row groups only when T > 1 (a decode step's (B, 1, 1, S) mask
    broadcasts as is). query (B, H, T, D), key/value (B, Hkv, S, D) -> (B, T, H, D)."""
    B, H, T, D = query.shape
    Hkv = key.shape[1]
    G = H // Hkv
    q = query.reshape(B, Hkv, G * T, D)  # query head h = k * G + g reads key/value head k (as repeat_kv has it)
    if mask.shape[1] > 1 or mask.shape[2] > 1:
        mb, mh, mt, S = mask.shape
        kv = Hkv if mh > 1 else 1  # a per-head mask (mh = H) or one for all heads (mh = 1)
        mask = mask.reshape(mb, kv, mh // kv, mt, S).expand(mb, kv, G, T, S).reshape(mb, kv, G * T, S)
    o = torch.nn.functional.scaled_dot_product_attention(q, key, value, attn_mask=mask, dropout_p=dropout,
                                                         scale=scaling)  # (B, Hkv, G*T, Dv)
    return o.view(B, H, T, -1).transpose(1, 2).contiguous()


def gdr_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, position_bias=None,
                  gdr_flex: tuple | None = None, **kwargs):
    """Attention for the scoring and sampling passes; identical to transformers' SDPA for everything else.

    query (Bq, H, T, D), key/value (Bk, Hkv, S, D). The cases:

    - ``attention_mask`` is a flex ``BlockMask`` (packed causal queries): block-sparse flex attention, the
      function the caller passes through the model's forward (``gdr_flex``: (function, compiled)), else
      :func:`flex_attention_fn`'s.
    - ``Bq = G * Bk`` (T5 cross-attention, G queries per document): the G query rows of a document are
      folded into one (H, G*T) sequence over that document's keys, one SDPA call, no key/value copies.
      ``attention_mask`` is then the (Bk, 1, 1, S) bool encoder padding mask; T5's cross-attention
      position bias is zero and ignored.
    - grouped-query attention (``Hkv < H``) under a mask: :func:`grouped_sdpa`, no key/value copies (where
      transformers' SDPA would ``repeat_kv`` them).
    - otherwise: transformers' ``sdpa`` attention.
    Returns (Bq, T, H, D) as transformers' attention functions do.
    """
    if isinstance(attention_mask, BlockMask):
        kw = dict(block_mask=attention_mask, scale=scaling, enable_gqa=query.shape[1] != key.shape[1])
        fn, compiled = gdr_flex if gdr_flex is not None else flex_attention_fn()
        try:
            out = fn(query, key, value, **kw)
        except Exception as e:  # noqa: BLE001 - a compiler failure: the dense path, not eager flex (which
            # materialises the fp32 scores: ~42 GB a layer at the CUDA auto sizes)
            if not compiled:
                raise
            raise FlexFailed(f"{type(e).__name__}: {' '.join(str(e).split())[:300]}") from e
        return out.transpose(1, 2).contiguous(), None
    Bq, Bk = query.shape[0], key.shape[0]
    if Bq != Bk:
        G, H, T, D = Bq // Bk, query.shape[1], query.shape[2], query.shape[3]
        q = query.view(Bk, G, H, T, D).transpose(1, 2).reshape(Bk, H, G * T, D)  # (Bk, H, G*T, D)
        o = torch.nn.functional.scaled_dot_product_attention(q, key, value, attn_mask=attention_mask, scale=scaling)
        return o.view(Bk, H, G, T, D).permute(0, 2, 3, 1, 4).reshape(Bq, T, H, D), None
    if query.shape[1] != key.shape[1] and attention_mask is not None and position_bias is None:
        return grouped_sdpa(query, key, value, attention_mask, scaling, dropout), None

    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                  position_bias=position_bias, **kwargs)


def register_attention() -> None:
    """Register :func:`gdr_attention` (and SDPA's mask builder) with transformers under :data:`ATTN_IMPL`."""
    if ATTN_IMPL not in AttentionInterface._global_mapping:
        AttentionInterface.register(ATTN_IMPL, gdr_attention)
        AttentionMaskInterface.register(ATTN_IMPL, sdpa_mask)


def set_attention(model, impl: str) -> None:
    """``model.set_attn_implementation(impl)``, and on its encoder and decoder stacks where their configs are
    copies that it leaves as they were (transformers 5.17: T5's cross-attention then ran plain SDPA on the
    folded query rows and failed at a doc batch above 1)."""
    model.set_attn_implementation(impl)
    for get in (getattr(model, "get_encoder", None), getattr(model, "get_decoder", None)):
        stack = get() if get is not None else None
        if stack is not None and stack is not model and getattr(stack.config, "_attn_implementation", impl) != impl:
            stack.set_attn_implementation(impl)


def use_gdr_attention(model) -> None:
    """Run ``model``'s attention through :func:`gdr_attention` (transformers' SDPA where nothing differs)."""
    register_attention()
    set_attention(model, ATTN_IMPL)
