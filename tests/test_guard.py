"""One writer per folder, children that die with their parent, output errors as one line (gdr.guard).

Covered: kill -9 of the parent takes its scoring workers with it; a second writer on one folder is refused; an
unwritable folder or a full disk is one line, never a traceback, and report.md / report.json never disagree;
accelerator=gpu without CUDA and out= naming a file are refused before any work."""
from __future__ import annotations

import errno
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
from test_cli_errors import error_of
from test_pipeline import setup  # noqa: F401  (module fixture: a saved tiny LM and a 30-document corpus)

from gdr import guard
from gdr.cli import main

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


@pytest.fixture(autouse=True)
def _release():
    yield
    guard.release_all()


def _env(*front: Path, **extra) -> dict:
    """The environment of a child python: this checkout (and ``front`` folders) first on its path."""
    path = os.pathsep.join(str(p) for p in (*front, ROOT, HERE))
    return dict(os.environ, PYTHONPATH=path, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", **extra)


def _hold(folder: Path) -> subprocess.Popen:
    """Another process that locks ``folder`` the way a command does, then waits."""
    code = textwrap.dedent(f"""
        import sys, time
        from gdr import guard
        guard.claim_folder({str(folder)!r}, "out", "gdr run out={folder}")
        print("locked", flush=True)
        time.sleep(120)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], env=_env(), stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


# ----------------------------------------------------------------------------------- one writer
def test_second_writer_is_refused_and_kill_9_leaves_no_stale_lock(tmp_path, capsys, nothing_loads):
    out = tmp_path / "run"
    holder = _hold(out)
    try:
        for argv in (["sample", f"out={out}"], ["run", f"out={out}"], ["score", f"out={out}"]):
            line = error_of(capsys, argv)
            assert f"out={out}: in use by another gdr process, pid {holder.pid} (gdr run out={out})" in line, line
        with pytest.raises(guard.FolderBusy):
            guard.claim_folder(out)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert guard.claim_folder(out) == out  # the kernel dropped the dead holder's lock
    assert (out / guard.LOCK_FILE).read_text().split()[0] == str(os.getpid())


def test_lock_is_per_process_and_reentrant(tmp_path):
    """``gdr run`` holds its folder and locks each stage folder inside it: its own process is never refused."""
    from gdr.pipeline import Pipeline, stage_key

    run = tmp_path / "run"
    guard.claim_folder(run)
    guard.claim_folder(run)
    pipe = Pipeline(run)
    rec = pipe.stage("score", {"a": 1}, lambda folder: {"files": len(list(folder.iterdir()))})
    assert rec.path == run / f"score-{stage_key({'a': 1})}" and not rec.reused
    assert Path(rec.path).resolve() in guard._HELD and run.resolve() in guard._HELD
    guard.release_all()
    assert guard._HELD == {}


def test_a_stage_folder_another_process_writes_is_refused(tmp_path):
    """`gdr score out=<run>/score-<key>` running elsewhere: `gdr run` does not write into it too."""
    from gdr.pipeline import Pipeline, stage_key

    run = tmp_path / "run"
    holder = _hold(run / f"score-{stage_key({'a': 1})}")
    try:
        with pytest.raises(guard.FolderBusy, match=f"pid {holder.pid}"):
            Pipeline(run).stage("score", {"a": 1}, lambda folder: pytest.fail("built a stage another process holds"))
    finally:
        holder.kill()
        holder.wait()


def test_ranks_of_a_launched_job_do_not_lock(tmp_path, monkeypatch):
    """torchrun / Lightning ddp start every rank as a copy of the command: rank 0 locks, the others trust it."""
    out = tmp_path / "out"
    holder = _hold(out)  # stands for rank 0 of the same job
    try:
        monkeypatch.setenv("RANK", "1")
        monkeypatch.setattr(guard, "die_with_parent", lambda *a, **k: "prctl")  # not this pytest process
        assert guard.claim_out("score", {"out": str(out)}) == out
        assert out.resolve() not in guard._HELD
        monkeypatch.setenv("RANK", "0")
        with pytest.raises(guard.FolderBusy):
            guard.claim_out("score", {"out": str(out)})
    finally:
        holder.kill()
        holder.wait()


# ----------------------------------------------------------------------------------- children die
@pytest.fixture(scope="module")
def toy(setup):  # noqa: F811
    """test_pipeline's saved tiny causal LM and 30-document BEIR folder."""
    return setup


def _score_args(toy, out: Path, *extra: str) -> list[str]:
    root, folder = toy
    return ["score", f"data.name={folder}", f"model.name={root / 'tiny-llama'}", "model.max_doc_tokens=24",
            "sample.n_queries=8", "sample.max_new_tokens=6", "score.shard_size=2", "progress=false", "threads=1",
            f"out={out}", *extra]


def _slow_scoring(toy, out: Path, **popen) -> subprocess.Popen:
    """`gdr score` with 2 scoring processes slowed down per batch (workers still busy when the test strikes),
    in a session of its own."""
    cmd = [sys.executable, "-m", "gdr.cli", *_score_args(toy, out, "score.processes=2")]
    env = _env(HERE / "slow_scoring", GDR_TEST_SCORE_DELAY="0.4")
    return subprocess.Popen(cmd, env=env, start_new_session=True, **popen)


def _after_first_shard(proc: subprocess.Popen, parent, out: Path) -> list:
    """Waits until the first shard of ``out`` is finished (the job still running); returns the job's processes."""
    deadline = time.time() + 120
    while time.time() < deadline and not list((out / "P.shards").glob("*.done")):
        assert proc.poll() is None, "gdr score ended before the test struck"
        time.sleep(0.05)
    return parent.children(recursive=True)


@pytest.mark.slow(seconds=20)
def test_kill_9_of_the_parent_kills_its_scoring_workers(toy, tmp_path):
    """kill -9 of gdr during scoring with score.processes=2 takes both workers (and the resource tracker) with
    it, so nothing keeps writing into the folder, and a rerun's P equals an uninterrupted run's."""
    out = tmp_path / "killed"
    proc = _slow_scoring(toy, out, stderr=subprocess.DEVNULL)
    group = proc.pid
    try:
        parent = psutil.Process(proc.pid)
        children = _after_first_shard(proc, parent, out)
        workers = [c for c in children if "multiprocessing.spawn" in " ".join(c.cmdline())]
        assert len(workers) == 2, [c.cmdline() for c in children]
        parent.send_signal(signal.SIGKILL)
        proc.wait()
        gone, alive = psutil.wait_procs(children, timeout=10)
        assert alive == [], [(c.pid, c.cmdline()) for c in alive]  # workers and the resource tracker
    finally:
        try:
            os.killpg(group, signal.SIGKILL)  # whatever is left of the test's own process group
        except ProcessLookupError:
            pass
    n_done = len(list((out / "P.shards").glob("*.done")))
    assert 1 <= n_done < 15, n_done  # killed in the middle of scoring
    assert json.loads((out / "P.manifest.json").read_text())["status"] == "running"
    ref = tmp_path / "ref"
    assert main(_score_args(toy, ref)) == 0
    assert main(_score_args(toy, out)) == 0  # resumes the finished shards
    assert np.array_equal(np.load(ref / "P.npy"), np.load(out / "P.npy"))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
@pytest.mark.slow(seconds=20)
def test_a_signal_to_the_process_group_during_scoring_stops_every_process(toy, tmp_path, sig):
    """SIGTERM to the whole job (a scheduler) or Ctrl-C (SIGINT to the terminal's process group)
    while score.processes=2 workers score: the parent prints one line and exits 143 / 130, no worker prints
    a traceback or outlives it, and the rerun resumes from the finished shards."""
    out = tmp_path / "stopped"
    proc = _slow_scoring(toy, out, stderr=subprocess.PIPE, text=True)
    try:
        parent = psutil.Process(proc.pid)
        children = _after_first_shard(proc, parent, out)
        done_at_signal = len(list((out / "P.shards").glob("*.done")))
        os.killpg(proc.pid, sig)
        _, err = proc.communicate(timeout=300)  # a hang's bound: how promptly it stopped is counted below
        gone, alive = psutil.wait_procs(children, timeout=10)
        assert alive == [], [(c.pid, c.cmdline()) for c in alive]
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    name = signal.Signals(sig).name
    assert proc.returncode == 128 + sig, err[-2000:]
    # the last line gdr writes (multiprocessing's resource tracker may warn after it, about a worker's semaphore)
    gdr_lines = [ln for ln in err.strip().splitlines() if ln.startswith("gdr ")]
    assert gdr_lines[-1:] == [f"gdr score: stopped by {name}; rerun the same command to resume"], err
    assert "Traceback" not in err, err[-2000:]
    # stopped where it was: no shard begun after the signal is finished (at most each worker's shard in flight,
    # of the 15 the corpus has; each score call is slowed by 0.4 s, so going on would finish them all)
    done = len(list((out / "P.shards").glob("*.done")))
    assert done - done_at_signal <= 2 and done < 15, (done_at_signal, done)
    assert main(_score_args(toy, out)) == 0  # resumes the finished shards
    assert (out / "P.npy").is_file()


def test_the_advised_rescore_command_works_as_printed(toy, tmp_path, capsys):
    """The advice for a damaged P is the command that scored the folder (a bare `gdr score out=<folder>` would
    compose the default corpus and model and be refused), and it repairs P as printed."""
    out = tmp_path / "scored"
    assert main(_score_args(toy, out)) == 0
    capsys.readouterr()
    data = (out / "P.npy").read_bytes()
    (out / "P.npy").write_bytes(data[: len(data) // 2])
    index = ["index", "method=gc", f"run={out}", f"out={tmp_path / 'idx'}", "n_clusters=4", "leaf_size=4",
             "gc.n_init=1"]
    line = error_of(capsys, index)
    cmd = re.search(r"run `(gdr score [^`]+)`", line)
    assert cmd, line
    assert main(shlex.split(cmd.group(1))[1:]) == 0
    assert (out / "P.npy").read_bytes() == data
    assert main(index) == 0


def test_the_empty_text_advice_is_an_override_that_works(toy, tmp_path, capsys):
    """The empty-text error gives an override that works on the command line as printed, whatever the data group
    (not the Python spelling `on_empty='drop'`)."""
    root, folder = toy
    bad = tmp_path / "toy"
    shutil.copytree(folder, bad)
    with open(bad / "corpus.jsonl", "a") as f:
        f.write('{"_id": "dx", "title": "", "text": ""}\n')
    argv = _score_args((root, bad), tmp_path / "out", "sample.n_queries=2")
    line = error_of(capsys, argv)
    assert "document 'dx' has empty text" in line and "on_empty='drop'" not in line.split("(in Python")[0], line
    override = re.search(r"add (\S+) to the command", line).group(1)
    assert main([*argv, override]) == 0
    assert len(json.loads((tmp_path / "out" / "doc_ids.json").read_text())) == 30


def test_a_full_disk_while_moving_a_file_in_names_the_destination(tmp_path, monkeypatch):
    """Lightning writes a checkpoint to a temporary file (/tmp/tmpXXXX) and moves it into the out folder; on a
    full out disk the line names the destination, the file on the full disk, not the temporary file."""
    out = tmp_path / "out"
    guard.claim_folder(out, "out_dir")
    src = tmp_path / "tmpabc123"
    src.write_bytes(b"checkpoint")

    def rename(a, b, **kw):
        raise OSError(errno.EXDEV, "Invalid cross-device link", str(a), None, str(b))

    def sendfile(*a):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "rename", rename)
    monkeypatch.setattr(os, "sendfile", sendfile)
    with pytest.raises(OSError) as e:
        shutil.move(src, out / "last.ckpt")  # what fsspec's commit does
    line = guard.write_error_line(e.value, "train")
    assert line.startswith(f"cannot write {out / 'last.ckpt'} (no space left on the device)"), line
    assert str(src) not in line and "out_dir=" in line


def test_die_with_parent_arms_prctl_or_a_watcher():
    """The worker-side call: PR_SET_PDEATHSIG on Linux (read back with PR_GET_PDEATHSIG), a watcher elsewhere."""
    code = textwrap.dedent("""
        import ctypes, os, signal, sys
        from gdr.guard import die_with_parent
        how = die_with_parent(os.getppid())
        sig = ctypes.c_int(0)
        ctypes.CDLL(None).prctl(2, ctypes.byref(sig), 0, 0, 0)  # PR_GET_PDEATHSIG
        print(how, sig.value)
    """)
    out = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, check=True)
    how, sig = out.stdout.split()
    if sys.platform.startswith("linux"):
        assert (how, int(sig)) == ("prctl", int(signal.SIGKILL))
    else:
        assert how == "watch"


# ----------------------------------------------------------------------------------- output errors
def _unwritable(folder: Path, monkeypatch) -> callable:
    """Make ``folder`` unwritable for this process: chmod for a user; as root (whom chmod does not stop)
    chattr +i, else a probe that fails as EACCES would. Returns the undo."""
    folder.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        folder.chmod(0o555)
        return lambda: folder.chmod(0o755)
    if subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode == 0:
        return lambda: subprocess.run(["chattr", "-i", str(folder)], check=True)
    real = guard.tempfile.mkstemp

    def mkstemp(*args, dir=None, **kwargs):
        if dir is not None and Path(dir).resolve() == folder.resolve():
            raise PermissionError(errno.EACCES, "Permission denied", str(folder))
        return real(*args, dir=dir, **kwargs)

    monkeypatch.setattr(guard.tempfile, "mkstemp", mkstemp)
    return lambda: None


@pytest.fixture
def docids(tmp_path) -> str:
    p = tmp_path / "docids.tsv"
    p.write_text("d0\t0\n")
    return str(p)


COMMANDS = [(["sample"], "out"), (["score"], "out"), (["cluster"], "out"), (["run"], "out"),
            (["qg"], "out"), (["index", "method=random", "data=r5"], "out"), (["train", "docids={docids}"], "out_dir")]


@pytest.mark.parametrize("argv,option", COMMANDS, ids=[c[0][0] for c in COMMANDS])
def test_out_naming_a_file_is_one_line_before_any_work(tmp_path, capsys, nothing_loads, docids, argv, option):
    f = tmp_path / "a-file"
    f.write_text("keep me\n")
    line = error_of(capsys, [a.format(docids=docids) for a in argv] + [f"{option}={f}"])
    assert f"{option}={f}: is a regular file, not a folder; choose another {option}=" in line, line
    assert f.read_text() == "keep me\n"
    line = error_of(capsys, [a.format(docids=docids) for a in argv] + [f"{option}={f}/sub"])
    assert f"{option}={f}/sub: {f} is a regular file" in line, line


@pytest.mark.parametrize("argv,option", COMMANDS, ids=[c[0][0] for c in COMMANDS])
def test_unwritable_out_folder_is_one_line_before_any_work(tmp_path, capsys, monkeypatch, nothing_loads, docids,
                                                           argv, option):
    folder = tmp_path / "locked-down"
    undo = _unwritable(folder, monkeypatch)
    try:
        line = error_of(capsys, [a.format(docids=docids) for a in argv] + [f"{option}={folder}"])
        listing = os.listdir(folder)
    finally:
        undo()
    assert f"{option}={folder}: cannot write into the folder" in line, line
    assert "chmod u+w" in line and f"choose another {option}=" in line, line
    assert listing == []


def test_evaluate_out_dir_is_checked(tmp_path, capsys, nothing_loads):
    train = tmp_path / "train-run"
    (train / "model").mkdir(parents=True)
    (train / "model" / "retriever.json").write_text("{}")
    (train / "trained_on.json").write_text('{"inputs": {"queries": null}}')  # a retriever trained on no real queries
    (tmp_path / "f").write_text("")
    line = error_of(capsys, ["evaluate", f"run_dir={train}", f"out_dir={tmp_path / 'f'}"])
    assert f"out_dir={tmp_path / 'f'}: is a regular file" in line


def test_a_full_disk_is_found_by_the_probe(tmp_path, capsys, monkeypatch, nothing_loads):
    real = guard.os.fsync

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(guard.os, "fsync", full)
    try:
        line = error_of(capsys, ["sample", f"out={tmp_path / 'o'}"])
    finally:
        monkeypatch.setattr(guard.os, "fsync", real)
    assert f"out={tmp_path / 'o'}: cannot write into the folder (No space left on device); free space" in line
    assert os.listdir(tmp_path / "o") == []


def test_a_full_disk_later_is_one_line_and_leaves_nothing_half_written(tmp_path, capsys, monkeypatch):
    """ENOSPC while writing outputs after the early check: one line naming the file and the space it needs, exit 2,
    no traceback, and no half-written file (the atomic writes leave the old state; the folder the command made
    for them, left empty, is removed)."""
    import gdr.io

    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"doc_id": f"d{i}", "text": f"text {i}"}) + "\n" for i in range(6)))
    out = tmp_path / "idx"

    class FullDisk:  # gdr.io's os, whose fsync fails as a full disk's does
        def __getattr__(self, name):
            return getattr(os, name)

        @staticmethod
        def fsync(fd):
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(gdr.io, "os", FullDisk())
    line = error_of(capsys, ["index", "method=random", f"kmeans.docs={docs}", "n_clusters=2", "leaf_size=2",
                             "progress=false", f"out={out}"])
    assert line.startswith(f"gdr index: error: cannot write {out / 'docids.tsv'} (no space left on the device: "
                           "it needs 54 bytes, "), line  # the file and the space it needs
    assert "free); free space on that disk or choose another out=" in line, line
    # no .tmp, no torn tree.json: the folder the command made holds nothing, so it is gone with its lock
    assert not out.exists()


def test_a_p_matrix_that_does_not_fit_is_one_line_not_sigbus(toy, tmp_path, capsys, monkeypatch):
    """P.npy is a memmap: written sparse, a full disk surfaced as SIGBUS in the middle of scoring (no
    message, no exit code of ours). Its blocks are reserved up front, so a full disk is ENOSPC at once."""
    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full, raising=False)
    out = tmp_path / "p"
    assert main(_score_args(toy, out)) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    line = err.strip().splitlines()[-1]  # after the model's loading bar
    assert line.startswith(f"gdr score: error: cannot write {out / 'P.npy'} (no space left on the device: it needs "
                           ), line  # the file and the bytes it needs
    assert line.endswith("free); free space on that disk or choose another out= on a disk with room, then rerun the "
                         "same command to resume"), line
    assert not (out / "P.shards").exists() or not list((out / "P.shards").glob("*.done"))


def test_permission_error_later_names_the_file(tmp_path):
    guard.claim_folder(tmp_path / "x", "out_dir")
    e = PermissionError(errno.EACCES, "Permission denied", str(tmp_path / "x" / "metrics.md"))
    assert guard.write_error_line(e, "evaluate") == (
        f"cannot write {tmp_path}/x/metrics.md (Permission denied); make it writable (chmod u+w; chattr -i if it "
        "is immutable) or choose another out_dir=, then rerun the same command to resume")
    e = PermissionError(errno.EACCES, "Permission denied", "/elsewhere/queries.jsonl")  # an input
    assert guard.write_error_line(e, "evaluate") == (
        "/elsewhere/queries.jsonl: Permission denied (an input, outside the folders this command writes); "
        "fix its permissions")
    assert guard.write_error_line(ValueError("x"), "run") is None
    assert guard.write_error_line(FileNotFoundError(errno.ENOENT, "No such file", "/y"), "run") is None


# ----------------------------------------------------------------------------------- reports
def _write_report(tmp_path, plot: bool, recall: float) -> dict:
    """The report stage's write of a one-retriever run into ``tmp_path``."""
    from gdr.config import load_config, to_container
    from gdr.stages.report import write_report

    cfg = load_config("run", ["data=r5", f"out={tmp_path}", f"plot={str(plot).lower()}"])
    index = {"depth_max": 2, "depth_mean": 1.5, "largest_child_frac_mean": 0.5}
    rows = [{"seed": 0, "recall@1": recall, "recall@10": 0.8, "recall@100": 1.0, "mrr@100": 0.6, "n_queries": 9}]
    return write_report(to_container(cfg), "gdr run", tmp_path, [], 7, {"gc": rows}, {"gc": index}, None, None, 1.0)


def test_report_files_are_replaced_together(tmp_path, monkeypatch):
    """report.md, report.png and report.json never disagree (report.md new, report.json old): all three
    are written to temp names first; a failure (here: the plot, on a full disk) leaves the old set whole."""
    _write_report(tmp_path, True, 0.5)
    names = ("report.md", "report.png", "report.json")
    before = {n: (tmp_path / n).read_bytes() for n in names}
    assert json.loads(before["report.json"])["retrieval"]["gc"]["recall@1"] == 50.0
    assert "| gc | 50.0 |" in before["report.md"].decode()  # one seed: no std

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    from gdr.stages import report

    monkeypatch.setattr(report, "_plot", full)
    with pytest.raises(OSError):
        _write_report(tmp_path, True, 0.25)
    assert {n: (tmp_path / n).read_bytes() for n in names} == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []
    monkeypatch.undo()
    _write_report(tmp_path, True, 0.25)  # a good write replaces all three
    after = {n: (tmp_path / n).read_bytes() for n in names}
    assert json.loads(after["report.json"])["retrieval"]["gc"]["recall@1"] == 25.0
    assert "| gc | 25.0 |" in after["report.md"].decode() and after["report.png"] != before["report.png"]


def test_replace_together_renames_nothing_until_all_are_written(tmp_path):
    a, b = tmp_path / "a.md", tmp_path / "b.json"
    a.write_text("old a")
    b.write_text("old b")

    def fail(p):
        p.write_text("half")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError):
        guard.replace_together({a: lambda p: p.write_text("new a"), b: fail})
    assert (a.read_text(), b.read_text()) == ("old a", "old b")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.md", "b.json"]
    guard.replace_together({a: lambda p: p.write_text("new a"), b: lambda p: p.write_text("new b")})
    assert (a.read_text(), b.read_text()) == ("new a", "new b")


# ----------------------------------------------------------------------------------- accelerators
@pytest.fixture
def no_cuda(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)


@pytest.mark.parametrize("argv,key", [
    (["train", "docids={docids}", "trainer.accelerator=gpu"], "trainer.accelerator=gpu"),
    (["train", "docids={docids}", "trainer.accelerator=cuda", "trainer.devices=2"], "trainer.accelerator=cuda"),
    (["run", "train.trainer.accelerator=gpu"], "train.trainer.accelerator=gpu"),
    (["qg", "qg.train.accelerator=gpu"], "qg.train.accelerator=gpu"),
    (["sample", "device=cuda"], "device=cuda"),
    (["score", "device=cuda"], "device=cuda"),
    (["cluster", "device=cuda:1"], "device=cuda:1"),
    (["run", "device=cuda"], "device=cuda"),
], ids=lambda x: x if isinstance(x, str) else " ".join(x))
def test_a_gpu_without_cuda_is_refused_before_anything(tmp_path, capsys, nothing_loads, no_cuda, docids, argv, key):
    """Asking for a GPU without CUDA is one line naming the setting, before the data or model loads and before
    out_dir is made (not a Lightning traceback after loading, files left in out_dir)."""
    out = tmp_path / "out"
    option = "out_dir" if argv[0] == "train" else "out"
    line = error_of(capsys, [a.format(docids=docids) for a in argv] + [f"{option}={out}"])
    assert f"{key}: CUDA is not available on this machine; use cpu" in line, line
    assert not out.exists()


def test_more_gpus_than_the_machine_has(tmp_path, capsys, nothing_loads, monkeypatch, docids):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    line = error_of(capsys, ["train", f"docids={docids}", "trainer.accelerator=gpu", "trainer.devices=4",
                             f"out_dir={tmp_path / 'o'}"])
    assert "trainer.devices=4: this machine has 2 CUDA device(s)" in line
    line = error_of(capsys, ["train", f"docids={docids}", "trainer.devices=oops", f"out_dir={tmp_path / 'o'}"])
    assert "trainer.devices=oops: must be auto, -1 (all), a positive integer or a list" in line


@pytest.mark.slow
def test_a_sigterm_inside_a_finaliser_exits_a_scoring_worker_quietly(tmp_path):
    """A scoring worker's SIGTERM (gdr.stages.score._leave) that lands while tqdm's __del__ runs raised its
    SystemExit inside the finaliser: Python printed "Exception ignored in ... Traceback" and the worker went on
    (test_a_signal_to_the_process_group_during_scoring_stops_every_process failed so under load). The worker's
    unraisable hook exits at once with the same code, printing nothing."""
    script = tmp_path / "worker.py"
    script.write_text(
        "import signal, sys\n"
        "from gdr.stages import score\n"
        "signal.signal(signal.SIGTERM, score._leave)\n"
        "sys.unraisablehook = score._exit_from_finaliser\n"
        "class Bar:\n"
        "    def __del__(self):\n"
        "        signal.raise_signal(signal.SIGTERM)  # the signal arrives while the finaliser runs\n"
        "Bar()\n"
        "print('went on after the signal', flush=True)\n")
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 128 + signal.SIGTERM, (p.returncode, p.stdout, p.stderr)
    assert "Traceback" not in p.stderr and "went on" not in p.stdout, p.stderr
