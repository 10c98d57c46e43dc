"""TREC test collections as distributed (``data=trec``): SGML documents, topics and trec_eval qrels.

- Documents: ``<DOC> <DOCNO>id</DOCNO> <TITLE>..</TITLE> <TEXT>..</TEXT> </DOC>``, several to a file; a file, a
  ``.gz`` (read as is) or a folder of them (every file that holds TREC SGML, in name order). The text is every
  field named in ``text_fields`` (default ``TEXT``), joined; a document with none of them (older collections write
  the text directly in ``<DOC>``) gives its body: the DOC's text minus its ``<DOCNO>`` and title fields. The title
  is the first of ``title_fields`` present (``TITLE``, ``HEADLINE``, ``HEAD``). Tags are matched case-insensitively
  and may carry attributes; markup inside a field (``<P>``) is dropped, entities (``&amp;``) decoded, whitespace
  collapsed. A DOCNO is one token (run files split on whitespace), one per document; a text field is never the
  DOCNO, and fields that hold only ids (one id-like token in every document) are refused.
- Topics: ``<top> <num> Number: 401 <title> .. <desc> Description: .. <narr> Narrative: .. </top>``, the fields
  usually unclosed (each ends where the next tag starts); a query is the fields named in ``topic_fields`` (default
  ``title``), joined, with the ``Number:`` / ``Topic:`` / ``Description:`` / ``Narrative:`` labels dropped.
- Qrels: trec_eval's ``qid iter docno rel`` (whitespace-separated); graded relevance is kept, and a document is
  relevant when ``rel >= min_relevance``. :func:`qrels_form` tells them from BEIR's tab-separated qrels, so either
  form is read wherever judgements are read (:func:`gdr.data.beir.read_qrels`).
"""
from __future__ import annotations

import html
import logging
import os
import re
import zlib
from pathlib import Path
from typing import Iterable, Sequence

from gdr.data.core import BOM, GZIP_MAGIC, DataError, DocTable, gzip_damage, normalize_space
from gdr.data.options import QUERY_TOPIC_FIELDS, TEXT_FIELDS, TITLE_FIELDS, DataOptions

__all__ = ["TEXT_FIELDS", "TITLE_FIELDS", "TOPIC_FIELDS", "sniff", "is_trec_folder", "load_trec", "read_trec_topics",
           "qrels_form", "format_hint", "trec_files", "sgml_text_fields"]

log = logging.getLogger(__name__)

TOPIC_FIELDS = ("title", "desc", "narr")

_DOC_TAG = re.compile(r"<(/?)DOC(?:\s[^>]*)?>", re.I)
_DOCNO = re.compile(r"<DOCNO(?:\s[^>]*)?>(.*?)</DOCNO\s*>", re.I | re.S)
_ID_LIKE = re.compile(r"[^\s]*\d[^\s]*")  # one token with a digit: a DOCNO, a DOCID, a file id
_ANY_TAG = re.compile(r"<[^>]*>")
_OPEN_TAG = re.compile(r"<([A-Za-z][\w.-]*)(?:\s[^>]*)?>")
_TOP = re.compile(r"<top(?:\s[^>]*)?>(.*?)(?:</top\s*>|(?=<top[\s>])|\Z)", re.I | re.S)
_TOPIC_LABEL = {"num": r"Number\s*:", "title": r"Topic\s*:", "desc": r"Description\s*:", "narr": r"Narrative\s*:"}
_SNIFF_BYTES = 4096


def sgml_text_fields(v, sec=None):
    """``data.text_fields``: a non-empty list of SGML tag names, none of them DOCNO (the id is not the text)."""
    if isinstance(v, str) or not hasattr(v, "__iter__") or not list(v):
        return "must be a non-empty list of SGML field names, e.g. [TEXT] or [TEXT, GRAPHIC]"
    bad = next((x for x in v if not isinstance(x, str) or not re.fullmatch(r"[A-Za-z][\w.-]*", x)), None)
    if bad is not None:
        return f"{bad!r} is not an SGML field name; name fields as tags, e.g. [TEXT, GRAPHIC]"
    if any(x.upper() == "DOCNO" for x in v):
        return ("DOCNO is the document's id, not its text; name the fields holding the text (a <DOC> without them "
                "gives its body)")
    return None


def _gunzip(raw: bytes, path: Path) -> bytes:
    """``raw`` decompressed; an archive that ends early or is damaged names the line it stops at."""
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = d.decompress(raw)
    except zlib.error as e:
        raise gzip_damage(path, 1, e) from None
    if not d.eof:
        raise gzip_damage(path, out.count(b"\n") + 1, EOFError("the compressed stream is cut short"))
    return out


def _read(path: Path, encoding: str) -> str:
    """The whole text of ``path`` (gzip by its magic bytes), decoded strictly: a bad byte names its line."""
    raw = path.read_bytes()
    if raw[:2] == GZIP_MAGIC:
        raw = _gunzip(raw, path)
    try:
        return raw.decode(encoding)
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise DataError(f"{path}:{line}: byte {raw[e.start:e.start + 1]!r} is not valid {encoding}; set "
                        "data.encoding=latin-1 (older TREC collections are latin-1) or re-encode the file") from None


def _head(path: Path) -> str:
    """The first non-blank line of ``path`` (gzip read as is), or ''."""
    try:
        with path.open("rb") as f:
            raw = f.read(_SNIFF_BYTES)
    except OSError:
        return ""
    if raw[:2] == GZIP_MAGIC:  # what the start decompresses to, even where the archive is cut short later
        try:
            raw = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(raw, _SNIFF_BYTES)
        except zlib.error:
            return ""
    text = raw.decode("utf-8", errors="replace").removeprefix(BOM)  # a byte-order mark is no content
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def sniff(path: str | os.PathLike) -> str | None:
    """What a file holds by its first line: ``"trec-docs"`` (``<DOC>``), ``"trec-topics"`` (``<top>``),
    ``"trec-qrels"`` (``qid iter docno rel``), or None."""
    p = Path(path)
    if not p.is_file():
        return None
    first = _head(p)
    low = first.lower()
    if re.match(r"<doc[\s>]", low):
        return "trec-docs"
    if re.match(r"<top[\s>]", low):
        return "trec-topics"
    return "trec-qrels" if qrels_form(first) == "trec" else None


def is_trec_folder(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a folder holding a file of TREC SGML documents (at any depth)."""
    p = Path(path)
    return p.is_dir() and any(sniff(f) == "trec-docs" for f in sorted(p.rglob("*")) if not f.name.startswith("."))


def format_hint(path: str | os.PathLike) -> str:
    """``"; this looks like TREC SGML, use data=trec"`` (or topics, qrels) when ``path`` holds a TREC file, else ''."""
    what = sniff(path)
    return {"trec-docs": "; this looks like TREC SGML documents: use data=trec data.path=<file or folder>",
            "trec-topics": "; this looks like TREC topics: pass it as data.queries with data=trec",
            "trec-qrels": "; this looks like trec_eval qrels: pass it as data.qrels"}.get(what or "", "")


def qrels_form(line: str) -> str | None:
    """``"beir"`` (``query-id<TAB>corpus-id<TAB>score`` or its header), ``"trec"`` (``qid iter docno rel``,
    whitespace-separated) or None, by one non-blank line of a qrels file."""
    parts = line.strip().split("\t")
    if len(parts) == 3:
        return "beir"
    cols = line.split()
    if len(cols) == 4 and re.fullmatch(r"-?\d+(\.0*)?", cols[3]):
        return "trec"
    return None


def trec_files(path: str | os.PathLike | Sequence[str | os.PathLike]) -> list[Path]:
    """The files of TREC SGML documents under ``path``: a file, a folder (every file in it that holds TREC SGML,
    recursively, in name order; others are left out and counted) or a list of files."""
    if not isinstance(path, (str, os.PathLike)):
        return [p for x in path for p in trec_files(x)]
    p = Path(path)
    if p.is_file():
        return [p]
    if not p.is_dir():
        raise FileNotFoundError(f"{p}: TREC documents do not exist; pass data.path=<a file or a folder of TREC SGML>")
    files = sorted(f for f in p.rglob("*") if f.is_file() and not f.name.startswith("."))
    docs = [f for f in files if sniff(f) == "trec-docs"]
    for f in files:  # a damaged archive is refused, not left out as if it held something else
        if f not in docs and f.read_bytes()[:2] == GZIP_MAGIC:
            _gunzip(f.read_bytes(), f)
    if not docs:
        raise DataError(f"{p}: no file in this folder starts with <DOC>; pass the folder or file of TREC SGML "
                        "documents")
    if len(docs) < len(files):
        log.info("%s: %d files hold no TREC SGML (e.g. %s) and are left out", p, len(files) - len(docs),
                 next(f.name for f in files if f not in set(docs)))
    return docs


def _fields(body: str, tags: Sequence[str]) -> list[str]:
    """The cleaned contents of every ``<TAG>..</TAG>`` of ``body`` for the names ``tags``, in the order they occur."""
    alt = "|".join(re.escape(t) for t in tags)
    pattern = re.compile(rf"<({alt})(?:\s[^>]*)?>(.*?)</\1\s*>", re.I | re.S)
    out = (normalize_space(html.unescape(_ANY_TAG.sub(" ", m.group(2)))) for m in pattern.finditer(body))
    return [x for x in out if x]


def _title(body: str, title_fields: Sequence[str]) -> str | None:
    """The first of ``title_fields`` (in that order of preference) that ``body`` holds."""
    return next((f[0] for t in title_fields if (f := _fields(body, (t,)))), None)


def _documents(file: Path, text: str) -> Iterable[tuple[int, str]]:
    """``(line, body)`` of each ``<DOC>..</DOC>`` of ``text``; an unclosed or stray tag names its line."""
    line, pos, start, start_line = 1, 0, None, 0
    for m in _DOC_TAG.finditer(text):
        line += text.count("\n", pos, m.start())
        pos = m.start()
        closing = m.group(1) == "/"
        if closing == (start is None):
            what = "</DOC> without its <DOC>" if closing else "<DOC> inside a <DOC> (the one before is not closed)"
            raise DataError(f"{file}:{line}: {what}; every document is <DOC> .. </DOC>")
        if closing:
            yield start_line, text[start:m.start()]
            start = None
        else:
            start, start_line = m.end(), line
    if start is not None:
        raise DataError(f"{file}:{start_line}: <DOC> is never closed; end it with </DOC>")


def _docno(file: Path, line: int, body: str) -> str:
    """The one DOCNO of a document whose ``<DOC>`` is at ``line``: missing, doubled or holding whitespace is refused
    with the line it is on."""
    found = list(_DOCNO.finditer(body))
    if not found or not normalize_space(found[0].group(1)):
        raise DataError(f"{file}:{line}: <DOC> without a <DOCNO>; give every document its <DOCNO>id</DOCNO>")
    doc_id = found[0].group(1).strip()
    if len(found) > 1:
        at = line + body.count("\n", 0, found[1].start())
        raise DataError(f"{file}:{at}: a second <DOCNO> ({found[1].group(1).strip()!r}) in document {doc_id!r} (its "
                        f"<DOC> is at line {line}); a document has one DOCNO: close the first with </DOC> or delete "
                        "one")
    if re.search(r"\s", doc_id):
        at = line + body.count("\n", 0, found[0].start())
        raise DataError(f"{file}:{at}: <DOCNO> {doc_id!r} holds whitespace; a DOCNO is one token (trec_eval reads "
                        "runs and qrels split on whitespace): remove it")
    return doc_id


def _body(body: str, title_fields: Sequence[str]) -> str:
    """The text of a ``<DOC>`` without text fields: everything in it but its DOCNO and title fields, markup dropped."""
    alt = "|".join(re.escape(t) for t in ("DOCNO", *title_fields))
    rest = re.sub(rf"<({alt})(?:\s[^>]*)?>.*?</\1\s*>", " ", body, flags=re.I | re.S)
    return normalize_space(html.unescape(_ANY_TAG.sub(" ", rest)))


def load_trec(path: str | os.PathLike | Sequence[str | os.PathLike], *, text_fields: Sequence[str] = TEXT_FIELDS,
              title_fields: Sequence[str] | None = TITLE_FIELDS, encoding: str = DataOptions.encoding,
              on_empty: str = "error", name: str | None = None):
    """A :class:`gdr.data.Corpus` from TREC SGML documents (see the module docstring); the name defaults to the
    file's or folder's name. A document with none of ``text_fields`` gives its body; an empty one is an empty
    document (``on_empty``)."""
    if path is None:
        raise ValueError("data=trec needs data.path=<a file or a folder of TREC SGML documents>")
    problem = sgml_text_fields(text_fields)
    if problem:
        raise ValueError(f"text_fields={list(text_fields) if not isinstance(text_fields, str) else text_fields!r}: "
                         f"{problem}")
    text_fields, title_fields = list(text_fields), list(title_fields or ())
    has_field = re.compile(rf"<({'|'.join(map(re.escape, text_fields))})[\s>]", re.I)
    closes = re.compile(rf"</({'|'.join(map(re.escape, text_fields))})\s*>", re.I)
    table = DocTable(on_empty=on_empty)
    files = trec_files(path)
    from_body = 0
    for file in files:
        found = 0
        for line, body in _documents(file, _read(file, encoding)):
            found += 1
            where = f"{file}:{line}"
            doc_id = _docno(file, line, body)
            if has_field.search(body):
                opened, closed = len(has_field.findall(body)), len(closes.findall(body))
                if opened != closed:
                    raise DataError(f"{where}: document {doc_id!r} opens <{'>, <'.join(text_fields)}> {opened} "
                                    f"time(s) and closes it {closed}; close each field (</{text_fields[0]}>) before "
                                    "</DOC>")
                text = " ".join(_fields(body, text_fields))
            else:
                text, from_body = _body(body, title_fields), from_body + 1
                if not text and on_empty == "error":
                    tags = list(dict.fromkeys(m.group(1).upper() for m in _OPEN_TAG.finditer(body)))
                    raise DataError(f"{where}: document {doc_id!r} has no <{'>, <'.join(text_fields)}> nor text of "
                                    f"its own (its fields: {', '.join(tags)}); name the fields holding the text with "
                                    "data.text_fields=[...], or add ++data.on_empty=drop (or title) for documents "
                                    "without one")
            table.add(doc_id, text, title=_title(body, title_fields), where=where)
        if not found:
            raise DataError(f"{file}: no <DOC> .. </DOC> in this file{format_hint(file)}; pass TREC SGML documents "
                            "as data.path")
    _refuse_id_texts(table, text_fields)
    if from_body:
        log.info("%s: %d of %d documents have no <%s>: their text is the body of <DOC> (minus DOCNO and the title "
                 "fields)", path, from_body, len(table), ">, <".join(text_fields))
    root = Path(path) if isinstance(path, (str, os.PathLike)) else files[0]
    stem = root.name.removesuffix(".gz").rsplit(".", 1)[0] if root.is_file() else root.name
    return table.build(name or stem or root.name, str(root))


def _refuse_id_texts(table: DocTable, text_fields: Sequence[str]) -> None:
    """Refuse a collection whose every text is one id-like token (a DOCID or file id named as the text field)."""
    texts = [x for x in table.texts if x]
    if texts and all(_ID_LIKE.fullmatch(x) for x in texts):
        i = next(i for i, x in enumerate(table.texts) if x)
        raise DataError(f"{table.where[table.doc_ids[i]]}: data.text_fields=[{', '.join(text_fields)}]: every "
                        f"document's text is one id-like token (here {table.texts[i]!r} of {table.doc_ids[i]!r}): "
                        "these fields hold ids, not text; name the fields holding the text")


def read_trec_topics(file: str | os.PathLike, fields: Sequence[str] = QUERY_TOPIC_FIELDS,
                     encoding: str = DataOptions.encoding) -> list[tuple[int, dict]]:
    """``(line, {"_id": number, "text": the chosen fields joined})`` of each ``<top>`` of ``file``, in file order:
    the record form :func:`gdr.data.beir.read_query_texts` reads."""
    bad = [f for f in fields if f not in TOPIC_FIELDS]
    if bad or not fields:
        raise ValueError(f"data.topic_fields={list(fields)}: choose among {', '.join(TOPIC_FIELDS)}, e.g. [title] "
                         "or [title, desc]")
    file = Path(file)
    text = _read(file, encoding)
    out, line, pos = [], 1, 0
    for m in _TOP.finditer(text):
        line += text.count("\n", pos, m.start())
        pos = m.start()
        body = m.group(1)
        num = _topic_field(body, "num")
        if not num:
            raise DataError(f"{file}:{line}: <top> without a <num>; give every topic its <num> Number: ..")
        chosen = [x for f in fields if (x := _topic_field(body, f))]
        if not chosen:
            raise DataError(f"{file}:{line}: topic {num!r} has no <{'>, <'.join(fields)}>; fill it in, or choose "
                            f"others with data.topic_fields (some of {', '.join(TOPIC_FIELDS)})")
        out.append((line, {"_id": num, "text": " ".join(chosen)}))
    if not out:
        raise DataError(f"{file}: no <top> in this file; TREC topics are <top> <num> .. <title> .. </top>")
    return out


def _topic_field(body: str, tag: str) -> str:
    """The text after ``<tag>`` up to the next tag (TREC topics seldom close their fields), label dropped."""
    m = re.search(rf"<{tag}(?:\s[^>]*)?>(.*?)(?=<[/A-Za-z]|\Z)", body, re.I | re.S)
    if m is None:
        return ""
    value = re.sub(rf"^\s*{_TOPIC_LABEL[tag]}", "", m.group(1), flags=re.I)
    return normalize_space(html.unescape(value))
