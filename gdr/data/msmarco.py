"""MS MARCO Lite (Du et al. 2024, BMI): 138,457 MS MARCO v1 documents and 2,792 dev queries.

``shared/data/msmarco-lite`` holds only ids: ``docids.tsv`` (header ``docid``, one id per
line) and ``query2docid.dev.tsv`` (header ``query<TAB>docid``, one query and its relevant
doc id per line). The text comes from the user's MS MARCO v1 document TSV
(``msmarco-docs.tsv`` or ``.tsv.gz``: ``docid<TAB>url<TAB>title<TAB>body``), which is
streamed once, keeping only the listed documents, in ``docids.tsv`` order.

Query ids are ``"<split>-<n>"`` with ``n`` counting the file's queries from 0.
"""
from __future__ import annotations

import gzip
import logging
import os
from pathlib import Path
from typing import Collection

from gdr.data.core import Corpus, DataError, DocTable, QuerySet, checked_lines, data_dir, iter_lines, require_file

__all__ = ["load_msmarco_lite", "load_msmarco_lite_queries", "read_id_list", "read_query2docid", "find_docs_tsv"]

log = logging.getLogger(__name__)

DOCS_TSV_NAMES = ("msmarco-docs.tsv", "msmarco-docs.tsv.gz")
_DOCS_FIX = ("download the MS MARCO v1 document corpus (msmarco-docs.tsv.gz, "
             "https://msmarco.z22.web.core.windows.net/msmarcoranking/msmarco-docs.tsv.gz) and pass "
             "docs_tsv=<its path>, put it in the msmarco-lite folder, or set GDR_MSMARCO_DOCS")


def _folder(path: str | os.PathLike | None) -> Path:
    return Path(path) if path is not None else data_dir() / "msmarco-lite"


def read_id_list(path: Path, header: str = "docid") -> list[str]:
    """One id per line (an optional header line equal to ``header`` is skipped); duplicates are errors."""
    ids: list[str] = []
    first: dict[str, int] = {}
    for lineno, line in iter_lines(path):
        s = line.strip()
        if lineno == 1 and s.lower() == header:
            continue
        if not s:
            continue
        if "\t" in s:
            raise DataError(f"{path}:{lineno}: expected one id per line, got {line!r}; fix that line")
        if s in first:
            raise DataError(f"{path}:{lineno}: duplicate id {s!r} (first on line {first[s]}); delete one")
        first[s] = lineno
        ids.append(s)
    if not ids:
        raise DataError(f"{path}: no ids; the file should list one document id per line")
    return ids


def read_query2docid(path: Path, split: str, known: Collection[str] | None, known_what: str = "the corpus",
                     qid_prefix: str | None = None) -> QuerySet:
    """Read ``query<TAB>docid`` lines (optional header ``query<TAB>docid``) into a QuerySet.

    The doc id is the last tab-separated field, so a query text containing a tab still parses.
    Each line becomes one query with one relevant document; qids are ``"<prefix>-<n>"``.
    """
    prefix = split if qid_prefix is None else qid_prefix
    texts, relevant = [], []
    for lineno, line in iter_lines(path):
        if not line.strip():
            continue
        parts = line.rsplit("\t", 1)
        if lineno == 1 and [p.strip().lower() for p in parts] in (["query", "docid"], ["query", "doc_id"]):
            continue
        if len(parts) != 2:
            raise DataError(f"{path}:{lineno}: expected 'query<TAB>docid', got {line!r}; fix that line")
        q, d = parts[0].strip(), parts[1].strip()
        if not q:
            raise DataError(f"{path}:{lineno}: empty query text; fill it in or delete the line")
        if not d:
            raise DataError(f"{path}:{lineno}: empty doc id; fill it in or delete the line")
        if known is not None and d not in known:
            raise DataError(f"{path}:{lineno}: doc id {d!r} is not in {known_what}; fix the id or delete the line")
        texts.append(q)
        relevant.append([d])
    if not texts:
        raise DataError(f"{path}: no queries; expected lines 'query<TAB>docid'")
    n = len(texts)
    return QuerySet(name="", qids=[f"{prefix}-{i}" for i in range(n)], texts=texts, relevant=relevant,
                    splits=[split] * n, info={"source": str(path), "filtered": {}})


def find_docs_tsv(folder: Path, docs_tsv: str | os.PathLike | None) -> Path:
    if docs_tsv is not None:
        return require_file(docs_tsv, "MS MARCO v1 document TSV", _DOCS_FIX)
    env = os.environ.get("GDR_MSMARCO_DOCS")
    if env:
        return require_file(env, "MS MARCO v1 document TSV ($GDR_MSMARCO_DOCS)", _DOCS_FIX)
    for name in DOCS_TSV_NAMES:
        if (folder / name).is_file():
            return folder / name
    raise FileNotFoundError(f"{folder / DOCS_TSV_NAMES[0]}: MS MARCO v1 document TSV does not exist "
                            f"(MS MARCO Lite ships ids only); {_DOCS_FIX}")


def _scan_docs_tsv(file: Path, wanted: set[str]) -> dict[str, tuple[int, list[str]]]:
    """``{docid: (lineno, [docid, url, title, body])}`` for the wanted ids; one pass, decoding only those lines."""
    from tqdm import tqdm  # lazy: `gdr --help`, `import gdr` stay light

    wanted_b = {w.encode() for w in wanted}
    found: dict[str, tuple[int, list[str]]] = {}
    opener = gzip.open if file.suffix == ".gz" else open
    size = file.stat().st_size
    with opener(file, "rb") as f, tqdm(total=size if file.suffix != ".gz" else None, unit="B", unit_scale=True,
                                        desc=f"scan {file.name}", mininterval=2.0, leave=False) as bar:
        pending = 0
        for lineno, raw in enumerate(checked_lines(f, file), 1):
            pending += len(raw)
            if pending > 1 << 24:
                bar.update(pending)
                pending = 0
            key = raw.split(b"\t", 1)[0]
            if key not in wanted_b:
                continue
            try:
                line = raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError as e:
                raise DataError(f"{file}:{lineno}: byte {raw[e.start:e.start + 1]!r} at column {e.start + 1} is not "
                                "valid UTF-8; re-encode the file as UTF-8 or fix that line") from None
            parts = line.split("\t")
            if len(parts) != 4:
                raise DataError(f"{file}:{lineno}: expected 4 tab-separated columns (docid, url, title, body), "
                                f"got {len(parts)}; this should be the MS MARCO v1 msmarco-docs.tsv")
            d = parts[0]
            if d in found:
                raise DataError(f"{file}:{lineno}: duplicate docid {d!r} (first on line {found[d][0]}); "
                                "delete one of the two lines")
            found[d] = (lineno, parts)
            if len(found) == len(wanted):
                break
        bar.update(pending)
    return found


def load_msmarco_lite(path: str | os.PathLike | None = None, docs_tsv: str | os.PathLike | None = None,
                      on_empty: str = "title") -> Corpus:
    """MS MARCO Lite documents: the ids of ``<path>/docs.tsv`` with text from the v1 document TSV.

    Parameters
    ----------
    path : folder with ``docids.tsv`` (default ``<data>/msmarco-lite``).
    docs_tsv : the MS MARCO v1 ``msmarco-docs.tsv[.gz]`` (default: ``$GDR_MSMARCO_DOCS`` or that
        file inside ``path``).
    on_empty : a document with an empty body gets its title as text by default (``"title"``,
        ids in ``info["text_from_title"]``); ``"error"``, ``"drop"``, ``"keep"`` as in ``DocTable``.
    """
    folder = _folder(path)
    id_file = require_file(folder / "docids.tsv", "MS MARCO Lite doc id list",
                           "pass data.path= (path= in Python) the msmarco-lite folder, or set GDR_DATA_DIR")
    ids = read_id_list(id_file)
    file = find_docs_tsv(folder, docs_tsv)
    found = _scan_docs_tsv(file, set(ids))
    missing = [d for d in ids if d not in found]
    if missing:
        raise DataError(f"{file}: {len(missing)} of the {len(ids)} ids listed in {id_file} are not in it "
                        f"(first: {', '.join(missing[:5])}); docs_tsv must be the MS MARCO v1 document corpus "
                        "(msmarco-docs.tsv, ids like D1555982), not v2 or the passage corpus")
    table = DocTable(on_empty=on_empty)
    for d in ids:
        lineno, (_, url, title, body) = found[d]
        table.add(d, body.strip(), title=title.strip() or None, where=f"{file}:{lineno}")
    return table.build("msmarco-lite", str(file), {"id_list": str(id_file)})


def load_msmarco_lite_queries(path: str | os.PathLike | None = None, split: str | None = None,
                              doc_ids: Collection[str] | None = None) -> QuerySet:
    """MS MARCO Lite queries from ``<path>/query2docid.<split>.tsv`` (``dev`` ships; others if present).

    Relevant doc ids are checked against ``doc_ids`` (default: ``docids.tsv``).
    """
    folder = _folder(path)
    available = sorted(p.name.split(".")[1] for p in folder.glob("query2docid.*.tsv"))
    splits = available if split is None else [split]
    if not splits:
        raise FileNotFoundError(f"{folder}: no query2docid.<split>.tsv files; pass data.path= (path= in Python) "
                                "the msmarco-lite folder")
    known = set(doc_ids) if doc_ids is not None else set(
        read_id_list(require_file(folder / "docids.tsv", "MS MARCO Lite doc id list",
                                  "pass data.path= (path= in Python) the msmarco-lite folder")))
    parts = []
    for s in splits:
        file = folder / f"query2docid.{s}.tsv"
        if not file.is_file():
            raise FileNotFoundError(f"{file}: no MS MARCO Lite queries for split {s!r}; available: {available}")
        parts.append(read_query2docid(file, s, known, known_what="docids.tsv"))
    return concat_query_sets("msmarco-lite", parts, str(folder))


def concat_query_sets(name: str, parts: list[QuerySet], source: str) -> QuerySet:
    return QuerySet(
        name=name,
        qids=[q for p in parts for q in p.qids],
        texts=[t for p in parts for t in p.texts],
        relevant=[r for p in parts for r in p.relevant],
        splits=[s for p in parts for s in p.splits],
        info={"source": source, "filtered": {}, "files": [p.info["source"] for p in parts]},
    )
