import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from tiny_models import DOCS, QUERIES, tiny_llama

from gdr.cli import main
from gdr.formats import FORMAT, FormatError
from gdr.stages.sample import sample_run
from gdr.stages.score import score_run
from gdr.store import load_run
from gdr.upgrade import upgrade

HERE = Path(__file__).parent
DOC_IDS = [f"d{i}" for i in range(len(DOCS))]


@contextlib.contextmanager
def _scored_batches(lm):
    """The sizes of the document batches ``lm.score`` is called with inside the block."""
    calls: list[int] = []
    orig = lm.score
    lm.score = lambda docs, *a, **k: calls.append(len(docs)) or orig(docs, *a, **k)
    try:
        yield calls
    finally:
        del lm.score


@pytest.fixture(scope="module")
def lm():
    return tiny_llama()


def test_score_run_writes_matrix_and_manifest(lm, tmp_path):
    score_run(lm, DOCS, DOC_IDS, QUERIES, tmp_path, shard_size=3, progress=False)
    run = load_run(tmp_path)
    np.testing.assert_allclose(run.logp, lm.score(DOCS, QUERIES, progress=False), atol=1e-5)
    m = run.manifest
    assert m["status"] == "complete" and m["shape"] == [len(DOCS), len(QUERIES)]
    assert m["lm"]["prompt"]["style"] == "chat" and m["doc_ids_hash"] and m["queries_hash"]
    assert run.doc_ids == DOC_IDS
    assert len(list((tmp_path / "P.shards").glob("*.done"))) == 3


def test_float16_storage(lm, tmp_path):
    score_run(lm, DOCS, DOC_IDS, QUERIES, tmp_path, dtype="float16", shard_size=4, progress=False)
    run = load_run(tmp_path)
    assert run.logp.dtype == np.float16
    np.testing.assert_allclose(run.logp.astype(np.float32), lm.score(DOCS, QUERIES, progress=False), rtol=2e-3)


def test_partial_run_resumes_to_the_same_matrix(lm, tmp_path, capsys):
    ref = tmp_path / "ref"
    score_run(lm, DOCS, DOC_IDS, QUERIES, ref, shard_size=2, progress=False)
    part = tmp_path / "part"
    score_run(lm, DOCS, DOC_IDS, QUERIES, part, shard_size=2, progress=False, max_shards=2)
    assert json.loads((part / "P.manifest.json").read_text())["status"] == "partial"
    with pytest.raises(ValueError, match=r"P.npy is partial, not finished: rerun the `gdr score` command that wrote "
                                         r"it, with its settings, to finish it"):  # no score.config.yaml to rebuild
        load_run(part)
    capsys.readouterr()
    assert main(["index", "method=gc", f"run={part}", "n_clusters=2", "leaf_size=2", f"out={tmp_path / 'ix'}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is partial, not finished" in err[0], err  # one line, no traceback
    with _scored_batches(lm) as calls:
        score_run(lm, DOCS, DOC_IDS, QUERIES, part, shard_size=2, progress=False)
    assert sum(calls) == len(DOCS) - 4  # finished shards were not redone
    assert np.array_equal(np.load(ref / "P.npy"), np.load(part / "P.npy"))


def test_a_p_resumed_on_a_machine_that_rounds_otherwise_says_so_and_lists_both(lm, tmp_path, caplog):
    part = tmp_path / "part"
    score_run(lm, DOCS, DOC_IDS, QUERIES, part, shard_size=2, progress=False, max_shards=2)
    man = json.loads((part / "P.manifest.json").read_text())
    man["machine"] = {**man["machine"], "cpu_capability": "OTHER-ISA", "torch": "2.4.0"}  # no machine's own
    (part / "P.manifest.json").write_text(json.dumps(man))
    with caplog.at_level("WARNING", logger="gdr.stages.score"):
        score_run(lm, DOCS, DOC_IDS, QUERIES, part, shard_size=2, progress=False)
    assert "finished shards were scored on another machine (cpu_capability OTHER-ISA there" in caplog.text
    done = json.loads((part / "P.manifest.json").read_text())
    assert done["status"] == "complete" and [m["torch"] for m in done["machines"]] == ["2.4.0", torch.__version__]


def test_small_shards_are_scored_in_groups_that_fill_a_doc_batch(lm, tmp_path):
    """2-document shards at a doc batch of 4: scored two shards at a time (batches of 4, as 4-document shards
    give, bit for bit), one marker per shard; a half-finished group resumes to the same matrix, rewriting
    only its unfinished shard (one call per shard would score batches of 2)."""
    ref = tmp_path / "ref"
    score_run(lm, DOCS, DOC_IDS, QUERIES, ref, shard_size=4, doc_batch_size=4, progress=False)
    small = tmp_path / "small"
    with _scored_batches(lm) as calls:
        score_run(lm, DOCS, DOC_IDS, QUERIES, small, shard_size=2, doc_batch_size=4, progress=False)
    assert calls == [4, 3] and len(list((small / "P.shards").glob("*.done"))) == 4
    assert np.array_equal(np.load(ref / "P.npy"), np.load(small / "P.npy"))
    kept = (small / "P.shards" / "00000.done").read_text()
    (small / "P.shards" / "00001.done").unlink()  # the second shard of the first group unfinished
    with _scored_batches(lm) as calls:
        score_run(lm, DOCS, DOC_IDS, QUERIES, small, shard_size=2, doc_batch_size=4, progress=False)
    assert calls == [4] and (small / "P.shards" / "00000.done").read_text() == kept
    assert np.array_equal(np.load(ref / "P.npy"), np.load(small / "P.npy"))


def test_compute_dtype_is_chosen_recorded_and_checked(lm, tmp_path):
    """score.compute_dtype: bf16 on the CPU gives bf16 numbers (close to fp32, not equal); the manifest records
    what auto resolved to; a folder scored in another compute dtype is refused; a manifest of format 0 without the
    key (scored by auto, the only behaviour then) is refused until `gdr upgrade` records it, then reused."""
    import torch

    score_run(lm, DOCS, DOC_IDS, QUERIES, tmp_path / "bf16", shard_size=4, progress=False, compute_dtype="bfloat16")
    score_run(lm, DOCS, DOC_IDS, QUERIES, tmp_path / "auto", shard_size=4, progress=False)
    bf16, fp32 = load_run(tmp_path / "bf16"), load_run(tmp_path / "auto")
    assert bf16.manifest["compute_dtype"] == "bfloat16" and fp32.manifest["compute_dtype"] == "float32"
    diff = np.abs(bf16.logp - fp32.logp)
    assert 1e-6 < diff.max() < 0.1
    # the same batches (score_run's one document per pass): bf16 numbers depend on the padding of a batch
    np.testing.assert_allclose(bf16.logp, lm.score(DOCS, QUERIES, compute_dtype=torch.bfloat16, progress=False,
                                                   doc_batch_size=1), atol=1e-6, rtol=0)
    with pytest.raises(FileExistsError, match="compute_dtype"):
        score_run(lm, DOCS, DOC_IDS, QUERIES, tmp_path / "bf16", shard_size=4, progress=False)
    man_path = tmp_path / "auto" / "P.manifest.json"
    man = json.loads(man_path.read_text())
    del man["compute_dtype"], man["format"]
    man_path.write_text(json.dumps(man))
    with pytest.raises(FormatError, match=r"P.manifest.json: format 0 of an older gdr .* run `gdr upgrade "):
        score_run(lm, DOCS, DOC_IDS, QUERIES, tmp_path / "auto", shard_size=4, progress=False)
    assert upgrade(tmp_path / "auto") == [f"{man_path}: format 0 -> {FORMAT}"]
    assert json.loads(man_path.read_text())["compute_dtype"] == "float32"
    with _scored_batches(lm) as calls:
        score_run(lm, DOCS, DOC_IDS, QUERIES, tmp_path / "auto", shard_size=4, progress=False)
    assert calls == []
    with pytest.raises(ValueError, match="compute_dtype='float16'"):
        score_run(lm, DOCS, DOC_IDS, QUERIES, tmp_path / "x", progress=False, compute_dtype="float16")


def test_a_cpu_p_is_scored_with_the_threads_that_key_it(lm, tmp_path, monkeypatch):
    """A CPU P's last bits depend on torch's thread count (MKL computes a product of a few rows by another kernel
    at another count), so it is scored with a set count, whatever the process had set before: ``threads``, else one
    per core; its manifest records it, the count is restored after, and a P of another count is not resumed."""
    from gdr.device import cpu_threads

    seen = []
    original = type(lm).score

    def score(self, *args, **kwargs):
        seen.append(torch.get_num_threads())
        return original(self, *args, **kwargs)

    monkeypatch.setattr(type(lm), "score", score)
    monkeypatch.setattr(lm, "threads", None)
    torch.set_num_threads(1)  # what an earlier stage (or conftest) left set
    score_run(lm, DOCS, DOC_IDS, QUERIES, tmp_path, shard_size=2, progress=False, max_shards=2)
    assert set(seen) == {cpu_threads()} and torch.get_num_threads() == 1
    assert json.loads((tmp_path / "P.manifest.json").read_text())["threads"] == cpu_threads()
    before = np.load(tmp_path / "P.npy").copy()
    monkeypatch.setattr(lm, "threads", cpu_threads() + 1)
    with pytest.raises(FileExistsError, match=f"threads {cpu_threads()} there, {cpu_threads() + 1} here"):
        score_run(lm, DOCS, DOC_IDS, QUERIES, tmp_path, shard_size=2, progress=False)
    assert np.array_equal(before, np.load(tmp_path / "P.npy"))
    seen.clear()
    score_run(lm, DOCS, DOC_IDS, QUERIES, tmp_path / "more", shard_size=2, progress=False)
    assert set(seen) == {cpu_threads() + 1} and torch.get_num_threads() == 1


def test_p_of_another_device_is_refused_and_its_numerics_recorded(lm, tmp_path):
    """P records the device kind and compute dtype that made it (gdr.lm.numerics.scoring_numerics, what a stage
    key can hold before the model loads); a partial P from another device (a GPU's, here its manifest) is not
    resumed on this one: refused in one line naming both, its rows left as they were."""
    from gdr.lm.numerics import scoring_numerics

    score_run(lm, DOCS, DOC_IDS, QUERIES, tmp_path, shard_size=2, progress=False, max_shards=2)
    man_path = tmp_path / "P.manifest.json"
    man = json.loads(man_path.read_text())
    assert {k: man[k] for k in ("device", "compute_dtype")} == scoring_numerics("cpu", "auto") == \
        {"device": "cpu", "compute_dtype": "float32"}
    before = np.load(tmp_path / "P.npy").copy()
    man_path.write_text(json.dumps({**man, "device": "cuda", "compute_dtype": "bfloat16"}))
    with pytest.raises(FileExistsError, match="device cuda there, cpu here, compute_dtype bfloat16 there, "
                                              "float32 here") as e:
        score_run(lm, DOCS, DOC_IDS, QUERIES, tmp_path, shard_size=2, progress=False)
    assert "\n" not in str(e.value) and np.array_equal(before, np.load(tmp_path / "P.npy"))
    man_path.write_text(json.dumps({k: v for k, v in man.items() if k != "device"}))  # no device: refused too
    with pytest.raises(FileExistsError, match="device None there, cpu here"):
        score_run(lm, DOCS, DOC_IDS, QUERIES, tmp_path, shard_size=2, progress=False)


def test_mismatched_run_folder_is_refused(lm, tmp_path):
    score_run(lm, DOCS, DOC_IDS, QUERIES, tmp_path, shard_size=4, progress=False)
    before = np.load(tmp_path / "P.npy").copy()
    with pytest.raises(FileExistsError, match="queries_hash"):
        score_run(lm, DOCS, DOC_IDS, QUERIES[:-1], tmp_path, shard_size=4, progress=False)
    assert np.array_equal(before, np.load(tmp_path / "P.npy"))  # nothing corrupted


def _script(out, *extra):
    env = dict(os.environ, PYTHONPATH=str(HERE) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return [sys.executable, str(HERE / "score_script.py"), str(out), *extra], env


@pytest.mark.slow(seconds=20)
def test_sigkill_then_resume_equals_uninterrupted(tmp_path):
    ref, killed = tmp_path / "ref", tmp_path / "killed"
    cmd, env = _script(ref)
    subprocess.run(cmd, env=env, check=True, timeout=300)
    cmd, env = _script(killed, "0.5")
    proc = subprocess.Popen(cmd, env=env)
    deadline = time.time() + 240
    while time.time() < deadline and len(list((killed / "P.shards").glob("*.done"))) < 2:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    n_done = len(list((killed / "P.shards").glob("*.done")))
    assert 2 <= n_done < 11, n_done  # killed in the middle of the run
    cmd, env = _script(killed)
    subprocess.run(cmd, env=env, check=True, timeout=300)
    assert np.array_equal(np.load(ref / "P.npy"), np.load(killed / "P.npy"))
    assert json.loads((killed / "P.manifest.json").read_text())["status"] == "complete"


@pytest.mark.slow(seconds=15)
def test_two_processes_equal_one(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    cmd, env = _script(one)
    subprocess.run(cmd, env=env, check=True, timeout=300)
    cmd, env = _script(two)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                str(29500 + os.getpid() % 1000)]
    subprocess.run(torchrun + cmd[1:], env=env, check=True, timeout=300)
    assert np.array_equal(np.load(one / "P.npy"), np.load(two / "P.npy"))
    assert json.loads((two / "P.manifest.json").read_text())["world_size"] == 2


def test_sample_run_reuses_and_refuses(lm, tmp_path):
    rows = sample_run(lm, DOCS, DOC_IDS, tmp_path, n_queries=5, seed=2, batch_size=2, max_new_tokens=5,
                      progress=False)
    assert [r["qid"] for r in rows] == [f"q{j}" for j in range(5)]
    assert all(r["source_doc_id"] == DOC_IDS[r["source_index"]] for r in rows)
    assert sample_run(lm, DOCS, DOC_IDS, tmp_path, n_queries=5, seed=2, batch_size=2, max_new_tokens=5,
                      progress=False) == rows
    with pytest.raises(FileExistsError, match="seed"):
        sample_run(lm, DOCS, DOC_IDS, tmp_path, n_queries=5, seed=3, batch_size=2, max_new_tokens=5,
                   progress=False)
    assert not (tmp_path / "queries.partial.jsonl").exists()


def test_per_doc_generation_resumes_to_the_same_file(lm, tmp_path):
    from gdr.io import read_jsonl
    from gdr.stages.doc_queries import sample_per_doc_run

    kw = dict(n_per_doc=2, seed=1, batch_size=3, max_new_tokens=5, progress=False)
    full = read_jsonl(sample_per_doc_run(lm, DOCS, DOC_IDS, tmp_path / "a", **kw))
    assert [r["doc_id"] for r in full] == DOC_IDS and all(len(r["queries"]) == 2 for r in full)
    # a run killed after its first batch, with a torn half-written line at the end
    part = tmp_path / "b"
    sample_per_doc_run(lm, DOCS[:3], DOC_IDS[:3], part, **kw)
    (part / "doc_queries.manifest.json").unlink()  # same settings, now for the whole corpus
    with open(part / "doc_queries.jsonl", "a") as f:
        f.write('{"doc_id": "d3", "quer')
    resumed = read_jsonl(sample_per_doc_run(lm, DOCS, DOC_IDS, part, **kw))
    assert resumed == full
    # a corrupt line in the middle is not silently dropped
    lines = (part / "doc_queries.jsonl").read_text().splitlines()
    lines[1] = "{oops"
    (part / "doc_queries.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=r"doc_queries.jsonl: size .*re-sample"):  # finished: changed since
        sample_per_doc_run(lm, DOCS, DOC_IDS, part, **kw)
    man = json.loads((part / "doc_queries.manifest.json").read_text())
    (part / "doc_queries.manifest.json").write_text(json.dumps({**man, "status": "running"}))  # as if killed
    with pytest.raises(ValueError, match="doc_queries.jsonl:2"):
        sample_per_doc_run(lm, DOCS, DOC_IDS, part, **kw)


# ------------------------------------------------------------------------------------------ integrity
def test_truncated_p_is_rescored_never_zero_filled(lm, tmp_path, caplog):
    """`truncate -s` of a finished P.npy, then the rerun our own message advises: the lost rows are re-scored
    (never zero-filled with every shard marker trusted)."""
    score_run(lm, DOCS, DOC_IDS, QUERIES, tmp_path, shard_size=3, progress=False)
    ref = np.load(tmp_path / "P.npy").copy()
    # cut right after the last row of the shard that ends first: that shard keeps its work, the others lose rows
    order = np.argsort([len(p) for p in lm.prompt_ids(DOCS)], kind="stable")
    ends = [int(order[3 * s:3 * s + 3].max()) + 1 for s in range(3)]
    header = (tmp_path / "P.npy").stat().st_size - ref.nbytes
    with open(tmp_path / "P.npy", "r+b") as f:
        f.truncate(header + min(ends) * ref[0].nbytes)
    with pytest.raises(ValueError, match=r"P\.npy: .*bytes.*rerun `gdr score"):
        load_run(tmp_path)
    with _scored_batches(lm) as calls:
        score_run(lm, DOCS, DOC_IDS, QUERIES, tmp_path, shard_size=3, progress=False)
    assert "P.npy: " in caplog.text and "re-scoring the shards whose rows it lost" in caplog.text
    np.testing.assert_array_equal(load_run(tmp_path).logp, ref)
    kept = sum(e <= min(ends) for e in ends)
    assert kept >= 1 and sum(calls) == len(DOCS) - sum(len(order[3 * s:3 * s + 3]) for s in range(3)
                                                        if ends[s] <= min(ends))


def test_p_with_a_broken_header_is_recreated(lm, tmp_path, caplog):
    score_run(lm, DOCS, DOC_IDS, QUERIES, tmp_path, shard_size=3, progress=False)
    ref = np.load(tmp_path / "P.npy").copy()
    with open(tmp_path / "P.npy", "r+b") as f:
        f.write(b"garbage!")
    score_run(lm, DOCS, DOC_IDS, QUERIES, tmp_path, shard_size=3, progress=False)
    assert "unreadable .npy header" in caplog.text and "re-scoring every shard" in caplog.text
    np.testing.assert_array_equal(load_run(tmp_path).logp, ref)


def test_damaged_shard_is_rescored_alone(lm, tmp_path, caplog):
    score_run(lm, DOCS, DOC_IDS, QUERIES, tmp_path, shard_size=3, progress=False)
    ref = np.load(tmp_path / "P.npy").copy()
    P = np.load(tmp_path / "P.npy", mmap_mode="r+")
    P[4, 1] = np.nextafter(P[4, 1], 0)  # one flipped low bit
    P.flush()
    del P
    with pytest.raises(ValueError, match="checksum differs"):
        load_run(tmp_path)
    with _scored_batches(lm) as calls:
        score_run(lm, DOCS, DOC_IDS, QUERIES, tmp_path, shard_size=3, progress=False)
    assert calls == [3] and "re-scoring that shard" in caplog.text
    np.testing.assert_array_equal(load_run(tmp_path).logp, ref)


def test_shard_markers_of_format_0_without_a_checksum_are_dropped_by_the_upgrade_and_rescored(lm, tmp_path, caplog):
    """Markers of format 0 before they held a checksum (empty files) cannot be checked without the documents'
    prompt-length order, which the folder does not record: the upgrade drops them, naming that in one line, and
    leaves P's bytes and the checked markers alone; scoring again re-scores those shards only. A marker without a
    checksum in the current format counts as damaged."""
    score_run(lm, DOCS, DOC_IDS, QUERIES, tmp_path, shard_size=3, progress=False)
    ref = np.load(tmp_path / "P.npy").copy()
    path = tmp_path / "P.manifest.json"
    man = json.loads(path.read_text())
    path.write_text(json.dumps({k: v for k, v in man.items() if k != "format"} | {"status": "partial"}))
    markers = sorted((tmp_path / "P.shards").glob("*.done"))
    kept = markers[0].read_bytes()
    for m in markers[1:]:
        m.write_text("")  # what a format-0 gdr wrote before markers held a checksum
    p_before = (tmp_path / "P.npy").read_bytes()
    lines = upgrade(tmp_path)
    assert lines[0] == f"{path}: format 0 -> {FORMAT}"
    assert lines[1] == (f"{tmp_path / 'P.shards'}: 2 shard marker(s) of format 0 hold no checksum of their rows, "
                        "which need the documents' prompt-length order (not recorded in the folder): dropped, those "
                        "shards are re-scored when P is scored again") and len(lines) == 2
    assert (tmp_path / "P.npy").read_bytes() == p_before
    assert [m.name for m in (tmp_path / "P.shards").glob("*.done")] == [markers[0].name]
    assert markers[0].read_bytes() == kept and json.loads(path.read_text())["format"] == FORMAT
    with _scored_batches(lm) as calls:
        score_run(lm, DOCS, DOC_IDS, QUERIES, tmp_path, shard_size=3, progress=False)
    assert calls == [3, 1]  # shards 1 and 2: 3 documents and the last one
    np.testing.assert_array_equal(load_run(tmp_path).logp, ref)
    assert all(json.loads(m.read_text())["rows_crc32"] for m in (tmp_path / "P.shards").glob("*.done"))

    markers[1].write_text("{}")  # the current format: a marker without its checksum is a damaged one
    with _scored_batches(lm) as calls:
        score_run(lm, DOCS, DOC_IDS, QUERIES, tmp_path, shard_size=3, progress=False)
    assert calls == [3] and "rows of shard 1 differ from the checksum in its marker" in caplog.text
    np.testing.assert_array_equal(load_run(tmp_path).logp, ref)


@pytest.mark.parametrize("damage", ["broken_line", "dropped_line", "duplicated_line"])
def test_changed_queries_file_is_refused_with_resample(lm, tmp_path, damage):
    sample_run(lm, DOCS, DOC_IDS, tmp_path, n_queries=5, seed=2, batch_size=2, max_new_tokens=5, progress=False)
    q = tmp_path / "queries.jsonl"
    lines = q.read_text().splitlines(keepends=True)
    if damage == "broken_line":
        lines[2] = lines[2][:10] + "\n"
    elif damage == "dropped_line":
        del lines[1]
    else:
        lines.append(lines[0])
    q.write_text("".join(lines))
    for man in (None, "legacy"):  # with the recorded checksum, and a manifest of an older version without it
        if man == "legacy":
            m = json.loads((tmp_path / "queries.manifest.json").read_text())
            del m["file"]
            (tmp_path / "queries.manifest.json").write_text(json.dumps(m))
        with pytest.raises(ValueError, match="queries.jsonl.*re-sample") as e:
            sample_run(lm, DOCS, DOC_IDS, tmp_path, n_queries=5, seed=2, batch_size=2, max_new_tokens=5,
                       progress=False)
        assert "fix or delete" not in str(e.value)
