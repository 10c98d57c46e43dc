"""Titles as queries: a known-item retrieval proxy for corpora that have titles but no queries.

Each document's title becomes a query whose one relevant document is that article, with the
title removed from what the retriever sees (``load_corpus(name, drop_title=True)`` or
:func:`drop_titles`). This is a proxy task, built here so that labelled corpora without query
sets (BBC News, Reuters R2/R5) can be scored end to end; it is not a benchmark of the field and
its numbers are not comparable with published retrieval results.

Splits are by document: a document's split ("train", "dev", "test") is a function of its id and
the seed only (blake2b of ``f"{seed}:{doc_id}"`` mapped to [0, 1) and cut at the cumulative
fractions), so subsampling a corpus (``n_docs=``) never moves a document to another split.

Ambiguous known items (measured on the real data; see :func:`title_queries`): a title shared by
several documents, its case, spacing and punctuation aside (BBC: 260 articles; R5: 314 stories),
a body shared by several documents (BBC: 133 bodies on 266 articles, mostly the same repeated
article) or a body that is another's with a word or a sentence changed (word 5-grams overlapping
by >= 90%: 3 more BBC pairs, e.g. "Federer claims Dubai crown" and "Dogged Federer claims Dubai
crown"; 12 more R5 stories) does not point at one document, and a twin's title trained on would
all but name a test article. By default such documents get no query (BBC keeps 1,891 of its
2,225 articles as queries, R5 6,461 of 6,807); they stay in the corpus as distractors.
Checked on the real files: no BBC or Reuters body starts with its
title (one R5 story, NEWID 5692, opens with a sentence that reads like its headline in lower
case; it is the lead sentence, not a repeated title, and is left as is).
"""
from __future__ import annotations

import dataclasses
import hashlib
import itertools
import logging
import re
from collections import Counter
from typing import Sequence

import numpy as np
from scipy import sparse

from gdr.data.core import Corpus, DataError, QuerySet
from gdr.logs import log_once

__all__ = ["title_queries", "drop_titles", "split_of", "unit_hash", "TITLE_SPLITS", "TITLE_FRACTIONS", "DUPLICATES"]

log = logging.getLogger(__name__)

TITLE_SPLITS = ("train", "dev", "test")
NEAR_SHINGLE_WORDS = 5  # words an n-gram of the near-duplicate test
NEAR_JACCARD = 0.9  # two texts whose word 5-grams overlap this much are one article: 3 BBC pairs, 7 in R5
_COMMON_NGRAM_DOCS = 64
_HASH_BASE = 1_000_003
_MIX = 0x9E3779B97F4A7C15
_WORD = re.compile(r"[^\W_]+")
_ALNUM = re.compile(r"[^\W_]")  # a letter or digit, of any script
# the train/dev/test shares of title queries, which have no split of their own, where queries.fractions is null
TITLE_FRACTIONS = (0.8, 0.1, 0.1)
DUPLICATES = ("drop", "keep")


def _check_fractions(fractions: Sequence[float]) -> np.ndarray:
    f = np.asarray(fractions, dtype=np.float64)
    if f.shape != (len(TITLE_SPLITS),) or (f < 0).any() or not np.isclose(f.sum(), 1.0):
        raise ValueError(f"fractions={tuple(fractions)}; give three non-negative numbers for "
                         f"{'/'.join(TITLE_SPLITS)} that sum to 1, e.g. (0.8, 0.1, 0.1)")
    return f


def unit_hash(doc_ids: Sequence[str], seed: int) -> np.ndarray:
    """blake2b of ``f"{seed}:{id}"`` as a number in [0, 1), of shape (n,): a document's or a topic's place in a
    seeded split that depends on its own id only."""
    digests = b"".join(hashlib.blake2b(f"{seed}:{d}".encode(), digest_size=8).digest() for d in doc_ids)
    # 53 high bits -> exact float64 in [0, 1)
    return (np.frombuffer(digests, dtype=">u8") >> np.uint64(11)).astype(np.float64) / float(1 << 53)


def split_of(doc_ids: Sequence[str], seed: int = 0, fractions: Sequence[float] = TITLE_FRACTIONS) -> list[str]:
    """The title-query split of each doc id, of length len(doc_ids); depends on the id and seed only."""
    f = _check_fractions(fractions)
    if len(doc_ids) == 0:
        return []
    cuts = np.cumsum(f)[:-1]  # (2,): train | dev | test
    which = np.searchsorted(cuts, unit_hash(doc_ids, seed), side="right")
    return np.asarray(TITLE_SPLITS, dtype=object)[which].tolist()


def _shared(values: Sequence[str | None]) -> np.ndarray:
    """Boolean mask of shape (n,): the value occurs more than once (None never counts)."""
    counts = Counter(v for v in values if v)
    return np.fromiter((bool(v) and counts[v] > 1 for v in values), dtype=bool, count=len(values))


def _title_key(title: str | None) -> str | None:
    """What a title says, its case, spacing and punctuation aside (R5's ``GENCORP <GY>`` and ``GENCORP<GY>``)."""
    return "".join(_ALNUM.findall(title.casefold())) or None if title else None


def _near_identical(texts: Sequence[str], n: int = NEAR_SHINGLE_WORDS,
                    threshold: float = NEAR_JACCARD) -> np.ndarray:
    """Boolean mask of shape (len(texts),): the text's word ``n``-grams (case folded) overlap another text's with a
    Jaccard index >= ``threshold``: the same article with a word or a sentence changed (BBC's ``sports/425`` and
    ``sports/433``, 0.96). A text of fewer than ``n`` words is left to the exact comparison.

    The n-grams are 64-bit polynomial hashes of word ids over all texts at once; an n-gram in more than
    :data:`_COMMON_NGRAM_DOCS` texts is boilerplate and counts in the sizes but not in the overlaps, so that the
    sparse product of texts by n-grams stays small on large corpora (it can only lower an index)."""
    vocab: dict[str, int] = {}
    words = [[vocab.setdefault(w, len(vocab)) for w in _WORD.findall(t.casefold())] for t in texts]  # once at load
    lengths = np.fromiter(map(len, words), dtype=np.int64, count=len(words))
    ids = np.fromiter((w for ws in words for w in ws), dtype=np.uint64, count=int(lengths.sum()))
    doc = np.repeat(np.arange(len(texts)), lengths)
    starts = np.arange(ids.size - n + 1) if ids.size >= n else np.arange(0)
    starts = starts[doc[starts] == doc[starts + n - 1]]  # n-grams inside one text
    h = np.zeros(starts.size, dtype=np.uint64)
    with np.errstate(over="ignore"):  # arithmetic modulo 2**64 is the hash
        for k in range(n):  # n steps of a polynomial hash over every n-gram at once
            h = h * np.uint64(_HASH_BASE) + ids[starts + k] + np.uint64(1)
    near = np.zeros(len(texts), dtype=bool)
    if h.size == 0:
        return near
    rows = doc[starts]
    with np.errstate(over="ignore"):  # each text's distinct n-grams: (text, hash) hashed once more
        first = np.unique(h ^ (rows.astype(np.uint64) * np.uint64(_MIX)), return_index=True)[1]
    rows, h = rows[first], h[first]
    cols = np.unique(h, return_inverse=True)[1].ravel()
    size = np.bincount(rows, minlength=len(texts))
    rare = np.bincount(cols)[cols] <= _COMMON_NGRAM_DOCS
    x = sparse.csr_matrix((np.ones(int(rare.sum()), dtype=np.float32), (rows[rare], cols[rare])),
                          shape=(len(texts), int(cols.max()) + 1))
    overlap = sparse.triu(x @ x.T, k=1).tocoo()
    a, b, shared = overlap.row, overlap.col, overlap.data
    hit = shared >= threshold * (size[a] + size[b] - shared)
    near[a[hit]] = near[b[hit]] = True
    return near


def title_queries(corpus: Corpus, seed: int = 0, fractions: Sequence[float] = TITLE_FRACTIONS,
                  duplicates: str = "drop") -> QuerySet:
    """One query per document with a title: the title is the text, the document the one relevant item.

    Parameters
    ----------
    corpus : a Corpus with titles (load it without ``drop_title``).
    seed : split seed; a document's split depends on its doc id and ``seed`` only (see :func:`split_of`).
    fractions : expected shares of train, dev, test; the realised counts are binomial around them.
    duplicates : ``"drop"`` (default) gives no query to a document whose title is another document's in
        ``corpus`` (case, spacing and punctuation aside), whose text is identical to another's, or whose
        text is near-identical to another's (:func:`_near_identical`), since neither the query nor the
        article would single it out, and a title trained on would all but name its twin's test article
        (counted in ``info["filtered"]["shared_title"]``, ``["shared_text"]`` and ``["near_text"]``;
        the documents stay in the corpus). ``"keep"`` keeps them: identical query texts then
        each name their own document as the only relevant one, and may fall in different splits.
        Which documents are dropped depends on the corpus passed (a subsample may lose a twin).

    Returns
    -------
    QuerySet named ``"<corpus>-titles"``: qid = doc id, text = title, relevant = [doc id],
    splits ``"train"``/``"dev"``/``"test"``, in corpus order. Documents without a title are
    counted in ``info["filtered"]["no_title"]``.
    """
    if duplicates not in DUPLICATES:
        raise ValueError(f"duplicates={duplicates!r}; use one of {DUPLICATES}")
    f = _check_fractions(fractions)
    if corpus.titles is None:
        raise DataError(f"corpus {corpus.name!r} has no titles, so it has no title queries; load it without "
                        "drop_title=True (titles are only dropped from what the retriever reads)")
    titles = [t.strip() if t else None for t in corpus.titles]
    has_title = np.fromiter((bool(t) for t in titles), dtype=bool, count=len(titles))
    keep = has_title.copy()
    filtered = {"no_title": int((~has_title).sum())}
    if duplicates == "drop":
        shared_title = _shared([_title_key(t) for t in titles]) & keep
        keep &= ~shared_title
        shared_text = _shared(corpus.texts) & keep
        keep &= ~shared_text
        near_text = _near_identical(corpus.texts) & keep
        keep &= ~near_text
        filtered.update(shared_title=int(shared_title.sum()), shared_text=int(shared_text.sum()),
                        near_text=int(near_text.sum()))
    if not keep.any():
        raise DataError(f"corpus {corpus.name!r}: no document has a title of its own; nothing to query")
    sub = corpus.select(keep)
    splits = split_of(sub.doc_ids, seed, f)
    qs = QuerySet(
        name=f"{corpus.name}-titles",
        qids=sub.doc_ids,
        texts=[t for t, k in zip(titles, keep) if k],
        relevant=[[d] for d in sub.doc_ids],
        splits=splits,
        info={"source": corpus.info.get("source", corpus.name), "task": "titles as queries (known-item proxy)",
              "seed": int(seed), "fractions": [float(x) for x in f], "duplicates": duplicates,
              "filtered": {k: v for k, v in filtered.items() if v}, "n_docs": len(corpus)},
    )
    log_once(log, logging.INFO, "%s: %d title queries (%s) from %d documents; left out %s", qs.name, len(qs),
             ", ".join(f"{s}={n}" for s, n in Counter(splits).items()), len(corpus), filtered)
    return qs


def drop_titles(corpus: Corpus) -> Corpus:
    """The same corpus with every title removed (``titles=None``), so ``model_inputs()`` is the text only.

    A body that opens with a copy of its own title loses that opening, so the title is gone from what a model
    reads: Cranfield repeats the title at the start of 1,397 of its 1,398 titled abstracts
    (:func:`_strip_repeated_titles`; the 1,398th, document 1369, repeats it with a typo, ``oseens's``, and keeps
    it). The count is ``info["repeated_titles_stripped"]``. A body that is its title and nothing more is kept
    whole. Checked on the real files: no BBC or Reuters body starts with its title in the same case (Reuters
    headlines are in capitals), so their texts are unchanged.
    """
    info = dict(corpus.info)
    info["titles_dropped"] = True
    texts = corpus.texts
    if corpus.titles is not None:
        texts, stripped = _strip_repeated_titles(corpus.titles, corpus.texts)
        if stripped:
            info["repeated_titles_stripped"] = stripped
    return dataclasses.replace(corpus, texts=texts, titles=None, info=info)


def _strip_repeated_titles(titles: Sequence[str | None], texts: Sequence[str]) -> tuple[list[str], int]:
    """(the texts with a leading copy of their title removed, how many were). A copy is the title's letters and
    digits in order and in the same case, the spacing or punctuation between them aside (Cranfield's ``3 .5`` in
    a title is ``3. 5`` in its abstract), ending at a word boundary; the punctuation after it goes too. A text
    that would be left empty stays as it was."""
    out, n = [], 0
    for title, text in zip(titles, texts):  # once at load: the title's letters against the text's first ones
        end = _repeat_end(_ALNUM.findall(title or ""), text)
        rest = text[_SEPARATORS.match(text, end).end():] if end else ""
        if rest:
            out.append(rest)
            n += 1
        else:
            out.append(text)
    return out, n


def _repeat_end(chars: list[str], text: str) -> int:
    """Where the copy of the letters and digits ``chars`` that opens ``text`` ends (0: it opens with none): the
    text's first ``len(chars)`` letters and digits are ``chars``, the first at position 0, and no letter or digit
    follows the last. It compares characters, compiling no pattern per document."""
    if not chars:
        return 0
    found = list(itertools.islice(_ALNUM.finditer(text), len(chars)))
    if len(found) < len(chars) or found[0].start() != 0 or any(m.group() != c for m, c in zip(found, chars)):
        return 0
    end = found[-1].end()
    return 0 if _ALNUM.match(text, end) else end


_SEPARATORS = re.compile(r"[\W_]*")  # the spacing and punctuation after a repeated title, removed with it
