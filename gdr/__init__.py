"""gdr: generative document retrieval with generative-clustering (GC) indexing.

The public API (loaded on first use, so ``import gdr`` stays cheap)::

    corpus = gdr.load_corpus("bbc", n_docs=80, drop_title=True)        # a Corpus (doc_ids, texts, labels)
    lm = gdr.load_lm("smollm2-135m", max_doc_tokens=64)                 # a GenerativeLM
    p = gdr.score(corpus, lm, "runs/x/score", n_queries=64)            # sampled queries and P = log p(q | d)
    labels = gdr.GenerativeClustering(n_clusters=5, alpha="auto").fit_predict(p.logp)
    gc = gdr.build_index("runs/x/index-gc", run=p, method="gc", n_clusters=8, leaf_size=8)
    train = gdr.split_queries(corpus, "train", name="titles", data={"name": "bbc", "n_docs": 80})
    res = gdr.train_retriever(corpus, gc["docids"], "runs/x/train-gc", queries=train, size="mini")
    report = gdr.run({"seeds": [0]}, experiment="demo")                 # the whole pipeline, cached by stage

See :mod:`gdr.api` for every function, :mod:`gdr.stages` for the stages they call and
:mod:`gdr.stages.settings` for the settings (the defaults of ``conf/``).
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from typing import Any

from gdr.paths import KERNELS, PACKAGE

__version__ = "0.1.0"


class _KernelsBeside(importlib.abc.MetaPathFinder):
    """Finds gdr.indexing, gdr.training and gdr.eval in a source checkout, where their folders sit beside gdr/ (the
    design's top level); a wheel installs them inside gdr, where the usual import finds them."""

    def find_spec(self, fullname, path=None, target=None):
        parent, _, name = fullname.rpartition(".")
        if parent != __name__ or name not in KERNELS:
            return None
        init = PACKAGE.parent / name / "__init__.py"
        return importlib.util.spec_from_file_location(fullname, init, submodule_search_locations=[str(init.parent)])


# First on the path, so that a checkout put on PYTHONPATH imports its own kernels, not an editable install's
if not any((PACKAGE / k).is_dir() for k in KERNELS) and not any(isinstance(f, _KernelsBeside) for f in sys.meta_path):
    sys.meta_path.insert(0, _KernelsBeside())

_EXPORTS = {
    # data
    "Corpus": "gdr.data", "QuerySet": "gdr.data", "DataError": "gdr.data", "load_corpus": "gdr.data",
    "load_queries": "gdr.data", "load_title_queries": "gdr.data", "write_beir": "gdr.data",
    # models and the method
    "GenerativeLM": "gdr.lm", "PromptConfig": "gdr.lm", "GenerativeClustering": "gdr.cluster",
    "PRun": "gdr.store", "load_run": "gdr.store",
    # the settings of each stage
    "LMSettings": "gdr.stages.settings", "SampleSettings": "gdr.stages.settings",
    "ScoreSettings": "gdr.stages.settings", "ClusterSettings": "gdr.stages.settings",
    "IndexSettings": "gdr.stages.settings", "TrainSettings": "gdr.stages.settings",
    "EvaluateSettings": "gdr.stages.settings",
    # the steps
    "load_lm": "gdr.api", "sample_queries": "gdr.api", "sample_doc_queries": "gdr.api", "score": "gdr.api",
    "split_queries": "gdr.api",
    "evaluate_clusters": "gdr.api", "build_index": "gdr.api", "train_retriever": "gdr.api", "evaluate": "gdr.api",
    "bm25": "gdr.api", "run": "gdr.api", "headline": "gdr.api",
    "prune": "gdr.api", "pack": "gdr.api", "unpack": "gdr.api",
    "setup_logging": "gdr.logs",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        if not name.startswith("_") and importlib.util.find_spec(f"gdr.{name}") is not None:
            return importlib.import_module(f"gdr.{name}")  # a submodule: gdr.api, gdr.stages ...
        raise AttributeError(f"module 'gdr' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
