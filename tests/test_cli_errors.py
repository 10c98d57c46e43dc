"""Command-line errors: one line ``gdr <command>: error: ...``, exit 2, before any model or corpus loads."""
import logging

import pytest

from gdr.cli import main
from gdr.config import load_config
from gdr.data import Corpus
from gdr.validate import ConfigError, check_corpus, validate


@pytest.fixture(autouse=True)
def _config_alone(nothing_loads):
    """Every test here must fail (or pass) on the config alone: loading a model or a corpus is a bug."""


@pytest.fixture
def paths(tmp_path) -> dict[str, str]:
    """Inputs that exist: a P-matrix run, a docids file, a trained run folder."""
    run = tmp_path / "score-run"
    run.mkdir()
    (run / "P.npy").write_bytes(b"")
    docids = tmp_path / "docids.tsv"
    docids.write_text("d0\t0\n")
    train = tmp_path / "train-run"
    (train / "model").mkdir(parents=True)
    (train / "model" / "retriever.json").write_text("{}")
    return {"run": str(run), "docids": str(docids), "train": str(train), "tmp": str(tmp_path)}


def error_of(capsys, argv: list[str]) -> str:
    """Run ``gdr argv``; assert exit code 2 and exactly one stderr line ``gdr <command>: error: ...``."""
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"gdr {argv[0]}: error: "), lines[0]
    return lines[0]


# One case per (class of bad value, command); each names the key the message must show.
CASES = {
    "negative": [
        (["sample", "sample.n_queries=-3"], "sample.n_queries=-3", "positive integer"),
        (["score", "score.shard_size=-1"], "score.shard_size=-1", "positive integer"),
        (["cluster", "cluster.repeats=-1"], "cluster.repeats=-1", ">= 0"),
        (["index", "method=random", "data=r5", "leaf_size=-2"], "leaf_size=-2", "positive integer"),
        (["train", "docids={docids}", "trainer.batch_size=-8"], "trainer.batch_size=-8", "positive integer"),
        (["evaluate", "run_dir={train}", "beam=-1"], "beam=-1", "positive integer"),
    ],
    "out of range": [
        (["sample", "sample.top_p=1.5"], "sample.top_p=1.5", "(0, 1]"),
        (["score", "sample.temperature=0"], "sample.temperature=0", "> 0"),
        (["cluster", "cluster.gc.alpha=0"], "cluster.gc.alpha=0", "(0, 1]"),
        (["cluster", "cluster.n_clusters=1"], "cluster.n_clusters=1", ">= 2"),
        (["index", "run={run}", "n_clusters=4", "leaf_size=5"], "leaf_size=5", "n_clusters=4"),
        (["train", "docids={docids}", "examples.dev_fraction=1.0"], "examples.dev_fraction=1.0", "[0, 1)"),
        (["evaluate", "run_dir={train}", "k=20", "beam=10"], "k=20", "beam=10"),
        (["sample", "progress=flase"], "progress=flase", "true or false"),
        # refused with the config, before any stage runs (not after scoring, clustering and indexing)
        (["run", "+experiment=demo", "queries.fractions=[0.5,0.6,0.1]"], "queries.fractions=[0.5, 0.6, 0.1]",
         "must sum to 1 (these sum to 1.2)"),
        (["train", "docids={docids}", "+queries.fractions=[0.5,0.5]"], "queries.fractions=[0.5, 0.5]", "three"),
    ],
    "unknown name": [
        (["sample", "data.name=reuter"], "data.name=reuter", "unknown corpus"),
        (["score", "model.name=smollm2-13m"], "model.name=smollm2-13m", "did you mean smollm2-135m"),
        (["index", "method=kmeans", "run={run}"], "method=kmeans", "gc | hkmi | bmi | random | atomic"),
        (["index", "run={run}", "gc.proposal=mean"], "gc.proposal=mean", "power | naive"),
        (["cluster", "cluster.init=kmeans++"], "cluster.init=kmeans++", "did you mean k-means++"),
        (["score", "score.dtype=bf16"], "score.dtype=bf16", "float32 | float16"),
        (["score", "score.compute_dtype=fp16"], "score.compute_dtype=fp16", "auto | bfloat16 | float32"),
        (["sample", "sample.compile=yes"], "sample.compile=yes", "auto or true or false"),
        (["train", "docids={docids}", "model.size=huge"], "model.size=huge", "tiny"),
        (["sample", "device=tpu"], "device=tpu", "auto | cpu | cuda"),
    ],
    "missing path": [
        (["evaluate", "run_dir={tmp}/nope"], "run_dir=", "no such folder"),
        (["search", "a query", "run_dir={tmp}"], "run_dir=", "model/retriever.json"),
        (["train", "docids={tmp}/nope.tsv"], "docids=", "no such file"),
        (["index", "run={tmp}"], "run=", "P.npy"),
        (["index", "method=bmi", "kmeans.doc_queries={tmp}/dq.jsonl"], "kmeans.doc_queries=", "no such file"),
        (["sample", "data.path={tmp}/nope"], "data.path=", "no such"),
        # a misspelt query set: refused by name, not read as "no queries" and reported as an empty test split
        (["run", "+experiment=demo", "queries.name=titels"], "queries.name=titels", "titles, a BEIR folder"),
        (["evaluate", "run_dir={train}", "queries.name={tmp}/nope"], "queries.name=", "no folder holding"),
    ],
    "input a choice needs": [
        (["index", "method=bmi", "kmeans.doc_queries={docids}", "bmi.inputs=realq_genq_docseg"], "method=bmi",
         "needs bmi.real_queries="),
        (["index", "method=bmi", "kmeans.doc_queries={docids}", "bmi.inputs=genq_docseg"], "method=bmi",
         "needs the document texts"),
        (["run", "+experiment=cranfield", "index.bmi.inputs=realq_genq_docseg"], "index.bmi.inputs=realq_genq_docseg",
         "each fold's test topics"),
        (["run", "+experiment=bbc", "index.bmi.real_queries={docids}"], "index.bmi.real_queries=", "leave it null"),
        # a primary test named before the run that the run cannot make: refused, not swapped for another pair
        (["run", "+experiment=demo", "verdict.pair=[gc,bmi]"], "verdict.pair=[gc, bmi]",
         "bmi is not in indexers=[gc, hkmi]"),
    ],
    "unknown key": [
        (["sample", "sample.nqueries=3"], "sample.nqueries", "did you mean sample.n_queries"),
        (["train", "docids={docids}", "trainer.batchsize=3"], "trainer.batchsize", "did you mean trainer.batch_size"),
        (["index", "gc.alpa=1"], "gc.alpa", "did you mean gc.alpha"),
        (["cluster", "data=r6"], "data/r6", "r5"),
        # a key of data=jsonl|tsv|trec given with a corpus composed without it: the option to name, not a "+"
        (["run", "data=bbc", "data.queries={docids}"], "unknown key data.queries",
         "a key of data=jsonl | data=trec | data=tsv; name the option, e.g. data=jsonl data.path="),
    ],
    "missing mandatory": [
        (["train"], "docids=???", "set docids="),
        (["evaluate"], "run_dir=???", "set run_dir="),
        (["sample", "data=beir"], "data.path=???", "set data.path="),
    ],
}


@pytest.mark.parametrize("kind,argv,key,hint", [(kind, *case) for kind, cases in CASES.items() for case in cases],
                         ids=[f"{kind}:{' '.join(c[0])}" for kind, cases in CASES.items() for c in cases])
def test_bad_value_is_one_line_exit_2(capsys, paths, kind, argv, key, hint):
    line = error_of(capsys, [a.format(**paths) for a in argv])
    assert key.format(**paths) in line and hint in line, line


def test_override_syntax_error_names_the_argument(capsys):
    line = error_of(capsys, ["sample", "sample.n_queries=[1"])
    assert "sample.n_queries=[1" in line


def test_cuda_asked_for_but_missing(capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert "CUDA is not available" in error_of(capsys, ["sample", "device=cuda"])
    assert "index.gc.device=cuda" in str(pytest.raises(ConfigError, validate, "run",
                                                       load_config("run", ["index.gc.device=cuda"])).value)


def test_debug_reraises_with_traceback(capsys):
    with pytest.raises(ConfigError, match=r"sample\.n_queries=-3"):
        main(["sample", "sample.n_queries=-3", "--debug"])
    with pytest.raises(ConfigError, match="docids"):
        main(["--debug", "train"])
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException):
        main(["sample", "--debug", "sample.nqueries=3"])


def test_exits_and_interrupts(capsys, monkeypatch):
    import gdr.cli.commands.evaluate as cli_train

    def exits(argv):
        raise SystemExit("gdr evaluate: no 'test' queries with relevant documents for r5; set queries.name")

    monkeypatch.setattr(cli_train, "evaluate_main", exits)
    assert error_of(capsys, ["evaluate"]) == ("gdr evaluate: error: no 'test' queries with relevant documents "
                                              "for r5; set queries.name")

    def interrupted(argv):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_train, "evaluate_main", interrupted)
    assert main(["evaluate"]) == 130
    assert capsys.readouterr().err.strip() == "gdr evaluate: interrupted"

    def value_error(argv):
        raise ValueError("docids.tsv: line 3 has no code\nsecond line")

    monkeypatch.setattr(cli_train, "evaluate_main", value_error)
    assert "docids.tsv: line 3 has no code (--debug" in error_of(capsys, ["evaluate"])

    def bug(argv):
        raise RuntimeError("a bug")

    monkeypatch.setattr(cli_train, "evaluate_main", bug)
    with pytest.raises(RuntimeError):  # not a command-line error: the traceback stays
        main(["evaluate"])
    assert main(["sample", "--cfg", "sample.n_queries=8"]) == 0  # --cfg prints without validating
    assert "n_queries: 8" in capsys.readouterr().out


def test_default_configs_are_valid(paths):
    minimal = {
        "sample": ("sample", []),
        "score": ("score", []),
        "cluster": ("cluster", []),
        "index": ("index", [f"run={paths['run']}"]),
        "train": ("train", [f"docids={paths['docids']}"]),
        "evaluate": ("evaluate", [f"run_dir={paths['train']}"]),
        "search": ("evaluate", [f"run_dir={paths['train']}", "beam=5"]),  # search's k is 10 unless given
        "run": ("run", []),
    }
    for command, (name, overrides) in minimal.items():
        validate(command, load_config(name, overrides))
    for name in ("r5", "cranfield", "msmarco-lite", "nq320k"):
        validate("sample", load_config("sample", [f"data={name}"]))
    validate("sample", load_config("sample", ["model=doc2query-t5"]))  # a hub id stays valid offline
    validate("index", load_config("index", ["method=random", "data=r5", "n_clusters=2", "leaf_size=2"]))


def test_run_sections_use_the_stage_rules():
    def error(*overrides):
        with pytest.raises(ConfigError) as e:
            validate("run", load_config("run", list(overrides)))
        return str(e.value)

    # a rule that names another setting names it by its full key, as the user would override it
    assert error("index.leaf_size=31").startswith("index.leaf_size=31: must be <= index.n_clusters=30")
    assert error("train.trainer.max_epochs=0").startswith("train.trainer.max_epochs=0:")
    assert error("evaluate.k=200").startswith("evaluate.k=200: must be <= evaluate.beam=100")
    assert error("train.trainer.max_steps=5", "train.trainer.min_steps=9").startswith(
        "train.trainer.min_steps=9: must be <= train.trainer.max_steps=5")
    # the final weights of a fixed budget, which early stopping would cut short
    said = error("train.trainer.weights=final", "train.trainer.patience=3")
    assert said.startswith("train.trainer.weights=final: ") and "(train.trainer.patience=3)" in said
    assert "set train.trainer.patience=0 and train.trainer.patience_steps=null" in said
    assert "(train.trainer.patience_steps=400)" in error("train.trainer.weights=final", "train.trainer.patience=0",
                                                         "train.trainer.patience_steps=400")
    validate("run", load_config("run", ["train.trainer.weights=final", "train.trainer.patience=0"]))
    assert error("sample.n_queries=0").startswith("sample.n_queries=0:")
    assert "listed twice" in error("indexers=[gc,hkmi,gc]")
    assert "unknown indexer 'kmeans'" in error("indexers=[gc,kmeans]")
    assert "non-empty" in error("indexers=[]")
    assert error("seeds=[0,-1]").startswith("seeds=[0, -1]:")
    assert "bmi" in error("doc_queries.per_doc=0")
    validate("run", load_config("run", ["doc_queries.per_doc=0", "indexers=[gc,random]"]))
    assert error("+cluster.variants.x.clip_sigma=0").startswith("cluster.variants.x.clip_sigma=0:")


def test_a_run_deeper_or_a_leaf_larger_than_the_corpus_is_warned_before_any_stage(caplog):
    """Settings that are valid but mean less than they say on this corpus: each is one warning naming the key."""
    corpus = Corpus.from_texts([f"document {i}" for i in range(12)])
    cfg = load_config("run", ["+experiment=demo", "evaluate.k=20", "evaluate.beam=20", "index.leaf_size=12"])
    with caplog.at_level(logging.WARNING, logger="gdr.validate"):
        check_corpus("run", cfg, corpus)
    said = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("evaluate.k=20 is more than the corpus's 12 documents") for m in said), said
    assert any(m.startswith("index.leaf_size=12 holds all 12 documents") for m in said), said
