"""Fault injection on a finished tiny `gdr run`: damaged artifacts are found, named and rebuilt, and kill -9
at a stage boundary or inside sampling, scoring and training resumes; the last JSON line always equals the
undamaged run's (tiny random-init models, CPU)."""
from __future__ import annotations

import json
import logging
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from test_pipeline import _args, setup  # noqa: F401  (the module fixture: a tiny LM and a 30-document corpus)

from gdr.cli import main
from gdr.io import file_digest

pytestmark = pytest.mark.cost(seconds=27)  # the file's tests in all, fast lane, 2 cores: dealt first

HERE = Path(__file__).parent
# gc reads P, bmi reads the generated queries: every kind of stage, the smallest run that has them all
EXTRA = ("indexers=[gc,bmi]", "score.shard_size=8", "train.trainer.checkpoint_every_n_steps=2", "plot=false")


def _run(root, folder, out, capsys, caplog, *more: str) -> tuple[dict, str]:
    caplog.clear()
    with caplog.at_level(logging.INFO):
        assert main(_args(root, folder, out, *EXTRA, *more)) == 0
    head = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    head.pop("seconds")
    return head, caplog.text


def _stages(out: Path) -> dict[str, dict]:
    return {s["name"]: s for s in json.loads((out / "report.json").read_text())["stages"]}


@pytest.fixture(scope="module")
def finished(setup, tmp_path_factory):  # noqa: F811
    """An undamaged finished run (kept pristine: each test damages a copy) and its last JSON line."""
    root, folder = setup
    out = tmp_path_factory.mktemp("faults") / "ref"
    logging.getLogger().setLevel(logging.WARNING)
    assert main(_args(root, folder, out, *EXTRA)) == 0
    report = json.loads((out / "report.json").read_text())
    from gdr.stages.report import headline

    head = headline(report)
    head.pop("seconds")
    return root, folder, out, head


def _folder(out: Path, stage: str) -> Path:
    return out / _stages(out)[stage]["folder"]


def _damage(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "truncate":
        path.write_bytes(data[: len(data) // 2])
    elif how == "bitflip":
        i = len(data) - 3  # in the data, past any header
        path.write_bytes(data[:i] + bytes([data[i] ^ 0x01]) + data[i + 1:])
    elif how == "delete_line":
        lines = data.splitlines(keepends=True)
        path.write_bytes(b"".join(lines[:1] + lines[2:]))
    elif how == "duplicate_line":
        lines = data.splitlines(keepends=True)
        path.write_bytes(b"".join(lines + lines[-1:]))
    elif how == "break_line":
        lines = data.splitlines(keepends=True)
        path.write_bytes(b"".join(lines[:1] + [lines[1][:7] + b"\n"] + lines[2:]))
    elif how == "delete":
        path.unlink()
    else:
        raise ValueError(how)


# (stage, file in its folder, damage, byte-equal to the undamaged file after the rerun)
CASES = [
    ("score", "P.npy", "truncate", True),            # the lost rows re-scored, never zero-filled
    ("score", "P.npy", "bitflip", True),             # one shard re-scored
    ("score", "P.shards/00002.done", "delete", True),
    ("score", "queries.jsonl", "break_line", True),  # re-sampled: an edited line cannot restore what P scored
    ("score", "queries.jsonl", "delete_line", True),
    ("doc-queries", "doc_queries.jsonl", "duplicate_line", True),
    ("index-gc", "docids.tsv", "duplicate_line", True),  # a document twice
    ("index-gc", "tree_state.npz", "truncate", False),  # np.savez stamps the time
    ("index-bmi", "stage.json", "truncate", False),
    ("index-gc", "stage.json", "delete", False),  # rebuilt, the lost file named in the one line
    ("train-gc-s0", "model/model.pt", "bitflip", False),
    ("train-bmi-s0", "checkpoints/last.ckpt", "delete", False),
    ("eval-bmi-s0", "run.trec", "bitflip", True),
    ("bm25", "bm25.trec", "delete_line", True),
]


@pytest.mark.parametrize("stage,name,how,same_bytes", CASES, ids=[f"{c[1]}-{c[2]}" for c in CASES])
def test_damaged_artifact_is_named_and_rebuilt(finished, tmp_path, capsys, caplog, stage, name, how, same_bytes):
    root, folder, ref, head = finished
    out = tmp_path / "run"
    shutil.copytree(ref, out)
    target = _folder(out, stage) / name
    before = file_digest(target)
    _damage(target, how)
    again, logs = _run(root, folder, out, capsys, caplog)
    assert again == head
    assert str(target) in logs  # the one line names the damaged file
    stages = _stages(out)
    assert not stages[stage]["reused"]  # re-run, not trusted
    ran = {n for n, s in stages.items() if not s["reused"]}
    assert ran <= {stage} | {n for n in stages if n.startswith(("train", "eval")) and stage.startswith("train")}
    record = json.loads((_folder(out, stage) / "stage.json").read_text())
    assert record["status"] == "complete"
    if name != "stage.json":
        now = file_digest(target)
        assert record["artifacts"][name] == now  # the record describes the rebuilt file
        if same_bytes:
            assert now == before


def test_several_damaged_files_in_one_stage_are_all_repaired(finished, tmp_path, capsys, caplog):
    root, folder, ref, head = finished
    out = tmp_path / "run"
    shutil.copytree(ref, out)
    score = _folder(out, "score")
    before = {n: file_digest(score / n) for n in ("P.npy", "queries.jsonl")}
    _damage(score / "P.npy", "truncate")
    _damage(score / "queries.jsonl", "break_line")
    again, logs = _run(root, folder, out, capsys, caplog)
    assert again == head
    assert str(score / "P.npy") in logs, [ln for ln in logs.splitlines() if "WARN" in ln]
    assert f"{score / 'queries.jsonl'}" in logs and "re-sampling" in logs
    assert {n: file_digest(score / n) for n in before} == before


def test_upstream_rebuilt_with_other_content_reruns_dependents(finished, tmp_path, capsys, caplog):
    """A stage whose upstream now holds other content (as after a rebuild that came out differently) re-runs,
    and so do the stages after it; stages on unchanged upstreams are reused."""
    root, folder, ref, head = finished
    out = tmp_path / "run"
    shutil.copytree(ref, out)
    idx = _folder(out, "index-gc")
    lines = (idx / "docids.tsv").read_text().splitlines(keepends=True)
    (d0, c0), (d1, c1) = (ln.rstrip("\n").split("\t") for ln in lines[:2])
    (idx / "docids.tsv").write_text(f"{d0}\t{c1}\n{d1}\t{c0}\n" + "".join(lines[2:]))  # two codes swapped
    from gdr.io import record_files, refresh_manifest_files

    refresh_manifest_files(idx)
    marker = json.loads((idx / "stage.json").read_text())
    marker["artifacts"] = record_files(idx, exclude=("stage.json",))  # index-gc itself looks intact
    (idx / "stage.json").write_text(json.dumps(marker))
    _run(root, folder, out, capsys, caplog)
    ran = {n for n, s in _stages(out).items() if not s["reused"]}
    assert ran == {"train-gc-s0", "eval-gc-s0"}, ran
    assert f"upstream stage {idx.name} changed" in caplog.text


def _older_version_copy(ref: Path, out: Path) -> Path:
    """A copy of the finished run ``ref`` whose stage.json files and P run manifests are as an older gdr wrote them
    (format 0, stage.json without checksums)."""
    shutil.copytree(ref, out)
    for marker in out.glob("*/stage.json"):
        m = json.loads(marker.read_text())
        del m["artifacts"], m["upstream"], m["format"]
        marker.write_text(json.dumps(m))
    for manifest in out.glob("*/*.manifest.json"):
        m = json.loads(manifest.read_text())
        m.pop("format", None)
        manifest.write_text(json.dumps(m))
    return out


def test_run_of_an_older_version_is_checked_then_adopted(finished, tmp_path, capsys, caplog):
    """stage.json without checksums and empty shard markers (older gdr), with the zero rows an older gdr left
    after re-entering a truncated P: the upgrade at open finds the zeros, they are re-scored and the stages built
    on that P are built again; the stages not built on it are kept and their checksums recorded."""
    root, folder, ref, head = finished
    out = _older_version_copy(ref, tmp_path / "run")
    score = _folder(out, "score")
    for m in (score / "P.shards").glob("*.done"):
        m.write_text("")
    for name in ("P.manifest.json", "queries.manifest.json"):
        m = json.loads((score / name).read_text())
        del m["file"]
        (score / name).write_text(json.dumps(m))
    P = np.load(score / "P.npy", mmap_mode="r+")
    good = P.copy()
    P[-3:] = 0.0
    P.flush()
    del P
    again, logs = _run(root, folder, out, capsys, caplog)
    assert again == head
    assert np.array_equal(np.load(score / "P.npy"), good)
    assert f"{score / 'P.npy'}: holds zeros" in logs
    rebuilt = {n for n, s in _stages(out).items() if not s["reused"]}
    assert "score" in rebuilt and "doc-queries" not in rebuilt and "index-gc" in rebuilt, rebuilt
    assert all("artifacts" in json.loads(p.read_text()) for p in out.glob("*/stage.json"))


def test_a_lost_stage_json_and_a_damaged_doc_queries_file_are_redone(finished, tmp_path, capsys, caplog):
    """With the doc-queries stage.json deleted and a line of doc_queries.jsonl gone, `gdr run` re-samples the
    stage itself, with one line naming the damage (not an exit 2 asking the user to run the advice)."""
    root, folder, ref, head = finished
    out = tmp_path / "run"
    shutil.copytree(ref, out)
    dq = _folder(out, "doc-queries")
    before = file_digest(dq / "doc_queries.jsonl")
    _damage(dq / "stage.json", "delete")
    _damage(dq / "doc_queries.jsonl", "delete_line")
    again, logs = _run(root, folder, out, capsys, caplog)
    assert again == head
    assert f"{dq / 'doc_queries.jsonl'}: " in logs and "re-sampling" in logs
    assert file_digest(dq / "doc_queries.jsonl") == before


def test_p_repaired_by_hand_is_not_scored_again_by_run(finished, tmp_path, capsys, caplog):
    """A truncated P repaired as a user does it: `gdr score` repairs a truncated P in a stage folder (rewriting its
    manifest), then `gdr run` re-checks that stage and keeps every shard whose rows match their checksum."""
    root, folder, ref, head = finished
    out = tmp_path / "run"
    shutil.copytree(ref, out)
    score = _folder(out, "score")
    good = np.load(score / "P.npy")
    man = json.loads((score / "P.manifest.json").read_text())
    man["repaired_by"] = "gdr score"  # what a hand-run `gdr score` does to the manifest: rewrites it
    (score / "P.manifest.json").write_text(json.dumps(man))
    again, logs = _run(root, folder, out, capsys, caplog)
    assert again == head
    assert "P.manifest.json" in logs and "0 left" in logs  # the stage re-ran, no shard was scored again
    assert np.array_equal(np.load(score / "P.npy"), good)


def test_p_manifest_of_other_settings_is_scored_again_by_run(finished, tmp_path, capsys, caplog):
    root, folder, ref, head = finished
    out = tmp_path / "run"
    shutil.copytree(ref, out)
    score = _folder(out, "score")
    man = json.loads((score / "P.manifest.json").read_text())
    man["shard_size"] += 1  # a damaged value: the folder's key says which settings it holds
    (score / "P.manifest.json").write_text(json.dumps(man))
    again, logs = _run(root, folder, out, capsys, caplog)
    assert again == head
    assert "disagrees with this stage's settings; scoring P again" in logs


def _signalled_at(point: str, sig: int, argv: list[str], tmp_path: Path, command: str = "run") -> tuple[int, str]:
    """Start ``gdr <command> argv`` (tests/run_script.py), send ``sig`` once it reaches ``point``; returns its
    exit code and its stderr. How promptly it stopped is counted, not timed (:func:`_stop`): the wait for its exit
    only bounds a hang."""
    ready = tmp_path / f"ready-{point.replace(':', '-')}"
    for f in (ready, Path(f"{ready}.after"), Path(f"{ready}.stop")):
        f.unlink(missing_ok=True)
    env = dict(os.environ, GDR_TEST_PAUSE=point, GDR_TEST_READY=str(ready), GDR_TEST_COMMAND=command,
               PYTHONPATH=os.pathsep.join([str(HERE), *sys.path]))
    proc = subprocess.Popen([sys.executable, str(HERE / "run_script.py"), *argv], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 300
    while not ready.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(sig)
    try:
        _, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert ready.exists(), f"never reached {point}: {err.decode()[-2000:]}"
    return proc.returncode, err.decode()


def _stop(point: str, tmp_path: Path) -> tuple[list[int], str | None]:
    """What the process signalled at ``point`` did after the signal (tests/run_script.py): the steps of the batch
    ends that went on training after it, and how a pause ended (``at once`` or ``deferred``; None: not paused)."""
    ready = tmp_path / f"ready-{point.replace(':', '-')}"
    after, stop = Path(f"{ready}.after"), Path(f"{ready}.stop")
    return ([int(x) for x in after.read_text().split()] if after.exists() else [],
            stop.read_text() if stop.exists() else None)


def _killed_at(point: str, root, folder, out: Path, tmp_path: Path) -> None:
    _signalled_at(point, signal.SIGKILL, _args(root, folder, out, *EXTRA)[1:], tmp_path)


@pytest.mark.slow(seconds=45)
def test_kill_9_at_a_boundary_and_inside_each_stage_resumes_to_the_same_result(finished, tmp_path, capsys, caplog):
    root, folder, ref, head = finished
    out = tmp_path / "run"
    for point in ("sample", "score", "stage:score", "train"):
        _killed_at(point, root, folder, out, tmp_path)
    running = [json.loads(p.read_text())["stage"] for p in out.glob("*/stage.json")
               if json.loads(p.read_text())["status"] == "running"]
    assert len(running) == 1 and running[0].startswith("train-"), running  # the last kill was inside training
    again, _ = _run(root, folder, out, capsys, caplog)
    assert again == head
    for stage, name in (("score", "P.npy"), ("score", "queries.jsonl"), ("index-gc", "docids.tsv"),
                        ("doc-queries", "doc_queries.jsonl")):
        assert file_digest(_folder(out, stage) / name) == file_digest(_folder(ref, stage) / name)
    # every retriever, the one killed inside its training and those trained after the kills, has the unbroken
    # run's bytes: nothing earlier in the process (or its absence after a kill) changes a retriever
    trains = [s for s in _stages(ref) if s.startswith("train-")]
    assert trains
    for stage in trains:
        assert file_digest(_folder(out, stage) / "model" / "model.pt") == \
            file_digest(_folder(ref, stage) / "model" / "model.pt"), stage


@pytest.mark.parametrize("command", ["train", "evaluate"])
def test_docids_with_a_doc_twice_or_a_shared_code_are_refused(finished, tmp_path, capsys, command):
    """A docids.tsv with two lines for one document (or one code for two) is refused by every reader,
    `gdr train` included, rather than one line silently winning."""
    root, folder, ref, _ = finished
    idx, tr = _folder(ref, "index-gc"), _folder(ref, "train-gc-s0")
    lines = (idx / "docids.tsv").read_text().splitlines(keepends=True)
    doc, code = lines[0].rstrip("\n").split("\t")
    other = lines[1].split("\t")[1].rstrip("\n")
    for extra, want in ((f"{doc}\t0-0-0-0-0\n", f"doc id '{doc}' is also on line 1"),
                        (f"d999\t{code}\n", f"code '{code}' of 'd999' is also the code of '{doc}' on line 1"),
                        (f"{lines[1].split(chr(9))[0]}x\t{other}\n", "is also the code of")):
        if command == "train":
            bad = tmp_path / "docids.tsv"
            bad.write_text("".join(lines) + extra)
            argv = ["train", f"data.name={folder}", f"docids={bad}", "model.size=tiny", f"out_dir={tmp_path / 't'}"]
            assert main(argv) == 2
            assert not (tmp_path / "t").exists()  # refused before out_dir is made (no config.yaml left behind)
            capsys.readouterr()
        else:
            run = tmp_path / "tr"
            shutil.rmtree(run, ignore_errors=True)
            shutil.copytree(tr, run)
            (run / "docids.tsv").write_text("".join(lines) + extra)
            argv = ["evaluate", f"data.name={folder}", f"run_dir={run}", f"out_dir={tmp_path / 'e'}",
                    "queries.name=" + str(folder)]
            # the train folder's manifest recorded docids.tsv: the change itself is found first
            assert main(argv) == 2
            err = capsys.readouterr().err.strip().splitlines()
            assert len(err) == 1 and "docids.tsv: size" in err[0] and "retrain" in err[0], err
            man = json.loads((run / "manifest.json").read_text())
            del man["files"]  # a folder without that record (another tool, an older gdr): the lines are checked
            (run / "manifest.json").write_text(json.dumps(man))
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"docids.tsv:{len(lines) + 1}: " in err[0] and want in err[0], err


def test_integrity_bench_verifies_a_finished_run(finished, capsys):
    from gdr.bench.integrity import main as bench

    _, _, ref, _ = finished
    assert bench(["--mb", "1", "--repeats", "1", "--run", str(ref)]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["gib_per_s"] > 0 and 0 < res["bytes_hashed"] <= res["bytes_total"]


# ----------------------------------------------------------------------------------- SIGTERM / SIGINT
def _last_line(err: str) -> str:
    return err.strip().splitlines()[-1]


@pytest.mark.slow
def test_sigterm_during_training_stops_with_one_line_and_a_resume_point(finished, tmp_path, capsys, caplog):
    """SIGTERM while `gdr run` trains (a scheduler's preemption): exit 143 within seconds, one line naming the
    stage, last.ckpt written at the batch the signal came in, the report never looking current (the bmi retriever
    of the earlier attempt is taken in first, so it is this run's report, marked partial: 1 of 2 retrievers); the
    rerun resumes from that checkpoint to the same result."""
    root, folder, ref, head = finished
    out = tmp_path / "run"
    shutil.copytree(ref, out)
    shutil.rmtree(_folder(out, "train-gc-s0"))  # as `rm -rf r/train-gc*` does: training starts afresh
    rc, err = _signalled_at("train-slow", signal.SIGTERM, _args(root, folder, out, *EXTRA)[1:], tmp_path)
    assert rc == 143, err[-2000:]
    assert _last_line(err) == ("gdr run: stopped by SIGTERM in stage train-gc-s0; rerun the same command to "
                               "resume"), err[-2000:]
    assert "Traceback" not in err
    # at the next batch end: the child's grace period is 10 minutes (tests/run_script.py), so only a batch end
    # stops it, with the resume point checked below; at most the batch end the signal landed in goes on
    assert len(_stop("train-slow", tmp_path)[0]) <= 1, _stop("train-slow", tmp_path)
    kept = json.loads((out / "report.json").read_text())
    assert kept["partial"] == {"retrievers_done": 1, "retrievers": 2}, kept
    assert "bmi" in kept["retrieval"] and "gc" not in kept["retrieval"], kept["retrieval"]
    assert "**Partial: 1 of 2 retrievers finished" in (out / "report.md").read_text()
    (train,) = [p for p in out.glob("train-gc-s0-*")
                if json.loads((p / "stage.json").read_text())["status"] == "running"]
    last = train / "checkpoints" / "last.ckpt"
    saved = re.search(rf"stopping on SIGTERM: resume point {re.escape(str(last))} \(step (\d+)\)", err)
    assert saved, err[-2000:]
    import torch

    assert torch.load(last, map_location="cpu", weights_only=False)["global_step"] == int(saved.group(1))
    again, logs = _run(root, folder, out, capsys, caplog)
    assert again == head  # resumed from the signal's checkpoint to the uninterrupted result
    assert f"resuming from {last}" in logs


@pytest.mark.parametrize("point,sig", [("sample", signal.SIGTERM), ("stage:score", signal.SIGINT)])
@pytest.mark.slow
def test_a_signal_while_sampling_or_between_stages_stops_with_one_line(finished, tmp_path, point, sig):
    root, folder, _, _ = finished
    out = tmp_path / "run"
    rc, err = _signalled_at(point, sig, _args(root, folder, out, *EXTRA)[1:], tmp_path)
    name = signal.Signals(sig).name
    assert rc == 128 + sig, err[-2000:]
    assert _last_line(err).startswith(f"gdr run: stopped by {name}") and \
        _last_line(err).endswith("; rerun the same command to resume"), err[-2000:]
    assert "Traceback" not in err and _stop(point, tmp_path)[1] == "at once", _stop(point, tmp_path)


def test_a_stop_whose_raise_python_dropped_in_a_stage_starts_no_later_stage(tmp_path, monkeypatch):
    """A SIGTERM handled while a stage's build runs a ``__del__`` (Python drops the raise there and goes on): the
    stage finishes, and the next one is refused at its start with :class:`Stopped`, its build never run."""
    from gdr import guard, signals
    from gdr.pipeline import Pipeline

    class StopInFinaliser:
        def __del__(self):
            signal.raise_signal(signal.SIGTERM)

    dropped, built = [], []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: dropped.append(u.exc_type))

    def first(folder):
        StopInFinaliser()
        built.append("first")

    signals.install()
    try:
        pipe = Pipeline(tmp_path / "run")
        assert not pipe.stage("first", {}, first).reused
        with pytest.raises(signals.Stopped):
            pipe.stage("second", {}, lambda folder: built.append("second"))
    finally:
        signals.uninstall()
        guard.release_all()
    assert dropped == [signals.Stopped] and built == ["first"]


@pytest.mark.slow
def test_sigint_during_gdr_train_stops_with_one_line(finished, tmp_path):
    """Ctrl-C during `gdr train` exits 130 (not Lightning's own exit 1) with the one line and a resume point."""
    root, folder, ref, _ = finished
    out = tmp_path / "t"
    argv = [f"data.name={folder}", f"docids={_folder(ref, 'index-gc') / 'docids.tsv'}", "model.size=tiny",
            "trainer.max_steps=60", "trainer.max_epochs=100", "trainer.batch_size=16", "trainer.tensorboard=false",
            "trainer.enable_progress_bar=false", "trainer.checkpoint_every_n_steps=2", "trainer.num_sanity_val_steps=0",
            "trainer.check_val_every_n_epoch=50", f"out_dir={out}"]
    rc, err = _signalled_at("train-slow", signal.SIGINT, argv, tmp_path, command="train")
    assert rc == 130, err[-2000:]
    assert _last_line(err) == "gdr train: stopped by SIGINT; rerun the same command to resume", err[-2000:]
    assert len(_stop("train-slow", tmp_path)[0]) <= 1, _stop("train-slow", tmp_path)  # at the next batch end
    assert (out / "checkpoints" / "last.ckpt").is_file() and not (out / "model").exists()


# ----------------------------------------------------------------------------------- checked first, advice works
@pytest.mark.parametrize("line,want", [("q0\td999\t1", "corpus-id 'd999' is not in the corpus"),
                                       ("q999\td0\t1", "query-id 'q999' is not in queries.jsonl")])
def test_a_bad_qrels_line_is_refused_before_the_first_stage(setup, tmp_path, capsys, monkeypatch, line,  # noqa: F811
                                                            want):
    """A qrels/test.tsv line naming an unknown document or query is refused before any stage starts and before the
    query generator loads, not at the bm25 stage after scoring and indexing."""
    root, folder = setup
    bad = tmp_path / "toy"
    shutil.copytree(folder, bad)
    qrels = bad / "qrels" / "test.tsv"
    n = len(qrels.read_text().splitlines()) + 1
    with open(qrels, "a") as f:
        f.write(line + "\n")
    out = tmp_path / "run"
    loads = []  # the LM loads before the refusal: none (the corpus and the queries are read: they are what is checked)
    monkeypatch.setattr("gdr.lm.GenerativeLM.__init__", lambda *a, **k: loads.append("GenerativeLM"))
    monkeypatch.setattr("transformers.AutoModelForCausalLM.from_pretrained",
                        lambda *a, **k: loads.append("from_pretrained"))
    assert main(_args(root, bad, out, *EXTRA)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"gdr run: error: {qrels}:{n}: ") and want in err[0], err
    assert loads == [] and not list(out.glob("*/stage.json"))


def test_an_older_run_with_a_damaged_model_is_rebuilt_not_adopted(finished, tmp_path, capsys, caplog):
    """A stage folder of an older gdr (stage.json without checksums) with a damaged model.pt is rebuilt, not
    recorded as good (every rerun would stop at evaluation): the train folder's own manifest is checked."""
    root, folder, ref, head = finished
    out = _older_version_copy(ref, tmp_path / "run")
    target = _folder(out, "train-gc-s0") / "model" / "model.pt"
    _damage(target, "bitflip")
    again, logs = _run(root, folder, out, capsys, caplog)
    assert again == head
    assert f"{target}: " in logs, [ln for ln in logs.splitlines() if "WARN" in ln]
    assert "train-gc-s0" in {n for n, s in _stages(out).items() if not s["reused"]}


def test_the_advised_retrain_command_works_as_printed(finished, tmp_path, capsys):
    """`gdr evaluate` on a train folder with a damaged model advises the whole `gdr train` command, from the
    folder's saved config (a bare `gdr train out_dir=<folder>` fails with `docids=???`), and it runs."""
    root, folder, ref, _ = finished
    run = tmp_path / "tr"
    shutil.copytree(_folder(ref, "train-gc-s0"), run)
    _damage(run / "model" / "model.pt", "bitflip")
    argv = ["evaluate", f"data.name={folder}", f"run_dir={run}", f"out_dir={tmp_path / 'e'}", f"queries.name={folder}"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "model.pt" in err[0], err
    cmd = re.search(r"retrain with `([^`]+)`", err[0]).group(1)
    assert cmd.startswith("gdr train ") and f"out_dir={run}" in cmd
    assert main(shlex.split(cmd)[1:]) == 0
    assert main(argv) == 0


def test_the_advised_resample_command_works_as_printed(finished, tmp_path, capsys):
    """The advice is the command that sampled the file (not `gdr sample sample.per_doc=N out=...`, a literal N
    with the corpus and model left out), and the files to delete are all named."""
    from gdr.training.data import read_generated_queries

    root, folder, ref, _ = finished
    dq = tmp_path / "dq"
    shutil.copytree(_folder(ref, "doc-queries"), dq)
    good = (dq / "doc_queries.jsonl").read_bytes()
    _damage(dq / "doc_queries.jsonl", "duplicate_line")
    doc_ids = [f"d{i}" for i in range(30)]
    with pytest.raises(ValueError) as e:
        read_generated_queries(dq / "doc_queries.jsonl", doc_ids)
    m = re.search(r"re-sample: delete (\S+) and (\S+), then run `([^`]+)`", str(e.value))
    assert m, str(e.value)
    for f in m.group(1, 2):
        Path(f).unlink()
    assert main(shlex.split(m.group(3))[1:]) == 0
    read_generated_queries(dq / "doc_queries.jsonl", doc_ids)
    assert (dq / "doc_queries.jsonl").read_bytes() == good  # the same seed and settings: the same queries


def test_a_bad_generated_queries_file_is_refused_before_gdr_train_makes_anything(finished, tmp_path, capsys):
    """The generated query file `gdr train` reads is checked with its docids, before out_dir is made."""
    root, folder, ref, _ = finished
    gen = tmp_path / "doc_queries.jsonl"
    lines = (_folder(ref, "doc-queries") / "doc_queries.jsonl").read_text().splitlines(keepends=True)
    gen.write_text("".join(lines + lines[-1:]))  # a copy without its manifest: the lines are checked
    argv = ["train", f"data.name={folder}", f"docids={_folder(ref, 'index-gc') / 'docids.tsv'}", f"generated={gen}",
            "model.size=tiny", f"out_dir={tmp_path / 't'}"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{gen}:{len(lines) + 1}: doc id" in err[0] and "also on line" in err[0], err
    assert not (tmp_path / "t").exists()
