"""NQ320K (Natural Questions as prepared by DSI/NCI: ~109K Wikipedia pages, ~307K train and
~7.8K dev questions, one relevant page each). We read the processed TSVs that NCI users have;
nothing here downloads or re-derives them.

Two layouts are recognised in the folder ``path``:

NCI (``Data_process/NQ_dataset/NQ_dataset_Process.ipynb`` of the NCI repository; no header lines):
  - ``NQ_doc_content.tsv``: ``docid<TAB><TAB><TAB>text<TAB><TAB><TAB>en`` (7 columns; ``docid`` is
    NCI's integer id, ``text`` the page's title + abstract + content), or, when that file is
    absent, ``nq_title_abs.tsv``: ``title abstract<TAB>example_id<TAB>docid<TAB>semantic_id`` (one
    row per train/dev question, so a page repeats; repeats must carry the same text and are
    collapsed, counted in ``info["repeated_rows"]``);
  - ``nq_train_doc_newid.tsv`` / ``nq_dev_doc_newid.tsv``: ``query<TAB>example_id<TAB>docid<TAB>semantic_id``;
    the qid is NQ's ``example_id``.

Simple (documented here, for users who hold other NQ320K exports):
  - ``docs.tsv``: ``doc_id<TAB>title<TAB>text`` (optional header ``doc_id<TAB>title<TAB>text``);
  - ``query2docid.<split>.tsv``: ``query<TAB>doc_id`` (optional header), qids ``"<split>-<n>"``.

Ids written by pandas as floats (``"123.0"``) are read as ``"123"``.
"""
from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Collection

from gdr.data.core import Corpus, DataError, DocTable, QuerySet, data_dir, iter_lines, require_file
from gdr.data.msmarco import concat_query_sets, read_query2docid

__all__ = ["load_nq320k", "load_nq320k_queries", "nq320k_docs_file", "SPLITS"]

log = logging.getLogger(__name__)

SPLITS = ("train", "dev")
DOC_FILES = ("docs.tsv", "NQ_doc_content.tsv", "nq_title_abs.tsv")
_FLOAT_ID = re.compile(r"^(\d+)\.0$")
_FIX = ("pass data.path= (path= in Python) a folder with NCI's NQ_doc_content.tsv (or nq_title_abs.tsv) and "
        "nq_{train,dev}_doc_newid.tsv, or with docs.tsv (doc_id, title, text) and query2docid.{train,dev}.tsv "
        "(query, doc_id)")


def _folder(path: str | os.PathLike | None) -> Path:
    p = Path(path) if path is not None else data_dir() / "nq320k"
    if not p.is_dir():
        raise FileNotFoundError(f"{p}: NQ320K folder does not exist; {_FIX}")
    return p


def _nci_id(s: str) -> str:
    s = s.strip()
    m = _FLOAT_ID.match(s)
    return m.group(1) if m else s


def nq320k_docs_file(path: str | os.PathLike | None = None, docs_tsv: str | os.PathLike | None = None) -> Path:
    """The documents file: ``docs_tsv`` if given, else the first of docs.tsv, NQ_doc_content.tsv, nq_title_abs.tsv."""
    if docs_tsv is not None:
        return require_file(docs_tsv, "NQ320K documents TSV", _FIX)
    folder = _folder(path)
    for name in DOC_FILES:
        if (folder / name).is_file():
            return folder / name
    raise FileNotFoundError(f"{folder}: no NQ320K documents file ({', '.join(DOC_FILES)}); {_FIX}")


def _docs_layout(file: Path) -> str:
    """``"simple"`` (3 columns), ``"content"`` (7) or ``"title_abs"`` (4), from the first line."""
    for lineno, line in iter_lines(file):
        n = len(line.split("\t"))
        layout = {3: "simple", 7: "content", 4: "title_abs"}.get(n)
        if layout is None:
            raise DataError(f"{file}:{lineno}: {n} tab-separated columns; expected 3 (doc_id, title, text), "
                            "7 (NCI NQ_doc_content.tsv) or 4 (NCI nq_title_abs.tsv)")
        return layout
    raise DataError(f"{file}: empty file; {_FIX}")


def load_nq320k(path: str | os.PathLike | None = None, docs_tsv: str | os.PathLike | None = None,
                on_empty: str = "error") -> Corpus:
    """NQ320K documents from the NCI or simple layout (see the module docstring)."""
    file = nq320k_docs_file(path, docs_tsv)
    layout = _docs_layout(file)
    ncols = {"simple": 3, "content": 7, "title_abs": 4}[layout]
    table = DocTable(on_empty=on_empty)
    repeated = 0
    seen_text: dict[str, str] = {}
    for lineno, line in iter_lines(file):
        if not line.strip():
            continue
        parts = line.split("\t")
        if len(parts) != ncols:
            raise DataError(f"{file}:{lineno}: {len(parts)} tab-separated columns, expected {ncols} like line 1 "
                            f"({layout} layout); fix that line (a tab inside the text must be replaced)")
        where = f"{file}:{lineno}"
        if layout == "simple":
            if lineno == 1 and [p.strip().lower() for p in parts] == ["doc_id", "title", "text"]:
                continue
            table.add(parts[0].strip(), parts[2].strip(), title=parts[1].strip() or None, where=where)
        elif layout == "content":
            table.add(_nci_id(parts[0]), parts[3].strip(), where=where)
        else:  # title_abs: one row per question; a page repeats with the same text
            d, text = _nci_id(parts[2]), parts[0].strip()
            if d in seen_text:
                if seen_text[d] != text:
                    raise DataError(f"{where}: doc id {d!r} repeats with a different text than at "
                                    f"{table.where[d]}; the file is inconsistent, regenerate it")
                repeated += 1
                continue
            seen_text[d] = text
            table.add(d, text, where=where)
    info = {"layout": layout}
    if layout == "title_abs":
        info["repeated_rows"] = repeated
    return table.build("nq320k", str(file), info)


def file_doc_ids(file: Path) -> set[str]:
    """The doc ids of a documents file, without building the corpus (for checking queries)."""
    layout = _docs_layout(file)
    col = 2 if layout == "title_abs" else 0
    ids = {_nci_id(line.split("\t")[col]) for _, line in iter_lines(file) if line.strip()}
    if layout == "simple":
        ids.discard("doc_id")
    return ids


def _nci_queries(file: Path, split: str, known: Collection[str] | None) -> QuerySet:
    qids, texts, relevant = [], [], []
    first: dict[str, int] = {}
    for lineno, line in iter_lines(file):
        if not line.strip():
            continue
        parts = line.split("\t")
        if len(parts) != 4:
            raise DataError(f"{file}:{lineno}: {len(parts)} tab-separated columns, expected 4 "
                            "(query, example_id, docid, semantic_id); fix that line")
        q, ex, d = parts[0].strip(), parts[1].strip(), _nci_id(parts[2])
        if not q:
            raise DataError(f"{file}:{lineno}: empty query text; fill it in or delete the line")
        if not d or d.lower() == "nan":
            raise DataError(f"{file}:{lineno}: query {ex!r} has no doc id; its page is missing from the corpus, "
                            "regenerate the file or delete the line")
        if ex in first:
            raise DataError(f"{file}:{lineno}: duplicate example_id {ex!r} (first on line {first[ex]}); delete one")
        if known is not None and d not in known:
            raise DataError(f"{file}:{lineno}: doc id {d!r} is not in the NQ320K documents file; fix the id or "
                            "load the matching documents")
        first[ex] = lineno
        qids.append(ex)
        texts.append(q)
        relevant.append([d])
    if not qids:
        raise DataError(f"{file}: no queries; expected lines 'query<TAB>example_id<TAB>docid<TAB>semantic_id'")
    return QuerySet(name="", qids=qids, texts=texts, relevant=relevant, splits=[split] * len(qids),
                    info={"source": str(file)})


def load_nq320k_queries(path: str | os.PathLike | None = None, split: str | None = None,
                        doc_ids: Collection[str] | None = None) -> QuerySet:
    """NQ320K queries of ``split`` (``"train"``, ``"dev"``; ``None`` = both that exist).

    Relevant doc ids are checked against ``doc_ids`` (default: the ids in the documents file).
    """
    folder = _folder(path)

    def file_for(s: str) -> Path | None:
        for name in (f"nq_{s}_doc_newid.tsv", f"query2docid.{s}.tsv"):
            if (folder / name).is_file():
                return folder / name
        return None

    splits = [s for s in SPLITS if file_for(s) is not None] if split is None else [split]
    if not splits:
        raise FileNotFoundError(f"{folder}: no NQ320K query files; {_FIX}")
    if doc_ids is None:
        doc_ids = file_doc_ids(nq320k_docs_file(folder))
    known = set(doc_ids)
    parts = []
    for s in splits:
        file = file_for(s)
        if file is None:
            raise FileNotFoundError(f"{folder}: no queries for split {s!r} (nq_{s}_doc_newid.tsv or "
                                    f"query2docid.{s}.tsv); {_FIX}")
        if file.name.startswith("nq_"):
            parts.append(_nci_queries(file, s, known))
        else:
            parts.append(read_query2docid(file, s, known, known_what="the NQ320K documents file"))
    return concat_query_sets("nq320k", parts, str(folder))
