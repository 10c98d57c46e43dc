"""README, "Your own corpus": the three recipes as printed there, at tiny sizes (a saved tiny random-init LM, the
`tiny` retriever, a few steps): a jsonl file to a report in one `gdr run`, the same from a DataFrame through
`gdr.run`, and new documents into the index with `gdr score queries_from=<run>` + `gdr index add` + `gdr train`."""
from __future__ import annotations

import json
import re
import shlex

from test_pipeline import setup  # noqa: F401  (module fixture: a saved tiny LM and a 30-document corpus)

import gdr
from gdr.cli import main
from gdr.data import load_corpus

TINY_TRAIN = {"model": {"size": "tiny"}, "optim": {"warmup_steps": 2},
              "trainer": {"max_steps": 4, "max_epochs": 100, "batch_size": 16, "tensorboard": False, "val_beam": 4,
                          "check_val_every_n_epoch": 50, "num_sanity_val_steps": 0, "enable_progress_bar": False}}


def _tiny(root) -> dict:
    """The sizes the README leaves at their defaults, made tiny (as `gdr run` settings)."""
    return {"model": {"name": str(root / "tiny-llama"), "max_doc_tokens": 24},
            "sample": {"n_queries": 16, "batch_size": 8, "max_new_tokens": 6},
            "doc_queries": {"per_doc": 2, "max_new_tokens": 6},
            "index": {"n_clusters": 4, "leaf_size": 4, "gc": {"n_init": 2, "n_init_inner": 1}},
            "cluster": {"repeats": 1, "n_init": 1, "baselines": ["logp"]}, "train": TINY_TRAIN,
            "evaluate": {"k": 10, "beam": 10}, "progress": False, "threads": 1}


def _flat(d: dict, prefix: str = "") -> list[str]:
    out = []
    for k, v in d.items():
        if isinstance(v, dict):
            out += _flat(v, f"{prefix}{k}.")
        else:
            out.append(f"{prefix}{k}=" + (json.dumps(v).replace('"', "").replace(" ", "") if isinstance(v, list)
                                          else str(v).lower() if isinstance(v, bool) else str(v)))
    return out


def test_readme_own_corpus_recipes(setup, tmp_path, capsys, monkeypatch):
    root, folder = setup
    corpus = load_corpus(str(folder))
    qs = gdr.split_queries(corpus, "test")
    monkeypatch.chdir(tmp_path)
    old = [(d, x) for d, x in zip(corpus.doc_ids, corpus.texts)][:24]
    new = [(d, x) for d, x in zip(corpus.doc_ids, corpus.texts)][24:]
    for name, rows in (("docs.jsonl", old), ("new.jsonl", new)):
        (tmp_path / name).write_text("".join(json.dumps({"id": d, "text": x}) + "\n" for d, x in rows))
    test = [(q, t, r[0]) for q, t, r in zip(qs.qids, qs.texts, qs.relevant) if r[0] in dict(old)]
    (tmp_path / "queries.jsonl").write_text("".join(json.dumps({"id": q, "text": t}) + "\n" for q, t, _ in test))
    (tmp_path / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{d}\t1\n" for q, _, d in test))

    # 1. a jsonl file to a report in one `gdr run`
    readme = ["run", "data=jsonl", "data.path=docs.jsonl", "data.queries=queries.jsonl", "data.qrels=test.tsv",
              "indexers=[gc,hkmi]", "seeds=[0]", "out=runs/mine"]
    assert main(readme + _flat(_tiny(root))) == 0
    head = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert {"recall_at_1", "hkmi_recall_at_1", "bm25_recall_at_1"} <= set(head)
    md = (tmp_path / "runs/mine/report.md").read_text()
    assert md.startswith("# gdr run: docs, 24 documents") and "trained on generated queries only" in md

    # 2. the same from a pandas DataFrame, in Python
    import pandas as pd

    df = pd.DataFrame({"note_id": [d for d, _ in old], "body": [x for _, x in old]})
    corpus = gdr.Corpus.from_pandas(df, id_column="note_id", text_column="body")
    queries = gdr.QuerySet(name="mine", qids=[q for q, _, _ in test], texts=[t for _, t, _ in test],
                           relevant=[[d] for *_, d in test], splits=["test"] * len(test))
    report = gdr.run({"indexers": ["gc", "hkmi"], "seeds": [0], "out": "runs/notes", **_tiny(root)}, corpus=corpus,
                     queries=queries)
    assert set(gdr.headline(report)) >= {"recall_at_1", "hkmi_recall_at_1", "bm25_recall_at_1"}
    assert report["n_docs"] == 24 and report["n_test_queries"] == len(test) and report["corpus"] == "dataframe"
    assert (tmp_path / "runs/notes/report.md").is_file()

    # 3. new documents into the index: the run's queries and model, index add, a retriever on every document
    index = next((tmp_path / "runs/mine").glob("index-gc-*"))
    assert main(["score", "data=jsonl", "data.path=new.jsonl", "queries_from=runs/mine", "out=runs/mine-new",
                 "progress=false", "threads=1"]) == 0
    assert main(["index", "add", "run=runs/mine-new", f"index={index.relative_to(tmp_path)}", "out=runs/mine-gc",
                 "plot=false"]) == 0
    said = capsys.readouterr().out
    assert "added 6 documents" in said
    train = re.search(r"`(gdr train [^`]+)`", said).group(1)  # the command it ends with, on every document
    assert train == ("gdr train data=jsonl data.path=runs/mine-gc/documents.jsonl docids=runs/mine-gc/docids.tsv "
                     "out_dir=runs/mine-new-train")
    assert len((index / "docids.tsv").read_text().splitlines()) == 24  # the run's own stage is as it was
    assert main(shlex.split(train)[1:] + _flat(TINY_TRAIN)) == 0
    trained = (tmp_path / "runs/mine-new-train/docids.tsv").read_text().splitlines()
    assert len(trained) == 30 and {x.split("\t")[0] for x in trained} >= {d for d, _ in new}


def test_readme_trec_commands_compose_and_pass_the_checks(tmp_path, monkeypatch):
    """The `data=trec` commands of "Your own corpus" (the plain one and the one sized for 15 minutes on 2 cores), as
    printed, on files named as there: every setting exists and passes the checks made before any work."""
    from pathlib import Path

    from gdr.config import load_config
    from gdr.validate import validate

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    section = readme[readme.index("### Your own corpus"):readme.index("### A query generator")]
    commands = [shlex.split(c.replace("\\\n", " ")) for c in re.findall(r"^(gdr run data=trec.*?)\n(?!    )",
                                                                       section, re.M | re.S)]
    assert len(commands) == 2 and any("data.n_docs=300" in c for c in commands)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "fr940104.0").write_text("<DOC>\n<DOCNO> FR1 </DOCNO>\n<TEXT> a rule </TEXT>\n</DOC>\n")
    (tmp_path / "topics.401-450").write_text("<top>\n<num> Number: 401\n<title> rules\n</top>\n")
    (tmp_path / "qrels.401-450.txt").write_text("401 0 FR1 1\n")
    for argv in commands:
        validate("run", load_config("run", argv[2:]))
