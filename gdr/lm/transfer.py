"""Host data onto the device without a host sync.

A CUDA copy from ordinary (pageable) host memory without ``non_blocking`` is ``cudaMemcpyAsync`` followed by
``cudaStreamSynchronize``: Python waits until the GPU has finished everything queued before it, so the GPU
then idles while Python queues the next kernels. From pinned memory with ``non_blocking=True`` the copy is
queued like a kernel (PyTorch's pinned-memory allocator keeps the buffer until the copy has run).
``tests/syncs.py`` counts the syncs that remain in each hot loop.
"""
from __future__ import annotations

import torch

__all__ = ["upload"]


def upload(data, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``data`` (a list, an array or a CPU tensor) as a tensor on ``device``, copied without a host sync:
    pinned and ``non_blocking`` on CUDA; elsewhere the tensor itself (no copy on the CPU)."""
    t = torch.as_tensor(data, dtype=dtype)
    if torch.device(device).type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device, non_blocking=True)
