"""The command-level keys of ``conf/<command>.yaml`` (``out``, ``indexers``, ``queries.*``, ``qg.*`` ...) as plain
dataclasses: the one place their defaults and help are written.

Like the stage settings of :mod:`gdr.stages.settings`, every field carries its default and its help
(:func:`gdr.rules.setting`); a dict-valued field's keys are the fields of its section class
(:data:`gdr.stages.settings.SECTIONS`). ``conf/stage/*_keys.yaml`` (and the few files that keep a key's place in
the composed config: ``sample_out``, ``qg_out``, ``train_paths``) are generated from them
(:data:`gdr.stages.settings.GENERATED`), the command YAMLs include them through ``defaults:``, and ``--help`` reads
the help from the fields. The sections whose keys are all said here carry their rules on their fields
(``doc_queries``, ``qg``: :data:`gdr.validate.TABLES` derives them, :func:`gdr.rules.fields_rules`); the others'
rules stay with the commands' tables in :mod:`gdr.validate`. A default that refers to another key is an
interpolation (``"${data.name}"``); ``"???"`` is a value the command line must give. ``typed``: the sections held as
their dataclass once read (:func:`gdr.stages.settings.section_from`), as a settings class's.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import ClassVar

from gdr.data import CORPORA
from gdr.rules import (
    MISSING,
    NON_NEGATIVE,
    OPT_POSITIVE,
    POSITIVE,
    any_value,
    auto_or,
    boolean,
    get,
    is_int,
    number,
    one_of,
    path_problem,
    same_setting,
    seed,
    setting,
)
from gdr.training.options import QGDevSplit, QGOptions

__all__ = ["INDEXERS", "SampleKeys", "ScoreKeys", "IndexKeys", "TrainKeys", "TrainQueries", "EvaluateKeys",
           "EvaluateQueries", "QGKeys", "QGSection", "QGQueries", "QG_TRAIN", "RunKeys", "RunQueries", "DocQueries",
           "RunQG"]

INDEXERS = ("gc", "hkmi", "bmi", "random", "atomic")  # the docid indexers, in the order `gdr run` builds them
PLAN_DEVICE = "h200"  # the device `gdr plan` plans for unless its device= names one


@dataclass
class SampleKeys:
    """``gdr sample``'s own keys (``gdr score``, ``cluster`` and ``run`` include them)."""

    out: str = setting("runs/${data.name}", "output folder: queries, P and their manifests (a rerun resumes there)")
    progress: bool = setting(True)


@dataclass
class ScoreKeys:
    """``gdr score``'s own keys: where the queries come from instead of sampling them."""

    queries_from: str | None = setting(None, "a `gdr score` (or `gdr run`) folder: score against ITS queries, with "
                                             "its model, instead of sampling (the P of new documents for `gdr index "
                                             "add index=<index built on it>`)")
    reuse_from: str | None = setting(None, "an older `gdr score` (or `gdr run`) folder of the same model and settings "
                                           "(the corpus before an edit): its queries and P entries that a full "
                                           "rescore would give byte for byte are taken, only the rest sampled and "
                                           "scored (all but an edited document's own with sample.p_per_doc > 0); "
                                           "null: queries_from's, if any")


@dataclass
class IndexKeys:
    """``gdr index``'s own keys: its input and output folders."""

    run: str | None = setting(None, "P-matrix run folder (P.npy, queries.jsonl, doc_ids.json): required for gc; "
                                    "else gives doc ids")
    out: str | None = setting(None, "output folder (required); `gdr index add`: a new folder to grow a copy of the "
                                    "index in (as a `gdr run` stage must be)")
    index: str | None = setting(None, "`gdr index add`: the GC index folder to grow")


@dataclass
class TrainQueries:
    """``gdr train``'s ``queries``: the real training queries."""

    name: str | None = setting("${data.name}", "a corpus without a query set (r2, r5, bbc) simply has none")
    split: str = setting("train", "the split trained on; the dev split is held out from it")
    path: str | None = setting("${data.path}")


@dataclass
class TrainKeys:
    """``gdr train``'s own keys: the docids, the output folder and the training queries."""

    docids: str = setting(MISSING, "docids.tsv from `gdr index` (doc_id<TAB>12-3-27)")
    out_dir: str = setting("runs/train/${data.name}", "output folder: the retriever (model/), its docids, config "
                                                      "and checkpoints (a rerun resumes there)")
    queries: dict = setting(help="real training queries (gdr.data.load_queries); null name = none",
                            factory=lambda: asdict(TrainQueries()))
    generated: str | None = setting(None, "jsonl {\"doc_id\": ..., \"queries\": [...]} from `gdr sample`")


@dataclass
class EvaluateQueries:
    """``gdr evaluate``'s ``queries``: the split scored."""

    name: str | None = setting("${data.name}")
    split: str = setting("test", "never the split the model was trained on (unless --allow-train-split)")
    path: str | None = setting("${data.path}")


@dataclass
class EvaluateKeys:
    """``gdr evaluate``'s (and ``gdr search``'s) own keys: the retriever and where its scores go."""

    run_dir: str = setting(MISSING, "a `gdr train` run folder (model/ + docids.tsv)")
    out_dir: str = setting("${run_dir}/eval/${queries.split}", "output folder: metrics, run.trec, qrels, per-query "
                                                               "values")
    queries: dict = setting(factory=lambda: asdict(EvaluateQueries()))


# what `gdr qg` changes of gdr.training.options.QGOptions' defaults: Lightning's bar follows the command's progress
QG_TRAIN = {"enable_progress_bar": "${progress}"}


def qg_pairs(v, sec):
    """``qg.pairs``: titles, queries or an existing ``.jsonl`` of pairs."""
    if v in ("titles", "queries"):
        return None
    if isinstance(v, str) and v.endswith(".jsonl"):
        return path_problem(v, "file")
    return "must be titles | queries | the path of a .jsonl of {doc or doc_id, query} pairs"


def corpus_list(v, sec):
    """``qg.exclude``: a list of corpus names of :data:`gdr.data.CORPORA`."""
    vals = list(v) if isinstance(v, Sequence) and not isinstance(v, str) else None  # a list, or a config's
    if vals is None or any(x not in CORPORA for x in vals):
        return f"must be a list of corpus names ({', '.join(CORPORA)}), e.g. [r5]"
    return None


@dataclass
class QGSection:
    """``gdr qg``'s ``qg``: the (document, query) pairs, their dev split, the prompt and the training."""

    typed: ClassVar = {"train": QGOptions}

    pairs: str = setting("titles", rule=qg_pairs, rule_help="where the training pairs come from")
    exclude: list = setting(help="corpora whose documents are never trained on, e.g. [r5]: no R5 story or its title",
                            factory=list, rule=corpus_list, rule_help="corpora never trained on")
    lowercase: bool = setting(False, "lowercase the queries (Reuters headlines are in capitals: twice the tokens per "
                                     "word)", rule=boolean)
    max_pairs: int | None = setting(None, "a seeded uniform sample of at most this many pairs; null = all",
                                    rule=OPT_POSITIVE, rule_help="pairs kept; null = all")
    dev_fraction: float = same_setting(QGDevSplit, "dev_fraction")
    dev_max: int = same_setting(QGDevSplit, "dev_max")
    shots: int = setting(0, rule=NON_NEGATIVE, rule_help="prompt examples kept")
    train: QGOptions = setting(factory=lambda: QGOptions(**QG_TRAIN))


@dataclass
class QGQueries:
    """``gdr qg``'s ``queries``: the query set of ``qg.pairs=queries``."""

    # a query set's name or folder: gdr.data.load_queries refuses one it cannot read when the pairs are built
    name: str | None = setting(None, "the query set of qg.pairs=queries (default: the corpus's own, data.name)",
                               rule=any_value)
    path: str | None = setting(None, rule=any_value)
    split: str = same_setting(TrainQueries, "split", "the split whose pairs are trained on", rule=one_of("train"),
                              rule_help="gdr qg trains on the train split only")


@dataclass
class QGKeys:
    """``gdr qg``'s own keys (the query generator's ``device`` and ``threads`` are :class:`LMSettings`')."""

    out: str = setting("runs/qg/${data.name}", "output folder: the fine-tuned generator (model/) and its report",
                       rule=any_value)  # gdr.guard claims it
    progress: bool = setting(True, rule=boolean)
    seed: int = setting(0, rule=seed)
    qg: dict = setting(help=(
        "Where the pairs come from (pairs): titles - each document's title is the query, the document without its "
        "title is the input (bbc, r2, r5, reuters; documents sharing a title or a body are left out); queries - the "
        "TRAIN split of the query set `queries.name` (cranfield, msmarco-lite, nq320k, a BEIR folder), one pair per "
        "(query, relevant document of the corpus), dev and test are refused; <file.jsonl> - one pair per line: "
        "{\"doc\": text, \"query\": text} or {\"doc_id\": id, \"query\": text} (doc_id looked up in `data`). Prompt "
        "shots kept from the model's prompt (shots): a fine-tuned generator needs no examples, and a prompt without "
        "them is 3-4x shorter, so sampling and scoring are faster. The prompt used is saved."),
        factory=lambda: asdict(QGSection()))
    queries: dict = setting(factory=lambda: asdict(QGQueries()))


@dataclass
class RunQueries:
    """``gdr run``'s ``queries``: the query set, its train and test splits, or its folds."""

    name: str | None = setting("${data.name}", "a query set (cranfield, msmarco-lite, nq320k, a BEIR folder) or "
                                               "`titles` (bbc, r2, r5: each title is the query of its own article; a "
                                               "proxy task)")
    path: str | None = setting("${data.path}")
    train_split: str = setting("train", "trained on (its dev part is held out by the trainer)")
    test_split: str = setting("test", "scored on; never trained on, never used to pick a checkpoint")
    dev_split: str | None = setting(None, "the retrievers' dev split (their learning curves; the checkpoint where "
                                          "train.trainer.weights=best): this split of the query set, every query of "
                                          "it, none trained on; null = held out from the train split by the trainer "
                                          "(train.examples.dev_fraction). Not with queries.folds: the folds have no "
                                          "dev split")
    seed: int = setting(0, "seeds a split by a setting: a hash of the topic (titles: document) id")
    fractions: list | None = setting(None, "train/dev/test shares of the topics, e.g. [0.6, 0.1, 0.3]; null = the "
                                           "query set's own splits (titles, which have none: 0.8/0.1/0.1)")
    folds: int | None = setting(None, "K: cross-validate over K folds of the topics (K retrievers per scheme and "
                                      "seed, each trained without one fold, scored on it); null = one split")


def per_doc_for_bmi(v, sec):
    """``doc_queries.per_doc`` of ``gdr run``: the bmi indexer needs at least one generated query per document."""
    if not is_int(v) or v < 0:
        return "must be an integer >= 0"
    if v == 0 and "bmi" in list(get(sec, "indexers") or []):
        return "the bmi indexer needs generated queries: set doc_queries.per_doc >= 1 or drop bmi from indexers"
    return None


@dataclass
class DocQueries:
    """``gdr run``'s ``doc_queries``: generated training queries for every document, with decoding of their own."""

    per_doc: int = setting(10, "0 = none (then bmi cannot run)", effect="result",
                           rule=per_doc_for_bmi, rule_help="generated training queries per document")
    seed: int = setting(1, effect="result", rule=seed)
    batch_size: int | str = setting("${sample.batch_size}", effect="speed",
                                    rule=auto_or(POSITIVE),
                                    rule_help="queries per decode batch; auto = as sample.batch_size")
    max_new_tokens: int | str = setting("${sample.max_new_tokens}", effect="result", rule=POSITIVE)
    top_k: int = setting(10, effect="result",
                         rule=NON_NEGATIVE, rule_help="top-k sampling of the training queries; 0 = off")
    top_p: float = setting(1.0, effect="result",
                           rule=number(0, 1), rule_help="nucleus mass of the training queries; 1 = off")
    temperature: float = setting(0.7, effect="result",
                                 rule=number(0),
                                 rule_help="sampling temperature of the training queries; below 1e-30 greedy")


@dataclass
class Verdict:
    """``gdr run``'s ``verdict``: the primary test, fixed before the run (eval/compare.py primary_verdict)."""

    pair: list = setting(help="the two schemes compared, a - b", factory=lambda: ["gc", "hkmi"])
    metric: str = setting("recall@1", "recall@1 | recall@10 | mrr (RR at evaluate.k)")
    margin: float = setting(2.0, "points: an interval over seeds and queries inside +-margin says 'equivalent'")


@dataclass
class RunQG:
    """``gdr run``'s ``qg``: the query generator fine-tuned inside the run on its training split's pairs."""

    typed: ClassVar = {"train": QGOptions}

    enabled: bool = setting(False, "fine-tune the query generator (model.name, the base LM) on the run's TRAINING "
                                   "split's (document, query) pairs (titles: the train titles; a query set: its "
                                   "train split; never a dev or test query), or on the corpus's titles "
                                   "(qg.pairs), and sample P's queries, score P and generate the retrievers' training "
                                   "queries with it; false = the base model and its prompt (the two-shot generator)",
                            rule=boolean)
    compare_two_shot: bool = setting(False, "also score a P with the two-shot generator and cluster it, for the "
                                            "report's flat clustering with each generator (qg.enabled only)",
                                     rule=boolean)
    pairs: str = setting("queries", "what the generator is fine-tuned on. queries: the training split's (query, "
                                    "relevant document) pairs (not with queries.folds: one generator would see "
                                    "every fold's test topics); titles: (document, its own title) pairs of the "
                                    "corpus, the document read without its title (data.drop_title=true; not with "
                                    "queries.name=titles, whose test queries are those titles): no query at all, so "
                                    "it is allowed with queries.folds; the titles of a seeded qg.dev_fraction of "
                                    "the documents (hash with qg.seed + 1) are held out for the report's held-out "
                                    "loss", rule=one_of("queries", "titles"),
                         rule_help="the generator's training pairs")
    lowercase: bool = same_setting(QGSection, "lowercase")
    max_pairs: int | None = same_setting(QGSection, "max_pairs")
    dev_fraction: float = same_setting(QGDevSplit, "dev_fraction", "training documents held out (by a seeded hash "
                                                                   "of the doc id) to pick the checkpoint; the "
                                                                   "report's held-out loss is on the run's dev split "
                                                                   "(qg.pairs=titles: on held-out documents' titles)")
    dev_max: int = same_setting(QGDevSplit, "dev_max")
    seed: int = setting(0, rule=seed)
    train: QGOptions = setting(factory=lambda: QGOptions(**QG_TRAIN))


@dataclass
class RunKeys:
    """``gdr run``'s own keys: the indexers and seeds compared, the query set, the generated training queries."""

    out: str = setting("runs/run-${data.name}", "output folder: one folder per stage, the report (a rerun reuses "
                                                "finished stages)")
    indexers: list = setting(help="one docid index per name", factory=lambda: list(INDEXERS))
    seeds: list = setting(help="one retriever per (indexer, seed); the report gives mean (std) over seeds",
                          factory=lambda: [0, 1, 2])
    index_seed: str = setting("shared", "shared: one index per docid scheme (index.seed) under every retriever seed; "
                                        "retriever: the retriever of seed s trains on the docids of an index built "
                                        "with index.seed=s (index-<scheme>-s<s>), so the seeds sample the index's "
                                        "construction too (a scheme whose ids depend on no seed, atomic, keeps one)")
    queries: dict = setting(help="what the retrievers learn from and are scored on",
                            factory=lambda: asdict(RunQueries()))
    doc_queries: dict = setting(help=(
        "generated training queries for every document (`gdr sample sample.per_doc=N`). Decoding of their own, for "
        "teaching a retriever (not the clustering sampler's, whose temperature 1 and top-p 0.99 estimate p(query | "
        "doc) as the importance weights need, and whose draws from a 135M model are often noise): the 10 most "
        "likely next tokens at temperature 0.7. Each query keeps its own random stream."),
        factory=lambda: asdict(DocQueries()))
    qg: dict = setting(help="the query generator fine-tuned on the run's training split (gdr.stages.qg)",
                       factory=lambda: asdict(RunQG()))
    bm25: bool = setting(True, "BM25 (bm25s) on the same test queries, as reference")
    overlap: bool | str = setting("auto", "run the host stages (flat clustering and its baselines, the indexes, "
                                          "BM25) in a background thread beside the device stages, each taken where "
                                          "it is needed (gdr.stages.overlap); auto = on when the device is CUDA, "
                                          "off on the CPU (the same cores); the results are the same either way")
    plot: bool = setting(True, "report.png")
    verdict: dict = setting(help=("the primary test: decided when its interval over seeds and queries excludes 0, "
                                  "equivalent when it lies inside +-margin, else undecided"),
                            factory=lambda: asdict(Verdict()))
