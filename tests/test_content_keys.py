"""Same key, same bytes: a stage is keyed by what it reads (a model by the digest of its files; documents, queries
and judgements by their content), never by a path, and a retriever's bytes depend on its key alone (issues 39, 40).
`gdr run` on a 30-document BEIR folder with a tiny random-init LM (offline, CPU)."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from test_pipeline import _args as pipeline_args
from test_pipeline import toy_collection
from tiny_models import saved_tiny_llama

import gdr.models
from gdr.cli import main
from gdr.data import Corpus
from gdr.io import what_differs
from gdr.lm.prompts import PROMPT_LEAD
from gdr.models import model_digest
from gdr.pipeline import lm_key
from gdr.rules import ConfigError
from gdr.stages.settings import LMSettings, TrainSettings
from gdr.stages.train import check_trained_on, trained_on


def _move(src: Path, dst: Path) -> Path:
    dst.parent.mkdir(parents=True, exist_ok=True)
    return Path(shutil.move(src, dst))


def _rewrite(path: Path, data: bytes) -> None:
    """New bytes of the same size, with an mtime one second on (file times may not move within a clock tick)."""
    before = path.stat().st_mtime_ns
    path.write_bytes(data)
    os.utime(path, ns=(before + 10**9, before + 10**9))


@pytest.fixture
def setup(tmp_path, monkeypatch):
    monkeypatch.setenv("GDR_CACHE", str(tmp_path / "cache"))  # this test's own digest cache
    return saved_tiny_llama(tmp_path / "lm", seed=0), toy_collection(tmp_path / "toy")


def _args(model: Path, folder: Path, out: Path, *extra: str) -> list[str]:
    """`gdr run` as test_pipeline runs it, with GC and random docids and the model at ``model``."""
    args = pipeline_args(model.parent, folder, out, "indexers=[gc,random]", "train.trainer.max_steps=4", *extra)
    return [f"model.name={model}" if a.startswith("model.name=") else a for a in args]


def _ran(out: Path, capsys) -> set[str]:
    """The stages of the last run of ``out`` that were not reused."""
    capsys.readouterr()
    return {s["name"] for s in json.loads((out / "report.json").read_text())["stages"] if not s["reused"]}


def _only(out: Path, pattern: str) -> Path:
    found = [p for p in out.glob(pattern) if json.loads((p / "stage.json").read_text())["status"] == "complete"]
    assert len(found) == 1, found
    return found[0]


def test_a_model_changed_in_place_reruns_what_it_made_and_a_moved_one_reruns_nothing(setup, tmp_path, capsys):
    model, folder = setup
    out = tmp_path / "run"
    assert main(_args(model, folder, out)) == 0
    first = _only(out, "score-*")
    p_before, q_before = np.load(first / "P.npy"), (first / "queries.jsonl").read_text()

    saved_tiny_llama(model, seed=1)  # new weights in the same folder, as a fine-tuning does
    assert main(_args(model, folder, out)) == 0
    assert {"score", "doc-queries", "index-gc", "train-gc-s0", "train-random-s0"} <= _ran(out, capsys)
    second = [p for p in out.glob("score-*") if p != first]
    assert len(second) == 1
    assert not np.array_equal(np.load(second[0] / "P.npy"), p_before)
    assert (second[0] / "queries.jsonl").read_text() != q_before
    # a CPU P is keyed by the threads it is scored with (`threads=1` here), as its manifest records them
    assert json.loads((second[0] / "stage.json").read_text())["inputs"]["device"] == {
        "kind": "cpu", "compute_dtype": "float32", "threads": 1}
    assert json.loads((second[0] / "P.manifest.json").read_text())["threads"] == 1

    moved = _move(model, tmp_path / "elsewhere" / "lm")  # the same files at another path
    assert main(_args(moved, folder, out)) == 0
    assert _ran(out, capsys) == set()
    train_dir = next(s["folder"] for s in json.loads((out / "report.json").read_text())["stages"]
                     if s["name"] == "train-gc-s0")
    train = json.loads((out / train_dir / "stage.json").read_text())
    assert train["inputs"]["device"] == {"kind": "cpu", "precision": "32-true", "fused": False,
                                         "threads": len(os.sched_getaffinity(0))}  # one per core, not `threads=1`


def test_gdr_score_refuses_the_queries_of_a_model_changed_in_place(setup, tmp_path, capsys):
    model, folder = setup
    common = ["score", f"data.name={folder}", "model.max_doc_tokens=24", "sample.n_queries=8",
              "sample.max_new_tokens=6", "progress=false", "threads=1", f"out={tmp_path / 'p'}"]
    assert main([*common, f"model.name={model}"]) == 0
    written = (tmp_path / "p" / "P.npy").stat().st_mtime_ns
    moved = _move(model, tmp_path / "moved")
    assert main([*common, f"model.name={moved}"]) == 0  # the same model elsewhere: P reused, not written again
    assert (tmp_path / "p" / "P.npy").stat().st_mtime_ns == written
    capsys.readouterr()
    saved_tiny_llama(moved, seed=1)
    assert main([*common, f"model.name={moved}"]) != 0
    err = capsys.readouterr().err
    assert "queries.manifest.json was written with different settings (lm.weights ('sha256:" in err


def test_what_differs_names_each_nested_leaf_that_differs_and_inputs_by_what_they_hash():
    old = {"lm": {"prompt": {"prefix": "a", "shots": [1, 2]}, "max_doc_tokens": 24}, "texts_hash": "x", "n": 8}
    new = {"lm": {"prompt": {"prefix": "b", "shots": (1, 2)}, "max_doc_tokens": 24}, "texts_hash": "y", "n": 8}
    assert what_differs(old, new) == "lm.prompt.prefix ('a' -> 'b'), the documents' texts"
    assert what_differs(old, {**new, "n": 9}, ["n"]) == "n (8 -> 9)"
    assert what_differs({"c": {"k": 3}}, {"c": None}) == "c ({'k': 3} -> None)"  # a section dropped: whole
    assert what_differs({"c": {"k": 3}}, {"c": {}}) == "c.k (3 -> None)"


def test_a_refused_score_or_sample_leaves_the_folders_config_as_its_files_were_made(setup, tmp_path, capsys):
    model, folder = setup
    out = tmp_path / "p"
    common = [f"data.name={folder}", f"model.name={model}", "sample.n_queries=8", "sample.max_new_tokens=6",
              "progress=false", "threads=1", f"out={out}"]
    assert main(["score", *common, "model.max_doc_tokens=24"]) == 0
    for command, name in (("score", "score.config.yaml"), ("sample", "sample.config.yaml")):
        saved = (out / name).read_bytes() if (out / name).exists() else None
        assert main([command, *common, "model.max_doc_tokens=32"]) != 0  # the folder's P is of 24 tokens
        assert "was written with different settings (lm.max_doc_tokens (24 -> 32))" in capsys.readouterr().err
        assert ((out / name).read_bytes() if (out / name).exists() else None) == saved, command
    assert "max_doc_tokens: 24" in (out / "score.config.yaml").read_text()


def test_moving_a_collection_and_its_model_reruns_no_stage(setup, tmp_path, capsys):
    model, folder = setup
    out = tmp_path / "run"
    assert main(_args(model, folder, out)) == 0
    new_folder = _move(folder, tmp_path / "moved" / "collection")
    new_model = _move(model, tmp_path / "moved" / "model")
    assert main(_args(new_model, new_folder, out)) == 0
    assert _ran(out, capsys) == set()


def test_a_model_digest_reads_a_file_again_only_when_its_size_or_mtime_changed(tmp_path, monkeypatch):
    monkeypatch.setenv("GDR_CACHE", str(tmp_path / "cache"))
    (tmp_path / "m").mkdir()
    weights = tmp_path / "m" / "model.safetensors"
    weights.write_bytes(b"a" * 100)
    (tmp_path / "m" / "config.json").write_text("{}")
    first = model_digest(str(tmp_path / "m"))
    read = []
    real = gdr.models._file_sha256
    monkeypatch.setattr(gdr.models, "_file_sha256", lambda p: read.append(p.name) or real(p))
    assert model_digest(str(tmp_path / "m")) == first and read == []
    _rewrite(weights, b"b" * 100)  # changed in place, the same size
    assert model_digest(str(tmp_path / "m")) != first and read == ["model.safetensors"]
    shutil.copytree(tmp_path / "m", tmp_path / "copy")
    _rewrite(weights, b"a" * 100)
    assert model_digest(str(tmp_path / "copy")) != first == model_digest(str(tmp_path / "m"))


def test_a_training_folder_of_another_device_is_refused_in_one_line(tmp_path):
    corpus = Corpus(name="c", doc_ids=["a", "b"], texts=["x", "y"])
    now = trained_on(corpus, "docids.tsv", [(0,), (1,)], TrainSettings.from_dict({"model": {"size": "tiny"}}))
    assert {k: v for k, v in now["settings"].items() if k.startswith("device.")} == {
        "device.kind": "cpu", "device.precision": "32-true", "device.fused": False,
        "device.threads": len(os.sched_getaffinity(0))}
    cuda = {**now["settings"], "device.kind": "cuda", "device.precision": "bf16-mixed", "device.fused": True}
    (tmp_path / "trained_on.json").write_text(json.dumps({**now, "settings": cuda}))
    with pytest.raises(ConfigError, match=r"device.fused \(True -> False\); device.kind \(cuda -> cpu\); "
                                          r"device.precision \(bf16-mixed -> 32-true\)") as e:
        check_trained_on(tmp_path, now)
    assert "\n" not in str(e.value)


def test_a_training_folder_of_the_other_consistency_view_is_refused(tmp_path):
    """`gdr train` into a folder trained on R-drop's other second view is refused, naming the view; a record of an
    earlier gdr, without the setting, trained on the dropout view (the default the setting was added with): it is
    resumed by a dropout-view training and refused by a corrupted-view one."""
    corpus = Corpus(name="c", doc_ids=["a", "b"], texts=["x", "y"])

    def record(view: str) -> dict:
        return trained_on(corpus, "docids.tsv", [(0,), (1,)], TrainSettings.from_dict(
            {"model": {"size": "tiny"}, "optim": {"consistency_weight": 0.15, "consistency_view": view}}))

    corrupted, dropout = record("corrupted"), record("dropout")
    (tmp_path / "trained_on.json").write_text(json.dumps(corrupted))
    with pytest.raises(ConfigError, match=r"optim\.consistency_view \(corrupted -> dropout\)"):
        check_trained_on(tmp_path, dropout)
    check_trained_on(tmp_path, corrupted)  # the same training: resumed
    earlier = {k: v for k, v in dropout["settings"].items() if k != "optim.consistency_view"}
    (tmp_path / "trained_on.json").write_text(json.dumps({**dropout, "settings": earlier}))
    check_trained_on(tmp_path, dropout)
    with pytest.raises(ConfigError, match=r"optim\.consistency_view \(not recorded: default dropout -> corrupted\)"):
        check_trained_on(tmp_path, corrupted)


def _model_bytes(out: Path) -> dict[str, str]:
    return {p.parent.parent.name.split("-")[1]: hashlib.md5(p.read_bytes()).hexdigest()
            for p in out.glob("train-*/model/model.pt")}


@pytest.mark.slow
def test_a_retriever_trains_to_the_same_bytes_alone_and_after_another(setup, tmp_path, capsys):
    """The retriever `mini` (whose CPU sums depend on the thread count) trained after another in one process, after
    the query generator set `threads`, and alone in a rerun in a process whose thread count an earlier stage left
    (or a fresh process's default). Two at once (`train.concurrent=2`): tests/test_train_speed.py."""
    model, folder = setup
    args = ["indexers=[random,atomic]", "train.model.size=mini", "train.trainer.max_steps=2", "threads=2"]
    out = tmp_path / "run"
    assert main(_args(model, folder, out, *args)) == 0
    both = _model_bytes(out)
    assert set(both) == {"random", "atomic"}
    for stage in ("train-atomic-s0-*", "eval-atomic-s0-*"):
        shutil.rmtree(_only(out, stage))
    torch.set_num_threads(1)  # the generated queries are reused: nothing in this rerun sets `threads` before training
    assert main(_args(model, folder, out, *args)) == 0
    assert _ran(out, capsys) == {"train-atomic-s0", "eval-atomic-s0"}
    assert _model_bytes(out) == both


def test_a_prefix_prompt_keys_how_it_starts(tmp_path):
    """A causal model's prefix prompt starts with its tokenizer's leading special tokens
    (:data:`gdr.lm.prompts.PROMPT_LEAD`): the LM stages of a prefix prompt carry that rule in their key, a chat
    prompt's key is what it was."""
    model = str(saved_tiny_llama(tmp_path / "llama"))
    chat, prefix = (lm_key(LMSettings(name=model, prompt=p)) for p in (None, {"style": "prefix", "prefix": "q: "}))
    assert "prompt_lead" not in chat and prefix["prompt_lead"] == PROMPT_LEAD
    assert chat["weights"] == prefix["weights"] == model_digest(model)
