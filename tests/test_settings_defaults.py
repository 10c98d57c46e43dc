"""Every default is written once: in its settings dataclass (gdr/stages/settings.py, training/options.py) or, for a
command's own keys (out, indexers, queries.*, qg.* ...), in gdr/stages/command_keys.py.

The ``conf/stage/*.yaml`` files the commands compose are generated from those dataclasses (``make conf``); a command's
own YAML (``conf/<command>.yaml``) holds only its ``defaults`` list and may not set a key that a generated file it
composes holds, and the few defaults ``gdr train``/``gdr run``/``gdr qg`` change of the training kernel's are listed
once and must differ from the kernel's.
"""
from __future__ import annotations

import ast
import inspect
import shutil
import textwrap
from dataclasses import MISSING, asdict, fields
from pathlib import Path

import pytest
import yaml

import gdr.api
import gdr.data
import gdr.data.irds
import gdr.data.trec
from gdr.config import conf_dir, flat_leaves
from gdr.data import Corpus
from gdr.data.options import DataOptions
from gdr.indexing.options import GCOptions
from gdr.lm import GenerativeLM
from gdr.stages.command_keys import QG_TRAIN, EvaluateQueries, IndexKeys, QGKeys, QGSection, RunKeys, RunQueries
from gdr.stages.settings import (
    GENERATED,
    GROUP_OPTIONS,
    SECTIONS,
    STAGE_EXAMPLES,
    STAGE_OPTIM,
    ClusterGC,
    ClusterSettings,
    EvaluateSettings,
    IndexGC,
    IndexSettings,
    LMSettings,
    SampleSettings,
    ScoreSettings,
    TrainSettings,
    generated_yaml,
    section_classes,
    write_generated,
)
from gdr.training.options import ExampleOptions, OptimOptions, QGOptions, TrainerOptions


def _included(cdir: Path, name: str, package: str = "") -> list[tuple[str, str]]:
    """(generated file, the package its keys land in) of every generated file ``conf/<name>.yaml`` composes, through
    the command configs it includes (``run`` includes ``cluster``, which includes ``score`` ...)."""
    raw = yaml.safe_load((cdir / f"{name}.yaml").read_text(encoding="utf-8")) or {}
    out = []
    for entry in raw.get("defaults", []):
        if not isinstance(entry, str) or entry == "_self_":
            continue  # a group choice (data: bbc) picks an option file, which holds choices, not defaults
        path, _, at = entry.partition("@")
        where = package if at in ("", "_here_") else ".".join(p for p in (package, at) if p)
        if f"{path}.yaml" in GENERATED:
            out.append((f"{path}.yaml", where))
        elif (cdir / f"{path}.yaml").is_file():
            out += _included(cdir, path, where)
    return out


def _own_keys(command_file: Path) -> dict:
    """Dotted key -> value of what a command YAML writes besides its ``defaults`` list."""
    raw = yaml.safe_load(command_file.read_text(encoding="utf-8")) or {}
    return {k: v for k, v in flat_leaves(raw).items() if k.split(".")[0] != "defaults"}


def duplicates(cdir: Path) -> list[str]:
    """``file: key`` for every value a command's YAML writes at a key a generated settings file it composes already
    holds (a default written twice)."""
    found = []
    for command_file in sorted(cdir.glob("*.yaml")):
        own = _own_keys(command_file)
        for gen, package in _included(cdir, command_file.stem):
            generated = flat_leaves(yaml.safe_load((cdir / gen).read_text(encoding="utf-8")) or {})
            for key in generated:
                full = f"{package}.{key}" if package else key
                hits = [k for k in own if k == full or k.startswith(full + ".") or full.startswith(k + ".")]
                found += [f"{command_file.name}: {k} (also {gen})" for k in hits]
    return sorted(set(found))


def test_generated_stage_files_are_what_the_dataclasses_write():
    """A default or a help text changed by hand in conf/stage/*.yaml (a second copy of it) fails here: `make conf`
    rewrites them from the dataclasses."""
    for name in GENERATED:
        text = (conf_dir() / name).read_text(encoding="utf-8")
        assert text == generated_yaml(name), f"conf/{name} differs from its dataclass: run `make conf`"


def test_no_command_yaml_repeats_a_default_of_its_settings():
    assert duplicates(conf_dir()) == []


def test_command_yamls_hold_only_what_they_compose():
    """Every key of a command comes from a dataclass (through a generated file) or a config group's option: the
    command YAMLs write none, and every generated file is composed by some command."""
    cdir = conf_dir()
    commands = sorted(cdir.glob("*.yaml"))
    assert {p.stem for p in commands} >= {"sample", "score", "cluster", "index", "train", "evaluate", "qg", "run"}
    for command_file in commands:
        assert _own_keys(command_file) == {}, f"{command_file.name} writes keys: declare them in a dataclass"
    included = {gen for p in commands for gen, _ in _included(cdir, p.stem)}
    assert included == set(GENERATED)


def test_a_default_written_twice_is_found(tmp_path):
    """The check above finds a copy: a sampling default written into conf/sample.yaml, a trainer default into
    conf/run.yaml's train section and cluster.enabled back into conf/run.yaml."""
    cdir = tmp_path / "conf"
    shutil.copytree(conf_dir(), cdir)
    with open(cdir / "sample.yaml", "a", encoding="utf-8") as f:
        f.write("sample:\n  top_k: 50\n")
    with open(cdir / "run.yaml", "a", encoding="utf-8") as f:
        f.write("train:\n  trainer:\n    max_epochs: 20\ncluster:\n  enabled: true\nindexers: [gc]\n"
                "doc_queries:\n  top_k: 10\n")
    with open(cdir / "qg.yaml", "a", encoding="utf-8") as f:
        f.write("qg:\n  train:\n    lr: 1.0e-4\n")
    with open(cdir / "train.yaml", "a", encoding="utf-8") as f:
        f.write("docids: ???\n")
    assert duplicates(cdir) == ["qg.yaml: qg.train.lr (also stage/qg_keys.yaml)",
                                "run.yaml: cluster.enabled (also stage/cluster_enabled.yaml)",
                                "run.yaml: doc_queries.top_k (also stage/run_keys.yaml)",
                                "run.yaml: indexers (also stage/run_keys.yaml)",
                                "run.yaml: train.trainer.max_epochs (also stage/train.yaml)",
                                "sample.yaml: sample.top_k (also stage/sample.yaml)",
                                "train.yaml: docids (also stage/train_paths.yaml)"]
    (cdir / "stage" / "score.yaml").write_text("dtype: float32\n", encoding="utf-8")
    (cdir / "stage" / "run_keys.yaml").write_text("seeds: [0]\n", encoding="utf-8")
    assert write_generated(cdir) == ["stage/score.yaml", "stage/run_keys.yaml"]  # `make conf` puts the text back


def test_stage_sections_are_the_kernels_fields():
    """TrainSettings' examples, optim and trainer (and gdr qg's qg.train) are gdr.training.options' fields and defaults
    (not a copy), but for the defaults the commands change, each of which differs from the kernel's (else it would be
    written twice)."""
    s = TrainSettings()
    assert s.trainer == asdict(TrainerOptions())
    assert s.examples == {**asdict(ExampleOptions()), **STAGE_EXAMPLES}
    assert s.optim == {**asdict(OptimOptions()), **STAGE_OPTIM}
    assert QGKeys().qg["train"] == {**asdict(QGOptions()), **QG_TRAIN}
    for kernel, changed in ((ExampleOptions(), STAGE_EXAMPLES), (OptimOptions(), STAGE_OPTIM),
                            (QGOptions(), QG_TRAIN)):
        for key, value in changed.items():
            assert getattr(kernel, key) != value, f"{type(kernel).__name__}.{key}={value} is written twice"


def test_every_section_key_is_declared_by_one_dataclass_field():
    """Each dict-valued settings field (index.gc, trainer ...) holds the fields of its section classes, each key
    declared by exactly one of them (index.gc: the stage's own IndexGC and the kernel's GCOptions), so a key's
    default and help live in one place."""
    for cls, name in SECTIONS:
        declared = [f.name for section in section_classes(cls, name) for f in fields(section)]
        assert len(declared) == len(set(declared)), f"{cls.__name__}.{name}: a key declared twice"
        assert sorted(getattr(cls(), name)) == sorted(declared), (cls.__name__, name)
    assert IndexSettings().gc == {**asdict(IndexGC()), **asdict(GCOptions())}
    assert ClusterSettings().gc == asdict(ClusterGC())
    assert QGKeys().qg == asdict(QGSection())


@pytest.mark.parametrize("cls, name, command, key, generated, local", [
    (TrainerOptions, "monitor", "train", "trainer.monitor", "stage/train.yaml", "trainer.monitor"),
    (EvaluateSettings, "beam", "evaluate", "beam", "stage/evaluate.yaml", "beam"),
    (RunKeys, "seeds", "run", "seeds", "stage/run_keys.yaml", "seeds"),
    (RunQueries, "folds", "run", "queries.folds", "stage/run_keys.yaml", "queries.folds"),
    (QGOptions, "patience", "qg", "qg.train.patience", "stage/qg_keys.yaml", "qg.train.patience"),
    (IndexKeys, "index", "index", "index", "stage/index_keys.yaml", "index"),
])
def test_help_reads_what_a_key_means_from_its_field(monkeypatch, cls, name, command, key, generated, local):
    """`gdr <command> --help` says what a key means from its field's metadata, not from YAML comments: a stage
    setting (the trainer's monitor, the search's beam) and a command's own key (gdr run's seeds, queries.folds,
    gdr qg's qg.train.patience, gdr index's index) alike; a changed help text shows at once."""
    import gdr.cli.help as help_module

    def line_of(text: str, key: str) -> str:
        return next(x for x in text.splitlines() if x.strip().startswith(f"{key} ="))

    said = [f for f in fields(cls) if f.name == name][0].metadata["help"]
    assert " ".join(said.split()[:4]) in line_of(help_module.command_help(command, command), key)
    real = help_module.generated_help
    monkeypatch.setattr(help_module, "generated_help",
                        lambda file: {**real(file), local: "as the field says"} if file == generated else real(file))
    assert "as the field says" in line_of(help_module.command_help(command, command), key)



# ----------------------------------------------------------------------------- config groups and the Python API

def test_generated_group_options_are_what_the_dataclasses_write():
    """conf/data/*.yaml and conf/model/*.yaml are written from DataOptions and ModelOptions (and their option tables):
    a default or help changed by hand in one of them fails here, and each file reads back as the option's values."""
    cdir = conf_dir()
    for group in ("data", "model"):
        on_disk = {f"{group}/{p.name}" for p in (cdir / group).glob("*.yaml")}
        assert on_disk == {name for name in GROUP_OPTIONS if name.startswith(group + "/")}, "run `make conf`"
    for name, (cls, option) in GROUP_OPTIONS.items():
        text = (cdir / name).read_text(encoding="utf-8")
        assert text == generated_yaml(name), f"conf/{name} differs from {cls.__name__}: run `make conf`"
        values = {**asdict(cls()), **option.values}
        assert yaml.safe_load(text) == {k: values[k] for k in option.keys}
        assert list(yaml.safe_load(text)) == list(option.keys)


def literal_copies(func, classes) -> list[str]:
    """``func(param=...)`` for each parameter of ``func`` named like a field of one of ``classes`` whose default is
    written as a literal (``seed: int = 0``) equal to that field's default: a default written twice. Writing the
    field (``seed: int = DataOptions.seed``) is the one copy; None (not given: the callee decides) is not a copy."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
    node = next(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))
    args = node.args
    positional = args.posonlyargs + args.args
    pairs = [*zip(positional[len(positional) - len(args.defaults):], args.defaults),
             *((a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None)]
    defaults = {}
    for cls in classes:
        for f in fields(cls):
            if f.default is not MISSING:
                defaults.setdefault(f.name, f.default)
            elif f.default_factory is not MISSING:
                defaults.setdefault(f.name, f.default_factory())
    found = []
    for arg, default in pairs:
        if arg.arg not in defaults:
            continue
        try:
            value = ast.literal_eval(default)
        except ValueError:
            continue  # a name or an attribute: written once elsewhere
        same = value == defaults[arg.arg] or (isinstance(value, tuple) and list(value) == defaults[arg.arg])
        if value is not None and same:
            found.append(f"{func.__qualname__}({arg.arg}={ast.unparse(default)})")
    return found


# every function of the Python API whose parameters are settings, with the settings classes that declare them
API_SETTINGS = [
    (gdr.api.load_lm, (LMSettings,)),
    (GenerativeLM.__init__, (LMSettings,)),
    (gdr.api.sample_queries, (SampleSettings,)),
    (gdr.api.sample_doc_queries, (SampleSettings,)),
    (gdr.api.score, (SampleSettings, ScoreSettings)),
    (gdr.api.split_queries, (RunQueries,)),
    (gdr.api.evaluate_clusters, (ClusterSettings,)),
    (gdr.api.build_index, (IndexSettings,)),
    (gdr.api.train_retriever, (TrainSettings,)),
    (gdr.api.evaluate, (EvaluateSettings, EvaluateQueries, DataOptions)),
    (gdr.api.bm25, (EvaluateSettings, EvaluateQueries, DataOptions)),
    *((loader, (DataOptions,)) for loader in (
        gdr.data.load_corpus, gdr.data.load_queries, gdr.data.load_bbc, gdr.data.load_reuters,
        gdr.data.load_cranfield, gdr.data.load_beir, gdr.data.load_beir_queries, gdr.data.load_msmarco_lite,
        gdr.data.load_msmarco_lite_queries, gdr.data.load_nq320k, gdr.data.load_nq320k_queries,
        gdr.data.load_docs_file, gdr.data.load_file_queries, gdr.data.load_trec, gdr.data.trec.read_trec_topics,
        gdr.data.load_irds, gdr.data.irds.load_irds_query_sets, gdr.data.load_irds_queries, Corpus.sample)),
]


def test_no_api_signature_repeats_a_default_of_its_settings():
    """A Python API function that sets a setting takes its default from the settings class (``gdr.load_lm``'s
    ``max_doc_tokens``, ``gdr.data.load_corpus``'s ``seed``, ``load_docs_file``'s field names ...): written there
    once, so the API and the commands cannot drift apart."""
    found = [copy for func, classes in API_SETTINGS for copy in literal_copies(func, classes)]
    assert found == []


def test_a_literal_copy_in_a_signature_is_found():
    """The check above finds a copy, and only a copy: a literal equal to the field's default, not a name, not None,
    not another value."""
    def loader(path=None, *, seed: int = 0, n_docs=None, encoding: str = DataOptions.encoding, min_relevance=2,
               topic_fields=("title",), drop_title: bool = False):
        return path

    assert literal_copies(loader, (DataOptions,)) == [
        "test_a_literal_copy_in_a_signature_is_found.<locals>.loader(seed=0)",
        "test_a_literal_copy_in_a_signature_is_found.<locals>.loader(topic_fields=('title',))",
        "test_a_literal_copy_in_a_signature_is_found.<locals>.loader(drop_title=False)"]
