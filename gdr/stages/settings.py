"""The settings of each stage as plain dataclasses (no Hydra): what ``conf/*.yaml`` sections hold.

Every class has the defaults of its ``conf/`` section and :meth:`~Settings.from_dict`, which takes that
section as a dict (``OmegaConf.to_container(cfg.sample)``, or a dict a script writes by hand) and refuses a
key it does not know, naming it. The commands build them from their composed configs; a script builds
them directly, e.g. ``SampleSettings(n_queries=32)``. A value the command would refuse is refused here too,
when the instance is made, by the same rules (:func:`gdr.validate.check_settings`): a
:class:`gdr.validate.ConfigError` (a ``ValueError``) naming the field, before any model or data loads.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Mapping

__all__ = ["Settings", "LMSettings", "SampleSettings", "ScoreSettings", "ClusterSettings", "IndexSettings",
           "TrainSettings", "EvaluateSettings", "stage_defaults"]


class Settings:
    """Shared helpers of the settings dataclasses."""

    def __post_init__(self) -> None:
        self.check()

    def check(self):
        """Refuse a value out of range (the commands' rules, :mod:`gdr.validate`), naming the field; returns self."""
        from gdr.validate import check_settings

        check_settings(self)
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


def stage_defaults(section: str) -> dict:
    """The defaults of a ``conf/stage/<section>.yaml`` file (index, train, evaluate) as a plain dict."""
    import yaml

    from gdr.config import conf_dir

    return yaml.safe_load((conf_dir() / "stage" / f"{section}.yaml").read_text(encoding="utf-8")) or {}


@dataclass
class LMSettings(Settings):
    """The query generator (``model:`` plus ``device`` and ``threads``): :meth:`build` loads it."""

    name: str = "smollm2-135m"
    max_doc_tokens: int = 128
    prompt: dict | None = None      # PromptConfig fields; None: the model's default prompt
    device: str = "auto"            # auto | cpu | cuda | cuda:N (under torchrun: cuda:LOCAL_RANK)
    threads: int | None = None      # torch CPU threads (None: torch's default)

    def build(self):
        """The :class:`gdr.lm.GenerativeLM` on this process's device (see :func:`gdr.store.local_device`)."""
        import torch

        from gdr.lm import GenerativeLM, PromptConfig
        from gdr.store import local_device

        if self.threads:
            torch.set_num_threads(int(self.threads))
        prompt = PromptConfig(**self.prompt) if self.prompt else None
        return GenerativeLM(self.name, prompt=prompt, max_doc_tokens=self.max_doc_tokens,
                            device=local_device(self.device))


@dataclass
class SampleSettings(Settings):
    """``sample:``: how the J queries (or ``per_doc`` queries of every document) are drawn."""

    n_queries: int = 64             # J
    per_doc: int = 0                # > 0: this many queries for every document instead (doc_queries.jsonl)
    seed: int = 0
    batch_size: int | str = "auto"  # only the speed changes
    max_new_tokens: int = 32
    top_k: int = 50
    top_p: float = 0.99
    temperature: float = 1.0
    compile: bool | str = "auto"    # compile the decode step: auto = on CUDA for >= compile_min_queries queries
    compile_min_queries: int | str = "auto"  # auto: gdr.lm.compiling.AUTO_COMPILE_MIN_QUERIES


@dataclass
class ScoreSettings(Settings):
    """``score:``: how P = log p(query | doc) is computed and stored."""

    dtype: str = "float32"              # storage of P.npy: float32 | float16
    compute_dtype: str = "auto"         # scoring's dtype: auto (bf16 on CUDA, fp32 on a CPU) | bfloat16 | float32
    shard_size: int = 32
    doc_batch_size: int | str = "auto"
    max_query_tokens: int | str = "auto"
    processes: int = 1              # > 1: that many scoring processes on this machine


@dataclass
class ClusterSettings(Settings):
    """``cluster:``: flat generative clustering and its evaluation against labels."""

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


@dataclass
class IndexSettings(Settings):
    """``conf/stage/index.yaml``: one docid indexer (``method``) and its settings."""

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

    k: int = 100
    beam: int = 100
    length_penalty: float = 1.0
    batch_size: int | str = "auto"
    device: str | None = None
    bm25: bool = True
    tag: str = "gdr"
