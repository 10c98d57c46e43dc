"""The format of gdr's folders: the version every stage folder (``stage.json``) and every P run folder manifest
(``P.manifest.json``, ``queries.manifest.json``, ``doc_queries.manifest.json``) carries as ``format``, and the
stage key that names a stage folder.

This gdr reads :data:`FORMAT` only. A folder of an older format (a record without ``format`` is format 0) is
brought to it by :mod:`gdr.upgrade`, the one module that knows older formats; a newer or unknown one is refused
with :class:`FormatError`, one line naming the version and what to do.
"""
from __future__ import annotations

import fnmatch
import json
from pathlib import Path
from typing import Sequence

from gdr.io import bytes_digest, hash_strings

__all__ = ["FORMAT", "STAGE_FILE", "FormatError", "format_of", "read_stage_record", "require_format", "stage_key",
           "stage_digest", "matches"]

FORMAT = 1  # the format this gdr writes and reads
STAGE_FILE = "stage.json"  # a stage folder's record: key, inputs, status, attempts, files and their checksums


def read_stage_record(folder: str | Path) -> dict | None:
    """The record (``stage.json``) of the stage folder ``folder``; None where it is missing, being written, damaged
    or not a JSON object."""
    try:
        rec = json.loads((Path(folder) / STAGE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) else None


class FormatError(ValueError):
    """A folder of a format this gdr does not read: one line naming the file, its version and what to do."""


def stage_key(inputs: dict) -> str:
    """A short hash of a stage's inputs (canonical JSON): the ``<key>`` of its folder ``<name>-<key>``."""
    return hash_strings([json.dumps(inputs, sort_keys=True, default=str)])[:10]


def stage_digest(artifacts: dict, outputs: Sequence[str]) -> str:
    """A stage's content as the stages after it record it: one checksum over the recorded checksums of its files
    matching ``outputs`` (``stage.json``'s ``artifacts`` and ``outputs``)."""
    mine = {k: v["crc32"] for k, v in artifacts.items() if matches(k, outputs)}
    return bytes_digest(json.dumps(mine, sort_keys=True).encode())


def matches(rel: str, patterns: Sequence[str]) -> bool:
    """Whether the relative path ``rel`` matches one of the glob ``patterns``."""
    return any(fnmatch.fnmatchcase(rel, p) for p in patterns)


def format_of(record: dict, path: str | Path) -> int:
    """The format of ``record`` (read from ``path``): 0 when it has none (written before formats were recorded);
    :class:`FormatError` for a newer format than this gdr's or one that is not a version at all."""
    version = record.get("format", 0)
    if not isinstance(version, int) or isinstance(version, bool) or version < 0:
        raise FormatError(f"{path}: format {version!r} is not a gdr format version (this gdr reads format "
                          f"{FORMAT}); the file is damaged or not gdr's: rebuild it or use another out= folder")
    if version > FORMAT:
        raise FormatError(f"{path}: format {version} is newer than this gdr's format {FORMAT}; use the newer gdr "
                          f"that wrote it (pip install -U gdr), or another out= folder")
    return version


def require_format(record: dict, path: str | Path, folder: str | Path) -> dict:
    """``record`` when it is of the current format; else :class:`FormatError` saying to run ``gdr upgrade``
    on ``folder`` (an older format) or naming the newer one."""
    version = format_of(record, path)
    if version != FORMAT:
        raise FormatError(f"{path}: format {version} of an older gdr (this gdr reads format {FORMAT}); run "
                          f"`gdr upgrade {folder}` to bring it to format {FORMAT}, keeping its work")
    return record
