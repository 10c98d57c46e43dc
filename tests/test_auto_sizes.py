"""Automatic sizes read the free device memory once per run, with PyTorch's cache emptied first, so they do not
depend on what ran before. CUDA is stood in for on the CPU (its calls recorded)."""
from __future__ import annotations

import pytest
import torch

from gdr.device import free_memory


class _FakeCuda:
    """A GPU with ``free`` bytes unallocated and ``cached`` bytes held by the caching allocator (counted as used
    by mem_get_info until empty_cache gives them back)."""

    def __init__(self, free: float, cached: float):
        self.free, self.cached, self.calls = free, cached, []

    def install(self, monkeypatch) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: self.calls.append("synchronize"))
        monkeypatch.setattr(torch.cuda, "empty_cache", self.empty_cache)
        monkeypatch.setattr(torch.cuda, "mem_get_info", self.mem_get_info)

    def empty_cache(self) -> None:
        self.calls.append("empty_cache")
        self.free, self.cached = self.free + self.cached, 0

    def mem_get_info(self, *a):
        self.calls.append("mem_get_info")
        return int(self.free), int(80e9)


def test_free_memory_empties_the_cache_before_reading_and_is_none_on_the_cpu(monkeypatch):
    assert free_memory("cpu") is None
    gpu = _FakeCuda(free=10e9, cached=30e9)
    gpu.install(monkeypatch)
    assert free_memory() == int(40e9) and free_memory("cuda:0") == int(40e9)
    assert gpu.calls[:3] == ["synchronize", "empty_cache", "mem_get_info"]


def test_the_training_batch_is_resolved_from_memory_with_the_cache_given_back(monkeypatch):
    """batch_size=auto read mem_get_info as it was: after a first retriever had trained, its cached blocks
    counted as used and the next retriever of the same run got a smaller batch (and other learning rates)."""
    from gdr.bench.common import preset_config
    from training.train import TrainerOptions, resolve_train_batch, train_batch_for_memory

    cfg = preset_config("small30m", 30, 4)
    assert resolve_train_batch(TrainerOptions(batch_size="auto", accelerator="cpu"), cfg, 10**6) == 64
    assert resolve_train_batch(TrainerOptions(batch_size=96), cfg, 10**6) == 96
    gpu = _FakeCuda(free=4e9, cached=36e9)
    gpu.install(monkeypatch)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    want = train_batch_for_memory(cfg, 40e9)
    assert want > train_batch_for_memory(cfg, 4e9)  # the cache would have cost batch size
    assert resolve_train_batch(TrainerOptions(batch_size="auto"), cfg, 10**7) == want
    gpu.free, gpu.cached = 4e9, 36e9  # a second retriever, after the first one filled the cache: the same batch
    assert resolve_train_batch(TrainerOptions(batch_size="auto"), cfg, 10**7) == want
    assert gpu.calls.count("empty_cache") == 2 and gpu.calls.index("empty_cache") < gpu.calls.index("mem_get_info")


@pytest.mark.parametrize("devices,n", [(2, 2), ("auto", 1)])
def test_the_training_batch_caps_by_each_process_share_of_the_examples(monkeypatch, devices, n):
    from gdr.bench.common import preset_config
    from training.train import MIN_STEPS_PER_EPOCH, TrainerOptions, resolve_train_batch

    _FakeCuda(free=141e9, cached=0).install(monkeypatch)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    n_train = 2048 * MIN_STEPS_PER_EPOCH * 2  # one process: 2 * 2048 per step keeps 16 steps an epoch
    got = resolve_train_batch(TrainerOptions(batch_size="auto", devices=devices), preset_config("mini", 30, 4), n_train)
    assert got == 4096 // n
