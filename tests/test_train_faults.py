"""Faults of `gdr train` and the API's train_retriever, like tests/test_faults.py has for `gdr run`: a
folder holding another training, a run shorter than its first validation, two stops, a damaged checkpoint, a full
disk while checkpointing, a lock, settings that contradict each other. Tiny random-init retrievers on 40 toy
documents (5 steps an epoch), a few seconds each on a CPU."""
from __future__ import annotations

import errno
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_retriever import toy_corpus, word_tokenizer  # noqa: F401  (session fixture: a word-level tokenizer)

import gdr
from gdr.cli import main
from gdr.io import file_digest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def toy(tmp_path_factory, word_tokenizer):  # noqa: F811
    """A 40-document BEIR folder with train queries, its docids, and the same docids with the ids rotated."""
    from gdr.data import Corpus, QuerySet, write_beir
    from gdr.indexing.docids import write_docids

    root = tmp_path_factory.mktemp("train-faults")
    ids, texts, codes = toy_corpus(40)
    qs = QuerySet(name="toy", qids=[f"q{i}" for i in range(40)], texts=texts, relevant=[[d] for d in ids],
                  splits=["train"] * 40)
    folder = write_beir(Corpus(name="toy", doc_ids=ids, texts=texts), qs, root / "toy")
    write_docids(root / "docids.tsv", ids, codes)
    write_docids(root / "rotated.tsv", ids, codes[1:] + codes[:1])  # the same codes, other documents
    return root, folder, word_tokenizer


def _args(toy, out: Path, *extra: str, docids: str = "docids.tsv") -> list[str]:
    """A short training: `gdr train ... model.size=tiny trainer.max_steps=3 trainer.batch_size=16` (an epoch is
    5 steps, so the run ends before its first scheduled validation)."""
    root, folder, tok = toy
    return ["train", f"data.name={folder}", f"model.tokenizer={tok}", f"docids={root / docids}", f"out_dir={out}",
            "model.size=tiny", "trainer.max_steps=3", "trainer.batch_size=16", "trainer.enable_progress_bar=false",
            "trainer.tensorboard=false", "trainer.val_beam=4", *extra]


@pytest.fixture(scope="module")
def trained(toy, tmp_path_factory):
    """A finished training of one epoch (5 steps; kept pristine: tests work on copies)."""
    out = tmp_path_factory.mktemp("trained") / "run"
    assert main(_args(toy, out, "trainer.max_steps=5")) == 0
    return out


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".gdr.lock"))
    return dst


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def _loads(path: Path) -> bool:
    try:
        torch.load(path, map_location="cpu", weights_only=False)
    except Exception:
        return False
    return True


# ----------------------------------------------------------------------------------- a run shorter than a validation
def test_a_run_shorter_than_its_first_validation_validates_once_and_exits_0(toy, tmp_path, caplog):
    """`gdr train ... trainer.max_steps=3 trainer.batch_size=16` (an epoch is 5 steps) validates the final weights
    once and exits 0, never Lightning's `Early stopping conditioned on metric val/recall@1 which is not
    available`."""
    out = tmp_path / "run"
    with caplog.at_level(logging.INFO):
        assert main(_args(toy, out)) == 0
    logs = caplog.text
    man = json.loads((out / "manifest.json").read_text())
    assert man["global_step"] == 3 and man["best_val_recall1"] is not None
    assert _loads(Path(man["best_checkpoint"])) and "validated the final weights once" in logs
    # the learning curve's one point is at the step of the weights validated, the last one
    assert [s for s, _ in json.loads((out / "curve.json").read_text())] == [3]
    # the default warmup (1,000 steps at batch 64: 4,000 at 16) is longer than the run: adjusted, with a line
    assert "optim.warmup_steps: 4000 warmup steps" in logs and "warming up over the first 0 steps" in logs


def test_a_rerun_with_more_steps_that_starts_afresh_exports_its_own_weights(toy, tmp_path):
    """3 steps validated once at the end, no validation due within fit and no last.ckpt left, then the same folder
    with max_steps=4: the second training starts afresh and must export its own weights, validated at its end, not
    the first's best checkpoint (it exported that one, with no score and an empty learning curve)."""
    out = tmp_path / "run"
    rare = ("trainer.check_val_every_n_epoch=50", "trainer.max_epochs=100", "trainer.num_sanity_val_steps=0")
    assert main(_args(toy, out, *rare)) == 0
    first = (out / "model" / "model.pt").read_bytes()
    assert main(_args(toy, out, *rare, "trainer.max_steps=4")) == 0
    man = json.loads((out / "manifest.json").read_text())
    assert man["global_step"] == 4 and man["best_val_recall1"] is not None
    assert Path(man["best_checkpoint"]).name.endswith("-4.ckpt"), man["best_checkpoint"]
    assert [s for s, _ in json.loads((out / "curve.json").read_text())] == [4]
    assert (out / "model" / "model.pt").read_bytes() != first


def test_the_best_checkpoint_is_printed_and_stored_under_the_metric_that_picked_it(toy, tmp_path, capsys):
    """`gdr train trainer.monitor=val/mrr` prints `best val/mrr: <its value>` and its manifest keeps that value as
    `best_val_score` of `best_val_metric: val/mrr`, never as a recall@1; a rerun reusing the training says the
    same. Under the default monitor the manifest keeps `best_val_recall1` too (what earlier readers read)."""
    out = tmp_path / "mrr"
    args = _args(toy, out, "trainer.monitor=val/mrr")
    for _ in range(2):  # trained, then reused
        assert main(args) == 0
        man = json.loads((out / "manifest.json").read_text())
        assert man["best_val_metric"] == "val/mrr" and "best_val_recall1" not in man
        printed = capsys.readouterr().out
        assert f"best val/mrr: {man['best_val_score']}  steps: 3" in printed and "recall" not in printed
        assert isinstance(man["best_val_score"], float)
    assert main(_args(toy, tmp_path / "r1")) == 0
    man = json.loads((tmp_path / "r1" / "manifest.json").read_text())
    assert man["best_val_metric"] == "val/recall@1" and man["best_val_recall1"] == man["best_val_score"] is not None
    assert f"best val/recall@1: {man['best_val_score']}" in capsys.readouterr().out


def test_lightnings_progress_bar_is_not_written_into_a_log_file(toy, tmp_path, capfd, caplog):
    """`gdr train ... > train.log 2>&1` (stdout and stderr not a terminal) with the default
    `trainer.enable_progress_bar=true`: no Lightning bar redraws in the output, while the log keeps the line of
    each validation."""
    args = [a for a in _args(toy, tmp_path / "run", "trainer.max_steps=10") if "enable_progress_bar" not in a]
    with caplog.at_level(logging.INFO, logger="gdr.training.callbacks"):
        assert main(args) == 0
    out, err = capfd.readouterr()
    assert "Epoch " not in out + err and "it/s" not in out + err  # Lightning's bar, rich's or tqdm's
    assert re.search(r"step 10 \(epoch 1\): train loss \d\.\d{4}, val/recall@1", caplog.text), caplog.text


def test_min_steps_above_max_steps_is_refused(toy, tmp_path, capsys):
    """min_steps > max_steps is refused by name (the command and the settings class), not trained to max_steps
    without a word."""
    assert main(_args(toy, tmp_path / "t", "trainer.min_steps=9")) == 2
    assert "trainer.min_steps=9: must be <= trainer.max_steps=3" in _one_line(capsys)
    with pytest.raises(ValueError, match=r"^trainer.min_steps=9: must be <= trainer.max_steps=3"):
        gdr.TrainSettings.merged(trainer={"max_steps": 3, "min_steps": 9})


def test_a_finished_training_rerun_is_reused_with_its_dev_score(toy, tmp_path, caplog):
    """A run that validates only at its end (check_val_every_n_epoch above its epochs), rerun with the same
    command: reused as it is, with its dev score, its model untouched and no second fit (no logs/version_1)."""
    out = tmp_path / "run"
    args = _args(toy, out, "trainer.max_steps=7", "trainer.check_val_every_n_epoch=50")
    assert main(args) == 0
    first = json.loads((out / "manifest.json").read_text())
    assert first["best_val_recall1"] is not None
    assert (first["batch_size"], first["precision"], first["device"]) == (16, "32-true", "cpu")  # as resolved
    model, rows = file_digest(out / "model" / "model.pt"), (out / "logs" / "metrics.csv").read_bytes()
    with caplog.at_level(logging.INFO):
        assert main(args) == 0
    again = json.loads((out / "manifest.json").read_text())
    assert (again["best_val_recall1"], again["best_checkpoint"], again["global_step"]) == \
        (first["best_val_recall1"], first["best_checkpoint"], 7)
    assert file_digest(out / "model" / "model.pt") == model and (out / "logs" / "metrics.csv").read_bytes() == rows
    assert "a finished training on these inputs and settings (step 7" in caplog.text
    assert main(_args(toy, out, "trainer.max_steps=9", "trainer.check_val_every_n_epoch=50")) == 0  # more steps
    assert json.loads((out / "manifest.json").read_text())["global_step"] == 9


# ----------------------------------------------------------------------------------- a folder of another training
@pytest.mark.parametrize("change,named", [
    ({"docids": "rotated.tsv"}, "docids ("),  # the same codes, the ids rotated
    ({"extra": "optim.lr_decoder=0.002"}, "optim.lr_decoder (0.001 -> 0.002)"),
    ({"extra": "examples.doc_windows=1"}, "examples.doc_windows (2 -> 1)"),
])
def test_gdr_train_into_a_folder_of_another_training_is_refused(toy, trained, tmp_path, capsys, change, named):
    """`gdr train` into a finished training's folder with other docids or settings is refused, naming what
    differs, and leaves every file as it was (never "resuming from last.ckpt" into the old model.pt under a new
    docids.tsv, manifest and config.yaml)."""
    out = _copy(trained, tmp_path / "run")
    files = ("docids.tsv", "config.yaml", "manifest.json", "model/model.pt", "checkpoints/last.ckpt")
    before = {f: file_digest(out / f) for f in files}
    extra = [change["extra"]] if "extra" in change else []
    docids = change.get("docids", "docids.tsv")
    assert main(_args(toy, out, *extra, docids=docids)) == 2
    line = _one_line(capsys)
    assert line.startswith(f"gdr train: error: out_dir={out}: holds a training on other inputs or settings: ")
    assert named in line and "set trainer.resume=false" in line and "fresh out_dir" in line, line
    assert {f: file_digest(out / f) for f in files} == before  # checked before anything is written
    assert main(_args(toy, out, *extra, "trainer.resume=false", docids=docids)) == 0  # the way out it names
    assert (out / "docids.tsv").read_text() == (toy[0] / docids).read_text()
    assert file_digest(out / "config.yaml") != before["config.yaml"]
    assert main(_args(toy, out, *extra, docids=docids)) == 0  # and that training resumes


def test_gdr_train_into_a_training_of_format_0_is_refused_in_one_line(toy, trained, tmp_path, capsys):
    """A training of an older gdr without trained_on.json (format 0) does not say what it was trained on: resuming
    it is refused in one line naming the format and the ways out, before any file changes; trainer.resume=false
    starts over in the folder."""
    out = _copy(trained, tmp_path / "run")
    (out / "trained_on.json").unlink()
    files = ("docids.tsv", "config.yaml", "manifest.json", "model/model.pt", "checkpoints/last.ckpt")
    before = {f: file_digest(out / f) for f in files}
    assert main(_args(toy, out)) == 2
    line = _one_line(capsys)
    assert line == (f"gdr train: error: out_dir={out}: holds a training of format 0 (an older gdr's, without "
                    "trained_on.json), which does not record what it was trained on, so it cannot be resumed. To "
                    "start over in this folder set trainer.resume=false, or choose a fresh out_dir")
    assert {f: file_digest(out / f) for f in files} == before and not (out / "trained_on.json").exists()
    assert main(_args(toy, out, "trainer.resume=false")) == 0  # the way out it names
    assert (out / "trained_on.json").is_file()


def test_train_retriever_refuses_a_folder_of_another_training(toy, trained, tmp_path):
    """The API's train_retriever keeps the same promise."""
    root, folder, tok = toy
    out = _copy(trained, tmp_path / "run")
    corpus = gdr.load_corpus(str(folder))
    before = file_digest(out / "model" / "model.pt")
    kw = dict(queries=gdr.split_queries(corpus, "train", name=str(folder)), size="tiny", model={"tokenizer": tok},
              trainer={"max_steps": 3, "batch_size": 16, "tensorboard": False, "val_beam": 4})
    with pytest.raises(gdr.validate.ConfigError, match=r"holds a training on other inputs.*docids \("):
        gdr.train_retriever(corpus, root / "rotated.tsv", out, **kw)
    assert file_digest(out / "model" / "model.pt") == before and (out / "docids.tsv").read_text() == \
        (root / "docids.tsv").read_text()
    res = gdr.train_retriever(corpus, root / "docids.tsv", out, **kw)  # the same inputs: resumed, not refused
    assert res.global_step == 5


# ----------------------------------------------------------------------------------- stops, damage, a full disk
def _stop_at(monkeypatch, step: int) -> None:
    """SIGTERM to this process once training reaches ``step`` (a scheduler's preemption)."""
    from gdr.training import callbacks

    real = callbacks.LossRecorder.on_train_batch_end

    def on_train_batch_end(self, trainer, *a, **k):
        real(self, trainer, *a, **k)
        if trainer.global_step == step:
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(callbacks.LossRecorder, "on_train_batch_end", on_train_batch_end)


def test_two_stops_then_the_rerun_finishes(toy, tmp_path, capsys, monkeypatch):
    """Stopped by SIGTERM at steps 2 and 9 (rc 143 and one line both times, last.ckpt at that step), the rerun
    finishes the run; no rerun meets Lightning's `Early stopping conditioned on metric val/recall@1 which is not
    available`."""
    out = tmp_path / "run"
    # an epoch is 19 steps at batch 4: both stops, and the end of the run, fall within the first one
    args = _args(toy, out, "trainer.batch_size=4", "trainer.max_steps=12", "trainer.checkpoint_every_n_steps=1")
    for step in (2, 9):
        with monkeypatch.context() as m:
            _stop_at(m, step)
            assert main(args) == 143
        assert _one_line(capsys) == "gdr train: stopped by SIGTERM; rerun the same command to resume"
        assert torch.load(out / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == step
    assert main(args) == 0, capsys.readouterr().err[-2000:]
    man = json.loads((out / "manifest.json").read_text())
    assert man["global_step"] == 12 and _loads(Path(man["best_checkpoint"]))


@pytest.mark.parametrize("choice,said", [("best", "starting from the weights of best-"), ("fresh", "starting over")])
def test_a_truncated_last_checkpoint_is_one_line_and_a_fallback(toy, trained, tmp_path, caplog, choice, said):
    """A truncated last.ckpt is one warning line and a fallback (the best checkpoint's weights, or a fresh start
    with trainer.resume_damaged=fresh), not a traceback (`PytorchStreamReader failed reading zip archive`)."""
    out = _copy(trained, tmp_path / "run")
    last = out / "checkpoints" / "last.ckpt"
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])
    with caplog.at_level(logging.WARNING):
        assert main(_args(toy, out, *([] if choice == "best" else [f"trainer.resume_damaged={choice}"]))) == 0
    lines = [r.getMessage() for r in caplog.records if str(last) in r.getMessage()]
    assert len(lines) == 1 and "is damaged" in lines[0] and said in lines[0], lines
    assert (out / "checkpoints" / "last.ckpt.damaged").exists() and _loads(last)
    assert json.loads((out / "manifest.json").read_text())["global_step"] == 3  # the fallback starts a new count


def test_a_damaged_best_checkpoint_left_behind_is_never_used(toy, trained, tmp_path):
    """A best-*.ckpt cut short (a full disk under an older gdr) is never picked as the newest best on a rerun: it
    is removed and the recorded best kept."""
    out = _copy(trained, tmp_path / "run")
    stray = out / "checkpoints" / "best-9-99.ckpt"
    good = Path(json.loads((out / "manifest.json").read_text())["best_checkpoint"]).name
    stray.write_bytes((out / "checkpoints" / good).read_bytes()[:1000])
    assert main(_args(toy, out)) == 0
    man = json.loads((out / "manifest.json").read_text())
    assert Path(man["best_checkpoint"]).name == good and not stray.exists()


def test_a_relative_out_dir_keeps_its_best_checkpoint(toy, tmp_path, monkeypatch):
    """`gdr run` trains into relative folders (runs/<name>/train-...); Lightning resolves its checkpoint folder,
    so the best checkpoint's path is absolute: the clean-up of stray best-*.ckpt files must not take it for one
    (else make demo fails with `No such file or directory: .../best-15-224.ckpt`)."""
    monkeypatch.chdir(tmp_path)
    assert main(_args(toy, Path("rel") / "run", "trainer.max_steps=5")) == 0
    best = Path(json.loads((tmp_path / "rel" / "run" / "manifest.json").read_text())["best_checkpoint"])
    assert (tmp_path / "rel" / "run" / "checkpoints" / best.name).is_file()
    assert (tmp_path / "rel" / "run" / "model").is_dir()


def test_a_full_disk_while_checkpointing_leaves_no_truncated_checkpoint(toy, tmp_path, capsys, monkeypatch):
    """A full disk leaves no truncated best-*.ckpt to be recorded as a good artifact. Simulated where
    each writer meets it: Lightning's move from /tmp (a copy, cut short) and a write in place (its flush)."""
    out = tmp_path / "run"
    args = _args(toy, out, "trainer.max_steps=6")  # validation at step 5 writes the first best checkpoint
    real_fsync = os.fsync

    def rename(a, b, **kw):
        raise OSError(errno.EXDEV, "Invalid cross-device link", str(a), None, str(b))

    def sendfile(*a):
        raise OSError(errno.ENOSPC, "No space left on device")

    def fsync(fd):
        if "best-" in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_fsync(fd)

    with monkeypatch.context() as m:
        m.setattr(os, "rename", rename)
        m.setattr(os, "sendfile", sendfile)
        m.setattr(os, "fsync", fsync)
        assert main(args) == 2
    line = _one_line(capsys)
    assert "no space left on the device" in line and "best-" in line, line
    ckpts = list((out / "checkpoints").glob("*.ckpt"))
    assert all(_loads(p) for p in ckpts), [(p.name, p.stat().st_size) for p in ckpts]
    assert not list((out / "checkpoints").glob(".*.tmp"))
    assert main(args) == 0
    man = json.loads((out / "manifest.json").read_text())
    assert all(_loads(p) for p in (out / "checkpoints").glob("*.ckpt")) and _loads(Path(man["best_checkpoint"]))


def test_a_full_disk_inside_a_checkpoint_write_is_one_line_with_the_space_needed(toy, tmp_path, capsys, monkeypatch):
    """The disk fills up while torch writes a checkpoint: torch raises a RuntimeError (`enforce fail at
    inline_container.cc`) from the OSError; gdr train turns it into one line naming the space needed, not a
    77-line traceback and exit 1."""
    from test_disk_full import fill_disk_for

    out = tmp_path / "run"
    args = _args(toy, out, "trainer.max_steps=6")
    with monkeypatch.context() as m:
        fill_disk_for(m, ".ckpt.")  # the temporary file of each checkpoint write
        assert main(args) == 2
    line = _one_line(capsys)
    assert re.fullmatch(rf"gdr train: error: cannot write {re.escape(str(out))}/checkpoints/\S+\.ckpt \(no space left "
                        r"on the device: it needs [\d.]+ (KiB|MiB), [\d.]+ \w+ free\); free space on that disk or "
                        r"choose another out_dir= on a disk with room, then rerun the same command to resume",
                        line), line
    assert not list((out / "checkpoints").glob("*.ckpt")) and not list((out / "checkpoints").glob(".*.tmp"))
    assert main(args) == 0
    assert _loads(Path(json.loads((out / "manifest.json").read_text())["best_checkpoint"]))


# ----------------------------------------------------------------------------------- one writer per folder
def test_train_retriever_takes_the_folder_lock(toy, tmp_path):
    """train_retriever takes the folder's lock as `gdr train` does, so a script and `gdr train out_dir=<same>`
    never write one folder together."""
    from gdr import guard

    root, folder, tok = toy
    out = tmp_path / "run"
    out.mkdir()
    code = ("import sys, time; from gdr import guard; guard.lock_folder(sys.argv[1], 'out_dir', 'gdr train'); "
            "print('held', flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(out)], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert proc.stdout.readline().strip() == "held"
        with pytest.raises(guard.FolderBusy, match=rf"out_dir={out}: in use by another gdr process, pid \d+ \(gdr "):
            gdr.train_retriever(gdr.load_corpus(str(folder)), root / "docids.tsv", out, size="tiny",
                                model={"tokenizer": tok}, trainer={"max_steps": 3, "batch_size": 16})
        assert sorted(p.name for p in out.iterdir()) == [".gdr.lock"]
    finally:
        proc.kill()
        proc.wait()
