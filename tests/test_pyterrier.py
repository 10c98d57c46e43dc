"""gdr in PyTerrier (gdr.pyterrier): a tiny `gdr run` (GC and HKmI, one seed, random-init models) compared in
pt.Experiment with its BM25, offline and without Java."""
from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pandas as pd
import pyterrier as pt  # in the test extra: a missing package fails here, it is never skipped
import pytest
from pyterrier.measures import RR, R, Success  # ir_measures' measures
from test_pipeline import _args, setup  # noqa: F401  (the 30-document BEIR folder and tiny LM of the pipeline test)

from gdr.cli import main
from gdr.eval.retrieval import read_trec_run
from gdr.pyterrier import BM25, GenerativeRetriever, RunFolder, topics_and_qrels


@pytest.fixture(scope="module")
def run_dir(setup, tmp_path_factory) -> Path:  # noqa: F811
    root, folder = setup
    out = tmp_path_factory.mktemp("pt") / "run"
    assert main(_args(root, folder, out, "indexers=[gc,hkmi]", "doc_queries.per_doc=1")) == 0
    return out


def _stage(out: Path, name: str) -> Path:
    return out / {s["name"]: s["folder"] for s in json.loads((out / "report.json").read_text())["stages"]}[name]


def _as_run(res: pd.DataFrame) -> dict[str, list[tuple[str, float]]]:
    res = res.sort_values(["qid", "rank"])
    return {q: list(zip(g["docno"], g["score"].round(4))) for q, g in res.groupby("qid")}


# scipy's t-test warns when a tiny random-init retriever's per-query figures are all nearly the same
@pytest.mark.filterwarnings("ignore:Precision loss occurred in moment calculation:RuntimeWarning")
def test_experiment_runs_with_pyterriers_significance_tests(run_dir):
    assert not pt.java.started()
    topics, qrels = topics_and_qrels(run_dir)
    assert list(topics.columns) == ["qid", "query"] and list(qrels.columns) == ["qid", "docno", "label"]
    assert len(topics) == 10 and len(qrels) == 10  # every third of the 30 queries is a test query, one doc each
    bm25 = BM25.from_run(run_dir)
    gc = GenerativeRetriever.from_run(run_dir, indexer="gc", seed=0)
    hkmi = GenerativeRetriever.from_run(run_dir, indexer="hkmi", seed=0)
    table = pt.Experiment([bm25, gc, hkmi], topics, qrels, eval_metrics=[RR @ 10, R @ 10, Success @ 1], baseline=0,
                          names=["bm25", "gc", "hkmi"], correction="holm")
    assert list(table["name"]) == ["bm25", "gc", "hkmi"]
    assert {"RR@10 p-value", "R@10 p-value", "RR@10 reject", "RR@10 +", "RR@10 -"} <= set(table.columns)
    assert table["RR@10 p-value"].iloc[1:].between(0, 1).all() and pd.isna(table["RR@10 p-value"].iloc[0])
    assert not pt.java.started()

    # PyTerrier's figures are the report's (gdr's metrics.json: recall@1 is Success@1, at the run's depth k = 10)
    means = pt.Experiment([bm25, gc, hkmi], topics, qrels, eval_metrics=[Success @ 1, RR @ 10], names=["bm25", "gc",
                          "hkmi"]).set_index("name")
    for name, stage in (("gc", "eval-gc-s0"), ("hkmi", "eval-hkmi-s0"), ("bm25", "bm25")):
        m = json.loads((_stage(run_dir, stage) / "metrics.json").read_text())["systems"]
        m = m["bm25" if name == "bm25" else "gdr"]
        assert means.loc[name, "Success@1"] == pytest.approx(m["recall@1"], abs=1e-9), name
        assert means.loc[name, "RR@10"] == pytest.approx(m["mrr@10"], abs=1e-9), name

    # the same rows as the run's own evaluation: gdr's run.trec and bm25.trec on its test queries
    for system, stage, file in ((gc, "eval-gc-s0", "run.trec"), (hkmi, "eval-hkmi-s0", "run.trec"),
                                (bm25, "bm25", "bm25.trec")):
        ours = _as_run(system.transform(topics))
        theirs = read_trec_run(_stage(run_dir, stage) / file)
        assert ours == {q: [(d, round(s, 4)) for d, s in zip(ds, ss)]
                        for q, ds, ss in zip(theirs.qids, theirs.doc_ids, theirs.scores)}, stage


def test_a_result_frame_is_pyterriers(run_dir):
    gc = GenerativeRetriever.from_run(run_dir, indexer="gc", seed=0, k=3, beam=4)
    res = gc.search("cat mat item3")  # pt.Transformer.search: one query
    assert list(res.columns) == ["qid", "query", "docno", "score", "rank"]
    assert list(res["rank"]) == list(range(len(res))) and len(res) >= 3  # a shared docid may add documents
    assert res["score"].is_monotonic_decreasing
    empty = gc.transform(pd.DataFrame(columns=["qid", "query"]))
    assert list(empty.columns) == ["qid", "query", "docno", "score", "rank"] and len(empty) == 0
    pipe = gc % 2  # PyTerrier's operators compose with it
    assert pipe.search("stock market item4")["rank"].max() == 1
    with pytest.raises(pt.validate.InputValidationError):
        gc.transform(pd.DataFrame({"qid": ["1"]}))  # no query column


def test_a_missing_retriever_names_those_the_run_has(run_dir):
    with pytest.raises(FileNotFoundError, match=r"no finished stage train-bmi-s0.*train-gc-s0, train-hkmi-s0"):
        GenerativeRetriever.from_run(run_dir, indexer="bmi", seed=0)
    with pytest.raises(FileNotFoundError, match="not the out folder of `gdr run`"):
        BM25.from_run(run_dir / "nothing")
    train = RunFolder(run_dir).stage_folder("train-gc-s0")
    assert GenerativeRetriever.from_run(train, k=5).k == 5  # a train folder is taken as it is


def test_without_pyterrier_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "pyterrier", None)  # as if it were not installed
    monkeypatch.delitem(sys.modules, "gdr.pyterrier")
    with pytest.raises(ImportError, match=r"^gdr.pyterrier needs PyTerrier: pip install 'gdr\[pyterrier\]'"):
        importlib.import_module("gdr.pyterrier")
