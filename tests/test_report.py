"""The report names every measure at the depth it was evaluated at (``evaluate.k``), in its table, its paired
comparisons and report.json; the demo's JSON line keeps its keys. Hand-made evaluation rows, no model."""
from __future__ import annotations

import json

import numpy as np
import pytest

from gdr.config import load_config, to_container
from gdr.eval.retrieval import Run, depths, evaluate_run, metric_keys, write_per_query
from gdr.stages.report import headline, write_report

INDEX = {"depth_max": 2, "depth_mean": 1.5, "largest_child_frac_mean": 0.5}


def _eval_dir(tmp_path, name: str, first: list[int]):
    folder = tmp_path / name
    folder.mkdir()
    write_per_query(folder / "per_query.json", {f"q{i}": r for i, r in enumerate(first)})
    return folder


def _report(tmp_path, k: int, rows: dict, bm25: dict | None = None) -> dict:
    cfg = load_config("run", ["data=r5", f"out={tmp_path}", "plot=false", f"evaluate.k={k}"])
    rng = np.random.default_rng(0)
    dirs = {m: [_eval_dir(tmp_path, m, rng.integers(0, k + 1, 12).tolist())] for m in rows}
    return write_report(to_container(cfg), "gdr run", tmp_path, [], 7, {m: [r] for m, r in rows.items()},
                        {m: INDEX for m in rows}, bm25, None, 1.0, dirs)


def test_measures_are_named_at_the_depth_evaluated():
    """A run of 20 results a query is measured at 1, 10 and 20: Success@20, R@20, RR@20, never @100."""
    assert depths(20) == (1, 10, 20) and depths(5) == (1, 5) and depths(100) == (1, 10, 100)
    assert metric_keys(20) == ("recall@1", "recall@10", "recall@20", "R@10", "R@20", "mrr@20")
    assert metric_keys(5) == ("recall@1", "recall@5", "R@5", "mrr@5")
    run = Run(["a", "b"], [[f"d{i}" for i in range(20)]] * 2, [[0.0] * 20] * 2)
    m, _ = evaluate_run(run, {"a": ["d0"], "b": ["d14"]}, ks=depths(20), mrr_depth=20)
    d = m.as_dict()
    assert d["Success@20"] == d["recall@20"] == 1.0 and d["Success@10"] == 0.5
    assert d["RR@20"] == d["mrr@20"] == pytest.approx((1 + 1 / 15) / 2)
    assert not [key for key in d if "@100" in key]


def test_the_report_at_k_20_says_20_in_its_table_comparisons_and_json(tmp_path):
    """With `evaluate.k=20` report.md's table and comparisons and report.json say Success@20, R@20 and RR@20
    (the comparisons were RR@100 while the table said RR@20)."""
    rows = {m: {"seed": 0, "recall@1": 0.25, "recall@10": 0.5, "recall@20": 0.75, "R@10": 0.5, "R@20": 0.7,
                "mrr@20": 0.4, "n_queries": 12} for m in ("gc", "hkmi")}
    report = _report(tmp_path, 20, rows, bm25={**rows["gc"], "mrr@20": 0.5})
    md = (tmp_path / "report.md").read_text()
    assert "| docids | Success@1 | Success@10 | Success@20 | R@10 | R@20 | RR@20 |" in md
    assert "| gc | hkmi | RR@20 |" in md and "@100" not in md
    assert {c["metric"] for c in report["comparisons"]} == {"recall@1", "recall@10", "mrr@20"}
    assert report["retrieval"]["gc"]["mrr@20"] == 40.0 and report["bm25"]["mrr@20"] == 50.0
    assert "@100" not in json.dumps(report)
    head = headline(report)  # the JSON line names the depth of its RR too
    assert head["rr_at_20"] == 40.0 and head["recall_at_1"] == 25.0 and "gc_vs_hkmi_recall_at_1_p" in head
    assert not [key for key in head if "100" in key]


def test_rows_of_an_earlier_evaluation_at_k_20_are_read_at_their_depth(tmp_path):
    """Evaluation folders reused from before the measures were named at their depth hold the figures of a run of
    20 results under the keys of 100: the report shows them as RR@20 and so on, not as missing."""
    old = {"seed": 0, "recall@1": 0.25, "recall@10": 0.5, "recall@100": 0.75, "R@10": 0.5, "R@100": 0.7,
           "mrr@100": 0.4, "n_queries": 12}
    report = _report(tmp_path, 20, {"gc": old})
    assert report["retrieval"]["gc"]["mrr@20"] == 40.0 and report["retrieval"]["gc"]["recall@20"] == 75.0
    assert "| gc | 25.0 | 50.0 | 75.0 | 50.0 | 70.0 | 40.0 |" in (tmp_path / "report.md").read_text()


def test_an_index_per_seed_gives_the_table_its_facts_over_the_seeds_indexes():
    """index_seed=retriever: a scheme's depth and balance in the table are over its indexes (one a retriever seed):
    the deepest depth, the mean of the rest, and the row says how many."""
    from gdr.stages.report import _retrieval_table, pooled_index_facts

    facts = pooled_index_facts([INDEX, {**INDEX, "depth_max": 4, "depth_mean": 2.5, "largest_child_frac_mean": 0.7}])
    assert facts == {"n_indexes": 2, "depth_max": 4, "depth_mean": 2.0, "largest_child_frac_mean": pytest.approx(0.6)}
    row = {"seed": 0, "recall@1": 0.25, "n_queries": 12}
    lines, _, _ = _retrieval_table({"gc": [row], "hkmi": [row]}, {"gc": facts, "hkmi": INDEX}, None, ["recall@1"])
    assert "| gc (2 indexes, one a seed) | 25.0 | 4 / 2.00 | 0.60 | 1 |" in lines
    assert "| hkmi | 25.0 | 2 / 1.50 | 0.50 | 1 |" in lines


def test_the_demo_line_keeps_its_keys_and_values_at_the_default_depth(tmp_path):
    """At the default k = 100 the report's keys are those the demo's last JSON line has always read."""
    rows = {m: {"seed": 0, "recall@1": 0.25, "recall@10": 0.5, "recall@100": 0.75, "R@10": 0.5, "R@100": 0.7,
                "mrr@100": 0.4, "n_queries": 12} for m in ("gc", "hkmi")}
    report = _report(tmp_path, 100, rows)
    assert set(report["retrieval"]["gc"]) >= {"recall@1", "recall@10", "recall@100", "R@10", "R@100", "mrr@100"}
    head = headline(report)
    assert (head["recall_at_1"], head["rr_at_100"], head["hkmi_recall_at_1"]) == (25.0, 40.0, 25.0)


def test_the_report_says_what_each_schemes_docids_are_computed_from(tmp_path):
    """A reader of report.md learns what the ids of each scheme it reports come from: BMI's vector by
    ``index.bmi.inputs``, the
    k-means schemes' vectors by ``index.kmeans.embedding``; a config of an earlier gdr without the bmi section is
    BMI on its generated queries alone."""
    from gdr.stages.report import docid_sources

    cfg = to_container(load_config("run", ["+experiment=bbc"]))
    assert docid_sources(cfg, cfg["indexers"]) == (
        "Docids (K = 30, leaf 30): gc: generative clustering of P; hkmi: k-means on tf-idf + SVD vectors of the "
        "documents; bmi: k-means on the mean tf-idf + SVD vector of each document's training queries, generated "
        "queries and text segments (BMI's own); random: a random tree.")
    old = to_container(load_config("run", ["+experiment=bbc", "index.kmeans.embedding=model"]))
    del old["index"]["bmi"]
    assert docid_sources(old, ["bmi"]) == ("Docids (K = 30, leaf 30): bmi: k-means on the mean `minilm-l6` vector "
                                           "of each document's generated queries.")
    rows = {m: {"seed": 0, "recall@1": 0.25, "recall@10": 0.5, "recall@100": 0.75, "R@10": 0.5, "R@100": 0.7,
                "mrr@100": 0.4, "n_queries": 12} for m in ("gc", "hkmi")}
    _report(tmp_path, 100, rows)
    assert "Docids (K = 30, leaf 30): gc: generative clustering of P; hkmi: k-means on `minilm-l6` vectors of the " \
           "documents." in (tmp_path / "report.md").read_text()
