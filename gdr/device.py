"""What a device has free, read the same way by every automatic size (GPU memory, the machine's available memory);
the process's device and rank; what machine this is (:func:`machine_record`), recorded beside a run's and a P's
results."""
from __future__ import annotations

import os
import platform
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed as dist

__all__ = ["free_memory", "local_device", "dist_info", "available_memory", "machine_record", "machine_differences",
           "cpu_threads", "torch_threads"]

# What of a machine record decides the last bits of CPU and GPU kernels' results (the instruction set the CPU
# kernels dispatch to, the GPU model, the torch build); the rest (memory, CPU model name) is information
_NUMERIC_FIELDS = ("cpu_capability", "gpu", "torch", "cuda")


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


def cpu_threads() -> int:
    """The torch threads a CPU stage runs with unless told otherwise: one per core this process may use (shared
    with the other local processes of a launcher, ``LOCAL_WORLD_SIZE``), whatever an earlier stage of the process
    left set. A CPU result's last bits depend on the count (MKL computes a product of a few rows by another kernel
    at another count: on the development CPU 5-11 rows differ between 1 and 2 threads), so the stages that compute
    on the CPU key it (a retriever's training, P's scoring)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cores // max(1, int(os.environ.get("LOCAL_WORLD_SIZE") or 1)))


@contextmanager
def torch_threads(n: int | None):
    """torch's CPU threads set to ``n`` for the block (None: left as they are), then restored."""
    before = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


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


def _cpu_model() -> str | None:
    """The CPU's model name (``/proc/cpuinfo``), else what :func:`platform.processor` says, else None."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def machine_record() -> dict:
    """What machine this process runs on, as information beside results (never part of a key, no host name): the
    CPU model and torch's CPU capability (the instruction set its CPU kernels dispatch to: ``AVX2``, ``AVX512``,
    ...), the first GPU's name and memory in bytes when CUDA is there (else None), the GPU count, and the torch,
    CUDA and Python versions."""
    cuda = torch.cuda.is_available()
    props = torch.cuda.get_device_properties(0) if cuda else None
    return {"cpu": _cpu_model(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "gpu": props.name if props is not None else None,
            "gpu_memory_bytes": int(props.total_memory) if props is not None else None,
            "gpus": torch.cuda.device_count() if cuda else 0,
            "torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version()}


def machine_differences(recorded: dict | None, now: dict) -> list[str]:
    """How the machine ``recorded`` (a :func:`machine_record` read back; None or {}: not recorded) differs from
    ``now`` in what decides the last bits of results: ``["cpu_capability AVX2 there, AVX512 here", ...]``."""
    if not recorded:
        return []
    return [f"{k} {recorded.get(k)} there, {now.get(k)} here" for k in _NUMERIC_FIELDS
            if k in recorded and recorded.get(k) != now.get(k)]
