"""How `gdr run` spends a lease: the query generator and its compiled code let go before training, every retriever
evaluated and reported as soon as it is trained (seed by seed, also when several train at once), and a SIGTERM
during concurrent training keeps every retriever that finished."""
from __future__ import annotations

import gc
import json
import signal
import weakref
from pathlib import Path

import pytest
from test_faults import _signalled_at, _stop
from test_pipeline import _args, setup  # noqa: F401  (setup: the module-scoped tiny LM and corpus)

import gdr.pipeline
import gdr.stages.train as train_stage
from gdr.cli import main
from gdr.stages.settings import LMSettings


def test_the_generator_and_its_compiled_code_go_before_the_first_retriever_trains(setup, tmp_path,  # noqa: F811
                                                                                   monkeypatch):
    """Once the LM stages are done, nothing keeps the generator alive and its compiled code is released (on CUDA
    the CUDA-graph pools held ~120 GB on an H200), before the batch of the retrievers is sized and they train."""
    root, folder = setup
    events, lms = [], []
    real_build, real_release, real_train = LMSettings.build, gdr.pipeline.release_compiled, \
        train_stage.train_retriever

    def build(self):
        lm = real_build(self)
        lms.append(weakref.ref(lm))
        return lm

    def release():
        real_release()
        gc.collect()
        events.append(("release", [r() is None for r in lms]))

    def train(*a, **k):
        events.append(("train", None))
        return real_train(*a, **k)

    monkeypatch.setattr(LMSettings, "build", build)
    monkeypatch.setattr(gdr.pipeline, "release_compiled", release)
    monkeypatch.setattr(train_stage, "train_retriever", train)
    assert main(_args(root, folder, tmp_path / "run", "indexers=[hkmi]", "bm25=false")) == 0
    assert lms, "the run built no generator"
    assert events[0] == ("release", [True] * len(lms))  # every generator gone, before anything trained
    assert ("train", None) in events


def test_retrievers_are_trained_seed_by_seed_and_each_is_reported_as_it_finishes(setup, tmp_path,  # noqa: F811
                                                                                 monkeypatch):
    """With two indexers and two seeds, seed 0 of both schemes is trained and in `retrievers.jsonl` (and the partial
    report) before any retriever of seed 1 starts training."""
    root, folder = setup
    out = tmp_path / "run"
    seen = []
    real = train_stage.train_retriever

    def train(corpus, docids, folder, settings, **k):
        lines = (out / "retrievers.jsonl").read_text().splitlines() if (out / "retrievers.jsonl").exists() else []
        report = json.loads((out / "report.json").read_text()) if (out / "report.json").exists() else {}
        seen.append((Path(folder).name.split("-")[1:3], len(lines), report.get("partial")))
        return real(corpus, docids, folder, settings, **k)

    monkeypatch.setattr(train_stage, "train_retriever", train)
    assert main(_args(root, folder, out, "indexers=[hkmi,random]", "seeds=[0,1]", "bm25=false")) == 0
    assert [s[0] for s in seen] == [["hkmi", "s0"], ["random", "s0"], ["hkmi", "s1"], ["random", "s1"]]
    assert [s[1] for s in seen] == [0, 1, 2, 3]  # each earlier retriever already evaluated and listed
    assert seen[2][2] == {"retrievers_done": 2, "retrievers": 4}  # seed 0 compared in the report before seed 1
    lines = [json.loads(x) for x in (out / "retrievers.jsonl").read_text().splitlines()]
    assert [(x["indexer"], x["seed"]) for x in lines] == [("hkmi", 0), ("random", 0), ("hkmi", 1), ("random", 1)]


@pytest.mark.slow(seconds=35)
def test_sigterm_during_concurrent_training_keeps_each_finished_retriever_and_the_rerun_reuses_it(
        setup, tmp_path):  # noqa: F811
    """`gdr run` with train.concurrent=2 (one worker per slot), SIGTERM once the first retriever is in
    `retrievers.jsonl` and the partial report: exit 143, the finished retrievers listed and reported; the rerun
    (one at a time) reuses them and trains only the rest (its report says which ran)."""
    root, folder = setup
    out = tmp_path / "run"
    # six retrievers, two at a time. The parent pauses (tests/run_script.py) once the first finished retriever is
    # listed and in the partial report; no slot gets a job more while it waits, so the signal finds two jobs or more
    # untrained however fast or busy the machine is, and however few steps a retriever trains
    args = _args(root, folder, out, "indexers=[hkmi,random]", "seeds=[0,1,2]", "bm25=false", "train.concurrent=2")
    rc, err = _signalled_at("report:partial", signal.SIGTERM, args[1:], tmp_path)
    listed = out / "retrievers.jsonl"
    assert rc == 143, err[-2000:]
    assert "stopped by SIGTERM" in err and _stop("report:partial", tmp_path)[1] == "at once"
    assert "Traceback" not in err, err[-3000:]  # nor from a slot stopped between jobs
    first = [(x["indexer"], x["seed"]) for x in map(json.loads, listed.read_text().splitlines())]
    assert len(first) == 1 and first[0] in {("hkmi", 0), ("random", 0)}  # the first of seed 0 to finish
    report = json.loads((out / "report.json").read_text())
    assert report["partial"] == {"retrievers_done": len(first), "retrievers": 6}

    finished = {f.parent.name.rsplit("-", 1)[0] for f in out.glob("train-*/stage.json")
                if json.loads(f.read_text())["status"] == "complete"}  # listed, or trained as the signal came
    assert {f"train-{m}-s{s}" for m, s in first} <= finished and len(finished) < 6

    # the rerun here, one retriever at a time: train.concurrent only changes the speed (no stage key holds it), and
    # the retrievers left train in this process rather than in two more spawned ones
    assert main([*args, "train.concurrent=1"]) == 0
    stages = {s["name"]: s for s in json.loads((out / "report.json").read_text())["stages"]}
    assert {n for n, s in stages.items() if n.startswith("train-") and s["reused"]} == finished
    assert len(listed.read_text().splitlines()) == 6
