"""Plain files of documents (``data=jsonl``, ``data=tsv``) and, optionally, their queries and judgements.

A documents file is a ``.jsonl`` (one JSON object per line) or a ``.tsv`` with a header line naming its
columns (``.gz`` read transparently). Its fields:

- the id: ``id_field`` (``auto``: the first of ``_id`` (BEIR), ``id``, ``doc_id`` present in the first record);
- the text: ``text_field`` (default ``text``);
- optionally a title (``title_field``, default ``title``) and a label (``label_field``, default ``label``;
  labelled corpora get the flat clustering of ``gdr run``), used where present.

Queries are optional: a queries file (jsonl ``{"_id"|"id"|"qid", "text"}``, a tsv ``id<TAB>text`` with a
header, or TREC topics, known by their content) and judgements in BEIR's qrels format
(``query-id<TAB>corpus-id<TAB>score``, header optional) or trec_eval's (``qid iter docno rel``): one file, whose
name is its split (``test.tsv`` holds the ``test`` split; a trec_eval file named otherwise is the ``test`` split),
or a folder of ``<split>.tsv`` files.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Iterable, Iterator, Sequence

from gdr.data.beir import SPLIT_ORDER, available_splits, read_qrels, read_query_texts
from gdr.data.core import ID_FIELDS, Corpus, DataError, DocTable, QuerySet, id_value_problem, iter_lines, require_file
from gdr.data.options import QUERY_TOPIC_FIELDS, DataOptions
from gdr.data.trec import format_hint, read_trec_topics, sniff

__all__ = ["DOC_FORMATS", "file_format", "load_docs_file", "load_file_queries", "ID_FIELDS", "QUERY_ID_FIELDS"]

log = logging.getLogger(__name__)

DOC_FORMATS = ("jsonl", "tsv")
QUERY_ID_FIELDS = ("_id", "id", "qid", "query_id")


def file_format(path: str | os.PathLike) -> str | None:
    """``"jsonl"`` or ``"tsv"`` by the file's suffix (``.gz`` aside), else None."""
    name = Path(path).name.lower().removesuffix(".gz")
    return next((f for f in DOC_FORMATS if name.endswith(f".{f}")), None)


def _records(path: Path, fmt: str) -> Iterator[tuple[int, dict]]:
    """``(lineno, record)`` of a jsonl file, or of a tsv file by its header line."""
    if fmt == "jsonl":
        from gdr.data.beir import jsonl_records  # BEIR's reader: one record a line, errors naming the line

        yield from jsonl_records(path)
        return
    header: list[str] | None = None
    for lineno, line in iter_lines(path):
        if not line.strip():
            continue
        cols = line.split("\t")
        if header is None:
            if line.lstrip(" \t").startswith("{"):
                raise DataError(f"{path}:{lineno}: a JSON object where a .tsv file has its header line: the file is "
                                f"JSON Lines; load it with data=jsonl")
            header = [c.strip() for c in cols]
            twice = next((c for i, c in enumerate(header) if c in header[:i]), None)
            if twice is not None:  # dict(zip()) would keep the last column of that name, silently
                raise DataError(f"{path}:{lineno}: the header names column {twice!r} twice; give each column its "
                                "own name")
            continue
        if len(cols) != len(header):
            raise DataError(f"{path}:{lineno}: {len(cols)} tab-separated columns, the header line has {len(header)} "
                            f"({', '.join(header)}); fix that line (a tab inside a text splits it)")
        yield lineno, dict(zip(header, cols))


def _pick(first: dict, wanted: str, choices: Sequence[str], path: Path, lineno: int, option: str | None) -> str:
    """The field name ``wanted`` (``auto``: the first of ``choices`` in the first record); ``option``: the setting
    that names another, None where there is none (the queries' id: rename the field)."""
    if wanted != "auto":
        if wanted not in first:
            raise DataError(f"{path}:{lineno}: no field {wanted!r} (fields: {', '.join(map(str, first))}); "
                            f"set {option}=<one of them>")
        return wanted
    found = next((c for c in choices if c in first), None)
    if found is None:
        fix = f"name yours with {option}=<field>" if option else f"name the id field one of {', '.join(choices)}"
        raise DataError(f"{path}:{lineno}: no id field ({', '.join(choices)}; fields: {', '.join(map(str, first))}); "
                        f"{fix}")
    return found


def _text(row: dict, key: str | None, path: Path, lineno: int) -> str | None:
    if key is None or key not in row:
        return None
    v = row[key]
    if v is None:
        return ""
    if not isinstance(v, str):
        raise DataError(f"{path}:{lineno}: {key!r} must be a string, got {type(v).__name__}; fix that record")
    return v


def load_docs_file(path: str | os.PathLike, *, fmt: str | None = None, id_field: str = DataOptions.id_field,
                   text_field: str = DataOptions.text_field, title_field: str | None = DataOptions.title_field,
                   label_field: str | None = DataOptions.label_field,
                   on_empty: str = "error", name: str | None = None) -> Corpus:
    """A Corpus from a ``.jsonl`` or ``.tsv`` file of documents (see the module docstring); the name defaults to
    the file's stem (``docs.jsonl`` -> ``docs``)."""
    if path is None:
        raise ValueError("a documents file needs path=<file.jsonl or file.tsv> (data.path=...)")
    file = require_file(path, "documents file", "pass data.path=<a .jsonl or .tsv file of documents>")
    fmt = fmt or file_format(file)
    if fmt not in DOC_FORMATS:
        raise DataError(f"{file}: not a .jsonl or .tsv file{format_hint(file)}; name it so, or load it with "
                        f"data={'|'.join(DOC_FORMATS)}")
    table = DocTable(on_empty=on_empty)
    id_key = None
    for lineno, row in _records(file, fmt):
        if id_key is None:
            id_key = _pick(row, id_field, ID_FIELDS, file, lineno, "data.id_field")
            _pick(row, text_field, (), file, lineno, "data.text_field")
        v = row.get(id_key)
        if v is None or (isinstance(v, str) and not v.strip()):
            raise DataError(f"{file}:{lineno}: record has no {id_key!r} (or it is not a string); give every "
                            f"document a non-empty {id_key!r}")
        if id_value_problem(v):
            raise DataError(f"{file}:{lineno}: {id_key!r} {id_value_problem(v)}; ids are strings or integers: fix "
                            "that record")
        text = _text(row, text_field, file, lineno)
        if text is None:
            raise DataError(f"{file}:{lineno}: document {v!r} has no {text_field!r} field; add it")
        title, label = _text(row, title_field, file, lineno), row.get(label_field) if label_field else None
        table.add(str(v), text, title=(title or "").strip() or None, label=None if label in (None, "") else str(label),
                  where=f"{file}:{lineno}")
    stem = file.name.removesuffix(".gz").rsplit(".", 1)[0]
    return table.build(name or stem, str(file))


def load_file_queries(queries: str | os.PathLike, qrels: str | os.PathLike, *, split: str | None = None,
                      doc_ids: Iterable[str], name: str = "queries", topic_fields: Sequence[str] = QUERY_TOPIC_FIELDS,
                      min_relevance: int = DataOptions.min_relevance, encoding: str = DataOptions.encoding,
                      drop_unknown: bool = False) -> QuerySet:
    """The queries of ``queries`` (jsonl, tsv or TREC topics, the latter's text the ``topic_fields``) judged in
    ``qrels`` (a ``<split>.tsv`` file or a folder of them, BEIR or trec_eval qrels; a trec_eval file not named after
    a split is the ``test`` split), checked against ``doc_ids`` (a judgement of another document refused, or with
    ``drop_unknown`` dropped: :func:`gdr.data.beir.read_qrels`); ``split=None`` gives every split."""
    qfile = require_file(queries, "queries file",
                         "pass data.queries=<a .jsonl or .tsv file of queries, or TREC topics>")
    fmt = "trec-topics" if sniff(qfile) == "trec-topics" else file_format(qfile)
    if fmt is None:
        raise DataError(f"{qfile}: a queries file is a .jsonl, a .tsv or TREC topics (<top> <num> .. <title> .. "
                        f"</top>){format_hint(qfile)}; name it so or pass that form")
    q = Path(qrels)
    if q.is_dir():
        files = {s: q / f"{s}.tsv" for s in available_splits(q)}
        if not files:
            raise FileNotFoundError(f"{q}: no <split>.tsv files; add e.g. {q / 'test.tsv'}")
    else:
        q = require_file(q, "qrels file", "pass data.qrels=<split>.tsv (e.g. test.tsv) or a folder of them")
        stem = q.name.removesuffix(".gz").rsplit(".", 1)[0]
        if stem not in SPLIT_ORDER:  # one file of judgements, in either format, is the test split
            log.info("%s: qrels not named after a split (train, dev, test): read as the test split", q)
            stem = "test"
        files = {stem: q}
    if split is not None:
        if split not in files:
            raise FileNotFoundError(f"{qrels}: no qrels for split {split!r}; available: {list(files)}")
        files = {split: files[split]}
    if fmt == "trec-topics":
        rows = read_trec_topics(qfile, topic_fields, encoding)
        id_key = "_id"
    else:
        rows = list(_records(qfile, fmt))
        id_key = (_pick(rows[0][1], "auto", QUERY_ID_FIELDS, qfile, rows[0][0], None) if rows else "_id")
    return read_qrels(read_query_texts(qfile, rows, id_key), qfile, files, set(doc_ids), name, str(qfile),
                      min_relevance, drop_unknown)
