"""Reuters-21578 (Distribution 1.0): the 22 SGML files, parsed here with regular expressions.

R2 and R5 follow the definition in ``shared/data/README.md``: stories that have a BODY
and exactly one TOPICS label, restricted to {earn, acq} (R2, 5,860 stories) or to the
five most frequent topics {earn, acq, crude, trade, money-fx} (R5, 6,807 stories).
Text is the body (entities unescaped, control characters and the trailing
" Reuter &#3;" removed, one paragraph per line); the headline is the title; the
label is the topic; the doc id is NEWID.
"""
from __future__ import annotations

import html
import logging
import os
import re
from collections import Counter
from pathlib import Path
from typing import Iterator, Sequence

from gdr.data.core import Corpus, DataError, DocTable, data_dir, normalize_space, require_dir

__all__ = ["R2_TOPICS", "R5_TOPICS", "load_reuters"]

log = logging.getLogger(__name__)

R2_TOPICS = ("earn", "acq")
R5_TOPICS = ("earn", "acq", "crude", "trade", "money-fx")
N_FILES = 22
N_STORIES = 21_578

_STORY = re.compile(r"<REUTERS([^>]*)>(.*?)</REUTERS>", re.S)
_ATTR = re.compile(r'([A-Z]+)="([^"]*)"')
_TOPICS = re.compile(r"<TOPICS>(.*?)</TOPICS>", re.S)
_D = re.compile(r"<D>(.*?)</D>", re.S)
_TITLE = re.compile(r"<TITLE>(.*?)</TITLE>", re.S)
_BODY = re.compile(r"<BODY>(.*?)</BODY>", re.S)
# The wire trailer: "Reuter", "REUTER...", "reuter^M" (a literal caret-M), "REUTER E" (a stray desk letter) before
# the &#3; end-of-text mark. It must start a line, follow a sentence end or end a table's row of figures
# ("...17 REUTER"), so "... told Reuters" stays.
_TRAILER = re.compile(r"(?:(?:(?<=[\n.!?\"])|(?<=[\d)])(?=\s))\s*reuters?\b(?:\s[a-z](?!\w))?(?:\.\.\.|\^M|\s)*)?"
                      r"\s*(?:&#3;)?\s*$", re.I)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
_PARA = re.compile(r"\n\s{2,}")  # paragraphs start on an indented line


def _clean(raw: str) -> str:
    s = html.unescape(raw)
    s = _CONTROL.sub("", s)
    return s


def _body_text(raw: str) -> str:
    # Only the tail can hold the trailer (regex over the whole body is slow); twice, because a few
    # stories end "REUTER\n Reuter\n&#3;".
    head, tail = raw[:-100], raw[-100:]
    raw = head + _TRAILER.sub("", _TRAILER.sub("", tail))
    paras = (normalize_space(p) for p in _PARA.split(_clean(raw)))
    return "\n".join(p for p in paras if p)


def load_reuters(
    path: str | os.PathLike | None = None,
    topics: Sequence[str] | None = R5_TOPICS,
    split: str | None = None,
    name: str | None = None,
) -> Corpus:
    """Load Reuters-21578 stories with a body and exactly one of ``topics`` as their only TOPICS label.

    Parameters
    ----------
    path : folder holding ``reut2-000.sgm`` .. ``reut2-021.sgm`` (default ``<data>/reuters21578``).
    topics : the topics to keep (``R2_TOPICS``, ``R5_TOPICS`` or any others); ``None`` keeps every story
        with a body, whatever its TOPICS, without labels (corpus ``"reuters"``, 19,043 stories: e.g. the
        training pairs of a query generator, minus the R5 stories).
    split : ``None`` for all stories, or ``"train"`` / ``"test"`` / ``"not-used"`` (the LEWISSPLIT attribute).
    name : corpus name (default ``"r2"`` / ``"r5"`` for those topic sets, else ``"reuters"``).

    Returns
    -------
    Corpus with titles and labels; ``info["filtered"]`` counts every story left out, by reason
    (``no_body``, ``no_topic``, ``several_topics``, ``other_topic``, ``other_split``), and
    ``info["label_counts"]`` the kept stories per topic.
    """
    folder, files = _sgm_files(path)
    topics = None if topics is None else tuple(topics)
    if name is None:
        name = {R2_TOPICS: "r2", R5_TOPICS: "r5"}.get(topics, "reuters")
    want_split = None if split is None else split.upper()
    if want_split is not None and want_split not in {"TRAIN", "TEST", "NOT-USED"}:
        raise ValueError(f"split={split!r}; Reuters LEWISSPLIT values are 'train', 'test', 'not-used'")

    table = DocTable(on_empty="error")
    filtered: Counter[str] = Counter()
    n_stories = 0
    for where, doc_id, attrs, story in _stories(files):
        n_stories += 1
        reason, body, label = _verdict(attrs, story, topics, want_split)
        if reason:
            filtered[reason] += 1
            continue
        tt = _TITLE.search(story)
        title = normalize_space(_clean(tt.group(1))) if tt else None
        table.add(doc_id, _body_text(body), title=title, label=label, where=where)
    info = {
        "topics": None if topics is None else list(topics),
        "split": split,
        "n_stories": n_stories,
        "filtered": dict(filtered),
        "label_counts": dict(Counter(table.labels).most_common()),
        "definition": ("stories with a BODY and exactly one TOPICS label in `topics`" if topics is not None
                       else "every story with a BODY (any TOPICS, no labels)"),
    }
    if n_stories != N_STORIES:
        raise DataError(f"{folder}: {n_stories:,} stories in its reut2-*.sgm files, expected {N_STORIES:,}; a file "
                        "is truncated or edited: restore the Reuters-21578 Distribution 1.0 files")
    corpus = table.build(name, str(folder), info)
    missing = [t for t in topics or () if t not in corpus.info["label_counts"]]
    if missing:
        raise DataError(f"{folder}: no story kept for topic(s) {missing}; check the topic names "
                        f"(e.g. {list(R5_TOPICS)})")
    return corpus


def _sgm_files(path: str | os.PathLike | None) -> tuple[Path, list[Path]]:
    """The Reuters folder and its 22 ``reut2-*.sgm`` files in order; an incomplete copy is refused."""
    folder = require_dir(path or data_dir() / "reuters21578", "Reuters-21578",
                          "pass data.path= (path= in Python) the folder holding reut2-000.sgm .. reut2-021.sgm, "
                          "or set GDR_DATA_DIR")
    files = sorted(folder.glob("reut2-*.sgm"))
    if len(files) != N_FILES:
        raise FileNotFoundError(f"{folder}: found {len(files)} reut2-*.sgm files, expected {N_FILES}; "
                                "point data.path= (path= in Python) at a complete Reuters-21578 Distribution 1.0 copy")
    return folder, files


def _stories(files: Sequence[Path]) -> Iterator[tuple[str, str, dict[str, str], str]]:
    """Every ``<REUTERS>`` story of ``files`` in order: ``(where, NEWID, tag attributes, inner SGML)``, where
    ``where`` is ``"file:line (NEWID id)"`` for error messages."""
    for f in files:
        # latin-1 maps every byte, so decoding cannot fail
        text = f.read_text(encoding="latin-1")
        line, pos, end = 1, 0, 0  # line number of `pos`, advanced incrementally for error messages
        for m in _STORY.finditer(text):
            line += text.count("\n", pos, m.start())
            pos, end = m.start(), m.end()
            attrs = dict(_ATTR.findall(m.group(1)))
            doc_id = attrs.get("NEWID")
            if not doc_id:
                raise DataError(f"{f}:{line}: <REUTERS> tag without NEWID; this is not an original "
                                "Reuters-21578 file, restore it from the distribution")
            story = m.group(2)
            for tag, problem in (("<REUTERS", "holds the start of another story: its </REUTERS> is missing"),
                                 ("<BODY>", "opens <BODY> without closing it")):
                if tag in story and (tag == "<REUTERS" or "</BODY>" not in story):
                    raise DataError(f"{f}:{line}: the story of NEWID {doc_id} {problem}; the file is damaged, "
                                    "restore it from the Reuters-21578 distribution")
            yield f"{f}:{line} (NEWID {doc_id})", doc_id, attrs, story
        cut = text.find("<REUTERS", end)
        if cut >= 0:
            raise DataError(f"{f}:{text.count(chr(10), 0, cut) + 1}: <REUTERS> without </REUTERS>: the file is "
                            "truncated or damaged; restore it from the Reuters-21578 distribution")


def _verdict(attrs: dict[str, str], story: str, topics: tuple[str, ...] | None,
             want_split: str | None) -> tuple[str | None, str, str | None]:
    """Whether a story is kept: ``(reason it is left out or None, raw body, label)``; with ``topics=None``
    every story with a body is kept, unlabelled."""
    if want_split is not None and attrs.get("LEWISSPLIT") != want_split:
        return "other_split", "", None
    body = _BODY.search(story)
    if body is None:
        return "no_body", "", None
    if topics is None:
        return None, body.group(1), None
    tm = _TOPICS.search(story)
    labels = _D.findall(tm.group(1)) if tm else []
    if not labels:
        return "no_topic", "", None
    if len(labels) > 1:
        return "several_topics", "", None
    if labels[0] not in topics:
        return "other_topic", "", None
    return None, body.group(1), labels[0]
