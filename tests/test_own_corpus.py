"""A researcher's own corpus: plain files and in-memory corpora in, the same way through the CLI and the
API; arguments checked before a model loads; the API doing what it says; the smaller frictions. Tiny models,
offline, CPU."""
from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
from test_pipeline import _args, setup  # noqa: F401  (module fixture: a saved tiny LM and a 30-document corpus)

import gdr
from gdr.cli import main
from gdr.data import Corpus, DataError, load_corpus, write_beir

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def files(tmp_path):
    """The same 4 documents as a jsonl (``id``), a tsv (``doc_id`` with a title column) and a BEIR folder (``_id``),
    with queries and test judgements."""
    docs = [(f"n{i}", f"Title {i}", f"body of note {i} about topic {i % 2}") for i in range(4)]
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"id": d, "title": t, "text": x}) + "\n"
                                                 for d, t, x in docs))
    (tmp_path / "docs.tsv").write_text("doc_id\ttitle\ttext\n" + "".join(f"{d}\t{t}\t{x}\n" for d, t, x in docs))
    (tmp_path / "queries.jsonl").write_text(json.dumps({"id": "q1", "text": "note 1"}) + "\n")
    (tmp_path / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\tn1\t1\n")
    write_beir(Corpus("b", [d for d, _, _ in docs], [x for *_, x in docs], titles=[t for _, t, _ in docs]), None,
               tmp_path / "beir")
    return tmp_path


# ------------------------------------------------------------------------------------------- plain data in
def test_files_of_documents_load_the_same_way_everywhere(files, capsys):
    a, b, c = load_corpus(str(files / "docs.jsonl")), load_corpus(str(files / "docs.tsv")), load_corpus(
        str(files / "beir"))
    assert a.doc_ids == b.doc_ids == c.doc_ids == ["n0", "n1", "n2", "n3"]
    assert a.model_inputs() == b.model_inputs() == c.model_inputs()
    assert a.name == "docs" and a.titles[1] == "Title 1"
    d = load_corpus("jsonl", path=files / "docs.jsonl", id_field="id", text_field="title", drop_title=True)
    assert d.texts[0] == "Title 0" and d.titles is None
    with pytest.raises(DataError, match=r"docs\.jsonl:1: no field 'body'.*data\.text_field"):
        load_corpus("jsonl", path=files / "docs.jsonl", text_field="body")
    with pytest.raises(DataError, match=r"no id field \(_id, id, doc_id.*data\.id_field"):
        (files / "noid.jsonl").write_text(json.dumps({"key": "x", "text": "t"}) + "\n")
        load_corpus(str(files / "noid.jsonl"))
    with pytest.raises(ValueError, match="id_field= applies to a file of documents"):
        load_corpus("bbc", id_field="id")
    # the command line: a file as the corpus, never "this folder has no corpus.jsonl"
    from gdr.config import load_config
    from gdr.validate import ConfigError, validate

    validate("score", load_config("score", [f"data.name={files / 'docs.jsonl'}"]))
    validate("run", load_config("run", ["data=tsv", f"data.path={files / 'docs.tsv'}",
                                        f"data.queries={files / 'queries.jsonl'}", f"data.qrels={files / 'test.tsv'}"]))
    (files / "notes.txt").write_text("x")
    with pytest.raises(ConfigError, match="is a file, but not a .jsonl or .tsv file of documents"):
        validate("score", load_config("score", [f"data.name={files / 'notes.txt'}"]))
    with pytest.raises(ConfigError, match="data.qrels=null: is needed with data.queries"):
        validate("run", load_config("run", ["data=jsonl", f"data.path={files / 'docs.jsonl'}",
                                            f"data.queries={files / 'queries.jsonl'}"]))
    # `gdr run` on a file without its queries says how to give them
    assert main(["run", f"data.name={files / 'docs.jsonl'}", f"out={files / 'run'}"]) == 2
    assert "data=jsonl|tsv|trec data.path=<documents> data.queries=<queries file> data.qrels=<test.tsv>" in \
        capsys.readouterr().err
    # its queries and judgements, as the pipeline reads them
    from gdr.data.splits import split_queries

    data = {"name": "jsonl", "path": str(files / "docs.jsonl"), "queries": str(files / "queries.jsonl"),
            "qrels": str(files / "test.tsv")}
    qs = split_queries({"name": "jsonl", "split": "test"}, data, set(a.doc_ids))
    assert qs.qids == ["q1"] and qs.relevant == [["n1"]] and qs.texts == ["note 1"]
    assert split_queries({"name": "jsonl", "split": "train"}, data, set(a.doc_ids)) is None


def test_a_spreadsheets_tsv_a_qrels_file_of_any_name_and_a_missing_file_of_documents(tmp_path):
    from gdr.data.files import load_file_queries

    tsv = tmp_path / "bom.tsv"
    tsv.write_text("id\ttext\nd1\thello world\nd2\tgood bye\n", encoding="utf-8-sig")  # Excel's "CSV UTF-8"
    assert load_corpus(str(tsv)).doc_ids == ["d1", "d2"]
    (tmp_path / "q.jsonl").write_text('{"_id": "q0", "text": "hello"}\n')
    (tmp_path / "qrels.tsv").write_text("query-id\tcorpus-id\tscore\nq0\td1\t1\n")  # BEIR's form, not a split's name
    qs = load_file_queries(tmp_path / "q.jsonl", tmp_path / "qrels.tsv", doc_ids=["d1", "d2"])
    assert (qs.qids, qs.splits, qs.relevant) == (["q0"], ["test"], [["d1"]])
    with pytest.raises(ValueError, match=r"corpus '.*nofile\.jsonl': no such file"):
        load_corpus(str(tmp_path / "nofile.jsonl"))
    # JSON Lines read as a .tsv (data=tsv data.path=docs.jsonl) said "no id field" of a one-column header
    from gdr.data.files import load_docs_file

    (tmp_path / "docs.jsonl").write_text('{"id": "d0", "text": "a"}\n{"id": "d1", "text": "b"}\n')
    with pytest.raises(ValueError, match=r"docs\.jsonl:1: a JSON object where a \.tsv file has its header line: the "
                                         r"file is JSON Lines; load it with data=jsonl"):
        load_docs_file(tmp_path / "docs.jsonl", fmt="tsv")
    # a header naming a column twice: the last one of that name was read, silently
    (tmp_path / "twice.tsv").write_text("id\ttext\ttext\nd1\tfirst\tsecond\n")
    with pytest.raises(ValueError, match=r"twice\.tsv:1: the header names column 'text' twice"):
        load_docs_file(tmp_path / "twice.tsv", fmt="tsv")


def test_in_memory_corpora_from_texts_pandas_and_datasets():
    import datasets
    import pandas as pd

    c = Corpus.from_texts(["a cat on a mat", "stock markets fell"])
    assert c.doc_ids == ["0", "1"] and c.titles is None
    df = pd.DataFrame({"key": ["x", "y"], "body": ["t1", "t2"], "title": ["T1", None]})
    p = Corpus.from_pandas(df, id_column="key", text_column="body")
    assert p.doc_ids == ["x", "y"] and p.texts == ["t1", "t2"] and p.titles == ["T1", None]
    assert Corpus.from_pandas(df.rename(columns={"key": "_id", "body": "text"})).doc_ids == ["x", "y"]
    assert Corpus.from_pandas(df.rename(columns={"body": "text"}), id_column=None).doc_ids == ["0", "1"]
    ds = datasets.Dataset.from_pandas(df)
    assert Corpus.from_dataset(ds, id_column="key", text_column="body").model_inputs() == p.model_inputs()
    with pytest.raises(DataError, match="no text column 'text'.*text_column="):
        Corpus.from_pandas(df)
    with pytest.raises(DataError, match="duplicate doc_id 'a'"):
        Corpus.from_texts(["x", "y"], ids=["a", "a"])
    with pytest.raises(TypeError, match="texts: got str; pass a list of document strings"):
        Corpus.from_texts("one long string")
    # what is given in memory is fixed there: no option of a loader, no path to check
    with pytest.raises(DataError, match=r"^texts row 1: document '1' has empty text; give it a text or leave it out"):
        Corpus.from_texts(["a b", " "])
    with pytest.raises(DataError, match=r"^texts: no documents given; pass at least one$"):
        Corpus.from_texts([])


def test_api_refuses_what_is_not_a_corpus_before_a_model_loads(nothing_loads, tmp_path):
    import pandas as pd

    texts = ["a cat", "a dog"]
    with pytest.raises(TypeError, match=r"corpus: got list; pass a gdr.Corpus: gdr.Corpus.from_texts"):
        gdr.score(texts, "smollm2-135m", tmp_path)
    with pytest.raises(TypeError, match=r"corpus: got DataFrame; pass a gdr.Corpus: gdr.Corpus.from_pandas"):
        gdr.score(pd.DataFrame({"text": texts}), "smollm2-135m", tmp_path)
    corpus = Corpus.from_texts(texts)
    with pytest.raises(TypeError, match=r"corpus: got list"):
        gdr.sample_queries("smollm2-135m", texts, tmp_path)
    with pytest.raises(TypeError, match=r"lm: got Corpus; pass gdr.load_lm"):
        gdr.score(corpus, corpus, tmp_path)
    with pytest.raises(TypeError, match=r"queries: got list; pass a gdr.QuerySet"):
        gdr.bm25(corpus, ["a cat"], tmp_path)
    with pytest.raises(TypeError, match=r"docids: got dict; pass a path"):
        gdr.train_retriever(corpus, {"docids": "x"}, tmp_path)
    with pytest.raises(TypeError, match=r"corpus: got str; pass a gdr.Corpus: gdr.load_corpus\('bbc'\)"):
        gdr.evaluate(tmp_path, "bbc", None, tmp_path)
    # sample_queries(per_doc=) is not silently a set of J queries
    with pytest.raises(TypeError, match=r"per_doc=2.*gdr.sample_doc_queries\(lm, corpus, out, per_doc=2\)"):
        gdr.sample_queries("smollm2-135m", corpus, tmp_path, n_queries=4, per_doc=2)
    with pytest.raises(ValueError, match="needs queries= too"):
        gdr.run({"out": str(tmp_path)}, corpus=corpus)


def test_sample_doc_queries_is_exported_and_honours_per_doc(llama, tmp_path):
    path = gdr.sample_doc_queries(llama, Corpus.from_texts(["a cat on a mat", "stock markets fell"]), tmp_path,
                                  per_doc=2, max_new_tokens=4)
    rows = [json.loads(x) for x in Path(path).read_text().splitlines()]
    assert [r["doc_id"] for r in rows] == ["0", "1"] and all(len(r["queries"]) == 2 for r in rows)


def test_split_queries_defaults_to_the_corpus_own_source(setup):
    _, folder = setup
    corpus = gdr.load_corpus(str(folder))
    test = gdr.split_queries(corpus, "test")
    assert test is not None and len(test) == 10 and set(test.splits) == {"test"}
    assert len(gdr.split_queries(gdr.load_corpus("beir", path=folder, n_docs=12), "train")) < 20


def test_train_retriever_shows_its_progress_bar_by_default(monkeypatch, tmp_path):
    import gdr.stages.train as stage

    seen = {}
    monkeypatch.setattr(stage, "train_retriever", lambda corpus, docids, out, settings, **kw: seen.update(s=settings))
    gdr.train_retriever(Corpus("two", ["a", "b"], ["a text", "b text"]), tmp_path / "docids.tsv", tmp_path)
    assert seen["s"].trainer.enable_progress_bar is True


# ------------------------------------------------------------------------------------------- gdr.run
def test_run_dict_selects_the_data_group_as_the_command_does(setup, tmp_path, capfd, caplog):
    """{"data": {"name": "beir", "path": ...}} is `data=beir data.path=...`: the CLI's run folder is reused. The
    report names the corpus by its folder, the split trained on, and R@k by the k in use; an unlabelled corpus
    says why it has no clustering; `gdr search` shows the documents' first words and takes --query."""
    root, folder = setup
    out = tmp_path / "run"
    args = [a for a in _args(root, folder, out, "indexers=[random]", "doc_queries.per_doc=0", "bm25=false")
            if not a.startswith("data.name=")]
    caplog.set_level("INFO", logger="gdr.pipeline")
    assert main(args[:1] + ["data=beir", f"data.path={folder}"] + args[1:]) == 0
    settings = {"data": {"name": "beir", "path": str(folder)}, "model": {"name": str(root / "tiny-llama"),
                "max_doc_tokens": 24}, "sample": {"n_queries": 16, "batch_size": 8, "max_new_tokens": 6},
                "doc_queries": {"per_doc": 0}, "indexers": ["random"], "bm25": False, "seeds": [0],
                "index": {"n_clusters": 4, "leaf_size": 4, "gc": {"n_init": 2, "n_init_inner": 1}},
                "train": {"model": {"size": "tiny"}, "optim": {"warmup_steps": 2},
                          "trainer": {"max_steps": 6, "max_epochs": 100, "batch_size": 16, "enable_progress_bar": False,
                                      "tensorboard": False, "val_beam": 4, "check_val_every_n_epoch": 50,
                                      "num_sanity_val_steps": 0}},
                "evaluate": {"k": 10, "beam": 10}, "progress": False, "threads": 1, "out": str(out)}
    report = gdr.run(settings)
    assert report["stages"] and all(s["reused"] for s in report["stages"])
    assert "stage cluster: skipped: corpus toy has no labels" in caplog.text
    md = (out / "report.md").read_text()
    assert md.startswith("# gdr run: toy, 30 documents") and "trained on `train` (" in md
    assert "| docids | Success@1 | Success@10 | R@10 | RR@10 |" in md
    assert report["columns"] == {"recall@1": "Success@1", "recall@10": "Success@10", "R@10": "R@10",
                                 "mrr@10": "RR@10"}  # measured at evaluate.k=10, named there

    train = out / next(s["folder"] for s in report["stages"] if s["name"] == "train-random-s0")
    capfd.readouterr()
    assert main(["search", f"run_dir={train}", "k=2", "--query", "cat=mat", "--", "stock k=3"]) == 0
    lines = capfd.readouterr().out.splitlines()
    assert lines[0] == "# cat=mat" and lines[3] == "# stock k=3" and len(lines) == 6
    assert all(" story number " in x for x in lines[1:3] + lines[4:6])  # each document's first words


def test_report_says_when_there_is_no_training_split(setup, tmp_path):
    from gdr.config import load_config
    from gdr.pipeline import trained_on

    _, folder = setup
    corpus = load_corpus(str(folder))
    qs = gdr.split_queries(corpus, "test")
    only_test = write_beir(corpus, qs, tmp_path / "only-test")
    cfg = load_config("run", ["data=beir", f"data.path={only_test}"])
    only = load_corpus(str(only_test))
    assert gdr.split_queries(only, "train") is None
    assert trained_on(cfg, only, None, True) == "generated queries only: `only-test` has no `train` queries"


# ------------------------------------------------------------------------------------------- smaller things
def test_cfg_piped_into_a_closed_reader_exits_quietly(tmp_path):
    p = subprocess.Popen([sys.executable, "-m", "gdr.cli", "run", "--cfg"], cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    p.stdout.close()  # `| head` that has read what it wanted: the next write gets EPIPE
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 141 and "Traceback" not in err and "BrokenPipe" not in err, err


def test_unreachable_hub_id_is_one_line(setup, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _, folder = setup
    assert main(["score", f"data.name={folder}", "model.name=nobody/no-such-model-27", f"out={tmp_path}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "model.name=nobody/no-such-model-27: not a local folder" in err[0]
    assert "HF_HUB_OFFLINE" in err[0]


def test_no_empty_progress_bar_when_p_is_reused(llama, tmp_path, capfd):
    from gdr.stages.score import score_run

    kw = dict(texts=["a cat", "a dog"], doc_ids=["a", "b"], queries=["cat", "dog"], out_dir=tmp_path)
    score_run(llama, **kw)
    assert "score" in capfd.readouterr().err
    score_run(llama, **kw)  # every shard finished: nothing to show
    assert "pair" not in capfd.readouterr().err


def test_n_docs_above_the_corpus_size_says_it_kept_them_all(tmp_path, caplog):
    (tmp_path / "docs.jsonl").write_text("".join(f'{{"id": "d{i}", "text": "t {i}"}}\n' for i in range(3)))
    with caplog.at_level(logging.INFO, logger="gdr"):
        assert len(load_corpus(str(tmp_path / "docs.jsonl"), n_docs=50)) == 3
    assert "n_docs=50 asked, the corpus has 3 documents: all of them are kept" in caplog.text


def test_a_folder_without_p_is_not_answered_with_a_command_that_scores_the_default_corpus(tmp_path):
    """A folder of no saved config has no `gdr score` of its own: the default command would score all of BBC into
    it (hours on a CPU), or into the user's data folder."""
    with pytest.raises(FileNotFoundError, match=r"P.manifest.json not found: score a corpus into it first \(`gdr "
                                                 r"score data=<your corpus> out=.*nothing`\)"):
        gdr.load_run(tmp_path / "nothing")
