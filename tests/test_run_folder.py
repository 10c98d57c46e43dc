"""The run folder of `gdr run` / `gdr.run`: a refused run leaves no folder, the lock comes before the first write,
and the report of a finished run stays (marked in progress) until a new run replaces it."""
from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

import pytest

import gdr
from gdr import guard
from gdr.cli import main


@pytest.fixture
def doc_files(tmp_path):
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"id": f"d{i}", "text": f"story {i} about cats"}) + "\n" for i in range(6)))
    queries = tmp_path / "queries.jsonl"
    queries.write_text("".join(json.dumps({"id": f"q{i}", "text": f"cats {i}"}) + "\n" for i in range(6)))
    qrels = tmp_path / "test.tsv"
    qrels.write_text("query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\td{i}\t1\n" for i in range(6)))
    return docs, queries, qrels


def test_a_run_refused_after_its_claim_leaves_no_folder(doc_files, tmp_path, capsys):
    """The run folder is claimed (made and locked) before the corpus and its queries are read; a run refused
    there (no query of the test split) leaves neither the folder nor the folders made for it."""
    docs, queries, qrels = doc_files
    out = tmp_path / "new" / "run"
    rc = main(["run", "data=jsonl", f"data.path={docs}", f"data.queries={queries}", f"data.qrels={qrels}",
               "queries.test_split=dev", f"out={out}"])
    assert rc == 2 and "queries.test_split=dev" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()


def test_a_refused_run_keeps_a_folder_it_did_not_make(doc_files, tmp_path, capsys):
    docs, queries, qrels = doc_files
    out = tmp_path / "run"
    out.mkdir()
    assert main(["run", "data=jsonl", f"data.path={docs}", f"data.queries={queries}", f"data.qrels={qrels}",
                 "queries.test_split=dev", f"out={out}"]) == 2
    assert out.is_dir() and {p.name for p in out.iterdir()} <= {guard.LOCK_FILE}


def test_gdr_run_with_a_corpus_takes_the_lock_before_writing_it(tmp_path):
    """A folder locked by another process: gdr.run(corpus=...) is refused before it writes <out>/corpus/."""
    out = tmp_path / "busy"
    out.mkdir()
    fd = os.open(out / guard.LOCK_FILE, os.O_RDWR | os.O_CREAT)  # another holder: its own open file
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(fd, b"4242 gdr run out=busy\n")
        corpus = gdr.Corpus.from_texts(["a cat", "a dog"], ids=["d0", "d1"])
        qs = gdr.QuerySet(name="q", qids=["q0"], texts=["cat"], relevant=[["d0"]], splits=["test"])
        with pytest.raises(guard.FolderBusy, match="pid 4242"):
            gdr.run({"out": str(out)}, corpus=corpus, queries=qs)
        assert sorted(p.name for p in out.iterdir()) == [guard.LOCK_FILE]
    finally:
        os.close(fd)


def test_the_previous_report_is_kept_and_marked_in_progress(tmp_path):
    from gdr.stages.report import mark_in_progress

    (tmp_path / "report.md").write_text("# gdr run: toy, 3 documents\n\nfigures\n")
    (tmp_path / "report.json").write_text(json.dumps({"seconds": 1.0, "retrieval": {"gc": {"recall@1": 50.0}}}))
    assert mark_in_progress(tmp_path, "gdr run out=x")
    assert mark_in_progress(tmp_path, "gdr run out=x")  # a second interrupted run: one note, not two
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["retrieval"] == {"gc": {"recall@1": 50.0}} and report["in_progress"]["command"] == "gdr run out=x"
    md = (tmp_path / "report.md").read_text()
    assert md.startswith("> **In progress since") and md.count("In progress") == 1
    assert md.endswith("# gdr run: toy, 3 documents\n\nfigures\n")
    assert not mark_in_progress(tmp_path / "none", "gdr run")


def test_a_run_that_stops_before_its_report_marks_the_previous_one_stopped(tmp_path, monkeypatch):
    """A run stopped (a signal, an error) before its own report replaced the previous run's turns that report's
    in-progress mark into a stopped one, naming why; a run without such a report marks nothing."""
    from gdr import pipeline, signals
    from gdr.stages.report import mark_stopped

    (tmp_path / "report.md").write_text("# gdr run: toy\n\nfigures\n")
    (tmp_path / "report.json").write_text(json.dumps({"seconds": 1.0}))
    assert not mark_stopped(tmp_path, "stopped by SIGTERM")  # no run in progress: nothing to say
    corpus = gdr.Corpus.from_texts(["a cat", "a dog"], ids=["d0", "d1"])
    qs = gdr.QuerySet(name="q", qids=["q0"], texts=["cat"], relevant=[["d0"]], splits=["test"])

    def stop(run):
        raise signals.Stopped(15)

    monkeypatch.setattr(pipeline, "run_generator", stop)
    with pytest.raises(signals.Stopped):
        gdr.run({"out": str(tmp_path), "indexers": ["atomic"], "bm25": False}, corpus=corpus, queries=qs)
    report = json.loads((tmp_path / "report.json").read_text())
    assert "in_progress" not in report and report["stopped"]["why"] == "stopped by SIGTERM"
    assert report["stopped"]["command"] and report["seconds"] == 1.0
    md = (tmp_path / "report.md").read_text()
    assert md.startswith("> **Stopped at ") and "(stopped by SIGTERM; `" in md and md.count("> **") == 1
    assert md.endswith("# gdr run: toy\n\nfigures\n")


def test_the_readme_says_what_an_unfinished_run_leaves():
    """README describes the report an unfinished run leaves as above (kept, marked `in_progress`), not as withdrawn."""
    readme = " ".join((Path(__file__).resolve().parent.parent / "README.md").read_text().split())
    assert "has no `report.json`: `gdr run` withdraws" not in readme
    assert ("the previous run's `report.json` and `report.md` are kept but marked in progress (`report.json` gains "
            "`\"in_progress\": {\"since\": ..., \"command\": ...}`, `report.md` a first line `> **In progress since "
            "...**`)") in readme


def test_a_resumed_training_counts_only_the_steps_this_invocation_trained():
    """The report's training rate: a retriever resumed at step 6 of 10 adds the 4 steps it trained over this
    attempt's seconds, not 10 steps over them; a reused one adds nothing."""
    from types import SimpleNamespace

    from gdr import pipeline

    run = SimpleNamespace(training={"retrievers": 0, "examples": 0, "batch": 8, "seconds": 0.0, "peak_gb": None,
                                    "estimate_gb": None})
    resumed = SimpleNamespace(reused=False, info={"global_step": 10, "start_step": 6}, last_seconds=2.0, seconds=9.0)
    pipeline._trained(run, resumed, alone=True)
    pipeline._trained(run, SimpleNamespace(reused=True, info={"global_step": 10}), alone=True)
    assert (run.training["retrievers"], run.training["examples"], run.training["seconds"]) == (1, 32, 2.0)
