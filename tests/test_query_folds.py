"""Real topics split by a setting (queries.fractions) or cross-validated (queries.folds=K), on a TREC-like
collection built in tmp_path: 30 documents, 15 topics of two relevant documents each, qrels in train/test files;
and the Cranfield protocol (`gdr run +experiment=cranfield`: 5 folds of its 225 real queries, four docid schemes)
as composed, its split over the real collection and a rehearsal of the run on a slice of it. Offline, CPU, tiny
models."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from test_pipeline import TOPICS, _args, setup  # noqa: F401  (module fixture: a saved tiny LM)

import gdr
import gdr.data.splits as splits_module
from gdr.cli import main
from gdr.config import load_config, rerun_command
from gdr.data import load_corpus, load_queries, load_trec
from gdr.data.splits import QuerySplits, check_query_splits, fold_of, split_queries
from gdr.data.titles import split_of
from gdr.pipeline import queries_section
from gdr.rules import ConfigError
from gdr.validate import validate

N_TOPICS = 15


@pytest.fixture
def trec(tmp_path) -> dict:
    """``data:`` of a TREC collection: documents d0 .. d29 in SGML, topics 301 .. 315 (topic 301 + i is about
    documents d{2i} and d{2i+1}, whose unique words its title holds), judged in qrels/train.tsv (301 .. 310) and
    qrels/test.tsv (311 .. 315) as trec_eval lines; topic 301 is judged in both files (another document in each)."""
    docs = "".join(f"<DOC>\n<DOCNO> d{i} </DOCNO>\n<TEXT>\n{TOPICS[i % 5]} story number {i} item{i}\n</TEXT>\n"
                   f"</DOC>\n" for i in range(30))
    (tmp_path / "docs.trec").write_text(docs)
    (tmp_path / "topics.301-315").write_text("".join(
        f"<top>\n<num> Number: {301 + i}\n<title> item{2 * i} item{2 * i + 1}\n\n<desc> Description:\nabout "
        f"{2 * i}\n</top>\n\n" for i in range(N_TOPICS)))
    (tmp_path / "qrels").mkdir()
    lines = {i: f"{301 + i} 0 d{2 * i} 1\n{301 + i} 0 d{2 * i + 1} 1\n" for i in range(N_TOPICS)}
    (tmp_path / "qrels" / "train.tsv").write_text("".join(lines[i] for i in range(10)))
    (tmp_path / "qrels" / "test.tsv").write_text("".join(lines[i] for i in range(10, N_TOPICS)) + "301 0 d29 1\n")
    return {"name": "trec", "path": str(tmp_path / "docs.trec"), "queries": str(tmp_path / "topics.301-315"),
            "qrels": str(tmp_path / "qrels")}


def _split(data: dict, split: str, **how):
    ids = set(load_trec(data["path"]).doc_ids)
    return split_queries({"name": "trec", "split": split, "path": data["path"], **how}, data, ids)


def test_folds_are_balanced_seeded_and_depend_on_the_topic_ids_only():
    ids = [f"t{i}" for i in range(17)]
    folds = fold_of(ids, 5, seed=0)
    assert sorted(Counter(folds.tolist()).values()) == [3, 3, 3, 4, 4]
    perm = np.random.default_rng(1).permutation(17)
    again = fold_of([ids[i] for i in perm], 5, seed=0)
    assert {ids[i]: int(f) for i, f in zip(perm, again)} == dict(zip(ids, folds.tolist()))
    assert not np.array_equal(fold_of(ids, 5, seed=1), folds)


def test_without_a_setting_the_qrels_files_are_the_splits(trec):
    train, test = _split(trec, "train"), _split(trec, "test")
    assert train.qids == [str(301 + i) for i in range(10)]
    assert test.qids == [str(301 + i) for i in range(10, N_TOPICS)] + ["301"]


def test_fractions_split_every_topic_by_its_id(trec):
    fr = [0.6, 0.2, 0.2]
    parts = {s: _split(trec, s, fractions=fr, seed=3) for s in ("train", "dev", "test")}
    got = {q: s for s, qs in parts.items() if qs is not None for q in qs.qids}
    topics = [str(301 + i) for i in range(N_TOPICS)]
    assert sorted(got) == topics  # every topic once, train and test files pooled
    assert got == dict(zip(topics, split_of(topics, 3, fr)))
    # a topic judged in both files is one topic with both files' judgements
    s301 = parts[got["301"]]
    assert sorted(s301.relevant[s301.qids.index("301")]) == ["d0", "d1", "d29"]
    # the API takes the same setting
    corpus = gdr.load_corpus(trec["path"])
    api = gdr.split_queries(corpus, "train", data=trec, fractions=fr, seed=3)
    assert api.qids == parts["train"].qids


def test_each_fold_tests_its_topics_and_trains_on_the_others(trec):
    topics = {str(301 + i) for i in range(N_TOPICS)}
    tested = []
    for f in range(5):
        test = _split(trec, "test", folds=5, fold=f, seed=0)
        train = _split(trec, "train", folds=5, fold=f, seed=0)
        assert len(test) == 3 and set(test.qids) | set(train.qids) == topics
        assert not set(test.qids) & set(train.qids)
        tested += test.qids
    assert sorted(tested) == sorted(topics)  # every topic a test topic exactly once
    assert set(_split(trec, "test", folds=5, fold=None, seed=0).qids) == topics  # the union: BM25's queries
    with pytest.raises(ConfigError, match=r"queries\.folds=16: only 15 topic\(s\) .* lower queries\.folds"):
        check_query_splits([{"name": "trec", "split": "test", "path": trec["path"], "folds": 16, "fold": None}],
                           QuerySplits(trec, load_trec(trec["path"]).doc_ids), need="test")


@pytest.mark.parametrize("overrides, message", [
    (["queries.folds=1"], "queries.folds=1: must be null or an integer >= 2"),
    (["queries.folds=5", "queries.fractions=[0.6,0.2,0.2]"], "queries.folds=5: the folds split the topics, so "
                                                             "queries.fractions must be null"),
    (["queries.folds=5", "queries.test_split=dev"], "queries.folds=5: each fold's topics are its test split"),
    (["queries.fractions=[0.6,0.2]"], "queries.fractions=[0.6, 0.2]: must be null or three numbers"),
    (["queries.folds=5", "queries.dev_split=dev"], "queries.dev_split=dev with queries.folds=5: the folds split every "
                                                  "topic into a train and a test part, with no dev split"),
    (["queries.dev_split=test"], "queries.dev_split=test: the retrievers' dev split must be apart"),
    (["index_seed=each"], "index_seed=each"),
])
def test_bad_split_settings_stop_the_run_with_one_line(nothing_loads, capsys, overrides, message):
    assert main(["run", "data=bbc", *overrides]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_the_folds_test_every_topic_and_compare_the_schemes_over_all_of_them(setup, trec, tmp_path, capsys,
                                                                             monkeypatch):
    """queries.folds=3 over 15 topics (five a fold, two schemes: six tiny trainings): every topic is one fold's test
    topic, and the seed's figures and the comparisons pool all 15; the query files are read once for all the
    run's splits (each fold's train and test, BM25's, the keys and the report's)."""
    root, folder = setup
    out = tmp_path / "run"
    args = [a for a in _args(root, folder, out, "indexers=[hkmi,random]", "doc_queries.per_doc=0",
                             "queries.folds=3") if not a.startswith("data.name=")]
    data = [f"data.{k}={v}" for k, v in trec.items() if k != "name"]
    reads = []
    read = splits_module.load_file_queries
    monkeypatch.setattr(splits_module, "load_file_queries", lambda *a, **kw: reads.append(a) or read(*a, **kw))
    assert main(args[:1] + ["data=trec", *data] + args[1:]) == 0
    assert len(reads) == 1
    capsys.readouterr()
    report = json.loads((out / "report.json").read_text())
    stages = {s["name"]: s for s in report["stages"]}
    topics = {str(301 + i) for i in range(N_TOPICS)}
    for m in ("hkmi", "random"):
        per_query = [json.loads((out / stages[f"eval-{m}-s0-f{f}"]["folder"] / "per_query.json").read_text())["qids"]
                     for f in range(3)]
        assert sorted(q for qids in per_query for q in qids) == sorted(topics)  # each topic in one fold's test
        assert report["retrieval"][m]["recall@1"] == pytest.approx(  # the seed's row: all 15 topics
            100 * np.mean([json.loads((out / stages[f"eval-{m}-s0-f{f}"]["folder"] / "metrics.json").read_text())
                           ["systems"]["gdr"]["recall@1"] for f in range(3)]), abs=0.01)  # 5 topics each
    assert report["n_test_queries"] == N_TOPICS and report["partial"] is None
    assert {(c["b"], c["n_queries"]) for c in report["comparisons"]} == {("random", 15), ("bm25", 15)}
    assert report["query_split"] == {"by": "folds", "folds": 3, "seed": 0, "n_topics": N_TOPICS}
    assert "Cross-validated over 3 folds of the 15 topics" in (out / "report.md").read_text()
    assert report["trained_on"] == "the topics of the 2 other folds of 3"
    # (seed, fold) major: every scheme of a fold before the next fold
    lines = [json.loads(x) for x in (out / "retrievers.jsonl").read_text().splitlines()]
    assert [(x["fold"], x["indexer"]) for x in lines] == [(f, m) for f in range(3) for m in ("hkmi", "random")]
    bm25 = json.loads((out / stages["bm25"]["folder"] / "per_query.json").read_text())
    assert set(bm25["qids"]) == topics
    # a fold's training folder reruns by hand on the same topics (its saved config names the fold)
    cmd = rerun_command("train", out / stages["train-hkmi-s0-f2"]["folder"])
    assert "+queries.folds=3" in cmd and "+queries.fold=2" in cmd
    # the same settings again reuse every stage
    assert main(args[:1] + ["data=trec", *data] + args[1:]) == 0
    capsys.readouterr()
    assert all(s["reused"] for s in json.loads((out / "report.json").read_text())["stages"])


def test_a_run_cut_short_compares_the_schemes_on_the_folds_it_finished(setup, trec, tmp_path, capsys, monkeypatch):
    import gdr.pipeline

    root, folder = setup
    out = tmp_path / "run"
    args = [a for a in _args(root, folder, out, "indexers=[hkmi,random]", "doc_queries.per_doc=0",
                             "queries.folds=3", "bm25=false") if not a.startswith("data.name=")]
    args = args[:1] + ["data=trec", *[f"data.{k}={v}" for k, v in trec.items() if k != "name"]] + args[1:]
    real = gdr.pipeline.train_spec

    def cut_in_the_second_fold(run, method, seed, fold=None):  # stopped while random trains on fold 1
        spec = real(run, method, seed, fold)
        if (method, fold) == ("random", 1):
            def stopped(folder: Path):
                raise KeyboardInterrupt
            spec.build = stopped
        return spec

    monkeypatch.setattr(gdr.pipeline, "train_spec", cut_in_the_second_fold)
    assert main(args) == 130
    report = json.loads((out / "report.json").read_text())
    assert report["partial"] == {"retrievers_done": 3, "retrievers": 6}
    fold0 = len(json.loads(next(out.glob("eval-random-s0-f0-*/per_query.json")).read_text())["qids"])
    # hkmi has folds 0 and 1, random fold 0: compared on fold 0's topics
    assert [c["n_queries"] for c in report["comparisons"]] == [fold0] * 3


def test_a_seed_s_figures_over_its_folds_weigh_each_fold_by_its_topics():
    from gdr.pipeline import _pooled_metrics

    rows = [{"recall@1": 1.0, "R@10": 0.5, "n_queries": 1}, {"recall@1": 0.0, "R@10": 1.0, "n_queries": 3}]
    assert _pooled_metrics(rows) == {"recall@1": 0.25, "R@10": 0.875, "n_queries": 4}


def test_the_api_takes_the_folds_too(trec):
    corpus = gdr.load_corpus(trec["path"])
    test = gdr.split_queries(corpus, "test", data=trec, folds=5, fold=2)
    assert test.qids == _split(trec, "test", folds=5, fold=2, seed=0).qids and len(test) == 3
    with pytest.raises(ValueError, match=r"^fold=5: must be one of the folds 0 \.\. folds-1 \(folds=5\)$"):
        gdr.split_queries(corpus, "test", data=trec, folds=5, fold=5)


def _cranfield(*overrides: str):
    """``gdr run +experiment=cranfield`` as Hydra composes it (conf/experiment/cranfield.yaml), validated."""
    cfg = load_config("run", ["+experiment=cranfield", *overrides])
    validate("run", cfg)
    return cfg


def test_the_cranfield_protocol_tests_each_of_its_225_queries_once_with_the_bbc_schemes():
    """The experiment as composed: 5 folds of Cranfield's 225 queries (graded judgements, every query a test query
    of one fold and a training query of the four others) and the four docid schemes of the BBC protocol."""
    cfg = _cranfield()
    assert cfg.data.name == "cranfield" and cfg.queries.name == "cranfield" and cfg.queries.folds == 5
    assert list(cfg.indexers) == list(load_config("run", ["+experiment=bbc"]).indexers) == [
        "gc", "hkmi", "bmi", "random"]
    corpus = load_corpus("cranfield")
    splits = QuerySplits(dict(cfg.data), corpus.doc_ids)
    everyone = splits(queries_section(cfg, cfg.queries.test_split))  # fold None: BM25's test queries, every topic
    assert everyone.qids == [str(i) for i in range(1, 226)]
    assert {g for grades in everyone.grades for g in grades} == {1, 2, 3, 4}  # 5 - cranqrel's code
    tested = []
    for f in range(5):
        test = splits(queries_section(cfg, cfg.queries.test_split, f))
        train = splits(queries_section(cfg, cfg.queries.train_split, f))
        assert len(test) == 45 and len(train) == 180 and not set(test.qids) & set(train.qids)
        assert test.grades == [everyone.grades[everyone.qids.index(q)] for q in test.qids]
        tested += test.qids
    assert sorted(tested, key=int) == everyone.qids  # every query a test query exactly once
    assert dict(zip(everyone.qids, fold_of(everyone.qids, 5, cfg.queries.seed).tolist())) == {
        q: f for f in range(5) for q in splits(queries_section(cfg, "test", f)).qids}
    # the single split stays one override away: the query set's own 68 test queries
    one = _cranfield("queries.folds=null")
    assert len(QuerySplits(dict(one.data), corpus.doc_ids)(queries_section(one, "test"))) == 68


def test_a_slice_of_the_corpus_keeps_the_grade_of_each_judgement_it_keeps():
    """Judgements of documents outside a sampled corpus go with their grades (Cranfield, 200 of 1,400 documents)."""
    corpus = load_corpus("cranfield", n_docs=200)
    qs = split_queries({"name": "cranfield", "split": "test", "path": None, "folds": 5, "fold": None, "seed": 0},
                       {"name": "cranfield"}, set(corpus.doc_ids))
    full = load_queries("cranfield")
    grade = {(q, d): g for q, rel, gs in zip(full.qids, full.relevant, full.grades) for d, g in zip(rel, gs)}
    assert 5 <= len(qs) < 225 and sum(map(len, qs.relevant)) < sum(map(len, full.relevant))
    assert all(set(rel) <= set(corpus.doc_ids) for rel in qs.relevant)
    assert qs.grades == [[grade[(q, d)] for d in rel] for q, rel in zip(qs.qids, qs.relevant)]


@pytest.mark.slow(seconds=50)
def test_the_cranfield_protocol_rehearsed_on_a_slice(setup, tmp_path, capsys):  # noqa: F811
    """`gdr run +experiment=cranfield` at test size (80 of the 1,400 documents, the topics judged on them, tiny
    models, one seed): the generator fine-tuned on the abstracts' titles (qg.pairs=titles, no query), 5 folds x the
    four schemes = 20 retrievers, each topic scored by the fold that held it out, the schemes compared over every
    topic, the report and the JSON line as for the full run."""
    root, folder = setup
    out = tmp_path / "run"
    tiny = [a for a in _args(root, folder, out, "seeds=[0]") if not a.startswith("data.name=")][1:]
    args = ["run", "+experiment=cranfield", *tiny, "data.n_docs=80", "train.trainer.min_steps=0",
            "train.trainer.val_check_interval=null", "train.trainer.patience_steps=null"]
    validate("run", load_config("run", args[1:]))
    assert main(args) == 0
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    report = json.loads((out / "report.json").read_text())
    stages = {s["name"]: s for s in report["stages"]}
    n = report["query_split"]["n_topics"]
    assert report["query_split"] == {"by": "folds", "folds": 5, "seed": 0, "n_topics": n} and n >= 5
    assert report["n_test_queries"] == n and report["partial"] is None
    assert list(report["retrieval"]) == ["gc", "hkmi", "bmi", "random"]
    bm25 = set(json.loads((out / stages["bm25"]["folder"] / "per_query.json").read_text())["qids"])
    for m in report["retrieval"]:
        qids = [q for f in range(5) for q in
                json.loads((out / stages[f"eval-{m}-s0-f{f}"]["folder"] / "per_query.json").read_text())["qids"]]
        assert len(qids) == n and set(qids) == bm25  # each topic in exactly one fold's test
    assert {c["b"]: c["n_queries"] for c in report["comparisons"]} == {"hkmi": n, "bmi": n, "random": n, "bm25": n}
    assert len((out / "retrievers.jsonl").read_text().splitlines()) == 20
    assert f"Cross-validated over 5 folds of the {n} topics" in (out / "report.md").read_text()
    assert line["rr_at_10"] == report["retrieval"]["gc"]["mrr@10"]
    # the generator: one qg stage for every fold, on (abstract without its title, title) pairs, its held-out loss on
    # the titles of held-out abstracts; P and the generated queries come from it
    marker = json.loads((out / stages["qg"]["folder"] / "stage.json").read_text())
    qg = marker["info"]
    assert qg["pairs"]["source"] == "titles" and 60 <= qg["pairs"]["pairs"] <= 80
    assert qg["held_out"]["split"] == "titles of held-out documents" and qg["held_out"]["n_pairs"] >= 1
    assert report["generator"]["held_out"]["fine_tuned"]["loss_per_token"] > 0
    assert "held-out documents (never trained on" in (out / "report.md").read_text()
    dq = json.loads((out / stages["doc-queries"]["folder"] / "stage.json").read_text())
    assert dq["inputs"]["lm"] == {"qg": marker["key"]}
