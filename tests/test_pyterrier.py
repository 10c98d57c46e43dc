"""gdr in PyTerrier (gdr.pyterrier): a tiny `gdr run` (GC and random docids, one seed, random-init models; the
session's `tiny_run`, read only) compared in
pt.Experiment with its BM25, and a tiny cross-validated one (3 folds) searched topic by topic with the fold that
held each out, offline and without Java."""
from __future__ import annotations

import importlib
import io
import json
import sys
from contextlib import redirect_stdout
from pathlib import Path

import pandas as pd
import pyterrier as pt  # in the test extra: a missing package fails here, it is never skipped
import pytest
from pyterrier.measures import RR, R, Success  # ir_measures' measures
from test_pipeline import _args, setup  # noqa: F401  (the 30-document BEIR folder and tiny LM of the pipeline test)

from gdr.cli import main
from gdr.eval.retrieval import read_per_query, read_trec_run
from gdr.pyterrier import BM25, GenerativeRetriever, RunFolder, topics_and_qrels
from gdr.rules import ConfigError
from gdr.stages.settings import EvaluateSettings
from gdr.training.search import Retriever


@pytest.fixture
def run_dir(tiny_run) -> Path:
    """A finished run of GC and random docids, one seed (read only: PyTerrier searches it, nothing writes there)."""
    return tiny_run.out


@pytest.fixture(scope="module")
def folds_dir(setup, tmp_path_factory) -> tuple[Path, dict]:  # noqa: F811
    """A run cross-validated over 3 folds of the 30 topics (GC, one seed: three retrievers), and the JSON line it
    printed last."""
    root, folder = setup
    out = tmp_path_factory.mktemp("pt-folds") / "run"
    with redirect_stdout(io.StringIO()) as printed:
        assert main(_args(root, folder, out, "indexers=[gc]", "doc_queries.per_doc=1", "queries.folds=3")) == 0
    return out, json.loads(printed.getvalue().strip().splitlines()[-1])


def _stage(out: Path, name: str) -> Path:
    return out / {s["name"]: s["folder"] for s in json.loads((out / "report.json").read_text())["stages"]}[name]


def _as_run(res: pd.DataFrame) -> dict[str, tuple[list[str], list[float]]]:
    """A result frame as {qid: (documents, scores)}, best first."""
    res = res.sort_values(["qid", "rank"])
    return {q: (list(g["docno"]), list(g["score"])) for q, g in res.groupby("qid")}


def _assert_rows_of(ours: pd.DataFrame, *runs) -> None:
    """``ours`` holds the rows of the TREC runs ``runs`` (read_trec_run): the same documents in the same order, the
    same scores to the 6 decimals a run file keeps."""
    ours = _as_run(ours)
    theirs = {q: (list(ds), list(ss)) for r in runs for q, ds, ss in zip(r.qids, r.doc_ids, r.scores)}
    assert {q: d for q, (d, _) in ours.items()} == {q: d for q, (d, _) in theirs.items()}
    for q, (_, scores) in ours.items():
        assert scores == pytest.approx(theirs[q][1], abs=1e-6), q


# scipy's t-test warns when a tiny random-init retriever's per-query figures are all nearly the same
@pytest.mark.filterwarnings("ignore:Precision loss occurred in moment calculation:RuntimeWarning")
def test_experiment_runs_with_pyterriers_significance_tests(run_dir):
    assert not pt.java.started()
    topics, qrels = topics_and_qrels(run_dir)
    assert list(topics.columns) == ["qid", "query"] and list(qrels.columns) == ["qid", "docno", "label"]
    assert len(topics) == 10 and len(qrels) == 10  # every third of the 30 queries is a test query, one doc each
    bm25 = BM25.from_run(run_dir)
    gc = GenerativeRetriever.from_run(run_dir, indexer="gc", seed=0)
    rand = GenerativeRetriever.from_run(run_dir, indexer="random", seed=0)
    table = pt.Experiment([bm25, gc, rand], topics, qrels, eval_metrics=[RR @ 10, R @ 10, Success @ 1], baseline=0,
                          names=["bm25", "gc", "random"], correction="holm")
    assert list(table["name"]) == ["bm25", "gc", "random"]
    assert {"RR@10 p-value", "R@10 p-value", "RR@10 reject", "RR@10 +", "RR@10 -"} <= set(table.columns)
    assert table["RR@10 p-value"].iloc[1:].between(0, 1).all() and pd.isna(table["RR@10 p-value"].iloc[0])
    assert not pt.java.started()

    # PyTerrier's figures are the report's (gdr's metrics.json: recall@1 is Success@1, at the run's depth k = 10)
    means = pt.Experiment([bm25, gc, rand], topics, qrels, eval_metrics=[Success @ 1, RR @ 10], names=["bm25", "gc",
                          "random"]).set_index("name")
    for name, stage in (("gc", "eval-gc-s0"), ("random", "eval-random-s0"), ("bm25", "bm25")):
        m = json.loads((_stage(run_dir, stage) / "metrics.json").read_text())["systems"]
        m = m["bm25" if name == "bm25" else "gdr"]
        assert means.loc[name, "Success@1"] == pytest.approx(m["recall@1"], abs=1e-9), name
        assert means.loc[name, "RR@10"] == pytest.approx(m["mrr@10"], abs=1e-9), name

    # the same rows as the run's own evaluation: gdr's run.trec and bm25.trec on its test queries
    for system, stage, file in ((gc, "eval-gc-s0", "run.trec"), (rand, "eval-random-s0", "run.trec"),
                                (bm25, "bm25", "bm25.trec")):
        _assert_rows_of(system.transform(topics), read_trec_run(_stage(run_dir, stage) / file))


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
    with pytest.raises(FileNotFoundError, match=r"no finished stage train-bmi-s0.*train-gc-s0, train-random-s0"):
        GenerativeRetriever.from_run(run_dir, indexer="bmi", seed=0)
    with pytest.raises(FileNotFoundError, match="not the out folder of `gdr run`"):
        BM25.from_run(run_dir / "nothing")
    train = RunFolder(run_dir).stage_folder("train-gc-s0")
    assert GenerativeRetriever.from_run(train, k=5).k == 5  # a train folder is taken as it is


def test_a_cross_validated_run_searches_each_topic_with_the_fold_that_held_it_out(folds_dir):
    """`from_run` of a 3-fold run routes each topic to the retriever trained without it: per topic PyTerrier's
    figures are the run's per-query ones, its rows the fold's run.trec, and pt.Experiment over all the run's topics
    gives the report's figures."""
    out, line = folds_dir
    report = json.loads((out / "report.json").read_text())
    assert line["rr_at_10"] == report["retrieval"]["gc"]["mrr@10"]  # the JSON line names the depth it measures
    topics, qrels = topics_and_qrels(out)
    assert len(topics) == 30 and report["n_test_queries"] == 30  # every topic, each tested by one fold
    tested = {f: read_per_query(_stage(out, f"eval-gc-s0-f{f}") / "per_query.json") for f in range(3)}
    assert RunFolder(out).topic_folds() == {q: f for f, (qids, _) in tested.items() for q in qids}

    gc = GenerativeRetriever.from_run(out, indexer="gc", seed=0)
    assert len(gc.retrievers) == 3 and repr(gc) == "GenerativeRetriever('gdr-gc-s0', k=10, beam=10, folds=3)"
    per_topic = pt.Experiment([gc], topics, qrels, eval_metrics=[Success @ 1, RR @ 10], names=["gc"], perquery=True)
    got = per_topic.pivot(index="qid", columns="measure", values="value")
    first = {q: int(r) for qids, ranks in tested.values() for q, r in zip(qids, ranks)}  # 0: none in the top k
    assert got["Success@1"].to_dict() == {q: float(r == 1) for q, r in first.items()}
    assert got["RR@10"].to_dict() == pytest.approx({q: 1 / r if r else 0.0 for q, r in first.items()}, abs=1e-9)
    means = pt.Experiment([gc], topics, qrels, eval_metrics=[Success @ 1, RR @ 10], names=["gc"]).iloc[0]
    assert 100 * means["Success@1"] == pytest.approx(report["retrieval"]["gc"]["recall@1"], abs=0.01)
    assert 100 * means["RR@10"] == pytest.approx(report["retrieval"]["gc"]["mrr@10"], abs=0.01)
    # the rows are each fold's own evaluation's, the topics in the order given
    res = gc.transform(topics)
    assert list(dict.fromkeys(res["qid"])) == list(topics["qid"])
    _assert_rows_of(res, *(read_trec_run(_stage(out, f"eval-gc-s0-f{f}") / "run.trec") for f in range(3)))

    # fold= takes one fold's retriever for every topic: on its own test topics, the same rows
    one = GenerativeRetriever.from_run(out, indexer="gc", seed=0, fold=1)
    mine = topics[topics["qid"].isin(tested[1][0])]
    assert one.name == "gdr-gc-s0-f1" and _as_run(one.transform(mine)) == _as_run(gc.transform(mine))
    assert set(one.transform(topics)["qid"]) == set(topics["qid"])  # any topic, trained on or not
    with pytest.raises(ValueError, match=r"topic\(s\) nope are not among the 30 topics .* pass fold="):
        gc.transform(pd.DataFrame({"qid": ["nope"], "query": ["cat"]}))
    with pytest.raises(ValueError, match=r"^fold=3: must be one of the run's folds 0 \.\. 2 \(queries\.folds=3\)$"):
        GenerativeRetriever.from_run(out, indexer="gc", seed=0, fold=3)
    with pytest.raises(FileNotFoundError, match=r"no finished stage train-gc-s1-f0 .*train-gc-s0-f0, train-gc-s0-f1"):
        GenerativeRetriever.from_run(out, indexer="gc", seed=1)


def test_k_and_beam_are_checked_by_gdr_evaluates_rules(run_dir, monkeypatch):
    """from_run refuses what `gdr evaluate` refuses, naming the argument, before any retriever loads: a beam
    narrower than the results asked for (it would search at k, not at the beam said), k of 0."""
    monkeypatch.setattr(Retriever, "load", lambda *a, **k: pytest.fail("a retriever loaded before the check"))
    with pytest.raises(ConfigError, match=r"k=50: .*beam=5"):
        GenerativeRetriever.from_run(run_dir, indexer="gc", seed=0, k=50, beam=5)
    with pytest.raises(ConfigError, match=r"k=0"):
        GenerativeRetriever.from_run(run_dir, indexer="gc", seed=0, k=0)


def test_fold_is_refused_where_the_run_has_no_folds(run_dir):
    with pytest.raises(ValueError, match="not cross-validated .* leave fold out"):
        GenerativeRetriever.from_run(run_dir, indexer="gc", seed=0, fold=0)
    with pytest.raises(ValueError, match="not cross-validated"):
        RunFolder(run_dir).topic_folds()


def test_a_run_folder_reads_its_sections_typed_an_older_configs_missing_keys_at_their_defaults(tmp_path):
    """A run.config.yaml from before evaluate.batch_size and queries.folds / dev_split were settings."""
    (tmp_path / "run.config.yaml").write_text("evaluate: {k: 20, beam: 40, length_penalty: 1.0, device: null}\n"
                                              "queries: {name: titles, path: null, train_split: train, "
                                              "test_split: test, seed: 0, fractions: null}\n", encoding="utf-8")
    run = RunFolder(tmp_path)
    assert (run.evaluate.k, run.evaluate.beam, run.evaluate.batch_size) == (20, 40, EvaluateSettings.batch_size)
    assert run.folds is None and run.query_settings.dev_split is None and run.query_settings.test_split == "test"


def test_without_pyterrier_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "pyterrier", None)  # as if it were not installed
    monkeypatch.delitem(sys.modules, "gdr.pyterrier")
    with pytest.raises(ImportError, match=r"^gdr.pyterrier needs PyTerrier: pip install 'gdr\[pyterrier\]'"):
        importlib.import_module("gdr.pyterrier")
