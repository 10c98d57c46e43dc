"""Training data for the retriever: (input text, target docid) pairs as token ids.

Sources, each switchable (NCI/BMI use all three):

- **real queries**: training queries with their relevant documents (one example per pair);
- **generated queries**: per-document queries from a jsonl ``{"doc_id": ..., "queries": [...]}``
  (written by ``gdr sample``);
- **document as query**: the first ``window`` tokens of each document, and ``doc_windows`` random
  ``window``-token windows per document (positions drawn from ``seed``).

A **dev split** for model selection is held out from the *training* queries (a seeded random
``dev_fraction``, at most ``dev_max`` queries), or given whole (``dev_queries``: a query set's own dev split, kept
apart from the training queries by the caller; then no training query is held out). When that leaves fewer than
``dev_min`` dev queries (a few held-out titles or queries cannot rank checkpoints: one query moves Recall@1 by several
points), generated queries are held out too, at most one per document, from a seeded random choice of documents,
until the dev split holds ``dev_min`` queries; they are removed from training (their documents keep their other
examples). Without real queries the dev split is held out from the generated ones, in the same way. Either way the
generated queries held out never exceed ``dev_max_share`` of them (10%), so a small corpus whose only
queries are generated (a query set with test judgements only) still trains on 90% of them. A warning names
a dev split larger than what is left to train on. The test split is never seen here.

Token ids are stored flat (``TokenStore``: one int32 array and offsets), not as Python lists, so a
corpus of 10^5 documents with several windows each stays small.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from gdr.indexing.trie import DocidTrie
from gdr.io import check_manifest_files, read_jsonl
from gdr.lm.prompts import special_wrap
from gdr.rerun import RerunCommand
from gdr.training.options import ExampleOptions, TrainerOptions

log = logging.getLogger(__name__)

__all__ = ["TokenStore", "RetrievalExamples", "build_examples", "dev_sizes", "read_generated_queries", "EpochSampler",
           "ResumeSampler", "resume_point", "RetrievalDataModule", "padded", "bucket_widths", "bucketed_order"]


@dataclass
class TokenStore:
    """Variable-length token id sequences: ``ids[offsets[i]:offsets[i + 1]]`` is sequence ``i``."""

    ids: np.ndarray  # int32 (total,)
    offsets: np.ndarray  # int64 (n + 1,)

    @classmethod
    def from_lists(cls, seqs: Sequence[Sequence[int]]) -> "TokenStore":
        lens = np.fromiter((len(s) for s in seqs), dtype=np.int64, count=len(seqs))
        offsets = np.zeros(len(seqs) + 1, dtype=np.int64)
        np.cumsum(lens, out=offsets[1:])
        ids = np.fromiter((t for s in seqs for t in s), dtype=np.int32, count=int(offsets[-1]))
        return cls(ids, offsets)

    @classmethod
    def concat(cls, stores: Sequence["TokenStore"]) -> "TokenStore":
        stores = [s for s in stores if len(s)]
        if not stores:
            return cls(np.zeros(0, np.int32), np.zeros(1, np.int64))
        ids = np.concatenate([s.ids for s in stores])
        lens = np.concatenate([np.diff(s.offsets) for s in stores])
        offsets = np.zeros(len(lens) + 1, dtype=np.int64)
        np.cumsum(lens, out=offsets[1:])
        return cls(ids, offsets)

    def take(self, idx: np.ndarray) -> "TokenStore":
        """Sequences ``idx`` (int array of shape (m,)), gathered without a Python loop."""
        idx = np.asarray(idx, dtype=np.int64)
        lens = self.offsets[idx + 1] - self.offsets[idx]
        offsets = np.zeros(len(idx) + 1, dtype=np.int64)
        np.cumsum(lens, out=offsets[1:])
        pos = np.repeat(self.offsets[idx] - offsets[:-1], lens) + np.arange(offsets[-1])
        return TokenStore(self.ids[pos], offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> np.ndarray:
        return self.ids[self.offsets[i]:self.offsets[i + 1]]


@dataclass
class RetrievalExamples:
    """Tokenised training and dev examples.

    train : encoder inputs of n_train examples; train_doc : int64 (n_train,) target document index
    dev : encoder inputs of n_dev queries; dev_rel : per dev query, the relevant document indices
    counts : examples per source (logged and written to the run's manifest)
    """

    train: TokenStore
    train_doc: np.ndarray
    dev: TokenStore
    dev_rel: list[np.ndarray]
    counts: dict[str, int | str] = field(default_factory=dict)


def read_generated_queries(path, doc_ids: Sequence[str]) -> tuple[list[str], np.ndarray]:
    """Read ``{"doc_id": ..., "queries": [...]}`` lines; returns (texts, doc indices).

    Lines for doc ids not in ``doc_ids`` are an error naming the line (a docids/corpus mismatch).
    """
    path = Path(path)
    check_manifest_files(path.parent, only=[path.name], name="doc_queries.manifest.json",
                         fix=RerunCommand("sample", path.parent, f"re-sample: delete {path} and "
                                          f"{path.parent / 'doc_queries.manifest.json'}, then run `{{}}`"))
    pos = {d: i for i, d in enumerate(doc_ids)}
    seen: dict[str, int] = {}
    texts, docs = [], []
    for lineno, row in enumerate(read_jsonl(path), 1):
        if "doc_id" not in row or "queries" not in row:
            raise ValueError(f"{path}: row {lineno} lacks `doc_id` or `queries`; expected "
                             '{"doc_id": ..., "queries": [...]}')
        d = str(row["doc_id"])
        if d not in pos:
            raise ValueError(f"{path}: row {lineno}: doc id {d!r} is not in the corpus/docids; "
                             "regenerate the queries for this corpus")
        if d in seen:
            redo = RerunCommand("sample", path.parent, f"delete {path} and run `{{}}`",
                                fallback="re-sample it with `gdr sample` and the settings that made it "
                                         "(sample.per_doc=...)")
            raise ValueError(f"{path}:{lineno}: doc id {d!r} is also on line {seen[d]}; each document has one line: "
                             f"{redo}")
        seen[d] = lineno
        qs = [q for q in row["queries"] if isinstance(q, str) and q.strip()]
        texts.extend(qs)
        docs.extend([pos[d]] * len(qs))
    return texts, np.asarray(docs, dtype=np.int64)


def _tokenize(tokenizer, texts: Sequence[str], max_len: int, chunk: int = 4096) -> TokenStore:
    stores = []
    for s in range(0, len(texts), chunk):
        enc = tokenizer(list(texts[s:s + chunk]), truncation=True, max_length=max_len, add_special_tokens=True)
        stores.append(TokenStore.from_lists(enc["input_ids"]))
    return TokenStore.concat(stores)


def _doc_windows(tokenizer, doc_texts: Sequence[str], window: int, n_windows: int, first: bool, max_doc_tokens: int,
                 rng: np.random.Generator, chunk: int = 2048) -> tuple[TokenStore, np.ndarray, np.ndarray]:
    """First-``window`` and random-window inputs per document; returns (store, doc index, is_first)."""
    pre, post = special_wrap(tokenizer)
    body = max(window - len(pre) - len(post), 1)
    seqs, docs, is_first = [], [], []
    for s in range(0, len(doc_texts), chunk):
        enc = tokenizer(list(doc_texts[s:s + chunk]), truncation=True, max_length=max_doc_tokens,
                        add_special_tokens=False)["input_ids"]
        lens = np.fromiter((len(e) for e in enc), dtype=np.int64, count=len(enc))
        # window starts, vectorised over documents: uniform in [0, len - body]
        starts = rng.integers(0, np.maximum(lens - body, 0)[:, None] + 1, size=(len(enc), max(n_windows, 1)))
        for j, ids in enumerate(enc):  # slicing token lists; no per-document arithmetic
            if first:
                seqs.append(pre + ids[:body] + post)
                docs.append(s + j)
                is_first.append(True)
            if n_windows and lens[j] > body:
                for st in starts[j, :n_windows]:
                    seqs.append(pre + ids[st:st + body] + post)
                    docs.append(s + j)
                    is_first.append(False)
    return TokenStore.from_lists(seqs), np.asarray(docs, dtype=np.int64), np.asarray(is_first, dtype=bool)


@dataclass
class _Gathered:
    """The examples gathered so far, source by source: training parts with their targets, the dev split
    (inputs and relevant document indices) and the per-source counts."""

    parts: list[TokenStore] = field(default_factory=list)
    targets: list[np.ndarray] = field(default_factory=list)
    dev: TokenStore = field(default_factory=lambda: TokenStore.concat([]))
    dev_rel: list[np.ndarray] = field(default_factory=list)
    counts: dict[str, int | str] = field(default_factory=dict)


def build_examples(
    tokenizer,
    n_docs: int,
    doc_texts: Sequence[str] | None = None,
    train_queries: Sequence[str] = (),
    train_rel: Sequence[Sequence[int]] = (),
    gen_queries: Sequence[str] = (),
    gen_docs: np.ndarray | Sequence[int] = (),
    use_real: bool = ExampleOptions.use_real,
    use_generated: bool = ExampleOptions.use_generated,
    doc_first: bool = ExampleOptions.doc_first,
    doc_windows: int = ExampleOptions.doc_windows,
    window: int = ExampleOptions.window,
    max_query_len: int = 64,
    max_doc_tokens: int = ExampleOptions.max_doc_tokens,
    dev_fraction: float = ExampleOptions.dev_fraction,
    dev_max: int = ExampleOptions.dev_max,
    dev_min: int = ExampleOptions.dev_min,
    dev_max_share: float = ExampleOptions.dev_max_share,
    generated_per_doc: int | None = None,
    seed: int = 0,
    dev_queries: Sequence[str] | None = None,
    dev_rel: Sequence[Sequence[int]] = (),
) -> RetrievalExamples:
    """Tokenise every source and hold out the dev split (see the module docstring).

    The sources are added in a fixed order (real queries, generated queries, document windows), all drawing
    from one generator seeded with ``seed``, so the same arguments give the same examples in the same order.

    Parameters
    ----------
    n_docs : number of documents (targets are indices in [0, n_docs))
    doc_texts : n_docs document texts (needed for document-as-query inputs)
    train_queries, train_rel : real training queries and their relevant document indices
    gen_queries, gen_docs : generated queries and the document each was generated from
    dev_min : with fewer real dev queries than this, held-out generated queries fill the dev split up to it
    dev_max_share : the generated queries held out for the dev split are at most this share of them (and at
        most one per document)
    generated_per_doc : use only the first N generated queries of each document (None = all)
    dev_queries, dev_rel : the dev split given whole (a query set's dev split) and its relevant document indices;
        None: held out from the training queries as above
    """
    rng = np.random.default_rng(seed)
    if len(train_queries) != len(train_rel):
        raise ValueError(f"{len(train_queries)} training queries but {len(train_rel)} relevance lists")
    if len(gen_queries) != len(gen_docs):
        raise ValueError(f"{len(gen_queries)} generated queries but {len(gen_docs)} document indices")
    got = _Gathered()
    real_q = list(train_queries) if use_real else []
    gen_q, gen_d = _generated_subset(gen_queries, gen_docs, use_generated, generated_per_doc)
    given = dev_queries is not None
    if given:
        _add_given_dev(got, tokenizer, list(dev_queries), dev_rel, n_docs, max_query_len)
    if len(real_q):  # with a given dev split no training query is held out
        _add_real_queries(got, tokenizer, real_q, train_rel, n_docs, max_query_len, 0.0 if given else dev_fraction,
                          dev_max, rng, dev_from=not given)
    if len(gen_q):
        want = _generated_dev_wanted(len(gen_q), bool(real_q) or given, len(got.dev_rel), dev_fraction, dev_max,
                                     dev_min)
        held = _add_generated_queries(got, tokenizer, gen_q, gen_d, n_docs, max_query_len, want, dev_max_share, rng)
        if 0 < held < want:
            log.info("dev split: %d held-out generated queries, not the %d asked for (train.examples.dev_min=%d): "
                     "at most one per document and %g of the %d generated queries (examples.dev_max_share)",
                     held, want, dev_min, dev_max_share, len(gen_q))
    if doc_texts is not None and (doc_first or doc_windows):
        if len(doc_texts) != n_docs:
            raise ValueError(f"{len(doc_texts)} document texts for {n_docs} documents")
        store, docs, is_first = _doc_windows(tokenizer, doc_texts, window, doc_windows, doc_first,
                                             max_doc_tokens, rng)
        _add_document_windows(got, store, docs, is_first, dev_fraction, dev_max, rng)
    return _assemble(got, n_docs)


def _generated_subset(gen_queries: Sequence[str], gen_docs, use_generated: bool,
                      generated_per_doc: int | None) -> tuple[list[str], np.ndarray]:
    """The generated queries used (none when switched off; the first ``generated_per_doc`` of each document)."""
    gen_q = list(gen_queries) if use_generated else []
    gen_d = np.asarray(gen_docs, dtype=np.int64) if use_generated else np.zeros(0, np.int64)
    if generated_per_doc is not None and len(gen_q):
        keep = np.flatnonzero(_rank_within(gen_d) < generated_per_doc)
        gen_q, gen_d = [gen_q[i] for i in keep], gen_d[keep]
    return gen_q, gen_d


def _relevant(texts: list[str], rel: Sequence[Sequence[int]], n_docs: int, what: str) -> list[np.ndarray]:
    """The relevant document indices of each query as arrays; an error naming the first without a valid one."""
    out = [np.asarray(r, dtype=np.int64) for r in rel]
    bad = [i for i, r in enumerate(out) if len(r) == 0 or r.min() < 0 or r.max() >= n_docs]
    if bad:
        raise ValueError(f"{what} query #{bad[0]} ({texts[bad[0]][:60]!r}) has no valid relevant document")
    return out


def _add_given_dev(got: _Gathered, tokenizer, dev_q: list[str], dev_rel: Sequence[Sequence[int]], n_docs: int,
                   max_query_len: int) -> None:
    """The dev split given whole (``dev_queries``): every one of its queries, none of them trained on."""
    if len(dev_q) != len(dev_rel):
        raise ValueError(f"{len(dev_q)} dev queries but {len(dev_rel)} relevance lists")
    got.dev_rel = _relevant(dev_q, dev_rel, n_docs, "dev")
    got.dev = _tokenize(tokenizer, dev_q, max_query_len)
    got.counts["dev_from"] = "dev_queries"


def _add_real_queries(got: _Gathered, tokenizer, real_q: list[str], train_rel: Sequence[Sequence[int]], n_docs: int,
                      max_query_len: int, dev_fraction: float, dev_max: int, rng: np.random.Generator,
                      dev_from: bool = True) -> None:
    """Hold out a seeded ``dev_fraction`` of the real queries; the rest give one example per relevant document.
    ``dev_from``: the dev split is the held-out queries (False: it was given whole, and ``dev_fraction`` is 0)."""
    rel = _relevant(real_q, train_rel, n_docs, "training")
    n_dev = _real_dev_size(len(real_q), dev_fraction, dev_max)
    perm = rng.permutation(len(real_q))
    dev_idx, tr_idx = np.sort(perm[:n_dev]), np.sort(perm[n_dev:])
    store = _tokenize(tokenizer, real_q, max_query_len)
    if dev_from:
        got.dev = store.take(dev_idx)
        got.dev_rel = [rel[i] for i in dev_idx]
    # one training example per (query, relevant document) pair
    n_rel = np.array([len(rel[i]) for i in tr_idx], dtype=np.int64)
    got.parts.append(store.take(np.repeat(tr_idx, n_rel)))
    got.targets.append(np.concatenate([rel[i] for i in tr_idx]) if len(tr_idx) else np.zeros(0, np.int64))
    got.counts["real_queries"] = int(n_rel.sum())
    if dev_from:
        got.counts["dev_from"] = "real_queries"


def dev_sizes(n_real: int, n_gen: int, n_gen_docs: int, dev_fraction: float, dev_max: int, dev_min: int,
              dev_max_share: float) -> tuple[int, int]:
    """(real queries, generated queries) :func:`build_examples` holds out for the dev split, given ``n_real`` real
    training queries and ``n_gen`` generated ones over ``n_gen_docs`` documents: the counts its seeded choice makes,
    without the choice (what ``gdr plan`` needs to count an epoch's examples)."""
    n_dev = _real_dev_size(n_real, dev_fraction, dev_max)
    want = _generated_dev_wanted(n_gen, n_real > 0, n_dev, dev_fraction, dev_max, dev_min)
    cap = _generated_dev_cap(n_gen, n_gen_docs, dev_max_share)
    return n_dev, min(want, cap) if want > 0 and cap > 0 else 0


def _real_dev_size(n_real: int, dev_fraction: float, dev_max: int) -> int:
    """The seeded ``dev_fraction`` of ``n_real`` real queries held out (none of a single query)."""
    return min(dev_max, int(round(dev_fraction * n_real))) if n_real > 1 else 0


def _generated_dev_cap(n_gen: int, n_gen_docs: int, dev_max_share: float) -> int:
    """At most ``dev_max_share`` of the generated queries, one per document, leaving one document out."""
    return min(int(dev_max_share * n_gen), n_gen_docs - 1)


def _generated_dev_wanted(n_gen: int, has_real: bool, n_dev: int, dev_fraction: float, dev_max: int,
                          dev_min: int) -> int:
    """How many generated queries the dev split asks for: its whole size without real queries, else what the
    real dev queries fall short of ``dev_min``."""
    if n_gen <= 1:
        return 0
    if not has_real:
        return min(dev_max, max(int(round(dev_fraction * n_gen)), dev_min))
    return max(dev_min - n_dev, 0)  # too few real dev queries: generated ones fill the dev split up


def _add_generated_queries(got: _Gathered, tokenizer, gen_q: list[str], gen_d: np.ndarray, n_docs: int,
                           max_query_len: int, want: int, dev_max_share: float, rng: np.random.Generator) -> int:
    """Train on the generated queries, less up to ``want`` held out for the dev split: one per document (of a
    seeded choice of documents), at most ``dev_max_share`` of them. Returns how many were held out."""
    if gen_d.min() < 0 or gen_d.max() >= n_docs:
        raise ValueError("a generated query points at a document index outside the corpus")
    store = _tokenize(tokenizer, gen_q, max_query_len)
    keep, dev_idx = np.arange(len(gen_q)), np.zeros(0, np.int64)
    first_of_doc = np.flatnonzero(_rank_within(gen_d) == 0)
    cap = _generated_dev_cap(len(gen_q), len(first_of_doc), dev_max_share)
    if want > 0 and cap > 0:
        dev_idx = np.sort(rng.permutation(first_of_doc)[:min(want, cap)])
        keep = np.setdiff1d(keep, dev_idx)
        got.dev = TokenStore.concat([got.dev, store.take(dev_idx)])
        got.dev_rel = got.dev_rel + [gen_d[i:i + 1] for i in dev_idx]
        had = got.counts.get("dev_from")
        got.counts["dev_from"] = f"{had}+generated_queries" if had else "generated_queries"
        got.counts["dev_generated"] = int(len(dev_idx))
    got.parts.append(store.take(keep) if len(keep) < len(gen_q) else store)
    got.targets.append(gen_d[keep])
    got.counts["generated_queries"] = int(len(keep))
    return len(dev_idx)


def _add_document_windows(got: _Gathered, store: TokenStore, docs: np.ndarray, is_first: np.ndarray,
                          dev_fraction: float, dev_max: int, rng: np.random.Generator) -> None:
    """Train on the document windows; with no query in the dev split, hold out random windows (or, without
    random windows, first windows: a memorisation check)."""
    if not len(got.dev_rel) and len(docs):
        pool = np.flatnonzero(~is_first) if (~is_first).any() else np.arange(len(docs))
        n_dev = min(dev_max, max(1, int(round(dev_fraction * len(pool)))))
        dev_idx = np.sort(rng.choice(pool, size=min(n_dev, len(pool)), replace=False))
        got.dev = store.take(dev_idx)
        got.dev_rel = [docs[i:i + 1] for i in dev_idx]
        if not (~is_first).any():
            log.warning("no queries and no random windows: the dev split repeats training inputs")
        else:
            mask = np.ones(len(docs), dtype=bool)
            mask[dev_idx] = False
            store, docs, is_first = store.take(np.flatnonzero(mask)), docs[mask], is_first[mask]
        got.counts["dev_from"] = "document_windows"
    got.parts.append(store)
    got.targets.append(docs)
    got.counts["doc_first"] = int(is_first.sum())
    got.counts["doc_windows"] = int((~is_first).sum())


def _assemble(got: _Gathered, n_docs: int) -> RetrievalExamples:
    """Concatenate the sources into the training examples; count and log them, warn of an outsized dev split."""
    train = TokenStore.concat(got.parts)
    train_doc = np.concatenate(got.targets) if got.targets else np.zeros(0, np.int64)
    if len(train) == 0:
        raise ValueError("no training examples: enable real queries, generated queries or document windows")
    counts = got.counts
    counts["train_examples"] = len(train)
    counts["dev_queries"] = len(got.dev)
    n_train_q = counts.get("real_queries", 0) + counts.get("generated_queries", 0)
    if counts.get("dev_from") != "document_windows" and len(got.dev) > n_train_q:
        log.warning("the dev split (%d queries) is larger than what is left to train on (%d queries): lower "
                    "train.examples.dev_fraction / dev_min, or add training queries", len(got.dev), n_train_q)
    counts["docs_without_example"] = int(n_docs - len(np.unique(train_doc)))
    log.info("training examples: %s", counts)
    return RetrievalExamples(train, train_doc, got.dev, got.dev_rel, counts)


def _rank_within(groups: np.ndarray) -> np.ndarray:
    """For each element, how many earlier elements share its group (0 for a group's first), vectorised."""
    g = np.asarray(groups, dtype=np.int64)
    order = np.argsort(g, kind="stable")
    sg = g[order]
    start = np.r_[0, np.flatnonzero(sg[1:] != sg[:-1]) + 1] if len(sg) else np.zeros(0, np.int64)
    first = np.repeat(start, np.diff(np.r_[start, len(sg)]))
    out = np.empty(len(g), dtype=np.int64)
    out[order] = np.arange(len(g)) - first
    return out


BUCKET_CHUNK = 64  # length bucketing sorts within windows of this many batches of the epoch's shuffled order


def bucket_widths(max_width: int, smallest: int = 8) -> np.ndarray:
    """The padded widths of length-bucketed batches: powers of two from ``smallest``, then ``max_width``."""
    widths = [w for w in (smallest << i for i in range(32)) if w < max_width]
    return np.asarray(widths + [max_width], dtype=np.int64)


def bucketed_order(order: np.ndarray, bucket: np.ndarray, batch_size: int, rng: np.random.Generator,
                   chunk: int = BUCKET_CHUNK) -> np.ndarray:
    """``order`` (an epoch's shuffled example indices) regrouped so that each batch of ``batch_size`` holds examples
    of one length bucket where it can: within each window of ``chunk`` batches the examples are sorted by
    ``bucket[i]`` (stably: a bucket keeps its shuffled order), then the full batches are shuffled by ``rng``. Every
    batch but the last stays full, so an epoch has ``ceil(n / batch_size)`` batches, a batch starts every
    ``batch_size`` examples (a resumed run skips whole batches), and the order depends on the seed alone."""
    n = len(order)
    window = batch_size * max(1, chunk)
    starts = np.arange(n) // window  # the window of each position
    grouped = order[np.lexsort((bucket[order], starts))]  # by window, then by bucket; lexsort is stable
    full = n // batch_size
    blocks = rng.permutation(full)
    head = grouped[:full * batch_size].reshape(full, batch_size)[blocks].ravel()
    return np.concatenate([head, grouped[full * batch_size:]])


class EpochSampler(Sampler[int]):
    """Shuffles with a permutation that depends only on (seed, epoch): a run resumed from a
    checkpoint sees the same order as an uninterrupted one (Lightning calls ``set_epoch``). With ``bucket`` (a
    length bucket per example) and ``batch_size``, batches are grouped by length (:func:`bucketed_order`)."""

    def __init__(self, n: int, seed: int = 0, shuffle: bool = True, bucket: np.ndarray | None = None,
                 batch_size: int = 1):
        self.n, self.seed, self.shuffle, self.epoch = n, seed, shuffle, 0
        self.bucket, self.batch_size = bucket, batch_size

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _order(self) -> np.ndarray:
        order = np.random.default_rng([self.seed, self.epoch]).permutation(self.n)
        if self.bucket is not None:
            order = bucketed_order(order, self.bucket, self.batch_size,
                                   np.random.default_rng([self.seed, self.epoch, 1]))
        return order

    def __iter__(self) -> Iterator[int]:
        if not self.shuffle:
            return iter(range(self.n))
        return iter(self._order().tolist())

    def __len__(self) -> int:
        return self.n


class ResumeSampler(EpochSampler):
    """:class:`EpochSampler` that, in the epoch a run was killed in, skips the ``skip`` examples it had
    already trained on, so a resumed run sees exactly the batches an uninterrupted one would. The
    length stays the full epoch: Lightning's loop, restored to the killed batch index, ends the epoch
    when the iterator is exhausted."""

    def __init__(self, n: int, seed: int = 0, resume_epoch: int = -1, skip: int = 0, bucket: np.ndarray | None = None,
                 batch_size: int = 1):
        super().__init__(n, seed, bucket=bucket, batch_size=batch_size)
        self.resume_epoch, self.skip = resume_epoch, skip

    def __iter__(self):
        order = self._order()
        if self.epoch == self.resume_epoch and self.skip:
            order = order[self.skip:]
            self.resume_epoch, self.skip = -1, 0
        return iter(order.tolist())


def resume_point(ckpt: Path, n_train: int, batch_size: int) -> tuple[int, int]:
    """(epoch, examples of that epoch already trained on) of a Lightning checkpoint."""
    state = torch.load(ckpt, map_location="cpu", weights_only=False, mmap=True)
    epoch, step = int(state.get("epoch", 0)), int(state.get("global_step", 0))
    per_epoch = math.ceil(n_train / batch_size)
    return epoch, max(0, step - epoch * per_epoch) * batch_size


class _Examples(Dataset):
    def __init__(self, store: TokenStore, targets: np.ndarray | list[np.ndarray]):
        self.store, self.targets = store, targets

    def __len__(self) -> int:
        return len(self.store)

    def __getitem__(self, i: int):
        return self.store[i], self.targets[i]


def padded(store: TokenStore, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every sequence of ``store`` in one int32 tensor of shape (n, S_max), ``pad_id`` after its end, and
    the lengths (n,) int64: built once, without a Python loop over sequences."""
    lens = np.diff(store.offsets)
    n, width = len(lens), int(lens.max()) if len(lens) else 0
    dense = np.full((n, width), pad_id, dtype=np.int32)
    rows = np.repeat(np.arange(n), lens)
    cols = np.arange(len(store.ids)) - np.repeat(store.offsets[:-1], lens)
    dense[rows, cols] = store.ids
    return torch.from_numpy(dense), torch.from_numpy(lens.astype(np.int64))


class _TrainTensors(Dataset):
    """Training examples pre-tokenised into tensors: a batch is one gather, not a per-example collate.

    The DataLoader's fetcher calls ``__getitems__`` with the sampler's indices of a whole batch;
    the batch is trimmed to its longest input, exactly what padding each example one by one gave, or with
    ``widths`` (sorted) padded to the smallest of them that holds it: a few fixed shapes, which a compiled step
    traces once each.
    """

    def __init__(self, ids: torch.Tensor, lens: torch.Tensor, labels: torch.Tensor, widths: np.ndarray | None = None):
        self.ids, self.lens, self.labels = ids, lens, labels  # (n, S) int32, (n,), (n, L + 1)
        self.widths = widths

    def __len__(self) -> int:
        return len(self.lens)

    def __getitem__(self, i: int):
        return self.__getitems__([i])

    def __getitems__(self, idx: list[int]) -> dict[str, torch.Tensor]:
        idx_t = torch.as_tensor(idx, dtype=torch.long)
        lens = self.lens[idx_t]  # (B,)
        width = int(lens.max())  # host tensors: no device sync
        if self.widths is not None:
            width = int(self.widths[np.searchsorted(self.widths, width)])
        ids = self.ids[idx_t, :width].long()  # (B, S)
        mask = (torch.arange(width)[None, :] < lens[:, None]).long()  # (B, S)
        return {"input_ids": ids, "attention_mask": mask, "labels": self.labels[idx_t]}


def _first(batch):
    """collate_fn of :class:`_TrainTensors`: ``__getitems__`` already returned the batch."""
    return batch


def pad_batch(seqs: Sequence[np.ndarray], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    n = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), n), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), n), dtype=torch.long)
    for i, s in enumerate(seqs):  # batch assembly (collate), not a hot numeric path
        ids[i, : len(s)] = torch.from_numpy(s.astype(np.int64))
        mask[i, : len(s)] = 1
    return ids, mask


class RetrievalDataModule(pl.LightningDataModule):
    """Batches for training (queries -> slot labels) and validation (queries -> relevant terminal nodes).

    Training batch: ``input_ids``, ``attention_mask`` (B, S) and ``labels`` (B, L + 1) slot indices
    (digit, K = EOS, -100 padding). Validation batch: ``input_ids``, ``attention_mask`` and
    ``rel_nodes`` (B, R) terminal trie nodes of the relevant documents (-1 padding).
    """

    def __init__(self, examples: RetrievalExamples, trie: DocidTrie, pad_token_id: int,
                 batch_size: int = TrainerOptions.batch_size, eval_batch_size: int = TrainerOptions.eval_batch_size,
                 num_workers: int = TrainerOptions.num_workers, seed: int = 0, pin_memory: bool = False,
                 length_buckets: bool = TrainerOptions.length_buckets, fixed_shapes: bool = False):
        super().__init__()
        # length_buckets: batches grouped by input length (bucket_widths, bucketed_order); fixed_shapes: each batch
        # padded to its bucket's width (the longest input's without buckets), so a compiled step sees few shapes
        self.length_buckets, self.fixed_shapes = length_buckets, fixed_shapes
        self.examples, self.trie = examples, trie
        self.pad_token_id = pad_token_id
        self.batch_size, self.eval_batch_size = batch_size, eval_batch_size
        self.num_workers, self.seed, self.pin_memory = num_workers, seed, pin_memory
        self.resume_epoch, self.resume_skip = -1, 0  # set by train() when it resumes a killed run mid-epoch
        seq = trie.slot_sequences()
        self.labels = torch.from_numpy(np.where(seq < 0, -100, seq))  # (n_docs, L + 1)
        self.doc_node = torch.from_numpy(trie.doc_node)
        self._train: _TrainTensors | None = None
        self._bucket: np.ndarray | None = None

    def _collate_dev(self, batch):
        seqs, rels = zip(*batch)
        ids, mask = pad_batch(seqs, self.pad_token_id)
        R = max(len(r) for r in rels)
        rel = torch.full((len(rels), R), -1, dtype=torch.long)
        for i, r in enumerate(rels):
            rel[i, : len(r)] = self.doc_node[torch.as_tensor(r)]
        return {"input_ids": ids, "attention_mask": mask, "rel_nodes": rel}

    def train_dataloader(self) -> DataLoader:
        if self._train is None:  # tokens -> tensors once, not per epoch
            ids, lens = padded(self.examples.train, self.pad_token_id)
            widths = bucket_widths(ids.shape[1]) if self.length_buckets else np.asarray([ids.shape[1]])
            self._bucket = np.searchsorted(widths, lens.numpy()) if self.length_buckets else None
            self._train = _TrainTensors(ids, lens, self.labels[torch.from_numpy(self.examples.train_doc)],
                                        widths=widths if self.fixed_shapes else None)
        ds = self._train
        sampler = ResumeSampler(len(ds), self.seed, self.resume_epoch, self.resume_skip, bucket=self._bucket,
                                batch_size=self.batch_size)
        return DataLoader(ds, batch_size=self.batch_size, sampler=sampler, collate_fn=_first,
                          num_workers=self.num_workers, persistent_workers=self.num_workers > 0, drop_last=False,
                          pin_memory=self.pin_memory)

    def val_dataloader(self) -> DataLoader | list:
        if len(self.examples.dev) == 0:
            return []
        ds = _Examples(self.examples.dev, self.examples.dev_rel)
        return DataLoader(ds, batch_size=self.eval_batch_size, shuffle=False, collate_fn=self._collate_dev,
                          num_workers=self.num_workers, persistent_workers=self.num_workers > 0)
