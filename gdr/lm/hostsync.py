"""What keeps a GPU loop free of host syncs.

A host sync is Python waiting for the GPU: reading a device value, or copying host memory to the GPU the
plain way (from pageable memory without ``non_blocking``, CUDA's copy is ``cudaMemcpyAsync`` followed by
``cudaStreamSynchronize``). The GPU's queue then drains and the GPU idles while Python queues the next
kernels. ``tests/syncs.py`` counts the syncs that remain in each hot loop.

- :func:`upload`: host data to the device from pinned memory with ``non_blocking`` (queued like a kernel;
  PyTorch's pinned-memory allocator keeps the buffer until the copy has run).
- :func:`padding_mask_4d`: given a 2D padding mask, transformers' mask helpers read it on the host
  (``padding_mask.all()``: may the mask be dropped?); a 4D mask they use as is.
"""
from __future__ import annotations

import sys

import torch
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask, sdpa_mask

__all__ = ["upload", "padding_mask_4d"]


def upload(data, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``data`` (a list, an array or a CPU tensor) as a tensor on ``device``, copied without a host sync:
    pinned and ``non_blocking`` on CUDA; elsewhere the tensor itself (no copy on the CPU)."""
    t = torch.as_tensor(data, dtype=dtype)
    if torch.device(device).type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device, non_blocking=True)


def padding_mask_4d(mask: torch.Tensor, module: torch.nn.Module, dtype: torch.dtype) -> torch.Tensor:
    """The (B, 1, 1, S) form of a (B, S) padding mask (1 = token) that transformers would build from it for
    ``module``'s attention: bool where its mask function is SDPA's (SDPA, our scoring attention), additive
    (0 / ``dtype``'s min) where it is eager's. ``dtype``: that of the states the mask is built for (the
    encoder states for cross-attention).

    Modules whose code does not build masks with ``transformers.masking_utils`` and other attention kernels
    (flash wants 2D, flex a block mask) get the 2D mask back.
    """
    impl = getattr(module.config, "_attn_implementation", None)
    make = ALL_MASK_ATTENTION_FUNCTIONS[impl] if impl in list(ALL_MASK_ATTENTION_FUNCTIONS) else None
    builds_masks = "create_bidirectional_mask" in vars(sys.modules[type(module).__module__])  # masking_utils
    if make not in (sdpa_mask, eager_mask) or not builds_masks:
        return mask
    keep = mask.bool()[:, None, None, :]
    if make is sdpa_mask:
        return keep
    return torch.zeros(keep.shape, dtype=dtype, device=mask.device).masked_fill_(~keep, torch.finfo(dtype).min)
