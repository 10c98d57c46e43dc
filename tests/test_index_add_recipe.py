"""`gdr index add` for new documents: P scored against the index's own queries (`gdr score queries_from=<run>`),
checked by content, never by qids. Tiny random-init LM, offline, CPU."""
from __future__ import annotations

import json
import shutil

import numpy as np
from test_pipeline import setup  # noqa: F401  (module fixture: a saved tiny LM and a 30-document BEIR folder)

from gdr.cli import main
from gdr.data import load_corpus, write_beir


def _split(folder, tmp_path):
    """The 30 documents as 24 indexed ones, 6 new ones and all 30, each a BEIR folder without queries."""
    corpus = load_corpus(str(folder))
    old, new = corpus.select(np.arange(24)), corpus.select(np.arange(24, 30))
    return (write_beir(old, None, tmp_path / "old"), write_beir(new, None, tmp_path / "new"),
            write_beir(corpus, None, tmp_path / "all"))


def test_index_add_takes_only_p_of_the_runs_own_queries(setup, tmp_path, capsys):
    from gdr.indexing.add import place_documents
    from gdr.indexing.docids import read_docids
    from gdr.indexing.state import load_tree_state
    from gdr.store.rows import PMatrix

    root, folder = setup
    old, new, every = _split(folder, tmp_path)
    lm = [f"model.name={root / 'tiny-llama'}", "model.max_doc_tokens=24", "sample.n_queries=16",
          "sample.max_new_tokens=6", "progress=false", "threads=1"]
    run, idx = tmp_path / "run", tmp_path / "idx"
    assert main(["score", f"data.name={old}", *lm, f"out={run}"]) == 0
    assert main(["index", "method=gc", f"run={run}", f"out={idx}", "n_clusters=4", "leaf_size=4", "gc.n_init=2",
                 "gc.n_init_inner=1", "progress=false", "plot=false"]) == 0
    before = tmp_path / "idx-before"
    shutil.copytree(idx, before)
    capsys.readouterr()

    # queries.jsonl copied by hand into a new folder: refused (never re-sampled over without a word)
    (tmp_path / "copied").mkdir()
    shutil.copy(run / "queries.jsonl", tmp_path / "copied" / "queries.jsonl")
    assert main(["score", f"data.name={new}", *lm, f"out={tmp_path / 'copied'}"]) == 2
    err = capsys.readouterr().err
    assert "has no queries.manifest.json" in err and "gdr score queries_from=" in err

    # P of re-sampled queries (same qids q0..q15, other texts): refused, naming both sources
    resampled = tmp_path / "resampled"
    assert main(["score", f"data.name={new}", *lm, "sample.seed=1", f"out={resampled}"]) == 0
    capsys.readouterr()
    assert main(["index", "add", f"run={resampled}", f"index={idx}", "plot=false"]) == 2
    err = capsys.readouterr().err
    assert "other queries" in err and str(resampled) in err and str(run.resolve()) in err
    assert f"gdr score queries_from={run.resolve()}" in err

    # P of the run's own queries: accepted, with what to do next
    good = tmp_path / "good"
    assert main(["score", f"data.name={new}", *lm, f"queries_from={run}", f"out={good}"]) == 0
    assert [json.loads(x)["text"] for x in (good / "queries.jsonl").read_text().splitlines()] == \
        [json.loads(x)["text"] for x in (run / "queries.jsonl").read_text().splitlines()]
    assert main(["index", "add", f"run={good}", f"index={idx}", "plot=false"]) == 0
    out = capsys.readouterr().out
    assert "added 6 documents" in out and "next:" in out and f"docids={idx / 'docids.tsv'}" in out

    # the same placement as the new documents' rows of a P of all 30 documents over the run's queries
    full = tmp_path / "full"
    assert main(["score", f"data.name={every}", *lm, f"queries_from={run}", f"out={full}"]) == 0
    p_full = np.load(full / "P.npy")
    np.testing.assert_array_equal(p_full[:24], np.load(run / "P.npy"))
    st = load_tree_state(before / "tree_state.npz")
    want, _ = place_documents(st, PMatrix(np.ascontiguousarray(p_full[24:])))
    ids, codes = read_docids(idx / "docids.tsv")
    assert ids[24:] == [f"d{i}" for i in range(24, 30)] and codes[24:] == want

    # another model's P of the same queries is refused too
    other = tmp_path / "other"
    assert main(["score", f"data.name={new}", *lm, "model.max_doc_tokens=20", f"queries_from={run}",
                 f"out={other}"]) == 2
    assert "scored by another model (max_doc_tokens=24)" in capsys.readouterr().err


def test_a_cluster_folder_serves_as_the_run_of_new_documents(setup, tmp_path, capsys):
    """README's stages one by one: `gdr cluster ... out=R`, `gdr index method=gc run=R`, then `gdr score
    queries_from=R` without model settings takes R's (saved by `gdr cluster`), and `gdr index add` finds R's corpus
    for the documents.jsonl of every document."""
    root, folder = setup
    old, new, _ = _split(folder, tmp_path)
    lm = [f"model.name={root / 'tiny-llama'}", "model.max_doc_tokens=24", "sample.n_queries=16",
          "sample.max_new_tokens=6"]
    quiet = ["progress=false", "threads=1"]
    run, idx, added = tmp_path / "clustered", tmp_path / "idx", tmp_path / "new-p"
    assert main(["cluster", f"data.name={old}", *lm, *quiet, "cluster.n_clusters=3", "cluster.repeats=1",
                 "cluster.n_init=2", f"out={run}"]) == 0
    assert main(["index", "method=gc", f"run={run}", f"out={idx}", "n_clusters=4", "leaf_size=4", "gc.n_init=2",
                 "gc.n_init_inner=1", "plot=false", *quiet[:1]]) == 0
    # its next: line trains on the corpus that P scored, read from the cluster folder's saved config
    assert f"`gdr train data.name={old} docids={idx / 'docids.tsv'}" in capsys.readouterr().out
    assert main(["score", f"data.name={new}", f"queries_from={run}", f"out={added}", *quiet]) == 0
    assert np.load(added / "P.npy").shape == (6, 16)
    assert main(["index", "add", f"run={added}", f"index={idx}", "plot=false"]) == 0
    printed = capsys.readouterr().out
    documents = [json.loads(x)["_id"] for x in (idx / "documents.jsonl").read_text().splitlines()]
    assert documents == [f"d{i}" for i in range(30)] and f"data.path={idx / 'documents.jsonl'}" in printed
