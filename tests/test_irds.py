"""Collections by ir_datasets id (gdr.data.irds), offline: a dataset registered from local files in the test."""
from __future__ import annotations

import sys
from typing import NamedTuple

import ir_datasets  # in the test extra: a missing package fails here, it is never skipped
import pytest

import gdr
from gdr.config import load_config
from gdr.data import DataError, corpus_from_config
from gdr.data.irds import irds_split, load_irds, load_irds_queries, load_irds_query_sets
from gdr.data.splits import split_queries
from gdr.rules import ConfigError
from gdr.validate import validate

TOY = "gdr-toy"  # registered once per process (ir_datasets' registry refuses a second registration of a name)
N_DOCS = 12


class ToyDoc(NamedTuple):
    doc_id: str
    title: str
    text: str

    def default_text(self):
        return f"{self.title} {self.text}"


@pytest.fixture(scope="module")
def toy(tmp_path_factory) -> str:
    """``gdr-toy`` (12 documents with titles), ``gdr-toy/test`` (3 judged queries, one judged non-relevant doc and one
    query without a relevant doc) and ``gdr-toy/train`` (2 queries), read from local TSV and qrels files."""
    from ir_datasets.datasets.base import Dataset
    from ir_datasets.formats import GenericQuery, TrecQrels, TsvDocs, TsvQueries
    from ir_datasets.util import LocalDownload

    root = tmp_path_factory.mktemp("irds")
    docs = root / "docs.tsv"
    docs.write_text("".join(f"d{i}\ttitle {i}\tbody of document {i} about topic{i % 3}\n" for i in range(N_DOCS)))
    files = {"test": ("q1\tdocument seven\nq2\ttopic one\nq3\tnothing relevant\n",
                      "q1 0 d7 2\nq2 0 d1 1\nq2 0 d4 1\nq2 0 d10 0\nq3 0 d2 0\n"),
             "train": ("t1\tdocument three\nt2\tdocument five\n", "t1 0 d3 1\nt2 0 d5 1\n")}
    if TOY not in ir_datasets.registry._registered:
        doc_handler = TsvDocs(LocalDownload(docs), doc_cls=ToyDoc)
        ir_datasets.registry.register(TOY, Dataset(doc_handler))
        for split, (queries, qrels) in files.items():
            (root / f"{split}.queries.tsv").write_text(queries)
            (root / f"{split}.qrels").write_text(qrels)
            ir_datasets.registry.register(f"{TOY}/{split}", Dataset(
                doc_handler, TsvQueries(LocalDownload(root / f"{split}.queries.tsv"), GenericQuery),
                TrecQrels(LocalDownload(root / f"{split}.qrels"), {0: "not relevant", 1: "relevant", 2: "key"})))
        other = root / "other.tsv"  # another collection, judged by the same queries
        other.write_text("x1\tx\tanother collection\n")
        ir_datasets.registry.register(f"{TOY}-other/train", Dataset(
            TsvDocs(LocalDownload(other), doc_cls=ToyDoc), TsvQueries(LocalDownload(root / "train.queries.tsv")),
            TrecQrels(LocalDownload(root / "train.qrels"), {1: "relevant"})))
    return f"{TOY}/test"


def test_documents_queries_and_qrels_are_read_through_ir_datasets(toy):
    corpus = gdr.load_corpus(f"irds:{toy}")
    assert corpus.doc_ids == [f"d{i}" for i in range(N_DOCS)]
    assert corpus.titles[7] == "title 7" and corpus.texts[7] == "body of document 7 about topic1"
    assert corpus.info["data"] == {"name": f"irds:{toy}"}
    qs = gdr.load_queries(f"irds:{toy}")
    # q3 has only a non-relevant judgement: not a query of the set; d10's grade 0 is not relevant
    assert qs.qids == ["q1", "q2"] and qs.texts == ["document seven", "topic one"]
    assert qs.relevant == [["d7"], ["d1", "d4"]] and qs.grades == [[2], [1, 1]] and qs.splits == ["test", "test"]
    assert qs.info["filtered"]["no_relevant"] == 1
    assert load_irds_queries(f"{TOY}/train").splits == ["train", "train"]
    assert load_irds_queries(toy, min_relevance=2).qids == ["q1"]


def test_the_split_is_the_one_the_id_names():
    assert irds_split("msmarco-passage/dev/small") == "dev"
    assert irds_split("beir/scifact/train") == "train"
    assert irds_split("beir/fiqa/test") == "test"
    assert irds_split("vaswani") == "test"


def test_a_subset_keeps_the_judged_documents_first(toy):
    sub = load_irds(toy, n_docs=5, seed=0)
    # d7, d1, d4 judged relevant; d10 (grade 0) and d2 (q3) judged; so all of these and no other
    assert set(sub.doc_ids) == {"d1", "d2", "d4", "d7", "d10"}
    assert sub.doc_ids == sorted(sub.doc_ids, key=lambda d: int(d[1:]))  # collection order
    assert sub.info["sample"] == {"n": 5, "seed": 0, "of": N_DOCS, "judged_relevant": 3, "judged": 5}
    two = load_irds(toy, n_docs=2, seed=3)
    assert set(two.doc_ids) <= {"d1", "d4", "d7"}  # fewer than the relevant ones: a draw among them
    eight = [load_irds(toy, n_docs=8, seed=s).doc_ids for s in (0, 0, 1)]
    assert eight[0] == eight[1] and {"d1", "d2", "d4", "d7", "d10"} <= set(eight[0]) and len(eight[0]) == 8
    assert eight[2] != eight[0]  # another seed draws other unjudged documents


def test_data_irds_in_a_config(toy):
    cfg = load_config("run", ["data=irds", f"data.id={toy}", "data.n_docs=6"])
    validate("run", cfg)
    data = {k: v for k, v in dict(cfg.data).items()}
    corpus = corpus_from_config(data)
    assert len(corpus) == 6 and {"d1", "d4", "d7"} <= set(corpus.doc_ids)
    test = split_queries({"name": cfg.queries.name, "split": "test", "path": None}, data, set(corpus.doc_ids))
    assert test.qids == ["q1", "q2"]
    assert split_queries({"name": "irds", "split": "train", "path": None}, data, set(corpus.doc_ids)) is None


def test_an_unknown_id_is_refused_with_the_closest(toy):
    cfg = load_config("run", ["data=irds", f"data.id={TOY}/tset"])
    with pytest.raises(ConfigError, match=r"data.id.*not an ir_datasets id; did you mean gdr-toy/test"):
        validate("run", cfg)
    with pytest.raises(ConfigError, match=r"data.id=\?\?\?: missing mandatory value"):
        validate("run", load_config("run", ["data=irds"]))
    with pytest.raises(ValueError, match="not an ir_datasets id"):
        gdr.load_corpus("irds:no/such/dataset")
    with pytest.raises(ValueError, match="path= does not apply to an ir_datasets id"):
        gdr.load_corpus(f"irds:{toy}", path="/tmp")


def test_gdr_run_on_an_ir_datasets_id(toy, tmp_path, capsys):
    """`gdr run data=irds data.id=...` end to end with tiny models: the test split of the id is scored, the train
    split (another id) is not read, and the report names the collection."""
    from tiny_models import saved_tiny_llama

    from gdr.cli import main

    saved_tiny_llama(tmp_path / "lm")
    out = tmp_path / "run"
    argv = ["run", "data=irds", f"data.id={toy}", "data.n_docs=10", f"model.name={tmp_path / 'lm'}",
            "model.max_doc_tokens=16", "sample.n_queries=8", "sample.batch_size=8", "sample.max_new_tokens=4",
            "doc_queries.per_doc=1", "indexers=[gc]", "index.n_clusters=3", "index.leaf_size=3",
            "index.gc.n_init=1", "index.gc.n_init_inner=1", "train.model.size=tiny", "train.trainer.max_steps=2",
            "train.trainer.batch_size=8", "train.trainer.enable_progress_bar=false", "train.trainer.tensorboard=false",
            "train.trainer.val_beam=2", "train.trainer.num_sanity_val_steps=0", "train.optim.warmup_steps=1",
            "evaluate.k=5", "evaluate.beam=5", "seeds=[0]", "progress=false", "threads=1", f"out={out}"]
    assert main(argv) == 0
    report = (out / "report.json").read_text()
    assert '"bm25"' in report and "gdr-toy/test" in (out / "report.md").read_text()
    bm25 = next(out.glob("bm25-*"))
    assert (bm25 / "qrels.txt").read_text().splitlines() == ["q1 0 d7 1", "q2 0 d1 1", "q2 0 d4 1"]


def test_query_ids_add_their_splits_and_their_judged_documents(toy):
    data = {"name": "irds", "id": toy, "query_ids": [f"{TOY}/train"], "n_docs": 7}
    validate("run", load_config("run", ["data=irds", f"data.id={toy}", f"data.query_ids=[{TOY}/train]"]))
    corpus = corpus_from_config(data)
    # judged relevant by the test (d1, d4, d7) or the train queries (d3, d5), judged not relevant (d2, d10)
    assert corpus.doc_ids == ["d1", "d2", "d3", "d4", "d5", "d7", "d10"]
    train = split_queries({"name": "irds", "split": "train", "path": None}, data, set(corpus.doc_ids))
    assert train.qids == ["t1", "t2"] and train.relevant == [["d3"], ["d5"]]
    test = split_queries({"name": "irds", "split": "test", "path": None}, data, set(corpus.doc_ids))
    assert test.qids == ["q1", "q2"]
    with pytest.raises(DataError, match="name the split 'test' twice"):
        load_irds_query_sets(toy, [toy])
    with pytest.raises(DataError, match=r"judges the documents of 'gdr-toy-other/train'.*name ids of one collection"):
        load_irds_query_sets(toy, [f"{TOY}-other/train"])
    with pytest.raises(ConfigError, match=r"data.query_ids.*'gdr-toy/tset' is not an ir_datasets id"):
        validate("run", load_config("run", ["data=irds", f"data.id={toy}", f"data.query_ids=[{TOY}/tset]"]))


def test_files_that_do_not_come_are_one_line_naming_the_id(toy, tmp_path):
    """ir_datasets fetches a collection's files on first use: without a network that is an OSError deep in requests
    (here, a local file that is not there), which is said in one line naming the id and the way out."""
    from ir_datasets.datasets.base import Dataset
    from ir_datasets.formats import TsvDocs
    from ir_datasets.util import LocalDownload

    gone = f"{TOY}-unreachable"
    if gone not in ir_datasets.registry._registered:
        ir_datasets.registry.register(gone, Dataset(TsvDocs(LocalDownload(tmp_path / "nowhere.tsv"), doc_cls=ToyDoc)))
    with pytest.raises(DataError, match=rf"ir_datasets id '{gone}': its files could not be read or downloaded "
                                        r"\(\w+Error: .*IR_DATASETS_HOME"):
        gdr.load_corpus(f"irds:{gone}")


def test_without_ir_datasets_the_error_names_the_extra(toy, monkeypatch):
    monkeypatch.setitem(sys.modules, "ir_datasets", None)  # as if it were not installed
    with pytest.raises(ImportError, match=r"data=irds needs ir_datasets: pip install 'gdr\[irds\]'"):
        gdr.load_corpus(f"irds:{toy}")
    with pytest.raises(ConfigError, match=r"data.id=gdr-toy/test: data=irds needs ir_datasets: pip install"):
        validate("run", load_config("run", ["data=irds", f"data.id={toy}"]))
