"""The gdr data layer: corpora and query sets, each loader parsing its raw files itself.

>>> from gdr.data import load_corpus, load_queries
>>> corpus = load_corpus("r5")                       # doctest: +SKIP
>>> qs = load_queries("cranfield", split="test")     # doctest: +SKIP

Names: ``bbc``, ``r2``, ``r5``, ``cranfield``, ``msmarco-lite``, ``nq320k``, ``beir`` (the
latter needs ``path=``; a path to a BEIR folder also works as the name). Default paths
live under :func:`data_dir` (``$GDR_DATA_DIR`` or ``<repo>/../shared/data``).
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

__all__ = [
    "Corpus",
    "QuerySet",
    "DataError",
    "CORPORA",
    "QUERY_SETS",
    "data_dir",
    "load_corpus",
    "load_queries",
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

CORPORA = ("bbc", "r2", "r5", "cranfield", "msmarco-lite", "nq320k", "beir")
QUERY_SETS = ("cranfield", "msmarco-lite", "nq320k", "beir")


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
    """
    name, path = _resolve(name, path)
    if split is not None and name not in ("r2", "r5"):
        raise ValueError(f"corpus {name!r} has no document splits; split= selects queries in load_queries()")
    if docs_tsv is not None and name not in ("msmarco-lite", "nq320k"):
        raise ValueError(f"docs_tsv= applies to msmarco-lite and nq320k, not {name!r}")
    kw = {} if on_empty is None else {"on_empty": on_empty}
    if name in ("r2", "r5"):
        if on_empty is not None:
            raise ValueError("on_empty= does not apply to Reuters (stories without a body are always filtered)")
        corpus = load_reuters(path, topics=R2_TOPICS if name == "r2" else R5_TOPICS, split=split, name=name)
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
    or from ``docs_tsv`` for ``nq320k``). Reuters and BBC have labels, not queries.
    """
    name, path = _resolve(name, path)
    if name not in QUERY_SETS:
        raise ValueError(f"{name!r} has no query set (it is evaluated by its labels); "
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


def corpus_from_config(data) -> Corpus:
    """``load_corpus`` from a ``data:`` config section (``name`` plus any non-null keyword)."""
    d = {k: v for k, v in dict(data).items() if v is not None}
    return load_corpus(d.pop("name"), **d)
