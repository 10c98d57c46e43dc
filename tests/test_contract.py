"""One contract for every entry point: the Python API's functions and the settings dataclasses refuse
what the commands refuse, with the commands' rules and messages, before any model or data loads; the stage
functions lock their out folder as the commands do; `gdr run` checks the settings that compare with the corpus
before its first stage."""
from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import math
import pkgutil
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_pipeline import _args, setup  # noqa: F401  (module fixture: a saved tiny LM and a 30-document corpus)

import gdr
import gdr.stages
from gdr.cli import main
from gdr.store import TEXTS_FILE, text_digests
from gdr.validate import ConfigError

pytestmark = pytest.mark.cost(seconds=24)  # the file's tests in all, fast lane, 2 cores: dealt first

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def no_loading(monkeypatch, patch_where_bound):
    """Loading a model, a retriever or a corpus fails the test: a bad argument must be refused before."""
    def forbidden(*args, **kwargs):
        raise AssertionError("loaded a model or a corpus before checking the arguments")

    import transformers

    for mod in pkgutil.iter_modules(gdr.stages.__path__):  # imported first: none binds a patched loader for good
        importlib.import_module(f"gdr.stages.{mod.name}")

    for cls in ("AutoConfig", "AutoModelForCausalLM", "AutoModelForSeq2SeqLM", "AutoTokenizer"):
        monkeypatch.setattr(getattr(transformers, cls), "from_pretrained", forbidden)
    monkeypatch.setattr("gdr.training.search.Retriever.load", forbidden)
    for loader in ("load_bbc", "load_reuters", "load_cranfield", "load_beir", "load_msmarco_lite", "load_nq320k"):
        patch_where_bound(f"gdr.data.{loader}", forbidden)
    patch_where_bound("gdr.store.load_run", forbidden)


def _queries(n: int = 2):
    """A valid query set, so that only the numbers passed beside it are under test."""
    return gdr.QuerySet(name="toy", qids=[f"q{i}" for i in range(n)], texts=[f"query {i}" for i in range(n)],
                        relevant=[[f"d{i}"] for i in range(n)], splits=["test"] * n)


def _corpus(n: int = 6):
    return gdr.Corpus(name="toy", doc_ids=[f"d{i}" for i in range(n)], texts=[f"text number {i}" for i in range(n)],
                      labels=["a", "b"] * (n // 2))


# ------------------------------------------------------------------ every function of gdr.__all__ that takes a number
# The settings class whose fields a function's keyword arguments are: "**" for **kwargs, else the parameter.
SETTINGS_OF = {
    "sample_queries": {"**": gdr.SampleSettings},
    "sample_doc_queries": {"**": gdr.SampleSettings},
    "score": {"sampling": gdr.SampleSettings, "scoring": gdr.ScoreSettings},
    "evaluate_clusters": {"**": gdr.ClusterSettings},
    "build_index": {"**": gdr.IndexSettings},
    "train_retriever": {"**": gdr.TrainSettings},
    "evaluate": {"**": gdr.EvaluateSettings},
    "run": {"settings": None},  # conf/run.yaml's keys: validate("run"), the command's own check (test_api.py)
    "load_lm": {"prompt": None},  # gdr.lm.PromptConfig's fields: texts, no numbers
    "split_queries": {"data": None},  # how the corpus was loaded (name, path): where title queries are read
}
# Where -1 means something (no limit, all), a value out of range is another one.
BAD = {"trainer.max_steps": -2, "trainer.num_sanity_val_steps": -2, "gc.centroid_json_depth": -2,
       "length_penalty": math.nan, "trainer.length_penalty": math.nan, "fractions": (0.5, 0.5, 0.5),
       "min_relevance": 1.5}  # a grade: any integer, negative too (some qrels mark spam -2)


def _numeric(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _number_parameters(obj) -> list[str]:
    """Parameters of ``obj`` (a function, or a class's constructor) that take a number."""
    out = []
    for p in inspect.signature(obj).parameters.values():
        ann = str(p.annotation)
        if _numeric(p.default) or re.fullmatch(r"(int|float)( \| (int|float|str|None))*", ann):
            out.append(p.name)
    return out


def _settings_leaves(cls) -> list[str]:
    """Numeric fields of a settings dataclass, nested dict fields as ``field.key``."""
    out, defaults = [], cls()
    for f in dataclasses.fields(cls):
        v = getattr(defaults, f.name)
        v = dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v  # a typed section: its keys
        if isinstance(v, dict) and f.name != "model_presets":
            out += [f"{f.name}.{k}" for k, x in v.items() if _numeric(x)]
        elif _numeric(v) or f.type in ("int | None", "float | None"):
            out.append(f.name)
    return out


def _nested(path: str, value) -> dict:
    head, _, rest = path.partition(".")
    return {head: _nested(rest, value) if rest else value}


def _cases() -> list[tuple[str, str, str]]:
    """(export, where the number goes: a parameter or ``<mapping>:<settings path>``, its name in the message)."""
    cases = []
    for name in gdr.__all__:
        obj = getattr(gdr, name)
        if not callable(obj) or inspect.isclass(obj) and issubclass(obj, BaseException):
            continue
        if dataclasses.is_dataclass(obj) and name.endswith("Settings"):
            cases += [(name, f"**:{leaf}", leaf) for leaf in _settings_leaves(obj)]
            continue
        own = _number_parameters(obj)
        cases += [(name, p, p) for p in own]
        for where, cls in SETTINGS_OF.get(name, {}).items():
            if cls is not None:  # a field the function takes as its own parameter is not given twice
                cases += [(name, f"{where}:{leaf}", leaf) for leaf in _settings_leaves(cls) if leaf not in own]
    return cases


CASES = _cases()


def test_every_export_with_settings_or_numbers_is_covered():
    """A function of gdr.__all__ that takes settings (**kwargs or a mapping) must be listed in SETTINGS_OF, so the
    parametrized test below covers its numbers too; and the list covers the numbers that reach a model or a file
    when unchecked."""
    for name in gdr.__all__:
        obj = getattr(gdr, name)
        if not callable(obj) or inspect.isclass(obj):
            continue
        takes = [p.name for p in inspect.signature(obj).parameters.values()
                 if p.kind is p.VAR_KEYWORD or "Mapping" in str(p.annotation)]
        assert not takes or name in SETTINGS_OF, (name, takes)
    have = {(f, leaf) for f, _, leaf in CASES}
    for want in [("load_lm", "max_doc_tokens"), ("sample_queries", "temperature"), ("sample_queries", "n_queries"),
                 ("sample_queries", "max_new_tokens"), ("sample_queries", "top_p"), ("evaluate", "beam"),
                 ("bm25", "k"), ("load_corpus", "n_docs"), ("GenerativeLM", "max_doc_tokens"),
                 ("train_retriever", "trainer.max_steps"), ("build_index", "gc.alpha"), ("score", "shard_size")]:
        assert want in have, want
    assert len(CASES) > 150


def _call(name: str, where: str, value, tmp_path: Path):
    fn = getattr(gdr, name)
    out = tmp_path / "out"
    corpus = _corpus()
    param, _, path = where.partition(":")
    kw = {param: value} if not path else _nested(path, value) if param == "**" else {param: _nested(path, value)}
    if name.endswith("Settings"):
        top = next(iter(kw))
        return fn.merged(kw) if isinstance(kw[top], dict) else fn(**kw)
    calls = {
        "load_lm": lambda: fn("smollm2-135m", **kw),
        "sample_queries": lambda: fn(object(), corpus, out, **kw),
        "sample_doc_queries": lambda: fn(object(), corpus, out, **kw),
        "score": lambda: fn(corpus, "smollm2-135m", out, **kw),
        "split_queries": lambda: fn(corpus, "train", **kw),
        "evaluate_clusters": lambda: fn(corpus, tmp_path / "run", out, **kw),
        "build_index": lambda: fn(out, **kw),
        "train_retriever": lambda: fn(corpus, tmp_path / "docids.tsv", out, **kw),
        "evaluate": lambda: fn(tmp_path / "train", corpus, _queries(), out, **kw),
        "bm25": lambda: fn(corpus, _queries(), out, **kw),
        "pack": lambda: fn(tmp_path / "run", out, **kw),
        "load_corpus": lambda: fn("bbc", **kw),
        "load_title_queries": lambda: fn("bbc", **kw),
        "load_queries": lambda: fn("cranfield", **kw),
        "GenerativeLM": lambda: fn("smollm2-135m", **kw),
        "GenerativeClustering": lambda: fn(**{"n_clusters": 2, **kw}).fit(np.log(np.full((4, 3), 0.5))),
    }
    return calls[name]()


@pytest.mark.parametrize("name,where,shown", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_a_number_out_of_range_is_refused_naming_the_argument(no_loading, tmp_path, name, where, shown):
    """Every gdr.* function (and settings class) that takes a number refuses one out of its
    range, naming the argument, before a model or data loads and before any file is written."""
    value = BAD.get(shown, -1)
    with pytest.raises((ValueError, TypeError)) as e:
        _call(name, where, value, tmp_path)
    assert re.search(rf"\b{re.escape(shown)}\b", str(e.value)), str(e.value)
    assert len(str(e.value).splitlines()) == 1
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("call,match", [
    (lambda t: gdr.load_lm("smollm2-135m", max_doc_tokens=0), r"^max_doc_tokens=0: must be a positive integer"),
    (lambda t: gdr.load_lm("no-such-model"), r"^name=no-such-model: unknown model"),
    (lambda t: gdr.sample_queries(object(), _corpus(), t, temperature=-1.0), r"^temperature=-1.0: must be a number"),
    (lambda t: gdr.sample_queries(object(), _corpus(), t, temperature=0.0), r"^temperature=0.0: must be a number > 0"),
    (lambda t: gdr.sample_queries(object(), _corpus(), t, n_queries=0), r"^n_queries=0: must be a positive integer"),
    (lambda t: gdr.sample_queries(object(), _corpus(), t, max_new_tokens=0), r"^max_new_tokens=0: must be a posit"),
    (lambda t: gdr.sample_queries(object(), _corpus(), t, top_p=2.0), r"^top_p=2.0: must be a number in \(0, 1\]"),
    (lambda t: gdr.score(_corpus(), "smollm2-135m", t, n_queries=-1), r"^n_queries=-1: must be a positive integer"),
    (lambda t: gdr.evaluate(t / "tr", _corpus(), _queries(), t, k=1, beam=0), r"^beam=0: must be a positive integer"),
    (lambda t: gdr.evaluate(t / "tr", _corpus(), _queries(), t, k=30, beam=20), r"^k=30: must be <= beam=20"),
    (lambda t: gdr.bm25(_corpus(), _queries(), t, k=0), r"^k=0: must be a positive integer"),
    (lambda t: gdr.load_corpus("bbc", n_docs=0), r"^n_docs=0: must be null or a positive integer"),
    (lambda t: gdr.load_corpus("bbc", n_docs="8"), r"^n_docs='8': must be null or a positive integer"),  # text
])
def test_bad_api_values_are_refused_before_anything_loads(no_loading, tmp_path, call, match):
    """Each value, unchecked, gives junk (identical rows of P, gibberish queries, R@1 of another beam, all-zero
    BM25, an empty corpus) or fails after the model loads, leaving a manifest: refused first, nothing written."""
    out = tmp_path / "out"
    with pytest.raises(ConfigError, match=match):
        call(out)
    assert not out.exists()


def test_settings_and_commands_share_one_table(tmp_path):
    """The message a settings class gives is the command's, with the field for the key: one table of rules."""
    from gdr.config import load_config
    from gdr.validate import validate

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "retriever.json").write_text("{}")  # a train folder, for `gdr evaluate`'s run_dir

    pairs = [("sample", "sample.temperature=-1.0", lambda: gdr.SampleSettings(temperature=-1.0)),
             ("score", "score.shard_size=0", lambda: gdr.ScoreSettings(shard_size=0)),
             ("evaluate", "beam=0", lambda: gdr.EvaluateSettings(beam=0)),
             ("index", "gc.alpha=-1.0", lambda: gdr.IndexSettings.merged(gc={"alpha": -1.0})),
             ("train", "trainer.min_steps=9", lambda: gdr.TrainSettings.merged(trainer={"max_steps": 3,
                                                                                          "min_steps": 9})),
             ("sample", "model.max_doc_tokens=0", lambda: gdr.LMSettings(max_doc_tokens=0))]
    for command, override, make in pairs:
        more = {"train": [f"docids={tmp_path / 'model' / 'retriever.json'}", "trainer.max_steps=3"],
                "evaluate": [f"run_dir={tmp_path}"], "index": ["out=x", "method=random", "data=bbc"]}.get(command, [])
        with pytest.raises(ConfigError) as cli:
            validate(command, load_config(command, [override, *more]))
        with pytest.raises(ConfigError) as api:
            make()
        key = override.split("=")[0]
        field = key.split(".", 1)[1] if command in ("sample", "score") else key
        assert str(cli.value).split(": ", 1)[1] == str(api.value).split(": ", 1)[1], (cli.value, api.value)
        assert str(api.value).startswith(f"{field}=")


def test_a_document_with_empty_text_is_not_scored(no_loading, tmp_path):
    """gdr.score refuses a corpus holding an empty text before writing anything, unless the loader kept it on
    purpose (on_empty=keep lists it in corpus.info)."""
    corpus = gdr.Corpus(name="toy", doc_ids=["a", "b", "c"], texts=["one", "  ", "three"])
    with pytest.raises(ValueError, match=r"document 'b' has empty text"):
        gdr.score(corpus, "smollm2-135m", tmp_path / "out", n_queries=2)
    assert not (tmp_path / "out").exists()
    from gdr.stages.sample import check_texts

    corpus.info["empty_text"] = ["b"]
    check_texts(corpus)  # kept on purpose: scored as the command does (cranfield's two empty documents)


# ----------------------------------------------------------------------------------- locks in the library
def _hold(folder: Path):
    """Another process holding ``folder``'s lock, as a running `gdr score out=<folder>` does."""
    folder.mkdir(parents=True, exist_ok=True)
    code = ("import sys, time; from gdr import guard; guard.lock_folder(sys.argv[1], command='gdr score'); "
            "print('held', flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(folder)], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_stage_functions_lock_their_folder_as_the_commands_do(setup, tmp_path):  # noqa: F811
    """gdr.score(...) and `gdr score out=<same>` never write one folder together: every stage function takes
    the folder's lock, refused while another process holds it, released when it returns."""
    from gdr import guard

    root, folder = setup
    corpus = gdr.load_corpus(str(folder))
    lm = gdr.LMSettings(name=str(root / "tiny-llama"), max_doc_tokens=24, threads=1)
    out = tmp_path / "score"
    proc = _hold(out)
    try:
        with pytest.raises(guard.FolderBusy, match=rf"out={re.escape(str(out))}: in use by another gdr process"):
            gdr.score(corpus, lm, out, n_queries=4, sampling={"max_new_tokens": 4})
        for call in (lambda: gdr.build_index(out, method="random", corpus=corpus, n_clusters=4, leaf_size=4),
                     lambda: gdr.bm25(corpus, gdr.split_queries(corpus, "test"), out),
                     lambda: gdr.sample_queries(lm.build(), corpus, out, n_queries=2, max_new_tokens=4)):
            with pytest.raises(guard.FolderBusy):
                call()
        assert not (out / "queries.jsonl").exists()
    finally:
        proc.kill()
        proc.wait()
    p = gdr.score(corpus, lm, out, n_queries=4, sampling={"max_new_tokens": 4})
    assert p.logp.shape == (30, 4)
    assert guard._HELD == {}  # released: a command may write the folder now
    proc = _hold(out)  # and another process can take it
    proc.kill()
    proc.wait()


# ----------------------------------------------------------------------------------- gdr run: data rules first
BBC = ["data=bbc", "data.n_docs=20", "queries.name=titles", "data.drop_title=true"]  # a labelled corpus (bundled)


@pytest.mark.parametrize("extra,line", [
    (["index.gc.n_queries=100"], "index.gc.n_queries=100: must be <= sample.n_queries=16"),
    ([*BBC, "cluster.n_clusters=30"], "cluster.n_clusters=30: must be <= the 20 documents"),
    ([*BBC, "cluster.restrict_labels=[nosuchlabel]"],
     "cluster.restrict_labels=[nosuchlabel]: 'nosuchlabel' is not a label of corpus 'bbc'"),
    ([*BBC, "cluster.restrict_labels=[tech]"], "cluster.n_clusters=null: K would be the number of labels, 1"),
])
def test_run_refuses_settings_that_compare_with_the_corpus_before_stage_1(setup, tmp_path, capsys, extra,  # noqa: F811
                                                                        line):
    """Each is refused before the first stage, not at its own stage after sampling and scoring (~90 s on a fresh
    run)."""
    root, folder = setup
    out = tmp_path / "run"
    args = [a for a in _args(root, folder, out, *extra) if not (a.startswith("data.name=") and "data=bbc" in extra)]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and line in err[0], err
    assert not list(out.glob("*/stage.json")) and not (out / "run.config.yaml").exists()  # before any stage


# ------------------------------------------------------------ every argument works or is refused, before anything loads
@pytest.mark.parametrize("name,where,shown", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_an_infinite_number_is_refused_as_nan_is(no_loading, tmp_path, name, where, shown):
    """No setting takes inf (40 s of sampling at temperature=inf wrote a file): refused where NaN is, by name."""
    with pytest.raises((ValueError, TypeError)) as e:
        _call(name, where, math.inf, tmp_path)
    assert re.search(rf"\b{re.escape(shown)}\b", str(e.value)), str(e.value)
    assert not (tmp_path / "out").exists()


def _two_splits():
    """One train and one test query over _corpus(): the train query would score 1.0, the test query too."""
    return gdr.QuerySet(name="toy", qids=["q0", "q1"], texts=["text number 0", "text number 1"],
                        relevant=[["d0"], ["d1"]], splits=["train", "test"])


def _unknown_relevant():
    return gdr.QuerySet(name="toy", qids=["q0", "q1"], texts=["text number 0", "text number 1"],
                        relevant=[["d0"], ["zz"]], splits=["test", "test"])


def _p_run(doc_ids):
    from gdr.store import PRun

    return PRun(path=Path("elsewhere"), doc_ids=list(doc_ids), queries=[], logp=np.zeros((len(doc_ids), 2)),
                manifest={})


@pytest.mark.parametrize("call,error,match", [
    (lambda t: gdr.sample_doc_queries("smollm2-135m", _corpus(), t, temperature=math.inf), ConfigError,
     r"^temperature=inf: must be a number > 0"),
    (lambda t: gdr.sample_doc_queries("smollm2-135m", _corpus(), t, per_doc=0), ConfigError,
     r"^per_doc=0: must be a positive integer \(queries per document\)"),
    (lambda t: gdr.score(_corpus(), "smollm2-135m", t, n_queries=10**13), ConfigError,
     r"^n_queries=10000000000000: P of 6 documents x 10000000000000 queries \(float32\) takes 218\.3 TiB, more "
     r"than the .* of memory available"),
    (lambda t: gdr.score(_corpus(), "smollm2-135m", t, sampling=[1, 2]), TypeError,
     r"^sampling: got list \[1, 2\]; pass a dict"),
    (lambda t: gdr.score(_corpus(), "smollm2-135m", t, scoring=[1, 2]), TypeError, r"^scoring: got list"),
    (lambda t: gdr.score(_corpus(), "smollm2-135m", t, sampling={"temprature": 1.0}), TypeError,
     r"^SampleSettings: unknown setting\(s\) temprature; known: .*temperature"),
    (lambda t: gdr.score(_corpus(), "smollm2-135m", t, sampling={"seed": 3}), TypeError,
     r"^sampling: seed is an argument of its own; pass seed=\.\.\. once"),
    (lambda t: gdr.run([1, 2]), TypeError, r"^settings: got list \[1, 2\]; pass a dict"),
    (lambda t: gdr.load_lm(prompt=[1]), TypeError, r"^prompt: got list"),
    (lambda t: gdr.bm25(_corpus(), _queries().select([]), t), ValueError, r"^queries: the gdr.QuerySet 'toy' holds "
     r"no query"),
    (lambda t: gdr.bm25(_corpus(), _queries(), t, split="bogus"), ConfigError,
     r"^split=bogus: must be one of train \| dev \| test"),
    (lambda t: gdr.bm25(_corpus(), _queries(), t, split="dev"), gdr.DataError,
     r"has no split 'dev'; available: \['test'\]"),
    (lambda t: gdr.evaluate(t.parent / "tr", _corpus(), _queries(), t, split="train"), gdr.DataError,
     r"has no split 'train'; available: \['test'\]"),
    (lambda t: gdr.bm25(_corpus(), _unknown_relevant(), t), gdr.DataError,
     r"^1 relevant doc id\(s\) of query set 'toy' are not in corpus 'toy' \(e.g. 'zz' of query 'q1', test\); .*"
     r"drop_unknown_qrels"),
    (lambda t: gdr.evaluate(t.parent / "tr", _corpus(), _unknown_relevant(), t), gdr.DataError,
     r"'zz' of query 'q1'"),
    (lambda t: gdr.bm25(_corpus(), _queries(), t, drop_unknown_qrels="yes"), ConfigError,
     r"^drop_unknown_qrels=yes: must be true or false"),
    (lambda t: gdr.split_queries(_corpus(), "bogus"), ConfigError, r"^split=bogus: must be one of train \| dev"),
    (lambda t: gdr.evaluate_clusters(_corpus(), _p_run(["d0", "d1"]), t), gdr.DataError,
     r"run elsewhere holds 2 documents, corpus 'toy' 6"),
    (lambda t: gdr.evaluate_clusters(_corpus(), _p_run([f"d{i}" for i in (0, 1, 2, 3, 5, 4)]), t), gdr.DataError,
     r"row 4 is document 'd5', corpus 'toy' has 'd4' there"),
    (lambda t: gdr.evaluate_clusters(_corpus(), np.zeros((6, 2)), t), TypeError,
     r"^run: got ndarray; pass what gdr.score returned or its folder \(for GC alone on a matrix"),
    (lambda t: gdr.evaluate_clusters(gdr.Corpus.from_texts(["a b", "c d"]), _p_run(["0", "1"]), t), ConfigError,
     r"^n_clusters=null takes K from the labels, and corpus .* has none; set n_clusters=<K>"),
])
def test_arguments_that_would_run_wrong_or_fail_late_are_refused_first(no_loading, tmp_path, call, error, match):
    """Unchecked, each of these runs (inf, a split that filters nothing or does not exist, a relevant id scored as
    a miss) or fails after the model loads or deep in a library (per_doc=0, a 72.8 TiB MemoryError, a list for a
    dict, an empty query set in bm25s, a corpus that is not P's): each is refused by name before a model or data
    loads."""
    out = tmp_path / "out"
    with pytest.raises(error, match=match) as e:
        call(out)
    assert len(str(e.value).splitlines()) == 1
    assert not out.exists()


def test_split_scores_only_that_splits_queries(tmp_path):
    """gdr.bm25(..., split='test') scores the test queries only, not the train query beside them."""
    m = gdr.bm25(_corpus(), _two_splits(), tmp_path / "b", k=3, split="test")
    assert m["n_queries"] == 1
    assert gdr.bm25(_corpus(), _two_splits(), tmp_path / "c", k=3, split="train")["n_queries"] == 1


def test_relevant_ids_outside_the_corpus_are_dropped_only_when_asked_and_counted(tmp_path, caplog):
    """A relevant id missing from the corpus is refused (it would count as a miss); with drop_unknown_qrels=True it is
    dropped with a warning naming the count and one id, and metrics.json says how many."""
    import json
    import logging

    with caplog.at_level(logging.WARNING):
        m = gdr.bm25(_corpus(), _unknown_relevant(), tmp_path / "b", k=3, drop_unknown_qrels=True)
    assert m["n_queries"] == 1  # q1, whose only relevant id is not in the corpus, is not scored as a miss
    assert re.search(r"1 relevant doc id\(s\) .* \(e.g. 'zz' of query 'q1', test\): dropped", caplog.text)
    assert json.loads((tmp_path / "b" / "metrics.json").read_text())["unknown_qrels"] == 1


def test_a_query_split_other_than_train_dev_test_is_refused_at_load(tmp_path):
    """A query of split 'zzz' is refused at load (never counted as test)."""
    with pytest.raises(gdr.DataError, match=r"query 'q0' has split 'zzz'; a split is one of train, dev, test"):
        gdr.QuerySet(name="toy", qids=["q0"], texts=["x"], relevant=[["d0"]], splits=["zzz"])
    folder = gdr.write_beir(_corpus(), _queries(), tmp_path / "beir")
    (folder / "qrels" / "test.tsv").rename(folder / "qrels" / "zzz.tsv")
    with pytest.raises(gdr.DataError, match=r"split 'zzz'"):
        gdr.load_queries(str(folder))


@pytest.mark.parametrize("make,match", [
    (lambda t: gdr.load_corpus(_docs_file(t, '{"id": "h\\t2", "text": "b"}')),
     r"docs\.jsonl:2: doc id 'h\\t2' holds a tab"),
    (lambda t: gdr.load_corpus(_docs_file(t, '{"id": "h\\n2", "text": "b"}')),
     r"docs\.jsonl:2: doc id 'h\\n2' holds a line break"),
    (lambda t: gdr.Corpus(name="c", doc_ids=["a", "b\tc"], texts=["x", "y"]), r"doc_id 'b\\tc' \(row 1\) holds a tab"),
    (lambda t: gdr.Corpus.from_pandas(_frame(["a", math.nan])), r"^from_pandas: id column row 1: the id is missing"),
    (lambda t: gdr.Corpus.from_pandas(_frame([1.0, 2.0])), r"row 0: the id is the float 1.0, which would read as "
     r"'1.0'"),
    (lambda t: gdr.QuerySet(name="q", qids=["a\nb"], texts=["x"], relevant=[["d0"]], splits=["test"]),
     r"qid 'a\\nb' \(row 0\) holds a line break"),
])
def test_ids_with_a_tab_a_line_break_or_nan_are_refused_at_load(tmp_path, make, match):
    """An id holding a tab or a line break (which would break docids.tsv), or a NaN or float id (which would
    become 'nan' or '1.0'), is refused where the corpus or query set is made."""
    with pytest.raises(gdr.DataError, match=match):
        make(tmp_path)


def _docs_file(folder: Path, line: str) -> str:
    path = folder / "docs.jsonl"
    path.write_text('{"id": "a", "text": "first"}\n' + line + "\n", encoding="utf-8")
    return str(path)


def _frame(ids):
    import pandas as pd

    return pd.DataFrame({"id": ids, "text": ["one", "two"]})


def test_integer_ids_from_pandas_stay_exact():
    assert gdr.Corpus.from_pandas(_frame([1, 2])).doc_ids == ["1", "2"]


@pytest.mark.parametrize("extra,line", [
    (["cluster.n_clusters=40"], "cluster.n_clusters=40: must be <= the 30 documents"),
    (["cluster.n_clusters=3", "cluster.restrict_labels=[a]"],
     "cluster.restrict_labels=[a]: corpus 'toy' has no labels"),
    (["cluster.n_clusters=3", "sample.n_queries=10000000000000"],
     "sample.n_queries=10000000000000: P of 30 documents x 10000000000000 queries (float32) takes 1.1 PiB"),
])
def test_cluster_refuses_settings_that_compare_with_the_corpus_before_sampling(setup, tmp_path, capsys,  # noqa: F811
                                                                              extra, line):
    """gdr cluster checked cluster.n_clusters and restrict_labels only after sampling and scoring (24 s, P.npy
    written), and named them without the cluster. prefix."""
    root, folder = setup
    out = tmp_path / "cluster"
    args = ["cluster", f"data.name={folder}", f"model.name={root / 'tiny-llama'}", "model.max_doc_tokens=24",
            "sample.n_queries=4", "sample.max_new_tokens=4", "progress=false", "threads=1", f"out={out}", *extra]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and line in err[0], err
    assert not (out / "queries.jsonl").exists() and not (out / "P.npy").exists()


def test_score_refuses_a_p_larger_than_memory_before_the_model_loads(setup, tmp_path, capsys, monkeypatch):  # noqa: F811
    """sample.n_queries=10**13 loaded the model and wrote a manifest before a MemoryError (72.8 TiB)."""
    import transformers

    def forbidden(*args, **kwargs):
        raise AssertionError("loaded the model before checking P's size")

    root, folder = setup
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", forbidden)
    out = tmp_path / "score"
    assert main(["score", f"data.name={folder}", f"model.name={root / 'tiny-llama'}",
                 "sample.n_queries=10000000000000", "progress=false", f"out={out}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "sample.n_queries=10000000000000: P of 30 documents x 10000000000000 queries" in err[0]
    assert not (out / "queries.jsonl").exists() and not (out / "score.config.yaml").exists()


# ------------------------------------------------------------- input families: every route judges an input the same
# Each route a corpus comes in by, from (ids, texts) columns. A new Corpus.from_* or file format is refused by
# test_every_route_is_in_the_families until it is added here, so the families below cover it by construction.
def _jsonl_route(t: Path, ids, texts):
    import json

    path = t / "docs.jsonl"
    path.write_text("".join(json.dumps({"id": i, "text": x}) + "\n" for i, x in zip(ids, texts)))
    return gdr.load_corpus(str(path))


def _dataset_route(t: Path, ids, texts):
    import datasets

    return gdr.Corpus.from_dataset(datasets.Dataset.from_dict({"id": ids, "text": texts}))


def _pandas_route(t: Path, ids, texts):
    import pandas as pd

    return gdr.Corpus.from_pandas(pd.DataFrame({"id": ids, "text": texts}))


CORPUS_ROUTES = {
    "Corpus": lambda t, ids, texts: gdr.Corpus(name="c", doc_ids=ids, texts=texts),
    "from_texts": lambda t, ids, texts: gdr.Corpus.from_texts(texts, ids=ids),
    "from_pandas": _pandas_route,
    "from_dataset": _dataset_route,
    "jsonl": _jsonl_route,
}
# (ids, texts) whose one bad column a route must refuse, naming what is wrong with the value; both rows of a column
# have one type, as a DataFrame or Arrow column does
INPUT_FAMILIES = {
    "nan id": ([math.nan, math.nan], ["one", "two"], r"missing \(None/NaN\)"),
    "float id": ([1.5, 2.5], ["one", "two"], r"float 1\.5, which would read as '1\.5'"),
    "bool id": ([True, False], ["one", "two"], r"boolean True, which would read as 'True'"),
    "missing id": ([None, "b"], ["one", "two"], r"missing|has no 'id'"),
    "spaced id": (["D 023", "D 024"], ["one", "two"], r"'D 023' .*holds a space, which splits the columns of run"),
    "nan text": (["a", "b"], [math.nan, math.nan], r"missing \(None/NaN\)|must be a string, got float"),
    "number text": (["a", "b"], [1.5, 2.5], r"is a float|must be a string, got float"),
}


def test_every_route_is_in_the_families():
    from gdr.data.files import DOC_FORMATS

    routes = {"Corpus"} | {n for n in dir(gdr.Corpus) if n.startswith("from_")}
    typed = {f for f in DOC_FORMATS if f != "tsv"}  # a TSV holds strings only: no value has another type there
    assert routes | typed <= set(CORPUS_ROUTES), sorted(routes | typed - set(CORPUS_ROUTES))


@pytest.mark.parametrize("route", CORPUS_ROUTES)
def test_good_columns_give_the_same_corpus_on_every_route(tmp_path, route):
    for ids, want in (["a", "b"], ["a", "b"]), ([7, 8], ["7", "8"]):
        c = CORPUS_ROUTES[route](tmp_path, ids, ["one", "two"])
        assert c.doc_ids == want and c.texts == ["one", "two"]


def test_numpy_columns_are_plain_strings():
    c = gdr.Corpus(name="n", doc_ids=np.array([3, 4]), texts=np.array(["one", "two"]))
    assert c.doc_ids == ["3", "4"] and c.texts == ["one", "two"] and type(c.texts[0]) is str
    assert gdr.Corpus.from_texts(list(np.array(["one", "two"])), ids=np.array(["a", "b"])).doc_ids == ["a", "b"]


@pytest.mark.parametrize("family", INPUT_FAMILIES)
@pytest.mark.parametrize("route", CORPUS_ROUTES)
def test_a_bad_value_is_refused_on_every_route(tmp_path, route, family):
    """a NaN id became 'nan', 1.5 '1.5', a JSONL true 'True', a NaN text 'nan', on some routes and
    not others; every route now refuses each, in one line saying what the value is."""
    ids, texts, what = INPUT_FAMILIES[family]
    with pytest.raises((gdr.DataError, TypeError)) as e:
        CORPUS_ROUTES[route](tmp_path, ids, texts)
    assert re.search(what, str(e.value)) and len(str(e.value).splitlines()) == 1, str(e.value)


def _queries_file_route(t: Path, qid):
    import json

    from gdr.data.files import load_file_queries

    (t / "queries.jsonl").write_text(json.dumps({"_id": qid, "text": "a query"}) + "\n")
    (t / "test.tsv").write_text(f"query-id\tcorpus-id\tscore\n{qid if isinstance(qid, str) else 'q'}\td0\t1\n")
    return load_file_queries(t / "queries.jsonl", t / "test.tsv", doc_ids=["d0"])


QUERY_ROUTES = {
    "QuerySet": lambda t, qid: gdr.QuerySet(name="q", qids=[qid], texts=["a query"], relevant=[["d0"]],
                                            splits=["test"]),
    "jsonl": _queries_file_route,
}


@pytest.mark.parametrize("family", [f for f in INPUT_FAMILIES if f.endswith(" id")])
@pytest.mark.parametrize("route", QUERY_ROUTES)
def test_a_bad_query_id_is_refused_on_every_route(tmp_path, route, family):
    ids, _, what = INPUT_FAMILIES[family]
    with pytest.raises((gdr.DataError, TypeError)) as e:
        QUERY_ROUTES[route](tmp_path, ids[0])
    assert re.search(what.replace("has no 'id'", "has no '_id'").replace(" .*holds", ".*holds"), str(e.value)), \
        str(e.value)


@pytest.mark.parametrize("relevant,match", [
    (["d0"], r"query 'q0': relevant is 'd0'; pass one list of relevant doc ids per query"),
    ([[math.nan]], r"query 'q0': relevant doc id nan is missing"),
    ([[True]], r"relevant doc id True is the boolean True"),
])
def test_a_query_set_judges_its_relevant_ids(relevant, match):
    with pytest.raises(gdr.DataError, match=match):
        gdr.QuerySet(name="q", qids=["q0"], texts=["x"], relevant=relevant, splits=["test"])


def _truncated(path: Path, text: str) -> Path:
    import gzip

    data = gzip.compress(text.encode())
    path.write_bytes(data[: len(data) // 2])
    return path


_ROWS = [(f"d{i}", f"document {i} " + "word " * 30) for i in range(60)]
TRUNCATED = {  # a gzip cut in half, by every reader of .gz files
    "jsonl": lambda t: _truncated(t / "docs.jsonl.gz", "".join(f'{{"id": "{d}", "text": "{x}"}}\n' for d, x in _ROWS)),
    "tsv": lambda t: _truncated(t / "docs.tsv.gz", "id\ttext\n" + "".join(f"{d}\t{x}\n" for d, x in _ROWS)),
    "trec": lambda t: _truncated(t / "docs.gz", "".join(f"<DOC><DOCNO>{d}</DOCNO><TEXT>{x}</TEXT></DOC>\n"
                                                         for d, x in _ROWS)),
}


def test_the_msmarco_documents_scan_refuses_a_truncated_archive(tmp_path):
    from gdr.data.msmarco import _scan_docs_tsv

    path = _truncated(tmp_path / "msmarco-docs.tsv.gz", "".join(f"{d}\turl\ttitle\t{x}\n" for d, x in _ROWS))
    with pytest.raises(gdr.DataError, match=rf"^{re.escape(str(path))}:\d+: the gzip archive ends early"):
        _scan_docs_tsv(path, {"D-none"})


def test_every_reader_of_archives_is_in_the_truncation_family():
    from gdr.data.files import DOC_FORMATS

    assert {*DOC_FORMATS, "trec"} <= set(TRUNCATED)


@pytest.mark.parametrize("fmt", TRUNCATED)
def test_a_truncated_archive_is_refused_naming_its_file_and_line(tmp_path, fmt):
    path = TRUNCATED[fmt](tmp_path)
    with pytest.raises(gdr.DataError, match=rf"^{re.escape(str(path))}:\d+: the gzip archive ends early"):
        gdr.load_corpus(str(path) if fmt != "trec" else "trec", **({"path": path} if fmt == "trec" else {}))


def _rules_of(pattern: str):
    """(command, key, check) of every rule of every command table whose key matches ``pattern``."""
    from gdr.validate import TABLES

    return [(cmd, f"{prefix}.{r.key}" if prefix else r.key, r.check) for cmd, parts in TABLES.items()
            for prefix, rules in parts for r in rules if re.search(pattern, r.key)]


SPLIT_SETTINGS = _rules_of(r"(^|\.|_)split$")
LR_SETTINGS = _rules_of(r"(^|\.)lr(_(?!scaling)\w+)?$")  # the learning rates, not how they scale


def test_the_setting_families_are_found():
    keys = {k for _, k, _ in SPLIT_SETTINGS}
    assert {"queries.train_split", "queries.test_split", "queries.split"} <= keys
    assert {"optim.lr_decoder", "optim.lr_encoder", "qg.train.lr"} <= {k.split(".", 1)[-1] if k.startswith("train.")
                                                                        else k for _, k, _ in LR_SETTINGS}


@pytest.mark.parametrize("command,key,check", SPLIT_SETTINGS, ids=[f"{c}-{k}" for c, k, _ in SPLIT_SETTINGS])
def test_every_split_setting_refuses_an_unknown_split(command, key, check):
    """queries.train_split=bogus (gdr run) and queries.split=bogus (gdr train) trained on generated
    queries only, with exit 0. Every split setting of every command is one of train | dev | test (gdr qg: train)."""
    from gdr.config import load_config

    cfg = load_config("evaluate" if command == "search" else command, [])  # gdr search reads evaluate's config
    assert re.match(r"must be (null or )?one of train( \| dev \| test)?$", check("bogus", cfg) or "")


@pytest.mark.parametrize("command,key,check", LR_SETTINGS, ids=[f"{c}-{k}" for c, k, _ in LR_SETTINGS])
def test_every_learning_rate_refuses_one_that_diverges(command, key, check):
    """train.optim.lr_decoder=1e308 passed the checks and failed in training, after sampling,
    scoring and indexing."""
    assert check(1e308, None) and check(2.0, None) and check(1e-3, None) is None


def test_api_arguments_that_failed_late_are_refused_first(no_loading, tmp_path):
    """By the API: out=None, an empty corpus, a data or model setting of the wrong type,
    a corpus that is not the scored run's, and evaluating on the training split."""
    import json

    with pytest.raises(TypeError, match=r"^out: got NoneType; pass a path"):
        gdr.score(_corpus(), "smollm2-135m", None, n_queries=2)
    with pytest.raises(TypeError, match=r"^out: got NoneType"):
        gdr.bm25(_corpus(), _queries(), None)
    with pytest.raises(ValueError, match=r"^corpus: the gdr\.Corpus 'e' holds no document"):
        gdr.score(gdr.Corpus(name="e", doc_ids=[], texts=[]), "smollm2-135m", tmp_path / "out", n_queries=2)
    with pytest.raises(TypeError, match=r"^settings\['data'\]: got list \['bbc'\]; pass a name"):
        gdr.run({"data": ["bbc"]})
    with pytest.raises(TypeError, match=r"^settings\['model'\]: got int 3"):
        gdr.run({"model": 3})
    run = tmp_path / "score"
    run.mkdir()
    (run / "doc_ids.json").write_text(json.dumps([f"d{i}" for i in range(30)]))
    with pytest.raises(gdr.DataError, match=r"run .*score holds 30 documents, corpus 'toy' 6"):
        gdr.build_index(tmp_path / "out", method="gc", run=run, corpus=_corpus())
    # the same ids, another text in a row: not the documents the run scored
    (run / "doc_ids.json").write_text(json.dumps(_corpus().doc_ids))
    texts = _corpus().model_inputs()
    (run / TEXTS_FILE).write_text(json.dumps(text_digests([*texts[:2], "edited", *texts[3:]])))
    with pytest.raises(gdr.DataError, match=r"document 'd2' \(row 2\) was scored on another text than corpus 'toy'"):
        gdr.build_index(tmp_path / "out", method="gc", run=run, corpus=_corpus())
    train = tmp_path / "train"
    train.mkdir()
    (train / "trained_on.json").write_text(json.dumps({"inputs": {"queries": {"hash": "0", "splits": ["train"]}}}))
    with pytest.raises(ConfigError, match=r"^split=train: the retriever in .*train was trained on the 'train' "
                                          r"queries; .*allow_train_split=True"):
        gdr.evaluate(train, _corpus(), _two_splits(), tmp_path / "out", split="train")
    old = tmp_path / "old"  # a retriever of format 0, without trained_on.json: its training splits are not known
    (old / "model").mkdir(parents=True)
    (old / "model" / "retriever.json").write_text("{}")
    (old / "config.yaml").write_text("queries:\n  name: toy\n  split: test\n")
    for split in ("test", "dev"):
        with pytest.raises(ConfigError, match=r"^\S*old: a retriever of format 0, from before gdr recorded the query "
                                              r"splits it was trained on .*; train it again with this gdr") as e:
            gdr.evaluate(old, _corpus(), _two_splits(), tmp_path / "out", split=split)
        assert len(str(e.value).splitlines()) == 1
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------------- keys by content ------------
# The stages whose bytes depend on the machine: the generator's sampling and scoring, and the retriever's training.
DEVICE_STAGES = ("score", "doc-queries", "train")


def _strings(value, where=()):
    """Every string leaf of a stage's inputs, with where it sits."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(v, (*where, str(k)))
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _strings(v, (*where, str(i)))
    elif isinstance(value, str):
        yield where, value


def test_every_stage_key_holds_content_never_a_path_and_the_device_where_it_decides_bytes(tiny_run):
    """By construction over whatever stages `gdr run` has: no input of any stage's key is a path to a file or
    folder (the corpus, its queries and judgements, the models are keyed by their content: a moved collection or
    model re-runs nothing, a model changed in place re-runs what it made), and every stage whose bytes depend on
    the machine keys the device it ran on."""
    import json

    out = tiny_run.out  # read only
    stages = {f.parent.name.rsplit("-", 1)[0]: json.loads(f.read_text())["inputs"] for f in out.glob("*/stage.json")}
    assert {"score", "doc-queries", "index-gc", "bm25", "train-gc-s0", "eval-gc-s0"} <= set(stages)
    for name, inputs in stages.items():
        paths = [("/".join(w), v) for w, v in _strings(inputs) if ("/" in v or "\\" in v) and Path(v).exists()]
        assert not paths, f"{name} is keyed by a path: {paths}"
        kind = "doc-queries" if name == "doc-queries" else name.split("-")[0]
        if kind in DEVICE_STAGES:
            assert "device" in inputs and inputs["device"], f"{name}'s key has no device"


def test_the_apis_missing_folders_are_named_as_the_commands_name_them(tmp_path):
    """gdr.evaluate and gdr.train_retriever say what is wrong with the path, as the command does."""
    from gdr.indexing.docids import read_docids
    from gdr.training.search import Retriever

    with pytest.raises(FileNotFoundError, match=r"nope: no such folder; pass the out_dir of `gdr train`"):
        Retriever.load(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match=r"has no model/retriever.json: not the out_dir of a finished"):
        Retriever.load(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"nofile.tsv: no such file; pass the docids.tsv of `gdr index`"):
        read_docids(tmp_path / "nofile.tsv")


def test_gdr_run_says_an_unknown_key_or_experiment_in_the_commands_one_line(tmp_path):
    """Hydra's refusals (a multi-line exception of its own) come as the command's line, with its did-you-mean."""
    with pytest.raises(ConfigError, match=r"^unknown key sample\.n_querys; did you mean sample\.n_queries\?"):
        gdr.run({"sample": {"n_querys": 8}, "out": str(tmp_path / "out")})
    with pytest.raises(ConfigError, match=r"Could not find 'experiment/nosuch'; Available options in 'experiment': "):
        gdr.run({"out": str(tmp_path / "out")}, experiment="nosuch")
    assert not (tmp_path / "out").exists()


def test_a_retriever_is_evaluated_only_on_the_corpus_it_was_trained_on(tiny_run, tmp_path, capsys):
    """`gdr evaluate` of a run's retriever with a part of its corpus (data.n_docs=20: 10 of its docids name no
    document) or the same ids with an edited text: one line each, naming what it was trained on (it warned and
    scored 0, or said nothing)."""
    train = next(tiny_run.out.glob("train-gc-s0-*"))
    edited = tmp_path / "edited"
    shutil.copytree(tiny_run.folder, edited)
    lines = (edited / "corpus.jsonl").read_text().splitlines()
    first = json.loads(lines[0])
    lines[0] = json.dumps({**first, "text": first["text"] + " edited"})
    (edited / "corpus.jsonl").write_text("\n".join(lines) + "\n")
    for data in ([f"data.name={tiny_run.folder}", "data.n_docs=20"], [f"data.name={edited}"]):
        capsys.readouterr()
        assert main(["evaluate", f"run_dir={train}", *data, "k=10", "beam=10", f"out_dir={tmp_path / 'ev'}"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "its retriever was trained on toy, 30 documents; corpus" in err[0], err
        assert not (tmp_path / "ev" / "metrics.json").exists()  # nothing scored
