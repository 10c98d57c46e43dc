"""Every ``conf/experiment/*.yaml`` composes with the command it is meant for and passes validation.

Fast (config composition only): no model, no data loaded. Data files an experiment needs are replaced
by stand-in paths under ``tmp_path``, so the checks run on a machine without MS MARCO or NQ320K.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from gdr.cli.help import CONFIG_OF
from gdr.config import conf_dir, load_config, to_container
from gdr.validate import ConfigError, validate

REPO = Path(__file__).resolve().parent.parent
EXPERIMENTS = sorted(p.stem for p in (conf_dir() / "experiment").glob("*.yaml"))
# Where an experiment's command is written down (`gdr run +experiment=demo` in the Makefile).
DOCS = [REPO / "Makefile", REPO / "README.md", *sorted((REPO / "reports").glob("*.md"))]


def commands_for(name: str) -> set[str]:
    """The configs of the `gdr <command>`s used with ``+experiment=name`` in the file itself and the docs (`gdr plan`
    composes run's); ``run`` if none."""
    pattern = re.compile(rf"gdr (\w+) [^\n]*\+experiment={re.escape(name)}(?![\w-])")
    texts = [(conf_dir() / "experiment" / f"{name}.yaml").read_text()]
    texts += [p.read_text() for p in DOCS if p.is_file()]
    found = {CONFIG_OF.get(m.group(1)) or m.group(1) for t in texts for m in pattern.finditer(t)}  # plan: run's
    return found or {"run"}


def stand_ins(data_name: str, tmp_path: Path) -> list[str]:
    """Overrides that point an experiment's data at stand-in files (validation stats paths, never reads them)."""
    folder = tmp_path / data_name
    folder.mkdir(exist_ok=True)
    if data_name == "msmarco-lite":
        docs = tmp_path / "msmarco-docs.tsv"
        docs.write_text("")
        return [f"data.path={folder}", f"data.docs_tsv={docs}"]
    if data_name in ("nq320k", "beir"):
        return [f"data.path={folder}"]
    return []


def compose(command: str, name: str, tmp_path: Path, *extra: str):
    first = load_config(command, [f"+experiment={name}"])
    return load_config(command, [f"+experiment={name}", *stand_ins(first.data.name, tmp_path), *extra])


def test_experiments_found():
    assert {"msmarco-lite", "nq320k"} <= set(EXPERIMENTS)
    # the Makefile's `gdr run +experiment=demo`; reports/bf16-scoring.md also scores and clusters it
    assert commands_for("demo") == {"run", "score", "cluster"}
    assert "run" in commands_for("msmarco-lite")


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_experiment_composes_and_validates(name, tmp_path):
    for command in sorted(commands_for(name)):
        cfg = compose(command, name, tmp_path)
        validate(command, cfg)


@pytest.mark.parametrize("name,data,n_test", [("msmarco-lite", "msmarco-lite", "dev"), ("nq320k", "nq320k", "dev")])
def test_paper_settings(name, data, n_test, tmp_path):
    """The settings of the paper's GDR experiment (Section "Application to Generative Retrieval")."""
    cfg = compose("run", name, tmp_path)
    assert cfg.data.name == data
    assert cfg.model.name == "doc2query/all-with_prefix-t5-base-v1" and cfg.model.prompt.prefix == "text2query: "
    assert cfg.sample.n_queries == 4096                       # J
    assert cfg.index.n_clusters == 30 and cfg.index.leaf_size == 30
    assert cfg.index.gc.alpha == 0.25 and cfg.index.gc.localized and cfg.index.gc.n_queries is None
    assert cfg.score.dtype == "float16" and cfg.score.doc_batch_size == "auto" and cfg.device == "auto"
    assert cfg.doc_queries.per_doc == 15 and cfg.train.examples.use_real and cfg.train.examples.use_generated
    assert cfg.train.model.size == "small30m"                 # "about 30M parameters"
    assert {"gc", "hkmi", "bmi"} <= set(cfg.indexers)
    assert cfg.queries.test_split == n_test and cfg.queries.train_split == "train"
    # one device unless asked: Lightning's default ddp on several GPUs would re-launch the whole `gdr run`
    assert cfg.train.trainer.devices == 1
    assert cfg.evaluate.k == 100 and cfg.evaluate.beam >= 100


def test_multi_gpu_overrides_validate(tmp_path):
    """The 8-GPU command of reports/paper-scale.md composes and validates (without GPUs: no cuda device named)."""
    cfg = compose("run", "msmarco-lite", tmp_path, "score.processes=8", "train.trainer.devices=8",
                  "train.trainer.strategy=ddp_spawn", "train.trainer.batch_size=64")
    validate("run", cfg)
    assert cfg.score.processes == 8 and cfg.train.trainer.strategy == "ddp_spawn"


def test_stand_ins_are_checked(tmp_path):
    """Validation does look at the data paths: a missing document TSV is named, with its key."""
    cfg = compose("run", "msmarco-lite", tmp_path, f"data.docs_tsv={tmp_path / 'absent.tsv'}")
    with pytest.raises(ConfigError, match=r"^data\.docs_tsv=.*absent\.tsv: no such file"):
        validate("run", cfg)


def test_bbc_protocol_follows_nci_and_bmi(tmp_path):
    """conf/experiment/bbc.yaml as reports/retriever-recipe.md says: the retriever as NCI sets it, a fixed budget
    kept whole with its final weights, K = 30 and leaf 30, HKmI on tf-idf + SVD vectors; the named variants change
    only what they name."""
    cfg = compose("run", "bbc", tmp_path)
    validate("run", cfg)
    assert cfg.train.model.size == "small30m" and cfg.train.model.pawa is True
    assert cfg.train.optim.consistency_weight == 0.15 and cfg.doc_queries.per_doc == 15
    t = cfg.train.trainer
    assert t.max_epochs == 40 and t.max_steps == -1 and t.weights == "final"
    assert t.patience == 0 and t.patience_steps is None and t.min_steps == 0
    assert t.check_val_every_n_epoch == 1 and t.val_check_interval is None  # 40 points of the curve, at any batch
    assert cfg.index.n_clusters == 30 and cfg.index.leaf_size == 30
    assert cfg.index.kmeans.embedding == "tfidf-svd" and cfg.index.bmi.inputs == "realq_genq_docseg"
    base = to_container(cfg)
    for name, changed in (("bbc-k10", {("index", "n_clusters"): 10, ("index", "leaf_size"): 10}),
                          ("bbc-minilm", {("index", "kmeans", "embedding"): "model"})):
        variant = compose("run", name, tmp_path)
        validate("run", variant)
        flat_v, flat_b = _flat(to_container(variant)), _flat(base)
        assert {k: v for k, v in flat_v.items() if flat_b.get(k) != v} == {**changed, ("out",): f"runs/{name}"}


def test_cranfield_runs_the_bbc_protocol_with_a_generator_that_sees_no_query(tmp_path):
    """conf/experiment/cranfield.yaml: bbc.yaml's retriever, budget, docids and index seeds, validated once an
    epoch; its generator fine-tuned on the abstracts' titles (no query: allowed with the folds), each abstract read
    without its title; the other differences are the corpus, the folds, the dev split and the generator's."""
    cran, bbc = compose("run", "cranfield", tmp_path), compose("run", "bbc", tmp_path)
    validate("run", cran)
    assert cran.queries.folds == 5 and cran.data.drop_title is True
    assert cran.qg.enabled is True and cran.qg.pairs == "titles" and cran.qg.compare_two_shot is False
    flat_c, flat_b = _flat(to_container(cran)), _flat(to_container(bbc))
    same = [k for k in flat_b if k[0] in ("train", "index", "doc_queries", "model", "sample", "indexers", "seeds",
                                          "index_seed")]
    # the two differences: BBC's dev is its 96 dev titles alone, Cranfield's trainer tops its ~18 held-out topics up
    # with held-out generated queries to a curve of 100 points; BMI's vector leaves the real queries out, as one
    # index serves all five folds
    assert {k: (flat_c.get(k), flat_b[k]) for k in same if flat_c.get(k) != flat_b[k]} == {
        ("train", "examples", "dev_min"): (100, 0), ("index", "bmi", "inputs"): ("genq_docseg", "realq_genq_docseg")}


def _flat(d: dict, prefix: tuple = ()) -> dict:
    out = {}
    for k, v in d.items():
        out.update(_flat(v, (*prefix, k)) if isinstance(v, dict) else {(*prefix, k): v})
    return out
