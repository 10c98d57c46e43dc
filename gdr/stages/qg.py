"""Stage ``qg`` (``gdr qg``): the (document, query) pairs a query generator is fine-tuned on; the fine-tuning
itself is :func:`gdr.training.qg.fine_tune_qg`."""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Sequence

import numpy as np

from gdr.data import corpus_from_config, load_corpus, load_queries
from gdr.data.titles import drop_titles, title_queries
from gdr.stages.command_keys import QGQueries, QGSection
from gdr.training.qg import QGPairs

log = logging.getLogger(__name__)


def _exclude_ids(names) -> set[str]:
    ids: set[str] = set()
    for name in names or ():
        ids.update(load_corpus(name).doc_ids)
    return ids


def _title_pairs(seed: int, corpus, excluded: set[str], fractions: tuple, split: str):
    """(document without its title, its title) pairs of the documents of ``corpus`` (loaded with its titles) with
    a title of their own (:func:`gdr.data.titles.title_queries`) in the ``split`` of a seeded split by document
    id, none of ``excluded``."""
    qs = title_queries(corpus, seed=int(seed), fractions=fractions)
    texts = dict(zip(corpus.doc_ids, drop_titles(corpus).model_inputs()))
    keep = [i for i, (d, s) in enumerate(zip(qs.qids, qs.splits)) if d not in excluded and s == split]
    return QGPairs([texts[qs.qids[i]] for i in keep], [qs.texts[i] for i in keep], [qs.qids[i] for i in keep])


def _query_pairs(q: QGQueries, data_name: str, corpus):
    qs = load_queries(q.name or data_name, **({"path": q.path} if q.path else {}))  # name null: the corpus's own
    split = q.split
    if split not in qs.split_names:
        raise SystemExit(f"queries.split={split}: query set {qs.name} has splits {qs.split_names}")
    qs = qs.filter(split)
    texts = dict(zip(corpus.doc_ids, corpus.model_inputs()))
    docs, queries, ids = [], [], []
    for text, rel in zip(qs.texts, qs.relevant):  # pair assembly, once
        for d in rel:
            if d in texts:
                docs.append(texts[d]), queries.append(text), ids.append(d)
    return QGPairs(docs, queries, ids)


def read_pairs_jsonl(path: str, corpus=None, load_corpus=None):
    """Pairs from a jsonl file: ``{"doc": ..., "query": ...}`` or ``{"doc_id": ..., "query": ...}``.

    ``doc_id`` lines look the text up in ``corpus``, or in ``load_corpus()``, called at the first such line."""
    texts = None
    docs, queries, ids = [], [], []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not JSON ({e.msg}); one object per line") from None
            query = rec.get("query") if isinstance(rec, dict) else None
            if not isinstance(query, str) or not query.strip():
                raise ValueError(f"{path}:{n}: needs a non-empty string \"query\"")
            if isinstance(rec.get("doc"), str) and rec["doc"].strip():
                doc, did = rec["doc"], str(rec.get("doc_id", f"{Path(path).name}:{n}"))
            elif "doc_id" in rec and (corpus is not None or load_corpus is not None):
                if texts is None:
                    corpus = corpus if corpus is not None else load_corpus()
                    texts = dict(zip(corpus.doc_ids, corpus.model_inputs()))
                did = str(rec["doc_id"])
                if did not in texts:
                    raise ValueError(f"{path}:{n}: doc_id {did!r} is not in the corpus "
                                     f"{getattr(corpus, 'name', '')!r}; "
                                     "give the text as \"doc\" or pick the corpus with data=...")
                doc = texts[did]
            else:
                raise ValueError(f"{path}:{n}: needs \"doc\" (the text), or \"doc_id\" of a document of the corpus "
                                 "given as data=...")
            docs.append(doc), queries.append(query.strip()), ids.append(did)
    return QGPairs(docs, queries, ids)


def build_pairs(qg: QGSection, data: dict, queries: QGQueries | None = None, seed: int = 0):
    """The training pairs of the ``qg:`` settings and a summary of where they came from.

    ``qg``: ``pairs`` (titles | queries | a jsonl path), ``exclude``, ``lowercase``, ``max_pairs``; ``data``: the
    corpus's ``data:`` settings; ``queries``: the query set of ``pairs=queries`` (None: the corpus's own train
    split)."""
    def load_data():
        return corpus_from_config(data)

    src = str(qg.pairs)
    excluded = _exclude_ids(qg.exclude)
    if src == "titles":
        if data.get("drop_title"):  # absent from the data options of corpora without titles (conf/data/beir.yaml)
            raise SystemExit("data.drop_title=true: qg.pairs=titles needs the titles; leave data.drop_title false")
        pairs = _title_pairs(seed, load_data(), excluded, (1.0, 0.0, 0.0), "train")  # every title
    elif src == "queries":
        pairs = _query_pairs(queries or QGQueries(), data["name"], load_data())
    else:
        pairs = read_pairs_jsonl(src, load_corpus=load_data)
    n_all = len(pairs)
    if excluded and src != "titles":
        keep = np.flatnonzero([d not in excluded for d in pairs.doc_ids])
        pairs = pairs.take(keep)
    if qg.lowercase:
        pairs.queries = [q.lower() for q in pairs.queries]
    if qg.max_pairs and len(pairs) > qg.max_pairs:
        rng = np.random.default_rng(int(seed))
        pairs = pairs.take(np.sort(rng.choice(len(pairs), int(qg.max_pairs), replace=False)))
    info = {"source": src, "data": data["name"], "excluded_corpora": list(qg.exclude),
            "excluded_docs": len(excluded), "pairs_before_sampling": n_all, "pairs": len(pairs),
            "documents": len(set(pairs.doc_ids)),
            "mean_query_words": float(np.mean([len(q.split()) for q in pairs.queries])) if len(pairs) else 0.0}
    if excluded:
        leak = sum(d in excluded for d in pairs.doc_ids)
        if leak:
            raise RuntimeError(f"{leak} pairs of excluded documents survived; this is a bug")
    return pairs, info


def run_pairs(corpus, train, held_out: Sequence, split: str) -> QGPairs:
    """The query generator's training pairs of a ``gdr run``: one per (query of ``train`` in the split ``split``,
    relevant document of ``corpus``), the document as the LM reads it (``corpus.model_inputs()``).

    ``train``: the run's training split (a :class:`gdr.data.QuerySet`, or None: no pairs); ``held_out``: the run's
    other splits (dev, test; None for one it lacks). A query of another split, a query id or text of a held-out
    split, or a held-out (query, document) pairing is dropped, so no dev or test query nor its document's pairing
    ever reaches the pairs; :func:`check_run_pairs` then checks what is left."""
    if train is None or len(train) == 0:
        return QGPairs([], [], [])
    held = [h for h in held_out if h is not None]
    bad_ids = {q for h in held for q in h.qids}
    bad_texts = {t.strip().lower() for h in held for t in h.texts}
    in_split = np.asarray(train.splits, dtype=object) == split
    keep = in_split & ~np.isin(np.asarray(train.qids, dtype=object), list(bad_ids))
    keep &= ~np.isin(np.asarray([t.strip().lower() for t in train.texts], dtype=object), list(bad_texts))
    texts = dict(zip(corpus.doc_ids, corpus.model_inputs()))
    docs, queries, ids = [], [], []
    for i in np.flatnonzero(keep):  # pair assembly, once per (query, relevant document)
        for d in train.relevant[i]:
            if d in texts:
                docs.append(texts[d]), queries.append(train.texts[i]), ids.append(d)
    pairs = QGPairs(docs, queries, ids)
    dropped = int(in_split.sum() - keep.sum())
    if dropped:
        log.warning("qg: %d queries of the training input are dev or test queries (by id or text) and were left "
                    "out of the generator's pairs", dropped)
    check_run_pairs(pairs, train.select(in_split & keep), held)
    return pairs


def run_title_pairs(corpus, held_fraction: float, seed: int, queries: Sequence) -> tuple[QGPairs, QGPairs]:
    """The query generator's pairs of a ``gdr run`` with ``qg.pairs=titles``: (training pairs, held-out pairs), each
    a (document, its own title) pair, the document as the run's LM reads it (without its title,
    :func:`gdr.data.titles.drop_titles`). ``corpus``: the run's corpus loaded WITH its titles; the titles of a
    seeded ``held_fraction`` of its documents (a hash of the doc id with ``seed``) are held out, for the report's
    held-out loss; ``queries``: the run's query sets (QuerySets or None), whose texts no pair may hold
    (:func:`check_title_pairs`)."""
    if corpus.titles is None:
        raise ValueError(f"qg.pairs=titles: corpus {corpus.name!r} has no titles to fine-tune the generator on; set "
                         "qg.pairs=queries, or give the documents a title (data.title_field of a jsonl/tsv file)")
    fractions = (1.0 - float(held_fraction), float(held_fraction), 0.0)
    train = _title_pairs(seed, corpus, set(), fractions, "train")
    held = _title_pairs(seed, corpus, set(), fractions, "dev")
    texts = list({t.strip().lower() for q in queries if q is not None for t in q.texts})
    same = np.isin(np.asarray([t.strip().lower() for t in train.queries], dtype=object), texts)
    if same.any():  # a title that reads exactly as a query of the run: left out, as run_pairs leaves out queries
        log.warning("qg: %d titles read exactly as a query of the run and were left out of the generator's pairs",
                    int(same.sum()))
        train = train.take(np.flatnonzero(~same))
    check_title_pairs(train, held, queries)
    return train, held


def check_title_pairs(pairs: QGPairs, held: QGPairs, queries: Sequence) -> None:
    """Raise ``ValueError`` when a training pair is a held-out document's, or its query text (a title) is the text of
    a query of the run (``queries``: QuerySets or None), compared as :func:`run_pairs` compares them."""
    held_docs = set(held.doc_ids)
    leaked = [d for d in pairs.doc_ids if d in held_docs]
    if leaked:
        raise ValueError(f"qg: {len(leaked)} generator training pairs are of held-out documents, e.g. {leaked[0]}; the "
                         "report's held-out loss would be measured on titles trained on")
    texts = {t.strip().lower() for q in queries if q is not None for t in q.texts}
    hit = [(q, d) for q, d in zip(pairs.queries, pairs.doc_ids) if q.strip().lower() in texts]
    if hit:
        q, d = hit[0]
        raise ValueError(f"qg: {len(hit)} generator training pairs hold the text of a query of the run, e.g. {q!r} -> "
                         f"{d}; qg.pairs=titles trains on no query of the run")


def check_run_pairs(pairs: QGPairs, train, held_out: Sequence) -> None:
    """Raise ``ValueError`` unless every pair is a (query, document) judged in the training split ``train`` and no
    pair's query or (query, document) pairing is one of a held-out split (``held_out``: QuerySets of dev, test)."""
    allowed = {(t, d) for t, rel in zip(train.texts, train.relevant) for d in rel} if train is not None else set()
    outside = [(q, d) for q, d in zip(pairs.queries, pairs.doc_ids) if (q, d) not in allowed]
    if outside:
        q, d = outside[0]
        raise ValueError(f"qg: {len(outside)} generator training pairs are not (query, document) pairs of the "
                         f"training split, e.g. {q!r} -> {d}; the generator trains on the training split only")
    held_texts = {t.strip().lower() for h in held_out if h is not None for t in h.texts}
    held_pairs = {(t, d) for h in held_out if h is not None for t, rel in zip(h.texts, h.relevant) for d in rel}
    leaked = [(q, d) for q, d in zip(pairs.queries, pairs.doc_ids)
              if q.strip().lower() in held_texts or (q, d) in held_pairs]
    if leaked:
        q, d = leaked[0]
        raise ValueError(f"qg: {len(leaked)} generator training pairs hold a dev or test query or its pairing, e.g. "
                         f"{q!r} -> {d}; this is a leak of held-out queries into the generator")
