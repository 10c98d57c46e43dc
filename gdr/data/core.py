"""Corpus and QuerySet containers, the data folder, and strict line-level readers.

A :class:`Corpus` holds documents (doc_id, text, optional title, optional label); a
:class:`QuerySet` holds queries (qid, text, relevant doc_ids, split). Both keep plain
Python lists for fast access and expose a ``datasets.Dataset`` view on demand.

Loaders (``gdr.data.reuters`` etc.) parse raw files through :func:`iter_lines` and
:class:`DocTable`, so that every problem is reported as ``file:line: what is wrong;
how to fix it`` and anything filtered is counted in ``info["filtered"]``.
"""
from __future__ import annotations

import gzip
import logging
import os
import re
import zlib
from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import numpy as np

from gdr.data.options import DataOptions
from gdr.logs import log_once, warn_once
from gdr.paths import cache_dir, checkout

__all__ = [
    "Corpus",
    "QuerySet",
    "DataError",
    "data_dir",
    "require_file",
    "iter_lines",
    "normalize_space",
    "DocTable",
    "ON_EMPTY",
]

log = logging.getLogger(__name__)

ON_EMPTY = ("error", "drop", "keep", "title")
SPLITS = ("train", "dev", "test")  # the query splits a QuerySet holds
# docids.tsv is tab-separated, and qrels and TREC runs (run.trec, bm25.trec) are split on any whitespace by
# trec_eval and ir_measures: an id with a space would shift every column after it
_ID_BREAKS = re.compile(r"\s")


def id_problem(value: str) -> str | None:
    """What makes ``value`` unusable as a document or query id (a tab, a line break or other whitespace), or None."""
    found = _ID_BREAKS.search(value)
    if found is None:
        return None
    named = {"\t": "a tab", "\n": "a line break", "\r": "a line break", " ": "a space"}
    what = named.get(found.group(), f"whitespace ({found.group()!r})")
    return f"holds {what}, which splits the columns of run and qrels files"


def id_value_problem(v) -> str | None:
    """Why a raw value cannot be a document or query id, or None: ids are strings or integers. The one judge of
    every route in (``Corpus(...)``, ``from_texts``, ``from_pandas``, ``from_dataset``, JSONL and TSV files), so
    the same value is refused the same way wherever it comes from."""
    if isinstance(v, str):
        return None if v.strip() else "is empty"
    if v is None or (isinstance(v, float) and v != v):
        return "is missing (None/NaN)"
    if isinstance(v, bool) or type(v).__name__ == "bool_":
        return f"is the boolean {v!r}, which would read as {str(v)!r}"
    if isinstance(v, float) or type(v).__name__.startswith("float"):
        return f"is the float {v!r}, which would read as {str(v)!r}"
    if isinstance(v, int) or type(v).__name__.startswith(("int", "uint")):
        return None
    return f"is a {type(v).__name__} ({v!r:.40})"


def text_value_problem(v) -> str | None:
    """Why a raw value cannot be a document's text, or None: texts are strings (empty ones are ``on_empty``'s)."""
    if isinstance(v, str):
        return None
    if v is None or (isinstance(v, float) and v != v):
        return "is missing (None/NaN)"
    return f"is a {type(v).__name__} ({v!r:.40}), not a string"


def _id_strings(values, what: str) -> list[str]:
    """Ids as strings; a missing one (None, NaN), a float (1.0 would become '1.0') or a boolean is refused by row."""
    values = list(values)
    if set(map(type, values)) <= {str} and all(values):  # the common case, without a Python loop
        return values
    for i, v in enumerate(values):
        why = id_value_problem(v)
        if why:
            raise DataError(f"{what} row {i}: the id {why}; ids are strings or integers (a float column: "
                            ".astype('Int64').astype(str), or drop the rows without an id)")
    return [str(v) for v in values]


class DataError(ValueError):
    """Bad input data. The message names the file, the line or id, and the fix."""


# ---------------------------------------------------------------------------- paths

def data_dir() -> Path:
    """Root of the data sets' default folders: ``$GDR_DATA_DIR``; else, in a source checkout, the development
    default ``<repo>/../shared/data`` (CI clones the repository with ``shared/`` beside it); else, installed
    from a wheel, ``<cache>/data`` under gdr's cache (:func:`gdr.paths.cache_dir`). Never the working
    directory.
    """
    env = os.environ.get("GDR_DATA_DIR")
    if env:
        return Path(env).expanduser().resolve()
    root = checkout()
    if root is not None:
        return (root / ".." / "shared" / "data").resolve()
    return cache_dir() / "data"


def require_file(path: str | os.PathLike, what: str, fix: str = "") -> Path:
    """Return ``path`` as a Path if it is a file, else raise FileNotFoundError saying what it is."""
    p = Path(path)
    if not p.is_file():
        hint = f"; {fix}" if fix else ""
        where = "is a folder, not a file" if p.is_dir() else "does not exist"
        raise FileNotFoundError(f"{p}: {what} {where}{hint}")
    return p


def require_dir(path: str | os.PathLike, what: str, fix: str = "") -> Path:
    p = Path(path)
    if not p.is_dir():
        hint = f"; {fix}" if fix else ""
        raise FileNotFoundError(f"{p}: {what} folder does not exist{hint}")
    return p


# ---------------------------------------------------------------------------- readers

GZIP_MAGIC = b"\x1f\x8b"  # the first two bytes of a gzip file
BOM = "\ufeff"  # a byte-order mark, as some editors (and Excel) open a UTF-8 file


def iter_lines(path: str | os.PathLike, encoding: str = DataOptions.encoding) -> Iterator[tuple[int, str]]:
    """Yield ``(lineno, line)`` (1-based, line ending stripped); a gzip file (by its first bytes, whatever its
    name) is read transparently, and a byte-order mark opening the file is dropped.

    Each line is decoded strictly, so undecodable bytes raise a :class:`DataError`
    naming the file, line and column instead of turning into replacement characters.
    """
    path = Path(path)
    with open(path, "rb") as f:
        opener = gzip.open if f.read(2) == GZIP_MAGIC else open
    with opener(path, "rb") as f:
        for lineno, raw in enumerate(checked_lines(f, path), 1):
            try:
                line = raw.decode(encoding)
            except UnicodeDecodeError as e:
                raise DataError(
                    f"{path}:{lineno}: byte {raw[e.start:e.start + 1]!r} at column {e.start + 1} is not "
                    f"valid {encoding}; re-encode the file as UTF-8 (e.g. `iconv -f latin1 -t utf-8`) "
                    "or fix that line"
                ) from None
            yield lineno, (line.removeprefix(BOM) if lineno == 1 else line).rstrip("\r\n")


def gzip_damage(path: Path, line: int, error: Exception) -> DataError:
    """The one-line refusal of a gzip archive that ends early or is damaged at ``line`` (1-based)."""
    return DataError(f"{path}:{line}: the gzip archive ends early or is damaged here ({error or type(error).__name__});"
                     f" download or compress it again (`gzip -t {path}` checks one)")


def checked_lines(lines: Iterable[bytes], path: Path) -> Iterator[bytes]:
    """The lines of an open file (``gzip.open`` or plain); a truncated or damaged gzip stream is refused naming the
    line it stops at."""
    read = 0
    try:
        for raw in lines:
            read += 1
            yield raw
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise gzip_damage(path, read + 1, e) from None


_WS = re.compile(r"\s+")


def normalize_space(s: str) -> str:
    """Collapse every whitespace run (newlines included) into one space and strip the ends."""
    return _WS.sub(" ", s).strip()


# ---------------------------------------------------------------------------- builder

class DocTable:
    """Accumulates parsed documents, checking each one where it was read.

    Parameters
    ----------
    on_empty : {"error", "drop", "keep", "title"}
        What to do with a document whose text is empty: raise (default), drop it
        (counted in ``info["filtered"]["empty_text"]``), keep it as is (ids listed in
        ``info["empty_text"]``) or use its title as text (ids in ``info["text_from_title"]``;
        an error when the title is empty too).
    in_memory : the documents were given as Python objects (``Corpus.from_texts`` ...), not read from files: the
        errors say to fix the list, not the path or the loader's options.
    """

    def __init__(self, on_empty: str = "error", in_memory: bool = False):
        if on_empty not in ON_EMPTY:
            raise ValueError(f"on_empty={on_empty!r}; use one of {ON_EMPTY}")
        self.on_empty, self.in_memory = on_empty, in_memory
        self.doc_ids: list[str] = []
        self.texts: list[str] = []
        self.titles: list[str | None] = []
        self.labels: list[str | None] = []
        self.where: dict[str, str] = {}
        self.filtered: Counter[str] = Counter()
        self.empty_text: list[str] = []
        self.text_from_title: list[str] = []

    def __len__(self) -> int:
        return len(self.doc_ids)

    def add(self, doc_id: str, text: str, title: str | None = None, label: str | None = None,
            where: str = "") -> None:
        """Add one document read at ``where`` (``"file:line"``)."""
        if not doc_id:
            raise DataError(f"{where}: empty doc id; give every document a non-empty id")
        if id_problem(doc_id):
            raise DataError(f"{where}: doc id {doc_id!r} {id_problem(doc_id)}; remove it from the id")
        if doc_id in self.where:
            raise DataError(
                f"{where}: duplicate doc_id {doc_id!r} (first seen at {self.where[doc_id]}); "
                "give each document a unique id or delete the duplicate"
            )
        title = title or None
        if not text.strip():
            if self.on_empty == "drop":
                self.filtered["empty_text"] += 1
                return
            if self.on_empty == "keep":
                self.empty_text.append(doc_id)
            elif self.on_empty == "title" and title:
                text = title
                self.text_from_title.append(doc_id)
            else:
                extra = " and no title" if self.on_empty == "title" else ""
                if self.in_memory:
                    raise DataError(f"{where}: document {doc_id!r} has empty text{extra}; give it a text or leave it "
                                    "out of what you pass")
                raise DataError(
                    f"{where}: document {doc_id!r} has empty text{extra}; fill it in or delete the record, "
                    "or add ++data.on_empty=drop to the command to skip such documents (counted in "
                    "corpus.info['filtered']), ++data.on_empty=title to use the title as text, or "
                    "++data.on_empty=keep (in Python: load_corpus(..., on_empty='drop'))"
                )
        self.where[doc_id] = where
        self.doc_ids.append(doc_id)
        self.texts.append(text)
        self.titles.append(title)
        self.labels.append(label)

    def build(self, name: str, source: str, info: dict | None = None) -> "Corpus":
        """The finished :class:`Corpus`; empty title/label columns become ``None``."""
        if not self.doc_ids:
            raise DataError(f"{source}: no documents given; pass at least one" if self.in_memory else
                            f"{source}: no documents were read; check that the path points at the data")
        info = dict(info or {})
        info.setdefault("source", source)
        filtered = Counter(info.get("filtered", {}))
        filtered.update(self.filtered)
        info["filtered"] = dict(filtered)
        if self.empty_text:
            info["empty_text"] = list(self.empty_text)
            warn_once(log, "%s: kept %d documents with empty text: %s", source, len(self.empty_text),
                      ", ".join(self.empty_text[:10]))
        if self.text_from_title:
            info["text_from_title"] = list(self.text_from_title)
            log_once(log, logging.INFO, "%s: %d documents have no body; their title is used as text",
                     source, len(self.text_from_title))
        if any(filtered.values()):
            log_once(log, logging.INFO, "%s: filtered %s", source,
                     ", ".join(f"{k}={v}" for k, v in filtered.items() if v))
        titles = self.titles if any(t is not None for t in self.titles) else None
        labels = self.labels if all(lab is not None for lab in self.labels) else None
        if labels is None and any(lab is not None for lab in self.labels):
            missing = next(d for d, lab in zip(self.doc_ids, self.labels) if lab is None)
            raise DataError(f"{self.where[missing]}: document {missing!r} has no label while others do; "
                            "label every document or none")
        corpus = Corpus(name=name, doc_ids=self.doc_ids, texts=self.texts, titles=titles,
                        labels=labels, info=info)
        log_once(log, logging.INFO, "loaded %s: %d documents from %s", name, len(corpus), source)
        return corpus


# ---------------------------------------------------------------------------- helpers

def _take(xs: list, idx: np.ndarray) -> list:
    """``[xs[i] for i in idx]`` done in C (object-array fancy indexing)."""
    if len(idx) == 0:
        return []
    arr = np.empty(len(xs), dtype=object)
    arr[:] = xs
    return arr[idx].tolist()


def _as_indices(indices: Iterable[int] | np.ndarray, n: int, what: str) -> np.ndarray:
    idx = np.asarray(list(indices) if not isinstance(indices, np.ndarray) else indices)
    if idx.dtype == bool:
        if idx.shape != (n,):
            raise ValueError(f"{what}.select: boolean mask of shape {idx.shape}, expected ({n},)")
        return np.flatnonzero(idx)
    if idx.size == 0:
        return np.zeros(0, dtype=np.int64)
    if idx.ndim != 1 or not np.issubdtype(idx.dtype, np.integer):
        raise ValueError(f"{what}.select: expected a 1-D sequence of integer positions, got dtype "
                         f"{idx.dtype} and shape {idx.shape}")
    if idx.min() < -n or idx.max() >= n:
        raise IndexError(f"{what}.select: position out of range for {n} items "
                         f"(min {idx.min()}, max {idx.max()})")
    return idx.astype(np.int64) % max(n, 1)


def _first_duplicate(items: Sequence[str]) -> str | None:
    seen: set[str] = set()
    for x in items:
        if x in seen:
            return x
        seen.add(x)
    return None


def _join_title(title: str | None, text: str, sep: str) -> str:
    if not title:
        return text
    t = title.strip()
    if text.startswith(t):  # Cranfield repeats the title at the start of the abstract
        return text
    if sep == ". " and t[-1:] in ".!?:;":
        return f"{t} {text}"
    return f"{t}{sep}{text}"


# ---------------------------------------------------------------------------- Corpus

def _strings(values, what: str, expect: str) -> list[str]:
    """``values`` as a list of strings; a bare string or non-strings (NaN included) are refused with what to pass."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise TypeError(f"{what}: got {type(values).__name__}; pass {expect}")
    out = list(values)
    if set(map(type, out)) <= {str}:  # the common case, without a Python loop
        return out
    bad = next((i for i, v in enumerate(out) if text_value_problem(v)), None)
    if bad is not None:
        raise TypeError(f"{what}: item {bad} {text_value_problem(out[bad])}; pass {expect}")
    return [str(v) for v in out]  # str subclasses (numpy.str_) as plain strings


def _column(values, what: str, n: int, optional: bool = False) -> list | None:
    if values is None and optional:
        return None
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
        raise TypeError(f"{what}: got {type(values).__name__}; pass a list with one entry per document")
    out = [None if v is None or v != v else str(v) for v in values]  # NaN (pandas' missing) is missing
    if len(out) != n:
        raise ValueError(f"{what}: {len(out)} entries for {n} documents; pass one per document")
    return out


ID_FIELDS = ("_id", "id", "doc_id")  # a document's id field or column, the first present (BEIR's first)


def _label(x) -> str:
    """A label as a string: an integral float (pandas' int column with a gap) as the integer."""
    return str(int(x)) if isinstance(x, float) and x.is_integer() else str(x)


def _id_column(cols: list[str], id_column: str | None, who: str, option: str) -> str | None:
    if id_column is None:
        return None
    if id_column == "auto":
        return next((c for c in ID_FIELDS if c in cols), None)
    if id_column not in cols:
        raise DataError(f"{who}: no id column {id_column!r} (columns: {', '.join(cols)}); pass {option}=<column>, "
                        "or None to number the rows")
    return id_column


def _check_ids(ids: list[str], what: str) -> None:
    """Refuse the first id with a tab or a line break, naming it and its row."""
    if not _ID_BREAKS.search("\x00".join(ids)):  # one scan of all ids
        return
    bad = next((i for i, d in enumerate(ids) if id_problem(d)), None)
    if bad is not None:
        raise DataError(f"{what} {ids[bad]!r} (row {bad}) {id_problem(ids[bad])}; remove it from the id")


def _columns_as_lists(obj, cols, n: int, owner: str, key: str, unit: str) -> None:
    """Turn each non-None column of ``obj`` into a list and check it has one entry per row."""
    for col in cols:
        v = getattr(obj, col)
        if v is not None:
            v = list(v)
            setattr(obj, col, v)
            if len(v) != n:
                raise ValueError(f"{owner}: {len(v)} {col} for {n} {key}; every column needs one entry per {unit}")


@dataclass(eq=False, repr=False)
class Corpus:
    """Documents: ids, texts, optional titles and labels, plus loader ``info``.

    Attributes
    ----------
    name : str
        Short name (``"r5"``, ``"cranfield"``, a BEIR folder name, ...).
    doc_ids : list[str] of length n_docs
        Unique document ids.
    texts : list[str] of length n_docs
        Document bodies (titles kept separately).
    titles : list[str | None] of length n_docs, or None when no document has a title.
    labels : list[str] of length n_docs, or None for unlabelled corpora.
    info : dict
        What the loader did: ``source``, ``filtered`` (reason -> count), label counts, ...
    """

    name: str
    doc_ids: list[str]
    texts: list[str]
    titles: list[str | None] | None = None
    labels: list[str] | None = None
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.doc_ids = _id_strings(self.doc_ids, f"Corpus {self.name!r}: doc_ids")
        self.texts = _strings(self.texts, f"Corpus {self.name!r}: texts", "one string per document")
        n = len(self.doc_ids)
        _columns_as_lists(self, ("texts", "titles", "labels"), n, f"Corpus {self.name!r}", "doc_ids", "document")
        dup = _first_duplicate(self.doc_ids) if len(set(self.doc_ids)) != n else None
        if dup is not None:
            raise DataError(f"Corpus {self.name!r}: duplicate doc_id {dup!r}; doc ids must be unique")
        _check_ids(self.doc_ids, f"Corpus {self.name!r}: doc_id")

    # ------------------------------------------------------------------ basics
    def __len__(self) -> int:
        return len(self.doc_ids)

    def __repr__(self) -> str:
        extra = []
        if self.titles is not None:
            extra.append("titles")
        if self.labels is not None:
            extra.append(f"{len(set(self.labels))} labels")
        return f"Corpus(name={self.name!r}, n_docs={len(self)}{', ' + ', '.join(extra) if extra else ''})"

    def __getitem__(self, i: int) -> dict[str, Any]:
        """One document as a dict with keys doc_id, text, title, label."""
        return {
            "doc_id": self.doc_ids[i],
            "text": self.texts[i],
            "title": None if self.titles is None else self.titles[i],
            "label": None if self.labels is None else self.labels[i],
        }

    @cached_property
    def _pos(self) -> dict[str, int]:
        return {d: i for i, d in enumerate(self.doc_ids)}

    def indices(self, doc_ids: Iterable[str]) -> np.ndarray:
        """Positions of ``doc_ids`` in this corpus, of shape (len(doc_ids),); unknown ids raise."""
        pos = self._pos
        out = []
        for d in doc_ids:
            if d not in pos:
                raise KeyError(f"doc_id {d!r} is not in corpus {self.name!r} ({len(self)} documents)")
            out.append(pos[d])
        return np.asarray(out, dtype=np.int64)

    @property
    def label_names(self) -> list[str]:
        """Sorted distinct labels ([] for an unlabelled corpus)."""
        return sorted(set(self.labels)) if self.labels is not None else []

    # ------------------------------------------------------------------ subsets
    def check_same_ids(self, doc_ids: Sequence[str], source: str) -> None:
        """Refuse ``doc_ids`` (the rows of a matrix or run built from a corpus, read from ``source``) unless they are
        this corpus's ids in order, naming the count or the first row that differs."""
        if doc_ids is None:
            raise DataError(f"{source} names no documents (no doc_ids.json): not a finished `gdr score` run")
        ids = [str(d) for d in doc_ids]
        if len(ids) != len(self):
            raise DataError(f"{source} holds {len(ids)} documents, corpus {self.name!r} {len(self)}: it was built from "
                            "another corpus; pass the corpus it was built from")
        row = next((i for i, (a, b) in enumerate(zip(ids, self.doc_ids)) if a != b), None)
        if row is not None:
            raise DataError(f"{source}: row {row} is document {ids[row]!r}, corpus {self.name!r} has "
                            f"{self.doc_ids[row]!r} there: it was built from another corpus (or order); pass the "
                            "corpus it was built from")

    def select(self, indices: Iterable[int] | np.ndarray) -> "Corpus":
        """Subset in the order of ``indices`` (integer positions or a boolean mask of shape (n_docs,))."""
        idx = _as_indices(indices, len(self), "Corpus")
        return Corpus(
            name=self.name,
            doc_ids=_take(self.doc_ids, idx),
            texts=_take(self.texts, idx),
            titles=None if self.titles is None else _take(self.titles, idx),
            labels=None if self.labels is None else _take(self.labels, idx),
            info=dict(self.info),
        )

    def sample(self, n: int | None, seed: int = DataOptions.seed) -> "Corpus":
        """``n`` documents uniformly without replacement, kept in corpus order; deterministic in ``seed``.

        ``n=None`` or ``n >= len(self)`` returns the whole corpus.
        """
        if n is not None and n > len(self):
            log.info("%s: n_docs=%d asked, the corpus has %d documents: all of them are kept", self.name, n, len(self))
        if n is None or n >= len(self):
            return self
        if n < 0:
            raise ValueError(f"Corpus.sample: n={n}; use a non-negative number of documents or None for all")
        rng = np.random.default_rng(seed)
        idx = np.sort(rng.choice(len(self), size=n, replace=False))
        out = self.select(idx)
        out.info["sample"] = {"n": int(n), "seed": int(seed), "of": len(self)}
        return out

    # ------------------------------------------------------------------ views
    def model_inputs(self, with_title: bool = True, sep: str = ". ") -> list[str]:
        """Texts as fed to a model: ``"title. text"`` where a title exists, else the text.

        No separator is doubled when the title already ends with punctuation, and the
        title is not prepended when the text already starts with it (Cranfield).
        ``sep="\\n"`` gives ``"title\\ntext"``.
        """
        if not with_title or self.titles is None:
            return list(self.texts)
        return [_join_title(t, x, sep) for t, x in zip(self.titles, self.texts)]

    @cached_property
    def dataset(self):
        """A ``datasets.Dataset`` with string columns doc_id, text, title, label (None where absent)."""
        import datasets  # lazy: `gdr --help`, `import gdr` stay light

        n = len(self)
        features = datasets.Features({c: datasets.Value("string") for c in ("doc_id", "text", "title", "label")})
        return datasets.Dataset.from_dict(
            {
                "doc_id": self.doc_ids,
                "text": self.texts,
                "title": self.titles if self.titles is not None else [None] * n,
                "label": self.labels if self.labels is not None else [None] * n,
            },
            features=features,
        )

    @classmethod
    def from_texts(cls, texts: Sequence[str], ids: Sequence[str] | None = None, *,
                   titles: Sequence[str | None] | None = None, labels: Sequence[str] | None = None,
                   name: str = "texts") -> "Corpus":
        """A Corpus from a list of document texts; ``ids`` default to ``"0" .. "n-1"``.

        >>> Corpus.from_texts(["a cat on a mat", "stock markets fell"])
        Corpus(name='texts', n_docs=2)
        """
        texts = _strings(texts, "texts", "a list of document strings")
        if ids is None:
            ids = [str(i) for i in range(len(texts))]
        elif isinstance(ids, (str, bytes)) or not hasattr(ids, "__len__"):
            raise TypeError(f"ids: got {type(ids).__name__}; pass a list with one id per document")
        elif len(ids) != len(texts):
            raise ValueError(f"ids: {len(ids)} entries for {len(texts)} documents; pass one per document")
        else:
            ids = _id_strings(ids, "ids")
        return cls._checked(name, ids, texts, _column(titles, "titles", len(texts), True),
                            _column(labels, "labels", len(texts), True), {"source": "texts"})

    @classmethod
    def from_pandas(cls, df, *, id_column: str | None = "auto", text_column: str = "text",
                    title_column: str | None = "title", label_column: str | None = "label",
                    name: str = "dataframe") -> "Corpus":
        """A Corpus from a ``pandas.DataFrame``: one row per document.

        ``id_column``: ``auto`` = the first of ``_id``, ``id``, ``doc_id`` among the columns (as a file's reader
        takes them), else the DataFrame's
        index; None = the index. ``title_column`` and ``label_column`` are used where the column exists (None: never).
        """
        if not (hasattr(df, "columns") and hasattr(df, "index") and hasattr(df, "__getitem__")):
            raise TypeError(f"from_pandas: df is a {type(df).__name__}; pass a pandas.DataFrame (or use "
                            "Corpus.from_texts for a list of strings, Corpus.from_dataset for a datasets.Dataset)")
        cols = [str(c) for c in df.columns]
        get = lambda c: df[c].tolist()  # noqa: E731
        id_col = _id_column(cols, id_column, "from_pandas", "id_column")
        ids = get(id_col) if id_col else [str(i) for i in df.index.tolist()]
        return cls._from_columns(name, cols, get, ids, text_column, title_column, label_column, "from_pandas",
                                 {"source": "pandas.DataFrame"})

    @classmethod
    def from_dataset(cls, ds, name: str = "dataset", info: dict | None = None, *, id_column: str | None = "auto",
                     text_column: str = "text", title_column: str | None = "title",
                     label_column: str | None = "label") -> "Corpus":
        """A Corpus from a ``datasets.Dataset``, one row per document: columns as in :meth:`from_pandas`
        (``auto`` id: ``_id``, ``id`` or ``doc_id``; None: the row numbers)."""
        if not hasattr(ds, "column_names"):
            raise TypeError(f"from_dataset: ds is a {type(ds).__name__}; pass a datasets.Dataset (or use "
                            "Corpus.from_pandas for a DataFrame, Corpus.from_texts for a list of strings)")
        cols = list(ds.column_names)
        get = lambda c: list(ds[c])  # noqa: E731
        id_col = _id_column(cols, id_column, "from_dataset", "id_column")
        ids = get(id_col) if id_col else [str(i) for i in range(len(ds))]
        return cls._from_columns(name, cols, get, ids, text_column, title_column, label_column, "from_dataset",
                                 dict(info or {"source": "datasets.Dataset"}))

    @classmethod
    def _from_columns(cls, name, cols, get, ids, text_column, title_column, label_column, who, info) -> "Corpus":
        if text_column not in cols:
            raise DataError(f"{who}: no text column {text_column!r} (columns: {', '.join(cols)}); "
                            "pass text_column=<the column of the document texts>")
        def optional(col):  # a missing value is None (pandas holds NaN there)
            return [None if v is None or v != v else v for v in get(col)] if col and col in cols else None

        titles, labels = optional(title_column), optional(label_column)
        if titles is not None:  # stripped, as a file's reader strips them: the same rows, the same corpus
            titles = [None if t is None else str(t).strip() or None for t in titles]
        if titles is not None and all(t is None for t in titles):
            titles = None
        if labels is not None and all(lab is None for lab in labels):
            labels = None
        texts = _strings(get(text_column), f"{who}: column {text_column!r}", "strings (one document text each)")
        # a label missing in some rows is refused by the table; 1.0 (a float column with a gap) is the label 1
        return cls._checked(name, _id_strings(ids, f"{who}: id column"), texts, titles,
                            None if labels is None else [None if x is None else _label(x) for x in labels], info)

    @classmethod
    def _checked(cls, name, ids, texts, titles, labels, info) -> "Corpus":
        """Through :class:`DocTable`, so that an empty id, a duplicate or an empty text is refused as a loader
        refuses it, naming the row."""
        table = DocTable(on_empty="error", in_memory=True)
        for i, d in enumerate(ids):
            table.add(d, texts[i], title=None if titles is None else titles[i],
                      label=None if labels is None else labels[i], where=f"{name} row {i}")
        return table.build(name, info.get("source", name), info)


# ---------------------------------------------------------------------------- QuerySet

@dataclass(eq=False, repr=False)
class QuerySet:
    """Queries with their relevant documents.

    Attributes
    ----------
    name : str
    qids : list[str] of length n_queries
        Query ids, unique within a split.
    texts : list[str] of length n_queries
    relevant : list[list[str]] of length n_queries
        Relevant doc ids per query (at least one each), in the order the judgements were read.
    splits : list[str] of length n_queries
        ``"train"``, ``"dev"``, ``"test"``, ...
    grades : list[list[int]] aligned with ``relevant``, or None
        The grade of each relevant doc, higher more relevant (Cranfield: 5 - its code, 4 = most relevant).
    info : dict
        What the loader did (``source``, ``filtered``, ...).
    """

    name: str
    qids: list[str]
    texts: list[str]
    relevant: list[list[str]]
    splits: list[str]
    grades: list[list[int]] | None = None
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.qids = _id_strings(self.qids, f"QuerySet {self.name!r}: qids")
        n = len(self.qids)
        _columns_as_lists(self, ("texts", "relevant", "splits", "grades"), n, f"QuerySet {self.name!r}", "qids",
                          "query")
        _check_ids(self.qids, f"QuerySet {self.name!r}: qid")
        self.texts = _strings(self.texts, f"QuerySet {self.name!r}: texts", "one query string per qid")
        self._check_relevant()
        if not set(self.splits) <= set(SPLITS):
            odd = next(i for i, s in enumerate(self.splits) if s not in SPLITS)
            raise DataError(f"QuerySet {self.name!r}: query {self.qids[odd]!r} has split {self.splits[odd]!r}; a split "
                            f"is one of {', '.join(SPLITS)}")
        if self.grades is not None:
            for q, r, g in zip(self.qids, self.relevant, self.grades):
                if len(r) != len(g):
                    raise ValueError(f"QuerySet {self.name!r}: query {q!r} has {len(r)} relevant docs "
                                     f"but {len(g)} grades")
        keys = list(zip(self.splits, self.qids))
        if len(set(keys)) != n:
            split, qid = _first_duplicate([f"{s}\x00{q}" for s, q in keys]).split("\x00")  # type: ignore[union-attr]
            raise DataError(f"QuerySet {self.name!r}: duplicate qid {qid!r} in split {split!r}; "
                            "query ids must be unique within a split")

    def _check_relevant(self) -> None:
        """Each query's relevant ids are a list of ids (``relevant=["d0"]`` would read as ['d', '0'])."""
        for q, rel in zip(self.qids, self.relevant):
            if not isinstance(rel, (list, tuple)):
                raise DataError(f"QuerySet {self.name!r}: query {q!r}: relevant is {rel!r:.40}; pass one list of "
                                "relevant doc ids per query, e.g. relevant=[['d0'], ['d3', 'd7']]")
            bad = next((d for d in rel if id_value_problem(d)), None) if set(map(type, rel)) - {str} else None
            if bad is not None:
                raise DataError(f"QuerySet {self.name!r}: query {q!r}: relevant doc id {bad!r} "
                                f"{id_value_problem(bad)}; doc ids are strings")
        self.relevant = [[str(d) for d in rel] if not isinstance(rel, list) or set(map(type, rel)) - {str} else rel
                         for rel in self.relevant]

    def __len__(self) -> int:
        return len(self.qids)

    def __repr__(self) -> str:
        counts = Counter(self.splits)
        return f"QuerySet(name={self.name!r}, n_queries={len(self)}, splits={dict(counts)})"

    @property
    def split_names(self) -> list[str]:
        """Distinct splits in order of first appearance."""
        return list(dict.fromkeys(self.splits))

    def select(self, indices: Iterable[int] | np.ndarray) -> "QuerySet":
        """Subset in the order of ``indices`` (integer positions or a boolean mask of shape (n_queries,))."""
        idx = _as_indices(indices, len(self), "QuerySet")
        return QuerySet(
            name=self.name,
            qids=_take(self.qids, idx),
            texts=_take(self.texts, idx),
            relevant=_take(self.relevant, idx),
            splits=_take(self.splits, idx),
            grades=None if self.grades is None else _take(self.grades, idx),
            info=dict(self.info),
        )

    def filter(self, split: str | Sequence[str] | None = None) -> "QuerySet":
        """Queries of the given split(s); ``None`` keeps all. An absent split is an error."""
        if split is None:
            return self
        wanted = [split] if isinstance(split, str) else list(split)
        missing = [s for s in wanted if s not in set(self.splits)]
        if missing:
            raise DataError(f"QuerySet {self.name!r} has no split {missing[0]!r}; "
                            f"available: {self.split_names}")
        mask = np.isin(np.asarray(self.splits, dtype=object), wanted)
        return self.select(mask)

    def qrels(self) -> dict[str, dict[str, int]]:
        """Binary qrels ``{qid: {doc_id: 1}}`` (e.g. for ir_measures); qids must be unique across splits."""
        if len(set(self.qids)) != len(self):
            raise DataError(f"QuerySet {self.name!r}: a qid occurs in several splits; "
                            "call .filter(split=...) first")
        return {q: {d: 1 for d in rel} for q, rel in zip(self.qids, self.relevant)}

    def check_against(self, corpus: Corpus | Iterable[str], source: str = "") -> None:
        """Raise a DataError naming the first query whose relevant doc id is not in ``corpus``."""
        (q, s, d), _ = self._unknown(corpus)[0] or ((None, None, None), 0)
        if d is not None:
            where = f"{source}: " if source else ""
            raise DataError(f"{where}query {q!r} ({s}) names doc_id {d!r}, which is not in the corpus; "
                            "fix the judgement or load the matching corpus")

    def _unknown(self, corpus: Corpus | Iterable[str]) -> tuple[tuple[tuple[str, str, str], int] | None, np.ndarray]:
        """((qid, split, doc id) of the first relevant id not in ``corpus``, how many there are) or None, and a
        mask of shape (n_queries,) of the queries left with a relevant id in it."""
        known = corpus._pos if isinstance(corpus, Corpus) else set(corpus)
        kept = [[d for d in rel if d in known] for rel in self.relevant]
        n = sum(len(r) for r in self.relevant) - sum(len(k) for k in kept)
        if n == 0:
            return None, np.ones(len(self), dtype=bool)
        i = next(i for i, (r, k) in enumerate(zip(self.relevant, kept)) if len(r) != len(k))
        d = next(d for d in self.relevant[i] if d not in known)
        return ((self.qids[i], self.splits[i], d), n), np.array([len(k) > 0 for k in kept], dtype=bool)

    def judged_in(self, corpus: Corpus, drop_unknown: bool = False) -> tuple["QuerySet", int]:
        """These queries with their relevant ids checked against ``corpus``: an id not in it is refused (a DataError
        with how many there are and one of them), or with ``drop_unknown`` dropped with a warning saying the same
        (a query left without a relevant document is dropped too, for a corpus that is a subset). Returns (the
        queries, the number of relevant ids dropped)."""
        first, keep = self._unknown(corpus)
        if first is None:
            return self, 0
        (q, s, d), n = first
        said = (f"{n} relevant doc id(s) of query set {self.name!r} are not in corpus {corpus.name!r} "
                f"(e.g. {d!r} of query {q!r}, {s})")
        if not drop_unknown:
            raise DataError(f"{said}; load the matching corpus, or drop them with drop_unknown_qrels=True "
                            "(gdr.bm25, gdr.evaluate) when the corpus is a subset")
        log.warning("%s: dropped (drop_unknown_qrels); %d of %d queries keep a relevant document", said,
                    int(keep.sum()), len(keep))
        known = corpus._pos
        out = self.select(np.flatnonzero(keep))
        if out.grades is not None:
            out.grades = [[g for x, g in zip(rel, gr) if x in known] for rel, gr in zip(out.relevant, out.grades)]
        out.relevant = [[x for x in rel if x in known] for rel in out.relevant]
        return out, n

    def scored_split(self, corpus: Corpus, split: str, drop_unknown: bool = False) -> tuple["QuerySet", int]:
        """The queries of ``split`` (a split absent from this set is refused, naming those present) judged against
        ``corpus`` (:meth:`judged_in`): what a retriever is scored on. Returns (the queries, the relevant ids
        dropped: here, and by the loader of ``data.drop_unknown_qrels``, ``info["unknown_qrels"]``)."""
        qs, unknown = self.filter(split).judged_in(corpus, drop_unknown)
        unknown += int((self.info.get("unknown_qrels") or {}).get(split, 0))
        if len(qs) == 0:
            raise DataError(f"no {split!r} query of {self.name!r} has a relevant document in corpus {corpus.name!r}")
        return qs, unknown

    @property
    def dataset(self):
        """A ``datasets.Dataset`` with columns qid, text, relevant (list of str), split."""
        import datasets  # lazy: `gdr --help`, `import gdr` stay light

        return datasets.Dataset.from_dict(
            {"qid": self.qids, "text": self.texts, "relevant": self.relevant, "split": self.splits}
        )
