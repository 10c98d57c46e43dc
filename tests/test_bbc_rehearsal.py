"""The BBC comparison (`+experiment=bbc`) rehearsed on the CPU, scaled down by overrides alone, through the code a
GPU run takes: a run cut after its third retriever keeps a partial report (means and paired intervals over what
finished) and one figures line per finished retriever; the run folder copied elsewhere resumes there without
recomputing anything that finished; each retriever seed trains on an index of its own seed and validates on the
split's dev titles; more seeds later (5) add only their own stages, and the primary test's verdict counts them."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from tiny_models import saved_tiny_llama

import gdr.pipeline
from gdr.cli import main

SCALED = ["data.n_docs=40", "sample.n_queries=16", "sample.batch_size=16", "sample.max_new_tokens=4",
          "model.max_doc_tokens=32", "doc_queries.per_doc=1", "doc_queries.max_new_tokens=4",
          "indexers=[gc,hkmi,random]", "seeds=[0,1]", "index.n_clusters=4", "index.leaf_size=4",
          "index.gc.n_init=1", "index.gc.n_init_inner=1", "cluster.repeats=1", "cluster.n_init=1",
          "cluster.embed_model=null", "train.model.size=tiny", "train.trainer.max_steps=2",
          "train.trainer.min_steps=0", "train.trainer.batch_size=32", "train.trainer.val_check_interval=1",
          "train.trainer.enable_progress_bar=false", "train.trainer.tensorboard=false", "train.trainer.val_beam=4",
          "train.trainer.num_sanity_val_steps=0", "train.optim.warmup_steps=1", "evaluate.k=10", "evaluate.beam=10",
          "progress=false", "threads=1", "plot=false", "index.plot=false", "device=cpu"]


@pytest.fixture(scope="module")
def lm_path(tmp_path_factory):
    return saved_tiny_llama(tmp_path_factory.mktemp("bbc-lm") / "tiny-llama")


def _args(lm_path: Path, out: Path) -> list[str]:
    return ["run", "+experiment=bbc", f"model.name={lm_path}", *SCALED, f"out={out}"]


def _stages(out: Path) -> dict[str, dict]:
    return {s["name"]: s for s in json.loads((out / "report.json").read_text())["stages"]}


@pytest.mark.slow(seconds=35)  # the protocol's rehearsal: 12 retrievers, 12 indexes (the slow lane's)
def test_a_cut_bbc_run_keeps_what_finished_and_resumes_from_a_copy(lm_path, tmp_path, monkeypatch, capsys):
    out = tmp_path / "lease1"
    real = gdr.pipeline.train_spec

    def cut_after_the_third(run, method, seed):  # the lease ends while the fourth retriever trains
        spec = real(run, method, seed)
        if sum(map(len, run.results.values())) == 3:
            def stopped(folder):
                raise KeyboardInterrupt
            spec.build = stopped
        return spec

    monkeypatch.setattr(gdr.pipeline, "train_spec", cut_after_the_third)
    assert main(_args(lm_path, out)) == 130
    monkeypatch.undo()
    report = json.loads((out / "report.json").read_text())
    assert report["partial"] == {"retrievers_done": 3, "retrievers": 6}
    # seed by seed: every scheme compared once (seed 0) before any second seed started
    assert set(report["retrieval"]) == {"gc", "hkmi", "random"}
    assert {(c["a"], c["b"]) for c in report["comparisons"]} >= {("gc", "hkmi"), ("gc", "random")}
    assert (out / "report.md").read_text().count("**Partial: 3 of 6 retrievers finished") == 1
    lines = [json.loads(x) for x in (out / "retrievers.jsonl").read_text().splitlines()]
    assert [(x["indexer"], x["seed"]) for x in lines] == [("gc", 0), ("hkmi", 0), ("random", 0)]
    assert all(0 <= x["metrics"]["recall@1"] <= 1 for x in lines)
    stopped = json.loads(next(out.glob("train-gc-s1-*/stage.json")).read_text())
    assert stopped["status"] == "running" and len(stopped["attempts"]) == 1

    # the second lease: the folder carried elsewhere, the same command there
    copy = tmp_path / "lease2"
    shutil.copytree(out, copy, ignore=shutil.ignore_patterns(".gdr.lock"))
    capsys.readouterr()
    assert main(_args(lm_path, copy)) == 0
    stages = _stages(copy)
    # index_seed=retriever (bbc.yaml): every index of both seeds was built before the first retriever trained
    indexes = {f"index-{m}-s{s}" for m in ("gc", "hkmi", "random") for s in (0, 1)}
    finished_first = {"qg", "score", "cluster", "doc-queries", *indexes, "bm25",
                      "train-gc-s0", "eval-gc-s0", "train-hkmi-s0", "eval-hkmi-s0", "train-random-s0", "eval-random-s0"}
    assert {n for n, s in stages.items() if s["reused"]} == finished_first
    assert stages["train-gc-s1"]["attempts"] == 2  # the stopped attempt counts in its seconds
    report = json.loads((copy / "report.json").read_text())
    assert report["partial"] is None and set(report["retrieval"]) == {"gc", "hkmi", "random"}
    assert [(x["indexer"], x["seed"]) for x in map(json.loads, (copy / "retrievers.jsonl").read_text().splitlines())] \
        == [("gc", 0), ("hkmi", 0), ("random", 0), ("gc", 1), ("hkmi", 1), ("random", 1)]
    assert "Partial" not in (copy / "report.md").read_text()

    assert main(_args(lm_path, copy)) == 0  # and once more: nothing left to compute
    assert all(s["reused"] for s in _stages(copy).values())

    # the retriever of seed s trained on the docids of the index of seed s, and validated on the 2 dev titles
    marks = {p.parent.name.rsplit("-", 1)[0]: json.loads(p.read_text()) for p in copy.glob("*/stage.json")}
    assert marks["index-gc-s0"]["key"] != marks["index-gc-s1"]["key"]
    assert marks["index-gc-s1"]["inputs"]["index"]["seed"] == 1
    assert marks["train-gc-s1"]["inputs"]["index"] == marks["index-gc-s1"]["key"]
    assert marks["train-gc-s1"]["inputs"]["dev"]["split"] == "dev"
    trained = json.loads((copy / stages["train-gc-s1"]["folder"] / "manifest.json").read_text())["examples"]
    assert trained["dev_from"] == "dev_queries" and trained["dev_queries"] == marks["train-gc-s1"]["inputs"]["dev"]["n"]

    # later, 5 seeds of the pair the primary test compares: only the new seeds' indexes and retrievers are made
    capsys.readouterr()
    assert main([*_args(lm_path, copy), "seeds=[0,1,2,3,4]", "indexers=[gc,hkmi]"]) == 0
    stages = _stages(copy)
    new = {f"{k}-{m}-s{s}" for k in ("index", "train", "eval") for m in ("gc", "hkmi") for s in (2, 3, 4)}
    assert {n for n, st in stages.items() if not st["reused"]} == new
    lines = [json.loads(x) for x in (copy / "retrievers.jsonl").read_text().splitlines()]
    assert [(x["indexer"], x["seed"]) for x in lines] == [(m, s) for s in range(5) for m in ("gc", "hkmi")]
    assert all([step for step, _ in x["curve"]] == [1, 2] for x in lines)  # a learning curve on the dev titles
    report = json.loads((copy / "report.json").read_text())
    test = report["primary"]["test"]
    assert (test["a"], test["b"], test["n_seeds_a"], test["n_seeds_b"]) == ("gc", "hkmi", 5, 5)
    assert report["primary"]["status"] in ("decided", "equivalent", "undecided")
    assert report["verdict"] == report["primary"]["line"]
    assert f"**{report['verdict']}**" in (copy / "report.md").read_text()
    assert {s: r["seeds"] for s, r in report["primary"]["schemes"].items()} == {"gc": 5, "hkmi": 5}
    assert "| gc (5 indexes, one a seed) |" in (copy / "report.md").read_text()

    # what a lease carries back: the weights pruned, every retriever taken in from its evaluation, nothing retrained
    assert main(["prune", str(copy)]) == 0
    assert main([*_args(lm_path, copy), "seeds=[0,1,2,3,4]", "indexers=[gc,hkmi]"]) == 0
    assert all(s["reused"] for s in _stages(copy).values())
    assert json.loads((copy / "report.json").read_text())["primary"] == report["primary"]


# What a CUDA run of the protocol chooses, each asked for on the CPU where torch allows (reports/cuda-branches.md):
# bf16 scoring, bf16-mixed autocast for the generator's fine-tuning and the retrievers (fused AdamW, clipped), two
# retrievers at once in processes of their own, the host stages in the background thread. Not askable on a CPU: the
# bf16 decode copy (tests/test_sampling.py runs it apart), TF32, pinned memory, CUDA graphs.
CUDA_CHOICES = ["score.compute_dtype=bfloat16", "qg.train.precision=bf16-mixed", "train.trainer.precision=bf16-mixed",
                "train.optim.fused=true", "train.concurrent=2", "overlap=true"]


@pytest.mark.slow(seconds=30)  # one seed, two schemes, the retrievers in two spawned processes
def test_the_protocol_in_cudas_configuration_runs_on_the_cpu(lm_path, tmp_path):
    """`+experiment=bbc` (the fine-tuned generator, PAWA and R-drop retrievers) through `gdr run` with every choice
    CUDA makes that the CPU can run: it finishes, each choice took effect where the run records it, and each
    retriever's memory estimate counts R-drop's two forward passes."""
    from gdr.cost import TRAIN_BYTES_PER_PARAM
    from gdr.training.model import RetrieverConfig, meta_param_count
    from gdr.training.train import train_memory_per_example

    out = tmp_path / "run"
    args = [a for a in _args(lm_path, out) if not a.startswith(("indexers=", "seeds="))]
    assert main([*args, "indexers=[gc,random]", "seeds=[0]", *CUDA_CHOICES]) == 0
    marks = {p.parent.name.rsplit("-", 1)[0]: json.loads(p.read_text()) for p in out.glob("*/stage.json")}
    assert marks["qg"]["inputs"]["qg"]["train"]["precision"] == "bf16-mixed"
    p_files = list(out.glob("score-*/P.manifest.json"))  # the fine-tuned generator's P and the two-shot one
    assert len(p_files) == 2 and all(json.loads(p.read_text())["compute_dtype"] == "bfloat16" for p in p_files)
    report = json.loads((out / "report.json").read_text())
    training = report["training"]
    assert training["retrievers_at_once"] == 2 and training["retrievers"] == 2 and training["forward_passes"] == 2
    assert "32, 2 forward passes each (R-drop)) in" in (out / "report.md").read_text()  # batch 32 (SCALED)
    assert set(report["overlapped"]["stages"]) >= {"index-gc-s0", "index-random-s0", "cluster", "bm25"}
    for scheme in ("gc", "random"):
        mark = marks[f"train-{scheme}-s0"]
        assert mark["inputs"]["device"] == {"kind": "cpu", "precision": "bf16-mixed", "fused": True,
                                            "threads": mark["inputs"]["device"]["threads"]}
        folder = out / mark["folder"] if "folder" in mark else next(out.glob(f"train-{scheme}-s0-*"))
        man = json.loads((folder / "manifest.json").read_text())
        cfg = RetrieverConfig.from_dict(json.loads((folder / "model" / "retriever.json").read_text()))
        assert man["precision"] == "bf16-mixed" and cfg.pawa
        memory = man["memory"]
        assert mark["info"]["memory"] == memory and memory["peak_bytes"] is None  # no CUDA allocator on the CPU
        # R-drop 0.15: the batch's activations of two forward passes, plus the weights' share (the batch rule counts
        # the parameters on a meta build of the run's config, before the build fills in the encoder's own config:
        # ~5% more than the saved model's for this tiny encoder)
        weights = memory["estimate_bytes"] - man["batch_size"] * train_memory_per_example(cfg, 2)
        assert 0.9 < weights / (TRAIN_BYTES_PER_PARAM * meta_param_count(cfg)) < 1.1
    assert training["peak_gb"] is None and training["estimate_gb"] > 0
