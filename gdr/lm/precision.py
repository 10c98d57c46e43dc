"""Copies of a model cast for compute that keep its rotary frequencies in fp32.

``Module.to(torch.bfloat16)`` casts buffers too, so a rotary embedding's ``inv_freq`` (and
``original_inv_freq``) would be rounded to bf16: for SmolLM2 (theta 1e5, head dim 64) the angle at position 400
is then off by about 0.5 rad. transformers' rotary forward computes the angles in fp32 from ``inv_freq.float()``
(with autocast off in 5.17) and casts only cos/sin to the activations' dtype, so fp32 buffers give fp32 angles.
Every place that casts a model for compute (the CUDA decode copy, the scoring copy, the fp32 reference of
``score_naive``) goes through :func:`cast_copy`.
"""
from __future__ import annotations

import copy

import torch

__all__ = ["cast_copy", "rotary_buffers", "set_buffers"]


def rotary_buffers(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The floating-point buffers of ``model`` that define rotary angles, by qualified name: every ``*inv_freq``
    buffer (``inv_freq``, ``original_inv_freq``, per-layer-type variants) and every buffer of a module whose
    name or class name says rotary (cached cos/sin tables of older models)."""
    out = {}
    for mod_name, mod in model.named_modules():
        rotary = "rotary" in mod_name.lower() or "rotary" in type(mod).__name__.lower()
        for name, buf in mod.named_buffers(recurse=False):
            if buf is not None and buf.is_floating_point() and (rotary or "inv_freq" in name):
                out[f"{mod_name}.{name}" if mod_name else name] = buf
    return out


def cast_copy(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """A deep copy of ``model`` cast to ``dtype`` (weights and other buffers), in eval mode, whose rotary
    buffers (:func:`rotary_buffers`) are fp32 (or stay wider). ``model`` itself is not changed."""
    m = copy.deepcopy(model)
    keep = rotary_buffers(m)
    m.to(dtype)
    set_buffers(m, {k: b.float() if b.dtype in (torch.float16, torch.bfloat16) else b for k, b in keep.items()})
    return m.eval()


def set_buffers(model: torch.nn.Module, buffers: dict[str, torch.Tensor]) -> None:
    """Put ``buffers`` (qualified name -> tensor, as :func:`rotary_buffers` gives) into ``model`` in place of
    the buffers of those names, on their device."""
    for name, buf in buffers.items():
        owner, _, attr = name.rpartition(".")
        mod = model.get_submodule(owner)
        mod._buffers[attr] = buf.to(mod._buffers[attr].device)
