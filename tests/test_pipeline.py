"""`gdr run` end to end on a 30-document corpus with tiny random-init models (offline, CPU)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from tiny_models import saved_tiny_llama

from gdr.cli import main
from gdr.data import Corpus, QuerySet, write_beir

pytestmark = pytest.mark.cost(seconds=24)  # the file's tests in all, fast lane, 2 cores: dealt first

TOPICS = ["cat mat rat", "stock market earnings", "central bank rates", "oil prices supply", "football striker club"]
INDEXERS = ("gc", "hkmi", "bmi", "random", "atomic")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A saved tiny causal LM (loadable by path, like any checkpoint) and a 30-document BEIR folder."""
    root = tmp_path_factory.mktemp("pipeline")
    saved_tiny_llama(root / "tiny-llama")
    return root, toy_collection(root / "toy")


def toy_collection(folder: Path) -> Path:
    """A 30-document BEIR folder of five topics, a third of its queries in the test split."""
    ids, texts, qtexts = [], [], []
    for i in range(30):
        t = TOPICS[i % 5].split()
        ids.append(f"d{i}")
        texts.append(f"{' '.join(t)} story number {i} about {t[0]} and {t[-1]} item{i}")
        qtexts.append(f"{t[0]} item{i}")
    qs = QuerySet(name="toy", qids=[f"q{i}" for i in range(30)], texts=qtexts, relevant=[[d] for d in ids],
                  splits=["test" if i % 3 == 0 else "train" for i in range(30)])
    return write_beir(Corpus(name="toy", doc_ids=ids, texts=texts), qs, folder)


def _args(root: Path, folder: Path, out: Path, *extra: str) -> list[str]:
    return [
        "run", f"data.name={folder}", f"model.name={root / 'tiny-llama'}", "model.max_doc_tokens=24",
        "sample.n_queries=16", "sample.batch_size=8", "sample.max_new_tokens=6", "doc_queries.per_doc=2",
        "index.n_clusters=4", "index.leaf_size=4", "index.gc.n_init=2", "index.gc.n_init_inner=1",
        "train.model.size=tiny", "train.trainer.max_steps=6", "train.trainer.max_epochs=100",
        "train.trainer.batch_size=16", "train.trainer.enable_progress_bar=false", "train.trainer.tensorboard=false",
        "train.trainer.val_beam=4", "train.trainer.check_val_every_n_epoch=50", "train.trainer.num_sanity_val_steps=0",
        "train.optim.warmup_steps=2", "evaluate.k=10", "evaluate.beam=10", "seeds=[0]", "progress=false",
        "threads=1", "plot=false", "index.plot=false", f"out={out}", *extra,
    ]


def _last_json(capsys) -> dict:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def _stages(out: Path) -> dict[str, dict]:
    return {s["name"]: s for s in json.loads((out / "report.json").read_text())["stages"]}


def test_pipeline_end_to_end_cache_and_resume(setup, tmp_path, capsys, monkeypatch):
    root, folder = setup
    out = tmp_path / "run"
    assert main(_args(root, folder, out, "plot=true", "index.plot=true")) == 0
    head = _last_json(capsys)
    assert {"seconds", "recall_at_1", "bm25_recall_at_1"} <= set(head)
    for m in INDEXERS:
        assert 0.0 <= head[f"{m}_recall_at_1"] <= 100.0

    # every artifact present, every stage finished
    for name in ("report.md", "report.json", "report.png", "run.config.yaml"):
        assert (out / name).is_file(), name
    stages = _stages(out)
    expected = {"score", "doc-queries", "bm25"} | {f"index-{m}" for m in INDEXERS} \
        | {f"{s}-{m}-s0" for m in INDEXERS for s in ("train", "eval")}
    assert set(stages) == expected and not any(s["reused"] for s in stages.values())
    for s in stages.values():
        marker = json.loads((out / s["folder"] / "stage.json").read_text())
        assert marker["status"] == "complete" and s["folder"].endswith(marker["key"])
    score = out / stages["score"]["folder"]
    logp = np.load(score / "P.npy")
    assert logp.shape == (30, 16) and np.isfinite(logp).all() and (logp < 0).all()
    assert len((out / stages["doc-queries"]["folder"] / "doc_queries.jsonl").read_text().splitlines()) == 30
    # the training queries are decoded with their own settings (conf/run.yaml doc_queries), P's with the sampler's
    dq = json.loads((out / stages["doc-queries"]["folder"] / "doc_queries.manifest.json").read_text())
    sq = json.loads((score / "queries.manifest.json").read_text())
    assert (dq["top_k"], dq["top_p"], dq["temperature"]) == (10, 1.0, 0.7)
    assert (sq["top_k"], sq["top_p"], sq["temperature"]) == (50, 0.99, 1.0)
    for m in INDEXERS:
        assert len((out / stages[f"index-{m}"]["folder"] / "docids.tsv").read_text().splitlines()) == 30
        assert (out / stages[f"index-{m}"]["folder"] / "summary.png").is_file()
        ev = json.loads((out / stages[f"eval-{m}-s0"]["folder"] / "metrics.json").read_text())
        r = ev["systems"]["gdr"]
        assert r["n_queries"] == 10 and 0.0 <= r["recall@1"] <= r["recall@10"] <= 1.0
    report = json.loads((out / "report.json").read_text())
    assert report["bm25"]["recall@10"] == 100.0  # each test query shares a unique word with its document
    assert "| gc |" in (out / "report.md").read_text()
    # paired comparisons: GC against every other scheme and BM25, on the same 10 test queries
    comps = report["comparisons"]
    assert {(c["a"], c["b"], c["metric"]) for c in comps} == {
        ("gc", b, m) for b in (*INDEXERS[1:], "bm25") for m in ("recall@1", "recall@10", "mrr@10")}  # evaluate.k=10
    for c in comps:
        assert c["n_queries"] == 10 and 0.0 <= c["p_value"] <= 1.0
        assert c["ci95"][0] <= c["diff"] <= c["ci95"][1]
        per_q = json.loads((out / stages[f"eval-{c['b']}-s0"]["folder"] / "per_query.json").read_text()) \
            if c["b"] != "bm25" else json.loads((out / stages["bm25"]["folder"] / "per_query.json").read_text())
        assert len(per_q["qids"]) == 10
    r10 = next(c for c in comps if c["b"] == "bm25" and c["metric"] == "recall@10")
    assert r10["diff"] == pytest.approx(report["retrieval"]["gc"]["recall@10"] - 100.0, abs=0.01)
    assert head["gc_vs_hkmi_recall_at_1_p"] == next(c["p_value"] for c in comps
                                                    if c["b"] == "hkmi" and c["metric"] == "recall@1")
    md = (out / "report.md").read_text()
    assert "## Paired comparisons" in md and report["verdict"] in md
    assert "GC" in report["verdict"] and "HKmI" in report["verdict"]
    # the primary test (verdict.pair gc - hkmi, Success@1): its line is the verdict, over seeds and queries
    prim = report["primary"]
    assert prim["line"] == report["verdict"] and prim["status"] == "undecided"  # one seed: its noise unmeasured
    assert "## Primary test" in md and "ran one seed, so the seed noise that could flip" in report["verdict"]
    test = prim["test"]
    assert test["n_queries"] == 10 and test["ci95"][0] <= test["diff"] <= test["ci95"][1]
    assert prim["query_only"] == next(c for c in comps if c["b"] == "hkmi" and c["metric"] == "recall@1")
    per_query = [json.loads(x) for x in (out / "per_query.jsonl").read_text().splitlines()]
    assert [(x["indexer"], x["seed"]) for x in per_query] == [(m, 0) for m in INDEXERS]
    assert all(len(x["qids"]) == len(x["first_rank"]) == 10 for x in per_query)
    assert set(prim["schemes"]) == set(INDEXERS) and prim["schemes"]["gc"]["mean"] == pytest.approx(
        report["retrieval"]["gc"]["recall@1"], abs=0.01)
    # the training phase of this invocation: every retriever's steps x batch over the phase's seconds
    train = report["training"]
    steps = [json.loads((out / stages[f"train-{m}-s0"]["folder"] / "stage.json").read_text())["info"]["global_step"]
             for m in INDEXERS]
    assert train["retrievers"] == len(INDEXERS) and train["examples"] == sum(steps) * train["batch"] > 0
    assert train["examples_per_s"] == pytest.approx(train["examples"] / train["seconds"], rel=0.01)
    assert train["free_gb"] is None and train["retrievers_at_once"] == 1  # the CPU
    assert "examples/s; 1 at once, n/a (CPU) free" in md
    outside = report["outside_stages"]  # every second of the invocation outside a stage, by part
    assert outside["seconds"] == pytest.approx(outside["lm_load"] + outside["report_rewrites"] + outside["other"],
                                               abs=0.2)
    assert outside["lm_load"] > 0 and outside["report_rewrites"] > 0 and "Outside any stage:" in md

    # a second run reuses every stage and reports the same numbers
    assert main(_args(root, folder, out)) == 0
    again = _last_json(capsys)
    assert all(s["reused"] for s in _stages(out).values())
    assert {k: v for k, v in again.items() if k != "seconds"} == {k: v for k, v in head.items() if k != "seconds"}
    assert json.loads((out / "report.json").read_text())["training"] is None  # nothing trained by this invocation

    # a changed alpha re-runs GC indexing and what depends on it, nothing else
    assert main(_args(root, folder, out, "index.gc.alpha=0.5")) == 0
    capsys.readouterr()
    ran = {name for name, s in _stages(out).items() if not s["reused"]}
    assert ran == {"index-gc", "train-gc-s0", "eval-gc-s0"}
    # retrievers.jsonl holds exactly the retrievers of this report: the superseded gc retriever's line is gone
    assert _retrievers(out) == [(m, 0, _stages(out)[f"eval-{m}-s0"]["folder"]) for m in INDEXERS]

    # a run killed inside a stage continues there: finished stages are reused, the killed one re-runs and
    # the run goes on past it (three schemes of a new seed: gc's retriever trains, hkmi's training is killed)
    import gdr.stages.train as train_stage

    calls = {"n": 0}
    real = train_stage.train_retriever

    def dies_on_second(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt("killed")
        return real(*args, **kwargs)

    monkeypatch.setattr(train_stage, "train_retriever", dies_on_second)
    killed_run = ("seeds=[1]", "indexers=[gc,hkmi,random]")
    try:
        rc = main(_args(root, folder, out, *killed_run))
    except KeyboardInterrupt:
        rc = 130
    assert rc != 0
    monkeypatch.setattr(train_stage, "train_retriever", real)
    killed = [p for p in out.glob("train-hkmi-s1-*")
              if json.loads((p / "stage.json").read_text())["status"] == "running"]
    assert len(killed) == 1
    assert main(_args(root, folder, out, *killed_run)) == 0
    capsys.readouterr()
    ran = {name for name, s in _stages(out).items() if not s["reused"]}
    assert ran == {f"{s}-{m}-s1" for m in ("hkmi", "random") for s in ("train", "eval")}
    assert json.loads((killed[0] / "stage.json").read_text())["status"] == "complete"
    assert _retrievers(out) == [(m, 1, _stages(out)[f"eval-{m}-s1"]["folder"]) for m in ("gc", "hkmi", "random")]
    line = json.loads((out / "retrievers.jsonl").read_text().splitlines()[0])
    assert line["best_val_metric"] == "val/recall@1" and line["best_val_recall1"] == line["best_val_score"]


def _retrievers(out: Path) -> list[tuple[str, int, str]]:
    """(indexer, seed, evaluation folder) of each line of ``retrievers.jsonl``."""
    lines = [json.loads(x) for x in (out / "retrievers.jsonl").read_text().splitlines()]
    return [(x["indexer"], x["seed"], x["eval"]) for x in lines]


def test_a_run_without_gc_skips_p_and_still_compares_its_schemes(setup, tmp_path, capsys):
    root, folder = setup
    out = tmp_path / "run"
    assert main(_args(root, folder, out, "indexers=[hkmi,random]", "bm25=false")) == 0
    head = _last_json(capsys)
    assert "score" not in _stages(out) and not list(out.glob("score-*"))  # nothing reads P
    report = json.loads((out / "report.json").read_text())
    assert {(c["a"], c["b"]) for c in report["comparisons"]} == {("hkmi", "random")}
    assert "gc_vs_hkmi_recall_at_1_p" not in head and report["primary"] is None
    # the default primary test (GC - HKmI) cannot be made, and the verdict line says why instead of another pair's
    assert report["verdict"] == ("No primary test: verdict.pair=[gc, hkmi] needs a retriever of gc, which "
                                 "indexers=[hkmi, random] does not train.")


def test_each_retrievers_learning_curve_is_in_its_stage_its_line_and_the_report(setup, tmp_path, capsys):
    """The protocol's training (no early stop, the final weights kept) validated every 2 steps: each train stage
    folder holds curve.json, a point per validation, the same in the retriever's retrievers.jsonl line; the report
    draws them (curves.png) and says where each peaked. The protocol's docids: HKmI's from tf-idf + SVD vectors,
    BMI's from its own vector (``index.bmi.inputs=realq_genq_docseg``), whose real queries are the training split's
    (20 of the 30; none of the 10 test queries), kept in its index folder under the documents they are relevant to,
    the split in its stage key."""
    root, folder = setup
    out = tmp_path / "run"
    assert main(_args(root, folder, out, "indexers=[hkmi,bmi,random]", "bm25=false",
                      "index.kmeans.embedding=tfidf-svd", "index.kmeans.svd_dim=8",
                      "index.bmi.inputs=realq_genq_docseg", "train.trainer.check_val_every_n_epoch=null",
                      "train.trainer.val_check_interval=2", "train.trainer.patience=0",
                      "train.trainer.weights=final", "plot=true")) == 0
    capsys.readouterr()
    stages = _stages(out)
    index = json.loads((out / stages["index-hkmi"]["folder"] / "manifest.json").read_text())
    assert index["embed_model"] == "tfidf-svd" and index["embedding_dim"] == 8
    bmi = out / stages["index-bmi"]["folder"]
    rows = [json.loads(x) for x in (bmi / "real_queries.jsonl").read_text().splitlines()]
    topic = [t.split()[0] for t in TOPICS]
    assert {(r["doc_id"], q) for r in rows for q in r["queries"]} == {
        (f"d{i}", f"{topic[i % 5]} item{i}") for i in range(30) if i % 3}  # the toy's train split
    assert json.loads((bmi / "manifest.json").read_text())["bmi_texts"] == {
        "inputs": "realq_genq_docseg", "real_queries": 20, "documents_with_real_queries": 20, "segments": 300}
    key = json.loads((bmi / "stage.json").read_text())["inputs"]
    assert (key["real_queries"]["split"], key["real_queries"]["n"]) == ("train", 20)
    assert key["index"]["bmi"] == {"inputs": "realq_genq_docseg", "segments": 10, "segment_words": 64}
    lines = [json.loads(x) for x in (out / "retrievers.jsonl").read_text().splitlines()]
    assert [x["indexer"] for x in lines] == ["hkmi", "bmi", "random"]
    for line in lines:
        curve = json.loads((out / line["train"] / "curve.json").read_text())
        assert [s for s, _ in curve] == [2, 4, 6] and all(0.0 <= v <= 1.0 for _, v in curve)
        assert line["curve"] == curve
    assert (out / "curves.png").is_file()
    md = (out / "report.md").read_text()
    assert "Learning curves" in md and "HKmI seed 0: val/recall@1 peaked at" in md


@pytest.mark.slow(seconds=15)
def test_score_processes_give_the_same_p_as_one(setup, tmp_path, monkeypatch):
    root, folder = setup
    common = ["score", f"data.name={folder}", f"model.name={root / 'tiny-llama'}", "model.max_doc_tokens=24",
              "sample.n_queries=8", "sample.max_new_tokens=6", "score.shard_size=4", "progress=false", "threads=1"]
    assert main([*common, f"out={tmp_path / 'one'}"]) == 0
    assert main([*common, f"out={tmp_path / 'two'}", "score.processes=2"]) == 0
    one, two = np.load(tmp_path / "one" / "P.npy"), np.load(tmp_path / "two" / "P.npy")
    assert one.shape == (30, 8) and np.array_equal(one, two)
    assert len(list((tmp_path / "two" / "P.shards").glob("*.done"))) == 8
    # a rerun over the finished P checks it in-process: no scoring process (and model load) is spawned
    import gdr.stages.score as score_stage

    def no_spawn(*a, **k):
        raise AssertionError("spawned scoring processes for a finished P")
    monkeypatch.setattr(score_stage, "score_in_processes", no_spawn)
    assert main([*common, f"out={tmp_path / 'two'}", "score.processes=2"]) == 0
    assert np.array_equal(np.load(tmp_path / "two" / "P.npy"), one)


def test_titles_need_articles_without_titles_and_bmi_needs_generated_queries(capsys):
    # refused before anything loads, with one line naming the setting
    assert main(["run", "data=bbc", "queries.name=titles", "data.drop_title=false"]) == 2
    assert "data.drop_title=true" in capsys.readouterr().err.strip()
    assert main(["run", "data=bbc", "indexers=[gc,bmi]", "doc_queries.per_doc=0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "per_doc" in err[0]
