"""Tests for gdr.data: real-file slices (Reuters, Cranfield, BBC), synthetic fixtures (MS MARCO
Lite, NQ320K), a BEIR round trip, and one error message per kind of bad input."""
from __future__ import annotations

import gzip
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf

import gdr
from gdr.config import load_config
from gdr.data import (
    Corpus,
    DataError,
    QuerySet,
    data_dir,
    load_beir,
    load_beir_queries,
    load_corpus,
    load_queries,
    write_beir,
)
from gdr.data.reuters import _body_text
from gdr.data.splits import QuerySplits

FIX = Path(__file__).parent / "fixtures" / "data"
SHARED = data_dir()
CONF = Path(gdr.__file__).resolve().parents[1] / "conf" / "data"


def _need(path: Path) -> Path:
    # shared/ sits beside the repository in CI and on the dev machines; its absence is a setup error
    assert path.exists(), f"{path} is missing: clone the repository with shared/ beside it or set GDR_DATA_DIR"
    return path


# ----------------------------------------------------------------------------- Reuters

@pytest.fixture(scope="module")
def r5() -> Corpus:
    _need(SHARED / "reuters21578")
    return load_corpus("r5")


@pytest.fixture(scope="module")
def r2() -> Corpus:
    return load_corpus("r2")


def test_r5_counts_labels_and_filtered(r5):
    assert len(r5) == 6807
    assert r5.info["label_counts"] == {"earn": 3735, "acq": 2125, "crude": 355, "trade": 333, "money-fx": 259}
    assert r5.label_names == ["acq", "crude", "earn", "money-fx", "trade"]
    # every one of the 21,578 stories is either kept or counted under a reason
    assert r5.info["n_stories"] == 21578
    assert len(r5) + sum(r5.info["filtered"].values()) == 21578
    assert r5.info["filtered"]["no_body"] == 2535
    assert r5.info["filtered"]["several_topics"] == 1723
    assert r5.titles is not None and all(r5.titles)


def test_r2_is_earn_and_acq_subset_of_r5(r2, r5):
    assert len(r2) == 5860
    assert r2.name == "r2" and r2.label_names == ["acq", "earn"]
    assert set(r2.doc_ids) <= set(r5.doc_ids)


def test_reuters_text_is_clean_body(r5):
    doc = r5[int(r5.indices(["10"])[0])]  # NEWID 10, reut2-000.sgm
    assert doc["title"] == "COMPUTER TERMINAL SYSTEMS <CPML> COMPLETES SALE"
    assert doc["label"] == "acq"
    assert "to <Woodco Inc> of Houston" in doc["text"]  # &lt; unescaped, hard line breaks joined
    assert doc["text"].endswith("tags and ticket printers and terminals.")  # " Reuter\n&#3;" dropped
    assert not any(re.search(r"\breuter\W*(?:\b[a-z]\W*)?$", t, re.I) for t in r5.texts)
    # the trailer after a desk letter ("... August 3 to 10.\n REUTER N") and at a table row's end ("0 REUTER")
    assert r5.texts[r5.doc_ids.index("10280")].endswith("books close August 3 to 10.")
    assert _body_text("   SALT....--....22......0 REUTER\n&#3;") == "SALT....--....22......0"
    assert not any("&lt;" in t or "&#" in t or "\x03" in t for t in r5.texts)
    assert all(t.strip() for t in r5.texts)


# ----------------------------------------------------------------------------- Cranfield

@pytest.fixture(scope="module")
def cranfield() -> Corpus:
    _need(SHARED / "cranfield")
    return load_corpus("cranfield")


def test_cranfield_documents(cranfield):
    assert len(cranfield) == 1400
    assert cranfield.doc_ids[:3] == ["1", "2", "3"]
    assert cranfield.titles[0] == "experimental investigation of the aerodynamics of a wing in a slipstream ."
    # 471 and 995 are empty in the distribution: kept and listed, not silently dropped
    assert cranfield.info["empty_text"] == ["471", "995"]
    # doc 240 has stray ".A"/".B" marker lines inside its abstract; the text after them is kept
    t240 = cranfield.texts[239]
    assert "application to turbulent separations" in t240 and "\n.A" not in t240
    assert cranfield.info["stray_markers"] == 4
    # the abstract repeats the title, so the model input does not prepend it again
    assert cranfield.model_inputs()[0] == cranfield.texts[0]


def test_cranfield_queries_follow_qrel_numbering(cranfield):
    qs = load_queries("cranfield")
    assert len(qs) == 225 and sorted(qs.split_names) == ["dev", "test", "train"]  # splits: tests/test_titles.py
    assert qs.qids[:3] == ["1", "2", "3"]
    # the 3rd query of cran.qry is numbered 004 there and 3 in cranqrel
    assert qs.info["file_numbers"][:4] == ["001", "002", "004", "008"]
    assert qs.texts[2].startswith("what problems of heat conduction in composite slabs")
    i = qs.relevant[2].index("5")  # "3 5 3" in cranqrel: a double-layer slab paper
    assert qs.grades[2][i] == 2  # code 3 as a gain (5 - code): higher = more relevant, as TREC grades
    assert "485" not in qs.relevant[2]  # "3 485 -1": judged not relevant
    assert qs.relevant[0][0] == "184" and qs.grades[0][0] == 3  # "1 184 2"
    assert sum(map(len, qs.relevant)) == 1837 - 225 and qs.info["nonrelevant_judgements"] == 225
    qs.check_against(cranfield)
    assert len(load_queries("cranfield", split="test")) == 68


# ----------------------------------------------------------------------------- BBC

def test_bbc():
    bbc = load_corpus("bbc")
    assert len(bbc) == 2225
    assert bbc.label_names == ["business", "entertainment", "politics", "sports", "tech"]
    assert bbc.info["label_counts"]["business"] == 510
    from gdr.data.bbc import bbc_dir

    first_line = (bbc_dir() / "business" / "001.txt").read_text(encoding="utf-8").splitlines()[0]
    assert bbc.doc_ids[0] == "business/001" and bbc.titles[0] == first_line == "Ad sales boost Time Warner profit"
    assert bbc.texts[0].startswith("Quarterly profits at US media giant TimeWarner")
    assert bbc.info["decoded_with_fallback"] == ["sports/199"]
    assert "£15.8m" in bbc.texts[bbc.doc_ids.index("sports/199")]


# ----------------------------------------------------------------------------- containers

@pytest.fixture
def toy() -> Corpus:
    return Corpus(
        name="toy",
        doc_ids=["a", "b", "c", "d", "e"],
        texts=["alpha text", "beta text", "gamma text", "delta text", "epsilon text"],
        titles=["Alpha", None, "Gamma!", "Delta", None],
        labels=["x", "y", "x", "y", "x"],
    )


def test_select_keeps_order_of_indices(toy):
    sub = toy.select([3, 0, 4])
    assert sub.doc_ids == ["d", "a", "e"]
    assert sub.texts == ["delta text", "alpha text", "epsilon text"]
    assert sub.titles == ["Delta", "Alpha", None] and sub.labels == ["y", "x", "x"]
    assert toy.select(np.array([True, False, True, False, False])).doc_ids == ["a", "c"]
    assert len(toy.select([])) == 0
    with pytest.raises(IndexError, match="out of range"):
        toy.select([5])


def test_sample_is_uniform_sorted_and_deterministic(toy):
    a, b = toy.sample(3, seed=7), toy.sample(3, seed=7)
    assert a.doc_ids == b.doc_ids and len(a) == 3
    pos = toy.indices(a.doc_ids)
    assert list(pos) == sorted(pos)
    assert a.info["sample"] == {"n": 3, "seed": 7, "of": 5}
    assert toy.sample(5, seed=1).doc_ids == toy.doc_ids and toy.sample(99).doc_ids == toy.doc_ids
    assert toy.sample(None).doc_ids == toy.doc_ids
    # uniform: over many seeds every document is drawn about 3/5 of the time
    counts = np.zeros(5)
    for s in range(400):
        counts[toy.indices(toy.sample(3, seed=s).doc_ids)] += 1
    assert np.all(np.abs(counts / 400 - 0.6) < 0.1)


def test_model_inputs(toy):
    assert toy.model_inputs() == ["Alpha. alpha text", "beta text", "Gamma! gamma text", "Delta. delta text",
                                  "epsilon text"]
    assert toy.model_inputs(sep="\n")[0] == "Alpha\nalpha text"
    assert toy.model_inputs(with_title=False) == toy.texts


def test_dataset_view_round_trip(toy):
    ds = toy.dataset
    assert ds.column_names == ["doc_id", "text", "title", "label"] and len(ds) == 5
    assert ds[1] == {"doc_id": "b", "text": "beta text", "title": None, "label": "y"}
    back = Corpus.from_dataset(ds, name="toy")
    assert (back.doc_ids, back.texts, back.titles, back.labels) == (toy.doc_ids, toy.texts, toy.titles, toy.labels)
    plain = Corpus("p", ["1"], ["t"])
    assert plain.dataset[0] == {"doc_id": "1", "text": "t", "title": None, "label": None}


def test_corpus_rejects_duplicate_ids_and_ragged_columns():
    with pytest.raises(DataError, match="duplicate doc_id 'a'"):
        Corpus("bad", ["a", "b", "a"], ["x", "y", "z"])
    with pytest.raises(ValueError, match="2 texts for 3 doc_ids"):
        Corpus("bad", ["a", "b", "c"], ["x", "y"])


@pytest.fixture
def toy_queries() -> QuerySet:
    return QuerySet(
        name="toy",
        qids=["q1", "q2", "q3", "q1"],
        texts=["first", "second", "third", "first again"],
        relevant=[["a"], ["b", "c"], ["d"], ["e"]],
        splits=["train", "train", "test", "test"],
        grades=[[1], [2, 1], [1], [3]],
    )


def test_queryset_filter_select_qrels(toy_queries, toy):
    test = toy_queries.filter(split="test")
    assert test.qids == ["q3", "q1"] and test.texts == ["third", "first again"] and test.grades == [[1], [3]]
    assert len(toy_queries.filter(split=["train", "test"])) == 4
    assert toy_queries.filter().qids == toy_queries.qids
    assert toy_queries.select([1]).relevant == [["b", "c"]]
    assert toy_queries.filter(split="train").qrels() == {"q1": {"a": 1}, "q2": {"b": 1, "c": 1}}
    with pytest.raises(DataError, match="several splits"):
        toy_queries.qrels()
    with pytest.raises(DataError, match="no split 'dev'"):
        toy_queries.filter(split="dev")
    toy_queries.check_against(toy)
    with pytest.raises(DataError, match="query 'q9' .* names doc_id 'zz'"):
        QuerySet("t", ["q9"], ["x"], [["zz"]], ["test"]).check_against(toy)
    with pytest.raises(DataError, match="duplicate qid 'q1' in split 'train'"):
        QuerySet("t", ["q1", "q1"], ["x", "y"], [["a"], ["b"]], ["train", "train"])


# ----------------------------------------------------------------------------- BEIR

def test_beir_round_trip(tmp_path, toy, toy_queries):
    folder = write_beir(toy, toy_queries.filter(split="test"), tmp_path / "toy-beir")
    assert (folder / "qrels" / "test.tsv").read_text().splitlines()[0] == "query-id\tcorpus-id\tscore"
    c = load_corpus("beir", path=folder)
    assert c.name == "toy-beir"
    assert (c.doc_ids, c.texts, c.titles, c.labels) == (toy.doc_ids, toy.texts, toy.titles, toy.labels)
    q = load_queries("beir", path=folder)
    want = toy_queries.filter(split="test")
    assert (q.qids, q.texts, q.relevant, q.splits, q.grades) == (
        want.qids, want.texts, want.relevant, want.splits, want.grades)
    # the folder path also works as the corpus name
    assert load_corpus(str(folder)).doc_ids == toy.doc_ids


def test_beir_splits_and_nonrelevant(tmp_path, toy):
    qs = QuerySet("t", ["q1", "q2"], ["one", "two"], [["a"], ["b"]], ["train", "test"])
    folder = write_beir(toy, qs, tmp_path / "b")
    with open(folder / "qrels" / "test.tsv", "a") as f:
        f.write("q2\tc\t0\n")  # judged non-relevant
    q = load_beir_queries(folder)
    assert q.split_names == ["train", "test"] and q.relevant == [["a"], ["b"]]
    assert q.info["nonrelevant_judgements"] == 1
    assert load_beir_queries(folder, split="train").qids == ["q1"]
    with pytest.raises(FileNotFoundError, match=r"no qrels for split 'dev'.*available splits: \['train', 'test'\]"):
        load_beir_queries(folder, split="dev")


def test_a_beir_folders_graded_qrels_take_min_relevance_on_every_route(tmp_path, toy):
    """data.min_relevance was refused for data=beir and, given with ++, read at 1: 2 keeps the highly relevant
    judgement alone, by gdr.load_queries and by the run's query splits (data=beir and data.name=<folder>)."""
    qs = QuerySet("t", ["q1", "q2"], ["one", "two"], [["a"], ["b"]], ["test", "test"])
    folder = write_beir(toy, qs, tmp_path / "b")
    with open(folder / "qrels" / "test.tsv", "a") as f:
        f.write("q1\tc\t2\n")  # q1: a is relevant (1), c highly relevant (2); q2: b relevant (1)
    assert load_queries(str(folder)).relevant == [["a", "c"], ["b"]]
    high = load_queries(str(folder), min_relevance=2)
    assert (high.qids, high.relevant) == (["q1"], [["c"]])
    for data in (["data=beir", f"data.path={folder}", "data.min_relevance=2"],
                 [f"data.name={folder}", "++data.min_relevance=2"]):
        cfg = OmegaConf.to_container(load_config("run", [*data, "queries.test_split=test"]), resolve=True)
        split = QuerySplits(cfg["data"], toy.doc_ids)({**cfg["queries"], "split": "test"})
        assert (split.qids, split.relevant) == (["q1"], [["c"]]), data


def test_beir_rewritten_with_other_queries_holds_those_only(tmp_path, toy):
    folder = tmp_path / "b"
    write_beir(toy, QuerySet("t", ["t1", "e1"], ["one", "two"], [["a"], ["b"]], ["train", "test"]), folder)
    # the train topics now scored as test topics: the first write's train.tsv must not stay to be trained on
    write_beir(toy, QuerySet("t", ["t1"], ["one"], [["a"]], ["test"]), folder)
    assert sorted(p.name for p in (folder / "qrels").iterdir()) == ["test.tsv"]
    q = load_beir_queries(folder)
    assert (q.qids, q.splits) == (["t1"], ["test"])
    (folder / "qrels" / "test.tsv").write_text("")  # emptied: named, not "no split 'test'"
    with pytest.raises(DataError, match=r"qrels/test\.tsv: no judgements \(the file is empty\)"):
        load_beir_queries(folder)
    write_beir(toy, None, folder)  # documents only: no query file of the earlier writes is left
    assert not (folder / "queries.jsonl").exists() and not any((folder / "qrels").iterdir())


def _beir(tmp_path: Path, corpus: str, queries: str = '{"_id": "q1", "text": "a query"}\n',
          qrels: str = "query-id\tcorpus-id\tscore\nq1\td1\t1\n") -> Path:
    folder = tmp_path / "bad"
    (folder / "qrels").mkdir(parents=True)
    (folder / "corpus.jsonl").write_bytes(corpus.encode("utf-8") if isinstance(corpus, str) else corpus)
    (folder / "queries.jsonl").write_text(queries)
    (folder / "qrels" / "test.tsv").write_text(qrels)
    return folder


GOOD_DOC = '{"_id": "d1", "title": "T", "text": "some text"}\n'


@pytest.mark.parametrize(
    "corpus, pattern",
    [
        (GOOD_DOC + '{"_id": "d1", "text": "again"}\n',
         r"corpus\.jsonl:2: duplicate doc_id 'd1' \(first seen at .*corpus\.jsonl:1\)"),
        (GOOD_DOC + '{"_id": "d2", "title": "", "text": "  "}\n',
         r"corpus\.jsonl:2: document 'd2' has empty text.*on_empty='drop'"),
        (GOOD_DOC + '{"_id": "d2", "text": "x"\n', r"corpus\.jsonl:2: not valid JSON .*fix or delete that line"),
        (GOOD_DOC + '{"title": "no id", "text": "x"}\n', r"corpus\.jsonl:2: record has no '_id'"),
        (GOOD_DOC + '{"_id": "d2"}\n', r"corpus\.jsonl:2: document 'd2' has no 'text' field"),
        (GOOD_DOC.encode() + b'{"_id": "d2", "text": "caf\xe9"}\n',
         r"corpus\.jsonl:2: byte b'\\xe9' at column 27 is not valid utf-8; re-encode"),
    ],
    ids=["duplicate-id", "empty-text", "bad-json", "no-id", "no-text", "undecodable"],
)
def test_beir_bad_corpus(tmp_path, corpus, pattern):
    with pytest.raises(DataError, match=pattern):
        load_beir(_beir(tmp_path, corpus))


def test_beir_on_empty_options(tmp_path):
    folder = _beir(tmp_path, GOOD_DOC + '{"_id": "d2", "title": "Only a title", "text": ""}\n')
    dropped = load_beir(folder, on_empty="drop")
    assert dropped.doc_ids == ["d1"] and dropped.info["filtered"] == {"empty_text": 1}
    titled = load_corpus("beir", path=folder, on_empty="title")
    assert titled.texts[1] == "Only a title" and titled.info["text_from_title"] == ["d2"]


@pytest.mark.parametrize(
    "queries, qrels, pattern",
    [
        (None, "query-id\tcorpus-id\tscore\nq1\td9\t1\n", r"qrels/test\.tsv:2: corpus-id 'd9' is not in the corpus"),
        (None, "query-id\tcorpus-id\tscore\nq7\td1\t1\n", r"qrels/test\.tsv:2: query-id 'q7' is not in queries\.jsonl"),
        (None, "query-id\tcorpus-id\tscore\nq1\td1\n", r"qrels/test\.tsv:2: expected 3 tab-separated columns"),
        (None, "query-id\tcorpus-id\tscore\nq1\td1\t1\nq1\td1\t2\n",
         r"test\.tsv:3: query 'q1' and doc 'd1' were already judged on line 2"),
        (None, "q1\td1\tscore\n", r"test\.tsv:1: score 'score' is not a number \(the first line must be the header"),
        ('{"_id": "q1", "text": "a"}\n{"_id": "q1", "text": "b"}\n', None,
         r"queries\.jsonl:2: duplicate query _id 'q1' \(first on line 1\)"),
        ('{"_id": "q1", "text": ""}\n', None, r"queries\.jsonl:1: query 'q1' has empty text"),
        ('{"_id": "q1", "query": "a"}\n', None, r"queries\.jsonl:1: query 'q1' has no 'text' field \(fields: _id, "
                                                r"query\); name its text field 'text'"),
        (None, "query-id\tcorpus-id\tscore\nq1\td1\t0.5\n", r"test\.tsv:2: score '0.5' is not an integer grade"),
    ],
    ids=["unknown-doc", "unknown-query", "columns", "double-judgement", "bad-header", "duplicate-query", "empty-query",
         "no-text-field", "fractional-score"],
)
def test_beir_bad_queries(tmp_path, queries, qrels, pattern):
    kw = {k: v for k, v in {"queries": queries, "qrels": qrels}.items() if v is not None}
    with pytest.raises(DataError, match=pattern):
        load_beir_queries(_beir(tmp_path, GOOD_DOC, **kw))


def test_beir_missing_files(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nowhere: BEIR folder does not exist"):
        load_beir(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"empty/corpus\.jsonl: BEIR corpus does not exist"):
        load_corpus("beir", path=tmp_path / "empty")
    with pytest.raises(ValueError, match="needs path="):
        load_corpus("beir")


# ----------------------------------------------------------------------------- MS MARCO Lite

MSM = FIX / "msmarco-lite"


def test_msmarco_lite_fixture():
    c = load_corpus("msmarco-lite", path=MSM, docs_tsv=MSM / "msmarco-docs.tsv")
    assert c.doc_ids == ["D3", "D1", "D5"]  # the order of docids.tsv; D2 and D4 are not listed
    assert c.titles == ["Fish", "Tiny fixtures", "A page with only a title"]
    assert c.texts[1] == "A tiny fixture is a small hand-written file used in tests."
    assert c.texts[2] == "A page with only a title" and c.info["text_from_title"] == ["D5"]
    q = load_queries("msmarco-lite", path=MSM)
    assert q.qids == ["dev-0", "dev-1", "dev-2", "dev-3"] and q.split_names == ["dev"]
    assert q.texts[1] == "how many fish in the sea" and q.relevant == [["D1"], ["D3"], ["D5"], ["D1"]]
    q.check_against(c)
    # the docs TSV found inside the folder when docs_tsv is not given
    assert load_corpus("msmarco-lite", path=MSM).doc_ids == c.doc_ids


def test_msmarco_lite_shared_queries():
    q = load_queries("msmarco-lite", split="dev")
    assert len(q) == 2792 and q.texts[0] == "androgen receptor define" and q.relevant[0] == ["D1650436"]
    assert sum(r == ["D1673949"] for r in q.relevant) == 166


def test_msmarco_lite_errors(tmp_path):
    with pytest.raises(DataError, match=r"msmarco-docs\.tsv:5: document 'D5' has empty text; fill it in"):
        load_corpus("msmarco-lite", path=MSM, on_empty="error")
    folder = tmp_path / "m"
    shutil.copytree(MSM, folder)
    docs = folder / "msmarco-docs.tsv"
    docs.write_text("".join(l for l in docs.read_text().splitlines(True) if not l.startswith("D5")))
    with pytest.raises(DataError, match=r"msmarco-docs\.tsv: 1 of the 3 ids listed in .*docids\.tsv are not in it "
                                        r"\(first: D5\); docs_tsv must be the MS MARCO v1"):
        load_corpus("msmarco-lite", path=folder)
    (folder / "query2docid.dev.tsv").write_text("query\tdocid\nok\tD1\nwhich doc\tD2\n")
    with pytest.raises(DataError, match=r"query2docid\.dev\.tsv:3: doc id 'D2' is not in docids\.tsv"):
        load_queries("msmarco-lite", path=folder)
    with pytest.raises(FileNotFoundError, match=r"msmarco-docs\.tsv: MS MARCO v1 document TSV does not exist"):
        load_corpus("msmarco-lite", path=folder, docs_tsv=folder / "absent" / "msmarco-docs.tsv")
    (folder / "docids.tsv").write_text("docid\nD1\nD3\nD1\n")
    with pytest.raises(DataError, match=r"docids\.tsv:4: duplicate id 'D1' \(first on line 2\)"):
        load_corpus("msmarco-lite", path=folder)


# ----------------------------------------------------------------------------- NQ320K

def test_nq320k_nci_layout():
    folder = FIX / "nq320k-nci"
    c = load_corpus("nq320k", path=folder)
    assert c.doc_ids == ["0", "1", "2"] and c.titles is None and c.info["layout"] == "content"
    assert c.texts[2].startswith("Mount Everest Mount Everest is the highest")
    q = load_queries("nq320k", path=folder)
    assert q.split_names == ["train", "dev"] and len(q) == 4
    assert q.qids[:2] == ["-1001", "-1002"] and q.relevant[1] == ["1"]  # "1.0" written by pandas reads as "1"
    dev = load_queries("nq320k", split="dev", path=folder)
    assert dev.qids == ["5001"] and dev.texts == ["what is the highest mountain"] and dev.relevant == [["2"]]
    q.check_against(c)


def test_nq320k_simple_layout():
    folder = FIX / "nq320k-simple"
    c = load_corpus("nq320k", path=folder)
    assert c.doc_ids == ["d0", "d1", "d2"] and c.titles == ["Eiffel Tower", "Python (programming language)", None]
    assert c.info["layout"] == "simple"
    q = load_queries("nq320k", path=folder)
    assert q.qids == ["train-0", "train-1", "dev-0"] and q.relevant == [["d0"], ["d1"], ["d1"]]


def test_nq320k_title_abs_layout(tmp_path):
    rows = ["eiffel tower The tower is in Paris.\t-1\t0\t1-1", "python Python is a language.\t-2\t1\t2-1",
            "eiffel tower The tower is in Paris.\t-3\t0\t1-1"]
    (tmp_path / "nq_title_abs.tsv").write_text("\n".join(rows) + "\n")
    (tmp_path / "nq_dev_doc_newid.tsv").write_text("where is the tower\t-3\t0\t1-1\n")
    c = load_corpus("nq320k", path=tmp_path)
    assert c.doc_ids == ["0", "1"] and c.info["repeated_rows"] == 1
    assert load_queries("nq320k", path=tmp_path).relevant == [["0"]]
    rows[2] = "eiffel tower A different text.\t-3\t0\t1-1"
    (tmp_path / "nq_title_abs.tsv").write_text("\n".join(rows) + "\n")
    with pytest.raises(DataError, match=r"nq_title_abs\.tsv:3: doc id '0' repeats with a different text than at "
                                        r".*nq_title_abs\.tsv:1"):
        load_corpus("nq320k", path=tmp_path)


def test_nq320k_errors(tmp_path):
    folder = tmp_path / "nq"
    shutil.copytree(FIX / "nq320k-nci", folder)
    (folder / "nq_dev_doc_newid.tsv").write_text("a question\t5001\t7\t9-9\n")
    with pytest.raises(DataError, match=r"nq_dev_doc_newid\.tsv:1: doc id '7' is not in the NQ320K documents file"):
        load_queries("nq320k", path=folder)
    (folder / "nq_dev_doc_newid.tsv").write_text("a question\t5001\t2\t9-9\nanother\t5001\t1\t1-1\n")
    with pytest.raises(DataError, match=r"nq_dev_doc_newid\.tsv:2: duplicate example_id '5001' \(first on line 1\)"):
        load_queries("nq320k", split="dev", path=folder)
    with open(folder / "NQ_doc_content.tsv", "a") as f:
        f.write("1\t\t\tDuplicate page\t\t\ten\n")
    with pytest.raises(DataError, match=r"NQ_doc_content\.tsv:4: duplicate doc_id '1' \(first seen at "):
        load_corpus("nq320k", path=folder)
    (folder / "NQ_doc_content.tsv").write_text("0\tonly two columns\n")
    with pytest.raises(DataError, match=r"NQ_doc_content\.tsv:1: 2 tab-separated columns; expected 3"):
        load_corpus("nq320k", path=folder)
    with pytest.raises(FileNotFoundError, match="NQ320K folder does not exist"):
        load_corpus("nq320k", path=tmp_path / "absent")


# ----------------------------------------------------------------------------- Cranfield errors, paths, conf

def _mini_cranfield(folder: Path, qrel: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "cran.all.1400").write_text(".I 1\n.T\nfirst title .\n.A\nsomeone\n.B\nj. 1\n.W\nfirst title .\n"
                                          "an abstract .\n.I 2\n.T\nsecond .\n.A\n.B\n.W\nsecond abstract .\n")
    (folder / "cran.qry").write_text(".I 001\r\n.W\r\nwhat is first .\r\n.I 004\r\n.W\r\nwhat is second .\r\n")
    (folder / "cranqrel").write_text(qrel)
    return folder


def test_cranfield_mini_and_data_dir_override(tmp_path, monkeypatch):
    _mini_cranfield(tmp_path / "cranfield", "1 1 2\n2 2 1\n2 1 -1\n")
    monkeypatch.setenv("GDR_DATA_DIR", str(tmp_path))
    assert data_dir() == tmp_path.resolve()
    c = load_corpus("cranfield")
    assert c.doc_ids == ["1", "2"] and c.titles == ["first title .", "second ."]
    q = load_queries("cranfield")
    assert q.qids == ["1", "2"] and q.relevant == [["1"], ["2"]] and q.grades == [[3], [4]]  # codes 2, 1
    assert q.info["file_numbers"] == ["001", "004"] and q.texts[1] == "what is second ."


@pytest.mark.parametrize(
    "qrel, pattern",
    [
        ("1 1 2\n3 2 1\n", r"cranqrel:2: query number 3 is outside 1\.\.2; cranqrel numbers the queries"),
        ("1 1 2\n2 9 1\n", r"cranqrel:2: doc id '9' is not in cran\.all\.1400"),
        ("1 1 2\n2 2 5\n", r"cranqrel:2: relevance code 5 is not one of -1, 1, 2, 3, 4"),
        ("1 1 2\n2 x 1\n", r"cranqrel:2: expected 'query doc code' \(three integers\)"),
        ("1 1 2\n1 1 3\n2 2 1\n", r"cranqrel:2: query 1 and doc 1 were already judged on line 1"),
        ("1 1 2\n2 2 -1\n", r"cranqrel: query 2 \(cran\.qry:4, number 004 there\) has no relevant document"),
    ],
    ids=["query-range", "unknown-doc", "bad-code", "not-integers", "double-judgement", "no-relevant"],
)
def test_cranfield_bad_qrels(tmp_path, qrel, pattern):
    with pytest.raises(DataError, match=pattern):
        load_queries("cranfield", path=_mini_cranfield(tmp_path / "c", qrel))


def test_cranfield_duplicate_doc_and_missing_file(tmp_path):
    folder = _mini_cranfield(tmp_path / "c", "1 1 2\n2 2 1\n")
    with open(folder / "cran.all.1400", "a") as f:
        f.write(".I 2\n.T\ndup\n.A\n.B\n.W\nagain .\n")
    with pytest.raises(DataError,
                       match=r"cran\.all\.1400:18: duplicate doc_id '2' \(first seen at .*cran\.all\.1400:11\)"):
        load_corpus("cranfield", path=folder)
    (folder / "cran.all.1400").unlink()
    with pytest.raises(FileNotFoundError,
                       match=r"cran\.all\.1400: Cranfield documents does not exist; pass data\.path="):
        load_corpus("cranfield", path=folder)


def test_default_data_dir_is_beside_the_repo(monkeypatch):
    monkeypatch.delenv("GDR_DATA_DIR", raising=False)
    assert data_dir() == (Path(gdr.__file__).resolve().parents[1] / ".." / "shared" / "data").resolve()


def test_reuters_missing_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nowhere: Reuters-21578 folder does not exist"):
        load_corpus("r5", path=tmp_path / "nowhere")
    (tmp_path / "reut2-000.sgm").write_text("")
    with pytest.raises(FileNotFoundError, match=r"found 1 reut2-\*\.sgm files, expected 22"):
        load_corpus("r2", path=tmp_path)


@pytest.mark.parametrize("damage, where", [
    ("cut", r"reut2-003\.sgm:\d+: <REUTERS> without </REUTERS>: the file is truncated"),
    ("</REUTERS>", r"reut2-003\.sgm:\d+: the story of NEWID \d+ holds the start of another story"),
    ("</BODY>", r"reut2-003\.sgm:\d+: the story of NEWID \d+ opens <BODY> without closing it"),
    ("whole stories", r"20,578 stories in its reut2-\*\.sgm files, expected 21,578"),
])
def test_a_damaged_reuters_file_is_refused_by_name(tmp_path, damage, where):
    _need(SHARED / "reuters21578")
    for f in (SHARED / "reuters21578").glob("reut2-*.sgm"):
        (tmp_path / f.name).symlink_to(f)
    name = "reut2-003.sgm"
    text = (tmp_path / name).read_bytes()
    (tmp_path / name).unlink()
    if damage == "cut":
        text = text[: len(text) // 2]
    elif damage == "whole stories":  # cut at a story's end: every tag closes, 1,000 stories fewer
        text = text[: text.index(b"<REUTERS")]
    else:
        text = text.replace(damage.encode(), b"", 1)
    (tmp_path / name).write_bytes(text)
    with pytest.raises(DataError, match=where):
        load_corpus("r5", path=tmp_path)


def test_load_corpus_argument_errors():
    with pytest.raises(ValueError, match="unknown corpus 'r7'"):
        load_corpus("r7")
    with pytest.raises(ValueError, match="corpus 'cranfield' has no document splits"):
        load_corpus("cranfield", split="test")
    with pytest.raises(ValueError, match="'bbc' has no query set"):
        load_queries("bbc")


@pytest.mark.parametrize("name, extra", [("bbc", {"drop_title": False}), ("r2", {"drop_title": False}),
                                         ("r5", {"drop_title": False}),
                                         ("cranfield", {"on_empty": None, "drop_title": False})])
def test_conf_data_files(name, extra):
    cfg = OmegaConf.load(CONF / f"{name}.yaml")
    assert dict(cfg) == {"name": name, "path": None, "n_docs": None, "seed": 0, **extra}


def test_conf_n_docs_feeds_load_corpus():
    cfg = OmegaConf.load(CONF / "cranfield.yaml")
    c = load_corpus(cfg.name, path=cfg.path, n_docs=50, seed=cfg.seed)
    assert len(c) == 50 and c.doc_ids == load_corpus("cranfield", n_docs=50, seed=0).doc_ids


def test_a_dataframe_gives_the_corpus_its_records_give_as_a_file(tmp_path):
    """The same records by from_pandas and by data=jsonl: the id the reader takes first (_id before doc_id), titles
    stripped; a label missing in one row is refused as the reader refuses it, not made a class "None", and a float
    column of integer labels (pandas' with a gap) keeps the integers."""
    rows = [{"_id": "b1", "doc_id": "orig1", "text": "alpha", "title": " Title one ", "label": 1},
            {"_id": "b2", "doc_id": "orig2", "text": "beta", "title": "Two", "label": 2}]
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    from_file = load_corpus("jsonl", path=tmp_path / "docs.jsonl")
    frame = Corpus.from_pandas(pd.DataFrame(rows))
    assert (frame.doc_ids, frame.titles, frame.labels) == (from_file.doc_ids, from_file.titles, from_file.labels)
    assert frame.doc_ids == ["b1", "b2"] and frame.titles == ["Title one", "Two"] and frame.labels == ["1", "2"]
    gap = pd.DataFrame({"id": ["1", "2", "3"], "text": ["a", "b", "c"], "label": [1, None, 2]})
    with pytest.raises(DataError, match=r"document '2' has no label while others do"):
        Corpus.from_pandas(gap)
    assert Corpus.from_pandas(gap.dropna()).labels == ["1", "2"]


def test_a_byte_order_mark_or_a_gzip_without_its_suffix_reads_as_the_plain_file(tmp_path):
    """An editor's UTF-8 byte-order mark opening a BEIR folder's files or a TREC file (which a folder then left out
    as "no TREC SGML"), and a gzip file named .jsonl: each read as the plain file is. A score of 0.7 is refused,
    not read as a non-relevant 0."""
    bom = "\ufeff"
    b = tmp_path / "b"
    (b / "qrels").mkdir(parents=True)
    records = '{"_id": "d1", "text": "alpha beta"}\n{"_id": "d2", "text": "gamma"}\n'
    (b / "corpus.jsonl").write_text(bom + records, encoding="utf-8")
    (b / "queries.jsonl").write_text(bom + '{"_id": "q1", "text": "alpha"}\n', encoding="utf-8")
    (b / "qrels" / "test.tsv").write_text(bom + "query-id\tcorpus-id\tscore\nq1\td1\t1\n", encoding="utf-8")
    assert load_corpus("beir", path=b).doc_ids == ["d1", "d2"]
    assert load_queries(str(b)).relevant == [["d1"]]
    trec = tmp_path / "trec"
    trec.mkdir()
    (trec / "x.sgml").write_text(bom + "<DOC><DOCNO>B1</DOCNO><TEXT>hello world</TEXT></DOC>\n", encoding="utf-8")
    (trec / "y.sgml").write_text("<DOC><DOCNO>B2</DOCNO><TEXT>bye world</TEXT></DOC>\n", encoding="utf-8")
    assert load_corpus("trec", path=trec).doc_ids == ["B1", "B2"]
    (tmp_path / "zipped.jsonl").write_bytes(gzip.compress(records.encode()))
    assert load_corpus("jsonl", path=tmp_path / "zipped.jsonl").doc_ids == ["d1", "d2"]
    (b / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t0.7\n")
    with pytest.raises(DataError, match=r"test.tsv:2: score '0.7' is not an integer grade"):
        load_queries(str(b))
