"""P (the score stage) and the generated queries are keyed by the documents, the LM, the sampling and scoring settings
and the device, never by where the files lie or which queries judge them: moving every input file, adding a train
split, or handing the same documents over as a DataFrame reuses them."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from tiny_models import saved_tiny_llama

import gdr
from gdr.cli import main

TOPICS = ["cat mat rat", "stock market earnings", "central bank rates", "oil prices supply", "football striker club"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A saved tiny causal LM and 20 documents with 20 judged queries as files (jsonl documents and queries, a
    test.tsv of judgements)."""
    root = tmp_path_factory.mktemp("reuse")
    saved_tiny_llama(root / "tiny-llama")
    a = root / "a"
    a.mkdir()
    docs, queries, qrels = [], [], ["query-id\tcorpus-id\tscore"]
    for i in range(20):
        t = TOPICS[i % 5].split()
        docs.append({"id": f"d{i}", "text": f"{' '.join(t)} story number {i} about {t[0]} and {t[-1]} item{i}"})
        queries.append({"id": f"q{i}", "text": f"{t[0]} item{i}"})
        qrels.append(f"q{i}\td{i}\t1")
    (a / "docs.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    (a / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    (a / "test.tsv").write_text("\n".join(qrels[:1] + qrels[1::2]) + "\n")
    return root, docs, queries, qrels


def _settings(root: Path, out: Path) -> list[str]:
    return [f"model.name={root / 'tiny-llama'}", "model.max_doc_tokens=24", "sample.n_queries=8",
            "sample.batch_size=8", "sample.max_new_tokens=4", "doc_queries.per_doc=1", "doc_queries.max_new_tokens=4",
            "indexers=[gc]", "bm25=false", "index.n_clusters=4", "index.leaf_size=4", "index.gc.n_init=1",
            "index.gc.n_init_inner=1", "train.model.size=tiny", "train.trainer.max_steps=2",
            "train.trainer.max_epochs=100", "train.trainer.batch_size=16", "train.trainer.enable_progress_bar=false",
            "train.trainer.tensorboard=false", "train.trainer.val_beam=4", "train.trainer.check_val_every_n_epoch=50",
            "train.trainer.num_sanity_val_steps=0", "train.optim.warmup_steps=1", "evaluate.k=10", "evaluate.beam=10",
            "seeds=[0]", "progress=false", "threads=1", "plot=false", "index.plot=false", f"out={out}"]


def _stages(out: Path) -> dict[str, dict]:
    return {s["name"]: s for s in json.loads((out / "report.json").read_text())["stages"]}


def _run_files(root: Path, out: Path, docs: Path, queries: Path, qrels: Path, *more: str) -> dict[str, dict]:
    """`gdr run data=jsonl` on these files (and ``more`` overrides); its stages by name."""
    assert main(["run", "data=jsonl", f"data.path={docs}", f"data.queries={queries}", f"data.qrels={qrels}",
                 *_settings(root, out), *more]) == 0
    return _stages(out)


def test_moved_files_and_a_new_train_split_reuse_p_and_the_generated_queries(files, tmp_path):
    root, docs, queries, qrels = files
    out = tmp_path / "run"
    a = root / "a"
    first = _run_files(root, out, a / "docs.jsonl", a / "queries.jsonl", a / "test.tsv")
    assert not first["score"]["reused"] and not first["doc-queries"]["reused"]

    # every file elsewhere under another name, the judgements now a folder with a train split beside the test one
    b = tmp_path / "elsewhere"
    (b / "qrels").mkdir(parents=True)
    shutil.copy(a / "docs.jsonl", b / "documents.jsonl")
    shutil.copy(a / "queries.jsonl", b / "topics.jsonl")
    shutil.copy(a / "test.tsv", b / "qrels" / "test.tsv")
    (b / "qrels" / "train.tsv").write_text("\n".join(qrels[:1] + qrels[2::2]) + "\n")
    second = _run_files(root, out, b / "documents.jsonl", b / "topics.jsonl", b / "qrels")
    for name in ("score", "doc-queries"):
        assert second[name]["reused"] and second[name]["folder"] == first[name]["folder"], name
    assert not second["train-gc-s0"]["reused"]  # the retriever now learns from the train split: trained anew
    assert "`train` (10 queries)" in (out / "report.md").read_text()


def test_the_same_documents_as_a_dataframe_reuse_p(files, tmp_path):
    root, docs, queries, qrels = files
    out = tmp_path / "run"
    a = root / "a"
    first = _run_files(root, out, a / "docs.jsonl", a / "queries.jsonl", a / "test.tsv")
    corpus = gdr.Corpus.from_pandas(pd.DataFrame(docs), name="docs")
    qs = gdr.QuerySet(name="docs", qids=[q["id"] for q in queries[::2]], texts=[q["text"] for q in queries[::2]],
                      relevant=[[d["id"]] for d in docs[::2]], splits=["test"] * 10)
    settings = {}
    for arg in _settings(root, out):
        key, value = arg.split("=", 1)
        node = settings
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = yaml.safe_load(value)
    gdr.run(settings, corpus=corpus, queries=qs)
    second = _stages(out)
    for name in ("score", "doc-queries"):
        assert second[name]["reused"] and second[name]["folder"] == first[name]["folder"], name


def test_an_edited_document_rescores_its_row_and_its_queries_columns_only(files, tmp_path):
    """`gdr run` (per-document sampler) after one document's text changed: a new score stage (other documents,
    other key) that takes the earlier stage's queries and P entries of everything unchanged."""
    root, docs, queries, qrels = files
    out = tmp_path / "run"
    a = root / "a"
    first = _run_files(root, out, a / "docs.jsonl", a / "queries.jsonl", a / "test.tsv", "sample.p_per_doc=1")
    edited = tmp_path / "docs.jsonl"
    changed = [dict(d, text="a rewritten story on tennis and golf") if d["id"] == "d3" else d for d in docs]
    edited.write_text("".join(json.dumps(d) + "\n" for d in changed))
    second = _run_files(root, out, edited, a / "queries.jsonl", a / "test.tsv", "sample.p_per_doc=1")
    assert not second["score"]["reused"] and second["score"]["folder"] != first["score"]["folder"]
    old_dir, new_dir = out / first["score"]["folder"], out / second["score"]["folder"]
    new_q = gdr.load_run(new_dir).queries
    q_man = json.loads((new_dir / "queries.manifest.json").read_text())
    assert q_man["queries_reused"] == len(docs) - 1 and q_man["reused_from"] == str(old_dir)
    p_man = json.loads((new_dir / "P.manifest.json").read_text())
    assert p_man["reused_from"] == str(old_dir)
    # d3's row against every query, the other rows against d3's one query
    assert p_man["pairs_scored_last_call"] == len(new_q) + (len(docs) - 1)


def test_gdr_score_reuse_from_an_older_folder(files, tmp_path):
    """`gdr score reuse_from=<older folder>` after one document's text changed: its queries and P entries of
    everything unchanged taken from there, the bytes of a full rescore; a folder of other settings reuses
    nothing."""
    root, docs, queries, qrels = files
    settings = [f"model.name={root / 'tiny-llama'}", "model.max_doc_tokens=24", "sample.p_per_doc=1",
                "sample.batch_size=8", "sample.max_new_tokens=4", "progress=false", "threads=1"]
    assert main(["score", "data=jsonl", f"data.path={root / 'a' / 'docs.jsonl'}", *settings,
                 f"out={tmp_path / 'old'}"]) == 0
    edited = tmp_path / "docs.jsonl"
    edited.write_text("".join(json.dumps(dict(d, text="golf and tennis news") if d["id"] == "d7" else d) + "\n"
                              for d in docs))
    assert main(["score", "data=jsonl", f"data.path={edited}", *settings, f"reuse_from={tmp_path / 'old'}",
                 f"out={tmp_path / 'new'}"]) == 0
    new = gdr.load_run(tmp_path / "new")
    n = len(docs)
    assert json.loads((tmp_path / "new" / "queries.manifest.json").read_text())["queries_reused"] == n - 1
    assert new.manifest["pairs_scored_last_call"] == n + (n - 1)
    assert main(["score", "data=jsonl", f"data.path={edited}", *settings, f"out={tmp_path / 'full'}"]) == 0
    assert np.asarray(new.logp).tobytes() == np.asarray(gdr.load_run(tmp_path / "full").logp).tobytes()
    assert main(["score", "data=jsonl", f"data.path={edited}", *settings, "score.dtype=float16",
                 f"reuse_from={tmp_path / 'old'}", f"out={tmp_path / 'f16'}"]) == 0
    assert gdr.load_run(tmp_path / "f16").manifest["pairs_scored_last_call"] == n * n
