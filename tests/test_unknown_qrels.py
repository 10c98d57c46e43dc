"""Judgements naming documents outside the corpus (a corpus that is a subset of the judged one): refused with the
count, an example by file:line and the setting to set; with ``data.drop_unknown_qrels=true``
(``drop_unknown_qrels=True`` in the API) dropped with one warning, and the count in metrics.json and the run's
report. The command line and the API score the same subset alike. Offline, CPU, tiny models."""
from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from test_pipeline import TOPICS, _args, setup  # noqa: F401  (module fixture: a saved tiny LM)

import gdr
from gdr.cli import main
from gdr.config import load_config
from gdr.data import DataError, load_corpus
from gdr.data.files import load_file_queries
from gdr.pipeline import corpus_signature, run_settings, score_inputs
from gdr.validate import ConfigError, validate

DROPPED = ("d1", "d2", "d4")  # documents judged in test.tsv but left out of the subset


def _subset(folder: Path) -> tuple[Path, Path, Path]:
    """A 27-document jsonl subset of a 30-document collection, its queries, and judgements of all 30 (test split:
    every third query; q1's and q2's documents are gone, q4's gone from its two judgements)."""
    docs, queries, qrels = folder / "docs.jsonl", folder / "queries.jsonl", folder / "test.tsv"
    with docs.open("w") as f:
        for i in range(30):
            t = TOPICS[i % 5].split()
            if f"d{i}" not in DROPPED:
                f.write(json.dumps({"id": f"d{i}", "text": f"{' '.join(t)} story number {i} about {t[0]} item{i}"})
                        + "\n")
    queries.write_text("".join(json.dumps({"id": f"q{i}", "text": f"{TOPICS[i % 5].split()[0]} item{i}"}) + "\n"
                               for i in range(30)))
    lines = ["query-id\tcorpus-id\tscore"] + [f"q{i}\td{i}\t1" for i in range(0, 30, 3)]
    lines += ["q1\td1\t1", "q2\td2\t1", "q4\td4\t1", "q4\td5\t1"]  # q1, q2: not scored (train) but judged in test
    qrels.write_text("\n".join(lines) + "\n")
    return docs, queries, qrels


def test_the_qrels_readers_refuse_unknown_documents_with_the_count_or_drop_them(tmp_path, caplog):
    docs, queries, qrels = _subset(tmp_path)
    ids = load_corpus(str(docs)).doc_ids
    with pytest.raises(DataError, match=rf"^{qrels}:12: corpus-id 'd1' is not in the corpus \(3 judgement\(s\) name "
                                        r"documents not in it\); .*set data.drop_unknown_qrels=true"):
        load_file_queries(queries, qrels, doc_ids=ids)
    caplog.set_level(logging.WARNING, logger="gdr.data.beir")
    qs = load_file_queries(queries, qrels, doc_ids=ids, drop_unknown=True)
    assert qs.info["unknown_qrels"] == {"test": 3}
    assert dict(zip(qs.qids, qs.relevant))["q4"] == ["d5"] and "q1" not in qs.qids and len(qs) == 11
    said = [r.getMessage() for r in caplog.records if "drop_unknown_qrels" in r.getMessage()]
    assert len(said) == 1 and "3 judgement(s)" in said[0] and "d1" in said[0]


def test_the_setting_is_checked_and_keys_no_document_stage(tmp_path):
    docs, _, _ = _subset(tmp_path)
    cfg = load_config("run", ["data=jsonl", "data.path=x.jsonl"])
    assert cfg.data.drop_unknown_qrels is False
    assert all(load_config("run", [f"data={d}"]).data.drop_unknown_qrels is False for d in ("tsv", "trec", "beir"))
    with pytest.raises(ConfigError, match=r"data.drop_unknown_qrels=yes: must be true or false"):
        validate("run", load_config("run", ["data=jsonl", f"data.path={docs}", "data.drop_unknown_qrels=yes"]))
    corpus = gdr.Corpus(name="c", doc_ids=["a", "b"], texts=["x", "y"])
    on = load_config("run", ["data=jsonl", "data.path=x.jsonl", "data.drop_unknown_qrels=true"])
    off = load_config("run", ["data=jsonl", "data.path=x.jsonl"])
    assert (score_inputs(run_settings(on), corpus_signature(corpus))
            == score_inputs(run_settings(off), corpus_signature(corpus)))


def test_gdr_run_and_evaluate_on_a_subset_drop_unknown_qrels_as_the_api_does(setup, tmp_path, capsys):
    root, _ = setup
    docs, queries, qrels = _subset(tmp_path)
    out = tmp_path / "run"
    data = ["data=jsonl", f"data.path={docs}", f"data.queries={queries}", f"data.qrels={qrels}"]
    args = [a for a in _args(root, tmp_path, out, "indexers=[random]", "doc_queries.per_doc=0")
            if not a.startswith("data.name=")]
    run = args[:1] + data + args[1:]
    assert main(run) == 2
    assert "corpus-id 'd1' is not in the corpus (3 judgement(s)" in capsys.readouterr().err
    assert not (out / "report.json").exists()

    assert main(run + ["data.drop_unknown_qrels=true"]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["unknown_qrels"] == 3
    md = (out / "report.md").read_text()
    assert "3 relevant judgement(s) of `queries.jsonl` name documents not in the corpus" in md
    stage = {s["name"]: s["folder"] for s in report["stages"]}
    bm25_cli = json.loads((out / stage["bm25"] / "metrics.json").read_text())
    assert bm25_cli["unknown_qrels"] == 3

    # the API on the same subset, the judgements read without a corpus to check them against, dropped at scoring
    corpus = gdr.load_corpus(str(docs))
    full = load_file_queries(queries, qrels, doc_ids=[f"d{i}" for i in range(30)])
    with pytest.raises(DataError, match="drop_unknown_qrels"):
        gdr.bm25(corpus, full, tmp_path / "api-refused", k=10)
    api = gdr.bm25(corpus, full, tmp_path / "api-bm25", k=10, drop_unknown_qrels=True)
    assert api == bm25_cli["systems"]["bm25"]
    assert json.loads((tmp_path / "api-bm25" / "metrics.json").read_text())["unknown_qrels"] == 3

    train = out / stage["train-random-s0"]
    ev = tmp_path / "eval"
    assert main(["evaluate", *data, "data.drop_unknown_qrels=true", f"run_dir={train}", f"out_dir={ev}", "k=10",
                 "beam=10"]) == 0
    cli = json.loads((ev / "metrics.json").read_text())
    assert cli["unknown_qrels"] == 3 and cli["systems"]["bm25"] == api
    via_api = gdr.evaluate(train, corpus, full, tmp_path / "api-eval", k=10, beam=10, drop_unknown_qrels=True)
    assert via_api["unknown_qrels"] == 3 and via_api["systems"] == cli["systems"]
    run_eval = json.loads((out / stage["eval-random-s0"] / "metrics.json").read_text())
    assert run_eval["systems"]["gdr"] == cli["systems"]["gdr"]


def test_a_beir_folder_whose_corpus_is_a_subset_of_its_judgements(tmp_path):
    docs, queries, qrels = _subset(tmp_path)
    corpus = gdr.load_corpus(str(docs))
    full = load_file_queries(queries, qrels, doc_ids=[f"d{i}" for i in range(30)])
    folder = gdr.write_beir(corpus, full, tmp_path / "beir")
    data = {"name": "beir", "path": str(folder)}
    with pytest.raises(DataError, match=r"test\.tsv:\d+: corpus-id 'd1' is not in the corpus \(3 judgement"):
        gdr.split_queries(corpus, "test", data=data)
    qs = gdr.split_queries(corpus, "test", data={**data, "drop_unknown_qrels": True})
    assert len(qs) == 11 and qs.info["unknown_qrels"] == {"test": 3}
    assert gdr.bm25(corpus, qs, tmp_path / "b", k=10) == gdr.bm25(corpus, full, tmp_path / "a", k=10,
                                                                   drop_unknown_qrels=True)
