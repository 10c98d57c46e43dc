"""Check a command's composed config before any model or data is loaded.

Every command calls :func:`validate` right after composing its config, so a bad value fails in
milliseconds with one line that names the key, the value and the fix
(``sample.n_queries=-3: must be a positive integer (the number J of sampled queries)``) instead of a
traceback from numpy after the model has loaded. A command's table is assembled from the rules their owners
declare (:mod:`gdr.data`'s loaders, :mod:`gdr.models`'s query generator, the settings classes of
:mod:`gdr.stages.settings`) plus the rules of the command's own keys (below); a rule whose key is absent from a
command's config is skipped, so one table serves every command that has the section. ``gdr run`` checks its
``index:``, ``train:`` and ``evaluate:`` sections with the tables of the stand-alone commands, under that prefix.
:func:`check_run` holds the rules across ``gdr run``'s sections, :func:`check_corpus` those that need the loaded
corpus (both before the first stage).

:func:`error_line` turns the errors a user can fix (:class:`gdr.rules.ConfigError`, Hydra's
composition and override-parse errors, bad data, missing files) into that one line for ``gdr``'s
``main``.
"""
from __future__ import annotations

import difflib
import logging
import re
from pathlib import Path
from typing import Sequence

from omegaconf import DictConfig, ListConfig, OmegaConf

from gdr.carry import was_pruned
from gdr.data import (
    DATA_RULES,
    FOLD_RULE,
    FOLDS_RULE,
    FRACTIONS_RULE,
    QUERY_NAME_RULE,
    QUERY_RULES,
    SPLIT_RULE,
    DataError,
)
from gdr.data.options import DATA_OPTIONS
from gdr.guard import OutputError
from gdr.rules import (
    FILE,
    Check,
    ConfigError,
    Rule,
    auto_or,
    boolean,
    check_rules,
    existing,
    fields_rules,
    folder_with,
    get,
    missing,
    number,
    one_of,
    optional,
    path_problem,
    seed,
    show,
)
from gdr.signals import WorkerDied
from gdr.stages.settings import (
    CLUSTER_RULES,
    EVALUATE_RULES,
    INDEX_RULES,
    INDEXERS,
    LM_RULES,
    RESULTS_RULE,
    SAMPLE_RULES,
    SCORE_RULES,
    TRAIN_RULES,
    ClusterSettings,
    DocQueries,
    QGKeys,
    RunKeys,
    RunQG,
    SampleSettings,
    ScoreSettings,
    Verdict,
    field_help,
    section_classes,
)

__all__ = ["ConfigError", "validate", "check_run", "check_corpus", "error_line", "exit_line", "TABLES"]

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------- the commands' own keys

def folder_with_queries(v, sec):
    """A ``gdr score`` folder, or a ``gdr run`` folder with one score stage (:func:`gdr.store.score_folder`)."""
    problem = path_problem(v, "folder")
    if problem:
        return problem
    p = Path(v).expanduser()
    if (p / "queries.jsonl").is_file() or len(list(p.glob("score-*/queries.jsonl"))) == 1:
        return None
    return "has no queries.jsonl (nor one score-*/ stage): not the output folder of `gdr score` or `gdr run`"


def train_run(v, sec):
    problem = path_problem(v, "folder")
    if problem:
        return problem
    p = Path(v).expanduser()
    if not ((p / "model" / "retriever.json").exists() or (p / "retriever.json").exists()):
        return "has no model/retriever.json: not the out_dir of a finished `gdr train`"
    if not (p / "model" / "model.pt").exists() and was_pruned(p):
        return ("has no model/model.pt: its weights were dropped (`gdr prune`); a `gdr run` of its run folder trains "
                "it again when its evaluation must run again")
    return None


def index_inputs(v, sec):
    """What each ``gdr index`` method needs besides its settings (checked in index_main too, but after imports)."""
    problem = one_of(*INDEXERS)(v, sec)
    if problem:
        return problem
    km = get(sec, "kmeans") or {}
    if v == "gc" and not sec.get("run"):
        return "needs run=<P-matrix run folder of `gdr score`>"
    if v == "bmi" and not km.get("doc_queries"):
        return "needs kmeans.doc_queries=<jsonl of {doc_id, queries} from `gdr sample sample.per_doc=N`>"
    bmi = get(sec, "bmi") or {}
    bmi_inputs = str(bmi.get("inputs") or "")
    if v == "bmi" and bmi_inputs.startswith("realq") and not bmi.get("real_queries"):
        return (f"with bmi.inputs={bmi_inputs} needs bmi.real_queries=<jsonl of {{doc_id, queries}}> of real training "
                "queries, or bmi.inputs=genq_docseg")
    if v == "bmi" and bmi_inputs.endswith("docseg") and not (sec.get("data") or km.get("docs")):
        return f"with bmi.inputs={bmi_inputs} needs the document texts: data=<corpus> or kmeans.docs=<jsonl>"
    if v == "hkmi" and not (sec.get("data") or km.get("docs")):
        return "needs the document texts: data=<corpus> or kmeans.docs=<jsonl>"
    if v in ("random", "atomic") and not (sec.get("run") or sec.get("data") or km.get("docs")
                                          or km.get("doc_queries")):
        return "needs the doc ids: run=<P-matrix run>, data=<corpus>, kmeans.docs=... or kmeans.doc_queries=..."
    return None


def indexers(v, sec):
    if not isinstance(v, (list, ListConfig)) or not v:
        return f"must be a non-empty list of indexers, e.g. [{', '.join(INDEXERS)}]"
    for name in v:
        if name not in INDEXERS:
            return f"unknown indexer {name!r}; choose from {' | '.join(INDEXERS)}"
    dup = next((n for i, n in enumerate(v) if n in list(v)[:i]), None)
    return f"{dup!r} is listed twice" if dup is not None else None


def verdict_pair(v, sec):
    """``verdict.pair``: two different indexers, a and b of the primary test a - b. A pair other than the default
    names a test fixed before the run, so both must be among the run's ``indexers``; the default pair of a run
    without one of them gives no primary test (the report says so) rather than a refusal."""
    if not isinstance(v, (list, ListConfig)) or len(v) != 2 or v[0] == v[1]:
        return "must be two different indexers, e.g. [gc, hkmi]"
    bad = next((n for n in v if n not in INDEXERS), None)
    if bad is not None:
        return f"unknown indexer {bad!r}; choose from {' | '.join(INDEXERS)}"
    run = list(get(sec, "indexers") or ())
    absent = [n for n in v if n not in run]
    if absent and list(v) != Verdict().pair:
        return (f"{absent[0]} is not in indexers={show(run)}, so this run cannot make the test; add it to "
                f"indexers or name two of them")
    return None


def seeds(v, sec):
    ok = isinstance(v, (list, ListConfig)) and len(v) > 0 and all(seed(s, sec) is None for s in v)
    if ok and len(set(v)) < len(v):
        return "lists a seed twice"
    return None if ok else "must be a non-empty list of integers in [0, 2^32), e.g. [0, 1, 2]"


def other_than(key: str) -> Check:
    """A query split (one of ``SPLITS``) other than the one ``key`` names."""
    def check(v, sec):
        problem = SPLIT_RULE.check(v, sec)
        if problem:
            return problem
        return f"must differ from {key}={get(sec, key)} (never test on what was trained on)" \
            if v == get(sec, key) else None

    return check


# ---------------------------------------------------------------------------- tables
# `gdr qg`'s own keys (seed, qg.*, queries.*), from their fields; `progress` is LM's
QG = tuple(r for r in fields_rules(QGKeys, sections=section_classes) if r.key != "progress")
SCORE_COMMAND = (
    Rule("queries_from", optional(folder_with_queries),
         "a run whose queries are scored instead of sampled; null = sample"),
    Rule("reuse_from", optional(folder_with_queries),
         "an older run of the same model and settings: its queries of unchanged documents and its P entries of "
         "unchanged pairs are taken, the rest sampled and scored; null = queries_from (or nothing)"),
)
INDEX_COMMAND = (
    Rule("method", index_inputs, "the indexer"),
    Rule("run", optional(folder_with("P.npy", made_by="`gdr score`")), "the P-matrix run folder"),
    Rule("index", optional(folder_with("tree_state.npz", "docids.tsv", made_by="`gdr index method=gc`")),
         "the GC index to grow"),
)
TRAIN_COMMAND = (
    Rule("docids", existing("file"), "docids.tsv from `gdr index`"),
    FRACTIONS_RULE,
    FOLDS_RULE,
    FOLD_RULE,
    Rule("generated", FILE, "jsonl of {doc_id, queries} from `gdr sample`"),
    QUERY_NAME_RULE,
    Rule("queries.path", optional(existing())),
    Rule("queries.split", optional(SPLIT_RULE.check), "the split trained on; its dev part is held out"),
    *QUERY_RULES[1:],
)
EVALUATE_COMMAND = (
    Rule("run_dir", train_run),
    FRACTIONS_RULE,
    FOLDS_RULE,
    FOLD_RULE,
    QUERY_NAME_RULE,
    Rule("queries.path", optional(existing())),
    Rule("queries.split", SPLIT_RULE.check,
         "the split scored; never the one the model was trained on (unless --allow-train-split)"),
)
RUN_HELP = field_help(RunKeys)
RUN = (
    Rule("indexers", indexers, RUN_HELP["indexers"]),
    Rule("seeds", seeds, "one retriever per (indexer, seed)"),
    QUERY_NAME_RULE,
    Rule("queries.path", optional(existing())),
    Rule("queries.train_split", SPLIT_RULE.check, "the split trained on; its dev part is held out"),
    Rule("queries.test_split", other_than("queries.train_split")),
    Rule("queries.dev_split", optional(SPLIT_RULE.check), RUN_HELP["queries.dev_split"]),
    FRACTIONS_RULE,
    FOLDS_RULE,
    Rule("index_seed", one_of("shared", "retriever"), RUN_HELP["index_seed"]),
    *fields_rules(DocQueries, "doc_queries."),
    Rule("bm25", boolean),
    Rule("overlap", auto_or(boolean), RUN_HELP["overlap"]),
    Rule("plot", boolean),
    Rule("verdict.pair", verdict_pair, RUN_HELP["verdict"]),
    Rule("verdict.metric", one_of("recall@1", "recall@10", "mrr")),
    Rule("verdict.margin", number(0, lo_open=False)),
    *fields_rules(RunQG, "qg.", sections=section_classes),
)

DATA, LM, SAMPLE, SCORE, CLUSTER = DATA_RULES, LM_RULES, SAMPLE_RULES, SCORE_RULES, CLUSTER_RULES  # short names
# command -> [(section prefix, rules)]: each owner's rules, then the command's own
TABLES: dict[str, list[tuple[str, tuple[Rule, ...]]]] = {
    "sample": [("", DATA + LM + SAMPLE)],
    "score": [("", DATA + LM + SAMPLE + SCORE + SCORE_COMMAND)],
    "cluster": [("", DATA + LM + SAMPLE + SCORE + SCORE_COMMAND + CLUSTER)],
    "index": [("", INDEX_COMMAND + INDEX_RULES + DATA)],
    "train": [("", DATA + TRAIN_COMMAND + TRAIN_RULES)],
    "evaluate": [("", DATA + EVALUATE_COMMAND + EVALUATE_RULES)],
    # `gdr search` returns k=10 unless k= is given, so the config's k need not fit a smaller beam=
    "search": [("", EVALUATE_COMMAND + tuple(r for r in EVALUATE_RULES if r.key != "k") + (RESULTS_RULE,))],
    "qg": [("", DATA + LM + QG)],
    "run": [("", DATA + LM + SAMPLE + SCORE + CLUSTER + RUN), ("index", INDEX_RULES), ("train", TRAIN_RULES),
            ("evaluate", EVALUATE_RULES)],
}

HINTS = {  # what to set for a mandatory (???) key
    "docids": "docids.tsv from `gdr index`",
    "run_dir": "the out_dir of `gdr train`",
    "data.path": "the corpus: a BEIR folder (corpus.jsonl, queries.jsonl, qrels/) or a .jsonl / .tsv file of documents",
}


def validate(command: str, cfg: DictConfig) -> None:
    """Raise :class:`ConfigError` for the first value of ``cfg`` that ``gdr <command>`` cannot run with.

    Cheap: reads the config and stats a few paths; imports torch only when a CUDA device is asked for.
    """
    if command not in TABLES:
        raise KeyError(f"no validation rules for command {command!r}; known: {', '.join(TABLES)}")
    if not isinstance(cfg, DictConfig):
        cfg = OmegaConf.create(cfg)
    for key in missing(cfg):
        what = HINTS.get(key)
        raise ConfigError(f"{key}=???: missing mandatory value; set {key}=<value>" + (f" ({what})" if what else ""))
    for prefix, rules in TABLES[command]:
        sec = get(cfg, prefix) if prefix else cfg
        if not isinstance(sec, DictConfig):
            if prefix in cfg:
                raise ConfigError(f"{prefix}={show(sec)}: must be a section of keys")
            continue
        check_rules(sec, rules, prefix)
    if command == "run":
        check_run(cfg)


def check_run(cfg: DictConfig) -> None:
    """The rules across ``gdr run``'s sections (each section's own rules are in :data:`TABLES`)."""
    if cfg.queries.name == "titles" and not cfg.data.get("drop_title"):
        raise ValueError("queries.name=titles needs data.drop_title=true: a document that still holds its title "
                         "makes the title query trivial")
    folds = cfg.queries.get("folds")
    if folds is not None and cfg.queries.get("fractions") is not None:
        raise ConfigError(f"queries.folds={folds}: the folds split the topics, so queries.fractions must be null "
                          f"(it is {show(cfg.queries.fractions)}); set one of them")
    if folds is not None and (cfg.queries.train_split, cfg.queries.test_split) != ("train", "test"):
        raise ConfigError(f"queries.folds={folds}: each fold's topics are its test split and the others' its train "
                          f"split, so queries.train_split must be train and queries.test_split test")
    dev = cfg.queries.get("dev_split")
    if dev is not None and folds is not None:
        raise ConfigError(f"queries.dev_split={dev} with queries.folds={folds}: the folds split every topic into a "
                          "train and a test part, with no dev split; set queries.dev_split=null (each retriever's "
                          "trainer holds its dev split out of its training topics)")
    if dev is not None and dev in (cfg.queries.train_split, cfg.queries.test_split):
        raise ConfigError(f"queries.dev_split={dev}: the retrievers' dev split must be apart from the split they "
                          f"train on (queries.train_split={cfg.queries.train_split}) and the one they are scored on "
                          f"(queries.test_split={cfg.queries.test_split}); choose another split, or null")
    if cfg.get("qg") is not None and cfg.qg.enabled:
        check_qg_pairs(cfg)
    bmi_inputs = str(cfg.index.bmi.inputs)
    if "bmi" in cfg.indexers and cfg.index.bmi.get("real_queries"):
        raise ConfigError(f"index.bmi.real_queries={cfg.index.bmi.real_queries}: `gdr run` gives BMI the real queries "
                          "of its training split (index.bmi.inputs=realq_genq_docseg); leave it null")
    if "bmi" in cfg.indexers and bmi_inputs.startswith("realq") and folds is not None:
        raise ConfigError(f"index.bmi.inputs={bmi_inputs} with queries.folds={folds}: one BMI index serves every fold, "
                          "so its vectors would average each fold's test topics as the other folds' training queries; "
                          "set index.bmi.inputs=genq_docseg")
    if "bmi" in cfg.indexers and int(cfg.doc_queries.per_doc) < 1:
        raise ValueError("indexer bmi needs generated queries: set doc_queries.per_doc to 1 or more, "
                         "or drop bmi from indexers")
    n_cols, J = cfg.index.gc.get("n_queries"), int(cfg.sample.n_queries)
    per_doc = int(cfg.sample.p_per_doc)  # J is p_per_doc x documents, checked at the stage
    if "gc" in cfg.indexers and n_cols is not None and int(n_cols) > J and not per_doc:
        raise ConfigError(f"index.gc.n_queries={n_cols}: must be <= sample.n_queries={J}, the J columns of P it takes "
                          "the first of; lower index.gc.n_queries (null = all) or raise sample.n_queries")


def check_qg_pairs(cfg: DictConfig) -> None:
    """``gdr run``'s ``qg.pairs`` against the query set and the corpus (``qg.enabled``): no pair may hold a test
    query, and title pairs need a document the LM reads without its title."""
    pairs, folds = cfg.qg.pairs, cfg.queries.get("folds")
    if pairs == "queries" and folds is not None:
        raise ConfigError(f"queries.folds={folds} with qg.enabled=true and qg.pairs=queries: one generator would be "
                          "fine-tuned on every fold's test topics; set qg.pairs=titles (the corpus's (document, "
                          "title) pairs, no query; with data.drop_title=true), qg.enabled=false (the base "
                          "generator) or queries.folds=null")
    if pairs != "titles":
        return
    if cfg.queries.name == "titles":
        raise ConfigError("qg.pairs=titles with queries.name=titles: the titles are the run's queries, so the "
                          "generator would be fine-tuned on the test titles; set qg.pairs=queries (the train "
                          "titles only)")
    if "drop_title" not in cfg.data:
        raise ConfigError(f"qg.pairs=titles: data={cfg.data.name} has no titles to read apart from its documents "
                          "(no data.drop_title); set qg.pairs=queries, or use a corpus with titles (bbc, cranfield, "
                          "r2, r5, reuters, trec, a jsonl/tsv file with a title field)")
    if not cfg.data.drop_title:
        raise ConfigError("qg.pairs=titles needs data.drop_title=true: the LM reads documents with their titles, so "
                          "the generator would learn to copy its input's opening words; set data.drop_title=true")


def check_corpus(command: str, cfg: DictConfig, corpus) -> None:
    """The rules that compare ``gdr <command>``'s settings with its loaded corpus, checked before the first stage
    (in seconds, not at their stage after sampling and scoring); the messages name the full key. ``gdr run``
    clusters only a labelled corpus (and only with ``cluster.enabled``); ``gdr cluster`` any corpus."""
    if command in ("score", "cluster", "run"):
        J, key = SampleSettings.from_config(OmegaConf.to_container(cfg.sample, resolve=True)).n_total(len(corpus))
        ScoreSettings.from_config(OmegaConf.to_container(cfg.score, resolve=True)).check_size(len(corpus), J, key)
    clusters = command == "cluster" or command == "run" and cfg.cluster.enabled and corpus.labels is not None
    if clusters:
        ClusterSettings.from_config(OmegaConf.to_container(cfg.cluster, resolve=True)).check_corpus(
            corpus, prefix="cluster.")
    leaf = get(cfg, "index.leaf_size")
    if leaf is not None and int(leaf) >= len(corpus):
        log.warning("index.leaf_size=%d holds all %d documents: every docid tree is one leaf of flat positions (the "
                    "indexers do not differ); lower index.leaf_size", int(leaf), len(corpus))
    k = get(cfg, "evaluate.k") if command == "run" else None
    if k is not None and int(k) > len(corpus):
        log.warning("evaluate.k=%d is more than the corpus's %d documents: a ranking holds at most %d, and RR@%d and "
                    "Success@%d are those at %d", int(k), len(corpus), len(corpus), int(k), int(k), len(corpus))


# ---------------------------------------------------------------------------- one-line errors

def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def _hydra_line(exc: BaseException) -> str:
    """Hydra's multi-line composition / override-parse messages, condensed to one line."""
    from omegaconf.errors import ConfigKeyError  # lazy: `gdr --help`, `import gdr` stay light

    text, cause = str(exc), exc.__cause__
    m = re.match(r"Could not override '([^']+)'", text)
    if m and isinstance(cause, (ConfigKeyError, AttributeError)) and "not in struct" in str(cause):
        unknown = getattr(cause, "full_key", None) or m.group(1)  # `sampl` of sampl.n_queries=3
        msg = f"unknown key {unknown}" + (f" in {m.group(1)}" if unknown != m.group(1) else "")
        parent, leaf = getattr(cause, "parent_node", None), unknown.rpartition(".")
        if isinstance(parent, DictConfig):
            close = difflib.get_close_matches(leaf[2], [str(k) for k in parent.keys() if k != "hydra"], n=1)
            if close:
                msg += f"; did you mean {leaf[0] + '.' if leaf[0] else ''}{close[0]}?"
        groups = [g for g, o in DATA_OPTIONS.items() if leaf[0] == "data" and leaf[2] in o.keys]
        if groups:  # a key of other data= options than the one composed (a file given as data.name composes none)
            return (f"{msg}: {unknown} is a key of {' | '.join(f'data={g}' for g in groups)}; name the option, e.g. "
                    f"data={groups[0]} data.path=<file or folder> {m.group(1)}=...")
        plus = re.search(r"use (\+\S+)", text)
        return msg + (f" (a new key needs a leading +: {plus.group(1)})" if plus else "")
    parts: list[str] = []
    listing = False  # inside "Available options in 'data':" and its one-per-line names
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith(("Config search path", "See https://")):
            break
        if not line:
            listing = False
        elif listing:
            parts[-1] += (" " if parts[-1].endswith(":") else ", ") + line
        else:
            parts.append(line.rstrip("."))
            listing = line.endswith(":")
    return "; ".join(parts[:3])


def _with_override(line: str, argv: Sequence[str]) -> str:
    """Name the command-line argument a message quotes (`'[1'`, `'nope'`, `'experiment/bcc'`) when the message does
    not: an argument whose key, value or ``group/value`` is a quoted word first, else one that holds a quoted word
    (so `In 'run': Could not find 'experiment/bcc'` names `+experiment=bcc`, not `out=runs/x`)."""
    quoted = re.findall(r"'([^']+)'", line)

    def names(a: str) -> set[str]:
        key, _, value = a.partition("=")
        key = key.lstrip("+~")
        return {a, key, value, f"{key}/{value}"}

    arg = next((a for q in quoted for a in argv if q in names(a)), None)
    arg = arg or next((a for q in quoted for a in argv if q in a), None)
    if arg is None:
        return line
    return line if arg in line else f"{arg}: {line}"


def error_line(exc: BaseException, argv: Sequence[str] = ()) -> str | None:
    """The one-line message for an error the user can fix on the command line ``argv``, else None."""
    from hydra.errors import HydraException  # lazy: `gdr --help`, `import gdr` stay light
    from omegaconf.errors import OmegaConfBaseException  # lazy: `gdr --help`, `import gdr` stay light

    if isinstance(exc, HydraException):
        return _with_override(_hydra_line(exc) or type(exc).__name__, argv)
    if isinstance(exc, OmegaConfBaseException):
        line, key = _first_line(str(exc)) or type(exc).__name__, getattr(exc, "full_key", None)
        return f"{line} (key {key})" if key and key not in line else _with_override(line, argv)
    if isinstance(exc, (ConfigError, DataError, OutputError, WorkerDied)):
        return _first_line(str(exc)) or type(exc).__name__
    if isinstance(exc, (ValueError, FileNotFoundError, FileExistsError)):
        line = _first_line(str(exc)) or type(exc).__name__
        return f"{line} (--debug shows the traceback)"
    return None


def exit_line(code: object, command: str) -> str:
    """A ``SystemExit("...")`` message without a repeated ``gdr <command>:`` prefix."""
    line = _first_line(str(code))
    for prefix in (f"gdr {command}: error: ", f"gdr {command}: ", "gdr: "):
        if line.startswith(prefix):
            return line[len(prefix):]
    return line
