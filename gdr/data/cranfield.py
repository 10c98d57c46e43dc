"""Cranfield (the SMART copy): ``cran.all.1400``, ``cran.qry``, ``cranqrel``.

Quirks handled here (see ``shared/data/README.md``):

- ``cran.qry`` numbers its 225 queries 001..365 with gaps, while ``cranqrel`` numbers them
  1..225 in file order: the i-th query in the file is qrel query ``i``. Query ids are
  therefore ``"1"`` .. ``"225"``; the file's own numbers are in ``info["file_numbers"]``.
- Relevance codes are -1, 1, 2, 3, 4 with 1 = most relevant: codes 1-4 are relevant, -1 is not relevant
  (counted in ``info["nonrelevant_judgements"]``). ``grades`` hold them as gains, higher = more relevant as in
  TREC qrels, ir_datasets and PyTerrier (gain ``5 - code``: code 1 is grade 4, code 4 grade 1), so nDCG and a
  ``min_relevance`` threshold read them the way they read every other collection's.
- Documents 471 and 995 have neither title nor abstract; they are kept (document 995 is
  judged relevant for query 125) and listed in ``corpus.info["empty_text"]``.
- A few records are scrambled in the distribution (a stray ``.A``/``.B``/``.W`` marker line
  inside the abstract of documents 240, 576, 578); everything after the first ``.W`` is the
  abstract, marker lines dropped (their count is ``info["stray_markers"]``).

Query splits: the collection has no official split. :func:`load_cranfield_queries` draws one
with a seeded permutation of the 225 queries, 60/10/30 (``SPLIT_FRACTIONS``): with the default
``seed=0`` that is 135 train, 22 dev, 68 test queries (sizes ``floor(0.6 n)``, ``floor(0.1 n)``
and the rest). Documents are shared by all splits, so a test query may share relevant documents
with a train query; ``split=None`` still gives all 225 (the classic evaluation uses them all).
"""
from __future__ import annotations

import logging
import os
import re
from pathlib import Path

import numpy as np

from gdr.data.core import Corpus, DataError, DocTable, QuerySet, data_dir, iter_lines, normalize_space, require_file

__all__ = ["load_cranfield", "load_cranfield_queries", "query_splits", "RELEVANT_CODES", "SPLIT_FRACTIONS"]

log = logging.getLogger(__name__)

RELEVANT_CODES = (1, 2, 3, 4)
SPLIT_NAMES = ("train", "dev", "test")
SPLIT_FRACTIONS = (0.6, 0.1, 0.3)
NONRELEVANT_CODE = -1
GAIN_OF_CODE = 5  # a relevant code's grade is GAIN_OF_CODE - code: higher = more relevant, as TREC grades
_ID_LINE = re.compile(r"^\.I\s+(\d+)\s*$")
_FIELD = re.compile(r"^\.([TABW])\s*$")
_FIX = ("pass data.path= (path= in Python) the folder holding cran.all.1400, cran.qry and cranqrel, "
        "or set GDR_DATA_DIR")


def _folder(path: str | os.PathLike | None) -> Path:
    return Path(path) if path is not None else data_dir() / "cranfield"


def _records(path: Path) -> list[tuple[str, int, dict[str, list[str]], int]]:
    """Parse a SMART file into ``(id, line, {field: lines}, stray_markers)`` records."""
    records: list[tuple[str, int, dict[str, list[str]], int]] = []
    fields: dict[str, list[str]] = {}
    current: str | None = None
    for lineno, line in iter_lines(path):
        m = _ID_LINE.match(line)
        if m:
            fields, current = {}, None
            records.append((m.group(1), lineno, fields, 0))
            continue
        f = _FIELD.match(line)
        if f:
            if current == "W":  # a marker inside the abstract: the record is scrambled, keep reading text
                rid, ln, flds, stray = records[-1]
                records[-1] = (rid, ln, flds, stray + 1)
                continue
            current = f.group(1)
            fields.setdefault(current, [])
            continue
        if not records:
            if line.strip():
                raise DataError(f"{path}:{lineno}: text before the first '.I <number>' line; "
                                "a SMART file starts with '.I 1'")
            continue
        if current is None:
            if line.strip():
                raise DataError(f"{path}:{lineno}: text outside any field of record "
                                f"{records[-1][0]}; fields start with a '.T', '.A', '.B' or '.W' line")
            continue
        fields[current].append(line)
    return records


def load_cranfield(path: str | os.PathLike | None = None, on_empty: str = "keep") -> Corpus:
    """The 1,400 Cranfield abstracts: doc id = ``.I`` number, title = ``.T``, text = ``.W``.

    ``on_empty="keep"`` (default) keeps documents 471 and 995, which are empty in the
    distribution (ids in ``info["empty_text"]``); ``"drop"`` leaves them out (counted in
    ``info["filtered"]``), ``"error"`` refuses them.
    """
    file = require_file(_folder(path) / "cran.all.1400", "Cranfield documents", _FIX)
    table = DocTable(on_empty=on_empty)
    stray = 0
    for doc_id, lineno, fields, n_stray in _records(file):
        if "W" not in fields:
            raise DataError(f"{file}:{lineno}: record {doc_id} has no '.W' (abstract) field; add an empty "
                            "'.W' line if the abstract is really missing")
        stray += n_stray
        title = normalize_space(" ".join(fields.get("T", []))) or None
        table.add(doc_id, normalize_space(" ".join(fields["W"])), title=title, where=f"{file}:{lineno}")
    return table.build("cranfield", str(file), {"stray_markers": stray})


def query_splits(n: int, seed: int = 0, fractions=SPLIT_FRACTIONS) -> list[str]:
    """Split names for ``n`` queries in file order: a seeded permutation cut into ``floor(f_train n)``
    train, ``floor(f_dev n)`` dev and the rest test (225 queries, seed 0: 135 / 22 / 68)."""
    f = np.asarray(fractions, dtype=np.float64)
    if f.shape != (3,) or (f < 0).any() or not np.isclose(f.sum(), 1.0):
        raise ValueError(f"fractions={tuple(fractions)}; give three non-negative numbers for train/dev/test "
                         "that sum to 1, e.g. (0.6, 0.1, 0.3)")
    n_train, n_dev = (int(np.floor(x * n + 1e-9)) for x in f[:2])  # 1e-9: 0.6 * 225 must be 135, not 134
    which = np.full(n, 2, dtype=np.int64)  # test
    perm = np.random.default_rng(seed).permutation(n)
    which[perm[:n_train]] = 0
    which[perm[n_train:n_train + n_dev]] = 1
    return np.asarray(SPLIT_NAMES, dtype=object)[which].tolist()


def load_cranfield_queries(path: str | os.PathLike | None = None, doc_ids=None, seed: int = 0,
                           fractions=SPLIT_FRACTIONS) -> QuerySet:
    """The 225 Cranfield queries with relevant docs from ``cranqrel``, split 135/22/68 train/dev/test.

    Parameters
    ----------
    path : the Cranfield folder (default ``<data>/cranfield``).
    doc_ids : ids judgements may name (default: the ids in ``cran.all.1400``).
    seed, fractions : the query split (:func:`query_splits`); the default gives 135 train, 22 dev
        and 68 test queries, the same on every machine.

    Returns
    -------
    QuerySet with qids ``"1"`` .. ``"225"`` (the qrel numbering, in file order), ``relevant`` =
    documents with codes 1-4 in ``cranqrel`` order, ``grades`` = their gains ``5 - code`` (4 = most relevant),
    and ``splits`` from :func:`query_splits` (``info["split"]`` records seed and fractions).
    """
    folder = _folder(path)
    qry = require_file(folder / "cran.qry", "Cranfield queries", _FIX)
    qrel = require_file(folder / "cranqrel", "Cranfield relevance judgements", _FIX)
    if doc_ids is None:
        doc_ids = {rid for rid, *_ in _records(require_file(folder / "cran.all.1400", "Cranfield documents", _FIX))}
    texts, file_numbers, lines = _query_texts(qry)
    n = len(texts)
    relevant, grades, nonrel = _judgements(qrel, qry.name, n, set(doc_ids))
    empty = [i for i in range(n) if not relevant[i]]
    if empty:
        i = empty[0]
        raise DataError(f"{qrel}: query {i + 1} ({qry.name}:{lines[i]}, number {file_numbers[i]} there) has no "
                        "relevant document; add a judgement with code 1-4 or delete the query")
    log.info("loaded cranfield queries: %d queries, %d relevant and %d non-relevant judgements",
             n, sum(map(len, relevant)), nonrel)
    return QuerySet(
        name="cranfield",
        qids=[str(i + 1) for i in range(n)],
        texts=texts,
        relevant=relevant,
        splits=query_splits(n, seed, fractions),
        grades=grades,
        info={"source": str(folder), "file_numbers": file_numbers, "nonrelevant_judgements": nonrel,
              "filtered": {}, "grade_meaning": "5 - cranqrel code: 4 = most relevant .. 1 = least",
              "split": {"seed": int(seed), "fractions": [float(x) for x in fractions],
                        "method": "seeded permutation"}},
    )


def _query_texts(qry: Path) -> tuple[list[str], list[str], list[int]]:
    """The query texts of ``cran.qry`` in file order, with the file's own query numbers and their lines."""
    texts, file_numbers, lines = [], [], []
    for number, lineno, fields, _ in _records(qry):
        text = normalize_space(" ".join(fields.get("W", [])))
        if not text:
            raise DataError(f"{qry}:{lineno}: query {number} has no text; add its '.W' text or delete the record "
                            "(and renumber cranqrel, which counts queries in file order)")
        texts.append(text)
        file_numbers.append(number)
        lines.append(lineno)
    return texts, file_numbers, lines


def _judgements(qrel: Path, qry_name: str, n: int, known: set[str]) -> tuple[list[list[str]], list[list[int]], int]:
    """Read ``cranqrel`` for ``n`` queries: per query the relevant doc ids and their gains in file order, and the
    number of non-relevant judgements; a malformed, unknown or repeated judgement names its line."""
    relevant: list[list[str]] = [[] for _ in range(n)]
    grades: list[list[int]] = [[] for _ in range(n)]
    seen: dict[tuple[int, str], int] = {}
    nonrel = 0
    for lineno, line in iter_lines(qrel):
        parts = line.split()
        if not parts:
            continue
        try:
            if len(parts) != 3:
                raise ValueError
            q, d, code = int(parts[0]), str(int(parts[1])), int(parts[2])
        except ValueError:
            raise DataError(f"{qrel}:{lineno}: expected 'query doc code' (three integers), got {line!r}; "
                            "fix or delete that line") from None
        if not 1 <= q <= n:
            raise DataError(f"{qrel}:{lineno}: query number {q} is outside 1..{n}; cranqrel numbers the "
                            f"queries of {qry_name} 1..{n} in file order, so fix the number or the query file")
        if d not in known:
            raise DataError(f"{qrel}:{lineno}: doc id {d!r} is not in cran.all.1400; fix or delete that line")
        if code not in RELEVANT_CODES and code != NONRELEVANT_CODE:
            raise DataError(f"{qrel}:{lineno}: relevance code {code} is not one of -1, 1, 2, 3, 4; "
                            "fix or delete that line")
        if (q, d) in seen:
            raise DataError(f"{qrel}:{lineno}: query {q} and doc {d} were already judged on line "
                            f"{seen[q, d]}; keep one judgement")
        seen[q, d] = lineno
        if code == NONRELEVANT_CODE:
            nonrel += 1
            continue
        relevant[q - 1].append(d)
        grades[q - 1].append(GAIN_OF_CODE - code)
    return relevant, grades, nonrel
