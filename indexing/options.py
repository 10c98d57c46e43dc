"""The options of hierarchical GC indexing (:mod:`gdr.indexing.gc`), without torch: ``gdr index``'s and ``gdr run``'s
``gc`` section is these fields (:class:`gdr.stages.settings.IndexSettings`), their defaults and help written here
once."""
from __future__ import annotations

import math
from dataclasses import dataclass

from gdr.models import EMBED_BATCH, EMBED_MODEL
from gdr.options import GCFitOptions
from gdr.rules import (
    FILE,
    NON_NEGATIVE,
    OPT_POSITIVE,
    POSITIVE,
    any_value,
    boolean,
    get,
    int_at_least,
    is_int,
    key_of,
    number,
    one_of,
    optional,
    same_setting,
    setting,
)

__all__ = ["GCOptions", "TreeOptions", "IndexGC", "IndexKMeans", "IndexBMI", "BMI_INPUTS", "bmi_keyed", "IndexAtomic"]


@dataclass
class GCOptions:
    """Switches of hierarchical GC (defaults: the paper, K and c set on the tree).

    alpha: RIS regularisation (Eq. ris), 0.25 in the paper; "auto": chosen once at the root by
        :func:`gdr.cluster.auto_alpha` (mean effective sample size ``ess_target * J``) and used at every node.
    ess_target: the ESS fraction of ``alpha="auto"``.
    clip_sigma: n_sigma of Eq. clip, applied once with the root's bounds; None disables clipping.
    proposal: "power" (Eq. vmp) or "naive" (column mean of P).
    localized: re-estimate phi~ on each node's documents (else every node uses the global phi).
    bootstrap: resample the J columns at each node by Eq. resampling (else use all J as they are).
    bootstrap_root: also resample at the root (r_j = 1 there: a uniform bootstrap).
    init, n_init, max_iter, tol, split_merge: passed to ``fit_generative``; ``n_init`` at the root,
        ``n_init_inner`` below it. ``init``: "greedy-k-means++" (default), "random" (Eq. init) or
        "k-means++" (Appendix); ``split_merge``: null = on for "greedy-k-means++" only.
    dedupe: cluster identical rows once (weighted by multiplicity).
    device: torch device of the kernel.
    memory_mb: working-set budget of one node; larger nodes are fitted on a row sample and
        refined by streamed passes of ``chunk_rows`` rows, at most ``refine_max_iter`` of them.
        With ``workers`` threads, peak memory is about ``workers * memory_mb`` plus the baseline.
    torch_threads: torch intra-op threads while indexing (restored afterwards); None = leave as is.
        1 is the default because most nodes are small: on a loaded 2-core machine, the kernel's
        (K, J) tensor operations ran 20-40x slower with 2 OpenMP threads than with 1 (measured).
    """
    alpha: float | str = same_setting(GCFitOptions, "alpha", "Eq. ris / vmp / resampling; auto = chosen at the root "
                                                             "by effective sample size",
                                      rule_help="GC's regularisation; the paper uses 0.25; auto = by effective sample "
                                                "size")
    ess_target: float = same_setting(GCFitOptions, "ess_target")
    clip_sigma: float | None = same_setting(GCFitOptions, "clip_sigma", "Eq. clip once on the root P (mu_j + 5 "
                                                                        "sigma_j); null = no clipping",
                                            rule_help="clipping at mu + n sigma; null = none")
    proposal: str = same_setting(GCFitOptions, "phi", "power (Eq. vmp) | naive (column mean of P)")
    localized: bool = setting(True, "phi~ re-estimated on each node's documents (Appendix \"Localized proposal\"); "
                                    "false: the root's phi at every node, whose columns gc.bootstrap then resamples "
                                    "uniformly (Algorithm 1 at every node: false with gc.bootstrap=false)",
                              effect="result", rule=boolean)
    bootstrap: bool = setting(True, "resample the J columns per node by Eq. resampling", effect="result", rule=boolean)
    bootstrap_root: bool = setting(False, "also resample at the root (uniformly: phi~ = phi there)", effect="result",
                                   rule=boolean)
    init: str = same_setting(GCFitOptions, "init")
    n_init: int = same_setting(GCFitOptions, "n_init", "fit_generative runs at the root")
    n_init_inner: int = setting(3, "... at every node below the root", effect="result", rule=POSITIVE,
                                rule_help="fits at every other node")
    max_iter: int = same_setting(GCFitOptions, "max_iter")
    tol: float = setting(1e-5, "relative improvement of the total distortion", effect="result",
                         rule=number(0, lo_open=False))
    dedupe: bool = setting(True, "cluster identical rows once, weighted by multiplicity", effect="result", rule=boolean)
    device: str = same_setting(GCFitOptions, "device")
    memory_mb: float = setting(1024, "per-node working-set budget; larger nodes: fit on a row sample + streamed "
                                     "refinement", effect="result", rule=number(0),
                               rule_help="working-set budget of one node")
    chunk_rows: int = setting(2048, "rows per streamed chunk", effect="result", rule=POSITIVE)
    refine_max_iter: int = setting(30, "streamed full-data passes of a node over budget", effect="result",
                                   rule=NON_NEGATIVE)
    torch_threads: int | None = setting(1, "torch threads while indexing (1: fastest on a shared 2-core machine); "
                                           "null = default", effect="result", rule=OPT_POSITIVE)
    split_merge: bool | None = setting(None, "split/merge moves after each node's fit; null = on for greedy-k-means++ "
                                             "only", effect="result", rule=optional(boolean))

    def validate(self) -> None:
        from gdr.cluster import INITS  # gdr.cluster imports torch; these options are read without it

        if self.alpha != "auto" and not (isinstance(self.alpha, (int, float)) and math.isfinite(self.alpha)
                                         and 0 < self.alpha <= 1):
            raise ValueError(f"gc.alpha must be in the paper's (0, 1] (it uses 0.25) or 'auto'; got {self.alpha!r}")
        if not 0 < self.ess_target < 1:
            raise ValueError(f"gc.ess_target must be in (0, 1); got {self.ess_target}")
        if self.clip_sigma is not None and not self.clip_sigma > 0:
            raise ValueError(f"gc.clip_sigma must be > 0 or null (no clipping); got {self.clip_sigma}")
        if self.proposal not in ("power", "naive"):
            raise ValueError(f"gc.proposal must be 'power' or 'naive'; got {self.proposal!r}")
        if self.init not in INITS:
            raise ValueError(f"gc.init must be one of {', '.join(INITS)}; got {self.init!r}")
        if self.split_merge is not None and not isinstance(self.split_merge, bool):
            raise ValueError(f"gc.split_merge must be true, false or null (on for greedy-k-means++); "
                             f"got {self.split_merge!r}")
        for name in ("n_init", "n_init_inner", "max_iter", "chunk_rows"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"gc.{name} must be >= 1; got {getattr(self, name)}")
        if self.torch_threads is not None and int(self.torch_threads) < 1:
            raise ValueError(f"gc.torch_threads must be >= 1 or null; got {self.torch_threads}")
        if self.refine_max_iter < 0 or self.memory_mb <= 0 or self.tol < 0:
            raise ValueError("gc.refine_max_iter and gc.tol must be >= 0 and gc.memory_mb > 0")


def leaf_size(v, sec):
    """gdr.indexing.tree.build_tree: 1 <= c <= K, since a leaf's documents take positions 0..c-1 < K."""
    k = get(sec, "n_clusters")
    if not is_int(v) or v < 1:
        return "must be a positive integer"
    if is_int(k) and v > k:
        return (f"must be <= {key_of(sec, 'n_clusters')}={k}: a leaf's documents take positions 0..c-1, which must "
                "be < K")
    return None


@dataclass
class TreeOptions:
    """The shape of every docid tree (:func:`gdr.indexing.tree.build_tree`): the paper's K and c."""

    n_clusters: int = setting(30, "K: children per node; every position < K", effect="result", rule=int_at_least(2),
                              rule_help="K, children per node")
    leaf_size: int = setting(30, "c: nodes of at most c documents are leaves (c <= K)", effect="result", rule=leaf_size,
                             rule_help="c, the most documents in a leaf")
    workers: int = setting(1, "threads over the nodes of one level (ids do not depend on it)", effect="speed",
                           rule=POSITIVE, rule_help="threads over the nodes of a level")


@dataclass
class IndexGC:
    """``gc``'s keys beside the kernel's :class:`gdr.indexing.options.GCOptions`: which columns of P, and what
    tree.json shows."""

    n_queries: int | None = setting(None, "J: use only the first J columns of P (null = all)", effect="result",
                                    rule=OPT_POSITIVE, rule_help="the first J columns of P; null = all")
    top_queries: int = setting(5, "typical queries per child in tree.json", effect="result",
                               rule=NON_NEGATIVE)
    centroid_json_depth: int = setting(0, "tree.json keeps rounded log-centroids of nodes up to this depth (all: "
                                          "tree_state.npz)", effect="result",
                                       rule=int_at_least(-1), rule_help="-1 = no centroids in tree.json")


@dataclass
class IndexKMeans:
    """``kmeans``: the k-means of hkmi and bmi."""

    docs: str | None = setting(None, "jsonl {\"doc_id\", \"text\"} (instead of data=)", effect="result", rule=FILE,
                               rule_help="jsonl of {doc_id, text}")
    doc_queries: str | None = setting(None, "bmi: jsonl {\"doc_id\", \"queries\": [...]}", effect="result", rule=FILE,
                                      rule_help="jsonl of {doc_id, queries} from `gdr sample sample.per_doc=N`")
    embed_model: str = setting(EMBED_MODEL, "hkmi (embedding=model) and bmi: any sentence-transformers model "
                                          "(bundled minilm-l6 works offline)", effect="result",
                               rule=any_value)
    embedding: str = setting("model", "the vectors hkmi clusters (of the documents) and bmi averages (of each "
                                      "document's generated queries): model = embed_model | tfidf-svd = tf-idf of "
                                      "the texts reduced by TruncatedSVD (no neural model, so not the retriever's "
                                      "encoder)", effect="result",
                             rule=one_of("model", "tfidf-svd"), rule_help="hkmi's and bmi's vectors")
    svd_dim: int = setting(256, "embedding=tfidf-svd: SVD components (at most n_docs - 1 and the vocabulary - 1)",
                           effect="result", rule=POSITIVE, rule_help="SVD components of embedding=tfidf-svd")
    batch_size: int = setting(EMBED_BATCH, "texts per encoder batch", effect="result", rule=POSITIVE)
    n_init: int = same_setting(GCFitOptions, "n_init", "k-means runs a node (faiss nredo), each from its own random "
                                                       "centroids, the lowest inertia kept: as many as GC's runs at "
                                                       "its root (NCI keeps the best of 100 k-means++ runs)")
    max_iter: int = setting(25, "faiss niter", effect="result", rule=POSITIVE)
    spherical: bool = setting(False, effect="result", rule=boolean)


# BMI's document vector: the texts whose embeddings are averaged per document, named as BMI's preprocessing names
# its centroid files (``doc_emb.centroid.realq_genq_docseg.h5``, scripts/NQ320K/preprocess_NQ320K.ipynb)
BMI_INPUTS = ("genq", "genq_docseg", "realq_genq_docseg")


@dataclass
class IndexBMI:
    """``bmi``: what BMI's document vector averages (the k-means itself is ``kmeans``)."""

    inputs: str = setting("genq", "the texts each document's vector is the mean embedding of: genq = its generated "
                                  "queries (kmeans.doc_queries) | genq_docseg = and random segments of its text | "
                                  "realq_genq_docseg = and its real training queries too (BMI's own)",
                          effect="result", rule=one_of(*BMI_INPUTS), rule_help="bmi's document vector")
    real_queries: str | None = setting(None, "inputs=realq_*: jsonl {\"doc_id\", \"queries\": [...]} of real "
                                             "training queries (`gdr run`: its training split's), never a test query; "
                                             "a document without any keeps the other inputs",
                                       effect="result", rule=FILE, rule_help="jsonl of {doc_id, queries}")
    segments: int = setting(10, "inputs=*docseg: random segments a document, one more per 3,000 words beyond 3,000 "
                                "(BMI's 10 + max(0, n - 3000) // 3000)", effect="result", rule=POSITIVE,
                            rule_help="text segments per document")
    segment_words: int = setting(64, "inputs=*docseg: words a segment (BMI's 64 whitespace tokens)", effect="result",
                                 rule=POSITIVE, rule_help="words per text segment")


def bmi_keyed(bmi: dict) -> dict | None:
    """The values of a ``bmi`` section that decide BMI's vectors besides its input files: None for ``genq`` (the
    generated queries alone, which key the index by content), else ``inputs`` and the segments' shape;
    ``real_queries`` counts by its content, never its path."""
    if bmi["inputs"] == "genq":
        return None
    return {k: bmi[k] for k in ("inputs", "segments", "segment_words")}


@dataclass
class IndexAtomic:
    """``atomic``: one flat position per document."""

    warn_above: int = setting(100000, effect="result", rule=NON_NEGATIVE)
