"""`gdr run` that pauses at one point so a test can SIGKILL it there (used by tests/test_faults.py).

Environment: ``GDR_TEST_PAUSE`` is ``sample`` (after the first checkpoint of the sampled queries),
``score`` (after the first finished shard), ``train`` (after the first ``last.ckpt``), ``report:partial`` (after
the first partial report, which follows the first finished retriever) or ``stage:<name>`` (right after stage
``<name>`` is marked complete); ``GDR_TEST_READY`` is a file touched when the process
reaches that point (then it sleeps until killed). ``train-slow`` does not stop there: it touches the file
after the first ``last.ckpt`` and goes on training with every batch slowed to 0.2 s, so a signal lands
in the middle of training; its grace period (:func:`gdr.signals.deferred`) is 10 minutes, so that only the
batch end can stop it (a stop by the grace timer would outlast the test's wait). Arguments: those of
``gdr run``, or of ``gdr $GDR_TEST_COMMAND`` when set.

What a test counts of the stop, in files beside ``GDR_TEST_READY``: ``<ready>.after`` (``train-slow``) one line,
the global step, per batch end that came after the signal and did not stop (a prompt stop: none, or one when the
signal landed inside that batch end); ``<ready>.stop`` (the pausing points) how the signal ended the pause: ``at
once`` (raised where it landed) or ``deferred`` (it waited for a safe point, or the grace timer).
"""
import os
import sys
import time
from pathlib import Path


def pause() -> None:
    Path(os.environ["GDR_TEST_READY"]).touch()
    try:
        time.sleep(600)
    except BaseException:
        import gdr.signals as signals

        how = "deferred" if signals.pending() is not None else "at once"
        Path(os.environ["GDR_TEST_READY"] + ".stop").write_text(how)
        raise


def install(point: str) -> None:
    if point == "sample":
        import gdr.stages.sample as sampling

        real_jsonl = sampling.write_jsonl

        def write_jsonl(path, rows):
            real_jsonl(path, rows)
            if Path(path).name == sampling.Q_PARTIAL:
                pause()

        sampling.write_jsonl = write_jsonl
    elif point == "score":
        import gdr.store as store

        real_json = store.atomic_write_json

        def atomic_write_json(path, obj):
            real_json(path, obj)
            if Path(path).suffix == ".done":
                pause()

        store.atomic_write_json = atomic_write_json
    elif point == "train":
        import pytorch_lightning as pl

        real_end = pl.callbacks.ModelCheckpoint.on_train_batch_end

        def on_train_batch_end(self, trainer, *a, **k):
            real_end(self, trainer, *a, **k)
            if self.filename == "last" and (Path(self.dirpath) / "last.ckpt").exists():
                pause()

        pl.callbacks.ModelCheckpoint.on_train_batch_end = on_train_batch_end
    elif point == "train-slow":
        import pytorch_lightning as pl

        import gdr.signals as signals

        real_end = pl.callbacks.ModelCheckpoint.on_train_batch_end

        def on_train_batch_end(self, trainer, *a, **k):
            real_end(self, trainer, *a, **k)
            if self.filename == "last" and (Path(self.dirpath) / "last.ckpt").exists():
                ready = os.environ["GDR_TEST_READY"]
                if signals.received() is not None:  # a batch end after the signal that did not stop training
                    with open(ready + ".after", "a") as f:
                        f.write(f"{trainer.global_step}\n")
                Path(ready).touch()
                time.sleep(0.2)

        pl.callbacks.ModelCheckpoint.on_train_batch_end = on_train_batch_end

        real_deferred = signals.deferred
        signals.deferred = lambda grace_s=10.0: real_deferred(grace_s=600.0)
    elif point == "report:partial":
        import gdr.pipeline as run

        real_report = run._report

        def report(r, partial=None):
            written = real_report(r, partial)
            if partial is not None:
                pause()
            return written

        run._report = report
    elif point.startswith("stage:"):
        import gdr.pipeline as run

        real_stage = run.atomic_write_json

        def stage_json(path, obj):
            real_stage(path, obj)
            if Path(path).name == run.STAGE_FILE and obj.get("status") == "complete" \
                    and obj.get("stage") == point.split(":", 1)[1]:
                pause()

        run.atomic_write_json = stage_json
    else:
        raise SystemExit(f"GDR_TEST_PAUSE={point!r}: unknown point")


if __name__ == "__main__":
    import torch

    from gdr.cli import main

    torch.set_num_threads(1)
    install(os.environ["GDR_TEST_PAUSE"])
    sys.exit(main([os.environ.get("GDR_TEST_COMMAND", "run"), *sys.argv[1:]]))
