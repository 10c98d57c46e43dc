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
    """batch_size=auto gives the CUDA cache back before reading mem_get_info: else, after a first retriever has
    trained, its cached blocks count as used and the next retriever of the same run gets a smaller batch (and
    other learning rates)."""
    from gdr.bench.common import preset_config
    from gdr.training.train import TrainerOptions, resolve_train_batch, train_batch_for_memory

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
    from gdr.training.train import MIN_STEPS_PER_EPOCH, TrainerOptions, resolve_train_batch

    _FakeCuda(free=141e9, cached=0).install(monkeypatch)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    n_train = 2048 * MIN_STEPS_PER_EPOCH * 2  # one process: 2 * 2048 per step keeps 16 steps an epoch
    got = resolve_train_batch(TrainerOptions(batch_size="auto", devices=devices), preset_config("mini", 30, 4), n_train)
    assert got == 4096 // n


def test_a_run_resolves_its_training_batch_once_and_records_it_with_its_device(monkeypatch, tmp_path):
    """`gdr run` resolves trainer.batch_size=auto once, for every retriever of the run, and records it with the
    device in <run>/auto_sizes.json: a retriever trained later (or the run resumed on the same device) trains at
    that batch whatever the memory holds by then (the stage key carries the number, not `auto`). Another
    device resolves its own."""
    import json
    from types import SimpleNamespace

    import gdr.pipeline as pipeline
    from gdr.config import load_config

    gpu = _FakeCuda(free=60e9, cached=0)
    gpu.install(monkeypatch)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H200")
    index = tmp_path / "index-gc"
    index.mkdir()
    (index / "docids.tsv").write_text("".join(f"d{i}\t{i // 10}-{i % 10}\n" for i in range(100)))
    cfg = load_config("run", ["train.model.size=small30m", "train.trainer.batch_size=auto",
                              "train.trainer.accelerator=gpu", f"out={tmp_path / 'run'}"])
    run = SimpleNamespace(cfg=cfg, settings=pipeline.run_settings(cfg), pipe=SimpleNamespace(root=tmp_path / "run"),
                          indexes={"gc": SimpleNamespace(path=index)}, seed_indexes={})
    run.pipe.root.mkdir()
    first = pipeline.resolve_train_batch(run, 10**6)
    assert first > 64 and json.loads((run.pipe.root / "auto_sizes.json").read_text()) == {
        "device": "NVIDIA H200", "train_batch": first}
    gpu.free = 2e9  # another retriever holds the memory now: the run's batch stays
    assert pipeline.resolve_train_batch(run, 10**6) == first
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H100 80GB HBM3")
    assert pipeline.resolve_train_batch(run, 10**6) < first  # another device: resolved (and keyed) anew
    cfg.train.trainer.batch_size = 96
    run.settings = pipeline.run_settings(cfg)
    assert pipeline.resolve_train_batch(run, 10**6) is None  # a number is the number: nothing to resolve
