"""Every default is written once: in its settings or options dataclass (gdr/stages/settings.py, the commands' own
keys in gdr/stages/command_keys.py, the kernels' training/options.py and indexing/options.py, gdr/options.py for what
several kernels read, gdr/models.py for the query generator, gdr/data/options.py for the corpus).

The ``conf/stage/*.yaml`` files the commands compose and the ``conf/data``, ``conf/model`` group options are generated
from those dataclasses (``make conf``); a command's own YAML (``conf/<command>.yaml``) holds only its ``defaults`` list
and may not set a key that a generated file it composes holds; the few defaults ``gdr train``/``gdr run``/``gdr qg``
change of the training kernel's are listed once and must differ from the kernel's; a second class that holds a
setting takes it with ``same_setting``; and no function writes a setting's default again, as a parameter's default or
a ``.get`` fallback or the literal of ``x or <literal>`` (it names the field).
"""
from __future__ import annotations

import ast
import inspect
import shutil
import textwrap
from dataclasses import MISSING, asdict, fields, is_dataclass
from pathlib import Path

import pytest
import yaml

import gdr
import gdr.data.options
import gdr.indexing.options
import gdr.models
import gdr.options
import gdr.stages.command_keys
import gdr.stages.settings
import gdr.training.options
from gdr.config import conf_dir, flat_leaves
from gdr.indexing.options import GCOptions
from gdr.stages.command_keys import QG_TRAIN, IndexKeys, QGKeys, QGSection, RunKeys, RunQueries
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
    assert s.trainer == TrainerOptions()
    assert s.examples == ExampleOptions(**STAGE_EXAMPLES)
    assert s.optim == OptimOptions(**STAGE_OPTIM)
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
        value = getattr(cls(), name)  # a typed section (TrainSettings') or a dict of its keys
        assert sorted(asdict(value) if is_dataclass(value) else value) == sorted(declared), (cls.__name__, name)
    assert asdict(IndexSettings().gc) == {**asdict(IndexGC()), **asdict(GCOptions())}
    assert ClusterSettings().gc == ClusterGC()
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


# the modules that declare settings: each dataclass in them is a settings or options class
DECLARING = (gdr.options, gdr.models, gdr.data.options, gdr.training.options, gdr.indexing.options,
             gdr.stages.settings, gdr.stages.command_keys)
# a name whose literal default is the convention of every function and section that takes it, not one setting's
CONVENTIONS = {
    "seed": "0 unless given, in every seeded function: each stage's seed is a setting of its own",
    "progress": "a progress bar: each function's own switch (the commands' progress key turns them all on or off)",
    "plot": "draw the figures unless told not to",
}
# (function, parameter) or (file, key of a .get): a setting's name used for another thing
OTHER_MEANING = {
    ("record_files", "exclude"): "the files a folder's record leaves out, not qg.exclude's corpora",
    ("gdr/upgrade.py", "length_buckets"): "what a training of format 0 ran with, a fact of that format",
    ("gdr/stages/sample.py", "p_per_doc"): "a sampling manifest without p_per_doc drew Algorithm 1's J queries",
    ("gdr/upgrade.py", "monitor"): "what a training of format 0 chose its checkpoint by, a fact of that format",
    ("gdr/plan.py", "patience"): "train.trainer.patience null: no early stopping (qg's patience is another setting)",
}
# a setting's name that functions use for another thing throughout
OTHER_NAMES = {"prefix": "a key's dotted prefix in the config helpers, not the prompt's prefix"}
# two sections' keys of one name that are two settings
OTHER_SETTING = {
    "batch_size": "queries per decode batch (sample) and per beam search (evaluate)",
    "bm25": "BM25 beside one evaluation (evaluate) and the run's BM25 baseline (gdr run)",
}


def setting_defaults() -> dict[str, list]:
    """Field name -> the defaults the settings and options classes give it (None and interpolations left out)."""
    out: dict[str, list] = {}
    for module in DECLARING:
        for cls in vars(module).values():
            if not (isinstance(cls, type) and is_dataclass(cls) and cls.__module__ == module.__name__):
                continue
            for f in fields(cls):
                value = (f.default if f.default is not MISSING else
                         f.default_factory() if f.default_factory is not MISSING else None)
                if value is not None and not (isinstance(value, str) and value.startswith(("${", "???"))):
                    out.setdefault(f.name, []).append(value)
    return out


def _same(value, defaults: list) -> bool:
    return any(value == d or (isinstance(value, tuple) and list(value) == d) for d in defaults)


def literal_copies(source: str, where: str, defaults: dict[str, list]) -> list[str]:
    """``where: f(name=literal)`` for each parameter of a function in ``source`` named like a setting whose default
    is written as a literal equal to that setting's default, ``where: .get('name', literal)`` for each such
    fallback, and ``where: name or literal`` (``name``, ``obj.name``, ``d["name"]``, ``d.get("name")``) for each such
    stand-in for a null: a default written twice. Writing the field (``seed: int = DataOptions.seed``) is the one
    copy; None (not given: the callee decides) is not a copy."""
    found = []

    def check(name: str, node: ast.expr, what: str, exempt: tuple) -> None:
        if name not in defaults or name in CONVENTIONS or name in OTHER_NAMES or exempt in OTHER_MEANING:
            return
        try:
            value = ast.literal_eval(node)
        except ValueError:
            return  # a name or an attribute: written once elsewhere
        if value is not None and _same(value, defaults[name]):
            found.append(f"{where}: {what}")

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            positional = args.posonlyargs + args.args
            pairs = [*zip(positional[len(positional) - len(args.defaults):], args.defaults),
                     *((a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None)]
            for arg, default in pairs:
                check(arg.arg, default, f"{node.name}({arg.arg}={ast.unparse(default)})", (node.name, arg.arg))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in ("get", "pop", "setdefault") and len(node.args) == 2
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            key = node.args[0].value
            check(key, node.args[1], f".{node.func.attr}({key!r}, {ast.unparse(node.args[1])})", (where, key))
        elif isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or) and len(node.values) == 2:
            key = _read_setting(node.values[0])
            empty = ast.unparse(node.values[1]) in ("[]", "()", "{}")  # `x or []`: None read as nothing
            if key is not None and not empty:
                check(key, node.values[1], ast.unparse(node), (where, key))
    return found


def _read_setting(node: ast.expr) -> str | None:
    """The setting name an expression reads: ``x``, ``obj.x``, ``d["x"]``, ``d.get("x")`` (None: none)."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
        return node.slice.value
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
            and len(node.args) == 1 and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
        return node.args[0].value
    return None


def test_no_function_repeats_a_default_of_a_setting():
    """No function of gdr (the kernels, the LM, the stages, the API, the loaders, the benchmarks) writes a setting's
    default again, as a parameter's default or as a dict lookup's fallback: each takes it from the class that
    declares it (``max_doc_tokens: int = ModelOptions.max_doc_tokens``, ``alpha=GCFitOptions.alpha``,
    ``t.get("accelerator", TrainerOptions.accelerator)``), so a changed default changes everywhere at once."""
    defaults = setting_defaults()
    assert {"alpha", "max_doc_tokens", "top_p", "seed", "k", "lr_encoder", "n_clusters", "encoding"} <= set(defaults)
    root = Path(gdr.__file__).resolve().parent.parent
    files = [p for pkg in ("gdr", "indexing", "training", "eval") for p in sorted((root / pkg).rglob("*.py"))]
    assert len(files) > 100
    found = [c for p in files for c in literal_copies(p.read_text(encoding="utf-8"),
                                                      p.relative_to(root).as_posix(), defaults)]
    assert found == []


def _literal_settings(source: str) -> list[tuple[str, str, object]]:
    """(class, field, default) of each field of ``source``'s classes declared as ``setting(<literal>, ...)``."""
    out = []
    for node in ast.parse(source).body:
        for st in node.body if isinstance(node, ast.ClassDef) else ():
            if (isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name) and isinstance(st.value, ast.Call)
                    and getattr(st.value.func, "id", None) == "setting" and st.value.args):
                try:
                    value = ast.literal_eval(st.value.args[0])
                except ValueError:
                    continue
                if value is not None and not (isinstance(value, str) and value.startswith("${")):
                    out.append((node.name, st.target.id, value))
    return out


def test_no_two_sections_write_one_default():
    """A key that two settings classes declare with the same literal default is one setting written twice (the second
    takes it with same_setting, as the flat clustering's alpha takes generative clustering's), unless it is the
    convention of a name (CONVENTIONS) or two settings that share a name (OTHER_SETTING)."""
    written: dict[tuple[str, str], list[str]] = {}
    for module in DECLARING:
        for cls, name, value in _literal_settings(inspect.getsource(module)):
            written.setdefault((name, repr(value)), []).append(cls)
    assert len(written) > 100
    twice = {key: classes for key, classes in written.items()
             if len(classes) > 1 and key[0] not in CONVENTIONS and key[0] not in OTHER_SETTING}
    assert twice == {}


def test_a_literal_copy_is_found():
    """The checks above find a copy, and only a copy: a literal equal to a setting's default, as a parameter's default
    or a .get fallback, or a second class writing one; not a name, not None, not another value, not a convention."""
    source = textwrap.dedent("""
        def loader(path=None, *, seed: int = 0, n_docs=None, encoding: str = DataOptions.encoding, min_relevance=2,
                   topic_fields=("title",), drop_title: bool = False):
            return cfg.get("alpha", 0.25), cfg.get("alpha", GCFitOptions.alpha), cfg.get("k", 10), cfg.get("beam")

        def reader(t, cfg, exclude):
            return (t.trainer.get("val_beam") or 10, cfg["k"] or 100, t.alpha or 0.25, cfg.get("k") or 10,
                    t.val_beam or TrainerOptions.val_beam, exclude or [])

        class A:
            alpha: float = setting(0.25, "a copy")
            beta: float = same_setting(GCFitOptions, "alpha")
        """)
    assert literal_copies(source, "x.py", setting_defaults()) == [
        "x.py: loader(topic_fields=('title',))", "x.py: loader(drop_title=False)", "x.py: .get('alpha', 0.25)",
        "x.py: t.trainer.get('val_beam') or 10", "x.py: cfg['k'] or 100", "x.py: t.alpha or 0.25"]
    assert _literal_settings(source) == [("A", "alpha", 0.25)]
