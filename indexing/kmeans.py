"""Baseline indexers by hierarchical k-means (faiss) on embeddings, same K, c and driver as GC.

* HKmI (DSI, NCI): embeddings of the documents themselves, by a sentence encoder or by tf-idf reduced with a
  truncated SVD (:func:`tfidf_svd_embeddings`: no neural model, so not the retriever's own encoder).
* BMI (Du et al. 2024): each document is the mean embedding of its generated queries, and with
  ``bmi.inputs=realq_genq_docseg`` (BMI's own) of its real training queries and random segments of its text too
  (:func:`bmi_document_texts`, :func:`document_segments`).

Embeddings come from any ``embed_fn(texts) -> (n, d) float32`` (default
:func:`gdr.embed.embed_texts` with the bundled ``minilm-l6``), so tests inject a tiny one.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import faiss
import numpy as np

from gdr.embed import embed_texts
from gdr.indexing.options import IndexBMI, IndexKMeans, TreeOptions
from gdr.indexing.tree import IndexTree, SplitResult, build_tree, node_seed_sequence
from gdr.io import read_jsonl
from gdr.models import EMBED_MODEL

__all__ = [
    "EmbedFn",
    "default_embed_fn",
    "KMeansSplitter",
    "build_kmeans_index",
    "document_embeddings",
    "tfidf_svd_embeddings",
    "query_mean_embeddings",
    "bmi_document_texts",
    "document_segments",
    "read_doc_queries",
]

log = logging.getLogger(__name__)

EmbedFn = Callable[[Sequence[str]], np.ndarray]


def default_embed_fn(model: str = EMBED_MODEL, batch_size: int = IndexKMeans.batch_size) -> EmbedFn:
    return lambda texts: embed_texts(texts, model=model, batch_size=batch_size)


@dataclass
class KMeansSplitter:
    """faiss k-means on the rows' embeddings; seeded per node path.

    embeddings: (n_docs, d) float32. ``n_init`` = faiss ``nredo``, ``max_iter`` = ``niter``.
    Every point is used for training (no faiss subsampling) and no minimum cluster size is imposed.
    """

    embeddings: np.ndarray
    seed: int = 0
    n_init: int = IndexKMeans.n_init
    max_iter: int = IndexKMeans.max_iter
    spherical: bool = IndexKMeans.spherical

    def __call__(self, rows: np.ndarray, path: tuple[int, ...], n_children: int) -> SplitResult:
        x = np.ascontiguousarray(self.embeddings[rows], dtype=np.float32)   # (n, d)
        seed = int(node_seed_sequence(self.seed, path).generate_state(1)[0] & 0x7FFFFFFF)
        km = faiss.Kmeans(x.shape[1], n_children, niter=self.max_iter, nredo=self.n_init, seed=seed,
                          spherical=self.spherical, verbose=False, min_points_per_centroid=1,
                          max_points_per_centroid=1 << 30)
        km.train(x)
        _, assign = km.index.search(x, 1)
        centroids = km.centroids.copy()

        def finalize(labels: np.ndarray, kept: np.ndarray | None) -> dict:
            if kept is not None:
                return {"centroids": centroids[kept]}
            m = int(labels.max()) + 1
            sums = np.zeros((m, x.shape[1]))
            np.add.at(sums, labels, x)
            return {"centroids": (sums / np.bincount(labels, minlength=m)[:, None]).astype(np.float32)}

        return SplitResult(labels=assign[:, 0].astype(np.int64), finalize=finalize)


def build_kmeans_index(embeddings: np.ndarray, *, n_clusters: int = TreeOptions.n_clusters,
                       leaf_size: int = TreeOptions.leaf_size, seed: int = 0, n_init: int = IndexKMeans.n_init,
                       max_iter: int = IndexKMeans.max_iter, spherical: bool = IndexKMeans.spherical,
                       workers: int = TreeOptions.workers, progress: bool = True, method: str = "hkmi") -> IndexTree:
    """Hierarchical k-means codes for the rows of ``embeddings`` (n_docs, d)."""
    embeddings = np.asarray(embeddings)
    if embeddings.ndim != 2 or not len(embeddings):
        raise ValueError(f"embeddings must have shape (n_docs, dim) with n_docs >= 1; got {embeddings.shape}")
    if not np.isfinite(embeddings).all():
        i = int(np.flatnonzero(~np.isfinite(embeddings).all(axis=1))[0])
        raise ValueError(f"embedding of document row {i} is not finite; re-embed it")
    splitter = KMeansSplitter(np.ascontiguousarray(embeddings, dtype=np.float32), seed=seed, n_init=n_init,
                              max_iter=max_iter, spherical=spherical)
    tree = build_tree(len(embeddings), splitter, n_clusters, leaf_size, workers=workers, progress=progress,
                      desc=f"{method} index")
    tree.meta.update(method=method, seed=seed)
    return tree


def document_embeddings(texts: Sequence[str], embed_fn: EmbedFn) -> np.ndarray:
    """HKmI input: one embedding per document text, float32 of shape (n_docs, d)."""
    return np.ascontiguousarray(embed_fn(list(texts)), dtype=np.float32)


def tfidf_svd_embeddings(texts: Sequence[str], dim: int = IndexKMeans.svd_dim, seed: int = 0) -> np.ndarray:
    """HKmI input without a neural model: sublinear tf-idf of the texts, reduced to ``dim`` components by a
    truncated SVD (latent semantic analysis), L2-normalised rows; float32 of shape (n_docs, d), the same for the
    same texts, ``dim`` and ``seed`` (the SVD's random projections are seeded). ``d`` is ``dim`` capped at one
    less than the documents and than the vocabulary (TruncatedSVD's limit); a corpus of one document or one term
    gets its tf-idf rows as they are."""
    # optional: gdr[eval] (scikit-learn); only this embedding needs it
    from sklearn.decomposition import TruncatedSVD
    from sklearn.feature_extraction.text import TfidfVectorizer

    x = TfidfVectorizer(sublinear_tf=True, dtype=np.float32).fit_transform(list(texts))    # (n_docs, vocab) sparse
    d = min(int(dim), x.shape[0] - 1, x.shape[1] - 1)
    if d < 1:
        emb = x.toarray()
    else:
        emb = TruncatedSVD(n_components=d, algorithm="randomized", n_iter=7, random_state=seed).fit_transform(x)
    emb = emb / np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12)
    return np.ascontiguousarray(emb, dtype=np.float32)


def query_mean_embeddings(doc_ids: Sequence[str], doc_queries: Mapping[str, Sequence[str]], embed_fn: EmbedFn,
                          normalize: bool = True) -> np.ndarray:
    """BMI input: the mean embedding of each document's texts (:func:`bmi_document_texts`: its generated queries,
    and its real queries and text segments where BMI's vector holds them), float32 of shape (n_docs, d).

    All texts are embedded in one call; the per-document mean is a segment sum (``np.add.reduceat``), not a loop
    over documents.
    """
    missing = [d for d in doc_ids if not doc_queries.get(d)]
    if missing:
        raise ValueError(f"{len(missing)} document(s) have no text to average (first: {missing[0]!r}); BMI needs "
                         "at least one generated query per document: sample queries for them or drop them")
    counts = np.array([len(doc_queries[d]) for d in doc_ids], dtype=np.int64)
    flat = [q for d in doc_ids for q in doc_queries[d]]
    emb = np.asarray(embed_fn(flat), dtype=np.float64)                     # (sum counts, d)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    mean = np.add.reduceat(emb, starts, axis=0) / counts[:, None]           # (n_docs, d)
    if normalize:
        mean /= np.maximum(np.linalg.norm(mean, axis=1, keepdims=True), 1e-12)
    return mean.astype(np.float32)


# BMI's docseg: one segment more per this many words beyond it (``nsegs = 10 + max(0, len(tokens) - 3000) // 3000``)
SEGMENT_EXTRA_WORDS = 3000


def document_segments(doc_ids: Sequence[str], texts: Sequence[str], *, words: int = IndexBMI.segment_words,
                      per_doc: int = IndexBMI.segments, seed: int = 0) -> dict[str, list[str]]:
    """BMI's ``docseg``: per document, ``per_doc`` segments of ``words`` whitespace-separated words (one more per
    3,000 words beyond 3,000), each starting uniformly in ``[0, max(1, n - words))`` as BMI's ``get_seg``, so a text
    of at most ``words`` words gives itself ``per_doc`` times; a text without words gives none. The starts are drawn
    at once from one generator seeded by ``seed``: the same segments for the same texts and seed."""
    tokens = [t.split() for t in texts]
    n = np.fromiter(map(len, tokens), dtype=np.int64, count=len(tokens))
    count = np.where(n > 0, per_doc + np.maximum(n - SEGMENT_EXTRA_WORDS, 0) // SEGMENT_EXTRA_WORDS, 0)
    owner = np.repeat(np.arange(len(n)), count)
    starts = np.random.default_rng(seed).integers(0, np.maximum(n[owner] - words, 1))
    flat = [" ".join(tokens[o][s:s + words]) for o, s in zip(owner.tolist(), starts.tolist())]
    bounds = np.concatenate([[0], np.cumsum(count)]).tolist()
    return {d: flat[bounds[i]:bounds[i + 1]] for i, d in enumerate(doc_ids)}


def bmi_document_texts(doc_ids: Sequence[str], generated: Mapping[str, Sequence[str]],
                       real: Mapping[str, Sequence[str]] | None = None,
                       segments: Mapping[str, Sequence[str]] | None = None) -> dict[str, list[str]]:
    """The texts BMI averages per document, in the order of BMI's centroid (real training queries, generated
    queries, text segments: ``doc_emb.centroid.realq_genq_docseg``): ``real`` and ``segments`` where given (a
    document without real queries has its others). Every document needs a generated query, as in BMI."""
    missing = [d for d in doc_ids if not generated.get(d)]
    if missing:
        raise ValueError(f"{len(missing)} document(s) have no generated queries (first: {missing[0]!r}); BMI needs "
                         "at least one query per document: sample queries for them or drop them")
    real, segments = real or {}, segments or {}
    return {d: [*real.get(d, ()), *generated[d], *segments.get(d, ())] for d in doc_ids}


def read_doc_queries(path: str | os.PathLike) -> dict[str, list[str]]:
    """Read ``{"doc_id": ..., "queries": [...]}`` lines (repeated doc ids are merged)."""
    out: dict[str, list[str]] = {}
    for i, row in enumerate(read_jsonl(path), 1):
        if "doc_id" not in row or not isinstance(row.get("queries"), list):
            raise ValueError(f"{path}: record {i} needs a 'doc_id' and a list 'queries'; got keys {sorted(row)}")
        out.setdefault(str(row["doc_id"]), []).extend(str(q) for q in row["queries"])
    return out
