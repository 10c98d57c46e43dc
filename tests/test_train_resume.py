"""A training stopped anywhere resumes to the unbroken run: the same steps, validations, best checkpoint, model and
``metrics.csv`` rows (each written once across the stops). Tiny random-init retrievers, about a second a run."""
from __future__ import annotations

import csv
import os
import signal

import pytest
import pytorch_lightning as pl
import torch
from test_retriever import tiny_config, toy_corpus, word_tokenizer  # noqa: F401  (session fixture)

from gdr import signals
from gdr.io import file_digest
from gdr.training.train import ExampleOptions, OptimOptions, TrainerOptions, train


class _SignalAt(pl.Callback):
    """SIGTERM to this process at the first batch end at or after step ``step`` (a scheduler's preemption)."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_end(self, trainer, *args):
        if trainer.global_step >= self.step:
            self.step = 10**9
            os.kill(os.getpid(), signal.SIGTERM)


@pytest.fixture
def installed_signals():
    signals.install()
    yield
    signals.uninstall()


def _fit(out, tok, trainer_kw: dict, stop_at: int | None = None):
    ids, texts, codes = toy_corpus(20)
    optim = trainer_kw.get("optim", {})
    return train(out, tiny_config(tok, dropout=0.1), ids, codes, train_queries=texts * 3,
                 train_rel=[[i] for i in range(20)] * 3,
                 examples=ExampleOptions(dev_fraction=0.2, dev_max=8, doc_first=False, doc_windows=0),
                 optim=OptimOptions(lr_encoder=3e-3, lr_decoder=3e-3, warmup_steps=2, **optim),
                 trainer_opts=TrainerOptions(batch_size=16, enable_progress_bar=False, tensorboard=False,
                                             log_every_n_steps=1, val_beam=4, monitor="val/mrr",
                                             num_sanity_val_steps=0,
                                             **{k: v for k, v in trainer_kw.items() if k != "optim"}),
                 seed=0, callbacks=[_SignalAt(stop_at)] if stop_at is not None else [])


def _rows(out) -> list[dict]:
    """Every row of the training's one ``logs/metrics.csv`` (however often it resumed), without empty cells."""
    assert list(out.rglob("metrics.csv")) == [out / "logs" / "metrics.csv"]
    with open(out / "logs" / "metrics.csv", newline="") as fh:
        return [{k: v for k, v in r.items() if v != ""} for r in csv.DictReader(fh)]


# 4 steps an epoch; the first run stops early at step 12 (patience 1), before its max_steps; the second trains with
# the BBC protocol's regulariser (R-drop on NCI's corrupted view: random spans and input dropout, drawn each step)
RUNS = {
    "validated each epoch, early stopped": dict(max_steps=14, patience=1),
    "validated every 2 steps across epochs, corrupted view": dict(
        max_steps=10, check_val_every_n_epoch=None, val_check_interval=2,
        optim=dict(consistency_weight=0.15, consistency_view="corrupted")),
}


@pytest.mark.parametrize("name", list(RUNS))
@pytest.mark.slow
def test_a_training_stopped_at_any_step_twice_resumes_to_the_unbroken_run(tmp_path, word_tokenizer, name,  # noqa: F811
                                                                          installed_signals):
    kw = RUNS[name]
    full = _fit(tmp_path / "full", word_tokenizer, kw)
    want = _rows(tmp_path / "full")
    val_steps = [r["step"] for r in want if "val/mrr" in r]
    assert len(val_steps) >= 3 and full.global_step >= 8, (full.global_step, val_steps)
    for k in range(1, full.global_step):
        out = tmp_path / f"stop{k}"
        for stop in (k, k + 1):  # twice in a row: at step k, then at the next batch end of the resumed run
            with pytest.raises(signals.Stopped):
                _fit(out, word_tokenizer, kw, stop_at=stop)
            signals.uninstall()
            signals.install()
        res = _fit(out, word_tokenizer, kw)
        assert _rows(out) == want, f"stopped at steps {k}, {k + 1}"
        assert (res.global_step, res.best_score) == (full.global_step, full.best_score), k
        assert os.path.basename(res.best_checkpoint) == os.path.basename(full.best_checkpoint), k
        assert file_digest(out / "model" / "model.pt") == file_digest(tmp_path / "full" / "model" / "model.pt"), k
        assert torch.load(out / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == full.global_step


def test_each_validation_logs_one_line_to_watch_the_run_by(tmp_path, word_tokenizer, caplog):  # noqa: F811
    import logging
    import re

    with caplog.at_level(logging.INFO, logger="gdr.training.callbacks"):
        res = _fit(tmp_path / "run", word_tokenizer, RUNS["validated each epoch, early stopped"])
    lines = [r.getMessage() for r in caplog.records if r.name == "gdr.training.callbacks"]
    rows = _rows(tmp_path / "run")
    vals = [r for r in rows if "val/mrr" in r]
    loss_at = {r["step"]: float(r["train/loss"]) for r in rows if "train/loss" in r}
    assert len(lines) == len(vals) == 3, lines
    best = 0.0
    for line, row in zip(lines, vals):
        m = re.fullmatch(r"step (\d+) \(epoch (\d+)\): train loss (\d\.\d{4}), val/mrr (\d\.\d{4}) "
                         r"\(best (\d\.\d{4})\), ([\d,]+) examples/s, ETA \d+:\d\d:\d\d", line)
        assert m, line
        best = max(best, float(row["val/mrr"]))
        assert int(m[1]) == int(row["step"]) + 1 and m[2] == row["epoch"], (line, row)
        assert (float(m[4]), float(m[5])) == (round(float(row["val/mrr"]), 4), round(best, 4)), (line, row)
        assert float(m[3]) == round(loss_at[row["step"]], 4) and int(m[6].replace(",", "")) > 0
    assert float(lines[-1].split("(best ")[1][:6]) == round(res.best_score, 4)


def test_a_resumed_training_has_one_metrics_csv_without_rows_past_its_checkpoint(tmp_path, word_tokenizer,  # noqa: F811
                                                                                  installed_signals):
    """Stopped at step 4 and resumed, a training keeps one ``logs/metrics.csv`` (no ``logs/version_N`` per start)
    holding the unbroken run's rows. Rows a run killed without a stop (kill -9) flushed after its last checkpoint are
    dropped on resume, as the resumed run logs those steps again."""
    kw = RUNS["validated every 2 steps across epochs, corrupted view"]
    _fit(tmp_path / "full", word_tokenizer, kw)
    want = _rows(tmp_path / "full")
    out = tmp_path / "run"
    with pytest.raises(signals.Stopped):
        _fit(out, word_tokenizer, kw, stop_at=4)
    signals.uninstall()
    signals.install()
    step = torch.load(out / "checkpoints" / "last.ckpt", weights_only=False)["global_step"]
    late = [r for r in want if int(r["step"]) >= step][:3]  # as a killed run would have flushed them
    assert late and len(_rows(out)) < len(want)
    with open(out / "logs" / "metrics.csv", "a", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=next(csv.reader(open(out / "logs" / "metrics.csv"))))
        writer.writerows(late)
    _fit(out, word_tokenizer, kw)
    assert _rows(out) == want
