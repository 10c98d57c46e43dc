"""Scoring processes (score.processes > 1) share one set of auto sizes, resolved once by the parent; a stage
whose processes leave shards unscored is never reported finished."""
from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from test_pipeline import setup  # noqa: F401 - a fixture
from tiny_models import DOCS

import gdr.stages.score as score_stage
from gdr.data import Corpus
from gdr.stages.score import score_run
from gdr.stages.settings import LMSettings, SampleSettings, ScoreSettings
from gdr.store import read_queries

CORPUS = Corpus(name="toy", doc_ids=[f"d{i}" for i in range(len(DOCS))], texts=list(DOCS))
SAMPLE = SampleSettings(n_queries=6, batch_size=6, max_new_tokens=5)


@pytest.fixture(scope="module")
def saved(setup):  # noqa: F811 - the fixture
    """The tiny causal LM saved as a checkpoint (test_pipeline's): each scoring process loads it by path."""
    root, _ = setup
    return LMSettings(name=str(root / "tiny-llama"), max_doc_tokens=24, device="cpu", threads=1)


@pytest.mark.slow
def test_workers_score_with_the_sizes_the_parent_resolved(saved, tmp_path, monkeypatch):
    """The parent resolves doc_batch_size=auto and max_query_tokens=auto once (here to 3 and 7; a worker that
    resolved its own on the CPU would take 1 and 2,048) and every worker scores with them: the manifest
    records them and P equals one process's at those sizes."""
    def auto_score_sizes(model, device, prompt_tokens=512, free_bytes=None):
        return 3, 7

    monkeypatch.setattr(score_stage, "auto_score_sizes", auto_score_sizes)  # where resolve_sizes calls it
    lm = saved.build()
    two = score_stage.score_corpus(CORPUS, (lm, saved), tmp_path / "two", SAMPLE,
                                   ScoreSettings(shard_size=2, processes=2), progress=False)
    man = json.loads((tmp_path / "two" / "P.manifest.json").read_text())
    assert (man["doc_batch_size"], man["max_query_tokens"], man["status"]) == (3, 7, "complete")
    rows = read_queries(tmp_path / "two")
    one = score_run(lm, CORPUS.texts, CORPUS.doc_ids, [q["text"] for q in rows], tmp_path / "one", shard_size=2,
                    doc_batch_size=3, max_query_tokens=7, progress=False, ended=[not q.get("cut") for q in rows])
    assert np.array_equal(np.load(one), np.load(two))


def test_shards_left_unscored_by_disagreeing_workers_fail_the_stage(saved, tmp_path, monkeypatch):
    """Two workers that group the shards differently (doc batch 4 and 2 over 2-document shards: groups of two
    shards and of one) leave shards 2 and 6 of 8 unscored. The stage says so in one line and is not marked
    complete; a rerun scores what is left."""
    lm = saved.build()

    def disagreeing(corpus, spec, out, settings, n_proc, progress=True, reuse_from=None):
        rows = read_queries(out)
        for rank, bs in ((0, 4), (1, 2)):
            monkeypatch.setattr(score_stage, "dist_info", lambda rank=rank: (rank, 2))
            score_run(lm, corpus.texts, corpus.doc_ids, [q["text"] for q in rows], out, shard_size=2,
                      doc_batch_size=bs, max_query_tokens=7, progress=False, ended=[not q.get("cut") for q in rows])
        monkeypatch.undo()
        return out / "P.npy"

    monkeypatch.setattr(score_stage, "score_in_processes", disagreeing)
    monkeypatch.setattr(score_stage, "_barrier", lambda world: None)
    docs = Corpus(name="toy", doc_ids=[f"d{i}" for i in range(16)], texts=[DOCS[i % len(DOCS)] + f" {i}"
                                                                           for i in range(16)])
    settings = ScoreSettings(shard_size=2, processes=2, doc_batch_size=4, max_query_tokens=7)
    with pytest.raises(RuntimeError, match=r"2 shard\(s\) left unscored \(2, 6\)") as e:
        score_stage.score_corpus(docs, (lm, saved), tmp_path, SAMPLE, settings, progress=False)
    assert "\n" not in str(e.value)
    assert json.loads((tmp_path / "P.manifest.json").read_text())["status"] == "partial"


def test_a_cpu_p_is_keyed_by_the_threads_each_scoring_process_has(saved, monkeypatch):
    """`gdr run` keys a CPU P by the threads it will be scored with, as each scoring process sets them: `threads`,
    else one per core in one process, one in each of score.processes > 1 (their P equals one process's of one
    thread, not one of more threads); a GPU P by no thread count."""
    import torch

    from gdr import pipeline
    from gdr.config import load_config
    from gdr.device import cpu_threads

    def key(*overrides):
        return pipeline.device_key(pipeline.run_settings(load_config("run", list(overrides))), scoring=True)

    assert replace(saved, threads=None).scoring_threads(1) == cpu_threads()
    assert replace(saved, threads=None).scoring_threads(2) == 1 and replace(saved, threads=3).scoring_threads(2) == 3
    assert key("device=cpu") == {"kind": "cpu", "compute_dtype": "float32", "threads": cpu_threads()}
    assert key("device=cpu", "score.processes=2")["threads"] == 1
    assert key("device=cpu", "score.processes=2", "threads=2")["threads"] == 2
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert key() == {"kind": "cuda", "compute_dtype": "bfloat16"}
