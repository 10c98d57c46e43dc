"""What a device has free, read the same way by every automatic size (GPU memory, the machine's available memory);
the process's device and rank."""
from __future__ import annotations

import os

import torch
import torch.distributed as dist

__all__ = ["free_memory", "available_memory", "local_device", "dist_info"]


def free_memory(device: torch.device | str | None = None) -> int | None:
    """Bytes free on a CUDA ``device`` (default: the current one) for what is allocated next; None on the CPU.

    ``torch.cuda.mem_get_info`` counts the blocks PyTorch's caching allocator keeps (freed tensors, graph pools)
    as used, so a size read after other work would depend on what ran before: the cache is emptied first, after
    the device has finished its queued work.
    """
    dev = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if dev.type != "cuda" or not torch.cuda.is_available():
        return None
    torch.cuda.synchronize(dev)
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info(dev)
    return int(free)


def available_memory() -> int:
    """Bytes of memory available to a new allocation (Linux: MemAvailable; else the free physical pages)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            line = next(x for x in f if x.startswith("MemAvailable:"))
        return int(line.split()[1]) * 1024
    except (OSError, StopIteration, ValueError):
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def local_device(device: str | None) -> str:
    """The device of this process: under a launcher that sets ``LOCAL_RANK`` (``torchrun``), ``auto`` and
    ``cuda`` mean ``cuda:{LOCAL_RANK % n_gpus}``, made the current CUDA device (before NCCL binds to it);
    anything else is returned as given."""
    device = "auto" if device is None else str(device)
    local = os.environ.get("LOCAL_RANK")
    if local is None or device not in ("auto", "cuda") or not torch.cuda.is_available():
        return device
    gpu = int(local) % torch.cuda.device_count()
    torch.cuda.set_device(gpu)
    return f"cuda:{gpu}"


def dist_info() -> tuple[int, int]:
    """(rank, world_size), initialising torch.distributed when a launcher asked for several processes:
    NCCL when each local rank has a GPU of its own, gloo otherwise (CPU, or ranks sharing a GPU)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return 0, 1
    if not dist.is_initialized():
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        nccl = torch.cuda.is_available() and local_world <= torch.cuda.device_count()
        if nccl:
            local_device("cuda")
        dist.init_process_group("nccl" if nccl else "gloo")
    return dist.get_rank(), dist.get_world_size()
