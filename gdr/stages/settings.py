"""The settings of each stage as plain dataclasses (no Hydra): the one place their defaults are written.

Every field carries its default, its help, its rule and its effect (:func:`gdr.rules.setting`; a section's keys are
the fields of its section classes, :data:`SECTIONS`: the training kernel's :mod:`gdr.training.options`, the GC
indexer's :mod:`gdr.indexing.options`). ``conf/stage/*.yaml``, which the commands compose, are generated from them
and from the commands' own keys (:mod:`gdr.stages.command_keys`) (:data:`GENERATED`, ``make conf``); ``--help`` reads
the help from the fields (:func:`generated_help`), :func:`rules_of` the rule tables.

:meth:`~Settings.from_dict` takes a section as a dict (``OmegaConf.to_container(cfg.sample)``, or a dict a
script writes by hand) and refuses a key it does not know, naming it. A script builds them directly, e.g.
``SampleSettings(n_queries=32)``: that is its door, where the instance checks its fields with its rules (``rules``:
the fields' rules, :func:`rules_of`, keyed as in the command's composed config; ``section``: where its fields sit
there; ``keys``: fields kept at another key), a :class:`gdr.rules.ConfigError` naming the field before any model or
data loads. A command checks its whole config once with the same tables (:func:`gdr.validate.validate`) and builds its
settings with :meth:`~Settings.from_config`, which trusts the values.
"""
from __future__ import annotations

import copy
import json
import textwrap
from contextvars import ContextVar
from dataclasses import asdict, dataclass, fields, is_dataclass, replace
from pathlib import Path
from typing import Any, ClassVar, Mapping

import numpy as np
import yaml

from gdr.config import override_value
from gdr.data.options import DATA_OPTIONS, DataOptions
from gdr.indexing.options import GCOptions, IndexAtomic, IndexBMI, IndexGC, IndexKMeans, TreeOptions, bmi_keyed
from gdr.models import DEVICE_RULE, EMBED_MODEL, MODEL_OPTIONS, THREADS_RULE, ModelOptions, SamplingOptions
from gdr.options import GCFitOptions, RankingOptions
from gdr.rules import (
    NON_NEGATIVE,
    OPT_POSITIVE,
    POSITIVE,
    ConfigError,
    Each,
    Rule,
    any_value,
    auto_or,
    boolean,
    check_values,
    device,
    effect_of,
    fields_rules,
    get,
    int_at_least,
    is_int,
    key_of,
    non_empty_list,
    number,
    one_of,
    optional,
    rule_of,
    same_setting,
    seed,
    setting,
    string_list,
)
from gdr.stages.command_keys import (
    INDEXERS,
    DocQueries,
    EvaluateKeys,
    EvaluateQueries,
    IndexKeys,
    QGKeys,
    QGQueries,
    QGSection,
    RunKeys,
    RunQG,
    RunQueries,
    SampleKeys,
    ScoreKeys,
    TrainKeys,
    TrainQueries,
    Verdict,
)
from gdr.training.options import ExampleOptions, OptimOptions, QGOptions, TrainerOptions

__all__ = ["Settings", "LMSettings", "SampleSettings", "ScoreSettings", "ClusterSettings", "IndexSettings",
           "TrainSettings", "EvaluateSettings", "INDEXERS", "MODEL_PRESETS", "MAX_P_PER_DOC",
           "IndexGCSettings", "keyed_values", "resumable", "index_keys", "settings_classes", "config_dict"]

# sample.p_per_doc's bound: query k of a document is on random stream (44 bits of its text's digest) *
# MAX_P_PER_DOC + k (gdr.stages.sample.per_doc_draws), so no two queries of a document share a stream
MAX_P_PER_DOC = 1 << 16


# ---------------------------------------------------------------------------- the settings' rules
# Each field declares its rule (``setting(..., rule=...)``); the tables below the classes are derived from them,
# keyed as in the composed config of the stand-alone command (``sample.n_queries``): gdr.validate applies them to the
# commands' configs (``gdr run`` under ``index.``, ``train.``, ``evaluate.``), each class's ``check`` to its fields.
# The rules that compare keys read the other keys from the section their table is applied to.

def preset(v, sec):
    """``model.size``: a key of ``model_presets``."""
    presets = get(sec, "model_presets")
    names = list(presets) if isinstance(presets, Mapping) else []
    return None if isinstance(v, str) and v in names else f"must be a preset: one of {' | '.join(names)}"


def k_within_beam(v, sec):
    """``k``: no more than a valid ``beam`` (an invalid beam is refused by its own rule)."""
    beam = get(sec, "beam")
    if not is_int(v) or v < 1:
        return "must be a positive integer"
    fits = not (is_int(beam) and beam >= 1) or v <= beam
    return None if fits else f"must be <= {key_of(sec, 'beam')}={beam}: beam search returns at most beam docids"


def p_per_doc(v, sec):
    """``sample.p_per_doc``: below :data:`MAX_P_PER_DOC`, so that no two queries of a document share a stream."""
    return None if is_int(v) and 0 <= v < MAX_P_PER_DOC else f"must be an integer from 0 to {MAX_P_PER_DOC - 1}"


# queries for every document (gdr.sample_doc_queries, `gdr sample sample.per_doc=N`): at least one
PER_DOC_RULE = Rule("sample.per_doc", POSITIVE, "queries per document")


# True while settings are built from a config the command's door already checked (Settings.from_config): their
# values are trusted, not checked a second time. A context variable, so that a thread building its own is unaffected.
_AT_DOOR_CHECKED: ContextVar[bool] = ContextVar("settings_checked_at_door", default=False)


class Settings:
    """Shared helpers of the settings dataclasses."""

    rules: ClassVar[tuple[Rule, ...]] = ()
    section: ClassVar[str] = ""             # the config section holding the fields ("sample": sample.n_queries)
    keys: ClassVar[dict[str, str]] = {}     # fields kept at another key of the config
    typed: ClassVar[dict[str, type]] = {}   # sections held as these dataclasses (a dict given for one converted)

    def __post_init__(self) -> None:
        for name, cls in self.typed.items():  # the door of a section given as a dict (a script, a config)
            value = getattr(self, name)
            if isinstance(value, Mapping):
                setattr(self, name, section_from(cls, value, f"{type(self).__name__}.{name}"))
        if not _AT_DOOR_CHECKED.get():  # built by a script: this is its door
            self.check()

    def check(self, shown: str = ""):
        """Refuse a value its rules refuse, naming the field (``shown`` before it, e.g. ``sampling.``); returns
        self."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}  # type: ignore[arg-type]
        check_values({k: asdict(v) if k in self.typed else v for k, v in values.items()},
                     self.rules, self.keys, self.section, shown)
        return self

    @classmethod
    def from_dict(cls, values: Mapping[str, Any] | None = None, **overrides: Any):
        """An instance from a config section (plus ``overrides``); unknown keys are refused by name."""
        d = {**(dict(values) if values else {}), **overrides}
        names = [f.name for f in fields(cls)]  # type: ignore[arg-type]
        unknown = sorted(k for k in d if k not in names)
        if unknown:
            raise TypeError(f"{cls.__name__}: unknown setting(s) {', '.join(unknown)}; known: {', '.join(names)}")
        return cls(**d)

    @classmethod
    def from_config(cls, values: Mapping[str, Any] | None = None, **overrides: Any):
        """Like :meth:`from_dict`, for a config section its command already checked at the door
        (:func:`gdr.validate.validate`): unknown keys are still refused by name, the values are trusted, not
        checked a second time."""
        token = _AT_DOOR_CHECKED.set(True)
        try:
            return cls.from_dict(values, **overrides)
        finally:
            _AT_DOOR_CHECKED.reset(token)

    @classmethod
    def merged(cls, values: Mapping[str, Any] | None = None, **overrides: Any):
        """Like :meth:`from_dict`, but a dict given for a dict-valued setting (``gc``, ``trainer`` ...) changes
        only the keys it names: the rest keep their defaults (what a script means by ``gc={"alpha": "auto"}``)."""
        d = {**(dict(values) if values else {}), **overrides}
        base = cls.from_config(d)  # refuses unknown keys; the values are checked once, merged, below
        defaults = cls.from_config()
        for key, value in d.items():
            default = getattr(defaults, key)
            if isinstance(default, dict) and isinstance(value, Mapping):
                setattr(base, key, {**default, **value})
            elif key in cls.typed and isinstance(value, Mapping):
                setattr(base, key, replace(default, **value))
        return base.check()

    def to_dict(self) -> dict:
        """The settings as their config section (:func:`config_dict`): what a stage saves as its config."""
        return config_dict(self)

    def replace(self, **changes: Any):
        """A copy with some settings changed (checked: a script's door)."""
        return replace(self, **changes)  # type: ignore[type-var]

    def resolved(self, **changes: Any):
        """A copy with values a stage resolved itself (``auto`` sizes) on checked settings: not checked again."""
        token = _AT_DOOR_CHECKED.set(True)
        try:
            return replace(self, **changes)  # type: ignore[type-var]
        finally:
            _AT_DOOR_CHECKED.reset(token)


def config_dict(value: Any) -> Any:
    """A settings object (or section) as the config it is read from: :func:`dataclasses.asdict`, a section whose
    class lists its keys in another order (``key_order``) in that order."""
    if is_dataclass(value) and not isinstance(value, type):
        out = {f.name: config_dict(getattr(value, f.name)) for f in fields(value)}
        order = getattr(value, "key_order", None)
        return {**{k: out[k] for k in order}, **out} if order else out  # a field it does not list: after them
    if isinstance(value, Mapping):
        return {k: config_dict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(config_dict(v) for v in value)
    return copy.deepcopy(value)


def section_from(cls, values: Mapping[str, Any], where: str):
    """The section dataclass ``cls`` from a dict of its keys (the rest at their defaults), its own sections
    (``typed``: ``qg.train``) as their dataclasses too; an unknown key is refused by name (``where``: how the section
    is named, ``TrainSettings.trainer``)."""
    names = [f.name for f in fields(cls)]
    unknown = sorted(str(k) for k in values if k not in names)
    if unknown:
        raise TypeError(f"{where}: unknown setting(s) {', '.join(unknown)}; known: {', '.join(names)}")
    typed = getattr(cls, "typed", {})
    return cls(**{k: section_from(typed[k], v, f"{where}.{k}") if k in typed and isinstance(v, Mapping) else v
                  for k, v in values.items()})


def _size(n: float) -> str:
    """``n`` bytes as B, KiB ... PiB."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024:
            return f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} PiB"


@dataclass
class LMSettings(Settings, ModelOptions):
    """The query generator (``model:``, :class:`gdr.models.ModelOptions`, plus ``device`` and ``threads``):
    :meth:`build` loads it."""

    keys: ClassVar = {"name": "model.name", "max_doc_tokens": "model.max_doc_tokens", "prompt": "model.prompt"}

    # cuda:N too; under torchrun auto is cuda:LOCAL_RANK
    device: str = setting("auto", "auto | cpu | cuda", effect="result", rule=DEVICE_RULE.check)
    threads: int | None = setting(None, "torch CPU threads (null = one per core; a scoring process of "
                                        "score.processes > 1: one); a CPU P's last bits depend on it, so there it "
                                        "keys the score stage", effect="speed",
                                  rule=THREADS_RULE.check, rule_help=THREADS_RULE.what)

    def scoring_threads(self, processes: int) -> int:
        """The torch threads P is scored with on a CPU: ``threads``, else 1 in each of ``processes`` > 1 scoring
        processes, else one per core (:func:`gdr.device.cpu_threads`): what keys a CPU P (P's manifest records it as
        scored, ``threads``)."""
        from gdr.device import cpu_threads  # lazy: `gdr --help`, `import gdr` stay light

        return int(self.threads) if self.threads else 1 if processes > 1 else cpu_threads()

    def build(self):
        """The :class:`gdr.lm.GenerativeLM` on this process's device (see :func:`gdr.device.local_device`)."""
        import torch  # lazy: `gdr --help`, `import gdr` stay light

        from gdr.device import local_device  # lazy: `gdr --help`, `import gdr` stay light
        from gdr.lm import GenerativeLM, PromptConfig  # lazy: `gdr --help`, `import gdr` stay light

        if self.threads:
            torch.set_num_threads(int(self.threads))
        prompt = PromptConfig(**self.prompt) if self.prompt else None
        return GenerativeLM(self.name, prompt=prompt, max_doc_tokens=self.max_doc_tokens,
                            device=local_device(self.device), threads=self.threads)


@dataclass
class SampleSettings(Settings):
    """``sample:``: how the J queries (or ``per_doc`` queries of every document) are drawn."""

    section: ClassVar = "sample"

    n_queries: int = setting(64, "J", effect="result", rule=POSITIVE, rule_help="the number J of sampled queries")
    per_doc: int = setting(0, "> 0: instead, generate this many queries for EVERY document (doc_queries.jsonl; "
                              "training data of the retriever and input of the BMI indexer)", effect="result",
                           rule=NON_NEGATIVE, rule_help="queries generated for every document; 0 = off")
    p_per_doc: int = setting(0, "> 0: P's queries are this many from EVERY document (J = p_per_doc x documents), "
                                "each document's on random streams keyed by its text and scored apart from the "
                                "others' (by source), so an edited, added or removed document re-samples and "
                                "re-scores only its own queries, row and columns of P (gdr score reuse_from=, gdr "
                                "run). 0: n_queries drawn over the corpus (Algorithm 1)", effect="result",
                             rule=p_per_doc,
                             rule_help="P's queries: this many from every document, each document's own (an edit "
                                       "re-scores only what changed); 0 = sample.n_queries drawn over the corpus")
    seed: int = setting(0, effect="result", rule=seed)
    batch_size: int | str = same_setting(SamplingOptions, "batch_size")
    max_new_tokens: int = same_setting(SamplingOptions, "max_new_tokens")
    top_k: int = same_setting(SamplingOptions, "top_k")
    top_p: float = same_setting(SamplingOptions, "top_p")
    temperature: float = same_setting(SamplingOptions, "temperature")
    compile: bool | str = same_setting(SamplingOptions, "compile")
    compile_min_queries: int | str = same_setting(SamplingOptions, "compile_min_queries")

    def n_total(self, n_docs: int) -> tuple[int, str]:
        """(J, the key that sets it) for a corpus of ``n_docs`` documents: ``p_per_doc`` x ``n_docs`` under the
        per-document sampler, else ``n_queries``."""
        if self.p_per_doc:
            return self.p_per_doc * int(n_docs), "sample.p_per_doc"
        return self.n_queries, "sample.n_queries"


@dataclass
class ScoreSettings(Settings):
    """``score:``: how P = log p(query | doc) is computed and stored."""

    section: ClassVar = "score"

    dtype: str = setting("float32", "float32 | float16: storage of P.npy", effect="result",
                         rule=one_of("float32", "float16"), rule_help="storage of P.npy")
    compute_dtype: str = setting("auto", "auto | bfloat16 | float32: the dtype the scoring passes run in (auto: bf16 "
                                         "on CUDA, the model's fp32 on a CPU); bf16 vs fp32 on the demo: "
                                         "reports/bf16-scoring.md", effect="result",
                                 rule=one_of("auto", "bfloat16", "float32"),
                                 rule_help="the dtype scoring runs in; auto = bf16 on CUDA, the model's fp32 on a CPU")
    shard_size: int = setting(32, "documents per resumable shard (scored in groups that fill a doc batch: the shard "
                                  "size changes neither the batches nor how often anything is tokenised)",
                                  effect="result", rule=POSITIVE, rule_help="documents per resumable shard")
    doc_batch_size: int | str = setting("auto", "documents per forward pass (auto: 1 on CPU; on CUDA as many as fit in "
                                                "half the free GPU memory, at most 64)", effect="result",
                                        rule=auto_or(POSITIVE), rule_help="documents per forward pass")
    max_query_tokens: int | str = setting("auto", "query tokens per packed chunk (auto: 2048 on CPU, 4096 on CUDA)",
                                          effect="result",
                                          rule=auto_or(POSITIVE), rule_help="query tokens per packed chunk")
    processes: int = setting(1, "> 1: that many scoring processes on this machine (CPU: one single-thread process per "
                                "core is fastest); the same P as one process of as many threads (threads=1). "
                                "Started by spawn, which imports the "
                                "calling script again: a script calls gdr.score(processes=N) under "
                                "`if __name__ == \"__main__\":`", effect="speed",
                             rule=POSITIVE, rule_help="scoring processes on this machine")

    def check_size(self, n_docs: int, n_queries: int, key: str = "sample.n_queries") -> None:
        """Refuse a P of ``n_docs`` x ``n_queries`` that does not fit this machine's available memory (the index
        and cluster stages hold it whole), naming its size, before any model loads. ``key``: how J is named."""
        # lazy: gdr.device loads torch, and this module stays torch-free for `gdr <command> --help`
        from gdr.device import available_memory

        need = int(n_docs) * int(n_queries) * {"float16": 2}.get(self.dtype, 4)
        have = available_memory()
        if need > have:
            raise ConfigError(f"{key}={n_queries}: P of {n_docs} documents x {n_queries} queries ({self.dtype}) takes "
                              f"{_size(need)}, more than the {_size(have)} of memory available; lower {key}")


@dataclass
class ClusterGC:
    """``cluster.gc``: GC's settings of the flat clustering; each of ``cluster.variants`` overrides some of them
    (the paper's ablations)."""

    alpha: float | str = same_setting(GCFitOptions, "alpha")
    clip_sigma: float | None = same_setting(GCFitOptions, "clip_sigma")
    phi: str = same_setting(GCFitOptions, "phi")
    ess_target: float = same_setting(GCFitOptions, "ess_target")


@dataclass
class ClusterSettings(Settings):
    """``cluster:``: flat generative clustering and its evaluation against labels."""

    section: ClassVar = "cluster"
    typed: ClassVar = {"gc": ClusterGC}  # variants: free-form overrides of some of gc's keys, a dict per variant

    n_clusters: int | None = setting(None, "null: the number of labels in the corpus (required when it has none)",
                                     effect="result",
                                     rule=optional(int_at_least(2)),
                                     rule_help="the number K of clusters; null = the corpus's labels")
    seed: int = setting(0, effect="result", rule=seed)
    n_init: int = same_setting(GCFitOptions, "n_init", "runs per fit; the lowest distortion wins (no labels used)",
                               rule_help="runs per fit")
    repeats: int = setting(10, "the paper's protocol repeats best-of-n_init R times (it uses 100)", effect="result",
                           rule=NON_NEGATIVE, rule_help="repeats of best-of-n_init")
    init: str = same_setting(GCFitOptions, "init", "greedy-k-means++ (+ split/merge moves, lowest distortion) | "
                                                   "random (Eq. init, Algorithm 1) | k-means++")
    max_iter: int = same_setting(GCFitOptions, "max_iter")
    tol: float = same_setting(GCFitOptions, "tol")
    # the evaluation restricted to documents with these labels (and to the queries sampled from them), e.g. R2 =
    # {earn, acq} inside an R5 run; None: all documents
    restrict_labels: list | None = setting(None, effect="result",
                                           rule=optional(non_empty_list), rule_help="the labels evaluated; null = all")
    gc: ClusterGC = setting(help="GC settings; each variant overrides some of `gc` (the paper's ablations)",
                            factory=ClusterGC, effect="result")
    variants: dict = setting(help="named GC variants, each a dict of gc keys it changes, clustered beside gc",
                             factory=lambda: {"gc": {}}, effect="result", rule=Each(ClusterGC))
    baselines: list = setting(help="k-means baselines (only when labels exist)",
                              factory=lambda: ["tfidf", "embedding", "logp"], effect="result",
                              rule=string_list("tfidf", "embedding", "logp"))
    embed_model: str = setting(EMBED_MODEL, "any sentence-transformers name or path", effect="result", rule=any_value)
    describe_top: int = setting(5, effect="result", rule=NON_NEGATIVE)
    enabled: bool = setting(True, "flat GC vs k-means on the corpus labels (skipped when there are none)",
                            effect="result", rule=boolean)

    def check_corpus(self, corpus, prefix: str = "") -> None:
        """The rules that depend on the corpus, checked once it is loaded and before any work: ``restrict_labels``
        among the corpus's labels, and at least two clusters and no more than the documents clustered.
        ``prefix``: how the keys are named (``cluster.`` for the commands)."""
        labels = corpus.labels
        shown = override_value(list(self.restrict_labels or ()))
        if self.restrict_labels and labels is None:
            raise ConfigError(f"{prefix}restrict_labels={shown}: corpus {corpus.name!r} has no labels; "
                              f"set {prefix}restrict_labels=null")
        names = sorted(set(labels)) if labels is not None else []
        unknown = [x for x in (self.restrict_labels or ()) if x not in names]
        if unknown:
            raise ConfigError(f"{prefix}restrict_labels={shown}: {unknown[0]!r} is not a label of corpus "
                              f"{corpus.name!r} (its labels: {', '.join(names)})")
        kept = set(self.restrict_labels or names)
        n_docs = len(corpus) if labels is None else int(np.isin(np.asarray(labels), list(kept)).sum())
        what = f"the {n_docs} documents" + (f" with labels {sorted(kept)}" if self.restrict_labels
                                            else " of the corpus")
        if self.n_clusters is None and labels is None:
            raise ConfigError(f"{prefix}n_clusters=null takes K from the labels, and corpus {corpus.name!r} has none; "
                              f"set {prefix}n_clusters=<K>")
        if self.n_clusters is not None and self.n_clusters > n_docs:
            raise ConfigError(f"{prefix}n_clusters={self.n_clusters}: must be <= {what} (the flat clustering's K; the "
                              f"docid tree's is index.n_clusters); lower {prefix}n_clusters")
        if self.n_clusters is None and labels is not None and len(kept) < 2:
            raise ConfigError(f"{prefix}n_clusters=null: K would be the number of labels, {len(kept)}; set "
                              f"{prefix}n_clusters to 2 or more")


@dataclass
class IndexGCSettings(IndexGC, GCOptions):
    """``index.gc``: the GC kernel's :class:`~gdr.indexing.options.GCOptions` (this section is one, handed to
    :func:`gdr.indexing.gc.build_gc_index` as it is) and the stage's own :class:`~gdr.indexing.options.IndexGC`
    keys beside them."""

    # the order `gdr index --help`, conf/stage/index.yaml and the saved configs list the keys in (config_dict)
    key_order: ClassVar = ("n_queries", "alpha", "ess_target", "clip_sigma", "proposal", "localized", "bootstrap",
                           "bootstrap_root", "init", "split_merge", "n_init", "n_init_inner", "max_iter", "tol",
                           "dedupe", "device", "memory_mb", "chunk_rows", "refine_max_iter", "torch_threads",
                           "top_queries", "centroid_json_depth")


# the indexers that build a tree of K children and leaves of c documents (atomic gives each document its own id)
TREE_INDEXERS = ("gc", "hkmi", "bmi", "random")


@dataclass
class IndexSettings(Settings):
    """``conf/stage/index.yaml``: one docid indexer (``method``) and its settings."""

    typed: ClassVar = {"gc": IndexGCSettings, "kmeans": IndexKMeans, "bmi": IndexBMI, "atomic": IndexAtomic}

    method: str = setting("gc", "gc | hkmi | bmi | random | atomic", effect="result",
                          rule=one_of(*INDEXERS), rule_help="the indexer")
    seed: int = setting(0, effect="result", indexers=TREE_INDEXERS, rule=seed)
    n_clusters: int = same_setting(TreeOptions, "n_clusters", indexers=TREE_INDEXERS)
    leaf_size: int = same_setting(TreeOptions, "leaf_size", indexers=TREE_INDEXERS)
    workers: int = same_setting(TreeOptions, "workers")
    progress: bool = setting(True, effect="speed", rule=boolean)
    plot: bool = setting(True, "summary.png", effect="speed", rule=boolean)
    gc: IndexGCSettings = setting(factory=IndexGCSettings, effect="result", indexers=("gc",))
    kmeans: IndexKMeans = setting(help="hkmi and bmi", factory=IndexKMeans, effect="result", indexers=("hkmi", "bmi"))
    bmi: IndexBMI = setting(factory=IndexBMI, effect="result", indexers=("bmi",))
    atomic: IndexAtomic = setting(factory=IndexAtomic, effect="result", indexers=("atomic",))


@dataclass
class TrainModel:
    """``model``: the retriever; a ``size`` preset of :data:`MODEL_PRESETS`, any non-null key overriding it."""

    size: str = setting("small30m", "a preset below; any non-null key here overrides it", effect="result",
                        rule=preset, rule_help="the retriever preset")
    encoder: str | None = setting(None, "a pretrained encoder (a name or folder; null = the preset's)",
                                  effect="result", rule=any_value)
    encoder_config: dict | None = setting(None, "T5Config keys (d_model, num_layers, ...) of a randomly initialised "
                                                "encoder, built where encoder is null", effect="result",
                                          rule=any_value)
    encoder_layers: int | None = setting(None, "first N layers of a pretrained encoder (null = all)", effect="result",
                                         rule=OPT_POSITIVE)
    tokenizer: str | None = setting(None, "the queries' tokenizer (null = the encoder's)", effect="result",
                                    rule=any_value)
    n_digits: int | None = setting(None, "null = from the docids (max digit + 1)", effect="result", rule=OPT_POSITIVE)
    max_code_len: int | None = setting(None, "null = from the docids (longest code)", effect="result",
                                       rule=OPT_POSITIVE)
    d_model: int | None = setting(None, effect="result", rule=OPT_POSITIVE)
    num_layers: int | None = setting(None, effect="result", rule=OPT_POSITIVE)
    num_heads: int | None = setting(None, effect="result", rule=OPT_POSITIVE)
    d_ff: int | None = setting(None, effect="result", rule=OPT_POSITIVE)
    d_kv: int | None = setting(None, effect="result", rule=OPT_POSITIVE)
    dropout: float | None = setting(None, effect="result", rule=optional(number(0, 1, lo_open=False, hi_open=True)))
    pawa: bool | None = setting(None, "NCI's prefix-aware weight-adaptive output layer", effect="result",
                                rule=optional(boolean))
    pawa_rank: int | None = setting(None, effect="result", rule=OPT_POSITIVE)
    max_query_len: int | None = setting(None, effect="result", rule=OPT_POSITIVE)


def _preset(encoder, d_model, num_layers, num_heads, d_ff, pawa_rank, **more) -> dict:
    """A ``model_presets`` entry: the decoder's sizes; dropout 0.1, no PAWA, 64 query tokens in every preset."""
    return {"encoder": encoder, **more, "d_model": d_model, "num_layers": num_layers, "num_heads": num_heads,
            "d_ff": d_ff, "dropout": 0.1, "pawa": False, "pawa_rank": pawa_rank, "max_query_len": 64}


# model.size -> the retriever's shape (gdr.training.model.RetrieverConfig fields), with what each is for
MODEL_PRESETS = {
    "tiny": (_preset(None, 32, 2, 4, 64, 8, encoder_config={"d_model": 32, "num_layers": 2, "num_heads": 4,
                                                               "d_ff": 64}, tokenizer="minilm-l6"),
             "~1M parameters, random init: tests and smoke runs"),
    "mini": (_preset("minilm-l6", 256, 2, 4, 1024, 8, encoder_layers=2),
             "CPU-sized: the first 2 layers of the pretrained MiniLM-L6 (bundled) + 2-layer decoder"),
    "small30m": (_preset("minilm-l6", 384, 4, 6, 1536, 16),
                 "~32M: pretrained MiniLM-L6 encoder (bundled, offline) + 4-layer decoder"),
    "t5-small": (_preset("t5-small", 512, 4, 8, 2048, 16), "T5-small encoder from the hub or a local path"),
    "t5-base": (_preset("t5-base", 768, 6, 12, 3072, 32), "NCI's size"),
}
# what `gdr train` and `gdr run` change of gdr.training.options' defaults (a direct call of gdr.training.train.train
# keeps its learning rates as given and needs no generated dev queries)
STAGE_EXAMPLES = {"dev_min": 100}
STAGE_OPTIM = {"lr_scaling": "sqrt"}


@dataclass
class TrainSettings(Settings):
    """``conf/stage/train.yaml``: the retriever (a ``model.size`` preset), its examples, optimiser and trainer."""

    typed: ClassVar = {"examples": ExampleOptions, "model": TrainModel, "optim": OptimOptions,
                       "trainer": TrainerOptions}
    # the order conf/stage/train.yaml and a saved config list the keys in (config_dict)
    key_order: ClassVar = ("concurrent", "examples", "model", "model_presets", "optim", "trainer", "seed")

    examples: ExampleOptions = setting(help="training inputs (training/data.py), each switchable",
                                       factory=lambda: ExampleOptions(**STAGE_EXAMPLES), effect="result")
    model: TrainModel = setting(factory=TrainModel, effect="result")
    model_presets: dict = setting(factory=lambda: {k: dict(v) for k, (v, _) in MODEL_PRESETS.items()},
                                  effect="result", rule=any_value)
    optim: OptimOptions = setting(help=("learning rates and warmup are stated at `base_batch_size` examples per step; "
                                        "at batch B they are scaled by sqrt(B / base_batch_size) (`lr_scaling: sqrt`; "
                                        "`linear`: B / base; `none`: as given) and the warmup covers the same number "
                                        "of examples (warmup_steps * base / B steps). Batch 512: lr x 2.83, warmup 125 "
                                        "steps."),
                                  factory=lambda: OptimOptions(**STAGE_OPTIM), effect="result")
    trainer: TrainerOptions = setting(factory=TrainerOptions, effect="result")
    seed: int = setting(0, effect="result", rule=seed)
    concurrent: int | str = setting("auto", "`gdr run`: retrievers (indexers x seeds) trained at once on one device, "
                                            "one process each (training/concurrent.py); auto = on CUDA as many as the "
                                            "free memory holds at their batch, 1 on the CPU; a number asks for that "
                                            "many on any device", effect="speed",
                                    rule=auto_or(POSITIVE), rule_help="retrievers trained at once on one device; auto "
                                                                      "= what fits, 1 on the CPU")


@dataclass
class EvaluateSettings(Settings):
    """``conf/stage/evaluate.yaml``: how a trained retriever is searched and scored."""

    k: int = same_setting(RankingOptions, "k", rule=k_within_beam, rule_help="results per query")
    beam: int = same_setting(RankingOptions, "beam")
    length_penalty: float = same_setting(RankingOptions, "length_penalty")
    batch_size: int | str = setting("auto", "queries per beam search: auto = as many as fit half the free GPU memory "
                                            "(<= 1024), 32 on the CPU", effect="result",
                                    rule=auto_or(POSITIVE), rule_help="queries per beam search; auto = what fits on "
                                                                      "CUDA (<= 1024), 32 on the CPU")
    device: str | None = setting(None, "null = cuda if available", effect="speed",
                                 rule=device(None, "cpu"), rule_help="null = cuda when available")
    bm25: bool = setting(True, "BM25 (bm25s) on the same corpus and queries", effect="result", rule=boolean)
    tag: str = same_setting(RankingOptions, "tag")


# ---------------------------------------------------------------------------- conf/stage/*.yaml, generated
# the nested sections of the dict-valued fields: their keys' help (and, for the defaults, their fields)
SECTIONS = {(ClusterSettings, "gc"): ClusterGC, (IndexSettings, "gc"): (IndexGC, GCOptions),
            (IndexSettings, "kmeans"): IndexKMeans, (IndexSettings, "bmi"): IndexBMI,
            (IndexSettings, "atomic"): IndexAtomic,
            (TrainSettings, "examples"): ExampleOptions, (TrainSettings, "model"): TrainModel,
            (TrainSettings, "optim"): OptimOptions, (TrainSettings, "trainer"): TrainerOptions,
            (TrainKeys, "queries"): TrainQueries, (EvaluateKeys, "queries"): EvaluateQueries,
            (QGKeys, "qg"): QGSection, (QGSection, "train"): QGOptions, (QGKeys, "queries"): QGQueries,
            (RunKeys, "queries"): RunQueries, (RunKeys, "doc_queries"): DocQueries,
            (RunKeys, "verdict"): Verdict, (RunKeys, "qg"): RunQG, (RunQG, "train"): QGOptions}
# conf/<file> -> the settings (or command keys) class it is written from and its fields there, in the order the
# commands list them
# (a field kept out of a stage file has one of its own where only some commands compose it: `gdr index`'s method,
# `gdr train`'s seed, `gdr run`'s cluster.enabled)
GENERATED = {
    "stage/lm.yaml": (LMSettings, ("device", "threads")),  # the model's own keys are its conf/model/ option's
    "stage/sample.yaml": (SampleSettings, ("n_queries", "per_doc", "p_per_doc", "seed", "batch_size", "max_new_tokens",
                                           "compile", "compile_min_queries", "top_k", "top_p", "temperature")),
    "stage/score.yaml": (ScoreSettings, ()),
    "stage/cluster.yaml": (ClusterSettings, tuple(f.name for f in fields(ClusterSettings) if f.name != "enabled")),
    "stage/cluster_enabled.yaml": (ClusterSettings, ("enabled",)),
    "stage/index.yaml": (IndexSettings, tuple(f.name for f in fields(IndexSettings) if f.name != "method")),
    "stage/index_method.yaml": (IndexSettings, ("method",)),
    "stage/train.yaml": (TrainSettings, ("concurrent", "examples", "model", "model_presets", "optim", "trainer")),
    "stage/train_seed.yaml": (TrainSettings, ("seed",)),
    "stage/evaluate.yaml": (EvaluateSettings, ()),
    # the commands' own keys (gdr.stages.command_keys); `out` (and train's docids, out_dir) a file of their own where
    # the command places the query generator's device and threads (train: its seed) after them
    "stage/sample_out.yaml": (SampleKeys, ("out",)),
    "stage/sample_keys.yaml": (SampleKeys, ("progress",)),
    "stage/score_keys.yaml": (ScoreKeys, ()),
    "stage/index_keys.yaml": (IndexKeys, ()),
    "stage/train_paths.yaml": (TrainKeys, ("docids", "out_dir")),
    "stage/train_keys.yaml": (TrainKeys, ("queries", "generated")),
    "stage/evaluate_keys.yaml": (EvaluateKeys, ()),
    "stage/qg_out.yaml": (QGKeys, ("out",)),
    "stage/qg_keys.yaml": (QGKeys, ("progress", "seed", "qg", "queries")),
    "stage/run_keys.yaml": (RunKeys, ()),
}

# conf/<group>/<option>.yaml -> the dataclass declaring the group's keys, and the option (its keys, values, help)
GROUP_OPTIONS = {**{f"data/{name}.yaml": (DataOptions, option) for name, option in DATA_OPTIONS.items()},
                 **{f"model/{name}.yaml": (ModelOptions, option) for name, option in MODEL_OPTIONS.items()}}


def section_classes(cls, name: str) -> tuple:
    """The dataclasses whose fields are the keys of the dict-valued field ``name`` of ``cls`` (none: not one)."""
    found = SECTIONS.get((cls, name), ())
    return found if isinstance(found, tuple) else (found,)


def rules_of(cls) -> tuple[Rule, ...]:
    """The rules the fields of the settings class ``cls`` and of its sections declare, keyed as in the composed
    config of its stand-alone command (``sample.n_queries``, ``trainer.patience_steps``)."""
    return fields_rules(cls, f"{cls.section}." if cls.section else "", cls.keys, section_classes)


# The settings' rule tables, derived from their fields. `gdr index`, `gdr train`, `gdr evaluate` (`gdr search`) keep
# their settings at the root, `gdr run` under `index.`, `train.`, `evaluate.`; `progress` is `gdr sample`'s own key.
LM_RULES = LMSettings.rules = rules_of(LMSettings) + (Rule("progress", boolean),)
SAMPLE_RULES = SampleSettings.rules = rules_of(SampleSettings)
SCORE_RULES = ScoreSettings.rules = rules_of(ScoreSettings)
CLUSTER_RULES = ClusterSettings.rules = rules_of(ClusterSettings)
INDEX_RULES = IndexSettings.rules = rules_of(IndexSettings)
TRAIN_RULES = TrainSettings.rules = rules_of(TrainSettings)
EVALUATE_RULES = EvaluateSettings.rules = rules_of(EvaluateSettings)
RESULTS_RULE = rule_of(RankingOptions.__dataclass_fields__["k"], "k")


def keyed_values(cls, values: Mapping[str, Any]) -> dict:
    """The part of a config section of ``cls`` (a settings or section dataclass, or a tuple of them) that keys its
    stage: every key but those whose field changes only the speed (``effect="speed"``), the same within its dict-valued
    sections; a key no field declares is kept."""
    classes = cls if isinstance(cls, tuple) else (cls,)
    by_name = {f.name: (c, f) for c in classes for f in fields(c)}
    out = {}
    for key, value in values.items():
        owner, f = by_name.get(key, (None, None))
        if f is not None and effect_of(f) == "speed":
            continue
        sections = section_classes(owner, key) if owner is not None else ()
        out[key] = keyed_values(sections, value) if sections and isinstance(value, Mapping) else value
    return out


def resumable(cls) -> frozenset[str]:
    """The settings of ``cls`` a resumed run may change: those that key nothing (speed) or say ``effect="resume"``."""
    return frozenset(f.name for f in fields(cls) if effect_of(f) in ("speed", "resume"))


def index_keys() -> dict[str, tuple[str, ...]]:
    """Indexer -> the settings of ``gdr index`` (:class:`IndexSettings`) its ids depend on, from their fields'
    ``indexers``."""
    return {m: tuple(f.name for f in fields(IndexSettings) if m in f.metadata.get("indexers", ())) for m in INDEXERS}


def index_key_values(method: str, values: dict) -> dict:
    """What of ``values`` (an :class:`IndexSettings` dict) keys an index of ``method``: its :func:`index_keys`, the
    ``bmi`` section as far as its ``inputs`` read it (:func:`gdr.indexing.options.bmi_keyed`; nothing for genq)."""
    out = {k: values[k] for k in index_keys()[method]}
    if "bmi" in out:
        bmi = bmi_keyed(out.pop("bmi"))
        if bmi is not None:
            out["bmi"] = bmi
    return out


def settings_classes() -> list[type]:
    """Every stage settings class and every section class under them (the fields whose ``effect`` keys the
    stages), parents before their sections."""
    found: list[type] = []
    todo = [LMSettings, SampleSettings, ScoreSettings, ClusterSettings, IndexSettings, TrainSettings,
            EvaluateSettings, DocQueries, GCFitOptions, TreeOptions, RankingOptions, SamplingOptions]
    while todo:
        cls = todo.pop(0)
        if cls not in found:
            found.append(cls)
            todo += [s for f in fields(cls) for s in section_classes(cls, f.name)]
    return found


def field_help(cls) -> dict[str, str]:
    """Dotted key -> what it means, from the field metadata of ``cls`` and its sections (``gc.alpha``); a key
    without help is left out."""
    out: dict[str, str] = {}
    for f in fields(cls):
        if f.metadata.get("help"):
            out[f.name] = f.metadata["help"]
        for section in section_classes(cls, f.name):
            out.update({f"{f.name}.{k}": v for k, v in field_help(section).items()})
    if cls is TrainSettings:
        out.update({f"model_presets.{name}": what for name, (_, what) in MODEL_PRESETS.items()})
    return out


def generated_help(name: str) -> dict[str, str]:
    """Dotted key -> its help, of the keys the generated ``conf/<name>`` holds (``--help`` reads this)."""
    if name in GROUP_OPTIONS:
        cls, option = GROUP_OPTIONS[name]
        return {k: v for k, v in {**field_help(cls), **option.help}.items() if k in option.keys}
    cls, names = GENERATED[name]
    keep = names or tuple(f.name for f in fields(cls))
    return {k: v for k, v in field_help(cls).items() if k.split(".")[0] in keep}


def _yaml_value(v) -> str:
    """``v`` as one line of YAML (a text with a line break in JSON's double quotes, which YAML reads as is)."""
    if isinstance(v, str) and "\n" in v:
        return json.dumps(v, ensure_ascii=False)
    return yaml.safe_dump(v, default_flow_style=True, width=10**6, sort_keys=False).strip().removesuffix("\n...")


def _yaml_lines(values: dict, helps: dict[str, str], indent: str = "", prefix: str = "") -> list[str]:
    """``values`` as YAML block lines, each key's help a comment above it."""
    lines: list[str] = []
    for k, v in values.items():
        what = helps.get(prefix + k)
        lines += [f"{indent}# {x}" for x in textwrap.wrap(what, 116 - len(indent))] if what else []
        if isinstance(v, dict) and v:
            lines += [f"{indent}{k}:", *_yaml_lines(v, helps, indent + "  ", f"{prefix}{k}.")]
        elif isinstance(v, list) and v and all(isinstance(x, (list, dict)) for x in v):  # one item a line
            lines += [f"{indent}{k}:", *(f"{indent}  - {_yaml_value(x)}" for x in v)]
        else:
            lines.append(f"{indent}{k}: {_yaml_value(v)}")
    return lines


def generated_yaml(name: str) -> str:
    """The text of ``conf/<name>`` (a key of :data:`GENERATED` or of :data:`GROUP_OPTIONS`), written from its
    settings class."""
    if name in GROUP_OPTIONS:
        cls, option = GROUP_OPTIONS[name]
        defaults = {**asdict(cls()), **option.values}
        about = [f"# {line}" for line in option.about.splitlines()]
        head = (f"# Generated from {cls.__module__}.{cls.__name__} and its option table (`make conf`): change those, "
                "not this file.")
        values = {k: defaults[k] for k in option.keys}
        return "\n".join([*about, head, *_yaml_lines(values, generated_help(name))]) + "\n"
    cls, names = GENERATED[name]
    defaults = config_dict(cls())
    values = {k: defaults[k] for k in (names or defaults)}
    head = f"# Generated from {cls.__module__}.{cls.__name__} (`make conf`): change the dataclass, not this file."
    return "\n".join([head, *_yaml_lines(values, field_help(cls))]) + "\n"


def write_generated(folder) -> list[str]:
    """Write every :data:`GENERATED` and :data:`GROUP_OPTIONS` file under the ``conf/`` ``folder``; returns the
    names that changed."""
    changed = []
    for name in (*GENERATED, *GROUP_OPTIONS):
        path, text = Path(folder) / name, generated_yaml(name)
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            changed.append(name)
    return changed
