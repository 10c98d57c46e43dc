"""Recall@k / MRR@100 on hand-made runs, TREC files, the ir_measures cross-check, and BM25."""
from __future__ import annotations

import numpy as np
import pytest

from gdr.eval.retrieval import (
    Run,
    evaluate_run,
    first_relevant_rank,
    markdown_table,
    metrics_from_ranks,
    read_trec_run,
    write_qrels,
    write_trec_run,
)


def _run(rows: dict[str, list[str]], ranks: dict[str, list[int]] | None = None) -> Run:
    qids = list(rows)
    scores = [[float(-i) for i in range(len(rows[q]))] for q in qids]
    return Run(qids, [rows[q] for q in qids], scores, None if ranks is None else [ranks[q] for q in qids])


def test_hand_made_run():
    run = _run({"q1": ["a", "b", "c"], "q2": ["x", "y"], "q3": ["m"]})
    qrels = {"q1": ["b"], "q2": ["z"], "q3": ["m", "n"], "q4": ["a"]}  # q4 is missing from the run: a miss
    m, first = evaluate_run(run, qrels)
    assert first == {"q1": 2, "q2": 0, "q3": 1, "q4": 0}
    assert m.n_queries == 4
    assert m.recall == {1: 0.25, 10: 0.5, 100: 0.5}
    assert m.mrr == pytest.approx((1 / 2 + 0 + 1 + 0) / 4)
    d = m.as_dict()
    assert d["mrr@100"] == pytest.approx(0.375) and d["recall@1"] == 0.25 and d["n_queries"] == 4


def test_cutoffs_at_10_and_100():
    docs = [f"d{i}" for i in range(150)]
    run = _run({"q_at_10": docs, "q_at_11": docs, "q_at_100": docs, "q_at_101": docs})
    qrels = {"q_at_10": ["d9"], "q_at_11": ["d10"], "q_at_100": ["d99"], "q_at_101": ["d100"]}
    m, first = evaluate_run(run, qrels)
    assert list(first.values()) == [10, 11, 100, 101]
    assert m.recall == {1: 0.0, 10: 0.25, 100: 0.75}
    assert m.mrr == pytest.approx((1 / 10 + 1 / 11 + 1 / 100) / 4)  # rank 101 is past MRR@100


def test_documents_sharing_a_docid_share_its_rank():
    # a generative retriever returns docid 1 = {a, b}, docid 2 = {c}
    run = _run({"q": ["a", "b", "c"]}, ranks={"q": [1, 1, 2]})
    m, first = evaluate_run(run, {"q": ["b"]})
    assert first["q"] == 1 and m.recall[1] == 1.0 and m.mrr == 1.0
    m2, first2 = evaluate_run(run, {"q": ["c"]})
    assert first2["q"] == 2 and m2.mrr == 0.5


def test_array_kernel_and_empty_cases():
    doc_idx = np.array([[3, 1, -1], [0, 2, 4]])
    ranks = np.array([[1, 2, 3], [1, 2, 3]])
    first = first_relevant_rank(doc_idx, ranks, rel_query=np.array([0, 1, 1]), rel_doc=np.array([1, 4, 2]))
    assert first.tolist() == [2, 2]
    m = metrics_from_ranks(np.array([0, 1, 3, 12]), ks=(1, 10), mrr_depth=10)
    assert m.recall == {1: 0.25, 10: 0.5} and m.mrr == pytest.approx((1 + 1 / 3) / 4)
    with pytest.raises(ValueError, match="no query has a relevant"):
        evaluate_run(_run({"q": ["a"]}), {"q": []})
    with pytest.raises(ValueError, match="must match"):
        Run(["q1", "q2"], [["a"]], [[1.0]])


def _random_run(rng: np.random.Generator, n_docs: int, n_queries: int) -> tuple[list[str], Run]:
    """(the pool of doc ids, a run of 120 of them per query with distinct descending scores)."""
    pool = [f"D{i}" for i in range(n_docs)]
    qids = [f"Q{i}" for i in range(n_queries)]
    docs = [list(rng.choice(pool, size=120, replace=False)) for _ in qids]
    scores = [sorted(rng.normal(size=120).tolist(), reverse=True) for _ in qids]
    return pool, Run(qids, docs, scores)


def test_matches_ir_measures_on_a_random_run(tmp_path):
    import ir_measures
    rng = np.random.default_rng(0)
    pool, run = _random_run(rng, 300, 40)
    qrels = {q: list(rng.choice(pool, size=rng.integers(1, 4), replace=False)) for q in run.qids}
    ours, _ = evaluate_run(run, qrels)
    write_trec_run(tmp_path / "run.trec", run, depth=100)
    write_qrels(tmp_path / "qrels.txt", qrels)
    measures = [ir_measures.Success @ 1, ir_measures.Success @ 10, ir_measures.Success @ 100, ir_measures.RR @ 100]
    ref = ir_measures.calc_aggregate(measures, ir_measures.read_trec_qrels(str(tmp_path / "qrels.txt")),
                                     ir_measures.read_trec_run(str(tmp_path / "run.trec")))
    assert ours.recall[1] == pytest.approx(ref[ir_measures.Success @ 1])
    assert ours.recall[10] == pytest.approx(ref[ir_measures.Success @ 10])
    assert ours.recall[100] == pytest.approx(ref[ir_measures.Success @ 100])
    assert ours.mrr == pytest.approx(ref[ir_measures.RR @ 100])
    assert 0 < ours.recall[100] < 1  # the run is neither trivially good nor bad


def test_recall_at_k_counts_every_relevant_document_and_success_at_k_one():
    run = _run({"q1": ["a", "b", "c", "d"], "q2": ["x", "y"]})
    qrels = {"q1": ["b", "d", "e", "f", "b"], "q2": ["x"]}  # q1: 4 relevant (b once), 2 of them retrieved
    m, _ = evaluate_run(run, qrels, ks=(1, 2, 10))
    assert m.recall == {1: 0.5, 2: 1.0, 10: 1.0}  # Success@k: a relevant document in the top k
    assert m.r_at == {1: pytest.approx((0 + 1) / 2), 2: pytest.approx((1 / 4 + 1) / 2),
                      10: pytest.approx((2 / 4 + 1) / 2)}
    d = m.as_dict()
    assert d["Success@2"] == d["recall@2"] == 1.0 and d["R@10"] == pytest.approx(0.75) and d["RR@100"] == d["mrr@100"]
    shared, _ = evaluate_run(_run({"q": ["a", "b", "c"]}, ranks={"q": [1, 1, 2]}), {"q": ["b", "c"]}, ks=(1,))
    assert shared.r_at == {1: 0.5}  # a and b share docid rank 1


def test_success_recall_and_rr_equal_ir_measures_on_a_multi_relevant_collection(tmp_path):
    """Graded qrels with 1-8 relevant documents a query, read back from the TREC files by ir_measures."""
    import ir_measures

    rng = np.random.default_rng(1)
    pool, run = _random_run(rng, 200, 30)
    qids = run.qids
    graded = {q: {d: int(rng.integers(1, 4)) for d in rng.choice(pool, size=rng.integers(1, 9), replace=False)}
              for q in qids}
    (tmp_path / "qrels.txt").write_text("".join(f"{q} 0 {d} {g}\n" for q, r in graded.items() for d, g in r.items()))
    write_trec_run(tmp_path / "run.trec", run, depth=100)
    from gdr.data import load_file_queries  # the qrels as gdr reads them (graded, trec_eval form)

    (tmp_path / "q.tsv").write_text("id\ttext\n" + "".join(f"{q}\tquery {q}\n" for q in qids))
    qs = load_file_queries(tmp_path / "q.tsv", tmp_path / "qrels.txt", doc_ids=pool)
    ours, _ = evaluate_run(read_trec_run(tmp_path / "run.trec"), dict(zip(qs.qids, qs.relevant)))
    measures = [ir_measures.Success @ 1, ir_measures.Success @ 10, ir_measures.R @ 10, ir_measures.R @ 100,
                ir_measures.RR @ 100]
    ref = ir_measures.calc_aggregate(measures, ir_measures.read_trec_qrels(str(tmp_path / "qrels.txt")),
                                     ir_measures.read_trec_run(str(tmp_path / "run.trec")))
    d = ours.as_dict()
    for m in measures:
        assert d[str(m)] == pytest.approx(ref[m]), m
    assert d["R@10"] < d["Success@10"] < 1  # several relevant documents: recall below the hit rate


def test_trec_files_round_trip_and_table(tmp_path):
    run = Run(["q1", "q2"], [["a", "b"], ["c"]], [[2.5, 1.0], [0.25]])
    write_trec_run(tmp_path / "r.trec", run, tag="x")
    lines = (tmp_path / "r.trec").read_text().splitlines()
    assert lines[0] == "q1 Q0 a 1 2.5 x" and lines[2] == "q2 Q0 c 1 0.25 x"
    back = read_trec_run(tmp_path / "r.trec")
    assert back.qids == run.qids and back.doc_ids == run.doc_ids and back.scores == run.scores
    write_qrels(tmp_path / "q.txt", {"q1": ["b"]})
    assert (tmp_path / "q.txt").read_text() == "q1 0 b 1\n"
    (tmp_path / "bad.trec").write_text("q1 Q0 a 1\n")
    with pytest.raises(ValueError, match="bad.trec:1"):
        read_trec_run(tmp_path / "bad.trec")
    table = markdown_table({"gdr": {"recall@1": 0.5, "mrr@100": 0.625, "n_queries": 8}})
    assert table.splitlines()[2] == "| gdr | 50.00 | 62.50 | 8 |"


def test_bm25_ranks_the_matching_document_first():
    from gdr.eval.bm25 import bm25_run, bm25_search

    docs = ["the cat sat on the mat", "dogs are loyal animals", "a cat and a dog play", "stock markets fell today"]
    res = bm25_search(docs, ["loyal dogs", "cat mat", "quantum zebra"], k=3)
    assert res.doc_idx.shape == (3, 3)
    assert res.doc_idx[0, 0] == 1 and res.doc_idx[1, 0] == 0
    assert (res.doc_idx[2] == -1).all()  # no shared term: nothing returned
    run = bm25_run(["A", "B", "C", "D"], docs, ["q1", "q2"], ["loyal dogs", "cat"], k=10)
    assert run.doc_ids[0][0] == "B" and set(run.doc_ids[1]) == {"A", "C"}
    m, _ = evaluate_run(run, {"q1": ["B"], "q2": ["C"]})
    assert m.recall[10] == 1.0


def test_bm25_ties_are_evaluated_in_trec_evals_order(tmp_path):
    """Two identical articles tie in BM25: the run is evaluated in the order trec_eval reads its file (score, then
    document id, the later first), and its scores are written in full, so close scores are not rounded into ties
    that trec_eval would reorder. gdr's figures equal pytrec_eval's on the file it writes."""
    import pytrec_eval

    from gdr.eval.bm25 import bm25_run

    docs = ["the bank raised rates", "the bank raised rates", "a bank holiday was announced today",
            "rates on the bank loans rose sharply at the bank"]
    ids = ["a", "b", "c", "d"]
    run = bm25_run(ids, docs, ["q1", "q2"], ["bank rates", "bank holiday"], k=10)
    assert run.doc_ids[0][:2] == ["b", "a"] and run.scores[0][0] == run.scores[0][1]
    qrels = {"q1": ["b"], "q2": ["a"]}
    ours, _ = evaluate_run(run, qrels)
    write_trec_run(tmp_path / "bm25.trec", run, tag="bm25")
    back = read_trec_run(tmp_path / "bm25.trec")
    assert back.doc_ids == run.doc_ids and back.scores == run.scores  # full scores: read back as written
    ev = pytrec_eval.RelevanceEvaluator({q: {d: 1 for d in ds} for q, ds in qrels.items()}, {"success_1", "recip_rank"})
    ref = ev.evaluate({q: dict(zip(d, s)) for q, d, s in zip(back.qids, back.doc_ids, back.scores)})
    assert ours.recall[1] == pytest.approx(np.mean([r["success_1"] for r in ref.values()]))
    assert ours.mrr == pytest.approx(np.mean([r["recip_rank"] for r in ref.values()]))


def test_a_document_listed_twice_is_refused_in_a_run_and_in_a_trec_file(tmp_path):
    """R@k would count a document listed twice twice (R@10 = 2.0 on one relevant document): trec_eval refuses such a
    run, and so does gdr, naming the query and document (and the file's line)."""
    with pytest.raises(ValueError, match="document 'x' twice for query 'q2'"):
        evaluate_run(_run({"q1": ["a", "b"], "q2": ["x", "y", "x"]}), {"q1": ["a"], "q2": ["x"]})
    (tmp_path / "r.trec").write_text("q1 Q0 a 1 2.0 t\nq1 Q0 b 2 1.5 t\nq1 Q0 a 3 1.0 t\n")
    with pytest.raises(ValueError, match=r"r.trec:3: document 'a' is listed twice for query 'q1' \(first at line 1\)"):
        read_trec_run(tmp_path / "r.trec")


def test_a_trec_file_is_read_in_score_order_not_rank_order(tmp_path):
    """trec_eval ignores the rank column: a file whose ranks disagree with its scores is read by score, ties by
    document id (the later first)."""
    (tmp_path / "r.trec").write_text("q1 Q0 a 1 1.0 t\nq1 Q0 b 2 3.0 t\nq1 Q0 c 3 1.0 t\n")
    back = read_trec_run(tmp_path / "r.trec")
    assert back.doc_ids == [["b", "c", "a"]] and back.scores == [[3.0, 1.0, 1.0]]
