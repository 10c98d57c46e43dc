"""The settings of each stage as plain dataclasses (no Hydra): what ``conf/*.yaml`` sections hold.

Every class has the defaults of its ``conf/`` section and :meth:`~Settings.from_dict`, which takes that
section as a dict (``OmegaConf.to_container(cfg.sample)``, or a dict a script writes by hand) and refuses a
key it does not know, naming it. The commands build them from their composed configs; a script builds
them directly, e.g. ``SampleSettings(n_queries=32)``.

Each class carries its rules (``rules``: :class:`gdr.rules.Rule` keyed as in the command's composed config;
``section``: where its fields sit there; ``keys``: fields kept at another key). The commands check their configs
with these tables (:mod:`gdr.validate`), and an instance checks its fields with them when it is made: a
:class:`gdr.rules.ConfigError` (a ``ValueError``) naming the field, before any model or data loads.
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, ClassVar, Mapping

import numpy as np

from gdr.config import conf_dir, override_value
from gdr.models import LM_RULES
from gdr.rules import (
    FILE,
    NON_NEGATIVE,
    OPT_POSITIVE,
    POSITIVE,
    ConfigError,
    Rule,
    accelerator,
    auto_or,
    boolean,
    check_values,
    device,
    get,
    int_at_least,
    is_int,
    non_empty_list,
    number,
    one_of,
    optional,
    precision,
    seed,
    string_list,
    trainer_devices_at,
)

__all__ = ["Settings", "LMSettings", "SampleSettings", "ScoreSettings", "ClusterSettings", "IndexSettings",
           "TrainSettings", "EvaluateSettings", "stage_defaults", "INDEXERS", "MAX_P_PER_DOC"]

# sample.p_per_doc's bound: query k of a document is on random stream (44 bits of its text's digest) *
# MAX_P_PER_DOC + k (gdr.stages.sample.per_doc_draws), so no two queries of a document share a stream
MAX_P_PER_DOC = 1 << 16


# ---------------------------------------------------------------------------- the settings' rules
# Each table is keyed as in the composed config of the stand-alone command (``sample.n_queries``); gdr.validate
# applies it to the commands' configs (``gdr run`` under ``index.``, ``train.``, ``evaluate.``), each class's
# ``check`` to its fields.
INDEXERS = ("gc", "hkmi", "bmi", "random", "atomic")


def preset(v, sec):
    """``model.size``: a key of ``model_presets``."""
    presets = get(sec, "model_presets")
    names = list(presets) if isinstance(presets, Mapping) else []
    return None if isinstance(v, str) and v in names else f"must be a preset: one of {' | '.join(names)}"


def leaf_size(v, sec):
    """indexing.tree.build_tree: 1 <= c <= K, since a leaf's documents take positions 0..c-1 < K."""
    k = get(sec, "n_clusters")
    if not is_int(v) or v < 1:
        return "must be a positive integer"
    if is_int(k) and v > k:
        return f"must be <= n_clusters={k}: a leaf's documents take positions 0..c-1, which must be < K"
    return None


def k_within_beam(v, sec):
    beam = get(sec, "beam")
    if not is_int(v) or v < 1:
        return "must be a positive integer"
    return f"must be <= beam={beam}: beam search returns at most beam docids" if is_int(beam) and v > beam else None


def fused(v, sec):
    """``optim.fused``: auto, true or false; true cannot be clipped under 16-mixed's gradient scaler."""
    if v != "auto" and not isinstance(v, bool):
        return "must be auto, true or false"
    scaled = str(get(sec, "trainer.precision")) in ("16-mixed", "16")
    if v is True and scaled and get(sec, "trainer.gradient_clip_val"):
        return ("cannot be true with trainer.precision=16-mixed and gradient clipping (a fused AdamW unscales "
                "float16 gradients itself); use false, bf16-mixed or trainer.gradient_clip_val=null")
    return None


def min_steps(v, sec):
    """``trainer.min_steps``: no more than ``trainer.max_steps`` (Lightning would stop at max_steps, silently)."""
    problem = NON_NEGATIVE(v, sec)
    most = get(sec, "trainer.max_steps")
    if problem is None and is_int(most) and most > 0 and v > most:
        return f"must be <= trainer.max_steps={most}: training stops there; lower it or raise trainer.max_steps"
    return problem


# AdamW moves each weight by about lr a step: above 1 every step overshoots, and the batch scaling of lr_scaling
# can take a huge value to inf, which fails only in training, after sampling, scoring and indexing
LR_LIMIT = "AdamW moves each weight by about lr a step: at most 1"
SAMPLE_RULES = (
    Rule("sample.n_queries", POSITIVE, "the number J of sampled queries"),
    Rule("sample.per_doc", NON_NEGATIVE, "queries generated for every document; 0 = off"),
    Rule("sample.p_per_doc", lambda v, sec: None if is_int(v) and 0 <= v < MAX_P_PER_DOC
         else f"must be an integer from 0 to {MAX_P_PER_DOC - 1}",
         "P's queries: this many from every document, each document's own (an edit re-scores only what changed); "
         "0 = sample.n_queries drawn over the corpus"),
    Rule("sample.seed", seed),
    Rule("sample.batch_size", auto_or(POSITIVE),
         "queries per decode batch (changes speed, not the queries); auto = fits the GPU / fastest on a CPU"),
    Rule("sample.max_new_tokens", POSITIVE, "tokens per sampled query"),
    Rule("sample.compile", auto_or(boolean), "compile the decode step; auto = on CUDA for large work"),
    Rule("sample.compile_min_queries", auto_or(POSITIVE), "sample.compile=auto compiles from this many queries"),
    Rule("sample.top_k", NON_NEGATIVE, "top-k sampling; 0 = off"),
    Rule("sample.top_p", number(0, 1), "nucleus sampling mass; 1 = off"),
    Rule("sample.temperature", number(0), "sampling temperature; below 1e-30 the greedy output, its limit"),
)
# queries for every document (gdr.sample_doc_queries, `gdr sample sample.per_doc=N`): at least one
PER_DOC_RULE = Rule("sample.per_doc", POSITIVE, "queries per document")
SCORE_RULES = (
    Rule("score.dtype", one_of("float32", "float16"), "storage of P.npy"),
    Rule("score.compute_dtype", one_of("auto", "bfloat16", "float32"),
         "the dtype scoring runs in; auto = bf16 on CUDA, the model's fp32 on a CPU"),
    Rule("score.shard_size", POSITIVE, "documents per resumable shard"),
    Rule("score.doc_batch_size", auto_or(POSITIVE), "documents per forward pass"),
    Rule("score.max_query_tokens", auto_or(POSITIVE), "query tokens per packed chunk"),
    Rule("score.processes", POSITIVE, "scoring processes on this machine"),
)
GC_VARIANT = (  # cluster.gc and every cluster.variants.<name> (keys set on top of cluster.gc)
    Rule("alpha", auto_or(number(0)), "GC's regularisation; the paper uses 0.25; auto = by effective sample size"),
    Rule("ess_target", number(0, 1, hi_open=True), "alpha=auto's mean ESS as a fraction of J"),
    Rule("clip_sigma", optional(number(0)), "clipping at mu + n sigma; null = none"),
    Rule("phi", one_of("power", "naive"), "the proposal phi"),
)
CLUSTER_RULES = (
    Rule("cluster.n_clusters", optional(int_at_least(2)), "the number K of clusters; null = the corpus's labels"),
    Rule("cluster.seed", seed),
    Rule("cluster.n_init", POSITIVE, "runs per fit"),
    Rule("cluster.repeats", NON_NEGATIVE, "repeats of best-of-n_init"),
    Rule("cluster.init", one_of("greedy-k-means++", "random", "k-means++")),
    Rule("cluster.max_iter", POSITIVE),
    Rule("cluster.tol", number(0, lo_open=False)),
    Rule("cluster.restrict_labels", optional(non_empty_list), "the labels evaluated; null = all"),
    *(Rule(f"cluster.{sec}.{r.key}", r.check, r.what) for sec in ("gc", "variants.*") for r in GC_VARIANT),
    Rule("cluster.baselines", string_list("tfidf", "embedding", "logp"), "k-means baselines"),
    Rule("cluster.describe_top", NON_NEGATIVE),
)
# Indexer settings: `gdr index` at the root, `gdr run` under `index.` (conf/stage/index.yaml).
INDEX_RULES = (
    Rule("seed", seed),
    Rule("n_clusters", int_at_least(2), "K, children per node"),
    Rule("leaf_size", leaf_size, "c, the most documents in a leaf"),
    Rule("workers", POSITIVE, "threads over the nodes of a level"),
    Rule("progress", boolean),
    Rule("plot", boolean),
    Rule("gc.n_queries", OPT_POSITIVE, "the first J columns of P; null = all"),
    Rule("gc.alpha", auto_or(number(0)), "GC's regularisation; the paper uses 0.25; auto = by effective sample size"),
    Rule("gc.ess_target", number(0, 1, hi_open=True), "alpha=auto's mean ESS as a fraction of J"),
    Rule("gc.clip_sigma", optional(number(0)), "clipping at mu + n sigma; null = none"),
    Rule("gc.proposal", one_of("power", "naive")),
    Rule("gc.localized", boolean),
    Rule("gc.bootstrap", boolean),
    Rule("gc.bootstrap_root", boolean),
    Rule("gc.init", one_of("greedy-k-means++", "random", "k-means++")),
    Rule("gc.split_merge", optional(boolean),
         "split/merge moves after each node's fit; null = on for greedy-k-means++"),
    Rule("gc.n_init", POSITIVE, "fits at the root"),
    Rule("gc.n_init_inner", POSITIVE, "fits at every other node"),
    Rule("gc.max_iter", POSITIVE),
    Rule("gc.tol", number(0, lo_open=False)),
    Rule("gc.dedupe", boolean),
    Rule("gc.device", device("cpu")),
    Rule("gc.memory_mb", number(0), "working-set budget of one node"),
    Rule("gc.chunk_rows", POSITIVE),
    Rule("gc.refine_max_iter", NON_NEGATIVE),
    Rule("gc.torch_threads", OPT_POSITIVE),
    Rule("gc.top_queries", NON_NEGATIVE),
    Rule("gc.centroid_json_depth", int_at_least(-1), "-1 = no centroids in tree.json"),
    Rule("kmeans.docs", FILE, "jsonl of {doc_id, text}"),
    Rule("kmeans.doc_queries", FILE, "jsonl of {doc_id, queries} from `gdr sample sample.per_doc=N`"),
    Rule("kmeans.batch_size", POSITIVE),
    Rule("kmeans.n_init", POSITIVE),
    Rule("kmeans.max_iter", POSITIVE),
    Rule("kmeans.spherical", boolean),
    Rule("atomic.warn_above", NON_NEGATIVE),
)
# Retriever settings: `gdr train` at the root, `gdr run` under `train.` (conf/stage/train.yaml).
TRAIN_RULES = (
    Rule("examples.use_real", boolean),
    Rule("examples.use_generated", boolean),
    Rule("examples.doc_first", boolean),
    Rule("examples.doc_windows", NON_NEGATIVE, "random windows per document"),
    Rule("examples.window", POSITIVE, "tokens per document window"),
    Rule("examples.max_doc_tokens", POSITIVE),
    Rule("examples.dev_fraction", number(0, 1, lo_open=False, hi_open=True), "queries held out for validation"),
    Rule("examples.dev_max", NON_NEGATIVE),
    Rule("examples.dev_min", NON_NEGATIVE, "dev queries filled up with held-out generated queries"),
    Rule("examples.dev_max_share", number(0, 1, lo_open=False), "the most generated queries held out for dev"),
    Rule("examples.generated_per_doc", OPT_POSITIVE, "generated queries used per document; null = all"),
    Rule("model.size", preset, "the retriever preset"),
    *(Rule(f"model.{k}", OPT_POSITIVE) for k in ("n_digits", "max_code_len", "d_model", "num_layers", "num_heads",
                                                 "d_ff", "d_kv", "pawa_rank", "max_query_len", "encoder_layers")),
    Rule("model.dropout", optional(number(0, 1, lo_open=False, hi_open=True))),
    Rule("model.pawa", optional(boolean)),
    Rule("optim.lr_encoder", number(0, 1, lo_open=False), f"0 freezes the encoder; {LR_LIMIT}"),
    Rule("optim.lr_decoder", number(0, 1), LR_LIMIT),
    Rule("optim.weight_decay", number(0, lo_open=False)),
    Rule("optim.warmup_steps", NON_NEGATIVE),
    Rule("optim.consistency_weight", number(0, lo_open=False), "0 = off"),
    Rule("optim.base_batch_size", POSITIVE, "the batch size the learning rates are stated at"),
    Rule("optim.lr_scaling", one_of("sqrt", "linear", "none"), "how learning rates follow the batch size"),
    Rule("optim.fused", fused, "fused AdamW; auto = on CUDA"),
    Rule("trainer.precision", precision, "Lightning's precision; null/auto = bf16-mixed on CUDA, 32-true on the CPU"),
    Rule("trainer.max_epochs", POSITIVE),
    Rule("trainer.max_steps", lambda v, sec: None if v == -1 or (is_int(v) and v > 0)
         else "must be -1 (no limit) or a positive integer"),
    Rule("trainer.batch_size", auto_or(POSITIVE), "auto = what fits on CUDA (<= 4096), 64 on the CPU"),
    Rule("trainer.eval_batch_size", POSITIVE),
    Rule("trainer.gradient_clip_val", optional(number(0, lo_open=False))),
    Rule("trainer.check_val_every_n_epoch", OPT_POSITIVE),
    Rule("trainer.val_check_interval", optional(number(0))),
    Rule("trainer.limit_val_batches", number(0)),
    Rule("trainer.patience", NON_NEGATIVE, "validations without improvement before stopping"),
    Rule("trainer.patience_steps", OPT_POSITIVE, "steps without improvement before stopping; null = `patience`"),
    Rule("trainer.min_steps", min_steps, "steps before any early stop"),
    Rule("trainer.monitor", one_of("val/recall@1", "val/mrr"), "the dev metric that picks the checkpoint"),
    Rule("trainer.val_beam", POSITIVE),
    Rule("trainer.length_penalty", number(), "the dev beam search's length penalty"),
    Rule("trainer.num_workers", NON_NEGATIVE),
    Rule("trainer.log_every_n_steps", POSITIVE),
    Rule("trainer.checkpoint_every_n_steps", OPT_POSITIVE),
    Rule("trainer.checkpoint_every_n_epochs", POSITIVE, "epochs between resume points"),
    Rule("trainer.num_sanity_val_steps", int_at_least(-1)),
    Rule("trainer.tensorboard", boolean),
    Rule("trainer.resume", boolean),
    Rule("trainer.resume_damaged", one_of("best", "fresh"), "a damaged last.ckpt: start from the best weights or over"),
    Rule("trainer.enable_progress_bar", boolean),
    Rule("trainer.accelerator", accelerator, "Lightning's accelerator; auto = cuda when available"),
    Rule("trainer.devices", trainer_devices_at("trainer"), "Lightning's devices"),
    Rule("trainer.compile", boolean),
    Rule("trainer.length_buckets", boolean, "batches grouped by input length"),
    Rule("concurrent", auto_or(POSITIVE), "retrievers trained at once on one device; auto = what fits, 1 on the CPU"),
)
# Search settings: `gdr evaluate`/`gdr search` at the root, `gdr run` under `evaluate.` (conf/stage/evaluate.yaml).
RESULTS_RULE = Rule("k", POSITIVE)  # the results of a search that names its own k (gdr search, gdr.bm25)
EVALUATE_RULES = (
    Rule("beam", POSITIVE, "beam width"),
    Rule("k", k_within_beam, "results per query"),
    Rule("batch_size", auto_or(POSITIVE), "queries per beam search; auto = what fits on CUDA (<= 1024), 32 on the CPU"),
    Rule("length_penalty", number(), "a docid scores log p / length**length_penalty"),
    Rule("device", device(None, "cpu"), "null = cuda when available"),
    Rule("bm25", boolean),
)


class Settings:
    """Shared helpers of the settings dataclasses."""

    rules: ClassVar[tuple[Rule, ...]] = ()
    section: ClassVar[str] = ""             # the config section holding the fields ("sample": sample.n_queries)
    keys: ClassVar[dict[str, str]] = {}     # fields kept at another key of the config

    def __post_init__(self) -> None:
        self.check()

    def check(self, shown: str = ""):
        """Refuse a value its rules refuse, naming the field (``shown`` before it, e.g. ``sampling.``); returns
        self."""
        check_values({f.name: getattr(self, f.name) for f in fields(self)},  # type: ignore[arg-type]
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
    def merged(cls, values: Mapping[str, Any] | None = None, **overrides: Any):
        """Like :meth:`from_dict`, but a dict given for a dict-valued setting (``gc``, ``trainer`` ...) changes
        only the keys it names: the rest keep their defaults (what a script means by ``gc={"alpha": "auto"}``)."""
        d = {**(dict(values) if values else {}), **overrides}
        base = cls.from_dict(d)  # refuses unknown keys
        defaults = cls()
        for key, value in d.items():
            default = getattr(defaults, key)
            if isinstance(default, dict) and isinstance(value, Mapping):
                setattr(base, key, {**default, **value})
        return base.check()

    def to_dict(self) -> dict:
        return asdict(self)  # type: ignore[call-overload]

    def replace(self, **changes: Any):
        """A copy with some settings changed."""
        return replace(self, **changes)  # type: ignore[type-var]


def available_memory() -> int:
    """Bytes of memory available to a new allocation (Linux: MemAvailable; else the free physical pages)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            line = next(x for x in f if x.startswith("MemAvailable:"))
        return int(line.split()[1]) * 1024
    except (OSError, StopIteration, ValueError):
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _size(n: float) -> str:
    """``n`` bytes as B, KiB ... PiB."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024:
            return f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} PiB"


def stage_defaults(section: str) -> dict:
    """The defaults of a ``conf/stage/<section>.yaml`` file (index, train, evaluate) as a plain dict."""
    import yaml

    return yaml.safe_load((conf_dir() / "stage" / f"{section}.yaml").read_text(encoding="utf-8")) or {}


@dataclass
class LMSettings(Settings):
    """The query generator (``model:`` plus ``device`` and ``threads``): :meth:`build` loads it."""

    rules: ClassVar = LM_RULES
    keys: ClassVar = {"name": "model.name", "max_doc_tokens": "model.max_doc_tokens", "prompt": "model.prompt"}

    name: str = "smollm2-135m"
    max_doc_tokens: int = 128
    prompt: dict | None = None      # PromptConfig fields; None: the model's default prompt
    device: str = "auto"            # auto | cpu | cuda | cuda:N (under torchrun: cuda:LOCAL_RANK)
    threads: int | None = None      # torch CPU threads (None: torch's default)

    def build(self):
        """The :class:`gdr.lm.GenerativeLM` on this process's device (see :func:`gdr.device.local_device`)."""
        import torch

        from gdr.device import local_device
        from gdr.lm import GenerativeLM, PromptConfig

        if self.threads:
            torch.set_num_threads(int(self.threads))
        prompt = PromptConfig(**self.prompt) if self.prompt else None
        return GenerativeLM(self.name, prompt=prompt, max_doc_tokens=self.max_doc_tokens,
                            device=local_device(self.device))


@dataclass
class SampleSettings(Settings):
    """``sample:``: how the J queries (or ``per_doc`` queries of every document) are drawn."""

    rules: ClassVar = SAMPLE_RULES
    section: ClassVar = "sample"

    n_queries: int = 64             # J
    per_doc: int = 0                # > 0: this many queries for every document instead (doc_queries.jsonl)
    p_per_doc: int = 0              # > 0: P's queries are this many from every document (incremental P)
    seed: int = 0
    batch_size: int | str = "auto"  # only the speed changes
    max_new_tokens: int = 32
    top_k: int = 50
    top_p: float = 0.99
    temperature: float = 1.0
    compile: bool | str = "auto"    # compile the decode step: auto = on CUDA for >= compile_min_queries queries
    compile_min_queries: int | str = "auto"  # auto: gdr.lm.compiling.AUTO_COMPILE_MIN_QUERIES

    def n_total(self, n_docs: int) -> tuple[int, str]:
        """(J, the key that sets it) for a corpus of ``n_docs`` documents: ``p_per_doc`` x ``n_docs`` under the
        per-document sampler, else ``n_queries``."""
        if self.p_per_doc:
            return self.p_per_doc * int(n_docs), "sample.p_per_doc"
        return self.n_queries, "sample.n_queries"


@dataclass
class ScoreSettings(Settings):
    """``score:``: how P = log p(query | doc) is computed and stored."""

    rules: ClassVar = SCORE_RULES
    section: ClassVar = "score"

    dtype: str = "float32"              # storage of P.npy: float32 | float16
    compute_dtype: str = "auto"         # scoring's dtype: auto (bf16 on CUDA, fp32 on a CPU) | bfloat16 | float32
    shard_size: int = 32
    doc_batch_size: int | str = "auto"
    max_query_tokens: int | str = "auto"
    processes: int = 1              # > 1: that many scoring processes on this machine

    def check_size(self, n_docs: int, n_queries: int, key: str = "sample.n_queries") -> None:
        """Refuse a P of ``n_docs`` x ``n_queries`` that does not fit this machine's available memory (the index
        and cluster stages hold it whole), naming its size, before any model loads. ``key``: how J is named."""
        need = int(n_docs) * int(n_queries) * {"float16": 2}.get(self.dtype, 4)
        have = available_memory()
        if need > have:
            raise ConfigError(f"{key}={n_queries}: P of {n_docs} documents x {n_queries} queries ({self.dtype}) takes "
                              f"{_size(need)}, more than the {_size(have)} of memory available; lower {key}")


@dataclass
class ClusterSettings(Settings):
    """``cluster:``: flat generative clustering and its evaluation against labels."""

    rules: ClassVar = CLUSTER_RULES
    section: ClassVar = "cluster"

    n_clusters: int | None = None   # None: the number of labels
    seed: int = 0
    n_init: int = 10
    repeats: int = 10
    init: str = "greedy-k-means++"
    max_iter: int = 100
    tol: float = 1.0e-6
    restrict_labels: list | None = None
    gc: dict = field(default_factory=lambda: {"alpha": 0.25, "clip_sigma": 5.0, "phi": "power", "ess_target": 0.5})
    variants: dict = field(default_factory=lambda: {"gc": {}})
    baselines: list = field(default_factory=lambda: ["tfidf", "embedding", "logp"])
    embed_model: str = "minilm-l6"
    describe_top: int = 5
    enabled: bool = True            # `gdr run` only: skip the stage when false

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
        if self.n_clusters is not None and self.n_clusters > n_docs:
            raise ConfigError(f"{prefix}n_clusters={self.n_clusters}: must be <= {what} (the flat clustering's K; the "
                              f"docid tree's is index.n_clusters); lower {prefix}n_clusters")
        if self.n_clusters is None and labels is not None and len(kept) < 2:
            raise ConfigError(f"{prefix}n_clusters=null: K would be the number of labels, {len(kept)}; set "
                              f"{prefix}n_clusters to 2 or more")


@dataclass
class IndexSettings(Settings):
    """``conf/stage/index.yaml``: one docid indexer (``method``) and its settings."""

    rules: ClassVar = INDEX_RULES + (Rule("method", one_of(*INDEXERS), "the indexer"),)

    method: str = "gc"
    seed: int = 0
    n_clusters: int = 30
    leaf_size: int = 30
    workers: int = 1
    progress: bool = True
    plot: bool = True
    gc: dict = field(default_factory=lambda: dict(stage_defaults("index")["gc"]))
    kmeans: dict = field(default_factory=lambda: dict(stage_defaults("index")["kmeans"]))
    atomic: dict = field(default_factory=lambda: {"warn_above": 100000})


@dataclass
class TrainSettings(Settings):
    """``conf/stage/train.yaml``: the retriever (a ``model.size`` preset), its examples, optimiser and trainer."""

    rules: ClassVar = TRAIN_RULES + (Rule("seed", seed),)

    examples: dict = field(default_factory=lambda: dict(stage_defaults("train")["examples"]))
    model: dict = field(default_factory=lambda: dict(stage_defaults("train")["model"]))
    model_presets: dict = field(default_factory=lambda: dict(stage_defaults("train")["model_presets"]))
    optim: dict = field(default_factory=lambda: dict(stage_defaults("train")["optim"]))
    trainer: dict = field(default_factory=lambda: dict(stage_defaults("train")["trainer"]))
    seed: int = 0
    concurrent: int | str = "auto"  # `gdr run`: retrievers trained at once on one device (auto: 1 on the CPU)


@dataclass
class EvaluateSettings(Settings):
    """``conf/stage/evaluate.yaml``: how a trained retriever is searched and scored."""

    rules: ClassVar = EVALUATE_RULES

    k: int = 100
    beam: int = 100
    length_penalty: float = 1.0
    batch_size: int | str = "auto"
    device: str | None = None
    bm25: bool = True
    tag: str = "gdr"
