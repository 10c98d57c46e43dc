"""The gdr data layer: corpora and query sets, each loader parsing its raw files itself.

>>> from gdr.data import load_corpus, load_queries
>>> corpus = load_corpus("r5")                       # doctest: +SKIP
>>> qs = load_queries("cranfield", split="test")     # doctest: +SKIP
>>> titles = load_title_queries("bbc", split="test")  # doctest: +SKIP
>>> articles = load_corpus("bbc", drop_title=True)   # doctest: +SKIP

Names: ``bbc``, ``r2``, ``r5``, ``reuters`` (every story with a body, unlabelled), ``cranfield``,
``msmarco-lite``, ``nq320k``, ``beir`` (the latter needs ``path=``; a path to a BEIR folder also works
as the name), ``jsonl`` and ``tsv`` (a file of documents, :mod:`gdr.data.files`; a path ending in
``.jsonl`` or ``.tsv`` also works as the name), ``trec`` (TREC SGML documents, topics and trec_eval qrels,
:mod:`gdr.data.trec`; a file or folder of TREC SGML also works as the name), ``irds:<id>`` (a collection by its
ir_datasets id, read through ir_datasets and its cache: :mod:`gdr.data.irds`). In memory: :meth:`Corpus.from_texts`,
:meth:`Corpus.from_pandas`, :meth:`Corpus.from_dataset`. Default paths
live under :func:`data_dir` (``$GDR_DATA_DIR``; in a checkout ``<repo>/../shared/data``, installed
``~/.cache/gdr/data``).

Queries: :func:`load_queries` reads the query sets that ship with a collection
(``QUERY_SETS``); :func:`load_title_queries` builds title queries for the titled corpora
without one (``TITLE_CORPORA``: bbc, r2, r5, reuters), a known-item proxy task (``gdr.data.titles``).
"""
from __future__ import annotations

import difflib
import logging
import os
from pathlib import Path
from typing import Sequence

from gdr.data.bbc import load_bbc
from gdr.data.beir import load_beir, load_beir_queries, write_beir
from gdr.data.core import SPLITS, Corpus, DataError, QuerySet, data_dir
from gdr.data.cranfield import load_cranfield, load_cranfield_queries
from gdr.data.files import DOC_FORMATS, file_format, load_docs_file, load_file_queries
from gdr.data.irds import PREFIX as IRDS_PREFIX
from gdr.data.irds import irds_problem, load_irds, load_irds_queries
from gdr.data.msmarco import load_msmarco_lite, load_msmarco_lite_queries
from gdr.data.nq320k import file_doc_ids, load_nq320k, load_nq320k_queries, nq320k_docs_file
from gdr.data.options import DataOptions
from gdr.data.reuters import R2_TOPICS, R5_TOPICS, load_reuters
from gdr.data.titles import TITLE_FRACTIONS, drop_titles, title_queries
from gdr.data.trec import format_hint, is_trec_folder, load_trec, sgml_text_fields, sniff
from gdr.rules import (
    FILE,
    OPT_POSITIVE,
    Rule,
    boolean,
    check_values,
    existing,
    field_name,
    fractions,
    get,
    int_at_least,
    integer,
    non_empty_list,
    one_of,
    optional,
    path_problem,
    seed,
    subset_of,
    text_encoding,
)

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
    "load_docs_file",
    "load_file_queries",
    "load_trec",
    "load_irds",
    "load_irds_queries",
    "R2_TOPICS",
    "R5_TOPICS",
    "DATA_RULES",
    "QUERY_RULES",
    "SPLIT_RULE",
    "DROP_UNKNOWN_RULE",
    "SPLITS",
]

log = logging.getLogger(__name__)

CORPORA = ("bbc", "r2", "r5", "reuters", "cranfield", "msmarco-lite", "nq320k", "beir", *DOC_FORMATS, "trec", "irds")
QUERY_SETS = ("cranfield", "msmarco-lite", "nq320k", "beir")
TITLE_CORPORA = ("bbc", "r2", "r5", "reuters")
# data: keys of the query side
QUERY_KEYS = ("queries", "qrels", "topic_fields", "min_relevance", "drop_unknown_qrels", "query_field")


# ---------------------------------------------------------------------------- the loaders' rules
def corpus_name(v, sec):
    """``data.name``: a corpus of ``CORPORA`` (``beir``/``jsonl``/``tsv`` with ``data.path``), a BEIR folder or a
    file of documents."""
    if not isinstance(v, str) or not v:
        return f"must be a corpus name ({', '.join(CORPORA)}), a BEIR folder or a .jsonl / .tsv file of documents"
    if v in CORPORA:
        if v == "beir" and not get(sec, "data.path"):
            return "needs data.path=<BEIR folder> (or data.name=<BEIR folder>)"
        if v in DOC_FORMATS and not get(sec, "data.path"):
            return f"needs data.path=<a .{v} file of documents>"
        if v == "trec" and not get(sec, "data.path"):
            return "needs data.path=<a file or a folder of TREC SGML documents>"
        if v == "irds" and not get(sec, "data.id"):
            return "needs data.id=<an ir_datasets id, e.g. beir/scifact/test>"
        return None
    if v.startswith(IRDS_PREFIX):
        return irds_problem(v[len(IRDS_PREFIX):])
    p = Path(v).expanduser()
    if (p / "corpus.jsonl").is_file():
        return None
    if p.is_file():
        if file_format(p) or sniff(p) == "trec-docs":
            return None
        return ("is a file, but not a .jsonl or .tsv file of documents (data=jsonl|tsv data.path=<file>) nor TREC "
                f"SGML{format_hint(p)}; a BEIR folder is a folder")
    if is_trec_folder(p):
        return None
    if p.exists():
        return "this folder has no corpus.jsonl: a BEIR folder needs corpus.jsonl, queries.jsonl and qrels/"
    close = difflib.get_close_matches(v, CORPORA, n=1)
    return (f"unknown corpus; choose one of {', '.join(CORPORA)} or give the path of a BEIR folder or of a .jsonl / "
            ".tsv file of documents"
            + (f"; did you mean {close[0]}?" if close else ""))


def qrels_of_queries(v, sec):
    """``data.qrels``: needed with, and only with, ``data.queries``."""
    if v is None:
        return ("is needed with data.queries: the judgements of those queries (<split>.tsv, or a folder of them)"
                if get(sec, "data.queries") else None)
    problem = path_problem(v, "file or folder")
    if problem:
        return problem
    if not get(sec, "data.queries"):
        return "needs data.queries=<file of the queries it judges>"
    return None


def irds_id(v, sec):
    """``data.id``: an id ir_datasets knows, with data=irds only."""
    if get(sec, "data.name") != "irds":
        return "applies to data=irds (an ir_datasets id); remove it or set data=irds"
    return irds_problem(v)


def irds_ids(v, sec):
    """``data.query_ids``: a list of ids ir_datasets knows, with data=irds only."""
    if non_empty_list(v, sec):
        return "must be a non-empty list of ir_datasets ids"
    return next((f"{i!r} {p}" for i, p in ((i, irds_id(i, sec)) for i in v) if p), None)


# the scoring functions' choice for judgements of documents not in the corpus (QuerySet.judged_in) and of the
# qrels readers (gdr.data.beir.read_qrels)
DROP_UNKNOWN_RULE = Rule("data.drop_unknown_qrels", boolean,
                         "judgements of documents not in the corpus: true drops them (a subset), false refuses")
# ``data:`` (conf/data/*.yaml): the keyword arguments of load_corpus and corpus_from_config, and of the query side
DATA_RULES = (
    Rule("data.name", corpus_name, "the corpus"),
    Rule("data.path", optional(existing()), "the corpus's file or folder: data=jsonl|tsv|beir|trec need it, a named "
                                             "corpus reads its default location when null"),
    Rule("data.docs_tsv", FILE, "the document TSV of msmarco-lite / nq320k"),
    Rule("data.n_docs", OPT_POSITIVE, "documents kept; null = all"),
    Rule("data.seed", seed),
    Rule("data.on_empty", optional(one_of("error", "drop", "keep", "title")), "what an empty document does"),
    Rule("data.drop_title", boolean),
    Rule("data.id_field", field_name, "the id field of a file of documents; auto = _id, id or doc_id"),
    Rule("data.text_field", field_name, "the text field of a file of documents"),
    Rule("data.title_field", optional(field_name), "the title field of a file of documents"),
    Rule("data.label_field", optional(field_name), "the label field of a file of documents"),
    Rule("data.queries", optional(existing("file")), "a file of queries (.jsonl or .tsv) for data=jsonl|tsv"),
    Rule("data.qrels", qrels_of_queries, "judgements (<split>.tsv, or a folder of them) for data.queries"),
    Rule("data.text_fields", sgml_text_fields, "data=trec: the SGML fields holding a document's text; a <DOC> without "
         "them gives its body"),
    Rule("data.title_fields", optional(non_empty_list), "data=trec: the SGML fields of a title, the first present"),
    Rule("data.topic_fields", subset_of("title", "desc", "narr"), "data=trec: a query's topic fields"),
    Rule("data.min_relevance", integer, "judgements of this grade or more are relevant"),
    Rule("data.encoding", text_encoding, "data=trec: the files' text encoding"),
    Rule("data.id", optional(irds_id), "data=irds: the ir_datasets id of documents, queries and qrels "
                                       "(beir/scifact/test)"),
    Rule("data.query_ids", optional(irds_ids), "data=irds: ids of the same documents whose queries join data.id's, "
                                               "each in the split its id names ([beir/scifact/train])"),
    Rule("data.query_field", optional(field_name), "data=irds: the queries' text field; null = text or "
                                                   "default_text()"),
    DROP_UNKNOWN_RULE,
)
def reads_query_set(name: str) -> bool:
    """Whether ``queries.name`` names queries to read: a query set, a BEIR folder with ``queries.jsonl``, the
    titles, an ir_datasets id, or the query files of a corpus read from a file of documents."""
    return (name in (*QUERY_SETS, *DOC_FORMATS, "trec", "irds", "titles") or name.startswith(IRDS_PREFIX)
            or (Path(name) / "queries.jsonl").is_file())


def query_set_name(v, sec):
    """``queries.name``: queries to read, or the corpus's own name (``${data.name}``: a corpus without a query set,
    r2, r5, bbc, simply has none)."""
    if v is None or v == get(sec, "data.name") or reads_query_set(str(v)):
        return None
    return (f"no query set of that name and no folder holding queries.jsonl; choose {' | '.join(QUERY_SETS)}, "
            "titles, a BEIR folder, irds:<id>, or null for none")


# ``queries:`` split by a setting (gdr.data.splits): shares or folds of the topics, seeded by topic id
QUERY_NAME_RULE = Rule("queries.name", query_set_name, "the query set: its train split trains, its test split scores")
FRACTIONS_RULE = Rule("queries.fractions", optional(fractions),
                      "train/dev/test shares of the topics, split by a seeded hash of the topic id; null = the query "
                      "set's own splits (titles, which have none: 0.8/0.1/0.1)")
FOLDS_RULE = Rule("queries.folds", optional(int_at_least(2)),
                  "K-fold cross-validation over the topics: K retrievers per scheme and seed, each trained without "
                  "one fold and scored on it, so every topic is a test topic; null = one train/test split")
# a `gdr train` / `gdr evaluate` of one fold (what a `gdr run` stage folder saves)
FOLD_RULE = Rule("queries.fold", optional(int_at_least(0)),
                 "with queries.folds: the fold held out, whose topics are the test split; null = every topic")
QUERY_RULES = (FRACTIONS_RULE, Rule("seed", seed))
SPLIT_RULE = Rule("split", one_of(*SPLITS), "the query split")


def resolve_corpus(name: str, path: str | os.PathLike | None) -> tuple[str, str | os.PathLike | None]:
    """A path given as the name means a BEIR folder, a documents file (``.jsonl``, ``.tsv``), or TREC SGML (a file
    whose first line is ``<DOC>``, or a folder holding such files)."""
    if not isinstance(name, (str, os.PathLike)):
        raise TypeError(f"corpus name: got {type(name).__name__}; pass a name ({', '.join(CORPORA)}) or a path, "
                        "or build a gdr.Corpus in memory (Corpus.from_texts / from_pandas / from_dataset)")
    name = os.fspath(name)
    if name not in CORPORA and (Path(name) / "corpus.jsonl").is_file():
        return "beir", name
    if name not in CORPORA and Path(name).is_file() and file_format(name):
        return file_format(name), name
    if name not in CORPORA and (sniff(name) == "trec-docs" or is_trec_folder(name)):
        return "trec", name
    if name not in CORPORA:
        what = (f"corpus {name!r} is a file, but not a .jsonl or .tsv file of documents nor TREC SGML"
                f"{format_hint(name)}" if Path(name).is_file() else
                f"corpus {name!r} is a folder without corpus.jsonl (not a BEIR folder) nor TREC SGML files"
                if Path(name).is_dir() else
                f"corpus {name!r}: no such file" if file_format(name) else f"unknown corpus {name!r}")
        raise ValueError(f"{what}; choose one of {', '.join(CORPORA)}, or pass the path of a BEIR folder, of a "
                         ".jsonl / .tsv file of documents or of TREC SGML documents")
    return name, path


def load_corpus(
    name: str,
    *,
    path: str | os.PathLike | None = None,
    docs_tsv: str | os.PathLike | None = None,
    split: str | None = None,
    n_docs: int | None = None,
    seed: int = DataOptions.seed,
    on_empty: str | None = None,
    drop_title: bool = DataOptions.drop_title,
    id_field: str | None = None,
    text_field: str | None = None,
    title_field: str | None = None,
    label_field: str | None = None,
    text_fields: Sequence[str] | None = None,
    title_fields: Sequence[str] | None = None,
    encoding: str | None = None,
    query_ids: Sequence[str] | None = None,
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
        side of title queries (:func:`load_title_queries`). A body that opens with a copy of its title loses
        that copy (:func:`gdr.data.titles.drop_titles`: 1,397 Cranfield abstracts; no BBC or Reuters body).
    id_field, text_field, title_field, label_field : ``jsonl`` / ``tsv`` only: the names of the fields
        (default ``auto`` = ``_id``, ``id`` or ``doc_id``; ``text``; ``title``; ``label``), see :mod:`gdr.data.files`.
    text_fields, title_fields, encoding : ``trec`` only: the SGML fields holding the text (default ``TEXT``), the
        title (the first of ``TITLE``, ``HEADLINE``, ``HEAD``), and the files' encoding; see :mod:`gdr.data.trec`.
    query_ids : ``irds:<id>`` only: ids of the same documents whose judged documents ``n_docs`` keeps first too
        (their queries join in :func:`gdr.data.splits.split_queries`); see :mod:`gdr.data.irds`.
    """
    check_values({"n_docs": n_docs, "seed": seed}, DATA_RULES, {"n_docs": "data.n_docs", "seed": "data.seed"})
    source = {"name": name, "path": None if path is None else os.fspath(path)}
    if isinstance(name, str) and name.startswith(IRDS_PREFIX):
        return _load_irds_corpus(name, path=path, docs_tsv=docs_tsv, split=split, n_docs=n_docs, seed=seed,
                                 on_empty=on_empty, drop_title=drop_title, query_ids=query_ids, others=(
                                     id_field, text_field, title_field, label_field, text_fields, title_fields,
                                     encoding))
    name, path = resolve_corpus(name, path)
    fields = {k: v for k, v in (("id_field", id_field), ("text_field", text_field), ("title_field", title_field),
                                ("label_field", label_field)) if v is not None}
    trec = {k: v for k, v in (("text_fields", text_fields), ("title_fields", title_fields), ("encoding", encoding))
            if v is not None}
    if query_ids is not None:
        raise ValueError(f"query_ids= applies to an ir_datasets id (irds:<id>), not {name!r}")
    _check_applies(name, fields, trec, split, docs_tsv)
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
    elif name in DOC_FORMATS:
        corpus = load_docs_file(path, fmt=name, **fields, **kw)
    elif name == "trec":
        corpus = load_trec(path, **trec, **kw)
    else:
        corpus = load_beir(path, **kw)
    if drop_title:
        corpus = drop_titles(corpus)
    # where it came from: gdr.split_queries(corpus, split) finds the corpus's own queries by it
    corpus.info["data"] = {k: v for k, v in {**source, "docs_tsv": None if docs_tsv is None else os.fspath(docs_tsv),
                                             "drop_title": drop_title or None}.items() if v is not None}
    return corpus.sample(n_docs, seed)


def _check_applies(name: str, fields: dict, trec: dict, split, docs_tsv) -> None:
    """Refuse a keyword of :func:`load_corpus` that does not apply to corpus ``name``."""
    if fields and name not in DOC_FORMATS:
        raise ValueError(f"{next(iter(fields))}= applies to a file of documents (jsonl, tsv), not {name!r}")
    if trec and name != "trec":
        raise ValueError(f"{next(iter(trec))}= applies to TREC SGML documents (data=trec), not {name!r}")
    if split is not None and name not in ("r2", "r5", "reuters"):
        raise ValueError(f"corpus {name!r} has no document splits; split= selects queries in load_queries()")
    if docs_tsv is not None and name not in ("msmarco-lite", "nq320k"):
        raise ValueError(f"docs_tsv= applies to msmarco-lite and nq320k, not {name!r}")


def _load_irds_corpus(name: str, *, path, docs_tsv, split, n_docs, seed, on_empty, drop_title, query_ids,
                      others) -> Corpus:
    """``load_corpus("irds:<id>")``: the documents of an ir_datasets id (:mod:`gdr.data.irds`), ``n_docs`` of them
    judged ones first."""
    given = [k for k, v in (("path", path), ("docs_tsv", docs_tsv), ("split", split)) if v is not None]
    if given or any(v is not None for v in others):
        what = given[0] if given else "a field setting"
        raise ValueError(f"{what}= does not apply to an ir_datasets id ({name!r}): ir_datasets finds the files "
                         "itself, and a split is named by the id (beir/scifact/train, beir/scifact/test)")
    kw = {} if on_empty is None else {"on_empty": on_empty}
    corpus = load_irds(name[len(IRDS_PREFIX):], n_docs=n_docs, seed=seed, judged_by=query_ids or (), **kw)
    if drop_title:
        corpus = drop_titles(corpus)
    corpus.info["data"] = {"name": name, **({"drop_title": True} if drop_title else {})}
    return corpus


def load_queries(
    name: str,
    split: str | None = None,
    *,
    path: str | os.PathLike | None = None,
    docs_tsv: str | os.PathLike | None = None,
    drop_unknown_qrels: bool = DataOptions.drop_unknown_qrels,
    min_relevance: int = DataOptions.min_relevance,
) -> QuerySet:
    """Load the query set of a corpus; ``split=None`` gives every split that exists. ``min_relevance``: the
    lowest grade of a relevant judgement of a BEIR folder or an ``irds:`` id (the other sets keep their own).

    Relevant doc ids are checked against the corpus's id list (read from the raw files,
    or from ``docs_tsv`` for ``nq320k``). Reuters and BBC have labels, not queries; their title
    queries come from :func:`load_title_queries`. ``drop_unknown_qrels``: a BEIR folder whose corpus is a
    subset of its judgements' drops those of other documents (:func:`gdr.data.beir.read_qrels`) instead of
    refusing them.
    """
    check_values({"min_relevance": min_relevance}, DATA_RULES, {"min_relevance": "data.min_relevance"})
    if isinstance(name, str) and name.startswith(IRDS_PREFIX):  # an ir_datasets id: its own queries and qrels
        return load_irds_queries(name[len(IRDS_PREFIX):], min_relevance=min_relevance).filter(split)
    name, path = resolve_corpus(name, path)
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
        doc_ids = file_doc_ids(nq320k_docs_file(path, docs_tsv)) if docs_tsv is not None else None
        return load_nq320k_queries(path, split=split, doc_ids=doc_ids)
    return load_beir_queries(path, split=split, drop_unknown=drop_unknown_qrels, min_relevance=min_relevance)


def load_title_queries(
    name: str,
    split: str | None = None,
    *,
    path: str | os.PathLike | None = None,
    seed: int = 0,
    fractions: tuple[float, float, float] = TITLE_FRACTIONS,
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
    check_values({"seed": seed, "fractions": list(fractions)}, QUERY_RULES, {"fractions": "queries.fractions"})
    if name not in TITLE_CORPORA:
        raise ValueError(f"{name!r} has no title queries; title queries exist for {', '.join(TITLE_CORPORA)} "
                         f"(query sets of other collections: load_queries, one of {', '.join(QUERY_SETS)})")
    return title_queries(load_corpus(name, path=path), seed=seed, fractions=tuple(fractions)).filter(split)


def corpus_from_config(data) -> Corpus:
    """``load_corpus`` from a ``data:`` config section (``name`` plus any non-null keyword of it).

    Keys: ``path``, ``n_docs``, ``seed``, ``docs_tsv``, ``on_empty``, ``drop_title``, the field names of a file of
    documents (see ``conf/data/*.yaml``); ``QUERY_KEYS`` (a file's queries) are read by the query side.
    """
    d = {k: v for k, v in dict(data).items() if v is not None and k not in QUERY_KEYS}
    name = d.pop("name")
    if name == "irds":  # data=irds data.id=<id>
        name = IRDS_PREFIX + str(d.pop("id", ""))
    return load_corpus(name, **d)
