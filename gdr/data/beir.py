"""BEIR folders, the field's interchange format: read and write.

A folder holds ``corpus.jsonl`` (``{"_id", "title", "text"}`` per line), ``queries.jsonl``
(``{"_id", "text"}``) and ``qrels/<split>.tsv`` with the header ``query-id corpus-id score``.
A judgement with score >= ``min_relevance`` (1) is relevant (its score kept as the grade); a lower one is a
judged non-relevant pair (counted, not kept). A qrels file in trec_eval's form (``qid iter docno rel``) is read
as well (:mod:`gdr.data.trec`). gdr adds one optional corpus field, ``label``,
so labelled corpora survive a round trip; other BEIR tools ignore it.
"""
from __future__ import annotations

import json
import logging
import os
from collections import Counter
from pathlib import Path
from typing import Iterable, Sequence

from gdr.data.core import (
    Corpus,
    DataError,
    DocTable,
    QuerySet,
    id_problem,
    id_value_problem,
    iter_lines,
    require_file,
)
from gdr.data.options import DataOptions
from gdr.data.trec import format_hint, qrels_form
from gdr.io import atomic_write_text

__all__ = ["load_beir", "load_beir_queries", "beir_doc_ids", "write_beir", "corpus_jsonl", "SPLIT_ORDER"]

log = logging.getLogger(__name__)

SPLIT_ORDER = ("train", "dev", "test")
_QRELS_HEADER = ("query-id", "corpus-id", "score")


def _folder(path: str | os.PathLike | None) -> Path:
    if path is None:
        raise ValueError("a BEIR corpus needs path= the folder holding corpus.jsonl, queries.jsonl and qrels/")
    p = Path(path)
    if not p.is_dir():
        raise FileNotFoundError(f"{p}: BEIR folder does not exist; pass data.path= (path= in Python) the folder "
                                "holding corpus.jsonl, queries.jsonl and qrels/")
    return p


def jsonl_records(path: Path) -> Iterable[tuple[int, dict]]:
    for lineno, line in iter_lines(path):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            hint = format_hint(path) if lineno == 1 else ""
            raise DataError(f"{path}:{lineno}: not valid JSON ({e.msg} at column {e.colno}){hint}; "
                            "fix or delete that line") from None
        if not isinstance(row, dict):
            raise DataError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}; "
                            "each line must be one record")
        yield lineno, row


def _id(row: dict, path: Path, lineno: int, key: str = "_id") -> str:
    v = row.get(key)
    if v is None or (isinstance(v, str) and not v.strip()):
        raise DataError(f"{path}:{lineno}: record has no '{key}'; give every record a non-empty '{key}'")
    if id_value_problem(v):
        raise DataError(f"{path}:{lineno}: '{key}' must be a string, got {v!r} (it {id_value_problem(v)})")
    if id_problem(str(v)):
        raise DataError(f"{path}:{lineno}: '{key}' {str(v)!r} {id_problem(str(v))}; remove it from the id")
    return str(v)


def _str_field(row: dict, key: str, path: Path, lineno: int) -> str:
    v = row.get(key, "")
    if v is None:
        return ""
    if not isinstance(v, str):
        raise DataError(f"{path}:{lineno}: '{key}' must be a string, got {type(v).__name__}; fix that record")
    return v


def load_beir(path: str | os.PathLike | None, on_empty: str = "error", name: str | None = None) -> Corpus:
    """Read ``<path>/corpus.jsonl`` into a Corpus (name defaults to the folder name).

    ``on_empty`` decides what an empty ``text`` does: ``"error"`` (default), ``"drop"``,
    ``"keep"`` or ``"title"`` (use the title as text); see :class:`gdr.data.core.DocTable`.
    """
    folder = _folder(path)
    file = require_file(folder / "corpus.jsonl", "BEIR corpus", "a BEIR folder holds corpus.jsonl")
    table = DocTable(on_empty=on_empty)
    for lineno, row in jsonl_records(file):
        doc_id = _id(row, file, lineno)
        if "text" not in row:
            raise DataError(f"{file}:{lineno}: document {doc_id!r} has no 'text' field; add it")
        label = row.get("label")
        table.add(
            doc_id,
            _str_field(row, "text", file, lineno),
            title=_str_field(row, "title", file, lineno).strip() or None,
            label=None if label is None else str(label),
            where=f"{file}:{lineno}",
        )
    return table.build(name or folder.resolve().name, str(file))


def beir_doc_ids(path: str | os.PathLike) -> list[str]:
    """The ``_id`` of every record in ``<path>/corpus.jsonl`` (for checking qrels without building a Corpus)."""
    file = require_file(_folder(path) / "corpus.jsonl", "BEIR corpus", "a BEIR folder holds corpus.jsonl")
    return [_id(row, file, lineno) for lineno, row in jsonl_records(file)]


def available_splits(qdir: Path) -> list[str]:
    found = sorted(p.stem for p in qdir.glob("*.tsv"))
    return [s for s in SPLIT_ORDER if s in found] + [s for s in found if s not in SPLIT_ORDER]


def load_beir_queries(
    path: str | os.PathLike | None,
    split: str | None = None,
    doc_ids: Iterable[str] | None = None,
    name: str | None = None,
    drop_unknown: bool = False,
    min_relevance: int = DataOptions.min_relevance,
) -> QuerySet:
    """Read ``queries.jsonl`` and ``qrels/<split>.tsv`` (all splits when ``split`` is None); a judgement of
    ``min_relevance`` or more is relevant (graded qrels: 2 keeps the highly relevant).

    Parameters
    ----------
    doc_ids : ids the qrels may name (default: the ids of ``corpus.jsonl``); an unknown id is an error, or
        with ``drop_unknown`` a judgement dropped (:func:`read_qrels`).

    Returns
    -------
    QuerySet with one row per (split, query with at least one relevant judgement), in qrels
    order; ``grades`` are the scores. Queries whose judgements are all non-relevant are
    counted in ``info["filtered"]["no_relevant"]``.
    """
    folder = _folder(path)
    qfile = require_file(folder / "queries.jsonl", "BEIR queries", "a BEIR folder holds queries.jsonl")
    qdir = folder / "qrels"
    if not qdir.is_dir():
        raise FileNotFoundError(f"{qdir}: BEIR qrels folder does not exist; add qrels/<split>.tsv files")
    splits = available_splits(qdir) if split is None else [split]
    if not splits:
        raise FileNotFoundError(f"{qdir}: no <split>.tsv files; add e.g. qrels/test.tsv")
    for s in splits:
        if not (qdir / f"{s}.tsv").is_file():
            raise FileNotFoundError(f"{qdir / (s + '.tsv')}: no qrels for split {s!r}; available splits: "
                                    f"{available_splits(qdir)}")
    known = set(doc_ids) if doc_ids is not None else set(beir_doc_ids(folder))
    query_text = read_query_texts(qfile, jsonl_records(qfile), "_id")
    return read_qrels(query_text, qfile, {s: qdir / f"{s}.tsv" for s in splits}, known,
                      name or folder.resolve().name, str(folder), min_relevance=min_relevance,
                      drop_unknown=drop_unknown)


def read_query_texts(qfile: Path, rows: Iterable[tuple[int, dict]], id_key: str, text_key: str = "text"
                     ) -> dict[str, str]:
    """``{qid: text}`` of the query records ``rows`` (``(lineno, record)`` read from ``qfile``)."""
    query_text: dict[str, str] = {}
    query_line: dict[str, int] = {}
    for lineno, row in rows:
        qid = _id(row, qfile, lineno, id_key)
        if qid in query_text:
            raise DataError(f"{qfile}:{lineno}: duplicate query {id_key} {qid!r} (first on line {query_line[qid]}); "
                            f"give each query a unique {id_key}")
        if text_key not in row:
            raise DataError(f"{qfile}:{lineno}: query {qid!r} has no {text_key!r} field (fields: "
                            f"{', '.join(map(str, row))}); name its text field {text_key!r}")
        text = _str_field(row, text_key, qfile, lineno)
        if not text.strip():
            raise DataError(f"{qfile}:{lineno}: query {qid!r} has empty text; fill it in or delete the record")
        query_text[qid] = text
        query_line[qid] = lineno
    return query_text


def read_qrels(query_text: dict[str, str], qfile: Path, split_files: dict[str, Path], known: set[str], name: str,
               source: str, min_relevance: int = DataOptions.min_relevance, drop_unknown: bool = False) -> QuerySet:
    """The QuerySet of the judgements in ``split_files`` (``{split: qrels file}``: BEIR's three tab-separated columns
    with an optional header, or trec_eval's ``qid iter docno rel``, told apart by the first line) over the queries
    ``query_text`` (read from ``qfile``) and the doc ids ``known``; a judgement of ``min_relevance`` or more is
    relevant. A judgement of a document not in ``known`` is refused (the count and the first, by file:line), or
    with ``drop_unknown`` (``data.drop_unknown_qrels``: the corpus is a subset) dropped with one warning saying the
    same; ``info["unknown_qrels"]`` counts the dropped relevant ones per split (what a score leaves out)."""
    qids, texts, relevant, grades, out_splits = [], [], [], [], []
    filtered: Counter[str] = Counter()
    nonrel = 0
    unknown: Counter[str] = Counter()  # judgements of documents not in ``known``, per split
    unknown_rel: Counter[str] = Counter()  # those of them that judge the document relevant
    first_unknown = ""
    for s, file in split_files.items():
        rel: dict[str, list[str]] = {}
        grd: dict[str, list[int]] = {}
        judged: dict[tuple[str, str], int] = {}
        form = None
        for lineno, line in iter_lines(file):
            if not line.strip():
                continue
            if form is None:
                form = _qrels_form(file, lineno, line)
            row = _qrels_row(form, line, file, lineno)
            if row is None:
                continue
            qid, did, score = row
            if qid not in query_text:
                raise DataError(f"{file}:{lineno}: query-id {qid!r} is not in {qfile.name}; add the query or "
                                "delete the judgement")
            if did not in known:
                unknown[s] += 1
                unknown_rel[s] += score >= min_relevance
                first_unknown = first_unknown or f"{file}:{lineno}: corpus-id {did!r}"
                continue
            if (qid, did) in judged:
                raise DataError(f"{file}:{lineno}: query {qid!r} and doc {did!r} were already judged on line "
                                f"{judged[qid, did]}; keep one judgement")
            judged[qid, did] = lineno
            rel.setdefault(qid, [])
            grd.setdefault(qid, [])
            if score < min_relevance:
                nonrel += 1
                continue
            rel[qid].append(did)
            grd[qid].append(score)
        if form is None:  # not one line to read
            raise DataError(f"{file}: no judgements (the file is empty); fill it in, or delete it to have no {s!r} "
                            "split")
        for qid, r in rel.items():
            if not r:
                filtered["no_relevant"] += 1
                continue
            qids.append(qid)
            texts.append(query_text[qid])
            relevant.append(r)
            grades.append(grd[qid])
            out_splits.append(s)
    _unknown_judgements(unknown, first_unknown, drop_unknown)
    if not qids:
        raise DataError(f"{', '.join(map(str, split_files.values()))}: no query with a relevant judgement in "
                        f"split(s) {list(split_files)}")
    info = {"source": source, "filtered": dict(filtered), "nonrelevant_judgements": nonrel,
            "unjudged_queries": len(set(query_text) - set(qids)),
            **({"unknown_qrels": dropped} if (dropped := {k: v for k, v in unknown_rel.items() if v}) else {})}
    if filtered:
        log.info("%s: %d queries have only non-relevant judgements and are left out", source, filtered["no_relevant"])
    return QuerySet(name=name, qids=qids, texts=texts, relevant=relevant, splits=out_splits, grades=grades, info=info)


def _unknown_judgements(unknown: Counter[str], first: str, drop: bool) -> None:
    """Refuse the judgements of documents not in the corpus (``unknown``: how many per split; ``first``: where the
    first is), or with ``drop`` say once that they were dropped."""
    n = sum(unknown.values())
    if not n:
        return
    said = f"{first} is not in the corpus ({n} judgement(s) name documents not in it)"
    if not drop:
        raise DataError(f"{said}; add the documents or delete the judgements, or set data.drop_unknown_qrels=true "
                        "(drop_unknown_qrels=True in the API) when the corpus is a subset")
    log.warning("%s: dropped (data.drop_unknown_qrels=true)", said)


def _qrels_form(file: Path, lineno: int, line: str) -> str:
    """The form of a qrels file by its first line (see :func:`gdr.data.trec.qrels_form`), said in the log."""
    form = qrels_form(line)
    if form is None:
        raise DataError(f"{file}:{lineno}: neither BEIR qrels (query-id<TAB>corpus-id<TAB>score) nor trec_eval qrels "
                        f"(qid iter docno rel){format_hint(file)}; fix the file")
    log.info("%s: read as %s qrels", file, "trec_eval" if form == "trec" else "BEIR")
    return form


def _qrels_row(form: str, line: str, file: Path, lineno: int) -> tuple[str, str, int] | None:
    """``(qid, doc id, score)`` of one qrels line of the form ``form``; None for BEIR's header."""
    if form == "trec":
        parts = line.split()
        if len(parts) != 4:
            raise DataError(f"{file}:{lineno}: expected 4 whitespace-separated columns of trec_eval qrels (qid iter "
                            f"docno rel) as on the first line, got {len(parts)}; fix that line")
        qid, _, did, score_s = parts
    else:
        parts = line.split("\t")
        if lineno == 1 and tuple(p.strip() for p in parts) == _QRELS_HEADER:
            return None
        if len(parts) != 3:
            raise DataError(f"{file}:{lineno}: expected 3 tab-separated columns of BEIR qrels (query-id, corpus-id, "
                            f"score) as on the first line, got {len(parts)}; fix that line")
        qid, did, score_s = (p.strip() for p in parts)
    try:
        score = float(score_s)
    except ValueError:
        hint = " (the first line must be the header 'query-id<TAB>corpus-id<TAB>score')" if lineno == 1 else ""
        raise DataError(f"{file}:{lineno}: score {score_s!r} is not a number{hint}; fix that line") from None
    if not score.is_integer():  # int() would make 0.7 a 0, a relevant judgement read as non-relevant
        raise DataError(f"{file}:{lineno}: score {score_s!r} is not an integer grade; qrels grade relevance in "
                        "integers (0 non-relevant, 1 relevant, 2 ...): fix that line")
    return qid, did, int(score)


def _one_line(s: str, what: str) -> str:
    if "\t" in s or "\n" in s or "\r" in s:
        raise DataError(f"{what} contains a tab or newline, which a qrels TSV cannot hold; clean the id")
    return s


def corpus_jsonl(corpus: Corpus) -> str:
    """``corpus`` as BEIR's ``corpus.jsonl`` text (``_id``, ``title``, ``text``, and ``label`` where labelled): also
    a file of documents ``data=jsonl`` reads."""
    rows = []
    for i, d in enumerate(corpus.doc_ids):
        row = {"_id": d, "title": (corpus.titles[i] or "") if corpus.titles is not None else "",
               "text": corpus.texts[i]}
        if corpus.labels is not None:
            row["label"] = corpus.labels[i]
        rows.append(json.dumps(row, ensure_ascii=False))
    return "\n".join(rows) + "\n"


def write_beir(corpus: Corpus, queries: QuerySet | None, folder: str | os.PathLike) -> Path:
    """Write ``corpus`` (and ``queries``, if given) as a BEIR folder; returns the folder.

    Files are written atomically. Queries that occur in several splits must have the same
    text there; relevance scores are the ``grades`` when present, else 1. The folder then holds these queries
    only: a ``queries.jsonl`` or ``qrels/<split>.tsv`` of an earlier write that they do not replace is removed,
    so that a split of other queries is never read with them.
    """
    folder = Path(folder)
    atomic_write_text(folder / "corpus.jsonl", corpus_jsonl(corpus))
    if queries is None:
        _remove_stale(folder, keep=())
        return folder
    text_of: dict[str, str] = {}
    for q, t in zip(queries.qids, queries.texts):
        if text_of.setdefault(q, t) != t:
            raise DataError(f"query {q!r} has different texts in different splits; BEIR keeps one text per _id, "
                            "so give the queries distinct ids")
    atomic_write_text(folder / "queries.jsonl",
                      "".join(json.dumps({"_id": q, "text": t}, ensure_ascii=False) + "\n" for q, t in text_of.items()))
    by_split: dict[str, list[str]] = {}
    for i, s in enumerate(queries.splits):
        q = _one_line(queries.qids[i], f"query id {queries.qids[i]!r}")
        g = queries.grades[i] if queries.grades is not None else [1] * len(queries.relevant[i])
        lines = by_split.setdefault(s, ["\t".join(_QRELS_HEADER)])
        lines.extend(f"{q}\t{_one_line(d, f'doc id {d!r}')}\t{int(x)}" for d, x in zip(queries.relevant[i], g))
    for s, lines in by_split.items():
        atomic_write_text(folder / "qrels" / f"{s}.tsv", "\n".join(lines) + "\n")
    _remove_stale(folder, keep=("queries.jsonl", *(f"qrels/{s}.tsv" for s in by_split)))
    log.info("wrote BEIR folder %s: %d documents, %d queries", folder, len(corpus), len(text_of))
    return folder


def _remove_stale(folder: Path, keep: Sequence[str]) -> None:
    """Remove the query files of ``folder`` (``queries.jsonl``, ``qrels/<split>.tsv``) not in ``keep``, naming each."""
    for name in ("queries.jsonl", *(f"qrels/{s}.tsv" for s in SPLIT_ORDER)):
        if name not in keep and (folder / name).exists():
            (folder / name).unlink()
            log.info("%s: removed, left by an earlier write of other queries", folder / name)
