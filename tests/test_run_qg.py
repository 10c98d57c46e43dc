"""The query generator fine-tuned inside `gdr run` (qg.enabled): its pairs hold the training split only (a planted
dev or test title never reaches them), the LM stages after it are keyed by its key, a second run reuses everything,
qg.enabled=false keeps the old keys, and `gdr prune` drops its weights once its readers are complete."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from tiny_models import saved_tiny_llama

from gdr.carry import prunable
from gdr.cli import main
from gdr.config import load_config
from gdr.data import Corpus, QuerySet, write_beir
from gdr.data.titles import drop_titles, title_queries
from gdr.models import model_digest
from gdr.rules import ConfigError
from gdr.stages.qg import check_run_pairs, check_title_pairs, run_pairs, run_title_pairs
from gdr.training.qg import QGPairs
from gdr.validate import check_run

TOPICS = ["cat mat rat", "stock market earnings", "central bank rates", "oil prices supply", "football striker club"]


def _titled(n: int = 60) -> Corpus:
    ids = [f"d{i}" for i in range(n)]
    texts = [f"{TOPICS[i % 5]} story {i} body text" for i in range(n)]
    titles = [f"headline {i} {TOPICS[i % 5].split()[0]}" for i in range(n)]
    return Corpus(name="toy", doc_ids=ids, texts=texts, titles=titles)


def _planted(qs: QuerySet, extra: QuerySet, i: int, split: str) -> QuerySet:
    """``qs`` with query ``i`` of ``extra`` added as a query of ``split``."""
    return QuerySet(name=qs.name, qids=[*qs.qids, extra.qids[i]], texts=[*qs.texts, extra.texts[i]],
                    relevant=[*qs.relevant, extra.relevant[i]], splits=[*qs.splits, split])


@pytest.mark.parametrize("split_label", ["train", "test"], ids=["relabelled-train", "as-test"])
def test_a_planted_dev_or_test_title_never_reaches_the_generators_pairs(split_label):
    corpus = _titled()
    qs = title_queries(corpus, seed=0, fractions=(0.5, 0.2, 0.3))
    train, dev, test = (qs.filter(s) for s in ("train", "dev", "test"))
    assert len(train) and len(dev) and len(test)
    clean = run_pairs(corpus, train, [dev, test], "train")
    assert len(clean) == len(train) and set(clean.doc_ids) == {r[0] for r in train.relevant}
    planted = _planted(_planted(train, test, 0, split_label), dev, 0, split_label)
    pairs = run_pairs(corpus, planted, [dev, test], "train")
    assert test.texts[0] not in pairs.queries and dev.texts[0] not in pairs.queries
    assert test.relevant[0][0] not in pairs.doc_ids and dev.relevant[0][0] not in pairs.doc_ids
    assert (pairs.queries, pairs.doc_ids) == (clean.queries, clean.doc_ids)
    # every pair's document is one of the training split's; the guard refuses any that is not
    train_docs = {d for r in train.relevant for d in r}
    assert set(pairs.doc_ids) <= train_docs


def test_the_guard_refuses_pairs_holding_a_held_out_query_or_a_document_outside_the_training_split():
    corpus = _titled()
    qs = title_queries(corpus, seed=0, fractions=(0.5, 0.2, 0.3))
    train, dev, test = (qs.filter(s) for s in ("train", "dev", "test"))
    texts = dict(zip(corpus.doc_ids, corpus.model_inputs()))
    good = run_pairs(corpus, train, [dev, test], "train")
    check_run_pairs(good, train, [dev, test])  # the builder's own pairs pass
    for held in (test, dev):
        d = held.relevant[0][0]
        leak = QGPairs([*good.docs, texts[d]], [*good.queries, held.texts[0]], [*good.doc_ids, d])
        with pytest.raises(ValueError, match="not \\(query, document\\) pairs of the training split"):
            check_run_pairs(leak, train, [dev, test])
        # even a split that claims the held-out query as its own is refused by the held-out check
        with pytest.raises(ValueError, match="leak of held-out queries"):
            check_run_pairs(leak, _planted(train, held, 0, "train"), [dev, test])


# ------------------------------------------------------------------------------------------ the rehearsal
@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A saved tiny causal LM and a 30-document labelled BEIR folder with train, dev and test queries."""
    root = tmp_path_factory.mktemp("run-qg")
    saved_tiny_llama(root / "tiny-llama")
    ids, texts, qtexts, labels = [], [], [], []
    for i in range(30):
        t = TOPICS[i % 5].split()
        ids.append(f"d{i}")
        texts.append(f"{' '.join(t)} story number {i} about {t[0]} and {t[-1]} item{i}")
        qtexts.append(f"{t[0]} item{i}")
        labels.append(t[0])
    qs = QuerySet(name="toy", qids=[f"q{i}" for i in range(30)], texts=qtexts, relevant=[[d] for d in ids],
                  splits=["test" if i % 3 == 0 else "dev" if i % 5 == 1 else "train" for i in range(30)])
    folder = write_beir(Corpus(name="toy", doc_ids=ids, texts=texts, labels=labels), qs, root / "toy")
    return root, folder, qs


def _args(root: Path, folder: Path, out: Path, *extra: str) -> list[str]:
    return [
        "run", f"data.name={folder}", f"model.name={root / 'tiny-llama'}", "model.max_doc_tokens=24",
        "sample.n_queries=8", "sample.batch_size=8", "sample.max_new_tokens=4", "doc_queries.per_doc=1",
        "indexers=[gc]", "index.n_clusters=4", "index.leaf_size=4", "index.gc.n_init=1", "index.gc.n_init_inner=1",
        "cluster.repeats=1", "train.model.size=tiny", "train.trainer.max_steps=2", "train.trainer.max_epochs=100",
        "train.trainer.batch_size=16", "train.trainer.enable_progress_bar=false", "train.trainer.tensorboard=false",
        "train.trainer.val_beam=4", "train.trainer.check_val_every_n_epoch=50", "train.trainer.num_sanity_val_steps=0",
        "train.optim.warmup_steps=0", "evaluate.k=10", "evaluate.beam=10", "seeds=[0]", "progress=false",
        "threads=1", "bm25=false", "plot=false", "index.plot=false", f"out={out}", *extra,
    ]


QG_ON = ["qg.enabled=true", "qg.train.max_steps=3", "qg.train.batch_size=4", "qg.train.eval_batch_size=8",
         "qg.train.warmup_steps=0", "qg.train.lr=1e-3", "qg.train.accelerator=cpu", "qg.train.devices=1",
         "qg.dev_fraction=0.2"]


def _markers(out: Path) -> dict[str, dict]:
    """stage folder name -> its stage.json."""
    return {p.parent.name: json.loads(p.read_text()) for p in out.glob("*/stage.json")}


def _one(markers: dict, prefix: str, pred=lambda m: True) -> tuple[str, dict]:
    found = [(n, m) for n, m in markers.items() if n.startswith(prefix + "-") and n[len(prefix) + 1:].isalnum()
             and pred(m)]
    assert len(found) == 1, (prefix, sorted(markers))
    return found[0]


@pytest.mark.slow
def test_run_fine_tunes_its_generator_on_the_train_split_and_keys_the_lm_stages_by_it(setup, tmp_path, capsys):
    root, folder, qs = setup
    out = tmp_path / "run"
    # overlap forced on: both clusterings run in the background (the runs below, with it off, reuse every stage)
    assert main(_args(root, folder, out, *QG_ON, "qg.compare_two_shot=true", "overlap=true")) == 0
    marks = _markers(out)
    qg_name, qg = _one(marks, "qg")
    assert qg["status"] == "complete"
    info = qg["info"]
    train_docs = {r[0] for r, s in zip(qs.relevant, qs.splits) if s == "train"}
    assert info["pairs"]["pairs"] == len(train_docs) and info["pairs"]["documents"] == len(train_docs)
    held = info["held_out"]
    assert held["n_pairs"] == sum(s == "dev" for s in qs.splits)
    for k in ("two_shot", "fine_tuned"):
        assert held[k]["loss_per_token"] > 0 and held[k]["nll_per_query"] > 0
    # P and the generated training queries come from the fine-tuned generator, keyed by the qg stage's key
    tuned = {"qg": qg["key"]}
    _, score = _one(marks, "score", lambda m: m["inputs"]["lm"] == tuned)
    _, dq = _one(marks, "doc-queries")
    assert dq["inputs"]["lm"] == tuned
    sq = json.loads((out / _one(marks, "score", lambda m: m["inputs"]["lm"] == tuned)[0] / "queries.manifest.json")
                    .read_text())
    # the sampler records the model it drew with: the qg stage's export (its weights' digest, its prompt's no shots)
    assert sq["lm"]["weights"] == model_digest(str(out / qg_name / "model"))
    assert sq["lm"]["weights"] != model_digest(str(root / "tiny-llama")) and not sq["lm"]["prompt"]["shots"]
    # the two-shot comparison: the base model's P (its key as a run without qg) and a clustering of each P
    two_name, two = _one(marks, "score", lambda m: m["inputs"]["lm"] != tuned)
    assert "weights" in two["inputs"]["lm"]
    assert len([n for n in marks if n.startswith("cluster-")]) == 2
    report = json.loads((out / "report.json").read_text())
    gen = report["generator"]
    assert gen["cluster"]["fine_tuned"] and gen["cluster"]["two_shot"]
    assert {"cluster", "cluster (two-shot)"} <= set(report["overlapped"]["stages"])
    assert set(gen["cluster"]["fine_tuned"]) >= {"gc_acc", "gc_nmi", "gc_ari"}
    md = (out / "report.md").read_text()
    assert "## Query generator" in md and "Held-out loss on the run's dev split" in md
    # the pairs it trained on, apart from those held out to pick its checkpoint; the header names it fine-tuned
    picked = f" ({info['n_checkpoint_dev']} more of them held out to pick the checkpoint)" if info["n_checkpoint_dev"] \
        else ""
    assert f"Fine-tuned in the run on {info['n_train']} (document, query) pairs" in md and picked in md
    assert info["n_train"] + info["n_checkpoint_dev"] == info["pairs"]["pairs"]
    assert f"Query generator `{root / 'tiny-llama'}` fine-tuned in the run (Query generator, below)" in md

    # a second run reuses every stage
    capsys.readouterr()
    assert main(_args(root, folder, out, *QG_ON, "qg.compare_two_shot=true")) == 0
    assert all(s["reused"] for s in json.loads((out / "report.json").read_text())["stages"])

    # gdr prune drops the generator's weights (its readers are complete); a rerun still reuses P and the queries
    assert any(t.folder.name == qg_name for t in prunable(out))
    capsys.readouterr()
    assert main(["prune", str(out)]) == 0
    assert "pruned 1 evaluated retrievers and 1 query generator" in capsys.readouterr().out
    assert not list((out / qg_name / "model").glob("*.safetensors"))
    assert json.loads((out / qg_name / "stage.json").read_text())["pruned"]
    assert main(_args(root, folder, out, *QG_ON, "qg.compare_two_shot=true")) == 0
    stages = json.loads((out / "report.json").read_text())["stages"]
    assert all(s["reused"] for s in stages) and any(s["name"] == "qg" for s in stages)
    assert not list((out / qg_name / "model").glob("*.safetensors"))  # not retrained

    # qg.enabled=false: today's stages and keys, the two-shot P of the first run among them
    off = tmp_path / "off"
    assert main(_args(root, folder, off)) == 0
    off_marks = _markers(off)
    assert not [n for n in off_marks if n.startswith("qg-")]
    off_score, _ = _one(off_marks, "score")
    assert off_score == two_name
    off_dq, dq_off = _one(off_marks, "doc-queries")
    assert "weights" in dq_off["inputs"]["lm"] and off_dq not in marks


def test_a_generator_is_refused_with_folds(setup, tmp_path, capsys):
    root, folder, _ = setup
    assert main(_args(root, folder, tmp_path / "o", *QG_ON, "queries.folds=3")) == 2
    err = capsys.readouterr().err
    assert "qg.enabled=true" in err and "queries.folds=null" in err and "qg.pairs=titles" in err
    assert main(_args(root, folder, tmp_path / "o", "qg.enabled=maybe")) == 2
    assert "qg.enabled" in capsys.readouterr().err


# ------------------------------------------------------------------------- qg.pairs=titles (a cross-validated run)
def test_title_pairs_hold_no_query_and_no_held_out_documents_title():
    """qg.pairs=titles: (document without its title, its title) pairs; the held-out documents' titles are never
    trained on, a title that reads as a query of the run is left out, and the guard refuses a planted one."""
    corpus = _titled()
    everything, held = run_title_pairs(corpus, 0.3, 1, [])
    assert len(held) and len(everything) + len(held) == len(corpus)
    planted = everything.doc_ids[3]  # a trained document whose title is planted as a test query of the run
    queries = QuerySet(name="q", qids=["q0", "q1"],
                       texts=["stock market earnings", corpus.titles[corpus.doc_ids.index(planted)].upper()],
                       relevant=[["d1"], [planted]], splits=["train", "test"])
    pairs, held_again = run_title_pairs(corpus, 0.3, 1, [queries, None])
    assert held_again.doc_ids == held.doc_ids and len(pairs) == len(everything) - 1
    assert planted not in pairs.doc_ids and not set(pairs.doc_ids) & set(held.doc_ids)
    assert not {q.lower() for q in pairs.queries} & {t.lower() for t in queries.texts}
    titles, bodies = dict(zip(corpus.doc_ids, corpus.titles)), dict(zip(corpus.doc_ids, corpus.texts))
    assert all(q == titles[d] and doc == bodies[d] and q not in doc
               for doc, q, d in zip(pairs.docs, pairs.queries, pairs.doc_ids))
    d = held.doc_ids[0]
    with pytest.raises(ValueError, match="held-out documents"):
        check_title_pairs(QGPairs([*pairs.docs, held.docs[0]], [*pairs.queries, held.queries[0]],
                                  [*pairs.doc_ids, d]), held, [queries])
    with pytest.raises(ValueError, match="text of a query of the run"):
        check_title_pairs(QGPairs([*pairs.docs, "x"], [*pairs.queries, queries.texts[0]], [*pairs.doc_ids, "d1"]),
                          held, [queries])
    with pytest.raises(ValueError, match="qg.pairs=titles: corpus 'bare' has no titles.*qg.pairs=queries"):
        run_title_pairs(Corpus(name="bare", doc_ids=["a", "b"], texts=["one", "two"]), 0.3, 1, [queries])


def test_drop_title_strips_the_copy_of_the_title_that_opens_a_body():
    """Cranfield's abstracts open with their title: without it the title pairs would teach the generator to copy
    the input's opening. A copy differing in spacing or punctuation goes too, a body that is only its title stays."""
    corpus = Corpus(name="c", doc_ids=["1", "2", "3", "4"],
                    texts=["mach 3 .5 flow . the flow was measured", "a wing. tests of a wing", "a wings study",
                           "only the title"],
                    titles=["mach 3. 5 flow .", "a wing", "a wing", "only the title"])
    dropped = drop_titles(corpus)
    assert dropped.texts == ["the flow was measured", "tests of a wing", "a wings study", "only the title"]
    assert dropped.titles is None and dropped.info["repeated_titles_stripped"] == 2


@pytest.mark.parametrize("overrides, says", [
    (["+experiment=cranfield", "qg.pairs=queries"], ["queries.folds=5", "qg.pairs=queries", "qg.pairs=titles"]),
    (["+experiment=bbc", "qg.pairs=titles"], ["qg.pairs=titles", "queries.name=titles", "qg.pairs=queries"]),
    (["+experiment=cranfield", "data.drop_title=false"], ["qg.pairs=titles", "data.drop_title=true"]),
    (["data=beir", "data.path=/nowhere", "qg.enabled=true", "qg.pairs=titles"], ["qg.pairs=titles", "data=beir",
                                                                                 "qg.pairs=queries"]),
], ids=["queries-with-folds", "titles-are-the-queries", "titles-kept", "no-titles"])
def test_the_generators_pairs_are_refused_at_the_door_where_they_would_leak(overrides, says):
    with pytest.raises(ConfigError) as e:
        check_run(load_config("run", overrides))
    assert all(s in str(e.value) for s in says), str(e.value)


def test_title_pairs_pass_the_door_with_folds_and_with_one_split():
    for extra in ([], ["queries.folds=null"]):
        cfg = load_config("run", ["+experiment=cranfield", *extra])
        check_run(cfg)
        assert cfg.qg.enabled and cfg.qg.pairs == "titles" and cfg.data.drop_title
