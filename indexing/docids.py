"""``docids.tsv``: one line per document, ``doc_id<TAB>code`` with code ``12-3-27`` (positions from the root)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

from gdr.io import atomic_write_text
from gdr.rerun import RerunCommand

__all__ = ["format_code", "parse_code", "write_docids", "read_docids", "rebuild_advice"]


def format_code(code: Sequence[int]) -> str:
    return "-".join(str(int(c)) for c in code)


def parse_code(s: str) -> tuple[int, ...]:
    return tuple(int(c) for c in s.split("-"))


def write_docids(path: str | os.PathLike, doc_ids: Sequence[str], codes: Sequence[Sequence[int]]) -> None:
    if len(doc_ids) != len(codes):
        raise ValueError(f"{len(doc_ids)} doc ids but {len(codes)} codes")
    atomic_write_text(path, "".join(f"{d}\t{format_code(c)}\n" for d, c in zip(doc_ids, codes)))


def rebuild_advice(path: str | os.PathLike) -> object:
    """The advice for a bad docids.tsv: the `gdr index` command that built its folder, when it saved one."""
    return RerunCommand("index", Path(path).parent, "rebuild the file with `{}`",
                        fallback="rebuild the file with `gdr index`")


def read_docids(path: str | os.PathLike) -> tuple[list[str], list[tuple[int, ...]]]:
    """Read ``docids.tsv``; the one reader of the file, for every command.

    A malformed line, a doc id on two lines, or one code given to two documents raises an error naming
    the file and both lines (a docid must name exactly one document, and each document has one docid).
    """
    doc_ids, codes = [], []
    id_line: dict[str, int] = {}
    code_line: dict[tuple[int, ...], tuple[int, str]] = {}
    if not Path(path).is_file():
        raise FileNotFoundError(f"{path}: no such file; pass the docids.tsv of `gdr index` (gdr.build_index)")
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line:
                continue
            parts = line.split("\t")
            if len(parts) != 2:
                raise ValueError(f"{path}:{lineno}: expected `doc_id<TAB>code`, got {line[:80]!r}")
            try:
                code = parse_code(parts[1])
            except ValueError:
                raise ValueError(f"{path}:{lineno}: code {parts[1]!r} is not dash-separated integers") from None
            if any(c < 0 for c in code):
                raise ValueError(f"{path}:{lineno}: negative position in code {parts[1]!r}")
            if parts[0] in id_line:
                raise ValueError(f"{path}:{lineno}: doc id {parts[0]!r} is also on line {id_line[parts[0]]}; each "
                                 f"document needs exactly one line: {rebuild_advice(path)}")
            if code in code_line:
                first, other = code_line[code]
                raise ValueError(f"{path}:{lineno}: code {parts[1]!r} of {parts[0]!r} is also the code of {other!r} "
                                 f"on line {first}; each docid must name one document: {rebuild_advice(path)}")
            id_line[parts[0]] = lineno
            code_line[code] = (lineno, parts[0])
            doc_ids.append(parts[0])
            codes.append(code)
    return doc_ids, codes
