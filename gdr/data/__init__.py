"""The gdr data layer: corpora and query sets, each loader parsing its raw files itself.

>>> from gdr.data import load_corpus, load_queries
>>> corpus = load_corpus("r5")                       # doctest: +SKIP
>>> qs = load_queries("cranfield", split="test")     # doctest: +SKIP
>>> titles = load_title_queries("bbc", split="test")  # doctest: +SKIP
>>> articles = load_corpus("bbc", drop_title=True)   # doctest: +SKIP

Names: ``bbc``, ``r2``, ``r5``, ``reuters`` (every story with a body, unlabelled), ``cranfield``,
``msmarco-lite``, ``nq320k``, ``beir`` (the latter needs ``path=``; a path to a BEIR folder also works
as the name). Default paths
live under :func:`data_dir` (``$GDR_DATA_DIR`` or ``<repo>/../shared/data``).

Queries: :func:`load_queries` reads the query sets that ship with a collection
(``QUERY_SETS``); :func:`load_title_queries` builds title queries for the titled corpora
without one (``TITLE_CORPORA``: bbc, r2, r5, reuters), a known-item proxy task (``gdr.data.titles``).
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

from gdr.data.bbc import load_bbc
from gdr.data.beir import load_beir, load_beir_queries, write_beir
from gdr.data.core import Corpus, DataError, QuerySet, data_dir
from gdr.data.cranfield import load_cranfield, load_cranfield_queries
from gdr.data.msmarco import load_msmarco_lite, load_msmarco_lite_queries
from gdr.data.nq320k import load_nq320k, load_nq320k_queries
from gdr.data.reuters import R2_TOPICS, R5_TOPICS, load_reuters
from gdr.data.titles import drop_titles, title_queries

__all__ = [
    "Corpus",
    "QuerySet",
    "DataError",
    "CORPORA",
    "QUERY_SETS",
    "TITLE_CORPORA",
    "data_dir",
    "load_corpus",
    "load_queries",
    "load_title_queries",
    "title_queries",
    "drop_titles",
    "load_bbc",
    "load_reuters",
    "load_cranfield",
    "load_cranfield_queries",
    "load_beir",
    "load_beir_queries",
    "write_beir",
    "load_msmarco_lite",
    "load_msmarco_lite_queries",
    "load_nq320k",
    "load_nq320k_queries",
    "R2_TOPICS",
    "R5_TOPICS",
]

log = logging.getLogger(__name__)

CORPORA = ("bbc", "r2", "r5", "reuters", "cranfield", "msmarco-lite", "nq320k", "beir")
QUERY_SETS = ("cranfield", "msmarco-lite", "nq320k", "beir")
TITLE_CORPORA = ("bbc", "r2", "r5", "reuters")


def _resolve(name: str, path: str | os.PathLike | None) -> tuple[str, str | os.PathLike | None]:
    """A path given as the name means a BEIR folder."""
    if name not in CORPORA and (Path(name) / "corpus.jsonl").is_file():
        return "beir", name
    if name not in CORPORA:
        raise ValueError(f"unknown corpus {name!r}; choose one of {', '.join(CORPORA)} "
                         "(or pass the path of a BEIR folder)")
    return name, path


def load_corpus(
    name: str,
    *,
    path: str | os.PathLike | None = None,
    docs_tsv: str | os.PathLike | None = None,
    split: str | None = None,
    n_docs: int | None = None,
    seed: int = 0,
    on_empty: str | None = None,
    drop_title: bool = False,
) -> Corpus:
    """Load a corpus by name, optionally subsampled.

    Parameters
    ----------
    name : one of ``CORPORA`` (or a BEIR folder path).
    path : data folder (default under :func:`data_dir`; the package's copy for ``bbc``; required for ``beir``).
    docs_tsv : the document TSV for ``msmarco-lite`` (MS MARCO v1 ``msmarco-docs.tsv``) or ``nq320k``.
    split : Reuters only: keep stories of that LEWISSPLIT (``"train"``, ``"test"``); other corpora have
        no document splits (``split`` belongs to :func:`load_queries`) and refuse it.
    n_docs, seed : keep ``n_docs`` documents drawn uniformly with ``seed`` (:meth:`Corpus.sample`); None = all.
    on_empty : what an empty document does (``"error"``, ``"drop"``, ``"keep"``, ``"title"``); default per corpus.
    drop_title : remove every title (``titles=None``), so ``model_inputs()`` is the article only: the corpus
        side of title queries (:func:`load_title_queries`). Texts are not edited; BBC and Reuters bodies
        never start with their title, Cranfield abstracts do and keep it.
    """
    from gdr.validate import check_arguments

    check_arguments("load_corpus", n_docs=n_docs, seed=seed)
    name, path = _resolve(name, path)
    if split is not None and name not in ("r2", "r5", "reuters"):
        raise ValueError(f"corpus {name!r} has no document splits; split= selects queries in load_queries()")
    if docs_tsv is not None and name not in ("msmarco-lite", "nq320k"):
        raise ValueError(f"docs_tsv= applies to msmarco-lite and nq320k, not {name!r}")
    kw = {} if on_empty is None else {"on_empty": on_empty}
    if name in ("r2", "r5", "reuters"):
        if on_empty is not None:
            raise ValueError("on_empty= does not apply to Reuters (stories without a body are always filtered)")
        topics = {"r2": R2_TOPICS, "r5": R5_TOPICS, "reuters": None}[name]
        corpus = load_reuters(path, topics=topics, split=split, name=name)
    elif name == "bbc":
        if on_empty is not None:
            raise ValueError("on_empty= does not apply to BBC News")
        corpus = load_bbc(path)
    elif name == "cranfield":
        corpus = load_cranfield(path, **kw)
    elif name == "msmarco-lite":
        corpus = load_msmarco_lite(path, docs_tsv=docs_tsv, **kw)
    elif name == "nq320k":
        corpus = load_nq320k(path, docs_tsv=docs_tsv, **kw)
    else:
        corpus = load_beir(path, **kw)
    if drop_title:
        corpus = drop_titles(corpus)
    return corpus.sample(n_docs, seed)


def load_queries(
    name: str,
    split: str | None = None,
    *,
    path: str | os.PathLike | None = None,
    docs_tsv: str | os.PathLike | None = None,
) -> QuerySet:
    """Load the query set of a corpus; ``split=None`` gives every split that exists.

    Relevant doc ids are checked against the corpus's id list (read from the raw files,
    or from ``docs_tsv`` for ``nq320k``). Reuters and BBC have labels, not queries; their title
    queries come from :func:`load_title_queries`.
    """
    name, path = _resolve(name, path)
    if name not in QUERY_SETS:
        hint = f"; load_title_queries({name!r}) gives its title queries" if name in TITLE_CORPORA else ""
        raise ValueError(f"{name!r} has no query set (it is evaluated by its labels{hint}); "
                         f"query sets: {', '.join(QUERY_SETS)}")
    if name == "cranfield":
        qs = load_cranfield_queries(path)
        return qs.filter(split)
    if name == "msmarco-lite":
        return load_msmarco_lite_queries(path, split=split)
    if name == "nq320k":
        from gdr.data.nq320k import _doc_ids, nq320k_docs_file

        doc_ids = _doc_ids(nq320k_docs_file(path, docs_tsv)) if docs_tsv is not None else None
        return load_nq320k_queries(path, split=split, doc_ids=doc_ids)
    return load_beir_queries(path, split=split)


def load_title_queries(
    name: str,
    split: str | None = None,
    *,
    path: str | os.PathLike | None = None,
    seed: int = 0,
    fractions: tuple[float, float, float] = (0.8, 0.1, 0.1),
) -> QuerySet:
    """Title queries of the whole corpus ``name`` (one of ``TITLE_CORPORA``), optionally one split.

    Each article's title is the query and the article its one relevant document; the split of a
    document depends on its doc id and ``seed`` only (80/10/10 expected), so the queries of the
    documents in ``load_corpus(name, n_docs=...)`` keep their split. Documents whose title or text
    is shared with another document get no query. A proxy task: see :mod:`gdr.data.titles`.
    Pair it with ``load_corpus(name, drop_title=True)`` so the retriever never reads the titles.

    Parameters
    ----------
    name : ``"bbc"``, ``"r2"``, ``"r5"`` or ``"reuters"``.
    split : ``"train"``, ``"dev"``, ``"test"``, or None for all three.
    path : the corpus folder, as in :func:`load_corpus`.
    seed : the split seed (not the ``n_docs`` sampling seed of :func:`load_corpus`).
    fractions : expected train/dev/test shares (a small corpus may want a larger test share).
    """
    from gdr.validate import check_arguments

    check_arguments("load_title_queries", seed=seed, fractions=list(fractions))
    if name not in TITLE_CORPORA:
        raise ValueError(f"{name!r} has no title queries; title queries exist for {', '.join(TITLE_CORPORA)} "
                         f"(query sets of other collections: load_queries, one of {', '.join(QUERY_SETS)})")
    return title_queries(load_corpus(name, path=path), seed=seed, fractions=tuple(fractions)).filter(split)


def corpus_from_config(data) -> Corpus:
    """``load_corpus`` from a ``data:`` config section (``name`` plus any non-null keyword of it).

    Keys: ``path``, ``n_docs``, ``seed``, ``docs_tsv``, ``on_empty``, ``drop_title`` (see ``conf/data/*.yaml``).
    """
    d = {k: v for k, v in dict(data).items() if v is not None}
    return load_corpus(d.pop("name"), **d)
